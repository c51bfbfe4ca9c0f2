/*
 * ckpt_writer.c - snapshot now, encode and write later, on one worker
 * thread.
 *
 * States of the single slot (guarded by mu):
 *   IDLE --submit--> CLAIMED --copied--> QUEUED --worker takes it--> BUSY
 *   BUSY --done--> IDLE;  IDLE --reserve--> CLAIMED --faulted in--> IDLE
 * CLAIMED: the submitting (or reserving) thread owns the stage and works
 * on it without the lock, so busy() and stats() never wait for a copy.
 * A submit in any state but IDLE is skipped. The delta base (the last
 * full shard written successfully, read back from its file) is only
 * touched by the worker.
 *
 * With opts.background = N the worker encodes at SCHED_BATCH, nice N:
 * the encoding of a checkpoint can wait, while the trainers, the ring
 * thread and the daemon's loop on the same cores cannot, so it does not
 * preempt them and gets a small share against each busy one (nice 19:
 * about 1.5%, where SCHED_IDLE gets 0.3%, so a node whose trainers keep
 * every core busy still finishes its checkpoints, later). An
 * unprivileged thread cannot raise its priority again, so the copies,
 * which a collective may be held for, are not made on this thread
 * (ckpt_writer_submit runs the copy on the caller's).
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "kernels/kern.h"

typedef enum { SLOT_IDLE, SLOT_CLAIMED, SLOT_QUEUED, SLOT_BUSY } slot_state_t;

struct ckpt_writer {
    ckpt_writer_opts_t opts;
    char *root;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;

    slot_state_t state;
    ckpt_shard_info_t info;     /* of the queued shard */
    void *stage;                /* ckpt_stage_alloc'd, grown as needed */
    size_t stage_cap;
    ckpt_writer_done_fn done;
    void *done_arg;
    const void *live;           /* copied by the worker (submit_live) */
    ckpt_writer_copied_fn copied;
    void *copied_arg;

    /* Worker-only: the encoder's pieces and the last full shard written,
     * the base of the deltas that follow it: read back from its file
     * piece by piece, never held in memory. */
    ckpt_encoder_t *enc;
    ckpt_shard_info_t base_info; /* valid when base_valid */
    int base_valid;
    uint32_t deltas_since_full;

    ckpt_writer_stats_t stats;
};

/* ---- the snapshot ------------------------------------------------------
 *
 * Measured on the 2-core VM (bench/ckpt-cost, checkpoint/README.md): the copy
 * itself runs at memory speed, ~70-170 ms/GiB on one core depending on
 * the load; one shard's copy split with a helper thread was no faster
 * there (within the noise both ways), so it is one copy per writer (the
 * daemon runs its two writers' copies at once, daemon/checkpoint.c),
 * with streaming stores from CKPT_STREAM_MIN (ckpt_stage_copy: 30%
 * faster than memcpy at 64 MiB). What made snapshots cost
 * seconds was faulting in a fresh staging buffer (the first checkpoint:
 * 4-17 s per GiB in 4 KiB pages on that VM). So the stage is faulted in
 * when it is allocated, in huge pages where the kernel gives them, and
 * ckpt_writer_reserve() does that before the first checkpoint.
 */
void *ckpt_stage_alloc(size_t n)
{
    if (n == 0)
        n = 1;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, n, MADV_HUGEPAGE); /* a hint: fine if refused */
#endif
    memset(p, 0, n); /* fault every page in now, not in the snapshot */
    if (n >= 512) /* and the streaming copy's code page (ckpt_stage_copy) */
        kern_copy_stream(p, (char *)p + n / 2, 256);
    return p;
}

void ckpt_stage_free(void *p, size_t n)
{
    if (p != NULL)
        munmap(p, n ? n : 1);
}

static int buf_reserve(void **p, size_t *cap, size_t bytes)
{
    if (*cap >= bytes && *p != NULL)
        return 0;
    void *q = ckpt_stage_alloc(bytes);
    if (q == NULL)
        return ST_ENOMEM;
    ckpt_stage_free(*p, *cap);
    *p = q;
    *cap = bytes;
    return 0;
}

/* Grow the stage to bytes; caller owns the slot (CLAIMED), not mu. */
static int stage_reserve(ckpt_writer_t *w, size_t bytes)
{
    return buf_reserve(&w->stage, &w->stage_cap, bytes);
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_minflt(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0)
        return 0;
    return (uint64_t)ru.ru_minflt;
}

