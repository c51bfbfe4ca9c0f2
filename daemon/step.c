/*
 * step.c - the node's step and collective state machine.
 *
 * A step starts when every member trainer of the node (those that took part
 * in an earlier step and are still connected) and any joiner has called
 * step_begin; joiners are only admitted there, at a step boundary, and get
 * the job's state copied into their state region. Within a step, a
 * collective proceeds when every trainer of the step has posted the same
 * one (same index, kind, count, dtype, op, root): their buffers are reduced
 * into a staging area in local-rank order, handed once to the backend, and
 * the result is copied back into every trainer's buffer. Because all
 * trainers receive the very same bytes, replicas stay bitwise identical.
 * Collectives are asynchronous: each trainer's queue holds those it sent
 * in order, the i-th entries of all queues are the same collective, and
 * the next runs as soon as one completes; a run of ALLREDUCE_MORE entries
 * and the allreduce ending it (a fusion group) runs as one.
 *
 * Anything that invalidates the step's view (a backend view change, a lost
 * trainer) breaks the step: pending and later collectives of the step
 * answer RINGD_ERESHAPE and the trainers redo it. The step closes when
 * every trainer has left it, by step_end (done) or step_begin (redo).
 * All state changes go through step_set_state().
 */
#include "daemon/dmn-int.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "kernels/kern.h"

/* The wire enums are the kernels' enums. */
_Static_assert(RINGD_F32 == (int)KERN_F32 && RINGD_U8 == (int)KERN_U8 &&
                   RINGD_BF16 == (int)KERN_BF16,
               "ringd_dtype_t must match kern_dtype_t");
_Static_assert(RINGD_SUM == (int)KERN_SUM && RINGD_AVG == (int)KERN_AVG,
               "ringd_op_t must match kern_op_t");

static void try_start(dmn_t *d);
static void try_launch(dmn_t *d);
static void on_backend_ready(void *arg, int status);
static void maybe_restore(dmn_t *d);

uint64_t dmn__now_ms(void)
{
    return rd_now_ns() / 1000000;
}

