/*
 * job_ring_mb.c - the ring backend's side of membership (mb_), on the main
 * loop: membership's callbacks (a new view, fenced, a drain asked, left),
 * a node without local trainers stepping out of the job and
 * registering again as a new member once one is back, and the reports
 * on failed or lossy peers it makes to membership.
 */
#include "job/job_ring-int.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

/* ---- membership callbacks ------------------------------------------------ */

static void mb_on_view(const mb_view_t *mv, void *data)
{
    job_ring_t *b = data;
    mb_view_t *v;
    if (mb_view_dup(mv, &v) != 0) {
        RD_ERROR("ring backend: out of memory copying view %llu",
                 (unsigned long long)mv->generation);
        return;
    }
    RD_INFO("ring backend: view %llu: %zu member%s, me #%d, %zu joiner%s",
            (unsigned long long)v->generation, v->n_members,
            v->n_members == 1 ? "" : "s",
            v->my_index, v->n_joiners, v->n_joiners == 1 ? "" : "s");
    /*
     * Every node must switch rings at the same point of the job, and a
     * node cannot know where the others are when a view arrives: so any
     * new view, a join as much as a loss, ends whatever runs on the old
     * ring (a collective comes back ST_ERESHAPE and its step is redone),
     * and each node installs the newest view it has at its next step
     * start. A node still on an older view aborts when the newer one
     * reaches it, so all converge on the latest generation.
     */
    mb_view_free(b->pending);
    b->pending = v;
    if (b->state == JOB_SYNCING)
        job__ring_abort_running(b); /* its failure brings WAITING */
    else if (b->state == JOB_READY || b->state == JOB_FENCED)
        job__ring_set_state(b, JOB_WAITING, "a new view");
    job__commit_check(b); /* a step waiting for its verdict has it */
    job__ring_advance(b);
}

static void mb_on_fenced(int reason, void *data)
{
    job_ring_t *b = data;
    RD_WARN("ring backend: fenced (%s): not serving collectives until "
            "etcd takes this node back", st_strerror(reason));
    /* cur stays: a command in flight may still read it; the view that
     * takes this node back replaces it. */
    if (b->state < JOB_STEPPING_OUT)
        job__ring_set_state(b, JOB_FENCED, "lease lost");
}

static void mb_on_drain(void *data)
{
    job_ring_t *b = data;
    RD_INFO("ring backend: drain requested; leaving at the next step "
            "boundary");
    if (b->cbs.on_drain != NULL)
        b->cbs.on_drain(b->cbs.arg);
}

static void mb_on_left(int status, void *data)
{
    job_ring_t *b = data;
    if (b->state == JOB_STEPPING_OUT) {
        job__ring_set_state(b, JOB_STANDBY, "left the job");
        return;
    }
    job__ring_set_state(b, JOB_LEFT, "left the job");
    job_done_cb cb = b->leave_cb;
    b->leave_cb = NULL;
    if (cb != NULL)
        cb(b->leave_arg, status);
}

/* ---- a local trainer lost ------------------------------------------------ */

/* Register again, as a new member, once a trainer waits at a step start.
 * From a timer: mb_destroy may not run inside an mb callback. */
static void on_rejoin(uv_timer_t *t)
{
    job_ring_t *b = t->data;
    if (b->state != JOB_STANDBY || b->ready_cb == NULL ||
        b->local_trainers == 0)
        return;
    mb_t *mb = NULL;
    int rc = mb_create(b->loop, &b->mc, &b->mcb, b, &mb);
    if (rc == 0)
        rc = mb_start(mb);
    if (rc != 0) {
        RD_ERROR("ring backend: cannot register again: %s; retrying",
                 st_strerror(rc));
        mb_destroy(mb);
        uv_timer_start(&b->rejoin, on_rejoin, 1000, 0);
        return;
    }
    mb_destroy(b->mb);
    b->mb = mb;
    RD_INFO("ring backend: a trainer is back: registering again");
    job__ring_set_state(b, JOB_WAITING, "registered again");
}

void job__ring_maybe_rejoin(job_ring_t *b)
{
    if (b->state == JOB_STANDBY && b->ready_cb != NULL &&
        b->local_trainers > 0)
        uv_timer_start(&b->rejoin, on_rejoin, 0, 0);
}

/*
 * No trainer left here: this node cannot take part in any collective, and
 * every other node would wait for it. It leaves the job (a clean leave:
 * the view without it comes at once) and registers again as a new member
 * when a trainer is back; it then gets the job's state like any joiner.
 */
