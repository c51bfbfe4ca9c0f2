/*
 * test-ring-args.c - what ring_create and ring_allreduce refuse, and what
 * the fields of a ring_allreduce_t mean, on rings in this process: one
 * rank alone, or two ring threads over loopback with a static view.
 *
 * A refused call returns ST_EINVAL and does nothing: no collective
 * starts (the ring's counters and sequence stay, so nothing was sent),
 * the buffer keeps its bytes and the ring stays usable. Every refusal is
 * next to the same call with that one field in range, which runs.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/wire.h"
#include "kernels/kern.h"
#include "ring/ring.h"
#include "tests/helpers.h"
#include "tests/task.h"
#include "transport/tp.h"

#define ARGS_N 8 /* elements of the buffers */


static void opts_for_test(ring_opts_t *o, rd_wire_t wire)
{
    ring_opts_default(o);
    o->deadline_ms = 20000; /* a loaded machine, not a failure */
    o->wire = wire;
}

/*
 * ring_create refuses a ring without a wire format of its own (DEFAULT
 * is what a call's DEFAULT means) and one outside rd_wire_t, before it
 * makes anything: *ring_p keeps what it held. The three concrete ones
 * are taken.
 */
TEST_IMPL(ring_create_wire_refused)
{
    th_ucx_loopback("tcp");
    tp_t *tp = NULL, *tp2 = NULL;
    ASSERT_OK(tp_create(NULL, &tp));
    ASSERT_OK(tp_create(NULL, &tp2));
    const void *addrs[2];
    size_t lens[2];
    tp_address(tp, &addrs[0], &lens[0]);
    tp_address(tp2, &addrs[1], &lens[1]);
    ring_view_t one = {.generation = 1, .nranks = 1, .rank = 0};
    ring_view_t two = {.generation = 1, .nranks = 2, .rank = 0,
                       .addrs = addrs, .addr_lens = lens};
    const ring_view_t *views[2] = {&one, &two};
    const rd_wire_t bad[] = {RD_WIRE_DEFAULT, RD_WIRE_COUNT,
                             (rd_wire_t)(RD_WIRE_COUNT + 7), (rd_wire_t)-1};
    ring_t *const sentinel = (ring_t *)&tp;
    for (int v = 0; v < 2; v++) {
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            ring_opts_t o;
            opts_for_test(&o, bad[i]);
            ring_t *r = sentinel;
            uint32_t unreachable = 5;
            int rc = ring_create(tp, views[v], &o, &r, &unreachable);
            ASSERT_MSG(rc == ST_EINVAL, "%u ranks, wire %d: %s",
                       views[v]->nranks, (int)bad[i], st_strerror(rc));
            ASSERT(r == sentinel);
            ASSERT_EQ(unreachable, UINT32_MAX);
        }
    }
    for (rd_wire_t w = RD_WIRE_NONE; w < RD_WIRE_COUNT; w++) {
        ring_opts_t o;
        opts_for_test(&o, w);
        ring_t *r = sentinel;
        ASSERT_OK(ring_create(tp, &one, &o, &r, NULL));
        ASSERT(r != sentinel && r != NULL);
        ring_destroy(r);
    }
    tp_destroy(tp2);
    tp_destroy(tp);
    return 0;
}

/*
 * AVG on one rank: divisor 0 is the number of ranks (1: the sum as it
 * is), another divisor divides. The other ops with a divisor are
 * refused, also here where they would change nothing.
 */
TEST_IMPL(ring_avg_divisor_n1)
{
    th_ucx_loopback("tcp");
    tp_t *tp = NULL;
    ASSERT_OK(tp_create(NULL, &tp));
    ring_view_t one = {.generation = 1, .nranks = 1, .rank = 0};
    ring_opts_t o;
    opts_for_test(&o, RD_WIRE_NONE);
    ring_t *r = NULL;
    ASSERT_OK(ring_create(tp, &one, &o, &r, NULL));
    float x[ARGS_N];
    for (int i = 0; i < ARGS_N; i++)
        x[i] = (float)(3 * (i + 1));
    ring_allreduce_t a = {.buf = x, .count = ARGS_N, .dt = KERN_F32,
                          .op = KERN_AVG};
    ASSERT_OK(ring_allreduce(r, &a));
    for (int i = 0; i < ARGS_N; i++)
        ASSERT_EQ(x[i], (float)(3 * (i + 1)));
    a.divisor = 4;
    ASSERT_OK(ring_allreduce(r, &a));
    for (int i = 0; i < ARGS_N; i++)
        ASSERT_EQ(x[i], (float)(3 * (i + 1)) / 4);
    a.op = KERN_SUM;
    ASSERT_EQ(ring_allreduce(r, &a), ST_EINVAL);
    ring_stats_t st;
    ring_stats(r, &st);
    ASSERT_EQ(st.collectives, 2);
    ring_destroy(r);
    tp_destroy(tp);
    return 0;
}

