/*
 * job_ring_view.c - installing a view: the ring thread builds the new
 * generation's ring and resyncs (REBUILD: agree on the step and the
 * counts, broadcast the state from the member furthest ahead), and its
 * outcome moves the backend to READY, or back to WAITING with a retry or
 * the suspects it names. Views are installed only at a step start, when
 * the daemon waits in ready() (job__ring_advance).
 */
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "job/job_ring-int.h"

void job__ring_fill_dview(job_ring_t *b)
{
    const mb_view_t *v = b->cur;
    uint32_t total = 0, offset = 0;
    for (size_t i = 0; i < v->n_members; i++) {
        if ((int)i == v->my_index)
            offset = total;
        total += b->counts[i];
    }
    b->dview = (job_view_t){.generation = v->generation, .step = b->step,
                            .node_rank = (uint32_t)v->my_index,
                            .node_count = (uint32_t)v->n_members,
                            .global_trainers = total,
                            .rank_offset = offset,
                            .commit = (uint32_t)b->x.commit,
                            .fuse_bytes = b->x.fuse_bytes};
}

static void post_rebuild(job_ring_t *b);

/* Install the pending view and have the ring thread build and resync. */
static void install_pending(job_ring_t *b)
{
    if (b->pending->n_members > JOB_RING_MAX_NODES) {
        RD_ERROR("ring backend: view %llu has %zu nodes, more than the %d "
                 "this build supports; waiting for another",
                 (unsigned long long)b->pending->generation,
                 b->pending->n_members,
                 JOB_RING_MAX_NODES);
        mb_view_free(b->pending);
        b->pending = NULL;
        return;
    }
    mb_view_free(b->cur);
    b->cur = b->pending;
    b->pending = NULL;
    b->retries = 0;
    job__opts_install(b, b->cur);
    post_rebuild(b);
}

/* Have the ring thread build the ring of the installed view and resync. */
static void post_rebuild(job_ring_t *b)
{
    b->cmd = (job_ring_cmd_t){.kind = JOB_CMD_REBUILD, .view = b->cur,
                        .my_step = b->step, .counts = b->counts,
                        .my_trainers = b->local_trainers,
                        .ckpt_req = b->ckpt_req,
                        .ckpt_root = b->ckpt_root};
    if (b->cbs.get_state != NULL) {
        b->cbs.get_state(b->cbs.arg, &b->cmd.state, &b->cmd.state_bytes);
        b->state_lent = 1;
    }
    job__ring_set_state(b, JOB_SYNCING, "a view to install");
    job__ring_post(b);
}

/*
 * The one place that decides what runs next, called whenever something
 * changed (a view arrived, a command finished, ready() was asked). Work
 * starts only while the daemon waits in ready(): then the node is at a
 * step start with its state registered.
 */
void job__ring_advance(job_ring_t *b)
{
    if (job__ring_busy(b) || b->ready_cb == NULL ||
        b->state >= JOB_STEPPING_OUT)
        return;
    if (b->pending != NULL) {
        install_pending(b);
    } else if (b->state == JOB_READY && b->agree_due) {
        b->cmd = (job_ring_cmd_t){.kind = JOB_CMD_AGREE, .view = b->cur,
                            .counts = b->counts,
                            .my_trainers = b->local_trainers,
                            .ckpt_req = b->ckpt_req};
        job__ring_post(b);
    }
    /* else WAITING: the next view brings us back here */
}

void job__ring_ready_fire(job_ring_t *b, int status)
{
    job_done_cb cb = b->ready_cb;
    b->ready_cb = NULL;
    if (cb != NULL)
        cb(b->ready_arg, status);
}

/* 1 when node (lease) is a member of view v. */
int job__ring_view_has(const mb_view_t *v, const char *node, int64_t lease)
{
    for (size_t i = 0; v != NULL && i < v->n_members; i++)
        if (v->members[i].lease == lease &&
            strcmp(v->members[i].node, node) == 0)
            return 1;
    return 0;
}