const char *dmn__step_state_name(dmn_step_state_t s)
{
    static const char *const names[] = {"idle", "running", "reducing",
                                        "broken", "drained"};
    return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

static const char *conn_state_name(dmn_conn_state_t s)
{
    static const char *const names[] = {"new", "idle", "waiting", "active",
                                        "posted", "shutdown", "closed"};
    return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

#define C_(x) (1u << DMN_CONN_##x)
/* The states each connection state may go to. */
static const unsigned conn_next_ok[] = {
    [DMN_CONN_NEW] = C_(IDLE) | C_(CLOSED),
    [DMN_CONN_IDLE] = C_(WAITING) | C_(SHUTDOWN) | C_(CLOSED),
    [DMN_CONN_WAITING] = C_(ACTIVE) | C_(SHUTDOWN) | C_(CLOSED),
    [DMN_CONN_ACTIVE] = C_(POSTED) | C_(IDLE) | C_(SHUTDOWN) | C_(CLOSED),
    [DMN_CONN_POSTED] = C_(ACTIVE) | C_(IDLE) | C_(CLOSED),
    [DMN_CONN_SHUTDOWN] = C_(CLOSED),
    [DMN_CONN_CLOSED] = 0,
};
#undef C_

void dmn__conn_set_state(dmn_conn_t *c, dmn_conn_state_t next)
{
    if (c->cstate == next)
        return;
    if (!(conn_next_ok[c->cstate] & (1u << next))) {
        RD_ERROR("client %u: %s -> %s refused", c->id,
                 conn_state_name(c->cstate), conn_state_name(next));
        return;
    }
    RD_DEBUG("client %u: %s -> %s", c->id, conn_state_name(c->cstate),
             conn_state_name(next));
    if (next == DMN_CONN_CLOSED)
        c->flags &= ~DMN_CONN_F_MEMBER; /* no longer a trainer here */
    if (next == DMN_CONN_ACTIVE)
        c->active_ms = dmn__now_ms(); /* the trainer's turn begins */
    c->cstate = next;
}

uint32_t dmn__trainer_count(const dmn_t *d)
{
    uint32_t n = 0;
    for (const dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        n += dmn__conn_counted(c);
    return n;
}

static int is_member(const dmn_conn_t *c)
{
    return (c->flags & DMN_CONN_F_MEMBER) != 0;
}

static int has_state(const dmn_conn_t *c)
{
    return (c->flags & DMN_CONN_F_HAS_STATE) != 0;
}

/* c leaves the step it is in to redo it: the step cannot complete. */
static void leave_to_redo(dmn_t *d, dmn_conn_t *c)
{
    dmn__conn_set_state(c, DMN_CONN_IDLE);
    c->flags |= DMN_CONN_F_REDO;
    d->flags |= DMN_F_ANY_REDO;
}

/* Answer c's queued collectives from the keep-th on with status, oldest
 * first, and forget them. */
static void answer_queue(dmn_conn_t *c, uint32_t keep, int32_t status)
{
    for (uint32_t i = keep; i < c->q_len; i++)
        dmn__reply_status(c, PROTO_T_COLL, dmn__conn_q(c, i)->msg_seq,
                          status);
    if (c->q_len > keep)
        c->q_len = keep;
}

/* Some trainer of the step has a collective queued. */
static int any_queued(const dmn_t *d)
{
    for (const dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        if (c->cstate == DMN_CONN_POSTED)
            return 1;
    return 0;
}

/* STATUS= for systemd: at most once a second (each one is a blocking
 * datagram to the service manager), except for the final one. */
static void set_status(dmn_t *d, const char *fmt, unsigned long long a)
{
    uint64_t now = dmn__now_ms();
    if (d->state != DMN_STEP_DRAINED && now < d->status_ms + 1000)
        return;
    d->status_ms = now;
    char buf[128];
    snprintf(buf, sizeof(buf), fmt, a);
    if (d->hooks.on_status != NULL)
        d->hooks.on_status(d->hooks.arg, buf);
}

/*
 * Reply to every trainer whose collective is pending, and forget it. The
 * step is void only if someone is told to redo it (leave_to_redo): when
 * none waits (a trainer lost after the step's last collective), the
 * survivors have the whole result, apply it and end the step, and voiding
 * it then would make them apply it twice; a later collective of the step
 * still answers RINGD_ERESHAPE (dmn__step_coll) and voids it there.
 */
static void fail_posted(dmn_t *d, int32_t status, int redo)
{
    /* The head of every queue that the backend holds completes in
     * coll_done; only a mismatch comes while one is in flight. */
    uint32_t keep = d->coll_in_flight && !redo ? d->coll_nsegs : 0;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_POSTED)
            continue;
        answer_queue(c, keep, status);
        if (redo)
            leave_to_redo(d, c);
        else if (c->q_len == 0)
            dmn__conn_set_state(c, DMN_CONN_ACTIVE);
    }
}

static void check_done(dmn_t *d)
{
    if (dmn_done(d)) {
        set_status(d, "drained at step %llu", d->step);
        uv_stop(d->loop);
    }
}

static void on_leave(void *arg, int status)
{
    dmn_t *d = arg;
    if (status != 0)
        RD_WARN("leaving the job: %s", st_strerror(status));
    d->flags |= DMN_F_LEAVE_DONE;
    check_done(d);
}

/*
 * The one transition function: exit/entry actions of every state change.
 */
static void step_set_state(dmn_t *d, dmn_step_state_t to)
{
    dmn_step_state_t from = d->state;
    if (from == to || from == DMN_STEP_DRAINED)
        return;
    RD_DEBUG("step %llu: %s -> %s", (unsigned long long)d->step,
             dmn__step_state_name(from), dmn__step_state_name(to));
    d->state = to;
    switch (to) {
    case DMN_STEP_BROKEN:
        d->stats.aborted_steps++;
        if (d->break_ms == 0)
            d->break_ms = dmn__now_ms();
        d->flags &= ~DMN_F_BREAK_PENDING;
        fail_posted(d, RINGD_ERESHAPE, 1);
        break;
    case DMN_STEP_DRAINED:
        RD_INFO("drained at step %llu: telling trainers to stop",
                (unsigned long long)d->step);
        for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
            if (c->cstate != DMN_CONN_WAITING)
                continue;
            dmn__conn_set_state(c, DMN_CONN_SHUTDOWN);
            dmn__reply_status(c, PROTO_T_STEP_BEGIN, c->begin_seq,
                              RINGD_ESHUTDOWN);
        }
        if (d->be->ops->leave(d->be, on_leave, d) != 0)
            d->flags |= DMN_F_LEAVE_DONE;
        check_done(d);
        break;
    default:
        break;
    }
}

/*
 * Keep the job's state as of this step boundary, for a trainer that joins
 * after every local one died. Only a node that is the whole job needs it:
 * with other nodes in the view, a node left without trainers steps out,
 * and its next trainer receives the job's state from them over the ring
 * (job/README.md), so the per-step copy of the whole state region (175 ms
 * a step for 1 GiB here, on the main loop) is not paid there.
 */
static void snapshot_state(dmn_t *d)
{
    if (d->view.node_count > 1)
        return;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (!is_member(c) || !has_state(c))
            continue;
        const void *src = dmn__buf_ptr(c, c->state.buf_id, c->state.offset,
                                       c->state.bytes);
        if (src == NULL)
            return;
        if (d->snapshot_size < c->state.bytes) {
            void *p = realloc(d->snapshot, c->state.bytes);
            if (p == NULL) {
                RD_WARN("no memory for a %llu-byte state snapshot",
                        (unsigned long long)c->state.bytes);
                return;
            }
            d->snapshot = p;
            d->snapshot_size = c->state.bytes;
        }
        memcpy(d->snapshot, src, c->state.bytes);
        d->snapshot_bytes = c->state.bytes;
        d->snapshot_step = d->step + 1; /* the step it is the input of */
        return;
    }
}

