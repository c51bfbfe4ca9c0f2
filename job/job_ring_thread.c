/*
 * job_ring_thread.c - the ring backend's ring thread: REBUILD (a new
 * ring, the step agreement, the state broadcast), AGREE (trainer counts)
 * and the collectives, one command at a time.
 * See job_ring.c for the whole picture.
 */
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "job/job_ring-int.h"

#define THREAD_IDLE_MS 20 /* progress period of an idle ring thread */

/* ---- the ring thread ------------------------------------------------- */

static void set_ring(job_ring_t *b, ring_t *r)
{
    pthread_mutex_lock(&b->mu);
    b->ring = r;
    if (r != NULL && b->abort_flag)
        ring_abort(r); /* asked for while ring_create ran */
    pthread_mutex_unlock(&b->mu);
}

/* Every node's trainer count, in ring order; the top bit carries "a
 * checkpoint was asked for here", so every node learns it at this step.
 * Run by REBUILD and, at a step start, only when the last step's flags
 * asked for it (job_ring.c, "step attempts"). */
static int agree_counts(job_ring_t *b, job_ring_cmd_t *c)
{
    uint32_t n = (uint32_t)c->view->n_members;
    memset(c->counts, 0, n * sizeof(uint32_t));
    c->counts[c->view->my_index] =
        c->my_trainers | (c->ckpt_req ? JOB_RING_CKPT_BIT : 0);
    int rc = ring_allgather(b->ring, c->counts, sizeof(uint32_t));
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        c->ckpt_out |= (c->counts[i] & JOB_RING_CKPT_BIT) != 0;
        c->counts[i] &= ~JOB_RING_CKPT_BIT;
    }
    return rc;
}

/* The view groups a host's members: the ring's host key changes only
 * where the host does. */
static int same_host(const mb_view_t *v, size_t i)
{
    const char *a = v->members[i].host, *b = v->members[i - 1].host;
    return a != NULL && b != NULL && strcmp(a, b) == 0;
}

/*
 * REBUILD, step 1: replace the ring. The ring being replaced is closed one
 * generation later, not now: a neighbour that has not seen the new view
 * yet may still wait in a collective on it, and closing our endpoints
 * would show it a failed endpoint naming us (a healthy node it would then
 * suspect). Open, we are merely quiet until its own copy of the view
 * aborts it.
 */
static int replace_ring(job_ring_t *b, const mb_view_t *v, ring_t **r_p,
                           uint32_t *suspect_p, uint32_t *unreachable_p)
{
    ring_t *prev = b->ring;
    set_ring(b, NULL);
    if (b->older != NULL) {
        ring_abort(b->older); /* closes at once instead of flushing */
        ring_destroy(b->older);
    }
    b->older = prev;

    const void **addrs = calloc(v->n_members, sizeof(*addrs));
    size_t *lens = calloc(v->n_members, sizeof(*lens));
    uint32_t *hosts = calloc(v->n_members, sizeof(*hosts));
    if (addrs == NULL || lens == NULL || hosts == NULL) {
        free(addrs);
        free(lens);
        free(hosts);
        return ST_ENOMEM;
    }
    for (size_t i = 0; i < v->n_members; i++) {
        addrs[i] = v->members[i].addr;
        lens[i] = v->members[i].addr_len;
        hosts[i] = i == 0 ? 0 : hosts[i - 1] + !same_host(v, i);
    }
    ring_view_t rv = {.generation = v->generation,
                      .nranks = (uint32_t)v->n_members,
                      .rank = (uint32_t)v->my_index, .addrs = addrs,
                      .addr_lens = lens, .hosts = hosts};
    /* Keyed tags exactly where the handshake runs (job__ring_auth): the
     * ring's stale rule for them counts on it. */
    int rc = 0;
    if (b->auth != NULL && v->n_members > 1) {
        rv.tag_keyed = 1;
        rc = job_auth_tag_gen(b->auth, b->job_name, v->generation,
                              &rv.tag_gen);
    }
    /* The members reach a new ring when their trainers reach a step
     * start, seconds apart at worst: the first collective may wait long.
     * A crash still ends it at once (endpoint error), a new view too. */
    ring_opts_t first = b->ring_opts;
    if (first.deadline_ms < JOB_RING_REBUILD_DEADLINE_MS)
        first.deadline_ms = JOB_RING_REBUILD_DEADLINE_MS;
    /* Liveness from the start: nothing keeps a member from its ring's
     * loops until the restore (resync_state turns it off for that),
     * and a member stuck in a REBUILD (a lossy link) must be named, not
     * waited for. The checkpoint scan runs before the ring exists. */
    if (rc == 0)
        rc = ring_create(b->tp, &rv, &first, r_p, unreachable_p);
    free(addrs);
    free(lens);
    free(hosts);
    if (rc != 0)
        return rc;
    /* Published first, so that a new view can abort the handshake. */
    set_ring(b, *r_p);
    if ((rc = job__ring_auth(b, *r_p, v, suspect_p)) != 0) {
        set_ring(b, NULL);
        ring_abort(*r_p); /* its endpoints close at once */
        ring_destroy(*r_p);
        *r_p = NULL;
    }
    return rc;
}

