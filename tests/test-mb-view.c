/*
 * test-mb-view.c - membership: the state machine and view rule on their own,
 * then views against a real etcd: the neighbours' records a view needs
 * (compact views) and the leader's retries of a view write.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zstd.h>

#include "membership/mb-int.h"
#include "membership/mb.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/mb-members.h"
#include "tests/task.h"

/* ---- pure parts ---- */

TEST_IMPL(mb_state_machine)
{
    mb_state_t s;
    ASSERT_OK(mb_state_next(MB_IDLE, MB_EV_START, &s));
    ASSERT_EQ(s, MB_REGISTERING);
    ASSERT_OK(mb_state_next(s, MB_EV_REGISTERED, &s));
    ASSERT_EQ(s, MB_JOINING);
    ASSERT_OK(mb_state_next(s, MB_EV_IN_VIEW, &s));
    ASSERT_EQ(s, MB_ACTIVE);
    ASSERT_OK(mb_state_next(s, MB_EV_LEASE_LOST, &s));
    ASSERT_EQ(s, MB_FENCED);
    ASSERT_EQ(mb_state_next(s, MB_EV_IN_VIEW, &s), ST_EINVAL);
    ASSERT_OK(mb_state_next(s, MB_EV_RETRY, &s));
    ASSERT_EQ(s, MB_REGISTERING);
    ASSERT_EQ(mb_state_next(MB_REGISTERING, MB_EV_DRAIN, &s), ST_EINVAL);
    ASSERT_OK(mb_state_next(MB_ACTIVE, MB_EV_DRAIN, &s));
    ASSERT_EQ(s, MB_DRAINING);
    ASSERT_OK(mb_state_next(s, MB_EV_IN_VIEW, &s));
    ASSERT_EQ(s, MB_DRAINING);
    ASSERT_OK(mb_state_next(s, MB_EV_LEAVE, &s));
    ASSERT_EQ(s, MB_LEAVING);
    ASSERT_EQ(mb_state_next(s, MB_EV_LEAVE, &s), ST_EINVAL);
    ASSERT_OK(mb_state_next(s, MB_EV_LEFT, &s));
    ASSERT_EQ(s, MB_LEFT);
    for (int ev = MB_EV_START; ev <= MB_EV_LEFT; ev++)
        ASSERT_EQ(mb_state_next(MB_LEFT, (mb_event_t)ev, &s), ST_EINVAL);
    ASSERT_EQ(mb_state_next(MB_IDLE, MB_EV_LEAVE, &s), ST_EINVAL);
    ASSERT_STR_EQ(mb_state_name(MB_DRAINING), "DRAINING");
    return fx_done();
}

static mb_member_t mk(const char *node, const char *host, int64_t lease)
{
    mb_member_t m = {node, host, (const uint8_t *)"ad", 2, 1, lease, 0};
    return m;
}

static void order(const mb__view_t *v, char *out, size_t n)
{
    out[0] = '\0';
    for (size_t i = 0; i < v->n_members; i++) {
        strncat(out, v->members[i].node, n - strlen(out) - 1);
        strncat(out, v->members[i].joiner ? "* " : " ",
                n - strlen(out) - 1);
    }
}