/*
 * A REBUILD that failed here without naming a peer (an endpoint could not
 * be created: a link just back up, "Destination is unreachable") is tried
 * again: the other members wait for this node in the new ring's first
 * collective, and would otherwise wait out its deadline (60 s).
 */
static void on_retry(uv_timer_t *t)
{
    job_ring_t *b = t->data;
    if (b->state != JOB_WAITING || job__ring_busy(b) || b->pending != NULL ||
        b->cur == NULL || b->ready_cb == NULL)
        return;
    RD_INFO("ring backend: building generation %llu again (try %d)",
            (unsigned long long)b->cur->generation, b->retries + 1);
    b->retries++;
    post_rebuild(b);
}

void job__ring_rebuilt(job_ring_t *b, job_ring_cmd_t *c)
{
    if (b->state_lent) { /* the ring thread is done with the region */
        b->state_lent = 0;
        if (b->cbs.put_state != NULL)
            b->cbs.put_state(b->cbs.arg);
    }
    if (c->status != 0) {
        RD_WARN("ring backend: generation %llu could not resync: %s",
                (unsigned long long)c->view->generation,
                st_strerror(c->status));
        job__ring_peer_failure(b, c->status, c->suspect);
        job__ring_peer_failure(b, ST_EPEER, c->suspect2);
        /* A neighbour whose endpoint cannot be made, try after try, is
         * most likely dead (a view written before every death was
         * reported): suspected, it leaves the next view instead of
         * holding this one until its lease runs out. Not at the first
         * failure: a link just back up may refuse briefly. */
        if (c->status == ST_ELINK && c->unreachable != UINT32_MAX &&
            c->view == b->cur && b->retries + 1 >= JOB_RING_UNREACHABLE_TRIES)
            job__ring_peer_failure(b, ST_EPEER, c->unreachable);
        if (b->state == JOB_SYNCING)
            job__ring_set_state(b, JOB_WAITING, "resync failed");
        if (b->leave_waits) {
            job__ring_leave_deferred(b);
            return;
        }
        if (c->status == ST_EMISMATCH && c->view == b->cur) {
            b->fatal = ST_EMISMATCH;
            b->fatal_gen = c->view->generation;
            job__ring_ready_fire(b, ST_EMISMATCH);
            return;
        }
        if (c->suspect == UINT32_MAX && c->status != ST_EABORTED &&
            c->status != ST_ECONFIG && c->view == b->cur &&
            b->retries < JOB_RING_REBUILD_RETRIES)
            uv_timer_start(&b->retry, on_retry, JOB_RING_RETRY_MS, 0);
        return;
    }
    if (b->state != JOB_SYNCING) {
        job__ring_leave_deferred(b);
        return; /* fenced or stepped out meanwhile: not in this view */
    }
    b->step = c->step_out;
    b->agree_due = 0; /* the REBUILD agreed the counts */
    b->attempt_open = 0;
    mb_set_step(b->mb, b->step);
    b->replaced_carry |= c->state_replaced;
    if (b->pending != NULL) {
        /* A newer view came while this one resynced, and its abort was
         * too late: install that one next, from WAITING (READY ->
         * SYNCING is no move; refused, it left the node READY with the
         * newer ring built and ignored, and the job hung under ASan in
         * dmn_ring_lossy_node). Whether the state was replaced carries
         * over to the view the trainers are told of. */
        job__ring_set_state(b, JOB_WAITING, "a newer view waits");
        job__ring_leave_deferred(b);
        return;
    }
    job__ring_fill_dview(b);
    b->dview.ckpt_requested = (uint32_t)c->ckpt_out;
    b->dview.restored = b->replaced_carry;
    b->replaced_carry = 0;
    job__ring_set_state(b, JOB_READY, "resynced");
    if (b->cbs.on_view != NULL)
        b->cbs.on_view(b->cbs.arg, &b->dview);
    b->dview.restored = 0;
    job__ring_ready_fire(b, 0);
    job__ring_leave_deferred(b);
}