void ckpt_stage_copy(void *stage, const void *src, size_t n)
{
    if (n >= CKPT_STREAM_MIN)
        kern_copy_stream(stage, src, n);
    else
        memcpy(stage, src, n);
}

/* The snapshot copy, timed on the calling thread; caller owns stage. */
static void copy_timed(ckpt_writer_t *w, const void *src, size_t n)
{
    uint64_t t0 = rd_now_ns(), c0 = thread_cpu_ns(), f0 = thread_minflt();
    ckpt_stage_copy(w->stage, src, n);
    uint64_t dt = rd_now_ns() - t0, dc = thread_cpu_ns() - c0;
    uint64_t df = thread_minflt() - f0;
    pthread_mutex_lock(&w->mu);
    w->stats.last_stall_ns = dt;
    w->stats.last_copy_cpu_ns = dc;
    w->stats.last_copy_faults = df;
    w->stats.copy_ns += dt;
    w->stats.copy_cpu_ns += dc;
    w->stats.copy_faults += df;
    pthread_mutex_unlock(&w->mu);
}

/* Same shard of the same layout: the delta lines up byte for byte. */
static int can_delta(const ckpt_writer_t *w, const ckpt_shard_info_t *in)
{
    return w->opts.full_every > 0 && w->base_valid && in->raw_size > 0 &&
           w->deltas_since_full < w->opts.full_every &&
           w->base_info.shard == in->shard &&
           w->base_info.nshards == in->nshards &&
           w->base_info.offset == in->offset &&
           w->base_info.raw_size == in->raw_size &&
           w->base_info.total_size == in->total_size &&
           w->base_info.step < in->step;
}

/*
 * A full shard just written is the base of the deltas that follow (each
 * against it, not against the one before, so a delta's base is one full
 * file that streams back without a chain).
 */
static void keep_base(ckpt_writer_t *w, const ckpt_shard_info_t *in,
                      int was_delta)
{
    if (was_delta) {
        w->deltas_since_full++;
        return;
    }
    w->base_info = *in;
    w->base_valid = 1;
    w->deltas_since_full = 0;
}

/* The snapshot of a live submit, on this thread, then the caller told. */
static void copy_live(ckpt_writer_t *w, const ckpt_shard_info_t *in)
{
    copy_timed(w, w->live, in->raw_size);
    pthread_mutex_lock(&w->mu);
    w->live = NULL;
    pthread_mutex_unlock(&w->mu);
    if (w->copied)
        w->copied(w->copied_arg, in);
}

/* The base's file, if it is still the one this writer wrote. */
static int open_base(ckpt_writer_t *w, ckpt_piece_reader_t **rd_p)
{
    char path[PATH_MAX];
    ckpt_shard_info_t bi;
    const ckpt_shard_info_t *want = &w->base_info;
    int rc = ckpt_store_shard_path(w->root, want->step, want->shard,
                                   w->opts.replica, path, sizeof(path));
    if (rc == 0)
        rc = ckpt_piece_reader_open(path, &bi, rd_p);
    if (rc == 0 && (bi.raw_xxh64 != want->raw_xxh64 ||
                    bi.raw_size != want->raw_size ||
                    bi.generation != want->generation)) {
        ckpt_piece_reader_close(*rd_p);
        rc = ST_ECORRUPT;
    }
    return rc;
}

/*
 * Encode the stage piece by piece straight into the shard's file; a delta
 * whose base cannot be read back whole and intact (retention removed an
 * incomplete step, a bad disk) is written full instead.
 */