/* Close the step once every trainer has left it. */
static void maybe_close(dmn_t *d)
{
    if (d->state != DMN_STEP_RUNNING && d->state != DMN_STEP_BROKEN)
        return;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        if (dmn__conn_in_step(c))
            return;
    /* Completed only if someone finished it: a step that every trainer
     * abandoned (left, or went back to redo it) is not a step. */
    if (!(d->flags & DMN_F_ANY_REDO) && d->ended > 0) {
        d->stats.steps++;
        d->be->ops->step_end(d->be, d->step);
        snapshot_state(d);
        if (d->break_ms != 0) {
            double s = (double)(dmn__now_ms() - d->break_ms) / 1e3;
            d->stats.recoveries++;
            d->stats.recovery_seconds_sum += s;
            d->stats.last_recovery_seconds = s;
            dmn__metrics_observe_recovery(d, s);
            d->break_ms = 0;
        }
        d->step++;
        dmn__ckpt_boundary(d, d->step);
    }
    step_set_state(d, DMN_STEP_IDLE);
    if (d->flags & DMN_F_DRAIN_REQUESTED)
        step_set_state(d, DMN_STEP_DRAINED);
    else
        try_start(d);
}

/* Copy the job's state into a joiner's region; 1 when restored. */
static int restore_joiner(dmn_t *d, dmn_conn_t *j)
{
    if (!has_state(j))
        return 0;
    void *dst = dmn__buf_ptr(j, j->state.buf_id, j->state.offset,
                             j->state.bytes);
    const void *src = NULL;
    for (dmn_conn_t *c = d->conns; c != NULL && src == NULL; c = c->next)
        if (is_member(c) && has_state(c) &&
            c->state.bytes == j->state.bytes)
            src = dmn__buf_ptr(c, c->state.buf_id, c->state.offset,
                               c->state.bytes);
    if (src == NULL && d->snapshot_bytes == j->state.bytes &&
        d->snapshot_step == d->step)
        src = d->snapshot;
    if (src == NULL || dst == NULL)
        return 0;
    memcpy(dst, src, j->state.bytes);
    d->stats.restores++;
    RD_INFO("client %u: state restored (%llu bytes, step %llu)", j->id,
            (unsigned long long)j->state.bytes, (unsigned long long)d->step);
    return 1;
}

