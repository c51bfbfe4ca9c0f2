/*
 * dmn-int.h - internals shared by the daemon's files. Not a public
 * header. Which file may call which: daemon/README.md, "Files".
 */
#ifndef RINGD_DMN_INT_H
#define RINGD_DMN_INT_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "checkpoint/ckpt.h"
#include "job/job.h"
#include "daemon/dmn.h"
#include "proto/proto.h"

typedef struct {
    void *addr;           /* NULL: slot unused */
    uint64_t size;
} dmn_buf_t;

/*
 * A connection's life, as the step machine sees it. One transition
 * function (dmn__conn_set_state in conn.c) changes it.
 *
 *   NEW -HELLO-> IDLE -step_begin-> WAITING -step starts-> ACTIVE
 *   ACTIVE -COLL-> POSTED -its last queued COLL answered-> ACTIVE
 *   ACTIVE/POSTED -step_end, or left to redo the step-> IDLE
 *   IDLE/WAITING -drained-> SHUTDOWN (told RINGD_ESHUTDOWN)
 *   any -connection gone-> CLOSED
 */
typedef enum {
    DMN_CONN_NEW = 0,   /* connected, no HELLO yet */
    DMN_CONN_IDLE,      /* between steps (or never in one) */
    DMN_CONN_WAITING,   /* a STEP_BEGIN awaits its reply */
    DMN_CONN_ACTIVE,    /* in the current step */
    DMN_CONN_POSTED,    /* in the step, COLLs await their replies */
    DMN_CONN_SHUTDOWN,  /* told to stop: the node drained */
    DMN_CONN_CLOSED,    /* gone; freed once its handle closes */
} dmn_conn_state_t;

/* Facts about a connection independent of its state (c->flags). */
enum {
    DMN_CONN_F_MEMBER = 1u << 0,    /* took part in a step already */
    DMN_CONN_F_BYE = 1u << 1,       /* said goodbye: a clean leave */
    DMN_CONN_F_HAS_STATE = 1u << 2, /* registered a state region */
    DMN_CONN_F_STALLED = 1u << 3,   /* timed out in a step (--step-
                                       timeout): its next call redoes it */
    DMN_CONN_F_REDO = 1u << 4,      /* left the step to redo it: the
                                       collectives it still sends in that
                                       step answer RINGD_ERESHAPE */
    DMN_CONN_F_END_HELD = 1u << 5,  /* its STEP_END (end_seq) is answered
                                       when the step's commit is known */
    DMN_CONN_F_JOB = 1u << 6,       /* named the job the node runs
                                       (jobs.c) */
};

/* A collective a connection sent and that awaits its reply. */
typedef struct {
    uint32_t msg_seq;     /* the COLL to answer */
    uint32_t pad;
    proto_coll_req_t req;
} dmn_qcoll_t;

/* One client connection (a trainer, or ringctl asking for status). */
typedef struct dmn_conn {
    struct dmn_conn *next;
    dmn_t *d;
    uv_poll_t poll;
    int fd;
    /* The peer process's pidfd, readable once it exited: a child it
     * forked (a DataLoader worker) inherits the socket and holds it open
     * after the trainer died, so EOF alone never says so. -1: not
     * watched (no pidfd_open, or a peer outside our pid namespace). */
    uv_poll_t exit_poll;
    int pidfd;
    int polls_open;       /* handles conn_freed waits for */
    uint32_t id;
    pid_t pid;            /* the kernel's (SO_PEERCRED), not the HELLO's */
    uid_t uid;
    char name[32];
    dmn_conn_state_t cstate;
    unsigned flags;       /* DMN_CONN_F_* */
    dmn_buf_t *bufs;      /* indexed by the client's buffer id */
    uint32_t bufs_cap;    /* slots in bufs (grows to the highest id) */
    uint32_t nmapped;     /* slots in use */
    uint64_t mapped_bytes;
    proto_state_set_t state; /* valid with DMN_CONN_F_HAS_STATE */

    /* Step bookkeeping (step.c). */
    uint32_t begin_seq;   /* WAITING: the STEP_BEGIN to answer */
    uint32_t end_seq;     /* DMN_CONN_F_END_HELD: the STEP_END to answer */
    /* POSTED: its collectives in the order sent, a ring of q_len from
     * q_head. Every in-step connection's i-th entry is the same collective
     * of the step (the heads complete together), the head the one being
     * gathered or reduced. */
    dmn_qcoll_t q[PROTO_MAX_OUTSTANDING];
    uint32_t q_head, q_len;
    uint32_t local_rank;
    uint64_t active_ms;   /* when it last entered DMN_CONN_ACTIVE */
    /* A joiner whose state was filled off the loop: d->stats.steps + 1
     * when it was (valid until a step completes); 0: not filled. */
    uint64_t restored_mark;
} dmn_conn_t;

