/*
 * dmn.c - the daemon object: wires the backend, the local API server and
 * the metrics server onto one loop, and tears them down.
 */
#include "daemon/dmn-int.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"

static void dmn_free(dmn_t *d)
{
    /* The backend's thread is gone: nothing writes the buffers now. */
    dmn__maps_fini(d);
    dmn__queue_fini(d);
    dmn__state_fini(d);
    dmn__copy_fini(&d->pool);
    free(d);
}

/* Copies read and write the trainers' mappings on the pool's threads:
 * none is unmapped until the pool is idle again (copy_after). */
static void copy_busy(void *arg)
{
    dmn__maps_hold(arg, DMN_MAPS_COPIES);
}

/*
 * A copy on the pool is done (copy.c calls this after its done()): a
 * collective held for the copies is answered once the last one it waits
 * for is, the unmaps deferred while any ran happen when none does, and a
 * step start that waited for the copy is tried again. Last, the reference
 * the copy held on d goes (it may free d).
 */
static void copy_after(void *arg, unsigned flags, int status)
{
    dmn_t *d = arg;
    if (!(flags & DMN_COPY_F_NO_HOLD) && status == 0 &&
        dmn__copy_holding(&d->pool) == 0) {
        dmn__ckpt_copies_done(d);
        dmn__coll_release(d);
    }
    if (dmn__copy_busy(&d->pool) == 0)
        dmn__maps_release(d, DMN_MAPS_COPIES);
    if ((flags & DMN_COPY_F_KICK) && status == 0)
        dmn__step_try_start(d);
    dmn__unref(d);
}

/*
 * The loop's lag: how late a periodic timer fires. Anything that holds the
 * loop (a memcpy of tensor data, a long callback) delays the lease
 * keepalive by as much; the worst since the last scrape is exported
 * (ringd_loop_lag_max_seconds), so a scraper sees each window's.
 */
static void on_lag_timer(uv_timer_t *t)
{
    dmn_t *d = t->data;
    uint64_t now = rd_now_ns();
    if (now > d->lag_due_ns) {
        double lag = (double)(now - d->lag_due_ns) / 1e9;
        if (lag > d->stats.loop_lag_max)
            d->stats.loop_lag_max = lag;
    }
    d->lag_due_ns = now + DMN_LAG_PERIOD_MS * 1000000ULL;
}

int dmn_create(uv_loop_t *loop, const dmn_config_t *cfg,
               const dmn_hooks_t *hooks, dmn_t **d_p)
{
    dmn_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return ST_ENOMEM;
    d->loop = loop;
    d->cfg = cfg;
    d->free_fn = dmn_free;
    d->conn_changed = dmn__step_stall_arm;
    dmn__server_init(d);
    dmn__queue_init(d);
    d->start_ms = dmn__now_ms();
    d->loop_thread = pthread_self();
    dmn_copy_pool_opts_t po = {loop, &d->open_handles,
                               &d->stats.ckpt_loop_seconds, copy_busy,
                               copy_after, d};
    if (dmn__copy_init(&d->pool, &po) != 0) {
        free(d);
        return ST_ENOMEM;
    }
    if (hooks != NULL)
        d->hooks = *hooks;
    uv_timer_init(loop, &d->drain_timer);
    d->drain_timer.data = d;
    uv_timer_init(loop, &d->stall_timer);
    d->stall_timer.data = d;
    uv_timer_init(loop, &d->lag_timer);
    d->lag_timer.data = d;
    d->lag_due_ns = rd_now_ns() + DMN_LAG_PERIOD_MS * 1000000ULL;
    uv_timer_start(&d->lag_timer, on_lag_timer, DMN_LAG_PERIOD_MS,
                   DMN_LAG_PERIOD_MS);

    int rc = dmn__job_start(d);
    if (rc != 0)
        goto err_timer;
    /* The stop functions also undo a start that failed half way. */
    rc = dmn__server_start(d);
    if (rc != 0)
        goto err_server;
    rc = dmn__ckpt_start(d, dmn__job_store_name(d));
    if (rc != 0)
        goto err_ckpt;
    rc = dmn__metrics_start(d);
    if (rc != 0)
        goto err_metrics;
    *d_p = d;
    return 0;

err_metrics:
    dmn__metrics_stop(d);
err_ckpt:
    dmn__ckpt_stop(d);
err_server:
    dmn__server_stop(d);
    job_destroy(d->job);
err_timer:
    /* d is freed when its last handle has closed (the caller runs the
     * loop, as after dmn_destroy). */
    d->flags |= DMN_F_DESTROYING;
    d->open_handles += 3;
    uv_close((uv_handle_t *)&d->drain_timer, dmn__handle_closed);
    uv_close((uv_handle_t *)&d->stall_timer, dmn__handle_closed);
    uv_close((uv_handle_t *)&d->lag_timer, dmn__handle_closed);
    dmn__job_stop(d);
    return rc;
}

void dmn_destroy(dmn_t *d)
{
    if (d == NULL)
        return;
    d->flags |= DMN_F_DESTROYING;
    dmn__server_stop(d);
    dmn__ckpt_stop(d);
    dmn__metrics_stop(d);
    d->open_handles += 3;
    uv_close((uv_handle_t *)&d->drain_timer, dmn__handle_closed);
    uv_close((uv_handle_t *)&d->stall_timer, dmn__handle_closed);
    uv_close((uv_handle_t *)&d->lag_timer, dmn__handle_closed);
    dmn__job_stop(d);
    job_destroy(d->job);
    /* d is freed by the last close callback, once the caller runs the
     * loop (dmn.h). */
}
