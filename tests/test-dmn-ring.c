/*
 * Several real ringd daemons on one real etcd, joined by the UCX ring on
 * loopback, with real trainers: data-parallel equivalence across nodes, a
 * SIGKILLed daemon (the survivors redo the step and finish, bitwise
 * identical), and a node joining mid-job (it gets the state and takes
 * part from the next step boundary).
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "include/ringd.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/ring-cluster.h"
#include "tests/task.h"


/* 3 nodes x 2 trainers reach the parameters of one process on the same
 * global batch, and all six replicas are bitwise identical at every step. */
TEST_IMPL(dmn_ring_three_nodes_match_one)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "2", "3");
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++)
            c.trainer[i][k] = trainer(&c, i, k, "120");
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++)
            expect_exit0(&c, i, k, c.trainer[i][k]);

    const char *ref[] = {"--no-daemon", "--steps", "120", "--save",
                         td_path(&c.d[0], "pref"), NULL};
    ASSERT_EQ(td_exit_code(td_trainer(&c.d[0], ref,
                                      td_path(&c.d[0], "ref.log")),
                           60000), 0);
    static td_hashes_t h0, hx;
    td_read_hashes(td_path(&c.d[0], "h0"), &h0);
    ASSERT_EQ(h0.nsteps, 120);
    ASSERT_EQ(h0.world[119], 6);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) {
            td_read_hashes(td_path(&c.d[i], k ? "h1" : "h0"), &hx);
            ASSERT_EQ(td_same_hashes(&h0, &hx), 120);
            ASSERT_EQ(td_param_diff(td_path(&c.d[i], k ? "p1" : "p0"),
                                    td_path(&c.d[0], "p0")), 0);
        }
    double d = td_param_diff(td_path(&c.d[0], "p0"),
                             td_path(&c.d[0], "pref"));
    ASSERT_MSG(d < 1e-3, "3x2 trainers vs 1 process differ by %g", d);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* A 2-node job of one trainer per node; RINGD_ZERO_COPY=zc for the
 * daemons. Returns how many collectives ran in a trainer's buffer. */
static double zc_job(cluster_t *c, const char *zc)
{
    setenv("RINGD_ZERO_COPY", zc, 1);
    fx_etcd_start(&c->etcd, 0);
    for (int i = 0; i < 2; i++)
        node_init(c, i, "1", "2");
    unsetenv("RINGD_ZERO_COPY");
    for (int i = 0; i < 2; i++)
        c->trainer[i][0] = trainer(c, i, 0, "80");
    for (int i = 0; i < 2; i++)
        expect_exit0(c, i, 0, c->trainer[i][0]);
    double zero_copy = 0;
    for (int i = 0; i < 2; i++) {
        double v = td_metric(&c->d[i], "ringd_collectives_zero_copy_total");
        ASSERT_MSG(v >= 0, "n%d exports no zero-copy counter", i);
        zero_copy += v;
    }
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c->d[i], 30000), 0);
    return zero_copy;
}

/*
 * One trainer per node: the ring runs in the trainer's shared buffer
 * (no copy in the daemon). The same job through the copying path
 * (RINGD_ZERO_COPY=0: staging in, staging out) gives the same bits at
 * every step, and the counter says which path each job took.
 */
TEST_IMPL(dmn_ring_zero_copy_matches_copy)
{
    cluster_env();
    static cluster_t zc = {.n = 2}, cp = {.n = 2};
    double direct = zc_job(&zc, "1");
    double copied = zc_job(&cp, "0");
    ASSERT_MSG(direct >= 2 * 80, "zero-copy collectives: %g", direct);
    ASSERT_MSG(copied == 0, "the copying path ran %g zero-copy", copied);
    static td_hashes_t hz, hc;
    for (int i = 0; i < 2; i++) {
        td_read_hashes(td_path(&zc.d[i], "h0"), &hz);
        td_read_hashes(td_path(&cp.d[i], "h0"), &hc);
        ASSERT_EQ(hz.nsteps, 80);
        ASSERT_EQ(td_same_hashes(&hz, &hc), 80);
        ASSERT_EQ(td_param_diff(td_path(&zc.d[i], "p0"),
                                td_path(&cp.d[i], "p0")), 0);
    }
    return fx_done();
}

/*
 * A 2-node job of two trainers per node, 60 steps; RINGD_LOCAL_PIPE=pipe
 * for the daemons, more daemon flags dflags and trainer flags targs
 * (NULL-ended). Each trainer k logs h<k> and saves p<k>. Returns n0's
 * ringd_collectives_fused_total.
 */
