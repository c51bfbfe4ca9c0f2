/*
 * mb.c - membership: the state machine, registration and keepalive, the
 * mirror of /ringd/<job>/ kept by one watch, and the leader's duties
 * (writing views, acting on suspicions).
 *
 * Everything is driven by two inputs: etcd replies and watch updates.
 * After each watch update reconcile() compares the mirror with what this
 * node believes and acts: evicted -> fence; new view -> install; drain key
 * -> drain; no leader -> campaign; leader -> revoke suspects and write the
 * next view if the live set changed.
 */
#include "membership/mb-int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/log.h"
#include "common/status.h"
#include "membership/etcd-int.h"

#define MB_KEY_MAX 512
#define MB_RETRY_MIN_MS 100
#define MB_RETRY_MAX_MS 1000

typedef struct {
    char *key;
    char *val;
    size_t len;
    int64_t mod, create, lease;
} mb_kv_t;

struct mb {
    uv_loop_t *loop;
    etcd_t *etcd;
    mb_callbacks_t cb;
    void *data;
    mb_member_t me;          /* node, host, addr, slots; lease below */
    int ttl_s, min_members, settle_ms;
    char prefix[MB_KEY_MAX], my_key[MB_KEY_MAX], leader_key[MB_KEY_MAX];
    char view_key[MB_KEY_MAX], drain_key[MB_KEY_MAX];
    char nodes_prefix[MB_KEY_MAX], suspect_prefix[MB_KEY_MAX];

    mb_state_t state;
    int64_t lease;           /* current registration; 0 when none */
    int64_t old_lease;       /* a lost lease still to revoke */
    int64_t my_key_rev;      /* revision of our node record put */
    uint64_t step;
    unsigned reg_gen;        /* bumped per registration: drops stale
                                replies */

    uv_timer_t ka_timer, fence_timer, retry_timer, settle_timer;
    uv_timer_t again_timer;  /* reconcile again after a failed request */
    int n_closing;
    int ka_inflight;
    unsigned ka_gen;
    uint64_t ka_sent_ms;
    long retry_ms;
    int campaign_inflight, view_inflight, view_again;
    int64_t suspect_rev_done;

    etcd_watch_t *watch;
    mb_kv_t *kvs;
    size_t n_kvs, cap_kvs;
    int64_t rev;             /* mirror is complete up to this revision */

    mb__view_t view;         /* the view in etcd, as last parsed */
    int64_t view_mod;        /* its mod_revision */
    uint64_t delivered_gen;  /* last generation given to on_view */
};

static void transition(mb_t *mb, mb_event_t ev, const char *why);
static void reconcile(mb_t *mb);

static void on_again(uv_timer_t *t)
{
    reconcile(t->data);
}

/* A request that reconcile() sent failed (etcd hiccup): look again soon,
 * since no watch event may come to trigger it. */
static void reconcile_soon(mb_t *mb)
{
    uv_timer_start(&mb->again_timer, on_again, MB_RETRY_MIN_MS * 2, 0);
}

/* ------------------------------------------------------------------ */
/* The state machine                                                   */

static const char *const state_names[] = {
    "IDLE", "REGISTERING", "FENCED", "LEAVING", "LEFT", "JOINING",
    "ACTIVE", "DRAINING",
};

static const char *const event_names[] = {
    "start", "registered", "in-view", "lease-lost", "retry", "drain",
    "leave", "left",
};

const char *mb_state_name(mb_state_t s)
{
    return (unsigned)s < 8 ? state_names[s] : "?";
}

const char *mb_event_name(mb_event_t ev)
{
    return (unsigned)ev < 8 ? event_names[ev] : "?";
}

static int holds_lease(mb_state_t s)
{
    return s >= MB_JOINING;
}

