/*
 * Fusion groups (ringd_group_start/end) through real daemons: two trainers
 * of a standalone daemon issuing a group of mixed collectives, and 3-node
 * ring jobs whose trainers fuse their gradients, with the pieces end to
 * end (run in the buffer) and issued backwards (run in the pieces),
 * against the blocking job and the staged path; and fusion by arrival
 * (daemon/fuse.c): 2-node jobs of asynchronous allreduces outside any
 * group, a mismatch that fusion could hide, and the ask's answer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "daemon/dmn-int.h"
#include "include/ringd.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/ring-cluster.h"
#include "tests/task.h"

/* Trainer k's input, tensor i, element j. */
static float fu_input(int k, int i, int j)
{
    return (float)((k + 1) * (i * 3 + j % 11));
}

/*
 * Fusion groups: two trainers issue, in one group, 10 f32 SUM allreduces,
 * 5 f32 AVG ones, a broadcast and 4 i32 MAX ones, in buffers apart. The
 * daemon runs the three allreduce runs fused (19 collectives fused, in 4
 * operations with the broadcast), the two whose pieces lie end to end in
 * the trainers' buffers, the sums through staging, and every result is
 * the closed form.
 * Inside the group, waiting and blocking calls are refused; a grouping
 * that differs between the trainers is a mismatch, and the daemon serves
 * on.
 */
/* dmn_async_fused's group: NS f32 sums, NA f32 averages, a broadcast, NM
 * i32 maxima, of L elements each. */
enum { FU_NS = 10, FU_NA = 5, FU_NM = 4, FU_L = 300,
       FU_NF = (FU_NS + FU_NA + 1) * FU_L,
       FU_NH = FU_NS + FU_NA + 1 + FU_NM };

/* Trainer k's inputs, issued as one group in h (backwards through the
 * buffer: fusion needs no adjacency); inside the group, a wait, a test, a
 * blocking collective and step_end are refused. */
static void issue_group(ringd_client_t *c, int k, float *f, int32_t *m,
                        ringd_handle_t *h)
{
    for (int i = 0; i < FU_NF; i++)
        f[i] = fu_input(k, i / FU_L, i % FU_L);
    for (int i = 0; i < FU_NM * FU_L; i++)
        m[i] = (k == 1) == (i % 2) ? i : -i;
    ASSERT_OK(ringd_group_start(c));
    ASSERT_EQ(ringd_group_start(c), RINGD_ESTATE);
    int n = 0;
    for (int i = FU_NS - 1; i >= 0; i--)
        ASSERT_OK(ringd_allreduce_async(c, f + i * FU_L, FU_L, RINGD_F32,
                                        RINGD_SUM, &h[n++]));
    for (int i = FU_NS; i < FU_NS + FU_NA; i++)
        ASSERT_OK(ringd_allreduce_async(c, f + i * FU_L, FU_L, RINGD_F32,
                                        RINGD_AVG, &h[n++]));
    ASSERT_OK(ringd_broadcast_async(c, f + (FU_NS + FU_NA) * FU_L,
                                    FU_L * sizeof(float), 0, &h[n++]));
    for (int i = 0; i < FU_NM; i++)
        ASSERT_OK(ringd_allreduce_async(c, m + i * FU_L, FU_L, RINGD_I32,
                                        RINGD_MAX, &h[n++]));
    ASSERT_EQ(ringd_wait(c, h[0]), RINGD_ESTATE);
    int done = -1;
    ASSERT_EQ(ringd_test(c, h[0], &done), RINGD_ESTATE);
    ASSERT_EQ(done, 0);
    ASSERT_EQ(ringd_allreduce(c, f, 1, RINGD_F32, RINGD_SUM), RINGD_ESTATE);
    ASSERT_EQ(ringd_step_end(c), RINGD_ESTATE);
    ASSERT_OK(ringd_group_end(c));
    ASSERT_EQ(ringd_group_end(c), RINGD_ESTATE);
}