static double pipe_job(cluster_t *c, const char *pipe,
                     const char *const *dflags, const char *const *targs)
{
    setenv("RINGD_LOCAL_PIPE", pipe, 1);
    rc_flags = dflags;
    fx_etcd_start(&c->etcd, 0);
    for (int i = 0; i < 2; i++)
        node_init(c, i, "2", "2");
    rc_flags = NULL;
    unsetenv("RINGD_LOCAL_PIPE");
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) {
            char h[8], p[8], lg[16];
            snprintf(h, sizeof(h), "h%d", k);
            snprintf(p, sizeof(p), "p%d", k);
            snprintf(lg, sizeof(lg), "t%d.log", k);
            const char *args[16] = {"--steps", "60", "--hash-log",
                                    td_path(&c->d[i], h), "--save",
                                    td_path(&c->d[i], p)};
            for (int a = 0; targs[a] != NULL && a < 8; a++)
                args[6 + a] = targs[a];
            c->trainer[i][k] = td_trainer(&c->d[i], args,
                                          td_path(&c->d[i], lg));
        }
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++)
            expect_exit0(c, i, k, c->trainer[i][k]);
    double fused = td_metric(&c->d[0], "ringd_collectives_fused_total");
    /* --fuse-backwards: the pieces are not end to end, so every group is
     * gathered through staging (the fused layout of the local sources) */
    ASSERT_EQ(td_metric(&c->d[0], "ringd_collectives_fused_in_place_total"),
              0);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c->d[i], 30000), 0);
    return fused;
}

/* The same job pipelined and staged: every trainer of both ends at the
 * same bits at every step, and each daemon said which path it took. */
static void pipe_compare(cluster_t *pl, cluster_t *st,
                         const char *const *dflags,
                         const char *const *targs, double fused)
{
    ASSERT_GE(pipe_job(pl, "1", dflags, targs), fused);
    ASSERT_GE(pipe_job(st, "0", dflags, targs), fused);
    static td_hashes_t hp, hs;
    for (int i = 0; i < 2; i++) {
        ASSERT(td_file_has(pl->d[i].log, "(pipelined)"));
        ASSERT(!td_file_has(pl->d[i].log, "(staged"));
        ASSERT(td_file_has(st->d[i].log, "(staged, RINGD_LOCAL_PIPE=0)"));
        ASSERT(!td_file_has(st->d[i].log, "(pipelined)"));
        for (int k = 0; k < 2; k++) {
            const char *h = k ? "h1" : "h0", *p = k ? "p1" : "p0";
            td_read_hashes(td_path(&pl->d[i], h), &hp);
            td_read_hashes(td_path(&st->d[i], h), &hs);
            ASSERT_EQ(hp.nsteps, 60);
            ASSERT_EQ(hp.world[59], 4);
            ASSERT_EQ(td_same_hashes(&hp, &hs), 60);
            ASSERT_EQ(td_param_diff(td_path(&pl->d[i], p),
                                    td_path(&st->d[i], p)), 0);
            ASSERT_EQ(td_param_diff(td_path(&pl->d[i], p),
                                    td_path(&pl->d[0], "p0")), 0);
        }
    }
    fx_done(); /* both jobs' etcds: the fixture tracks only four */
}

/*
 * Two trainers per node: the daemons reduce them chunk by chunk into the
 * ring (RINGD_LOCAL_PIPE unset) or into staging first (=0, the staged
 * path). With 1 KiB chunks (about ten per segment of the 19 KiB
 * gradient), the two paths give the same bits at every step: averaged
 * with bf16 on the wire; and fused (three asynchronous allreduces in one
 * group) on two rings.
 */
TEST_IMPL(dmn_ring_local_pipe_matches_staged)
{
    cluster_env();
    const char *wire[] = {"--ring-chunk-kib", "1", "--ring-wire", "bf16",
                          NULL};
    const char *plain[] = {NULL};
    static cluster_t c[4] = {{.n = 2}, {.n = 2}, {.n = 2}, {.n = 2}};
    pipe_compare(&c[0], &c[1], wire, plain, 0);
    const char *bidir[] = {"--ring-chunk-kib", "1", "--ring-bidirectional",
                           NULL};
    const char *fused[] = {"--async", "3", "--fuse-backwards", NULL};
    pipe_compare(&c[2], &c[3], bidir, fused, 3 * 60);
    return fx_done();
}