/* The i-th collective c awaits (i < c->q_len). */
static inline dmn_qcoll_t *dmn__conn_q(dmn_conn_t *c, uint32_t i)
{
    return &c->q[(c->q_head + i) % PROTO_MAX_OUTSTANDING];
}

/* In the current step (ACTIVE or POSTED). */
static inline int dmn__conn_in_step(const dmn_conn_t *c)
{
    return c->cstate == DMN_CONN_ACTIVE || c->cstate == DMN_CONN_POSTED;
}

/* Took part in a step of the node already. */
static inline int dmn__conn_is_member(const dmn_conn_t *c)
{
    return (c->flags & DMN_CONN_F_MEMBER) != 0;
}

/* Registered a state region. */
static inline int dmn__conn_has_state(const dmn_conn_t *c)
{
    return (c->flags & DMN_CONN_F_HAS_STATE) != 0;
}

/* Counts as a trainer of the node: a member, or waiting to join. */
static inline int dmn__conn_counted(const dmn_conn_t *c)
{
    return (c->flags & DMN_CONN_F_MEMBER) || c->cstate == DMN_CONN_WAITING;
}

/*
 * The node's step state. IDLE, RUNNING, REDUCING are the normal cycle;
 * BROKEN is a step aborted by a view change or a lost trainer (every
 * later collective of the step answers RINGD_ERESHAPE); ABORTING is a
 * break asked for while a collective is with the backend, which must come
 * back before the step can be broken (its buffers are in use); DRAINED is
 * final. dmn__step_set_state (step.c) holds the table of allowed moves.
 */
typedef enum {
    DMN_STEP_IDLE = 0,     /* between steps: collecting step_begins */
    DMN_STEP_RUNNING,      /* step begun: collecting collectives */
    DMN_STEP_REDUCING,     /* a collective is with the backend, or
                              its copies into or out of staging run */
    DMN_STEP_ABORTING,     /* REDUCING, and the step is to break when the
                              collective comes back */
    DMN_STEP_BROKEN,       /* aborted: waiting for everyone to leave it */
    DMN_STEP_COMMITTING,   /* every trainer ended it: the backend's commit
                              decides whether it counts (job.h) */
    DMN_STEP_DRAINED,      /* shutting down: no more steps */
} dmn_step_state_t;

/* Upper bounds (seconds) of the recovery histogram's finite buckets. */
#define DMN_RECOVERY_BUCKETS 10
#define DMN_LAG_PERIOD_MS 10 /* the loop-lag timer (dmn.c) */
extern const double dmn__recovery_le[DMN_RECOVERY_BUCKETS];

