/*
 * dmn-int.h - internals shared by the daemon's files (server.c, step.c,
 * metrics.c, dmn.c). Not a public header.
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

/* One client connection (a trainer, or ringctl asking for status). */
typedef struct dmn_conn {
    struct dmn_conn *next;
    dmn_t *d;
    uv_poll_t poll;
    int fd;
    uint32_t id;
    pid_t pid;
    char name[32];
    int hello;            /* HELLO accepted */
    int bye;              /* said goodbye: a clean leave */
    dmn_buf_t bufs[PROTO_MAX_BUFFERS];
    int has_state;
    proto_state_set_t state;

    /* Step bookkeeping (step.c). */
    int member;           /* took part in a step already */
    int active;           /* in the current step, not left it yet */
    int redo;             /* left the current step to redo it */
    int waiting_begin;    /* a STEP_BEGIN awaits its reply */
    uint32_t begin_seq;
    int posted;           /* a COLL awaits its reply */
    uint32_t coll_msg_seq;
    proto_coll_req_t coll;
    uint32_t local_rank;
    int told_shutdown;
} dmn_conn_t;

/*
 * The node's step state. Ordered: IDLE < RUNNING < REDUCING mark the normal
 * cycle; BROKEN is a step aborted by a view change or a lost trainer (every
 * later collective of the step answers RINGD_ERESHAPE); DRAINED is final.
 */
typedef enum {
    DMN_STEP_IDLE = 0,     /* between steps: collecting step_begins */
    DMN_STEP_RUNNING,      /* step begun: collecting collectives */
    DMN_STEP_REDUCING,     /* a collective is with the backend */
    DMN_STEP_BROKEN,       /* aborted: waiting for everyone to leave it */
    DMN_STEP_DRAINED,      /* shutting down: no more steps */
} dmn_step_state_t;

/* Upper bounds (seconds) of the recovery histogram's finite buckets. */
#define DMN_RECOVERY_BUCKETS 10
extern const double dmn__recovery_le[DMN_RECOVERY_BUCKETS];

typedef struct {
    uint64_t collectives;
    uint64_t coll_zero_copy; /* ran in the one trainer's buffer */
    uint64_t coll_bytes;
    double coll_seconds;
    double last_busbw;     /* bytes/s of the last allreduce */
    uint64_t coll_errors;
    uint64_t view_changes;
    uint64_t aborted_steps;
    uint64_t steps;
    uint64_t recoveries;
    double recovery_seconds_sum;
    /* Recoveries per histogram bucket of metrics.c (not cumulative). */
    uint64_t recovery_hist[DMN_RECOVERY_BUCKETS];
    double last_recovery_seconds;
    uint64_t trainers_joined;
    uint64_t trainers_lost;
    uint64_t proto_errors;
    uint64_t ckpt_requests;
    uint64_t ckpt_taken;
    uint64_t ckpt_failed;
    uint64_t ckpt_skipped;
    uint64_t restores;
} dmn_stats_t;

struct dmn {
    uv_loop_t *loop;
    const dmn_config_t *cfg;
    dmn_hooks_t hooks;
    job_t *be;
    uint64_t start_ms;
    int open_handles;      /* handles of this struct still closing */
    uint64_t status_ms;    /* last STATUS= sent */

    /* Local API server (server.c). */
    int listen_fd;
    uv_poll_t listen_poll;
    int listening;
    dmn_conn_t *conns;     /* in connection order: local rank order */
    uint32_t nconns;
    /* accept() out of descriptors or memory: paused, retried with backoff
     * (server.c), logged rate-limited. */
    uv_timer_t accept_timer;
    uint32_t accept_backoff_ms; /* 0: accepting normally */
    uint64_t accept_failures;
    uint64_t accept_log_ms;
    uint64_t refused_over_cap;  /* closed at once: max-clients reached */
    uint64_t cap_log_ms;
    uint32_t next_conn_id;

    /* Metrics HTTP server (metrics.c). */
    uv_tcp_t http;
    int http_on;

