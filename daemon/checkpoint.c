/*
 * checkpoint.c - the daemon's use of checkpoint/: a checkpoint every
 * --ckpt-interval steps at a step boundary, and a restore when a job starts.
 *
 * At step boundary S (every trainer ended step S-1) with S % interval == 0,
 * node r of N hands two shards of its state region to two asynchronous
 * writers: shard r (the primary) and shard r-1 (the replica of its ring
 * predecessor). The state of a data-parallel job is the same on every
 * node, so the successor can encode its predecessor's replica from its own
 * copy: no bytes cross the network for checkpoints and no collective is
 * needed, at the price of compressing 2/N of the state instead of 1/N.
 *
 * The snapshot copies run on the writers' threads while the next step
 * runs (ckpt_writer_submit_live), never on the main loop. A trainer reads
 * its parameters until its optimizer step, which follows its step's
 * collective, so the state stays as it was at the boundary as long as no
 * collective of the next step is answered before both copies are done:
 * coll_done holds a completed one until then (dmn__ckpt_hold), which is
 * the only stall checkpoints put on the training path, and only when the
 * copy is slower than the trainer's forward and backward pass. Trainers'
 * mappings are not unmapped while a copy may read them (dmn__buf_unmap).
 *
 * When both of this node's files are written, two records may complete
 * the checkpoint:
 *  - the job's, through the backend (ckpt_report: the ring backend puts
 *    the node's two shard headers in etcd, and the node that sees every
 *    shard with its two copies writes the manifest key); this works
 *    whatever the directories are, one per node or shared;
 *  - the directory's: if the step's 2N files are all in this node's
 *    directory (one machine, a shared file system), MANIFEST.json, which
 *    restore reads. Every node that completes the set writes the same
 *    manifest, atomically, so it does not matter who is first.
 * Both apply retention (the same CKPT_KEEP newest). The directory's
 * record is written on libuv's thread pool, never on the event loop.
 *
 * On request (ringd_checkpoint): the backend carries the request into the
 * view of the next step that starts on every node, and every node takes
 * the checkpoint when that step ends, so all of them hold the same step.
 *
 * Restore: at the node's first step start, with its trainers' state
 * registered, the newest checkpoint whose shards verify (repaired from
 * replicas, or an older one) is copied into the state and the node starts
 * at its step; a ring backend then makes that state the job's (the
 * member furthest ahead sends its state to all).
 */
#include "daemon/dmn-int.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/ckpt.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"

#define CKPT_KEEP 3

/* Worker threads report here; main reads it in the async callback. */
static void on_written(dmn_t *d, int which, int status,
                       const ckpt_shard_info_t *info)
{
    pthread_mutex_lock(&d->ckpt_mu);
    d->ckpt_done_step[which] = info->step;
    d->ckpt_done_status[which] = status;
    d->ckpt_done_info[which] = *info;
    pthread_mutex_unlock(&d->ckpt_mu);
    uv_async_send(&d->ckpt_async);
}

static void on_primary(void *arg, int status, const ckpt_shard_info_t *info,
                       const void *file, size_t len)
{
    (void)file;
    (void)len;
    on_written(arg, 0, status, info);
}

static void on_replica(void *arg, int status, const ckpt_shard_info_t *info,
                       const void *file, size_t len)
{
    (void)file;
    (void)len;
    on_written(arg, 1, status, info);
}

static void on_copied(void *arg, const ckpt_shard_info_t *info)
{
    dmn_t *d = arg;
    (void)info;
    pthread_mutex_lock(&d->ckpt_mu);
    d->ckpt_copied++;
    pthread_mutex_unlock(&d->ckpt_mu);
    uv_async_send(&d->ckpt_async);
}

int dmn__ckpt_hold(dmn_t *d, int status)
{
    if (!d->ckpt_copying || status != 0)
        return 0;
    if (!d->coll_held) {
        d->stats.ckpt_holds++;
        d->coll_held_ns = rd_now_ns();
    }
    d->coll_held = 1;
    d->coll_held_status = status;
    return 1;
}