/* ---- two ring threads ---- */

typedef struct pair pair_t;
typedef void (*pair_body_fn)(ring_t *r, uint32_t rank);

struct pair {
    pthread_barrier_t bar;
    const void *addrs[2];
    size_t lens[2];
    tp_t *tp[2];
    int create_rc[2];
    pair_body_fn body;
};

typedef struct {
    pair_t *pair;
    uint32_t rank;
} pair_side_t;

static void *pair_run(void *arg)
{
    pair_side_t *s = arg;
    pair_t *p = s->pair;
    tp_address(p->tp[s->rank], &p->addrs[s->rank], &p->lens[s->rank]);
    pthread_barrier_wait(&p->bar);
    ring_view_t v = {.generation = 3, .nranks = 2, .rank = s->rank,
                     .addrs = p->addrs, .addr_lens = p->lens};
    ring_opts_t o;
    opts_for_test(&o, RD_WIRE_NONE);
    ring_t *r = NULL;
    p->create_rc[s->rank] = ring_create(p->tp[s->rank], &v, &o, &r, NULL);
    ASSERT_MSG(p->create_rc[s->rank] == 0, "rank %u: ring_create: %s",
               s->rank, st_strerror(p->create_rc[s->rank]));
    p->body(r, s->rank);
    /* Both are done with the ring before either closes its endpoints. */
    pthread_barrier_wait(&p->bar);
    ring_destroy(r);
    return NULL;
}

/* body on both ranks of a two-rank ring, each on its own thread. */
static void pair_each(pair_body_fn body)
{
    th_ucx_loopback("tcp");
    static pair_t p;
    memset(&p, 0, sizeof(p));
    p.body = body;
    ASSERT_EQ(pthread_barrier_init(&p.bar, NULL, 2), 0);
    for (int i = 0; i < 2; i++)
        ASSERT_OK(tp_create(NULL, &p.tp[i]));
    pair_side_t sides[2] = {{&p, 0}, {&p, 1}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, pair_run, &sides[i]), 0);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 2; i++)
        tp_destroy(p.tp[i]);
    pthread_barrier_destroy(&p.bar);
}

/* Rank r's input: (r + 1) * (i + 1), so the sum is 3 * (i + 1). */
static void fill_rank(float *x, uint32_t rank)
{
    for (int i = 0; i < ARGS_N; i++)
        x[i] = (float)((rank + 1) * (uint32_t)(i + 1));
}

typedef struct {
    const char *what;
    int null_desc;
    ring_allreduce_t a;
} args_case_t;

/* Every refused descriptor differs from the valid f32 SUM over x in the
 * one field named; the same list on both ranks. */
static size_t refused_args(float *x, args_case_t *c)
{
    const ring_allreduce_t base = {.buf = x, .count = ARGS_N,
                                   .dt = KERN_F32, .op = KERN_SUM};
    size_t n = 0;
#define CASE(msg, ...)                                                       \
    do {                                                                     \
        c[n] = (args_case_t){.what = msg, .a = base};                        \
        __VA_ARGS__;                                                         \
        n++;                                                                 \
    } while (0)
    CASE("no descriptor", c[n].null_desc = 1);
    CASE("SUM with a divisor", c[n].a.divisor = 2);
    CASE("PROD with a divisor", c[n].a.op = KERN_PROD, c[n].a.divisor = 2);
    CASE("MIN with a divisor", c[n].a.op = KERN_MIN, c[n].a.divisor = 1);
    CASE("MAX with a divisor", c[n].a.op = KERN_MAX, c[n].a.divisor = 3);
    CASE("wire past the enum", c[n].a.wire = RD_WIRE_COUNT);
    CASE("negative wire", c[n].a.wire = (rd_wire_t)-1);
    CASE("op past the enum", c[n].a.op = KERN_OP_COUNT);
    CASE("dtype past the enum", c[n].a.dt = KERN_DTYPE_COUNT);
    CASE("no buffer", c[n].a.buf = NULL);
#undef CASE
    return n;
}

static void same_stats(const ring_stats_t *a, const ring_stats_t *b,
                       const char *what)
{
    ASSERT_MSG(a->collectives == b->collectives &&
               a->next_seq == b->next_seq && a->forged == b->forged &&
               a->stale_dropped == b->stale_dropped,
               "%s: the ring moved (collectives %llu -> %llu, seq %u -> %u)",
               what, (unsigned long long)a->collectives,
               (unsigned long long)b->collectives, a->next_seq, b->next_seq);
}

