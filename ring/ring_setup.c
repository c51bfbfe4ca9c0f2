/*
 * ring_setup.c - options, creating a ring for a view (its staging arena,
 * endpoints and channels), tearing it down, and the calls that only read
 * or flag a ring (abort, deadline, suspect, stats).
 */
#include "ring/ring-int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

static long env_long(const char *name, long def)
{
    const char *v = getenv(name);
    if (v == NULL || v[0] == '\0')
        return def;
    char *end;
    long x = strtol(v, &end, 0);
    return *end == '\0' ? x : def;
}

void ring_opts_default(ring_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->chunk_bytes = (size_t)env_long("RINGD_RING_CHUNK", RING_CHUNK_DEFAULT);
    o->recv_depth = 2;
    o->send_depth = 4;
    o->deadline_ms = (int)env_long("RINGD_RING_DEADLINE_MS", 2000);
    o->spin_us = (int)env_long("RINGD_RING_SPIN_US", 50);
    o->spin_adaptive = (int)env_long("RINGD_RING_SPIN_ADAPT", 1);
    o->bidirectional = (int)env_long("RINGD_RING_BIDIR", RING_BIDIR_AUTO);
    o->recv_inplace = (int)env_long("RINGD_RING_RECV_INPLACE", 1);
    o->live_ms = (int)env_long("RINGD_RING_LIVE_MS", 0);
    o->grid_min_nodes = (uint32_t)env_long("RINGD_RING_GRID_MIN_NODES", 0);
    o->grid_max_bytes = (size_t)env_long("RINGD_RING_GRID_MAX_BYTES", 0);
    o->grid_cols = (uint32_t)env_long("RINGD_RING_GRID_COLS", 0);
    o->split_lone = (int)env_long("RINGD_RING_SPLIT", 1);
    /* Anything but a concrete name sends f32, as an unset variable. */
    if (rd_wire_parse(getenv("RINGD_RING_WIRE"), &o->wire) != 0)
        o->wire = RD_WIRE_NONE;
}

void ring_abort(ring_t *r)
{
    atomic_store_explicit(&r->abort_req, 1, memory_order_release);
    tp_signal(r->tp);
}

int ring_set_deadline(ring_t *r, int deadline_ms)
{
    if (deadline_ms < 1) {
        RD_ERROR("ring_set_deadline: %d ms", deadline_ms);
        return ST_EINVAL;
    }
    r->opts.deadline_ms = deadline_ms;
    return 0;
}

int ring_suspect(const ring_t *r, uint32_t *rank_p)
{
    if (r->state != RING_FAILED)
        return 0;
    if (rank_p != NULL)
        *rank_p = r->suspect;
    return r->fail_rc;
}

int ring_other_failed(const ring_t *r, uint32_t named, uint32_t *rank_p)
{
    const ring_link_t *l[2] = {&r->left, &r->right};
    for (int i = 0; i < 2; i++)
        if (l[i]->fail_rc == ST_EPEER && l[i]->rank != named &&
            l[i]->rank != r->rank) {
            *rank_p = l[i]->rank;
            return 1;
        }
    return 0;
}

void ring_stats(const ring_t *r, ring_stats_t *stats_p)
{
    *stats_p = r->stats;
}

/* ---- create / destroy --------------------------------------------------- */

static int opts_check(const ring_opts_t *o)
{
    if (o->chunk_bytes < 64 || o->recv_depth < 1 || o->send_depth < 1 ||
        o->deadline_ms < 1 || o->spin_us < 0 || o->live_ms < 0 ||
        o->bidirectional < RING_BIDIR_OFF ||
        o->bidirectional > RING_BIDIR_AUTO ||
        o->wire == RD_WIRE_DEFAULT || (unsigned)o->wire >= RD_WIRE_COUNT) {
        RD_ERROR("ring: invalid options (chunk %zu, depth %u/%u, wire %s, "
                 "bidirectional %d)", o->chunk_bytes, o->recv_depth,
                 o->send_depth, rd_wire_name(o->wire), o->bidirectional);
        return ST_EINVAL;
    }
    return 0;
}

static int view_check(const ring_view_t *v)
{
    if (v->nranks == 0 || v->rank >= v->nranks) {
        RD_ERROR("ring: rank %u of %u", v->rank, v->nranks);
        return ST_EINVAL;
    }
    if (v->nranks > 1 && (v->addrs == NULL || v->addr_lens == NULL)) {
        RD_ERROR("ring: view without addresses");
        return ST_EINVAL;
    }
    return 0;
}

/*
 * One arena for the staging slots, registered once: receive slots for each
 * channel in use, send slots only when sends are converted (wire
 * compression); otherwise sends go straight from the user's buffer.
 */
