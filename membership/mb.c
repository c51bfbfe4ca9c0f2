/*
 * mb.c - membership: the state machine, delivering views and the public
 * API. Registration and keepalive are in mb-lease.c; the mirror of the
 * keys this node acts on (its own record, the view, the leader key, its
 * drain key, its ring neighbours' records; the leader adds every record,
 * the suspects and the reshape requests), one watch each so etcd's
 * traffic to a member does not grow with the job, is in mb-watch.c.
 *
 * Everything is driven by two inputs: etcd replies and watch updates.
 * After each watch update reconcile() compares the mirror with what this
 * node believes and acts: evicted -> fence; new view -> read its
 * neighbours' addresses, install; drain key -> drain; no leader ->
 * campaign; leader -> revoke suspects and write the next view if the live
 * set changed.
 */
#include "membership/mb-int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include <openssl/crypto.h>

#include "common/json.h"
#include "common/log.h"
#include "common/status.h"

static void on_again(uv_timer_t *t)
{
    mb__reconcile(t->data);
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
/* Views                                                               */

int mb__find_me(const mb_t *mb, const mb__view_t *v)
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

/* Ring neighbours of index me in v (right first); returns how many. */
static size_t view_nbrs(const mb__view_t *v, int me, int idx[2])
{
    size_t n = v->n_members;
    if (n < 2 || me < 0)
        return 0;
    idx[0] = (int)(((size_t)me + 1) % n);
    idx[1] = (int)(((size_t)me + n - 1) % n);
    return idx[1] == idx[0] ? 1 : 2;
}

/* Watch the neighbours of the delivered view, which the ring talks to
 * now, and those of the view waiting for their records. */
static void update_peers(mb_t *mb)
{
    const char *names[MB_PEERS_MAX];
    size_t n = 0;
    for (int i = 0; i < 2; i++)
        if (mb->nbrs[i] != NULL)
            names[n++] = mb->nbrs[i];
    int idx[2];
    size_t k = mb->pending_gen != 0
                   ? view_nbrs(&mb->view, mb__find_me(mb, &mb->view), idx)
                   : 0;
    for (size_t i = 0; i < k; i++) {
        const char *node = mb->view.members[idx[i]].node;
        int dup = 0;
        for (size_t j = 0; j < n; j++)
            dup |= strcmp(names[j], node) == 0;
        if (!dup)
            names[n++] = node;
    }
    mb__watch_peers(mb, names, n);
}

/* Said once per view, node and version of its record. */
static void peer_unusable(mb_t *mb, const mb_member_t *m, int64_t mod,
                          const char *why)
{
    mb_bad_peer_t *bad = &mb->bad;
    if (bad->gen == mb->view.generation && bad->mod == mod &&
        strcmp(bad->node, m->node) == 0)
        return;
    bad->gen = mb->view.generation;
    bad->mod = mod;
    snprintf(bad->node, sizeof(bad->node), "%s", m->node);
    /* A warning: a watch of a record may lag the view's by a moment. */
    RD_WARN("mb %s: view %llu is unusable: the node record of its member "
             "%s %s; waiting for the record or a later view", mb->me.node,
             (unsigned long long)mb->view.generation, m->node, why);
}

/*
 * View member m's record (val NULL: missing) at key, held by lease: 0
 * with rec filled (owned), or ST_EPROTO when it is missing, garbled,
 * without an address, unsigned or of another incarnation (logged).
 */
static int record_addr(mb_t *mb, const mb_member_t *m, const char *key,
                       const char *val, size_t len, int64_t lease,
                       int64_t mod, mb_node_rec_t *rec)
{
    const char *why = NULL;
    memset(rec, 0, sizeof(*rec));
    if (val == NULL) {
        peer_unusable(mb, m, 0, "is missing");
        return ST_EPROTO;
    }
    if (mb_node_parse(m->node, val, len, rec, &why) != 0) {
        char garbled[128];
        snprintf(garbled, sizeof(garbled), "is garbled (%s)", why);
        peer_unusable(mb, m, mod, garbled);
        return ST_EPROTO;
    }
    why = NULL;
    if (rec->member.addr_len == 0)
        why = "has no address";
    else if (lease != m->lease)
        why = "is of another incarnation (lease)";
    else if (!mb__text_sig_ok(mb, "node", key, val, len))
        why = "is not signed with the job secret";
    if (why != NULL) {
        peer_unusable(mb, m, mod, why);
        mb_node_rec_free(rec);
        return ST_EPROTO;
    }
    return 0;
}

/* A ring neighbour's address from its watched record: 0 with rec
 * filled, 1 while no watch has told yet, ST_EPROTO (logged). */
static int resolve_peer(mb_t *mb, const mb_member_t *m, mb_node_rec_t *rec)
{
    char key[MB_KEY_MAX];
    mb_kv_t *kv;
    memset(rec, 0, sizeof(*rec));
    if (mb_key(key, sizeof(key), mb->job, MB_KEY_NODE, m->node, 0, 0) != 0)
        return ST_EPROTO;
    if (!mb__mirror_lookup(mb, key, &kv))
        return 1;
    return record_addr(mb, m, key, kv ? kv->val : NULL, kv ? kv->len : 0,
                       kv ? kv->lease : 0, kv ? kv->mod : 0, rec);
}

/* ---- the peers callback's members: read once per view ---- */

static void extra_reset(mb_t *mb)
{
    for (size_t i = 0; i < mb->extra_done; i++)
        mb_node_rec_free(&mb->extra[i]);
    free(mb->extra);
    free(mb->extra_idx);
    mb->extra = NULL;
    mb->extra_idx = NULL;
    mb->n_extra = mb->extra_done = 0;
    mb->extra_gen = 0;
}

static void fetch_extra(mb_t *mb);

/* Records for the pending view, in the order asked; a bad or missing one
 * is read again (from itself on) a little later. */
static void on_extra(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    mb->extra_inflight = 0;
    mb__view_t *v = &mb->view;
    if (mb->extra_gen == 0 || mb->extra_gen != mb->pending_gen ||
        v->generation != mb->extra_gen) {
        uv_timer_start(&mb->again_timer, on_again, 0, 0); /* a newer view */
        return;
    }
    size_t n = mb->n_extra - mb->extra_done;
    n = n < MB_FETCH_OPS ? n : MB_FETCH_OPS;
    if (status != 0 || res->n_responses != n) {
        mb->extra_retry_at = uv_now(mb->loop) + MB_RETRY_MIN_MS * 2;
        mb__reconcile_soon(mb);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const etcd_result_t *r = &res->responses[i];
        const etcd_kv_t *kv = r->n_kvs > 0 ? &r->kvs[0] : NULL;
        const mb_member_t *m = &v->members[mb->extra_idx[mb->extra_done]];
        char key[MB_KEY_MAX];
        mb_key(key, sizeof(key), mb->job, MB_KEY_NODE, m->node, 0, 0);
        if (record_addr(mb, m, key, kv ? kv->value : NULL,
                        kv ? kv->value_len : 0, kv ? kv->lease : 0,
                        kv ? kv->mod_revision : 0,
                        &mb->extra[mb->extra_done]) != 0) {
            mb->extra_retry_at = uv_now(mb->loop) + MB_RETRY_MIN_MS * 2;
            mb__reconcile_soon(mb);
            return;
        }
        mb->extra_done++;
    }
    if (mb->extra_done < mb->n_extra)
        fetch_extra(mb);
    else
        uv_timer_start(&mb->again_timer, on_again, 0, 0);
}

/* One read-only txn for the next MB_FETCH_OPS records still to read. */
static void fetch_extra(mb_t *mb)
{
    size_t n = mb->n_extra - mb->extra_done;
    n = n < MB_FETCH_OPS ? n : MB_FETCH_OPS;
    char (*keys)[MB_KEY_MAX] = calloc(n, sizeof(*keys));
    etcd_op_t *ops = calloc(n, sizeof(*ops));
    int rc = keys != NULL && ops != NULL ? 0 : ST_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        size_t idx = mb->extra_idx[mb->extra_done + i];
        rc = mb_key(keys[i], MB_KEY_MAX, mb->job, MB_KEY_NODE,
                    mb->view.members[idx].node, 0, 0);
        ops[i].type = ETCD_OP_RANGE;
        ops[i].key = keys[i];
    }
    if (rc == 0)
        rc = etcd_txn(mb->etcd, NULL, 0, ops, n, NULL, 0, on_extra, mb);
    if (rc == 0)
        mb->extra_inflight = 1;
    else
        mb__reconcile_soon(mb);
    free(keys);
    free(ops);
}

