/*
 * mb-fixture.h - a real etcd for membership tests: started on free
 * loopback ports with a temp data dir, waited for with a bounded deadline,
 * killed by pid and removed at exit even when an assertion fails.
 */
#ifndef RINGD_TEST_MB_FIXTURE_H
#define RINGD_TEST_MB_FIXTURE_H

#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

typedef struct {
    pid_t pid;
    char *dir;      /* temp dir: data/, certs, etcd.log */
    int cport, pport;
    int tls;        /* 0, FX_TLS_CLIENT_CERTS or FX_TLS_SERVER */
    char url[128];
    char extra[4][64]; /* extra etcd flags */
    int n_extra;
    char ctl_user[64]; /* "user:password" for etcdctl once auth is on */
} fx_etcd_t;

/* https: clients must show a certificate the test CA signed. */
#define FX_TLS_CLIENT_CERTS 1
/* https with a server certificate only: what etcd 3.4's JSON gateway
 * takes together with password auth. */
#define FX_TLS_SERVER 2

/* Start etcd (tls: make certs with openssl first). Fails the test on
 * error. A port taken before etcd bound it (etcd exits: "address
 * already in use") is no error: it starts again on other free ports. */
void fx_etcd_start(fx_etcd_t *et, int tls);
/* The same, trying client port cport and peer port pport first. */
void fx_etcd_start_on(fx_etcd_t *et, int tls, int cport, int pport);
/* Start again on the same ports and data dir (after fx_etcd_kill). */
void fx_etcd_restart(fx_etcd_t *et);
/* SIGKILL and reap. */
void fx_etcd_kill(fx_etcd_t *et);
void fx_etcd_signal(fx_etcd_t *et, int sig);
/* Path of a file in et->dir (static buffer, one at a time). */
const char *fx_path(fx_etcd_t *et, const char *name);
/* Run etcdctl with args against et; returns its exit status. */
int fx_etcdctl(fx_etcd_t *et, const char *args);

/*
 * A TCP relay 127.0.0.1:port -> etcd's client port, in a child process,
 * to cut one client off etcd: fx_proxy_stop kills it (its connections
 * close), fx_proxy_start on the same port brings it back.
 */
pid_t fx_proxy_start(fx_etcd_t *et, int port);
void fx_proxy_stop(pid_t pid);

/* Kill every etcd this test started and remove their dirs; returns 0 so
 * a test can end with `return fx_done();`. Also run at exit, for tests
 * that fail an assertion. */
int fx_done(void);

/* Run loop until *flag != 0 or timeout_ms; returns 1 if the flag was set. */
int fx_run_until(uv_loop_t *loop, const int *flag, int64_t timeout_ms);
/* Same with a predicate. */
int fx_run_until_fn(uv_loop_t *loop, int (*pred)(void *), void *arg,
                    int64_t timeout_ms);
/* Run the loop until all handles are closed (after destroys). */
void fx_loop_drain(uv_loop_t *loop);

#endif
