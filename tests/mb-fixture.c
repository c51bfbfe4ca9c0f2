#include "tests/mb-fixture.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "tests/helpers.h"
#include "tests/task.h"

/* The etcds this test process started, for the atexit cleanup. */
static fx_etcd_t *started[4];

static void cleanup_all(void)
{
    for (int i = 0; i < 4; i++) {
        if (started[i] == NULL)
            continue;
        th_kill(started[i]->pid);
        started[i]->pid = 0;
        th_rmtree(started[i]->dir);
        free(started[i]->dir);
        started[i]->dir = NULL;
        started[i] = NULL;
    }
}

int fx_done(void)
{
    cleanup_all();
    return 0;
}

const char *fx_path(fx_etcd_t *et, const char *name)
{
    static char buf[512];
    snprintf(buf, sizeof(buf), "%s/%s", et->dir, name);
    return buf;
}

static void make_certs(fx_etcd_t *et)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "cd %s && ( "
             "openssl req -x509 -newkey rsa:2048 -nodes -days 2 "
             "-subj /CN=test-ca -keyout ca.key -out ca.crt && "
             "printf 'subjectAltName=IP:127.0.0.1\\n"
             "extendedKeyUsage=serverAuth,clientAuth\\n' > ext.cnf && "
             "for n in server client; do "
             "openssl req -newkey rsa:2048 -nodes -subj /CN=$n "
             "-keyout $n.key -out $n.csr && "
             "openssl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key "
             "-CAcreateserial -days 2 -extfile ext.cnf -out $n.crt; done"
             " ) > openssl.log 2>&1",
             et->dir);
    ASSERT_MSG(system(cmd) == 0, "openssl failed, see %s/openssl.log",
               et->dir);
}

/* 1 when etcd's log says a port of its was in use. */
static int port_was_taken(fx_etcd_t *et)
{
    FILE *f = fopen(fx_path(et, "etcd.log"), "r");
    if (f == NULL)
        return 0;
    char line[4096];
    int taken = 0;
    while (!taken && fgets(line, sizeof(line), f) != NULL)
        taken = strstr(line, "address already in use") != NULL;
    fclose(f);
    return taken;
}

/* Poll /health until it says true: etcd is a separate process, so the
 * only signal of readiness is asking it. Bounded by 15 s. 0 once
 * healthy; -EADDRINUSE when etcd exited because a port was taken (then
 * reaped); any other exit fails the test. */