/* 1 when idx is me, a neighbour or already listed. */
static int extra_skip(const mb_t *mb, size_t idx, int me, const int *nb,
                      size_t k)
{
    if ((int)idx == me)
        return 1;
    for (size_t i = 0; i < k; i++)
        if ((int)idx == nb[i])
            return 1;
    for (size_t i = 0; i < mb->n_extra; i++)
        if (mb->extra_idx[i] == idx)
            return 1;
    return 0;
}

/* The callback's members for the pending view: 0 once every record is
 * read and valid, 1 while reading (or waiting to read again). */
static int extra_ready(mb_t *mb, int me, const int *nb, size_t k)
{
    mb__view_t *v = &mb->view;
    if (mb->cb.peers == NULL)
        return 0;
    if (mb->extra_gen != v->generation) {
        if (mb->extra_inflight)
            return 1; /* its reply starts the next read */
        extra_reset(mb);
        size_t *idx = calloc(v->n_members + 1, sizeof(*idx));
        mb->extra_idx = calloc(v->n_members + 1, sizeof(*mb->extra_idx));
        mb->extra = calloc(v->n_members + 1, sizeof(*mb->extra));
        if (idx == NULL || mb->extra_idx == NULL || mb->extra == NULL) {
            free(idx);
            extra_reset(mb);
            return 1;
        }
        mb_view_t pub = {v->generation, v->step, v->members, v->n_members,
                         me, v->source_index, v->n_joiners, v->opts};
        size_t n = mb->cb.peers(&pub, idx, v->n_members, mb->data);
        for (size_t i = 0; i < n && i < v->n_members; i++)
            if (idx[i] < v->n_members && !extra_skip(mb, idx[i], me, nb, k))
                mb->extra_idx[mb->n_extra++] = idx[i];
        free(idx);
        mb->extra_gen = v->generation;
        mb->extra_retry_at = 0;
    }
    if (mb->extra_done == mb->n_extra)
        return 0;
    if (!mb->extra_inflight && uv_now(mb->loop) >= mb->extra_retry_at)
        fetch_extra(mb);
    return 1;
}

