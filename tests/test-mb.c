/*
 * test-mb.c - membership: the state machine and view rule on their own,
 * then several members (mb_t on one loop) against a real etcd.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "membership/mb-int.h"
#include "membership/mb.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
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
 * hosts as a big job names them, leases as etcd grants them), stays far
 * under etcd's request limit: < 64 KiB.
 */
TEST_IMPL(mb_view_size_1000)
{
    enum { N = 1000 };
    mb__view_t v0 = {.source_index = -1}, v1, back;
    mb_member_t *alive = calloc(N, sizeof(*alive));
    char (*names)[32] = calloc(N, sizeof(*names));
    char (*hosts)[40] = calloc(N, sizeof(*hosts));
    ASSERT(alive != NULL && names != NULL && hosts != NULL);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "node-%04d", i);
        snprintf(hosts[i], sizeof(hosts[i]), "gpu-host-%03d.rack-%02d",
                 i / 8, i / 64);
        alive[i] = mk(names[i], hosts[i], 0x694d7a3b1c2e4000LL + i);
        alive[i].slots = 8;
    }
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
            "(limit 65536)\n", N, len);
    ASSERT(len < 65536);
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
    mb__view_free(&v1);
    free(json);
    free(alive);
    free(names);
    free(hosts);
    return fx_done();
}

/* ---- members against etcd ---- */

#define MAX_VIEWS 64

typedef struct {
    char name[16];
    mb_t *mb;
    int n_views;
    uint64_t gens[MAX_VIEWS];
    char lists[MAX_VIEWS][128];
    char joiners[MAX_VIEWS][128];
    int joiner[MAX_VIEWS];
    int source[MAX_VIEWS];
    uint64_t steps[MAX_VIEWS];
    int fenced, drained, left;
    int leave_on_drain;
    int all_peers;           /* its peers callback names every member */
} member_t;

static int start_all_peers; /* start_member's next member: all_peers */

static uv_loop_t loop;
static fx_etcd_t etcd_;

/* on_view carries the addresses of this node and its ring neighbours,
 * read from their records (start_member's "ucx-addr-of-<node>"), and no
 * other: a member reads only the records of the peers it connects to. */
static void check_addrs(const mb_view_t *v, int all_peers)
{
    size_t n = v->n_members, me = (size_t)v->my_index;
    for (size_t k = 0; k < n; k++) {
        const mb_member_t *m = &v->members[k];
        int peer = all_peers || k == me || k == (me + 1) % n ||
                   k == (me + n - 1) % n;
        if (!peer) {
            ASSERT_EQ(m->addr_len, 0);
            continue;
        }
        ASSERT_GT(m->addr_len, 0);
        char want[64];
        snprintf(want, sizeof(want), "ucx-addr-of-%s", m->node);
        if (m->addr_len > 12 && memcmp(m->addr, want, 12) == 0)
            ASSERT(m->addr_len == strlen(want) &&
                   memcmp(m->addr, want, m->addr_len) == 0);
    }
}

static void on_view(const mb_view_t *v, void *data)
{
    member_t *m = data;
    ASSERT(m->n_views < MAX_VIEWS);
    ASSERT(v->my_index >= 0 && (size_t)v->my_index < v->n_members);
    ASSERT_STR_EQ(v->members[v->my_index].node, m->name);
    if (m->n_views > 0)
        ASSERT_GT(v->generation, m->gens[m->n_views - 1]);
    check_addrs(v, m->all_peers);
    int i = m->n_views++;
    m->gens[i] = v->generation;
    m->joiner[i] = v->members[v->my_index].joiner;
    m->source[i] = v->source_index;
    m->steps[i] = v->step;
    m->lists[i][0] = m->joiners[i][0] = '\0';
    for (size_t k = 0; k < v->n_members; k++) {
        strcat(m->lists[i], v->members[k].node);
        strcat(m->lists[i], " ");
        if (v->members[k].joiner) {
            strcat(m->joiners[i], v->members[k].node);
            strcat(m->joiners[i], " ");
        }
    }
}

static void on_fenced(int reason, void *data)
{
    member_t *m = data;
    ASSERT_EQ(reason, ST_EFENCED);
    m->fenced++;
}

static void on_left(int status, void *data)
{
    member_t *m = data;
    ASSERT_OK(status);
    m->left = 1;
}

static void on_drain(void *data)
{
    member_t *m = data;
    m->drained++;
    if (m->leave_on_drain)
        ASSERT_OK(mb_leave(m->mb));
}

/* The peers callback of an all_peers member: every other member. */
static size_t all_peers(const mb_view_t *v, size_t *idx, size_t max,
                        void *data)
{
    member_t *m = data;
    size_t n = 0;
    ASSERT(m->all_peers);
    for (size_t i = 0; i < v->n_members && n < max; i++) {
        ASSERT_EQ(v->members[i].addr_len, 0);
        if ((int)i != v->my_index)
            idx[n++] = i;
    }
    return n;
}

static int ride_outage_; /* the next start_member's mb_config_t */

static void start_member(member_t *m, const char *name, const char *host,
                         int ttl, int min_members)
{
    memset(m, 0, sizeof(*m));
    m->all_peers = start_all_peers;
    snprintf(m->name, sizeof(m->name), "%s", name);
    char addr[32];
    snprintf(addr, sizeof(addr), "ucx-addr-of-%s", name);
    mb_config_t cfg = {.job = "test", .node = name, .host = host,
                       .addr = addr, .addr_len = strlen(addr), .slots = 1,
                       .ttl_s = ttl, .min_members = min_members,
                       .etcd = {.endpoints = etcd_.url},
                       .ride_outage = ride_outage_};
    mb_callbacks_t cb = {on_view, on_fenced, on_drain, on_left,
                         m->all_peers ? all_peers : NULL};
    ASSERT_OK(mb_create(&loop, &cfg, &cb, m, &m->mb));
    ASSERT_OK(mb_start(m->mb));
}