TEST_IMPL(mb_view_rule)
{
    mb__view_t v0 = {.source_index = -1}, v1, v2, v3, back;
    char s[256];
    mb_member_t a[] = {mk("d", "h2", 4), mk("a", "h1", 1), mk("c", "h2", 3),
                       mk("b", "h1", 2)};
    ASSERT_EQ(mb__view_next(&v0, a, 4, 7, &v1), 1);
    order(&v1, s, sizeof(s));
    ASSERT_STR_EQ(s, "a b c d ");
    ASSERT_EQ(v1.generation, 1);
    ASSERT_EQ(v1.step, 7);
    ASSERT_EQ(v1.source_index, -1);
    ASSERT_EQ(mb__view_next(&v1, a, 4, 7, &v2), 0); /* no change */

    /* b dies, e joins on h1: e goes where h1's members are. */
    mb_member_t b[] = {a[0], a[1], a[2], mk("e", "h1", 5), mk("f", "h3", 6)};
    ASSERT_EQ(mb__view_next(&v1, b, 5, 9, &v2), 1);
    order(&v2, s, sizeof(s));
    ASSERT_STR_EQ(s, "a e* c d f* ");
    ASSERT_EQ(v2.n_joiners, 2);
    ASSERT_EQ(v2.source_index, 0);

    /* A re-registered node (new lease) is a new member. */
    mb_member_t c[] = {mk("a", "h1", 11), b[2], b[0], b[3], b[4]};
    ASSERT_EQ(mb__view_next(&v2, c, 5, 9, &v3), 1);
    order(&v3, s, sizeof(s));
    ASSERT_STR_EQ(s, "e a* c d f ");
    ASSERT_EQ(v3.source_index, 0);

    /* JSON round trip. */
    char *json = mb__view_json(&v3);
    ASSERT_OK(mb__view_parse(json, strlen(json), &back));
    char s2[256];
    order(&back, s2, sizeof(s2));
    ASSERT_STR_EQ(s2, s);
    ASSERT_EQ(back.generation, 3);
    ASSERT_EQ(back.members[1].lease, 11);
    ASSERT_STR_EQ(back.members[1].host, "h1");
    ASSERT_EQ(back.members[1].joiner, 1);
    ASSERT_EQ(back.source_index, v3.source_index);
    ASSERT_EQ(back.members[1].addr_len, 0); /* in the node record */
    mb__view_free(&back);
    free(json);
    const char *bad[] = {"", "[]", "{\"generation\":0}",
                         "{\"generation\":1,\"step\":0,\"hosts\":[],"
                         "\"members\":[{}],\"joiners\":[]}",
                         "{\"generation\":1,\"step\":0,\"hosts\":[],"
                         "\"members\":[],\"joiners\":[0]}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ASSERT_EQ(mb__view_parse(bad[i], strlen(bad[i]), &back) < 0, 1);
    mb__view_free(&v1);
    mb__view_free(&v2);
    mb__view_free(&v3);
    return fx_done();
}

/*
 * A view of 1000 members, as the leader writes it (signed, node ids and
 * hosts as a big job names them, leases as etcd grants them: consecutive
 * ids in the order the nodes registered, which is not the ring's), goes
 * out packed and small: every watcher receives it at each view change
 * (bench/README.md), and the plain table was 45 KB.
 */
TEST_IMPL(mb_view_size_1000)
{
    enum { N = 1000 };
    mb__view_t v0 = {.source_index = -1}, v1, back;
    mb_member_t *alive = calloc(N, sizeof(*alive));
    char (*names)[32] = calloc(N, sizeof(*names));
    char (*hosts)[40] = calloc(N, sizeof(*hosts));
    ASSERT(alive != NULL && names != NULL && hosts != NULL);
    /* The order the nodes registered in: a shuffle (Fisher-Yates, a
     * fixed LCG), as unrelated to the ring order as a big job's start. */
    int *reg = calloc(N, sizeof(*reg));
    ASSERT(reg != NULL);
    uint32_t x = 12345;
    for (int i = 0; i < N; i++)
        reg[i] = i;
    for (int i = N - 1; i > 0; i--) {
        x = x * 1664525u + 1013904223u;
        int j = (int)((x >> 8) % (uint32_t)(i + 1)), t = reg[i];
        reg[i] = reg[j];
        reg[j] = t;
    }
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "node-%04d", i);
        snprintf(hosts[i], sizeof(hosts[i]), "gpu-host-%03d.rack-%02d",
                 i / 8, i / 64);
        alive[i] = mk(names[i], hosts[i], 0x694d7a3b1c2e4000LL + reg[i]);
        alive[i].slots = 8;
    }
    free(reg);
    ASSERT_EQ(mb__view_next(&v0, alive, N, 123456789, &v1), 1);
    /* Every member a joiner but the first: the longest joiner list. */
    for (int i = 1; i < N; i++)
        v1.members[i].joiner = 1;
    v1.n_joiners = N - 1;
    v1.source_index = 0;
    v1.generation = 987654;
    char *json = mb__view_json(&v1);
    ASSERT(json != NULL);
    size_t len = strlen(json) + 76; /* the signature field */
    fprintf(stderr, "mb_view_size_1000: view of %d members: %zu bytes "
            "(limit 7680)\n", N, len);
    ASSERT(strstr(json, "\"packed\":\"") != NULL);
    ASSERT(strstr(json, "\"members\"") == NULL);
    ASSERT(len < 7680);
    ASSERT_OK(mb__view_parse(json, strlen(json), &back));
    ASSERT_EQ(back.n_members, N);
    ASSERT_EQ(back.n_joiners, N - 1);
    for (int i = 0; i < N; i++) {
        ASSERT_STR_EQ(back.members[i].node, v1.members[i].node);
        ASSERT_STR_EQ(back.members[i].host, v1.members[i].host);
        ASSERT_EQ(back.members[i].lease, v1.members[i].lease);
        ASSERT_EQ(back.members[i].slots, 8);
    }
    mb__view_free(&back);
    /* The view after a failure: the same members, no joiners. */
    for (int i = 0; i < N; i++)
        v1.members[i].joiner = 0;
    v1.n_joiners = 0;
    free(json);
    json = mb__view_json(&v1);
    ASSERT(json != NULL);
    len = strlen(json) + 76;
    fprintf(stderr, "mb_view_size_1000: without joiners: %zu bytes\n", len);
    ASSERT(len < 6144);
    mb__view_free(&v1);
    free(json);
    free(alive);
    free(names);
    free(hosts);
    return fx_done();
}