/* Trainer k's results: the closed-form sums, averages, root's bytes and
 * maxima. */
static void check_group(int k, const float *f, const int32_t *m)
{
    for (int i = 0; i < FU_NF; i++) {
        int tsr = i / FU_L, j = i % FU_L;
        float sum = fu_input(0, tsr, j) + fu_input(1, tsr, j);
        float want = tsr < FU_NS             ? sum
                     : tsr < FU_NS + FU_NA ? sum / 2
                                           : fu_input(0, tsr, j);
        ASSERT_MSG(f[i] == want, "trainer %d tensor %d [%d]: %g, want %g",
                   k, tsr, j, (double)f[i], (double)want);
    }
    for (int i = 0; i < FU_NM * FU_L; i++)
        ASSERT_EQ(m[i], i);
}

/* Trainer 0 groups two allreduces, trainer 1 issues them apart. */
static void group_mismatch(ringd_client_t *const *c, float *const *f)
{
    ringd_handle_t g0[2], g1[2];
    ASSERT_OK(ringd_group_start(c[0]));
    for (int i = 0; i < 2; i++)
        ASSERT_OK(ringd_allreduce_async(c[0], f[0] + i * FU_L, FU_L,
                                        RINGD_F32, RINGD_SUM, &g0[i]));
    ASSERT_OK(ringd_group_end(c[0]));
    for (int i = 0; i < 2; i++)
        ASSERT_OK(ringd_allreduce_async(c[1], f[1] + i * FU_L, FU_L,
                                        RINGD_F32, RINGD_SUM, &g1[i]));
    ASSERT_EQ(ringd_wait(c[1], g1[0]), RINGD_EMISMATCH);
    ASSERT_EQ(ringd_wait(c[0], g0[0]), RINGD_EMISMATCH);
}

TEST_IMPL(dmn_async_fused)
{
    td_daemon_t t;
    td_init(&t, "dmn-async-fuse");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    ringd_client_t *c[2];
    float *f[2];
    int32_t *m[2];
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(ringd_connect(&c[k], t.sock, NULL));
        f[k] = ringd_buffer(c[k], FU_NF * sizeof(float));
        m[k] = ringd_buffer(c[k], FU_NM * FU_L * sizeof(int32_t));
        ASSERT(f[k] != NULL && m[k] != NULL);
    }
    ringd_view_t v[2];
    td_begin_both(c, v);
    ringd_handle_t h[2][FU_NH];
    for (int k = 0; k < 2; k++)
        issue_group(c[k], k, f[k], m[k], h[k]);
    for (int k = 0; k < 2; k++)
        for (int i = FU_NH - 1; i >= 0; i--)
            ASSERT_EQ(ringd_wait(c[k], h[k][i]), 0);
    for (int k = 0; k < 2; k++)
        check_group(k, f[k], m[k]);
    ASSERT_EQ(td_metric(&t, "ringd_collectives_fused_total"),
              FU_NS + FU_NA + FU_NM);
    /* The averages and maxima lie end to end in group order: run in the
     * trainers' buffers; the sums, issued backwards, through staging. */
    ASSERT_EQ(td_metric(&t, "ringd_collectives_fused_in_place_total"),
              FU_NA + FU_NM);
    ASSERT_EQ(td_metric(&t, "ringd_collectives_total"), FU_NH);

    group_mismatch(c, f);
    for (int k = 0; k < 2; k++)
        ringd_close(c[k]);
    ASSERT(td_file_has(t.log, "does not match"));
    ringd_client_t *again;
    ASSERT_OK(ringd_connect(&again, t.sock, NULL));
    ringd_close(again);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* A 3-node ring job of one trainer per node, 100 steps, trainer flags
 * extra (NULL-ended); returns n0's ringd_collectives_fused_total, and
 * its ringd_collectives_fused_in_place_total in *in_place. */