/*
 * Both ranks make the same refused calls on inputs that a SUM would
 * change: ST_EINVAL each, the buffer as it was, the ring's counters and
 * sequence where they were. Then the same ring runs a SUM.
 */
static void refused_body(ring_t *r, uint32_t rank)
{
    float x[ARGS_N], x0[ARGS_N];
    args_case_t c[16];
    size_t n = refused_args(x, c);
    fill_rank(x, rank);
    memcpy(x0, x, sizeof(x));
    ring_stats_t before, after;
    ring_stats(r, &before);
    for (size_t i = 0; i < n; i++) {
        int rc = ring_allreduce(r, c[i].null_desc ? NULL : &c[i].a);
        ASSERT_MSG(rc == ST_EINVAL, "rank %u, %s: %s", rank, c[i].what,
                   st_strerror(rc));
        ASSERT_MSG(memcmp(x, x0, sizeof(x)) == 0, "rank %u, %s: buffer "
                   "changed", rank, c[i].what);
        ring_stats(r, &after);
        same_stats(&before, &after, c[i].what);
    }
    ring_allreduce_t a = {.buf = x, .count = ARGS_N, .dt = KERN_F32,
                          .op = KERN_SUM};
    ASSERT_OK(ring_allreduce(r, &a));
    for (int i = 0; i < ARGS_N; i++)
        ASSERT_EQ(x[i], (float)(3 * (i + 1)));
    ring_stats(r, &after);
    ASSERT_EQ(after.collectives, before.collectives + 1);
    ASSERT_NE(after.next_seq, before.next_seq);
}

TEST_IMPL(ring_allreduce_refused_n2)
{
    pair_each(refused_body);
    return 0;
}

/*
 * AVG's divisor on two ranks: 0 divides the sum by the ranks (2), 4 by
 * 4; the inputs sum to 3 * (i + 1), so both are exact in f32.
 */
static void avg_body(ring_t *r, uint32_t rank)
{
    float x[ARGS_N];
    fill_rank(x, rank);
    ring_allreduce_t a = {.buf = x, .count = ARGS_N, .dt = KERN_F32,
                          .op = KERN_AVG};
    ASSERT_OK(ring_allreduce(r, &a));
    for (int i = 0; i < ARGS_N; i++)
        ASSERT_MSG(x[i] == (float)(3 * (i + 1)) / 2, "rank %u, [%d]: %g, "
                   "not the sum over 2 ranks", rank, i, (double)x[i]);
    fill_rank(x, rank);
    a.divisor = 4;
    ASSERT_OK(ring_allreduce(r, &a));
    for (int i = 0; i < ARGS_N; i++)
        ASSERT_EQ(x[i], (float)(3 * (i + 1)) / 4);
}

TEST_IMPL(ring_avg_divisor_n2)
{
    pair_each(avg_body);
    return 0;
}

/*
 * A compressing wire applies to f32 only; other dtypes ignore it
 * (ring.h), with no error. Inputs 1 + (r + 1) 2^-20 sum to
 * 2 + 3 * 2^-20: exact in f32 and f64, 2 once rounded to bf16. So f32
 * with bf16 on the wire gives 2 (it compresses), f64 the exact sum.
 */
static void wire_dtype_body(ring_t *r, uint32_t rank)
{
    const double eps = 1.0 / (1 << 20);
    float xf[ARGS_N];
    double xd[ARGS_N];
    for (int i = 0; i < ARGS_N; i++) {
        xf[i] = (float)(1.0 + (rank + 1) * eps);
        xd[i] = 1.0 + (rank + 1) * eps;
    }
    ring_allreduce_t a = {.buf = xf, .count = ARGS_N, .dt = KERN_F32,
                          .op = KERN_SUM, .wire = RD_WIRE_BF16};
    ASSERT_OK(ring_allreduce(r, &a));
    for (int i = 0; i < ARGS_N; i++)
        ASSERT_EQ(xf[i], 2.0f);
    a = (ring_allreduce_t){.buf = xd, .count = ARGS_N, .dt = KERN_F64,
                           .op = KERN_SUM, .wire = RD_WIRE_BF16};
    ASSERT_OK(ring_allreduce(r, &a));
    for (int i = 0; i < ARGS_N; i++)
        ASSERT_EQ(xd[i], 2.0 + 3 * eps);
}

TEST_IMPL(ring_wire_dtype_n2)
{
    pair_each(wire_dtype_body);
    return 0;
}
