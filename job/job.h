/*
 * job.h - the elastic job engine: the cross-node half of ringd, as the
 * daemon sees it.
 *
 * The daemon reduces its node's trainers locally, then hands ONE buffer per
 * collective to the job, which combines it with the other nodes of the job.
 * A job runs on one of these backends, picked by job_config_t.spec:
 *   solo   one node, no network: completes at once, the view never changes
 *          (--standalone).
 *   fake   solo plus scripted view changes, for tests (--backend fake:...).
 *   ring   etcd membership + the UCX ring, on a ring thread (job_ring.c).
 *
 * Threading: every op is called on the daemon's main loop thread, and every
 * callback must be invoked on that thread too. A backend with its own
 * threads (the ring thread) posts results back with uv_async. Callbacks are
 * never invoked from inside the op that started the work (no re-entrancy):
 * defer with a timer or an async handle even when the result is known.
 *
 * Ownership: a buffer passed to allreduce/broadcast belongs to the backend
 * until done_cb runs (allreduce: every buffer job_reduce_t names); the
 * daemon neither reads nor frees it meanwhile. At most one collective is in
 * flight per backend at any time (the daemon serialises them), and
 * collectives are posted only between step_begin and step_end of the node.
 *
 * Views: the backend owns the job's view (generation, this node's rank,
 * node count, global trainer count and rank offset, step). The daemon reads
 * it with get_view() at every step start and is told of changes through
 * the on_view callback given at creation. A change that removes a member
 * must complete the in-flight collective (if any) with ST_ERESHAPE BEFORE
 * on_view runs; a change that only adds members waits for step_end().
 *
 * Errors: ops return 0 or a negative ST_* code and log it; a collective's
 * outcome goes to done_cb: 0, ST_ERESHAPE (the view changed: every trainer
 * of the job redoes the step), ST_EFENCED (this node lost its lease) or
 * another negative code (reported to the trainers as RINGD_EABORTED).
 */
#ifndef RINGD_JOB_H
#define RINGD_JOB_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "checkpoint/ckpt.h"
#include "common/wire.h"
#include "kernels/kern.h"

typedef struct {
    uint64_t generation;      /* bumps on every membership change */
    uint64_t step;            /* the job's next step (restart point) */
    uint32_t node_rank;       /* this node's position in the ring */
    uint32_t node_count;      /* nodes in the view */
    uint32_t global_trainers; /* trainers of all nodes in the view */
    uint32_t rank_offset;     /* global rank of this node's first trainer */
    uint32_t restored;        /* on_view only: the backend replaced the
                                 state region (get_state) with the job's */
    uint32_t ckpt_requested;  /* some node of the job asked for a
                                 checkpoint (ringd_checkpoint): every node
                                 takes one at the end of this step */
    uint32_t commit;          /* the backend commits each step before
                                 its step_ends are answered (job_ops_t
                                 commit; the ring's job option) */
    uint64_t fuse_bytes;      /* ungrouped allreduces queued together may
                                 run as one ring operation up to this
                                 many bytes, the nodes agreeing on how
                                 many (the daemon's step-queue.c; the
                                 ring's job option); 0: each alone */
    uint64_t agreements;      /* a counter: step starts at which the nodes
                                 agreed the trainer counts (the ring
                                 backend's AGREE; a view's REBUILD agrees
                                 them too and is not counted) */
} job_view_t;

/* This node's two files of one checkpoint, written and durable. */
typedef struct {
    ckpt_shard_info_t primary; /* shard r, r = the node's rank then */
    ckpt_shard_info_t replica; /* shard r-1 (mod n) */
    unsigned keep;             /* retention: newest complete to keep */
} job_ckpt_files_t;

typedef struct job job_t;

/*
 * How long this node waited on its ring predecessor per completed step
 * (the ring's idle time in that step's collectives), per predecessor:
 * a straggler makes its successors wait, and waits little itself.
 * bucket[i] counts steps with a wait <= job_hop_le[i] seconds (not
 * cumulative; the rest are over the last bound).
 */
