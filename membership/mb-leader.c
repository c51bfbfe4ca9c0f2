/*
 * mb-leader.c - the leader's duties and the requests that reach it:
 * campaigning, writing views, revoking convicted suspects (the reports
 * themselves are mb-suspect.c's), and reshape requests
 * (a member asks for a new generation of the same member list).
 *
 * A reshape exists for failures that etcd cannot see: a node whose local
 * trainer died in the middle of a step cannot finish that step, and its
 * ring neighbours wait for it. Its daemon is healthy, so no lease expires
 * and no endpoint fails; the node puts reshape/<node> naming the
 * generation it wants replaced, the leader writes generation g+1 with the
 * same members, and every member aborts what runs on the old ring and
 * agrees on the step again (daemon/README.md, "The ring backend").
 */
#include "membership/mb-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/log.h"
#include "common/status.h"

/* Said once per version of the record. */
static void record_refused(mb_t *mb, const mb_kv_t *kv)
{
    if (kv->mod <= mb->refused_rec_mod)
        return;
    mb->refused_rec_mod = kv->mod;
    RD_WARN("mb %s: ignoring the registration %s: not signed with the job "
            "secret for its lease", mb->me.node, kv->key);
}

/* The live set: every node record in the mirror (a record exists exactly
 * as long as its lease), less the convicted suspects (mb-blame.c): their
 * leases are being revoked, and waiting for each record's deletion would
 * write one view per dead node where one view can drop them all. Returns
 * the count; members are owned copies. */
