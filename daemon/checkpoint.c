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
 * The snapshot copies run on libuv's thread pool while the next step
 * runs (copy.c, ckpt_writer_submit there), never on the main loop; the
 * writers encode at SCHED_BATCH, nice 19, so the compression of a
 * checkpoint takes mostly CPU time the trainers, the ring and the loop
 * leave (checkpoint/ckpt_writer.c). A trainer reads
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"

#define CKPT_KEEP 3

/* Worker threads report here; main reads it in the async callback. */
static void on_written(dmn_t *d, int which, int status,
                       const ckpt_shard_info_t *info)
{
    pthread_mutex_lock(&d->ck.mu);
    d->ck.done_step[which] = info->step;
    d->ck.done_status[which] = status;
    d->ck.done_info[which] = *info;
    pthread_mutex_unlock(&d->ck.mu);
    uv_async_send(&d->ck.async);
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

int dmn__ckpt_hold(dmn_t *d, int status)
{
    if (!dmn__copy_holding(&d->pool) || status != 0)
        return 0;
    d->stats.ckpt_holds++;
    d->ck.hold_ns = rd_now_ns();
    return 1;
}

/* The copies are done: how long the held completion waited for them. */
void dmn__ckpt_copies_done(dmn_t *d)
{
    double held = 0;
    if (d->ck.hold_ns != 0) {
        held = (double)(rd_now_ns() - d->ck.hold_ns) / 1e9;
        d->stats.ckpt_hold_seconds += held;
        if (held > d->stats.ckpt_hold_max_seconds)
            d->stats.ckpt_hold_max_seconds = held;
        d->ck.hold_ns = 0;
    }
    d->ck.last_hold_ms = held * 1e3;
}

int dmn__ckpt_enabled(const dmn_t *d)
{
    return d->ck.root != NULL;
}

int dmn__ckpt_restoring(const dmn_t *d)
{
    return d->ck.restoring;
}

ckpt_writer_t *dmn__ckpt_writer(const dmn_t *d, int i)
{
    return d->ck.w[i];
}

int dmn__ckpt_writing(const dmn_t *d)
{
    return d->ck.submitting || ckpt_writer_busy(d->ck.w[0]) ||
           ckpt_writer_busy(d->ck.w[1]);
}

static void restart_progress(dmn_t *d, uint64_t ended);

/*
 * A boundary's two shard copies, run on the pool (copy.c) as one work
 * each, so that they take two of its threads at once: a held collective
 * waits for the slower copy of 1/N of the state instead of both in turn
 * where the node has the cores and memory bandwidth for two (a server
 * runs one daemon; on the development VM two threads copy a shared
 * mapping at 53 ms per GiB against one thread's 78). The pool counts each
 * as holding, so the collective is released when both are done.
 */
typedef struct ckpt_pair ckpt_pair_t;
typedef struct {
    dmn_copy_t base; /* first: done() gets &base */
    ckpt_pair_t *pair;
    int i;           /* 0 the primary, 1 the replica */
} ckpt_copy_t;

struct ckpt_pair {
    ckpt_copy_t part[2];
    const char *src; /* the state region */
    ckpt_shard_info_t in[2];
    int rc[2];       /* each written by its own part's thread */
    int left;        /* parts not done yet (the loop's) */
    int aborted;     /* a part was cancelled: shutting down */
    uint64_t step, wall_ns, work_ns;
};

/* Pool work of the checkpoint's (copy.c). */
static int ckpt_copy_queue(dmn_t *d, dmn_copy_t *c)
{
    c->d = d;
    return dmn__copy_queue(&d->pool, c);
}

static void ckpt_copy_work(dmn_copy_t *b)
{
    ckpt_copy_t *c = (ckpt_copy_t *)b;
    ckpt_pair_t *p = c->pair;
    dmn_t *d = b->d;
    int i = c->i;
    p->rc[i] = ckpt_writer_submit(d->ck.w[i], &p->in[i],
                                  p->src + p->in[i].offset,
                                  i ? on_replica : on_primary, d);
    if (p->rc[i] == 0)
        dmn__state_copied(d, p->in[i].raw_size);
}

/* Both parts are done (or one never started): the boundary's outcome. */
static void ckpt_pair_done(dmn_t *d, ckpt_pair_t *p)
{
    d->ck.submitting = 0;
    if (p->aborted) { /* shutting down: the writers finish or not */
        free(p);
        return;
    }
    d->stats.ckpt_copies += p->rc[0] == 0 && p->rc[1] == 0;
    d->stats.ckpt_copy_seconds += (double)p->wall_ns / 1e9;
    d->ck.last_copy_ms = (double)p->wall_ns / 1e6;
    d->ck.last_copy_work_ms = (double)p->work_ns / 1e6;
    if (p->rc[0] != 0 || p->rc[1] != 0) {
        if (d->ck.pending_step == p->step)
            d->ck.pending_step = 0;
        d->stats.ckpt_failed++;
        RD_WARN("checkpoint of step %" PRIu64 " not taken: %s", p->step,
                st_strerror(p->rc[0] ? p->rc[0] : p->rc[1]));
        restart_progress(d, p->step);
    }
    free(p);
}

/* The longer part's wall and work times are the boundary's. */
static void ckpt_copy_done(dmn_copy_t *b, int status)
{
    ckpt_copy_t *c = (ckpt_copy_t *)b;
    ckpt_pair_t *p = c->pair;
    if (status != 0)
        p->aborted = 1;
    if (b->wall_ns > p->wall_ns)
        p->wall_ns = b->wall_ns;
    if (b->work_ns > p->work_ns)
        p->work_ns = b->work_ns;
    if (--p->left == 0)
        ckpt_pair_done(b->d, p);
}

static double ms_of(uint64_t ns)
{
    return (double)ns / 1e6;
}

/* Where this checkpoint's time went, once both shards are written. */
static void log_written(dmn_t *d, uint64_t step)
{
    ckpt_writer_stats_t s[2];
    for (int i = 0; i < 2; i++)
        ckpt_writer_stats(d->ck.w[i], &s[i]);
    RD_INFO("checkpoint of step %" PRIu64 " written: copies %.1f ms off "
            "the loop (%.1f ms copying; primary %.1f ms, cpu %.1f, %llu "
            "faults; replica %.1f ms, cpu %.1f, %llu faults); the last "
            "held collective waited %.1f ms; encode primary %.1f ms "
            "(cpu %.1f), replica %.1f ms (cpu %.1f); main loop %.2f ms in "
            "checkpoints so far", step,
            d->ck.last_copy_ms, d->ck.last_copy_work_ms,
            ms_of(s[0].last_stall_ns), ms_of(s[0].last_copy_cpu_ns),
            (unsigned long long)s[0].last_copy_faults,
            ms_of(s[1].last_stall_ns), ms_of(s[1].last_copy_cpu_ns),
            (unsigned long long)s[1].last_copy_faults, d->ck.last_hold_ms,
            ms_of(s[0].last_write_ns), ms_of(s[0].last_write_cpu_ns),
            ms_of(s[1].last_write_ns), ms_of(s[1].last_write_cpu_ns),
            d->stats.ckpt_loop_seconds * 1e3);
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
    char *root;  /* ours: dmn__ckpt_stop frees d's while this may run */
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
    restart_progress(d, c->step);
    free(c->root);
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
    c->root = strdup(d->ck.root);
    if (c->root == NULL) {
        RD_WARN("checkpoint of step %" PRIu64 " not completed: out of "
                "memory", step);
        free(c);
        return;
    }
    c->dir_only = !job_records_ckpts(d->job);
    c->step = step;
    c->n = n;
    int rc = uv_queue_work(d->loop, &c->req, complete_work, complete_done);
    if (rc != 0) {
        RD_WARN("checkpoint of step %" PRIu64 " not completed: %s", step,
                uv_strerror(rc));
        free(c->root);
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
                "2 copies; manifest in etcd)", d->ck.reported_step);
    } else if (status < 0) {
        d->stats.ckpt_failed++;
    }
}