/*
 * SIGKILL one daemon mid-training: the survivors' collective returns
 * RINGD_ERESHAPE (or their next step start waits for the new view), they
 * go on on a 2-node ring and finish every step, bitwise identical. Then a new node joins: its trainer starts from
 * the job's state at a step boundary and ends identical too.
 */
TEST_IMPL(dmn_ring_kill_and_join)
{
    /* Long enough that the job is still running when n3 joins (its
     * daemon takes a few hundred ms to register). */
    enum { KJ_STEPS = 3000 };
    const char *KJ_STEPS_S = "3000";
    cluster_env();
    cluster_t c = {.n = 4};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    for (int i = 0; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, KJ_STEPS_S);
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h0"), "step 60 ", 60000));
    th_kill(c.d[1].pid);
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h0"), "world 2", 30000));
    node_init(&c, 3, "1", "1");
    c.trainer[3][0] = trainer(&c, 3, 0, KJ_STEPS_S);
    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    expect_exit0(&c, 2, 0, c.trainer[2][0]);
    expect_exit0(&c, 3, 0, c.trainer[3][0]);
    ASSERT_NE(td_exit_code(c.trainer[1][0], 30000), 0); /* lost its daemon */

    static td_hashes_t h0, h2, h3;
    td_read_hashes(td_path(&c.d[0], "h0"), &h0);
    td_read_hashes(td_path(&c.d[2], "h0"), &h2);
    td_read_hashes(td_path(&c.d[3], "h0"), &h3);
    /* A survivor that was one step behind when n1 died receives that
     * step in the state from the one ahead instead of computing it, so
     * it may not log it: every step is logged by one survivor at least,
     * and wherever two logged a step, they agree bit for bit. */
    for (int s = 0; s < KJ_STEPS; s++)
        ASSERT_MSG(h0.have[s] || h2.have[s], "step %d ran nowhere", s);
    ASSERT_GE(td_same_hashes(&h0, &h2), KJ_STEPS - 10);
    ASSERT_GT(td_same_hashes(&h0, &h3), 0);
    ASSERT_EQ(h0.hash[KJ_STEPS - 1], h2.hash[KJ_STEPS - 1]);
    ASSERT_EQ(h0.hash[KJ_STEPS - 1], h3.hash[KJ_STEPS - 1]);
    ASSERT_EQ(h0.world[KJ_STEPS - 1], 3); /* the joiner took part */
    /* The kill lands mid-collective (the trainer redoes the step) or
     * between steps (the step start waits for the new view): either way
     * n0 installed a view without n1. */
    ASSERT(td_file_has(c.d[0].log, "ring backend: view 2"));
    ASSERT(td_file_has(td_path(&c.d[3], "t0.log"), "restored"));
    for (int i = 0; i < 4; i++)
        if (i != 1)
            ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * Trainers die, daemons stay. n0 runs 2 trainers, n1 and n2 one each, and
 * the ring deadline is longer than the test may run, so only the daemons'
 * own handling can keep the job going:
 *  - one of n0's trainers is SIGKILLed mid-step: n0 asks for a new
 *    generation of the view, every node redoes the step, and the job goes
 *    on with 3 trainers;
 *  - n1's only trainer is SIGKILLed: n1 leaves the job (the others go on
 *    with 2 trainers), and when a new trainer connects it registers again
 *    and its trainer gets the job's state.
 * Every step runs somewhere and the survivors end bitwise identical.
 */
