/*
 * job_ring-int.h - internals of the ring backend shared by
 * job_ring.c (main loop side, the backend ops),
 * job_ring_mb.c (membership's callbacks, stepping out, rejoining),
 * job_ring_thread.c (views and the ring thread) and
 * job_ring_ckpt.c (checkpoint records in etcd).
 */
#ifndef RINGD_JOB_RING_INT_H
#define RINGD_JOB_RING_INT_H

#include <pthread.h>

#include "job/job.h"
#include "job/job_auth.h"
#include "membership/etcd.h"
#include "membership/mb.h"
#include "ring/ring.h"
#include "transport/tp.h"

/*
 * The life of a ring job on this node. Ordered: a state < JOB_STEPPING_OUT
 * takes part in the job (holds or seeks a place in a view); from
 * JOB_STEPPING_OUT on, nothing new is started on the ring.
 *
 *   WAITING -view at a step start-> SYNCING -resynced-> READY
 *   SYNCING/READY -new view, failure-> WAITING
 *   WAITING/SYNCING/READY -lease lost-> FENCED -view-> WAITING
 *   in the job -last trainer lost-> STEPPING_OUT -left-> STANDBY
 *   STANDBY -trainer back-> WAITING
 *   any but LEFT -leave-> LEAVING -left-> LEFT; STANDBY -leave-> LEFT
 *
 * job__ring_set_state() is the one place that changes it, with the exit
 * and entry actions.
 */
typedef enum {
    JOB_WAITING = 0,  /* no usable view: start, after a failure */
    JOB_SYNCING,      /* the ring thread builds the ring and resyncs */
    JOB_READY,        /* collectives run */
    JOB_FENCED,       /* lease lost: waiting for the view that takes this
                         node back */
    JOB_STEPPING_OUT, /* no local trainer: mb_leave in progress */
    JOB_STANDBY,      /* out of the job until a trainer comes back */
    JOB_LEAVING,      /* the daemon's leave: mb_leave in progress */
    JOB_LEFT,         /* terminal */
} job_state_t;


/* A neighbour's link the ring thread found lossy (job_ring.c). */
typedef struct {
    uint64_t gen;
    uint32_t rank;
} job_ring_lossy_t;

typedef enum {
    JOB_CMD_NONE = 0,
    JOB_CMD_REBUILD,
    JOB_CMD_AGREE,
    JOB_CMD_ALLREDUCE,
    JOB_CMD_BROADCAST,
    JOB_CMD_COMMIT,   /* the step's commit round (job_ring_commit.c) */
} job_cmd_kind_t;

#define JOB_RING_MAX_NODES 4096
#define JOB_RING_REBUILD_DEADLINE_MS 60000
/* A REBUILD that failed here is tried again this many times, this often
 * (10 s). */
#define JOB_RING_REBUILD_RETRIES 40
#define JOB_RING_RETRY_MS 250
/* A neighbour unreachable this many tries in a row is suspected (1 s). */
#define JOB_RING_UNREACHABLE_TRIES 4
/* Hop-record ticks skipped after failed puts (job_ring_hops.c). */
#define JOB_RING_HOP_SKIP_MAX 8

typedef struct {
    job_cmd_kind_t kind;
    /* REBUILD */
    const mb_view_t *view;
    void *state;
    size_t state_bytes;
    uint64_t my_step;
    uint32_t my_trainers;
    uint32_t *counts;     /* [n]: trainers per node (REBUILD, AGREE) */
    int ckpt_req, ckpt_out; /* checkpoint asked for: here, by anyone */
    const char *ckpt_root;  /* REBUILD: restore from the nodes' stores */
    /* collectives: red for ALLREDUCE, buf for BROADCAST */
    job_reduce_t red;
    void *buf;
    size_t count;
    kern_dtype_t dt;
    kern_op_t op;
    uint32_t root;
    unsigned flags;       /* ALLREDUCE, BROADCAST: JOB_RING_F_* raised here */
    /* results */
    int status;
    uint32_t suspect; /* ring rank, when status is a peer failure */
    uint32_t suspect2; /* the other neighbour, when its endpoint failed too;
                          UINT32_MAX: none */
    uint32_t unreachable; /* REBUILD: the neighbour whose endpoint could
                             not be made (ST_ELINK), UINT32_MAX: none */
    uint64_t step_out;
    int state_replaced;
    int flags_all;        /* the collective carried every node's flags */
    unsigned flags_seen;  /* then: their OR */
    uint64_t wait_us; /* a collective: idle time waiting on the predecessor */
} job_ring_cmd_t;

