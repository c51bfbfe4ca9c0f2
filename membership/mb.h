/*
 * mb.h - membership: registration under a lease, leader election, the
 * sequence of views, suspicion, fencing and drain, all kept in etcd under
 * /ringd/<job>/ (see membership/README.md for keys and protocol).
 *
 * Threading: an mb_t lives on one libuv loop; every function must be
 * called on that loop's thread and every callback runs there. Callbacks
 * may call mb_suspect, mb_set_step and mb_leave, but not mb_destroy.
 *
 * Errors: 0 or a negative code from common/status.h; the function that
 * detects an error logs it.
 */
#ifndef RINGD_MB_H
#define RINGD_MB_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "membership/etcd.h"

typedef struct mb mb_t;

typedef struct {
    const char *job;         /* keys live under /ringd/<job>/ */
    const char *node;        /* node id, unique in the job, no '/' */
    const char *host;        /* members on one host are adjacent in rings */
    const void *addr;        /* UCX worker address: opaque bytes, copied */
    size_t addr_len;
    int slots;               /* trainers (GPUs) on this node */
    int ttl_s;               /* lease TTL; 0: 3 (etcd's minimum is 2) */
    int min_members;         /* the first view waits for this many; 0: 1 */
    int settle_ms;           /* leader batches changes this long; 0: 10 */
    etcd_config_t etcd;      /* request_timeout_ms 0: ttl/3 */
    const void *secret;      /* the job secret, copied: signs the writes
                                that change a view; NULL: unsigned */
    size_t secret_len;
    int ride_outage;         /* keep an ACTIVE node of a view of >= 2 in the
                                view while etcd cannot be reached past its
                                lease deadline (the caller fences by its
                                collectives, membership/README.md) */
    const char *view_opts;   /* a JSON object (at most MB_OPTS_MAX bytes),
                                copied: as leader this node puts it in the
                                job's first view as "opts"; later views
                                carry the previous view's. NULL: none */
} mb_config_t;

/* The largest "opts" object a view carries (membership/README.md). */
#define MB_OPTS_MAX 1024

/* One member of a view. Strings and addr point into the view. */
typedef struct {
    const char *node;
    const char *host;
    /* The UCX address, from the member's node record: on_view fills it
     * for this node, its ring neighbours and the callbacks' peers only,
     * addr_len 0 for the others and in mb_view_parse views. */
    const uint8_t *addr;
    size_t addr_len;
    int slots;
    int64_t lease;           /* the incarnation: a re-registered node has a
                                new lease and counts as a new member */
    int joiner;              /* not in the previous view: needs state */
} mb_member_t;

/*
 * A view: generation g names exactly one member list, ever. members are in
 * ring order (grouped by host, stable across views). Valid only during
 * on_view; copy what you keep.
 */
typedef struct {
    uint64_t generation;
    uint64_t step;           /* the step the leader last heard of */
    const mb_member_t *members;
    size_t n_members;
    int my_index;            /* always >= 0 in on_view, which only runs
                                for views that contain this incarnation;
                                -1 in a view read by mb_view_parse */
    int source_index;        /* member whose state joiners copy; -1 none */
    size_t n_joiners;
    const char *opts;        /* the job's "opts" object as compact JSON,
                                fixed by the job's first view; NULL when
                                the view has none */
} mb_view_t;

typedef struct {
    /* A view containing this node was installed; in generation order,
     * none repeated. */
    void (*on_view)(const mb_view_t *view, void *data);
    /* This node lost its lease (reason ST_EFENCED: could not renew it in
     * time, or was evicted; -EACCES: etcd refused this node's
     * credentials, logged as such): stop serving collectives. It
     * re-registers by itself as a new member once etcd answers (or takes
     * its credentials again); a later on_view says when it is in. */
    void (*on_fenced)(int reason, void *data);
    /* /ringd/<job>/drain/<node> appeared: leave at the next step boundary
     * by calling mb_leave(). */
    void (*on_drain)(void *data);
    /* mb_leave finished (deregistered). May be NULL. */
    void (*on_left)(int status, void *data);
    /* The members (indices into view->members, this node's own excluded)
     * whose addresses on_view must carry besides the two ring
     * neighbours', e.g. a grid's rows; at most max, returns how many.
     * Called before on_view, with no addresses in the view. May be NULL:
     * the ring neighbours only. */
    size_t (*peers)(const mb_view_t *view, size_t *idx, size_t max,
                    void *data);
} mb_callbacks_t;

/*
 * The life of a member. Ordered: a state >= MB_JOINING holds a lease.
 *
 *   IDLE -start-> REGISTERING -registered-> JOINING -in view-> ACTIVE
 *   JOINING/ACTIVE/DRAINING -lease lost-> FENCED -retry-> REGISTERING
 *   JOINING/ACTIVE -drain-> DRAINING
 *   any but IDLE/LEFT -leave-> LEAVING -left-> LEFT
 */