static double fuse_job(cluster_t *c, const char *const *extra,
                       double *in_place)
{
    fx_etcd_start(&c->etcd, 0);
    for (int i = 0; i < 3; i++)
        node_init(c, i, "1", "3");
    for (int i = 0; i < 3; i++) {
        const char *args[12] = {"--steps", "100", "--hash-log",
                                td_path(&c->d[i], "h0"), "--save",
                                td_path(&c->d[i], "p0")};
        for (int k = 0; extra[k] != NULL && k < 5; k++)
            args[6 + k] = extra[k];
        c->trainer[i][0] = td_trainer(&c->d[i], args,
                                      td_path(&c->d[i], "t0.log"));
    }
    for (int i = 0; i < 3; i++)
        expect_exit0(c, i, 0, c->trainer[i][0]);
    double fused = td_metric(&c->d[0], "ringd_collectives_fused_total");
    *in_place = td_metric(&c->d[0], "ringd_collectives_fused_in_place_total");
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c->d[i], 30000), 0);
    return fused;
}

/* Two fuse_job runs: every node of a at every step bitwise where b's is,
 * and every node's final parameters b's node 0's. */
static void same_jobs(cluster_t *a, cluster_t *b)
{
    static td_hashes_t ha, hb;
    for (int i = 0; i < 3; i++) {
        td_read_hashes(td_path(&a->d[i], "h0"), &ha);
        td_read_hashes(td_path(&b->d[i], "h0"), &hb);
        ASSERT_EQ(ha.nsteps, 100);
        ASSERT_EQ(td_same_hashes(&ha, &hb), 100);
        ASSERT_EQ(td_param_diff(td_path(&a->d[i], "p0"),
                                td_path(&b->d[0], "p0")), 0);
    }
}

/*
 * Fusion across nodes: a 3-node job whose trainers issue their gradients
 * as 10 asynchronous allreduces in one fusion group runs each step's 10
 * as one ring operation on every node (in the trainer's buffer, where the
 * pieces lie end to end in group order), and ends bitwise where the same
 * job with one blocking allreduce of the whole gradient does (the fused
 * buffer is that gradient, end to end), at every step. (Unfused, the 10
 * pieces are summed in other orders and the bits differ from step 0.)
 */
TEST_IMPL(dmn_ring_async_fused)
{
    cluster_env();
    static cluster_t fused = {.n = 3}, plain = {.n = 3};
    const char *fx[] = {"--async", "10", "--fuse", NULL};
    const char *px[] = {NULL};
    double nfi = 0, npi = 0;
    double nf = fuse_job(&fused, fx, &nfi);
    double np = fuse_job(&plain, px, &npi);
    ASSERT_MSG(nf >= 10 * 100, "n0 fused %g collectives", nf);
    ASSERT_EQ(nfi, nf); /* the pieces lie end to end: in the buffer */
    ASSERT_EQ(np, 0);
    same_jobs(&fused, &plain);
    return fx_done();
}

/*
 * The same group issued last piece first (not end to end): the ring runs
 * it in the trainer's pieces (ring_stats' local_in_place), with chunks
 * that cross two pieces packed and applied piece by piece, and every
 * step ends bitwise where the staged path (RINGD_LOCAL_PIPE=0: gathered
 * into staging, reduced there, scattered back) does.
 */
TEST_IMPL(dmn_ring_async_fused_pieces)
{
    cluster_env();
    static cluster_t inpl = {.n = 3}, staged = {.n = 3};
    const char *fx[] = {"--async", "10", "--fuse-backwards", NULL};
    double ni = 0, ns = 0;
    double nf = fuse_job(&inpl, fx, &ni);
    setenv("RINGD_LOCAL_PIPE", "0", 1);
    double nfs = fuse_job(&staged, fx, &ns);
    unsetenv("RINGD_LOCAL_PIPE");
    ASSERT_MSG(nf >= 10 * 100 && nfs >= 10 * 100, "n0 fused %g and %g", nf,
               nfs);
    ASSERT_EQ(ni, 0); /* not end to end: the daemon hands the pieces */
    ASSERT_EQ(ns, 0);
    for (int i = 0; i < 3; i++) {
        ASSERT(td_file_has(staged.d[i].log, "(staged, RINGD_LOCAL_PIPE=0)"));
        ASSERT(td_file_has(inpl.d[i].log, "runs in its pieces (in place)"));
    }
    same_jobs(&inpl, &staged);
    return fx_done();
}