/* Main loop: both copies of the last boundary are done? */
static void check_copies(dmn_t *d)
{
    pthread_mutex_lock(&d->ckpt_mu);
    uint32_t copied = d->ckpt_copied;
    pthread_mutex_unlock(&d->ckpt_mu);
    if (!d->ckpt_copying || copied < 2)
        return;
    d->ckpt_copying = 0;
    uint64_t now = rd_now_ns();
    double copy_ms = (double)(now - d->ckpt_copy_start_ns) / 1e6;
    if (d->coll_held)
        RD_INFO("checkpoint: state copied off the main loop in %.1f ms; a "
                "collective waited %.1f ms for it", copy_ms,
                (double)(now - d->coll_held_ns) / 1e6);
    else
        RD_INFO("checkpoint: state copied off the main loop in %.1f ms; "
                "no collective waited", copy_ms);
    dmn__held_release(d);
    dmn__coll_release(d);
}

static int file_exists(const char *root, uint64_t step, const char *kind,
                       uint32_t i)
{
    char dir[PATH_MAX], path[PATH_MAX + 64];
    if (ckpt_store_step_dir(root, step, dir, sizeof(dir)) != 0)
        return 0;
    snprintf(path, sizeof(path), "%s/%s-%05u.rckp", dir, kind, i);
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The manifest, from the primaries' own (checked) headers. */
static int build_manifest(const char *root, uint64_t step, uint32_t n,
                          ckpt_manifest_t **m_p)
{
    ckpt_manifest_t *m = ckpt_manifest_new(n);
    if (m == NULL)
        return ST_ENOMEM;
    char dir[PATH_MAX];
    ckpt_store_step_dir(root, step, dir, sizeof(dir));
    for (uint32_t i = 0; i < n; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof(path), "%s/shard-%05u.rckp", dir, i);
        ckpt_shard_info_t in;
        int rc = ckpt_shard_peek_file(path, &in);
        if (rc == 0 && (in.step != step || in.nshards != n || in.shard != i))
            rc = ST_ECORRUPT;
        if (rc != 0) {
            ckpt_manifest_free(m);
            return rc;
        }
        m->total_size = in.total_size;
        m->generation = in.generation;
        m->elem_size = in.elem_size;
        m->shards[i] = (ckpt_manifest_shard_t){
            .offset = in.offset, .size = in.raw_size,
            .raw_xxh64 = in.raw_xxh64, .base_step = in.base_step,
            .owner = i, .replica = (i + 1) % n, .flags = in.flags};
        char name[32];
        snprintf(name, sizeof(name), "member%u", i);
        m->members[i] = strdup(name);
    }
    m->step = step;
    *m_p = m;
    return 0;
}

/*
 * Completing the set reads the step's headers and writes MANIFEST.json
 * with fsyncs, then applies retention: on a slow or stalled disk that
 * takes seconds, which the event loop (trainers, etcd keepalives, the
 * ring's view changes) must never wait for. So it runs on libuv's thread
 * pool, one at a time (retention must not race a newer manifest), and
 * only the outcome comes back to the loop.
 */
typedef struct {
    uv_work_t req;
    dmn_t *d;    /* held through open_handles until complete_done */
    const char *root;
    int dir_only; /* no job-wide record: this one counts, with retention */
    uint64_t step;
    uint32_t n;
    int rc;      /* 0 complete, 1 not every file here yet, else ST_* */
    int removed; /* steps retention removed */
} ckpt_complete_t;

static pthread_mutex_t complete_mu = PTHREAD_MUTEX_INITIALIZER;