static void stop_member(member_t *m)
{
    mb_destroy(m->mb);
    m->mb = NULL;
}

static const char *last_list(const member_t *m)
{
    return m->n_views ? m->lists[m->n_views - 1] : "";
}

typedef struct {
    member_t **ms;
    int n;
    const char *list; /* every member's last view has this list */
    uint64_t min_gen;
} views_pred_t;

static int all_have(void *p)
{
    views_pred_t *vp = p;
    for (int i = 0; i < vp->n; i++) {
        const member_t *m = vp->ms[i];
        if (m->n_views == 0 || m->gens[m->n_views - 1] < vp->min_gen ||
            strcmp(last_list(m), vp->list) != 0)
            return 0;
    }
    return 1;
}

/* Run until every member in ms installed a view listing exactly list. */
static void wait_view(member_t **ms, int n, const char *list,
                      uint64_t min_gen, int64_t timeout_ms)
{
    views_pred_t vp = {ms, n, list, min_gen};
    if (!fx_run_until_fn(&loop, all_have, &vp, timeout_ms)) {
        for (int i = 0; i < n; i++)
            fprintf(stderr, "%s: %d views, last '%s'\n", ms[i]->name,
                    ms[i]->n_views, last_list(ms[i]));
        TEST_FAIL_("no view '%s' within %lld ms", list,
                   (long long)timeout_ms);
    }
}

static int all_gen(void *p)
{
    views_pred_t *vp = p;
    for (int i = 0; i < vp->n; i++)
        if (vp->ms[i]->n_views == 0 ||
            vp->ms[i]->gens[vp->ms[i]->n_views - 1] < vp->min_gen)
            return 0;
    return 1;
}

/* Run until every member in ms installed generation min_gen or later. */
static void wait_gen(member_t **ms, int n, uint64_t min_gen,
                     int64_t timeout_ms)
{
    views_pred_t vp = {ms, n, NULL, min_gen};
    ASSERT_MSG(fx_run_until_fn(&loop, all_gen, &vp, timeout_ms),
               "no view %llu within %lld ms", (unsigned long long)min_gen,
               (long long)timeout_ms);
}

static uint64_t last_gen(const member_t *m)
{
    return m->n_views ? m->gens[m->n_views - 1] : 0;
}

static void setup(void)
{
    ASSERT_OK(uv_loop_init(&loop));
    fx_etcd_start(&etcd_, 0);
}

static void teardown(member_t *ms, int n)
{
    for (int i = 0; i < n; i++)
        mb_destroy(ms[i].mb);
    fx_loop_drain(&loop);
    ASSERT_OK(uv_loop_close(&loop));
}

static int leader_index(member_t *ms, int n)
{
    int idx = -1, count = 0;
    for (int i = 0; i < n; i++)
        if (ms[i].mb && mb_is_leader(ms[i].mb)) {
            idx = i;
            count++;
        }
    ASSERT_LE(count, 1);
    return idx;
}

TEST_IMPL(mb_three_form_view)
{
    setup();
    member_t m[3];
    start_member(&m[0], "n1", "hostB", 2, 3);
    start_member(&m[1], "n2", "hostA", 2, 3);
    start_member(&m[2], "n3", "hostB", 2, 3);
    member_t *all[] = {&m[0], &m[1], &m[2]};
    wait_view(all, 3, "n2 n1 n3 ", 1, 10000);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(m[i].n_views, 1);
        ASSERT_EQ(m[i].gens[0], 1);
        ASSERT_EQ(m[i].source[0], -1);
        ASSERT_EQ(mb_state(m[i].mb), MB_ACTIVE);
    }
    ASSERT(leader_index(m, 3) >= 0);
    teardown(m, 3);
    return fx_done();
}

/* A member that stops renewing (a crash) leaves the view within
 * TTL + 1 s; the leader dying gets a new leader and view. */
static void crash_one(int kill_leader)
{
    setup();
    member_t m[3];
    start_member(&m[0], "n1", "h", 2, 3);
    start_member(&m[1], "n2", "h", 2, 3);
    start_member(&m[2], "n3", "h", 2, 3);
    member_t *all[] = {&m[0], &m[1], &m[2]};
    wait_view(all, 3, "n1 n2 n3 ", 1, 10000);
    int leader = leader_index(m, 3);
    ASSERT(leader >= 0);
    int victim = kill_leader ? leader : (leader + 1) % 3;
    member_t *rest[2];
    char list[64] = "";
    for (int i = 0, k = 0; i < 3; i++)
        if (i != victim) {
            rest[k++] = &m[i];
            strcat(list, m[i].name);
            strcat(list, " ");
        }
    int64_t t0 = th_now_ms();
    stop_member(&m[victim]);
    wait_view(rest, 2, list, 2, 2000 + 1000 + 500);
    int64_t dt = th_now_ms() - t0;
    fprintf(stderr, "view without %s after %lld ms\n", m[victim].name,
            (long long)dt);
    ASSERT_LE(dt, 2000 + 1000 + 500); /* TTL + 1 s (+ one keepalive gap) */
    int nl = leader_index(m, 3);
    ASSERT(nl >= 0 && nl != victim);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(rest[i]->n_views, 2);
        ASSERT_EQ(rest[i]->source[1], 0);
    }
    teardown(m, 3);
}

TEST_IMPL(mb_member_crash)
{
    crash_one(0);
    return fx_done();
}

TEST_IMPL(mb_leader_dies)
{
    crash_one(1);
    return fx_done();
}