static size_t collect_alive(mb_t *mb, mb_member_t **out)
{
    const mb_mirror_t *s = &mb->mirrors[MB_W_NODES];
    size_t plen = strlen(mb->nodes_prefix), n = 0;
    mb__report_t *rs = NULL;
    size_t nrs = mb__reports_mirror(mb, &rs);
    mb_member_t *arr = calloc(s->n_kvs + 1, sizeof(*arr));
    if (arr == NULL || rs == NULL) {
        free(arr);
        free(rs);
        *out = NULL;
        return 0;
    }
    for (size_t i = 0; i < s->n_kvs; i++) {
        const mb_kv_t *kv = &s->kvs[i];
        if (strncmp(kv->key, mb->nodes_prefix, plen) != 0)
            continue;
        if (mb__convicted(mb, rs, nrs, kv->key + plen, kv->lease, NULL))
            continue;
        if (mb__node_parse(kv->key + plen, kv->val, kv->len, &arr[n]))
            continue;
        /* Signed by a holder of the secret for this key and lease: a
         * copied record under another lease is no registration. */
        if (!mb__text_sig_ok(mb, "node", kv->key, kv->val, kv->len) ||
            (mb->secret_len > 0 && arr[n].lease != kv->lease)) {
            record_refused(mb, kv);
            mb__member_free(&arr[n]);
            continue;
        }
        arr[n++].lease = kv->lease; /* the lease etcd holds it by */
    }
    free(rs);
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

/* Leader: 1 when a member asked to replace the stored view's generation.
 * Requests for an older generation were answered by a later view (any
 * new generation aborts the old ring) and are deleted, as are malformed
 * ones and those of nodes that are not members. */
static int reshape_wanted(mb_t *mb)
{
    const mb_mirror_t *s = &mb->mirrors[MB_W_RESHAPES];
    size_t plen = strlen(mb->reshape_prefix);
    int wanted = 0;
    for (size_t i = 0; i < s->n_kvs; i++) {
        const mb_kv_t *kv = &s->kvs[i];
        if (strncmp(kv->key, mb->reshape_prefix, plen) != 0)
            continue;
        cJSON *j = cJSON_ParseWithLength(kv->val, kv->len);
        int64_t gen = -1, lease = 0;
        if (rd_json_i64(j, "gen", &gen) != 0)
            gen = -1;
        rd_json_i64(j, "lease", &lease);
        cJSON_Delete(j);
        int member = 0;
        for (size_t m = 0; m < mb->view.n_members; m++)
            member |= strcmp(mb->view.members[m].node, kv->key + plen) == 0 &&
                      (mb->secret_len == 0 ||
                       lease == mb->view.members[m].lease);
        if (member &&
            !mb__text_sig_ok(mb, "reshape", kv->key, kv->val, kv->len)) {
            RD_WARN("mb %s: ignoring the reshape request %s: not signed "
                    "with the job secret", mb->me.node, kv->key);
            member = 0;
        }
        if (member && gen >= 0 && (uint64_t)gen == mb->view.generation) {
            if (!wanted)
                RD_INFO("mb %s: %s asks for a new generation of view %llu",
                        mb->me.node, kv->key + plen,
                        (unsigned long long)mb->view.generation);
            wanted = 1;
        } else if (gen < 0 || (uint64_t)gen < mb->view.generation ||
                   !member) {
            /* Only the request we read: the node may already have asked
             * again, for the view just written (a mismatch does within
             * milliseconds), and a plain delete landing after that put
             * dropped the new request (dmn_ring_size_mismatch hung). */
            etcd_cmp_t cmp = {.key = kv->key, .target = ETCD_CMP_MOD,
                              .result = ETCD_CMP_EQUAL, .number = kv->mod};
            etcd_op_t del = {.type = ETCD_OP_DELETE, .key = kv->key};
            etcd_txn(mb->etcd, &cmp, 1, &del, 1, NULL, 0, NULL, NULL);
        }
    }
    return wanted;
}

void mb__schedule_settle(mb_t *mb)
{
    if (!uv_is_active((uv_handle_t *)&mb->settle_timer))
        uv_timer_start(&mb->settle_timer, on_settle,
                       (uint64_t)mb->settle_ms, 0);
}

/* A view txn that etcd did not answer is tried again after a backoff
 * (MB_RETRY_MIN_MS doubling to MB_RETRY_MAX_MS), not a settle time later:
 * through an outage every try fails at once, and a settle time of 10 ms
 * made a busy loop of it. */
static void on_view_txn(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    int again = mb->view_again;
    mb->view_inflight = 0;
    mb->view_again = 0;
    if (status != 0) {
        long ms = mb->view_retry_ms;
        mb->view_retry_ms = ms * 2 > MB_RETRY_MAX_MS ? MB_RETRY_MAX_MS
                                                     : ms * 2;
        mb->view_tries++;
        uv_timer_stop(&mb->settle_timer);
        uv_timer_start(&mb->settle_timer, on_settle, (uint64_t)ms, 0);
        return;
    }
    mb->view_retry_ms = MB_RETRY_MIN_MS;
    mb->view_tries = 0;
    if (!res->succeeded)
        RD_DEBUG("mb %s: view txn lost a race", mb->me.node);
    if (again)
        mb__schedule_settle(mb); /* the live set moved meanwhile */
}

int mb__is_leader(mb_t *mb)
{
    mb_kv_t *kv = mb__mirror_find(mb, mb->leader_key);
    return kv != NULL && mb__holds_lease(mb->state) && mb->lease != 0 &&
           kv->lease == mb->lease && strcmp(kv->val, mb->me.node) == 0;
}

/*
 * A view no leader wrote: unsigned, badly signed, or signed but older
 * than the one we hold (a replay of an old view, which would make the
 * next leader count generations from there). Every member refuses it;
 * the leader writes the valid one back (view_restore).
 */
int mb__view_accept(mb_t *mb, const mb_kv_t *kv, mb__view_t *v)
{
    if (!mb__text_sig_ok(mb, "view", mb->view_key, kv->val, kv->len)) {
        RD_ERROR("mb %s: refusing the view at revision %lld: not signed "
                 "by a leader holding the job secret", mb->me.node,
                 (long long)kv->mod);
        mb->view_forged = 1;
        return ST_EPEER_FORGED;
    }
    if (mb__view_parse(kv->val, kv->len, v) != 0)
        return ST_EPROTO;
    if (mb->secret_len > 0 && v->generation < mb->view.generation) {
        RD_ERROR("mb %s: refusing the view at revision %lld: generation "
                 "%llu, older than view %llu (a replay)", mb->me.node,
                 (long long)kv->mod, (unsigned long long)v->generation,
                 (unsigned long long)mb->view.generation);
        mb__view_free(v);
        mb->view_forged = 1;
        return ST_EPEER_FORGED;
    }
    mb->view_forged = 0;
    return 0;
}

/* The txn of on_settle and view_restore: v replaces the stored view only
 * if that is still the one we saw (view_mod) and we still lead. */
static void view_write(mb_t *mb, const mb__view_t *v)
{
    char *json = mb__text_sign(mb, "view", mb->view_key, mb__view_json(v));
    mb_kv_t *lk = mb__mirror_find(mb, mb->leader_key);
    etcd_cmp_t cmps[2] = {
        {mb->view_key, ETCD_CMP_MOD, ETCD_CMP_EQUAL,
         mb__mirror_find(mb, mb->view_key) ? mb->view_mod : 0, NULL, 0},
        {mb->leader_key, ETCD_CMP_CREATE, ETCD_CMP_EQUAL, lk->create, NULL,
         0},
    };
    etcd_op_t put = {ETCD_OP_PUT, mb->view_key, 0, json,
                     json ? strlen(json) : 0, 0};
    if (json != NULL &&
        etcd_txn(mb->etcd, cmps, 2, &put, 1, NULL, 0, on_view_txn, mb) == 0)
        mb->view_inflight = 1;
    free(json);
}

/*
 * Leader: the key holds a view no leader wrote. Members refuse it, but it
 * would stay there until the next change of the live set; the view we
 * hold goes back at once, same generation, so that no member rebuilds
 * its ring for it (those that hold it install nothing again).
 */
static void view_restore(mb_t *mb)
{
    RD_WARN("mb %s: the view key holds a view no leader wrote: writing "
            "view %llu back", mb->me.node,
            (unsigned long long)mb->view.generation);
    view_write(mb, &mb->view);
}

/* Leader: write view g+1 if the live set differs from view g. The txn
 * holds only if view g is still the stored one and we still lead, so no
 * generation is ever written twice. */
static void on_settle(uv_timer_t *t)
{
    mb_t *mb = t->data;
    if (!mb__is_leader(mb) || !mb__leader_synced(mb))
        return; /* a partial list of records is no live set */
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
    if (changed == 0 && reshape_wanted(mb))
        changed = mb__view_renew(&mb->view, mb->step, &next);
    free_members(alive, n);
    if (changed == 0 && mb->view_forged && mb->view.generation > 0)
        view_restore(mb);
    if (changed <= 0)
        return;
    /* The job's options are fixed by its first view: a leader configured
     * otherwise carries the previous view's, never its own, as long as a
     * member of the previous view runs on (the view names a source). A
     * view of none of them starts the job anew, on its leader's. */
    const char *opts = next.source_index >= 0 && mb->view.opts != NULL
                           ? mb->view.opts : mb->view_opts;
    if (mb__view_set_opts(&next, opts) != 0) {
        mb__view_free(&next);
        return;
    }
    if (mb->view_tries == 0 && next.source_index < 0 &&
        mb->view.generation > 0)
        RD_WARN("mb %s: view %llu keeps none of view %llu's members: the "
                "job's state of step %llu is on no member; the job starts "
                "anew (from its newest checkpoint where there is one)",
                mb->me.node, (unsigned long long)next.generation,
                (unsigned long long)mb->view.generation,
                (unsigned long long)mb->view.step);
    if (mb->view_tries == 0)
        RD_INFO("mb %s: leader writes view %llu (%zu members)", mb->me.node,
                (unsigned long long)next.generation, next.n_members);
    else
        RD_DEBUG("mb %s: leader writes view %llu again (try %d)",
                 mb->me.node, (unsigned long long)next.generation,
                 mb->view_tries + 1);
    view_write(mb, &next);
    mb__view_free(&next);
}

static void on_campaign(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    mb->campaign_inflight = 0;
    if (status == 0 && res->succeeded)
        RD_INFO("mb %s: elected leader", mb->me.node);
    else if (status != 0)
        mb__reconcile_soon(mb);
}

void mb__campaign(mb_t *mb)
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
        /* try those suspects again */
        memset(mb->blame_revoked, 0, sizeof(mb->blame_revoked));
        mb__reconcile_soon(mb);
    }
}

