/*
 * ring_grid.c - the two-level (grid) allreduce: reduce-scatter along the
 * rows, allreduce along the columns, allgather along the rows, each phase
 * a run of the channel engine of ring.c (see ring/README.md, "Grid").
 *
 * Rows are runs of consecutive ranks (the view orders the nodes of one
 * host together), balanced: their widths differ by at most one. Row i of
 * width w reduce-scatters the whole buffer in w segments, the engine's
 * balanced ones, and leaves its position p owning segment (p + 1) mod w.
 * The boundaries of both widths' segments, merged, cut the buffer into
 * intervals; each interval is allreduced on its own column ring, made of
 * the owners of its elements in every row, in row order. A segment of one
 * width holds at most one boundary of the other width's inside (segment p
 * of w - 1 spans (p + p/(w-1), p + 1 + (p+1)/(w-1)) in units of the w
 * segments, and p <= w - 2), so a rank is on at most two column rings at
 * once (RING_NCHAN engine channels), run together.
 */
#include "ring/ring-int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"

#define GRID_MIN_RANKS 4      /* below this one row would do */
#define GRID_ADDR_MAX 65536   /* a worker address: 215 bytes over tcp */

int ring__grid_on(const ring_opts_t *o, uint32_t n)
{
    return o->grid_min_nodes > 0 && n >= o->grid_min_nodes &&
           n >= GRID_MIN_RANKS && !rd_wire_compresses(o->wire);
}

/* A row per host when every host has the same number (>= 2) of nodes. */
static uint32_t rows_by_host(const ring_view_t *v)
{
    uint32_t run = 1, h = 0;
    for (uint32_t i = 1; i <= v->nranks; i++) {
        if (i < v->nranks && v->hosts[i] == v->hosts[i - 1]) {
            run++;
            continue;
        }
        if (h != 0 && run != h)
            return 0;
        h = run;
        run = 1;
    }
    return h >= 2 && v->nranks / h >= 2 ? v->nranks / h : 0;
}

/* Rows: grid_cols wide, else one per host, else about sqrt(n). */
static uint32_t grid_rows(const ring_opts_t *o, const ring_view_t *v)
{
    uint32_t n = v->nranks;
    if (o->grid_cols > 0)
        return (n + o->grid_cols - 1) / o->grid_cols;
    uint32_t rows = v->hosts != NULL ? rows_by_host(v) : 0;
    if (rows != 0)
        return rows;
    for (rows = 1; (rows + 1) * (rows + 1) <= n; rows++)
        ;
    return rows;
}

void ring__grid_free(ring_t *r)
{
    ring_grid_t *g = r->grid;
    if (g == NULL)
        return;
    free(g->links);
    free(g->bounds);
    free(g->row_first);
    free(g);
    r->grid = NULL;
}

static uint32_t row_width(const ring_grid_t *g, uint32_t row)
{
    return g->row_first[row + 1] - g->row_first[row];
}

/*
 * Endpoints to every rank a grid allreduce may talk to, whatever its size:
 * my row neighbours and the whole rows above and below (which of them
 * own my intervals depends on the size), from the exchanged addresses
 * (blocks of a 4-byte little-endian length and the address). The set is
 * symmetric (B is in A's iff A is in B's), and the flat ring's own
 * neighbours keep their one endpoint.
 */
