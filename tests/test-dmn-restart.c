/*
 * Trainers survive their daemon's restart: a real ringd restarted with
 * SIGUSR2 (what `systemctl reload ringd` sends) drains, exits 75 and is
 * started again on the same socket, as the unit's RestartForceExitStatus
 * does; its trainers wait for it (client-wait.c), reconnect with the same
 * buffers and go on. A daemon that crashes mid-step and comes back gives
 * the step's collective RINGD_ERESHAPE. A stop (SIGTERM) still ends the
 * trainers with RINGD_ESHUTDOWN, and a daemon that stays away ends them
 * with a clear RINGD_ENODAEMON once the window is over. In a ring job,
 * a node restarted this way rejoins in a later generation and the job
 * loses and repeats no step.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "include/ringd.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/py-util.h"
#include "tests/ring-cluster.h"
#include "tests/task.h"

/* The unit's RestartSec=1: the trainers must live through a second with
 * no daemon at all (not a wait for any event: systemd's delay). */
static void restart_sec(void)
{
    usleep(1000 * 1000);
}

static int alive(pid_t p)
{
    return kill(p, 0) == 0 && waitpid(p, NULL, WNOHANG) == 0;
}

/* A standalone daemon checkpointing every 10 steps in t's dir. */
static void solo_flags(td_daemon_t *t, const char **flags)
{
    const char *f[] = {"--ckpt-dir", td_path(t, "ckpt"), "--ckpt-interval",
                       "10", NULL};
    memcpy(flags, f, sizeof(f));
}

/* A checkpoint is complete on disk: what a restarted standalone daemon
 * resumes from (without one it would start the job again at step 0). */
static void wait_checkpoint(td_daemon_t *t)
{
    ASSERT_OK(td_wait_file(t->log, "copies each)", 60000));
}

/* The restart drain checkpointed its boundary S, and the trainer, after
 * the daemon came back, went on at exactly S: no step ran twice. */
static void expect_exact_resume(td_daemon_t *t, int steps)
{
    const char *key = "restart: the checkpoint of step ";
    char *log = td_read(t->log, NULL);
    char *at = log != NULL ? strstr(log, key) : NULL;
    unsigned long long s = 0;
    ASSERT_MSG(at != NULL && sscanf(at + strlen(key), "%llu", &s) == 1,
               "the restart drain checkpointed no step");
    free(log);
    char want[96];
    snprintf(want, sizeof(want), "joined at step %llu: parameters restored",
             s);
    ASSERT_MSG(td_file_has(td_path(t, "t0.log"), want), "no '%s'", want);
    static td_hashes_t h;
    td_read_hashes(td_path(t, "h0"), &h);
    for (int i = 0; i < steps; i++)
        ASSERT_MSG(h.have[i] == 1, "step %d logged %d times", i, h.have[i]);
}

/* The reference: the same training without a daemon. */
static void reference(td_daemon_t *t, const char *steps)
{
    const char *ref[] = {"--no-daemon", "--steps", steps, "--save",
                         td_path(t, "pref"), "--hash-log",
                         td_path(t, "href"), NULL};
    ASSERT_EQ(td_exit_code(td_trainer(t, ref, td_path(t, "ref.log")),
                           60000), 0);
}

/* The trainer ended where an uninterrupted run ends, every step logged
 * with the reference's hash. */
static void expect_like_reference(td_daemon_t *t, int steps)
{
    static td_hashes_t h, r;
    td_read_hashes(td_path(t, "h0"), &h);
    td_read_hashes(td_path(t, "href"), &r);
    ASSERT_EQ(h.nsteps, steps);
    ASSERT_EQ(td_same_hashes(&h, &r), steps);
    ASSERT_EQ(td_param_diff(td_path(t, "p0"), td_path(t, "pref")), 0);
}

static pid_t solo_trainer(td_daemon_t *t, const char *steps,
                          const char *stop_in)
{
    const char *args[] = {"--steps", steps, "--log-every", "50",
                          "--hash-log", td_path(t, "h0"), "--save",
                          td_path(t, "p0"), stop_in ? "--stop-in-step"
                                                    : NULL, stop_in, NULL};
    return td_trainer(t, args, td_path(t, "t0.log"));
}

static int expect_trainer_exit(td_daemon_t *t, pid_t p)
{
    int rc = td_exit_code(p, 120000);
    if (rc != 0) {
        td_dump(td_path(t, "t0.log"));
        td_dump(t->log);
    }
    return rc;
}