static int blame_revoked(const mb_t *mb, int64_t lease)
{
    for (int i = 0; i < MB_SUSPECTS_MAX; i++)
        if (mb->blame_revoked[i] == lease)
            return 1;
    return 0;
}

/* Ours when the report's reporter is this node: nothing to log twice. */
static void report_dropped(mb_t *mb, const mb__report_t *r, const char *why)
{
    RD_WARN("mb %s: ignoring the suspect report %s: %s", mb->me.node,
            r->kv->key, why);
    etcd_delete(mb->etcd, r->kv->key, 0, NULL, NULL);
}

/* A key to delete: malformed or forged, a moot suspect, a lossy report
 * past its freshness. Returns 1 when it was deleted. */
static int report_sweep(mb_t *mb, const mb__report_t *r)
{
    if (!r->valid) {
        report_dropped(mb, r, "not well-formed, or not signed by a "
                              "current member with the job secret");
        return 1;
    }
    char nkey[MB_KEY_MAX];
    mb_kv_t *node = NULL;
    if (mb_key(nkey, sizeof(nkey), mb->job, MB_KEY_NODE, r->node, 0, 0) ==
        0)
        node = mb__mirror_find(mb, nkey);
    if (node == NULL || node->lease != r->lease ||
        (r->kind == MB_BLAME_LOSSY && r->age_ms > MB_BLAME_FRESH_MS)) {
        etcd_delete(mb->etcd, r->kv->key, 0, NULL, NULL);
        return 1;
    }
    return 0;
}

