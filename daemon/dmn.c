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
#include "common/wire.h"

#define DMN_DRAIN_TIMEOUT_MS 10000

static void dmn_free(dmn_t *d)
{
    /* The backend's thread is gone: nothing writes the buffers now. */
    d->coll_in_flight = 0;
    d->state_lent = 0;
    dmn__held_release(d);
    free(d->held);
    free(d->coll_bufs);
    free(d->seg_counts);
    free(d->staging);
    free(d->snapshot);
    dmn__copy_fini(d);
    free(d);
}

void dmn__unref(dmn_t *d)
{
    if (--d->open_handles == 0 && (d->flags & DMN_F_DESTROYING))
        dmn_free(d);
}

/* The handles live inside d: the last one to close frees it. */
void dmn__handle_closed(uv_handle_t *h)
{
    dmn__unref(h->data);
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

/* The job's part of the daemon's settings. */
static void job_config_from(const dmn_config_t *cfg, job_config_t *jc)
{
    /* config.c accepted only concrete names; anything else is none. */
    rd_wire_t ring_wire = RD_WIRE_NONE;
    (void)rd_wire_parse(cfg->ring_wire, &ring_wire);
    *jc = (job_config_t){
        .spec = cfg->backend != NULL ? cfg->backend : "solo",
        .etcd = cfg->etcd,
        .etcd_ca = cfg->etcd_ca,
        .etcd_cert = cfg->etcd_cert,
        .etcd_key = cfg->etcd_key,
        .etcd_user = cfg->etcd_user,
        .etcd_password_file = cfg->etcd_password_file,
        .job_secret_file = cfg->job_secret_file,
        .job = cfg->job,
        .node = cfg->node_id,
        .host = cfg->host,
        .trainers = cfg->trainers,
        .min_nodes = cfg->min_nodes,
        .lease_ttl = cfg->lease_ttl,
        .ring_deadline_ms = cfg->ring_deadline_ms,
        .ring_live_ms = cfg->liveness_ms,
        .ring_grid_min_nodes = cfg->ring_grid_min_nodes,
        .ring_grid_max_bytes = (uint64_t)cfg->ring_grid_max_kib * 1024,
        .ring_grid_cols = cfg->ring_grid_cols,
        .step_commit_off = cfg->step_commit == 0,
        .ring_chunk_bytes = (uint64_t)cfg->ring_chunk_kib * 1024,
        .ring_bidirectional = (uint32_t)cfg->ring_bidirectional,
        .ring_wire = ring_wire,
        .ckpt_dir = cfg->ckpt_interval > 0 ? cfg->ckpt_dir : NULL,
    };
}

static job_cbs_t job_cbs(dmn_t *d)
{
    return (job_cbs_t){.on_view = dmn__step_on_view, .arg = d,
                       .get_state = dmn__step_lend_state,
                       .put_state = dmn__step_return_state,
                       .on_drain = dmn__on_backend_drain};
}

/*
 * The first trainer named job d->job_name (jobs.c): swap the placeholder
 * backend, which no step used, for the job's. The options are the
 * daemon's config, as for a pinned job (the job's first view fixes the
 * job-wide ones).
 */
int dmn__job_join(dmn_t *d)
{
    job_config_t jc;
    job_config_from(d->cfg, &jc);
    jc.job = d->job_name;
    jc.job_secret_file = d->job_secret[0] != '\0' ? d->job_secret : NULL;
    job_cbs_t cbs = job_cbs(d);
    job_t *job = NULL;
    int rc = job_create(d->loop, &jc, &cbs, &job);
    if (rc != 0) {
        RD_ERROR("joining job '%s': %s", d->job_name, st_strerror(rc));
        return rc;
    }
    job_destroy(d->job);
    d->job = job;
    job_get_view(d->job, &d->view);
    return 0;
}

int dmn_create(uv_loop_t *loop, const dmn_config_t *cfg,
               const dmn_hooks_t *hooks, dmn_t **d_p)
{
    dmn_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return ST_ENOMEM;
    d->loop = loop;
    d->cfg = cfg;
    d->listen_fd = -1;
    /* The copying path stays selectable, to compare results with it. */
    const char *zc = getenv("RINGD_ZERO_COPY");
    d->zero_copy = zc == NULL || strcmp(zc, "0") != 0;
    d->start_ms = dmn__now_ms();
    d->loop_thread = pthread_self();
    if (dmn__copy_init(d) != 0) {
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
    uv_timer_init(loop, &d->job_grace_timer);
    d->job_grace_timer.data = d;
    d->lag_due_ns = rd_now_ns() + DMN_LAG_PERIOD_MS * 1000000ULL;
    uv_timer_start(&d->lag_timer, on_lag_timer, DMN_LAG_PERIOD_MS,
                   DMN_LAG_PERIOD_MS);

    job_config_t jc;
    job_config_from(cfg, &jc);
    dmn__job_init(d);
    if (jc.job == NULL && jc.etcd != NULL && !cfg->standalone)
        jc = (job_config_t){.spec = "solo", .node = cfg->node_id,
                            .host = cfg->host, .trainers = cfg->trainers,
                            .min_nodes = 1}; /* until a trainer names one */
    job_cbs_t cbs = job_cbs(d);
    int rc = job_create(loop, &jc, &cbs, &d->job);
    if (rc != 0)
        goto err_timer;
    job_get_view(d->job, &d->view);
    /* The stop functions also undo a start that failed half way. */
    rc = dmn__server_start(d);
    if (rc != 0)
        goto err_server;
    rc = dmn__ckpt_start(d);
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
    d->open_handles += 4;
    uv_close((uv_handle_t *)&d->drain_timer, dmn__handle_closed);
    uv_close((uv_handle_t *)&d->stall_timer, dmn__handle_closed);
    uv_close((uv_handle_t *)&d->lag_timer, dmn__handle_closed);
    uv_close((uv_handle_t *)&d->job_grace_timer, dmn__handle_closed);
    return rc;
}

static void on_drain_timeout(uv_timer_t *t)
{
    dmn_t *d = t->data;
    RD_WARN("drain: trainers did not come back within %d ms; exiting",
            DMN_DRAIN_TIMEOUT_MS);
    /* A trainer stuck mid-step never lets the step close: give up on it
     * (dmn_done() accepts a timed-out drain). */
    d->flags |= DMN_F_DRAIN_TIMED_OUT;
    d->flags |= DMN_F_LEAVE_DONE;
    dmn__step_force_drained(d);
    uv_stop(d->loop);
}

/* Membership's drain key: the same as SIGTERM. */
void dmn__on_backend_drain(void *arg)
{
    dmn_drain(arg);
}

void dmn_drain(dmn_t *d)
{
    if (d->flags & DMN_F_DRAIN_REQUESTED)
        return;
    RD_INFO("drain requested: finishing step %llu",
            (unsigned long long)d->step);
    uv_timer_start(&d->drain_timer, on_drain_timeout, DMN_DRAIN_TIMEOUT_MS,
                   0);
    dmn__step_drain(d);
}

int dmn_restart(dmn_t *d)
{
    if (d->flags & DMN_F_DRAIN_REQUESTED)
        return dmn_restarting(d); /* a stop under way stays a stop */
    d->flags |= DMN_F_RESTART;
    RD_INFO("restart requested: trainers will wait for the next ringd");
    dmn_drain(d);
    return 1;
}

int dmn_restarting(const dmn_t *d)
{
    return (d->flags & DMN_F_RESTART) != 0;
}

void dmn_destroy(dmn_t *d)
{
    if (d == NULL)
        return;
    d->flags |= DMN_F_DESTROYING;
    dmn__server_stop(d);
    dmn__ckpt_stop(d);
    dmn__metrics_stop(d);
    d->open_handles += 4;
    uv_close((uv_handle_t *)&d->drain_timer, dmn__handle_closed);
    uv_close((uv_handle_t *)&d->stall_timer, dmn__handle_closed);
    uv_close((uv_handle_t *)&d->lag_timer, dmn__handle_closed);
    uv_close((uv_handle_t *)&d->job_grace_timer, dmn__handle_closed);
    job_destroy(d->job);
    /* d is freed by the last close callback, once the caller runs the
     * loop (dmn.h). */
}