/* Start a step if every member and at least the gathering quorum wait. */
static void try_start(dmn_t *d)
{
    if (d->state != DMN_STEP_IDLE)
        return;
    uint32_t waiting = 0, members = 0;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        int w = c->cstate == DMN_CONN_WAITING;
        if (is_member(c) && !w)
            return; /* a member is still busy with the last step */
        waiting += w;
        members += is_member(c);
    }
    /* --trainers N gathers N trainers before a job (re)starts from no
     * member; afterwards trainers may leave and join at boundaries. */
    if (waiting == 0 || (members == 0 && waiting < d->cfg->trainers))
        return;

    maybe_restore(d);
    d->be->ops->set_local_trainers(d->be, waiting);
    if (d->be->ops->ready != NULL) {
        int r = d->be->ops->ready(d->be, on_backend_ready, d);
        if (r == 0) {
            set_status(d, "waiting for the job's view (step %llu)", d->step);
            return; /* on_backend_ready calls try_start again */
        }
        if (r < 0) {
            RD_WARN("backend cannot start a step: %s", st_strerror(r));
            return;
        }
    }
    d->be->ops->get_view(d->be, &d->view);
    if (d->last_generation != 0 && d->view.generation != d->last_generation)
        d->stats.view_changes++;
    d->last_generation = d->view.generation;
    d->step = d->view.step;
    dmn__ckpt_prepare(d);
    d->flags &= ~DMN_F_ANY_REDO;
    d->ended = 0;
    step_set_state(d, DMN_STEP_RUNNING);

    uint32_t rank = 0;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_WAITING)
            continue;
        int restored = (d->flags & DMN_F_RESTORED_PENDING) != 0;
        if (!is_member(c)) {
            restored |= restore_joiner(d, c);
            d->stats.trainers_joined++;
        }
        c->local_rank = rank++;
        dmn__conn_set_state(c, DMN_CONN_ACTIVE);
        proto_step_rep_t r = {0, d->view.rank_offset + c->local_rank,
                              d->view.global_trainers, c->local_rank,
                              waiting, (uint32_t)restored, d->step,
                              d->view.generation};
        (void)dmn__reply(c, PROTO_T_STEP_BEGIN, c->begin_seq, &r, sizeof(r));
    }
    d->flags &= ~DMN_F_RESTORED_PENDING;
    /* Members are marked after the loop so that joiners restore only from
     * trainers that finished the previous step. */
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        if (dmn__conn_in_step(c))
            c->flags |= DMN_CONN_F_MEMBER;
    set_status(d, "training: step %llu", d->step);
}

void dmn__step_begin(dmn_t *d, dmn_conn_t *c, uint32_t seq)
{
    c->flags &= ~DMN_CONN_F_STALLED;
    if (d->state == DMN_STEP_DRAINED) {
        dmn__conn_set_state(c, DMN_CONN_SHUTDOWN);
        dmn__reply_status(c, PROTO_T_STEP_BEGIN, seq, RINGD_ESHUTDOWN);
        check_done(d);
        return;
    }
    if (dmn__conn_in_step(c)) {
        /* Abandoning a step without step_end: the others cannot finish
         * it consistently, so everyone redoes it. */
        RD_WARN("client %u restarted step %llu without ending it", c->id,
                (unsigned long long)d->step);
        /* Its collectives are answered before this STEP_BEGIN is. One
         * may be with the backend: the break waits for it, and its
         * buffers stay mapped until then (dmn__buf_unmap). */
        answer_queue(c, 0, RINGD_ERESHAPE);
        leave_to_redo(d, c);
        if (d->state == DMN_STEP_RUNNING)
            step_set_state(d, DMN_STEP_BROKEN);
        else if (d->state == DMN_STEP_REDUCING)
            d->flags |= DMN_F_BREAK_PENDING;
    }
    c->flags &= ~DMN_CONN_F_REDO;
    c->begin_seq = seq;
    dmn__conn_set_state(c, DMN_CONN_WAITING);
    maybe_close(d);
    try_start(d);
}

static int coll_matches(const proto_coll_req_t *a, const proto_coll_req_t *b)
{
    return a->kind == b->kind && a->coll_seq == b->coll_seq &&
           a->count == b->count && a->dtype == b->dtype &&
           (!proto_coll_is_allreduce(a->kind) || a->op == b->op) &&
           (a->kind != PROTO_COLL_BROADCAST || a->root == b->root);
}

void dmn__buf_unmap(dmn_t *d, void *addr, size_t size)
{
    if (!d->coll_in_flight) {
        munmap(addr, size);
        return;
    }
    if (d->nheld == d->held_cap) {
        uint32_t cap = d->held_cap ? 2 * d->held_cap : 4;
        struct dmn_held *p = realloc(d->held, cap * sizeof(*p));
        if (p == NULL) {
            /* Unmapping under the backend's thread could crash the
             * daemon: losing the address space is the lesser evil. */
            RD_WARN("no memory to defer an unmap: %zu bytes stay mapped",
                    size);
            return;
        }
        d->held = p;
        d->held_cap = cap;
    }
    d->held[d->nheld++] = (struct dmn_held){addr, size};
}

void dmn__held_release(dmn_t *d)
{
    for (uint32_t i = 0; i < d->nheld; i++)
        munmap(d->held[i].addr, d->held[i].size);
    d->nheld = 0;
}

