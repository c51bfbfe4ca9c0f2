/*
 * Ring jobs through faults other than one trainer or one daemon lost: a
 * daemon SIGSTOPped past its lease (it fences and rejoins), two or three
 * daemons SIGKILLed at once (neighbours of each other or not), a trainer
 * timed out of a step (--step-timeout) and one slower than the ring
 * deadline (it waits: liveness is not progress).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "include/ringd.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/ring-cluster.h"
#include "tests/task.h"

/* 1 once the trainer process pid is stopped (SIGSTOP), reaping the
 * stop so the test sees it exactly once. */
static int trainer_stopped(void *pid_p)
{
    int st;
    return waitpid(*(pid_t *)pid_p, &st, WUNTRACED | WNOHANG) ==
               *(pid_t *)pid_p && WIFSTOPPED(st);
}

/*
 * A daemon SIGSTOPped past its lease TTL (2 s) while its trainer waits in
 * a collective. n0's trainer stops itself in step 200, so the others'
 * trainers post their step-200 allreduce and wait; n2's daemon is stopped
 * once it reduces its part, then n0's trainer resumes. n0 and n1 wait for
 * n2 until its lease expires, then redo step 200 as a 2-node job. After
 * SIGCONT, n2 finds its lease gone: it fences, the collective it was in
 * is dropped (even when it completed from buffered data first) and its
 * trainer gets RINGD_EFENCED; it registers again as a new member and
 * joins with the job's state. Its step 200 of the old view never counts:
 * its trainer logs no step between 199 and its join, every step it logged
 * has the others' hash, and all end identical in a 3-node view.
 */
TEST_IMPL(dmn_ring_fence_stopped)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    node_init(&c, 0, "1", "3");
    node_init(&c, 1, "1", "3");
    rc_log_level = "debug";
    node_init(&c, 2, "1", "3");
    rc_log_level = NULL;
    const char *steps = "3000";
    rc_stop_in = "200";
    c.trainer[0][0] = trainer(&c, 0, 0, steps);
    rc_stop_in = NULL;
    for (int i = 1; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, steps);
    ASSERT_MSG(td_poll(trainer_stopped, &c.trainer[0][0], 60000) == 0,
               "n0's trainer never stopped in step 200");
    ASSERT_OK(td_wait_file(c.d[2].log, "step 200: running -> reducing",
                           30000));
    ASSERT_OK(kill(c.d[2].pid, SIGSTOP));
    ASSERT_MSG(td_poll(td_all_stopped, &c.d[2].pid, 10000) == 0,
               "n2's daemon did not stop");
    ASSERT_OK(kill(c.trainer[0][0], SIGCONT));
    const char *h00 = td_path(&c.d[0], "h0");
    /* The others redo step 200 without n2 once its lease expired. */
    ASSERT_OK(td_wait_file(h00, "step 200 ", 30000));
    ASSERT(td_file_has(c.d[0].log, ": 2 members, me #"));
    ASSERT_OK(kill(c.d[2].pid, SIGCONT));

    const char *t2 = td_path(&c.d[2], "t0.log");
    ASSERT_OK(td_wait_file(c.d[2].log, "ring backend: fenced", 10000));
    ASSERT_OK(td_wait_file(t2, "collective: the node is fenced (lease "
                               "lost); redoing the step", 10000));
    ASSERT_OK(td_wait_file(c.d[2].log, "FENCED -> REGISTERING", 10000));
    ASSERT_OK(td_wait_file(c.d[2].log, ": 3 members, me #", 30000));
    for (int i = 0; i < 3; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    ASSERT(td_file_has(c.d[0].log, " 1 joiner"));
    /* Most often its part of step 200 went out before the stop and the
     * others' parts were buffered, so on waking the collective completed
     * before the fence timer fired: it must have been dropped (else the
     * fence aborted it first). Either way step 200 is not counted below. */
    if (!td_file_has(c.d[2].log, "lease ran out: dropped"))
        fprintf(stderr, "note: the fence aborted n2's collective first\n");

    static td_hashes_t h0, h1, h2;
    td_read_hashes(h00, &h0);
    td_read_hashes(td_path(&c.d[1], "h0"), &h1);
    td_read_hashes(td_path(&c.d[2], "h0"), &h2);
    int64_t joined = logged_step(t2, "joined at step ");
    ASSERT_GT(joined, 200);
    ASSERT_EQ(h0.world[199], 3);
    ASSERT_EQ(h0.world[200], 2);
    ASSERT(h2.have[199]);
    for (int s = 200; s < joined; s++)
        ASSERT_MSG(!h2.have[s], "n2 logged step %d while evicted", s);
    ASSERT_GE(td_same_hashes(&h0, &h1), 2990);
    ASSERT_GT(td_same_hashes(&h0, &h2), 200);
    ASSERT_EQ(h0.hash[2999], h2.hash[2999]);
    ASSERT_EQ(h0.world[2999], 3);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * Liveness apart from the lease: a daemon SIGSTOPped while its trainer
 * trains is found by its neighbours' heartbeats (--liveness-ms 1000, the
 * default), not by its lease, which here runs 30 s. They suspect it at
 * once ("stopped answering"), the leader revokes its lease, and the other
 * two go on as a 2-node job long before the TTL could have run out: the
 * test waits 15 s for that view, so without heartbeats it fails. After
 * SIGCONT n2 finds itself fenced, registers again and joins; all three
 * end identical.
 */
