/*
 * mb-int.h - internals of membership shared between its files.
 */
#ifndef RINGD_MB_INT_H
#define RINGD_MB_INT_H

#include "membership/mb.h"

/* An owned view: members' strings and addresses are malloc'ed copies. */
typedef struct {
    uint64_t generation;
    uint64_t step;
    mb_member_t *members;
    size_t n_members;
    int source_index;
    size_t n_joiners;
    char *opts;              /* compact JSON object, or NULL */
} mb__view_t;

void mb__member_free(mb_member_t *m);
int mb__member_copy(mb_member_t *dst, const mb_member_t *src);
void mb__view_free(mb__view_t *v);

/* Node record <-> JSON (DESIGN.md: host, addr base64, pid, lease, slots,
 * version). parse fills an owned member; node is the key's last part. */
char *mb__node_json(const mb_member_t *m, int pid);
int mb__node_parse(const char *node, const char *json, size_t len,
                   mb_member_t *m);

char *mb__view_json(const mb__view_t *v);
int mb__view_parse(const char *json, size_t len, mb__view_t *v);
/* v's options become a copy of opts (NULL: none); 0 or ST_ENOMEM. */
int mb__view_set_opts(mb__view_t *v, const char *opts);
/* An "opts" value (cJSON *, NULL when absent) as kept in a view: its
 * compact text, *opts_p NULL for none; ST_EPROTO with *why_p for a value
 * that is no object or longer than MB_OPTS_MAX. */
struct cJSON;
int mb__opts_text(const struct cJSON *j, char **opts_p, const char **why_p);

/*
 * The view that follows old (generation 0 when none) given the live
 * nodes: survivors keep their order, newcomers are placed after the last
 * member on their host (else at the end), sorted by (host, node).
 * Returns 1 with *next filled when the member list changed, 0 when it
 * did not, or ST_ENOMEM.
 */
int mb__view_next(const mb__view_t *old, const mb_member_t *alive,
                  size_t n_alive, uint64_t step, mb__view_t *next);

/* The same member list as a new generation (a reshape): old with
 * generation + 1, step, no joiners, the first member as the source.
 * Returns 1 with *next filled, 0 when old is empty, or ST_ENOMEM. */
int mb__view_renew(const mb__view_t *old, uint64_t step, mb__view_t *next);


/* ------------------------------------------------------------------ */
/* The member object, shared by mb.c (state machine, views),          */
/* mb-lease.c (registration, keepalive, fence), mb-watch.c (mirror)    */
/* and mb-leader.c (campaign, views, verdicts, reshapes).            */

#define MB_RETRY_MIN_MS 100
#define MB_RETRY_MAX_MS 1000
/* etcd refusing our credentials is a configuration problem an operator
 * must fix: retry slowly, saying so each time. */
#define MB_RETRY_DENIED_MS 10000
/* A fenced node's registration through an outage: each try is one
 * refused connection per endpoint, and the cap is what it may wait past
 * etcd's return, so it is lower than MB_RETRY_MAX_MS. */
#define MB_REG_RETRY_MAX_MS 250

/* A lone silence report convicts after this, if its reporter stands
 * unaccused; after twice this whatever. */
#define MB_BLAME_GRACE_MS 1000
/* A lossy-link report counts this long (then the leader deletes it). */
#define MB_BLAME_FRESH_MS 3000
/* In a view of two a soft report goes out only after this many reads of
 * our own record, each answered within MB_SELF_SLOW_MS (mb-suspect.c). */
#define MB_SELF_PROBES 3
#define MB_SELF_SLOW_MS 150
/* A fenced node checks its own path before registering again, this long
 * at most (mb-lease.c, grant_when_sound). */
#define MB_PATH_WAIT_MS 10000

/* A suspicion etcd has not taken yet (an outage), kept and tried again
 * until it holds or is moot (mb-suspect.c). */