static int arena_setup(ring_t *r)
{
    unsigned nchan = ring__grid_on(&r->opts, r->n) ? RING_NCHAN
                   : r->opts.bidirectional ? 2 : 1;
    unsigned nsend = rd_wire_compresses(r->opts.wire) ? r->opts.send_depth : 0;
    unsigned per = r->opts.recv_depth + nsend;
    r->arena_len = (size_t)per * nchan * r->opts.chunk_bytes;
    r->arena = aligned_alloc(4096, (r->arena_len + 4095) & ~(size_t)4095);
    if (r->arena == NULL)
        return ST_ENOMEM;
    int rc = tp_mem_map(r->tp, r->arena, r->arena_len, &r->arena_mem);
    if (rc != 0)
        return rc;
    uint8_t *p = r->arena;
    for (unsigned i = 0; i < RING_NCHAN; i++) {
        ring_chan_t *c = &r->chan[i];
        c->rs = calloc(r->opts.recv_depth, sizeof(*c->rs));
        c->ss = calloc(r->opts.send_depth, sizeof(*c->ss));
        if (c->rs == NULL || c->ss == NULL)
            return ST_ENOMEM;
        if (i >= nchan)
            continue;
        for (unsigned j = 0; j < r->opts.recv_depth; j++) {
            c->rs[j].buf = p;
            p += r->opts.chunk_bytes;
        }
        for (unsigned j = 0; j < nsend; j++) {
            c->ss[j].buf = p;
            p += r->opts.chunk_bytes;
        }
    }
    if (nsend > 0)
        r->send_mem = r->arena_mem;
    return 0;
}

/*
 * A ring made without wire compression gets the send slots of a
 * compressed allreduce (a trainer's per-call choice) at the first one,
 * so that rings that never compress spend no memory on them. A
 * compressed allreduce runs on the flat ring's channels only (never on
 * the grid): one or two.
 */
int ring__wire_slots(ring_t *r)
{
    if (r->send_mem != NULL)
        return 0;
    unsigned nchan = r->opts.bidirectional ? 2 : 1;
    size_t len = (size_t)nchan * r->opts.send_depth * r->opts.chunk_bytes;
    uint8_t *p = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
    if (p == NULL) {
        RD_ERROR("ring: no memory for %zu bytes of send slots", len);
        return ST_ENOMEM;
    }
    int rc = tp_mem_map(r->tp, p, len, &r->wire_mem);
    if (rc != 0) {
        free(p);
        return rc;
    }
    r->wire_arena = p;
    for (unsigned i = 0; i < nchan; i++)
        for (unsigned j = 0; j < r->opts.send_depth; j++) {
            r->chan[i].ss[j].buf = p;
            p += r->opts.chunk_bytes;
        }
    r->send_mem = r->wire_mem;
    return 0;
}

static int link_connect(ring_t *r, ring_link_t *l, const ring_view_t *v,
                        uint32_t rank)
{
    l->ring = r;
    l->rank = rank;
    return tp_peer_connect(r->tp, v->addrs[rank], v->addr_lens[rank],
                           ring__on_peer_fail, l, &l->peer);
}

static int links_setup(ring_t *r, const ring_view_t *v,
                       uint32_t *unreachable_p)
{
    uint32_t left = ring__mod_n((int64_t)v->rank - 1, v->nranks);
    uint32_t right = ring__mod_n((int64_t)v->rank + 1, v->nranks);
    int rc = link_connect(r, &r->right, v, right);
    if (rc != 0) {
        *unreachable_p = right;
        return rc;
    }
    if (left == right) {
        r->left = r->right; /* two ranks: one endpoint both ways */
        return 0;
    }
    if ((rc = link_connect(r, &r->left, v, left)) != 0)
        *unreachable_p = left;
    return rc;
}


/* The staging slots and arena (arena_setup), also partly set up. */
static void arena_free(ring_t *r)
{
    for (unsigned i = 0; i < RING_NCHAN; i++) {
        free(r->chan[i].rs);
        free(r->chan[i].ss);
    }
    tp_mem_unmap(r->arena_mem);
    free(r->arena);
    tp_mem_unmap(r->wire_mem);
    free(r->wire_arena);
}

/* Both neighbours' endpoints (one when n == 2), also one of them, and
 * the grid's. */
static void links_close(ring_t *r, int force)
{
    tp_peer_close(r->left.peer, force);
    if (r->right.peer != r->left.peer)
        tp_peer_close(r->right.peer, force);
    ring__grid_close(r, force);
}

/*
 * RINGD_TEST_CUT_RIGHT=GEN:SEQ, for tests only: in the ring of generation
 * GEN, from the allgather half of its first allreduce numbered SEQ or
 * later (the ring's own collectives count too), this rank sends nothing
 * more to its right neighbour (data, heartbeats, later collectives). It
 * completes that collective (its receives come from the left) while its
 * right neighbour cannot: the asymmetric end a one-way link failure
 * leaves, at a point no timing-based fault can pick.
 */