int job__ring_agree(ring_t *r, int64_t *v, size_t n, kern_op_t op)
{
    ring_allreduce_t a = {.buf = v, .count = n, .dt = KERN_I64, .op = op,
                          .wire = RD_WIRE_NONE};
    return ring_allreduce(r, &a);
}

/* What the members agreed on in step 2. */
typedef struct {
    uint64_t max_step, min_step;
    uint32_t source;         /* ring rank whose state the others take */
    int64_t state_bytes;     /* every member's (checked equal) */
    uint64_t newest_ckpt;    /* newest complete checkpoint + 1 (0: none) */
} agreed_t;

/*
 * REBUILD, step 2: agree on the step. One allreduce MAX of
 * {member<<62 | step<<20 | (0xfffff - index), -step, bytes, -bytes,
 * newest checkpoint} gives the source of the state, the smallest step,
 * whether every state has the same size, and the newest checkpoint any
 * member holds.
 *
 * Members that were in the previous view outrank joiners: a node evicted
 * while stopped may have finished, alone, a step the others redid without
 * it, and must never be the source of the job's state when it comes back.
 * Among equals the furthest step wins, then the lowest index. Steps fit
 * in 42 bits.
 */
static int agree_step(job_ring_t *b, ring_t *r, const job_ring_cmd_t *c,
                         uint64_t newest, agreed_t *a)
{
    const mb_view_t *v = c->view;
    int member = !v->members[v->my_index].joiner;
    int64_t key = (int64_t)(((uint64_t)member << 62) |
                            ((c->my_step & ((1ull << 42) - 1)) << 20) |
                            (0xfffffu - (uint32_t)v->my_index));
    /* [4]: newest, the newest complete checkpoint this node holds + 1,
     * for a job that starts again with its state in per-node stores. */
    int64_t agree[5] = {key, -(int64_t)c->my_step, (int64_t)c->state_bytes,
                        -(int64_t)c->state_bytes, (int64_t)newest};
    int rc = job__ring_agree(r, agree, 5, KERN_MAX);
    if (rc != 0)
        return rc;
    ring_set_deadline(r, b->ring_opts.deadline_ms);
    if (agree[2] != -agree[3]) {
        RD_ERROR("ring backend: state sizes differ across nodes (%lld vs "
                 "%lld bytes): the trainers are not the same job",
                 (long long)-agree[3], (long long)agree[2]);
        return ST_EMISMATCH;
    }
    a->max_step = ((uint64_t)agree[0] >> 20) & ((1ull << 42) - 1);
    a->source = 0xfffffu - (uint32_t)(agree[0] & 0xfffff);
    a->min_step = (uint64_t)-agree[1];
    a->state_bytes = agree[2];
    a->newest_ckpt = (uint64_t)agree[4];
    return 0;
}

/*
 * After the broadcast of the state, an allreduce every member enters only
 * once the state is wholly here: the source's install ends only when
 * every member holds the state. Its sends complete locally before they
 * arrive, and a source that leaves right after its install (a drain that
 * waited to hand the only copy over) must not go while a joiner still
 * receives it. A member that has the state whole keeps it if this fails:
 * the source may leave as soon as its own allreduce ends, before its last
 * message of it reaches us, and the view that follows starts from the
 * state we hold.
 */
static int ack_state(ring_t *r, const mb_view_t *v, uint32_t source)
{
    int64_t one = 1;
    int rc = job__ring_agree(r, &one, 1, KERN_SUM);
    if (rc == 0 || (uint32_t)v->my_index == source)
        return rc;
    RD_INFO("ring backend: generation %llu: the state arrived whole and "
            "its acknowledgement did not complete (%s): keeping the state",
            (unsigned long long)v->generation, st_strerror(rc));
    return 0;
}

/*
 * REBUILD, step 3: resync the state. A job starting again from step 0
 * restores its newest checkpoint from the members' stores; otherwise the
 * source broadcasts its state when the members disagree on the step or a
 * joiner needs it. The trainer counts are agreed in between, so the first
 * step of a view starts on this view's counts.
 */