static void ckpt_written(dmn_t *d)
{
    pthread_mutex_lock(&d->ck.mu);
    uint64_t s0 = d->ck.done_step[0], s1 = d->ck.done_step[1];
    int r0 = d->ck.done_status[0], r1 = d->ck.done_status[1];
    job_ckpt_files_t f = {.primary = d->ck.done_info[0],
                          .replica = d->ck.done_info[1],
                          .keep = CKPT_KEEP};
    pthread_mutex_unlock(&d->ck.mu);
    uint64_t want = d->ck.pending_step;
    if (want == 0 || s0 != want || s1 != want)
        return;
    d->ck.pending_step = 0;
    log_written(d, want);
    if (r0 != 0 || r1 != 0) {
        d->stats.ckpt_failed++;
        RD_WARN("checkpoint of step %" PRIu64 " failed (%s); training goes "
                "on and older checkpoints stay", want,
                st_strerror(r0 ? r0 : r1));
        restart_progress(d, want);
        return;
    }
    if (job_records_ckpts(d->job)) {
        d->ck.reported_step = want;
        int rc = job_ckpt_report(d->job, &f, on_reported, d);
        if (rc != 0) {
            d->stats.ckpt_failed++;
            RD_WARN("checkpoint of step %" PRIu64 " not recorded: %s", want,
                    st_strerror(rc));
        }
    }
    try_complete(d, want, d->ck.pending_n);
}