/* ---- fusion by arrival -------------------------------------------------- */

/* Each step: one allreduce too large to fuse (AF_BIG floats, 8 MiB), then
 * AF_PIECES allreduces of AF_LEN floats in one buffer, then two that
 * overlap (o[0, 2L) and o[L, 3L)), all outstanding at once. */
enum { AF_STEPS = 20, AF_PIECES = 64, AF_LEN = 4096, AF_BIG = 2 << 20,
       AF_NH = AF_PIECES + 3 };

/* Trainer t's inputs of step s. */
static void af_fill(float *big, float *f, float *o, int t, uint64_t s)
{
    for (int i = 0; i < AF_BIG; i++)
        big[i] = (float)(t + 1);
    for (int i = 0; i < AF_PIECES * AF_LEN; i++)
        f[i] = (float)(t + 1 + i % 1000 + (int)s);
    for (int i = 0; i < 3 * AF_LEN; i++)
        o[i] = (float)(t + 1);
}

/* Issue step's collectives (the pieces last first when backwards; slow:
 * a pause of that many us before each piece, a trainer that issues them
 * as its backward pass makes them, so that the nodes have queued
 * different numbers when their daemons ask). */
static int af_issue(ringd_client_t *c, float *big, float *f, float *o,
                    int backwards, int slow, ringd_handle_t *h)
{
    int rc = ringd_allreduce_async(c, big, AF_BIG, RINGD_F32, RINGD_SUM,
                                   &h[0]);
    for (int p = 0; rc == 0 && p < AF_PIECES; p++) {
        int at = backwards ? AF_PIECES - 1 - p : p;
        if (slow > 0)
            usleep((useconds_t)slow);
        rc = ringd_allreduce_async(c, f + at * AF_LEN, AF_LEN, RINGD_F32,
                                   RINGD_SUM, &h[1 + p]);
    }
    if (rc == 0)
        rc = ringd_allreduce_async(c, o, 2 * AF_LEN, RINGD_F32, RINGD_SUM,
                                   &h[AF_PIECES + 1]);
    if (rc == 0)
        rc = ringd_allreduce_async(c, o + AF_LEN, 2 * AF_LEN, RINGD_F32,
                                   RINGD_SUM, &h[AF_PIECES + 2]);
    return rc;
}

/* The closed forms of a world of w: each allreduce sees the results of
 * the ones before it (the overlap's second sums what the first wrote). */
static int af_check(const float *big, const float *f, const float *o,
                    int w, uint64_t s)
{
    float tri = (float)(w * (w + 1) / 2);
    for (int i = 0; i < AF_BIG; i++)
        if (big[i] != tri)
            return 20;
    for (int i = 0; i < AF_PIECES * AF_LEN; i++)
        if (f[i] != tri + (float)(w * (i % 1000 + (int)s)))
            return 21;
    for (int i = 0; i < 3 * AF_LEN; i++)
        if (o[i] != (i >= AF_LEN && i < 2 * AF_LEN ? w * tri : tri))
            return 22;
    return 0;
}

/* One trainer of an auto-fusion job (a child process): 0 when every
 * step's results were the closed forms. */
