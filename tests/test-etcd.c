/*
 * test-etcd.c - the etcd client against a real etcd (and, in
 * test-etcd-fake.c, against a server that misbehaves).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "membership/etcd.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/task.h"

typedef struct {
    int done;
    int status;
    etcd_result_t res;       /* scalars only */
    char value[256];
    int n_kvs;
    int64_t lease_id, ttl;
} reply_t;

static void on_reply(int status, const etcd_result_t *res, void *data)
{
    reply_t *r = data;
    r->done = 1;
    r->status = status;
    if (res == NULL)
        return;
    r->res = *res;
    r->n_kvs = (int)res->n_kvs;
    const etcd_kv_t *kvs = res->kvs;
    if (res->n_responses > 0 && res->responses[0].n_kvs > 0)
        kvs = res->responses[0].kvs;
    if (kvs != NULL)
        snprintf(r->value, sizeof(r->value), "%s", kvs[0].value);
    r->lease_id = res->lease_id;
    r->ttl = res->ttl;
}

/* Wait for one reply on e's private loop. */
static reply_t wait_reply(etcd_t *e, reply_t *r)
{
    ASSERT_OK(etcd_run(e, &r->done, 10000));
    return *r;
}

#define CALL(e, expr)                                                        \
    ({                                                                       \
        reply_t r_ = {0};                                                    \
        reply_t *rp_ = &r_;                                                  \
        (void)rp_;                                                           \
        ASSERT_OK(expr);                                                     \
        wait_reply(e, &r_);                                                  \
    })

static etcd_t *connect_to(fx_etcd_t *et)
{
    etcd_config_t cfg = {.endpoints = et->url};
    etcd_t *e;
    ASSERT_OK(etcd_create(NULL, &cfg, &e));
    return e;
}