/* The job's options that are the daemon's, not the ring's, carried in
 * the same "opts" of the view (job_ring_opts.c). */
typedef struct {
    int commit;          /* the step's commit round */
    uint64_t fuse_bytes; /* job_view_t.fuse_bytes */
} job_xopts_t;

typedef struct {
    job_t base;
    uv_loop_t *loop;
    job_cbs_t cbs;
    ring_opts_t ring_opts; /* in use: the job's (job_ring_opts.c); main
                              loop, read by the ring thread in commands */
    ring_opts_t my_opts;   /* this node's config */
    char *my_opts_json;    /* the same for a first view (b->mc) */
    job_xopts_t x, my_x;   /* the job's options that are the daemon's:
                              the job's (from the view, as ring_opts),
                              this node's */
    char *opts_seen;       /* the view options last logged */
    int ttl_s;
    mb_t *mb;
    tp_t *tp;
    job_auth_t *auth; /* the job secret; NULL: neighbours are trusted */
    const char *job_name; /* bound into the neighbours' proofs */

    /* The ring thread and its one command slot. */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_ring_cmd_t cmd;
    int posted;       /* cmd waits for the ring thread (guarded by mu) */
    int quit;
    ring_t *ring;     /* guarded by mu: main may ring_abort() it */
    ring_t *older;    /* ring thread only: the previous generation's ring,
                         kept open one generation longer (see rebuild) */
    int abort_flag;   /* guarded by mu: abort the command in flight, also
                         a ring it has not published yet */
    /* Ring thread only. Several local buffers: 1 sums them all into
     * staging before the ring and copies back after it (the staged path,
     * RINGD_LOCAL_PIPE=0, kept for comparison), 0 pipelines the local
     * reduce with the ring (ring_allreduce_t.local). local_told: the path
     * was logged once. */
    int local_staged, local_told;
    uv_async_t async;

    /* Main loop state. cmd.kind != JOB_CMD_NONE while a command is out. */
    job_state_t state;
    mb_view_t *cur;       /* the installed view */
    mb_view_t *pending;   /* the next one */
    job_view_t dview;
    uint64_t step;        /* next step to run */
    uint32_t local_trainers;
    int ckpt_req;         /* a trainer here asked for a checkpoint */
    char *ckpt_root;      /* this node's store (NULL: checkpoints off) */
    struct job_rbck *ckpt; /* checkpoint records in etcd */
    /* The trainer counts agreed at the last REBUILD or AGREE, and when to
     * agree again (job_ring.c, "step attempts"). */
    uint32_t counts[JOB_RING_MAX_NODES];
    int agree_due;        /* the next step start runs AGREE */
    int attempt_open;     /* a step runs on the agreed counts */
    int attempt_carried;  /* a collective of it carried every node's flags */
    unsigned attempt_flags; /* their OR over the attempt */
    unsigned my_flags;    /* JOB_RING_F_* this node raises in the attempt */
    uint64_t agreements;  /* AGREE commands run (a counter) */
    /* 1 + the step whose collective last met another size on a
     * neighbour (0: none): the same step again on agreed counts is the
     * trainers' own mismatch, not a count change. */
    uint64_t mismatch_step;
    int mismatch_status;  /* what the aborted collective answers, or 0 */
    int replaced_carry;   /* a resync replaced the state; not told yet */
    /* A REBUILD found what no retry mends (the trainers' states differ in
     * size across nodes): step starts in that generation fail with it,
     * so the trainers hear why instead of waiting; a new view clears it. */
    int fatal;
    uint64_t fatal_gen;
    struct {              /* from the ring thread (under mu); gen 0: none */
        uint64_t gen;
        uint32_t rank;
        unsigned flags;
    } mismatch;
    job_done_cb op_cb, ready_cb, leave_cb;
    void *op_arg, *ready_arg, *leave_arg;
    int leave_waits;      /* a leave waits for the install (op_leave) */
    int state_lent;       /* a REBUILD holds cbs.get_state's region */
    /* The step's commit (job_ring_commit.c): the daemon's callback,
     * pending until the round (cmd JOB_CMD_COMMIT) or a verdict decides. */
    job_done_cb commit_cb;
    void *commit_arg;
    int op_status;        /* a deferred completion */
    mb_config_t mc;       /* to register again after a standby */
    mb_callbacks_t mcb;
    uv_timer_t rejoin;
    uv_timer_t retry;     /* a REBUILD that failed here, tried again */
    int retries;
    uv_timer_t defer;
    uv_timer_t suspect_timer;
    /* Lossy links the ring thread saw (on_lossy), under mu, for the main
     * loop to report: generation 0 marks a free slot. */
    job_ring_lossy_t lossy[2];
    char *quiet_node;     /* neighbour that went quiet (deadline) */
    int64_t quiet_lease;  /* its incarnation */
    int open_handles;     /* counted down by close callbacks */
    /* Waits on the predecessor (job_ring_hops.c). */
    uint64_t step_wait_us; /* this step's so far */
    job_hops_t hops;
    uv_timer_t hop_timer;
    uint64_t win_steps, win_wait_us; /* since the last record put */
    char win_peer[64];
    int hop_skip, hop_backoff; /* ticks to skip; after a failed put */
} job_ring_t;