static int af_trainer(const char *sock, int backwards, int slow)
{
    ringd_client_t *c = NULL;
    if (ringd_connect(&c, sock, NULL) != 0)
        return 10;
    float *big = ringd_buffer(c, AF_BIG * sizeof(float));
    float *f = ringd_buffer(c, AF_PIECES * AF_LEN * sizeof(float));
    float *o = ringd_buffer(c, 3 * AF_LEN * sizeof(float));
    if (big == NULL || f == NULL || o == NULL)
        return 11;
    for (;;) {
        ringd_view_t v;
        if (ringd_step_begin(c, &v) != 0)
            return 12;
        if (v.step >= AF_STEPS)
            break;
        af_fill(big, f, o, (int)v.rank, v.step);
        ringd_handle_t h[AF_NH];
        int rc = af_issue(c, big, f, o, backwards, slow, h), redo = 0;
        if (rc != 0)
            return 13;
        for (int i = 0; i < AF_NH; i++) {
            rc = ringd_wait(c, h[i]);
            redo |= rc == RINGD_ERESHAPE;
            if (rc != 0 && rc != RINGD_ERESHAPE)
                return 14;
        }
        if (redo)
            continue;
        if ((rc = af_check(big, f, o, (int)v.world, v.step)) != 0) {
            fprintf(stderr, "step %llu: check %d failed\n",
                    (unsigned long long)v.step, rc);
            return rc;
        }
        if (ringd_step_end(c) != 0)
            return 15;
    }
    ringd_close(c);
    return 0;
}

/* A 2-node job of per_node trainers a node running AF_STEPS steps with
 * daemon flags (NULL: none), node 1's trainers slow (af_issue); checks every trainer's results and that both
 * nodes made the same fusions and asks; returns n0's fused-by-arrival
 * count, its asks in *asks. */
static double af_job(int per_node, int backwards, int slow,
                     const char *const *flags, double *asks)
{
    cluster_t c = {.n = 2};
    const char *t = per_node == 2 ? "2" : "1";
    fx_etcd_start(&c.etcd, 0);
    rc_flags = flags;
    for (int i = 0; i < 2; i++)
        node_init(&c, i, t, "2");
    rc_flags = NULL;
    pid_t p[4];
    for (int k = 0; k < 2 * per_node; k++)
        if ((p[k] = td_fork()) == 0)
            _exit(af_trainer(c.d[k / per_node].sock, backwards,
                             k / per_node == 1 ? slow : 0));
    for (int k = 0; k < 2 * per_node; k++)
        ASSERT_EQ(td_exit_code(p[k], 120000), 0);
    const char *fk = "ringd_collectives_fused_auto_total";
    const char *ak = "ringd_fusion_asks_total";
    double fused = td_metric(&c.d[0], fk);
    *asks = td_metric(&c.d[0], ak);
    ASSERT_EQ(td_metric(&c.d[1], fk), fused);
    ASSERT_EQ(td_metric(&c.d[1], ak), *asks);
    ASSERT_EQ(td_metric(&c.d[0], "ringd_steps_total"), AF_STEPS);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    fx_done();
    return fused;
}

/*
 * Fusion by arrival: 2-node jobs whose trainers issue 67 asynchronous
 * allreduces a step, outside any group, behind an 8 MiB one. The daemons
 * fuse the 64 pieces queued behind it into a few ring operations, both
 * nodes the same ones (their counts of fused collectives and of asks
 * match, though one node's trainer issues its pieces slowly, so that the
 * nodes have queued different numbers), with one trainer a node whatever
 * the order of the pieces (the ring runs them where they lie) and with two when they lie end to end,
 * but never with two trainers' pieces apart (staging would cost more)
 * nor two that overlap: every result is the closed form of the
 * allreduces run one after another. ring-fuse-kib 0 turns it off: no ask.
 */
