/*
 * etcd.c - requests to etcd's JSON gateway with libcurl multi on libuv.
 *
 * Every call becomes an etcd_req_t: a body, an easy handle, a reply
 * buffer. It is launched on the preferred endpoint; a connection failure,
 * timeout or HTTP 5xx moves it to the next endpoint until each was tried
 * once. With auth configured, requests wait until a token was obtained
 * from /v3/auth/authenticate, and a reply saying the token is invalid
 * (expired) gets one fresh token and one retry. A failed authenticate
 * that timed out backs off (250 ms doubling to 8 s, jittered).
 */
#include "membership/etcd-int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "common/log.h"
#include "common/status.h"

#define GRPC_NOT_FOUND 5
#define GRPC_PERMISSION_DENIED 7
#define GRPC_UNAUTHENTICATED 16
#define GRPC_INVALID_ARGUMENT 3

static void req_launch(etcd_req_t *r);
static void on_reap(uv_timer_t *t);
static void req_complete_error(etcd_req_t *r, int status);

/* ------------------------------------------------------------------ */
/* Lists and lifetime                                                  */

static void req_free(etcd_req_t *r)
{
    if (r->active)
        curl_multi_remove_handle(r->e->multi, r->easy);
    LIST_DEL(r->e->reqs, r);
    curl_easy_cleanup(r->easy);
    curl_slist_free_all(r->hdrs);
    free(r->body);
    free(r->buf);
    free(r);
}

/* Detach a request from its owner; the reap timer frees it, because we
 * may be inside a libcurl callback where removing handles is not allowed. */
void etcd__req_cancel(etcd_req_t *r)
{
    if (r == NULL)
        return;
    r->cancelled = 1;
    r->cb = NULL;
    r->watch = NULL;
    uv_timer_start(&r->e->reap, on_reap, 0, 0);
}

static void on_reap(uv_timer_t *t)
{
    etcd_t *e = t->data;
    etcd_req_t *r = e->reqs, *next;
    for (; r != NULL; r = next) {
        next = r->next;
        if (r->cancelled) {
            req_free(r);
        } else if (r->to_add) {
            r->to_add = 0;
            r->active = 1;
            if (curl_multi_add_handle(e->multi, r->easy) != CURLM_OK) {
                RD_ERROR("etcd %s: curl_multi_add_handle failed", r->path);
                r->active = 0;
                req_complete_error(r, ST_ENOMEM);
            }
        }
    }
}

/* ------------------------------------------------------------------ */
/* libcurl on libuv                                                    */

static void check_done(etcd_t *e);

static void on_poll(uv_poll_t *p, int status, int events)
{
    etcd_sock_t *s = p->data;
    int running, flags = 0;
    if (status < 0)
        flags = CURL_CSELECT_ERR;
    if (events & UV_READABLE)
        flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE)
        flags |= CURL_CSELECT_OUT;
    etcd_t *e = s->e;
    curl_multi_socket_action(e->multi, s->fd, flags, &running);
    check_done(e);
}

static void on_curl_timer(uv_timer_t *t)
{
    etcd_t *e = t->data;
    int running;
    curl_multi_socket_action(e->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    check_done(e);
}

static int start_timeout(CURLM *m, long ms, void *u)
{
    etcd_t *e = u;
    (void)m;
    if (ms < 0)
        uv_timer_stop(&e->timer);
    else
        uv_timer_start(&e->timer, on_curl_timer, (uint64_t)ms, 0);
    return 0;
}

static void sock_close_cb(uv_handle_t *h)
{
    free(h->data);
}

static int handle_socket(CURL *easy, curl_socket_t fd, int action, void *u,
                         void *sockp)
{
    etcd_t *e = u;
    etcd_sock_t *s = sockp;
    (void)easy;
    if (action == CURL_POLL_REMOVE) {
        if (s != NULL) {
            uv_poll_stop(&s->poll);
            uv_close((uv_handle_t *)&s->poll, sock_close_cb);
            curl_multi_assign(e->multi, fd, NULL);
        }
        return 0;
    }
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL)
            return -1;
        s->fd = fd;
        s->e = e;
        if (uv_poll_init_socket(e->loop, &s->poll, fd) != 0) {
            RD_ERROR("etcd: uv_poll_init_socket(%d) failed", (int)fd);
            free(s);
            return -1;
        }
        s->poll.data = s;
        curl_multi_assign(e->multi, fd, s);
    }
    int ev = (action & CURL_POLL_IN ? UV_READABLE : 0) |
             (action & CURL_POLL_OUT ? UV_WRITABLE : 0);
    uv_poll_start(&s->poll, ev, on_poll);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Completion                                                          */

