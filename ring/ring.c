/*
 * ring.c - the channel engine and the collectives (setup and teardown of
 * a ring are in ring_setup.c; how a collective waits for its messages, in
 * ring_wait.c).
 *
 * Every collective is a stream of messages per channel, numbered m = 0..M-1
 * in both the sender's and the receiver's order. A message's place in the
 * buffer (segment and chunk) and its dependency are pure functions of m, so
 * both sides agree without a header: see msg_send() and ring__msg_recv().
 */
#include "ring/ring-int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"

#define RING_DRAIN_BOUND_NS 1000000000LL

/* ---- state ------------------------------------------------------------ */

/*
 * The one transition function. Entering FAILED records the first cause,
 * tells the owner whom to suspect, and is final.
 */
static void ring_set_state(ring_t *r, ring_state_t to, int rc, uint32_t who)
{
    if (r->state == RING_FAILED)
        return;
    r->state = to;
    if (to != RING_FAILED)
        return;
    r->fail_rc = rc;
    r->suspect = who;
    if (rc != ST_EABORTED && r->opts.on_fail != NULL)
        r->opts.on_fail(r->opts.on_fail_arg, who, rc);
}

void ring__fail(ring_t *r, int rc, uint32_t who)
{
    ring_set_state(r, RING_FAILED, rc, who);
}

/* First error of the running collective wins; it is logged once, here. */
void ring__coll_fail(ring_t *r, int rc, uint32_t who)
{
    if (r->coll.err != 0)
        return;
    r->coll.err = rc;
    r->coll.err_rank = who;
    if (rc == ST_EABORTED)
        RD_WARN("ring gen %" PRIu64 " seq %u: aborted", r->generation,
                r->seq);
    else
        RD_ERROR("ring gen %" PRIu64 " seq %u: %s (rank %u)", r->generation,
                 r->seq, st_strerror(rc), who);
}

void ring__on_peer_fail(void *arg, tp_peer_t *peer, int status)
{
    ring_link_t *l = arg;
    (void)peer;
    ring_t *r = l->ring;
    /* A running collective decides in chan_links_check() whether it
     * cares. */
    if (l->fail_rc == 0)
        l->fail_order = ++r->links_failed;
    l->fail_rc = status;
    if (r->state != RING_RUNNING)
        ring_set_state(r, RING_FAILED, status, l->rank);
}

/* ---- geometry --------------------------------------------------------- */

/* Element range of chunk j of segment seg of the channel's region. */
void ring__chunk_range(const ring_chan_t *c, uint32_t seg, uint32_t j,
                       size_t *off_p, size_t *cnt_p)
{
    size_t s0 = c->count * seg / c->nseg;
    size_t s1 = c->count * (seg + 1) / c->nseg;
    size_t len = s1 - s0;
    size_t a = len * j / c->k, b = len * (j + 1) / c->k;
    *off_p = s0 + a;
    *cnt_p = b - a;
}

/* Where send m reads from and which receive it waits for. */
static void msg_send(const ring_chan_t *c, uint32_t m, uint32_t *seg_p,
                     uint32_t *dep_p)
{
    const ring_t *r = c->ring;
    uint32_t n = c->n, s = m / c->k + c->step0;
    *seg_p = 0;
    *dep_p = RING_NO_DEP;
    switch (r->coll.kind) {
    case COLL_ALLREDUCE:
        /* Steps 0..n-2 reduce-scatter, then n-1 steps of allgather. */
        *seg_p = s < n - 1
                     ? ring__mod_n((int64_t)c->pos - s, n)
                     : ring__mod_n((int64_t)c->pos + 1 - (s - (n - 1)), n);
        *dep_p = m >= c->k ? m - c->k : RING_NO_DEP;
        break;
    case COLL_ALLGATHER:
        *seg_p = ring__mod_n((int64_t)c->pos - s, n);
        *dep_p = m >= c->k ? m - c->k : RING_NO_DEP;
        break;
    case COLL_BCAST:
        *seg_p = 0;
        *dep_p = c->pos == r->coll.root ? RING_NO_DEP : m;
        break;
    }
}

