/*
 * copy.c - copies of the trainers' state made on libuv's thread pool,
 * never on the event loop.
 *
 * The loop renews the etcd lease and answers every trainer; a memcpy of a
 * state region there (175 ms for 1 GiB on the development VM) holds all
 * of that up. So the checkpoint's shard copies, a one-node job's per-step
 * snapshot and a joiner's state run as pool work, and the loop only
 * starts them and takes their outcome.
 *
 * While any of this work is in flight (d->ckpt_copying counts it) the
 * trainers' mappings it may read or write stay mapped (dmn__buf_unmap
 * defers), and while a copy of state is (d->copies_holding; not work
 * with no_hold, like growing the writers' stages) a collective that
 * completes is held until the last one is done (dmn__ckpt_hold): a
 * trainer changes its state only after a collective of its step, so the
 * source bytes are those of the step boundary.
 */
#include "daemon/dmn-int.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"

static void copy_work(uv_work_t *w)
{
    dmn_copy_t *c = w->data;
    uint64_t t0 = rd_now_ns();
    c->work(c);
    c->work_ns = rd_now_ns() - t0;
    pthread_mutex_lock(&c->d->copy_mu);
    c->ran = 1;
    pthread_cond_broadcast(&c->d->copy_cv);
    pthread_mutex_unlock(&c->d->copy_mu);
}

static void unlink_copy(dmn_t *d, dmn_copy_t *c)
{
    for (dmn_copy_t **p = &d->copies; *p != NULL; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            return;
        }
}

static void copy_after(uv_work_t *w, int status)
{
    dmn_copy_t *c = w->data;
    dmn_t *d = c->d;
    uint64_t t0 = rd_now_ns();
    unlink_copy(d, c);
    int held = !c->no_hold;
    d->ckpt_copying--;
    d->copies_holding -= held;
    c->wall_ns = t0 - c->queued_ns;
    /* Destroying: the backend and the connections are gone, so done()
     * only frees (a copy that ran is as good as cancelled). */
    int st = status == UV_ECANCELED || (d->flags & DMN_F_DESTROYING)
                 ? ST_EABORTED
                 : 0;
    c->done(c, st);
    if (held && d->copies_holding == 0 && st == 0) {
        dmn__ckpt_copies_done(d);
        dmn__coll_release(d);
    }
    if (d->ckpt_copying == 0)
        dmn__held_release(d);
    d->stats.ckpt_loop_seconds += (double)(rd_now_ns() - t0) / 1e9;
    dmn__unref(d);
}

int dmn__copy_queue(dmn_t *d, dmn_copy_t *c)
{
    c->d = d;
    c->req.data = c;
    c->ran = 0;
    c->queued_ns = rd_now_ns();
    int rc = uv_queue_work(d->loop, &c->req, copy_work, copy_after);
    if (rc != 0) {
        RD_WARN("state copy not started: %s", uv_strerror(rc));
        return ST_ENOMEM;
    }
    c->next = d->copies;
    d->copies = c;
    d->ckpt_copying++;
    d->copies_holding += !c->no_hold;
    d->open_handles++;
    return 0;
}

int dmn__copy_init(dmn_t *d)
{
    if (pthread_mutex_init(&d->copy_mu, NULL) != 0)
        return ST_ENOMEM;
    if (pthread_cond_init(&d->copy_cv, NULL) != 0) {
        pthread_mutex_destroy(&d->copy_mu);
        return ST_ENOMEM;
    }
    d->flags |= DMN_F_COPY_SYNC_INIT;
    return 0;
}

/*
 * Shutting down: what the copies use (the writers, the mappings) is about
 * to go. A copy not started yet is cancelled; one running is waited for
 * (it is a memcpy: bounded), on the loop, which is exiting anyway.
 */
void dmn__copy_stop(dmn_t *d)
{
    if (!(d->flags & DMN_F_COPY_SYNC_INIT))
        return;
    for (dmn_copy_t *c = d->copies; c != NULL; c = c->next) {
        if (uv_cancel((uv_req_t *)&c->req) == 0)
            continue;
        pthread_mutex_lock(&d->copy_mu);
        while (!c->ran)
            pthread_cond_wait(&d->copy_cv, &d->copy_mu);
        pthread_mutex_unlock(&d->copy_mu);
    }
}

/* After the last copy's after-work callback: nothing uses them. */
void dmn__copy_fini(dmn_t *d)
{
    if (!(d->flags & DMN_F_COPY_SYNC_INIT))
        return;
    d->flags &= ~DMN_F_COPY_SYNC_INIT;
    pthread_cond_destroy(&d->copy_cv);
    pthread_mutex_destroy(&d->copy_mu);
}

void dmn__state_copied(dmn_t *d, size_t bytes)
{
    if (pthread_equal(pthread_self(), d->loop_thread))
        __atomic_add_fetch(&d->stats.loop_copy_bytes, bytes,
                           __ATOMIC_RELAXED);
}

/* A one-node job's per-step snapshot (for joiners), on the pool. */
typedef struct {
    dmn_copy_t base;
    const void *src;
    size_t bytes;
    void *buf;   /* d->snapshot, owned by the copy while it runs */
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
    d->snapshot = s->buf;
    d->snapshot_size = s->cap;
    d->snapshot_copying = 0;
    if (status == 0 && s->rc == 0) {
        d->snapshot_bytes = s->bytes;
        d->snapshot_step = s->step;
        d->stats.snapshots++;
        d->stats.snapshot_seconds += (double)b->work_ns / 1e9;
    } else if (s->rc != 0) {
        RD_WARN("no memory for a %zu-byte state snapshot", s->bytes);
    }
    free(s);
    if (status == 0)
        dmn__step_try_start(d); /* a joiner may wait for it */
}

void dmn__ckpt_snapshot(dmn_t *d, const void *src, size_t bytes,
                        uint64_t step)
{
    if (d->snapshot_copying) {
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
    s->buf = d->snapshot;
    s->cap = d->snapshot_size;
    s->step = step;
    s->base.work = snap_work;
    s->base.done = snap_done;
    if (dmn__copy_queue(d, &s->base) != 0) {
        free(s);
        return;
    }
    d->snapshot = NULL;
    d->snapshot_size = 0;
    d->snapshot_bytes = 0;
    d->snapshot_step = 0;
    d->snapshot_copying = 1;
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
    d->joiner_copying--;
    for (dmn_conn_t *c = d->conns; c != NULL && status == 0 && fc->mark;
         c = c->next)
        for (uint32_t i = 0; i < fc->n; i++)
            if (c->id == fc->f[i].conn_id)
                c->restored_mark = fc->mark;
    free(fc);
    if (status == 0)
        dmn__step_try_start(d);
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
    int rc = dmn__copy_queue(d, &fc->base);
    if (rc != 0) {
        free(fc);
        return rc;
    }
    d->joiner_copying++;
    return 0;
}

int dmn__ckpt_fill_joiners(dmn_t *d, const dmn_fill_t *f, uint32_t n)
{
    return fill_start(d, f, n, d->stats.steps + 1);
}

int dmn__copy_propagate(dmn_t *d, const dmn_fill_t *f, uint32_t n)
{
    return fill_start(d, f, n, 0);
}
