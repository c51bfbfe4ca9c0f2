/*
 * job_ring.c - the cross-node backend: etcd membership (mb_) on the
 * main loop, the UCX ring (ring_, tp_) on a ring thread of its own.
 *
 * Main loop                                 ring thread
 *   mb on_view / on_fenced / on_drain         owns tp_t and the ring_t
 *   the backend ops the daemon calls          runs one command at a time:
 *   one command slot ---------(mu, cv)----->    REBUILD (+ resync), ALLREDUCE,
 *   uv_async <------------------------------    BROADCAST; posts the result
 *
 * States (job_state_t in job_ring-int.h; one transition function,
 * job__ring_set_state):
 *   WAITING  no usable view yet (start, after a failure)
 *   SYNCING  a REBUILD command runs: new ring, then agree on the step and
 *            broadcast the state from the member furthest ahead
 *   READY    collectives run on the ring of the current generation
 *   FENCED   lease lost, until a view takes this node back
 *   STEPPING_OUT / STANDBY  no local trainer: out of the job until one
 *            comes back
 *   LEAVING / LEFT  draining out of the job
 *
 * Views are installed at a step start (the daemon's ready()), where the
 * nodes agree on the step and the state source, so no step is lost or
 * applied twice; a failed endpoint is suspected at once, a deadline only
 * after the lease TTL. daemon/README.md ("The ring backend") says why.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "job/job_ring-int.h"

static const char *const job_state_names[] = {
    "waiting", "syncing", "ready", "fenced", "stepping-out", "standby",
    "leaving", "left"};

#define S_(x) (1u << JOB_##x)
/* The states each state may go to. */
static const unsigned job_next_ok[] = {
    [JOB_WAITING] = S_(SYNCING) | S_(FENCED) | S_(STEPPING_OUT) |
                    S_(LEAVING),
    [JOB_SYNCING] = S_(READY) | S_(WAITING) | S_(FENCED) |
                    S_(STEPPING_OUT) | S_(LEAVING),
    [JOB_READY] = S_(WAITING) | S_(FENCED) | S_(STEPPING_OUT) | S_(LEAVING),
    /* A view still pending from before the fence may be installed. */
    [JOB_FENCED] = S_(WAITING) | S_(SYNCING) | S_(STEPPING_OUT) |
                   S_(LEAVING),
    [JOB_STEPPING_OUT] = S_(STANDBY) | S_(LEAVING),
    [JOB_STANDBY] = S_(WAITING) | S_(LEFT),
    [JOB_LEAVING] = S_(LEFT),
    [JOB_LEFT] = 0,
};
#undef S_

/* ---- main loop side ---------------------------------------------------- */


/* The one transition function: refuses a move the table does not allow
 * (loudly: it is a bug), then runs the exit and entry actions. */
void job__ring_set_state(job_ring_t *b, job_state_t next, const char *why)
{
    job_state_t prev = b->state;
    if (prev == next)
        return;
    if (!(job_next_ok[prev] & (1u << next))) {
        RD_ERROR("ring backend: %s -> %s refused (%s)",
                 job_state_names[prev], job_state_names[next], why);
        return;
    }
    RD_INFO("ring backend: %s -> %s (%s)", job_state_names[prev],
            job_state_names[next], why);
    b->state = next;
    /* Exit: the ring of the old view can no longer be used. */
    if ((prev == JOB_READY || prev == JOB_SYNCING) && next != JOB_READY &&
        next != JOB_LEAVING && job__ring_busy(b))
        job__ring_abort_running(b);
    switch (next) {
    case JOB_READY:
        uv_timer_stop(&b->suspect_timer);
        free(b->quiet_node);
        b->quiet_node = NULL;
        break;
    case JOB_STEPPING_OUT:
        /* The daemon may still wait in ready() for the trainer that died:
         * only a step start with trainers (set_local_trainers > 0)
         * rejoins. */
        b->local_trainers = 0;
        mb_view_free(b->pending);
        b->pending = NULL;
        if (mb_leave(b->mb) != 0)
            job__ring_set_state(b, JOB_STANDBY, "not registered");
        break;
    case JOB_STANDBY:
        job__ring_maybe_rejoin(b);
        break;
    default:
        break;
    }
    job__commit_check(b); /* fenced or out of the job: its verdict */
}