static int wait_healthy(fx_etcd_t *et)
{
    char url[256];
    snprintf(url, sizeof(url), "%s/health", et->url);
    int64_t deadline = th_now_ms() + 15000;
    for (;;) {
        CURL *c = curl_easy_init();
        char buf[256] = {0};
        FILE *f = fmemopen(buf, sizeof(buf) - 1, "w");
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 1000L);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        if (et->tls) {
            curl_easy_setopt(c, CURLOPT_CAINFO, fx_path(et, "ca.crt"));
            char cert[512], key[512];
            snprintf(cert, sizeof(cert), "%s/client.crt", et->dir);
            snprintf(key, sizeof(key), "%s/client.key", et->dir);
            curl_easy_setopt(c, CURLOPT_SSLCERT, cert);
            curl_easy_setopt(c, CURLOPT_SSLKEY, key);
        }
        CURLcode cc = curl_easy_perform(c);
        fclose(f);
        curl_easy_cleanup(c);
        if (cc == CURLE_OK && strstr(buf, "\"health\":\"true\"") != NULL)
            return 0;
        int st;
        pid_t w = waitpid(et->pid, &st, WNOHANG);
        if (w == et->pid && port_was_taken(et)) {
            et->pid = 0;
            return -EADDRINUSE;
        }
        ASSERT_MSG(w == 0, "etcd exited, see %s/etcd.log", et->dir);
        ASSERT_MSG(th_now_ms() < deadline, "etcd not healthy in 15 s");
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static int spawn(fx_etcd_t *et)
{
    const char *scheme = et->tls ? "https" : "http";
    char curl_[128], purl[128], cluster[160], data[512];
    snprintf(curl_, sizeof(curl_), "%s://127.0.0.1:%d", scheme, et->cport);
    snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", et->pport);
    snprintf(cluster, sizeof(cluster), "t1=%s", purl);
    snprintf(data, sizeof(data), "%s/data", et->dir);
    snprintf(et->url, sizeof(et->url), "%s", curl_);
    char ca[512], sc[512], sk[512];
    snprintf(ca, sizeof(ca), "%s/ca.crt", et->dir);
    snprintf(sc, sizeof(sc), "%s/server.crt", et->dir);
    snprintf(sk, sizeof(sk), "%s/server.key", et->dir);
    char *argv[40] = {"/usr/bin/etcd", "--name", "t1", "--data-dir", data,
                      "--listen-client-urls", curl_,
                      "--advertise-client-urls", curl_,
                      "--listen-peer-urls", purl,
                      "--initial-advertise-peer-urls", purl,
                      "--initial-cluster", cluster,
                      "--log-level", "warn", "--logger", "zap"};
    int n = 19;
    if (et->tls) {
        char *t[] = {"--cert-file", sc, "--key-file", sk,
                     "--trusted-ca-file", ca, "--client-cert-auth"};
        /* FX_TLS_SERVER: etcd 3.4 demands client certificates as soon as
         * it has a trusted CA, so it gets none. */
        size_t nt = et->tls == FX_TLS_SERVER ? 4 : sizeof(t) / sizeof(t[0]);
        for (size_t i = 0; i < nt; i++)
            argv[n++] = t[i];
    }
    for (int i = 0; i < et->n_extra; i++)
        argv[n++] = et->extra[i];
    argv[n] = NULL;
    et->pid = th_spawn(argv, fx_path(et, "etcd.log"));
    ASSERT(et->pid > 0);
    return wait_healthy(et);
}

/* Tries of a start whose ports were taken before etcd bound them. */
#define FX_ETCD_TRIES 5

void fx_etcd_start_on(fx_etcd_t *et, int tls, int cport, int pport)
{
    static int registered;
    if (!registered) {
        atexit(cleanup_all);
        registered = 1;
    }
    int i = 0;
    while (i < 4 && started[i] != NULL)
        i++;
    ASSERT(i < 4);
    ASSERT_MSG(access("/usr/bin/etcd", X_OK) == 0,
               "/usr/bin/etcd missing: install etcd-server (make deps)");
    et->dir = th_mkdtemp("ringd-etcd");
    ASSERT(et->dir != NULL);
    started[i] = et;
    et->tls = tls;
    if (tls)
        make_certs(et);
    /* A port free when probed can be taken before etcd binds it (the
     * probes hand out ephemeral ports, which any connection may take as
     * its local port): then etcd exits, and it starts again on others. */
    for (int try = 1;; try++) {
        et->cport = cport;
        et->pport = pport;
        ASSERT(et->cport > 0 && et->pport > 0 && et->cport != et->pport);
        unlink(fx_path(et, "etcd.log"));
        if (spawn(et) == 0)
            return;
        ASSERT_MSG(try < FX_ETCD_TRIES, "etcd's ports were taken %d times, "
                   "see %s/etcd.log", try, et->dir);
        fprintf(stderr, "# etcd's port %d or %d was taken: trying others\n",
                cport, pport);
        cport = th_free_port();
        pport = th_free_port();
    }
}

void fx_etcd_start(fx_etcd_t *et, int tls)
{
    int cport = th_free_port();
    fx_etcd_start_on(et, tls, cport, th_free_port());
}

void fx_etcd_restart(fx_etcd_t *et)
{
    ASSERT(et->pid == 0);
    /* The clients know these ports: taken now, the test cannot go on. */
    ASSERT_MSG(spawn(et) == 0, "etcd's ports %d/%d were taken on its "
               "restart", et->cport, et->pport);
}

void fx_etcd_kill(fx_etcd_t *et)
{
    th_kill(et->pid);
    et->pid = 0;
}

void fx_etcd_signal(fx_etcd_t *et, int sig)
{
    kill(et->pid, sig);
}

int fx_etcdctl(fx_etcd_t *et, const char *args)
{
    char cmd[4096], tls[1600] = "", user[96] = "";
    if (et->tls)
        snprintf(tls, sizeof(tls), "--cacert=%s/ca.crt --cert=%s/client.crt "
                 "--key=%s/client.key", et->dir, et->dir, et->dir);
    if (et->ctl_user[0] != '\0')
        snprintf(user, sizeof(user), "--user=%s", et->ctl_user);
    snprintf(cmd, sizeof(cmd),
             "ETCDCTL_API=3 etcdctl --endpoints=%s %s %s %s "
             ">> %s/etcdctl.log 2>&1", et->url, tls, user, args, et->dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

int fx_run_until_fn(uv_loop_t *loop, int (*pred)(void *), void *arg,
                    int64_t timeout_ms)
{
    /* A ticking timer so UV_RUN_ONCE never blocks past the deadline. */
    uv_timer_t tick;
    uv_timer_init(loop, &tick);
    uv_timer_start(&tick, on_tick, 10, 10);
    int64_t deadline = th_now_ms() + timeout_ms;
    int ok;
    while (!(ok = pred(arg)) && th_now_ms() < deadline)
        uv_run(loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return ok;
}

static int flag_set(void *p)
{
    return *(const int *)p != 0;
}

int fx_run_until(uv_loop_t *loop, const int *flag, int64_t timeout_ms)
{
    return fx_run_until_fn(loop, flag_set, (void *)flag, timeout_ms);
}

void fx_loop_drain(uv_loop_t *loop)
{
    uv_run(loop, UV_RUN_DEFAULT);
}

/* ---- relay ---- */

#define RELAY_MAX 64

static int relay_listen(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 64))
        return -1;
    return fd;
}

static int relay_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One process, poll over pairs: fds[2k] <-> fds[2k+1]. */
static void relay_loop(int lfd, int target)
{
    struct pollfd p[1 + 2 * RELAY_MAX];
    int n = 0;
    char buf[65536];
    for (;;) {
        p[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < n; i++)
            p[1 + i].events = POLLIN;
        if (poll(p, (nfds_t)(1 + n), -1) < 0)
            continue;
        for (int i = 0; i < n; i++) {
            if (!(p[1 + i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t r = read(p[1 + i].fd, buf, sizeof(buf));
            int peer = p[1 + (i ^ 1)].fd;
            if (r <= 0 || write(peer, buf, (size_t)r) != r) {
                /* Close the pair; move the last pair into its place. */
                int k = i & ~1;
                close(p[1 + k].fd);
                close(p[2 + k].fd);
                p[1 + k] = p[n - 1];
                p[2 + k] = p[n];
                n -= 2;
                break;
            }
        }
        if ((p[0].revents & POLLIN) && n < 2 * RELAY_MAX) {
            int c = accept(lfd, NULL, NULL);
            int t = c >= 0 ? relay_connect(target) : -1;
            if (t < 0) {
                if (c >= 0)
                    close(c);
                continue;
            }
            p[1 + n++] = (struct pollfd){.fd = c};
            p[1 + n++] = (struct pollfd){.fd = t};
        }
    }
}

pid_t fx_proxy_start(fx_etcd_t *et, int port)
{
    int lfd = relay_listen(port);
    ASSERT_MSG(lfd >= 0, "relay cannot listen on %d", port);
    fflush(stderr);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0)
        relay_loop(lfd, et->cport);
    close(lfd);
    return pid;
}

void fx_proxy_stop(pid_t pid)
{
    th_kill(pid);
}