static int encode_to_file(ckpt_writer_t *w, ckpt_shard_info_t *in,
                          int *delta, size_t *len_p)
{
    ckpt_piece_reader_t *rd = NULL;
    if (*delta && open_base(w, &rd) != 0) {
        RD_WARN("checkpoint: step %llu shard %u: the base of step %llu is "
                "gone or bad; writing a full shard",
                (unsigned long long)in->step, in->shard,
                (unsigned long long)w->base_info.step);
        *delta = 0;
    }
    in->flags = *delta ? CKPT_F_DELTA : 0;
    in->base_step = *delta ? w->base_info.step : 0;
    ckpt_afile_t *f = NULL;
    int rc = ckpt_store_open(w->root, in->step, in->shard, w->opts.replica,
                             &f);
    if (rc == 0)
        rc = *delta ? ckpt_encoder_write_rd(w->enc, &w->opts.codec, in,
                                            w->stage, rd, f, len_p)
                    : ckpt_encoder_write(w->enc, &w->opts.codec, in,
                                         w->stage, NULL, f, len_p);
    int brc = ckpt_piece_reader_close(rd);
    if (rc == 0 && brc != 0)
        rc = brc;
    if (rc != 0) {
        if (f != NULL)
            ckpt_afile_abort(f);
        return rc;
    }
    return ckpt_afile_commit(f);
}

static void write_one(ckpt_writer_t *w, ckpt_shard_info_t *in)
{
    if (w->live != NULL)
        copy_live(w, in);
    uint64_t t0 = rd_now_ns(), c0 = thread_cpu_ns();
    int delta = can_delta(w, in);
    size_t len = 0;
    int rc = encode_to_file(w, in, &delta, &len);
    if (rc == ST_ECORRUPT && delta) { /* the base failed as it was read */
        delta = 0;
        rc = encode_to_file(w, in, &delta, &len);
    }
    if (rc != 0)
        RD_ERROR("checkpoint: step %llu shard %u not written: %s",
                 (unsigned long long)in->step, in->shard, st_strerror(rc));
    uint64_t dt = rd_now_ns() - t0, dc = thread_cpu_ns() - c0;
    pthread_mutex_lock(&w->mu);
    if (rc == 0) {
        keep_base(w, in, delta);
        w->stats.written++;
        w->stats.raw_bytes += in->raw_size;
        w->stats.file_bytes += len;
        w->stats.last_step = in->step;
        w->stats.last_write_ns = dt;
        w->stats.last_write_cpu_ns = dc;
        w->stats.write_ns += dt;
        w->stats.write_cpu_ns += dc;
    } else {
        w->stats.failed++;
    }
    pthread_mutex_unlock(&w->mu);
    if (w->done)
        w->done(w->done_arg, rc, in, NULL, rc == 0 ? len : 0);

    pthread_mutex_lock(&w->mu);
    w->state = SLOT_IDLE;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void lower_priority(int nice)
{
    struct sched_param sp = {.sched_priority = 0};
    int rc = pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
    if (rc != 0)
        RD_WARN("checkpoint: writer not put at SCHED_BATCH: %s",
                strerror(rc));
    /* PRIO_PROCESS with a thread id sets that thread's nice only. */
    if (setpriority(PRIO_PROCESS, (id_t)gettid(), nice) != 0)
        RD_WARN("checkpoint: writer not put at nice %d: %s", nice,
                strerror(errno));
}

static void *worker_main(void *arg)
{
    ckpt_writer_t *w = arg;
    if (w->opts.background > 0)
        lower_priority(w->opts.background);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->state != SLOT_QUEUED && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->state != SLOT_QUEUED)
            break; /* stop with nothing queued */
        w->state = SLOT_BUSY;
        ckpt_shard_info_t in = w->info;
        pthread_mutex_unlock(&w->mu);
        write_one(w, &in); /* stage is ours while BUSY */
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int ckpt_writer_create(const ckpt_writer_opts_t *opts, ckpt_writer_t **w_p)
{
    if (opts == NULL || opts->root == NULL)
        return ST_EINVAL;
    ckpt_writer_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return ST_ENOMEM;
    w->opts = *opts;
    int rc = ST_ENOMEM;
    w->root = strdup(opts->root);
    if (w->root == NULL)
        goto err_free;
    w->opts.root = w->root;
    rc = ckpt_mkdirs(w->root);
    if (rc != 0) {
        RD_ERROR("checkpoint: cannot create %s: %s", w->root,
                 st_strerror(rc));
        goto err_root;
    }
    rc = ckpt_encoder_create(&w->enc);
    if (rc != 0)
        goto err_root;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        rc = ST_ENOMEM;
        goto err_sync;
    }
    *w_p = w;
    return 0;

err_sync:
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    ckpt_encoder_destroy(w->enc);
err_root:
    free(w->root);
err_free:
    free(w);
    return rc;
}

void ckpt_writer_flush(ckpt_writer_t *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->state != SLOT_IDLE)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