static int grpc_status(int code)
{
    switch (code) {
    case GRPC_NOT_FOUND:
        return -ENOENT;
    case GRPC_PERMISSION_DENIED:
    case GRPC_UNAUTHENTICATED:
        return -EACCES;
    default:
        return ST_EINVAL;
    }
}

/* Call the owner back with the parsed reply (or the error) and free r. */
static void req_complete(etcd_req_t *r, int status, const cJSON *json)
{
    etcd_arena_t arena = {0};
    etcd_result_t res;
    if (status == 0) {
        status = etcd__parse_reply(r->kind, json, &arena, &res);
        if (status != 0)
            RD_ERROR("etcd %s: malformed reply (%.200s)", r->path,
                     r->buf ? r->buf : "");
    }
    if (r->cb != NULL)
        r->cb(status, status == 0 ? &res : NULL, r->data);
    etcd__arena_free(&arena);
    req_free(r);
}

static void auth_done(etcd_t *e, int status, const char *token);

/* The HTTP exchange is over without a transport failure: judge the body. */
static void req_http_done(etcd_req_t *r, long http)
{
    etcd_t *e = r->e;
    cJSON *json = r->buf ? cJSON_ParseWithLength(r->buf, r->len) : NULL;
    if (http == 200) {
        if (json == NULL)
            RD_ERROR("etcd %s: reply is not JSON (%.200s)", r->path,
                     r->buf ? r->buf : "(empty)");
        if (r->kind == ETCD_K_AUTH) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(json, "token");
            if (!cJSON_IsString(t))
                RD_ERROR("etcd auth: reply has no token");
            auth_done(e, cJSON_IsString(t) ? 0 : ST_EPROTO,
                      cJSON_IsString(t) ? t->valuestring : NULL);
            req_free(r);
        } else {
            req_complete(r, json ? 0 : ST_EPROTO, json);
        }
        cJSON_Delete(json);
        return;
    }
    int code;
    const char *msg;
    etcd__parse_error(json, &code, &msg);
    if (code == GRPC_UNAUTHENTICATED && e->user && !r->auth_retried &&
        r->kind != ETCD_K_AUTH) {
        /* The token expired: get a new one and try once more. */
        RD_INFO("etcd %s: %s; re-authenticating", r->path, msg);
        e->stats.auth_expired++;
        free(e->token);
        e->token = NULL;
        r->auth_retried = 1;
        etcd__req_submit(r);
        cJSON_Delete(json);
        return;
    }
    int status = json ? grpc_status(code) : ST_EPROTO;
    if (r->kind == ETCD_K_AUTH && code == GRPC_INVALID_ARGUMENT)
        status = -EACCES; /* "authentication failed, invalid user/pw" */
    if (json == NULL && http == 400 && r->buf != NULL &&
        strstr(r->buf, "CommonName of client") != NULL) {
        /* etcd 3.4's gateway answers every request that carries a client
         * certificate this way once auth is on: no retry will pass. */
        RD_ERROR("etcd %s: etcd refuses a client certificate together "
                 "with password auth through its JSON gateway: give ringd "
                 "a user or a client certificate, not both", r->path);
        req_complete_error(r, -EACCES);
        return;
    }
    RD_ERROR("etcd %s: HTTP %ld: %s (code %d)", r->path, http,
             json ? msg : "reply is not JSON", code);
    req_complete_error(r, status);
    cJSON_Delete(json);
}

