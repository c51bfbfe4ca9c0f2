/*
 * state.c - the trainers' state regions as the node's copy of the job's
 * state: which one is primary (what the backend sends to joiners and
 * replaces on a restore), lending it to the backend for a view install,
 * and the copies between regions: a one-node job's per-step snapshot, a
 * joiner's fill, and the propagation of a restored state to the node's
 * other trainers. Every copy runs on the pool (copy.c), never on the loop;
 * a step waiting for one starts when it is done (DMN_COPY_F_KICK).
 */
#include "daemon/dmn-int.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

/* A copy that a waiting step start depends on. */
static int state_copy_queue(dmn_t *d, dmn_copy_t *c)
{
    c->d = d;
    c->flags |= DMN_COPY_F_KICK;
    return dmn__copy_queue(&d->pool, c);
}

/* A one-node job's per-step snapshot (for joiners), on the pool. */
typedef struct {
    dmn_copy_t base;
    const void *src;
    size_t bytes;
    void *buf;   /* d->st.snap, owned by the copy while it runs */
    size_t cap;
    uint64_t step;
    int rc;
} snap_copy_t;

static void snap_work(dmn_copy_t *b)
{
    snap_copy_t *s = (snap_copy_t *)b;
    if (s->cap < s->bytes) {
        void *p = realloc(s->buf, s->bytes);
        if (p == NULL) {
            s->rc = ST_ENOMEM;
            return;
        }
        s->buf = p;
        s->cap = s->bytes;
    }
    memcpy(s->buf, s->src, s->bytes);
    dmn__state_copied(b->d, s->bytes);
}

static void snap_done(dmn_copy_t *b, int status)
{
    snap_copy_t *s = (snap_copy_t *)b;
    dmn_t *d = b->d;
    d->st.snap = s->buf;
    d->st.snap_size = s->cap;
    d->st.snap_copying = 0;
    if (status == 0 && s->rc == 0) {
        d->st.snap_bytes = s->bytes;
        d->st.snap_step = s->step;
        d->stats.snapshots++;
        d->stats.snapshot_seconds += (double)b->work_ns / 1e9;
    } else if (s->rc != 0) {
        RD_WARN("no memory for a %zu-byte state snapshot", s->bytes);
    }
    free(s); /* a joiner may wait for it: the copy kicks try_start */
}

static void snapshot(dmn_t *d, const void *src, size_t bytes,
                     uint64_t step)
{
    if (d->st.snap_copying) {
        /* A step without a collective outran the copy: this boundary
         * keeps no snapshot (a joiner keeps its own state, as when
         * memory runs out). */
        RD_DEBUG("snapshot of step %llu: the previous copy still runs",
                 (unsigned long long)step);
        return;
    }
    snap_copy_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        RD_WARN("no memory for a state snapshot");
        return;
    }
    s->src = src;
    s->bytes = bytes;
    s->buf = d->st.snap;
    s->cap = d->st.snap_size;
    s->step = step;
    s->base.work = snap_work;
    s->base.done = snap_done;
    if (state_copy_queue(d, &s->base) != 0) {
        free(s);
        return;
    }
    d->st.snap = NULL;
    d->st.snap_size = 0;
    d->st.snap_bytes = 0;
    d->st.snap_step = 0;
    d->st.snap_copying = 1;
}

/*
 * Keep the job's state as of this step boundary, for a trainer that joins
 * after every local one died. Only a node that is the whole job needs it:
 * with other nodes in the view, a node left without trainers steps out,
 * and its next trainer receives the job's state from them over the ring
 * (job/README.md), so the per-step copy of the whole state region (175 ms
 * a step for 1 GiB here) is not paid there. The copy runs on the pool
 * while the next step runs (copy.c), like a checkpoint's.
 */
