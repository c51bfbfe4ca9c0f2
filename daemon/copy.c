/*
 * copy.c - a pool of copies of trainer state and tensors on libuv's
 * thread pool, never on the event loop.
 *
 * The loop renews the etcd lease and answers every trainer; a memcpy of a
 * state region there (175 ms for 1 GiB on the development VM) holds all
 * of that up. So the checkpoint's shard copies, a one-node job's per-step
 * snapshot, a joiner's state and a collective's large copies into and
 * out of staging (step-queue.c) run as pool work, and the loop only
 * starts them and takes their outcome.
 *
 * The pool is generic, as uv_work_t is: the caller supplies each copy's
 * work() and done(), and the pool's owner one after() callback that hears
 * of every completion once done() has run (dmn.c: a collective held for
 * the copies is released, deferred unmaps run, a waiting step start is
 * tried again, and the reference on the daemon that the queue took, one
 * count in *refs, is dropped), and one on_busy() when a copy is queued on
 * an idle pool (dmn.c: the mappings are held until it is idle again).
 * It calls no other daemon file. It counts the copies in flight (busy:
 * while any runs, the trainers' mappings it may read or write stay
 * mapped) and those that hold a collective (holding: all but the
 * DMN_COPY_F_NO_HOLD work, growing the writers' stages and a
 * collective's own copies): a trainer changes its state only after a
 * collective of its step, so holding the
 * collective's answer keeps the source bytes those of the step boundary.
 */
#include "daemon/dmn-int.h"

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"

static void copy_work(uv_work_t *w)
{
    dmn_copy_t *c = w->data;
    dmn_copy_pool_t *p = c->pool;
    uint64_t t0 = rd_now_ns();
    c->work(c);
    c->work_ns = rd_now_ns() - t0;
    pthread_mutex_lock(&p->mu);
    c->ran = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void unlink_copy(dmn_copy_pool_t *p, dmn_copy_t *c)
{
    for (dmn_copy_t **q = &p->copies; *q != NULL; q = &(*q)->next)
        if (*q == c) {
            *q = c->next;
            return;
        }
}

static void copy_after(uv_work_t *w, int status)
{
    dmn_copy_t *c = w->data;
    dmn_copy_pool_t *p = c->pool;
    uint64_t t0 = rd_now_ns();
    unlink_copy(p, c);
    unsigned flags = c->flags;
    p->busy--;
    p->holding -= !(flags & DMN_COPY_F_NO_HOLD);
    c->wall_ns = t0 - c->queued_ns;
    /* Stopping: the backend and the connections are gone, so done() only
     * frees (a copy that ran is as good as cancelled). */
    int st = status == UV_ECANCELED || p->stopping ? ST_EABORTED : 0;
    c->done(c, st); /* frees c */
    *p->loop_seconds += (double)(rd_now_ns() - t0) / 1e9;
    /* Last: after() drops the reference the queue took (*refs), which
     * may free the owner and this pool with it. */
    p->after(p->arg, flags, st);
}

int dmn__copy_queue(dmn_copy_pool_t *p, dmn_copy_t *c)
{
    c->pool = p;
    c->req.data = c;
    c->ran = 0;
    c->queued_ns = rd_now_ns();
    int rc = uv_queue_work(p->loop, &c->req, copy_work, copy_after);
    if (rc != 0) {
        RD_WARN("state copy not started: %s", uv_strerror(rc));
        return ST_ENOMEM;
    }
    c->next = p->copies;
    p->copies = c;
    if (p->busy++ == 0)
        p->on_busy(p->arg);
    p->holding += !(c->flags & DMN_COPY_F_NO_HOLD);
    ++*p->refs;
    return 0;
}

int dmn__copy_init(dmn_copy_pool_t *p, const dmn_copy_pool_opts_t *o)
{
    *p = (dmn_copy_pool_t){.loop = o->loop, .refs = o->refs,
                           .loop_seconds = o->loop_seconds,
                           .on_busy = o->on_busy, .after = o->after,
                           .arg = o->arg};
    if (pthread_mutex_init(&p->mu, NULL) != 0)
        return ST_ENOMEM;
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        return ST_ENOMEM;
    }
    p->sync_init = 1;
    return 0;
}

int dmn__copy_busy(const dmn_copy_pool_t *p)
{
    return p->busy;
}

int dmn__copy_holding(const dmn_copy_pool_t *p)
{
    return p->holding;
}

/*
 * Shutting down: what the copies use (the writers, the mappings) is about
 * to go. A copy not started yet is cancelled; one running is waited for
 * (it is a memcpy: bounded), on the loop, which is exiting anyway.
 */
void dmn__copy_stop(dmn_copy_pool_t *p)
{
    if (!p->sync_init)
        return;
    p->stopping = 1;
    for (dmn_copy_t *c = p->copies; c != NULL; c = c->next) {
        if (uv_cancel((uv_req_t *)&c->req) == 0)
            continue;
        pthread_mutex_lock(&p->mu);
        while (!c->ran)
            pthread_cond_wait(&p->cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

/* After the last copy's after-work callback: nothing uses them. */
void dmn__copy_fini(dmn_copy_pool_t *p)
{
    if (!p->sync_init)
        return;
    p->sync_init = 0;
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
}