TEST_IMPL(mb_join)
{
    setup();
    member_t m[3];
    start_member(&m[0], "n1", "h1", 2, 2);
    start_member(&m[1], "n2", "h2", 2, 2);
    member_t *all[] = {&m[0], &m[1], &m[2]};
    wait_view(all, 2, "n1 n2 ", 1, 10000);
    mb_set_step(m[0].mb, 42);
    mb_set_step(m[1].mb, 42);
    start_member(&m[2], "n3", "h1", 2, 1);
    wait_view(all, 3, "n1 n3 n2 ", 2, 5000);
    ASSERT_EQ(m[0].steps[1], 42); /* the leader put its step in the view */
    ASSERT_EQ(m[2].steps[0], 42);
    ASSERT_EQ(m[2].n_views, 1);
    ASSERT_EQ(m[2].joiner[0], 1);
    ASSERT_EQ(m[0].joiner[1], 0);
    ASSERT_EQ(m[2].source[0], 0);
    teardown(m, 3);
    return fx_done();
}

/* Suspicion removes a live node in well under its TTL; the evicted node
 * notices (fenced) and comes back as a new member. */
TEST_IMPL(mb_suspect)
{
    setup();
    member_t m[3];
    start_member(&m[0], "n1", "h", 5, 3);
    start_member(&m[1], "n2", "h", 5, 3);
    start_member(&m[2], "n3", "h", 5, 3);
    member_t *all[] = {&m[0], &m[1], &m[2]};
    wait_view(all, 3, "n1 n2 n3 ", 1, 10000);
    int leader = leader_index(m, 3);
    int victim = (leader + 1) % 3, reporter = (leader + 2) % 3;
    member_t *rest[] = {&m[leader], &m[reporter]};
    char list[64];
    snprintf(list, sizeof(list), "%s %s ",
             m[leader < reporter ? leader : reporter].name,
             m[leader < reporter ? reporter : leader].name);
    ASSERT_EQ(mb_suspect(m[reporter].mb, "nobody", "?"), ST_EINVAL);
    int64_t t0 = th_now_ms();
    ASSERT_OK(mb_suspect(m[reporter].mb, m[victim].name, "endpoint reset"));
    /* View 2 drops the suspect's incarnation. The evicted node may already
     * be back in it as a new member (a joiner) when it re-registered
     * within the leader's settle time. */
    wait_gen(rest, 2, 2, 1000);
    fprintf(stderr, "view without suspect after %lld ms\n",
            (long long)(th_now_ms() - t0));
    for (int i = 0; i < 2; i++)
        ASSERT(strstr(rest[i]->lists[1], m[victim].name) == NULL ||
               strstr(rest[i]->joiners[1], m[victim].name) != NULL);
    ASSERT(fx_run_until(&loop, &m[victim].fenced, 3000));
    /* Back as a new member: placed after the survivors on its host. */
    strcat(list, m[victim].name);
    strcat(list, " ");
    wait_view(all, 3, list, 2, 5000);
    ASSERT_EQ(m[victim].joiner[m[victim].n_views - 1], 1);
    teardown(m, 3);
    return fx_done();
}

/* A dead leader cannot act on a suspicion of itself: the reporter
 * revokes its lease, so the view without it comes long before its TTL
 * (30 s here, longer than the wait) and another member leads. */
TEST_IMPL(mb_suspect_leader)
{
    setup();
    member_t m[3];
    start_member(&m[0], "n1", "h", 30, 3);
    start_member(&m[1], "n2", "h", 30, 3);
    start_member(&m[2], "n3", "h", 30, 3);
    member_t *all[] = {&m[0], &m[1], &m[2]};
    wait_view(all, 3, "n1 n2 n3 ", 1, 10000);
    int leader = leader_index(m, 3);
    ASSERT(leader >= 0);
    int reporter = (leader + 1) % 3, other = (leader + 2) % 3;
    member_t *rest[] = {&m[reporter], &m[other]};
    stop_member(&m[leader]); /* dead: it revokes nothing */
    ASSERT_OK(mb_suspect(m[reporter].mb, m[leader].name, "endpoint reset"));
    wait_gen(rest, 2, 2, 5000);
    for (int i = 0; i < 2; i++)
        ASSERT(strstr(rest[i]->lists[1], m[leader].name) == NULL);
    int nl = leader_index(m, 3);
    ASSERT(nl == reporter || nl == other);
    teardown(m, 3);
    return fx_done();
}

static int no_reshape_keys(void *arg)
{
    (void)arg;
    return fx_etcdctl(&etcd_, "get --prefix /ringd/test/reshape/ "
                              "--keys-only | grep -q .") == 1;
}

/* A reshape request gives every member a new generation of the same
 * member list: no joiner, nobody fenced. Malformed and foreign requests
 * change nothing and are removed. */