TEST_IMPL(dmn_ring_trainer_lost)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    rc_deadline = "600000";
    node_init(&c, 0, "2", "3");
    node_init(&c, 1, "1", "3");
    node_init(&c, 2, "1", "3");
    rc_deadline = NULL;
    const char *steps = "1500";
    c.trainer[0][0] = trainer(&c, 0, 0, steps);
    rc_crash_at = "100";
    c.trainer[0][1] = trainer(&c, 0, 1, steps);
    rc_crash_at = "400";
    c.trainer[1][0] = trainer(&c, 1, 0, steps);
    rc_crash_at = NULL;
    c.trainer[2][0] = trainer(&c, 2, 0, steps);
    const char *h00 = td_path(&c.d[0], "h0");

    /* n0's second trainer dies in step 100, after step_begin. */
    ASSERT_NE(td_exit_code(c.trainer[0][1], 60000), 0);
    ASSERT_OK(td_wait_file(h00, "world 3", 60000));
    ASSERT(td_file_has(c.d[0].log, "asking for a new generation"));

    /* n1's only trainer dies in step 400. */
    ASSERT_NE(td_exit_code(c.trainer[1][0], 60000), 0);
    ASSERT_OK(td_wait_file(h00, "world 2", 60000));
    ASSERT_OK(td_wait_file(c.d[1].log, "leaving the job until one connects",
                           10000));
    c.trainer[1][1] = trainer(&c, 1, 1, steps);
    ASSERT_OK(td_wait_file(td_path(&c.d[1], "h1"), "world 3", 60000));
    ASSERT(td_file_has(c.d[1].log, "registering again"));

    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    expect_exit0(&c, 1, 1, c.trainer[1][1]);
    expect_exit0(&c, 2, 0, c.trainer[2][0]);
    ASSERT(td_file_has(td_path(&c.d[1], "t1.log"), "restored"));

    static td_hashes_t h0, h2, h1;
    td_read_hashes(h00, &h0);
    td_read_hashes(td_path(&c.d[2], "h0"), &h2);
    td_read_hashes(td_path(&c.d[1], "h1"), &h1);
    for (int s = 0; s < 1500; s++)
        ASSERT_MSG(h0.have[s] || h2.have[s], "step %d ran nowhere", s);
    ASSERT_GE(td_same_hashes(&h0, &h2), 1490);
    ASSERT_GT(td_same_hashes(&h0, &h1), 0);
    ASSERT_EQ(h0.hash[1499], h2.hash[1499]);
    ASSERT_EQ(h0.hash[1499], h1.hash[1499]);
    ASSERT_EQ(h0.world[1499], 3);
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[2], "p0")),
              0);
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[1], "p1")),
              0);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* 1 once process pid sleeps in poll(2) (x86-64 syscall 7): the trainer
 * waiting for its step_begin reply. */
static int in_poll(void *pid_p)
{
    char path[64], buf[64] = "";
    snprintf(path, sizeof(path), "/proc/%d/syscall", (int)*(pid_t *)pid_p);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    int ok = fgets(buf, sizeof(buf), f) != NULL && strncmp(buf, "7 ", 2) == 0;
    fclose(f);
    return ok;
}

/*
 * A node's only trainer dies while it waits in step_begin for the step's
 * agreement (the other node's trainer is stopped between steps): the node
 * steps out of the job and must not register again before a trainer is
 * back (it once did at once, with no state, and every REBUILD then failed
 * on the state size: the job stopped). The other node goes on alone, a
 * new trainer brings the node back, both end identical.
 */
TEST_IMPL(dmn_ring_trainer_lost_waiting)
{
#if !defined(__x86_64__)
    TEST_SKIP_WHY("in_poll knows x86-64 syscall numbers only");
#endif
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    node_init(&c, 0, "1", "2");
    node_init(&c, 1, "1", "2");
    /* Steps enough that n1, alone once n0 is out, cannot finish before
     * n0's new trainer is back, however slow that rejoin is on a loaded
     * machine (1500 lost that race about 1 run in 3 under load). */
    c.trainer[0][0] = trainer(&c, 0, 0, "8000");
    rc_stop_after = "100";
    c.trainer[1][0] = trainer(&c, 1, 0, "8000");
    rc_stop_after = NULL;
    int st;
    ASSERT_EQ(waitpid(c.trainer[1][0], &st, WUNTRACED), c.trainer[1][0]);
    ASSERT(WIFSTOPPED(st));
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h0"), "step 100 ", 30000));
    ASSERT_MSG(td_poll(in_poll, &c.trainer[0][0], 10000) == 0,
               "n0's trainer never waited in step_begin");
    th_kill(c.trainer[0][0]);
    ASSERT_OK(td_wait_file(c.d[0].log, "leaving the job until one connects",
                           10000));
    kill(c.trainer[1][0], SIGCONT);
    ASSERT_OK(td_wait_file(td_path(&c.d[1], "h0"), "world 1", 30000));
    ASSERT(!td_file_has(c.d[0].log, "registering again"));
    c.trainer[0][1] = trainer(&c, 0, 1, "8000");
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h1"), "world 2", 30000));
    expect_exit0(&c, 0, 1, c.trainer[0][1]);
    expect_exit0(&c, 1, 0, c.trainer[1][0]);
    ASSERT(!td_file_has(c.d[0].log, "state sizes differ"));
    ASSERT(!td_file_has(c.d[1].log, "state sizes differ"));
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p1"), td_path(&c.d[1], "p0")),
              0);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * --ucx-opt reaches UCX: TLS=bogus_transport (either spelling, with or
 * without the UCX_ prefix, over UCX_TLS=tcp in the environment) leaves
 * UCX no transport, so the daemon cannot create its context and exits 1
 * naming the failure, before it ever registers; TLS=tcp is a transport
 * UCX has, and a 2-node job runs on it.
 */