/* Where receive m lands and what it does there. */
void ring__msg_recv(const ring_chan_t *c, uint32_t m, uint32_t *seg_p,
                    ring_act_t *act_p)
{
    const ring_t *r = c->ring;
    uint32_t n = c->n, s = m / c->k + c->step0;
    *seg_p = 0;
    *act_p = ACT_COPY;
    switch (r->coll.kind) {
    case COLL_ALLREDUCE:
        if (s < n - 1) {
            *seg_p = ring__mod_n((int64_t)c->pos - s - 1, n);
            *act_p = s == n - 2 && c->finish ? ACT_REDUCE_FINAL
                                             : ACT_REDUCE;
        } else {
            *seg_p = ring__mod_n((int64_t)c->pos - (s - (n - 1)), n);
            *act_p = ACT_COPY;
        }
        break;
    case COLL_ALLGATHER:
        *seg_p = ring__mod_n((int64_t)c->pos - s - 1, n);
        *act_p = ACT_COPY;
        break;
    case COLL_BCAST:
        *seg_p = 0;
        *act_p = ACT_COPY;
        break;
    }
}

/* ---- the channel engine ------------------------------------------------ */

static uint64_t chan_tag(const ring_chan_t *c, uint32_t m)
{
    return tp_tag_make(c->ring->gen, c->id, c->ring->seq, m & RING_IDX_MASK);
}

/* Every bit but the flags: generation, channel, sequence and index. */
#define RING_RECV_MASK (~((uint64_t)RING_FLAGS_MASK << RING_FLAG_SHIFT))

static void slot_cb(tp_req_t *req)
{
    ring_slot_t *sl = req->data;
    sl->state = SLOT_DONE;
}

static void send_cb(tp_req_t *req)
{
    ring_slot_t *sl = req->data;
    sl->state = SLOT_DONE;
}

/*
 * A receive that only copies (the allgather half, a broadcast) lands
 * straight in the user's buffer unless the wire is compressed: no staging
 * copy. Its bytes there are dead until it is applied (the chunk is being
 * replaced), and it cannot arrive before this rank is done with them: the
 * data for a chunk comes back only after this rank's own send of that
 * chunk reached the next rank. So a message rejected after landing (a
 * wrong size: UCX truncates a longer one, ST_EPEER_FORGED) is simply
 * received again over it, as with a slot; a collective that fails leaves
 * the buffer to be redone anyway.
 */
static int recv_inplace(const ring_chan_t *c, uint32_t m, void **dst_p,
                        size_t *cap_p)
{
    const ring_t *r = c->ring;
    uint32_t seg = 0;
    ring_act_t act = ACT_COPY;
    ring__msg_recv(c, m, &seg, &act);
    if (act != ACT_COPY || (r->coll.wire && r->coll.wire_es == 2))
        return 0;
    size_t off = 0, cnt = 0;
    ring__chunk_range(c, seg, m % c->k, &off, &cnt);
    if (cnt == 0)
        return 0;
    uint8_t *dst = ring__region_at(c, off, cnt);
    if (dst == NULL)
        return 0; /* across two pieces: through the slot */
    *dst_p = dst;
    *cap_p = cnt * r->coll.es;
    return 1;
}

static int post_recv(ring_chan_t *c, uint32_t m)
{
    ring_t *r = c->ring;
    ring_slot_t *sl = &c->rs[m % r->opts.recv_depth];
    void *dst = sl->buf;
    size_t cap = r->opts.chunk_bytes;
    tp_mem_t *mem = r->arena_mem;
    sl->inplace = r->opts.recv_inplace && recv_inplace(c, m, &dst, &cap);
    if (sl->inplace)
        mem = NULL; /* the user's memory, as sends from it */
    sl->m = m;
    sl->req.cb = slot_cb;
    sl->req.data = sl;
    sl->state = SLOT_POSTED; /* the callback may run inside tp_recv */
    int rc = tp_recv(r->tp, dst, cap, chan_tag(c, m), RING_RECV_MASK, mem,
                     &sl->req);
    if (rc != 0)
        sl->state = SLOT_FREE;
    return rc;
}

