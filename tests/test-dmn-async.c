/*
 * Asynchronous collectives through libringd against a real ringd
 * (--standalone): handles waited out of order and mixed with blocking
 * calls, two trainers of a node issuing the same sequence, misuse, and a
 * trainer that exits with handles outstanding.
 *
 * Two clients in this one process act as the node's two trainers: with
 * asynchronous calls one thread can issue for both before waiting. Only
 * step_begin, which returns once both asked, runs on a second thread.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/ringd.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/ring-cluster.h"
#include "tests/task.h"

enum { NT = 16, LEN = 1000 };

static void start_daemon(td_daemon_t *t, const char *name,
                         const char *trainers)
{
    td_init(t, name);
    const char *flags[] = {"--trainers", trainers, NULL};
    ASSERT_OK(td_start(t, flags));
}

/* Trainer k's input of tensor i, element j, in step s. */
static float input(int k, int s, int i, int j)
{
    return (float)((k + 1) * (s * 7 + i * 3 + j % 11));
}

/* Wait handles h[0..n) in a scrambled order (odd first, then even
 * backwards); every one must succeed. */
static void wait_scrambled(ringd_client_t *c, const ringd_handle_t *h,
                           int n)
{
    for (int i = 1; i < n; i += 2)
        ASSERT_EQ(ringd_wait(c, h[i]), 0);
    for (int i = (n - 1) / 2 * 2; i >= 0; i -= 2)
        ASSERT_EQ(ringd_wait(c, h[i]), 0);
}

/*
 * Two trainers issue the same sequence each step: NT asynchronous
 * allreduces (SUM, then AVG every other tensor) with a blocking allreduce
 * in the middle, and an asynchronous broadcast from global rank 1; one
 * trainer issues each half before the other does. Trainer 0
 * waits its handles out of order, trainer 1 in order after polling the
 * last with ringd_test; every result is the closed-form sum.
 */
TEST_IMPL(dmn_async_out_of_order)
{
    td_daemon_t t;
    start_daemon(&t, "dmn-async-ooo", "2");
    ringd_client_t *c[2];
    float *b[2];
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(ringd_connect(&c[k], t.sock, NULL));
        b[k] = ringd_buffer(c[k], (NT + 2) * LEN * sizeof(float));
        ASSERT(b[k] != NULL);
    }
    for (int s = 0; s < 3; s++) {
        ringd_view_t v[2];
        td_begin_both(c, v);
        ASSERT_EQ(v[0].world, 2);
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < NT + 2; i++)
                for (int j = 0; j < LEN; j++)
                    b[k][i * LEN + j] = input(k, s, i, j);
        ringd_handle_t h[2][NT + 1];
        /* The first half of the tensors, all by trainer 0 before any by
         * trainer 1, so that the daemon queues many of one trainer. */
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < NT / 2; i++)
                ASSERT_OK(ringd_allreduce_async(
                    c[k], b[k] + i * LEN, LEN, RINGD_F32,
                    i % 2 ? RINGD_AVG : RINGD_SUM, &h[k][i]));
        /* A blocking one in the middle: trainer 1 issues it first, so
         * trainer 0's blocking call has its partner queued. */
        ringd_handle_t hb;
        ASSERT_OK(ringd_allreduce_async(c[1], b[1] + NT * LEN, LEN,
                                        RINGD_F32, RINGD_SUM, &hb));
        ASSERT_OK(ringd_allreduce(c[0], b[0] + NT * LEN, LEN, RINGD_F32,
                                  RINGD_SUM));
        for (int k = 1; k >= 0; k--)
            for (int i = NT / 2; i < NT; i++)
                ASSERT_OK(ringd_allreduce_async(
                    c[k], b[k] + i * LEN, LEN, RINGD_F32,
                    i % 2 ? RINGD_AVG : RINGD_SUM, &h[k][i]));
        for (int k = 0; k < 2; k++)
            ASSERT_OK(ringd_broadcast_async(c[k], b[k] + (NT + 1) * LEN,
                                            LEN * sizeof(float), 1,
                                            &h[k][NT]));
        /* step_end with handles not waited for is refused. */
        ASSERT_EQ(ringd_step_end(c[0]), RINGD_ESTATE);
        ASSERT(strstr(ringd_last_error(c[0]), "not waited for"));
        wait_scrambled(c[0], h[0], NT + 1);
        int done = 0;
        for (int tries = 0; !done && tries < 100000; tries++) {
            int rc = ringd_test(c[1], h[1][NT], &done);
            ASSERT_EQ(rc, 0);
            if (!done)
                usleep(100);
        }
        ASSERT(done);
        ASSERT_EQ(ringd_wait(c[1], hb), 0);
        for (int i = 0; i < NT; i++)
            ASSERT_EQ(ringd_wait(c[1], h[1][i]), 0);
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < NT + 2; i++)
                for (int j = 0; j < LEN; j++) {
                    float sum = input(0, s, i, j) + input(1, s, i, j);
                    float want = i == NT + 1 ? input(1, s, i, j)
                                 : i < NT && i % 2 ? sum / 2 : sum;
                    ASSERT_MSG(b[k][i * LEN + j] == want,
                               "step %d trainer %d tensor %d [%d]: %g, "
                               "want %g", s, k, i, j,
                               (double)b[k][i * LEN + j], (double)want);
                }
            ASSERT_OK(ringd_step_end(c[k]));
        }
    }
    for (int k = 0; k < 2; k++)
        ringd_close(c[k]);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * Misuse gets an error and the daemon serves on: unknown and zero
 * handles, a double wait, a test after the wait, too many outstanding,
 * freeing a buffer with a collective outstanding, handles of a step that
 * was left.
 */