/* {"generation":1,"step":0,<extra>"packed":"<base64 of the first n bytes
 * of zstd(text)>"}, with the frame's content size written or not; n < 0:
 * the whole frame. malloc'd. */
static char *packed_view(const char *extra, const void *text, size_t len,
                         int content_size, long n)
{
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    size_t cap = ZSTD_compressBound(len);
    void *z = malloc(cap);
    ASSERT(cc != NULL && z != NULL);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, content_size);
    size_t zn = ZSTD_compress2(cc, z, cap, text, len);
    ASSERT(!ZSTD_isError(zn));
    char *b64 = etcd_b64_dup(z, n >= 0 && (size_t)n < zn ? (size_t)n : zn);
    size_t vcap = strlen(b64) + strlen(extra) + 64;
    char *v = malloc(vcap);
    ASSERT(b64 != NULL && v != NULL);
    snprintf(v, vcap, "{\"generation\":1,\"step\":0,%s\"packed\":\"%s\"}",
             extra, b64);
    free(b64);
    free(z);
    ZSTD_freeCCtx(cc);
    return v;
}

/*
 * The packed member table: a view of 100 members goes out packed (its
 * options plain beside it) and parses back member for member, a view of
 * 3 stays plain; a packed field that is not a string, not base64, not a
 * zstd frame, a frame cut short,
 * one without its content size or that decompresses to more than the
 * cap (a zstd bomb: a table padded to 9 MiB, in 300 bytes), a table
 * that is not an object, lacks a column or has columns of unequal
 * lengths, lacks hosts or holds a bad member, and a view with both a
 * packed and a plain table are each refused, each for its own reason.
 */
/* 3 members stay plain; 100 go out packed, options plain beside them,
 * and parse back member for member. */