/* Validate and apply the next receive, if it has arrived. */
static int chan_consume(ring_chan_t *c)
{
    ring_t *r = c->ring;
    if (c->next_proc >= c->nrecv)
        return 0;
    ring_slot_t *sl = &c->rs[c->next_proc % r->opts.recv_depth];
    if (sl->state != SLOT_DONE || sl->m != c->next_proc)
        return 0;
    uint32_t seg = 0;
    ring_act_t act = ACT_COPY;
    size_t off = 0, cnt = 0;
    ring__msg_recv(c, c->next_proc, &seg, &act);
    ring__chunk_range(c, seg, c->next_proc % c->k, &off, &cnt);
    size_t want = cnt * r->coll.wire_es;
    RD_DEBUG("chan %u recv m %u seg %u status %d len %zu want %zu", c->id,
             c->next_proc, seg, sl->req.status, sl->req.length, want);
    if (sl->req.status == ST_EPEER_FORGED ||
        (sl->req.status == 0 && sl->req.length != want)) {
        /* A well-tagged message of the wrong size: drop it, wait again.
         * From a job member it means the neighbour posted a collective of
         * another size here: the owner is told (once a collective) and
         * decides, by a new view that aborts this wait. A longer one was
         * truncated (ST_EPEER_FORGED): its flags are unknown. */
        r->stats.forged++;
        RD_WARN("ring gen %" PRIu64 " seq %u: rejected message %u of rank "
                "%u: %s than %zu bytes", r->generation, r->seq,
                c->next_proc, c->from->rank,
                sl->req.status == 0 ? "shorter" : "longer", want);
        if (!r->coll.mismatch_told && r->opts.on_mismatch != NULL) {
            r->coll.mismatch_told = 1;
            unsigned f = sl->req.status == 0
                             ? (unsigned)(sl->req.tag >> RING_FLAG_SHIFT) &
                                   RING_FLAGS_MASK
                             : 0;
            r->opts.on_mismatch(r->opts.on_mismatch_arg, r->generation,
                                c->from->rank, f | r->flags_out);
        }
        sl->state = SLOT_FREE;
        int rc = post_recv(c, c->next_proc);
        if (rc != 0)
            ring__coll_fail(r, rc, c->from->rank);
        return 1;
    }
    if (sl->req.status != 0) {
        ring__coll_fail(r, sl->req.status, c->from->rank);
        sl->state = SLOT_FREE;
        return 1;
    }
    /* The accumulate target holds the local sources' sum before the
     * first received partial sum lands on it. */
    if (r->coll.local != NULL && act != ACT_COPY)
        ring__local_fill(c, c->k + c->next_proc + 1);
    ring__apply(c, sl, off, cnt, act);
    r->stats.recv_inplace += sl->inplace != 0;
    /* Validated: its flags count (a send depending on it carries them). */
    r->flags_seen |= (unsigned)(sl->req.tag >> RING_FLAG_SHIFT) &
                     RING_FLAGS_MASK;
    sl->state = SLOT_FREE;
    c->next_proc++;
    c->last_rx = rd_now_ns();
    ring__hb_data(c->from, c->last_rx);
    return 1;
}

static int post_send(ring_chan_t *c, uint32_t m)
{
    ring_t *r = c->ring;
    ring_slot_t *sl = &c->ss[m % r->opts.send_depth];
    uint32_t seg = 0, dep;
    size_t off = 0, cnt;
    msg_send(c, m, &seg, &dep);
    ring__chunk_range(c, seg, m % c->k, &off, &cnt);
    if (r->coll.local != NULL && m < c->k)
        ring__local_fill(c, m + 1); /* step 0 sends the own segment */
    const void *src = ring__region_at(c, off, cnt);
    tp_mem_t *mem = NULL;
    if (r->coll.wire || src == NULL) {
        /* Compressed, or across two pieces: packed into the send slot. */
        ring__pack(c, off, cnt, sl->buf);
        src = sl->buf;
        mem = r->send_mem;
    }
    sl->m = m;
    sl->req.cb = send_cb;
    sl->req.data = sl;
    RD_DEBUG("chan %u send m %u seg %u off %zu cnt %zu", c->id, m, seg, off,
             cnt);
    if (ring__cut(r, c->to, r->coll.kind == COLL_ALLREDUCE &&
                               m / c->k + c->step0 >= c->n - 1)) {
        sl->req.status = 0;
        sl->state = SLOT_DONE; /* withheld: gone, as far as we know */
        return 0;
    }
    sl->state = SLOT_POSTED; /* the callback may run inside tp_send */
    uint64_t tag = chan_tag(c, m) |
                   ((uint64_t)r->flags_seen << RING_FLAG_SHIFT);
    int rc = tp_send(c->to->peer, src, cnt * r->coll.wire_es, tag, mem,
                     &sl->req);
    if (rc != 0)
        sl->state = SLOT_FREE;
    return rc;
}