TEST_IMPL(dmn_ring_ucx_opt)
{
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    const char *bad[] = {"TLS=bogus_transport", "UCX_TLS=bogus_transport"};
    setenv("UCX_TLS", "tcp", 1); /* the option wins over the environment */
    for (int b = 0; b < 2; b++) {
        td_daemon_t t;
        td_init(&t, "dmn-ring-ucx");
        char path[512];
        snprintf(path, sizeof(path), "%s/ringd", th_bindir());
        const char *argv[] = {path, "--etcd", c.etcd.url, "--job",
                              "ringtest", "--node-id", "bad", "--socket",
                              t.sock, "--metrics", "off", "--ucx-opt",
                              bad[b], NULL};
        pid_t p = th_spawn((char *const *)argv, t.log);
        td_track(p);
        int rc = td_exit_code(p, 30000);
        if (rc != 1)
            td_dump(t.log);
        ASSERT_EQ(rc, 1);
        ASSERT(td_file_has(t.log, "'bogus_transport' is not available"));
        ASSERT(td_file_has(t.log, "ucp_init: "));
        ASSERT(td_file_has(t.log, "ringd could not start"));
        ASSERT(!td_file_has(t.log, "node record written"));
    }
    unsetenv("UCX_TLS");
    rc_ucx_opt = "TLS=tcp";
    for (int i = 0; i < 2; i++)
        node_init(&c, i, "1", "2");
    rc_ucx_opt = NULL;
    for (int i = 0; i < 2; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "30");
    for (int i = 0; i < 2; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    static td_hashes_t h0, h1;
    td_read_hashes(td_path(&c.d[0], "h0"), &h0);
    td_read_hashes(td_path(&c.d[1], "h0"), &h1);
    ASSERT_EQ(h0.world[29], 2);
    ASSERT_EQ(td_same_hashes(&h0, &h1), 30);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * `ringctl drain n1` on a real 3-node job mid-training: n1 finishes the
 * step it is in and leaves at the boundary (its trainer's next step_begin
 * gets RINGD_ESHUTDOWN; trainer and daemon exit 0), the others go on in a
 * view without it (world 3 up to n1's last step, 2 from the next one) and
 * finish, bitwise identical; n1's steps match theirs.
 */
TEST_IMPL(dmn_ring_drain)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    for (int i = 0; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "3000");
    ASSERT_OK(td_wait_file(td_path(&c.d[1], "h0"), "step 200 ", 60000));
    char out[600], path[512];
    snprintf(out, sizeof(out), "%s", td_path(&c.d[0], "drain.out"));
    snprintf(path, sizeof(path), "%s/ringctl", th_bindir());
    char *const argv[] = {path, "--etcd", c.etcd.url, "--job", "ringtest",
                          "drain", "n1", NULL};
    int st = -1;
    pid_t p = th_spawn(argv, out);
    ASSERT_GT(p, 0);
    ASSERT_OK(th_wait(p, 15000, &st));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        td_dump(out);
    ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ASSERT(td_file_has(out, "drain of n1 requested"));

    expect_exit0(&c, 1, 0, c.trainer[1][0]);
    ASSERT(td_file_has(td_path(&c.d[1], "t0.log"),
                       "daemon drains: stopping"));
    ASSERT_EQ(td_exit_code(c.d[1].pid, 30000), 0);
    c.d[1].pid = 0;
    ASSERT(td_file_has(c.d[1].log, "drained at step"));
    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    expect_exit0(&c, 2, 0, c.trainer[2][0]);

    static td_hashes_t h0, h1, h2;
    td_read_hashes(td_path(&c.d[0], "h0"), &h0);
    td_read_hashes(td_path(&c.d[1], "h0"), &h1);
    td_read_hashes(td_path(&c.d[2], "h0"), &h2);
    int last = h1.nsteps - 1; /* n1's last completed step */
    ASSERT_GE(last, 200);
    ASSERT_LT(last, 2999);
    ASSERT_EQ(td_same_hashes(&h0, &h1), last + 1);
    ASSERT_EQ(h0.world[last], 3);
    ASSERT_EQ(h0.world[last + 1], 2);
    ASSERT_EQ(td_same_hashes(&h0, &h2), 3000);
    ASSERT_EQ(h0.world[2999], 2);
    ASSERT(td_file_has(c.d[0].log, ": 2 members, me #"));
    for (int i = 0; i < 3; i++)
        if (i != 1)
            ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * Every step's hash-log lines over the logs of all the job's trainers:
 * each step ran somewhere, every trainer of it was told the same world,
 * exactly world trainers logged it and their ranks are 0..world-1 once
 * each. world is the AVG divisor (the daemon's job_reduce_t.divisor is the
 * view's global_trainers), so this checks the divisor, global_trainers and
 * rank_offset of every node at every step.
 */
static void check_step_ranks(const char *const *logs, int nlogs, int steps)
{
    static unsigned world[TD_MAX_STEPS], seen[TD_MAX_STEPS];
    static unsigned long long ranks[TD_MAX_STEPS];
    memset(world, 0, sizeof(world));
    memset(seen, 0, sizeof(seen));
    memset(ranks, 0, sizeof(ranks));
    for (int i = 0; i < nlogs; i++) {
        char *s = td_read(logs[i], NULL);
        ASSERT_MSG(s != NULL, "no hash log %s", logs[i]);
        for (char *l = strtok(s, "\n"); l; l = strtok(NULL, "\n")) {
            long st;
            unsigned long long gen;
            unsigned r, w;
            if (sscanf(l, "step %ld gen %llu rank %u world %u", &st, &gen,
                       &r, &w) != 4 || st < 0 || st >= steps)
                continue;
            ASSERT_MSG(r < w && w < 64, "%s: step %ld rank %u world %u",
                       logs[i], st, r, w);
            ASSERT_MSG(seen[st] == 0 || world[st] == w,
                       "step %ld: world %u in %s, %u elsewhere", st, w,
                       logs[i], world[st]);
            ASSERT_MSG(!(ranks[st] & (1ull << r)),
                       "step %ld: rank %u twice", st, r);
            world[st] = w;
            seen[st]++;
            ranks[st] |= 1ull << r;
        }
        free(s);
    }
    for (int st = 0; st < steps; st++)
        ASSERT_MSG(seen[st] > 0 && seen[st] == world[st],
                   "step %d: %u trainers logged it, world %u", st, seen[st],
                   world[st]);
}

typedef struct {
    cluster_t *c;
    double step;
} step_wait_t;

/* For td_poll: n1's ringd_step reached w->step. */
static int n1_reached(void *arg)
{
    step_wait_t *w = arg;
    return td_metric(&w->c->d[1], "ringd_step") >= w->step;
}

/*
 * The trainer counts travel only when they change. n2, the last node of
 * the ring (n0 -> n1 -> n2 -> n0: n1 hears n2's flags through n0),
 * starts with two trainers, n0 and n1 with one; n2's second trainer
 * leaves after step 159 (its last) and a new one joins n2 while n0's
 * trainer is stopped after step 1000 (so the join lands mid-job however
 * fast the steps run). Over 100 steady steps no node agrees the counts
 * more than twice (it once did at every step); the leave and the join
 * void one step on every node, which is redone on the new counts: at
 * every step every node's world, ranks and divisor count exactly the
 * trainers that took part, the replicas end bitwise identical and match
 * one process training the same global batch.
 */
TEST_IMPL(dmn_ring_trainer_counts)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    node_init(&c, 0, "1", "3");
    node_init(&c, 1, "1", "3");
    node_init(&c, 2, "2", "3");
    const char *steps = "2000";
    rc_stop_after = "1000";
    c.trainer[0][0] = trainer(&c, 0, 0, steps);
    rc_stop_after = NULL;
    c.trainer[1][0] = trainer(&c, 1, 0, steps);
    c.trainer[2][0] = trainer(&c, 2, 0, steps);
    c.trainer[2][1] = trainer(&c, 2, 1, "160"); /* logs as the others */
    ASSERT_EQ(td_exit_code(c.trainer[2][1], 60000), 0);

    step_wait_t w = {&c, 170};
    ASSERT_OK(td_poll(n1_reached, &w, 60000));
    double a0[3], s0 = td_metric(&c.d[1], "ringd_step");
    for (int i = 0; i < 3; i++)
        a0[i] = td_metric(&c.d[i], "ringd_agreements_total");
    w.step = s0 + 100;
    ASSERT_OK(td_poll(n1_reached, &w, 60000));
    for (int i = 0; i < 3; i++) {
        double a = td_metric(&c.d[i], "ringd_agreements_total");
        ASSERT_MSG(a0[i] >= 0 && a - a0[i] <= 2,
                   "n%d agreed %g times in 100 steady steps", i, a - a0[i]);
    }
    int st;
    ASSERT_EQ(waitpid(c.trainer[0][0], &st, WUNTRACED), c.trainer[0][0]);
    ASSERT(WIFSTOPPED(st));
    c.trainer[2][1] = trainer(&c, 2, 1, steps); /* appends to h1 */
    ASSERT_OK(td_wait_file(c.d[2].log, "client 3 connected", 30000));
    kill(c.trainer[0][0], SIGCONT);
    for (int i = 0; i < 3; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    expect_exit0(&c, 2, 1, c.trainer[2][1]);
    ASSERT(td_file_has(c.d[2].log, "view 1: 3 members, me #2"));

    static char logs[4][512];
    snprintf(logs[0], sizeof(logs[0]), "%s", td_path(&c.d[0], "h0"));
    snprintf(logs[1], sizeof(logs[1]), "%s", td_path(&c.d[1], "h0"));
    snprintf(logs[2], sizeof(logs[2]), "%s", td_path(&c.d[2], "h0"));
    snprintf(logs[3], sizeof(logs[3]), "%s", td_path(&c.d[2], "h1"));
    const char *const lp[] = {logs[0], logs[1], logs[2], logs[3]};
    check_step_ranks(lp, 4, 2000);
    static td_hashes_t h;
    td_read_hashes(logs[1], &h);
    ASSERT_EQ(h.world[0], 4);
    ASSERT_EQ(h.world[1000], 3);
    ASSERT_EQ(h.world[1999], 4);
    /* n0's and n1's trainers never changed: they learned both changes
     * from the flags on the ring, and agreed a few times in all. */
    for (int i = 0; i < 2; i++)
        ASSERT_GE(td_count(c.d[i].log, "trainer count changed"), 2);
    for (int i = 0; i < 3; i++) {
        double a = td_metric(&c.d[i], "ringd_agreements_total");
        ASSERT_MSG(a >= 2 && a <= 8, "n%d agreed %g times in 2000 steps",
                   i, a);
    }

    const char *ref[] = {"--no-daemon", "--steps", steps, "--save",
                         td_path(&c.d[0], "pref"), NULL};
    ASSERT_EQ(td_exit_code(td_trainer(&c.d[0], ref,
                                      td_path(&c.d[0], "ref.log")),
                           60000), 0);
    for (int i = 1; i < 3; i++)
        ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"),
                                td_path(&c.d[i], "p0")), 0);
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[2], "p1")),
              0);
    double d = td_param_diff(td_path(&c.d[0], "p0"),
                             td_path(&c.d[0], "pref"));
    ASSERT_MSG(d < 1e-3, "the job vs 1 process differ by %g", d);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* ---- steps without a collective ----------------------------------------- */

