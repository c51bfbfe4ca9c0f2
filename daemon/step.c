/*
 * step.c - the node's step state machine.
 *
 * A step starts when every member trainer of the node (those that took part
 * in an earlier step and are still connected) and any joiner has called
 * step_begin; joiners are only admitted there, at a step boundary, and get
 * the job's state copied into their state region. The collectives within a
 * step are step-queue.c's.
 *
 * Anything that invalidates the step's view (a backend view change, a lost
 * trainer) breaks the step: pending and later collectives of the step
 * answer RINGD_ERESHAPE and the trainers redo it. The step closes when
 * every trainer has left it, by step_end (done) or step_begin (redo).
 * All state changes go through dmn__step_set_state().
 */
#include "daemon/step-int.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "kernels/kern.h"

/* The wire enums are the kernels' enums. */
_Static_assert(RINGD_F32 == (int)KERN_F32 && RINGD_U8 == (int)KERN_U8 &&
                   RINGD_BF16 == (int)KERN_BF16,
               "ringd_dtype_t must match kern_dtype_t");
/* A request's op goes to the job as it comes (step-queue.c's launch). */
_Static_assert(RINGD_SUM == (int)KERN_SUM && RINGD_PROD == (int)KERN_PROD &&
                   RINGD_MIN == (int)KERN_MIN && RINGD_MAX == (int)KERN_MAX &&
                   RINGD_AVG == (int)KERN_AVG &&
                   RINGD_AVG + 1 == (int)KERN_OP_COUNT,
               "ringd_op_t must match kern_op_t");

static void try_start(dmn_t *d);
static void on_backend_ready(void *arg, int status);
static int maybe_restore(dmn_t *d);

/* c leaves the step it is in to redo it: the step cannot complete. */
void dmn__step_leave_to_redo(dmn_t *d, dmn_conn_t *c)
{
    dmn__conn_set_state(c, DMN_CONN_IDLE);
    c->flags |= DMN_CONN_F_REDO;
    d->flags |= DMN_F_ANY_REDO;
}

/* Answer c's queued collectives from the keep-th on with status, oldest
 * first, and forget them. */
void dmn__step_answer_queue(dmn_conn_t *c, uint32_t keep, int32_t status)
{
    for (uint32_t i = keep; i < c->q_len; i++)
        dmn__reply_status(c, PROTO_T_COLL, dmn__conn_q(c, i)->msg_seq,
                          status);
    if (c->q_len > keep)
        c->q_len = keep;
}

/*
 * Reply to every trainer whose collective is pending, and forget it. The
 * step is void only if someone is told to redo it (leave_to_redo): when
 * none waits (a trainer lost after the step's last collective), the
 * survivors have the whole result, apply it and end the step, and voiding
 * it then would make them apply it twice; a later collective of the step
 * still answers RINGD_ERESHAPE (dmn__step_coll) and voids it there.
 */
void dmn__step_fail_posted(dmn_t *d, int32_t status, int redo)
{
    /* The head of every queue that the backend holds completes in
     * coll_done; only a mismatch comes while one is in flight. */
    uint32_t keep =
        dmn__maps_held(d, DMN_MAPS_COLL) && !redo ? d->coll_nsegs : 0;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_POSTED)
            continue;
        dmn__step_answer_queue(c, keep, status);
        if (redo)
            dmn__step_leave_to_redo(d, c);
        else if (c->q_len == 0)
            dmn__conn_set_state(c, DMN_CONN_ACTIVE);
    }
}

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

#define S_(x) (1u << DMN_STEP_##x)
/* The states each step state may go to. REDUCING ends only when its
 * collective comes back (coll_done); DRAINED is final (the exit's
 * dmn__step_force_drained is the one move outside this table). */
static const unsigned step_next_ok[] = {
    [DMN_STEP_IDLE] = S_(RUNNING) | S_(DRAINED),
    [DMN_STEP_RUNNING] = S_(REDUCING) | S_(BROKEN) | S_(COMMITTING) |
                         S_(IDLE),
    [DMN_STEP_REDUCING] = S_(RUNNING) | S_(ABORTING) | S_(BROKEN),
    [DMN_STEP_ABORTING] = S_(BROKEN),
    [DMN_STEP_BROKEN] = S_(COMMITTING) | S_(IDLE),
    [DMN_STEP_COMMITTING] = S_(IDLE),
    [DMN_STEP_DRAINED] = 0,
};
#undef S_

/*
 * The one transition function: exit/entry actions of every state change,
 * and a refusal (logged, nothing done) of a move the table has not.
 */