/* Reap finished sends; an error names the right neighbour. */
static int chan_reap_sends(ring_chan_t *c)
{
    ring_t *r = c->ring;
    int work = 0;
    for (unsigned i = 0; i < r->opts.send_depth; i++) {
        ring_slot_t *sl = &c->ss[i];
        if (sl->state != SLOT_DONE)
            continue;
        if (sl->req.status != 0)
            ring__coll_fail(r, sl->req.status, c->to->rank);
        sl->state = SLOT_FREE;
        c->sends_done++;
        work++;
    }
    if (work)
        c->last_tx = rd_now_ns();
    return work;
}

/* Post what may be posted, apply what has arrived. Returns work done. */
static int chan_advance(ring_chan_t *c)
{
    ring_t *r = c->ring;
    int work = 0;
    while (c->next_post < c->nrecv &&
           c->next_post < c->next_proc + r->opts.recv_depth &&
           c->rs[c->next_post % r->opts.recv_depth].state == SLOT_FREE) {
        int rc = post_recv(c, c->next_post);
        if (rc != 0) {
            ring__coll_fail(r, rc, c->from->rank);
            return work;
        }
        c->next_post++;
        work++;
    }
    while (chan_consume(c) && r->coll.err == 0)
        work++;
    while (r->coll.err == 0 && c->next_send < c->nsend) {
        uint32_t seg, dep;
        msg_send(c, c->next_send, &seg, &dep);
        if (dep != RING_NO_DEP && dep >= c->next_proc)
            break;
        if (c->ss[c->next_send % r->opts.send_depth].state != SLOT_FREE ||
            ring__test_held(r))
            break;
        int rc = post_send(c, c->next_send);
        if (rc != 0) {
            ring__coll_fail(r, rc, c->to->rank);
            break;
        }
        c->next_send++;
        work++;
    }
    return work;
}

/*
 * One turn of a channel. Final chunks go back to the local sources after
 * the sends that depend on them are posted (the wire is busy meanwhile),
 * and after an error too: what was applied is validated and final.
 */
static int chan_pump(ring_chan_t *c)
{
    ring_t *r = c->ring;
    int work = chan_reap_sends(c);
    if (r->coll.err == 0)
        work += chan_advance(c);
    if (r->coll.local != NULL)
        work += ring__local_publish(c);
    return work;
}

/* Every send has finished, well or not, and every receive is applied. */
static int chan_done(const ring_chan_t *c)
{
    return c->next_proc == c->nrecv && c->sends_done == c->nsend &&
           (c->ring->coll.local == NULL || c->published == c->nseg * c->k);
}

/*
 * A failed neighbour fails the collective only if we still need it: a
 * right neighbour that has all our messages may leave (or die) while we
 * wait for our left neighbour's last ones.
 */
static void chan_links_check(ring_chan_t *c)
{
    ring_t *r = c->ring;
    if (c->from->fail_rc != 0 && !ring__chan_recvs_done(c))
        ring__coll_fail(r, c->from->fail_rc, c->from->rank);
    else if (c->to->fail_rc != 0 && c->sends_done < c->nsend)
        ring__coll_fail(r, c->to->fail_rc, c->to->rank);
}

static int chan_outstanding(const ring_chan_t *c)
{
    const ring_t *r = c->ring;
    for (unsigned i = 0; i < r->opts.recv_depth; i++)
        if (c->rs[i].state == SLOT_POSTED)
            return 1;
    for (unsigned i = 0; i < r->opts.send_depth; i++)
        if (c->ss[i].state == SLOT_POSTED)
            return 1;
    return 0;
}

/* ---- running a collective ---------------------------------------------- */

/*
 * A silent neighbour's endpoint only: the others lead to live daemons,
 * and a force-closed endpoint shows its peer a failure naming us, which
 * it would report (a healthy node suspected). Our sends to them finish
 * as they take them or leave the ring; ring_destroy closes the rest.
 */
static void close_silent(ring_t *r, uint32_t rank)
{
    tp_peer_t *p = NULL;
    if (r->left.rank == rank || r->right.rank == rank) {
        p = r->left.rank == rank ? r->left.peer : r->right.peer;
        if (r->left.peer == p)
            r->left.peer = NULL;
        if (r->right.peer == p)
            r->right.peer = NULL;
    } else if (r->grid != NULL && r->grid->links != NULL && rank < r->n) {
        p = r->grid->links[rank].peer;
        r->grid->links[rank].peer = NULL;
    }
    tp_peer_close(p, 1);
}

/*
 * After an error: cancel receives, force-close the endpoints (a silent
 * neighbour's only) so stuck sends complete, and wait (bounded) until UCX
 * has let go of every buffer.
 */