enum { NC_STEPS = 30, NC_COUNT = 256, NC_BYTES = 64 };

/* What step s runs: an allreduce (0-9, 20-29), nothing (10-14) or only a
 * broadcast (15-19), the same on every node. */
static int nc_kind(uint64_t s)
{
    return s < 10 || s >= 20 ? 'a' : s < 15 ? '-' : 'b';
}

/* One trainer of the job, in a child process: 0 when every step's result
 * was right. */
static int nc_trainer(const char *sock)
{
    ringd_client_t *c = NULL;
    if (ringd_connect(&c, sock, NULL) != 0)
        return 10;
    float *f = ringd_buffer(c, NC_COUNT * sizeof(float));
    uint8_t *b = ringd_buffer(c, NC_BYTES);
    if (f == NULL || b == NULL)
        return 11;
    for (;;) {
        ringd_view_t v;
        if (ringd_step_begin(c, &v) != 0)
            return 12;
        if (v.step >= NC_STEPS)
            break;
        int rc = 0;
        if (nc_kind(v.step) == 'a') {
            for (int i = 0; i < NC_COUNT; i++)
                f[i] = (float)(v.rank + 1 + i);
            rc = ringd_allreduce(c, f, NC_COUNT, RINGD_F32, RINGD_SUM);
            for (int i = 0; rc == 0 && i < NC_COUNT; i++)
                if (f[i] != (float)(v.world * (v.world + 1) / 2 +
                                    v.world * i)) {
                    fprintf(stderr, "step %llu: [%d] = %g\n",
                            (unsigned long long)v.step, i, f[i]);
                    return 13;
                }
        } else if (nc_kind(v.step) == 'b') {
            for (int i = 0; i < NC_BYTES; i++)
                b[i] = v.rank == 0 ? (uint8_t)(v.step + i) : 0;
            rc = ringd_broadcast(c, b, NC_BYTES, 0);
            for (int i = 0; rc == 0 && i < NC_BYTES; i++)
                if (b[i] != (uint8_t)(v.step + i))
                    return 14;
        }
        if (rc == RINGD_ERESHAPE)
            continue;
        if (rc != 0 || ringd_step_end(c) != 0)
            return 15;
    }
    ringd_close(c);
    return 0;
}