#define JOB_HOP_BUCKETS 10
#define JOB_HOP_PEERS 8
extern const double job_hop_le[JOB_HOP_BUCKETS];
typedef struct {
    char peer[64];           /* the predecessor's node id (truncated) */
    uint64_t steps;
    double sum_s;
    uint64_t bucket[JOB_HOP_BUCKETS];
} job_hop_t;
typedef struct {
    size_t n;                /* the JOB_HOP_PEERS most used are kept */
    job_hop_t peers[JOB_HOP_PEERS];
} job_hops_t;
/* Suspicions this node reported, kept back and (leading) acted on
 * (membership/README.md, "Blame"). */
typedef struct {
    uint64_t reported_lossy, reported_silent, reported_hard;
    uint64_t withheld;   /* its own path to etcd was slow */
    uint64_t convicted;  /* leases it revoked on the reports */
} job_blame_t;

/* Count one step's wait on peer into h. */
void job_hops_record(job_hops_t *h, const char *peer, double wait_s);
/*
 * Milliseconds until node's next hop record in a job of n_members:
 * JOB_HOP_PUBLISH_MS, stretched so the whole job puts at most
 * JOB_HOP_JOB_PUTS_PER_S records a second whatever its size, plus 0-20%
 * by node (a hash of its name), so nodes started together drift apart
 * instead of putting in bursts.
 */
#define JOB_HOP_PUBLISH_MS 2000
#define JOB_HOP_JOB_PUTS_PER_S 50
int64_t job_hop_period_ms(size_t n_members, const char *node);

/*
 * The node's part of an allreduce: the buffers of the node's trainers that
 * posted it, in local-rank order. The backend combines them with the other
 * nodes' and writes the result into every one of them, all on its own
 * thread where it has one (never on the daemon's main loop):
 *  - one buffer: the cross-node allreduce runs in it, nothing is copied
 *    (the ring still validates every receive in its staging before any
 *    byte reaches the buffer, see ring/README.md);
 *  - several: the cross-node allreduce runs in the first buffer, which
 *    holds their reduction (in local-rank order) where it runs and whose
 *    result is copied into each other one (the ring backend: chunk by
 *    chunk, pipelined with the ring, ring_allreduce_t.local). Not in
 *    staging: a region of its own would be one more buffer's worth of
 *    memory traffic in the local sum and in the copy back, which cost
 *    two trainers a node a quarter of the ring's speed (bench/e2e's
 *    e2e2_vs_ring_min 0.61 with staging, 0.80-0.84 without).
 *  - fused (nsegs > 1): nsegs allreduces of the same dt and op run as one
 *    of count = the sum of seg_counts elements; bufs has nbufs * nsegs
 *    entries, trainer-major (bufs[t * nsegs + s]), and staging (count
 *    elements) is the region: the local reduction gathers the segments
 *    into it, the copy back scatters the result (the ring backend's flat
 *    ring runs one buffer's segments where they lie instead, staging
 *    untouched: ring_allreduce's one source in pieces).
 * On failure the buffers hold undefined data (the trainers redo the step).
 * The descriptor is copied; bufs, the buffers and staging must stay valid
 * and untouched until done_cb runs.
 */
typedef struct {
    void *const *bufs;     /* [nbufs] count elements of dt each */
    uint32_t nbufs;        /* >= 1 */
    void *staging;         /* count elements; used only when nsegs > 1 */
    size_t count;
    kern_dtype_t dt;
    kern_op_t op;          /* SUM, PROD, MIN, MAX or AVG */
    uint32_t divisor;      /* AVG: the sum is divided by it once (the
                              job's trainers, not its nodes; the ring
                              backend's ring divides each chunk at its
                              owner); 0 for the other ops */
    uint32_t nsegs;        /* 0 or 1: one collective; more: fused */
    const size_t *seg_counts; /* [nsegs] elements of each, when fused */
    rd_wire_t wire;        /* f32 only; every node must pass the same;
                              RD_WIRE_DEFAULT: the job's (its view's
                              ring options) */
} job_reduce_t;

/* The buffer the cross-node part runs on: bufs[0], or staging when
 * fused (job.c). */
