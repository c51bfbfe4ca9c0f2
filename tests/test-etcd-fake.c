/*
 * test-etcd-fake.c - the etcd client against a fake HTTP server that
 * answers garbage, wrong types, truncated JSON, 500s or nothing: every
 * call ends with a clear error, within its timeout, without a crash.
 */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "membership/etcd.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/task.h"

static void send_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void reply(int fd, const char *status, const char *body)
{
    char h[256];
    snprintf(h, sizeof(h),
             "HTTP/1.1 %s\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n\r\n",
             status, strlen(body));
    send_all(fd, h, strlen(h));
    send_all(fd, body, strlen(body));
}

/* Read the request head (and whatever of the body came with it). */
static int read_request(int fd, char *buf, size_t n)
{
    size_t len = 0;
    while (len + 1 < n) {
        ssize_t r = read(fd, buf + len, n - len - 1);
        if (r <= 0)
            return -1;
        len += (size_t)r;
        buf[len] = '\0';
        if (strstr(buf, "\r\n\r\n") != NULL)
            return 0;
    }
    return 0;
}

/*
 * Watch requests the fake server has accepted, counted across its forked
 * connection handlers in memory shared with the test.
 */
static int *watch_opens;
/* Accept times (ms) of the fake server's connections, shared likewise. */
#define FAKE_MAX_ACCEPTS 256
static int64_t *accept_ms;
static int *accepts;

static void serve_one(int fd, const char *mode)
{
    char req[8192];
    if (read_request(fd, req, sizeof(req)) != 0)
        return;
    int is_watch = strstr(req, "/v3/watch") != NULL;
    if (is_watch)
        __atomic_fetch_add(watch_opens, 1, __ATOMIC_SEQ_CST);
    if (!strcmp(mode, "garbage"))
        reply(fd, "200 OK", "this is not json");
    else if (!strcmp(mode, "wrongtype"))
        reply(fd, "200 OK", "{\"header\":{\"revision\":\"abc\"},\"kvs\":7}");
    else if (!strcmp(mode, "badkvs"))
        reply(fd, "200 OK", "{\"header\":{},\"kvs\":[{\"key\":\"!!\"}]}");
    else if (!strcmp(mode, "noheader"))
        reply(fd, "200 OK", "{\"kvs\":[]}");
    else if (!strcmp(mode, "truncated"))
        reply(fd, "200 OK", "{\"header\":{\"revision\":\"1");
    else if (!strcmp(mode, "short")) {
        const char *h = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
                        "{\"header\":";
        send_all(fd, h, strlen(h));
    } else if (!strcmp(mode, "500"))
        reply(fd, "500 Internal Server Error", "{}");
    else if (!strcmp(mode, "404html"))
        reply(fd, "404 Not Found", "<html>nope</html>");
    else if (!strcmp(mode, "silent"))
        pause();
    else if (!strcmp(mode, "watchgarbage") && is_watch) {
        const char *h = "HTTP/1.1 200 OK\r\nContent-Type: application/json"
                        "\r\nTransfer-Encoding: chunked\r\n\r\n";
        const char *lines[] = {
            "{\"result\":{\"header\":{\"revision\":\"5\"},\"created\":true}}\n",
            "{\"result\":{\"header\":{\"revision\":\"6\"},\"events\":"
            "[{\"kv\":{\"key\":7}}]}}\n",
        };
        send_all(fd, h, strlen(h));
        for (int i = 0; i < 2; i++) {
            char c[32];
            snprintf(c, sizeof(c), "%zx\r\n", strlen(lines[i]));
            send_all(fd, c, strlen(c));
            send_all(fd, lines[i], strlen(lines[i]));
            send_all(fd, "\r\n", 2);
        }
        pause();
    } else if (!strcmp(mode, "compacted") && is_watch) {
        reply(fd, "200 OK",
              "{\"result\":{\"header\":{\"revision\":\"9\"},"
              "\"canceled\":true,\"compact_revision\":\"8\"}}\n");
    } else if (!strcmp(mode, "compacted")) {
        reply(fd, "200 OK", "{\"header\":{\"revision\":\"9\"},\"kvs\":"
                            "[{\"key\":\"L3AvYQ==\",\"value\":\"MQ==\","
                            "\"mod_revision\":\"3\"}],\"count\":\"1\"}");
    } else if (!strcmp(mode, "watchgarbage"))
        reply(fd, "200 OK", "{\"header\":{\"revision\":\"5\"}}");
    /* "close": nothing */
}