/* Fail r whatever it is. */
static void req_complete_error(etcd_req_t *r, int status)
{
    if (r->kind == ETCD_K_AUTH) {
        auth_done(r->e, status, NULL);
        req_free(r);
    } else if (r->kind == ETCD_K_WATCH) {
        etcd__watch_stream_done(r->watch, status);
        req_free(r);
    } else {
        req_complete(r, status, NULL);
    }
}

/* Certificate trouble is a configuration problem, not an outage. */
static int transport_status(CURLcode cc)
{
    switch (cc) {
    case CURLE_OPERATION_TIMEDOUT:
        return ST_ETIMEDOUT;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_CONNECT_ERROR:
        return -EACCES;
    default:
        return ST_EUNAVAIL;
    }
}

/*
 * A send that failed on a connection libcurl took from its cache says
 * the cache holds a dead one (libcurl itself gives up after five such
 * reuses): the same endpoint is asked once more on a connection of its
 * own, and the requests after it skip the cache until one completes. A
 * send failure means the request never reached etcd whole, so asking
 * again cannot apply it twice. Seen once in CI: every request to an etcd
 * restarted healthy failed this way for 10 s, and the member never
 * registered again.
 */
static int retry_fresh(etcd_req_t *r, CURLcode cc)
{
    if (cc != CURLE_SEND_ERROR || r->kind == ETCD_K_WATCH)
        return 0;
    r->e->distrust_cache = 1;
    if (r->fresh)
        return 0;
    r->fresh = 1;
    req_launch(r);
    return 1;
}

static void req_done(etcd_req_t *r, CURLcode cc)
{
    etcd_t *e = r->e;
    long http = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &http);
    curl_multi_remove_handle(e->multi, r->easy);
    r->active = 0;
    if (r->cancelled) {
        req_free(r);
        return;
    }
    if (r->kind == ETCD_K_WATCH && http == 200) {
        int status = r->stream_rc ? r->stream_rc
                     : cc == CURLE_OK ? ST_ELINK : transport_status(cc);
        e->cur_ep = r->ep;
        etcd__watch_stream_done(r->watch, status);
        req_free(r);
        return;
    }
    if (cc == CURLE_WRITE_ERROR && r->len >= ETCD_MAX_REPLY) {
        RD_ERROR("etcd %s: reply over %u bytes", r->path, ETCD_MAX_REPLY);
        req_complete(r, ST_EPROTO, NULL);
        return;
    }
    if (cc != CURLE_OK || http >= 500 || http < 100) {
        int status = cc != CURLE_OK ? transport_status(cc) : ST_EUNAVAIL;
        const char *why = r->err[0] != '\0' ? r->err : curl_easy_strerror(cc);
        if (r->quiet)
            RD_DEBUG("etcd %s%s: %s (HTTP %ld)", e->eps[r->ep], r->path,
                     why, http);
        else
            RD_WARN("etcd %s%s: %s (HTTP %ld)", e->eps[r->ep], r->path,
                    why, http);
        if (retry_fresh(r, cc))
            return;
        if (++r->attempts < e->n_eps && r->kind != ETCD_K_WATCH) {
            r->ep = (r->ep + 1) % e->n_eps;
            req_launch(r);
            return;
        }
        if (r->kind != ETCD_K_WATCH)
            RD_ERROR("etcd %s: failed on every endpoint: %s", r->path,
                     st_strerror(status));
        e->cur_ep = (r->ep + 1) % e->n_eps;
        req_complete_error(r, status);
        return;
    }
    e->cur_ep = r->ep;
    e->distrust_cache = 0;
    req_http_done(r, http);
}