static int grid_connect(ring_t *r, const uint8_t *all, size_t block)
{
    ring_grid_t *g = r->grid;
    uint32_t w = row_width(g, g->row), first = g->row_first[g->row];
    uint32_t near[2] = {first + (g->col + 1) % w,
                        first + (g->col + w - 1) % w};
    for (uint32_t i = 0, row = 0; i < r->n; i++) {
        if (i >= g->row_first[row + 1])
            row++;
        int adjacent = row == (g->row + 1) % g->rows ||
                       (row + 1) % g->rows == g->row;
        if (i == r->rank || i == r->left.rank || i == r->right.rank ||
            !(adjacent || i == near[0] || i == near[1]))
            continue;
        const uint8_t *b = all + (size_t)i * block;
        uint32_t len = (uint32_t)b[0] | (uint32_t)b[1] << 8 |
                       (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        if (len == 0 || len > block - 4) {
            RD_ERROR("ring: grid address of rank %u: %u bytes", i, len);
            ring__fail(r, ST_EPROTO, i);
            return ST_EPROTO;
        }
        int rc = tp_peer_connect(r->tp, b + 4, len, ring__on_peer_fail,
                                 &g->links[i], &g->links[i].peer);
        if (rc != 0) {
            ring__fail(r, rc, i);
            return rc;
        }
    }
    return 0;
}

/* Between phases: an abort, or a failure that ended the last phase. */
static int grid_between(ring_t *r)
{
    if (atomic_load_explicit(&r->abort_req, memory_order_acquire))
        ring__fail(r, ST_EABORTED, r->rank);
    return r->state == RING_FAILED ? r->fail_rc : 0;
}

/*
 * Before the first grid allreduce of a ring: every rank's address, over
 * the flat ring (a view carries the flat neighbours' only), then the
 * grid's endpoints. Not on first use of each: UCX pairs the k-th endpoint
 * from A to B with the k-th from B to A, so both sides must make theirs
 * in the same ring, and every rank makes all of them here, in the same
 * collective.
 */
static int grid_exchange(ring_t *r)
{
    const void *mine;
    size_t len;
    tp_address(r->tp, &mine, &len);
    int64_t max = (int64_t)len;
    int rc = ring__flat_own(r, COLL_ALLREDUCE, &max, 1, KERN_I64, KERN_MAX);
    if (rc != 0 || (rc = grid_between(r)) != 0)
        return rc;
    if (max < (int64_t)len || max > GRID_ADDR_MAX) {
        RD_ERROR("ring: grid addresses of %lld bytes", (long long)max);
        ring__fail(r, ST_EPROTO, r->rank);
        return ST_EPROTO;
    }
    size_t block = 4 + (size_t)max;
    uint8_t *all = calloc(r->n, block);
    if (all == NULL) {
        ring__fail(r, ST_ENOMEM, r->rank);
        return ST_ENOMEM;
    }
    uint8_t *b = all + (size_t)r->rank * block;
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(len >> (8 * i));
    memcpy(b + 4, mine, len);
    rc = ring__flat_own(r, COLL_ALLGATHER, all, block, KERN_U8, KERN_SUM);
    if (rc == 0 && (rc = grid_between(r)) == 0 &&
        (rc = grid_connect(r, all, block)) == 0)
        r->grid->connected = 1;
    free(all);
    return rc;
}

static int grid_layout(ring_t *r, uint32_t rows)
{
    ring_grid_t *g = r->grid;
    uint32_t base = r->n / rows, extra = r->n % rows;
    g->rows = rows;
    g->row_first = calloc(rows + 1, sizeof(*g->row_first));
    g->links = calloc(r->n, sizeof(*g->links));
    /* Both widths' segment boundaries, merged: base + 1 + base + 2. */
    g->bounds = calloc(2 * (size_t)base + 3, sizeof(*g->bounds));
    if (g->row_first == NULL || g->links == NULL || g->bounds == NULL)
        return ST_ENOMEM;
    for (uint32_t i = 0; i <= rows; i++)
        g->row_first[i] = i * base + (i < extra ? i : extra);
    for (uint32_t i = 0; i < rows; i++)
        if (r->rank < g->row_first[i + 1]) {
            g->row = i;
            break;
        }
    g->col = r->rank - g->row_first[g->row];
    g->wmin = base;
    g->wmax = base + (extra != 0);
    for (uint32_t i = 0; i < r->n; i++) {
        g->links[i].ring = r;
        g->links[i].rank = i;
    }
    return 0;
}

int ring__grid_create(ring_t *r, const ring_view_t *v)
{
    if (!ring__grid_on(&r->opts, r->n))
        return 0;
    uint32_t rows = grid_rows(&r->opts, v);
    if (rows < 2 || rows >= r->n)
        return 0; /* one row, or one column: the flat ring is that */
    r->grid = calloc(1, sizeof(*r->grid));
    if (r->grid == NULL)
        return ST_ENOMEM;
    int rc = grid_layout(r, rows);
    if (rc != 0) {
        RD_ERROR("ring: grid of %u rows: %s", rows, st_strerror(rc));
        ring__grid_free(r);
        return rc;
    }
    r->stats.grid_rows = rows;
    RD_INFO("ring gen %" PRIu64 ": grid of %u rows %u-%u wide, rank %u at "
            "row %u col %u", r->generation, rows, r->grid->wmin,
            r->grid->wmax, r->rank, r->grid->row, r->grid->col);
    return 0;
}

void ring__grid_close(ring_t *r, int force)
{
    ring_grid_t *g = r->grid;
    for (uint32_t i = 0; g != NULL && i < r->n; i++) {
        tp_peer_close(g->links[i].peer, force);
        g->links[i].peer = NULL;
    }
}

static ring_link_t *earlier(ring_link_t *a, ring_link_t *b)
{
    if (b->fail_rc == 0)
        return a;
    return a == NULL || b->fail_order < a->fail_order ? b : a;
}

ring_link_t *ring__failed_link(ring_t *r)
{
    if (r->links_failed == 0)
        return NULL;
    ring_link_t *first = earlier(earlier(NULL, &r->left), &r->right);
    for (uint32_t i = 0; r->grid != NULL && i < r->n; i++)
        first = earlier(first, &r->grid->links[i]);
    return first;
}

/* The link to rank: the flat ring's own, or the grid's. */
static int grid_link(ring_t *r, uint32_t rank, ring_link_t **l_p)
{
    ring_grid_t *g = r->grid;
    if (rank == r->left.rank || rank == r->right.rank) {
        *l_p = rank == r->left.rank ? &r->left : &r->right;
        return 0;
    }
    *l_p = &g->links[rank];
    if (g->links[rank].peer == NULL && g->links[rank].fail_rc == 0) {
        RD_ERROR("ring: grid rank %u is not next to row %u", rank, g->row);
        return ST_EINVAL;
    }
    return 0;
}

/* First element of segment x of a row w wide: the engine's chunk_range. */
static size_t seg_lo(size_t count, uint32_t x, uint32_t w)
{
    return count * x / w;
}

/* The rank of row `row` that owns element e after the reduce-scatter. */
static uint32_t owner_of(const ring_grid_t *g, uint32_t row, size_t count,
                         size_t e)
{
    uint32_t w = row_width(g, row);
    /* The last x with count * x / w <= e. */
    uint32_t x = (uint32_t)(((e + 1) * w - 1) / count);
    return g->row_first[row] + (x + w - 1) % w;
}

/* The boundaries of both widths' segments, sorted, without repeats. */
static uint32_t grid_bounds(ring_grid_t *g, size_t count)
{
    uint32_t nb = 0, i = 0, j = 0, w0 = g->wmin, w1 = g->wmax;
    while (i <= w0 || j <= w1) {
        size_t a = i <= w0 ? seg_lo(count, i, w0) : SIZE_MAX;
        size_t b = j <= w1 ? seg_lo(count, j, w1) : SIZE_MAX;
        size_t x = a < b ? a : b;
        i += a == x;
        j += b == x;
        if (nb == 0 || g->bounds[nb - 1] != x)
            g->bounds[nb++] = x;
    }
    return nb;
}

/* Phase 0 (reduce-scatter) or 2 (allgather) on my row: channel 0. */
static int grid_row_setup(ring_t *r, uint8_t *buf, size_t count, int gather,
                          unsigned *nchan_p)
{
    ring_grid_t *g = r->grid;
    uint32_t w = row_width(g, g->row), first = g->row_first[g->row];
    ring_chan_t *c = &r->chan[0];
    *nchan_p = 0;
    if (w == 1)
        return 0;
    int rc = grid_link(r, first + (g->col + 1) % w, &c->to);
    if (rc == 0)
        rc = grid_link(r, first + (g->col + w - 1) % w, &c->from);
    if (rc != 0)
        return rc;
    c->id = 0;
    c->pos = g->col;
    c->n = w;
    c->step0 = gather ? w - 1 : 0;
    c->finish = 0; /* the column rings own the chunks */
    ring__chan_setup(c, buf, 0, count, w);
    c->nsend = c->nrecv = (w - 1) * c->k;
    *nchan_p = 1;
    return 0;
}

/* Phase 1: a full allreduce on the column ring of each of my intervals. */
static int grid_col_setup(ring_t *r, uint8_t *buf, size_t count,
                          unsigned *nchan_p)
{
    ring_grid_t *g = r->grid;
    uint32_t w = row_width(g, g->row), x = (g->col + 1) % w;
    size_t lo = seg_lo(count, x, w), hi = seg_lo(count, x + 1, w);
    uint32_t nb = grid_bounds(g, count), q = 0;
    uint32_t up = ring__mod_n((int64_t)g->row - 1, g->rows);
    uint32_t down = (g->row + 1) % g->rows;
    unsigned nchan = 0;
    *nchan_p = 0;
    while (q + 1 < nb && g->bounds[q] < lo)
        q++;
    for (; q + 1 < nb && g->bounds[q] < hi; q++) {
        if (nchan == RING_NCHAN) {
            RD_ERROR("ring: grid segment over %u column rings", nchan);
            return ST_EINVAL;
        }
        ring_chan_t *c = &r->chan[nchan++];
        size_t b0 = g->bounds[q];
        int rc = grid_link(r, owner_of(g, down, count, b0), &c->to);
        if (rc == 0)
            rc = grid_link(r, owner_of(g, up, count, b0), &c->from);
        if (rc != 0)
            return rc;
        /* A rank's rings are two consecutive intervals at most: the
         * parity of q (the tag channel) tells them apart. */
        c->id = q & 1u;
        c->pos = g->row;
        c->n = g->rows;
        c->step0 = 0;
        c->finish = 1;
        ring__chan_setup(c, buf, b0, g->bounds[q + 1] - b0, g->rows);
        c->nsend = c->nrecv = 2 * (g->rows - 1) * c->k;
    }
    *nchan_p = nchan;
    return 0;
}

int ring__grid_wants(const ring_t *r, size_t count, size_t es)
{
    return r->grid != NULL && (r->opts.grid_max_bytes == 0 ||
                               count * es <= r->opts.grid_max_bytes);
}

int ring__grid_allreduce(ring_t *r, void *buf, size_t count)
{
    int64_t t0 = rd_now_ns(), wait_ns = 0;
    int rc = r->grid->connected ? 0 : grid_exchange(r);
    for (int phase = 0; rc == 0 && phase < 3; phase++) {
        unsigned nchan = 0;
        if (phase > 0 && (rc = grid_between(r)) != 0)
            break;
        rc = phase == 1 ? grid_col_setup(r, buf, count, &nchan)
                        : grid_row_setup(r, buf, count, phase == 2, &nchan);
        if (rc != 0) {
            RD_ERROR("ring: grid phase %d: %s", phase, st_strerror(rc));
            ring__fail(r, rc, r->rank);
            break;
        }
        ring__coll_begin(r, nchan);
        rc = ring__coll_run(r, &wait_ns, phase == 2);
    }
    if (rc != 0)
        return rc;
    ring__coll_stats(r, t0, wait_ns);
    r->stats.collectives++;
    r->stats.grid++;
    return 0;
}