#define MB_SUSPECTS_MAX 8
typedef struct {
    mb_t *mb;
    char node[MB_KEY_MAX];
    char why[96];
    int64_t lease;           /* the suspect's incarnation; 0: slot free */
    mb_blame_t kind;
    int revoke;              /* revoke that lease ourselves */
    int may_revoke;          /* a hard report (mb_suspect) */
    int leader_check;        /* a soft report on the leader: read the
                                reports, revoke when it stands convicted */
    uint64_t t0_ms;          /* when this node suspected it (this kind) */
    uint64_t check_at;       /* leader_check: the next read, loop time */
    int checking;            /* leader_check: a read in flight */
    int probing, probe_n;    /* checking our own path first (a view of
                                two: mb-suspect.c, self_probe) */
    uint64_t probe_t0;
    int put_ok;              /* the suspect key is stored */
    int revoked;             /* its lease is gone: done */
    int inflight;            /* requests of this slot unanswered */
    uint64_t failed_ms;      /* when etcd last failed this slot's put */
    uint64_t gen;            /* the view's generation when suspected */
    int64_t my_lease;        /* and this node's incarnation then */
} mb__sus_t;

typedef struct {
    char *key;
    char *val;
    size_t len;
    int64_t mod, create, lease;
    uint64_t seen_ms;        /* loop time the mirror first held the key */
} mb_kv_t;

/*
 * The mirror is one slot per watch (membership/README.md, "Watches"):
 * every member watches its own record, the view, the leader key, its
 * drain key and the records of its ring neighbours; the leader adds the
 * node records, the suspects and the reshape requests. A slot's keys
 * are reset only by its own watch, so slots may overlap.
 */
enum {
    MB_W_SELF = 0,
    MB_W_VIEW,
    MB_W_LEADER,
    MB_W_DRAIN,
    MB_W_PEER,               /* MB_PEERS_MAX slots: neighbours' records */
#define MB_PEERS_MAX 4       /* of the view delivered and the one next */
    MB_W_NODES = MB_W_PEER + MB_PEERS_MAX,
    MB_W_SUSPECTS,
    MB_W_RESHAPES,
    MB_W_N,
};

typedef struct {
    mb_t *mb;
    etcd_watch_t *watch;     /* NULL: slot unused */
    char key[MB_KEY_MAX];
    int prefix;              /* key is a prefix, else exactly one key */
    int synced;              /* its first range read arrived */
    int64_t rev;             /* complete up to this revision */
    mb_kv_t *kvs;
    size_t n_kvs, cap_kvs;
} mb_mirror_t;

/* A node record that made a view unusable, said once per version. */
typedef struct {
    uint64_t gen;
    int64_t mod;
    char node[MB_KEY_MAX];
} mb_bad_peer_t;

struct mb {
    uv_loop_t *loop;
    etcd_t *etcd;
    mb_callbacks_t cb;
    void *data;
    mb_member_t me;          /* node, host, addr, slots; lease below */
    int ttl_s, min_members, settle_ms;
    char job[MB_KEY_MAX];
    char prefix[MB_KEY_MAX], my_key[MB_KEY_MAX], leader_key[MB_KEY_MAX];
    char view_key[MB_KEY_MAX], drain_key[MB_KEY_MAX];
    char nodes_prefix[MB_KEY_MAX], suspect_prefix[MB_KEY_MAX];
    char reshape_prefix[MB_KEY_MAX];

    mb_state_t state;
    int64_t lease;           /* current registration; 0 when none */
    int64_t old_lease;       /* a lost lease still to revoke */
    int old_alive;           /* etcd said it lives (mb-lease.c, on_old_ttl) */
    int64_t my_key_rev;      /* revision of our node record put */
    uint64_t step;
    unsigned reg_gen;        /* bumped per registration: drops stale
                                replies */

