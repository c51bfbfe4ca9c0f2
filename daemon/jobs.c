/*
 * jobs.c - the job a trainer names (PROTO_T_JOB; RINGD_JOB, opts.job).
 *
 * A config that pins a job (--job) serves that one: a trainer naming
 * another is refused, one naming none or the same is served. A ringd with
 * --etcd and no --job serves the job its first trainer names: until then
 * its backend is an idle placeholder (no etcd, no ring); the first name
 * (allowed by --jobs, with its secret) makes it join that job in etcd
 * (job_join). One job at a time: a trainer naming another while it
 * runs is refused with both names. When the job's last trainer is gone the
 * node drains and leaves the job like a stop, and main.c builds a fresh
 * daemon object for the next job (dmn_job_ended). A last trainer that
 * died (no BYE) is likely restarted (ringrun): the node keeps the job,
 * stepped out like a pinned node without trainers, for --job-grace, and
 * a trainer naming the job in that time rejoins at a step boundary with
 * the job's state instead of finding the daemon gone or draining.
 */
#include "daemon/dmn-int.h"
#include "daemon/dmn-parse.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/wire.h"

/* Names the daemon's trainers may name without --job (--etcd given). */
static int unpinned(const dmn_t *d)
{
    return !d->jobs.pinned && d->cfg->etcd != NULL && !d->cfg->standalone;
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
        .ring_fuse_bytes = (uint64_t)cfg->ring_fuse_kib * 1024,
        .ring_chunk_bytes = (uint64_t)cfg->ring_chunk_kib * 1024,
        .ring_bidirectional = (uint32_t)cfg->ring_bidirectional,
        .ring_wire = ring_wire,
        .ckpt_dir = cfg->ckpt_interval > 0 ? cfg->ckpt_dir : NULL,
    };
}

static job_cbs_t job_cbs(dmn_t *d)
{
    return (job_cbs_t){.on_view = dmn__step_on_view, .arg = d,
                       .get_state = dmn__state_lend,
                       .put_state = dmn__state_put,
                       .on_drain = dmn__on_backend_drain};
}

/*
 * The first trainer named job d->jobs.name: swap the placeholder
 * backend, which no step used, for the job's. The options are the
 * daemon's config, as for a pinned job (the job's first view fixes the
 * job-wide ones).
 */
static int job_join(dmn_t *d)
{
    job_config_t jc;
    job_config_from(d->cfg, &jc);
    jc.job = d->jobs.name;
    jc.job_secret_file = d->jobs.secret[0] != '\0' ? d->jobs.secret : NULL;
    job_cbs_t cbs = job_cbs(d);
    job_t *job = NULL;
    int rc = job_create(d->loop, &jc, &cbs, &job);
    /* Checkpoints in the job's own directory, started only with the job:
     * a failed join leaves neither, and the next name starts afresh. */
    if (rc == 0 && (rc = dmn__ckpt_start(d, d->jobs.name)) != 0)
        job_destroy(job);
    if (rc != 0) {
        RD_ERROR("joining job '%s': %s", d->jobs.name, st_strerror(rc));
        return rc;
    }
    job_destroy(d->job);
    d->job = job;
    job_get_view(d->job, &d->view);
    return 0;
}

/*
 * The daemon's first job object: the config's job, or, for a daemon that
 * serves the job its trainers name, an idle placeholder (no etcd, no
 * ring) until one does (job_join).
 */
int dmn__job_start(dmn_t *d)
{
    const dmn_config_t *cfg = d->cfg;
    uv_timer_init(d->loop, &d->jobs.grace_timer);
    d->jobs.grace_timer.data = d;
    d->jobs.pinned = cfg->job != NULL;
    if (d->jobs.pinned)
        snprintf(d->jobs.name, sizeof(d->jobs.name), "%s", cfg->job);
    job_config_t jc;
    job_config_from(cfg, &jc);
    if (jc.job == NULL && jc.etcd != NULL && !cfg->standalone)
        jc = (job_config_t){.spec = "solo", .node = cfg->node_id,
                            .host = cfg->host, .trainers = cfg->trainers,
                            .min_nodes = 1}; /* until a trainer names one */
    job_cbs_t cbs = job_cbs(d);
    int rc = job_create(d->loop, &jc, &cbs, &d->job);
    if (rc != 0)
        return rc;
    job_get_view(d->job, &d->view);
    return 0;
}