TEST_IMPL(etcd_base64)
{
    const char *cases[][2] = {{"", ""}, {"f", "Zg=="}, {"fo", "Zm8="},
                              {"foo", "Zm9v"}, {"foob", "Zm9vYg=="},
                              {"/ringd/j/nodes/", "L3JpbmdkL2ovbm9kZXMv"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char enc[64], dec[64];
        etcd_b64_encode(cases[i][0], strlen(cases[i][0]), enc);
        ASSERT_STR_EQ(enc, cases[i][1]);
        long n = etcd_b64_decode(enc, strlen(enc), dec);
        ASSERT_EQ(n, (long)strlen(cases[i][0]));
        ASSERT(memcmp(dec, cases[i][0], (size_t)n) == 0);
    }
    unsigned char bin[256], back[256];
    char enc[ETCD_B64_ENC_LEN(256)];
    for (int i = 0; i < 256; i++)
        bin[i] = (unsigned char)i;
    etcd_b64_encode(bin, 256, enc);
    ASSERT_EQ(etcd_b64_decode(enc, strlen(enc), back), 256);
    ASSERT(memcmp(bin, back, 256) == 0);
    char junk[8];
    ASSERT_EQ(etcd_b64_decode("ab$d", 4, junk), ST_EPROTO);
    ASSERT_EQ(etcd_b64_decode("a", 1, junk), ST_EPROTO);
    return fx_done();
}

TEST_IMPL(etcd_kv_txn_lease)
{
    fx_etcd_t et = {0};
    fx_etcd_start(&et, 0);
    etcd_t *e = connect_to(&et);
    reply_t r;

    r = CALL(e, etcd_put(e, "/t/a", "1", 1, 0, on_reply, rp_));
    ASSERT_OK(r.status);
    ASSERT_GT(r.res.revision, 0);
    r = CALL(e, etcd_put(e, "/t/b", "two", 3, 0, on_reply, rp_));
    r = CALL(e, etcd_get(e, "/t/a", 0, on_reply, rp_));
    ASSERT_OK(r.status);
    ASSERT_EQ(r.n_kvs, 1);
    ASSERT_STR_EQ(r.value, "1");
    r = CALL(e, etcd_get(e, "/t/", 1, on_reply, rp_));
    ASSERT_EQ(r.n_kvs, 2);
    ASSERT_EQ(r.res.count, 2);
    r = CALL(e, etcd_count(e, "/t/", 1, on_reply, rp_)); /* no values */
    ASSERT_OK(r.status);
    ASSERT_EQ(r.n_kvs, 0);
    ASSERT_EQ(r.res.count, 2);
    r = CALL(e, etcd_get(e, "/nothing", 1, on_reply, rp_));
    ASSERT_OK(r.status);
    ASSERT_EQ(r.n_kvs, 0);

    /* create-if-absent: first wins, second sees the holder. */
    etcd_cmp_t absent = {"/t/leader", ETCD_CMP_CREATE, ETCD_CMP_EQUAL, 0};
    etcd_op_t put = {ETCD_OP_PUT, "/t/leader", 0, "me", 2, 0};
    etcd_op_t get = {ETCD_OP_RANGE, "/t/leader", 0, NULL, 0, 0};
    r = CALL(e, etcd_txn(e, &absent, 1, &put, 1, &get, 1, on_reply, rp_));
    ASSERT_OK(r.status);
    ASSERT_EQ(r.res.succeeded, 1);
    etcd_op_t put2 = {ETCD_OP_PUT, "/t/leader", 0, "you", 3, 0};
    r = CALL(e, etcd_txn(e, &absent, 1, &put2, 1, &get, 1, on_reply, rp_));
    ASSERT_OK(r.status);
    ASSERT_EQ(r.res.succeeded, 0);
    ASSERT_STR_EQ(r.value, "me");
    etcd_cmp_t val = {"/t/leader", ETCD_CMP_VALUE, ETCD_CMP_EQUAL, 0, "me",
                      2};
    r = CALL(e, etcd_txn(e, &val, 1, &put2, 1, NULL, 0, on_reply, rp_));
    ASSERT_EQ(r.res.succeeded, 1);

    /* Leases: grant, attach, keepalive, time-to-live, revoke. */
    /* A long TTL: a slow (loaded) machine must not expire it mid-test. */
    r = CALL(e, etcd_lease_grant(e, 60, on_reply, rp_));
    ASSERT_OK(r.status);
    int64_t lease = r.lease_id;
    ASSERT_NE(lease, 0);
    ASSERT_EQ(r.ttl, 60);
    r = CALL(e, etcd_put(e, "/t/leased", "x", 1, lease, on_reply, rp_));
    ASSERT_OK(r.status);
    r = CALL(e, etcd_lease_keepalive(e, lease, on_reply, rp_));
    ASSERT_OK(r.status);
    ASSERT_EQ(r.ttl, 60);
    r = CALL(e, etcd_lease_timetolive(e, lease, on_reply, rp_));
    ASSERT_OK(r.status);
    ASSERT_EQ(r.res.granted_ttl, 60);
    ASSERT_GT(r.ttl, 0);
    r = CALL(e, etcd_lease_revoke(e, lease, on_reply, rp_));
    ASSERT_OK(r.status);
    r = CALL(e, etcd_get(e, "/t/leased", 0, on_reply, rp_));
    ASSERT_EQ(r.n_kvs, 0);
    /* A revoked lease: keepalive answers 200 without TTL. */
    r = CALL(e, etcd_lease_keepalive(e, lease, on_reply, rp_));
    ASSERT_OK(r.status);
    ASSERT_LE(r.ttl, 0);
    r = CALL(e, etcd_lease_revoke(e, lease, on_reply, rp_));
    ASSERT_EQ(r.status, -ENOENT);

    r = CALL(e, etcd_delete(e, "/t/", 1, on_reply, rp_));
    ASSERT_OK(r.status);
    ASSERT_EQ(r.res.deleted, 3);
    etcd_destroy(e);
    return fx_done();
}

/* ---- watch ---- */

typedef struct {
    int resets;
    int64_t last_rev;
    int n_events;
    int n_deletes;
    char keys[64][32];
    int n_keys;
    int bad_order;
} wstate_t;

static void on_watch(const etcd_watch_update_t *up, void *data)
{
    wstate_t *w = data;
    if (up->reset) {
        w->resets++;
        w->n_keys = 0;
        for (size_t i = 0; i < up->n_kvs && w->n_keys < 64; i++)
            snprintf(w->keys[w->n_keys++], 32, "%s", up->kvs[i].key);
        w->last_rev = up->revision;
        return;
    }
    for (size_t i = 0; i < up->n_events; i++) {
        if (up->events[i].kv.mod_revision <= w->last_rev)
            w->bad_order++;
        w->last_rev = up->events[i].kv.mod_revision;
        w->n_events++;
        w->n_deletes += up->events[i].is_delete;
    }
}

static int events_at_least(void *p)
{
    void **a = p;
    return ((wstate_t *)a[0])->n_events >= *(int *)a[1];
}

static void wait_events(etcd_t *e, wstate_t *w, int n)
{
    void *a[2] = {w, &n};
    ASSERT_MSG(fx_run_until_fn(etcd_loop(e), events_at_least, a, 10000),
               "saw %d events, wanted %d", w->n_events, n);
}

TEST_IMPL(etcd_watch_resume)
{
    fx_etcd_t et = {0};
    fx_etcd_start(&et, 0);
    etcd_t *e = connect_to(&et);
    reply_t r;
    r = CALL(e, etcd_put(e, "/w/0", "x", 1, 0, on_reply, rp_));
    wstate_t ws = {0};
    etcd_watch_t *w;
    ASSERT_OK(etcd_watch_start(e, "/w/", on_watch, &ws, &w));
    ASSERT(fx_run_until(etcd_loop(e), &ws.resets, 10000));
    ASSERT_EQ(ws.n_keys, 1);
    ASSERT_STR_EQ(ws.keys[0], "/w/0");

    for (int i = 1; i <= 5; i++) {
        char k[16];
        snprintf(k, sizeof(k), "/w/%d", i);
        r = CALL(e, etcd_put(e, k, "v", 1, 0, on_reply, rp_));
    }
    r = CALL(e, etcd_delete(e, "/w/1", 0, on_reply, rp_));
    wait_events(e, &ws, 6);
    ASSERT_EQ(ws.n_deletes, 1);

    /* Restart etcd; changes made while the stream is down arrive once. */
    fx_etcd_kill(&et);
    fx_etcd_restart(&et);
    for (int i = 6; i <= 8; i++) {
        char k[16];
        snprintf(k, sizeof(k), "/w/%d", i);
        r = CALL(e, etcd_put(e, k, "v", 1, 0, on_reply, rp_));
        ASSERT_OK(r.status);
    }
    wait_events(e, &ws, 9);
    ASSERT_EQ(ws.n_events, 9);
    ASSERT_EQ(ws.bad_order, 0);
    ASSERT_EQ(ws.resets, 1);
    etcd_watch_stop(w);
    etcd_destroy(e);
    return fx_done();
}

static int compacted_reread(void *p)
{
    const wstate_t *w = p;
    return w->resets >= 2;
}

/*
 * A watch that resumes from a revision etcd has compacted away is
 * canceled with compact_revision and re-reads the range. The watching
 * client reaches etcd through a relay; while the relay is down another
 * client writes 5 keys and etcd compacts (physically) past the watch's
 * resume point, so the resumed stream must take the compacted path.
 */
TEST_IMPL(etcd_watch_compacted)
{
    fx_etcd_t et = {0};
    fx_etcd_start(&et, 0);
    int port = th_free_port();
    pid_t relay = fx_proxy_start(&et, port);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    etcd_config_t cfg = {.endpoints = url};
    etcd_t *e, *wr = connect_to(&et);
    ASSERT_OK(etcd_create(NULL, &cfg, &e));
    wstate_t ws = {0};
    etcd_watch_t *w;
    ASSERT_OK(etcd_watch_start(e, "/c/", on_watch, &ws, &w));
    ASSERT(fx_run_until(etcd_loop(e), &ws.resets, 10000));
    int64_t resume = ws.last_rev + 1;

    fx_proxy_stop(relay);
    reply_t r;
    int64_t rev = 0;
    for (int i = 0; i < 5; i++) {
        char k[16];
        snprintf(k, sizeof(k), "/c/%d", i);
        r = CALL(wr, etcd_put(wr, k, "v", 1, 0, on_reply, rp_));
        ASSERT_OK(r.status);
        rev = r.res.revision;
    }
    ASSERT_GT(rev, resume);
    char args[64];
    snprintf(args, sizeof(args), "compact --physical %lld", (long long)rev);
    ASSERT_EQ(fx_etcdctl(&et, args), 0);
    relay = fx_proxy_start(&et, port);

    ASSERT_MSG(fx_run_until_fn(etcd_loop(e), compacted_reread, &ws, 10000),
               "no re-read after the compaction (%d resets, %d events)",
               ws.resets, ws.n_events);
    etcd_stats_t st;
    etcd_stats(e, &st);
    ASSERT_EQ(st.watch_compacted, 1);
    ASSERT_GE(st.watch_streams, 2);
    ASSERT_EQ(ws.resets, 2);
    ASSERT_EQ(ws.n_keys, 5);
    ASSERT_EQ(ws.n_events, 0); /* compacted history is not replayed */
    ASSERT_GE(ws.last_rev, rev);
    /* And the watch carries on from the re-read. */
    r = CALL(wr, etcd_put(wr, "/c/5", "v", 1, 0, on_reply, rp_));
    ASSERT_OK(r.status);
    wait_events(e, &ws, 1);
    ASSERT_EQ(ws.last_rev, r.res.revision);
    ASSERT_EQ(ws.bad_order, 0);
    etcd_watch_stop(w);
    etcd_destroy(e);
    etcd_destroy(wr);
    fx_proxy_stop(relay);
    return fx_done();
}

TEST_IMPL(etcd_failover)
{
    fx_etcd_t et = {0};
    fx_etcd_start(&et, 0);
    char eps[256];
    int dead = th_free_port();
    snprintf(eps, sizeof(eps), "http://127.0.0.1:%d,%s", dead, et.url);
    etcd_config_t cfg = {.endpoints = eps};
    etcd_t *e;
    ASSERT_OK(etcd_create(NULL, &cfg, &e));
    reply_t r = CALL(e, etcd_put(e, "/f", "1", 1, 0, on_reply, rp_));
    ASSERT_OK(r.status);
    /* Everything down: a clear error, within the timeouts. */
    fx_etcd_kill(&et);
    int64_t t0 = th_now_ms();
    r = CALL(e, etcd_get(e, "/f", 0, on_reply, rp_));
    ASSERT_EQ(r.status, ST_EUNAVAIL);
    ASSERT_LT(th_now_ms() - t0, 5000);
    etcd_destroy(e);

    etcd_config_t bad = {.endpoints = "ftp://x"};
    ASSERT_EQ(etcd_create(NULL, &bad, &e), ST_ECONFIG);
    return fx_done();
}

/*
 * The fixture against a port taken between its probe and etcd's bind:
 * the test listens on a port and hands it to the fixture as the client
 * port. etcd exits ("address already in use"); the fixture starts it on
 * other ports, and it serves there.
 */
TEST_IMPL(etcd_fixture_port_taken)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    ASSERT_OK(bind(fd, (struct sockaddr *)&a, sizeof(a)));
    ASSERT_OK(listen(fd, 1));
    ASSERT_OK(getsockname(fd, (struct sockaddr *)&a, &len));
    int busy = ntohs(a.sin_port);
    fx_etcd_t et = {0};
    fx_etcd_start_on(&et, 0, busy, th_free_port());
    close(fd);
    ASSERT(et.cport != busy);
    etcd_t *e = connect_to(&et);
    reply_t r = CALL(e, etcd_put(e, "/p", "1", 1, 0, on_reply, rp_));
    ASSERT_OK(r.status);
    r = CALL(e, etcd_get(e, "/p", 0, on_reply, rp_));
    ASSERT_OK(r.status);
    ASSERT_STR_EQ(r.value, "1");
    etcd_destroy(e);
    return fx_done();
}

