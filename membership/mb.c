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

#include <openssl/crypto.h>

#include "common/json.h"
#include "common/log.h"
#include "common/status.h"


static void transition(mb_t *mb, mb_event_t ev, const char *why);
static void reconcile(mb_t *mb);

static void on_again(uv_timer_t *t)
{
    reconcile(t->data);
}

/* A request that reconcile() sent failed (etcd hiccup): look again soon,
 * since no watch event may come to trigger it. */
void mb__reconcile_soon(mb_t *mb)
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

int mb__holds_lease(mb_state_t s)
{
    return s >= MB_JOINING;
}

int mb_state_next(mb_state_t s, mb_event_t ev, mb_state_t *next_p)
{
    mb_state_t n = (mb_state_t)-1;
    if (ev == MB_EV_LEAVE && s != MB_IDLE && s != MB_LEAVING && s != MB_LEFT)
        n = MB_LEAVING;
    else if (ev == MB_EV_LEASE_LOST && mb__holds_lease(s))
        n = MB_FENCED;
    else if (ev == MB_EV_DRAIN && (s == MB_JOINING || s == MB_ACTIVE))
        n = MB_DRAINING;
    else if (ev == MB_EV_IN_VIEW && mb__holds_lease(s))
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

/*
 * Registration failed. An outage is retried quickly and quietly (etcd.c
 * logs each endpoint that fails). A refusal (-EACCES: TLS verification,
 * a client certificate, a wrong password, a revoked user or role) will
 * not go away by itself: it is logged as such on every try and retried
 * every MB_RETRY_DENIED_MS, so an operator who fixes etcd's side gets the
 * node back without restarting it.
 */
static void schedule_retry_after(mb_t *mb, int status, const char *what)
{
    if (status == -EACCES) {
        mb->denied++;
        RD_ERROR("mb %s: etcd refused this node's credentials at %s (TLS "
                 "verification or authentication failed: check etcd-ca, "
                 "etcd-cert, etcd-key, etcd-user and its password file, "
                 "or whether the user or its role was revoked); not in "
                 "the job, retry %u in %d s", mb->me.node, what,
                 mb->denied, MB_RETRY_DENIED_MS / 1000);
        uv_timer_start(&mb->retry_timer, on_retry_timer,
                       MB_RETRY_DENIED_MS, 0);
        return;
    }
    uv_timer_start(&mb->retry_timer, on_retry_timer,
                   (uint64_t)mb->retry_ms, 0);
    mb->retry_ms = mb->retry_ms * 2 > MB_RETRY_MAX_MS ? MB_RETRY_MAX_MS
                                                      : mb->retry_ms * 2;
}

static void schedule_retry(mb_t *mb)
{
    schedule_retry_after(mb, 0, NULL);
}

static int find_me(const mb_t *mb, const mb__view_t *v);

/*
 * The lease deadline passed with etcd unreachable. Nobody can write a
 * view while etcd is down, so the view this node runs is still the job's
 * and it may keep training in it, provided something other than etcd
 * stops it should the outage be only ours (a partition: etcd expires our
 * lease and the others move to a newer generation without us). That
 * fence is the ring: every step of a view of two or more nodes needs a
 * collective with every member, and the ring drops messages of other
 * generations, so a node the others left behind completes no step. A
 * node alone in its view has no such fence and steps alone: it fences.
 * So does a node that saw no keepalive fail while it ran (it was stopped
 * past its deadline: the others may have moved on while it could not
 * notice) or whose user has no collective fence (ride_outage 0).
 */
static int may_ride_outage(mb_t *mb)
{
    return mb->ride_outage && mb->etcd_unreach && mb->state == MB_ACTIVE &&
           mb->view.n_members >= 2 &&
           mb->view.generation == mb->delivered_gen &&
           find_me(mb, &mb->view) >= 0;
}

/* Past the lease deadline: 1 when riding out an outage (from now on,
 * if not yet), 0 when this node must fence. */
static int ride_outage(mb_t *mb)
{
    if (mb->outage_since_ms != 0)
        return 1;
    if (!may_ride_outage(mb))
        return 0;
    mb->outage_since_ms = uv_now(mb->loop);
    RD_WARN("mb %s: etcd unreachable past the lease deadline: keeping "
            "view %llu and training while every ring member does",
            mb->me.node, (unsigned long long)mb->view.generation);
    return 1;
}

static void on_fence_timer(uv_timer_t *t)
{
    mb_t *mb = t->data;
    if (mb__holds_lease(mb->state) && !ride_outage(mb))
        transition(mb, MB_EV_LEASE_LOST, "lease not renewed in time");
}

/* A keepalive failed: log the first failure after a renewal, and note
 * whether etcd was found unreachable while the lease was still good. */
static void keepalive_failed(mb_t *mb, int status)
{
    if (!mb->etcd_unreach && mb->outage_since_ms == 0)
        RD_WARN("mb %s: keepalive failed: %s", mb->me.node,
                st_strerror(status));
    uv_update_time(mb->loop);
    if ((status == ST_EUNAVAIL || status == ST_ETIMEDOUT) &&
        uv_now(mb->loop) < mb->fence_at_ms)
        mb->etcd_unreach = 1;
}

static void keepalive_renewed(mb_t *mb)
{
    if (mb->outage_since_ms != 0)
        RD_INFO("mb %s: etcd answers again after %llu ms past the lease "
                "deadline: lease renewed, view %llu kept", mb->me.node,
                (unsigned long long)(uv_now(mb->loop) - mb->outage_since_ms),
                (unsigned long long)mb->delivered_gen);
    mb->outage_since_ms = 0;
    mb->etcd_unreach = 0;
}

/* The lease is good until sent + ttl as etcd counts from the arrival of
 * the request, which is later than sent: fence at sent + ttl. */
static void arm_fence(mb_t *mb, uint64_t sent_ms, int64_t ttl_s)
{
    uint64_t deadline = sent_ms + (uint64_t)ttl_s * 1000;
    uint64_t now = uv_now(mb->loop);
    mb->fence_at_ms = deadline;
    uv_timer_start(&mb->fence_timer, on_fence_timer,
                   deadline > now ? deadline - now : 0, 0);
}

/* Credentials refused: no later request will pass either, so fence now
 * rather than serve until the lease runs out. */
static void fence_denied(mb_t *mb, const char *what)
{
    RD_ERROR("mb %s: etcd refused this node's credentials at %s (the "
             "user, its role or its password changed, or the certificate "
             "is no longer accepted): fenced", mb->me.node, what);
    mb->fence_reason = -EACCES;
    transition(mb, MB_EV_LEASE_LOST, "etcd refused credentials");
}

static void on_probe(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    (void)res;
    mb->probe_inflight = 0;
    if (mb->ka_gen != mb->reg_gen || !mb__holds_lease(mb->state))
        return;
    if (status == -EACCES)
        fence_denied(mb, "its credentials check");
}

/*
 * etcd 3.4 renews a lease for any token, even one of a user deleted or
 * stripped of its role since, so a keepalive alone would keep a revoked
 * node in the job. With auth on, each keepalive is followed by a read of
 * the node's own key, which etcd does check.
 */
static void probe_credentials(mb_t *mb)
{
    if (!mb->auth_probe || mb->probe_inflight)
        return;
    if (etcd_get(mb->etcd, mb->my_key, 0, on_probe, mb) == 0)
        mb->probe_inflight = 1;
}

static void on_keepalive(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    mb->ka_inflight = 0;
    if (mb->ka_gen != mb->reg_gen || !mb__holds_lease(mb->state))
        return;
    if (status == -EACCES) {
        fence_denied(mb, "keepalive");
        return;
    }
    if (status != 0) {
        keepalive_failed(mb, status);
        return; /* the fence timer decides */
    }
    if (res->ttl <= 0) {
        transition(mb, MB_EV_LEASE_LOST, "lease expired or revoked");
        return;
    }
    keepalive_renewed(mb);
    arm_fence(mb, mb->ka_sent_ms, res->ttl);
    probe_credentials(mb);
}

static void on_ka_timer(uv_timer_t *t)
{
    mb_t *mb = t->data;
    if (!mb__holds_lease(mb->state))
        return;
    if (mb->ka_inflight) {
        /* Unanswered for a period while we ran, before the deadline:
         * etcd is failing over its endpoints (a member down, an
         * election), which can take past the deadline to say so. */
        if (uv_now(mb->loop) < mb->fence_at_ms)
            mb->etcd_unreach = 1;
        return;
    }
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
        schedule_retry_after(mb, status, "the node record");
        return;
    }
    mb->denied = 0;
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
        schedule_retry_after(mb, status, "the lease grant");
        return;
    }
    mb->lease = res->lease_id;
    mb->me.lease = res->lease_id;
    arm_fence(mb, mb->ka_sent_ms, res->ttl);
    char *json = mb__text_sign(mb, "node", mb->my_key,
                               mb__node_json(&mb->me, (int)getpid()));
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
        /* etcd is not answering yet, or refuses us */
        schedule_retry_after(mb, status, "the old lease's revoke");
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