TEST_IMPL(mb_reshape)
{
    setup();
    member_t m[3];
    start_member(&m[0], "n1", "h", 5, 3);
    start_member(&m[1], "n2", "h", 5, 3);
    ASSERT_EQ(mb_request_view(m[0].mb, "too early"), ST_EINVAL);
    start_member(&m[2], "n3", "h", 5, 3);
    member_t *all[] = {&m[0], &m[1], &m[2]};
    wait_view(all, 3, "n1 n2 n3 ", 1, 10000);
    int leader = leader_index(m, 3);
    int asker = (leader + 1) % 3;
    ASSERT_OK(mb_request_view(m[asker].mb, "trainer lost"));
    wait_gen(all, 3, 2, 3000);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(m[i].n_views, 2);
        ASSERT_STR_EQ(m[i].lists[1], "n1 n2 n3 ");
        ASSERT_STR_EQ(m[i].joiners[1], "");
        ASSERT_EQ(m[i].source[1], 0);
        ASSERT_EQ(m[i].fenced, 0);
        ASSERT_EQ(mb_state(m[i].mb), MB_ACTIVE);
    }
    /* The leader may ask too. */
    ASSERT_OK(mb_request_view(m[leader].mb, "again"));
    wait_gen(all, 3, 3, 3000);
    /* Hostile keys: garbage, a stale generation, a non-member. None may
     * make a view; the next real request still works and gets view 4. */
    ASSERT_OK(fx_etcdctl(&etcd_, "put /ringd/test/reshape/n1 'not json'"));
    ASSERT_OK(fx_etcdctl(&etcd_,
                         "put /ringd/test/reshape/n2 '{\"gen\":\"1\"}'"));
    ASSERT_OK(fx_etcdctl(&etcd_,
                         "put /ringd/test/reshape/zz '{\"gen\":\"3\"}'"));
    ASSERT(fx_run_until_fn(&loop, no_reshape_keys, NULL, 5000));
    /* The leader deleted them in the pass that would have written a
     * view: give such a view time to show up (none may). */
    int never = 0;
    fx_run_until(&loop, &never, 300);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(last_gen(&m[i]), 3);
    ASSERT_OK(mb_request_view(m[asker].mb, "third"));
    wait_gen(all, 3, 4, 3000);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(m[i].n_views, 4);
        ASSERT_EQ(last_gen(&m[i]), 4);
    }
    teardown(m, 3);
    return fx_done();
}

TEST_IMPL(mb_drain)
{
    setup();
    member_t m[3];
    start_member(&m[0], "n1", "h", 2, 3);
    start_member(&m[1], "n2", "h", 2, 3);
    start_member(&m[2], "n3", "h", 2, 3);
    m[1].leave_on_drain = 1;
    member_t *all[] = {&m[0], &m[1], &m[2]};
    wait_view(all, 3, "n1 n2 n3 ", 1, 10000);
    ASSERT_EQ(fx_etcdctl(&etcd_, "put /ringd/test/drain/n2 scale-down"),
              0);
    ASSERT(fx_run_until(&loop, &m[1].left, 3000));
    ASSERT_EQ(m[1].drained, 1);
    ASSERT_EQ(mb_state(m[1].mb), MB_LEFT);
    member_t *rest[] = {&m[0], &m[2]};
    wait_view(rest, 2, "n1 n3 ", 2, 1000);
    ASSERT_EQ(fx_etcdctl(&etcd_, "get --prefix /ringd/test/drain/ "
                                 "--print-value-only | grep -q ."), 1);
    teardown(m, 3);
    return fx_done();
}

/* etcd restarts under running members: the watches resume, and every
 * member sees the same views, none missed or doubled. */
TEST_IMPL(mb_etcd_restart)
{
    setup();
    member_t m[4];
    start_member(&m[0], "n1", "h", 6, 3);
    start_member(&m[1], "n2", "h", 6, 3);
    start_member(&m[2], "n3", "h", 6, 3);
    member_t *all[] = {&m[0], &m[1], &m[2], &m[3]};
    wait_view(all, 3, "n1 n2 n3 ", 1, 10000);
    fx_etcd_kill(&etcd_);
    fx_etcd_restart(&etcd_);
    start_member(&m[3], "n4", "h", 6, 1);
    wait_view(all, 4, "n1 n2 n3 n4 ", 2, 8000);
    fx_etcd_kill(&etcd_);
    fx_etcd_restart(&etcd_);
    ASSERT_OK(mb_leave(m[3].mb));
    wait_view(all, 3, "n1 n2 n3 ", 3, 8000);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(m[i].fenced, 0);
        ASSERT_EQ(m[i].n_views, 3);
        for (int k = 0; k < 3; k++) {
            ASSERT_EQ(m[i].gens[k], (uint64_t)k + 1);
            ASSERT_STR_EQ(m[i].lists[k], m[0].lists[k]);
        }
    }
    teardown(m, 4);
    return fx_done();
}

/* ---- compact views: addresses from the neighbours' records ---- */

typedef struct {
    int done, status;
    int64_t lease, mod;
} put_reply_t;

static void on_put_reply(int status, const etcd_result_t *res, void *data)
{
    put_reply_t *r = data;
    r->status = status;
    if (status == 0 && res != NULL) {
        r->lease = res->lease_id;
        r->mod = res->revision;
    }
    r->done = 1;
}

/* A put through e on the test loop; returns the reply's revision. */
static int64_t put_wait(etcd_t *e, const char *key, const char *val,
                        int64_t lease)
{
    put_reply_t r = {0};
    ASSERT_OK(etcd_put(e, key, val, strlen(val), lease, on_put_reply, &r));
    ASSERT(fx_run_until(&loop, &r.done, 10000));
    ASSERT_OK(r.status);
    return r.mod;
}

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

/* ---- narrow watches ---- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* The watched keys of m, each "=key" or "key*" (prefix), sorted. */
static void watch_set(mb_t *mb, char *out, size_t n)
{
    const char *keys[MB_W_N];
    int prefix[MB_W_N];
    size_t k = mb__watched(mb, keys, prefix, MB_W_N);
    char items[MB_W_N][MB_KEY_MAX + 2];
    for (size_t i = 0; i < k; i++)
        snprintf(items[i], sizeof(items[i]), "%s%s", keys[i] + 12,
                 prefix[i] ? "*" : "");
    qsort(items, k, sizeof(items[0]), cmp_str);
    out[0] = '\0';
    for (size_t i = 0; i < k; i++) {
        strncat(out, items[i], n - strlen(out) - 1);
        strncat(out, " ", n - strlen(out) - 1);
    }
}

typedef struct {
    member_t *m;
    uint64_t want[4];
} events_pred_t;

static int events_reached(void *p)
{
    events_pred_t *ep = p;
    for (int i = 0; i < 4; i++)
        if (ep->m[i].mb->events < ep->want[i])
            return 0;
    return 1;
}

