/*
 * step-queue.c - the collectives within a step (step.c).
 *
 * A collective proceeds when every trainer of the step has posted the same
 * one (same index, kind, count and dtype; an allreduce's op and wire
 * format, a broadcast's root): their buffers are reduced into a staging
 * area in local-rank order, handed once to the backend, and
 * the result is copied back into every trainer's buffer. Because all
 * trainers receive the very same bytes, replicas stay bitwise identical.
 * The backend does the reduction and the copy back on its own thread; the
 * copies left to this file (a broadcast to several trainers, the copying
 * path) run on the copy pool when large (coll_copy), so the loop moves no
 * tensor data beyond a few hundred KiB.
 * Collectives are asynchronous: each trainer's queue holds those it sent
 * in order, the i-th entries of all queues are the same collective, and
 * the next runs as soon as one completes; a run of ALLREDUCE_MORE entries
 * and the allreduce ending it (a fusion group) runs as one.
 */
#include "daemon/step-int.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "kernels/kern.h"

static void try_launch(dmn_t *d);
static void coll_done(void *arg, int status);

/*
 * A copy below this many bytes (all its destinations together) stays on
 * the loop: the pool's round trip (uv_queue_work to its after-callback)
 * took 22-30 us here, while 256 KiB took 5 us to copy from cache and 81
 * us cold (memory the loop had not just touched), so the hop would cost a
 * small collective more latency than the loop time it saves, and the
 * loop holds at most ~0.1 ms per copy, far below its lag timer's period.
 */
#define DMN_COLL_INLINE_MAX (256u << 10)

static void coll_copy_work(dmn_copy_t *b)
{
    dmn_t *d = b->d;
    for (uint32_t i = 0; i < d->q.copy_n; i++) {
        memcpy(d->q.copy_dst[i], d->q.copy_src, d->q.bytes);
        dmn__coll_copied(d, d->q.bytes);
    }
}

/* On the loop, once the copy ran (copy.c). A stopping daemon cancels it
 * (status != 0): the backend and the connections are going, and the
 * mappings with d (dmn__maps_fini), so there is nothing left to do. */
static void coll_copy_done(dmn_copy_t *b, int status)
{
    dmn_t *d = b->d;
    if (status == 0)
        d->q.copy_then(d);
}

/*
 * Copy d->q.copy_src (d->q.bytes) into d->q.copy_dst[0..n), then go on
 * with then(d). Large copies run on the pool: 0 after an inline copy (the
 * caller calls then() itself), ST_AGAIN when the pool has it and
 * then() runs when it is done. Meanwhile the step stays REDUCING, so
 * nothing launches over staging, and the caller holds DMN_MAPS_COLL (the
 * pool holds DMN_MAPS_COPIES too): a trainer lost or gone back to
 * step_begin meanwhile is unmapped only after the copy, and the step is
 * ABORTING when then() runs, as if that had happened while the backend
 * ran the collective.
 */
static int coll_copy(dmn_t *d, const void *src, uint32_t n,
                     void (*then)(dmn_t *d))
{
    dmn_copy_t *c = &d->q.copy;
    d->q.copy_src = src;
    d->q.copy_n = n;
    d->q.copy_then = then;
    *c = (dmn_copy_t){.d = d, .work = coll_copy_work,
                      .done = coll_copy_done,
                      /* no state: no checkpoint waits for it */
                      .flags = DMN_COPY_F_NO_HOLD};
    if ((uint64_t)n * d->q.bytes >= DMN_COLL_INLINE_MAX) {
        if (dmn__copy_queue(&d->pool, c) == 0)
            return ST_AGAIN;
        /* The pool refused (logged there): copying here beats failing
         * the collective. */
    }
    coll_copy_work(c);
    return 0;
}

static int coll_matches(const proto_coll_req_t *a, const proto_coll_req_t *b)
{
    if (a->kind != b->kind || a->coll_seq != b->coll_seq ||
        a->count != b->count || a->dtype != b->dtype)
        return 0;
    if (proto_coll_is_allreduce(a->kind))
        return a->op == b->op && a->wire == b->wire;
    return a->root == b->root;
}