mb_kv_t *mb__mirror_find(mb_t *mb, const char *key)
{
    for (size_t i = 0; i < mb->n_kvs; i++)
        if (strcmp(mb->kvs[i].key, key) == 0)
            return &mb->kvs[i];
    return NULL;
}

static void mirror_del(mb_t *mb, const char *key)
{
    mb_kv_t *kv = mb__mirror_find(mb, key);
    if (kv == NULL)
        return;
    kv_free(kv);
    *kv = mb->kvs[--mb->n_kvs];
}

static int mirror_put(mb_t *mb, const etcd_kv_t *src)
{
    mb_kv_t *kv = mb__mirror_find(mb, src->key);
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

/* A drain key, signed for this incarnation when there is a job secret
 * (a foreign writer's is ignored, said once per version). */
static int drain_wanted(mb_t *mb)
{
    mb_kv_t *kv = mb__mirror_find(mb, mb->drain_key);
    if (kv == NULL || mb->secret_len == 0)
        return kv != NULL;
    cJSON *j = cJSON_ParseWithLength(kv->val, kv->len);
    int64_t lease = 0;
    rd_json_i64(j, "lease", &lease);
    cJSON_Delete(j);
    if (lease == mb->lease &&
        mb__text_sig_ok(mb, "drain", mb->drain_key, kv->val, kv->len))
        return 1;
    if (kv->mod > mb->refused_drain_mod)
        RD_WARN("mb %s: ignoring the drain request %s: not signed with "
                "the job secret for this node's lease", mb->me.node,
                kv->key);
    mb->refused_drain_mod = kv->mod;
    return 0;
}

/* Parse the view key when it changed; deliver it if it is new and ours. */
static void install_view(mb_t *mb)
{
    mb_kv_t *kv = mb__mirror_find(mb, mb->view_key);
    if (kv == NULL || kv->mod == mb->view_mod)
        return;
    mb__view_t v;
    mb->view_mod = kv->mod;
    if (!mb__text_sig_ok(mb, "view", mb->view_key, kv->val, kv->len)) {
        RD_ERROR("mb %s: refusing the view at revision %lld: not signed "
                 "by a leader holding the job secret", mb->me.node,
                 (long long)kv->mod);
        return;
    }
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

/* Act on the mirror; see the top of the file. */
static void reconcile(mb_t *mb)
{
    if (!mb__holds_lease(mb->state) || mb->rev < mb->my_key_rev)
        return; /* the mirror is older than our own registration */
    mb_kv_t *mine = mb__mirror_find(mb, mb->my_key);
    if (mine == NULL || mine->lease != mb->lease) {
        transition(mb, MB_EV_LEASE_LOST, "node record gone (evicted)");
        return;
    }
    install_view(mb);
    if (!mb__holds_lease(mb->state))
        return;
    if (drain_wanted(mb) &&
        (mb->state == MB_JOINING || mb->state == MB_ACTIVE)) {
        transition(mb, MB_EV_DRAIN, "drain requested");
        if (!mb__holds_lease(mb->state))
            return;
    }
    if (mb__mirror_find(mb, mb->leader_key) == NULL)
        mb__campaign(mb);
    if (mb__is_leader(mb)) {
        mb__handle_suspects(mb);
        mb__schedule_settle(mb);
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
    mb->etcd_unreach = 0;
    mb->outage_since_ms = 0;
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
    int reason = mb->fence_reason != 0 ? mb->fence_reason : ST_EFENCED;
    mb->fence_reason = 0;
    if (mb->cb.on_fenced != NULL)
        mb->cb.on_fenced(reason, mb->data);
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
    if (mb__holds_lease(prev) && !mb__holds_lease(next))
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
    /* check_config bounded job and node, so every key fits. */
    snprintf(mb->job, MB_KEY_MAX, "%s", job);
    mb_key(mb->prefix, MB_KEY_MAX, job, MB_KEY_JOB, NULL, 0, 0);
    mb_key(mb->nodes_prefix, MB_KEY_MAX, job, MB_KEY_NODES, NULL, 0, 0);
    mb_key(mb->suspect_prefix, MB_KEY_MAX, job, MB_KEY_SUSPECTS, NULL, 0, 0);
    mb_key(mb->reshape_prefix, MB_KEY_MAX, job, MB_KEY_RESHAPES, NULL, 0, 0);
    mb_key(mb->my_key, MB_KEY_MAX, job, MB_KEY_NODE, n, 0, 0);
    mb_key(mb->leader_key, MB_KEY_MAX, job, MB_KEY_LEADER, NULL, 0, 0);
    mb_key(mb->view_key, MB_KEY_MAX, job, MB_KEY_VIEW, NULL, 0, 0);
    mb_key(mb->drain_key, MB_KEY_MAX, job, MB_KEY_DRAIN, n, 0, 0);
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
    if (cfg->secret_len > 0) {
        mb->secret = malloc(cfg->secret_len);
        if (mb->secret == NULL) {
            rc = ST_ENOMEM;
            goto err_member;
        }
        memcpy(mb->secret, cfg->secret, cfg->secret_len);
        mb->secret_len = cfg->secret_len;
    }
    rc = etcd_create(loop, &ecfg, &mb->etcd);
    if (rc != 0)
        goto err_secret;
    make_keys(mb, cfg->job);
    mb->loop = loop;
    mb->cb = *cb;
    mb->data = data;
    mb->view.source_index = -1;
    mb->retry_ms = MB_RETRY_MIN_MS;
    mb->view_retry_ms = MB_RETRY_MIN_MS;
    mb->auth_probe = cfg->etcd.user != NULL;
    mb->ride_outage = cfg->ride_outage;
    uv_timer_t *timers[] = {&mb->ka_timer, &mb->fence_timer,
                            &mb->retry_timer, &mb->settle_timer,
                            &mb->again_timer};
    for (int i = 0; i < 5; i++) {
        uv_timer_init(loop, timers[i]);
        timers[i]->data = mb;
    }
    *mb_p = mb;
    return 0;

err_secret:
    free(mb->secret);
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

int mb_lease_valid(mb_t *mb)
{
    if (!mb__holds_lease(mb->state) || mb->lease == 0)
        return 0;
    uv_update_time(mb->loop); /* after a stop, the cached time is old */
    /* Past the deadline before the fence timer ran: decide as it will. */
    return uv_now(mb->loop) < mb->fence_at_ms || ride_outage(mb);
}

int mb_member_alive(mb_t *mb, const char *node, int64_t lease)
{
    char key[MB_KEY_MAX];
    if (mb_key(key, sizeof(key), mb->job, MB_KEY_NODE, node, 0, 0) != 0)
        return 0;
    mb_kv_t *kv = mb__mirror_find(mb, key);
    return kv != NULL && kv->lease == lease;
}

int mb_is_leader(const mb_t *mb)
{
    return mb__is_leader((mb_t *)mb);
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
    if (mb->secret != NULL)
        OPENSSL_cleanse(mb->secret, mb->secret_len);
    free(mb->secret);
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