void *job_reduce_region(const job_reduce_t *r);
/* job_reduce_region(), holding the node's reduction when there are
 * several buffers. */
void *job_reduce_local(const job_reduce_t *r);
/* After a successful cross-node part on buf (job_reduce_local's result,
 * the AVG division done): the copy into every other buffer. */
void job_reduce_copy_back(const job_reduce_t *r, void *buf);

/* Collective completion: status is 0, ST_ERESHAPE, ST_EFENCED or < 0. */
typedef void (*job_done_cb)(void *arg, int status);
/* The view changed; *view is the new one (valid during the call). */
typedef void (*job_view_cb)(void *arg, const job_view_t *view);

typedef struct {
    const char *name;
    /*
     * Number of trainers on this node for the coming step; called at every
     * step start before get_view(). A ring backend publishes it (node key in
     * etcd) so that every node computes the same global_trainers and
     * rank_offset; solo uses it as the whole job.
     */
    void (*set_local_trainers)(job_t *job, uint32_t n);
    /*
     * May be NULL (always ready). Called at every step start after
     * set_local_trainers and before get_view: returns 1 when a step can
     * start now, 0 when cb will be called once it can (a new view is being
     * installed, or the nodes are agreeing on trainer counts after a
     * change), or < 0. The
     * daemon then calls it again. At most one cb is pending.
     */
    int (*ready)(job_t *job, job_done_cb cb, void *arg);
    void (*get_view)(job_t *job, job_view_t *view_p);
    /* May be NULL. The node restored its state from a checkpoint of this
     * step before its first step: start there (a ring backend lets the
     * member furthest ahead send its state to the others). */
    void (*set_step)(job_t *job, uint64_t step);
    /*
     * May be NULL. A local trainer vanished without BYE. in_step: it had
     * begun the step in progress, whose collectives the other nodes then
     * wait for this node to finish (it cannot: the step is redone);
     * remaining: trainers still connected here. A ring backend makes the
     * loss a job-wide event: a new generation of the view when in_step
     * and trainers remain, and, with none left, it steps out of the job
     * until a trainer comes back (at its next ready()).
     */
    void (*trainer_lost)(job_t *job, int in_step,
                         uint32_t remaining);
    /*
     * Allreduce of the node's trainers' buffers across nodes (see
     * job_reduce_t), already checked by job_allreduce().
     */
    int (*allreduce)(job_t *job, const job_reduce_t *r, job_done_cb cb,
                     void *arg);
    /*
     * Broadcast bytes of buf from the node holding global trainer rank
     * root (its daemon filled buf with that trainer's data) to all nodes.
     */
    int (*broadcast)(job_t *job, void *buf, size_t bytes,
                     uint32_t root, job_done_cb cb, void *arg);
    /* Every trainer of the node finished `step`: a step boundary, where
     * joins and drains take effect. */
    void (*step_end)(job_t *job, uint64_t step);
    /*
     * May be NULL (nothing to commit: one node). Called after step_end:
     * cb(0) once every node of the view has finished the step too (a
     * round of the ring), or once a later view holds this node as a
     * member (it survived whatever stopped the round, and the view
     * change's agreement carries the step it finished); cb(ST_EFENCED)
     * or cb(ST_ERESHAPE) when this node was dropped before that: the
     * others may redo the step without it, so its trainers must not take
     * it as done. The daemon answers its trainers' step_end only then.
     * No collective is in flight when it is called; at most one cb is
     * pending.
     */
    int (*commit)(job_t *job, job_done_cb cb, void *arg);
    /*
     * Leave the job at this step boundary (SIGTERM drain): deregister and
     * call cb when gone. No collective is in flight when it is called.
     */
    int (*leave)(job_t *job, job_done_cb cb, void *arg);
    /*
     * A trainer of this node asked for a checkpoint (ringd_checkpoint).
     * The backend sets ckpt_requested in the view of the next step that
     * starts, on every node of the job alike, until a step with it
     * completes (a ring backend carries the request as a flag on the
     * step's collectives and agrees at the next step start: the
     * checkpoint comes a step later than the request otherwise would).
     */
    void (*request_ckpt)(job_t *job);
    /*
     * May be NULL (solo: the shared directory's MANIFEST.json is the only
     * record). This node's two files of a checkpoint are durable: record
     * them where every node sees them and, once every shard has its two
     * copies, write the job's manifest and apply retention (f->keep).
     * cb(arg, 1): this call completed the checkpoint; cb(arg, 0): not
     * complete yet, or another node completed it; cb(arg, < 0): an error
     * (logged). f is copied.
     */
    int (*ckpt_report)(job_t *job, const job_ckpt_files_t *f,
                       job_done_cb cb, void *arg);
    /* Free everything; in-flight callbacks are dropped, never called.
     * Handles are closed asynchronously: run the loop once after. */
    void (*destroy)(job_t *job);
    /* May be NULL (no ring): the per-step waits on the predecessor. */
    void (*hop_stats)(job_t *job, job_hops_t *hops_p);
    /* May be NULL (no membership): blame's counters. */
    void (*blame_stats)(job_t *job, job_blame_t *stats_p);
    /*
     * May be NULL (the view never changes under a collective). The newest
     * view generation the backend was given, installed or waiting for the
     * next step start. A collective that completes once this is above the
     * generation of its step ran on a superseded view, which any newer
     * view ends (a ring backend aborts it, but it may have finished just
     * before): the daemon hands its result to no trainer and the step is
     * redone on the new view, so no step of a view known to be over
     * completes here.
     */
    uint64_t (*newest_generation)(job_t *job);
} job_ops_t;

