/*
 * Real ringd (--standalone) + real trainers: data-parallel equivalence,
 * redo on a view change, a killed trainer, a drain.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/task.h"

/* A metric's value in a /metrics body (name with its labels); -1 if
 * absent. */
static double metric_of(const char *m, const char *key)
{
    char want[160];
    snprintf(want, sizeof(want), "\n%s ", key);
    const char *p = m != NULL ? strstr(m, want) : NULL;
    return p != NULL ? strtod(p + strlen(want), NULL) : -1;
}

static void run_reference(td_daemon_t *t, const char *steps, const char *out)
{
    const char *ref[] = {"--no-daemon", "--steps", steps, "--save", out,
                         NULL};
    pid_t r = td_trainer(t, ref, td_path(t, "ref.log"));
    ASSERT_EQ(td_exit_code(r, 60000), 0);
}

/* 1 node x 2 trainers == 1 process on the same global batch. */
TEST_IMPL(dmn_two_trainers_match_one)
{
    td_daemon_t t;
    td_init(&t, "dmn-equiv");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    pid_t p[2];
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"--steps", "120", "--hash-log",
                              td_path(&t, i ? "h1" : "h0"), "--save",
                              td_path(&t, i ? "p1" : "p0"),
                              "--target-acc", "0.9", NULL};
        p[i] = td_trainer(&t, args, td_path(&t, i ? "t1.log" : "t0.log"));
    }
    for (int i = 0; i < 2; i++) {
        int rc = td_exit_code(p[i], 120000);
        if (rc != 0) {
            td_dump(td_path(&t, i ? "t1.log" : "t0.log"));
            td_dump(t.log);
        }
        ASSERT_EQ(rc, 0);
    }
    run_reference(&t, "120", td_path(&t, "pref"));

    static td_hashes_t h0, h1;
    td_read_hashes(td_path(&t, "h0"), &h0);
    td_read_hashes(td_path(&t, "h1"), &h1);
    ASSERT_EQ(h0.nsteps, 120);
    ASSERT_EQ(td_same_hashes(&h0, &h1), 120);
    ASSERT_EQ(h0.world[0], 2);
    double d = td_param_diff(td_path(&t, "p0"), td_path(&t, "pref"));
    ASSERT_MSG(d < 1e-3, "2 trainers vs 1 process differ by %g", d);
    ASSERT_EQ(td_param_diff(td_path(&t, "p0"), td_path(&t, "p1")), 0);
    ASSERT(td_file_has(td_path(&t, "t0.log"), "final: test_accuracy"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* A view change aborts an in-flight allreduce: the trainers get
 * RINGD_ERESHAPE, redo the step, and end where they would have anyway. */
TEST_IMPL(dmn_reshape_redo_step)
{
    td_daemon_t t;
    td_init(&t, "dmn-reshape");
    const char *flags[] = {"--trainers", "2", "--backend",
                           "fake:reshape=5,17", NULL};
    ASSERT_OK(td_start(&t, flags));
    pid_t p[2];
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"--steps", "30", "--hash-log",
                              td_path(&t, i ? "h1" : "h0"), "--save",
                              td_path(&t, i ? "p1" : "p0"), NULL};
        p[i] = td_trainer(&t, args, td_path(&t, i ? "t1.log" : "t0.log"));
    }
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_exit_code(p[i], 120000), 0);
    run_reference(&t, "30", td_path(&t, "pref"));
    for (int i = 0; i < 2; i++) {
        const char *log = td_path(&t, i ? "t1.log" : "t0.log");
        char *s = td_read(log, NULL);
        int redo = 0;
        for (char *q = s; (q = strstr(q, "redoing the step")); q++)
            redo++;
        free(s);
        ASSERT_EQ(redo, 2);
    }
    static td_hashes_t h0, h1;
    td_read_hashes(td_path(&t, "h0"), &h0);
    td_read_hashes(td_path(&t, "h1"), &h1);
    ASSERT_EQ(td_same_hashes(&h0, &h1), 30);
    ASSERT_EQ(h0.gen[4] + 1, h0.gen[5]);   /* a new view at step 5 */
    ASSERT_EQ(h0.gen[16] + 1, h0.gen[17]);
    ASSERT(td_param_diff(td_path(&t, "p0"), td_path(&t, "pref")) < 1e-3);
    ASSERT(td_file_has(t.log, "view change at step 5"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* SIGKILL one of two trainers: the daemon reports it, the survivor goes
 * on alone, a new trainer joins with the survivor's parameters. */
TEST_IMPL(dmn_killed_trainer)
{
    td_daemon_t t;
    td_init(&t, "dmn-kill");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *a0[] = {"--steps", "1000000", "--log-every", "100000",
                        "--hash-log", td_path(&t, "h0"), NULL};
    const char *a1[] = {"--steps", "1000000", "--log-every", "100000",
                        "--hash-log", td_path(&t, "h1"), NULL};
    pid_t p0 = td_trainer(&t, a0, td_path(&t, "t0.log"));
    pid_t p1 = td_trainer(&t, a1, td_path(&t, "t1.log"));
    ASSERT_OK(td_wait_file(td_path(&t, "h1"), "step 20 ", 60000));
    kill(p1, SIGKILL);
    ASSERT_EQ(td_exit_code(p1, 10000), 128 + SIGKILL);
    ASSERT_OK(td_wait_file(t.log, "lost at step", 10000));
    /* The survivor trains alone. */
    ASSERT_OK(td_wait_file(td_path(&t, "h0"), "rank 0 world 1 ", 30000));
    char *m = td_http_get(t.metrics_port, "/metrics");
    ASSERT(m != NULL && strstr(m, "\nringd_trainers_lost_total 1\n"));
    free(m);

    const char *a2[] = {"--steps", "1000000", "--log-every", "100000",
                        "--hash-log", td_path(&t, "h2"), NULL};
    pid_t p2 = td_trainer(&t, a2, td_path(&t, "t2.log"));
    ASSERT_OK(td_wait_file(td_path(&t, "h2"), "rank 1 world 2 ", 30000));
    ASSERT_OK(td_wait_file(td_path(&t, "t2.log"), "parameters restored",
                           10000));
    /* Drain: both trainers are told to stop and exit 0. */
    ASSERT_EQ(td_stop(&t, 30000), 0);
    int rc0 = td_exit_code(p0, 30000);
    if (rc0 != 0)
        td_dump(td_path(&t, "t0.log")), td_dump(t.log);
    ASSERT_EQ(rc0, 0);
    ASSERT_EQ(td_exit_code(p2, 30000), 0);
    ASSERT(td_file_has(td_path(&t, "t2.log"), "daemon drains"));
    static td_hashes_t h0, h2;
    td_read_hashes(td_path(&t, "h0"), &h0);
    td_read_hashes(td_path(&t, "h2"), &h2);
    ASSERT_GT(td_same_hashes(&h0, &h2), 0);
    return 0;
}

/* The only trainer dies: a new one resumes from the daemon's snapshot of
 * the last completed step, bitwise where a lone process would be. The
 * per-step snapshots and the joiner's copy are made off the main loop:
 * the loop's thread copied no state byte. */
TEST_IMPL(dmn_restore_from_snapshot)
{
    td_daemon_t t;
    td_init(&t, "dmn-snap");
    ASSERT_OK(td_start(&t, NULL));
    const char *a[] = {"--steps", "60", "--hash-log", td_path(&t, "ha"),
                       NULL};
    pid_t pa = td_trainer(&t, a, td_path(&t, "ta.log"));
    ASSERT_OK(td_wait_file(td_path(&t, "ha"), "step 20 ", 60000));
    kill(pa, SIGKILL);
    ASSERT_EQ(td_exit_code(pa, 10000), 128 + SIGKILL);
    const char *b[] = {"--steps", "60", "--hash-log", td_path(&t, "hb"),
                       NULL};
    pid_t pb = td_trainer(&t, b, td_path(&t, "tb.log"));
    ASSERT_EQ(td_exit_code(pb, 60000), 0);
    ASSERT(td_file_has(td_path(&t, "tb.log"), "parameters restored"));
    const char *r[] = {"--no-daemon", "--steps", "60", "--hash-log",
                       td_path(&t, "hr"), NULL};
    ASSERT_EQ(td_exit_code(td_trainer(&t, r, td_path(&t, "tr.log")),
                           60000), 0);
    static td_hashes_t ha, hb, hr;
    td_read_hashes(td_path(&t, "ha"), &ha);
    td_read_hashes(td_path(&t, "hb"), &hb);
    td_read_hashes(td_path(&t, "hr"), &hr);
    ASSERT_EQ(hb.nsteps, 60);
    ASSERT_GE(td_same_hashes(&ha, &hr), 20);
    int resumed = td_same_hashes(&hb, &hr);
    ASSERT(resumed > 0 && resumed < 60);
    ASSERT(!hb.have[0]); /* it did not start over */
    char *m = td_http_get(t.metrics_port, "/metrics");
    ASSERT(m != NULL && strstr(m, "\nringd_state_restores_total 1\n"));
    ASSERT_GE(metric_of(m, "ringd_state_snapshots_total"), 20);
    ASSERT_EQ(metric_of(m, "ringd_loop_copy_bytes_total"), 0);
    free(m);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