static void coll_unwind(ring_t *r)
{
    for (unsigned i = 0; i < r->nchan; i++)
        for (unsigned j = 0; j < r->opts.recv_depth; j++)
            if (r->chan[i].rs[j].state == SLOT_POSTED)
                tp_cancel(r->tp, &r->chan[i].rs[j].req);
    if (r->coll.err == ST_EPEER_SILENT) {
        close_silent(r, r->coll.err_rank);
    } else {
        tp_peer_close(r->left.peer, 1);
        if (r->right.peer != r->left.peer)
            tp_peer_close(r->right.peer, 1);
        r->left.peer = r->right.peer = NULL;
        ring__grid_close(r, 1);
    }
    int64_t deadline = rd_now_ns() + RING_DRAIN_BOUND_NS;
    for (;;) {
        int busy = 0;
        for (unsigned i = 0; i < r->nchan; i++)
            busy |= chan_outstanding(&r->chan[i]);
        if (!busy)
            break;
        if (rd_now_ns() > deadline) {
            RD_ERROR("ring: requests outlived the abort; leaking buffers");
            r->leaked = 1;
            break;
        }
        tp_progress(r->tp);
    }
}

void ring__coll_begin(ring_t *r, unsigned nchan)
{
    r->coll.err = 0;
    r->nchan = nchan;
    int64_t now = rd_now_ns();
    for (unsigned i = 0; i < nchan; i++) {
        ring_chan_t *c = &r->chan[i];
        c->next_send = c->next_post = c->next_proc = c->sends_done = 0;
        c->filled = c->published = 0;
        c->last_rx = c->last_tx = now;
    }
    /* ring__coll_check cleared them: a grid's phases add up. */
    r->flags_seen |= r->flags_out;
    ring_set_state(r, RING_RUNNING, 0, 0);
    ring__drain_stale(r);
}

/*
 * One turn of the loop: pump every channel. Returns 1 when the collective
 * is over: all done, or failed with receives still missing. Once every
 * receive is applied our result is complete, so after an error we only
 * wait for the sends to finish (they fail fast on a failed endpoint) and
 * UCX lets go of the buffer.
 */
int ring__coll_turn(ring_t *r, int *work_p)
{
    int done = 1, recvd = 1, quiet = 1;
    if (atomic_load_explicit(&r->abort_req, memory_order_acquire))
        ring__coll_fail(r, ST_EABORTED, r->rank);
    for (unsigned i = 0; i < r->nchan; i++) {
        chan_links_check(&r->chan[i]);
        *work_p += chan_pump(&r->chan[i]);
    }
    for (unsigned i = 0; i < r->nchan; i++) {
        const ring_chan_t *c = &r->chan[i];
        done &= chan_done(c);
        recvd &= ring__chan_recvs_done(c);
        quiet &= c->next_send == c->sends_done;
    }
    /*
     * After an error no send is posted any more: once the posted ones
     * are reaped nothing can move (and no deadline would fire), so a
     * failure that lands after the last receive but before the last
     * sends (an abort) ends here too.
     */
    return done || (r->coll.err != 0 && (!recvd || quiet));
}

/*
 * Drive the current collective (or grid phase) to the end. Complete beats
 * failed: a neighbour that exits (or dies) after its last message arrived
 * leaves a valid result; the ring is dead for the next collective only.
 */
int ring__coll_run(ring_t *r, int64_t *wait_ns, int last)
{
    *wait_ns += ring__coll_loop(r);
    r->seq = (r->seq + 1) & TP_TAG_SEQ_MASK;
    r->stats.next_seq = r->seq;
    int complete = 1;
    for (unsigned i = 0; i < r->nchan; i++)
        complete &= chan_done(&r->chan[i]);
    if (r->coll.err != 0 && !complete) {
        int rc = r->coll.err;
        coll_unwind(r);
        ring_set_state(r, RING_FAILED, rc, r->coll.err_rank);
        return rc;
    }
    ring__drain_stale(r);
    r->flags_all = r->coll.kind != COLL_BCAST;
    /* Only at the end: a grid's later phase fails on a link it needs
     * (chan_links_check), not on one of a row that has finished. */
    ring_link_t *gone = last ? ring__failed_link(r) : NULL;
    if (r->coll.err == 0 && gone != NULL) {
        r->coll.err = gone->fail_rc;
        r->coll.err_rank = gone->rank;
        RD_WARN("ring gen %" PRIu64 ": rank %u failed after the collective",
                r->generation, gone->rank);
    }
    if (r->coll.err != 0)
        ring_set_state(r, RING_FAILED, r->coll.err, r->coll.err_rank);
    else
        ring_set_state(r, RING_READY, 0, 0);
    return 0;
}