static void on_ckpt_async(uv_async_t *h)
{
    dmn_t *d = h->data;
    uint64_t t0 = rd_now_ns();
    ckpt_written(d);
    d->stats.ckpt_loop_seconds += (double)(rd_now_ns() - t0) / 1e9;
}

/* A failed start leaves nothing started: a named job's start may be
 * tried again by its next trainer. */
static void start_failed(dmn_t *d)
{
    for (int i = 0; i < 2; i++) {
        ckpt_writer_destroy(d->ck.w[i]);
        d->ck.w[i] = NULL;
    }
    pthread_mutex_destroy(&d->ck.mu);
    free(d->ck.root);
    d->ck.root = NULL;
}

int dmn__ckpt_start(dmn_t *d, const char *job)
{
    const dmn_config_t *cfg = d->cfg;
    if (cfg->ckpt_interval == 0 || job == NULL || d->ck.root != NULL)
        return 0;
    if (asprintf(&d->ck.root, "%s/%s", cfg->ckpt_dir, job) < 0) {
        d->ck.root = NULL;
        return ST_ENOMEM;
    }
    if (pthread_mutex_init(&d->ck.mu, NULL) != 0) {
        free(d->ck.root);
        d->ck.root = NULL;
        return ST_ENOMEM;
    }
    for (int i = 0; i < 2; i++) {
        ckpt_writer_opts_t o = {.root = d->ck.root,
                                .codec = {.level = 3, .elem_size = 4},
                                .full_every = 4, .replica = i,
                                .background = 19};
        int rc = ckpt_writer_create(&o, &d->ck.w[i]);
        if (rc != 0) {
            RD_ERROR("checkpoints under %s: %s", d->ck.root,
                     st_strerror(rc));
            start_failed(d);
            return rc;
        }
    }
    d->flags |= DMN_F_CKPT_MU_INIT;
    uv_async_init(d->loop, &d->ck.async, on_ckpt_async);
    d->ck.async.data = d;
    d->flags |= DMN_F_CKPT_ASYNC_ON;
    RD_INFO("checkpoints every %u steps under %s", cfg->ckpt_interval,
            d->ck.root);
    return 0;
}

void dmn__ckpt_stop(dmn_t *d)
{
    dmn__copy_stop(&d->pool); /* nothing submits to the writers any more */
    for (int i = 0; i < 2; i++) {
        ckpt_writer_destroy(d->ck.w[i]); /* finishes what is in flight */
        d->ck.w[i] = NULL;
    }
    if (d->flags & DMN_F_CKPT_ASYNC_ON) {
        d->flags &= ~DMN_F_CKPT_ASYNC_ON;
        d->open_handles++;
        uv_close((uv_handle_t *)&d->ck.async, dmn__handle_closed);
    }
    if (d->flags & DMN_F_CKPT_MU_INIT)
        pthread_mutex_destroy(&d->ck.mu);
    d->flags &= ~DMN_F_CKPT_MU_INIT;
    free(d->ck.root);
    d->ck.root = NULL;
}