static void packed_round_trip(void)
{
    enum { N = 100 };
    mb__view_t v0 = {.source_index = -1}, v1, back;
    mb_member_t alive[N];
    char names[N][16];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "n%d", i);
        alive[i] = mk(names[i], i < 50 ? "ha" : "hb", 1000 + (i * 7) % N);
    }
    ASSERT_EQ(mb__view_next(&v0, alive, 3, 5, &v1), 1);
    char *json = mb__view_json(&v1);
    ASSERT(json != NULL && strstr(json, "\"members\":[[") != NULL &&
           strstr(json, "packed") == NULL);
    free(json);
    mb__view_free(&v1);
    ASSERT_EQ(mb__view_next(&v0, alive, N, 5, &v1), 1);
    v1.members[7].joiner = 1;
    v1.n_joiners = 1;
    v1.source_index = 3;
    ASSERT_OK(mb__view_set_opts(&v1, "{\"chunk_kb\":64}"));
    json = mb__view_json(&v1);
    ASSERT(json != NULL && strstr(json, "\"packed\":\"") != NULL &&
           strstr(json, "members") == NULL);
    /* The job's options stay in the plain header. */
    ASSERT(strstr(json, "\"opts\":{\"chunk_kb\":64}") != NULL);
    ASSERT_OK(mb__view_parse(json, strlen(json), &back));
    ASSERT(back.opts != NULL && strstr(back.opts, "chunk_kb") != NULL);
    ASSERT_EQ(back.n_members, N);
    ASSERT_EQ(back.n_joiners, 1);
    ASSERT_EQ(back.members[7].joiner, 1);
    ASSERT_EQ(back.source_index, 3);
    for (int i = 0; i < N; i++) {
        ASSERT_STR_EQ(back.members[i].node, v1.members[i].node);
        ASSERT_STR_EQ(back.members[i].host, v1.members[i].host);
        ASSERT_EQ(back.members[i].lease, v1.members[i].lease);
    }
    mb__view_free(&back);
    free(json);
    mb__view_free(&v1);
}

static const char packed_table[] =
    "{\"hosts\":[\"h\"],\"node\":[\"n1\"],\"host\":[0],"
    "\"lease\":[\"a\"],\"slots\":[1],\"joiners\":[]}";

/* Leases absolute in hex, or as numbers above lease0. */
static void packed_leases(void)
{
    mb__view_t back;
    const char *table = packed_table;
    char *good = packed_view("", table, strlen(table), 1, -1);
    ASSERT_OK(mb__view_parse(good, strlen(good), &back));
    ASSERT_EQ(back.n_members, 1);
    ASSERT_EQ(back.members[0].lease, 10);
    mb__view_free(&back);
    free(good);
    /* Leases as numbers above lease0, or absolute in hex. */
    const char *deltas = "{\"hosts\":[\"h\"],\"lease0\":\"a\","
                         "\"node\":[\"n1\",\"n2\"],\"host\":[0,0],"
                         "\"lease\":[5,\"b\"],\"slots\":[1,1],\"joiners\":[]}";
    good = packed_view("", deltas, strlen(deltas), 1, -1);
    ASSERT_OK(mb__view_parse(good, strlen(good), &back));
    ASSERT_EQ(back.n_members, 2);
    ASSERT_EQ(back.members[0].lease, 15);
    ASSERT_EQ(back.members[1].lease, 11);
    mb__view_free(&back);
    free(good);
}