/*
 * The backend is done. An allreduce's result is already in every
 * trainer's buffer (the backend wrote it back, job_reduce_t); a broadcast
 * is copied out of staging unless it ran in the one trainer's buffer.
 */
static void coll_done(void *arg, int status)
{
    dmn_t *d = arg;
    d->coll_in_flight = 0;
    dmn__held_release(d);
    if (d->state != DMN_STEP_REDUCING)
        return;
    const proto_coll_req_t *r = &d->coll;
    size_t esz = proto_dtype_size(r->dtype);
    if (status != 0) {
        int32_t wire = status == ST_ERESHAPE  ? RINGD_ERESHAPE
                       : status == ST_EFENCED ? RINGD_EFENCED
                                              : RINGD_EABORTED;
        if (status != ST_ERESHAPE)
            RD_WARN("collective %u of step %llu failed: %s", r->coll_seq,
                    (unsigned long long)d->step, st_strerror(status));
        d->stats.coll_errors++;
        fail_posted(d, wire, 1);
        step_set_state(d, DMN_STEP_BROKEN);
        maybe_close(d);
        return;
    }
    uint32_t g = d->coll_nsegs;
    int copy_out = !d->coll_direct && g == 1 &&
                   (r->kind == PROTO_COLL_BROADCAST ||
                    d->coll_bufs[0] == d->staging);
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_POSTED)
            continue;
        const dmn_qcoll_t *e = dmn__conn_q(c, 0);
        void *dst = dmn__buf_ptr(c, e->req.buf_id, e->req.offset,
                                 r->count * esz);
        if (dst != NULL && copy_out)
            memcpy(dst, d->staging, r->count * esz);
        for (uint32_t s = 0; s < g && c->q_len > 0; s++) {
            uint32_t msg_seq = dmn__conn_q(c, 0)->msg_seq;
            c->q_head = (c->q_head + 1) % PROTO_MAX_OUTSTANDING;
            if (--c->q_len == 0)
                dmn__conn_set_state(c, DMN_CONN_ACTIVE);
            dmn__reply_status(c, PROTO_T_COLL, msg_seq, 0);
        }
    }
    double secs = (double)(rd_now_ns() - d->coll_start_ns) / 1e9;
    uint64_t bytes = r->count * esz;
    uint32_t n = d->view.node_count;
    d->stats.collectives += g;
    d->stats.coll_fused += g > 1 ? g : 0;
    d->stats.coll_zero_copy += d->coll_direct;
    d->stats.coll_bytes += bytes;
    d->stats.coll_seconds += secs;
    if (proto_coll_is_allreduce(r->kind) && secs > 0)
        d->stats.last_busbw = (double)bytes / secs * 2.0 * (n - 1) / n;
    step_set_state(d, DMN_STEP_RUNNING);
    if (d->flags & DMN_F_BREAK_PENDING)
        step_set_state(d, DMN_STEP_BROKEN);
    else
        try_launch(d); /* the next one queued: no round trip between */
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
 * The posted trainers' buffers, in local-rank order, into d->coll_bufs;
 * returns how many. *root_p: the index of a broadcast's root among them,
 * or -1 when it is on another node.
 */
static uint32_t gather_bufs(dmn_t *d, size_t bytes, int *root_p)
{
    const proto_coll_req_t *r = &d->coll;
    uint32_t n = 0;
    *root_p = -1;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_POSTED)
            continue;
        if (r->kind == PROTO_COLL_BROADCAST &&
            d->view.rank_offset + c->local_rank == r->root)
            *root_p = (int)n;
        const proto_coll_req_t *q = &dmn__conn_q(c, 0)->req;
        d->coll_bufs[n++] = dmn__buf_ptr(c, q->buf_id, q->offset, bytes);
    }
    return n;
}

/*
 * A fused group of g allreduces: every posted trainer's g buffers into
 * d->coll_bufs, trainer-major, their element counts into d->seg_counts
 * (the same for all: matched), and d->coll.count becomes the total.
 * Returns the number of trainers.
 */
static uint32_t gather_fused(dmn_t *d, uint32_t g)
{
    size_t esz = proto_dtype_size(d->coll.dtype), total = 0;
    uint32_t n = 0;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_POSTED)
            continue;
        for (uint32_t s = 0; s < g; s++) {
            const proto_coll_req_t *q = &dmn__conn_q(c, s)->req;
            d->coll_bufs[n * g + s] = dmn__buf_ptr(c, q->buf_id, q->offset,
                                                   q->count * esz);
            if (n == 0) {
                d->seg_counts[s] = q->count;
                total += q->count;
            }
        }
        n++;
    }
    d->coll.count = total;
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
        return n * proto_dtype_size(d->coll.dtype);
    }
    return 0;
}