int dmn__job_allowed(const char *list, const char *name)
{
    if (list == NULL)
        return 1;
    size_t nlen = strlen(name);
    for (const char *p = list; *p != '\0';) {
        const char *e = strchr(p, ',');
        size_t len = e != NULL ? (size_t)(e - p) : strlen(p);
        while (len > 0 && p[0] == ' ') {
            p++;
            len--;
        }
        while (len > 0 && p[len - 1] == ' ')
            len--;
        if (len > 0 && p[len - 1] == '*') {
            if (nlen >= len - 1 && strncmp(p, name, len - 1) == 0)
                return 1;
        } else if (len == nlen && strncmp(p, name, len) == 0) {
            return 1;
        }
        if (e == NULL)
            break;
        p = e + 1;
    }
    return 0;
}

/* Where job `name`'s secret comes from: DIR/NAME.secret with
 * --job-secret-dir, else --job-secret-file (or none). 0, or a RINGD_*
 * status with why (for the trainer) filled. */
static int job_secret(dmn_t *d, const char *name, char *why, size_t n)
{
    d->jobs.secret[0] = '\0';
    if (d->cfg->job_secret_dir == NULL) {
        if (d->cfg->job_secret_file != NULL)
            snprintf(d->jobs.secret, sizeof(d->jobs.secret), "%s",
                     d->cfg->job_secret_file);
        return 0;
    }
    snprintf(d->jobs.secret, sizeof(d->jobs.secret), "%s/%s.secret",
             d->cfg->job_secret_dir, name);
    char msg[512] = "";
    FILE *err = fmemopen(msg, sizeof(msg) - 1, "w");
    int rc = dmn__config_check_secret(d->jobs.secret, err != NULL ? err
                                                                 : stderr);
    if (err != NULL)
        fclose(err);
    if (rc == 0)
        return 0;
    RD_WARN("job '%s' refused: %s", name, msg);
    snprintf(why, n, "job '%s' has no usable secret on this node "
             "(job-secret-dir): ask the administrator", name);
    d->jobs.secret[0] = '\0';
    return RINGD_EINVAL;
}

/* 0 when c may run job `name` here, else the status (why filled). */
static int job_check(dmn_conn_t *c, const char *name, char *why, size_t n)
{
    dmn_t *d = c->d;
    if (d->jobs.name[0] != '\0') {
        if (strcmp(d->jobs.name, name) == 0)
            return 0;
        if (uv_is_active((uv_handle_t *)&d->jobs.grace_timer)) {
            /* The asker knows its own name; the held one is what helps.
             * Grace is at most an hour, so its seconds fit a short. */
            uint64_t due = uv_timer_get_due_in(&d->jobs.grace_timer);
            snprintf(why, n, "job '%s' is kept %hus for a lost trainer "
                     "(--job-grace)", d->jobs.name,
                     (unsigned short)((due + 999) / 1000));
            return RINGD_ESTATE;
        }
        snprintf(why, n, d->jobs.pinned
                 ? "ringd runs job '%s' (pinned by its config), not '%s'"
                 : "ringd runs job '%s' until its trainers leave; not '%s'",
                 d->jobs.name, name);
        return RINGD_ESTATE;
    }
    if (!unpinned(d))
        return 0; /* standalone, no --job: nothing to join, any name */
    if (d->flags & (DMN_F_DRAIN_REQUESTED | DMN_F_JOB_ENDED)) {
        snprintf(why, n, "ringd is stopping; job '%s' not started", name);
        return RINGD_ESHUTDOWN;
    }
    if (!dmn__job_allowed(d->cfg->jobs, name)) {
        snprintf(why, n, "job '%s' is not among this ringd's jobs (--jobs)",
                 name);
        return RINGD_EINVAL;
    }
    int rc = job_secret(d, name, why, n);
    if (rc != 0)
        return rc;
    snprintf(d->jobs.name, sizeof(d->jobs.name), "%s", name);
    if (job_join(d) != 0) {
        d->jobs.name[0] = '\0';
        snprintf(why, n, "ringd could not join job '%s' (see its log)",
                 name);
        return RINGD_EABORTED;
    }
    RD_INFO("joined job '%s' for its first trainer (uid %u)", name,
            (unsigned)c->uid);
    return 0;
}