/*
 * Four members n1..n4 (ring order). A non-leader watches exactly its own
 * record, the view, the leader key, its drain key and its two ring
 * neighbours' records; the leader adds the records, suspects and reshape
 * prefixes, and nobody watches checkpoint records. Twenty checkpoint
 * part records, a manifest and another node's drain key then reach no
 * member: the next event each gets is the view's rewrite that follows
 * them.
 */
TEST_IMPL(mb_watch_narrow)
{
    setup();
    member_t m[4];
    const char *names[] = {"n1", "n2", "n3", "n4"};
    for (int i = 0; i < 4; i++)
        start_member(&m[i], names[i], "h", 6, 4);
    member_t *all[] = {&m[0], &m[1], &m[2], &m[3]};
    wait_view(all, 4, "n1 n2 n3 n4 ", 1, 10000);
    int l = leader_index(m, 4);
    ASSERT_GE(l, 0);
    char got[1024], want[1024];
    for (int i = 0; i < 4; i++) {
        const char *me = names[i], *left = names[(i + 3) % 4],
                   *right = names[(i + 1) % 4];
        /* sorted: drain, leader, node records by name, view */
        const char *a = strcmp(left, right) < 0 ? left : right;
        const char *b = strcmp(left, right) < 0 ? right : left;
        const char *n[3] = {a, b, me};
        for (int x = 0; x < 3; x++)
            for (int y = x + 1; y < 3; y++)
                if (strcmp(n[x], n[y]) > 0) {
                    const char *t = n[x];
                    n[x] = n[y];
                    n[y] = t;
                }
        snprintf(want, sizeof(want), "drain/%s leader %snodes/%s nodes/%s "
                 "nodes/%s %sview ", me, i == l ? "nodes/* " : "", n[0],
                 n[1], n[2], i == l ? "reshape/* suspect/* " : "");
        watch_set(m[i].mb, got, sizeof(got));
        ASSERT_STR_EQ(got, want);
    }

    etcd_config_t ecfg = {.endpoints = etcd_.url};
    etcd_t *e;
    ASSERT_OK(etcd_create(&loop, &ecfg, &e));
    events_pred_t ep = {m, {0}};
    for (int i = 0; i < 4; i++)
        ep.want[i] = m[i].mb->events + 1;
    char key[MB_KEY_MAX];
    for (uint32_t r = 0; r < 20; r++) {
        ASSERT_OK(mb_key(key, sizeof(key), "test", MB_KEY_CKPT_PART, NULL,
                         40, r));
        put_wait(e, key, "{\"part\":1}", 0);
    }
    ASSERT_OK(mb_key(key, sizeof(key), "test", MB_KEY_CKPT, NULL, 40, 0));
    put_wait(e, key, "{\"manifest\":1}", 0);
    ASSERT_OK(mb_key(key, sizeof(key), "test", MB_KEY_DRAIN, "n7", 0, 0));
    put_wait(e, key, "x", 0);
    /* The marker: the view as it is, written again (no new generation). */
    mb_kv_t *v = mb__mirror_find(m[0].mb, "/ringd/test/view");
    ASSERT(v != NULL);
    char *val = strdup(v->val);
    put_wait(e, "/ringd/test/view", val, 0);
    free(val);
    ASSERT(fx_run_until_fn(&loop, events_reached, &ep, 10000));
    for (int i = 0; i < 4; i++)
        ASSERT_MSG(m[i].mb->events == ep.want[i],
                   "%s got %llu watch events besides the view's rewrite",
                   names[i],
                   (unsigned long long)(m[i].mb->events - ep.want[i] + 1));
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(m[i].n_views, 1);
    etcd_destroy(e);
    teardown(m, 4);
    return fx_done();
}

/*
 * Seven members, TTL 60 s; three that do not lead crash at once (their
 * leases stay: only the suspicions can remove them) and each is
 * reported by the next live member in ring order, as its ring neighbour
 * would. The leader writes one view for all the suspects it holds: every
 * survivor's next view, or the one after (a report that came while the
 * first view's txn was out), lists exactly the survivors, long before
 * the leases could expire.
 */
TEST_IMPL(mb_multi_kill)
{
    enum { N = 7, DEAD = 3 };
    setup();
    member_t m[N];
    const char *names[N] = {"n1", "n2", "n3", "n4", "n5", "n6", "n7"};
    for (int i = 0; i < N; i++)
        start_member(&m[i], names[i], "h", 60, N);
    member_t *all[N];
    for (int i = 0; i < N; i++)
        all[i] = &m[i];
    wait_view(all, N, "n1 n2 n3 n4 n5 n6 n7 ", 1, 15000);
    int l = leader_index(m, N);
    ASSERT_GE(l, 0);
    int dead[N] = {0}, k = 0;
    for (int i = 0; i < N && k < DEAD; i++)
        if (i != l) {
            dead[i] = 1;
            k++;
        }
    uint64_t g = last_gen(&m[l]);
    member_t *alive[N];
    int n_alive = 0;
    char list[128] = "";
    for (int i = 0; i < N; i++) {
        if (dead[i])
            continue;
        alive[n_alive++] = &m[i];
        strcat(list, names[i]);
        strcat(list, " ");
    }
    for (int i = 0; i < N; i++)
        if (dead[i])
            stop_member(&m[i]);
    for (int i = 0; i < N; i++) {
        if (!dead[i])
            continue;
        int r = (i + 1) % N;
        while (dead[r])
            r = (r + 1) % N;
        ASSERT_OK(mb_suspect(m[r].mb, names[i], "ring endpoint failed"));
    }
    /* Bounded far below the TTL: only the suspicions can do this. */
    wait_view(alive, n_alive, list, g + 1, 10000);
    for (int i = 0; i < n_alive; i++) {
        const member_t *s = alive[i];
        ASSERT_LE(last_gen(s), g + 2);
        ASSERT_LE(s->n_views, 3);
        ASSERT_EQ(s->fenced, 0);
    }
    teardown(m, N);
    return fx_done();
}