void job__ring_post(job_ring_t *b)
{
    pthread_mutex_lock(&b->mu);
    b->abort_flag = 0;
    b->posted = 1;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Thread-safe abort of the collective the ring thread is running. */
void job__ring_abort_running(job_ring_t *b)
{
    pthread_mutex_lock(&b->mu);
    if (b->posted) {
        b->abort_flag = 1;
        if (b->ring != NULL)
            ring_abort(b->ring);
    }
    pthread_mutex_unlock(&b->mu);
}

static void on_defer(uv_timer_t *t)
{
    job_ring_t *b = t->data;
    job_done_cb cb = b->op_cb;
    b->op_cb = NULL;
    if (cb != NULL)
        cb(b->op_arg, b->op_status);
}

/* Complete the daemon's collective on the next loop turn. */
void job__ring_complete_later(job_ring_t *b, job_done_cb cb, void *arg,
                              int status)
{
    b->op_cb = cb;
    b->op_arg = arg;
    b->op_status = status;
    uv_timer_start(&b->defer, on_defer, 0, 0);
}

/*
 * Step attempts: the trainer counts travel only when they change.
 *
 * An attempt is one run of a step on the agreed counts: it opens at the
 * step start that lets it run (op_ready returns 1) and closes when the
 * step ends (step_end) or a collective of it is void on every node. A step
 * the daemon redoes on its own (a trainer of this node left it) stays in
 * the same attempt: the other nodes are still in it. During an attempt
 * this node raises JOB_RING_F_AGREE on its collectives' messages when it
 * wants a checkpoint, and JOB_RING_F_VOID too when its trainer count is not
 * the agreed one (a trainer joined or left at a step start). A
 * collective that carries every node's flags (ring_flags_seen: an
 * allreduce or allgather of non-zero size) ends with their OR on every
 * node; whether it carries them depends on its kind and size only.
 *
 * When an attempt closes, every node decides to run AGREE at its next
 * step start iff no collective of the attempt carried the flags or their
 * OR was non-zero. Every node of a generation runs the same collectives
 * in the same order (otherwise the ring itself would not match), so all
 * see the same ORs and take the same decision; a node that misses a
 * collective (a failed ring) goes through a new view and REBUILD, which
 * agrees the counts anyway. A VOID seen fails its collective with
 * ST_ERESHAPE on every node alike: it ran with a divisor and global ranks
 * that miscount that node's trainers, so the step is redone after the
 * agreement, on the new counts.
 */
static void attempt_close(job_ring_t *b)
{
    if (!b->attempt_open)
        return;
    b->attempt_open = 0;
    if (!b->attempt_carried || b->attempt_flags != 0)
        b->agree_due = 1;
}

/* The flags this node raises in the attempt from now on. */
static unsigned my_flags(const job_ring_t *b)
{
    unsigned f = 0;
    if (b->local_trainers != b->counts[b->cur->my_index])
        f |= JOB_RING_F_VOID | JOB_RING_F_AGREE;
    if (b->ckpt_req && !b->dview.ckpt_requested)
        f |= JOB_RING_F_AGREE;
    return f;
}

/*
 * The attempt's view: the agreed counts, but this node's trainers as they
 * are, so that the ranks its trainers get fit the world they are told (a
 * trainer refuses rank >= world). Only a node whose count changed sees a
 * world that differs from the others', in an attempt that is void if it
 * holds any collective that carries the flags.
 */
static void attempt_view(job_ring_t *b)
{
    uint32_t total = 0;
    for (size_t i = 0; i < b->cur->n_members; i++)
        total += b->counts[i];
    b->dview.global_trainers =
        total - b->counts[b->cur->my_index] + b->local_trainers;
}

/* A step starts: 1, in a new attempt or the one the daemon redoes; or 0
 * with an agreement due (a one-node job agrees with itself at once, for
 * nothing, rather than run a void step). */
static int attempt_begin(job_ring_t *b)
{
    unsigned f = my_flags(b);
    if (f != 0 && b->cur->n_members == 1) {
        b->attempt_open = 0;
        b->agree_due = 1;
        return 0;
    }
    attempt_view(b);
    if (b->attempt_open) {
        b->my_flags |= f;
        return 1;
    }
    b->attempt_open = 1;
    b->attempt_carried = 0;
    b->attempt_flags = 0;
    b->my_flags = f;
    return 1;
}

/* A collective of the attempt completed: 1 when it is void. */
static int attempt_account(job_ring_t *b, const job_ring_cmd_t *c)
{
    if (!b->attempt_open || !c->flags_all)
        return 0;
    b->attempt_carried = 1;
    b->attempt_flags |= c->flags_seen;
    if (!(c->flags_seen & JOB_RING_F_VOID))
        return 0;
    RD_INFO("ring backend: a node's trainer count changed at step %llu: "
            "the step is redone on the counts agreed again",
            (unsigned long long)b->step);
    attempt_close(b);
    return 1;
}

static void on_collective_done(job_ring_t *b, job_ring_cmd_t *c)
{
    job_done_cb cb = b->op_cb;
    void *arg = b->op_arg;
    b->op_cb = NULL;
    int status = c->status;
    if (status == 0 && !mb_lease_valid(b->mb)) {
        /* Stopped past our lease (SIGSTOP, a frozen VM): the others may
         * have evicted us and redone this step without us. Finishing it
         * here would apply a step the job does not have; redo it after
         * rejoining instead (the fence timer is about to fire). */
        RD_WARN("ring backend: a collective finished after this node's "
                "lease ran out: dropped, the step is redone");
        if (b->state < JOB_STEPPING_OUT)
            job__ring_set_state(b, JOB_FENCED, "lease ran out");
        status = ST_EFENCED;
    }
    if (status == 0 && attempt_account(b, c)) {
        if (cb != NULL)
            cb(arg, ST_ERESHAPE); /* void: every node redoes the step */
        return;
    }
    int mismatch = b->mismatch_status;
    b->mismatch_status = 0;
    if (status != 0) {
        /* Whatever broke the ring, the step is redone on a new view. */
        job__ring_peer_failure(b, status, c->suspect);
        job__ring_peer_failure(b, ST_EPEER, c->suspect2);
        if (b->state == JOB_READY)
            job__ring_set_state(b, JOB_WAITING, "collective failed");
        status = b->state == JOB_FENCED ? ST_EFENCED
                 : mismatch != 0        ? mismatch
                                        : ST_ERESHAPE;
    }
    if (cb != NULL)
        cb(arg, status);
}

static void on_agreed(job_ring_t *b, job_ring_cmd_t *c)
{
    if (c->status != 0) {
        job__ring_peer_failure(b, c->status, c->suspect);
        job__ring_peer_failure(b, ST_EPEER, c->suspect2);
        if (b->state == JOB_READY)
            job__ring_set_state(b, JOB_WAITING, "agreement failed");
        return;
    }
    b->agree_due = 0;
    b->agreements++;
    job__ring_fill_dview(b);
    b->dview.ckpt_requested = (uint32_t)c->ckpt_out;
    job__ring_ready_fire(b, 0);
}


static void on_async(uv_async_t *h)
{
    job_ring_t *b = h->data;
    pthread_mutex_lock(&b->mu);
    int done = job__ring_busy(b) && !b->posted;
    job_ring_lossy_t lossy[2];
    memcpy(lossy, b->lossy, sizeof(lossy));
    memset(b->lossy, 0, sizeof(b->lossy));
    uint64_t mm_gen = b->mismatch.gen;
    uint32_t mm_rank = b->mismatch.rank;
    unsigned mm_flags = b->mismatch.flags;
    b->mismatch.gen = 0;
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < 2; i++)
        job__ring_lossy(b, lossy[i].gen, lossy[i].rank);
    if (mm_gen != 0)
        job__ring_mismatch(b, mm_gen, mm_rank, mm_flags);
    if (!done)
        return;
    job_ring_cmd_t c = b->cmd;
    b->cmd.kind = JOB_CMD_NONE;
    job__hops_cmd(b, &c);
    if (c.status == 0)
        mb_ring_progress(b->mb); /* the ride through an etcd outage */
    if (c.kind == JOB_CMD_REBUILD)
        job__ring_rebuilt(b, &c);
    else if (c.kind == JOB_CMD_AGREE)
        on_agreed(b, &c);
    else if (c.kind == JOB_CMD_COMMIT)
        job__commit_done(b, &c);
    else
        on_collective_done(b, &c);
    job__ring_advance(b);
}