/*
 * Size the writers' stages on the pool: it faults memory in. The node's
 * two shards of the trainer's state are faulted into the daemon's
 * mapping of it too, read-only: the first copy from a mapping the daemon
 * never read took 1024 minor faults per 64 MiB (e2e --mem-only), time a
 * held collective would wait for.
 */
typedef struct {
    dmn_copy_t base;
    size_t need;
    int rc;
    char *src[2];
    size_t len[2];
} reserve_t;

static void prefault(char *p, size_t len)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
    if (len > 0) /* a hint: old kernels say EINVAL */
        (void)madvise((void *)a, len + ((uintptr_t)p - a),
                      MADV_POPULATE_READ);
}

static void reserve_work(dmn_copy_t *b)
{
    reserve_t *r = (reserve_t *)b;
    for (int i = 0; i < 2 && r->rc == 0; i++)
        r->rc = ckpt_writer_reserve(b->d->ck.w[i], r->need);
    for (int i = 0; i < 2; i++)
        prefault(r->src[i], r->len[i]);
}

static void reserve_done(dmn_copy_t *b, int status)
{
    reserve_t *r = (reserve_t *)b;
    dmn_t *d = b->d; /* b is r: gone after the free */
    if (status == 0 && r->rc == 0 && r->need > d->ck.reserved)
        d->ck.reserved = r->need;
    /* else the first snapshot allocates, as before */
    d->ck.reserving = 0;
    free(r);
    if (status == 0)
        restart_progress(d, 0); /* the writers may be free now */
}

/* Step `step` is about to start and every trainer ended the one before. */
void dmn__ckpt_prepare(dmn_t *d)
{
    void *state;
    size_t bytes;
    /* Not while a boundary's copies wait for the writers: they would
     * race for the slot (the next step start grows the stages). */
    if (d->ck.w[0] == NULL || d->ck.reserving || d->ck.submitting)
        return;
    uint64_t t0 = rd_now_ns();
    dmn__state_get(d, &state, &bytes);
    uint32_t n = d->view.node_count ? d->view.node_count : 1;
    size_t need = state == NULL ? 0 : bytes / n + 64; /* aligned ranges */
    reserve_t *r = need > d->ck.reserved ? calloc(1, sizeof(*r)) : NULL;
    if (r != NULL) {
        r->need = need;
        uint32_t me = d->view.node_rank % n;
        for (int i = 0; i < 2; i++) {
            uint64_t off, len;
            ckpt_shard_range(bytes, n, i ? (me + n - 1) % n : me, 4, &off,
                             &len);
            r->src[i] = (char *)state + off;
            r->len[i] = len;
        }
        r->base.work = reserve_work;
        r->base.done = reserve_done;
        r->base.flags |= DMN_COPY_F_NO_HOLD;
        if (ckpt_copy_queue(d, &r->base) == 0)
            d->ck.reserving = 1;
        else
            free(r);
    }
    d->stats.ckpt_loop_seconds += (double)(rd_now_ns() - t0) / 1e9;
}

/* Queue both parts. If the second cannot be, the first alone completes
 * the pair, which then counts as not taken: the step is never reported,
 * so a primary written without its replica completes nothing. */
static void boundary_queue(dmn_t *d, ckpt_pair_t *p)
{
    for (int i = 0; i < 2; i++)
        p->part[i] = (ckpt_copy_t){.base = {.work = ckpt_copy_work,
                                            .done = ckpt_copy_done},
                                   .pair = p, .i = i};
    /* Before the writers can report: on_ckpt_async matches this step. */
    d->ck.pending_step = p->step;
    d->ck.pending_n = p->in[0].nshards;
    p->left = 2;
    if (ckpt_copy_queue(d, &p->part[0].base) != 0) {
        d->ck.pending_step = 0;
        d->stats.ckpt_failed++;
        free(p);
        return;
    }
    d->ck.submitting = 1;
    if (ckpt_copy_queue(d, &p->part[1].base) != 0) {
        p->rc[1] = ST_ENOMEM;
        p->left = 1;
    }
}