static void complete_work(uv_work_t *w)
{
    ckpt_complete_t *c = w->data;
    pthread_mutex_lock(&complete_mu);
    c->rc = 0;
    for (uint32_t i = 0; i < c->n && c->rc == 0; i++)
        if (!file_exists(c->root, c->step, "shard", i) ||
            !file_exists(c->root, c->step, "replica", i))
            c->rc = 1; /* another node will complete it */
    ckpt_manifest_t *m = NULL;
    if (c->rc == 0)
        c->rc = build_manifest(c->root, c->step, c->n, &m);
    if (c->rc == 0)
        c->rc = ckpt_store_put_manifest(c->root, m);
    ckpt_manifest_free(m);
    /* A ring backend applies retention after its report (it also copies
     * manifests from etcd first): once per checkpoint is enough. */
    if (c->rc == 0 && c->dir_only)
        c->removed = ckpt_store_retain(c->root, CKPT_KEEP);
    pthread_mutex_unlock(&complete_mu);
}

static void complete_done(uv_work_t *w, int status)
{
    ckpt_complete_t *c = w->data;
    dmn_t *d = c->d;
    if (status != 0 || c->rc < 0) {
        RD_WARN("checkpoint of step %" PRIu64 " not completed: %s", c->step,
                status != 0 ? uv_strerror(status) : st_strerror(c->rc));
    } else if (c->rc == 0 && c->dir_only) {
        /* With a job-wide record, that one counts the checkpoint. */
        d->stats.ckpt_taken++;
        RD_INFO("checkpoint of step %" PRIu64 " complete (%u shards, 2 "
                "copies each)", c->step, c->n);
        if (c->removed > 0)
            RD_DEBUG("checkpoint retention removed %d old steps",
                     c->removed);
    } else if (c->rc == 0) {
        RD_DEBUG("checkpoint of step %" PRIu64 ": MANIFEST.json written",
                 c->step);
    }
    free(c);
    dmn__unref(d);
}

/* Both of this node's files of `step` are written: complete the set? */
static void try_complete(dmn_t *d, uint64_t step, uint32_t n)
{
    ckpt_complete_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        RD_WARN("checkpoint of step %" PRIu64 " not completed: out of "
                "memory", step);
        return;
    }
    c->req.data = c;
    c->d = d;
    c->root = d->ckpt_root;
    c->dir_only = d->be->ops->ckpt_report == NULL;
    c->step = step;
    c->n = n;
    int rc = uv_queue_work(d->loop, &c->req, complete_work, complete_done);
    if (rc != 0) {
        RD_WARN("checkpoint of step %" PRIu64 " not completed: %s", step,
                uv_strerror(rc));
        free(c);
        return;
    }
    d->open_handles++;
}

static void on_reported(void *arg, int status)
{
    dmn_t *d = arg;
    if (status == 1) {
        d->stats.ckpt_taken++;
        RD_INFO("checkpoint of step %" PRIu64 " complete (every shard has "
                "2 copies; manifest in etcd)", d->ckpt_reported_step);
    } else if (status < 0) {
        d->stats.ckpt_failed++;
    }
}

static void on_ckpt_async(uv_async_t *h)
{
    dmn_t *d = h->data;
    check_copies(d);
    pthread_mutex_lock(&d->ckpt_mu);
    uint64_t s0 = d->ckpt_done_step[0], s1 = d->ckpt_done_step[1];
    int r0 = d->ckpt_done_status[0], r1 = d->ckpt_done_status[1];
    job_ckpt_files_t f = {.primary = d->ckpt_done_info[0],
                          .replica = d->ckpt_done_info[1],
                          .keep = CKPT_KEEP};
    pthread_mutex_unlock(&d->ckpt_mu);
    uint64_t want = d->ckpt_pending_step;
    if (want == 0 || s0 != want || s1 != want)
        return;
    d->ckpt_pending_step = 0;
    if (r0 != 0 || r1 != 0) {
        d->stats.ckpt_failed++;
        RD_WARN("checkpoint of step %" PRIu64 " failed (%s); training goes "
                "on and older checkpoints stay", want,
                st_strerror(r0 ? r0 : r1));
        return;
    }
    if (d->be->ops->ckpt_report != NULL) {
        d->ckpt_reported_step = want;
        int rc = d->be->ops->ckpt_report(d->be, &f, on_reported, d);
        if (rc != 0) {
            d->stats.ckpt_failed++;
            RD_WARN("checkpoint of step %" PRIu64 " not recorded: %s", want,
                    st_strerror(rc));
        }
    }
    try_complete(d, want, d->ckpt_pending_n);
}