static int resync_state(job_ring_t *b, ring_t *r, job_ring_cmd_t *c,
                           const agreed_t *a)
{
    const mb_view_t *v = c->view;
    c->step_out = a->max_step;
    c->state_replaced = 0;
    int restored = 0;
    if (a->max_step == 0 && a->newest_ckpt > 0 && a->state_bytes > 0) {
        /* Every member restores (the values are agreed), decoding shards
         * between collectives: none is silent to the others then. */
        ring_set_liveness(r, 0);
        uint64_t step;
        int rc = job__ring_restore(r, v, c->ckpt_root, c->state,
                                   c->state_bytes, a->newest_ckpt, &step);
        if (rc < 0)
            return rc;
        restored = rc == 0;
        if (restored) {
            c->step_out = step;
            c->state_replaced = 1;
        }
    }
    int rc = agree_counts(b, c);
    if (rc != 0 || a->state_bytes <= 0 || restored ||
        (a->max_step == a->min_step && v->n_joiners == 0))
        return rc;
    rc = ring_broadcast(r, c->state, c->state_bytes, a->source);
    if (rc != 0)
        return rc;
    c->state_replaced = (uint32_t)v->my_index != a->source;
    RD_INFO("ring backend: state (%zu bytes, step %llu) sent from "
            "member %u to generation %llu", c->state_bytes,
            (unsigned long long)a->max_step, a->source,
            (unsigned long long)v->generation);
    return ack_state(r, v, a->source);
}

/* REBUILD: replace the ring, agree on the step, resync the state. */
static int rebuild(job_ring_t *b, job_ring_cmd_t *c)
{
    ring_t *r = NULL;
    agreed_t a;
    /* Before the ring: a scan of a slow disk must not make this member
     * look silent to neighbours that heard it on the new ring. */
    uint64_t newest = c->my_step == 0 ? job__restore_newest_local(c->ckpt_root,
                                                         UINT64_MAX)
                                      : 0;
    int rc = replace_ring(b, c->view, &r, &c->suspect, &c->unreachable);
    if (rc == 0)
        rc = agree_step(b, r, c, newest, &a);
    if (rc == 0)
        rc = resync_state(b, r, c, &a);
    if (rc == 0)
        ring_set_liveness(r, b->ring_opts.live_ms);
    return rc;
}

/* The first allreduce of several local buffers says which path they
 * take (the comparison tests read it). */
static void tell_local(job_ring_t *b, ring_t *r, const ring_stats_t *before,
                       uint32_t nbufs)
{
    ring_stats_t st;
    ring_stats(r, &st);
    b->local_told = 1;
    if (st.local_pipelined > before->local_pipelined)
        RD_INFO("ring backend: %u local buffers are reduced chunk by chunk "
                "into the ring (pipelined)", nbufs);
    else if (st.local_in_place > before->local_in_place)
        RD_INFO("ring backend: a fused group of one local buffer runs in "
                "its pieces (in place)");
    else
        RD_INFO("ring backend: %u local buffers are reduced into staging "
                "before the ring and copied back after it (staged%s)",
                nbufs, b->local_staged ? ", RINGD_LOCAL_PIPE=0" : "");
}

/*
 * The node's trainers are summed, reduced across nodes and written back
 * here, on the ring thread, so the main loop (and the lease keepalive on
 * it) never waits for tensor bytes. The first trainer's buffer is the
 * ring's; the others are reduced into it chunk by chunk as the ring needs
 * each chunk, and each chunk goes back to every other buffer as it
 * becomes final, so the local work overlaps the ring
 * (ring_allreduce_t.local). A fused group runs in staging.
 *
 * The descriptor goes to the ring as job_allreduce checked it: AVG with
 * the job's divisor (the ring divides each chunk as its owner finishes
 * it, no pass of its own over the buffer), and RD_WIRE_DEFAULT left for
 * the ring to resolve to its opts.wire, the job's format that every rank
 * of this ring runs with.
 */
static int allreduce(job_ring_t *b, ring_t *r, const job_reduce_t *red)
{
    ring_allreduce_t a = {.buf = red->bufs[0], .count = red->count,
                          .dt = red->dt, .op = red->op,
                          .divisor = red->divisor, .wire = red->wire};
    if (red->nbufs == 1 && red->nsegs <= 1)
        return ring_allreduce(r, &a);
    ring_stats_t st;
    ring_stats(r, &st);
    ring_local_t l = {.bufs = red->bufs, .nbufs = red->nbufs,
                      .nsegs = red->nsegs, .seg_counts = red->seg_counts};
    int rc;
    if (b->local_staged) {
        a.buf = job_reduce_local(red);
        rc = ring_allreduce(r, &a);
        if (rc == 0)
            job_reduce_copy_back(red, a.buf);
    } else {
        a.buf = job_reduce_region(red);
        a.local = &l;
        rc = ring_allreduce(r, &a);
    }
    if (rc == 0 && !b->local_told)
        tell_local(b, r, &st, red->nbufs);
    return rc;
}