void dmn__step_set_state(dmn_t *d, dmn_step_state_t to)
{
    dmn_step_state_t from = d->state;
    if (from == to)
        return;
    if (!(step_next_ok[from] & (1u << to))) {
        if (from != DMN_STEP_DRAINED) /* a late event after the drain */
            RD_ERROR("step %llu: %s -> %s refused",
                     (unsigned long long)d->step, dmn__step_state_name(from),
                     dmn__step_state_name(to));
        return;
    }
    RD_DEBUG("step %llu: %s -> %s", (unsigned long long)d->step,
             dmn__step_state_name(from), dmn__step_state_name(to));
    d->state = to;
    switch (to) {
    case DMN_STEP_BROKEN:
        d->stats.aborted_steps++;
        if (d->break_ms == 0)
            d->break_ms = dmn__now_ms();
        dmn__step_fail_posted(d, RINGD_ERESHAPE, 1);
        break;
    case DMN_STEP_DRAINED:
        RD_INFO("drained at step %llu: %s", (unsigned long long)d->step,
                dmn_restarting(d) ? "restarting, trainers wait for the "
                                    "next ringd"
                                  : "telling trainers to stop");
        for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
            if (c->cstate != DMN_CONN_WAITING || dmn_restarting(d))
                continue;
            dmn__conn_set_state(c, DMN_CONN_SHUTDOWN);
            dmn__reply_status(c, PROTO_T_STEP_BEGIN, c->begin_seq,
                              RINGD_ESHUTDOWN);
        }
        if (dmn_restarting(d))
            dmn__ckpt_restart_take(d);
        if (job_leave(d->job, on_leave, d) != 0)
            d->flags |= DMN_F_LEAVE_DONE;
        check_done(d);
        break;
    default:
        break;
    }
}

/* Whether the backend must commit a step before its step_ends are
 * answered: a job of several nodes (job.h, commit). */
static int commit_needed(const dmn_t *d)
{
    return job_commits(d->job) && d->view.node_count > 1 &&
           d->view.commit;
}

/* The step counts: the boundary's bookkeeping and checkpoint. */
static void step_counted(dmn_t *d)
{
    d->stats.steps++;
    dmn__state_boundary(d);
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

/* Answer the held step_ends with rc, then on to the next step. */
static void step_closed(dmn_t *d, int rc)
{
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (!(c->flags & DMN_CONN_F_END_HELD))
            continue;
        c->flags &= ~DMN_CONN_F_END_HELD;
        c->active_ms = dmn__now_ms(); /* its turn: the next step_begin */
        dmn__reply_status(c, PROTO_T_STEP_END, c->end_seq, rc);
    }
    dmn__step_set_state(d, DMN_STEP_IDLE);
    dmn__step_stall_arm(d);
    if (d->flags & DMN_F_DRAIN_REQUESTED)
        dmn__step_set_state(d, DMN_STEP_DRAINED);
    else
        try_start(d);
}

static void on_committed(void *arg, int status)
{
    dmn_t *d = arg;
    if (d->state != DMN_STEP_COMMITTING)
        return; /* shutting down */
    if (status != 0) {
        d->stats.uncommitted_steps++;
        RD_WARN("step %llu ended here but is not committed (%s): the "
                "trainers redo it with the job's state",
                (unsigned long long)d->step, st_strerror(status));
        step_closed(d, status == ST_EFENCED ? RINGD_EFENCED
                                            : RINGD_ERESHAPE);
        return;
    }
    step_counted(d);
    step_closed(d, 0);
}

void dmn__step_break(dmn_t *d)
{
    if (d->state == DMN_STEP_RUNNING)
        dmn__step_set_state(d, DMN_STEP_BROKEN);
    else if (d->state == DMN_STEP_REDUCING)
        dmn__step_set_state(d, DMN_STEP_ABORTING);
}

/* Close the step once every trainer has left it. */
void dmn__step_maybe_close(dmn_t *d)
{
    if (d->state != DMN_STEP_RUNNING && d->state != DMN_STEP_BROKEN)
        return;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        if (dmn__conn_in_step(c))
            return;
    /* Completed only if someone finished it: a step that every trainer
     * abandoned (left, or went back to redo it) is not a step. */
    if (!(d->flags & DMN_F_ANY_REDO) && d->ended > 0) {
        job_step_end(d->job, d->step);
        if (commit_needed(d)) {
            dmn__step_set_state(d, DMN_STEP_COMMITTING);
            int rc = job_commit(d->job, on_committed, d);
            if (rc == 0)
                return; /* on_committed goes on */
            on_committed(d, rc);
            return;
        }
        step_counted(d);
    }
    step_closed(d, 0);
}

void dmn__step_try_start(dmn_t *d)
{
    try_start(d);
}

/* What no retry mends: the waiting trainers' step_begin fails with it. */
static void fail_waiting(dmn_t *d, int32_t code, const char *why)
{
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_WAITING)
            continue;
        dmn__conn_set_state(c, DMN_CONN_IDLE);
        dmn__reply_error(c, c->begin_seq, code, "%s", why);
    }
}