int dmn__ckpt_start(dmn_t *d)
{
    const dmn_config_t *cfg = d->cfg;
    if (cfg->ckpt_interval == 0)
        return 0;
    const char *job = cfg->job != NULL && cfg->backend != NULL &&
                              strcmp(cfg->backend, "ring") == 0
                          ? cfg->job
                          : "standalone";
    if (asprintf(&d->ckpt_root, "%s/%s", cfg->ckpt_dir, job) < 0)
        return ST_ENOMEM;
    pthread_mutex_init(&d->ckpt_mu, NULL);
    d->flags |= DMN_F_CKPT_MU_INIT;
    for (int i = 0; i < 2; i++) {
        ckpt_writer_opts_t o = {.root = d->ckpt_root,
                                .codec = {.level = 3, .elem_size = 4},
                                .full_every = 4, .replica = i};
        int rc = ckpt_writer_create(&o, &d->ckw[i]);
        if (rc != 0)
            return rc;
    }
    uv_async_init(d->loop, &d->ckpt_async, on_ckpt_async);
    d->ckpt_async.data = d;
    d->flags |= DMN_F_CKPT_ASYNC_ON;
    RD_INFO("checkpoints every %u steps under %s", cfg->ckpt_interval,
            d->ckpt_root);
    return 0;
}

void dmn__ckpt_stop(dmn_t *d)
{
    for (int i = 0; i < 2; i++) {
        ckpt_writer_destroy(d->ckw[i]); /* finishes what is in flight */
        d->ckw[i] = NULL;
    }
    d->ckpt_copying = 0; /* so the trainers' mappings can go */
    if (d->flags & DMN_F_CKPT_ASYNC_ON) {
        d->flags &= ~DMN_F_CKPT_ASYNC_ON;
        d->open_handles++;
        uv_close((uv_handle_t *)&d->ckpt_async, dmn__handle_closed);
    }
    if (d->flags & DMN_F_CKPT_MU_INIT)
        pthread_mutex_destroy(&d->ckpt_mu);
    d->flags &= ~DMN_F_CKPT_MU_INIT;
    free(d->ckpt_root);
    d->ckpt_root = NULL;
}

/* Step `step` is about to start and every trainer ended the one before. */
void dmn__ckpt_prepare(dmn_t *d)
{
    void *state;
    size_t bytes;
    if (d->ckw[0] == NULL)
        return;
    dmn__step_get_state(d, &state, &bytes);
    uint32_t n = d->view.node_count ? d->view.node_count : 1;
    size_t need = state == NULL ? 0 : bytes / n + 64; /* aligned ranges */
    if (need <= d->ckpt_reserved)
        return;
    for (int i = 0; i < 2; i++)
        if (ckpt_writer_reserve(d->ckw[i], need) != 0)
            return; /* the first snapshot allocates, as before */
    d->ckpt_reserved = need;
}