/* A collective of the step with this node's flags on its messages; after
 * it, whether it carried every node's and their OR. */
static int collective(job_ring_t *b, job_ring_cmd_t *c)
{
    if (b->ring == NULL)
        return ST_EABORTED;
    ring_set_flags(b->ring, c->flags);
    int rc = c->kind == JOB_CMD_ALLREDUCE
                 ? allreduce(b, b->ring, &c->red)
                 : ring_broadcast(b->ring, c->buf, c->count, c->root);
    ring_set_flags(b->ring, 0);
    c->flags_all = rc == 0 && ring_flags_seen(b->ring, &c->flags_seen);
    return rc;
}

static void run(job_ring_t *b, job_ring_cmd_t *c)
{
    c->suspect = c->suspect2 = c->unreachable = UINT32_MAX;
    c->flags_all = 0;
    c->flags_seen = 0;
    switch (c->kind) {
    case JOB_CMD_REBUILD:
        c->status = rebuild(b, c);
        break;
    case JOB_CMD_AGREE:
        c->status = b->ring ? agree_counts(b, c) : ST_EABORTED;
        break;
    case JOB_CMD_ALLREDUCE:
    case JOB_CMD_BROADCAST:
        c->status = collective(b, c);
        break;
    case JOB_CMD_COMMIT:
        /* Every member entered it once it returns: every member ended
         * the step (n - 1 hops on the flat ring). */
        c->status = b->ring ? ring_barrier(b->ring) : ST_EABORTED;
        break;
    default:
        c->status = ST_EINVAL;
    }
    /* The round's wait is the slowest node's step, not a hop's. */
    if (c->status == 0 && c->kind != JOB_CMD_REBUILD &&
        c->kind != JOB_CMD_COMMIT &&
        b->ring != NULL) {
        ring_stats_t st;
        ring_stats(b->ring, &st);
        c->wait_us = st.last_wait_us;
    }
    if (c->status != 0 && b->ring != NULL) {
        int cause = ring_suspect(b->ring, &c->suspect);
        if (cause == 0)
            c->suspect = UINT32_MAX; /* no failure named */
        else if (c->status == ST_EABORTED)
            c->status = cause; /* a peer broke the ring before this
                                  command began: report that peer */
        if (cause != 0 &&
            ring_other_failed(b->ring, c->suspect, &c->suspect2) == 0)
            c->suspect2 = UINT32_MAX;
    }
}

void *job__ring_thread_main(void *arg)
{
    job_ring_t *b = arg;
    const char *pipe = getenv("RINGD_LOCAL_PIPE");
    b->local_staged = pipe != NULL && strcmp(pipe, "0") == 0;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        /*
         * Idle, the worker is still progressed every THREAD_IDLE_MS: open
         * endpoints (the ring between steps, the replaced ring kept one
         * generation) must answer their peers' wireup, flush and close
         * messages. Left alone for seconds (a node fenced through an etcd
         * outage), UCX 1.13's TCP transport timed such endpoints out and
         * then aborted on an assertion when the peers reconnected.
         */
        while (!b->posted && !b->quit) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += THREAD_IDLE_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            if (pthread_cond_timedwait(&b->cv, &b->mu, &ts) == 0 ||
                b->posted || b->quit)
                continue;
            pthread_mutex_unlock(&b->mu);
            while (tp_progress(b->tp) != 0)
                ;
            /* Heartbeats: neighbours waiting in a collective (for our
             * trainer, say) must see this daemon alive. The older ring
             * too: a neighbour may not have seen the new view yet. */
            ring_service(b->ring);
            ring_service(b->older);
            pthread_mutex_lock(&b->mu);
        }
        if (b->quit)
            break;
        pthread_mutex_unlock(&b->mu);
        run(b, &b->cmd);
        pthread_mutex_lock(&b->mu);
        b->posted = 0;
        uv_async_send(&b->async);
    }
    ring_t *r = b->ring;
    b->ring = NULL;
    pthread_mutex_unlock(&b->mu);
    ring_t *both[2] = {r, b->older};
    for (int i = 0; i < 2; i++) {
        if (both[i] != NULL) {
            ring_abort(both[i]); /* close at once, no flush */
            ring_destroy(both[i]);
        }
    }
    return NULL;
}
