/*
 * ring_local.c - the node's local sources of an allreduce
 * (ring_allreduce_t.local): reduced into the ring's region chunk by chunk,
 * in the order the ring first uses the chunks, and each chunk written
 * back to every source as it becomes final (ring/README.md, "Local
 * sources").
 */
#include "ring/ring-int.h"

#include <string.h>

/* Elements [off, off + n) of piece s of every source, reduced into dst
 * in source order: the one order of every range and of the whole. */
static void gather_piece(const ring_local_t *l, kern_dtype_t dt,
                         kern_op_t op, uint8_t *dst, uint32_t s, size_t off,
                         size_t n)
{
    size_t es = kern_dtype_size(dt);
    uint32_t g = l->nsegs > 1 ? l->nsegs : 1;
    const uint8_t *b0 = (const uint8_t *)l->bufs[s] + off * es;
    if (l->nbufs == 2)
        kern_reduce3(dt, op, dst, b0,
                     (const uint8_t *)l->bufs[g + s] + off * es, n);
    else if (dst != b0) /* the region may be the first source itself */
        memcpy(dst, b0, n * es);
    for (uint32_t t = l->nbufs == 2 ? 2 : 1; t < l->nbufs; t++)
        kern_reduce(dt, op, dst,
                    (const uint8_t *)l->bufs[t * g + s] + off * es, n);
}

/*
 * Collectives of at least this many bytes are written back with
 * non-temporal stores: the sources are the trainers' buffers, which the
 * daemon does not read again, and at this size they do not stay in the
 * last-level cache for the trainer either, so plain stores would only
 * read each line first and evict the ring's working set (two trainers a
 * node: bench/e2e's n = 4 rows, 0.82 -> 0.94 of the ring at 64 MiB, the
 * daemons' CPU per GB 7-10% lower). Smaller results stay in the cache,
 * where the trainer's copy-out finds them.
 */
#define RING_LOCAL_STREAM_MIN (8u << 20)

static void scatter_piece(const ring_local_t *l, size_t es,
                          const uint8_t *src, uint32_t s, size_t off,
                          size_t n, int stream)
{
    uint32_t g = l->nsegs > 1 ? l->nsegs : 1;
    for (uint32_t t = 0; t < l->nbufs; t++) {
        uint8_t *dst = (uint8_t *)l->bufs[t * g + s] + off * es;
        if (dst == src)
            continue;
        if (stream)
            kern_copy_stream(dst, src, n * es);
        else
            memcpy(dst, src, n * es);
    }
}

/* The pieces [first, first + count) of the region crosses, in order:
 * one when the sources are whole, else those of the fused layout. */
typedef void (*piece_fn)(const ring_local_t *l, void *arg, uint32_t s,
                         size_t off, size_t n, size_t done);

static void for_pieces(const ring_local_t *l, size_t first, size_t count,
                       piece_fn fn, void *arg)
{
    if (l->nsegs <= 1) {
        fn(l, arg, 0, first, count, 0);
        return;
    }
    size_t base = 0, done = 0;
    for (uint32_t s = 0; s < l->nsegs && done < count; s++) {
        size_t len = l->seg_counts[s];
        if (first + done < base + len) {
            size_t off = first + done - base;
            size_t n = len - off < count - done ? len - off : count - done;
            fn(l, arg, s, off, n, done);
            done += n;
        }
        base += len;
    }
}

typedef struct {
    kern_dtype_t dt;
    kern_op_t op;
    size_t es;
    int stream;
    uint8_t *dst;
    const uint8_t *src;
} piece_arg_t;

static void gather_fn(const ring_local_t *l, void *arg, uint32_t s,
                      size_t off, size_t n, size_t done)
{
    piece_arg_t *a = arg;
    gather_piece(l, a->dt, a->op, a->dst + done * a->es, s, off, n);
}

static void scatter_fn(const ring_local_t *l, void *arg, uint32_t s,
                       size_t off, size_t n, size_t done)
{
    piece_arg_t *a = arg;
    scatter_piece(l, a->es, a->src + done * a->es, s, off, n, a->stream);
}

void ring_local_gather(const ring_local_t *l, kern_dtype_t dt, kern_op_t op,
                       void *dst, size_t first, size_t count)
{
    piece_arg_t a = {.dt = dt, .op = op, .es = kern_dtype_size(dt),
                     .dst = dst};
    if (count > 0)
        for_pieces(l, first, count, gather_fn, &a);
}

/* A range of a collective of total elements. */
static void scatter_range(const ring_local_t *l, size_t es, const void *src,
                          size_t first, size_t count, size_t total)
{
    piece_arg_t a = {.es = es, .src = src,
                     .stream = total * es >= RING_LOCAL_STREAM_MIN};
    if (count > 0)
        for_pieces(l, first, count, scatter_fn, &a);
}

void ring_local_scatter(const ring_local_t *l, size_t es, const void *src,
                        size_t first, size_t count)
{
    scatter_range(l, es, src, first, count, count);
}

/* ---- in the channel engine --------------------------------------------- */

/*
 * Item i of a channel's order of first use: first the own segment's
 * chunks (the sends of reduce-scatter step 0), then the chunks receive
 * m = i - k accumulates into. Both are segment pos - i/k, chunk i mod k.
 */
static void fill_item(ring_chan_t *c, uint32_t i)
{
    ring_t *r = c->ring;
    size_t off = 0, cnt = 0;
    uint32_t seg = ring__mod_n((int64_t)c->pos - i / c->k, c->n);
    ring__chunk_range(c, seg, i % c->k, &off, &cnt);
    ring_local_gather(r->coll.local, r->coll.dt, r->coll.op,
                      c->base + off * r->coll.es, c->first + off, cnt);
}

