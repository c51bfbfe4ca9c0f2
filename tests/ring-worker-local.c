/*
 * ring-worker-local.c - the ring test worker's local sources: MODE local,
 * ring_allreduce of --locals local sources per rank (whole buffers, or
 * --fused: three pieces each) through the pipelined local reduce, checked
 * bitwise against the staged path (ring/README.md, "Local sources"); whole
 * sources twice: in a region apart and in the first source itself.
 */
#include "tests/ring-worker.h"

#include <inttypes.h>
#include <string.h>

#include "common/status.h"

#define LOCAL_MAX 4
#define LOCAL_PIECES 3

/* The sources of one call: W.locals buffers, each whole or in
 * LOCAL_PIECES pieces of uneven sizes (the fused layout). */
typedef struct {
    void *bufs[LOCAL_MAX * LOCAL_PIECES];
    size_t seg[LOCAL_PIECES];
    ring_local_t l;
} local_set_t;

static void local_make(local_set_t *ls, kern_dtype_t dt, kern_op_t op,
                       size_t count)
{
    size_t es = kern_dtype_size(dt);
    uint32_t g = W.fused ? LOCAL_PIECES : 1;
    ls->seg[0] = count / 5;
    ls->seg[1] = count / 2;
    ls->seg[2] = count - ls->seg[0] - ls->seg[1];
    if (g == 1)
        ls->seg[0] = count;
    for (uint32_t j = 0; j < W.locals; j++) {
        size_t at = 0;
        for (uint32_t s = 0; s < g; s++) {
            uint8_t *b = malloc(ls->seg[s] * es + 1);
            for (size_t i = 0; i < ls->seg[s]; i++)
                put(dt, b, i, gen_val(dt, op, W.rank * W.locals + j, at + i));
            ls->bufs[j * g + s] = b;
            at += ls->seg[s];
        }
    }
    ls->l = (ring_local_t){.bufs = ls->bufs, .nbufs = W.locals,
                           .nsegs = g, .seg_counts = ls->seg};
}

static void local_free(local_set_t *ls)
{
    uint32_t g = W.fused ? LOCAL_PIECES : 1;
    for (uint32_t i = 0; i < W.locals * g; i++)
        free(ls->bufs[i]);
}

/* Every source holds want (count elements of es bytes) bitwise. */
static void local_expect(const local_set_t *ls, const uint8_t *want,
                         size_t es, const char *what)
{
    uint32_t g = W.fused ? LOCAL_PIECES : 1;
    for (uint32_t j = 0; j < W.locals; j++) {
        size_t at = 0;
        for (uint32_t s = 0; s < g; s++) {
            if (memcmp(ls->bufs[j * g + s], want + at * es,
                       ls->seg[s] * es) != 0)
                DIE("%s: source %u piece %u differs from the staged path",
                    what, j, s);
            at += ls->seg[s];
        }
    }
}

/* Integer sums are exact: the staged path's own result, checked. */
static void local_check_sum(kern_dtype_t dt, kern_op_t op, const void *res,
                            size_t count)
{
    if ((dt != KERN_I32 && dt != KERN_I64) || op != KERN_SUM)
        return;
    for (size_t i = 0; i < count; i++) {
        uint64_t acc = 0;
        for (uint32_t src = 0; src < W.n * W.locals; src++)
            acc += (uint64_t)wrap(dt, (uint64_t)(int64_t)gen_val(dt, op,
                                                                 src, i));
        if ((int64_t)get(dt, res, i) != wrap(dt, acc))
            DIE("local %s sum [%zu] = %.0f, want %" PRId64,
                kern_dtype_name(dt), i, get(dt, res, i), wrap(dt, acc));
    }
}

/* Whole sources, the region the first source itself (the daemon's way):
 * every source ends as the staged path left ref. */
static void one_in_place(kern_dtype_t dt, kern_op_t op, size_t count,
                         ring_allreduce_t *a, const uint8_t *ref,
                         const char *what)
{
    local_set_t inpl;
    local_make(&inpl, dt, op, count);
    a->buf = inpl.bufs[0];
    a->local = &inpl.l;
    int rc = ring_allreduce(W.ring, a);
    if (rc != 0)
        DIE("%s, in place: %s", what, st_strerror(rc));
    local_expect(&inpl, ref, kern_dtype_size(dt), what);
    local_free(&inpl);
}