int mb_state_next(mb_state_t s, mb_event_t ev, mb_state_t *next_p)
{
    mb_state_t n = (mb_state_t)-1;
    if (ev == MB_EV_LEAVE && s != MB_IDLE && s != MB_LEAVING && s != MB_LEFT)
        n = MB_LEAVING;
    else if (ev == MB_EV_LEASE_LOST && holds_lease(s))
        n = MB_FENCED;
    else if (ev == MB_EV_DRAIN && (s == MB_JOINING || s == MB_ACTIVE))
        n = MB_DRAINING;
    else if (ev == MB_EV_IN_VIEW && holds_lease(s))
        n = s == MB_DRAINING ? MB_DRAINING : MB_ACTIVE;
    else if (ev == MB_EV_START && s == MB_IDLE)
        n = MB_REGISTERING;
    else if (ev == MB_EV_REGISTERED && s == MB_REGISTERING)
        n = MB_JOINING;
    else if (ev == MB_EV_RETRY && s == MB_FENCED)
        n = MB_REGISTERING;
    else if (ev == MB_EV_LEFT && s == MB_LEAVING)
        n = MB_LEFT;
    if (n == (mb_state_t)-1)
        return ST_EINVAL;
    *next_p = n;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Registration, keepalive, fencing                                    */

static void reg_begin(mb_t *mb);

static void on_retry_timer(uv_timer_t *t)
{
    mb_t *mb = t->data;
    if (mb->state == MB_FENCED)
        transition(mb, MB_EV_RETRY, "etcd retry");
    else if (mb->state == MB_REGISTERING)
        reg_begin(mb);
}

static void schedule_retry(mb_t *mb)
{
    uv_timer_start(&mb->retry_timer, on_retry_timer,
                   (uint64_t)mb->retry_ms, 0);
    mb->retry_ms = mb->retry_ms * 2 > MB_RETRY_MAX_MS ? MB_RETRY_MAX_MS
                                                      : mb->retry_ms * 2;
}

static void on_fence_timer(uv_timer_t *t)
{
    mb_t *mb = t->data;
    if (holds_lease(mb->state))
        transition(mb, MB_EV_LEASE_LOST, "lease not renewed in time");
}

/* The lease is good until sent + ttl as etcd counts from the arrival of
 * the request, which is later than sent: fence at sent + ttl. */
static void arm_fence(mb_t *mb, uint64_t sent_ms, int64_t ttl_s)
{
    uint64_t deadline = sent_ms + (uint64_t)ttl_s * 1000;
    uint64_t now = uv_now(mb->loop);
    uv_timer_start(&mb->fence_timer, on_fence_timer,
                   deadline > now ? deadline - now : 0, 0);
}

static void on_keepalive(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    mb->ka_inflight = 0;
    if (mb->ka_gen != mb->reg_gen || !holds_lease(mb->state))
        return;
    if (status != 0) {
        RD_WARN("mb %s: keepalive failed: %s", mb->me.node,
                st_strerror(status));
        return; /* the fence timer decides */
    }
    if (res->ttl <= 0) {
        transition(mb, MB_EV_LEASE_LOST, "lease expired or revoked");
        return;
    }
    arm_fence(mb, mb->ka_sent_ms, res->ttl);
}

static void on_ka_timer(uv_timer_t *t)
{
    mb_t *mb = t->data;
    if (mb->ka_inflight || !holds_lease(mb->state))
        return;
    mb->ka_gen = mb->reg_gen;
    mb->ka_sent_ms = uv_now(mb->loop);
    if (etcd_lease_keepalive(mb->etcd, mb->lease, on_keepalive, mb) == 0)
        mb->ka_inflight = 1;
}

static void on_node_put(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    if (mb->state != MB_REGISTERING)
        return;
    if (status != 0) {
        mb->old_lease = mb->lease;
        mb->lease = 0;
        schedule_retry(mb);
        return;
    }
    mb->my_key_rev = res->revision;
    transition(mb, MB_EV_REGISTERED, "node record written");
}

static void on_granted(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    if (status == 0 && mb->state != MB_REGISTERING) {
        etcd_lease_revoke(mb->etcd, res->lease_id, NULL, NULL);
        return; /* left meanwhile: give the lease back */
    }
    if (mb->state != MB_REGISTERING)
        return;
    if (status != 0) {
        schedule_retry(mb);
        return;
    }
    mb->lease = res->lease_id;
    mb->me.lease = res->lease_id;
    arm_fence(mb, mb->ka_sent_ms, res->ttl);
    char *json = mb__node_json(&mb->me, (int)getpid());
    int rc = json ? etcd_put(mb->etcd, mb->my_key, json, strlen(json),
                             mb->lease, on_node_put, mb)
                  : ST_ENOMEM;
    free(json);
    if (rc != 0)
        schedule_retry(mb);
}

static void grant(mb_t *mb)
{
    mb->ka_sent_ms = uv_now(mb->loop);
    if (etcd_lease_grant(mb->etcd, mb->ttl_s, on_granted, mb) != 0)
        schedule_retry(mb);
}

static void on_old_revoked(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    (void)res;
    if (mb->state != MB_REGISTERING)
        return;
    if (status == 0 || status == -ENOENT)
        mb->old_lease = 0;
    if (status != 0 && status != -ENOENT) {
        schedule_retry(mb); /* etcd is not answering yet */
        return;
    }
    grant(mb);
}

/* Give back a lost lease first: after an etcd restart it comes back to
 * life for a TTL, and with it our old leader key. */
static void reg_begin(mb_t *mb)
{
    mb->reg_gen++;
    if (mb->old_lease == 0) {
        grant(mb);
        return;
    }
    if (etcd_lease_revoke(mb->etcd, mb->old_lease, on_old_revoked, mb) != 0)
        schedule_retry(mb);
}

/* ------------------------------------------------------------------ */
/* Mirror of /ringd/<job>/                                             */

static void kv_free(mb_kv_t *kv)
{
    free(kv->key);
    free(kv->val);
}

static mb_kv_t *mirror_find(mb_t *mb, const char *key)
{
    for (size_t i = 0; i < mb->n_kvs; i++)
        if (strcmp(mb->kvs[i].key, key) == 0)
            return &mb->kvs[i];
    return NULL;
}

static void mirror_del(mb_t *mb, const char *key)
{
    mb_kv_t *kv = mirror_find(mb, key);
    if (kv == NULL)
        return;
    kv_free(kv);
    *kv = mb->kvs[--mb->n_kvs];
}

static int mirror_put(mb_t *mb, const etcd_kv_t *src)
{
    mb_kv_t *kv = mirror_find(mb, src->key);
    if (kv == NULL) {
        if (mb->n_kvs == mb->cap_kvs) {
            size_t cap = mb->cap_kvs ? mb->cap_kvs * 2 : 16;
            mb_kv_t *p = realloc(mb->kvs, cap * sizeof(*p));
            if (p == NULL)
                return ST_ENOMEM;
            mb->kvs = p;
            mb->cap_kvs = cap;
        }
        kv = &mb->kvs[mb->n_kvs++];
        memset(kv, 0, sizeof(*kv));
        kv->key = strdup(src->key);
    }
    free(kv->val);
    kv->val = malloc(src->value_len + 1);
    if (kv->key == NULL || kv->val == NULL) {
        kv_free(kv);
        *kv = mb->kvs[--mb->n_kvs];
        return ST_ENOMEM;
    }
    memcpy(kv->val, src->value, src->value_len);
    kv->val[src->value_len] = '\0';
    kv->len = src->value_len;
    kv->mod = src->mod_revision;
    kv->create = src->create_revision;
    kv->lease = src->lease;
    return 0;
}

static void on_watch(const etcd_watch_update_t *up, void *data)
{
    mb_t *mb = data;
    if (up->reset) {
        while (mb->n_kvs > 0)
            kv_free(&mb->kvs[--mb->n_kvs]);
        for (size_t i = 0; i < up->n_kvs; i++)
            mirror_put(mb, &up->kvs[i]);
        mb->rev = up->revision;
    }
    /* One reconcile per event, not per batch: a batch may hold two
     * writes of the view key, and every generation must be installed. */
    for (size_t i = 0; i < up->n_events; i++) {
        const etcd_event_t *ev = &up->events[i];
        if (ev->is_delete)
            mirror_del(mb, ev->kv.key);
        else
            mirror_put(mb, &ev->kv);
        mb->rev = ev->kv.mod_revision;
        reconcile(mb);
    }
    if (up->reset)
        reconcile(mb);
}

static void restart_watch(mb_t *mb)
{
    etcd_watch_stop(mb->watch);
    mb->watch = NULL;
    while (mb->n_kvs > 0)
        kv_free(&mb->kvs[--mb->n_kvs]);
    mb->rev = 0;
    if (etcd_watch_start(mb->etcd, mb->prefix, on_watch, mb, &mb->watch))
        RD_ERROR("mb %s: cannot watch %s", mb->me.node, mb->prefix);
}

/* ------------------------------------------------------------------ */
/* Views                                                               */

static int find_me(const mb_t *mb, const mb__view_t *v)
{
    for (size_t i = 0; i < v->n_members; i++)
        if (v->members[i].lease == mb->lease &&
            strcmp(v->members[i].node, mb->me.node) == 0)
            return (int)i;
    return -1;
}

/* Parse the view key when it changed; deliver it if it is new and ours. */
static void install_view(mb_t *mb)
{
    mb_kv_t *kv = mirror_find(mb, mb->view_key);
    if (kv == NULL || kv->mod == mb->view_mod)
        return;
    mb__view_t v;
    mb->view_mod = kv->mod;
    if (mb__view_parse(kv->val, kv->len, &v) != 0)
        return;
    mb__view_free(&mb->view);
    mb->view = v;
    if (v.generation <= mb->delivered_gen)
        return;
    int me = find_me(mb, &v);
    if (me < 0) {
        if (mb->state == MB_ACTIVE)
            transition(mb, MB_EV_LEASE_LOST, "left out of a new view");
        return;
    }
    mb->delivered_gen = v.generation;
    transition(mb, MB_EV_IN_VIEW, "view installed");
    mb_view_t pub = {v.generation, v.step, v.members, v.n_members, me,
                     v.source_index, v.n_joiners};
    RD_INFO("mb %s: view %llu, %zu members, index %d", mb->me.node,
            (unsigned long long)v.generation, v.n_members, me);
    if (mb->cb.on_view != NULL)
        mb->cb.on_view(&pub, mb->data);
}

/* The live set: every node record in the mirror (a record exists exactly
 * as long as its lease). Returns the count; members are owned copies. */
static size_t collect_alive(mb_t *mb, mb_member_t **out)
{
    size_t plen = strlen(mb->nodes_prefix), n = 0;
    mb_member_t *arr = calloc(mb->n_kvs + 1, sizeof(*arr));
    if (arr == NULL)
        return 0;
    for (size_t i = 0; i < mb->n_kvs; i++) {
        const mb_kv_t *kv = &mb->kvs[i];
        if (strncmp(kv->key, mb->nodes_prefix, plen) != 0)
            continue;
        if (mb__node_parse(kv->key + plen, kv->val, kv->len, &arr[n]))
            continue;
        arr[n++].lease = kv->lease; /* the lease etcd holds it by */
    }
    *out = arr;
    return n;
}

static void free_members(mb_member_t *arr, size_t n)
{
    for (size_t i = 0; i < n; i++)
        mb__member_free(&arr[i]);
    free(arr);
}

static void on_settle(uv_timer_t *t);

static void schedule_settle(mb_t *mb)
{
    if (!uv_is_active((uv_handle_t *)&mb->settle_timer))
        uv_timer_start(&mb->settle_timer, on_settle,
                       (uint64_t)mb->settle_ms, 0);
}

static void on_view_txn(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    mb->view_inflight = 0;
    if (status != 0 || mb->view_again) {
        mb->view_again = 0;
        schedule_settle(mb);
    } else if (!res->succeeded) {
        RD_DEBUG("mb %s: view txn lost a race", mb->me.node);
    }
}

static int is_leader(mb_t *mb)
{
    mb_kv_t *kv = mirror_find(mb, mb->leader_key);
    return kv != NULL && holds_lease(mb->state) && mb->lease != 0 &&
           kv->lease == mb->lease && strcmp(kv->val, mb->me.node) == 0;
}

/* Leader: write view g+1 if the live set differs from view g. The txn
 * holds only if view g is still the stored one and we still lead, so no
 * generation is ever written twice. */
static void on_settle(uv_timer_t *t)
{
    mb_t *mb = t->data;
    if (!is_leader(mb))
        return;
    if (mb->view_inflight) {
        mb->view_again = 1;
        return;
    }
    mb_member_t *alive = NULL;
    size_t n = collect_alive(mb, &alive);
    mb__view_t next;
    int changed = 0;
    if (n > 0 && (mb->view.generation > 0 || n >= (size_t)mb->min_members))
        changed = mb__view_next(&mb->view, alive, n, mb->step, &next);
    free_members(alive, n);
    if (changed <= 0)
        return;
    char *json = mb__view_json(&next);
    mb_kv_t *lk = mirror_find(mb, mb->leader_key);
    etcd_cmp_t cmps[2] = {
        {mb->view_key, ETCD_CMP_MOD, ETCD_CMP_EQUAL,
         mirror_find(mb, mb->view_key) ? mb->view_mod : 0, NULL, 0},
        {mb->leader_key, ETCD_CMP_CREATE, ETCD_CMP_EQUAL, lk->create, NULL,
         0},
    };
    etcd_op_t put = {ETCD_OP_PUT, mb->view_key, 0, json,
                     json ? strlen(json) : 0, 0};
    RD_INFO("mb %s: leader writes view %llu (%zu members)", mb->me.node,
            (unsigned long long)next.generation, next.n_members);
    if (json != NULL &&
        etcd_txn(mb->etcd, cmps, 2, &put, 1, NULL, 0, on_view_txn, mb) == 0)
        mb->view_inflight = 1;
    free(json);
    mb__view_free(&next);
}

static void on_campaign(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    mb->campaign_inflight = 0;
    if (status == 0 && res->succeeded)
        RD_INFO("mb %s: elected leader", mb->me.node);
    else if (status != 0)
        reconcile_soon(mb);
}

static void campaign(mb_t *mb)
{
    if (mb->campaign_inflight || mb->state == MB_DRAINING)
        return;
    etcd_cmp_t absent = {mb->leader_key, ETCD_CMP_CREATE, ETCD_CMP_EQUAL,
                         0, NULL, 0};
    etcd_op_t put = {ETCD_OP_PUT, mb->leader_key, 0, mb->me.node,
                     strlen(mb->me.node), mb->lease};
    if (etcd_txn(mb->etcd, &absent, 1, &put, 1, NULL, 0, on_campaign,
                 mb) == 0)
        mb->campaign_inflight = 1;
}

static void on_suspect_revoked(int status, const etcd_result_t *res,
                               void *data)
{
    mb_t *mb = data;
    (void)res;
    if (status != 0 && status != -ENOENT) {
        mb->suspect_rev_done = 0; /* try those suspects again */
        reconcile_soon(mb);
    }
}

/* Leader: revoke the lease of every newly suspected node, so its record
 * (and any key it holds) vanishes now rather than after its TTL. A
 * suspicion names an incarnation (lease); once that record is gone (or
 * replaced by a new incarnation), the suspect key has done its job and
 * is deleted. */
static void handle_suspects(mb_t *mb)
{
    size_t plen = strlen(mb->suspect_prefix);
    int64_t done = mb->suspect_rev_done;
    for (size_t i = 0; i < mb->n_kvs; i++) {
        const mb_kv_t *kv = &mb->kvs[i];
        if (strncmp(kv->key, mb->suspect_prefix, plen) != 0)
            continue;
        char nkey[MB_KEY_MAX];
        snprintf(nkey, sizeof(nkey), "%s%s", mb->nodes_prefix,
                 kv->key + plen);
        cJSON *j = cJSON_ParseWithLength(kv->val, kv->len);
        int64_t lease = 0;
        etcd__json_i64(j, "lease", &lease);
        cJSON_Delete(j);
        mb_kv_t *node = mirror_find(mb, nkey);
        if (node == NULL || lease != node->lease) {
            etcd_delete(mb->etcd, kv->key, 0, NULL, NULL);
            continue;
        }
        if (kv->mod <= mb->suspect_rev_done)
            continue; /* revoke already sent */
        done = kv->mod > done ? kv->mod : done;
        RD_INFO("mb %s: revoking suspect %s (lease %llx)", mb->me.node,
                kv->key + plen, (unsigned long long)node->lease);
        etcd_lease_revoke(mb->etcd, node->lease, on_suspect_revoked, mb);
    }
    mb->suspect_rev_done = done;
}

/* Act on the mirror; see the top of the file. */
static void reconcile(mb_t *mb)
{
    if (!holds_lease(mb->state) || mb->rev < mb->my_key_rev)
        return; /* the mirror is older than our own registration */
    mb_kv_t *mine = mirror_find(mb, mb->my_key);
    if (mine == NULL || mine->lease != mb->lease) {
        transition(mb, MB_EV_LEASE_LOST, "node record gone (evicted)");
        return;
    }
    install_view(mb);
    if (!holds_lease(mb->state))
        return;
    if (mirror_find(mb, mb->drain_key) != NULL &&
        (mb->state == MB_JOINING || mb->state == MB_ACTIVE)) {
        transition(mb, MB_EV_DRAIN, "drain requested");
        if (!holds_lease(mb->state))
            return;
    }
    if (mirror_find(mb, mb->leader_key) == NULL)
        campaign(mb);
    if (is_leader(mb)) {
        handle_suspects(mb);
        schedule_settle(mb);
    } else {
        mb->suspect_rev_done = 0;
    }
}

/* ------------------------------------------------------------------ */
/* Leaving                                                             */

static void on_leave_revoked(int status, const etcd_result_t *res,
                             void *data)
{
    mb_t *mb = data;
    (void)res;
    if (mb->state != MB_LEAVING)
        return;
    transition(mb, MB_EV_LEFT, status == 0 ? "lease revoked"
                                           : "lease left to expire");
    if (mb->cb.on_left != NULL)
        mb->cb.on_left(status == -ENOENT ? 0 : status, mb->data);
}

static void leave_begin(mb_t *mb)
{
    etcd_delete(mb->etcd, mb->drain_key, 0, NULL, NULL);
    int64_t lease = mb->lease ? mb->lease : mb->old_lease;
    mb->lease = mb->old_lease = 0;
    if (lease == 0 ||
        etcd_lease_revoke(mb->etcd, lease, on_leave_revoked, mb) != 0)
        on_leave_revoked(0, NULL, mb);
}

/* ------------------------------------------------------------------ */
/* Transitions                                                         */

static void stop_lease_timers(mb_t *mb)
{
    uv_timer_stop(&mb->ka_timer);
    uv_timer_stop(&mb->fence_timer);
    uv_timer_stop(&mb->settle_timer);
    uv_timer_stop(&mb->again_timer);
    mb->reg_gen++;
    mb->ka_inflight = 0;
}

static void enter_joining(mb_t *mb)
{
    uint64_t period = (uint64_t)mb->ttl_s * 1000 / 3;
    mb->retry_ms = MB_RETRY_MIN_MS;
    mb->ka_gen = mb->reg_gen;
    uv_timer_start(&mb->ka_timer, on_ka_timer, period, period);
    restart_watch(mb);
}

static void enter_fenced(mb_t *mb)
{
    mb->old_lease = mb->lease;
    mb->lease = 0;
    mb->campaign_inflight = 0;
    if (mb->cb.on_fenced != NULL)
        mb->cb.on_fenced(ST_EFENCED, mb->data);
    if (mb->state == MB_FENCED)
        uv_timer_start(&mb->retry_timer, on_retry_timer, 0, 0);
}

/* The one place states change. Exit actions first (a state holding a
 * lease stops its timers when it is left), then the new state's entry. */
static void transition(mb_t *mb, mb_event_t ev, const char *why)
{
    mb_state_t prev = mb->state, next;
    if (mb_state_next(prev, ev, &next) != 0) {
        RD_ERROR("mb %s: event %s not allowed in state %s", mb->me.node,
                 mb_event_name(ev), mb_state_name(prev));
        return;
    }
    if (next == prev)
        return;
    RD_INFO("mb %s: %s -> %s (%s)", mb->me.node, mb_state_name(prev),
            mb_state_name(next), why);
    if (holds_lease(prev) && !holds_lease(next))
        stop_lease_timers(mb);
    mb->state = next;
    switch (next) {
    case MB_REGISTERING:
        mb->retry_ms = MB_RETRY_MIN_MS;
        reg_begin(mb);
        break;
    case MB_JOINING:
        enter_joining(mb);
        break;
    case MB_FENCED:
        enter_fenced(mb);
        break;
    case MB_DRAINING:
        if (mb->cb.on_drain != NULL)
            mb->cb.on_drain(mb->data);
        break;
    case MB_LEAVING:
        uv_timer_stop(&mb->retry_timer);
        leave_begin(mb);
        break;
    default:
        break;
    }
}

/* ------------------------------------------------------------------ */
/* Public API                                                          */

static int check_config(const mb_config_t *cfg)
{
    if (cfg->job == NULL || cfg->job[0] == '\0' || cfg->node == NULL ||
        cfg->node[0] == '\0' || strchr(cfg->node, '/') != NULL ||
        strchr(cfg->job, '/') != NULL || cfg->host == NULL ||
        (cfg->addr == NULL && cfg->addr_len > 0) || cfg->ttl_s < 0 ||
        strlen(cfg->job) + strlen(cfg->node) > MB_KEY_MAX - 64) {
        RD_ERROR("mb: invalid configuration (job, node, host, addr)");
        return ST_ECONFIG;
    }
    return 0;
}

static void make_keys(mb_t *mb, const char *job)
{
    const char *n = mb->me.node;
    snprintf(mb->prefix, MB_KEY_MAX, "/ringd/%s/", job);
    snprintf(mb->nodes_prefix, MB_KEY_MAX, "/ringd/%s/nodes/", job);
    snprintf(mb->suspect_prefix, MB_KEY_MAX, "/ringd/%s/suspect/", job);
    snprintf(mb->my_key, MB_KEY_MAX, "/ringd/%s/nodes/%s", job, n);
    snprintf(mb->leader_key, MB_KEY_MAX, "/ringd/%s/leader", job);
    snprintf(mb->view_key, MB_KEY_MAX, "/ringd/%s/view", job);
    snprintf(mb->drain_key, MB_KEY_MAX, "/ringd/%s/drain/%s", job, n);
}

int mb_create(uv_loop_t *loop, const mb_config_t *cfg,
              const mb_callbacks_t *cb, void *data, mb_t **mb_p)
{
    int rc = check_config(cfg);
    if (rc != 0)
        return rc;
    mb_t *mb = calloc(1, sizeof(*mb));
    if (mb == NULL)
        return ST_ENOMEM;
    mb_member_t me = {cfg->node, cfg->host, cfg->addr, cfg->addr_len,
                      cfg->slots > 0 ? cfg->slots : 1, 0, 0};
    rc = mb__member_copy(&mb->me, &me);
    if (rc != 0)
        goto err_free;
    mb->ttl_s = cfg->ttl_s > 0 ? cfg->ttl_s : 3;
    mb->min_members = cfg->min_members > 0 ? cfg->min_members : 1;
    mb->settle_ms = cfg->settle_ms > 0 ? cfg->settle_ms : 10;
    etcd_config_t ecfg = cfg->etcd;
    if (ecfg.request_timeout_ms <= 0)
        ecfg.request_timeout_ms = mb->ttl_s * 1000 / 3;
    if (ecfg.connect_timeout_ms <= 0 ||
        ecfg.connect_timeout_ms > ecfg.request_timeout_ms)
        ecfg.connect_timeout_ms = ecfg.request_timeout_ms;
    rc = etcd_create(loop, &ecfg, &mb->etcd);
    if (rc != 0)
        goto err_member;
    make_keys(mb, cfg->job);
    mb->loop = loop;
    mb->cb = *cb;
    mb->data = data;
    mb->view.source_index = -1;
    mb->retry_ms = MB_RETRY_MIN_MS;
    uv_timer_t *timers[] = {&mb->ka_timer, &mb->fence_timer,
                            &mb->retry_timer, &mb->settle_timer,
                            &mb->again_timer};
    for (int i = 0; i < 5; i++) {
        uv_timer_init(loop, timers[i]);
        timers[i]->data = mb;
    }
    *mb_p = mb;
    return 0;

err_member:
    mb__member_free(&mb->me);
err_free:
    free(mb);
    return rc;
}

int mb_start(mb_t *mb)
{
    if (mb->state != MB_IDLE) {
        RD_ERROR("mb %s: mb_start in state %s", mb->me.node,
                 mb_state_name(mb->state));
        return ST_EINVAL;
    }
    transition(mb, MB_EV_START, "mb_start");
    return 0;
}

static void on_suspect_put(int status, const etcd_result_t *res,
                           void *data)
{
    (void)res;
    (void)data;
    (void)status; /* etcd logged a failure; the lease still bounds it */
}

int mb_suspect(mb_t *mb, const char *node, const char *why)
{
    int64_t lease = 0;
    for (size_t i = 0; i < mb->view.n_members; i++)
        if (strcmp(mb->view.members[i].node, node) == 0)
            lease = mb->view.members[i].lease;
    if (!holds_lease(mb->state) || lease == 0) {
        RD_ERROR("mb %s: cannot suspect %s (state %s, %s)", mb->me.node,
                 node, mb_state_name(mb->state),
                 lease ? "known" : "not in the current view");
        return ST_EINVAL;
    }
    char key[MB_KEY_MAX], ls[32];
    snprintf(key, sizeof(key), "%s%s", mb->suspect_prefix, node);
    snprintf(ls, sizeof(ls), "%lld", (long long)lease);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "by", mb->me.node);
    cJSON_AddStringToObject(o, "why", why ? why : "");
    cJSON_AddStringToObject(o, "lease", ls);
    char *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    RD_INFO("mb %s: suspects %s: %s", mb->me.node, node, why ? why : "");
    int rc = json ? etcd_put(mb->etcd, key, json, strlen(json), mb->lease,
                             on_suspect_put, mb)
                  : ST_ENOMEM;
    free(json);
    return rc;
}