/* ---- backend ops ------------------------------------------------------- */

static void op_set_local_trainers(job_t *be, uint32_t n)
{
    ((job_ring_t *)be)->local_trainers = n;
}

static void op_set_step(job_t *be, uint64_t step)
{
    job_ring_t *b = (job_ring_t *)be;
    b->step = step;
    b->dview.step = step;
}


static void op_get_view(job_t *be, job_view_t *view_p)
{
    const job_ring_t *b = (const job_ring_t *)be;
    *view_p = b->dview;
    view_p->agreements = b->agreements;
}

static int op_ready(job_t *be, job_done_cb cb, void *arg)
{
    job_ring_t *b = (job_ring_t *)be;
    if (b->state == JOB_READY && !job__ring_busy(b) && b->pending == NULL &&
        !b->agree_due && attempt_begin(b))
        return 1;
    if (b->state >= JOB_LEAVING)
        return ST_EINVAL;
    if (b->fatal != 0 && b->pending == NULL && b->cur != NULL &&
        b->cur->generation == b->fatal_gen)
        return b->fatal;
    if (b->ready_cb == NULL) {
        b->ready_cb = cb;
        b->ready_arg = arg;
    }
    job__ring_maybe_rejoin(b);
    /* A step start: pending views and joins go now. */
    job__ring_advance(b);
    return 0;
}