static void check_done(etcd_t *e)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(e->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE)
            continue;
        etcd_req_t *r = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        req_done(r, m->data.result);
    }
}

/* ------------------------------------------------------------------ */
/* Launching                                                           */

static size_t on_write(char *p, size_t sz, size_t n, void *u)
{
    etcd_req_t *r = u;
    size_t len = sz * n;
    if (r->cancelled)
        return 0;
    if (r->len + len + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + len + 1)
            cap *= 2;
        if (cap > ETCD_MAX_REPLY) {
            r->len = ETCD_MAX_REPLY;
            return 0;
        }
        char *b = realloc(r->buf, cap);
        if (b == NULL)
            return 0;
        r->buf = b;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, p, len);
    r->len += len;
    r->buf[r->len] = '\0';
    if (r->kind == ETCD_K_WATCH) {
        long http = 0;
        curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &http);
        if (http == 200 && etcd__watch_feed(r) != 0)
            return 0; /* abort the stream: CURLE_WRITE_ERROR */
    }
    return r->cancelled ? 0 : len;
}

/* TCP keepalive probes after 2 s idle, every 1 s, 3 tries: a watch
 * stream to a host that vanished without a reset (power loss, partition)
 * is cut after about 5 s and resumed elsewhere, instead of hanging for
 * the kernel's default of two hours. */
static int on_sockopt(void *u, curl_socket_t fd, curlsocktype purpose)
{
    int one = 1, idle = 2, intvl = 1, cnt = 3;
    (void)u;
    if (purpose != CURLSOCKTYPE_IPCXN)
        return CURL_SOCKOPT_OK;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    return CURL_SOCKOPT_OK;
}

static void req_launch(etcd_req_t *r)
{
    etcd_t *e = r->e;
    char url[1024];
    snprintf(url, sizeof(url), "%s%s", e->eps[r->ep], r->path);
    curl_slist_free_all(r->hdrs);
    r->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    if (e->token != NULL && r->kind != ETCD_K_AUTH) {
        char h[1024];
        snprintf(h, sizeof(h), "Authorization: %s", e->token);
        r->hdrs = curl_slist_append(r->hdrs, h);
    }
    r->len = r->line_start = 0;
    CURL *c = r->easy;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, r->hdrs);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_PRIVATE, (char *)r);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, e->connect_ms);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                     r->kind == ETCD_K_WATCH ? 0L : e->request_ms);
    curl_easy_setopt(c, CURLOPT_SOCKOPTFUNCTION, on_sockopt);
    r->err[0] = '\0';
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->err);
    curl_easy_setopt(c, CURLOPT_FRESH_CONNECT,
                     (long)(r->fresh || e->distrust_cache));
    if (e->ca != NULL)
        curl_easy_setopt(c, CURLOPT_CAINFO, e->ca);
    if (e->cert != NULL)
        curl_easy_setopt(c, CURLOPT_SSLCERT, e->cert);
    if (e->key != NULL)
        curl_easy_setopt(c, CURLOPT_SSLKEY, e->key);
    /* Added by the kick timer: we may be inside a libcurl callback (a
     * watch delivering events), where curl_multi_add_handle refuses. */
    r->to_add = 1;
    uv_timer_start(&e->reap, on_reap, 0, 0);
}

static void auth_start(etcd_t *e);

void etcd__req_submit(etcd_req_t *r)
{
    etcd_t *e = r->e;
    r->attempts = 0;
    r->fresh = 0;
    r->ep = e->cur_ep;
    if (e->user != NULL && e->token == NULL && r->kind != ETCD_K_AUTH) {
        r->waiting_auth = 1;
        auth_start(e);
        return;
    }
    req_launch(r);
}