/*
 * Everyone posted: hand the node's buffers to the backend. With one
 * trainer the collective runs in its buffer (zero-copy); with several the
 * backend reduces them into staging and writes the result back, on its
 * own thread; a fused group always goes through staging, gathered and
 * scattered there. Only a broadcast to several trainers copies here.
 */
static void launch(dmn_t *d)
{
    const proto_coll_req_t *r = &d->coll;
    uint32_t g = d->coll_nsegs;
    size_t bytes = g > 1 ? fused_bytes(d, g)
                         : r->count * proto_dtype_size(r->dtype);
    uint32_t posted = 0;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        posted += c->cstate == DMN_CONN_POSTED;
    size_t cap = d->coll_bufs_cap, scap = d->staging_size;
    int direct = posted == 1 && d->zero_copy && g == 1;
    if (grow((void **)&d->coll_bufs, &cap, (posted ? posted : 1) * g,
             sizeof(void *)) != 0 ||
        (g > 1 && grow((void **)&d->seg_counts, &d->seg_counts_cap, g,
                       sizeof(size_t)) != 0) ||
        (!direct && grow(&d->staging, &scap, bytes, 1) != 0)) {
        fail_posted(d, RINGD_ENOMEM, 0);
        return;
    }
    d->coll_bufs_cap = (uint32_t)cap;
    d->staging_size = scap;
    int root = -1;
    uint32_t n = g > 1 ? gather_fused(d, g) : gather_bufs(d, bytes, &root);
    kern_op_t op = r->op == RINGD_AVG ? KERN_SUM : (kern_op_t)r->op;
    void *buf = d->staging;
    if (r->kind == PROTO_COLL_BROADCAST) {
        /* The one trainer's buffer is sent from or received into. */
        if (direct)
            buf = d->coll_bufs[0];
        else if (root >= 0)
            memcpy(d->staging, d->coll_bufs[root], bytes);
    } else if (!direct && g == 1) {
        /* The copying path: one buffer, copied in here and out in
         * coll_done, or several that the backend sums into staging. */
        if (n == 1) {
            memcpy(d->staging, d->coll_bufs[0], bytes);
            d->coll_bufs[0] = d->staging;
        }
    }
    d->coll_direct = direct;
    step_set_state(d, DMN_STEP_REDUCING);
    d->coll_start_ns = rd_now_ns();
    d->coll_in_flight = 1;
    int rc;
    if (r->kind == PROTO_COLL_BROADCAST) {
        rc = d->be->ops->broadcast(d->be, buf, bytes, r->root, coll_done,
                                   d);
    } else {
        job_reduce_t red = {.bufs = d->coll_bufs, .nbufs = n,
                            .staging = d->staging, .count = r->count,
                            .dt = (kern_dtype_t)r->dtype, .op = op,
                            .avg_divisor = r->op == RINGD_AVG
                                               ? d->view.global_trainers
                                               : 0,
                            .nsegs = g, .seg_counts = d->seg_counts};
        rc = d->be->ops->allreduce(d->be, &red, coll_done, d);
    }
    if (rc != 0)
        coll_done(d, rc);
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
    d->coll = dmn__conn_q(first, 0)->req;
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
        answer_queue(c, 0, RINGD_ERESHAPE);
        leave_to_redo(d, c);
        dmn__reply_status(c, PROTO_T_COLL, seq, RINGD_ERESHAPE);
        maybe_close(d);
        return;
    }
    if (!dmn__conn_in_step(c) || (d->state != DMN_STEP_RUNNING &&
                                  d->state != DMN_STEP_REDUCING)) {
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
        fail_posted(d, RINGD_EMISMATCH, 0);
        dmn__reply_status(c, PROTO_T_COLL, seq, RINGD_EMISMATCH);
        return;
    }
    if (c->q_len > 0) {
        const proto_coll_req_t *prev = &dmn__conn_q(c, c->q_len - 1)->req;
        if (prev->kind == PROTO_COLL_ALLREDUCE_MORE &&
            (!proto_coll_is_allreduce(req->kind) ||
             req->dtype != prev->dtype || req->op != prev->op)) {
            dmn__reply_error(c, seq, RINGD_EINVAL, "a fused group must be "
                             "allreduces of one dtype and op");
            return;
        }
    }
    dmn_qcoll_t *e = dmn__conn_q(c, c->q_len++);
    e->msg_seq = seq;
    e->req = *req;
    dmn__conn_set_state(c, DMN_CONN_POSTED);
    try_launch(d);
}