typedef struct {
    uint64_t collectives;
    uint64_t coll_zero_copy; /* ran in the one trainer's buffer */
    uint64_t coll_fused;     /* ran as part of a fused group */
    uint64_t coll_fused_in_place; /* of them, in the trainers' buffers */
    uint64_t coll_fused_auto; /* fused by arrival (step-queue.c, ask) */
    uint64_t fuse_asks;      /* the nodes asked how many to fuse */
    uint64_t coll_bytes;
    double coll_seconds;
    double last_busbw;     /* bytes/s of the last allreduce */
    double loop_lag_max;   /* seconds: worst lateness of the lag timer
                              since the last /metrics scrape */
    uint64_t coll_errors;
    uint64_t view_changes;
    uint64_t aborted_steps;
    uint64_t steps;
    uint64_t uncommitted_steps; /* ended here, dropped by the commit */
    uint64_t recoveries;
    double recovery_seconds_sum;
    /* Recoveries per histogram bucket of metrics.c (not cumulative). */
    uint64_t recovery_hist[DMN_RECOVERY_BUCKETS];
    double last_recovery_seconds;
    uint64_t trainers_joined;
    uint64_t trainers_lost;
    uint64_t trainers_stalled; /* timed out in a step (--step-timeout) */
    uint64_t stall_wakeups;    /* the step timeout's timer fired */
    uint64_t proto_errors;
    uint64_t ckpt_requests;
    uint64_t ckpt_taken;
    uint64_t ckpt_failed;
    uint64_t ckpt_skipped;
    uint64_t ckpt_holds; /* collectives answered after a snapshot copy */
    /* Where a checkpoint's time goes (metrics.c, the checkpoint log). */
    double ckpt_hold_seconds;     /* completions held for the copies */
    double ckpt_hold_max_seconds;
    uint64_t ckpt_copies;         /* boundaries whose shards were copied */
    double ckpt_copy_seconds;     /* boundary to both shards copied */
    double ckpt_loop_seconds;     /* the loop in checkpoint/copy code */
    double snapshot_seconds;      /* one-node snapshots, off the loop */
    uint64_t snapshots;
    /* State bytes memcpy'd on the loop's thread: restores that still
     * copy there (the checkpoint restore at a job's first step and its
     * copy to the node's other trainers). */
    uint64_t loop_copy_bytes;
    /* Tensor bytes a collective copied into or out of staging (a
     * broadcast to several trainers, the copying path), by the thread
     * that copied them (dmn__coll_copied): the loop only below
     * DMN_COLL_INLINE_MAX a copy, the pool above. */
    uint64_t coll_copy_loop_bytes;
    uint64_t coll_copy_pool_bytes;
    /* Trainer buffers unmapped, by the thread (conn.c, unmap_now): the
     * loop only below DMN_UNMAP_INLINE_MAX, at the daemon's end, or when
     * the pool refused. */
    uint64_t unmap_loop_bytes;
    uint64_t unmap_pool_bytes;
    uint64_t restores;
} dmn_stats_t;

/*
 * dmn_t's flags (d->flags), by concern. Each is a fact that holds until
 * cleared; the step machine's state itself is d->state.
 */
enum {
    /* The step being run (step.c). */
    DMN_F_ANY_REDO = 1u << 0,         /* a trainer left it to redo it */
    DMN_F_RESTORED_PENDING = 1u << 3, /* the job replaced the state: tell
                                         the trainers at the next start */
    DMN_F_RESTORE_CHECKED = 1u << 4,  /* the checkpoint restore was tried */
    /* The drain (dmn.c, step.c). */
    DMN_F_DRAIN_REQUESTED = 1u << 5,
    DMN_F_LEAVE_DONE = 1u << 6,       /* the job's leave finished */
    DMN_F_DRAIN_TIMED_OUT = 1u << 7,
    /* Handles and locks to tear down (server.c, metrics.c, checkpoint.c,
     * dmn.c). */
    DMN_F_LISTENING = 1u << 8,
    DMN_F_HTTP_ON = 1u << 9,
    DMN_F_CKPT_ASYNC_ON = 1u << 10,
    DMN_F_CKPT_MU_INIT = 1u << 11,
    DMN_F_DESTROYING = 1u << 12,      /* freed when the last handle closes */
    DMN_F_RESTART = 1u << 14,         /* the drain is dmn_restart()'s */
    DMN_F_JOB_ENDED = 1u << 15,       /* the drain is the end of a job its
                                         trainers named (jobs.c) */
    DMN_F_RESTART_CKPT = 1u << 16,    /* the restart's drain waits for its
                                         checkpoint (checkpoint.c) */
};

/*
 * A copy of trainer state on libuv's pool (copy.c): work() runs there,
 * done() on the loop (status ST_EABORTED: the daemon is being destroyed,
 * work() may not have run; touch nothing but d's own fields), and frees
 * the struct it is embedded in. The caller fills d, work, done, flags.
 */
typedef struct dmn_copy dmn_copy_t;
typedef struct dmn_copy_pool dmn_copy_pool_t;
enum {
    DMN_COPY_F_NO_HOLD = 1u << 0, /* copies no state: holds no collective */
    DMN_COPY_F_KICK = 1u << 1,    /* a step start waits for it */
};
struct dmn_copy {
    uv_work_t req;
    dmn_t *d;               /* the caller's: work() and done() read it */
    void (*work)(dmn_copy_t *c);
    void (*done)(dmn_copy_t *c, int status);
    unsigned flags;         /* DMN_COPY_F_* */
    dmn_copy_t *next;       /* the pool's list (copy.c) */
    dmn_copy_pool_t *pool;
    int ran;                /* guarded by the pool's mu */
    uint64_t queued_ns;
    uint64_t work_ns;       /* work() itself, on the pool thread */
    uint64_t wall_ns;       /* queued to done() */
};

