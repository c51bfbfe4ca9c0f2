/*
 * mb-members.c - the membership tests' members: several mb_t on one loop
 * against the fixture's etcd, each recording the views it installed, and
 * waits on what they installed.
 */
#include "tests/mb-members.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "membership/mb-int.h"
#include "tests/task.h"

int start_all_peers; /* start_member's next member: all_peers */

uv_loop_t loop;
fx_etcd_t etcd_;

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

void on_view(const mb_view_t *v, void *data)
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

void on_fenced(int reason, void *data)
{
    member_t *m = data;
    ASSERT_EQ(reason, ST_EFENCED);
    m->fenced++;
}

void on_left(int status, void *data)
{
    member_t *m = data;
    ASSERT_OK(status);
    m->left = 1;
}

void on_drain(void *data)
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

int ride_outage_; /* the next start_member's mb_config_t */

void start_member(member_t *m, const char *name, const char *host,
                  int ttl, int min_members)
{
    start_member_at(m, name, host, ttl, min_members, etcd_.url);
}

void start_member_at(member_t *m, const char *name, const char *host,
                     int ttl, int min_members, const char *endpoints)
{
    memset(m, 0, sizeof(*m));
    m->all_peers = start_all_peers;
    snprintf(m->name, sizeof(m->name), "%s", name);
    char addr[32];
    snprintf(addr, sizeof(addr), "ucx-addr-of-%s", name);
    mb_config_t cfg = {.job = "test", .node = name, .host = host,
                       .addr = addr, .addr_len = strlen(addr), .slots = 1,
                       .ttl_s = ttl, .min_members = min_members,
                       .etcd = {.endpoints = endpoints},
                       .ride_outage = ride_outage_};
    mb_callbacks_t cb = {on_view, on_fenced, on_drain, on_left,
                         m->all_peers ? all_peers : NULL};
    ASSERT_OK(mb_create(&loop, &cfg, &cb, m, &m->mb));
    ASSERT_OK(mb_start(m->mb));
}

void stop_member(member_t *m)
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
void wait_view(member_t **ms, int n, const char *list,
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
void wait_gen(member_t **ms, int n, uint64_t min_gen,
              int64_t timeout_ms)
{
    views_pred_t vp = {ms, n, NULL, min_gen};
    ASSERT_MSG(fx_run_until_fn(&loop, all_gen, &vp, timeout_ms),
               "no view %llu within %lld ms", (unsigned long long)min_gen,
               (long long)timeout_ms);
}

uint64_t last_gen(const member_t *m)
{
    return m->n_views ? m->gens[m->n_views - 1] : 0;
}

void setup(void)
{
    ASSERT_OK(uv_loop_init(&loop));
    fx_etcd_start(&etcd_, 0);
}

void teardown(member_t *ms, int n)
{
    for (int i = 0; i < n; i++)
        mb_destroy(ms[i].mb);
    fx_loop_drain(&loop);
    ASSERT_OK(uv_loop_close(&loop));
}

int leader_index(member_t *ms, int n)
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

void on_put_reply(int status, const etcd_result_t *res, void *data)
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
int64_t put_wait(etcd_t *e, const char *key, const char *val,
                 int64_t lease)
{
    put_reply_t r = {0};
    ASSERT_OK(etcd_put(e, key, val, strlen(val), lease, on_put_reply, &r));
    ASSERT(fx_run_until(&loop, &r.done, 10000));
    ASSERT_OK(r.status);
    return r.mod;
}

int n1_or_n2_leads(void *p)
{
    member_t *m = p;
    return mb_is_leader(m[0].mb) || mb_is_leader(m[1].mb);
}

/* setup() and members n1..n3 (TTL 30 s: longer than any wait here, so
 * only a revoke evicts one) in their first view; returns the leader's
 * index. */
int start_three(member_t m[3])
{
    setup();
    start_member(&m[0], "n1", "h", 30, 3);
    start_member(&m[1], "n2", "h", 30, 3);
    start_member(&m[2], "n3", "h", 30, 3);
    member_t *all[] = {&m[0], &m[1], &m[2]};
    wait_view(all, 3, "n1 n2 n3 ", 1, 10000);
    int leader = leader_index(m, 3);
    ASSERT(leader >= 0);
    return leader;
}

/* The member's mirror holds the leader key with value a->val. */
int mirror_leader_is(void *arg)
{
    leader_is_t *a = arg;
    mb_kv_t *kv = mb__mirror_find(a->mb, a->mb->leader_key);
    return kv != NULL && kv->val != NULL && strcmp(kv->val, a->val) == 0;
}