/* The bound: RINGD_MAX_OUTSTANDING handles not waited for (in a step). */
static void outstanding_bound(ringd_client_t *c, float *buf, float *other)
{
    ringd_handle_t h, hs[RINGD_MAX_OUTSTANDING];
    for (int i = 0; i < RINGD_MAX_OUTSTANDING; i++) {
        buf[i] = (float)i;
        ASSERT_OK(ringd_allreduce_async(c, buf + i, 1, RINGD_F32,
                                        RINGD_SUM, &hs[i]));
    }
    ASSERT_EQ(ringd_allreduce_async(c, other, 1, RINGD_F32, RINGD_SUM, &h),
              RINGD_ELIMIT);
    ASSERT(strstr(ringd_last_error(c), "not waited for"));
    ASSERT_STR_EQ(ringd_strerror(RINGD_ELIMIT),
                  "too many collectives outstanding");
    ASSERT_EQ(ringd_wait(c, hs[5]), 0);
    ASSERT_OK(ringd_allreduce_async(c, other, 1, RINGD_F32, RINGD_SUM,
                                    &hs[5]));
    for (int i = 0; i < RINGD_MAX_OUTSTANDING; i++)
        ASSERT_EQ(ringd_wait(c, hs[i]), 0);
    for (int i = 0; i < RINGD_MAX_OUTSTANDING; i++)
        ASSERT(buf[i] == (float)i);
}

/* Freeing a buffer a queued collective names: refused by the library,
 * and by the daemon (dmn_async_queue_bound). */