int ring__flat_own(ring_t *r, ring_coll_t kind, void *buf, size_t count,
                   kern_dtype_t dt, kern_op_t op)
{
    size_t es = kern_dtype_size(dt);
    ring_coll_desc_t saved = r->coll;
    r->coll = (ring_coll_desc_t){.kind = kind, .dt = dt, .op = op,
                                 .avg_div = r->n, .es = es, .wire_es = es};
    ring__chans_flat(r);
    ring_chan_t *c = &r->chan[0];
    int gather = kind == COLL_ALLGATHER;
    ring__chan_setup(c, buf, 0, gather ? count * r->n : count, r->n);
    c->nsend = c->nrecv = (gather ? 1 : 2) * (r->n - 1) * c->k;
    ring__coll_begin(r, 1);
    int64_t wait_ns = 0;
    int rc = ring__coll_run(r, &wait_ns, 0);
    r->coll = saved;
    return rc;
}

static int coll_run(ring_t *r)
{
    int64_t t0 = rd_now_ns(), wait_ns = 0;
    int rc = ring__coll_run(r, &wait_ns, 1);
    if (rc == 0) {
        ring__coll_stats(r, t0, wait_ns);
        r->stats.collectives++;
    }
    return rc;
}

/* A collective may start: the ring is alive and nobody asked to abort. */
int ring__coll_check(ring_t *r)
{
    r->flags_all = 0;
    r->flags_seen = 0;
    if (atomic_load_explicit(&r->abort_req, memory_order_acquire))
        ring_set_state(r, RING_FAILED, ST_EABORTED, r->rank);
    if (r->state == RING_FAILED)
        return ST_EABORTED;
    if (r->state != RING_READY) {
        RD_ERROR("ring: collective called while one is running");
        return ST_EINVAL;
    }
    return 0;
}

/*
 * The flat ring: channel 0 flows right; channel 1 flows left in the
 * mirrored order. The grid's phases set the channels up their own way, so
 * every flat collective sets them back.
 */
void ring__chans_flat(ring_t *r)
{
    /* With two ranks one endpoint (and its failure) serves both sides. */
    ring_link_t *left = r->n == 2 ? &r->right : &r->left;
    for (unsigned i = 0; i < RING_NCHAN; i++) {
        ring_chan_t *c = &r->chan[i];
        c->ring = r;
        c->id = i % RING_MAX_CHAN;
        c->to = i == 1 ? left : &r->right;
        c->from = i == 1 ? &r->right : left;
        c->pos = i == 1 ? ring__mod_n((int64_t)r->n - r->rank, r->n)
                        : r->rank;
        c->n = r->n;
        c->step0 = 0;
        c->finish = 1;
    }
}

/*
 * An allreduce's segment of at least 2 * RING_SPLIT_MIN bytes that would
 * be one chunk goes as two: with one chunk a rank's send of a segment
 * waits for the whole of its receive, and the link idles in between
 * (ring/README.md, "Two rings": 2 MiB at n = 2, 1 MiB segments, 1.4-2.0x
 * faster in halves; segments of 512 KiB gained nothing). Depends on the
 * count and opts.split_lone alone, the same on every rank of a view.
 */
#define RING_SPLIT_MIN ((size_t)512 << 10)

/* Set up channel c over elements [first, first+count) of buf. */
void ring__chan_setup(ring_chan_t *c, uint8_t *buf, size_t first,
                      size_t count, uint32_t nseg)
{
    ring_t *r = c->ring;
    size_t celems = r->opts.chunk_bytes / r->coll.es;
    size_t maxseg = (count + nseg - 1) / nseg;
    size_t k = (maxseg + celems - 1) / celems;
    if (k < 2 && r->opts.split_lone && r->coll.kind == COLL_ALLREDUCE &&
        maxseg * r->coll.es >= 2 * RING_SPLIT_MIN)
        k = 2;
    c->base = buf + first * r->coll.es;
    c->first = first;
    c->count = count;
    c->nseg = nseg;
    c->k = k ? (uint32_t)k : 1;
}