/* job_ring.c: the main loop side. */
/* The one transition function; refuses a move the table does not allow. */
void job__ring_set_state(job_ring_t *b, job_state_t next, const char *why);
/* Thread-safe abort of the collective the ring thread is running. */
void job__ring_abort_running(job_ring_t *b);
/* Start whatever the state and the pending view allow now. */
void job__ring_advance(job_ring_t *b);
/* job_ring_view.c: a REBUILD came back; the daemon's view of the ring;
 * the daemon's ready() answered. */
void job__ring_rebuilt(job_ring_t *b, job_ring_cmd_t *c);
void job__ring_fill_dview(job_ring_t *b);
void job__ring_ready_fire(job_ring_t *b, int status);
/* job_ring.c: a leave that waited for the install goes on. */
void job__ring_leave_deferred(job_ring_t *b);

/* A command is out to the ring thread. */
static inline int job__ring_busy(const job_ring_t *b)
{
    return b->cmd.kind != JOB_CMD_NONE;
}
/* Hand b->cmd to the ring thread. */
void job__ring_post(job_ring_t *b);
/* Complete the daemon's callback on the next loop turn. */
void job__ring_complete_later(job_ring_t *b, job_done_cb cb, void *arg,
                              int status);
/* 1 when node (lease) is a member of view v (NULL: none). */
int job__ring_view_has(const mb_view_t *v, const char *node, int64_t lease);
/* job_ring_mb.c: a command failed because of a peer: tell membership. */
void job__ring_peer_failure(job_ring_t *b, int status, uint32_t rank);
/* job_ring_mb.c: the ring thread found the link to rank of ring
 * generation gen lossy: a lossy report, when that ring is current. */
void job__ring_lossy(job_ring_t *b, uint64_t gen, uint32_t rank);
/* A neighbour posted the running collective with another size. */
void job__ring_mismatch(job_ring_t *b, uint64_t gen, uint32_t rank,
                        unsigned flags);

/* job_ring_commit.c: the step's commit round. The backend op; a round
 * came back; a view or a fence may have decided a waiting commit. */
int job__ring_commit(job_t *be, job_done_cb cb, void *arg);
void job__commit_done(job_ring_t *b, const job_ring_cmd_t *c);
void job__commit_check(job_ring_t *b);