/* ---- TLS and auth ---- */

static int put_get(etcd_t *e)
{
    reply_t r = CALL(e, etcd_put(e, "/s/k", "v", 1, 0, on_reply, rp_));
    if (r.status != 0)
        return r.status;
    r = CALL(e, etcd_get(e, "/s/k", 0, on_reply, rp_));
    if (r.status == 0)
        ASSERT_STR_EQ(r.value, "v");
    return r.status;
}

TEST_IMPL(etcd_tls)
{
    fx_etcd_t et = {0};
    fx_etcd_start(&et, 1);
    char ca[512], cert[512], key[512];
    snprintf(ca, sizeof(ca), "%s", fx_path(&et, "ca.crt"));
    snprintf(cert, sizeof(cert), "%s", fx_path(&et, "client.crt"));
    snprintf(key, sizeof(key), "%s", fx_path(&et, "client.key"));
    etcd_config_t cfg = {.endpoints = et.url, .ca_file = ca,
                         .cert_file = cert, .key_file = key};
    etcd_t *e;
    ASSERT_OK(etcd_create(NULL, &cfg, &e));
    ASSERT_OK(put_get(e));
    /* A watch streams over TLS too. */
    wstate_t ws = {0};
    etcd_watch_t *w;
    ASSERT_OK(etcd_watch_start(e, "/s/", on_watch, &ws, &w));
    ASSERT(fx_run_until(etcd_loop(e), &ws.resets, 10000));
    reply_t r = CALL(e, etcd_put(e, "/s/k2", "v", 1, 0, on_reply, rp_));
    ASSERT_OK(r.status);
    wait_events(e, &ws, 1);
    etcd_watch_stop(w);
    etcd_destroy(e);

    /* No client certificate, or a CA that did not sign the server. */
    etcd_config_t nocert = {.endpoints = et.url, .ca_file = ca};
    ASSERT_OK(etcd_create(NULL, &nocert, &e));
    ASSERT_NE(put_get(e), 0);
    etcd_destroy(e);
    etcd_config_t wrongca = {.endpoints = et.url, .ca_file = cert,
                             .cert_file = cert, .key_file = key};
    ASSERT_OK(etcd_create(NULL, &wrongca, &e));
    ASSERT_EQ(put_get(e), -EACCES);
    etcd_destroy(e);
    return fx_done();
}