static int coll_setup_check(ring_t *r, size_t count, size_t es)
{
    size_t celems = r->opts.chunk_bytes / es;
    size_t k = (count / r->n + 1 + celems - 1) / celems + 1;
    if (celems == 0 || k * 2 * r->n >= (1u << 30)) {
        RD_ERROR("ring: %zu elements is too large for chunk %zu", count,
                 r->opts.chunk_bytes);
        return ST_EINVAL;
    }
    return 0;
}

/* One rank: the AVG division is all there is to do. */
static int allreduce_one(ring_t *r, void *buf, size_t count,
                         const ring_local_t *local)
{
    r->stats.collectives++;
    r->flags_seen = r->flags_out;
    r->flags_all = 1;
    if (local != NULL) {
        ring__local_one(r, local, buf, count);
        r->stats.local_pipelined++;
    } else if (r->coll.op == KERN_AVG && r->coll.avg_div != 1) {
        kern_avg_finish(r->coll.dt, buf, count, r->coll.avg_div);
    }
    return 0;
}

/* RING_BIDIR_AUTO's sizes: ring.h. Every rank has the same count and
 * dtype, so every rank makes the same choice. */
static int two_rings(const ring_opts_t *o, size_t count, size_t es)
{
    if (count < 2 || o->bidirectional == RING_BIDIR_OFF)
        return 0;
    return o->bidirectional == RING_BIDIR_ON ||
           (count * es >= RING_BIDIR_MIN && count * es <= RING_BIDIR_MAX);
}

static int allreduce_flat(ring_t *r, void *buf, size_t count,
                          const ring_local_t *local)
{
    int rc = 0;
    if (local != NULL && ring__pieces_in_place(r, local) &&
        (rc = ring__wire_slots(r)) == 0) {
        r->coll.pieces = local; /* no fill, no write-back */
        local = NULL;
    }
    if (rc != 0)
        return rc;
    r->coll.local = local;
    ring__chans_flat(r);
    unsigned nchan = two_rings(&r->opts, count, r->coll.es) ? 2 : 1;
    size_t half = nchan == 2 ? count / 2 : count;
    ring__chan_setup(&r->chan[0], buf, 0, half, r->n);
    if (nchan == 2)
        ring__chan_setup(&r->chan[1], buf, half, count - half, r->n);
    for (unsigned i = 0; i < nchan; i++) {
        ring_chan_t *c = &r->chan[i];
        c->nsend = c->nrecv = 2 * (r->n - 1) * c->k;
    }
    ring__coll_begin(r, nchan);
    rc = coll_run(r);
    if (rc == 0 && local != NULL)
        r->stats.local_pipelined++;
    if (rc == 0 && nchan == 2)
        r->stats.two_rings++;
    if (rc == 0 && r->coll.pieces != NULL)
        r->stats.local_in_place++;
    r->coll.local = NULL;
    r->coll.pieces = NULL;
    return rc;
}

static int local_check(const ring_local_t *l, size_t count)
{
    size_t sum = 0;
    if (l->bufs == NULL || l->nbufs == 0 ||
        (l->nsegs > 1 && l->seg_counts == NULL))
        goto bad;
    for (uint32_t s = 0; l->nsegs > 1 && s < l->nsegs; s++)
        sum += l->seg_counts[s];
    if (l->nsegs > 1 && sum != count)
        goto bad;
    return 0;
bad:
    RD_ERROR("ring_allreduce: %u local sources of %u pieces do not make "
             "%zu elements", l->nbufs, l->nsegs, count);
    return ST_EINVAL;
}

static int allreduce_check(const ring_allreduce_t *a)
{
    if (a == NULL) {
        RD_ERROR("ring_allreduce: no descriptor");
        return ST_EINVAL;
    }
    if (kern_dtype_size(a->dt) == 0 || (unsigned)a->op >= KERN_OP_COUNT ||
        (a->count && !a->buf) || (a->op != KERN_AVG && a->divisor != 0) ||
        (unsigned)a->wire >= RD_WIRE_COUNT) {
        RD_ERROR("ring_allreduce: bad dtype %s, op %s, divisor %u, wire %s "
                 "or buffer %p of %zu elements", kern_dtype_name(a->dt),
                 kern_op_name(a->op), a->divisor, rd_wire_name(a->wire),
                 a->buf, a->count);
        return ST_EINVAL;
    }
    return 0;
}