TEST_IMPL(dmn_ring_liveness_stopped)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    rc_lease_ttl = "30";
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    rc_lease_ttl = "2";
    const char *steps = "3000";
    for (int i = 0; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, steps);
    ASSERT_OK(td_wait_file(td_path(&c.d[2], "h0"), "step 300 ", 60000));
    ASSERT_OK(kill(c.d[2].pid, SIGSTOP));
    ASSERT_MSG(td_poll(td_all_stopped, &c.d[2].pid, 10000) == 0,
               "n2's daemon did not stop");
    ASSERT_MSG(td_wait_file(c.d[0].log, ": 2 members, me #", 15000) == 0,
               "no view without the stopped n2 within 15 s (its lease "
               "runs 30 s)");
    ASSERT(td_file_has(c.d[0].log, "stopped answering") ||
           td_file_has(c.d[1].log, "stopped answering"));
    ASSERT_OK(kill(c.d[2].pid, SIGCONT));
    ASSERT_OK(td_wait_file(c.d[2].log, "FENCED -> REGISTERING", 30000));
    ASSERT_OK(td_wait_file(c.d[2].log, ": 3 members, me #", 30000));
    for (int i = 0; i < 3; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    static td_hashes_t h0, h1, h2;
    td_read_hashes(td_path(&c.d[0], "h0"), &h0);
    td_read_hashes(td_path(&c.d[1], "h0"), &h1);
    td_read_hashes(td_path(&c.d[2], "h0"), &h2);
    ASSERT_GE(td_same_hashes(&h0, &h1), 2990);
    ASSERT_EQ(h0.hash[2999], h1.hash[2999]);
    ASSERT_EQ(h0.hash[2999], h2.hash[2999]);
    ASSERT_EQ(h0.world[2999], 3);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* The worlds n's trainer logged steps in: bit w set for world w. */
static unsigned worlds_seen(const td_hashes_t *h)
{
    unsigned seen = 0;
    for (int s = 0; s < h->nsteps && s < TD_MAX_STEPS; s++)
        if (h->have[s] && h->world[s] < 32)
            seen |= 1u << h->world[s];
    return seen;
}

/*
 * The generations a daemon's log names: *full the last view of n
 * members, returns the first later one of k members (0: none).
 */
static uint64_t view_after(const char *log, int n, int k, uint64_t *full)
{
    char *text = td_read(log, NULL);
    uint64_t first = 0;
    *full = 0;
    for (char *p = text; p != NULL && (p = strstr(p, ": view ")) != NULL;
         p++) {
        unsigned long long g;
        int m;
        if (sscanf(p, ": view %llu, %d members", &g, &m) != 2)
            continue;
        if (m == n)
            *full = g;
        else if (m == k && *full > 0 && first == 0)
            first = g;
    }
    free(text);
    return first;
}

/*
 * Daemons (dead[] of an n-node ring) SIGKILLed at once while every
 * trainer is stopped between steps, with a 30 s lease TTL: no lease
 * expiry can remove them in time. The survivors' rings see the failed
 * endpoints while no collective runs; each failure must reach the leader
 * (the first command after it returns an abort, and that abort still
 * names the dead neighbour; a survivor whose two neighbours both died
 * names both) and go into a view, so the survivors go on as a job of the
 * survivors long before any lease runs out (the wait below is shorter
 * than the TTL) and finish every step, bitwise identical. No step runs
 * in a world in between: a view that still held a dead node could not
 * complete one.
 */
static int kill_nodes(int n, const int *dead, int n_dead)
{
    cluster_env();
    cluster_t c = {.n = n};
    int s[MAXN], n_s = 0, is_dead[MAXN] = {0};
    char nodes[16], world[32];
    for (int i = 0; i < n_dead; i++)
        is_dead[dead[i]] = 1;
    for (int i = 0; i < n; i++)
        if (!is_dead[i])
            s[n_s++] = i;
    snprintf(nodes, sizeof(nodes), "%d", n);
    snprintf(world, sizeof(world), "world %d", n_s);
    fx_etcd_start(&c.etcd, 0);
    rc_lease_ttl = "30";
    for (int i = 0; i < n; i++)
        node_init(&c, i, "1", nodes);
    rc_lease_ttl = "2";
    rc_stop_after = "100";
    for (int i = 0; i < n; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "3000");
    rc_stop_after = NULL;
    for (int i = 0; i < n; i++)
        ASSERT_MSG(td_poll(trainer_stopped, &c.trainer[i][0], 60000) == 0,
                   "n%d's trainer never stopped after step 100", i);
    for (int i = 0; i < n_dead; i++)
        kill(c.d[dead[i]].pid, SIGKILL);
    for (int i = 0; i < n_dead; i++) {
        th_kill(c.d[dead[i]].pid);
        c.d[dead[i]].pid = 0;
        th_kill(c.trainer[dead[i]][0]);
    }
    for (int i = 0; i < n_s; i++)
        ASSERT_OK(td_wait_file(c.d[s[i]].log, "peer endpoint failed",
                               10000));
    for (int i = 0; i < n_s; i++)
        kill(c.trainer[s[i]][0], SIGCONT);
    for (int i = 0; i < n_s; i++) {
        int rc = td_wait_file(td_path(&c.d[s[i]], "h0"), world, 20000);
        if (rc != 0)
            for (int j = 0; j < n_s; j++)
                td_dump(c.d[s[j]].log);
        ASSERT_MSG(rc == 0, "n%d never went on as a %d-node job before "
                            "the dead nodes' leases (30 s) could expire",
                   s[i], n_s);
    }
    for (int i = 0; i < n_s; i++)
        expect_exit0(&c, s[i], 0, c.trainer[s[i]][0]);
    /* One view for the suspects the leader holds: the dead are all out
     * of the next view or the one after (a report that came while the
     * first was being written). */
    for (int i = 0; i < n_s; i++) {
        uint64_t full, after = view_after(c.d[s[i]].log, n, n_s, &full);
        ASSERT_MSG(after > full && after <= full + 2,
                   "n%d: the view of %d members after view %llu is %llu",
                   s[i], n_s, (unsigned long long)full,
                   (unsigned long long)after);
    }

    static td_hashes_t h[MAXN];
    for (int i = 0; i < n_s; i++) {
        td_read_hashes(td_path(&c.d[s[i]], "h0"), &h[i]);
        ASSERT_EQ(worlds_seen(&h[i]), (1u << n) | (1u << n_s));
        if (i > 0)
            ASSERT_EQ(td_same_hashes(&h[0], &h[i]), 3000);
    }
    ASSERT_EQ(h[0].world[100], n);
    ASSERT_EQ(h[0].world[101], n_s);
    for (int i = 0; i < n_s; i++)
        ASSERT_EQ(td_stop(&c.d[s[i]], 30000), 0);
    return fx_done();
}

/* n1 and n2: each survivor has one dead neighbour. */
TEST_IMPL(dmn_ring_kill_two_adjacent)
{
    static const int dead[] = {1, 2};
    return kill_nodes(4, dead, 2);
}

/* n1 and n3: both neighbours of each survivor die at once. */
TEST_IMPL(dmn_ring_kill_both_neighbours)
{
    static const int dead[] = {1, 3};
    return kill_nodes(4, dead, 2);
}

/* Three of six at once: n1 and n2 adjacent, n4 too, so n3 loses both
 * neighbours and n0 and n5 one each. */
TEST_IMPL(dmn_ring_kill_three)
{
    static const int dead[] = {1, 2, 4};
    return kill_nodes(6, dead, 3);
}

/*
 * --step-timeout: n0's trainer stops itself in step 200, after step_begin
 * and before its collective (between: after step 200, its step_end
 * answered), while n1's and n2's wait for it there (in step 201). After
 * the timeout n0's daemon names that trainer (its pid), takes it out of
 * the step (out of the node's members) and steps out of the job, so n1
 * and n2 go on as a 2-node job instead of waiting. Resumed, the trainer's
 * next call answers RINGD_ERESHAPE, its step_begin brings n0 back as a
 * joiner with the job's state, and the three end identical in a 3-node
 * view. n0 logs no step from the one it was stopped in until it joined
 * (that step never counted). Its timer woke once, and the idle time it
 * logged is at least the timeout.
 */
static int step_timeout_case(int between)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    rc_step_timeout = "1500";
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    rc_step_timeout = NULL;
    if (between)
        rc_stop_after = "200";
    else
        rc_stop_in = "200";
    c.trainer[0][0] = trainer(&c, 0, 0, "3000");
    rc_stop_in = rc_stop_after = NULL;
    int out = between ? 201 : 200; /* the first step n0 does not log */
    for (int i = 1; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "3000");
    ASSERT_MSG(td_poll(trainer_stopped, &c.trainer[0][0], 60000) == 0,
               "n0's trainer never stopped at step 200");
    char named[64];
    snprintf(named, sizeof(named), "(pid %d) sent nothing for ",
             (int)c.trainer[0][0]);
    int rc = td_wait_file(c.d[0].log, named, 30000);
    if (rc != 0)
        td_dump(c.d[0].log);
    ASSERT_MSG(rc == 0, "n0 never timed its trainer out of the step");
    ASSERT_OK(td_wait_file(td_path(&c.d[1], "h0"), "world 2", 30000));
    ASSERT_OK(kill(c.trainer[0][0], SIGCONT));
    for (int i = 0; i < 3; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);

    static td_hashes_t h0, h1, h2;
    td_read_hashes(td_path(&c.d[0], "h0"), &h0);
    td_read_hashes(td_path(&c.d[1], "h0"), &h1);
    td_read_hashes(td_path(&c.d[2], "h0"), &h2);
    int64_t joined = logged_step(td_path(&c.d[0], "t0.log"),
                                 "joined at step ");
    ASSERT_GT(joined, out);
    ASSERT(h0.have[out - 1]);
    for (int s = out; s < joined; s++)
        ASSERT_MSG(!h0.have[s], "n0 logged step %d while out", s);
    /* n1 and n2 went on as a 2-node job and took n0 back. One of them
     * may have received a step in the state rather than computed it (it
     * was one step behind at a view change): it need not log it. */
    ASSERT_EQ(worlds_seen(&h1), (1u << 3) | (1u << 2));
    ASSERT_EQ(h1.world[out - 1], 3);
    for (int s = 0; s < 3000; s++)
        ASSERT_MSG(h1.have[s] || h2.have[s], "step %d ran nowhere", s);
    ASSERT_GE(td_same_hashes(&h1, &h2), 2990);
    ASSERT_GT(td_same_hashes(&h0, &h1), out);
    ASSERT_EQ(h0.hash[2999], h1.hash[2999]);
    ASSERT_EQ(h1.world[2999], 3);
    char *m = td_http_get(c.d[0].metrics_port, "/metrics");
    ASSERT(m != NULL);
    ASSERT_MSG(strstr(m, "ringd_trainers_stalled_total 1\n") != NULL,
               "n0's /metrics does not count one stalled trainer");
    /* Its timer is armed for the earliest deadline only: one wakeup for
     * the one stuck trainer, no periodic checks in the 3000 steps. */
    ASSERT_MSG(strstr(m, "ringd_step_timeout_wakeups_total 1\n") != NULL,
               "n0's step timeout did not fire exactly once");
    free(m);
    char *l = td_read(c.d[0].log, NULL);
    ASSERT(l != NULL);
    const char *idle = strstr(l, named);
    ASSERT(idle != NULL);
    ASSERT_GE(strtol(idle + strlen(named), NULL, 10), 1500);
    free(l);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

TEST_IMPL(dmn_ring_step_timeout)
{
    return step_timeout_case(0);
}

/* Stopped between steps: the other nodes wait in the next step's
 * collective, which the commit round made the usual place for a stop to
 * land (chaos: a hung_trainer there was a 60 s hang). */
TEST_IMPL(dmn_ring_step_timeout_between)
{
    return step_timeout_case(1);
}

/* For td_poll: the daemon log at path shows three deadlines waited out. */
static int waited_thrice(void *path)
{
    return td_count(path, "alive: waiting for it") >= 3;
}

/*
 * Liveness is not progress: n0's trainer stops itself in step 200 for
 * longer than the ring deadline (2 s here) plus the lease TTL, while n1's
 * and n2's wait for it in a collective. Their rings' deadlines pass, but
 * no view removed n0 (its daemon keeps renewing its lease), so the
 * collective waits on: nobody is suspected, evicted or re-ringed. Resumed
 * (once a neighbour has waited past a deadline and a TTL, n0's lease
 * renewed meanwhile), n0's trainer finishes with the others: the job
 * never left generation 1, every step had all three, all end identical.
 */
TEST_IMPL(dmn_ring_slow_trainer)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    rc_deadline = "2000";
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    rc_deadline = NULL;
    rc_stop_in = "200";
    c.trainer[0][0] = trainer(&c, 0, 0, "3000");
    rc_stop_in = NULL;
    for (int i = 1; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "3000");
    ASSERT_MSG(td_poll(trainer_stopped, &c.trainer[0][0], 60000) == 0,
               "n0's trainer never stopped in step 200");
    /* The event: n1's ring waited past its deadline three times (6 s >
     * 2 s + the 2 s TTL + 1 s: the old suspicion would have fired). */
    if (td_poll(waited_thrice, c.d[1].log, 30000) != 0) {
        td_dump(c.d[1].log);
        td_dump(c.d[2].log);
        ASSERT_MSG(0, "n1's ring never waited out three deadlines for n0");
    }
    ASSERT_OK(kill(c.trainer[0][0], SIGCONT));
    for (int i = 0; i < 3; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);

    for (int i = 0; i < 3; i++) {
        ASSERT_MSG(!td_file_has(c.d[i].log, " suspects "),
                   "n%d suspected a live node", i);
        ASSERT_MSG(!td_file_has(c.d[i].log, "ring backend: view 2"),
                   "n%d left generation 1", i);
        ASSERT(!td_file_has(c.d[i].log, "FENCED"));
    }
    static td_hashes_t h0, h1, h2;
    td_read_hashes(td_path(&c.d[0], "h0"), &h0);
    td_read_hashes(td_path(&c.d[1], "h0"), &h1);
    td_read_hashes(td_path(&c.d[2], "h0"), &h2);
    for (int s = 0; s < 3000; s++) {
        ASSERT_MSG(h0.have[s] && h1.have[s] && h2.have[s],
                   "step %d not logged by all three", s);
        ASSERT_EQ(h0.gen[s], 1);
        ASSERT_EQ(h0.world[s], 3);
    }
    ASSERT_EQ(td_same_hashes(&h0, &h1), 3000);
    ASSERT_EQ(td_same_hashes(&h1, &h2), 3000);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* Every trainer of the c->n nodes (3 at most) exits 0, no step is
 * logged twice by one (a stale step), the steps two of them logged
 * agree, and the last step ran on all of them. */
static void expect_one_history(cluster_t *c, int steps)
{
    for (int i = 0; i < c->n; i++)
        expect_exit0(c, i, 0, c->trainer[i][0]);
    static td_hashes_t h[3];
    for (int i = 0; i < c->n; i++)
        td_read_hashes(td_path(&c->d[i], "h0"), &h[i]);
    for (int s = 0; s < steps; s++)
        for (int i = 0; i < c->n; i++)
            ASSERT_MSG(h[i].have[s] <= 1, "n%d logged step %d %d times: "
                       "it took as done a step the job redid (stale)", i,
                       s, h[i].have[s]);
    for (int s = 0; s < steps; s++)
        for (int i = 0; i < c->n; i++)
            for (int j = i + 1; j < c->n; j++)
                ASSERT_MSG(!h[i].have[s] || !h[j].have[s] ||
                               (h[i].gen[s] == h[j].gen[s] &&
                                h[i].hash[s] == h[j].hash[s]),
                           "step %d: n%d logged it in generation %llu "
                           "(world %u), n%d in generation %llu (world %u), "
                           "hashes %s (a stale step)", s, i, h[i].gen[s],
                           h[i].world[s], j, h[j].gen[s], h[j].world[s],
                           h[i].hash[s] == h[j].hash[s] ? "equal"
                                                        : "differ");
    ASSERT_EQ(h[0].world[steps - 1], (unsigned)c->n);
    char p0[300];
    snprintf(p0, sizeof(p0), "%s", td_path(&c->d[0], "p0"));
    for (int i = 1; i < c->n; i++)
        ASSERT_EQ(td_param_diff(td_path(&c->d[i], "p0"), p0), 0);
}

/*
 * No stale step. n1 stops sending to its right neighbour n2 from the
 * allgather half of an allreduce of generation 1 on (RINGD_TEST_CUT_RIGHT,
 * a one-way link failure at a chosen point): n1 receives every chunk and
 * finishes the step, n2 never gets n1's chunks, finds n1 silent and has
 * it evicted (lease TTL 30 s: only the suspicion can), and n0 and n2 redo
 * the step in the next generation (n1, registered again at once, joins
 * it with the job's state). Without the commit round n1's trainer logged
 * that step in generation 1, which the job abandoned for it: a stale
 * step. Now n1's step_end answers that the step did not count, every
 * step is logged in one generation with one hash, and all three end
 * bitwise identical.
 */
TEST_IMPL(dmn_ring_no_stale_step)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    rc_lease_ttl = "30";
    for (int i = 0; i < 3; i++) {
        if (i == 1)
            setenv("RINGD_TEST_CUT_RIGHT", "1:60", 1);
        node_init(&c, i, "1", "3");
        unsetenv("RINGD_TEST_CUT_RIGHT");
    }
    rc_lease_ttl = "2";
    const int steps = 1500;
    for (int i = 0; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "1500");
    ASSERT_MSG(td_wait_file(c.d[1].log, "RINGD_TEST_CUT_RIGHT: nothing more "
                            "goes to rank", 30000) == 0,
               "n1's cut never came");
    ASSERT_MSG(td_wait_file(c.d[1].log, "FENCED -> REGISTERING", 15000)
                   == 0, "n1 was not evicted within 15 s (its lease runs "
               "30 s)");
    expect_one_history(&c, steps);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * A lossy link (ring/README.md, "A lossy link"; membership/README.md,
 * "Blame"). In generation 1, n1's sends stall as a TCP stream on a lossy
 * link does (RINGD_TEST_HB_STALL: heartbeats every fourth tick, data held
 * 300 ms of every 400), and it is never silent for the liveness timeout. Both its
 * neighbours report it (lossy), the leader convicts it on two reports
 * (lease TTL 30 s: nothing else could evict it), it registers again and
 * the job goes on with it, and no other node is ever evicted. Before,
 * nothing noticed: the job went at the stalled link's pace.
 */
TEST_IMPL(dmn_ring_lossy_node)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    rc_lease_ttl = "30";
    rc_step_delay = "2";
    for (int i = 0; i < 3; i++) {
        if (i == 1)
            setenv("RINGD_TEST_HB_STALL", "1", 1);
        node_init(&c, i, "1", "3");
        unsetenv("RINGD_TEST_HB_STALL");
    }
    rc_lease_ttl = "2";
    const int steps = 3000;
    for (int i = 0; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "3000");
    rc_step_delay = NULL;
    ASSERT_MSG(td_wait_file(c.d[1].log, "FENCED -> REGISTERING", 15000)
                   == 0, "n1 was not evicted within 15 s (its lease runs "
               "30 s)");
    int convicted = 0;
    for (int i = 0; i < 3; i++) {
        convicted += td_file_has(c.d[i].log, "revoking suspect n1");
        if (i != 1)
            ASSERT_MSG(td_file_has(c.d[i].log, "its link stalls"),
                       "n%d never found n1's link stalling", i);
    }
    ASSERT_MSG(convicted, "no leader convicted n1");
    /* Said in /metrics too: both neighbours reported it, one convicted. */
    double lossy = 0, conv = 0;
    for (int i = 0; i < 3; i++) {
        if (i != 1)
            lossy += td_metric(&c.d[i], "ringd_suspicions_reported_total"
                                        "{kind=\"lossy\"}");
        conv += td_metric(&c.d[i], "ringd_suspects_convicted_total");
    }
    ASSERT_MSG(lossy >= 2 && conv >= 1, "metrics: %g lossy reports, %g "
               "convicted", lossy, conv);
    expect_one_history(&c, steps);
    for (int i = 0; i < 3; i++) {
        if (i != 1)
            ASSERT_MSG(!td_file_has(c.d[i].log, "-> FENCED"),
                       "the healthy n%d was evicted", i);
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    }
    return fx_done();
}