    uv_timer_t ka_timer, fence_timer, retry_timer, settle_timer;
    uv_timer_t again_timer;  /* reconcile again after a failed request */
    uv_timer_t sus_timer;    /* retry of the suspicions in sus[] */
    uv_timer_t blame_timer;  /* a report's grace ends (mb-blame.c) */
    mb_blame_stats_t blame;
    int64_t blame_revoked[MB_SUSPECTS_MAX]; /* leases revoked as leader */
    unsigned blame_next;
    mb__sus_t sus[MB_SUSPECTS_MAX];
    long sus_retry_ms;
    int n_closing;
    int ka_inflight;
    unsigned ka_gen;
    uint64_t ka_sent_ms;
    uint64_t fence_at_ms;    /* loop time the lease may have run out */
    long retry_ms;
    int fence_reason;        /* why the next fence happens; 0: lease */
    int ride_outage;         /* mb_config_t.ride_outage */
    int etcd_unreach;        /* since the last renewal a keepalive found
                                etcd unreachable before the deadline */
    uint64_t etcd_ok_ms;     /* etcd last answered for this node: a
                                renewal, or its old lease revoked alive */
    uint64_t outage_since_ms; /* riding out an outage since; 0: not */
    uint64_t ring_ok_ms;     /* the caller's last collective of the view */
    uint64_t etcd_srtt_ms;   /* keepalive round trips, smoothed */
    int path_check, path_ok, path_inflight, path_slow_logged;
    unsigned path_gen;
    uint64_t path_since, path_t0; /* fenced: our path checked since */
    int auth_probe;          /* etcd auth on: check it at each keepalive */
    int probe_inflight;
    unsigned denied;         /* etcd refusals since the last success */
    int campaign_inflight, view_inflight, view_again;
    long view_retry_ms;      /* backoff of the next failed view txn */
    int view_tries;          /* view txns failed in a row */
    int64_t refused_rec_mod; /* newest unsigned record logged */
    int64_t refused_drain_mod; /* newest unsigned drain key logged */
    uint8_t *secret;         /* the job secret (mb-sign.c); NULL: none */
    char *view_opts;         /* mb_config_t.view_opts, compact; or NULL */
    size_t secret_len;

    mb_mirror_t mirrors[MB_W_N];
    uint64_t events;         /* watch events received, for tests */

    mb__view_t view;         /* the view in etcd, as last parsed */
    int64_t view_mod;        /* its mod_revision */
    int view_forged;         /* the key holds a view no leader wrote */
    uint64_t delivered_gen;  /* last generation given to on_view */
    uint64_t pending_gen;    /* a view with us, waiting for peers' records */
    char *nbrs[2];           /* the delivered view's ring neighbours */
    mb_bad_peer_t bad;       /* the last unusable record logged */
    /* The records of the peers callback's members (not neighbours), read
     * once per view, MB_FETCH_OPS to a txn; none in flight twice. */
    uint64_t extra_gen;      /* the view they belong to; 0: none */
    size_t *extra_idx;
    mb_node_rec_t *extra;
    size_t n_extra, extra_done; /* records read and valid so far */
    int extra_inflight;
    uint64_t extra_retry_at; /* loop time of the next read after a bad
                                or missing record */
};

#define MB_FETCH_OPS 100     /* under etcd's default --max-txn-ops 128 */

/* mb.c */
int mb__holds_lease(mb_state_t s);
/* The one place states change. */
void mb__transition(mb_t *mb, mb_event_t ev, const char *why);
/* Act on the mirror: after each watch event. */
void mb__reconcile(mb_t *mb);
void mb__reconcile_soon(mb_t *mb);
/* This incarnation's index in v, -1 when not a member. */
int mb__find_me(const mb_t *mb, const mb__view_t *v);

/* mb-lease.c */
void mb__reg_begin(mb_t *mb);
/* Entry and exit actions of the states that hold a lease. */
void mb__stop_lease_timers(mb_t *mb);
void mb__enter_joining(mb_t *mb);
void mb__enter_fenced(mb_t *mb);

/* mb-watch.c */
void mb__stop_watches(mb_t *mb);
/* Free the slots' copies once the watches stopped (destroy). */
void mb__mirrors_free(mb_t *mb);
/* The watches every member keeps; the rest follow leadership, views. */
void mb__restart_watch(mb_t *mb);
/* Start (on) or stop the leader's watches; 1 when on and all synced. */
int mb__leader_watches(mb_t *mb, int on);
/* Watch the records of exactly the nodes named (at most MB_PEERS_MAX). */
void mb__watch_peers(mb_t *mb, const char *const *nodes, size_t n);
mb_kv_t *mb__mirror_find(mb_t *mb, const char *key);
/* 1 when a synced slot covers key (*kv_p: its value, NULL when absent
 * from etcd), 0 when no watch of ours tells (*kv_p NULL). */
int mb__mirror_lookup(mb_t *mb, const char *key, mb_kv_t **kv_p);
/* The keys this member watches now (prefix[i]: a prefix watch), at most
 * max of them; returns how many. For tests. */
/* 1 once the leader's watches (records, suspects, reshapes) synced. */
int mb__leader_synced(mb_t *mb);
size_t mb__watched(const mb_t *mb, const char **keys, int *prefix,
                   size_t max);