/* Hand the waiting view to on_view once its neighbours' addresses are
 * known; the other members carry none (the ring connects to neither). */
static void deliver_view(mb_t *mb)
{
    mb__view_t *v = &mb->view;
    int me = mb__find_me(mb, v), idx[2];
    size_t k = view_nbrs(v, me, idx), got = 0;
    mb_node_rec_t recs[2];
    mb_member_t *members = calloc(v->n_members, sizeof(*members));
    if (members == NULL || me < 0) {
        free(members);
        return;
    }
    memcpy(members, v->members, v->n_members * sizeof(*members));
    members[me].addr = mb->me.addr;
    members[me].addr_len = mb->me.addr_len;
    for (; got < k; got++) {
        if (resolve_peer(mb, &v->members[idx[got]], &recs[got]) != 0)
            break;
        members[idx[got]].addr = recs[got].member.addr;
        members[idx[got]].addr_len = recs[got].member.addr_len;
    }
    if (got == k && extra_ready(mb, me, idx, k) == 0) {
        for (size_t i = 0; i < mb->n_extra; i++) {
            members[mb->extra_idx[i]].addr = mb->extra[i].member.addr;
            members[mb->extra_idx[i]].addr_len =
                mb->extra[i].member.addr_len;
        }
        mb->delivered_gen = v->generation;
        mb->pending_gen = 0;
        for (int i = 0; i < 2; i++) {
            free(mb->nbrs[i]);
            mb->nbrs[i] = (size_t)i < k ? strdup(v->members[idx[i]].node)
                                        : NULL;
        }
        update_peers(mb);
        mb__transition(mb, MB_EV_IN_VIEW, "view installed");
        mb_view_t pub = {v->generation, v->step, members, v->n_members, me,
                         v->source_index, v->n_joiners, v->opts};
        RD_INFO("mb %s: view %llu, %zu members, index %d", mb->me.node,
                (unsigned long long)v->generation, v->n_members, me);
        if (mb->cb.on_view != NULL)
            mb->cb.on_view(&pub, mb->data);
    }
    for (size_t i = 0; i < got && i < k; i++)
        mb_node_rec_free(&recs[i]);
    free(members);
}