/* Sleeps for ms: how long a fault lasts, not a wait for an event. */
static void fault_for_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/*
 * A receiver that did not run is not a lossy link. In a ring of two
 * (nothing to compare with: two stalls within a second are a report),
 * n1's daemon is stopped for 300 ms four times, 400 ms apart, as a
 * daemon starved of CPU by its node's trainers is: n0's heartbeats wait
 * in n1's socket meanwhile, and n1 finds them 300 ms and more apart.
 * Its own tick was as late, which explains them: neither daemon reports
 * the other, nobody is evicted (lease TTL 30 s: only a report could),
 * and the job ends as one history. Before, n1 reported its healthy
 * neighbour after the second stop and had it evicted.
 */
TEST_IMPL(dmn_ring_stopped_receiver_not_lossy)
{
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    rc_lease_ttl = "30";
    for (int i = 0; i < 2; i++)
        node_init(&c, i, "1", "2");
    rc_lease_ttl = "2";
    const int steps = 3000;
    rc_step_delay = "1";
    for (int i = 0; i < 2; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "3000");
    rc_step_delay = NULL;
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h0"), "step 100 ", 60000));
    for (int k = 0; k < 4; k++) {
        ASSERT_OK(kill(c.d[1].pid, SIGSTOP));
        fault_for_ms(300);
        ASSERT_OK(kill(c.d[1].pid, SIGCONT));
        fault_for_ms(400);
    }
    expect_one_history(&c, steps);
    for (int i = 0; i < 2; i++) {
        if (td_file_has(c.d[i].log, "its link stalls"))
            td_dump(c.d[i].log);
        ASSERT_MSG(!td_file_has(c.d[i].log, "its link stalls"),
                   "n%d took a stopped receiver for a lossy link", i);
        ASSERT_MSG(!td_file_has(c.d[i].log, "-> FENCED"), "n%d was evicted",
                   i);
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    }
    return fx_done();
}