/* The allreduces of one case that ran with local sources: the region
 * apart, and in the first source when the sources are whole. */
#define LOCAL_CALLS (W.fused ? 1u : 2u)

static void one_local(kern_dtype_t dt, kern_op_t op, size_t count)
{
    size_t es = kern_dtype_size(dt);
    uint32_t div = W.n * W.locals; /* a daemon's: the job's trainers */
    char what[96];
    snprintf(what, sizeof what, "local %s/%s count %zu",
             kern_dtype_name(dt), kern_op_name(op), count);
    local_set_t staged, piped;
    local_make(&staged, dt, op, count);
    local_make(&piped, dt, op, count);
    uint8_t *ref = malloc(count * es + 1), *region = malloc(count * es + 1);
    ring_local_gather(&staged.l, dt, op, ref, 0, count);
    ring_allreduce_t a = {.buf = ref, .count = count, .dt = dt, .op = op,
                          .divisor = op == KERN_AVG ? div : 0,
                          .wire = W.opts.wire};
    int rc = ring_allreduce(W.ring, &a);
    if (rc != 0)
        DIE("%s, staged: %s", what, st_strerror(rc));
    ring_local_scatter(&staged.l, es, ref, 0, count);
    a.buf = region;
    a.local = &piped.l;
    ring_stats_t st0, st1;
    ring_stats(W.ring, &st0);
    rc = ring_allreduce(W.ring, &a);
    if (rc != 0)
        DIE("%s: %s", what, st_strerror(rc));
    ring_stats(W.ring, &st1);
    /* One source in pieces runs in them; the region is left alone. */
    int in_place = st1.local_in_place != st0.local_in_place;
    if (count > 0 && !in_place && memcmp(region, ref, count * es) != 0)
        DIE("%s: the region differs from the staged path", what);
    local_expect(&piped, ref, es, what);
    local_expect(&staged, ref, es, what);
    if (!W.fused)
        one_in_place(dt, op, count, &a, ref, what);
    local_check_sum(dt, op, ref, count);
    fprintf(W.out, "local %s %s %zu %016" PRIx64 "\n", kern_dtype_name(dt),
            kern_op_name(op), count, fnv(ref, count * es));
    local_free(&staged);
    local_free(&piped);
    free(ref);
    free(region);
}

void mode_local(void)
{
    if (W.locals < 1 || W.locals > LOCAL_MAX)
        DIE("--locals wants 1..%d", LOCAL_MAX);
    uint64_t calls = 0;
    ring_stats_t before;
    ring_stats(W.ring, &before);
    for (int c = 0; c < W.ncounts; c++)
        for (int dt = 0; dt < KERN_DTYPE_COUNT; dt++)
            for (int op = 0; op < KERN_OP_COUNT; op++) {
                if (W.f32_only && (dt != KERN_F32 ||
                                   (op != KERN_SUM && op != KERN_AVG)))
                    continue;
                one_local((kern_dtype_t)dt, (kern_op_t)op, W.counts[c]);
                calls += W.counts[c] > 0 ? LOCAL_CALLS : 0;
            }
    ring_stats_t st;
    ring_stats(W.ring, &st);
    /* The grid keeps the staged order; the flat ring pipelines, or with
     * one source in pieces (n > 1) runs in them. */
    uint64_t want = W.expect_grid ? 0 : calls;
    uint64_t want_in = W.locals == 1 && W.fused && W.n > 1 ? want : 0;
    if (st.local_pipelined - before.local_pipelined != want - want_in)
        DIE("stats: %" PRIu64 " pipelined local allreduces, want %" PRIu64,
            st.local_pipelined - before.local_pipelined, want - want_in);
    if (st.local_in_place - before.local_in_place != want_in)
        DIE("stats: %" PRIu64 " local allreduces in the pieces, want %" PRIu64,
            st.local_in_place - before.local_in_place, want_in);
    /* Each case: the staged reference too. */
    uint64_t all = calls + calls / LOCAL_CALLS;
    if (W.expect_grid && st.grid - before.grid != all)
        DIE("stats: %" PRIu64 " of %" PRIu64 " allreduces on the grid",
            st.grid - before.grid, all);
    if (st.forged != 0 || st.stale_dropped != 0)
        DIE("stats: %" PRIu64 " forged, %" PRIu64 " stale", st.forged,
            st.stale_dropped);
}