/* The two shards of the node at this boundary: submitted on the pool. */
static void boundary_submit(dmn_t *d, uint64_t step, const char *state,
                            size_t bytes)
{
    uint32_t n = d->view.node_count ? d->view.node_count : 1;
    uint32_t r = d->view.node_rank % n;
    uint32_t shard[2] = {r, (r + n - 1) % n};
    /* Both files or neither: a writer that took step S while the other
     * skipped it would report S later, and the pair would never match.
     * The last boundary's copies may not have reached the writers yet
     * (steps without a collective are not held for them). */
    if (d->ck.reserving || d->ck.submitting ||
        ckpt_writer_busy(d->ck.w[0]) || ckpt_writer_busy(d->ck.w[1])) {
        d->stats.ckpt_skipped++;
        RD_INFO("checkpoint of step %" PRIu64 " skipped: the previous one "
                "is still being written", step);
        return;
    }
    ckpt_pair_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        d->stats.ckpt_failed++;
        RD_WARN("checkpoint of step %" PRIu64 " not taken: out of memory",
                step);
        return;
    }
    p->src = state;
    p->step = step;
    for (int i = 0; i < 2; i++) {
        p->in[i] = (ckpt_shard_info_t){.step = step,
                                       .generation = d->view.generation,
                                       .shard = shard[i], .nshards = n,
                                       .total_size = bytes};
        ckpt_shard_range(bytes, n, shard[i], 4, &p->in[i].offset,
                         &p->in[i].raw_size);
    }
    boundary_queue(d, p);
}

void dmn__ckpt_boundary(dmn_t *d, uint64_t step)
{
    /* d->view is still the view of the step that just ended. */
    if (d->ck.w[0] == NULL || step == 0 ||
        (step % d->cfg->ckpt_interval != 0 && !d->view.ckpt_requested))
        return;
    uint64_t t0 = rd_now_ns();
    void *state;
    size_t bytes;
    dmn__state_get(d, &state, &bytes);
    if (state != NULL && bytes != 0)
        boundary_submit(d, step, state, bytes);
    d->stats.ckpt_loop_seconds += (double)(rd_now_ns() - t0) / 1e9;
}

/* ---- the restart drain's checkpoint -------------------------------------
 *
 * A standalone daemon that restarts (dmn_restart) has nobody to take the
 * job's state from when it comes back but its store: it checkpoints the
 * boundary it drained at, so that the next daemon resumes exactly there
 * (not at its last periodic checkpoint, redoing the steps since). The
 * drain waits for it (dmn_done), bounded by the drain's timeout. With
 * several nodes the state comes back from the others: no such checkpoint.
 */

/* Whether step's checkpoint is complete in the store already. */
static int restart_stored(dmn_t *d, uint64_t step)
{
    uint64_t *steps = NULL;
    size_t n = 0;
    int have = 0;
    if (ckpt_store_list(d->ck.root, &steps, &n) == 0)
        for (size_t i = 0; i < n; i++)
            have |= steps[i] == step;
    free(steps);
    return have;
}

static int writers_busy(dmn_t *d)
{
    return d->ck.reserving || d->ck.submitting ||
           ckpt_writer_busy(d->ck.w[0]) || ckpt_writer_busy(d->ck.w[1]);
}

/* The drain may end: tell it (dmn_done decides). */
static void restart_done(dmn_t *d)
{
    d->flags &= ~DMN_F_RESTART_CKPT;
    if (dmn_done(d))
        uv_stop(d->loop);
}

/* A checkpoint event (`ended`: the step whose copy, files or set just
 * finished or failed): take ours once the writers are free, or see it
 * end. */
static void restart_progress(dmn_t *d, uint64_t ended)
{
    uint64_t step = d->ck.restart_step;
    if (!(d->flags & DMN_F_RESTART_CKPT))
        return;
    if (ended == step && d->ck.pending_step != step) {
        if (restart_stored(d, step))
            RD_INFO("restart: the checkpoint of step %" PRIu64 " is "
                    "complete: the next ringd resumes there", step);
        restart_done(d);
        return;
    }
    if (d->ck.pending_step == step || writers_busy(d))
        return; /* ours is under way, or the writers are not free yet */
    void *state;
    size_t bytes;
    dmn__state_get(d, &state, &bytes);
    if (state != NULL && bytes != 0)
        boundary_submit(d, step, state, bytes);
    if (!d->ck.submitting) /* not taken: nothing to wait for */
        restart_done(d);
}