TEST_IMPL(dmn_ring_auto_fused)
{
    cluster_env();
    double asks = 0, fused;
    fused = af_job(1, 1, 50, NULL, &asks);
    ASSERT_MSG(fused > 0 && asks > 0, "one trainer, backwards: %g fused, "
               "%g asks", fused, asks);
    fused = af_job(2, 0, 0, NULL, &asks);
    ASSERT_MSG(fused > 0 && asks > 0, "two trainers, end to end: %g fused, "
               "%g asks", fused, asks);
    fused = af_job(2, 1, 0, NULL, &asks);
    ASSERT_MSG(fused == 0 && asks > 0, "two trainers, apart: %g fused, %g "
               "asks", fused, asks);
    const char *off[] = {"--ring-fuse-kib", "0", NULL};
    fused = af_job(1, 0, 0, off, &asks);
    ASSERT_MSG(fused == 0 && asks == 0, "fusion off: %g fused, %g asks",
               fused, asks);
    return 0;
}

/* One attempt at a step whose three pieces node `node` orders its own
 * way, behind an 8 MiB allreduce, then another 8 MiB one and a piece
 * after it (child process): 0 when every handle succeeded, 1 when one
 * failed with a mismatch or a reshape. */
static int af_mismatch_trainer(const char *sock, int node)
{
    static const size_t len[2][3] = {{1000, 2000, 3000}, {1000, 3000, 2000}};
    ringd_client_t *c = NULL;
    if (ringd_connect(&c, sock, NULL) != 0)
        return 10;
    float *big = ringd_buffer(c, AF_BIG * sizeof(float));
    float *f = ringd_buffer(c, 7000 * sizeof(float));
    ringd_view_t v;
    if (big == NULL || f == NULL || ringd_step_begin(c, &v) != 0)
        return 11;
    ringd_handle_t h[6];
    int rc = ringd_allreduce_async(c, big, AF_BIG, RINGD_F32, RINGD_SUM,
                                   &h[0]);
    for (size_t i = 0, at = 0; rc == 0 && i < 3; at += len[node][i++])
        rc = ringd_allreduce_async(c, f + at, len[node][i], RINGD_F32,
                                   RINGD_SUM, &h[1 + i]);
    if (rc == 0)
        rc = ringd_allreduce_async(c, big, AF_BIG, RINGD_F32, RINGD_SUM,
                                   &h[4]);
    if (rc == 0)
        rc = ringd_allreduce_async(c, f + 6000, 1000, RINGD_F32, RINGD_SUM,
                                   &h[5]);
    if (rc != 0)
        return 12;
    int failed = 0;
    for (int i = 0; i < 6; i++) {
        rc = ringd_wait(c, h[i]);
        if (rc != 0 && rc != RINGD_EMISMATCH && rc != RINGD_ERESHAPE)
            return 13;
        failed |= rc != 0;
    }
    ringd_close(c);
    return failed;
}

/*
 * Trainers whose collectives differ in an order fusion could hide: the
 * same first piece and the same total of three, so that the three fused
 * by arrival make one ring operation of the same size on both nodes. The
 * ask before the next fusion carries each node's signature of what it
 * ran, and the step fails on both with a mismatch (the daemons say the
 * fused entries differed) instead of going on; had the pieces run alone,
 * the ring would have named the second one's size.
 */
TEST_IMPL(dmn_ring_auto_fused_mismatch)
{
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 2; i++)
        node_init(&c, i, "1", "2");
    pid_t p[2];
    for (int k = 0; k < 2; k++)
        if ((p[k] = td_fork()) == 0)
            _exit(af_mismatch_trainer(c.d[k].sock, k));
    for (int k = 0; k < 2; k++)
        ASSERT_EQ(td_exit_code(p[k], 60000), 1);
    int told = 0;
    for (int i = 0; i < 2; i++)
        told += td_file_has(c.d[i].log, "entries differed by node") ||
                td_file_has(c.d[i].log, "posted a collective of another "
                                        "size");
    ASSERT_EQ(told, 2);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* An answer to the ask as the backend would bring it (an i64 MIN over
 * the nodes: the offer, then signatures and their negations). */
