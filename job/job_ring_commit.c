/*
 * job_ring_commit.c - the step's commit round (job.h, commit): a node
 * answers its trainers' step_end only once every member of the view has
 * finished the step too, or once the next view shows nobody went on
 * without it (verdict(), below).
 *
 * Why: the ring's last messages reach the ranks at different moments, so
 * a node can finish a step that some of its neighbours never finish (a
 * link that stops carrying one direction, a neighbour stopped between two
 * messages). If that node is then dropped from the job, the others redo
 * the step without it, and its trainers would have applied a step the job
 * does not have: a stale step. After the round, a node that finished the
 * step knows every member did; a member that the round's failure leaves
 * behind finished it as well, and is either in the next view (whose
 * agreement takes the state of the member furthest ahead, so the step is
 * kept) or dropped too. So a step answered as done on any node is a step
 * of the job. The round is one byte per rank around the ring (an
 * allgather: n - 1 hops), once per step, not per collective. TorchFT's
 * should_commit vote before the optimizer step is the same idea.
 *
 * Known limit: a verdict from the next view (the round failed) is taken
 * before that view's REBUILD has spread the state furthest ahead; a
 * second fault that drops this node during that REBUILD, with no other
 * node holding the step, would have the others redo it.
 */
#include "job/job_ring-int.h"

#include "common/log.h"
#include "common/status.h"

/*
 * 1 with *status_p when the step's fate is known without the round, from
 * the view that follows the step's (b->cur, generation g):
 * - it holds this node's incarnation: the node survived, and the next
 *   REBUILD takes the state of the member furthest ahead: kept (0);
 * - it holds this node under a new lease (fenced, registered again) and
 *   is generation g + 1 with no member of g in it: every member was
 *   dropped (an etcd outage that expired every lease), nobody ran a step
 *   without us, and the job resumes from the state furthest ahead, which
 *   has this step: kept (0);
 * - else someone went on without this node: not counted (ST_ERESHAPE).
 * A view from before this node's fence says nothing: the one that takes
 * it back decides. Out of the job (no trainer, leaving): ST_EFENCED.
 */
static int verdict(job_ring_t *b, int *status_p)
{
    if (b->state >= JOB_STEPPING_OUT) {
        *status_p = ST_EFENCED;
        return 1;
    }
    const mb_view_t *p = b->pending, *g = b->cur;
    if (p == NULL || g == NULL || g->my_index < 0)
        return 0;
    const mb_member_t *me = &g->members[g->my_index];
    if (job__ring_view_has(p, me->node, me->lease)) {
        if (b->state == JOB_FENCED || !mb_lease_valid(b->mb))
            return 0;
        *status_p = 0;
        return 1;
    }
    int carried = 0;
    for (size_t i = 0; i < g->n_members && !carried; i++)
        carried = job__ring_view_has(p, g->members[i].node,
                                g->members[i].lease);
    *status_p = !carried && p->generation == g->generation + 1
                    ? 0 : ST_ERESHAPE;
    return 1;
}

static void fire(job_ring_t *b, int status)
{
    job_done_cb cb = b->commit_cb;
    b->commit_cb = NULL;
    if (status != 0)
        RD_WARN("ring backend: step %llu is not committed (%s): the job "
                "went on without this node before every member finished "
                "it; its trainers go on from the job's state",
                (unsigned long long)(b->step - 1), st_strerror(status));
    if (cb != NULL)
        cb(b->commit_arg, status);
}

void job__commit_check(job_ring_t *b)
{
    /* While the round runs, its end decides (job__commit_done). */
    int status;
    if (b->commit_cb != NULL && b->cmd.kind != JOB_CMD_COMMIT &&
        verdict(b, &status))
        fire(b, status);
}

int job__ring_commit(job_t *be, job_done_cb cb, void *arg)
{
    job_ring_t *b = (job_ring_t *)be;
    if (b->commit_cb != NULL || b->op_cb != NULL) {
        RD_ERROR("ring backend: a commit or a collective is pending");
        return ST_EINVAL;
    }
    int status;
    if (!b->x.commit) {
        job__ring_complete_later(b, cb, arg, 0); /* the job's option */
        return 0;
    }
    if (b->state == JOB_READY && b->pending == NULL && b->cur != NULL &&
        b->cur->n_members > 1 && !job__ring_busy(b)) {
        b->commit_cb = cb;
        b->commit_arg = arg;
        b->cmd = (job_ring_cmd_t){.kind = JOB_CMD_COMMIT};
        job__ring_post(b);
        return 0;
    }
    if (b->state == JOB_READY && b->cur != NULL && b->cur->n_members <= 1)
        status = 0; /* alone in the view: nobody to redo it */
    else if (!verdict(b, &status)) {
        /* A view or the fence is on its way (mb_on_view, set_state). */
        b->commit_cb = cb;
        b->commit_arg = arg;
        return 0;
    }
    job__ring_complete_later(b, cb, arg, status);
    return 0;
}

void job__commit_done(job_ring_t *b, const job_ring_cmd_t *c)
{
    int status = c->status;
    /* Every member finished the step: whoever goes on has it, whatever
     * becomes of this node's lease. */
    if (status == 0) {
        if (b->commit_cb != NULL)
            fire(b, 0);
        return;
    }
    job__ring_peer_failure(b, status, c->suspect);
    job__ring_peer_failure(b, ST_EPEER, c->suspect2);
    if (b->state == JOB_READY)
        job__ring_set_state(b, JOB_WAITING, "commit round failed");
    job__commit_check(b); /* else the next view, or the fence, decides */
}