/* Parse the view key when it changed; a new view with us waits in
 * pending_gen for its neighbours' records. */
static void take_view(mb_t *mb, const mb_kv_t *kv)
{
    mb__view_t v;
    mb->view_mod = kv->mod;
    if (mb__view_accept(mb, kv, &v) != 0)
        return;
    mb__view_free(&mb->view);
    mb->view = v;
    if (v.generation <= mb->delivered_gen)
        return;
    mb->pending_gen = 0;
    if (mb__find_me(mb, &v) < 0) {
        update_peers(mb);
        if (mb->state == MB_ACTIVE)
            mb__transition(mb, MB_EV_LEASE_LOST, "left out of a new view");
        return;
    }
    mb->pending_gen = v.generation;
    update_peers(mb);
}

static void install_view(mb_t *mb)
{
    mb_kv_t *kv = mb__mirror_find(mb, mb->view_key);
    if (kv != NULL && kv->mod != mb->view_mod)
        take_view(mb, kv);
    if (mb__holds_lease(mb->state) && mb->pending_gen != 0 &&
        mb->pending_gen == mb->view.generation)
        deliver_view(mb);
}

/* The member's own watches have all read their keys, its record up to
 * the registration: acting earlier would take a missing key for a
 * deleted one. */
static int mirror_ready(mb_t *mb)
{
    for (int i = MB_W_SELF; i <= MB_W_DRAIN; i++)
        if (!mb->mirrors[i].synced)
            return 0;
    return mb->mirrors[MB_W_SELF].rev >= mb->my_key_rev;
}