/* Build a request; body is consumed. */
int etcd__req_new(etcd_t *e, etcd_kind_t kind, const char *path,
                  cJSON *body, etcd_cb cb, void *data, etcd_req_t **req_p)
{
    etcd_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL || body == NULL)
        goto err;
    r->body = cJSON_PrintUnformatted(body);
    r->easy = curl_easy_init();
    if (r->body == NULL || r->easy == NULL)
        goto err;
    cJSON_Delete(body);
    r->e = e;
    r->kind = kind;
    r->path = path;
    r->cb = cb;
    r->data = data;
    LIST_ADD(e->reqs, r);
    *req_p = r;
    return 0;

err:
    RD_ERROR("etcd %s: out of memory", path);
    cJSON_Delete(body);
    if (r != NULL) {
        curl_easy_cleanup(r->easy);
        free(r->body);
        free(r);
    }
    return ST_ENOMEM;
}

int etcd__call(etcd_t *e, etcd_kind_t kind, const char *path, cJSON *body,
               etcd_cb cb, void *data)
{
    etcd_req_t *r;
    int rc = etcd__req_new(e, kind, path, body, cb, data, &r);
    if (rc == 0)
        etcd__req_submit(r);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Authentication                                                      */

#define AUTH_BACKOFF_MIN_MS 250
#define AUTH_BACKOFF_MAX_MS 8000

static void on_auth_timer(uv_timer_t *t)
{
    auth_start(t->data);
}

static void auth_start(etcd_t *e)
{
    if (e->auth_inflight)
        return;
    uint64_t now = uv_now(e->loop);
    if (now < e->auth_retry_ms) {
        /* Requests wait for the token meanwhile; the timer sends it. */
        if (!uv_is_active((uv_handle_t *)&e->auth_timer))
            uv_timer_start(&e->auth_timer, on_auth_timer,
                           e->auth_retry_ms - now, 0);
        return;
    }
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "name", e->user);
    cJSON_AddStringToObject(b, "password", e->password ? e->password : "");
    etcd_req_t *r;
    if (etcd__req_new(e, ETCD_K_AUTH, "/v3/auth/authenticate", b, NULL,
                      NULL, &r) != 0) {
        auth_done(e, ST_ENOMEM, NULL);
        return;
    }
    e->auth_inflight = 1;
    e->stats.auth_requests++;
    etcd__req_submit(r);
}

/* Launch (or fail) every request that waited for a token. */
static void auth_done(etcd_t *e, int status, const char *token)
{
    e->auth_inflight = 0;
    if (status == 0 || status == -EACCES) {
        /* A refusal is an answer, not an outage: its callers fence on it
         * and come back at their own pace. */
        e->auth_backoff_ms = 0;
        e->auth_retry_ms = 0;
    } else {
        long b = e->auth_backoff_ms ? 2 * e->auth_backoff_ms
                                    : AUTH_BACKOFF_MIN_MS;
        e->auth_backoff_ms = b > AUTH_BACKOFF_MAX_MS ? AUTH_BACKOFF_MAX_MS : b;
        /* Between half and all of it, so a job's daemons spread out. */
        long wait = e->auth_backoff_ms / 2 +
                    (long)(rand_r(&e->auth_rnd) %
                           (unsigned)(e->auth_backoff_ms / 2 + 1));
        e->auth_retry_ms = uv_now(e->loop) + (uint64_t)wait;
        e->stats.auth_backoffs++;
        RD_WARN("etcd auth: %s; the next attempt in %ld ms or later",
                st_strerror(status), wait);
    }
    if (status == 0) {
        free(e->token);
        e->token = strdup(token);
        if (e->token == NULL)
            status = ST_ENOMEM;
    }
    etcd_req_t *r = e->reqs, *next;
    for (; r != NULL; r = next) {
        next = r->next;
        if (!r->waiting_auth || r->cancelled)
            continue;
        r->waiting_auth = 0;
        if (status == 0)
            req_launch(r);
        else if (r->kind == ETCD_K_WATCH) {
            etcd__watch_stream_done(r->watch, status);
            etcd__req_cancel(r);
        } else {
            /* Deferred free: the caller may be iterating the list. */
            etcd_cb cb = r->cb;
            void *data = r->data;
            etcd__req_cancel(r);
            if (cb != NULL)
                cb(status, NULL, data);
        }
    }
}