void dmn__state_boundary(dmn_t *d)
{
    if (d->view.node_count > 1)
        return;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (!dmn__conn_is_member(c) || !dmn__conn_has_state(c))
            continue;
        const void *src = dmn__buf_ptr(c, c->state.buf_id, c->state.offset,
                                       c->state.bytes);
        if (src != NULL) /* the step it is the input of: */
            snapshot(d, src, c->state.bytes, d->step + 1);
        return;
    }
}

/* Joiners' state regions filled from a member's (or the snapshot), or
 * the node's other trainers' from the state the job replaced. */
typedef struct {
    dmn_copy_t base;
    uint32_t n;
    uint64_t mark;  /* 0: a propagation, no joiner to mark */
    dmn_fill_t f[];
} fill_copy_t;

static void fill_work(dmn_copy_t *b)
{
    fill_copy_t *fc = (fill_copy_t *)b;
    for (uint32_t i = 0; i < fc->n; i++) {
        memcpy(fc->f[i].dst, fc->f[i].src, fc->f[i].bytes);
        dmn__state_copied(b->d, fc->f[i].bytes);
    }
}

static void fill_done(dmn_copy_t *b, int status)
{
    fill_copy_t *fc = (fill_copy_t *)b;
    dmn_t *d = b->d;
    d->st.joiner_copying--;
    for (dmn_conn_t *c = d->conns; c != NULL && status == 0 && fc->mark;
         c = c->next)
        for (uint32_t i = 0; i < fc->n; i++)
            if (c->id == fc->f[i].conn_id)
                c->restored_mark = fc->mark;
    free(fc);
}

static int fill_start(dmn_t *d, const dmn_fill_t *f, uint32_t n,
                      uint64_t mark)
{
    fill_copy_t *fc = calloc(1, sizeof(*fc) + n * sizeof(*f));
    if (fc == NULL)
        return ST_ENOMEM;
    fc->n = n;
    fc->mark = mark;
    memcpy(fc->f, f, n * sizeof(*f));
    fc->base.work = fill_work;
    fc->base.done = fill_done;
    int rc = state_copy_queue(d, &fc->base);
    if (rc != 0) {
        free(fc);
        return rc;
    }
    d->st.joiner_copying++;
    return 0;
}


/* Where a joiner's state comes from: a member's, or the snapshot. */
static const void *joiner_source(dmn_t *d, const dmn_conn_t *j)
{
    const void *src = NULL;
    for (dmn_conn_t *c = d->conns; c != NULL && src == NULL; c = c->next)
        if (dmn__conn_is_member(c) && dmn__conn_has_state(c) &&
            c->state.bytes == j->state.bytes)
            src = dmn__buf_ptr(c, c->state.buf_id, c->state.offset,
                               c->state.bytes);
    if (src == NULL && d->st.snap_bytes == j->state.bytes &&
        d->st.snap_step == d->step)
        src = d->st.snap;
    return src;
}

/*
 * Copy the job's state into the waiting joiners' regions, off the loop
 * (copy.c). 1: a copy runs (or the snapshot is still being made), and
 * the step start is tried again when it is done; 0: every joiner is
 * ready.
 */
int dmn__state_fill_joiners(dmn_t *d)
{
    if (d->st.joiner_copying)
        return 1;
    dmn_fill_t *f = NULL;
    uint32_t n = 0;
    for (dmn_conn_t *j = d->conns; j != NULL; j = j->next) {
        if (j->cstate != DMN_CONN_WAITING || dmn__conn_is_member(j) ||
            !dmn__conn_has_state(j) || j->restored_mark == d->stats.steps + 1)
            continue;
        if (d->st.snap_copying) {
            free(f);
            return 1; /* the source may be the snapshot being made */
        }
        if (f == NULL && (f = calloc(d->nconns, sizeof(*f))) == NULL)
            break; /* logged below */
        void *dst = dmn__buf_ptr(j, j->state.buf_id, j->state.offset,
                                 j->state.bytes);
        const void *src = joiner_source(d, j);
        if (src != NULL && dst != NULL)
            f[n++] = (dmn_fill_t){j->id, dst, src, j->state.bytes};
    }
    int queued = n > 0 && fill_start(d, f, n, d->stats.steps + 1) == 0;
    if (n > 0 && !queued)
        RD_WARN("joiners start without the job's state: out of memory");
    free(f);
    return queued;
}