typedef enum {
    MB_IDLE = 0,       /* created, not started */
    MB_REGISTERING,    /* granting a lease, writing the node record */
    MB_FENCED,         /* lease lost: not taking part */
    MB_LEAVING,        /* mb_leave: revoking the lease */
    MB_LEFT,           /* deregistered; terminal */
    MB_JOINING,        /* registered, waiting for a view with me */
    MB_ACTIVE,         /* in the installed view */
    MB_DRAINING,       /* drain requested, waiting for mb_leave */
} mb_state_t;

typedef enum {
    MB_EV_START = 0,
    MB_EV_REGISTERED,
    MB_EV_IN_VIEW,
    MB_EV_LEASE_LOST,
    MB_EV_RETRY,
    MB_EV_DRAIN,
    MB_EV_LEAVE,
    MB_EV_LEFT,
} mb_event_t;

/* The transition table, pure: 0 and *next_p, or ST_EINVAL when ev is not
 * allowed in s. */
int mb_state_next(mb_state_t s, mb_event_t ev, mb_state_t *next_p);
const char *mb_state_name(mb_state_t s);
const char *mb_event_name(mb_event_t ev);

/*
 * Create a member on loop (nothing is sent before mb_start). cfg and its
 * strings are copied; cb is copied; data is passed to callbacks.
 * Returns 0, ST_ECONFIG or ST_ENOMEM.
 */
int mb_create(uv_loop_t *loop, const mb_config_t *cfg,
              const mb_callbacks_t *cb, void *data, mb_t **mb_p);

/* Register and take part. Returns 0 or ST_EINVAL if already started. */
int mb_start(mb_t *mb);

/* What a report on a suspect says (membership/README.md, "Blame"),
 * weakest first. */
typedef enum {
    MB_BLAME_LOSSY = 0,      /* its link stalls (heartbeats come late) */
    MB_BLAME_SILENT,         /* nothing heard from it for a while */
    MB_BLAME_HARD,           /* its endpoint failed: the process is gone */
} mb_blame_t;

/*
 * Report that node failed (a ring neighbour's endpoint broke): a hard
 * report, which alone convicts. The leader revokes the suspect's lease,
 * so it leaves the view at once instead of after its TTL. why is stored
 * for operators. A report etcd does not take (an outage, or this node
 * fenced meanwhile) is kept and sent again until it holds or a view
 * drops that node; this node then revokes the suspect's lease itself,
 * as it does at once when the suspect leads. Returns 0 when the report
 * was sent or kept, -EAGAIN when 8 are kept already, ST_EINVAL when not
 * registered or node unknown.
 */
int mb_suspect(mb_t *mb, const char *node, const char *why);
/*
 * A report that may be this node's own fault (a silent or lossy link
 * looks the same from both ends; a wrong job secret fails the handshake
 * on both sides): kind MB_BLAME_SILENT or MB_BLAME_LOSSY. The leader
 * convicts on it only as "Blame" says (two accusers, or a silence report
 * whose grace ran out); a suspected leader's lease is revoked from here
 * only once the reports in etcd convict it. A stronger kind replaces a
 * weaker one. Returns as mb_suspect.
 */
int mb_suspect_soft(mb_t *mb, const char *node, mb_blame_t kind,
                    const char *why);

/*
 * The value of a drain request for the node record at key held by lease,
 * signed with the job secret (ringctl drain); a daemon with a secret
 * drains only on such a value naming its own lease. Caller frees.
 */
int mb_drain_value(const void *secret, size_t len, const char *key,
                   int64_t lease, char **value_p);
/*
 * 1 when val (vlen bytes), stored at key, carries the signature a holder
 * of the secret gives a value of this kind ("view", "node", "reshape",
 * "drain"), else 0: for tools that check what etcd holds.
 */
int mb_value_signed(const void *secret, size_t len, const char *what,
                    const char *key, const char *val, size_t vlen);

/*
 * Ask for a new generation of the installed view with the same members
 * (a "reshape"): every member's on_view then fires with it. For failures
 * membership cannot see, e.g. a node whose local trainer died mid-step
 * and cannot finish it while its neighbours wait for it. The request
 * names the generation installed now; a view written meanwhile for
 * another reason answers it as well. Returns 0 when sent, ST_EINVAL when
 * this node is not ACTIVE in a view.
 */
int mb_request_view(mb_t *mb, const char *why);

/* The training step this node is at; the leader puts it in new views. */
void mb_set_step(mb_t *mb, uint64_t step);

/* Deregister (revoke the lease; the leader writes a view without this
 * node). Asynchronous: on_left reports the end. */
int mb_leave(mb_t *mb);

/*
 * 1 while this node holds a lease that cannot have expired yet, judged
 * on the clock now (not the loop's cached time): a node that was stopped
 * past its lease may run callbacks from before the fence timer fires,
 * and must not act on results the others may have excluded it from.
 * Also 1 while riding out an etcd outage (mb_config_t.ride_outage) with
 * a collective reported in the last lease TTL.
 */
int mb_lease_valid(mb_t *mb);