/* Each malformed packed table is refused for its own reason. */
static void packed_refusals(void)
{
    const char *table = packed_table;
    size_t tl = strlen(table);
    /* A good table but for 9 MiB of padding: 300 bytes packed. */
    size_t bomb_len = 9u << 20;
    char *bomb = malloc(bomb_len);
    ASSERT(bomb != NULL);
    int hl = snprintf(bomb, bomb_len, "%.*s,\"pad\":\"", (int)tl - 1, table);
    memset(bomb + hl, 'x', bomb_len - (size_t)hl - 2);
    memcpy(bomb + bomb_len - 2, "\"}", 2);
    const char *bad_member = "{\"hosts\":[\"h\"],\"node\":[5],\"host\":[0],"
                             "\"lease\":[\"a\"],\"slots\":[1],"
                             "\"joiners\":[]}";
    const char *ragged = "{\"hosts\":[\"h\"],\"node\":[\"n1\",\"n2\"],"
                         "\"host\":[0],\"lease\":[\"a\",\"b\"],"
                         "\"slots\":[1,1],\"joiners\":[]}";
    const char *cols = "packed member columns missing, of unequal lengths";
    const char *no_hosts = "{\"node\":[],\"host\":[],\"lease\":[],"
                           "\"slots\":[],\"joiners\":[]}";
    /* A number lease without lease0, below it, not whole, past 2^63. */
    const char *bad_lease[] = {
        "{\"hosts\":[\"h\"],\"node\":[\"n1\"],\"host\":[0],"
        "\"lease\":[5],\"slots\":[1],\"joiners\":[]}",
        "{\"hosts\":[\"h\"],\"lease0\":\"a\",\"node\":[\"n1\"],\"host\":[0],"
        "\"lease\":[-1],\"slots\":[1],\"joiners\":[]}",
        "{\"hosts\":[\"h\"],\"lease0\":\"a\",\"node\":[\"n1\"],\"host\":[0],"
        "\"lease\":[1.5],\"slots\":[1],\"joiners\":[]}",
        "{\"hosts\":[\"h\"],\"lease0\":\"7fffffffffffffff\",\"node\":[\"n1\"],"
        "\"host\":[0],\"lease\":[1],\"slots\":[1],\"joiners\":[]}",
    };
    const char *pk = "packed is not base64 of a zstd frame";
    struct {
        char *view;
        const char *why;
    } bad[] = {
        {strdup("{\"generation\":1,\"step\":0,\"packed\":5}"), pk},
        {strdup("{\"generation\":1,\"step\":0,\"packed\":\"!!!!\"}"), pk},
        {strdup("{\"generation\":1,\"step\":0,"
                "\"packed\":\"aGVsbG8gd29ybGQ=\"}"), pk},
        {packed_view("", table, tl, 1, 20), pk},
        {packed_view("", table, tl, 0, -1), pk},
        {packed_view("", bomb, bomb_len, 1, -1), pk},
        {packed_view("", "[1,2]", 5, 1, -1), pk},
        {packed_view("", bad_member, strlen(bad_member), 1, -1),
         "a member that is not"},
        {packed_view("", "{\"hosts\":[]}", 12, 1, -1), cols},
        {packed_view("", ragged, strlen(ragged), 1, -1), cols},
        {packed_view("", no_hosts, strlen(no_hosts), 1, -1),
         "of the wrong type"},
        {packed_view("\"members\":[],", table, tl, 1, -1),
         "packed and plain member tables both"},
        {packed_view("", bad_lease[0], strlen(bad_lease[0]), 1, -1), cols},
        {packed_view("", bad_lease[1], strlen(bad_lease[1]), 1, -1), cols},
        {packed_view("", bad_lease[2], strlen(bad_lease[2]), 1, -1), cols},
        {packed_view("", bad_lease[3], strlen(bad_lease[3]), 1, -1), cols},
    };
    free(bomb);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        mb_view_t *pv = NULL;
        const char *why = "";
        ASSERT(bad[i].view != NULL);
        ASSERT_MSG(mb_view_parse(bad[i].view, strlen(bad[i].view), &pv,
                                 &why) < 0 && pv == NULL,
                   "bad packed view %zu parsed", i);
        ASSERT_MSG(strstr(why, bad[i].why) != NULL,
                   "bad packed view %zu: '%s', not '%s'", i, why,
                   bad[i].why);
        free(bad[i].view);
    }
}

TEST_IMPL(mb_view_packed)
{
    packed_round_trip();
    packed_leases();
    packed_refusals();
    char *small = packed_view("", packed_table, strlen(packed_table), 1, -1);
    ASSERT(small != NULL && strlen(small) < 200);
    free(small);
    return fx_done();
}

/*
 * 20 live members form a view whose table goes to etcd packed (the view
 * key as etcdctl reads it has "packed" and no "members"), and every
 * member installs it with the same 20 members in order.
 */
TEST_IMPL(mb_view_packed_live)
{
    enum { N = 20 };
    setup();
    member_t *m = calloc(N, sizeof(*m));
    member_t *all[N];
    char list[128] = "", name[16];
    ASSERT(m != NULL);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "n%d", 10 + i);
        start_member(&m[i], name, "h", 5, N);
        all[i] = &m[i];
        strcat(list, name);
        strcat(list, " ");
    }
    wait_view(all, N, list, 1, 30000);
    ASSERT_EQ(fx_etcdctl(&etcd_, "get /ringd/test/view --print-value-only"),
              0);
    const char *log = fx_path(&etcd_, "etcdctl.log");
    ASSERT(td_file_has(log, "\"packed\":\""));
    ASSERT(!td_file_has(log, "\"members\""));
    teardown(m, N);
    free(m);
    return fx_done();
}