/* Start a step if every member and at least the gathering quorum wait. */
static void try_start(dmn_t *d)
{
    if (d->state != DMN_STEP_IDLE)
        return;
    uint32_t waiting = 0, members = 0;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        int w = c->cstate == DMN_CONN_WAITING;
        if (dmn__conn_is_member(c) && !w)
            return; /* a member is still busy with the last step */
        waiting += w;
        members += dmn__conn_is_member(c);
    }
    /* --trainers N gathers N trainers before a job (re)starts from no
     * member; afterwards trainers may leave and join at boundaries. */
    if (waiting == 0 || (members == 0 && waiting < d->cfg->trainers))
        return;

    if (maybe_restore(d) || dmn__state_fill_joiners(d))
        return; /* the copy's end calls try_start again */
    job_set_local_trainers(d->job, waiting);
    int r = job_ready(d->job, on_backend_ready, d);
    if (r == 0) {
        set_status(d, "waiting for the job's view (step %llu)", d->step);
        return; /* on_backend_ready calls try_start again */
    }
    if (r < 0) {
        RD_WARN("backend cannot start a step: %s", st_strerror(r));
        if (r == ST_EMISMATCH)
            fail_waiting(d, RINGD_EMISMATCH,
                         "the trainers' states differ in size across the "
                         "job's nodes: they do not run the same model "
                         "(see the daemons' logs)");
        return;
    }
    job_get_view(d->job, &d->view);
    if (d->last_generation != 0 && d->view.generation != d->last_generation)
        d->stats.view_changes++;
    d->last_generation = d->view.generation;
    d->step = d->view.step;
    dmn__ckpt_prepare(d);
    d->flags &= ~DMN_F_ANY_REDO;
    d->ended = 0;
    d->starts++;
    dmn__step_set_state(d, DMN_STEP_RUNNING);

    uint32_t rank = 0;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_WAITING)
            continue;
        int restored = (d->flags & DMN_F_RESTORED_PENDING) != 0;
        if (!dmn__conn_is_member(c)) {
            restored |= dmn__state_joiner_filled(d, c);
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
    if (d->state == DMN_STEP_DRAINED && dmn_restarting(d))
        return; /* answered by the close at exit: the client waits */
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
        dmn__step_answer_queue(c, 0, RINGD_ERESHAPE);
        dmn__step_leave_to_redo(d, c);
        dmn__step_break(d);
    }
    c->flags &= ~DMN_CONN_F_REDO;
    c->begin_seq = seq;
    dmn__conn_set_state(c, DMN_CONN_WAITING);
    dmn__step_maybe_close(d);
    try_start(d);
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
        dmn__step_fail_posted(d, RINGD_EMISMATCH, 0);
    }
    dmn__conn_set_state(c, DMN_CONN_IDLE);
    d->ended++;
    if (commit_needed(d)) {
        /* Answered once the step's fate is known (step_closed). */
        c->flags |= DMN_CONN_F_END_HELD;
        c->end_seq = seq;
    } else {
        dmn__reply_status(c, PROTO_T_STEP_END, seq, 0);
    }
    dmn__step_maybe_close(d);
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
        dmn__step_break(d);
    }
    /* The backend hears of a lost trainer, and of a clean leave (BYE) by
     * the node's last one: the other nodes would wait for this node's
     * trainers forever, so it steps out. A BYE with trainers left is a
     * count change the ring carries on its flags (the step it was in is
     * voided on every node, as any count change is), cheaper than the
     * new generation a death mid-step asks for. The daemon's own
     * teardown (which marks every connection BYE) is neither. */
    uint32_t remaining = 0;
    for (dmn_conn_t *o = d->conns; o != NULL; o = o->next)
        remaining += o != c && dmn__conn_counted(o);
    if (counted && (!bye || remaining == 0) &&
        d->state != DMN_STEP_DRAINED && !(d->flags & DMN_F_DESTROYING))
        job_trainer_lost(d->job, in_step, remaining);
    if (d->state == DMN_STEP_DRAINED) {
        check_done(d);
        return;
    }
    dmn__step_maybe_close(d);
    try_start(d);
}