void dmn__step_end(dmn_t *d, dmn_conn_t *c, uint32_t seq)
{
    if (c->flags & DMN_CONN_F_STALLED) {
        /* It had its results and was timed out before step_end: the step
         * did not count here, so it is not done; the next step_begin
         * brings the trainer back as a joiner with the job's state. */
        c->flags &= ~DMN_CONN_F_STALLED;
        dmn__reply_status(c, PROTO_T_STEP_END, seq, RINGD_ERESHAPE);
        return;
    }
    if (!dmn__conn_in_step(c) || c->q_len > 0) {
        dmn__reply_error(c, seq, RINGD_ESTATE, "step_end outside a step "
                         "or with collectives outstanding");
        return;
    }
    if (any_queued(d)) {
        RD_WARN("client %u ended step %llu while others wait in a "
                "collective", c->id, (unsigned long long)d->step);
        fail_posted(d, RINGD_EMISMATCH, 0);
    }
    dmn__conn_set_state(c, DMN_CONN_IDLE);
    d->ended++;
    dmn__reply_status(c, PROTO_T_STEP_END, seq, 0);
    maybe_close(d);
}

void dmn__step_conn_lost(dmn_t *d, dmn_conn_t *c)
{
    int counted = dmn__conn_counted(c), bye = (c->flags & DMN_CONN_F_BYE);
    if (counted) {
        if (bye) {
            RD_INFO("trainer %u (pid %d) left", c->id, (int)c->pid);
        } else {
            d->stats.trainers_lost++;
            RD_WARN("trainer %u (pid %d) lost at step %llu (%s)", c->id,
                    (int)c->pid, (unsigned long long)d->step,
                    dmn__step_state_name(d->state));
        }
    }
    int in_step = dmn__conn_in_step(c);
    dmn__conn_set_state(c, DMN_CONN_CLOSED);
    if (in_step) {
        if (d->state == DMN_STEP_RUNNING)
            step_set_state(d, DMN_STEP_BROKEN);
        else if (d->state == DMN_STEP_REDUCING)
            d->flags |= DMN_F_BREAK_PENDING;
    }
    if (counted && !bye && d->state != DMN_STEP_DRAINED &&
        d->be->ops->trainer_lost != NULL) {
        uint32_t remaining = 0;
        for (dmn_conn_t *o = d->conns; o != NULL; o = o->next)
            remaining += o != c && dmn__conn_counted(o);
        d->be->ops->trainer_lost(d->be, in_step, remaining);
    }
    if (d->state == DMN_STEP_DRAINED) {
        check_done(d);
        return;
    }
    maybe_close(d);
    try_start(d);
}

/*
 * --step-timeout: a trainer whose turn it is (ACTIVE: it began the step or
 * got a collective's result) and that sent nothing for that long holds up
 * the whole job. It leaves the step as if lost, but its connection stays:
 * the node breaks the step, the backend is told (no trainer left: the
 * node steps out of the job, so the others go on), and the trainer's next
 * call finds RINGD_ERESHAPE and comes back through step_begin as a joiner.
 */
static void stall(dmn_t *d, dmn_conn_t *c, uint64_t idle_ms)
{
    d->stats.trainers_stalled++;
    RD_WARN("trainer %u (pid %d) sent nothing for %llu ms in step %llu "
            "(--step-timeout %u): taking it out of the step; it rejoins at "
            "its next call", c->id, (int)c->pid,
            (unsigned long long)idle_ms, (unsigned long long)d->step,
            d->cfg->step_timeout_ms);
    c->flags |= DMN_CONN_F_STALLED;
    c->flags &= ~DMN_CONN_F_MEMBER;
    leave_to_redo(d, c);
    if (d->state == DMN_STEP_RUNNING)
        step_set_state(d, DMN_STEP_BROKEN);
    if (d->be->ops->trainer_lost != NULL) {
        uint32_t remaining = 0;
        for (dmn_conn_t *o = d->conns; o != NULL; o = o->next)
            remaining += dmn__conn_counted(o);
        d->be->ops->trainer_lost(d->be, 1, remaining);
    }
    maybe_close(d);
    try_start(d);
}