/* The joiner's state was filled for this start: 1 when restored. */
int dmn__state_joiner_filled(dmn_t *d, dmn_conn_t *j)
{
    if (!dmn__conn_has_state(j) || j->restored_mark != d->stats.steps + 1)
        return 0;
    j->restored_mark = 0;
    d->stats.restores++;
    RD_INFO("client %u: state restored (%llu bytes, step %llu)", j->id,
            (unsigned long long)j->state.bytes, (unsigned long long)d->step);
    return 1;
}

static int propagate(dmn_t *d, const dmn_fill_t *f, uint32_t n)
{
    return fill_start(d, f, n, 0);
}

/* The first trainer with a state region, members first: the one whose
 * state the backend sends and replaces. */
dmn_conn_t *dmn__state_primary(dmn_t *d, void **ptr_p)
{
    for (int pass = 0; pass < 2; pass++)
        for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
            if (!dmn__conn_has_state(c) || (pass == 0 ? !dmn__conn_is_member(c)
                                            : c->cstate != DMN_CONN_WAITING))
                continue;
            *ptr_p = dmn__buf_ptr(c, c->state.buf_id, c->state.offset,
                                  c->state.bytes);
            if (*ptr_p != NULL)
                return c;
        }
    return NULL;
}

void dmn__state_get(void *arg, void **ptr_p, size_t *bytes_p)
{
    void *p = NULL;
    dmn_conn_t *c = dmn__state_primary(arg, &p);
    *ptr_p = c ? p : NULL;
    *bytes_p = c ? (size_t)c->state.bytes : 0;
}

void dmn__state_lend(void *arg, void **ptr_p, size_t *bytes_p)
{
    dmn_t *d = arg;
    dmn__state_get(d, ptr_p, bytes_p);
    dmn__maps_hold(d, DMN_MAPS_INSTALL);
}

void dmn__state_put(void *arg)
{
    dmn_t *d = arg;
    dmn__maps_release(d, DMN_MAPS_INSTALL);
}

/* The other local trainers' state regions of p's size, into f (room
 * for d->nconns). */
uint32_t dmn__state_others(dmn_t *d, const dmn_conn_t *p, dmn_fill_t *f)
{
    uint32_t n = 0;
    for (dmn_conn_t *c = d->conns; c != NULL && n < d->nconns;
         c = c->next) {
        if (c == p || !dmn__conn_has_state(c) ||
            c->state.bytes != p->state.bytes)
            continue;
        void *dst = dmn__buf_ptr(c, c->state.buf_id, c->state.offset,
                                 c->state.bytes);
        if (dst != NULL)
            f[n++] = (dmn_fill_t){c->id, dst, NULL, c->state.bytes};
    }
    return n;
}

/* The backend replaced the primary state: give every local trainer the
 * same bytes, so the node's replicas stay identical (off the loop; no
 * step starts before they are there). */
void dmn__state_propagate(dmn_t *d)
{
    void *src = NULL;
    dmn_conn_t *p = dmn__state_primary(d, &src);
    if (p == NULL)
        return;
    dmn_fill_t *f = calloc(d->nconns, sizeof(*f));
    uint32_t n = f != NULL ? dmn__state_others(d, p, f) : 0;
    for (uint32_t i = 0; i < n; i++)
        f[i].src = src;
    if (f == NULL || (n > 0 && propagate(d, f, n) != 0))
        RD_WARN("the restored state was not copied to the node's other "
                "trainers: out of memory");
    free(f);
    d->stats.restores++;
}

void dmn__state_fini(dmn_t *d)
{
    free(d->st.snap);
    d->st.snap = NULL;
}