/*
 * The fence of a step by its generation: the collective ran on a view the
 * backend already knows is over (a newer one came while it finished, too
 * late for the abort). Its result reaches no trainer, which would apply
 * it and complete a step of a view the job left: the step is redone on
 * the new view instead.
 */
static int superseded(dmn_t *d)
{
    uint64_t g = job_newest_generation(d->job);
    if (g <= d->view.generation)
        return 0;
    RD_INFO("collective %u of step %llu finished on view %llu after view "
            "%llu came: its result is dropped, the step redone",
            d->q.coll.coll_seq, (unsigned long long)d->step,
            (unsigned long long)d->view.generation, (unsigned long long)g);
    return 1;
}

/* A collective that failed: every pending one of the step answers with
 * the trainers' code for it, and the step is void (redone). */
static void coll_failed(dmn_t *d, int status)
{
    int32_t wire = status == ST_ERESHAPE    ? RINGD_ERESHAPE
                   : status == ST_EFENCED   ? RINGD_EFENCED
                   : status == ST_EMISMATCH ? RINGD_EMISMATCH
                                            : RINGD_EABORTED;
    if (status != ST_ERESHAPE)
        RD_WARN("collective %u of step %llu failed: %s", d->q.coll.coll_seq,
                (unsigned long long)d->step, st_strerror(status));
    d->stats.coll_errors++;
    dmn__step_fail_posted(d, wire, 1);
    dmn__step_set_state(d, DMN_STEP_BROKEN);
    dmn__step_maybe_close(d);
}

/* The result reached every trainer (copy_out): the queues' heads (g
 * entries: a fused group) are answered, oldest first. */
static void coll_answer(dmn_t *d)
{
    uint32_t g = d->coll_nsegs;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_POSTED)
            continue;
        for (uint32_t s = 0; s < g && c->q_len > 0; s++) {
            uint32_t msg_seq = dmn__conn_q(c, 0)->msg_seq;
            c->q_head = (c->q_head + 1) % PROTO_MAX_OUTSTANDING;
            if (--c->q_len == 0)
                dmn__conn_set_state(c, DMN_CONN_ACTIVE);
            dmn__reply_status(c, PROTO_T_COLL, msg_seq, 0);
        }
    }
}

static void coll_count(dmn_t *d)
{
    const proto_coll_req_t *r = &d->q.coll;
    double secs = (double)(rd_now_ns() - d->q.start_ns) / 1e9;
    uint64_t bytes = r->count * proto_dtype_size(r->dtype);
    uint32_t g = d->coll_nsegs, n = d->view.node_count;
    d->stats.collectives += g;
    d->stats.coll_fused += g > 1 ? g : 0;
    d->stats.coll_fused_in_place += g > 1 && d->q.nsegs == 1 ? g : 0;
    d->stats.coll_fused_auto += d->q.auto_fused ? g : 0;
    d->stats.coll_zero_copy += d->q.direct;
    d->stats.coll_bytes += bytes;
    d->stats.coll_seconds += secs;
    if (proto_coll_is_allreduce(r->kind) && secs > 0)
        d->stats.last_busbw = (double)bytes / secs * 2.0 * (n - 1) / n;
}

/*
 * The result is in every trainer's buffer: let go of the mappings, answer
 * the trainers and run the next one queued.
 */
static void coll_answered(dmn_t *d)
{
    dmn__maps_release(d, DMN_MAPS_COLL);
    if (d->state != DMN_STEP_REDUCING && d->state != DMN_STEP_ABORTING)
        return; /* drained while the result was copied out */
    coll_answer(d);
    coll_count(d);
    if (d->state == DMN_STEP_ABORTING) {
        /* A trainer went back to step_begin (or was lost) while this
         * ran: the step is broken, and closes now if nobody else is still
         * in it (else the step_begin would wait for an event that never
         * comes). */
        dmn__step_set_state(d, DMN_STEP_BROKEN);
        dmn__step_maybe_close(d);
    } else {
        dmn__step_set_state(d, DMN_STEP_RUNNING);
        try_launch(d); /* the next one queued: no round trip between */
    }
}