/*
 * The trainers of two nodes post collectives of different sizes (n0
 * splits its gradient into 2 allreduces, n1 into 3; the state is the
 * same): a bug in the job, not a fault. The ring used to drop the message
 * of the wrong size and wait for one of the right size for ever ("quiet
 * but alive"). Now the first such message asks for a new generation, and
 * the same step meeting it again on agreed trainer counts is the
 * trainers' own: a trainer that meets it is told (RINGD_EMISMATCH,
 * "trainers posted different collectives") and exits 1. Its node then has
 * no trainer and leaves; the other node (min nodes 1) either met it too
 * or goes on alone and finishes. Nobody hangs, no daemon dies.
 */
TEST_IMPL(dmn_ring_size_mismatch)
{
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 2; i++)
        node_init(&c, i, "1", "1");
    ASSERT_OK(td_wait_file(c.d[1].log, ", 2 members, index", 30000));
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"--steps", "50", "--async", i ? "3" : "2",
                              NULL};
        c.trainer[i][0] = td_trainer(&c.d[i], args, td_path(&c.d[i],
                                                            "t0.log"));
    }
    int failed = 0, told = 0, convicted = 0;
    for (int i = 0; i < 2; i++) {
        int rc = td_exit_code(c.trainer[i][0], 60000);
        td_dump(td_path(&c.d[i], "t0.log"));
        ASSERT_MSG(rc == 0 || rc == 1, "n%d's trainer: exit %d, want 0 or "
                   "a failure of its own", i, rc);
        failed += rc == 1;
        told += td_file_has(td_path(&c.d[i], "t0.log"),
                            "posted different collectives") != 0;
        convicted += td_file_has(c.d[i].log, "the trainers' collectives "
                                 "differ") != 0;
        ASSERT(td_file_has(c.d[i].log, "posted a collective of another "
                           "size"));
    }
    ASSERT_MSG(failed > 0 && told == failed, "%d trainers failed, %d told "
               "the collectives differ", failed, told);
    ASSERT(convicted > 0);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}