/* ---- compact views: addresses from the neighbours' records ---- */


typedef struct {
    member_t *m;
    uint64_t gen;
    int64_t min_mod;
} bad_pred_t;

/* Both members logged view gen unusable because of n9's record at
 * min_mod or later (0: missing). */
static int both_refused(void *p)
{
    bad_pred_t *b = p;
    for (int i = 0; i < 2; i++) {
        const mb_bad_peer_t *bad = &b[i].m->mb->bad;
        if (bad->gen != b[i].gen || strcmp(bad->node, "n9") != 0 ||
            bad->mod < b[i].min_mod)
            return 0;
    }
    return 1;
}

static void view_for(char *out, size_t n, member_t *m, int64_t lease9)
{
    snprintf(out, n, "{\"generation\":100,\"step\":0,\"hosts\":[\"h\"],"
             "\"members\":[[\"n1\",0,\"%llx\",1],[\"n2\",0,\"%llx\",1],"
             "[\"n3\",0,\"%llx\",1],[\"n9\",0,\"%llx\",1]],\"joiners\":[]}",
             (unsigned long long)mb_lease(m[0].mb),
             (unsigned long long)mb_lease(m[1].mb),
             (unsigned long long)mb_lease(m[2].mb),
             (unsigned long long)lease9);
}

/* The leader writes no view for the rest of the test: a settle already
 * scheduled (after view 1) is cancelled too. */
static void stretch_settle(mb_t *mb)
{
    mb->settle_ms = 600000;
    uv_timer_stop(&mb->settle_timer);
}

/*
 * A view names n9 (a real lease, as a registered node would hold), but
 * n9's record is missing, then garbage: n9's ring neighbours n1 and n3
 * say the view is unusable and wait, unharmed (no crash, no fence, the
 * view they run stays installed); n2, not a neighbour, installs it. When
 * a valid record appears, n1 and n3 install the view with n9's address.
 * The leader's settle time is stretched so that it does not replace the
 * view first.
 */
TEST_IMPL(mb_view_peer_record)
{
    setup();
    member_t m[3];
    start_member(&m[0], "n1", "h", 6, 3);
    start_member(&m[1], "n2", "h", 6, 3);
    start_member(&m[2], "n3", "h", 6, 3);
    member_t *all[] = {&m[0], &m[1], &m[2]};
    wait_view(all, 3, "n1 n2 n3 ", 1, 10000);
    for (int i = 0; i < 3; i++)
        stretch_settle(m[i].mb);
    etcd_config_t ecfg = {.endpoints = etcd_.url};
    etcd_t *e;
    ASSERT_OK(etcd_create(&loop, &ecfg, &e));
    put_reply_t g = {0};
    ASSERT_OK(etcd_lease_grant(e, 60, on_put_reply, &g));
    ASSERT(fx_run_until(&loop, &g.done, 10000));
    ASSERT_OK(g.status);
    char view[512], key[MB_KEY_MAX], rec[256];
    view_for(view, sizeof(view), m, g.lease);
    put_wait(e, "/ringd/test/view", view, 0);

    member_t *n2[] = {&m[1]};
    wait_view(n2, 1, "n1 n2 n3 n9 ", 100, 10000);
    bad_pred_t b[2] = {{&m[0], 100, 0}, {&m[2], 100, 0}};
    ASSERT(fx_run_until_fn(&loop, both_refused, b, 10000));
    ASSERT_EQ(last_gen(&m[0]), 1);
    ASSERT_EQ(last_gen(&m[2]), 1);

    /* Garbage where the record should be, under its lease. */
    ASSERT_OK(mb_key(key, sizeof(key), "test", MB_KEY_NODE, "n9", 0, 0));
    b[0].min_mod = b[1].min_mod = put_wait(e, key, "{not json", g.lease);
    ASSERT(fx_run_until_fn(&loop, both_refused, b, 10000));
    ASSERT_EQ(last_gen(&m[0]), 1);
    ASSERT_EQ(last_gen(&m[2]), 1);

    /* The record appears: the view becomes usable. */
    char *b64 = etcd_b64_dup("ucx-addr-of-n9", 14);
    ASSERT(b64 != NULL);
    snprintf(rec, sizeof(rec), "{\"host\":\"h\",\"addr\":\"%s\",\"lease\":"
             "\"%lld\",\"slots\":1,\"pid\":1,\"version\":1}", b64,
             (long long)g.lease);
    free(b64);
    put_wait(e, key, rec, g.lease);
    wait_view(all, 3, "n1 n2 n3 n9 ", 100, 10000);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(m[i].fenced, 0);
        ASSERT_EQ(mb_state(m[i].mb), MB_ACTIVE);
    }
    ASSERT_EQ(m[1].n_views, 2); /* installed once */
    etcd_destroy(e);
    teardown(m, 3);
    return fx_done();
}