/*
 * An allreduce's result is already in every trainer's buffer (the backend
 * wrote it back, job_reduce_t); a broadcast to several trainers, or the
 * copying path, has it in staging: copied into every posted trainer's
 * buffer. ST_AGAIN: on the pool, and coll_answered goes on after it.
 */
static int copy_out(dmn_t *d)
{
    const proto_coll_req_t *r = &d->q.coll;
    if (d->q.direct || d->coll_nsegs != 1 ||
        (r->kind != PROTO_COLL_BROADCAST && d->q.bufs[0] != d->q.staging))
        return 0;
    uint32_t n = 0;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_POSTED)
            continue;
        if (n == d->q.copy_dst_cap) { /* none becomes POSTED meanwhile */
            RD_ERROR("client %u: more trainers in collective %u than "
                     "launched it: a bug, its result is not copied",
                     c->id, r->coll_seq);
            break;
        }
        const dmn_qcoll_t *e = dmn__conn_q(c, 0);
        void *dst = dmn__buf_ptr(c, e->req.buf_id, e->req.offset,
                                 d->q.bytes);
        if (dst != NULL)
            d->q.copy_dst[n++] = dst;
    }
    return coll_copy(d, d->q.staging, n, coll_answered);
}

/*
 * The backend is done (job.h's done callback). Finish first: the hold for
 * the checkpoint copies, the generation's fence and the errors; then the
 * copy out of staging, and coll_answered answers.
 */
static void coll_done(void *arg, int status)
{
    dmn_t *d = arg;
    /* The trainer applies the result to its state next: not before the
     * checkpoint of the last boundary has copied it. */
    if (dmn__ckpt_hold(d, status)) {
        d->q.held = 1;
        d->q.held_status = status;
        return;
    }
    if (d->state != DMN_STEP_REDUCING && d->state != DMN_STEP_ABORTING) {
        dmn__maps_release(d, DMN_MAPS_COLL);
        return;
    }
    if (status == 0 && superseded(d))
        status = ST_ERESHAPE;
    if (status != 0) {
        dmn__maps_release(d, DMN_MAPS_COLL);
        coll_failed(d, status);
        return;
    }
    if (copy_out(d) == ST_AGAIN)
        return;
    coll_answered(d);
}

/* The checkpoint copies are done: answer the collective they held. */
void dmn__coll_release(dmn_t *d)
{
    if (!d->q.held)
        return;
    d->q.held = 0;
    coll_done(d, d->q.held_status);
}

static int grow(void **p, size_t *cap, size_t want, size_t esz)
{
    if (*cap >= want)
        return 0;
    void *q = realloc(*p, want * esz);
    if (q == NULL) {
        RD_ERROR("no memory for %zu bytes of collective state", want * esz);
        return ST_ENOMEM;
    }
    *p = q;
    *cap = want;
    return 0;
}

/*
 * The posted trainers' buffers, in local-rank order, into d->q.bufs;
 * returns how many. *root_p: the index of a broadcast's root among them,
 * or -1 when it is on another node.
 */
static uint32_t gather_bufs(dmn_t *d, size_t bytes, int *root_p)
{
    const proto_coll_req_t *r = &d->q.coll;
    uint32_t n = 0;
    *root_p = -1;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_POSTED)
            continue;
        if (r->kind == PROTO_COLL_BROADCAST &&
            d->view.rank_offset + c->local_rank == r->root)
            *root_p = (int)n;
        const proto_coll_req_t *q = &dmn__conn_q(c, 0)->req;
        d->q.bufs[n++] = dmn__buf_ptr(c, q->buf_id, q->offset, bytes);
    }
    return n;
}