/*
 * --step-timeout: a trainer whose turn it is (its_turn: inside a step, or
 * between steps once its step_end was answered) and that sent nothing for
 * that long holds up the whole job. It leaves the step as if lost (or,
 * between steps, stops being a member), but its connection stays:
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
    int in_step = dmn__conn_in_step(c);
    c->flags |= DMN_CONN_F_STALLED;
    c->flags &= ~DMN_CONN_F_MEMBER;
    if (in_step)
        dmn__step_leave_to_redo(d, c);
    dmn__step_break(d);
    uint32_t remaining = 0;
    for (dmn_conn_t *o = d->conns; o != NULL; o = o->next)
        remaining += dmn__conn_counted(o);
    job_trainer_lost(d->job, in_step, remaining);
    dmn__step_maybe_close(d);
    try_start(d);
}

/*
 * Whether it is c's turn: it began the step or got a collective's result
 * (ACTIVE), or, between steps of a job of several nodes, the node waits
 * for this member's next step_begin and its step_end has been answered:
 * the other nodes wait in their next collective for it, so a trainer
 * stopped there holds up the job as much as one stopped inside a step
 * (and the commit round makes step_end wait, so a stop lands there
 * often). Alone, a trainer resting between steps holds up nobody.
 */
static int its_turn(const dmn_t *d, const dmn_conn_t *c)
{
    return c->cstate == DMN_CONN_ACTIVE ||
           (c->cstate == DMN_CONN_IDLE && d->state == DMN_STEP_IDLE &&
            d->view.node_count > 1 && (c->flags & DMN_CONN_F_MEMBER) &&
            !(c->flags & (DMN_CONN_F_END_HELD | DMN_CONN_F_STALLED)));
}

/* The trainer whose turn began first (NULL: none). */
static dmn_conn_t *first_active(dmn_t *d)
{
    dmn_conn_t *first = NULL;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        if (its_turn(d, c) &&
            (first == NULL || c->active_ms < first->active_ms))
            first = c;
    return first;
}

static void on_stall_timer(uv_timer_t *t)
{
    dmn_t *d = t->data;
    d->stats.stall_wakeups++;
    d->stall_due_ms = 0; /* one-shot: no longer armed */
    dmn_conn_t *c = first_active(d);
    uint64_t now = dmn__now_ms();
    if (d->state != DMN_STEP_DRAINED && c != NULL &&
        now - c->active_ms >= d->cfg->step_timeout_ms)
        stall(d, c, now - c->active_ms); /* its state change re-arms */
    else
        dmn__step_stall_arm(d);
}

/*
 * One one-shot timer for the earliest deadline of the ACTIVE trainers,
 * re-armed whenever one enters or leaves ACTIVE: the loop wakes once per
 * trainer that really overran, never to poll. Deadlines are absolute
 * times on the daemon's clock (CLOCK_MONOTONIC ms, as libuv's loop time),
 * so the timer fires at the deadline or after it, never before, and the
 * callback finds the trainer due.
 */
void dmn__step_stall_arm(dmn_t *d)
{
    uint32_t ms = d->cfg->step_timeout_ms;
    if (ms == 0 || (d->flags & DMN_F_DESTROYING))
        return;
    dmn_conn_t *c = first_active(d);
    if (c == NULL || d->state == DMN_STEP_DRAINED) {
        uv_timer_stop(&d->stall_timer);
        d->stall_due_ms = 0;
        return;
    }
    uint64_t due = c->active_ms + ms;
    if (due == d->stall_due_ms)
        return; /* armed for it already */
    uint64_t now = uv_now(d->loop);
    d->stall_due_ms = due;
    uv_timer_start(&d->stall_timer, on_stall_timer, due > now ? due - now : 0,
                   0);
}

/*
 * A node's first step start, once its trainers registered their state:
 * the newest usable checkpoint, if any, becomes the state and the step,
 * decoded and copied on the pool. 1 while that runs (try_start runs
 * again when it is done).
 */
static int maybe_restore(dmn_t *d)
{
    void *state = NULL;
    if (dmn__ckpt_restoring(d))
        return 1;
    if ((d->flags & DMN_F_RESTORE_CHECKED) || !dmn__ckpt_enabled(d))
        return 0;
    dmn_conn_t *p = dmn__state_primary(d, &state);
    if (p == NULL)
        return 0; /* no state registered yet: look again next time */
    d->flags |= DMN_F_RESTORE_CHECKED;
    dmn_fill_t *f = calloc(d->nconns, sizeof(*f));
    if (f == NULL) {
        RD_WARN("no checkpoint restore: out of memory");
        return 0;
    }
    uint32_t n = dmn__state_others(d, p, f);
    int started = dmn__ckpt_restore_start(d, state, p->state.bytes, f, n);
    free(f);
    return started == 0;
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
        dmn__state_propagate(d);
        d->flags |= DMN_F_RESTORED_PENDING;
    }
    if (d->state == DMN_STEP_RUNNING &&
        view->generation != d->view.generation) {
        dmn__step_set_state(d, DMN_STEP_BROKEN);
        dmn__step_maybe_close(d);
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
        dmn__step_set_state(d, DMN_STEP_DRAINED);
}