/* A child process serving mode on a free port; returns its pid. */
static pid_t fake_server(const char *mode, int *port_p)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    ASSERT_EQ(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    ASSERT_EQ(listen(lfd, 16), 0);
    ASSERT_EQ(getsockname(lfd, (struct sockaddr *)&a, &len), 0);
    *port_p = ntohs(a.sin_port);
    if (watch_opens == NULL) {
        watch_opens = mmap(NULL, sizeof(*watch_opens),
                           PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                           -1, 0);
        ASSERT(watch_opens != MAP_FAILED);
    }
    __atomic_store_n(watch_opens, 0, __ATOMIC_SEQ_CST);
    if (accept_ms == NULL) {
        accept_ms = mmap(NULL, FAKE_MAX_ACCEPTS * sizeof(*accept_ms) +
                                   sizeof(*accepts),
                         PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                         -1, 0);
        ASSERT(accept_ms != MAP_FAILED);
        accepts = (int *)(accept_ms + FAKE_MAX_ACCEPTS);
    }
    __atomic_store_n(accepts, 0, __ATOMIC_SEQ_CST);
    fflush(stderr);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        signal(SIGCHLD, SIG_IGN);
        for (;;) {
            int fd = accept(lfd, NULL, NULL);
            if (fd < 0)
                continue;
            int k = __atomic_load_n(accepts, __ATOMIC_SEQ_CST);
            if (k < FAKE_MAX_ACCEPTS) {
                accept_ms[k] = th_now_ms();
                __atomic_store_n(accepts, k + 1, __ATOMIC_SEQ_CST);
            }
            if (fork() == 0) {
                serve_one(fd, mode);
                close(fd);
                _exit(0);
            }
            close(fd);
        }
    }
    close(lfd);
    return pid;
}

typedef struct {
    int done, status;
} res_t;

static void on_res(int status, const etcd_result_t *r, void *data)
{
    res_t *x = data;
    x->done = 1;
    x->status = status;
    ASSERT((status == 0) == (r != NULL));
}

static int call_mode(const char *mode, int which)
{
    int port;
    pid_t pid = fake_server(mode, &port);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    etcd_config_t cfg = {.endpoints = url, .request_timeout_ms = 500,
                         .connect_timeout_ms = 500};
    etcd_t *e;
    ASSERT_OK(etcd_create(NULL, &cfg, &e));
    res_t r = {0};
    int64_t t0 = th_now_ms();
    if (which == 0)
        ASSERT_OK(etcd_get(e, "/k", 1, on_res, &r));
    else if (which == 1)
        ASSERT_OK(etcd_lease_keepalive(e, 42, on_res, &r));
    else
        ASSERT_OK(etcd_txn(e, NULL, 0, NULL, 0, NULL, 0, on_res, &r));
    ASSERT_OK(etcd_run(e, &r.done, 5000));
    ASSERT_LT(th_now_ms() - t0, 2000); /* 500 ms timeout + slack */
    etcd_destroy(e);
    th_kill(pid);
    fprintf(stderr, "mode %s: %s\n", mode, st_strerror(r.status));
    return r.status;
}

TEST_IMPL(etcd_fake_server)
{
    ASSERT_EQ(call_mode("garbage", 0), ST_EPROTO);
    ASSERT_EQ(call_mode("wrongtype", 0), ST_EPROTO);
    ASSERT_EQ(call_mode("badkvs", 0), ST_EPROTO);
    ASSERT_EQ(call_mode("noheader", 0), ST_EPROTO);
    ASSERT_EQ(call_mode("truncated", 0), ST_EPROTO);
    ASSERT_EQ(call_mode("garbage", 1), ST_EPROTO);
    ASSERT_EQ(call_mode("noheader", 1), ST_EPROTO);
    ASSERT_EQ(call_mode("wrongtype", 2), ST_EPROTO);
    ASSERT_EQ(call_mode("404html", 0), ST_EPROTO);
    ASSERT_EQ(call_mode("short", 0), ST_EUNAVAIL);
    ASSERT_EQ(call_mode("500", 0), ST_EUNAVAIL);
    ASSERT_EQ(call_mode("close", 0), ST_EUNAVAIL);
    ASSERT_EQ(call_mode("silent", 0), ST_ETIMEDOUT);
    return fx_done();
}

typedef struct {
    int resets, events;
    int kvs;
} wcount_t;

static void on_watch(const etcd_watch_update_t *up, void *data)
{
    wcount_t *w = data;
    if (up->reset) {
        w->resets++;
        w->kvs = (int)up->n_kvs;
        if (up->n_kvs > 0) {
            ASSERT_STR_EQ(up->kvs[0].key, "/p/a");
            ASSERT_STR_EQ(up->kvs[0].value, "1");
        }
    }
    w->events += (int)up->n_events;
}