/*
 * A fused group of g allreduces: every posted trainer's g buffers into
 * d->q.bufs, trainer-major, their element counts into d->q.seg_counts
 * (the same for all: matched), and d->q.coll.count becomes the total.
 * Returns the number of trainers.
 */
static uint32_t gather_fused(dmn_t *d, uint32_t g)
{
    size_t esz = proto_dtype_size(d->q.coll.dtype), total = 0;
    uint32_t n = 0;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_POSTED)
            continue;
        for (uint32_t s = 0; s < g; s++) {
            const proto_coll_req_t *q = &dmn__conn_q(c, s)->req;
            d->q.bufs[n * g + s] = dmn__buf_ptr(c, q->buf_id, q->offset,
                                                   q->count * esz);
            if (n == 0) {
                d->q.seg_counts[s] = q->count;
                total += q->count;
            }
        }
        n++;
    }
    d->q.coll.count = total;
    return n;
}

/* The group's total bytes (its entries are in every posted queue). */
static size_t fused_bytes(dmn_t *d, uint32_t g)
{
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_POSTED)
            continue;
        uint64_t n = 0;
        for (uint32_t s = 0; s < g; s++)
            n += dmn__conn_q(c, s)->req.count;
        return n * proto_dtype_size(d->q.coll.dtype);
    }
    return 0;
}

/* The backend's part, once staging holds its input (coll_copy). */
static void coll_run(dmn_t *d)
{
    const proto_coll_req_t *r = &d->q.coll;
    if (d->state != DMN_STEP_REDUCING && d->state != DMN_STEP_ABORTING) {
        coll_done(d, ST_EABORTED); /* drained while it was copied in */
        return;
    }
    /* A view change or a lost trainer during the copy-in leaves no
     * backend in the old view's state (job.h: it completes the
     * collective with ST_ERESHAPE), so it is posted as if that had
     * happened just after. */
    d->q.start_ns = rd_now_ns();
    int rc;
    if (r->kind == PROTO_COLL_BROADCAST) {
        rc = job_broadcast(d->job, d->q.buf, d->q.bytes, r->root,
                           coll_done, d);
    } else {
        job_reduce_t red = {.bufs = d->q.bufs, .nbufs = d->q.nbufs,
                            .staging = d->q.staging, .count = r->count,
                            .dt = (kern_dtype_t)r->dtype,
                            .op = (kern_op_t)r->op,
                            /* AVG is over the job's trainers, not its
                             * nodes (the ring's ranks) */
                            .divisor = r->op == RINGD_AVG
                                           ? d->view.global_trainers
                                           : 0,
                            .nsegs = d->q.nsegs,
                            .seg_counts = d->q.seg_counts,
                            .wire = (rd_wire_t)r->wire};
        rc = job_allreduce(d->job, &red, coll_done, d);
    }
    if (rc != 0)
        coll_done(d, rc);
}

/* Room for posted trainers' g buffers each. */
static int queue_grow(dmn_t *d, uint32_t posted, uint32_t g)
{
    size_t cap = d->q.bufs_cap, dcap = d->q.copy_dst_cap;
    if (posted == 0)
        posted = 1;
    if (grow((void **)&d->q.bufs, &cap, posted * g, sizeof(void *)) != 0 ||
        grow((void **)&d->q.copy_dst, &dcap, posted, sizeof(void *)) != 0 ||
        (g > 1 && grow((void **)&d->q.seg_counts, &d->q.seg_counts_cap, g,
                       sizeof(size_t)) != 0))
        return ST_ENOMEM;
    d->q.bufs_cap = (uint32_t)cap;
    d->q.copy_dst_cap = (uint32_t)dcap;
    return 0;
}

/*
 * A fused group runs in the trainers' buffers when each trainer's pieces
 * lie end to end in group order: then the region is the same elements in
 * the same order as staging would hold them, on every node whatever the
 * others do, and nothing is gathered or scattered. Compacts bufs to one
 * per trainer; returns the backend's segments (1, or g).
 */