/*
 * SIGUSR2 to a standalone daemon mid-job: it drains for a restart (exit
 * 75, the trainer told nothing), the trainer says it waits, survives a
 * second without a daemon, reconnects to the daemon started again on the
 * same socket, which restores the checkpoint the drain took of its last
 * boundary into the trainer's state region (the same buffer, registered
 * again): the trainer goes on at that very step, runs no step twice, and
 * finishes the job bitwise where an uninterrupted run ends.
 */
TEST_IMPL(dmn_restart_standalone)
{
    td_daemon_t t;
    td_init(&t, "dmn-restart");
    const char *flags[8];
    solo_flags(&t, flags);
    ASSERT_OK(td_start(&t, flags));
    unsetenv("RINGD_RECONNECT_S"); /* the default window: 30 s */
    pid_t p = solo_trainer(&t, "3000", NULL);
    ASSERT_OK(td_wait_file(td_path(&t, "h0"), "step 100 ", 60000));
    kill(t.pid, SIGUSR2);
    ASSERT_EQ(td_exit_code(t.pid, 30000), 75);
    t.pid = 0;
    ASSERT(td_file_has(t.log, "draining for a restart"));
    ASSERT(td_file_has(t.log, "restarting, trainers wait"));
    ASSERT_OK(td_wait_file(td_path(&t, "t0.log"),
                           "ringd: daemon gone, waiting up to 30 s", 30000));
    restart_sec();
    ASSERT_MSG(alive(p), "the trainer did not wait for its daemon");
    ASSERT_OK(td_start(&t, flags));
    ASSERT_EQ(expect_trainer_exit(&t, p), 0);
    const char *tl = td_path(&t, "t0.log");
    ASSERT(td_file_has(tl, "ringd: daemon back after"));
    ASSERT(td_file_has(tl, "parameters restored"));
    ASSERT(!td_file_has(tl, "daemon drains"));
    expect_exact_resume(&t, 3000);
    reference(&t, "3000");
    expect_like_reference(&t, 3000);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * The daemon dies in the middle of a step (SIGKILL while the trainer is
 * stopped after step_begin) and is started again: the trainer's next
 * call, the step's allreduce, waits for the new daemon and returns
 * RINGD_ERESHAPE; the trainer redoes the step from the checkpoint the
 * new daemon restores and ends where an uninterrupted run ends.
 */
TEST_IMPL(dmn_restart_crash_mid_step)
{
    td_daemon_t t;
    td_init(&t, "dmn-restart-crash");
    const char *flags[8];
    solo_flags(&t, flags);
    ASSERT_OK(td_start(&t, flags));
    setenv("RINGD_RECONNECT_S", "60", 1);
    pid_t p = solo_trainer(&t, "200", "55");
    unsetenv("RINGD_RECONNECT_S");
    ASSERT_MSG(td_poll(td_all_stopped, &p, 60000) == 0,
               "the trainer never stopped in step 55");
    wait_checkpoint(&t);
    kill(t.pid, SIGKILL);
    ASSERT_EQ(td_exit_code(t.pid, 30000), 128 + SIGKILL);
    t.pid = 0;
    ASSERT_OK(td_start(&t, flags));
    kill(p, SIGCONT);
    ASSERT_EQ(expect_trainer_exit(&t, p), 0);
    const char *tl = td_path(&t, "t0.log");
    ASSERT(td_file_has(tl, "ringd: daemon gone, waiting up to 60 s"));
    ASSERT(td_file_has(tl, "collective: view changed, redo the step; "
                           "redoing the step"));
    ASSERT(td_file_has(tl, "parameters restored"));
    reference(&t, "200");
    expect_like_reference(&t, 200);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* examples/trainer.py with args (NULL-ended) under /usr/bin/python3. */
static pid_t py_trainer(const char *const *args,
                        const char *log)
{
    char script[600];
    th_src_path(script, sizeof(script), "examples/trainer.py");
    const char *argv[16] = {"/usr/bin/python3", script};
    int n = 2;
    for (int i = 0; args[i] != NULL && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t p = th_spawn((char *const *)argv, log);
    td_track(p);
    return p;
}

/*
 * The same restart under the Python binding (examples/trainer.py): the
 * trainer waits in step_begin, the restarted daemon restores the drain's
 * checkpoint into the state region, the trainer goes on at that step, and
 * the job ends bitwise where the same script ends without a daemon.
 */
TEST_IMPL(dmn_restart_python_trainer)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    td_daemon_t t;
    td_init(&t, "dmn-restart-py");
    if (!have_numpy(py, td_path(&t, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    char lib[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    setenv("RINGD_LIB", lib, 1);
    const char *flags[8];
    solo_flags(&t, flags);
    ASSERT_OK(td_start(&t, flags));
    unsetenv("RINGD_RECONNECT_S");
    const char *args[] = {"--socket", t.sock, "--steps", "3000",
                          "--hash-log", td_path(&t, "h0"), NULL};
    pid_t p = py_trainer(args, td_path(&t, "t0.log"));
    ASSERT_OK(td_wait_file(td_path(&t, "h0"), "step 100 ", 60000));
    kill(t.pid, SIGUSR2);
    ASSERT_EQ(td_exit_code(t.pid, 30000), 75);
    t.pid = 0;
    ASSERT_OK(td_wait_file(td_path(&t, "t0.log"),
                           "ringd: daemon gone, waiting up to 30 s", 30000));
    restart_sec();
    ASSERT_MSG(alive(p), "the Python trainer did not wait for its daemon");
    ASSERT_OK(td_start(&t, flags));
    ASSERT_EQ(expect_trainer_exit(&t, p), 0);
    expect_exact_resume(&t, 3000);
    const char *ref[] = {"--no-daemon", "--steps", "3000", "--hash-log",
                         td_path(&t, "href"), NULL};
    ASSERT_EQ(td_exit_code(py_trainer(ref, td_path(&t, "ref.log")),
                           120000), 0);
    static td_hashes_t h, r;
    td_read_hashes(td_path(&t, "h0"), &h);
    td_read_hashes(td_path(&t, "href"), &r);
    ASSERT_EQ(h.nsteps, 3000);
    ASSERT_EQ(td_same_hashes(&h, &r), 3000);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* A stop is not a restart: SIGTERM still drains with RINGD_ESHUTDOWN,
 * the trainer stops at once (it waits for no daemon) and ringd exits 0. */
TEST_IMPL(dmn_restart_stop_still_stops)
{
    td_daemon_t t;
    td_init(&t, "dmn-restart-stop");
    ASSERT_OK(td_start(&t, NULL));
    unsetenv("RINGD_RECONNECT_S");
    pid_t p = solo_trainer(&t, "1000000", NULL);
    ASSERT_OK(td_wait_file(td_path(&t, "h0"), "step 20 ", 60000));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    ASSERT_EQ(expect_trainer_exit(&t, p), 0);
    const char *tl = td_path(&t, "t0.log");
    ASSERT(td_file_has(tl, "daemon drains: stopping before step"));
    ASSERT(!td_file_has(tl, "waiting up to"));
    ASSERT(td_file_has(t.log, "telling trainers to stop"));
    return 0;
}

/* A daemon held in its drain by a trainer stopped in step 30 (the step
 * must finish first); first, then second: the signals it gets. */
static int drain_with(const char *name, int first, int second,
                      const char *between)
{
    td_daemon_t t;
    td_init(&t, name);
    ASSERT_OK(td_start(&t, NULL));
    pid_t p = solo_trainer(&t, "1000000", "30");
    ASSERT_MSG(td_poll(td_all_stopped, &p, 60000) == 0,
               "the trainer never stopped in step 30");
    kill(t.pid, first);
    ASSERT_OK(td_wait_file(t.log, between, 10000));
    kill(t.pid, second);
    if (second == SIGUSR2)
        ASSERT_OK(td_wait_file(t.log, "a drain is already under way",
                               10000));
    kill(p, SIGCONT);
    int rc = td_exit_code(t.pid, 30000);
    t.pid = 0;
    if (second == SIGUSR2) { /* the stop went on: the trainer stops */
        ASSERT_EQ(expect_trainer_exit(&t, p), 0);
        ASSERT(td_file_has(td_path(&t, "t0.log"), "daemon drains"));
    }
    return rc;
}

/* A stop asked first stays a stop when a restart is asked during its
 * drain (exit 0, the trainer told to stop), and a stop asked during a
 * restart's drain wins too: ringd exits at once with 0, which the unit
 * does not restart. */
TEST_IMPL(dmn_restart_stop_wins)
{
    unsetenv("RINGD_RECONNECT_S");
    ASSERT_EQ(drain_with("dmn-restart-t-u", SIGTERM, SIGUSR2,
                         "drain requested"), 0);
    ASSERT_EQ(drain_with("dmn-restart-u-t", SIGUSR2, SIGTERM,
                         "draining for a restart"), 0);
    return 0;
}

/*
 * The window runs out: a daemon restarted with SIGUSR2 that nobody
 * starts again leaves the trainer, after RINGD_RECONNECT_S=2 seconds,
 * with RINGD_ENODAEMON and a message that says it waited. A bad
 * RINGD_RECONNECT_S or opts.reconnect_s is refused by ringd_connect().
 */
TEST_IMPL(dmn_restart_window_runs_out)
{
    td_daemon_t t;
    td_init(&t, "dmn-restart-gone");
    ASSERT_OK(td_start(&t, NULL));
    ringd_client_t *c = NULL;
    const char *bad[] = {"abc", "-1", "3601", "1e3", "99999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        setenv("RINGD_RECONNECT_S", bad[i], 1);
        ASSERT_EQ(ringd_connect(&c, t.sock, NULL), RINGD_EINVAL);
    }
    ringd_opts_t o;
    ringd_opts_init(&o);
    o.reconnect_s = RINGD_RECONNECT_MAX_S + 1;
    ASSERT_EQ(ringd_connect(&c, t.sock, &o), RINGD_EINVAL);
    o.reconnect_s = RINGD_RECONNECT_MAX_S; /* over the bad variable */
    ASSERT_OK(ringd_connect(&c, t.sock, &o));
    ringd_close(c);

    setenv("RINGD_RECONNECT_S", "2", 1);
    pid_t p = solo_trainer(&t, "1000000", NULL);
    unsetenv("RINGD_RECONNECT_S");
    ASSERT_OK(td_wait_file(td_path(&t, "h0"), "step 20 ", 60000));
    kill(t.pid, SIGUSR2);
    ASSERT_EQ(td_exit_code(t.pid, 30000), 75);
    t.pid = 0;
    ASSERT_EQ(td_exit_code(p, 60000), 1);
    const char *tl = td_path(&t, "t0.log");
    ASSERT(td_file_has(tl, "ringd: daemon gone, waiting up to 2 s"));
    ASSERT(td_file_has(tl, "did not come back within 2 s"));
    ASSERT(td_file_has(tl, "trainer: step_begin: the ringd daemon at"));
    return 0;
}

/*
 * Handles outstanding when the daemon dies: the daemon is started again
 * before the client notices, and then each handle fails with
 * RINGD_ERESHAPE (not RINGD_EDISCONNECTED), so does a collective issued
 * later in the step, and the next step_begin runs on the new daemon with
 * the same buffer.
 */
TEST_IMPL(dmn_restart_async_handles)
{
    td_daemon_t t;
    td_init(&t, "dmn-restart-async");
    const char *two[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, two));
    ringd_opts_t o;
    ringd_opts_init(&o);
    o.reconnect_s = 30;
    ringd_client_t *c[2];
    float *b[2];
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(ringd_connect(&c[k], t.sock, &o));
        b[k] = ringd_buffer(c[k], 4096);
        ASSERT(b[k] != NULL);
    }
    td_begin_t tb[2];
    for (int k = 0; k < 2; k++)
        td_begin_start(&tb[k], c[k]);
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(td_begin_join(&tb[k], 30000));
        ASSERT_OK(tb[k].rc);
    }
    ringd_handle_t h[3];
    for (int i = 0; i < 3; i++)
        ASSERT_OK(ringd_allreduce_async(c[0], b[0] + i * 4, 4, RINGD_F32,
                                        RINGD_SUM, &h[i]));
    kill(t.pid, SIGKILL);
    ASSERT_EQ(td_exit_code(t.pid, 10000), 128 + SIGKILL);
    ringd_close(c[1]);
    const char *one[] = {"--trainers", "1", NULL};
    ASSERT_OK(td_start(&t, one));
    b[0][0] = 42;
    ASSERT_EQ(ringd_wait(c[0], h[1]), RINGD_ERESHAPE);
    ASSERT(strstr(ringd_last_error(c[0]), "restarted") != NULL);
    int done = -1;
    ASSERT_EQ(ringd_test(c[0], h[2], &done), RINGD_ERESHAPE);
    ASSERT_EQ(done, 1);
    ASSERT_EQ(ringd_wait(c[0], h[0]), RINGD_ERESHAPE);
    ringd_handle_t hn;
    ASSERT_EQ(ringd_allreduce_async(c[0], b[0], 4, RINGD_F32, RINGD_SUM,
                                    &hn), RINGD_ERESHAPE);
    ringd_view_t v;
    ASSERT_OK(ringd_step_begin(c[0], &v));
    ASSERT_EQ(v.world, 1);
    ASSERT_OK(ringd_allreduce(c[0], b[0], 4, RINGD_F32, RINGD_SUM));
    ASSERT_EQ(b[0][0], 42); /* the same memory, reduced by the new one */
    ASSERT_OK(ringd_step_end(c[0]));
    ringd_close(c[0]);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* ---- a ring job: one node's daemon restarted ---------------------------- */

/* Start n1's daemon again on its socket, as systemd would: same flags. */
static void restart_node(cluster_t *c, int i, const char *min_nodes)
{
    static char id[16];
    snprintf(id, sizeof(id), "n%d", i);
    const char *flags[] = {"--etcd", c->etcd.url, "--job", "ringtest",
                           "--node-id", id, "--trainers", "1",
                           "--lease-ttl", rc_lease_ttl, "--min-nodes",
                           min_nodes, NULL};
    if (td_start(&c->d[i], flags) != 0)
        TEST_FAIL_("daemon n%d did not start again", i);
}

/*
 * A 2-node job, one trainer a node: n1's daemon gets SIGUSR2 mid-job,
 * finishes the step, leaves the job and exits 75; n0 goes on alone; n1's
 * daemon is started again a second later, registers again and rejoins
 * in a later generation, and its trainer, which waited, receives the
 * job's state and finishes with n0. No step is lost or logged twice by
 * either, and both end bitwise identical.
 */
TEST_IMPL(dmn_restart_ring_node)
{
    enum { STEPS = 3000 };
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    unsetenv("RINGD_RECONNECT_S");
    for (int i = 0; i < 2; i++)
        node_init(&c, i, "1", "2");
    /* 5 ms a step: the job outlasts n1's absence (a second and more). */
    rc_step_delay = "5";
    for (int i = 0; i < 2; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "3000");
    rc_step_delay = NULL;
    const char *h1 = td_path(&c.d[1], "h0"), *t1 = td_path(&c.d[1], "t0.log");
    ASSERT_OK(td_wait_file(h1, "step 100 ", 60000));
    kill(c.d[1].pid, SIGUSR2);
    ASSERT_EQ(td_exit_code(c.d[1].pid, 30000), 75);
    c.d[1].pid = 0;
    ASSERT_OK(td_wait_file(t1, "ringd: daemon gone, waiting up to", 30000));
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h0"), "world 1", 30000));
    restart_sec();
    ASSERT_MSG(alive(c.trainer[1][0]), "n1's trainer did not wait");
    restart_node(&c, 1, "2");
    for (int i = 0; i < 2; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    ASSERT(td_file_has(t1, "ringd: daemon back after"));
    ASSERT(td_file_has(t1, "parameters restored"));

    static td_hashes_t a, b;
    td_read_hashes(td_path(&c.d[0], "h0"), &a);
    td_read_hashes(h1, &b);
    ASSERT_EQ(a.nsteps, STEPS);
    for (int s = 0; s < STEPS; s++) {
        ASSERT_MSG(a.have[s] == 1, "n0 logged step %d %d times", s,
                   a.have[s]);
        ASSERT_MSG(b.have[s] <= 1, "n1 logged step %d %d times", s,
                   b.have[s]);
    }
    /* n1 ran the steps up to its restart, missed those n0 ran alone,
     * and came back in a later generation for the end of the job. */
    int gap = 0;
    while (gap < STEPS && b.have[gap])
        gap++;
    int back = gap;
    while (back < STEPS && !b.have[back])
        back++;
    ASSERT_GT(gap, 100);
    ASSERT_LT(back, STEPS);
    ASSERT_EQ(a.world[gap], 1);
    ASSERT_GT(b.gen[back], b.gen[gap - 1]);
    ASSERT_EQ(b.world[STEPS - 1], 2);
    for (int s = back; s < STEPS; s++)
        ASSERT_MSG(b.have[s], "n1 missed step %d after rejoining", s);
    ASSERT_EQ(td_same_hashes(&a, &b), gap + (STEPS - back));
    ASSERT_EQ(a.hash[STEPS - 1], b.hash[STEPS - 1]);
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[1], "p0")),
              0);
    ASSERT(td_file_has(c.d[1].log, "draining for a restart"));
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* What `ringctl view` says of the job: the generation (0 when it could
 * not be read) and whether node is a member (a node that came back stays
 * marked `joiner` in the view that took it in, until the next one). */
typedef struct {
    cluster_t *c;
    const char *node;
    const char *out;
    unsigned long long gen;
} view_q_t;

static int read_view(view_q_t *q)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ringctl", th_bindir());
    const char *argv[] = {path, "--etcd", q->c->etcd.url, "--job",
                          "ringtest", "view", NULL};
    unlink(q->out);
    pid_t p = th_spawn((char *const *)argv, q->out);
    td_track(p);
    q->gen = 0;
    if (td_exit_code(p, 15000) != 0)
        return 0;
    char *s = td_read(q->out, NULL);
    int member = 0;
    if (s != NULL && sscanf(s, "generation %llu,", &q->gen) == 1)
        for (char *l = strchr(s, '\n'); l != NULL; l = strchr(l + 1, '\n')) {
            char name[64] = "";
            if (sscanf(l + 1, "%*u %63s", name) == 1 &&
                strcmp(name, q->node) == 0)
                member = 1;
        }
    free(s);
    return member;
}

/* ringctl generation / wait-member, as the README's rolling upgrade
 * runs them: the exit code; out gets the output. */
static int ctl(cluster_t *c, const char *out, const char *const *args)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ringctl", th_bindir());
    const char *argv[16] = {path, "--etcd", c->etcd.url, "--job",
                            "ringtest"};
    int n = 5;
    for (int i = 0; args[i] != NULL && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    unlink(out);
    pid_t p = th_spawn((char *const *)argv, out);
    td_track(p);
    return td_exit_code(p, 90000);
}

/*
 * A rolling restart as daemon/README.md tells it: each daemon of a
 * 2-node job in turn gets SIGUSR2 and is started again, and the next
 * waits until the node is back (`ringctl generation` before the reload,
 * `ringctl wait-member NODE GEN` after it). The leader goes first. Both trainers survive both
 * restarts; every step ran on some node, none twice on one, and the
 * replicas end identical.
 */
TEST_IMPL(dmn_restart_rolling)
{
    enum { STEPS = 4000 };
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    unsetenv("RINGD_RECONNECT_S");
    for (int i = 0; i < 2; i++)
        node_init(&c, i, "1", "2");
    rc_step_delay = "5";
    for (int i = 0; i < 2; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "4000");
    rc_step_delay = NULL;
    ASSERT_OK(td_wait_file(td_path(&c.d[1], "h0"), "step 100 ", 60000));
    for (int i = 0; i < 2; i++) {
        const char *node = i ? "n1" : "n0";
        const char *out = td_path(&c.d[0], "ctl.out");
        view_q_t q = {&c, node, td_path(&c.d[0], "view.out"), 0};
        ASSERT_MSG(read_view(&q), "n%d is not in the view", i);
        const char *gen_args[] = {"generation", NULL};
        ASSERT_EQ(ctl(&c, out, gen_args), 0);
        char *g = td_read(out, NULL);
        ASSERT(g != NULL);
        g[strcspn(g, "\n")] = '\0';
        ASSERT_GE(strtoull(g, NULL, 10), q.gen);
        kill(c.d[i].pid, SIGUSR2);
        ASSERT_EQ(td_exit_code(c.d[i].pid, 30000), 75);
        c.d[i].pid = 0;
        ASSERT_OK(td_wait_file(td_path(&c.d[i], "t0.log"),
                               "ringd: daemon gone", 30000));
        restart_sec();
        restart_node(&c, i, "2");
        const char *wait_args[] = {"--timeout", "60", "wait-member", node,
                                   g, NULL};
        int rc = ctl(&c, out, wait_args);
        if (rc != 0)
            td_dump(out);
        ASSERT_MSG(rc == 0, "n%d not back in the view after its restart",
                   i);
        ASSERT(td_file_has(out, "is a member of view"));
        free(g);
    }
    for (int i = 0; i < 2; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    static td_hashes_t a, b;
    td_read_hashes(td_path(&c.d[0], "h0"), &a);
    td_read_hashes(td_path(&c.d[1], "h0"), &b);
    for (int s = 0; s < STEPS; s++) {
        ASSERT_MSG(a.have[s] || b.have[s], "step %d ran nowhere", s);
        ASSERT_MSG(a.have[s] <= 1 && b.have[s] <= 1,
                   "step %d logged twice on a node", s);
    }
    ASSERT_GT(td_same_hashes(&a, &b), STEPS / 2);
    ASSERT_EQ(a.hash[STEPS - 1], b.hash[STEPS - 1]);
    ASSERT_EQ(a.world[STEPS - 1], 2);
    for (int i = 0; i < 2; i++)
        ASSERT(td_file_has(td_path(&c.d[i], "t0.log"),
                           "parameters restored"));
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[1], "p0")),
              0);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* For td_poll: the log at path shows view 2 installed after it (the
 * node is in view 2's resync). */
static int syncing_view2(void *path)
{
    char *s = td_read(path, NULL);
    char *v = s != NULL ? strstr(s, "view 2: 2 members") : NULL;
    int yes = v != NULL && strstr(v, "-> syncing (a view to install)");
    free(s);
    return yes;
}

/*
 * A node stopped while the view that takes a new node in is being
 * installed, when it holds the only copy of the job's state: n0 trains
 * alone, n1's daemon starts (no trainer yet) and joins, n0 installs
 * view 2 and waits in its resync for n1; SIGTERM to n0 there. n0 leaves
 * only once the install has handed the state over, so n1's trainer,
 * started after the SIGTERM, goes on at the step n0 stopped before, and
 * the job ends as an uninterrupted run ends. (Leaving at once, n1 would
 * be a view of none of the job's members, which starts the job anew.)
 */
TEST_IMPL(dmn_ring_stop_hands_over)
{
    enum { STEPS = 1500 };
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    unsetenv("RINGD_RECONNECT_S");
    node_init(&c, 0, "1", "1");
    reference(&c.d[0], "1500");
    rc_step_delay = "2";
    c.trainer[0][0] = trainer(&c, 0, 0, "1500");
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h0"), "step 50 ", 60000));
    node_init(&c, 1, "1", "1");
    ASSERT_MSG(td_poll(syncing_view2, c.d[0].log, 30000) == 0,
               "n0 never installed view 2");
    kill(c.d[0].pid, SIGTERM);
    ASSERT_OK(td_wait_file(c.d[0].log, "leaving once generation 2 is "
                           "installed", 30000));
    c.trainer[1][0] = trainer(&c, 1, 0, "1500");
    rc_step_delay = NULL;
    ASSERT_EQ(td_exit_code(c.d[0].pid, 30000), 0);
    c.d[0].pid = 0;
    ASSERT(td_file_has(c.d[0].log, "installed, the joiners have the "
                       "state: leaving now"));
    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    expect_exit0(&c, 1, 0, c.trainer[1][0]);
    char *t0 = td_read(td_path(&c.d[0], "t0.log"), NULL);
    const char *key = "daemon drains: stopping before step ";
    char *at = t0 != NULL ? strstr(t0, key) : NULL;
    unsigned long long stop = 0;
    ASSERT_MSG(at != NULL && sscanf(at + strlen(key), "%llu", &stop) == 1,
               "n0's trainer was not told to stop");
    free(t0);
    ASSERT_GT(stop, 50);
    char want[96];
    snprintf(want, sizeof(want), "joined at step %llu: parameters restored",
             stop);
    if (!td_file_has(td_path(&c.d[1], "t0.log"), want)) {
        td_dump(td_path(&c.d[1], "t0.log"));
        td_dump(c.d[0].log);
        td_dump(c.d[1].log);
    }
    ASSERT_MSG(td_file_has(td_path(&c.d[1], "t0.log"), want), "no '%s'",
               want);
    static td_hashes_t a, b;
    td_read_hashes(td_path(&c.d[0], "h0"), &a);
    td_read_hashes(td_path(&c.d[1], "h0"), &b);
    for (int s = 0; s < STEPS; s++) {
        ASSERT_MSG(a.have[s] + b.have[s] == 1, "step %d logged %d times", s,
                   a.have[s] + b.have[s]);
        ASSERT_EQ(b.have[s], s >= (int)stop);
    }
    ASSERT_EQ(td_param_diff(td_path(&c.d[1], "p0"),
                            td_path(&c.d[0], "pref")), 0);
    ASSERT_EQ(td_stop(&c.d[1], 30000), 0);
    return fx_done();
}

/* The first bytes of the file at path (a static buffer). */
static const char *head_of(const char *path)
{
    static char head[16];
    char *s = td_read(path, NULL);
    snprintf(head, sizeof(head), "%s", s ? s : "");
    free(s);
    return head;
}

/* /usr/bin/python3 script args... (NULL-ended), output in log. */
static pid_t py_run(const char *script, const char *const *args,
                    const char *log)
{
    const char *argv[32] = {"/usr/bin/python3", script};
    int n = 2;
    for (int i = 0; args[i] != NULL && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t p = th_spawn((char *const *)argv, log);
    td_track(p);
    return p;
}

/*
 * elastic.run (ringd.torch: DistributedOptimizer with Adam, elastic.State,
 * ElasticSampler) under a standalone daemon restarted mid-job: the
 * trainer waits, the restarted daemon restores the drain's checkpoint,
 * elastic.run restores the model, Adam's moments and step counter and
 * the sampler from it (view.restored), and the job goes on: Adam's
 * counter is the job's step + 1 on every line, every epoch saw each
 * sample once, and the model ends within 1e-5 of one plain process.
 */
TEST_IMPL(dmn_restart_torch_elastic)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    td_daemon_t t;
    td_init(&t, "dmn-restart-torch");
    if (!have_numpy(py, td_path(&t, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    if (!py_imports(py, "import torch", td_path(&t, "torch.log")))
        TEST_SKIP_WHY("torch cannot be imported by %s", py);
    char lib[600], pypath[600], script[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    th_src_path(script, sizeof(script), "tests/py/elastic_train.py");
    th_src_path(pypath, sizeof(pypath), "client/python");
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    const char *flags[8];
    solo_flags(&t, flags);
    ASSERT_OK(td_start(&t, flags));
    unsetenv("RINGD_RECONNECT_S");
    char lg[300], out[300], ref[300], so[300];
    snprintf(lg, sizeof(lg), "%s", td_path(&t, "a.log"));
    snprintf(out, sizeof(out), "%s", td_path(&t, "a.pt"));
    snprintf(ref, sizeof(ref), "%s", td_path(&t, "ref.pt"));
    snprintf(so, sizeof(so), "%s", td_path(&t, "a.out"));
    const char *args[] = {"--mode", "ringd", "--socket", t.sock, "--steps",
                          "150", "--world", "1", "--pace-ms", "10", "--log",
                          lg, "--out", out, NULL};
    pid_t p = py_run(script, args, so);
    ASSERT_OK(td_wait_file(lg, "step 40 ", 120000));
    kill(t.pid, SIGUSR2);
    ASSERT_EQ(td_exit_code(t.pid, 30000), 75);
    t.pid = 0;
    ASSERT_OK(td_wait_file(so, "ringd: daemon gone, waiting up to 30 s",
                           30000));
    restart_sec();
    ASSERT_MSG(alive(p), "the torch trainer did not wait for its daemon");
    ASSERT_OK(td_start(&t, flags));
    int rc = td_exit_code(p, 120000);
    if (rc != 0)
        td_dump(so), td_dump(t.log);
    ASSERT_EQ(rc, 0);
    ASSERT(td_file_has(t.log, "restart: the checkpoint of step "));
    ASSERT(td_file_has(t.log, "job state restored from the checkpoint"));
    /* Each of the 150 steps logged once: the drain's checkpoint was the
     * boundary, so none ran twice. */
    ASSERT_EQ(td_count(lg, "\nstep ") + (strncmp(head_of(lg), "step ",
                                                  5) == 0), 150);
    const char *chk[] = {"--check", lg, NULL};
    ASSERT_EQ(td_exit_code(py_run(script, chk, td_path(&t, "check.out")),
                           120000), 0);
    const char *rargs[] = {"--mode", "ref", "--steps", "150", "--world", "1",
                           "--out", ref, NULL};
    ASSERT_EQ(td_exit_code(py_run(script, rargs, td_path(&t, "ref.out")),
                           120000), 0);
    const char *cmp[] = {"--compare", out, ref, "1e-5", NULL};
    rc = td_exit_code(py_run(script, cmp, td_path(&t, "cmp.out")), 120000);
    if (rc != 0)
        td_dump(td_path(&t, "cmp.out"));
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