/* Every backend struct starts with this. */
struct job {
    const job_ops_t *ops;
};

typedef struct {
    job_view_cb on_view;
    void *arg;
    /* The node's state region (the first trainer's), which a ring backend
     * broadcasts to joiners and overwrites on resync; NULL/0 when none is
     * registered. May be NULL. */
    void (*get_state)(void *arg, void **ptr_p, size_t *bytes_p);
    /* The region get_state gave is no longer read nor written (the view
     * install that used it ended): the daemon may unmap it again. Called
     * once after each get_state. May be NULL. */
    void (*put_state)(void *arg);
    /* Membership asked this node to leave (drain key). May be NULL. */
    void (*on_drain)(void *arg);
} job_cbs_t;

/*
 * What a job needs to know, and nothing of the daemon's other settings.
 * The strings must outlive the job: the ring backend registers again with
 * them after a standby.
 */
typedef struct {
    const char *spec;          /* "solo", "fake:reshape=S[,S...]", "ring" */
    const char *etcd;          /* ring: comma-separated endpoints */
    const char *etcd_ca;       /* ring: etcd security, each NULL for none: */
    const char *etcd_cert;     /*   CA bundle, client certificate and key, */
    const char *etcd_key;      /*   user and the file holding its */
    const char *etcd_user;     /*   password (etcd_config_t) */
    const char *etcd_password_file;
    const char *job_secret_file; /* ring: NULL, neighbours are trusted */
    const char *job;           /* ring: the job's name in etcd */
    const char *node;          /* ring: this node's id, unique in the job */
    const char *host;          /* ring: nodes of one host are adjacent */
    uint32_t trainers;         /* trainers of this node; 0: any (1 slot) */
    uint32_t min_nodes;        /* ring: the first view waits for this many */
    uint32_t lease_ttl;        /* ring: seconds */
    uint32_t ring_deadline_ms; /* ring: no progress this long fails a
                                  collective; 0: the ring's default */
    uint32_t ring_live_ms;     /* ring: a neighbour silent this long (no
                                  heartbeat, no data) is suspected; 0:
                                  off, its lease alone */
    /* ring: the options every node of a job must share (ring_opts_t's
     * fields of the same names). The job's first view carries those of
     * the node that wrote it, and every node runs with the view's
     * (job/README.md, "The job's ring options"). */
    uint64_t ring_chunk_bytes;    /* 0: the ring's default */
    uint32_t ring_bidirectional;  /* RING_BIDIR_OFF, _ON or _AUTO */
    rd_wire_t ring_wire;          /* RD_WIRE_DEFAULT: none */
    uint32_t ring_grid_min_nodes; /* 0: never */
    uint64_t ring_grid_max_bytes; /* 0: any size */
    uint32_t ring_grid_cols;      /* 0: rows by host, else sqrt */
    uint32_t step_commit_off;     /* no commit round at step end (a job
                                     option; stale steps possible) */
    uint64_t ring_fuse_bytes;     /* job_view_t.fuse_bytes (a job
                                     option), at most
                                     JOB_FUSE_MAX_BYTES; 0: off */
    const char *ckpt_dir;      /* ring: checkpoint directory (the job's
                                  store is ckpt_dir/job); NULL: off */
} job_config_t;