int ring_allreduce(ring_t *r, const ring_allreduce_t *a)
{
    int rc = allreduce_check(a);
    if (rc != 0)
        return rc;
    size_t es = kern_dtype_size(a->dt), count = a->count;
    void *buf = a->buf;
    const ring_local_t *local = a->local;
    rc = ring__coll_check(r);
    if (rc != 0 || count == 0 || (rc = coll_setup_check(r, count, es)) ||
        (local != NULL && (rc = local_check(local, count))))
        return rc;
    rd_wire_t wire_fmt = rd_wire_concrete(a->wire, r->opts.wire);
    int wire = rd_wire_compresses(wire_fmt) && a->dt == KERN_F32 && r->n > 1;
    if (wire && (rc = ring__wire_slots(r)) != 0)
        return rc;
    r->coll = (ring_coll_desc_t){.kind = COLL_ALLREDUCE, .dt = a->dt,
                                 .op = a->op,
                                 .avg_div = a->divisor ? a->divisor : r->n,
                                 .es = es, .wire_es = wire ? 2 : es,
                                 .wire = wire, .wire_fmt = wire_fmt,
                                 .count = count};
    if (r->n == 1)
        return allreduce_one(r, buf, count, local);
    if (!wire && ring__grid_wants(r, count, es))
        return local != NULL ? ring__local_staged(r, local, buf, count)
                             : ring__grid_allreduce(r, buf, count);
    return allreduce_flat(r, buf, count, local);
}

int ring_allgather(ring_t *r, void *buf, size_t block_bytes)
{
    int rc = ring__coll_check(r);
    size_t total = block_bytes * r->n;
    if (rc == 0 && block_bytes != 0 && r->n == 1) {
        r->flags_seen = r->flags_out;
        r->flags_all = 1;
    }
    if (rc != 0 || block_bytes == 0 || r->n == 1 ||
        (rc = coll_setup_check(r, total, 1)))
        return rc;
    r->coll = (ring_coll_desc_t){.kind = COLL_ALLGATHER, .dt = KERN_U8,
                                 .op = KERN_SUM, .es = 1, .wire_es = 1};
    ring__chans_flat(r);
    ring_chan_t *c = &r->chan[0];
    ring__chan_setup(c, buf, 0, total, r->n);
    c->nsend = c->nrecv = (r->n - 1) * c->k;
    ring__coll_begin(r, 1);
    return coll_run(r);
}

int ring_broadcast(ring_t *r, void *buf, size_t bytes, uint32_t root)
{
    if (root >= r->n) {
        RD_ERROR("ring_broadcast: root %u of %u", root, r->n);
        return ST_EINVAL;
    }
    int rc = ring__coll_check(r);
    if (rc != 0 || bytes == 0 || r->n == 1 ||
        (rc = coll_setup_check(r, bytes * r->n, 1)))
        return rc;
    /* root: channel 0 positions are ranks */
    r->coll = (ring_coll_desc_t){.kind = COLL_BCAST, .dt = KERN_U8,
                                 .op = KERN_SUM, .es = 1, .wire_es = 1,
                                 .root = root};
    ring__chans_flat(r);
    ring_chan_t *c = &r->chan[0];
    ring__chan_setup(c, buf, 0, bytes, 1);
    uint32_t rel = ring__mod_n((int64_t)r->rank - root, r->n);
    c->nsend = rel == r->n - 1 ? 0 : c->k;
    c->nrecv = rel == 0 ? 0 : c->k;
    ring__coll_begin(r, 1);
    return coll_run(r);
}

int ring_barrier(ring_t *r)
{
    /*
     * A rank returns once every rank's byte reached it, and a rank sends
     * its byte only once it entered. On the grid, a one-byte allreduce
     * (rows, columns, rows: about 2(rows + cols) hops); on the flat
     * ring an allgather of one byte a rank: n - 1 hops, half of what the
     * allreduce's two rounds take.
     */
    if (r->grid != NULL && ring__grid_wants(r, 1, 1)) {
        uint8_t token = 1;
        ring_allreduce_t a = {.buf = &token, .count = 1, .dt = KERN_U8,
                              .op = KERN_MAX};
        return ring_allreduce(r, &a);
    }
    if (r->barrier_bytes == NULL &&
        (r->barrier_bytes = calloc(r->n, 1)) == NULL)
        return ST_ENOMEM;
    return ring_allgather(r, r->barrier_bytes, 1);
}

void ring_set_flags(ring_t *r, unsigned flags)
{
    r->flags_out = flags & RING_FLAGS_MASK;
}

int ring_flags_seen(const ring_t *r, unsigned *flags_p)
{
    *flags_p = r->flags_all ? r->flags_seen : 0;
    return r->flags_all;
}