static void step_out(job_ring_t *b)
{
    RD_WARN("ring backend: no trainer left on this node: leaving the job "
            "until one connects");
    job__ring_set_state(b, JOB_STEPPING_OUT, "no local trainer");
}

/*
 * A trainer that had begun the step died: this node cannot finish the
 * step, and the others wait for it in a collective (its daemon is
 * healthy: no endpoint fails, no lease expires). Ask for a new
 * generation of the view; every node aborts the old ring, redoes the
 * step and agrees on the state again (the same path as any view change),
 * so no step is lost or applied twice. A trainer lost between steps
 * needs nothing here: the node's next step runs with another count than
 * the agreed one, which voids it on every node (attempt_begin).
 */
void job__ring_trainer_lost(job_t *be, int in_step, uint32_t remaining)
{
    job_ring_t *b = (job_ring_t *)be;
    if (b->state >= JOB_STEPPING_OUT)
        return;
    if (remaining == 0) {
        step_out(b);
        return;
    }
    if (!in_step || b->pending != NULL || b->cur == NULL)
        return; /* a view already on its way aborts everyone anyway */
    RD_WARN("ring backend: a trainer died during step %llu: asking for a "
            "new generation of view %llu so that every node redoes it",
            (unsigned long long)b->step,
            (unsigned long long)b->cur->generation);
    if (mb_request_view(b->mb, "a local trainer died mid-step") != 0)
        return; /* not in a view: the one that takes us in comes anyway */
    if (b->state == JOB_SYNCING)
        job__ring_abort_running(b);
    else if (b->state == JOB_READY)
        job__ring_set_state(b, JOB_WAITING, "a trainer died mid-step");
}

/* What membership needs, from the job's config. */
static void mb_config_from(const job_config_t *cfg, mb_config_t *mc)
{
    memset(mc, 0, sizeof(*mc));
    mc->job = cfg->job;
    mc->node = cfg->node;
    mc->host = cfg->host;
    mc->slots = (int)(cfg->trainers ? cfg->trainers : 1);
    mc->ttl_s = (int)cfg->lease_ttl;
    mc->min_members = (int)cfg->min_nodes;
    mc->ride_outage = 1; /* each step's collectives fence (mb-lease.c) */
    mc->etcd.endpoints = cfg->etcd;
    mc->etcd.ca_file = cfg->etcd_ca;
    mc->etcd.cert_file = cfg->etcd_cert;
    mc->etcd.key_file = cfg->etcd_key;
    mc->etcd.user = cfg->etcd_user;
    mc->etcd.password_file = cfg->etcd_password_file;
}

/* Membership on this node's transport address; its strings live in cfg
 * and tp, as long as the job does (kept in b->mc for a rejoin). */
int job__ring_create_mb(job_ring_t *b, const job_config_t *cfg)
{
    mb_config_from(cfg, &b->mc);
    b->mc.view_opts = b->my_opts_json;
    job_auth_secret(b->auth, &b->mc.secret, &b->mc.secret_len);
    tp_address(b->tp, &b->mc.addr, &b->mc.addr_len);
    b->mcb = (mb_callbacks_t){.on_view = mb_on_view,
                              .on_fenced = mb_on_fenced,
                              .on_drain = mb_on_drain,
                              .on_left = mb_on_left};
    return mb_create(b->loop, &b->mc, &b->mcb, b, &b->mb);
}

/* ---- reports on peers (membership/README.md, "Blame") ---------------- */

/*
 * A neighbour went quiet (the ring deadline) and no view came within its
 * lease TTL. If its daemon still renews its lease, it is alive: what the
 * ring waits for is a slow trainer somewhere (an evaluation, a data
 * loader), not a failure, and evicting anyone would be wrong. Ask for a
 * new generation of the same members instead: the leader answers every
 * member's request with one view, the ring is built again, and it waits
 * at its first collective for the slow node to come back. Only a
 * neighbour whose record is gone while no view removed it is suspected.
 */
static void on_suspect_timer(uv_timer_t *t)
{
    job_ring_t *b = t->data;
    if (b->quiet_node == NULL)
        return;
    if (mb_member_alive(b->mb, b->quiet_node, b->quiet_lease)) {
        RD_WARN("ring backend: %s is quiet but its daemon renews its lease "
                "(a slow trainer, not a failure): asking for a new "
                "generation of the same members", b->quiet_node);
        if (b->cur != NULL && b->pending == NULL)
            (void)mb_request_view(b->mb, "ring deadline, member alive");
    } else {
        RD_WARN("ring backend: %s stayed quiet and no view removed anyone; "
                "suspecting it", b->quiet_node);
        mb_suspect_soft(b->mb, b->quiet_node, MB_BLAME_SILENT,
                        "ring deadline, no view change");
    }
    free(b->quiet_node);
    b->quiet_node = NULL;
}