static int start_collective(job_ring_t *b, job_ring_cmd_t *c,
                            job_done_cb cb, void *arg)
{
    if (b->op_cb != NULL || job__ring_busy(b)) {
        RD_ERROR("ring backend: a collective is already in flight");
        return ST_EINVAL;
    }
    if (b->state != JOB_READY) {
        job__ring_complete_later(b, cb, arg,
                       b->state == JOB_FENCED ? ST_EFENCED : ST_ERESHAPE);
        return 0;
    }
    b->op_cb = cb;
    b->op_arg = arg;
    b->cmd = *c;
    b->cmd.flags = b->my_flags;
    job__ring_post(b);
    return 0;
}

static int op_allreduce(job_t *be, const job_reduce_t *r, job_done_cb cb,
                        void *arg)
{
    job_ring_cmd_t c = {.kind = JOB_CMD_ALLREDUCE, .red = *r};
    return start_collective((job_ring_t *)be, &c, cb, arg);
}

/* root is a global trainer rank: broadcast from the node holding it. */
static int op_broadcast(job_t *be, void *buf, size_t bytes,
                        uint32_t root, job_done_cb cb, void *arg)
{
    job_ring_t *b = (job_ring_t *)be;
    uint32_t node = UINT32_MAX, total = 0;
    for (size_t i = 0; b->cur && i < b->cur->n_members; i++) {
        if (root >= total && root < total + b->counts[i])
            node = (uint32_t)i;
        total += b->counts[i];
    }
    if (node == UINT32_MAX) {
        RD_ERROR("ring backend: broadcast root %u is not a trainer of the "
                 "view (%u trainers)", root, total);
        return ST_EINVAL;
    }
    job_ring_cmd_t c = {.kind = JOB_CMD_BROADCAST, .buf = buf, .count = bytes,
                  .root = node};
    return start_collective(b, &c, cb, arg);
}

static void op_step_end(job_t *be, uint64_t step)
{
    job_ring_t *b = (job_ring_t *)be;
    attempt_close(b);
    job__hops_step(b);
    b->step = step + 1;
    b->dview.step = b->step;
    mb_set_step(b->mb, b->step);
    if (b->dview.ckpt_requested) /* its end took the checkpoint */
        b->ckpt_req = 0;
    b->dview.ckpt_requested = 0;
}

/* The flag rides on the step's next collectives already, if any. */
static void op_request_ckpt(job_t *be)
{
    job_ring_t *b = (job_ring_t *)be;
    b->ckpt_req = 1;
    if (!b->dview.ckpt_requested)
        b->my_flags |= JOB_RING_F_AGREE;
}