/* The pool's owner's side (dmn.c): on_busy() runs when a copy is queued on
 * an idle pool, after() once per copy, after its done(), with the copy's
 * flags and status. */
typedef struct {
    uv_loop_t *loop;
    int *refs;              /* +1 per copy in flight; after() drops it */
    double *loop_seconds;   /* the loop's time in done() */
    void (*on_busy)(void *arg);
    void (*after)(void *arg, unsigned flags, int status);
    void *arg;
} dmn_copy_pool_opts_t;

/* The pool (copy.c's alone: others use its functions). */
struct dmn_copy_pool {
    uv_loop_t *loop;
    dmn_copy_t *copies;
    pthread_mutex_t mu;     /* dmn_copy_t.ran, for dmn__copy_stop */
    pthread_cond_t cv;
    int sync_init;
    int busy;               /* queued, not yet after() */
    int holding;            /* ... of them, without DMN_COPY_F_NO_HOLD */
    int stopping;
    int *refs;
    double *loop_seconds;
    void (*on_busy)(void *arg);
    void (*after)(void *arg, unsigned flags, int status);
    void *arg;
};

/*
 * The trainers' mappings while another thread may read or write them
 * (conn.c's alone). Each holder is a named bit: the collective the
 * backend runs (its buffers, staging), the state region lent to a view
 * install, and copies on the pool. A trainer that goes away meanwhile is
 * unmapped when the last holder lets go, never under a thread using it.
 */
enum {
    DMN_MAPS_COLL = 1u << 0,    /* a collective is with the backend
                                   or copied into or out of staging */
    DMN_MAPS_INSTALL = 1u << 1, /* the state region is lent (job.h) */
    DMN_MAPS_COPIES = 1u << 2,  /* copies run on the pool (copy.c) */
};
typedef struct {
    unsigned holds;            /* DMN_MAPS_* */
    struct dmn_unmap { void *addr; size_t size; } *deferred;
    uint32_t n, cap;
} dmn_maps_t;

/* The local API server's listener and accept policy (server.c's alone). */
typedef struct {
    int listen_fd;
    uv_poll_t listen_poll;
    /* accept() out of descriptors or memory: paused, retried with
     * backoff, logged rate-limited. */
    uv_timer_t accept_timer;
    uint32_t accept_backoff_ms; /* 0: accepting normally */
    uint64_t accept_failures;
    uint64_t accept_log_ms;
    uint32_t conn_cap;          /* max-clients, or less under ulimit -n */
    uint64_t refused_over_cap;  /* closed at once: conn_cap reached */
    uint64_t cap_log_ms;
    uint64_t refused_peers;     /* closed at once: credentials not allowed */
    uint64_t peer_log_ms;
    uint32_t next_conn_id;
} dmn_server_t;

/* The job the daemon serves (jobs.c's alone): the config's (pinned), or
 * the one its first trainer named ("" until then); its secret file when
 * not pinned. */
typedef struct {
    char name[RINGD_JOB_NAME_MAX + 1];
    int pinned;
    char secret[4096];
    /* Armed when the job's last trainer was lost (not a BYE): the node
     * stays in the job, stepped out, this long for its replacement
     * (--job-grace) before it leaves. */
    uv_timer_t grace_timer;
} dmn_jobs_t;

/* The checkpoint writers and their bookkeeping (checkpoint.c's alone). */
typedef struct {
    char *root;            /* <ckpt-dir>/<job>; NULL: off */
    ckpt_writer_t *w[2];   /* primary shard, predecessor's replica */
    uv_async_t async;
    pthread_mutex_t mu;
    uint64_t done_step[2]; /* guarded by mu */
    int done_status[2];
    ckpt_shard_info_t done_info[2];
    uint64_t pending_step; /* submitted, not completed; 0: none */
    uint32_t pending_n;
    uint64_t reported_step; /* the last one handed to ckpt_report */
    size_t reserved;       /* staging bytes the writers hold */
    uint64_t hold_ns;      /* a completion held for the copies since;
                              0: none */
    int reserving;         /* the stages grow on the pool */
    int submitting;        /* a boundary's copies are queued */
    int restoring;         /* the checkpoint restore runs: no start */
    /* The restart drain's checkpoint: its step (DMN_F_RESTART_CKPT
     * while it waits for the writers or is being written). */
    uint64_t restart_step;
    double last_copy_ms;   /* the last boundary's, queued to done */
    double last_copy_work_ms; /* ... of which copying */
    double last_hold_ms;   /* the last hold's wait */
} dmn_ckpt_t;

