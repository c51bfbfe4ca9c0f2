/*
 * etcd.h - a small etcd v3 client over the JSON gateway (/v3/...).
 *
 * Requests are HTTP POSTs made with libcurl's multi interface, driven by a
 * libuv loop (curl_multi_socket_action on uv_poll + uv_timer). Every reply
 * is validated (HTTP status, JSON shape, field types); a bad reply is an
 * error code passed to the callback, never a crash.
 *
 * Threading: an etcd_t and everything it hands out belong to the thread
 * running its loop. Callbacks run on that thread.
 *
 * Errors: functions return 0 or a negative code (common/status.h):
 *   ST_EUNAVAIL   no endpoint answered (refused, reset, HTTP 5xx)
 *   ST_ETIMEDOUT  connect or request timeout on every endpoint
 *   ST_EPROTO     the reply was not what etcd sends (garbage, truncated)
 *   -EACCES       authentication failed or permission denied
 *   -ENOENT       etcd said "not found" (e.g. revoking an unknown lease)
 *   ST_EINVAL     a bad argument or another etcd error (message logged)
 *
 * libcurl: etcd_create() calls curl_global_init() once per process (a
 * pthread_once), which libcurl requires before any other call; it is never
 * undone (curl_global_cleanup at exit is optional).
 */
#ifndef RINGD_ETCD_H
#define RINGD_ETCD_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

typedef struct etcd etcd_t;
typedef struct etcd_watch etcd_watch_t;

typedef struct {
    /* "http://127.0.0.1:2379,https://h2:2379": tried in order, the one
     * that answered last is tried first next time (fail-over). */
    const char *endpoints;
    long connect_timeout_ms; /* 0: 1000 */
    long request_timeout_ms; /* per attempt; 0: 3000; watches have none */
    const char *ca_file;     /* TLS: CA bundle to verify etcd (or NULL) */
    const char *cert_file;   /* TLS client certificate (or NULL) */
    const char *key_file;    /* TLS client key (or NULL) */
    const char *user;        /* auth: NULL disables */
    const char *password;
    /* auth: read the password from this file instead (its first line);
     * a password never has to be on a command line. Used when password
     * is NULL. */
    const char *password_file;
} etcd_config_t;

/*
 * Read a password file: its first line without the line end. The file
 * must be a regular file with a non-empty first line and no NUL byte;
 * one that others may read is accepted with a warning. Returns 0 and a
 * malloc'd *pw_p, or ST_ECONFIG (logged, naming the file).
 */
int etcd_password_file_read(const char *path, char **pw_p);

/* One key-value pair. key and value are NUL-terminated copies (value may
 * also hold NULs: use value_len). */
typedef struct {
    const char *key;
    const char *value;
    size_t value_len;
    int64_t create_revision;
    int64_t mod_revision;
    int64_t version;
    int64_t lease;
} etcd_kv_t;

/*
 * The parsed reply of any call. Fields a call does not produce are 0/NULL.
 * Valid only during the callback; copy what you keep.
 */
typedef struct etcd_result {
    int64_t revision;            /* header.revision */
    const etcd_kv_t *kvs;        /* range, txn range responses */
    size_t n_kvs;
    int64_t count;               /* range: number of keys matched */
    int64_t deleted;             /* delete: keys deleted */
    int succeeded;               /* txn: 1 when the compares held */
    const struct etcd_result *responses; /* txn: one per op run */
    size_t n_responses;
    int64_t lease_id;            /* lease grant/keepalive/timetolive */
    int64_t ttl;                 /* remaining TTL; <= 0: the lease is gone */
    int64_t granted_ttl;         /* timetolive */
} etcd_result_t;

/* status is 0 with res != NULL, or an error with res == NULL. */
typedef void (*etcd_cb)(int status, const etcd_result_t *res, void *data);

typedef enum {
    ETCD_CMP_VALUE = 0,
    ETCD_CMP_VERSION,
    ETCD_CMP_CREATE,   /* create_revision; 0 means "key absent" */
    ETCD_CMP_MOD,      /* mod_revision */
} etcd_cmp_target_t;

typedef enum {
    ETCD_CMP_EQUAL = 0,
    ETCD_CMP_GREATER,
    ETCD_CMP_LESS,
    ETCD_CMP_NOT_EQUAL,
} etcd_cmp_result_t;

typedef struct {
    const char *key;
    etcd_cmp_target_t target;
    etcd_cmp_result_t result;
    int64_t number;          /* VERSION, CREATE, MOD */
    const void *value;       /* VALUE */
    size_t value_len;
} etcd_cmp_t;

typedef enum {
    ETCD_OP_RANGE = 0,
    ETCD_OP_PUT,
    ETCD_OP_DELETE,
} etcd_op_type_t;

typedef struct {
    etcd_op_type_t type;
    const char *key;
    int prefix;              /* RANGE/DELETE: every key starting with key */
    const void *value;       /* PUT */
    size_t value_len;
    int64_t lease;           /* PUT: 0 for none */
} etcd_op_t;

/*
 * Create a client on loop. loop NULL gives the client a private loop for
 * blocking use with etcd_run() (command-line tools). cfg strings are
 * copied. Returns 0, ST_ECONFIG (bad endpoints) or ST_ENOMEM.
 */
int etcd_create(uv_loop_t *loop, const etcd_config_t *cfg, etcd_t **etcd_p);