static int op_ckpt_report(job_t *be, const job_ckpt_files_t *f,
                          job_done_cb cb, void *arg)
{
    job_ring_t *b = (job_ring_t *)be;
    return job__ckpt_report(b->ckpt, mb_etcd(b->mb), f, cb, arg);
}

/*
 * 1 when this node is the only member of the view being installed that
 * holds the job's state, and joiners wait for it: leaving now would
 * leave them a view of none of the job's members, which starts the job
 * anew (a rolling restart that reaches this node while the node
 * restarted before it is still being taken back in).
 */
static int sole_state_holder(const job_ring_t *b)
{
    const mb_view_t *v = b->cur;
    if (b->state != JOB_SYNCING || v == NULL || v->n_joiners == 0 ||
        v->my_index < 0 || (size_t)v->my_index >= v->n_members ||
        v->members[v->my_index].joiner)
        return 0;
    size_t holders = 0;
    for (size_t i = 0; i < v->n_members; i++)
        holders += !v->members[i].joiner;
    return holders == 1;
}

/* Leave now; 0 when mb_on_left will call leave_cb, else as op_leave. */
static int leave_now(job_ring_t *b)
{
    job_state_t prev = b->state;
    job__ring_set_state(b, JOB_LEAVING, "leave");
    if (prev == JOB_STEPPING_OUT)
        return 0; /* the standby's mb_leave finishes it (mb_on_left) */
    int rc = mb_leave(b->mb);
    if (rc != 0)
        job__ring_set_state(b, JOB_LEFT, "not registered");
    return rc;
}

/* The install a leave waited for has ended (installed or failed). */
void job__ring_leave_deferred(job_ring_t *b)
{
    if (!b->leave_waits)
        return;
    b->leave_waits = 0;
    RD_INFO("ring backend: generation %llu %s: leaving now",
            (unsigned long long)b->cur->generation,
            b->state == JOB_READY ? "installed, the joiners have the state"
                                  : "not installed");
    if (leave_now(b) != 0) {
        job_done_cb cb = b->leave_cb;
        b->leave_cb = NULL;
        if (cb != NULL)
            cb(b->leave_arg, 0);
    }
}

static int op_leave(job_t *be, job_done_cb cb, void *arg)
{
    job_ring_t *b = (job_ring_t *)be;
    if (b->state == JOB_STANDBY) {
        job__ring_set_state(b, JOB_LEFT, "leave: already out of the job");
        return 1;
    }
    b->leave_cb = cb;
    b->leave_arg = arg;
    if (sole_state_holder(b)) {
        /* Bounded: the install ends, installed or failed (a joiner that
         * never comes is suspected after the ring deadline), and the
         * daemon's drain timeout bounds the whole drain. */
        RD_INFO("ring backend: leaving once generation %llu is installed: "
                "this node holds the only copy of the job's state, which "
                "%zu joiner%s for",
                (unsigned long long)b->cur->generation, b->cur->n_joiners,
                b->cur->n_joiners == 1 ? " waits" : "s wait");
        b->leave_waits = 1;
        return 0;
    }
    int rc = leave_now(b);
    if (rc != 0)
        b->leave_cb = NULL;
    return rc;
}

/* ---- life ------------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h)
{
    job_ring_t *b = h->data;
    if (--b->open_handles == 0)
        free(b);
}

static void close_handles(job_ring_t *b)
{
    b->open_handles = 6;
    uv_close((uv_handle_t *)&b->hop_timer, on_handle_closed);
    uv_close((uv_handle_t *)&b->retry, on_handle_closed);
    uv_close((uv_handle_t *)&b->rejoin, on_handle_closed);
    uv_close((uv_handle_t *)&b->async, on_handle_closed);
    uv_close((uv_handle_t *)&b->defer, on_handle_closed);
    uv_close((uv_handle_t *)&b->suspect_timer, on_handle_closed);
}

/* Ask the ring thread to quit and wait for it; it destroys its rings. */
static void stop_thread(job_ring_t *b)
{
    pthread_mutex_lock(&b->mu);
    b->abort_flag = 1;
    if (b->ring != NULL)
        ring_abort(b->ring);
    b->quit = 1;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->thread, NULL);
}