/* The largest fusion cap a view may carry (job_view_t.fuse_bytes). */
#define JOB_FUSE_MAX_BYTES (1ull << 30)

/*
 * Create a job on loop from cfg->spec through the backend table. "fake":
 * the first collective of each listed step completes with ST_ERESHAPE and
 * the generation bumps, once per step. cfg is copied (not its strings).
 * Returns 0, ST_ECONFIG (an unknown or malformed spec, logged) or the
 * backend's error.
 */
int job_create(uv_loop_t *loop, const job_config_t *cfg,
               const job_cbs_t *cbs, job_t **job_p);

/* Implementations (job.c's table dispatches to them). fake_args NULL:
 * solo. */
int job__solo_create(uv_loop_t *loop, const char *fake_args,
                     const job_cbs_t *cbs, job_t **job_p);
int job__ring_create(uv_loop_t *loop, const job_config_t *cfg,
                     const job_cbs_t *cbs, job_t **job_p);

/*
 * The daemon's calls into its job: one wrapper per op of job_ops_t, which
 * owns the op's "may be NULL" (job.c), so no caller tests an op pointer.
 * Each does what the op above says; where the op is absent:
 */
const char *job_name(const job_t *job);
void job_set_local_trainers(job_t *job, uint32_t n);
int job_ready(job_t *job, job_done_cb cb, void *arg); /* absent: 1 */
void job_get_view(job_t *job, job_view_t *view_p);
void job_set_step(job_t *job, uint64_t step);       /* absent: nothing */
void job_trainer_lost(job_t *job, int in_step,
                      uint32_t remaining);          /* absent: nothing */
/* ST_EINVAL, before any backend sees it, for an op outside kern_op_t, a
 * divisor that is not non-zero exactly for AVG, a wire outside rd_wire_t
 * or a compressing one for a dtype other than f32, or no buffers. */
int job_allreduce(job_t *job, const job_reduce_t *r, job_done_cb cb,
                  void *arg);
int job_broadcast(job_t *job, void *buf, size_t bytes, uint32_t root,
                  job_done_cb cb, void *arg);
void job_step_end(job_t *job, uint64_t step);
/* 1 when steps need a commit (several nodes can disagree): job_commit
 * then decides; 0: a step that ended is done. */
int job_commits(const job_t *job);
int job_commit(job_t *job, job_done_cb cb, void *arg); /* absent: 1 */
int job_leave(job_t *job, job_done_cb cb, void *arg);
/* 1 when trainers may ask for a checkpoint (job_request_ckpt). */
int job_takes_ckpt_requests(const job_t *job);
void job_request_ckpt(job_t *job);                  /* absent: nothing */
/* 1 when checkpoints are recorded by the job (job_ckpt_report), 0 when
 * the shared directory's MANIFEST.json is the only record. */
int job_records_ckpts(const job_t *job);
int job_ckpt_report(job_t *job, const job_ckpt_files_t *f, job_done_cb cb,
                    void *arg);                     /* absent: ST_ENOTSUP */
/* 0 and *out filled, or ST_ENOTSUP when the job has no such figures. */
int job_hop_stats(job_t *job, job_hops_t *out);
int job_blame_stats(job_t *job, job_blame_t *out);
uint64_t job_newest_generation(job_t *job);         /* absent: 0 */

/* Accepts NULL. */
static inline void job_destroy(job_t *job)
{
    if (job != NULL)
        job->ops->destroy(job);
}

#endif /* RINGD_JOB_H */