void mb_set_step(mb_t *mb, uint64_t step)
{
    mb->step = step;
}

int mb_leave(mb_t *mb)
{
    mb_state_t next;
    if (mb_state_next(mb->state, MB_EV_LEAVE, &next) != 0) {
        RD_ERROR("mb %s: mb_leave in state %s", mb->me.node,
                 mb_state_name(mb->state));
        return ST_EINVAL;
    }
    transition(mb, MB_EV_LEAVE, "mb_leave");
    return 0;
}

mb_state_t mb_state(const mb_t *mb)
{
    return mb->state;
}

int mb_is_leader(const mb_t *mb)
{
    return is_leader((mb_t *)mb);
}

int64_t mb_lease(const mb_t *mb)
{
    return mb->lease;
}

etcd_t *mb_etcd(mb_t *mb)
{
    return mb->etcd;
}

static void mb_close_cb(uv_handle_t *h)
{
    mb_t *mb = h->data;
    if (--mb->n_closing > 0)
        return;
    mb__view_free(&mb->view);
    while (mb->n_kvs > 0)
        kv_free(&mb->kvs[--mb->n_kvs]);
    free(mb->kvs);
    mb__member_free(&mb->me);
    free(mb);
}

void mb_destroy(mb_t *mb)
{
    if (mb == NULL)
        return;
    etcd_watch_stop(mb->watch);
    etcd_destroy(mb->etcd);
    mb->n_closing = 5;
    uv_close((uv_handle_t *)&mb->again_timer, mb_close_cb);
    uv_close((uv_handle_t *)&mb->ka_timer, mb_close_cb);
    uv_close((uv_handle_t *)&mb->fence_timer, mb_close_cb);
    uv_close((uv_handle_t *)&mb->retry_timer, mb_close_cb);
    uv_close((uv_handle_t *)&mb->settle_timer, mb_close_cb);
}