/* The part of destroy that create's unwinding shares: everything below
 * the ring thread, in the reverse order of creation. */
static void release(job_ring_t *b)
{
    mb_destroy(b->mb);
    job__ckpt_destroy(b->ckpt); /* after its etcd client */
    free(b->ckpt_root);
    tp_destroy(b->tp);
    job_auth_destroy(b->auth);
    free(b->my_opts_json);
    free(b->opts_seen);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    close_handles(b); /* frees b once closed */
}

static void op_destroy(job_t *be)
{
    job_ring_t *b = (job_ring_t *)be;
    b->commit_cb = NULL; /* callbacks are dropped (job.h) */
    stop_thread(b);
    mb_view_free(b->cur);
    mb_view_free(b->pending);
    free(b->quiet_node);
    release(b);
}

static void op_blame_stats(job_t *be, job_blame_t *out)
{
    job_ring_t *b = (job_ring_t *)be;
    mb_blame_stats_t m;
    mb_blame_stats(b->mb, &m);
    out->reported_lossy = m.reported[MB_BLAME_LOSSY];
    out->reported_silent = m.reported[MB_BLAME_SILENT];
    out->reported_hard = m.reported[MB_BLAME_HARD];
    out->withheld = m.withheld;
    out->convicted = m.convicted;
}

static const job_ops_t op_ops = {
    .name = "ring",
    .set_local_trainers = op_set_local_trainers,
    .ready = op_ready,
    .get_view = op_get_view,
    .set_step = op_set_step,
    .trainer_lost = job__ring_trainer_lost,
    .allreduce = op_allreduce,
    .broadcast = op_broadcast,
    .step_end = op_step_end,
    .commit = job__ring_commit,
    .request_ckpt = op_request_ckpt,
    .ckpt_report = op_ckpt_report,
    .leave = op_leave,
    .destroy = op_destroy,
    .hop_stats = job__hops_get,
    .blame_stats = op_blame_stats,
    /* No newest_generation: a pending view always holds this node
     * (mb delivers only those), and the view change's agreement takes
     * the state of the member furthest ahead, so a collective finished
     * just before the abort is a step the job keeps, not a stale one.
     * Fencing it only made this node skip logging a step its neighbour
     * logged (dmn_ring_opts_join). A node dropped from the view learns
     * it by its lease (mb_lease_valid), which fences its steps. */
};

/*
 * The ring's deadline hook, on the ring thread. Every member of the
 * running ring's view is alive until a view says otherwise: a dead daemon
 * fails its endpoints (UCX), a hung or cut-off one loses its lease, and
 * either brings a new view, which aborts the collective (mb_on_view,
 * job__ring_abort_running). So a quiet rank while no abort was asked is a
 * slow trainer: wait. Known gap: a daemon whose ring thread is wedged while its
 * main loop renews the lease is waited for too.
 */
static int on_member_alive(void *arg, uint32_t rank)
{
    job_ring_t *b = arg;
    (void)rank;
    pthread_mutex_lock(&b->mu);
    int alive = !b->abort_flag;
    pthread_mutex_unlock(&b->mu);
    return alive;
}

/*
 * The ring saw a neighbour's link stall (ring_hb.c), on the ring thread:
 * kept for the main loop, which reports it (job__ring_lossy). A third report
 * while two wait is dropped; the ring says it again within a second.
 */
static void on_lossy(void *arg, uint64_t generation, uint32_t rank)
{
    job_ring_t *b = arg;
    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < 2; i++) {
        if (b->lossy[i].gen == 0) {
            b->lossy[i].gen = generation;
            b->lossy[i].rank = rank;
            break;
        }
    }
    pthread_mutex_unlock(&b->mu);
    uv_async_send(&b->async);
}

/* A neighbour's message of another size (ring thread): for
 * job__ring_mismatch. */
static void on_mismatch(void *arg, uint64_t generation, uint32_t rank,
                        unsigned flags)
{
    job_ring_t *b = arg;
    pthread_mutex_lock(&b->mu);
    b->mismatch.gen = generation;
    b->mismatch.rank = rank;
    b->mismatch.flags = flags;
    pthread_mutex_unlock(&b->mu);
    uv_async_send(&b->async);
}

