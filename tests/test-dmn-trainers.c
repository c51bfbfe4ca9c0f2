/*
 * Trainers that come and go on a node of a running job (real etcd, real
 * daemons, real trainers), with a ring deadline longer than the test may
 * run, so only the daemons' handling of the trainers keeps the job going:
 *  - a trainer that leaves cleanly (ringd_close: BYE) is a leave like a
 *    loss: its node, left without trainers, steps out and the others go on.
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
#include "tests/ring-cluster.h"
#include "tests/task.h"

/*
 * 3 nodes x 1 trainer; n1's trainer is given 100 steps of the job's 1500,
 * so it ends its part and closes its connection cleanly (BYE) mid-job.
 * n1 steps out (it has no trainer left) and n0 and n2 go on in a new
 * generation with 2 trainers, ending bitwise identical.
 */
TEST_IMPL(dmn_trainers_clean_leave)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    rc_deadline = "600000";
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    rc_deadline = NULL;
    c.trainer[0][0] = trainer(&c, 0, 0, "1500");
    c.trainer[1][0] = trainer(&c, 1, 0, "100");
    c.trainer[2][0] = trainer(&c, 2, 0, "1500");
    const char *h00 = td_path(&c.d[0], "h0");

    expect_exit0(&c, 1, 0, c.trainer[1][0]); /* its 100 steps, then BYE */
    ASSERT_OK(td_wait_file(c.d[1].log, "leaving the job until one connects",
                           30000));
    ASSERT_OK(td_wait_file(h00, "world 2", 60000));
    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    expect_exit0(&c, 2, 0, c.trainer[2][0]);

    static td_hashes_t h0, h2;
    td_read_hashes(h00, &h0);
    td_read_hashes(td_path(&c.d[2], "h0"), &h2);
    ASSERT_EQ(h0.world[1499], 2);
    ASSERT_GT(h0.gen[1499], h0.gen[0]); /* a new generation without n1 */
    ASSERT_EQ(h0.hash[1499], h2.hash[1499]);
    ASSERT_GE(td_same_hashes(&h0, &h2), 1490);
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[2], "p0")),
              0);
    /* A leave, not a loss. */
    ASSERT(!td_file_has(c.d[1].log, "lost at step"));
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* 2 nodes that take 2 trainers each, on a ring deadline no test outlives. */
static void two_nodes_two_trainers(cluster_t *c)
{
    cluster_env();
    fx_etcd_start(&c->etcd, 0);
    rc_deadline = "600000";
    node_init(c, 0, "2", "2");
    node_init(c, 1, "2", "2");
    rc_deadline = NULL;
}

/*
 * 2 nodes x 2 trainers; n0's second trainer is SIGKILLed in step 20 and a
 * new one started on the same socket while n0 keeps its first trainer:
 * the replacement joins at a step boundary with the state of the node's
 * member (restored), takes part in the job (world 4 again), and every
 * replica ends bitwise identical.
 */
TEST_IMPL(dmn_trainers_replace)
{
    cluster_t c = {.n = 2};
    two_nodes_two_trainers(&c);
    const char *steps = "3000";
    c.trainer[0][0] = trainer(&c, 0, 0, steps);
    rc_crash_at = "20";
    c.trainer[0][1] = trainer(&c, 0, 1, steps);
    rc_crash_at = NULL;
    c.trainer[1][0] = trainer(&c, 1, 0, steps);
    c.trainer[1][1] = trainer(&c, 1, 1, steps);
    const char *h10 = td_path(&c.d[1], "h0");

    ASSERT_NE(td_exit_code(c.trainer[0][1], 60000), 0);
    ASSERT_OK(td_wait_file(h10, "world 3", 60000));
    /* The replacement: its own files (t1, h1, p1 are the dead one's). */
    const char *args[] = {"--steps", steps, "--hash-log",
                          td_path(&c.d[0], "h2"), "--save",
                          td_path(&c.d[0], "p2"), "--log-every", "20", NULL};
    pid_t repl = td_trainer(&c.d[0], args, td_path(&c.d[0], "t2.log"));
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h2"), "world 4", 60000));
    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    expect_exit0(&c, 1, 0, c.trainer[1][0]);
    expect_exit0(&c, 1, 1, c.trainer[1][1]);
    int rc = td_exit_code(repl, 180000);
    if (rc != 0) {
        td_dump(td_path(&c.d[0], "t2.log"));
        td_dump(c.d[0].log);
    }
    ASSERT_MSG(rc == 0, "the replacement exited %d", rc);
    ASSERT(td_file_has(td_path(&c.d[0], "t2.log"), "restored"));

    static td_hashes_t h0, h1, h2;
    td_read_hashes(td_path(&c.d[0], "h0"), &h0);
    td_read_hashes(h10, &h1);
    td_read_hashes(td_path(&c.d[0], "h2"), &h2);
    ASSERT_GT(td_same_hashes(&h0, &h2), 0);
    ASSERT_GE(td_same_hashes(&h0, &h1), 2990);
    ASSERT_EQ(h0.hash[2999], h1.hash[2999]);
    ASSERT_EQ(h0.hash[2999], h2.hash[2999]);
    ASSERT_EQ(h0.world[2999], 4);
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[0], "p2")),
              0);
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[1], "p0")),
              0);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* The pid after "forked child " in path, or 0. */