/* The collective with the backend (step-queue.c's alone). */
typedef struct {
    /* The queues' head being reduced (REDUCING); when fused, count is
     * the group's total. */
    proto_coll_req_t coll;
    size_t *seg_counts;    /* [coll_nsegs] of a fused one */
    size_t seg_counts_cap;
    uint64_t start_ns;
    void *staging;
    size_t staging_size;
    /* The trainers' buffers the backend works on (job_reduce_t.bufs). */
    void **bufs;
    uint32_t bufs_cap;
    uint32_t nbufs;        /* of them, one per trainer (not fused) */
    size_t bytes;          /* the collective's (a fused group's total) */
    void *buf;             /* a broadcast's: staging or the one buffer */
    int direct;            /* it works in the one trainer's buffer */
    /* The backend's segments: coll_nsegs, or 1 for a fused group whose
     * pieces lie end to end in order in every trainer's buffer, which
     * then runs in those buffers like one allreduce (no staging). */
    uint32_t nsegs;
    int zero_copy;         /* 0: RINGD_ZERO_COPY=0, always via staging */
    int held;              /* done(held_status) waits for the checkpoint
                              copies (dmn__coll_release) */
    int held_status;
    /*
     * The copy into staging before the launch or out of it before the
     * answer, on the pool when large (step-queue.c, coll_copy): one at a
     * time, so it lives here, not in a malloc per collective. copy_dst
     * has room for every posted trainer; copy_then goes on on the loop.
     */
    dmn_copy_t copy;
    const void *copy_src;
    void **copy_dst;
    uint32_t copy_n, copy_dst_cap;
    void (*copy_then)(dmn_t *d);
    /*
     * Fusion by arrival of ungrouped allreduces (step-queue.c, "Fusion by
     * arrival"): every node of a view goes through the same launches in
     * the steps it counts, so these move alike on every node; they carry
     * over from a step to the next of the same view, else start again.
     */
    uint64_t fuse_starts;  /* the d->starts of the last launch */
    uint64_t fuse_gen, fuse_step; /* its view and step */
    uint32_t fuse_skip;    /* launches to go before the next ask */
    uint32_t fuse_backoff; /* the skip after an ask answered 1: 0, 1,
                              2, 4 ... 64 in a row */
    uint32_t fuse_agreed;  /* the last ask's answer, for its launch */
    uint32_t fuse_mine;    /* what this node offered in it */
    uint64_t fuse_hist;    /* signature of the step's launches so far */
    /* The ask's buffer, an i64 MIN over the nodes: the offer, then each
     * signature and its negation (both equal everywhere iff agreed). */
    int64_t fuse_ask[5];
    int auto_fused;        /* the launch's group was fused by arrival */
    void *fuse_ask_buf[1];
} dmn_queue_t;

/* state.c's alone. */
typedef struct {
    /* The job state as of the last completed step (for joiners) of a
     * one-node job; a copy in flight owns the buffer (snap_step is 0). */
    void *snap;
    size_t snap_size;      /* allocated */
    uint64_t snap_bytes;
    uint64_t snap_step;
    int snap_copying;
    int joiner_copying;    /* joiner fills in flight: no start */
} dmn_state_t;

struct dmn {
    uv_loop_t *loop;
    const dmn_config_t *cfg;
    dmn_hooks_t hooks;
    job_t *job;
    uint64_t start_ms;
    int open_handles;      /* handles of this struct still closing */
    void (*free_fn)(dmn_t *d); /* the last reference frees d (dmn.c) */
    /* A connection changed state (conn.c; the step's stall timer). */
    void (*conn_changed)(dmn_t *d);
    unsigned flags;        /* DMN_F_* */
    uint64_t status_ms;    /* last STATUS= sent */

    /* Local API server (server.c). */
    dmn_server_t srv;
    dmn_conn_t *conns;     /* in connection order: local rank order; added
                              and removed by server.c, read by all */
    uint32_t nconns;

    /* Metrics HTTP server (metrics.c). */
    uv_tcp_t http;