static void free_while_queued(void)
{
    td_daemon_t t;
    start_daemon(&t, "dmn-async-misuse2", "2");
    ringd_client_t *cc[2];
    float *bb[2];
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(ringd_connect(&cc[k], t.sock, NULL));
        bb[k] = ringd_buffer(cc[k], 4096);
        ASSERT(bb[k] != NULL);
    }
    ringd_view_t vv[2];
    td_begin_both(cc, vv);
    ringd_handle_t h, h1;
    int done = 0;
    ASSERT_OK(ringd_allreduce_async(cc[0], bb[0], 4, RINGD_F32, RINGD_SUM,
                                    &h));
    ASSERT_EQ(ringd_buffer_free(cc[0], bb[0]), RINGD_ESTATE);
    ASSERT(strstr(ringd_last_error(cc[0]), "outstanding"));
    ASSERT_OK(ringd_test(cc[0], h, &done));
    ASSERT_EQ(done, 0); /* trainer 1 has not issued it */
    ASSERT_OK(ringd_allreduce_async(cc[1], bb[1], 4, RINGD_F32, RINGD_SUM,
                                    &h1));
    ASSERT_EQ(ringd_wait(cc[0], h), 0);
    ASSERT_EQ(ringd_wait(cc[1], h1), 0);
    ASSERT_OK(ringd_buffer_free(cc[0], bb[0]));
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(ringd_step_end(cc[k]));
        ringd_close(cc[k]);
    }
    ASSERT_EQ(td_stop(&t, 30000), 0);
}

TEST_IMPL(dmn_async_misuse)
{
    td_daemon_t t;
    start_daemon(&t, "dmn-async-misuse", "1");
    ringd_client_t *c;
    ASSERT_OK(ringd_connect(&c, t.sock, NULL));
    float *buf = ringd_buffer(c, RINGD_MAX_OUTSTANDING * sizeof(float));
    float *other = ringd_buffer(c, 4096);
    ASSERT(buf != NULL && other != NULL);
    ringd_handle_t h;
    ASSERT_EQ(ringd_allreduce_async(c, buf, 1, RINGD_F32, RINGD_SUM, &h),
              RINGD_ESTATE);
    ringd_view_t v;
    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_EQ(ringd_wait(c, 0), RINGD_EINVAL);
    ASSERT_EQ(ringd_wait(c, 12345), RINGD_EINVAL);
    ASSERT(strstr(ringd_last_error(c), "not outstanding"));
    int done = 0;
    ASSERT_EQ(ringd_test(c, 777, &done), RINGD_EINVAL);
    ASSERT_EQ(done, 1);
    ASSERT_EQ(ringd_allreduce_async(c, buf, 1, RINGD_F32, RINGD_SUM, NULL),
              RINGD_EINVAL);

    buf[0] = 3.0f;
    ASSERT_OK(ringd_allreduce_async(c, buf, 1, RINGD_F32, RINGD_SUM, &h));
    ASSERT_EQ(ringd_wait(c, h), 0);
    ASSERT(buf[0] == 3.0f);
    ASSERT_EQ(ringd_wait(c, h), RINGD_EINVAL);    /* double wait */
    ASSERT_EQ(ringd_test(c, h, &done), RINGD_EINVAL);

    outstanding_bound(c, buf, other);
    ASSERT_OK(ringd_step_end(c));

    /* Handles of a step left by step_begin are void. */
    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_OK(ringd_allreduce_async(c, buf, 1, RINGD_F32, RINGD_SUM, &h));
    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_EQ(ringd_wait(c, h), RINGD_EINVAL);
    ASSERT_OK(ringd_allreduce(c, buf, 4, RINGD_F32, RINGD_SUM));
    ASSERT_OK(ringd_step_end(c));
    ringd_close(c);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    free_while_queued();
    return 0;
}

/* Trainer 1 of dmn_async_trainer_exits, in a process of its own: joins
 * the step, issues k + 3 allreduces, says so on fd, waits to be killed. */
static void exiting_trainer(const char *sock, int k, int fd)
{
    ringd_client_t *c;
    if (ringd_connect(&c, sock, NULL) != 0)
        _exit(2);
    float *b = ringd_buffer(c, 64 * 1024);
    ringd_view_t v;
    if (b == NULL || ringd_step_begin(c, &v) != 0)
        _exit(3);
    for (int i = 0; i < k + 3; i++) {
        ringd_handle_t h;
        if (ringd_allreduce_async(c, b + i * 100, 100, RINGD_F32,
                                  RINGD_SUM, &h) != 0)
            _exit(4);
    }
    if (write(fd, "i", 1) != 1)
        _exit(5);
    for (;;)
        pause();
}