typedef struct {
    member_t *m;
    int leader;
} switch_pred_t;

/* Member sp->leader watches the leader's prefixes (synced) and no other
 * member watches any prefix. */
static int watches_follow(void *p)
{
    switch_pred_t *sp = p;
    for (int i = 0; i < 4; i++) {
        char got[1024];
        watch_set(sp->m[i].mb, got, sizeof(got));
        int has = strstr(got, "nodes/* ") != NULL &&
                  strstr(got, "suspect/* ") != NULL &&
                  strstr(got, "reshape/* ") != NULL;
        if (i == sp->leader ? !has || !mb__leader_synced(sp->m[i].mb)
                            : strchr(got, '*') != NULL)
            return 0;
    }
    return 1;
}

/*
 * The leader key moves to another member (put over it, under that
 * member's lease, as a new election would leave it): the old leader
 * stops its leader watches, the new one starts them, and it does the
 * leader's work: a member that leaves is out of the next view.
 */
TEST_IMPL(mb_watch_leader_switch)
{
    setup();
    member_t m[4];
    const char *names[] = {"n1", "n2", "n3", "n4"};
    for (int i = 0; i < 4; i++)
        start_member(&m[i], names[i], "h", 6, 4);
    member_t *all[] = {&m[0], &m[1], &m[2], &m[3]};
    wait_view(all, 4, "n1 n2 n3 n4 ", 1, 10000);
    int l = leader_index(m, 4);
    ASSERT_GE(l, 0);
    switch_pred_t sp = {m, l};
    ASSERT(fx_run_until_fn(&loop, watches_follow, &sp, 10000));
    int nl = (l + 1) % 4, gone = (l + 2) % 4;
    etcd_config_t ecfg = {.endpoints = etcd_.url};
    etcd_t *e;
    ASSERT_OK(etcd_create(&loop, &ecfg, &e));
    put_wait(e, "/ringd/test/leader", names[nl], mb_lease(m[nl].mb));
    sp.leader = nl;
    ASSERT(fx_run_until_fn(&loop, watches_follow, &sp, 10000));
    ASSERT(!mb_is_leader(m[l].mb));
    ASSERT(mb_is_leader(m[nl].mb));
    ASSERT_OK(mb_leave(m[gone].mb));
    char list[64] = "";
    member_t *rest[3];
    int k = 0;
    for (int i = 0; i < 4; i++) {
        if (i == gone)
            continue;
        rest[k++] = &m[i];
        strcat(list, names[i]);
        strcat(list, " ");
    }
    wait_view(rest, 3, list, 2, 10000);
    etcd_destroy(e);
    teardown(m, 4);
    return fx_done();
}

/* etcd gone for longer than the TTL: every member fences itself, then
 * re-registers and a new view forms when etcd is back. */
TEST_IMPL(mb_fence_rejoin)
{
    setup();
    member_t m[2];
    start_member(&m[0], "n1", "h", 2, 2);
    start_member(&m[1], "n2", "h", 2, 2);
    member_t *all[] = {&m[0], &m[1]};
    wait_view(all, 2, "n1 n2 ", 1, 10000);
    int64_t lease0 = mb_lease(m[0].mb);
    fx_etcd_kill(&etcd_);
    int64_t t0 = th_now_ms();
    ASSERT(fx_run_until(&loop, &m[0].fenced, 2000 + 1500));
    ASSERT(fx_run_until(&loop, &m[1].fenced, 1000));
    fprintf(stderr, "fenced %lld ms after etcd died\n",
            (long long)(th_now_ms() - t0));
    ASSERT(mb_state(m[0].mb) == MB_REGISTERING ||
           mb_state(m[0].mb) == MB_FENCED);
    fx_etcd_restart(&etcd_);
    wait_view(all, 2, "n1 n2 ", last_gen(&m[0]) + 1, 10000);
    ASSERT_NE(mb_lease(m[0].mb), lease0);
    ASSERT_EQ(mb_state(m[0].mb), MB_ACTIVE);
    teardown(m, 2);
    return fx_done();
}

/* Stands in for the ring backend's collectives: both members report
 * one every 200 ms. */
static void on_collective(uv_timer_t *t)
{
    member_t *m = t->data;
    for (int i = 0; i < 2; i++)
        mb_ring_progress(m[i].mb);
}

/*
 * ride_outage (the ring backend's setting): etcd down past the TTL fences
 * neither member of a view of two while their collectives go on; both
 * keep ACTIVE, their leases and view 1, and mb_lease_valid stays 1. etcd
 * restarted on its data dir renews the same leases: no new view. Down
 * again, and the collectives stop: both fence, within a TTL of the last.
 */