/*
 * Steps that carry no flags (none run a collective, or only a
 * broadcast, which does not reach every node's flags) make every node
 * agree the trainer counts at the next step start, and only those: of
 * 30 steps, 5 without a collective and 5 broadcast-only ones cost
 * exactly 10 agreements on every node, the allreduce steps none, and no
 * node waits for another that skipped (the job finishes, every result
 * right).
 */
TEST_IMPL(dmn_ring_steps_without_collective)
{
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 2; i++)
        node_init(&c, i, "1", "2");
    pid_t p[2];
    for (int i = 0; i < 2; i++)
        if ((p[i] = td_fork()) == 0)
            _exit(nc_trainer(c.d[i].sock));
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_exit_code(p[i], 60000), 0);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(td_metric(&c.d[i], "ringd_steps_total"), NC_STEPS);
        ASSERT_EQ(td_metric(&c.d[i], "ringd_agreements_total"), 10);
    }
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * A one-node ring job agrees with itself at once when a trainer joins
 * (nobody else needs telling): no step is voided, exactly one agreement,
 * and every step's world and ranks count the trainers that ran it.
 */
TEST_IMPL(dmn_ring_one_node_join)
{
    cluster_env();
    cluster_t c = {.n = 1};
    fx_etcd_start(&c.etcd, 0);
    node_init(&c, 0, "1", "1");
    c.trainer[0][0] = trainer(&c, 0, 0, "3000");
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h0"), "step 100 ", 60000));
    c.trainer[0][1] = trainer(&c, 0, 1, "3000");
    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    expect_exit0(&c, 0, 1, c.trainer[0][1]);
    static char logs[2][512];
    snprintf(logs[0], sizeof(logs[0]), "%s", td_path(&c.d[0], "h0"));
    snprintf(logs[1], sizeof(logs[1]), "%s", td_path(&c.d[0], "h1"));
    const char *const lp[] = {logs[0], logs[1]};
    check_step_ranks(lp, 2, 3000);
    static td_hashes_t h;
    td_read_hashes(logs[1], &h);
    ASSERT_EQ(h.world[2999], 2);
    ASSERT(!td_file_has(c.d[0].log, "trainer count changed"));
    ASSERT_EQ(td_metric(&c.d[0], "ringd_agreements_total"), 1);
    ASSERT_EQ(td_stop(&c.d[0], 30000), 0);
    return fx_done();
}