static int never_(void *p)
{
    (void)p;
    return 0;
}

TEST_IMPL(etcd_auth)
{
    fx_etcd_t et = {0};
    snprintf(et.extra[0], sizeof(et.extra[0]), "--auth-token-ttl=1");
    et.n_extra = 1;
    fx_etcd_start(&et, 0);
    ASSERT_EQ(fx_etcdctl(&et, "user add root:rootpw"), 0);
    ASSERT_EQ(fx_etcdctl(&et, "auth enable"), 0);

    etcd_config_t cfg = {.endpoints = et.url, .user = "root",
                         .password = "rootpw"};
    etcd_t *e;
    ASSERT_OK(etcd_create(NULL, &cfg, &e));
    ASSERT_OK(put_get(e));
    etcd_stats_t st;
    etcd_stats(e, &st);
    ASSERT_EQ(st.auth_requests, 1);
    ASSERT_EQ(st.auth_expired, 0);

    /*
     * Let the token expire: etcd drops a simple token unused for its TTL
     * (1 s), checking once a second. Nothing announces the expiry, and
     * every use renews the token, so each round idles 2.5 s and then
     * makes one call; a loaded etcd gets a few rounds.
     */
    for (int round = 0; round < 5 && st.auth_expired == 0; round++) {
        fx_run_until_fn(etcd_loop(e), never_, NULL, 2500);
        ASSERT_OK(put_get(e));
        etcd_stats(e, &st);
    }
    ASSERT_MSG(st.auth_expired == 1, "token never expired (%llu)",
               (unsigned long long)st.auth_expired);
    ASSERT_EQ(st.auth_requests, 2); /* one fresh token, used since */
    etcd_destroy(e);

    etcd_config_t wrong = {.endpoints = et.url, .user = "root",
                           .password = "nope"};
    ASSERT_OK(etcd_create(NULL, &wrong, &e));
    ASSERT_EQ(put_get(e), -EACCES);
    etcd_destroy(e);
    etcd_config_t none = {.endpoints = et.url};
    ASSERT_OK(etcd_create(NULL, &none, &e));
    ASSERT_NE(put_get(e), 0);
    etcd_destroy(e);
    return fx_done();
}