static uint32_t fused_layout(dmn_t *d, uint32_t n, uint32_t g)
{
    if (g == 1 || !d->q.zero_copy)
        return g;
    size_t esz = proto_dtype_size(d->q.coll.dtype);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t s = 0; s + 1 < g; s++) {
            const uint8_t *p = d->q.bufs[t * g + s];
            if (p == NULL ||
                p + d->q.seg_counts[s] * esz != d->q.bufs[t * g + s + 1])
                return g;
        }
    for (uint32_t t = 1; t < n; t++)
        d->q.bufs[t] = d->q.bufs[t * g];
    return 1;
}

/* Staging is used by a broadcast that is not direct, a fused group in
 * pieces and the copying path; the allreduce of several whole buffers
 * runs in the first of them (job_reduce_t) and needs none. */
static int staging_grow(dmn_t *d, uint32_t n, uint32_t g, size_t bytes)
{
    int bcast = d->q.coll.kind == PROTO_COLL_BROADCAST;
    if (d->q.direct || (g > 1 && d->q.nsegs == 1) ||
        (!bcast && g == 1 && n > 1))
        return 0;
    size_t scap = d->q.staging_size;
    if (grow(&d->q.staging, &scap, bytes, 1) != 0)
        return ST_ENOMEM;
    d->q.staging_size = scap;
    return 0;
}

/*
 * Everyone posted: hand the node's buffers to the backend. With one
 * trainer the collective runs in its buffer (zero-copy); with several the
 * backend reduces the others into the first one's and writes the result
 * back, on its own thread (the ring backend chunk by chunk, as the ring
 * goes); a fused group runs the same way when every trainer's pieces lie
 * end to end, else through staging, gathered and scattered there. Only a
 * broadcast to several trainers and the copying path copy here
 * (coll_copy: on the pool when large), into staging before the launch
 * and out of it before the answer.
 */
static void launch(dmn_t *d)
{
    const proto_coll_req_t *r = &d->q.coll;
    uint32_t g = d->coll_nsegs;
    size_t bytes = g > 1 ? fused_bytes(d, g)
                         : r->count * proto_dtype_size(r->dtype);
    uint32_t posted = 0;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        posted += c->cstate == DMN_CONN_POSTED;
    int direct = posted == 1 && d->q.zero_copy && g == 1;
    d->q.direct = direct;
    if (queue_grow(d, posted, g) != 0) {
        dmn__step_fail_posted(d, RINGD_ENOMEM, 0);
        return;
    }
    int root = -1;
    uint32_t n = g > 1 ? gather_fused(d, g) : gather_bufs(d, bytes, &root);
    d->q.nsegs = fused_layout(d, n, g);
    if (staging_grow(d, n, g, bytes) != 0) {
        dmn__step_fail_posted(d, RINGD_ENOMEM, 0);
        return;
    }
    const void *in = NULL; /* what is copied into staging first */
    d->q.buf = d->q.staging;
    if (r->kind == PROTO_COLL_BROADCAST) {
        /* The one trainer's buffer is sent from or received into. */
        if (direct)
            d->q.buf = d->q.bufs[0];
        else if (root >= 0)
            in = d->q.bufs[root];
    } else if (!direct && g == 1 && n == 1) {
        /* The copying path: one buffer, copied in here and out in
         * coll_done; several the backend sums into staging itself. */
        in = d->q.bufs[0];
        d->q.bufs[0] = d->q.staging;
    }
    d->q.nbufs = n;
    d->q.bytes = bytes;
    dmn__step_set_state(d, DMN_STEP_REDUCING);
    dmn__maps_hold(d, DMN_MAPS_COLL);
    if (in != NULL) {
        d->q.copy_dst[0] = d->q.staging;
        if (coll_copy(d, in, 1, coll_run) == ST_AGAIN)
            return;
    }
    coll_run(d);
}

