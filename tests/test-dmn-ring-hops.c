/*
 * The waits on the ring predecessor per step: /metrics per peer, and the
 * slowest node that ringctl status names from the daemons' records.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "job/job.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/ring-cluster.h"
#include "tests/task.h"


/* Mean wait per step of node i on its predecessor peer, from /metrics. */
static double mean_wait(cluster_t *c, int i, const char *peer, double *n_p)
{
    char sum[96], count[96];
    snprintf(sum, sizeof(sum), "ringd_hop_wait_seconds_sum{peer=\"%s\"}",
             peer);
    snprintf(count, sizeof(count),
             "ringd_hop_wait_seconds_count{peer=\"%s\"}", peer);
    double s = td_metric(&c->d[i], sum), n = td_metric(&c->d[i], count);
    ASSERT_MSG(s >= 0 && n > 0, "n%d has no hop histogram for %s", i, peer);
    *n_p = n;
    return s / n;
}

/* Where promtool is installed (make deps), node i's /metrics with the
 * hop histograms passes promtool check metrics. */
static void promtool_clean(cluster_t *c, int i)
{
    const char *promtool = "/usr/bin/promtool";
    if (access(promtool, X_OK) != 0) {
        fprintf(stderr, "note: no %s: exposition not linted\n", promtool);
        return;
    }
    char *m = td_http_get(c->d[i].metrics_port, "/metrics");
    const char *body = m != NULL ? strstr(m, "\r\n\r\n") : NULL;
    ASSERT(body != NULL);
    char path[300], out[300], cmd[1024];
    snprintf(path, sizeof(path), "%s", td_path(&c->d[i], "metrics.txt"));
    snprintf(out, sizeof(out), "%s", td_path(&c->d[i], "promtool.txt"));
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs(body + 4, f);
    fclose(f);
    free(m);
    snprintf(cmd, sizeof(cmd), "%s check metrics <%s >%s 2>&1", promtool,
             path, out);
    int rc = system(cmd);
    if (rc != 0 || td_file_has(out, " "))
        td_dump(out);
    ASSERT_EQ(rc, 0);
}

typedef struct {
    cluster_t *c;
    char out[300];
} status_t;

/* ringctl status (with --etcd) on n0 names a slowest node. */
static int names_slowest(void *arg)
{
    status_t *st = arg;
    char bin[512];
    snprintf(bin, sizeof(bin), "%s/ringctl", th_bindir());
    char *const argv[] = {bin, "--socket", st->c->d[0].sock, "--etcd",
                          st->c->etcd.url, "--job", "ringtest", "status",
                          NULL};
    int status = -1;
    pid_t p = th_spawn(argv, st->out);
    ASSERT_GT(p, 0);
    ASSERT_OK(th_wait(p, 15000, &status));
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return td_file_has(st->out, "slowest:     ");
}

/*
 * n1's trainer spends 20 ms more per step than the others. n2, whose
 * predecessor it is, waits on it far longer per step than n1 waits on
 * its own predecessor (n0), every completed step is counted once per
 * node, and ringctl status, from the records in etcd, names n1.
 */
TEST_IMPL(dmn_ring_hop_slowest)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    /* The trainers stop themselves after the last step: a node whose
     * trainers have all ended steps out of the job, and its record (which
     * ringctl status reads) goes with it. */
    rc_stop_after = "299";
    c.trainer[0][0] = trainer(&c, 0, 0, "300");
    rc_step_delay = "20";
    c.trainer[1][0] = trainer(&c, 1, 0, "300");
    rc_step_delay = NULL;
    c.trainer[2][0] = trainer(&c, 2, 0, "300");
    rc_stop_after = NULL;
    for (int i = 0; i < 3; i++) {
        int st;
        ASSERT_EQ(waitpid(c.trainer[i][0], &st, WUNTRACED),
                  c.trainer[i][0]);
        ASSERT_MSG(WIFSTOPPED(st), "trainer of n%d ended before its last "
                   "step", i);
    }
    for (int i = 0; i < 3; i++)
        ASSERT_MSG(td_file_has(c.d[i].log, ": 3 members, me #") &&
                       !td_file_has(c.d[i].log, "ring backend: view 2"),
                   "n%d: the ring was not n0 n1 n2 throughout", i);

    double n_on_n1, n_on_n0;
    double slow = mean_wait(&c, 2, "n1", &n_on_n1);
    double own = mean_wait(&c, 1, "n0", &n_on_n0);
    fprintf(stderr, "n2 waits %.3f ms a step on n1, n1 %.3f ms on n0\n",
            slow * 1e3, own * 1e3);
    ASSERT_EQ(n_on_n1, 300);
    ASSERT_EQ(n_on_n0, 300);
    ASSERT_MSG(slow > 2 * own, "n2 waited %.6f s a step on n1, n1 %.6f s "
               "on n0", slow, own);

    promtool_clean(&c, 2);

    status_t st = {&c, ""};
    snprintf(st.out, sizeof(st.out), "%s", td_path(&c.d[0], "status.out"));
    ASSERT_MSG(td_poll(names_slowest, &st, 10000) == 0,
               "ringctl status never named a slowest node");
    td_dump(st.out);
    ASSERT(td_file_has(st.out, "slowest:     n1 "));
    /* All resumed before any is waited for: the first to end takes its
     * node out, and the view that follows is installed only once every
     * other trainer is back at its step_begin (one still stopped would
     * hold it, and the trainer waited for with it). */
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(kill(c.trainer[i][0], SIGCONT), 0);
    for (int i = 0; i < 3; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * The hop records' period: 2-2.4 s in a small job, and stretched with
 * the view so that a job of any size puts at most 50 records a second in
 * all (at 1000 nodes every 2 s was 500 a second); names spread the
 * nodes' periods so they do not put in step.
 */
TEST_IMPL(job_hop_period)
{
    static const size_t sizes[] = {1, 3, 10, 64, 100, 101, 250, 1000, 4096};
    char name[32];
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        double rate = 0;
        int64_t lo = INT64_MAX, hi = 0;
        for (size_t i = 0; i < n; i++) {
            snprintf(name, sizeof(name), "node-%04zu", i);
            int64_t ms = job_hop_period_ms(n, name);
            rate += 1000.0 / (double)ms;
            lo = ms < lo ? ms : lo;
            hi = ms > hi ? ms : hi;
        }
        fprintf(stderr, "%zu nodes: %.1f records/s, periods %lld-%lld ms\n",
                n, rate, (long long)lo, (long long)hi);
        ASSERT_MSG(rate <= JOB_HOP_JOB_PUTS_PER_S, "%zu nodes put %.1f "
                   "records a second", n, rate);
        ASSERT(lo >= JOB_HOP_PUBLISH_MS);
        if (n >= 10)
            ASSERT_MSG(hi - lo >= lo / 10, "%zu nodes' periods all within "
                       "%lld-%lld ms", n, (long long)lo, (long long)hi);
        if (n <= 100)
            ASSERT(hi <= JOB_HOP_PUBLISH_MS * 6 / 5);
    }
    int64_t anon = job_hop_period_ms(1000, NULL); /* before a name */
    ASSERT(anon >= 20000 && anon <= 24000);
    return fx_done();
}