/*
 * A trainer is killed with handles outstanding (collectives queued in the
 * daemon, results not waited for): the daemon drops its queue, the other
 * trainer's next collective of the step fails with RINGD_ERESHAPE, as
 * with blocking calls, and its next step runs alone at once.
 */
TEST_IMPL(dmn_async_trainer_exits)
{
    enum { K = 10 };
    td_daemon_t t;
    start_daemon(&t, "dmn-async-exit", "2");
    ringd_client_t *c;
    ASSERT_OK(ringd_connect(&c, t.sock, NULL));
    float *b = ringd_buffer(c, 64 * 1024);
    ASSERT(b != NULL);
    int pfd[2];
    ASSERT_OK(pipe(pfd));
    pid_t child = fork();
    ASSERT(child >= 0);
    if (child == 0) {
        close(pfd[0]);
        exiting_trainer(t.sock, K, pfd[1]);
    }
    td_track(child);
    close(pfd[1]);
    ringd_view_t v;
    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_EQ(v.world, 2);
    ringd_handle_t h[K];
    for (int i = 0; i < K; i++) {
        for (int j = 0; j < 100; j++)
            b[i * 100 + j] = 1.0f;
        ASSERT_OK(ringd_allreduce_async(c, b + i * 100, 100, RINGD_F32,
                                        RINGD_SUM, &h[i]));
    }
    char x;
    ASSERT_EQ(read(pfd[0], &x, 1), 1);
    close(pfd[0]);
    for (int i = K - 1; i >= 0; i--)
        ASSERT_EQ(ringd_wait(c, h[i]), 0);
    ASSERT(b[0] == 1.0f && b[K * 100 - 1] == 1.0f); /* + its zeros */
    kill(child, SIGKILL);
    ASSERT_EQ(td_exit_code(child, 10000), 128 + SIGKILL);
    ASSERT_OK(td_wait_file(t.log, "lost at step 0", 10000));
    ringd_handle_t hn;
    ASSERT_OK(ringd_allreduce_async(c, b, 100, RINGD_F32, RINGD_SUM, &hn));
    ASSERT_EQ(ringd_wait(c, hn), RINGD_ERESHAPE);
    /* Later ones of the step fail at once: it is to be redone. */
    ASSERT_EQ(ringd_allreduce_async(c, b, 100, RINGD_F32, RINGD_SUM, &hn),
              RINGD_ERESHAPE);
    ASSERT_EQ(ringd_step_end(c), RINGD_ESTATE);
    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_EQ(v.world, 1);
    ASSERT_EQ(v.step, 0); /* the step is redone */
    ASSERT_OK(ringd_allreduce_async(c, b, 100, RINGD_F32, RINGD_SUM, &hn));
    ASSERT_EQ(ringd_wait(c, hn), 0);
    ASSERT_OK(ringd_step_end(c));
    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_EQ(v.step, 1);
    ringd_close(c);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* Two trainers of a 30-step job on a daemon of the given backend (NULL:
 * solo), --async async_n (NULL: blocking). Hash logs h0, h1. */
static void run_job(td_daemon_t *t, const char *name, const char *backend,
                    const char *async_n)
{
    td_init(t, name);
    const char *flags[] = {"--trainers", "2", backend ? "--backend" : NULL,
                           backend, NULL};
    ASSERT_OK(td_start(t, flags));
    pid_t p[2];
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"--steps", "30", "--hash-log",
                              td_path(t, i ? "h1" : "h0"), "--save",
                              td_path(t, i ? "p1" : "p0"),
                              async_n ? "--async" : NULL, async_n, NULL};
        p[i] = td_trainer(t, args, td_path(t, i ? "t1.log" : "t0.log"));
    }
    for (int i = 0; i < 2; i++) {
        int rc = td_exit_code(p[i], 120000);
        if (rc != 0) {
            td_dump(td_path(t, i ? "t1.log" : "t0.log"));
            td_dump(t->log);
        }
        ASSERT_EQ(rc, 0);
    }
    ASSERT_EQ(td_stop(t, 30000), 0);
}