void ring__local_fill(ring_chan_t *c, uint32_t upto)
{
    uint32_t all = c->nseg * c->k;
    if (upto > all)
        upto = all;
    while (c->filled < upto)
        fill_item(c, c->filled++);
}

/*
 * From the last reduce-scatter step on, every receive applied leaves its
 * chunk final: the owner's (divided, rounded to the wire) or the owner's
 * bytes in the allgather. That is n * k receives, one per chunk.
 */
int ring__local_publish(ring_chan_t *c)
{
    ring_t *r = c->ring;
    uint32_t first_final = (c->n - 2) * c->k;
    int work = 0;
    while (c->published < c->nseg * c->k &&
           first_final + c->published < c->next_proc) {
        uint32_t m = first_final + c->published, seg = 0;
        ring_act_t act;
        size_t off = 0, cnt = 0;
        ring__msg_recv(c, m, &seg, &act);
        ring__chunk_range(c, seg, m % c->k, &off, &cnt);
        scatter_range(r->coll.local, r->coll.es, c->base + off * r->coll.es,
                      c->first + off, cnt, r->coll.count);
        c->published++;
        work++;
    }
    return work;
}

/*
 * Once a turn: fill the next chunk, up to those the posted receives will
 * accumulate into, so the sum is ready when they land instead of
 * delaying the send that depends on them.
 */
int ring__local_ahead(ring_t *r)
{
    for (unsigned i = 0; i < r->nchan; i++) {
        ring_chan_t *c = &r->chan[i];
        uint32_t until = c->k + c->next_proc + r->opts.recv_depth;
        if (c->filled < c->nseg * c->k && c->filled < until) {
            fill_item(c, c->filled++);
            return 1;
        }
    }
    return 0;
}

/* One rank: each chunk gathered, divided and written back while it is
 * still in cache. */
void ring__local_one(ring_t *r, const ring_local_t *l, void *region,
                     size_t count)
{
    size_t es = r->coll.es, step = r->opts.chunk_bytes / es;
    for (size_t first = 0; first < count; first += step) {
        size_t n = count - first < step ? count - first : step;
        uint8_t *dst = (uint8_t *)region + first * es;
        ring_local_gather(l, r->coll.dt, r->coll.op, dst, first, n);
        if (r->coll.op == KERN_AVG && r->coll.avg_div != 1)
            kern_avg_finish(r->coll.dt, dst, n, r->coll.avg_div);
        scatter_range(l, es, dst, first, n, count);
    }
}

int ring__local_staged(ring_t *r, const ring_local_t *l, void *region,
                       size_t count)
{
    ring_local_gather(l, r->coll.dt, r->coll.op, region, 0, count);
    int rc = ring__grid_allreduce(r, region, count);
    if (rc == 0)
        ring_local_scatter(l, r->coll.es, region, 0, count);
    return rc;
}

/* ---- one source in pieces, reduced where it lies --------------------- */

/*
 * A fused group of one trainer whose pieces are not end to end: instead of
 * gathering them into the region and scattering the result back (two
 * passes over memory), the flat ring addresses the region's elements in
 * the pieces themselves. Only pieces that do not overlap: an overlap would
 * make a piece's bytes change under a send of another.
 */
int ring__pieces_in_place(const ring_t *r, const ring_local_t *l)
{
    if (l->nbufs != 1 || l->nsegs <= 1)
        return 0;
    size_t es = r->coll.es;
    for (uint32_t a = 0; a < l->nsegs; a++)
        for (uint32_t b = a + 1; b < l->nsegs; b++) {
            const uint8_t *pa = l->bufs[a], *pb = l->bufs[b];
            size_t la = l->seg_counts[a] * es, lb = l->seg_counts[b] * es;
            if (la > 0 && lb > 0 && pa < pb + lb && pb < pa + la)
                return 0;
        }
    return 1;
}

typedef struct {
    uint8_t *p;
    size_t es;
} at_arg_t;

static void at_fn(const ring_local_t *l, void *arg, uint32_t s, size_t off,
                  size_t n, size_t done)
{
    at_arg_t *a = arg;
    (void)n;
    if (done == 0)
        a->p = (uint8_t *)l->bufs[s] + off * a->es;
    else
        a->p = NULL; /* a second piece: not one run */
}

/* Channel elements [off, off + n): their address when they are one run of
 * memory (the flat region, or inside one piece), else NULL. */
uint8_t *ring__region_at(const ring_chan_t *c, size_t off, size_t n)
{
    const ring_t *r = c->ring;
    if (r->coll.pieces == NULL)
        return c->base + off * r->coll.es;
    if (n == 0)
        return (uint8_t *)r->coll.pieces->bufs[0];
    at_arg_t a = {.p = NULL, .es = r->coll.es};
    for_pieces(r->coll.pieces, c->first + off, n, at_fn, &a);
    return a.p;
}

typedef struct {
    ring_t *r;
    ring_range_fn fn;
    void *arg;
} each_arg_t;

static void each_fn(const ring_local_t *l, void *arg, uint32_t s, size_t off,
                    size_t n, size_t done)
{
    each_arg_t *a = arg;
    a->fn(a->r, a->arg, (uint8_t *)l->bufs[s] + off * a->r->coll.es, n,
          done);
}

/* fn over the runs of memory that hold channel elements [off, off + n),
 * in order, with the elements before each (done). */
void ring__region_each(ring_chan_t *c, size_t off, size_t n,
                       ring_range_fn fn, void *arg)
{
    ring_t *r = c->ring;
    if (r->coll.pieces == NULL) {
        fn(r, arg, c->base + off * r->coll.es, n, 0);
        return;
    }
    each_arg_t a = {.r = r, .fn = fn, .arg = arg};
    if (n > 0)
        for_pieces(r->coll.pieces, c->first + off, n, each_fn, &a);
}