/*
 * A member whose peers callback names every member (as a grid names its
 * rows) gets every address in on_view, read in one txn. A view naming n9
 * away from its ring neighbours, n9's record missing: that member waits
 * (unusable, logged), the others install it; n9's record appears and it
 * reads it again and installs the view.
 */
TEST_IMPL(mb_view_peers_callback)
{
    setup();
    member_t m[5];
    const char *names[] = {"n1", "n2", "n3", "n4", "n5"};
    for (int i = 0; i < 5; i++) {
        start_all_peers = i == 0;
        start_member(&m[i], names[i], "h", 6, 5);
    }
    start_all_peers = 0;
    member_t *all[] = {&m[0], &m[1], &m[2], &m[3], &m[4]};
    wait_view(all, 5, "n1 n2 n3 n4 n5 ", 1, 10000);
    for (int i = 0; i < 5; i++)
        stretch_settle(m[i].mb);
    etcd_config_t ecfg = {.endpoints = etcd_.url};
    etcd_t *e;
    ASSERT_OK(etcd_create(&loop, &ecfg, &e));
    put_reply_t g = {0};
    ASSERT_OK(etcd_lease_grant(e, 60, on_put_reply, &g));
    ASSERT(fx_run_until(&loop, &g.done, 10000));
    ASSERT_OK(g.status);
    char view[512], key[MB_KEY_MAX], rec[256];
    snprintf(view, sizeof(view), "{\"generation\":100,\"step\":0,\"hosts\":"
             "[\"h\"],\"members\":[[\"n1\",0,\"%llx\",1],[\"n2\",0,\"%llx\",1],"
             "[\"n3\",0,\"%llx\",1],[\"n9\",0,\"%llx\",1],[\"n4\",0,\"%llx\",1],"
             "[\"n5\",0,\"%llx\",1]],\"joiners\":[]}",
             (unsigned long long)mb_lease(m[0].mb),
             (unsigned long long)mb_lease(m[1].mb),
             (unsigned long long)mb_lease(m[2].mb),
             (unsigned long long)g.lease,
             (unsigned long long)mb_lease(m[3].mb),
             (unsigned long long)mb_lease(m[4].mb));
    put_wait(e, "/ringd/test/view", view, 0);
    member_t *n2[] = {&m[1], &m[4]}; /* n9's neighbours are n3 and n4 */
    wait_view(n2, 2, "n1 n2 n3 n9 n4 n5 ", 100, 10000);
    bad_pred_t b[2] = {{&m[0], 100, 0}, {&m[0], 100, 0}};
    ASSERT(fx_run_until_fn(&loop, both_refused, b, 10000));
    ASSERT_EQ(last_gen(&m[0]), 1);

    ASSERT_OK(mb_key(key, sizeof(key), "test", MB_KEY_NODE, "n9", 0, 0));
    char *b64 = etcd_b64_dup("ucx-addr-of-n9", 14);
    ASSERT(b64 != NULL);
    snprintf(rec, sizeof(rec), "{\"host\":\"h\",\"addr\":\"%s\",\"lease\":"
             "\"%lld\",\"slots\":1,\"pid\":1,\"version\":1}", b64,
             (long long)g.lease);
    free(b64);
    put_wait(e, key, rec, g.lease);
    member_t *n1[] = {&m[0]};
    wait_view(n1, 1, "n1 n2 n3 n9 n4 n5 ", 100, 10000);
    ASSERT_EQ(m[0].n_views, 2);
    ASSERT_EQ(m[0].fenced, 0);
    etcd_destroy(e);
    teardown(m, 5);
    return fx_done();
}