    /* The job a trainer named, or the config's (jobs.c). */
    dmn_jobs_t jobs;

    /* Step state (step.c). */
    dmn_step_state_t state;
    uint64_t step;
    job_view_t view;       /* the view of the current/last step */
    uint64_t last_generation;
    uint32_t ended;        /* trainers that called step_end this step */
    uv_timer_t drain_timer;
    uv_timer_t stall_timer; /* --step-timeout: the earliest deadline */
    uint64_t stall_due_ms;  /* what stall_timer is armed for; 0: not */
    uv_timer_t lag_timer;  /* measures the loop's lag (dmn.c) */
    uint64_t lag_due_ns;
    uint64_t break_ms;     /* when the current recovery began; 0: none */
    uint64_t starts;       /* steps started (step.c): the fusion's
                              state is per start (step-queue.c) */
    /* The collective being reduced (step-queue.c). */
    dmn_queue_t q;
    /* Queue entries the collective with the backend answers (> 1 when
     * fused): step-queue.c sets it at the launch, step.c reads it when
     * it fails the step's collectives. */
    uint32_t coll_nsegs;
    /* Who may touch the trainers' mappings off the loop (conn.c). */
    dmn_maps_t maps;
    /* The state regions' copies (state.c). */
    dmn_state_t st;

    /* Checkpoints (checkpoint.c). */
    dmn_ckpt_t ck;
    /* Copies of trainer state run on the pool while the next step runs;
     * a collective that completes before they are done is answered
     * after (copy.c, dmn__ckpt_hold). */
    dmn_copy_pool_t pool;
    pthread_t loop_thread;       /* dmn__state_copied counts copies here */

    dmn_stats_t stats;
};

/* server.c */
/* Before anything can fail in dmn_create: dmn__server_stop is safe. */
void dmn__server_init(dmn_t *d);
int dmn__server_start(dmn_t *d);
void dmn__server_stop(dmn_t *d);

/* conn.c: a connection's replies, buffers and state. */
/* Send a reply body of the type's size. Returns 0 or a negative errno. */
int dmn__reply(dmn_conn_t *c, uint32_t type, uint32_t seq, const void *body,
               size_t len);
void dmn__reply_status(dmn_conn_t *c, uint32_t type, uint32_t seq,
                       int32_t status);