/*
 * --ring-grid-min-nodes 4 on a 4-node job: every daemon builds the
 * two-level ring (2 rows of 2), and the job's 4 replicas are bitwise
 * identical at every step and close to one process on the same global
 * batch (the grid sums in another order than the flat ring).
 */
TEST_IMPL(dmn_ring_grid_four_nodes)
{
    cluster_env();
    cluster_t c = {.n = 4};
    fx_etcd_start(&c.etcd, 0);
    rc_grid = "4";
    for (int i = 0; i < 4; i++)
        node_init(&c, i, "1", "4");
    rc_grid = NULL;
    for (int i = 0; i < 4; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "60");
    for (int i = 0; i < 4; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    const char *ref[] = {"--no-daemon", "--steps", "60", "--save",
                         td_path(&c.d[0], "pref"), NULL};
    ASSERT_EQ(td_exit_code(td_trainer(&c.d[0], ref,
                                      td_path(&c.d[0], "ref.log")),
                           60000), 0);
    static td_hashes_t h0, hx;
    td_read_hashes(td_path(&c.d[0], "h0"), &h0);
    ASSERT_EQ(h0.nsteps, 60);
    ASSERT_EQ(h0.world[59], 4);
    for (int i = 0; i < 4; i++) {
        ASSERT_MSG(td_file_has(c.d[i].log, "grid of 2 rows 2-2 wide"),
                   "n%d did not build the grid", i);
        td_read_hashes(td_path(&c.d[i], "h0"), &hx);
        ASSERT_EQ(td_same_hashes(&h0, &hx), 60);
        ASSERT_EQ(td_param_diff(td_path(&c.d[i], "p0"),
                                td_path(&c.d[0], "p0")), 0);
    }
    double d = td_param_diff(td_path(&c.d[0], "p0"),
                             td_path(&c.d[0], "pref"));
    ASSERT_MSG(d < 1e-3, "4 nodes on the grid vs 1 process differ by %g", d);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}