/* job_ring_mb.c: membership's callbacks, stepping out and rejoining. */
/* Membership on this node's transport address (kept in b->mc). */
int job__ring_create_mb(job_ring_t *b, const job_config_t *cfg);
/* Register again once a trainer waits at a step start (from STANDBY). */
void job__ring_maybe_rejoin(job_ring_t *b);
/* The backend op: a local trainer died. */
void job__ring_trainer_lost(job_t *be, int in_step, uint32_t remaining);

/* job_ring_hops.c */
void job__hops_init(job_ring_t *b, uv_loop_t *loop); /* its timer: with the
                                                   other handles */
/* A command came back. */
void job__hops_cmd(job_ring_t *b, const job_ring_cmd_t *c);
void job__hops_step(job_ring_t *b);
void job__hops_get(job_t *be, job_hops_t *hops_p);


/* Every node's trainer count's top bit in the per-step allgather carries
 * "a checkpoint was asked for here". */
#define JOB_RING_CKPT_BIT 0x80000000u

/* Flags on the ring's messages (ring_set_flags): a node asks every node to
 * agree the trainer counts again at the next step start. */
#define JOB_RING_F_AGREE 1u
/* This node runs the step with another trainer count than the agreed one:
 * the collective that carries it is void on every node (ST_ERESHAPE). */
#define JOB_RING_F_VOID 2u

/*
 * job_ring_thread.c, on the ring thread: the members' values v[0..n)
 * reduced under op (KERN_MAX, KERN_SUM), the same on every member. The
 * job's own agreements (steps, sizes, holders) are int64 and never
 * compressed, whatever the job's wire format.
 */
int job__ring_agree(ring_t *r, int64_t *v, size_t n, kern_op_t op);

/*
 * job_ring_restore.c, on the ring thread during a REBUILD in which no
 * member has any state ahead of step 0 (the whole job started again):
 * restore the newest checkpoint whose every shard some member holds.
 * my_newest: this node's newest complete step + 1 (0: none); agreed: the
 * MAX over the ring. Returns 0 with *step_p set (restored), 1 when there
 * was nothing usable (the state is unchanged everywhere), or an error of
 * the ring.
 */
int job__ring_restore(ring_t *r, const mb_view_t *v, const char *root,
                     void *state, size_t bytes, uint64_t agreed,
                     uint64_t *step_p);
/* This node's newest complete checkpoint step + 1 below `below` (0: none;
 * below 0: no bound). */
uint64_t job__restore_newest_local(const char *root, uint64_t below);

/*
 * job_ring_auth.c, on the ring thread right after ring_create: both
 * neighbours prove they hold the job secret (b->auth) for this job,
 * generation and pair of nodes, before any collective. 0, or an error
 * with *suspect_p the ring rank to report (ST_EPEER_FORGED: a wrong
 * proof); the caller then aborts and destroys r, closing its endpoints.
 */
int job__ring_auth(job_ring_t *b, ring_t *r, const mb_view_t *v,
                   uint32_t *suspect_p);

/* job_ring_opts.c: the ring options a job shares, carried in its views. */
/* The shared fields of o from the config (the environment does not set
 * them: a warning for each variable that tries). */
void job__opts_from_config(const job_config_t *cfg, ring_opts_t *o);
/* The shared fields as the view's "opts" object (caller frees; NULL: no
 * memory). */
char *job__opts_json(const ring_opts_t *o, const job_xopts_t *x);
/* b->ring_opts become view v's (main loop, no command out). */
void job__opts_install(job_ring_t *b, const mb_view_t *v);

/* The ring thread: runs posted commands until quit; destroys its rings. */
void *job__ring_thread_main(void *arg);

/* job_ring_ckpt.c: checkpoint records and manifests in etcd. */
typedef struct job_rbck job_rbck_t;
/* root: this node's checkpoint store, or NULL (checkpoints off). */
int job__ckpt_create(const char *job, const char *node, const char *root,
                     job_rbck_t **k_p);
void job__ckpt_destroy(job_rbck_t *k);
int job__ckpt_report(job_rbck_t *k, etcd_t *etcd, const job_ckpt_files_t *f,
                     job_done_cb cb, void *arg);

#endif