/*
 * Cancel everything without calling callbacks and release the client.
 * Accepts NULL. Must not be called from inside an etcd callback. With a
 * caller's loop, handles close asynchronously: run the loop afterwards
 * (uv_run returns once they are closed) before closing it.
 */
void etcd_destroy(etcd_t *etcd);

/*
 * Blocking use (a client made with loop NULL): run the private loop until
 * *done is non-zero (set it in your callback) or timeout_ms passes.
 * Returns 0 or ST_ETIMEDOUT.
 */
int etcd_run(etcd_t *etcd, const int *done, long timeout_ms);

/* The loop the client runs on. */
uv_loop_t *etcd_loop(etcd_t *etcd);

/*
 * Asynchronous calls. Each returns 0 when the request was queued (cb is
 * then called exactly once, unless the client is destroyed first) or an
 * error (cb is not called). Arguments are copied.
 */
int etcd_put(etcd_t *etcd, const char *key, const void *value,
             size_t value_len, int64_t lease, etcd_cb cb, void *data);
/* Range over one key, or every key starting with key when prefix != 0. */
int etcd_get(etcd_t *etcd, const char *key, int prefix, etcd_cb cb,
             void *data);
/* The same range, answering only res->count (no kvs): how many keys
 * there are, at a constant cost however many and large they are. */
int etcd_count(etcd_t *etcd, const char *key, int prefix, etcd_cb cb,
               void *data);
int etcd_delete(etcd_t *etcd, const char *key, int prefix, etcd_cb cb,
                void *data);
/* if (all cmps hold) run success ops else failure ops, atomically. */
int etcd_txn(etcd_t *etcd, const etcd_cmp_t *cmps, size_t n_cmps,
             const etcd_op_t *success, size_t n_success,
             const etcd_op_t *failure, size_t n_failure, etcd_cb cb,
             void *data);
int etcd_lease_grant(etcd_t *etcd, int64_t ttl_s, etcd_cb cb, void *data);
/* res->ttl <= 0 means the lease expired or was revoked. */
int etcd_lease_keepalive(etcd_t *etcd, int64_t lease, etcd_cb cb,
                         void *data);
int etcd_lease_revoke(etcd_t *etcd, int64_t lease, etcd_cb cb, void *data);
int etcd_lease_timetolive(etcd_t *etcd, int64_t lease, etcd_cb cb,
                          void *data);

/* One change seen by a watch. A DELETE's kv has only key and
 * mod_revision. */
typedef struct {
    int is_delete;
    etcd_kv_t kv;
} etcd_event_t;

/*
 * What a watch delivers. reset != 0: kvs is the whole range at revision
 * (the first update, and again after the watch fell behind a compaction);
 * forget what you had. Otherwise events, in revision order, none missed
 * or repeated, even across reconnects. Valid only during the callback.
 */
typedef struct {
    int reset;
    int64_t revision;
    const etcd_kv_t *kvs;
    size_t n_kvs;
    const etcd_event_t *events;
    size_t n_events;
} etcd_watch_update_t;

typedef void (*etcd_watch_cb)(const etcd_watch_update_t *up, void *data);

/*
 * Watch every key starting with prefix: first a range read (delivered as
 * a reset), then a streamed watch from the next revision. A dropped stream
 * is resumed from the revision after the last one delivered, on the next
 * endpoint, with a backoff (50 ms doubling to 1 s). The watch retries until
 * stopped; errors are logged, not delivered. cb may call etcd_watch_stop.
 */
int etcd_watch_start(etcd_t *etcd, const char *prefix, etcd_watch_cb cb,
                     void *data, etcd_watch_t **watch_p);
/* The same for exactly one key (no range end): a member watching its
 * own record must not receive every record whose name it prefixes. */
int etcd_watch_key(etcd_t *etcd, const char *key, etcd_watch_cb cb,
                   void *data, etcd_watch_t **watch_p);
/* Stop and free a watch; cb is not called again. Accepts NULL. */
void etcd_watch_stop(etcd_watch_t *watch);

/* Counters since etcd_create, for tests and metrics. */
typedef struct {
    uint64_t auth_requests;   /* /v3/auth/authenticate calls sent */
    uint64_t auth_backoffs;   /* failed ones, each followed by a backoff */
    uint64_t auth_expired;    /* replies saying our token was invalid */
    uint64_t watch_streams;   /* watch streams opened, first or resumed */
    uint64_t watch_compacted; /* streams etcd canceled because their start
                                 revision was compacted (then re-read) */
} etcd_stats_t;

void etcd_stats(const etcd_t *etcd, etcd_stats_t *stats_p);

/* Base64 (RFC 4648, with padding). Encode writes 4*ceil(n/3) chars and a
 * NUL into out (size it with ETCD_B64_ENC_LEN). Decode returns the
 * decoded length or ST_EPROTO on bad input; out needs 3*len/4 bytes. */
#define ETCD_B64_ENC_LEN(n) ((((n) + 2) / 3) * 4 + 1)
void etcd_b64_encode(const void *in, size_t n, char *out);
long etcd_b64_decode(const char *in, size_t len, void *out);
/* A malloc'ed NUL-ended encoding of in; NULL when out of memory. */
char *etcd_b64_dup(const void *in, size_t n);

#endif /* RINGD_ETCD_H */