static pid_t forked_child(const char *path)
{
    char *s = td_read(path, NULL);
    char *hit = s ? strstr(s, "forked child ") : NULL;
    pid_t p = hit ? (pid_t)atol(hit + strlen("forked child ")) : 0;
    free(s);
    return p;
}

/*
 * A trainer that forked a child (a DataLoader worker does) and is then
 * SIGKILLed: the child holds the trainer's socket to the daemon open, so
 * no EOF comes. 2 nodes x 2 trainers; n0's second trainer forks at step
 * 10 and dies at step 20. The daemon watches the peer process itself (a
 * pidfd): it sees the trainer gone, the job goes on at world 3, and the
 * others end bitwise identical. Before, the daemon kept counting the dead
 * trainer in its step and the whole job waited for it.
 */
TEST_IMPL(dmn_trainers_forked_child_holds_socket)
{
    cluster_t c = {.n = 2};
    two_nodes_two_trainers(&c);
    const char *steps = "1500";
    c.trainer[0][0] = trainer(&c, 0, 0, steps);
    const char *args[] = {"--steps", steps, "--hash-log",
                          td_path(&c.d[0], "h1"), "--log-every", "20",
                          "--crash-at-step", "20", "--fork-at-step", "10",
                          NULL};
    const char *t1 = td_path(&c.d[0], "t1.log");
    c.trainer[0][1] = td_trainer(&c.d[0], args, t1);
    c.trainer[1][0] = trainer(&c, 1, 0, steps);
    c.trainer[1][1] = trainer(&c, 1, 1, steps);

    ASSERT_EQ(td_exit_code(c.trainer[0][1], 60000), 128 + SIGKILL);
    pid_t child = forked_child(t1);
    ASSERT_MSG(child > 0, "no 'forked child' line in %s", t1);
    td_track(child);
    ASSERT_EQ(kill(child, 0), 0); /* it holds the socket now */
    const char *h10 = td_path(&c.d[1], "h0");
    ASSERT_OK(td_wait_file(h10, "world 3", 60000));
    ASSERT(td_file_has(c.d[0].log, "exited while a process it forked still "
                       "holds its connection open"));
    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    expect_exit0(&c, 1, 0, c.trainer[1][0]);
    expect_exit0(&c, 1, 1, c.trainer[1][1]);
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[1], "p0")),
              0);
    ASSERT_EQ(td_param_diff(td_path(&c.d[1], "p0"), td_path(&c.d[1], "p1")),
              0);
    kill(child, SIGKILL);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * Two nodes whose trainers hold models of different sizes (--hidden 64
 * and 32): the first view's REBUILD finds the state sizes differ, and
 * both trainers' step_begin fails with RINGD_EMISMATCH saying so, where
 * they used to wait for ever.
 */
TEST_IMPL(dmn_trainers_state_sizes_differ)
{
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    node_init(&c, 0, "1", "2");
    node_init(&c, 1, "1", "2");
    c.trainer[0][0] = trainer(&c, 0, 0, "100");
    const char *args[] = {"--steps", "100", "--hidden", "32", NULL};
    pid_t t1 = td_trainer(&c.d[1], args, td_path(&c.d[1], "t1.log"));
    ASSERT_NE(td_exit_code(c.trainer[0][0], 60000), 0);
    ASSERT_NE(td_exit_code(t1, 60000), 0);
    for (int i = 0; i < 2; i++) {
        const char *log = td_path(&c.d[i], i == 0 ? "t0.log" : "t1.log");
        ASSERT_MSG(td_file_has(log, "states differ in size"), "%s",
                   td_read(log, NULL));
        ASSERT(td_file_has(c.d[i].log, "state sizes differ"));
    }
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}