void dmn__job_named(dmn_conn_t *c, uint32_t seq, const proto_job_t *j)
{
    char name[sizeof(j->name)];
    memcpy(name, j->name, sizeof(name));
    name[sizeof(name) - 1] = '\0'; /* the validator found the NUL */
    char why[PROTO_TEXT];
    int rc = RINGD_ESTATE;
    if (c->flags & DMN_CONN_F_MEMBER)
        snprintf(why, sizeof(why), "the job is named before the first step");
    else
        rc = job_check(c, name, why, sizeof(why));
    if (rc != 0) {
        RD_WARN("client %u (pid %d, uid %u): %s", c->id, (int)c->pid,
                (unsigned)c->uid, why);
        dmn__reply_error(c, seq, rc, "%s", why);
        return;
    }
    c->flags |= DMN_CONN_F_JOB;
    if (uv_is_active((uv_handle_t *)&c->d->jobs.grace_timer)) {
        uv_timer_stop(&c->d->jobs.grace_timer);
        RD_INFO("job '%s': a trainer is back (client %u, pid %d): the node "
                "keeps the job", c->d->jobs.name, c->id, (int)c->pid);
    }
    dmn__reply_status(c, PROTO_T_JOB, seq, 0);
}

int dmn__job_may_step(dmn_conn_t *c, uint32_t seq)
{
    if (!unpinned(c->d) || (c->flags & DMN_CONN_F_JOB))
        return 0;
    dmn__reply_error(c, seq, RINGD_ESTATE,
                     "this ringd serves the job its trainers name: set "
                     "RINGD_JOB (or job=, opts.job)");
    return RINGD_ESTATE;
}

static int leaving(const dmn_t *d)
{
    return (d->flags & (DMN_F_DRAIN_REQUESTED | DMN_F_DESTROYING)) != 0;
}

static void leave_job(dmn_t *d)
{
    d->flags |= DMN_F_JOB_ENDED;
    dmn_drain(d);
}

static void on_job_grace(uv_timer_t *t)
{
    dmn_t *d = t->data;
    if (leaving(d))
        return;
    for (const dmn_conn_t *o = d->conns; o != NULL; o = o->next)
        if (o->flags & DMN_CONN_F_JOB)
            return; /* one named the job: dmn__job_named stopped us */
    RD_INFO("job '%s': no trainer came back within %u ms (--job-grace); "
            "leaving the job", d->jobs.name, d->cfg->job_grace_ms);
    leave_job(d);
}

void dmn__job_conn_gone(dmn_t *d, const dmn_conn_t *c)
{
    if (!(c->flags & DMN_CONN_F_JOB) || !unpinned(d) || leaving(d))
        return;
    for (const dmn_conn_t *o = d->conns; o != NULL; o = o->next)
        if (o != c && (o->flags & DMN_CONN_F_JOB))
            return;
    if (!(c->flags & DMN_CONN_F_BYE) && d->cfg->job_grace_ms > 0) {
        RD_INFO("job '%s': its last trainer was lost; the node keeps the "
                "job for %u ms (--job-grace) for a replacement",
                d->jobs.name, d->cfg->job_grace_ms);
        uv_timer_start(&d->jobs.grace_timer, on_job_grace,
                       d->cfg->job_grace_ms, 0);
        return;
    }
    RD_INFO("job '%s': its last trainer left; leaving the job",
            d->jobs.name);
    leave_job(d);
}

int dmn_job_ended(const dmn_t *d)
{
    return (d->flags & DMN_F_JOB_ENDED) != 0 &&
           !(d->flags & DMN_F_DRAIN_TIMED_OUT);
}

const char *dmn__job_store_name(const dmn_t *d)
{
    const dmn_config_t *cfg = d->cfg;
    if (unpinned(d))
        return d->jobs.name[0] != '\0' ? d->jobs.name : NULL;
    return cfg->job != NULL && cfg->backend != NULL &&
                   strcmp(cfg->backend, "ring") == 0
               ? cfg->job
               : "standalone";
}

void dmn__job_stop(dmn_t *d)
{
    d->open_handles++;
    uv_close((uv_handle_t *)&d->jobs.grace_timer, dmn__handle_closed);
}