/* Checks every "async: X of Y outstanding handles failed" line of a
 * trainer's log (X == Y >= 1); returns how many there are. */
static int all_handles_failed(const char *log)
{
    char *s = td_read(log, NULL);
    ASSERT(s != NULL);
    int lines = 0;
    const char *key = "async: ";
    for (char *q = s; (q = strstr(q, key)) != NULL; q++) {
        int x = -1, y = -1;
        ASSERT_EQ(sscanf(q, "async: %d of %d outstanding", &x, &y), 2);
        ASSERT_MSG(x == y && y >= 1, "%s: %d of %d handles failed", log, x,
                   y);
        lines++;
    }
    free(s);
    return lines;
}

/*
 * View changes (the fake backend's, at steps 5 and 17) while each trainer
 * has its gradients in 10 asynchronous allreduces: every outstanding
 * handle fails with RINGD_ERESHAPE, the step is redone, and the job ends
 * bitwise where the same job without view changes does, which is also
 * where the blocking single allreduce gets.
 */
TEST_IMPL(dmn_async_reshape_redo)
{
    static td_daemon_t a, b, c;
    run_job(&a, "dmn-async-rs", "fake:reshape=5,17", "10");
    run_job(&b, "dmn-async-plain", NULL, "10");
    run_job(&c, "dmn-async-block", NULL, NULL);
    static td_hashes_t ha[2], hb, hc;
    for (int i = 0; i < 2; i++) {
        const char *log = td_path(&a, i ? "t1.log" : "t0.log");
        ASSERT_EQ(all_handles_failed(log), 2);
        ASSERT_EQ(td_count(log, "redoing the step"), 2);
        td_read_hashes(td_path(&a, i ? "h1" : "h0"), &ha[i]);
    }
    ASSERT_EQ(all_handles_failed(td_path(&b, "t0.log")), 0);
    td_read_hashes(td_path(&b, "h0"), &hb);
    td_read_hashes(td_path(&c, "h0"), &hc);
    ASSERT_EQ(ha[0].nsteps, 30);
    ASSERT_EQ(td_same_hashes(&ha[0], &ha[1]), 30);
    ASSERT_EQ(ha[0].gen[4] + 1, ha[0].gen[5]); /* the view changed */
    ASSERT_EQ(td_same_hashes(&ha[0], &hb), 30);
    ASSERT_EQ(td_same_hashes(&hb, &hc), 30);
    ASSERT_EQ(td_param_diff(td_path(&a, "p0"), td_path(&c, "p0")), 0);
    return 0;
}

/* For td_poll: the daemon at arg reports 10 collectives queued. */
static int queued_ten(void *arg)
{
    const td_daemon_t *t = arg;
    char *m = td_http_get(t->metrics_port, "/metrics");
    int yes = m != NULL && strstr(m, "\nringd_collectives_queued 10\n");
    free(m);
    return yes;
}

/* The trainer of ring node i with --async 10, stopping itself in step
 * stop_in when given. */
static pid_t async_trainer(cluster_t *c, int i, const char *steps,
                           const char *stop_in)
{
    const char *args[] = {"--steps", steps, "--async", "10", "--hash-log",
                          td_path(&c->d[i], "h0"), "--log-every", "20",
                          stop_in ? "--stop-in-step" : NULL, stop_in, NULL};
    return td_trainer(&c->d[i], args, td_path(&c->d[i], "t0.log"));
}