void dmn__reply_error(dmn_conn_t *c, uint32_t seq, int32_t status,
                      const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A pointer into a client's mapped buffer, range-checked; NULL if bad. */
void *dmn__buf_ptr(dmn_conn_t *c, uint32_t buf_id, uint64_t off,
                   uint64_t len);
/* Unmap a client buffer now, or, while a holder may read or write it on
 * another thread (dmn_maps_t), once the last one lets go. */
void dmn__buf_unmap(dmn_t *d, void *addr, size_t size);
/* Take or let go of the mappings for who (DMN_MAPS_*); the last release
 * runs the deferred unmaps. */
void dmn__maps_hold(dmn_t *d, unsigned who);
void dmn__maps_release(dmn_t *d, unsigned who);
int dmn__maps_held(const dmn_t *d, unsigned who);
/* The daemon's end: every holder is gone; unmap and free. */
void dmn__maps_fini(dmn_t *d);
/* The one place a connection's state changes; a move its table does not
 * allow is logged as an error and refused. */
void dmn__conn_set_state(dmn_conn_t *c, dmn_conn_state_t next);

/* step.c: the step state machine (step-int.h: what the queue drives). */
void dmn__step_begin(dmn_t *d, dmn_conn_t *c, uint32_t seq);
void dmn__step_end(dmn_t *d, dmn_conn_t *c, uint32_t seq);
/* The connection is going away (before its buffers are unmapped). */
void dmn__step_conn_lost(dmn_t *d, dmn_conn_t *c);
/* --step-timeout: (re)arm the one-shot timer for the earliest deadline of
 * the ACTIVE trainers, or stop it when none is (a no-op when off). */
void dmn__step_stall_arm(dmn_t *d);
void dmn__step_on_view(void *arg, const job_view_t *view);
/* Start a step if the trainers are all there (after an off-loop copy). */
void dmn__step_try_start(dmn_t *d);
void dmn__step_drain(dmn_t *d);
/* Drain timed out: mark drained without telling anyone (exiting). */
void dmn__step_force_drained(dmn_t *d);

/* step-queue.c: the collectives within a step. */
void dmn__step_coll(dmn_t *d, dmn_conn_t *c, uint32_t seq,
                    const proto_coll_req_t *req);
/* The checkpoint copies are done: answer the collective they held. */
void dmn__coll_release(dmn_t *d);
/* The daemon's start (RINGD_ZERO_COPY) and end (the buffers' memory). */
void dmn__queue_init(dmn_t *d);
void dmn__queue_fini(dmn_t *d);

/* fuse.c: fusion by arrival, the nodes agreeing (step-queue.c drives). */
/* A job whose launches may fuse, and a head that may start a run. */
int dmn__fuse_on(const dmn_t *d);
int dmn__fuse_eligible(const proto_coll_req_t *head);
/* The entries from the queues' head this node could run as one (>= 1;
 * 0: nothing queued): queued by every posted trainer, within the cap. */
uint32_t dmn__fuse_run(dmn_t *d);
/* Before a launch: the fusion's state for this step start. */
void dmn__fuse_epoch(dmn_t *d);
/* The launch of the first g entries of first's queue (the history). */
void dmn__fuse_launched(dmn_t *d, dmn_conn_t *first, uint32_t g);
/* Ask the nodes about a run from the head d->q.coll, offering mine: the
 * backend's allreduce (job.h), cb(d, status) when answered. */
int dmn__fuse_ask(dmn_t *d, uint32_t mine, job_done_cb cb);
/* The ask came back: 0 with d->q.fuse_agreed set (1 where the heads
 * differed: no fusion for the step), ST_EMISMATCH when the history
 * differed, ST_EPROTO for an answer out of range. */
int dmn__fuse_answer(dmn_t *d);

/* drain.c (dmn_drain, dmn_restart: dmn.h); the job's drain key. */
void dmn__on_backend_drain(void *arg);

/* checkpoint.c */
/* Checkpoints of job under --ckpt-dir/job (--ckpt-interval > 0): from
 * dmn_create with the pinned job's name, or at the join of a job its
 * trainers named. NULL (no job yet) or started already: nothing. */
int dmn__ckpt_start(dmn_t *d, const char *job);
void dmn__ckpt_stop(dmn_t *d);
/* Step `step` is about to start; every trainer ended the one before. */
void dmn__ckpt_boundary(dmn_t *d, uint64_t step);
/* At a step start, the view known: size the writers' staging buffers for
 * this node's shards now, off the snapshot's path. */
void dmn__ckpt_prepare(dmn_t *d);
/* A CKPT request from a trainer: replies to it. */
void dmn__ckpt_request(dmn_t *d, dmn_conn_t *c, uint32_t seq);
/* A standalone daemon drained for a restart checkpoints that boundary
 * (the next one resumes there); dmn_done() waits while it is busy. */
void dmn__ckpt_restart_take(dmn_t *d);
/* 1 when the queue's finished collective must wait for the checkpoint
 * copies (dmn__coll_release answers it when they are done). */
int dmn__ckpt_hold(dmn_t *d, int status);
/* Checkpoints are on (a store); the restore at the first start runs. */
int dmn__ckpt_enabled(const dmn_t *d);
int dmn__ckpt_restoring(const dmn_t *d);
/* Writer i (0 primary, 1 replica), NULL when off; one is busy. */
ckpt_writer_t *dmn__ckpt_writer(const dmn_t *d, int i);
int dmn__ckpt_writing(const dmn_t *d);

/* copy.c: the pool */
int dmn__copy_init(dmn_copy_pool_t *p, const dmn_copy_pool_opts_t *o);
/* 0, or ST_ENOMEM (nothing queued, done() never called). */
int dmn__copy_queue(dmn_copy_pool_t *p, dmn_copy_t *c);
/* Copies in flight; of them, those a held collective waits for. */
int dmn__copy_busy(const dmn_copy_pool_t *p);
int dmn__copy_holding(const dmn_copy_pool_t *p);
void dmn__copy_stop(dmn_copy_pool_t *p);
void dmn__copy_fini(dmn_copy_pool_t *p);

/* state.c: the trainers' state regions and the copies between them. */
typedef struct { uint32_t conn_id; void *dst; const void *src;
                 size_t bytes; } dmn_fill_t;
/* The first trainer with a state region, members first (the one the
 * backend sends and replaces); *ptr_p its region. NULL if none. */
dmn_conn_t *dmn__state_primary(dmn_t *d, void **ptr_p);
/* The node's primary state region (for the backend); NULL/0 if none. */
void dmn__state_get(void *arg, void **ptr_p, size_t *bytes_p);
/* The same, lent to the backend for a view install: the trainers'
 * mappings stay mapped (dmn__buf_unmap) until it is given back. */
void dmn__state_lend(void *arg, void **ptr_p, size_t *bytes_p);
void dmn__state_put(void *arg);
/* The other local trainers' state regions of p's size, into f (room
 * for d->nconns), src unset. */
uint32_t dmn__state_others(dmn_t *d, const dmn_conn_t *p, dmn_fill_t *f);
/* The backend replaced the primary state: the node's other trainers get
 * the same bytes, off the loop; no step starts before they are there. */
void dmn__state_propagate(dmn_t *d);
/* A step boundary: a one-node job keeps the state as of it, off the loop,
 * for a trainer that joins after every local one died. */
void dmn__state_boundary(dmn_t *d);
/* Copy the job's state into the waiting joiners' regions, off the loop.
 * 1: a copy runs (the start is tried again when it is done); 0: every
 * joiner is ready. */
int dmn__state_fill_joiners(dmn_t *d);
/* 1 when joiner j's state was filled for this start (counted, logged). */
int dmn__state_joiner_filled(dmn_t *d, dmn_conn_t *j);
/* The daemon's end: the snapshot's memory. */
void dmn__state_fini(dmn_t *d);
/* At the node's first start: restore the newest usable checkpoint into
 * state (bytes) and copy it to f[n] (the other trainers), on the pool;
 * then the step is set, RESTORED_PENDING too, and the start is tried
 * again. 0: started (dmn__ckpt_restoring until done), else nothing to do
 * (checkpoint.c). */
int dmn__ckpt_restore_start(dmn_t *d, void *state, size_t bytes,
                            const dmn_fill_t *f, uint32_t n);
/* The last copy a held collective waited for is done (checkpoint.c: the
 * hold's figures). */
void dmn__ckpt_copies_done(dmn_t *d);

/* jobs.c: the job a trainer names (PROTO_T_JOB), and the end of a job
 * that trainers named. */
/* The daemon's first job object (dmn_create): the pinned job, or an idle
 * placeholder until a trainer names one. */
int dmn__job_start(dmn_t *d);
/* The daemon's end: the grace timer's close (counted in open_handles). */
void dmn__job_stop(dmn_t *d);
/* The name the job's checkpoints are stored under (--ckpt-dir/NAME): the
 * pinned job's, "standalone" for a one-node daemon, the named job's once
 * a trainer named it; NULL before. */
const char *dmn__job_store_name(const dmn_t *d);
void dmn__job_named(dmn_conn_t *c, uint32_t seq, const proto_job_t *j);
/* 0 when c may begin a step, else the status it was refused with. */
int dmn__job_may_step(dmn_conn_t *c, uint32_t seq);
void dmn__job_conn_gone(dmn_t *d, const dmn_conn_t *c);

/* metrics.c */
int dmn__metrics_start(dmn_t *d);
void dmn__metrics_stop(dmn_t *d);
/* Count one recovery of s seconds in the recovery histogram. */
void dmn__metrics_observe_recovery(dmn_t *d, double s);

/* base.c: the clock, the daemon's references, questions about it. */
uint64_t dmn__now_ms(void);
const char *dmn__step_state_name(dmn_step_state_t s);
uint32_t dmn__trainer_count(const dmn_t *d);
/* Every copy of state bytes says so here: those made on the loop's thread
 * are counted (ringd_loop_copy_bytes_total), which must stay 0 for the
 * copies that run on the pool. Thread-safe. */
void dmn__state_copied(dmn_t *d, size_t bytes);
/* The same for a collective's copies into and out of staging, counted by
 * thread (ringd_collective_copy_bytes_total{thread}). Thread-safe. */
void dmn__coll_copied(dmn_t *d, size_t bytes);
/* Close callback for handles embedded in dmn_t (data = d). */
void dmn__handle_closed(uv_handle_t *h);
/* Drops a reference counted in open_handles that is not a handle (work
 * queued on libuv's thread pool): the last one frees a destroyed d. */
void dmn__unref(dmn_t *d);

#endif /* RINGD_DMN_INT_H */