/* mb-sign.c: the hex HMAC of fields with the job secret; without a
 * secret the signature is "" and every one is accepted. */
#define MB_SIG_HEX 65
int mb__sign(const mb_t *mb, const char *const *fields, size_t n,
             char hex[MB_SIG_HEX]);
/* 1 when sig is the fields' signature (or there is no secret). */
int mb__sig_ok(const mb_t *mb, const char *const *fields, size_t n,
               const char *sig);

/* A JSON object's text (taken) with the signature of (what, key, text)
 * spliced in as its last field "sig": the leader's view, a node record.
 * A new string; json itself without a secret; NULL on failure. */
char *mb__text_sign(const mb_t *mb, const char *what, const char *key,
                    char *json);
/* 1 when val carries the signature mb__text_sign gives (or no secret). */
int mb__text_sig_ok(const mb_t *mb, const char *what, const char *key,
                    const char *val, size_t len);

/* mb-blame.c: one member's report on a suspect, parsed and checked. */
typedef struct {
    char node[MB_KEY_MAX];   /* the suspect */
    char by[MB_KEY_MAX];     /* its reporter */
    int64_t lease;           /* the suspect's incarnation it names */
    mb_blame_t kind;
    uint64_t age_ms;         /* how long it has been known here */
    int valid;               /* well-formed, by a member, signed */
    const mb_kv_t *kv;       /* the mirror's key (mb__reports_mirror) */
} mb__report_t;

const char *mb__blame_name(mb_blame_t kind);
/* The lease under which the stored view names node; 0 when it does not. */
int64_t mb__view_lease(const mb_t *mb, const char *node);
/* suspect/<node>/<by> */
int mb__suspect_key(const mb_t *mb, const char *node, const char *by,
                    char key[MB_KEY_MAX]);
int mb__suspect_sign(const mb_t *mb, const char *key, const char *lease,
                     const char *by, const char *by_lease, const char *kind,
                     char sig[MB_SIG_HEX]);
/* Fills r (r->valid: the report counts for blame); 0 or ST_EINVAL. */
int mb__report_parse(const mb_t *mb, const char *key, const char *val,
                     size_t len, uint64_t age_ms, mb__report_t *r);
/* Every key of the suspects' mirror, parsed (caller frees). */
size_t mb__reports_mirror(mb_t *mb, mb__report_t **out);
/* 1 when the reports convict node's incarnation lease; else 0, and
 * *wake_ms lowered to when a report's grace ends (0: none pending). */
int mb__convicted(const mb_t *mb, const mb__report_t *rs, size_t n,
                  const char *node, int64_t lease, uint64_t *wake_ms);

/* "n1 (silent, 120 ms), n3 (lossy, 40 ms)": the reports on node's
 * incarnation lease, for the log. */
void mb__blame_describe(const mb__report_t *rs, size_t n, const char *node,
                        int64_t lease, char *buf, size_t len);

/* mb-lease.c: a read slower than this means our own path is slow. */
uint64_t mb__path_slow_ms(const mb_t *mb);

/* mb-leader.c */
int mb__is_leader(mb_t *mb);
void mb__campaign(mb_t *mb);
void mb__handle_suspects(mb_t *mb);

/* mb-suspect.c */
/* etcd answered: try the kept suspicions now, not at their backoff. */
void mb__suspects_kick(mb_t *mb);
void mb__suspects_recheck(mb_t *mb);
/* Reporters of a soft suspicion of the leader: read the reports and
 * revoke the leader's lease once it stands convicted. */
void mb__blame_checks(mb_t *mb);
/* Run the blame timer in ms: the leader judges again, reporters read. */
void mb__blame_wake(mb_t *mb, uint64_t ms);
/* This node's incarnation lease turned out to have expired while etcd
 * ran (it was cut off): drop what it suspected under that lease and has
 * not stored, so a partitioned node does not evict healthy ones. */
void mb__suspects_forget(mb_t *mb, int64_t lease);
void mb__schedule_settle(mb_t *mb);
/* The stored view kv, parsed into v when a leader holding the job secret
 * wrote it (0); otherwise refused, logged, and left for the leader to
 * write the valid view back (ST_EPEER_FORGED), or ST_EPROTO. */
int mb__view_accept(mb_t *mb, const mb_kv_t *kv, mb__view_t *v);

#endif