TEST_IMPL(mb_ride_outage)
{
    setup();
    member_t m[2];
    ride_outage_ = 1;
    start_member(&m[0], "n1", "h", 2, 2);
    start_member(&m[1], "n2", "h", 2, 2);
    ride_outage_ = 0;
    member_t *all[] = {&m[0], &m[1]};
    wait_view(all, 2, "n1 n2 ", 1, 10000);
    uv_timer_t coll;
    uv_timer_init(&loop, &coll);
    coll.data = m;
    uv_timer_start(&coll, on_collective, 0, 200);
    int64_t lease[2] = {mb_lease(m[0].mb), mb_lease(m[1].mb)};
    fx_etcd_kill(&etcd_);
    /* Past every deadline: TTL after the last renewal, with a margin. */
    int any = 0;
    ASSERT(!fx_run_until(&loop, &any, 2000 + 1500));
    for (int i = 0; i < 2; i++) {
        ASSERT_MSG(!m[i].fenced, "%s fenced with etcd down", m[i].name);
        ASSERT_EQ(mb_state(m[i].mb), MB_ACTIVE);
        ASSERT_EQ(mb_lease_valid(m[i].mb), 1);
    }
    fx_etcd_restart(&etcd_);
    ASSERT(!fx_run_until(&loop, &any, 2000));
    for (int i = 0; i < 2; i++) {
        ASSERT(!m[i].fenced);
        ASSERT_EQ(mb_lease(m[i].mb), lease[i]);
        ASSERT_EQ(m[i].n_views, 1);
    }
    fx_etcd_kill(&etcd_);
    ASSERT(!fx_run_until(&loop, &any, 2000 + 500));
    ASSERT(!m[0].fenced && !m[1].fenced);
    uv_timer_stop(&coll);
    int64_t t0 = th_now_ms();
    ASSERT_MSG(fx_run_until(&loop, &m[0].fenced, 2000 + 1000) &&
                   fx_run_until(&loop, &m[1].fenced, 500),
               "collectives stopped, etcd down: still riding it out");
    fprintf(stderr, "fenced %lld ms after the last collective\n",
            (long long)(th_now_ms() - t0));
    uv_close((uv_handle_t *)&coll, NULL);
    teardown(m, 2);
    return fx_done();
}

/* A member alone in its view has no collective to fence it: with
 * ride_outage it still fences at its lease deadline. */
TEST_IMPL(mb_ride_outage_alone)
{
    setup();
    member_t m[1];
    ride_outage_ = 1;
    start_member(&m[0], "n1", "h", 2, 1);
    ride_outage_ = 0;
    member_t *all[] = {&m[0]};
    wait_view(all, 1, "n1 ", 1, 10000);
    fx_etcd_kill(&etcd_);
    ASSERT_MSG(fx_run_until(&loop, &m[0].fenced, 2000 + 1500),
               "a lone member rode out the outage");
    teardown(m, 1);
    return fx_done();
}

static void on_leader_key(const etcd_watch_update_t *up, void *data)
{
    int *seen = data;
    for (size_t i = 0; i < up->n_kvs; i++)
        *seen |= strcmp(up->kvs[i].value, "n1") == 0;
    for (size_t i = 0; i < up->n_events; i++)
        *seen |= !up->events[i].is_delete &&
                 strcmp(up->events[i].kv.value, "n1") == 0;
}

/* The leader is a separate process killed with SIGKILL: the survivors
 * elect a new leader and install a view without it within TTL + 1 s. */
TEST_IMPL(mb_leader_sigkill)
{
    setup();
    pid_t child = fork();
    ASSERT(child >= 0);
    if (child == 0) {
        /* The leader: its own loop, runs until killed. */
        uv_loop_t l;
        uv_loop_init(&l);
        member_t m;
        memset(&m, 0, sizeof(m));
        snprintf(m.name, sizeof(m.name), "n1");
        mb_config_t cfg = {.job = "test", .node = "n1", .host = "h",
                           .addr = "a", .addr_len = 1, .ttl_s = 2,
                           .min_members = 3,
                           .etcd = {.endpoints = etcd_.url}};
        mb_callbacks_t cb = {on_view, on_fenced, on_drain, on_left};
        if (mb_create(&l, &cfg, &cb, &m, &m.mb) != 0 || mb_start(m.mb))
            _exit(1);
        uv_run(&l, UV_RUN_DEFAULT);
        _exit(1);
    }
    /* Start the others once n1 holds the leader key. */
    etcd_config_t ecfg = {.endpoints = etcd_.url};
    etcd_t *e;
    etcd_watch_t *w;
    int seen = 0;
    ASSERT_OK(etcd_create(&loop, &ecfg, &e));
    ASSERT_OK(etcd_watch_start(e, "/ringd/test/leader", on_leader_key,
                               &seen, &w));
    ASSERT(fx_run_until(&loop, &seen, 10000));
    etcd_watch_stop(w);
    etcd_destroy(e);
    member_t m[2];
    start_member(&m[0], "n2", "h", 2, 3);
    start_member(&m[1], "n3", "h", 2, 3);
    member_t *all[] = {&m[0], &m[1]};
    wait_view(all, 2, "n1 n2 n3 ", 1, 10000);
    int64_t t0 = th_now_ms();
    kill(child, SIGKILL);
    int st;
    ASSERT_OK(th_wait(child, 5000, &st));
    wait_view(all, 2, "n2 n3 ", 2, 3500);
    fprintf(stderr, "view without the killed leader after %lld ms\n",
            (long long)(th_now_ms() - t0));
    ASSERT(leader_index(m, 2) >= 0);
    teardown(m, 2);
    return fx_done();
}

static int n1_or_n2_leads(void *p)
{
    member_t *m = p;
    return mb_is_leader(m[0].mb) || mb_is_leader(m[1].mb);
}

/* One member loses etcd (its relay is cut) while the others write two
 * views; when it is back within its TTL, its resumed watch delivers both
 * writes and it installs the newest, without fencing. View 2 is not
 * installed: it names n4 as a neighbour, whose record is gone (it left),
 * so it cannot be built, and view 3 has replaced it anyway. */