static int three_opens(void *p)
{
    (void)p;
    return __atomic_load_n(watch_opens, __ATOMIC_SEQ_CST) >= 3;
}

/* A stream with a malformed event is dropped and re-opened (the server
 * sees the watch request again, and again); nothing bad is delivered. */
TEST_IMPL(etcd_fake_watch)
{
    int port;
    pid_t pid = fake_server("watchgarbage", &port);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    etcd_config_t cfg = {.endpoints = url};
    etcd_t *e;
    ASSERT_OK(etcd_create(NULL, &cfg, &e));
    wcount_t wc = {0};
    etcd_watch_t *w;
    ASSERT_OK(etcd_watch_start(e, "/p/", on_watch, &wc, &w));
    ASSERT_MSG(fx_run_until_fn(etcd_loop(e), three_opens, NULL, 10000),
               "the server saw %d watch requests, wanted 3",
               __atomic_load_n(watch_opens, __ATOMIC_SEQ_CST));
    etcd_stats_t st;
    etcd_stats(e, &st);
    ASSERT_GE(st.watch_streams, 3);
    ASSERT_EQ(wc.resets, 1);
    ASSERT_EQ(wc.events, 0);
    etcd_watch_stop(w);
    etcd_destroy(e);
    th_kill(pid);
    return fx_done();
}

static int two_resets(void *p)
{
    return ((wcount_t *)p)->resets >= 2;
}

/* A watch told its start revision was compacted re-reads the range. */
TEST_IMPL(etcd_fake_compacted)
{
    int port;
    pid_t pid = fake_server("compacted", &port);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    etcd_config_t cfg = {.endpoints = url};
    etcd_t *e;
    ASSERT_OK(etcd_create(NULL, &cfg, &e));
    wcount_t wc = {0};
    etcd_watch_t *w;
    ASSERT_OK(etcd_watch_start(e, "/p/", on_watch, &wc, &w));
    ASSERT(fx_run_until_fn(etcd_loop(e), two_resets, &wc, 3000));
    ASSERT_EQ(wc.kvs, 1);
    ASSERT_EQ(wc.events, 0);
    etcd_watch_stop(w);
    etcd_destroy(e);
    th_kill(pid);
    return fx_done();
}

/* A caller that asks again at once whenever a call fails. */
typedef struct {
    etcd_t *e;
    int calls, done;
    int64_t until_ms;
} eager_t;

static void on_eager(int status, const etcd_result_t *r, void *data)
{
    eager_t *x = data;
    (void)r;
    (void)status;
    x->calls++;
    if (th_now_ms() >= x->until_ms || etcd_get(x->e, "/k", 1, on_eager, x))
        x->done = 1;
}

/*
 * etcd with auth that answers nothing (what a saturated etcd looks like
 * from a fenced daemon): a caller retrying at once must not turn into an
 * authenticate per request timeout. Every attempt after a failed one
 * waits at least half its backoff (250 ms doubling): the gaps between the
 * fake server's connections are bounded below (a loaded machine only
 * widens them). Without the backoff they were one 100 ms timeout each.
 */
TEST_IMPL(etcd_fake_auth_backoff)
{
    int port;
    pid_t pid = fake_server("silent", &port);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    etcd_config_t cfg = {.endpoints = url, .request_timeout_ms = 100,
                         .connect_timeout_ms = 100, .user = "ringd",
                         .password = "pw"};
    etcd_t *e;
    ASSERT_OK(etcd_create(NULL, &cfg, &e));
    eager_t x = {.e = e, .until_ms = th_now_ms() + 3000};
    ASSERT_OK(etcd_get(e, "/k", 1, on_eager, &x));
    ASSERT_OK(etcd_run(e, &x.done, 30000));
    etcd_stats_t st;
    etcd_stats(e, &st);
    etcd_destroy(e);
    th_kill(pid);
    int n = __atomic_load_n(accepts, __ATOMIC_SEQ_CST);
    fprintf(stderr, "auth attempts %d (sent %llu, backoffs %llu), calls %d\n",
            n, (unsigned long long)st.auth_requests,
            (unsigned long long)st.auth_backoffs, x.calls);
    ASSERT_GE(n, 3);
    ASSERT_EQ((uint64_t)n, st.auth_requests);
    long backoff = 250;
    for (int k = 1; k < n; k++) {
        int64_t gap = accept_ms[k] - accept_ms[k - 1];
        ASSERT_MSG(gap >= backoff / 2, "attempt %d came %lld ms after the "
                   "last, under half its backoff of %ld ms", k,
                   (long long)gap, backoff);
        backoff = backoff * 2 > 8000 ? 8000 : backoff * 2;
    }
    return fx_done();
}