/*
 * With ride_outage: a collective of every member of the installed view
 * completed. While etcd cannot be reached past the lease deadline, these
 * reports stand in for the lease: a TTL without one fences the node.
 */
void mb_ring_progress(mb_t *mb);

/*
 * 1 while node's incarnation `lease` is registered as far as this
 * member's mirror of etcd knows: its daemon keeps renewing that lease
 * (a hung or dead daemon's record is gone within about its TTL). This is
 * liveness of the daemon, independent of its trainers' progress.
 */
int mb_member_alive(mb_t *mb, const char *node, int64_t lease);

mb_state_t mb_state(const mb_t *mb);
int mb_is_leader(const mb_t *mb);
/* The lease of the current registration (0 when none). */
int64_t mb_lease(const mb_t *mb);

/* Blame, counted since mb_create (membership/README.md, "Blame"). */
typedef struct {
    uint64_t reported[3];  /* reports stored, by mb_blame_t */
    uint64_t withheld;     /* soft reports kept back: our path was slow */
    uint64_t convicted;    /* suspects whose lease we revoked on reports */
} mb_blame_stats_t;
void mb_blame_stats(const mb_t *mb, mb_blame_stats_t *stats_p);
/* The etcd client membership uses, for other keys of the job on the same
 * loop (checkpoint records). Owned by mb: gone after mb_destroy, which
 * drops its requests without calling their callbacks. */
etcd_t *mb_etcd(mb_t *mb);

/*
 * Free everything; does not deregister (the lease expires after its TTL,
 * as if the node crashed; call mb_leave first for a clean exit). Accepts
 * NULL. Handles close asynchronously: run the loop afterwards.
 */
void mb_destroy(mb_t *mb);

/* ---- The etcd key schema -------------------------------------------
 *
 * mb_key() is the one helper that builds a key path of job J; membership,
 * the ring backend's checkpoint records and ringctl all use it, so the
 * schema is written once (mb-keys.c). A "prefix" kind ends in '/' and
 * names a family for range reads; the per-node, per-step and per-rank
 * arguments are ignored by kinds that do not use them.
 */
#define MB_KEY_MAX 512

typedef enum {
    MB_KEY_JOB = 0,          /* prefix of every key of the job */
    MB_KEY_NODES,            /* prefix of the node records */
    MB_KEY_NODE,             /* node's record, under its lease */
    MB_KEY_LEADER,           /* the leader's node id, under its lease */
    MB_KEY_VIEW,             /* the current view */
    MB_KEY_DRAIN,            /* a drain request for node */
    MB_KEY_SUSPECTS,         /* prefix of the suspicion reports */
    MB_KEY_SUSPECT,          /* the reports that node failed: a prefix,
                                one key per reporter below it */
    MB_KEY_RESHAPES,         /* prefix of the reshape requests */
    MB_KEY_RESHAPE,          /* node's request for a new generation */
    MB_KEY_CKPT_ALL,         /* prefix of manifests and part records */
    MB_KEY_CKPTS,            /* prefix of the checkpoint manifests */
    MB_KEY_CKPT,             /* the manifest of step */
    MB_KEY_CKPT_PARTS,       /* prefix of every part record */
    MB_KEY_CKPT_STEP_PARTS,  /* prefix of the part records of step */
    MB_KEY_CKPT_PART,        /* shard rank's part record of step */
    MB_KEY_HOPS,             /* prefix of the nodes' hop-wait records */
    MB_KEY_HOP,              /* node's recent waits on its predecessor */
} mb_key_t;

/* Write the key into buf (n bytes with the NUL). Returns 0, or ST_EINVAL
 * (logged; buf empty) when it does not fit. Thread-safe. */
int mb_key(char *buf, size_t n, const char *job, mb_key_t which,
           const char *node, uint64_t step, uint32_t rank);

/* ---- Reading a job's records (ringctl, the ring backend) -----------
 *
 * Pure parsers of the values membership writes, for readers that are not
 * members. Every value is hostile: on failure they return ST_EPROTO (or
 * ST_ENOMEM), set *why_p to a constant phrase, log nothing (the caller
 * knows which record it was) and leave the output empty. Thread-safe.
 */

/* A node record (MB_KEY_NODE), parsed; strings owned. */
typedef struct {
    mb_member_t member;      /* addr_len 0 when the record has no addr */
    int64_t pid;             /* -1 when the record has none */
} mb_node_rec_t;

int mb_node_parse(const char *node, const char *json, size_t len,
                  mb_node_rec_t *rec, const char **why_p);
void mb_node_rec_free(mb_node_rec_t *rec);

/* An owned view: from a MB_KEY_VIEW value (my_index -1) or a copy of the
 * one on_view hands out. Free with mb_view_free (accepts NULL). */
int mb_view_parse(const char *json, size_t len, mb_view_t **view_p,
                  const char **why_p);
int mb_view_dup(const mb_view_t *view, mb_view_t **copy_p);
void mb_view_free(mb_view_t *view);

#endif /* RINGD_MB_H */