static void cut_setup(ring_t *r)
{
    const char *e = getenv("RINGD_TEST_HB_STALL");
    unsigned long long gen;
    unsigned seq;
    /* RINGD_TEST_HB_STALL=GEN, for tests only: in the ring of generation
     * GEN this rank's sends stall as a TCP stream on a lossy link does:
     * heartbeats every fourth tick (400 ms apart, on time by its own
     * clock), data only in the tick after each of them (held 300 ms of
     * every 400), seen from its neighbours only (ring__test_held). */
    if (e != NULL && sscanf(e, "%llu", &gen) == 1 && gen == r->generation) {
        r->hb_stall = 1;
        RD_WARN("ring gen %" PRIu64 ": RINGD_TEST_HB_STALL: heartbeats "
                "every fourth tick, data held between them",
                r->generation);
    }
    e = getenv("RINGD_TEST_CUT_RIGHT");
    if (e == NULL || sscanf(e, "%llu:%u", &gen, &seq) != 2 ||
        gen != r->generation || r->n < 3)
        return;
    r->cut_armed = 1;
    r->cut_seq = seq & TP_TAG_SEQ_MASK;
}

int ring__cut(ring_t *r, const ring_link_t *to, int allgather_half)
{
    if (to != &r->right || r->n < 3)
        return 0;
    if (!r->cut_right && r->cut_armed && allgather_half &&
        r->seq >= r->cut_seq) {
        r->cut_right = 1;
        RD_WARN("ring gen %" PRIu64 " seq %u: RINGD_TEST_CUT_RIGHT: "
                "nothing more goes to rank %u", r->generation, r->seq,
                to->rank);
    }
    return r->cut_right;
}

int ring_create(tp_t *tp, const ring_view_t *view, const ring_opts_t *opts,
                ring_t **ring_p, uint32_t *unreachable_p)
{
    ring_opts_t def;
    uint32_t unreachable_none;
    if (unreachable_p == NULL)
        unreachable_p = &unreachable_none;
    *unreachable_p = UINT32_MAX;
    if (opts == NULL) {
        ring_opts_default(&def);
        opts = &def;
    }
    int rc = view_check(view);
    if (rc != 0 || (rc = opts_check(opts)) != 0)
        return rc;
    ring_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return ST_ENOMEM;
    r->tp = tp;
    r->opts = *opts;
    r->generation = view->generation;
    r->tag_keyed = view->tag_keyed;
    r->gen = (uint32_t)((view->tag_keyed ? view->tag_gen : view->generation)
                        & TP_TAG_GEN_MASK);
    r->n = view->nranks;
    r->rank = view->rank;
    r->left.rank = r->right.rank = view->rank;
    atomic_init(&r->abort_req, 0);
    r->spin_credit = RING_SPIN_TRUST; /* spin until spells say otherwise */
    if ((rc = arena_setup(r)) != 0)
        goto err_arena;
    if (r->n > 1 && (rc = links_setup(r, view, unreachable_p)) != 0)
        goto err_links;
    if (r->n > 1 && (rc = ring__grid_create(r, view)) != 0)
        goto err_links;
    ring__chans_flat(r);
    cut_setup(r);
    r->stats.left_rank = r->left.rank;
    *ring_p = r;
    return 0;

err_links:
    links_close(r, 0); /* as ring_destroy closes a ring never used */
    ring__grid_free(r);
err_arena:
    arena_free(r);
    free(r);
    return rc;
}

void ring_destroy(ring_t *r)
{
    if (r == NULL)
        return;
    /*
     * A healthy ring flushes its endpoints (at most 1 s each, longer if a
     * neighbour hangs); a failed or aborted one forces them, so an owner
     * that knows a neighbour is gone calls ring_abort() first.
     */
    int force = r->state == RING_FAILED ||
                atomic_load_explicit(&r->abort_req, memory_order_acquire);
    const ring_stats_t *st = &r->stats;
    if (st->collectives > 0)
        RD_INFO("ring gen %" PRIu64 ": %" PRIu64 " collectives; idle "
                "spells: %" PRIu64 " ended spinning, %" PRIu64 " slept (%"
                PRIu64 " after %d us of spin, %" PRIu64 " us spun in vain)",
                r->generation, st->collectives, st->spin_hits, st->sleeps,
                st->spin_misses, r->opts.spin_us, st->spin_waste_us);
    links_close(r, force);
    ring__hb_close(r);
    /*
     * Requests UCX never completed still point at the slots (their
     * callbacks write there) and at the staging arena: leak both.
     */
    if (!r->leaked)
        arena_free(r);
    ring__grid_free(r);
    free(r->barrier_bytes);
    free(r);
}
