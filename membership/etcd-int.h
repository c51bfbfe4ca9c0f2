/*
 * etcd-int.h - internals shared by the etcd client's files.
 */
#ifndef RINGD_ETCD_INT_H
#define RINGD_ETCD_INT_H

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <uv.h>

#include "membership/etcd.h"

/* What a request is, which decides how its reply is parsed. */
typedef enum {
    ETCD_K_RANGE = 0,
    ETCD_K_PUT,
    ETCD_K_DELETE,
    ETCD_K_TXN,
    ETCD_K_GRANT,
    ETCD_K_KEEPALIVE,
    ETCD_K_REVOKE,
    ETCD_K_TTL,
    ETCD_K_AUTH,
    ETCD_K_WATCH,
} etcd_kind_t;

/* Allocations that live as long as one parsed reply. */
typedef struct {
    void **ptrs;
    size_t n, cap;
} etcd_arena_t;

void *etcd__arena_alloc(etcd_arena_t *a, size_t size);
void etcd__arena_free(etcd_arena_t *a);

int etcd__json_bool(const cJSON *obj, const char *name, int *out);
int etcd__json_bytes(const cJSON *obj, const char *name, etcd_arena_t *a,
                     const char **out, size_t *len_p);
int etcd__parse_kv(const cJSON *o, etcd_arena_t *a, etcd_kv_t *kv);
int etcd__parse_reply(etcd_kind_t kind, const cJSON *o, etcd_arena_t *a,
                      etcd_result_t *res);
void etcd__parse_error(const cJSON *o, int *code_p, const char **msg_p);

/* ---- the client's objects (etcd.c, etcd-watch.c) ---- */

#define ETCD_MAX_REPLY (64u << 20) /* a reply bigger than this is garbage */
#define ETCD_MAX_EPS 16

typedef struct etcd_req etcd_req_t;

struct etcd_req {
    etcd_t *e;
    etcd_kind_t kind;
    CURL *easy;
    struct curl_slist *hdrs;
    const char *path;
    char *body;
    etcd_cb cb;
    void *data;
    etcd_watch_t *watch; /* ETCD_K_WATCH: the watch fed by this stream */
    char *buf;
    size_t len, cap, line_start;
    int ep;           /* endpoint index of the current attempt */
    int attempts;     /* endpoints tried */
    int auth_retried;
    int active;       /* added to the multi handle */
    int waiting_auth;
    int cancelled;    /* owner gone: free without calling back */
    int stream_rc;    /* why we cut the watch stream (0: we did not) */
    int to_add;       /* launched, waiting for the kick timer */
    int quiet;        /* failures logged at debug (a watch retrying) */
    int fresh;        /* this attempt opens its own connection */
    char err[CURL_ERROR_SIZE]; /* libcurl's own words on a failure */
    etcd_req_t *prev, *next;
};

struct etcd_watch {
    etcd_t *e;
    char *key_b64, *end_b64;
    etcd_watch_cb cb;
    void *data;
    etcd_req_t *req;       /* the snapshot range or the stream */
    uv_timer_t timer;      /* backoff before the next attempt */
    int64_t next_rev;      /* 0: a snapshot is needed first */
    long backoff_ms;
    uint64_t started_ms;   /* when the current stream was opened */
    unsigned fails;        /* streams ended in a row: logged once */
    int stopped;
    etcd_watch_t *prev, *next;
};

typedef struct {
    uv_poll_t poll;
    curl_socket_t fd;
    etcd_t *e;
} etcd_sock_t;

struct etcd {
    uv_loop_t *loop;
    int own_loop;
    CURLM *multi;
    uv_timer_t timer;      /* libcurl's timeout */
    uv_timer_t reap;       /* adds and frees requests outside curl */
    uv_timer_t run_timer;  /* etcd_run's deadline */
    int n_closing;
    char *eps[ETCD_MAX_EPS];
    int n_eps;
    int cur_ep;
    long connect_ms, request_ms;
    char *ca, *cert, *key, *user, *password;
    char *token;
    int auth_inflight;
    /* After a failed authenticate the next waits auth_backoff_ms (doubled
     * per failure, jittered): each is a bcrypt check and a raft write in
     * etcd, and every fenced daemon of a job asks at once. */
    uv_timer_t auth_timer;
    uint64_t auth_retry_ms;  /* loop time before which none is sent */
    long auth_backoff_ms;
    unsigned auth_rnd;
    /* A request failed to send on a connection libcurl reused: until one
     * completes, the rest open their own rather than try the cache. */
    int distrust_cache;
    etcd_req_t *reqs;
    etcd_watch_t *watches;
    etcd_stats_t stats;
};

#define LIST_ADD(head, x)                                                    \
    do {                                                                     \
        (x)->prev = NULL;                                                    \
        (x)->next = (head);                                                  \
        if (head)                                                            \
            (head)->prev = (x);                                              \
        (head) = (x);                                                        \
    } while (0)

#define LIST_DEL(head, x)                                                    \
    do {                                                                     \
        if ((x)->prev)                                                       \
            (x)->prev->next = (x)->next;                                     \
        else                                                                 \
            (head) = (x)->next;                                              \
        if ((x)->next)                                                       \
            (x)->next->prev = (x)->prev;                                     \
        (x)->prev = (x)->next = NULL;                                        \
    } while (0)

/* Requests (etcd.c). req_new consumes body; submit sends it (after auth
 * when needed); cancel detaches it from its owner, freed later. */
int etcd__req_new(etcd_t *e, etcd_kind_t kind, const char *path,
                  cJSON *body, etcd_cb cb, void *data, etcd_req_t **req_p);
void etcd__req_submit(etcd_req_t *r);
void etcd__req_cancel(etcd_req_t *r);
void etcd__add_range(cJSON *o, const char *key, int prefix);
/* Build a request with etcd__req_new and submit it; 0 or a negative code
 * (then body was freed and cb is never called). */
int etcd__call(etcd_t *e, etcd_kind_t kind, const char *path, cJSON *body,
               etcd_cb cb, void *data);
void etcd__add_i64(cJSON *o, const char *name, int64_t v);

/* Watches (etcd-watch.c). */
void etcd__watch_stream_done(etcd_watch_t *w, int status);
int etcd__watch_feed(etcd_req_t *r);
void etcd__watch_free(etcd_watch_t *w);

#endif /* RINGD_ETCD_INT_H */