void ckpt_writer_destroy(ckpt_writer_t *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    while (w->state == SLOT_CLAIMED) /* a submitter is copying */
        pthread_cond_wait(&w->cv, &w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL); /* finishes what was queued first */
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    ckpt_stage_free(w->stage, w->stage_cap);
    ckpt_encoder_destroy(w->enc);
    free(w->root);
    free(w);
}

static int check_geometry(const ckpt_shard_info_t *info)
{
    if (info->nshards == 0 || info->shard >= info->nshards ||
        info->offset > info->total_size ||
        info->raw_size > info->total_size - info->offset)
        return ST_EINVAL;
    return 0;
}

/* Give a claimed slot back (its stage unchanged). Caller holds mu. */
static void unclaim(ckpt_writer_t *w)
{
    w->state = SLOT_IDLE;
    pthread_cond_broadcast(&w->cv);
}

/*
 * Count a submit and take the idle slot with a stage large enough
 * (normally sized in advance by ckpt_writer_reserve(); when not, the
 * allocation is part of the stall). Takes and returns with mu held;
 * drops it while the stage grows.
 */
static int claim(ckpt_writer_t *w, const ckpt_shard_info_t *info)
{
    w->stats.submitted++;
    if (w->state != SLOT_IDLE) {
        w->stats.skipped++;
        return ST_AGAIN;
    }
    w->state = SLOT_CLAIMED;
    if (w->stage_cap >= info->raw_size && w->stage != NULL)
        return 0;
    pthread_mutex_unlock(&w->mu);
    int rc = stage_reserve(w, info->raw_size);
    pthread_mutex_lock(&w->mu);
    if (rc != 0) {
        w->stats.skipped++;
        unclaim(w);
        return ST_ENOMEM;
    }
    return 0;
}

static void queue(ckpt_writer_t *w, const ckpt_shard_info_t *info,
                  ckpt_writer_done_fn done, void *arg)
{
    w->info = *info;
    w->done = done;
    w->done_arg = arg;
    w->state = SLOT_QUEUED;
    pthread_cond_broadcast(&w->cv);
}

int ckpt_writer_submit(ckpt_writer_t *w, const ckpt_shard_info_t *info,
                       const void *bytes, ckpt_writer_done_fn done,
                       void *arg)
{
    int rc = check_geometry(info);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&w->mu);
    rc = claim(w, info);
    pthread_mutex_unlock(&w->mu);
    if (rc != 0)
        return rc;
    /* CLAIMED: the worker does not read the stage, nobody else takes it. */
    copy_timed(w, bytes, info->raw_size);
    pthread_mutex_lock(&w->mu);
    queue(w, info, done, arg);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

int ckpt_writer_submit_live(ckpt_writer_t *w, const ckpt_shard_info_t *info,
                            const void *bytes, ckpt_writer_copied_fn copied,
                            void *copied_arg, ckpt_writer_done_fn done,
                            void *arg)
{
    int rc = check_geometry(info);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&w->mu);
    rc = claim(w, info);
    if (rc == 0) {
        w->live = bytes;
        w->copied = copied;
        w->copied_arg = copied_arg;
        queue(w, info, done, arg);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int ckpt_writer_busy(ckpt_writer_t *w)
{
    pthread_mutex_lock(&w->mu);
    int busy = w->state != SLOT_IDLE;
    pthread_mutex_unlock(&w->mu);
    return busy;
}

int ckpt_writer_reserve(ckpt_writer_t *w, size_t bytes)
{
    pthread_mutex_lock(&w->mu);
    while (w->state != SLOT_IDLE) /* the worker reads stage until IDLE */
        pthread_cond_wait(&w->cv, &w->mu);
    int rc = 0;
    if (w->stage_cap < bytes || w->stage == NULL) {
        w->state = SLOT_CLAIMED; /* fault it in without the lock */
        pthread_mutex_unlock(&w->mu);
        rc = stage_reserve(w, bytes);
        pthread_mutex_lock(&w->mu);
        unclaim(w);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

void ckpt_writer_stats(ckpt_writer_t *w, ckpt_writer_stats_t *stats_p)
{
    pthread_mutex_lock(&w->mu);
    *stats_p = w->stats;
    pthread_mutex_unlock(&w->mu);
}