TEST_IMPL(mb_watch_catch_up)
{
    setup();
    int port = th_free_port();
    pid_t relay = fx_proxy_start(&etcd_, port);
    member_t m[4];
    start_member(&m[0], "n1", "h", 6, 3);
    start_member(&m[1], "n2", "h", 6, 3);
    ASSERT(fx_run_until_fn(&loop, n1_or_n2_leads, m, 10000));
    /* n3 reaches etcd through the relay. */
    memset(&m[2], 0, sizeof(m[2]));
    snprintf(m[2].name, sizeof(m[2].name), "n3");
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    mb_config_t cfg = {.job = "test", .node = "n3", .host = "h",
                       .addr = "a", .addr_len = 1, .ttl_s = 6,
                       .min_members = 3, .etcd = {.endpoints = url}};
    mb_callbacks_t cb = {on_view, on_fenced, on_drain, on_left};
    ASSERT_OK(mb_create(&loop, &cfg, &cb, &m[2], &m[2].mb));
    ASSERT_OK(mb_start(m[2].mb));
    member_t *all[] = {&m[0], &m[1], &m[2], &m[3]};
    wait_view(all, 3, "n1 n2 n3 ", 1, 10000);
    fx_proxy_stop(relay);
    start_member(&m[3], "n4", "h", 6, 1);
    member_t *two[] = {&m[0], &m[1], &m[3]};
    wait_view(two, 3, "n1 n2 n3 n4 ", 2, 5000);
    ASSERT_OK(mb_leave(m[3].mb));
    wait_view(two, 2, "n1 n2 n3 ", 3, 5000);
    ASSERT_EQ(m[2].n_views, 1);
    relay = fx_proxy_start(&etcd_, port);
    wait_view(all, 3, "n1 n2 n3 ", 3, 5000);
    ASSERT_EQ(m[2].n_views, 2);
    ASSERT_EQ(m[2].gens[1], 3);
    ASSERT_STR_EQ(m[2].lists[1], "n1 n2 n3 ");
    ASSERT_EQ(m[2].fenced, 0);
    fx_proxy_stop(relay);
    teardown(m, 4);
    return fx_done();
}

/* One member's path to etcd hangs (its relay is SIGSTOPped: no resets,
 * just silence) for longer than its TTL: it fences itself, the others
 * install a view without it, and it rejoins as a new member once the
 * path works again. */
TEST_IMPL(mb_partition_fence)
{
    setup();
    int port = th_free_port();
    pid_t relay = fx_proxy_start(&etcd_, port);
    member_t m[3];
    start_member(&m[0], "n1", "h", 2, 3);
    start_member(&m[1], "n2", "h", 2, 3);
    ASSERT(fx_run_until_fn(&loop, n1_or_n2_leads, m, 10000));
    memset(&m[2], 0, sizeof(m[2]));
    snprintf(m[2].name, sizeof(m[2].name), "n3");
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    mb_config_t cfg = {.job = "test", .node = "n3", .host = "h",
                       .addr = "a", .addr_len = 1, .ttl_s = 2,
                       .min_members = 3, .etcd = {.endpoints = url}};
    mb_callbacks_t cb = {on_view, on_fenced, on_drain, on_left};
    ASSERT_OK(mb_create(&loop, &cfg, &cb, &m[2], &m[2].mb));
    ASSERT_OK(mb_start(m[2].mb));
    member_t *all[] = {&m[0], &m[1], &m[2]};
    wait_view(all, 3, "n1 n2 n3 ", 1, 10000);
    int64_t lease = mb_lease(m[2].mb);

    int64_t t0 = th_now_ms();
    kill(relay, SIGSTOP);
    ASSERT(fx_run_until(&loop, &m[2].fenced, 2000 + 1000));
    fprintf(stderr, "fenced %lld ms after the cut\n",
            (long long)(th_now_ms() - t0));
    wait_view(all, 2, "n1 n2 ", 2, 2000);
    kill(relay, SIGCONT);
    wait_view(all, 3, "n1 n2 n3 ", 3, 8000);
    ASSERT_NE(mb_lease(m[2].mb), lease);
    ASSERT_EQ(m[2].joiner[m[2].n_views - 1], 1);
    fx_proxy_stop(relay);
    teardown(m, 3);
    return fx_done();
}

static int is_joining(void *p)
{
    return mb_state(((member_t *)p)->mb) >= MB_JOINING;
}

/* Destroying a member at any point (requests and timers in flight) is
 * clean; calls in the wrong state fail loudly instead of acting. */
TEST_IMPL(mb_lifecycle_edges)
{
    setup();
    member_t m[3];
    start_member(&m[0], "n1", "h", 2, 1);
    stop_member(&m[0]); /* grant in flight */
    start_member(&m[1], "n2", "h", 2, 1);
    ASSERT(fx_run_until_fn(&loop, is_joining, &m[1], 10000));
    ASSERT_EQ(mb_start(m[1].mb), ST_EINVAL);
    stop_member(&m[1]); /* watch, keepalive, campaign in flight */

    mb_config_t bad = {.job = "j", .node = "a/b", .host = "h"};
    mb_callbacks_t cb = {0};
    mb_t *x = NULL;
    ASSERT_EQ(mb_create(&loop, &bad, &cb, NULL, &x), ST_ECONFIG);
    mb_config_t idle = {.job = "j", .node = "n9", .host = "h",
                        .etcd = {.endpoints = etcd_.url}};
    ASSERT_OK(mb_create(&loop, &idle, &cb, NULL, &x));
    ASSERT_EQ(mb_leave(x), ST_EINVAL);
    ASSERT_EQ(mb_suspect(x, "n1", "?"), ST_EINVAL);
    ASSERT_EQ(mb_state(x), MB_IDLE);
    mb_destroy(x);
    mb_destroy(NULL);

    /* Leave while registering: ends LEFT, the lease is given back. */
    start_member(&m[2], "n3", "h", 2, 1);
    ASSERT_OK(mb_leave(m[2].mb));
    ASSERT(fx_run_until(&loop, &m[2].left, 5000));
    ASSERT_EQ(mb_state(m[2].mb), MB_LEFT);
    teardown(m, 3);
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