/*
 * The entries the queues' head takes: 1, or for a fused group the run of
 * ALLREDUCE_MORE and the allreduce that ends it. 0 while some trainer has
 * not queued all of it: a group is one ring operation on every node, so
 * it never starts in part (the trainers send it whole).
 */
static uint32_t group_len(const dmn_t *d, dmn_conn_t *first)
{
    uint32_t g = 1;
    while (g <= first->q_len &&
           dmn__conn_q(first, g - 1)->req.kind == PROTO_COLL_ALLREDUCE_MORE)
        g++;
    if (g > first->q_len)
        return 0;
    for (const dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        if (c->cstate == DMN_CONN_POSTED && c->q_len < g)
            return 0;
    return g;
}

/* ---- Fusion by arrival (fuse.c) ---------------------------------------- */

/* The nodes answered the ask: launch what they agreed. */
static void ask_done(void *arg, int status)
{
    dmn_t *d = arg;
    if (d->state != DMN_STEP_REDUCING && d->state != DMN_STEP_ABORTING)
        return; /* drained meanwhile */
    if (status == 0 && superseded(d))
        status = ST_ERESHAPE;
    if (status == 0)
        status = dmn__fuse_answer(d);
    if (status != 0) {
        coll_failed(d, status);
        return;
    }
    if (d->state == DMN_STEP_ABORTING) {
        dmn__step_set_state(d, DMN_STEP_BROKEN);
        dmn__step_maybe_close(d);
        return;
    }
    dmn__step_set_state(d, DMN_STEP_RUNNING);
    try_launch(d);
}

/*
 * The entries the next launch takes from an eligible head: the answer of
 * the ask before it, 1 while skipping, or 0 when it asks now (ask_done
 * launches; the step is REDUCING meanwhile) or failed the step.
 */
static uint32_t fuse_len(dmn_t *d)
{
    uint32_t g = d->q.fuse_agreed;
    if (g > 0) {
        uint32_t run = dmn__fuse_run(d);
        d->q.fuse_agreed = 0;
        if (run >= g) {
            d->q.auto_fused = g > 1;
            return g;
        }
        /* Only a failure answers queued entries, and it breaks the
         * step: a bug, but never a launch the other nodes do not make. */
        RD_ERROR("collective %u: the nodes agreed to fuse %u allreduces, "
                 "%u are queued here", d->q.coll.coll_seq, g, run);
        coll_failed(d, ST_EMISMATCH);
        return 0;
    }
    if (d->q.fuse_skip > 0) {
        d->q.fuse_skip--;
        return 1;
    }
    /* The run is looked for only here and for an answer: a skipped
     * launch pays nothing for it (one trainer: every pair of entries). */
    uint32_t run = dmn__fuse_run(d);
    dmn__step_set_state(d, DMN_STEP_REDUCING);
    int rc = dmn__fuse_ask(d, run, ask_done);
    if (rc != 0)
        ask_done(d, rc);
    return 0;
}

/* Run the next collective once every trainer of the step queued it. */
static void try_launch(dmn_t *d)
{
    if (d->state != DMN_STEP_RUNNING)
        return;
    dmn_conn_t *first = NULL;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate == DMN_CONN_ACTIVE)
            return;
        if (c->cstate == DMN_CONN_POSTED && first == NULL)
            first = c;
    }
    if (first == NULL)
        return;
    uint32_t g = group_len(d, first);
    if (g == 0)
        return;
    d->q.coll = dmn__conn_q(first, 0)->req;
    d->q.auto_fused = 0;
    if (dmn__fuse_on(d)) {
        dmn__fuse_epoch(d);
        if (g == 1 && dmn__fuse_eligible(&d->q.coll) &&
            (g = fuse_len(d)) == 0)
            return;
        dmn__fuse_launched(d, first, g);
    }
    d->coll_nsegs = g;
    launch(d);
}