void dmn__ckpt_boundary(dmn_t *d, uint64_t step)
{
    /* d->view is still the view of the step that just ended. */
    if (d->ckw[0] == NULL || step == 0 ||
        (step % d->cfg->ckpt_interval != 0 && !d->view.ckpt_requested))
        return;
    void *state;
    size_t bytes;
    dmn__step_get_state(d, &state, &bytes);
    if (state == NULL || bytes == 0)
        return;
    uint32_t n = d->view.node_count ? d->view.node_count : 1;
    uint32_t r = d->view.node_rank % n;
    uint32_t shard[2] = {r, (r + n - 1) % n};
    /* Both files or neither: a writer that took step S while the other
     * skipped it would report S later, and the pair would never match. */
    if (ckpt_writer_busy(d->ckw[0]) || ckpt_writer_busy(d->ckw[1])) {
        d->stats.ckpt_skipped++;
        RD_INFO("checkpoint of step %" PRIu64 " skipped: the previous one "
                "is still being written", step);
        return;
    }
    int rc[2];
    pthread_mutex_lock(&d->ckpt_mu);
    d->ckpt_copied = 0;
    pthread_mutex_unlock(&d->ckpt_mu);
    d->ckpt_copying = 1;
    d->ckpt_copy_start_ns = rd_now_ns();
    for (int i = 0; i < 2; i++) {
        ckpt_shard_info_t in = {.step = step,
                                .generation = d->view.generation,
                                .shard = shard[i], .nshards = n,
                                .total_size = bytes};
        ckpt_shard_range(bytes, n, shard[i], 4, &in.offset, &in.raw_size);
        rc[i] = ckpt_writer_submit_live(d->ckw[i], &in,
                                        (char *)state + in.offset, on_copied,
                                        d, i ? on_replica : on_primary, d);
    }
    /* A refused one copies nothing: count it as copied. */
    pthread_mutex_lock(&d->ckpt_mu);
    d->ckpt_copied += (rc[0] != 0) + (rc[1] != 0);
    pthread_mutex_unlock(&d->ckpt_mu);
    if (rc[0] != 0 && rc[1] != 0)
        d->ckpt_copying = 0;
    if (rc[0] == 0 && rc[1] == 0) {
        d->ckpt_pending_step = step;
        d->ckpt_pending_n = n;
    } else { /* both were idle: only a failure (ST_ENOMEM) gets here */
        d->stats.ckpt_failed++;
        RD_WARN("checkpoint of step %" PRIu64 " not taken: %s", step,
                st_strerror(rc[0] ? rc[0] : rc[1]));
    }
}

/*
 * The request is acknowledged at once; the checkpoint is taken at the end
 * of the next step that starts (every node of the job must take the same
 * step, and they agree on it at a step start).
 */
void dmn__ckpt_request(dmn_t *d, dmn_conn_t *c, uint32_t seq)
{
    d->stats.ckpt_requests++;
    if (d->ckw[0] == NULL || d->be->ops->request_ckpt == NULL) {
        RD_INFO("client %u asked for a checkpoint, but checkpoints are "
                "off (--ckpt-interval 0)", c->id);
        dmn__reply_status(c, PROTO_T_CKPT, seq, RINGD_ENOTSUP);
        return;
    }
    d->be->ops->request_ckpt(d->be);
    RD_INFO("client %u asked for a checkpoint: taken at the end of the "
            "next step", c->id);
    dmn__reply_status(c, PROTO_T_CKPT, seq, RINGD_OK);
}

int dmn__ckpt_restore(dmn_t *d, uint64_t *step_p)
{
    if (d->ckpt_root == NULL)
        return -ENOENT;
    void *state;
    size_t bytes;
    dmn__step_get_state(d, &state, &bytes);
    if (state == NULL || bytes == 0)
        return -ENOENT;
    unsigned repaired = 0;
    int rc = ckpt_store_restore(d->ckpt_root, state, bytes, step_p,
                                &repaired);
    if (rc == 0)
        RD_INFO("job state restored from the checkpoint of step %" PRIu64
                " (%u shard%s from replicas)", *step_p, repaired,
                repaired == 1 ? "" : "s");
    else if (rc != -ENOENT && d->be->ops->ckpt_report != NULL)
        RD_INFO("no checkpoint this node can restore alone under %s: the "
                "nodes restore one together if their stores hold it",
                d->ckpt_root);
    else if (rc != -ENOENT)
        RD_ERROR("no usable checkpoint under %s: starting from the "
                 "trainers' initial state", d->ckpt_root);
    return rc;
}