    /* Step state (step.c). */
    dmn_step_state_t state;
    uint64_t step;
    job_view_t view;       /* the view of the current/last step */
    uint64_t last_generation;
    uint32_t ended;        /* trainers that called step_end this step */
    int any_redo;          /* one left the step to redo it */
    int restored_pending;  /* the backend replaced the state: tell the
                              trainers at their next step start */
    int ready_pending;     /* waiting for the backend's ready() */
    int break_pending;     /* a trainer was lost during REDUCING */
    int drain_requested;
    int leave_done;
    uv_timer_t drain_timer;
    int drain_timed_out;
    uint64_t break_ms;     /* when the current recovery began; 0: none */
    /* The collective being gathered or reduced. */
    int coll_open;
    proto_coll_req_t coll;
    uint64_t coll_start_ns;
    void *staging;
    size_t staging_size;
    /* The trainers' buffers the backend works on (job_reduce_t.bufs). */
    void **coll_bufs;
    uint32_t coll_bufs_cap;
    int coll_in_flight;    /* the backend holds coll_bufs / staging */
    int coll_direct;       /* it works in the one trainer's buffer */
    int zero_copy;         /* 0: RINGD_ZERO_COPY=0, always via staging */
    /* Mappings of trainers that went away while the backend held their
     * buffers: unmapped when the collective completes. */
    struct dmn_held { void *addr; size_t size; } *held;
    uint32_t nheld, held_cap;
    /* The job state as of the last completed step (for joiners). */
    void *snapshot;
    size_t snapshot_size;  /* allocated */
    uint64_t snapshot_bytes;
    uint64_t snapshot_step;

    /* Checkpoints (checkpoint.c). */
    char *ckpt_root;       /* <ckpt-dir>/<job>; NULL: off */
    ckpt_writer_t *ckw[2]; /* primary shard, predecessor's replica */
    uv_async_t ckpt_async;
    int ckpt_async_on;
    pthread_mutex_t ckpt_mu;
    int ckpt_mu_init;
    uint64_t ckpt_done_step[2]; /* guarded by ckpt_mu */
    int ckpt_done_status[2];
    ckpt_shard_info_t ckpt_done_info[2];
    uint64_t ckpt_pending_step; /* submitted, not completed; 0: none */
    uint32_t ckpt_pending_n;
    uint64_t ckpt_reported_step; /* the last one handed to ckpt_report */
    size_t ckpt_reserved;        /* staging bytes the writers hold */
    int restore_checked;

    dmn_stats_t stats;
};

/* server.c */
int dmn__server_start(dmn_t *d);
void dmn__server_stop(dmn_t *d);
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

/* step.c */
const char *dmn__step_state_name(dmn_step_state_t s);
void dmn__step_begin(dmn_t *d, dmn_conn_t *c, uint32_t seq);
void dmn__step_coll(dmn_t *d, dmn_conn_t *c, uint32_t seq,
                    const proto_coll_req_t *req);
void dmn__step_end(dmn_t *d, dmn_conn_t *c, uint32_t seq);
/* The connection is going away (before its buffers are unmapped). */
void dmn__step_conn_lost(dmn_t *d, dmn_conn_t *c);
/* Unmap a client buffer now, or once the collective in flight (which may
 * be writing into it on the backend's thread) completes. */
void dmn__buf_unmap(dmn_t *d, void *addr, size_t size);
/* Unmap what dmn__buf_unmap deferred (nothing in flight any more). */
void dmn__held_release(dmn_t *d);
void dmn__step_on_view(void *arg, const job_view_t *view);
/* The node's primary state region (for the backend); NULL/0 if none. */
void dmn__step_get_state(void *arg, void **ptr_p, size_t *bytes_p);
/* dmn.c */
void dmn__on_backend_drain(void *arg);
void dmn__step_drain(dmn_t *d);
/* Drain timed out: mark drained without telling anyone (exiting). */
void dmn__step_force_drained(dmn_t *d);
uint32_t dmn__trainer_count(const dmn_t *d);

/* checkpoint.c */
int dmn__ckpt_start(dmn_t *d);
void dmn__ckpt_stop(dmn_t *d);
/* Step `step` is about to start; every trainer ended the one before. */
void dmn__ckpt_boundary(dmn_t *d, uint64_t step);
/* At a step start, the view known: size the writers' staging buffers for
 * this node's shards now, off the snapshot's path. */
void dmn__ckpt_prepare(dmn_t *d);
/* A CKPT request from a trainer: replies to it. */
void dmn__ckpt_request(dmn_t *d, dmn_conn_t *c, uint32_t seq);
/* Restore the newest usable checkpoint into the state region: 0 and its
 * step, -ENOENT when there is none (or no state yet), or an error. */
int dmn__ckpt_restore(dmn_t *d, uint64_t *step_p);

/* metrics.c */
int dmn__metrics_start(dmn_t *d);
void dmn__metrics_stop(dmn_t *d);
/* Count one recovery of s seconds in the recovery histogram. */
void dmn__metrics_observe_recovery(dmn_t *d, double s);

uint64_t dmn__now_ms(void);
/* Close callback for handles embedded in dmn_t (data = d). */
void dmn__handle_closed(uv_handle_t *h);

#endif /* RINGD_DMN_INT_H */