/*
 * A node killed while the others have 10 handles outstanding: n1's
 * trainer stops itself in step 60 before its collectives, so n0's and
 * n2's trainers have issued all 10 pieces of that step and wait for the
 * ring; then n1's daemon is SIGKILLed. Every one of their outstanding
 * handles fails with RINGD_ERESHAPE, they redo step 60 on a 2-node ring
 * and finish, bitwise identical to each other at every step, and to n1
 * on every step before.
 */
TEST_IMPL(dmn_ring_async_kill)
{
    cluster_env();
    static cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    for (int i = 0; i < 3; i++)
        c.trainer[i][0] = async_trainer(&c, i, "300", i == 1 ? "60" : NULL);
    ASSERT_MSG(td_poll(td_all_stopped, &c.trainer[1][0], 60000) == 0,
               "n1's trainer never stopped in step 60");
    for (int i = 0; i < 3; i += 2)
        ASSERT_MSG(td_poll(queued_ten, &c.d[i], 30000) == 0,
                   "n%d never queued its trainer's 10 pieces", i);
    th_kill(c.d[1].pid);
    c.d[1].pid = 0;
    th_kill(c.trainer[1][0]);
    for (int i = 0; i < 3; i += 2)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    static td_hashes_t h[3];
    for (int i = 0; i < 3; i++) {
        td_read_hashes(td_path(&c.d[i], "h0"), &h[i]);
        if (i == 1)
            continue;
        const char *log = td_path(&c.d[i], "t0.log");
        ASSERT_EQ(all_handles_failed(log), 1);
        ASSERT(td_file_has(log, "async: 10 of 10 outstanding handles"));
        ASSERT_EQ(h[i].world[59], 3);
        ASSERT_EQ(h[i].world[60], 2);
    }
    ASSERT_EQ(td_same_hashes(&h[0], &h[2]), 300);
    ASSERT_EQ(td_same_hashes(&h[0], &h[1]), 60);
    for (int i = 0; i < 3; i += 2)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * The fake backend's view change at step 1 while trainer 0 has 10
 * allreduces queued in the daemon (issued before trainer 1 issues any):
 * all 10 of each trainer fail with RINGD_ERESHAPE (trainer 1's last ones
 * may be refused at issue instead), those queued when the first failed as
 * well as those that came after, and the redone step gives the sums of an
 * uninterrupted one.
 */
TEST_IMPL(dmn_async_reshape_queued)
{
    enum { K = 10, N = 512 };
    td_daemon_t t;
    td_init(&t, "dmn-async-rsq");
    const char *flags[] = {"--trainers", "2", "--backend", "fake:reshape=1",
                           NULL};
    ASSERT_OK(td_start(&t, flags));
    ringd_client_t *c[2];
    float *b[2];
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(ringd_connect(&c[k], t.sock, NULL));
        b[k] = ringd_buffer(c[k], K * N * sizeof(float));
        ASSERT(b[k] != NULL);
    }
    int reshaped[2] = {0, 0}, steps = 0;
    while (steps < 3) {
        ringd_view_t v[2];
        td_begin_both(c, v);
        int s = (int)v[0].step;
        ringd_handle_t h[2][K];
        int issued[2] = {0, 0}, failed[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < K * N; i++)
                b[k][i] = input(k, s, i / N, i % N);
            /* Trainer 1's issue may find the failure of its first ones
             * already answered: the rest are refused at once. */
            for (int i = 0; i < K; i++, issued[k]++) {
                int rc = ringd_allreduce_async(c[k], b[k] + i * N, N,
                                               RINGD_F32, RINGD_SUM,
                                               &h[k][i]);
                if (rc == RINGD_ERESHAPE && k == 1) {
                    failed[k] = K - i;
                    break;
                }
                ASSERT_EQ(rc, 0);
            }
            /* Trainer 0's all queued in the daemon before trainer 1's. */
            if (k == 0)
                ASSERT_MSG(td_poll(queued_ten, &t, 10000) == 0,
                           "the daemon never queued trainer 0's %d", K);
        }
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < issued[k]; i++) {
                int rc = ringd_wait(c[k], h[k][i]);
                ASSERT_MSG(rc == 0 || rc == RINGD_ERESHAPE, "rc %d", rc);
                failed[k] += rc == RINGD_ERESHAPE;
            }
        if (failed[0] || failed[1]) {
            ASSERT_EQ(s, 1);
            ASSERT_EQ(issued[0], K); /* all 10 queued when they failed */
            for (int k = 0; k < 2; k++) {
                ASSERT_MSG(failed[k] == K, "trainer %d: %d of %d failed", k,
                           failed[k], K);
                reshaped[k]++;
            }
            continue; /* redo */
        }
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < K * N; i++)
                ASSERT(b[k][i] == input(0, s, i / N, i % N) +
                                      input(1, s, i / N, i % N));
            ASSERT_OK(ringd_step_end(c[k]));
        }
        ASSERT_EQ(s, steps);
        steps++;
    }
    ASSERT_EQ(reshaped[0], 1);
    ASSERT_EQ(reshaped[1], 1);
    ASSERT(td_file_has(t.log, "view change at step 1"));
    for (int k = 0; k < 2; k++)
        ringd_close(c[k]);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * The Python binding's Client.allreduce_async / broadcast_async / wait /
 * test (tests/py/async_binding.py): two trainers as two threads, results
 * checked in Python, a double wait and the bound raising ringd.Error.
 */