/* Leader: revoke the lease of every convicted suspect (mb-blame.c), so
 * its record (and any key it holds) vanishes now rather than after its
 * TTL. A report names an incarnation (lease); once that record is gone
 * (or replaced by a new incarnation), the report has done its job and is
 * deleted. A suspect not convicted yet is judged again when a report's
 * grace ends. */
void mb__handle_suspects(mb_t *mb)
{
    mb__report_t *rs = NULL;
    size_t n = mb__reports_mirror(mb, &rs);
    uint64_t wake = 0;
    for (size_t i = 0; i < n; i++) {
        mb__report_t *r = &rs[i];
        if (report_sweep(mb, r)) {
            r->valid = 0;
            continue;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const mb__report_t *r = &rs[i];
        if (!r->valid || blame_revoked(mb, r->lease) ||
            !mb__convicted(mb, rs, n, r->node, r->lease, &wake))
            continue;
        char why[256];
        mb__blame_describe(rs, n, r->node, r->lease, why, sizeof(why));
        RD_INFO("mb %s: revoking suspect %s (lease %llx): convicted on the "
                "reports of %s", mb->me.node, r->node,
                (unsigned long long)r->lease, why);
        mb->blame_revoked[mb->blame_next++ % MB_SUSPECTS_MAX] = r->lease;
        mb->blame.convicted++;
        etcd_lease_revoke(mb->etcd, r->lease, on_suspect_revoked, mb);
    }
    free(rs);
    if (wake > 0)
        mb__blame_wake(mb, wake + 1);
}

static void on_reshape_put(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    (void)res;
    if (status != 0)
        RD_WARN("mb %s: reshape request not stored: %s", mb->me.node,
                st_strerror(status));
}

int mb_request_view(mb_t *mb, const char *why)
{
    if (mb->state != MB_ACTIVE || mb->delivered_gen == 0) {
        RD_ERROR("mb %s: cannot ask for a new view in state %s",
                 mb->me.node, mb_state_name(mb->state));
        return ST_EINVAL;
    }
    char key[MB_KEY_MAX], gen[32];
    mb_key(key, sizeof(key), mb->job, MB_KEY_RESHAPE, mb->me.node, 0, 0);
    snprintf(gen, sizeof(gen), "%" PRIu64, mb->delivered_gen);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "gen", gen);
    cJSON_AddStringToObject(o, "why", why ? why : "");
    if (mb->secret_len > 0)
        rd_json_add_u64(o, "lease", (uint64_t)mb->lease);
    char *json = mb__text_sign(mb, "reshape", key, cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
    RD_INFO("mb %s: asks for a new generation of view %s: %s", mb->me.node,
            gen, why ? why : "");
    int rc = json ? etcd_put(mb->etcd, key, json, strlen(json), mb->lease,
                             on_reshape_put, mb)
                  : ST_ENOMEM;
    free(json);
    return rc;
}