typedef struct {
    mb_t *leader;
    char key[MB_KEY_MAX];
} gone_pred_t;

/* Gone from the leader's watch of every record, the one it writes views
 * from (a neighbour's own watch of the record may see it first). */
static int record_gone(void *p)
{
    gone_pred_t *g = p;
    const mb_mirror_t *s = &g->leader->mirrors[MB_W_NODES];
    for (size_t i = 0; i < s->n_kvs; i++)
        if (strcmp(s->kvs[i].key, g->key) == 0)
            return 0;
    return s->synced;
}

/* How many lines of the file at path contain needle (all with NULL). */
static int count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        n += needle == NULL || strstr(line, needle) != NULL;
    if (f != NULL)
        fclose(f);
    return n;
}

static void dump_head(const char *path, int n)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    while (f != NULL && n-- > 0 && fgets(line, sizeof(line), f) != NULL)
        fputs(line, stderr);
    if (f != NULL)
        fclose(f);
}

/*
 * The leader must write a view (a member's lease was revoked) just as
 * etcd dies: its
 * view txn fails for as long as etcd is gone. Retries back off to one a
 * second and log "leader writes view" once, and the whole log of the 3 s
 * outage stays a few dozen lines (the retries once came a settle time
 * apart, 10 ms: hundreds of lines). When etcd is back the view is
 * written.
 */
TEST_IMPL(mb_view_retry_backoff)
{
    setup();
    member_t m[2];
    start_member(&m[0], "n1", "h", 30, 2);
    start_member(&m[1], "n2", "h", 30, 2);
    member_t *all[] = {&m[0], &m[1]};
    wait_view(all, 2, "n1 n2 ", 1, 10000);
    int l = leader_index(m, 2);
    ASSERT_GE(l, 0);
    gone_pred_t g = {.leader = m[l].mb};
    ASSERT_OK(mb_key(g.key, sizeof(g.key), "test", MB_KEY_NODE,
                     m[1 - l].name, 0, 0));
    /* The other member goes (its lease revoked while the loop stands
     * still); the leader's settle timer starts in the loop turn that
     * brings the deletion, and etcd is dead before the next one. */
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "lease revoke %llx",
             (unsigned long long)mb_lease(m[1 - l].mb));
    stop_member(&m[1 - l]);
    ASSERT_OK(fx_etcdctl(&etcd_, cmd));
    ASSERT(fx_run_until_fn(&loop, record_gone, &g, 5000));
    fx_etcd_kill(&etcd_);

    /* The outage's log, captured. */
    char path[600];
    snprintf(path, sizeof(path), "%s", fx_path(&etcd_, "outage.log"));
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(saved, 0);
    ASSERT_GE(fd, 0);
    ASSERT_GE(dup2(fd, 2), 0);
    close(fd);
    int never = 0;
    fx_run_until(&loop, &never, 3000);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    int writes = count_lines(path, "leader writes view");
    int txns = count_lines(path, "/v3/kv/txn");
    int lines = count_lines(path, NULL);
    fprintf(stderr, "outage: %d view writes logged, %d txn failure lines, "
            "%d log lines\n", writes, txns, lines);
    if (lines > 80)
        dump_head(path, 40);
    ASSERT_GE(txns, 1); /* the write was tried during the outage */
    ASSERT_EQ(writes, 1); /* tries after the first are debug */
    ASSERT_LE(txns, 20); /* 1 s apart at most: 2 lines per try */
    ASSERT_LE(lines, 80);

    fx_etcd_restart(&etcd_);
    member_t *leader[] = {&m[l]};
    wait_view(leader, 1, l == 0 ? "n1 " : "n2 ", 2, 15000);
    teardown(m, 2);
    return fx_done();
}