/* ------------------------------------------------------------------ */
/* Create / destroy / run                                              */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static char *dup_opt(const char *s, int *fail)
{
    if (s == NULL)
        return NULL;
    char *d = strdup(s);
    if (d == NULL)
        *fail = 1;
    return d;
}

static int parse_endpoints(etcd_t *e, const char *list)
{
    if (list == NULL || list[0] == '\0') {
        RD_ERROR("etcd: no endpoints configured");
        return ST_ECONFIG;
    }
    const char *p = list;
    while (*p != '\0') {
        size_t n = strcspn(p, ",");
        while (n > 0 && p[n - 1] == '/')
            n--; /* "http://h:1/" + "/v3/.." would give "//v3" */
        if (n == 0 || e->n_eps == ETCD_MAX_EPS ||
            (strncmp(p, "http://", 7) != 0 &&
             strncmp(p, "https://", 8) != 0)) {
            RD_ERROR("etcd: bad endpoint list '%s'", list);
            return ST_ECONFIG;
        }
        e->eps[e->n_eps] = strndup(p, n);
        if (e->eps[e->n_eps++] == NULL)
            return ST_ENOMEM;
        p += strcspn(p, ",");
        if (*p == ',')
            p++;
    }
    return 0;
}

static void free_strings(etcd_t *e)
{
    for (int i = 0; i < e->n_eps; i++)
        free(e->eps[i]);
    free(e->ca);
    free(e->cert);
    free(e->key);
    free(e->user);
    free(e->password);
    free(e->token);
}

#define ETCD_MAX_PASSWORD 4096

int etcd_password_file_read(const char *path, char **pw_p)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        RD_ERROR("etcd: cannot read password file %s: %s", path,
                 strerror(errno));
        return ST_ECONFIG;
    }
    struct stat st;
    char buf[ETCD_MAX_PASSWORD + 2];
    size_t n = 0;
    const char *bad = NULL;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
        bad = "not a regular file";
    else
        n = fread(buf, 1, sizeof(buf) - 1, f);
    if (bad == NULL && ferror(f))
        bad = "read error";
    fclose(f);
    buf[n] = '\0';
    size_t len = strcspn(buf, "\r\n");
    if (bad == NULL && memchr(buf, '\0', n) != NULL)
        bad = "NUL byte in the file";
    else if (bad == NULL && len == 0)
        bad = "the first line is empty";
    else if (bad == NULL && len > ETCD_MAX_PASSWORD)
        bad = "the first line is too long";
    if (bad != NULL) {
        RD_ERROR("etcd: password file %s: %s", path, bad);
        return ST_ECONFIG;
    }
    if (st.st_mode & S_IROTH)
        RD_WARN("etcd: password file %s is readable by every user "
                "(chmod 0600 or 0640)", path);
    char *pw = strndup(buf, len);
    memset(buf, 0, sizeof(buf));
    if (pw == NULL)
        return ST_ENOMEM;
    *pw_p = pw;
    return 0;
}