/* The main loop's handles and the command slot's lock: first, so that
 * every later failure unwinds through close_handles. */
static void init_sync(job_ring_t *b, uv_loop_t *loop)
{
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    uv_async_init(loop, &b->async, on_async);
    uv_timer_init(loop, &b->defer);
    uv_timer_init(loop, &b->suspect_timer);
    uv_timer_init(loop, &b->rejoin);
    uv_timer_init(loop, &b->retry);
    job__hops_init(b, loop);
    b->async.data = b->defer.data = b->suspect_timer.data = b;
    b->rejoin.data = b->retry.data = b;
}

int job__ring_create(uv_loop_t *loop, const job_config_t *cfg,
                     const job_cbs_t *cbs, job_t **be_p)
{
    job_ring_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return ST_ENOMEM;
    b->base.ops = &op_ops;
    b->loop = loop;
    b->cbs = *cbs;
    b->ttl_s = (int)cfg->lease_ttl;
    b->local_trainers = cfg->trainers ? cfg->trainers : 1;
    ring_opts_default(&b->my_opts);
    if (cfg->ring_deadline_ms > 0)
        b->my_opts.deadline_ms = (int)cfg->ring_deadline_ms;
    b->my_opts.live_ms = (int)cfg->ring_live_ms;
    job__opts_from_config(cfg, &b->my_opts);
    b->my_opts.on_quiet = on_member_alive;
    b->my_opts.on_quiet_arg = b;
    b->my_opts.on_lossy = on_lossy;
    b->my_opts.on_lossy_arg = b;
    b->my_opts.on_mismatch = on_mismatch;
    b->my_opts.on_mismatch_arg = b;
    b->ring_opts = b->my_opts;
    init_sync(b, loop);

    b->job_name = cfg->job;
    int rc = ST_ENOMEM;
    b->my_x = (job_xopts_t){.commit = !cfg->step_commit_off,
                            .fuse_bytes = cfg->ring_fuse_bytes};
    b->x = b->my_x;
    if ((b->my_opts_json = job__opts_json(&b->my_opts, &b->my_x)) ==
        NULL)
        goto err_sync;
    rc = 0;
    if (cfg->job_secret_file != NULL &&
        (rc = job_auth_load(cfg->job_secret_file, &b->auth)) != 0)
        goto err_sync;
    tp_config_t tc;
    tp_config_default(&tc);
    rc = tp_create(&tc, &b->tp);
    if (rc != 0)
        goto err_sync;
    if (cfg->ckpt_dir != NULL &&
        asprintf(&b->ckpt_root, "%s/%s", cfg->ckpt_dir, cfg->job) < 0)
        b->ckpt_root = NULL; /* no restore through the ring, no sync */
    rc = job__ckpt_create(cfg->job, cfg->node, b->ckpt_root, &b->ckpt);
    if (rc != 0)
        goto err_tp;
    rc = job__ring_create_mb(b, cfg);
    if (rc != 0)
        goto err_ckpt;
    if (pthread_create(&b->thread, NULL, job__ring_thread_main, b) != 0) {
        rc = ST_ENOMEM;
        goto err_mb;
    }
    /* Named so per-thread CPU (top -H, /proc/PID/task) tells it apart. */
    pthread_setname_np(b->thread, "ringd-ring");
    rc = mb_start(b->mb);
    if (rc != 0)
        goto err_thread;
    RD_INFO("ring backend: node %s of job %s, etcd %s, lease %u s, ring "
            "deadline %d ms", cfg->node, cfg->job, cfg->etcd,
            cfg->lease_ttl, b->ring_opts.deadline_ms);
    *be_p = &b->base;
    return 0;

err_thread:
    stop_thread(b);
err_mb:
    mb_destroy(b->mb);
    b->mb = NULL;
err_ckpt:
    job__ckpt_destroy(b->ckpt);
    b->ckpt = NULL;
err_tp:
    free(b->ckpt_root);
    b->ckpt_root = NULL;
    tp_destroy(b->tp);
    b->tp = NULL;
err_sync:
    release(b); /* the rest is NULL: closes the handles, frees b */
    return rc;
}