/* Act on the mirror; see the top of the file. */
void mb__reconcile(mb_t *mb)
{
    if (!mb__holds_lease(mb->state) || !mirror_ready(mb))
        return;
    mb_kv_t *mine = mb__mirror_find(mb, mb->my_key);
    if (mine == NULL || mine->lease != mb->lease) {
        mb__transition(mb, MB_EV_LEASE_LOST, "node record gone (evicted)");
        return;
    }
    install_view(mb);
    if (!mb__holds_lease(mb->state))
        return;
    if (drain_wanted(mb) &&
        (mb->state == MB_JOINING || mb->state == MB_ACTIVE)) {
        mb__transition(mb, MB_EV_DRAIN, "drain requested");
        if (!mb__holds_lease(mb->state))
            return;
    }
    if (mb__mirror_find(mb, mb->leader_key) == NULL)
        mb__campaign(mb);
    else
        mb__suspects_recheck(mb);
    if (mb__leader_watches(mb, mb__is_leader(mb))) {
        mb__handle_suspects(mb);
        mb__schedule_settle(mb);
    } else {
        memset(mb->blame_revoked, 0, sizeof(mb->blame_revoked));
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
    mb__transition(mb, MB_EV_LEFT, status == 0 ? "lease revoked"
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

/* The one place states change. Exit actions first (a state holding a
 * lease stops its timers when it is left), then the new state's entry. */
void mb__transition(mb_t *mb, mb_event_t ev, const char *why)
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
        mb__stop_lease_timers(mb);
    mb->state = next;
    switch (next) {
    case MB_REGISTERING:
        mb->retry_ms = MB_RETRY_MIN_MS;
        mb__reg_begin(mb);
        break;
    case MB_JOINING:
        mb__enter_joining(mb);
        break;
    case MB_FENCED:
        mb__enter_fenced(mb);
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

/* The leader's options for a first view, re-printed compact; NULL
 * stays NULL. */
static int copy_view_opts(mb_t *mb, const char *opts)
{
    if (opts == NULL)
        return 0;
    const char *why = "not JSON";
    cJSON *j = cJSON_Parse(opts);
    int rc = j != NULL ? mb__opts_text(j, &mb->view_opts, &why) : ST_EPROTO;
    cJSON_Delete(j);
    if (rc != 0)
        RD_ERROR("mb: invalid view options (%s): %.100s", why, opts);
    return rc == ST_EPROTO ? ST_ECONFIG : rc;
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
    rc = copy_view_opts(mb, cfg->view_opts);
    if (rc != 0)
        goto err_secret;
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
                            &mb->again_timer, &mb->sus_timer,
                            &mb->blame_timer};
    mb->sus_retry_ms = MB_RETRY_MIN_MS;
    for (int i = 0; i < 7; i++) {
        uv_timer_init(loop, timers[i]);
        timers[i]->data = mb;
    }
    *mb_p = mb;
    return 0;

err_secret:
    free(mb->view_opts);
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
    mb__transition(mb, MB_EV_START, "mb_start");
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
    mb__transition(mb, MB_EV_LEAVE, "mb_leave");
    return 0;
}

mb_state_t mb_state(const mb_t *mb)
{
    return mb->state;
}

/* Only the leader and a node's ring neighbours watch its record; for
 * anyone else the view stands in: the leader drops a member whose record
 * is gone. */
int mb_member_alive(mb_t *mb, const char *node, int64_t lease)
{
    char key[MB_KEY_MAX];
    mb_kv_t *kv;
    if (mb_key(key, sizeof(key), mb->job, MB_KEY_NODE, node, 0, 0) != 0)
        return 0;
    if (mb__mirror_lookup(mb, key, &kv))
        return kv != NULL && kv->lease == lease;
    for (size_t i = 0; i < mb->view.n_members; i++)
        if (mb->view.members[i].lease == lease &&
            strcmp(mb->view.members[i].node, node) == 0)
            return 1;
    return 0;
}

int mb_is_leader(const mb_t *mb)
{
    return mb__is_leader((mb_t *)mb);
}

int64_t mb_lease(const mb_t *mb)
{
    return mb->lease;
}

void mb_blame_stats(const mb_t *mb, mb_blame_stats_t *stats_p)
{
    *stats_p = mb->blame;
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
    mb__mirrors_free(mb);
    free(mb->nbrs[0]);
    free(mb->nbrs[1]);
    extra_reset(mb);
    mb__member_free(&mb->me);
    if (mb->secret != NULL)
        OPENSSL_cleanse(mb->secret, mb->secret_len);
    free(mb->secret);
    free(mb->view_opts);
    free(mb);
}

void mb_destroy(mb_t *mb)
{
    if (mb == NULL)
        return;
    mb__stop_watches(mb);
    etcd_destroy(mb->etcd);
    mb->n_closing = 7;
    uv_close((uv_handle_t *)&mb->sus_timer, mb_close_cb);
    uv_close((uv_handle_t *)&mb->blame_timer, mb_close_cb);
    uv_close((uv_handle_t *)&mb->again_timer, mb_close_cb);
    uv_close((uv_handle_t *)&mb->ka_timer, mb_close_cb);
    uv_close((uv_handle_t *)&mb->fence_timer, mb_close_cb);
    uv_close((uv_handle_t *)&mb->retry_timer, mb_close_cb);
    uv_close((uv_handle_t *)&mb->settle_timer, mb_close_cb);
}