int etcd_create(uv_loop_t *loop, const etcd_config_t *cfg, etcd_t **etcd_p)
{
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) {
        RD_ERROR("etcd: curl_global_init failed");
        return ST_ENOMEM;
    }
    int rc = ST_ENOMEM, fail = 0;
    etcd_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return ST_ENOMEM;
    rc = parse_endpoints(e, cfg->endpoints);
    if (rc != 0)
        goto err_strings;
    e->ca = dup_opt(cfg->ca_file, &fail);
    e->cert = dup_opt(cfg->cert_file, &fail);
    e->key = dup_opt(cfg->key_file, &fail);
    e->user = dup_opt(cfg->user, &fail);
    e->password = dup_opt(cfg->password, &fail);
    rc = ST_ENOMEM;
    if (fail)
        goto err_strings;
    if (cfg->password == NULL && cfg->password_file != NULL) {
        rc = etcd_password_file_read(cfg->password_file, &e->password);
        if (rc != 0)
            goto err_strings;
    }
    e->connect_ms = cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms
                                                : 1000;
    e->request_ms = cfg->request_timeout_ms > 0 ? cfg->request_timeout_ms
                                                : 3000;
    if (loop == NULL) {
        loop = malloc(sizeof(*loop));
        if (loop == NULL || uv_loop_init(loop) != 0) {
            free(loop);
            goto err_strings;
        }
        e->own_loop = 1;
    }
    e->loop = loop;
    e->multi = curl_multi_init();
    if (e->multi == NULL)
        goto err_loop;
    curl_multi_setopt(e->multi, CURLMOPT_SOCKETFUNCTION, handle_socket);
    curl_multi_setopt(e->multi, CURLMOPT_SOCKETDATA, e);
    curl_multi_setopt(e->multi, CURLMOPT_TIMERFUNCTION, start_timeout);
    curl_multi_setopt(e->multi, CURLMOPT_TIMERDATA, e);
    uv_timer_init(loop, &e->timer);
    uv_timer_init(loop, &e->reap);
    uv_timer_init(loop, &e->run_timer);
    uv_timer_init(loop, &e->auth_timer);
    e->timer.data = e->reap.data = e->run_timer.data = e;
    e->auth_timer.data = e;
    e->auth_rnd = (unsigned)getpid() ^ (unsigned)uv_hrtime();
    *etcd_p = e;
    return 0;

err_loop:
    if (e->own_loop) {
        uv_loop_close(loop);
        free(loop);
    }
err_strings:
    free_strings(e);
    free(e);
    return rc;
}

static void etcd_close_cb(uv_handle_t *h)
{
    etcd_t *e = h->data;
    if (--e->n_closing == 0) {
        free_strings(e);
        free(e);
    }
}

void etcd_destroy(etcd_t *e)
{
    if (e == NULL)
        return;
    while (e->watches != NULL)
        etcd__watch_free(e->watches);
    while (e->reqs != NULL)
        req_free(e->reqs);
    curl_multi_cleanup(e->multi);
    uv_loop_t *own = e->own_loop ? e->loop : NULL;
    e->n_closing = 4;
    uv_close((uv_handle_t *)&e->auth_timer, etcd_close_cb);
    uv_close((uv_handle_t *)&e->timer, etcd_close_cb);
    uv_close((uv_handle_t *)&e->reap, etcd_close_cb);
    uv_close((uv_handle_t *)&e->run_timer, etcd_close_cb);
    if (own != NULL) {
        uv_run(own, UV_RUN_DEFAULT);
        if (uv_loop_close(own) != 0)
            RD_WARN("etcd: private loop still has handles");
        free(own);
    }
}

uv_loop_t *etcd_loop(etcd_t *e)
{
    return e->loop;
}

void etcd_stats(const etcd_t *e, etcd_stats_t *stats_p)
{
    *stats_p = e->stats;
}

static void on_run_timer(uv_timer_t *t)
{
    (void)t;
}

int etcd_run(etcd_t *e, const int *done, long timeout_ms)
{
    uint64_t deadline = uv_now(e->loop) + (uint64_t)timeout_ms;
    uv_timer_start(&e->run_timer, on_run_timer, (uint64_t)timeout_ms, 0);
    while (!*done) {
        uv_update_time(e->loop);
        if (uv_now(e->loop) >= deadline)
            break;
        uv_run(e->loop, UV_RUN_ONCE);
    }
    uv_timer_stop(&e->run_timer);
    if (*done)
        return 0;
    RD_ERROR("etcd: no answer within %ld ms", timeout_ms);
    return ST_ETIMEDOUT;
}

/* ------------------------------------------------------------------ */
/* KV and lease calls                                                  */