void dmn__ckpt_restart_take(dmn_t *d)
{
    uint64_t step = d->step;
    if (d->ck.w[0] == NULL || job_records_ckpts(d->job) || step == 0 ||
        restart_stored(d, step))
        return;
    RD_INFO("restart: checkpointing step %" PRIu64 " first", step);
    d->ck.restart_step = step;
    d->flags |= DMN_F_RESTART_CKPT;
    restart_progress(d, 0);
}

/*
 * The request is acknowledged at once; the checkpoint is taken at the end
 * of the next step that starts (every node of the job must take the same
 * step, and they agree on it at a step start).
 */
void dmn__ckpt_request(dmn_t *d, dmn_conn_t *c, uint32_t seq)
{
    d->stats.ckpt_requests++;
    if (d->ck.w[0] == NULL || !job_takes_ckpt_requests(d->job)) {
        RD_INFO("client %u asked for a checkpoint, but checkpoints are "
                "off (--ckpt-interval 0)", c->id);
        dmn__reply_status(c, PROTO_T_CKPT, seq, RINGD_ENOTSUP);
        return;
    }
    job_request_ckpt(d->job);
    RD_INFO("client %u asked for a checkpoint: taken at the end of the "
            "next step", c->id);
    dmn__reply_status(c, PROTO_T_CKPT, seq, RINGD_OK);
}

/* The restore at a node's first start, on the pool. */
typedef struct {
    dmn_copy_t base;
    void *state;
    size_t bytes;
    uint64_t step;
    unsigned repaired;
    int rc;
    uint32_t n;
    dmn_fill_t f[]; /* the node's other trainers' regions */
} restore_t;

static void restore_work(dmn_copy_t *b)
{
    restore_t *r = (restore_t *)b;
    r->rc = ckpt_store_restore(b->d->ck.root, r->state, r->bytes,
                               &r->step, &r->repaired);
    if (r->rc != 0)
        return;
    dmn__state_copied(b->d, r->bytes);
    for (uint32_t i = 0; i < r->n; i++) {
        memcpy(r->f[i].dst, r->state, r->f[i].bytes);
        dmn__state_copied(b->d, r->f[i].bytes);
    }
}

static void restore_done(dmn_copy_t *b, int status)
{
    restore_t *r = (restore_t *)b;
    dmn_t *d = b->d;
    int rc = status != 0 ? status : r->rc;
    d->ck.restoring = 0;
    if (status != 0) {
        free(r);
        return;
    }
    if (rc == 0) {
        RD_INFO("job state restored from the checkpoint of step %" PRIu64
                " (%u shard%s from replicas)", r->step, r->repaired,
                r->repaired == 1 ? "" : "s");
        d->stats.restores++;
        d->flags |= DMN_F_RESTORED_PENDING;
        job_set_step(d->job, r->step);
    } else if (rc != -ENOENT && job_records_ckpts(d->job)) {
        RD_INFO("no checkpoint this node can restore alone under %s: the "
                "nodes restore one together if their stores hold it",
                d->ck.root);
    } else if (rc != -ENOENT) {
        RD_ERROR("no usable checkpoint under %s: starting from the "
                 "trainers' initial state", d->ck.root);
    }
    free(r); /* the copy kicks the step start that waits for it */
}

int dmn__ckpt_restore_start(dmn_t *d, void *state, size_t bytes,
                            const dmn_fill_t *f, uint32_t n)
{
    if (d->ck.root == NULL || state == NULL || bytes == 0)
        return -ENOENT;
    restore_t *r = calloc(1, sizeof(*r) + n * sizeof(*f));
    if (r == NULL)
        return ST_ENOMEM;
    r->state = state;
    r->bytes = bytes;
    r->n = n;
    memcpy(r->f, f, n * sizeof(*f));
    r->base.work = restore_work;
    r->base.done = restore_done;
    r->base.flags |= DMN_COPY_F_KICK;
    int rc = ckpt_copy_queue(d, &r->base);
    if (rc != 0) {
        free(r);
        return rc;
    }
    d->ck.restoring = 1;
    return 0;
}