static void on_stall_check(uv_timer_t *t)
{
    dmn_t *d = t->data;
    uint64_t now = dmn__now_ms();
    if (d->state == DMN_STEP_DRAINED)
        return;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate == DMN_CONN_ACTIVE &&
            now - c->active_ms >= d->cfg->step_timeout_ms) {
            stall(d, c, now - c->active_ms);
            return; /* the list may have changed: next tick */
        }
    }
}

void dmn__step_stall_start(dmn_t *d)
{
    uint32_t ms = d->cfg->step_timeout_ms;
    if (ms == 0)
        return;
    uint32_t every = ms / 4 < 50 ? 50 : ms / 4;
    uv_timer_start(&d->stall_timer, on_stall_check, every, every);
}

/* The first trainer with a state region, members first: the one whose
 * state the backend sends and replaces. */
static dmn_conn_t *state_primary(dmn_t *d, void **ptr_p)
{
    for (int pass = 0; pass < 2; pass++)
        for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
            if (!has_state(c) || (pass == 0 ? !is_member(c)
                                            : c->cstate != DMN_CONN_WAITING))
                continue;
            *ptr_p = dmn__buf_ptr(c, c->state.buf_id, c->state.offset,
                                  c->state.bytes);
            if (*ptr_p != NULL)
                return c;
        }
    return NULL;
}

void dmn__step_get_state(void *arg, void **ptr_p, size_t *bytes_p)
{
    void *p = NULL;
    dmn_conn_t *c = state_primary(arg, &p);
    *ptr_p = c ? p : NULL;
    *bytes_p = c ? (size_t)c->state.bytes : 0;
}

/* The backend replaced the primary state: give every local trainer the
 * same bytes, so the node's replicas stay identical. */
static void propagate_state(dmn_t *d)
{
    void *src = NULL;
    dmn_conn_t *p = state_primary(d, &src);
    if (p == NULL)
        return;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c == p || !has_state(c) || c->state.bytes != p->state.bytes)
            continue;
        void *dst = dmn__buf_ptr(c, c->state.buf_id, c->state.offset,
                                 c->state.bytes);
        if (dst != NULL)
            memcpy(dst, src, p->state.bytes);
    }
    d->stats.restores++;
}

/*
 * A node's first step start, once its trainers registered their state:
 * the newest usable checkpoint, if any, becomes the state and the step.
 */
static void maybe_restore(dmn_t *d)
{
    void *state;
    size_t bytes;
    if ((d->flags & DMN_F_RESTORE_CHECKED) || d->ckpt_root == NULL)
        return;
    dmn__step_get_state(d, &state, &bytes);
    if (state == NULL)
        return; /* no state registered yet: look again next time */
    d->flags |= DMN_F_RESTORE_CHECKED;
    uint64_t step;
    if (dmn__ckpt_restore(d, &step) != 0)
        return;
    propagate_state(d);
    d->flags |= DMN_F_RESTORED_PENDING;
    if (d->be->ops->set_step != NULL)
        d->be->ops->set_step(d->be, step);
}

static void on_backend_ready(void *arg, int status)
{
    dmn_t *d = arg;
    if (status != 0)
        RD_WARN("backend not ready: %s", st_strerror(status));
    try_start(d);
}

void dmn__step_on_view(void *arg, const job_view_t *view)
{
    dmn_t *d = arg;
    if (view->restored) {
        propagate_state(d);
        d->flags |= DMN_F_RESTORED_PENDING;
    }
    if (d->state == DMN_STEP_RUNNING &&
        view->generation != d->view.generation) {
        step_set_state(d, DMN_STEP_BROKEN);
        maybe_close(d);
    }
}

void dmn__step_force_drained(dmn_t *d)
{
    d->state = DMN_STEP_DRAINED; /* final, no actions: we exit now */
}

void dmn__step_drain(dmn_t *d)
{
    d->flags |= DMN_F_DRAIN_REQUESTED;
    if (d->state == DMN_STEP_IDLE)
        step_set_state(d, DMN_STEP_DRAINED);
}

int dmn_done(const dmn_t *d)
{
    if (d->state != DMN_STEP_DRAINED || !(d->flags & DMN_F_LEAVE_DONE))
        return 0;
    if (d->flags & DMN_F_DRAIN_TIMED_OUT)
        return 1;
    for (const dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        if (is_member(c) && c->cstate != DMN_CONN_SHUTDOWN)
            return 0;
    return 1;
}