/*
 * A collective or resync failed because of a peer: tell membership. A
 * view already pending does not make the report moot unless it drops that
 * peer: with two nodes dead at once, the first view removes one, and only
 * this report removes the other before its lease runs out.
 */
void job__ring_peer_failure(job_ring_t *b, int status, uint32_t rank)
{
    if (b->cur == NULL || rank >= b->cur->n_members ||
        (int)rank == b->cur->my_index)
        return;
    const char *node = b->cur->members[rank].node;
    if (b->pending != NULL &&
        !job__ring_view_has(b->pending, node, b->cur->members[rank].lease))
        return;
    if (status == ST_EPEER_FORGED) {
        RD_WARN("ring backend: %s failed the job-secret handshake; "
                "suspecting it", node);
        mb_suspect_soft(b->mb, node, MB_BLAME_SILENT,
                        "failed the job-secret handshake");
        return;
    }
    if (status == ST_EPEER) {
        RD_WARN("ring backend: endpoint of %s failed; suspecting it", node);
        mb_suspect(b->mb, node, "ring endpoint failed");
        return;
    }
    if (status == ST_EPEER_SILENT) {
        RD_WARN("ring backend: %s stopped answering (no heartbeat for "
                "%d ms); suspecting it", node, b->ring_opts.live_ms);
        mb_suspect_soft(b->mb, node, MB_BLAME_SILENT, "no heartbeat");
        return;
    }
    if (status == ST_EPEER_TIMEOUT && b->quiet_node == NULL) {
        b->quiet_node = strdup(node);
        b->quiet_lease = b->cur->members[rank].lease;
        uv_timer_start(&b->suspect_timer, on_suspect_timer,
                       (uint64_t)b->ttl_s * 1000 + 1000, 0);
    }
}

/*
 * A neighbour posted the running collective with another size (on the
 * main loop, from on_mismatch). In a void attempt (a node's trainer count
 * changed: its trainers were told another world) that is expected of any
 * collective whose size follows the world (DDP's allgather of its
 * parameter counts): the nodes cannot finish it alike, so a new
 * generation aborts it everywhere and the step is redone on the counts
 * agreed again. The same step meeting it again on agreed counts is the
 * trainers' own: their collectives differ (a bug in the script), and they
 * are told so when the new generation aborts it (which frees the others).
 * The ring waits meanwhile: failing the collective here would close its
 * endpoints and get this node suspected by its neighbours.
 */
void job__ring_mismatch(job_ring_t *b, uint64_t gen, uint32_t rank,
                        unsigned flags)
{
    if (b->cur == NULL || b->cur->generation != gen ||
        b->state != JOB_READY)
        return; /* that ring is gone already */
    unsigned f = flags | b->my_flags;
    int counted = !(f & JOB_RING_F_VOID) && b->mismatch_step == b->step + 1;
    b->mismatch_step = b->step + 1;
    b->mismatch_status = counted ? ST_EMISMATCH : ST_ERESHAPE;
    const char *node = rank < b->cur->n_members ? b->cur->members[rank].node
                                                : "?";
    if (counted)
        RD_ERROR("ring backend: step %llu: %s posted a collective of "
                 "another size than this node's trainers did, on agreed "
                 "trainer counts: the trainers' collectives differ",
                 (unsigned long long)b->step, node);
    else
        RD_INFO("ring backend: step %llu: %s posted a collective of "
                "another size (%s): asking for a new generation, every "
                "node redoes the step", (unsigned long long)b->step, node,
                f & JOB_RING_F_VOID ? "a node's trainer count changed"
                                 : "a trainer count may have changed");
    if (b->pending == NULL)
        (void)mb_request_view(b->mb, "collectives of different sizes");
}

/* A lossy link seen on the current ring is a soft report on that
 * neighbour: membership convicts it only when another member reports it
 * too (membership/README.md, "Blame"). */
void job__ring_lossy(job_ring_t *b, uint64_t gen, uint32_t rank)
{
    if (gen == 0 || b->cur == NULL || b->cur->generation != gen ||
        rank >= b->cur->n_members || (int)rank == b->cur->my_index)
        return;
    const char *node = b->cur->members[rank].node;
    if (b->pending != NULL &&
        !job__ring_view_has(b->pending, node, b->cur->members[rank].lease))
        return;
    mb_suspect_soft(b->mb, node, MB_BLAME_LOSSY,
                    "its link stalls (heartbeats late)");
}