static void fa_answer(dmn_t *d, int64_t m, int64_t head_lo, int64_t head_hi,
                      int64_t hist_lo, int64_t hist_hi)
{
    int64_t a[5] = {m, head_lo, -head_hi, hist_lo, -hist_hi};
    memcpy(d->q.fuse_ask, a, sizeof(a));
}

/*
 * The answer to an ask, as fuse.c reads it: outside 1..the node's offer
 * (a peer that sent what no MIN including this node's offer can give)
 * is ST_EPROTO; heads that differed launch the head alone and turn fusion
 * off for the step (the ring then names a size that differs); histories
 * that differed are a mismatch; agreed 1s in a row back off 0, 1, 2, 4
 * ... 64 launches and an agreed run resets that. The state carries over to the
 * next step of the view and starts again on a redo or a new view.
 */
TEST_IMPL(dmn_fuse_answer)
{
    dmn_t *d = calloc(1, sizeof(*d));
    ASSERT(d != NULL);
    d->view = (job_view_t){.generation = 3, .node_count = 2,
                           .fuse_bytes = 1 << 20};
    d->step = 7;
    d->starts = 1;
    ASSERT(dmn__fuse_on(d));
    dmn__fuse_epoch(d);
    d->q.fuse_mine = 3;
    fa_answer(d, 4, 9, 9, 5, 5);
    ASSERT_EQ(dmn__fuse_answer(d), ST_EPROTO);
    fa_answer(d, 0, 9, 9, 5, 5);
    ASSERT_EQ(dmn__fuse_answer(d), ST_EPROTO);
    fa_answer(d, 2, 9, 9, 5, 6);
    ASSERT_EQ(dmn__fuse_answer(d), ST_EMISMATCH);
    fa_answer(d, 3, 9, 9, 5, 5);
    ASSERT_EQ(dmn__fuse_answer(d), 0);
    ASSERT_EQ(d->q.fuse_agreed, 3);
    for (uint32_t want = 0; want <= 64; want = want ? want * 2 : 1) {
        fa_answer(d, 1, 9, 9, 5, 5);
        ASSERT_EQ(dmn__fuse_answer(d), 0);
        ASSERT_EQ(d->q.fuse_agreed, 1);
        ASSERT_EQ(d->q.fuse_skip, want);
    }
    fa_answer(d, 1, 9, 9, 5, 5);
    ASSERT_EQ(dmn__fuse_answer(d), 0);
    ASSERT_EQ(d->q.fuse_skip, 64);
    fa_answer(d, 2, 9, 9, 5, 5);
    ASSERT_EQ(dmn__fuse_answer(d), 0);
    ASSERT_EQ(d->q.fuse_backoff, 0);

    /* The next step of the view keeps the skips, a redo does not. */
    d->q.fuse_skip = 5;
    d->starts = 2;
    d->step = 8;
    dmn__fuse_epoch(d);
    ASSERT_EQ(d->q.fuse_skip, 5);
    d->starts = 3;
    dmn__fuse_epoch(d);
    ASSERT_EQ(d->q.fuse_skip, 0);

    /* Heads that differed: the head alone, no fusion for the step. */
    fa_answer(d, 3, 8, 9, 5, 5);
    ASSERT_EQ(dmn__fuse_answer(d), 0);
    ASSERT_EQ(d->q.fuse_agreed, 1);
    ASSERT_EQ(d->q.fuse_skip, UINT32_MAX);
    d->starts = 4;
    d->step = 9;
    dmn__fuse_epoch(d);
    ASSERT_EQ(d->q.fuse_skip, 0);
    d->q.fuse_skip = 5;
    d->starts = 5;
    d->step = 10;
    d->view.generation = 4;
    dmn__fuse_epoch(d);
    ASSERT_EQ(d->q.fuse_skip, 0);

    d->view.node_count = 1;
    ASSERT(!dmn__fuse_on(d));
    free(d);
    return 0;
}