TEST_IMPL(client_python_async)
{
    const char *py = "/usr/bin/python3";
#if defined(__SANITIZE_ADDRESS__)
    TEST_SKIP_WHY("sanitizer build: %s cannot load an ASan libringd.so",
                  py);
#endif
    if (access(py, X_OK) != 0)
        TEST_SKIP_WHY("%s is not installed", py);
    td_daemon_t t;
    start_daemon(&t, "client-pyasync", "2");
    const char *imp[] = {py, "-c", "import numpy", NULL};
    pid_t p = th_spawn((char *const *)imp, td_path(&t, "numpy.log"));
    td_track(p);
    if (td_exit_code(p, 60000) != 0)
        TEST_SKIP_WHY("numpy cannot be imported by %s", py);
    char lib[600], script[600], pypath[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    th_src_path(script, sizeof(script), "tests/py/async_binding.py");
    th_src_path(pypath, sizeof(pypath), "client/python");
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    const char *argv[] = {py, script, "--socket", t.sock, NULL};
    const char *log = td_path(&t, "async.log");
    p = th_spawn((char *const *)argv, log);
    td_track(p);
    int rc = td_exit_code(p, 120000);
    if (rc != 0)
        td_dump(log);
    ASSERT_EQ(rc, 0);
    ASSERT(td_file_has(log, "PASS async"));
    ASSERT(!td_file_has(t.log, "rejected message"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * Allgather and barrier for trainers: two trainers gather 3 floats each
 * (the other chunk holds junk before, which must not leak into the
 * result), and a barrier completes only once both issued it.
 */
TEST_IMPL(dmn_async_allgather_barrier)
{
    td_daemon_t t;
    start_daemon(&t, "dmn-async-ag", "2");
    ringd_client_t *c[2];
    float *b[2];
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(ringd_connect(&c[k], t.sock, NULL));
        b[k] = ringd_buffer(c[k], 4096);
        ASSERT(b[k] != NULL);
    }
    ASSERT_EQ(ringd_allgather(c[0], b[0], 12), RINGD_ESTATE);
    ringd_view_t v[2];
    td_begin_both(c, v);
    ringd_handle_t h[2];
    for (int k = 0; k < 2; k++) {
        uint32_t r = v[k].rank;
        for (int j = 0; j < 6; j++)
            b[k][j] = 99.0f;           /* junk in the others' chunk */
        for (int j = 0; j < 3; j++)
            b[k][r * 3 + j] = (float)(10 * (r + 1) + j);
        ASSERT_OK(ringd_allgather_async(c[k], b[k], 3 * sizeof(float),
                                        &h[k]));
    }
    for (int k = 0; k < 2; k++)
        ASSERT_EQ(ringd_wait(c[k], h[k]), 0);
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < 2; r++)
            for (int j = 0; j < 3; j++)
                ASSERT_MSG(b[k][r * 3 + j] == (float)(10 * (r + 1) + j),
                           "trainer %d, rank %d's [%d]: %g", k, r, j,
                           (double)b[k][r * 3 + j]);
    /* world * bytes past the buffer's end. */
    ASSERT_EQ(ringd_allgather(c[0], b[0] + 1000, 64), RINGD_EINVAL);

    ASSERT_OK(ringd_barrier_async(c[0], &h[0]));
    int done = -1;
    ASSERT_OK(ringd_test(c[0], h[0], &done));
    ASSERT_EQ(done, 0); /* trainer 1 has not reached it */
    ASSERT_OK(ringd_barrier_async(c[1], &h[1]));
    for (int k = 0; k < 2; k++) {
        ASSERT_EQ(ringd_wait(c[k], h[k]), 0);
        ASSERT_OK(ringd_step_end(c[k]));
        ringd_close(c[k]);
    }
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * The daemon dies with handles outstanding: each of them fails with
 * RINGD_EDISCONNECTED (none hangs), ringd_step_begin() reconnects to a
 * new daemon, and the old handles are void there.
 */
TEST_IMPL(dmn_async_daemon_dies)
{
    td_daemon_t t;
    start_daemon(&t, "dmn-async-dies", "2");
    ringd_client_t *c[2];
    float *b[2];
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(ringd_connect(&c[k], t.sock, NULL));
        b[k] = ringd_buffer(c[k], 4096);
        ASSERT(b[k] != NULL);
    }
    ringd_view_t v[2];
    td_begin_both(c, v);
    ringd_handle_t h[3];
    for (int i = 0; i < 3; i++)
        ASSERT_OK(ringd_allreduce_async(c[0], b[0] + i * 4, 4, RINGD_F32,
                                        RINGD_SUM, &h[i]));
    int done = -1;
    ASSERT_OK(ringd_test(c[0], h[2], &done));
    ASSERT_EQ(done, 0); /* trainer 1 issued none */
    kill(t.pid, SIGKILL);
    ASSERT_EQ(td_exit_code(t.pid, 10000), 128 + SIGKILL);
    ASSERT_EQ(ringd_wait(c[0], h[1]), RINGD_EDISCONNECTED);
    ASSERT_EQ(ringd_test(c[0], h[2], &done), RINGD_EDISCONNECTED);
    ASSERT_EQ(done, 1);
    ASSERT_EQ(ringd_wait(c[0], h[0]), RINGD_EDISCONNECTED);
    ringd_close(c[1]);

    const char *flags[] = {"--trainers", "1", NULL};
    ASSERT_OK(td_start(&t, flags));
    ASSERT_OK(ringd_step_begin(c[0], &v[0]));
    ASSERT_EQ(v[0].world, 1);
    ASSERT_EQ(ringd_wait(c[0], h[0]), RINGD_EINVAL);
    ringd_handle_t hn;
    b[0][0] = 5.0f;
    ASSERT_OK(ringd_allreduce_async(c[0], b[0], 1, RINGD_F32, RINGD_SUM,
                                    &hn));
    ASSERT_EQ(ringd_wait(c[0], hn), 0);
    ASSERT(b[0][0] == 5.0f);
    ASSERT_OK(ringd_step_end(c[0]));
    ringd_close(c[0]);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