/* Another trainer's collective at position pos of its queue, the one req
 * must match; NULL when none has queued that far yet. */
static const proto_coll_req_t *queued_at(dmn_t *d, const dmn_conn_t *c,
                                         uint32_t pos)
{
    for (dmn_conn_t *o = d->conns; o != NULL; o = o->next)
        if (o != c && dmn__conn_in_step(o) && o->q_len > pos)
            return &dmn__conn_q(o, pos)->req;
    return NULL;
}

void dmn__step_coll(dmn_t *d, dmn_conn_t *c, uint32_t seq,
                    const proto_coll_req_t *req)
{
    if (c->flags & (DMN_CONN_F_STALLED | DMN_CONN_F_REDO)) {
        /* Back from a step it was timed out of, or one it left to redo
         * (the rest of what it issued in that step): redo it. */
        c->flags &= ~DMN_CONN_F_STALLED;
        dmn__reply_status(c, PROTO_T_COLL, seq, RINGD_ERESHAPE);
        return;
    }
    if (dmn__conn_in_step(c) && d->state == DMN_STEP_BROKEN) {
        dmn__step_answer_queue(c, 0, RINGD_ERESHAPE);
        dmn__step_leave_to_redo(d, c);
        dmn__reply_status(c, PROTO_T_COLL, seq, RINGD_ERESHAPE);
        dmn__step_maybe_close(d);
        return;
    }
    if (!dmn__conn_in_step(c) || (d->state != DMN_STEP_RUNNING &&
                                  d->state != DMN_STEP_REDUCING &&
                                  d->state != DMN_STEP_ABORTING)) {
        dmn__reply_error(c, seq, RINGD_ESTATE,
                         "collective outside a step (state %s)",
                         dmn__step_state_name(d->state));
        return;
    }
    if (req->kind == PROTO_COLL_BROADCAST &&
        req->root >= d->view.global_trainers) {
        dmn__reply_error(c, seq, RINGD_EINVAL, "broadcast root %u >= %u",
                         req->root, d->view.global_trainers);
        return;
    }
    /* Matched by order of issue: the other trainers' collective at the
     * same place in their queues. A trainer that already ended the step
     * will post nothing more. */
    const proto_coll_req_t *other = queued_at(d, c, c->q_len);
    if ((other != NULL && !coll_matches(other, req)) || d->ended > 0) {
        RD_WARN("client %u: collective %u does not match the other "
                "trainers'", c->id, req->coll_seq);
        d->stats.coll_errors++;
        dmn__step_fail_posted(d, RINGD_EMISMATCH, 0);
        dmn__reply_status(c, PROTO_T_COLL, seq, RINGD_EMISMATCH);
        return;
    }
    if (c->q_len > 0) {
        const proto_coll_req_t *prev = &dmn__conn_q(c, c->q_len - 1)->req;
        if (prev->kind == PROTO_COLL_ALLREDUCE_MORE &&
            (!proto_coll_is_allreduce(req->kind) ||
             req->dtype != prev->dtype || req->op != prev->op ||
             req->wire != prev->wire)) {
            dmn__reply_error(c, seq, RINGD_EINVAL, "a fused group must be "
                             "allreduces of one dtype, op and wire");
            return;
        }
    }
    dmn_qcoll_t *e = dmn__conn_q(c, c->q_len++);
    e->msg_seq = seq;
    e->req = *req;
    dmn__conn_set_state(c, DMN_CONN_POSTED);
    try_launch(d);
}

void dmn__queue_init(dmn_t *d)
{
    /* The copying path stays selectable, to compare results with it. */
    const char *zc = getenv("RINGD_ZERO_COPY");
    d->q.zero_copy = zc == NULL || strcmp(zc, "0") != 0;
}

/* The backend's thread is gone: nothing uses the buffers. */
void dmn__queue_fini(dmn_t *d)
{
    free(d->q.bufs);
    free(d->q.copy_dst);
    free(d->q.seg_counts);
    free(d->q.staging);
}
