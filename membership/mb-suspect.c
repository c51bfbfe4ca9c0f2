/*
 * mb-suspect.c - a member's suspicions: the report it puts on a failed
 * peer (suspect/<node>/<by>), kept and tried again through an etcd
 * outage, the revoke of a suspected leader's lease, which is the
 * reporter's to do, and the check of its own path before a report in a
 * view of two (membership/README.md, "Suspicion" and "Blame"). The
 * leader's verdict on the reports is mb-leader.c's.
 */
#include "membership/mb-int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/log.h"
#include "common/status.h"

/* A report's grace ends, or a reporter's read of the reports is due:
 * judge again (the leader) and read again (a leader's reporter). */
static void on_blame_timer(uv_timer_t *t)
{
    mb_t *mb = t->data;
    mb__reconcile(mb);
    mb__blame_checks(mb);
}

void mb__blame_wake(mb_t *mb, uint64_t ms)
{
    uv_timer_start(&mb->blame_timer, on_blame_timer, ms, 0);
}

/*
 * A suspicion made while etcd is down would be lost with its request,
 * and a restarted etcd renews the dead node's lease for a full TTL: the
 * next view would count it, or, when it led, the election would wait for
 * its lease to run out. So each suspicion is kept in sus[] until etcd
 * took it or it is moot, and tried again with a backoff, at once when
 * etcd answers again. A report that failed once is acted on by its
 * reporter too (it revokes the suspect's lease): meanwhile the leader may
 * be the dead node, or this node may have been fenced and registered
 * again, and a report under a lease the view does not name is ignored.
 * Not so for a soft report (mb_suspect_soft), whose reporter may be the
 * one at fault.
 */
static void sus_arm(mb_t *mb);
static void sus_revoke(mb_t *mb, mb__sus_t *p);
static void self_probe(mb_t *mb, mb__sus_t *p);

static int view_names(const mb__view_t *v, const char *node, int64_t lease)
{
    for (size_t i = 0; i < v->n_members; i++)
        if (v->members[i].lease == lease &&
            strcmp(v->members[i].node, node) == 0)
            return 1;
    return 0;
}

/* Nothing left to do for the slot: done, or the view dropped it. */
static int sus_moot(mb_t *mb, const mb__sus_t *p)
{
    if (mb->state == MB_IDLE || mb->state == MB_LEAVING ||
        mb->state == MB_LEFT)
        return 1;
    if (!view_names(&mb->view, p->node, p->lease))
        return 1; /* a later view dropped that incarnation */
    /* A later view left out this node's incarnation of the suspicion:
     * the others went on without us, so it was us who were cut off (a
     * link down), and a suspect we lost sight of meanwhile is no news.
     * Revoking it when the link comes back would evict a healthy node.
     * After an etcd outage no view was written: the suspicion holds. */
    if (mb->view.generation > p->gen &&
        !view_names(&mb->view, mb->me.node, p->my_lease))
        return 1;
    /* A suspicion of ours (mb_suspect) is kept while the view names the
     * suspect, even once its key is stored: this node may learn only
     * later that the suspect leads (the leader key comes on its own
     * watch), and then the revoke is ours (mb__suspects_recheck). */
    if (p->revoked)
        return 1;
    /* A soft report is kept while this view stands, so that saying it
     * again does not restart its grace at the leader; a later view that
     * still names the suspect has judged it. */
    return !p->may_revoke && mb->view.generation > p->gen;
}

static void sus_free(mb__sus_t *p)
{
    if (p->inflight == 0)
        p->lease = 0;
}

static void on_sus_put(int status, const etcd_result_t *res, void *data)
{
    mb__sus_t *p = data;
    mb_t *mb = p->mb;
    (void)res;
    p->inflight--;
    if (status == 0) {
        p->put_ok = 1;
        mb->blame.reported[p->kind]++;
        mb->sus_retry_ms = MB_RETRY_MIN_MS;
        if (sus_moot(mb, p))
            sus_free(p);
        else if (p->revoke) /* learnt meanwhile that the suspect leads */
            sus_revoke(mb, p);
        else if (p->leader_check)
            mb__blame_checks(mb);
        return;
    }
    p->revoke = p->may_revoke; /* see above: the reporter acts on it */
    uv_update_time(mb->loop);
    p->failed_ms = uv_now(mb->loop);
    sus_arm(mb);
}

static void on_sus_revoked(int status, const etcd_result_t *res, void *data)
{
    mb__sus_t *p = data;
    mb_t *mb = p->mb;
    (void)res;
    p->inflight--;
    if (status == 0 || status == -ENOENT) {
        if (p->revoke)
            RD_INFO("mb %s: the lease %llx of suspect %s is revoked",
                    mb->me.node, (unsigned long long)p->lease, p->node);
        p->revoke = 0;
        p->revoked = 1; /* its record is gone: nothing left to report */
        mb->sus_retry_ms = MB_RETRY_MIN_MS;
        if (sus_moot(mb, p))
            sus_free(p);
        return;
    }
    sus_arm(mb);
}

static int sus_put(mb_t *mb, mb__sus_t *p)
{
    char key[MB_KEY_MAX], ls[32], mine[32], sig[MB_SIG_HEX];
    const char *kind = mb__blame_name(p->kind);
    if (mb__suspect_key(mb, p->node, mb->me.node, key) != 0)
        return ST_EINVAL;
    snprintf(ls, sizeof(ls), "%lld", (long long)p->lease);
    snprintf(mine, sizeof(mine), "%lld", (long long)mb->lease);
    int rc = mb__suspect_sign(mb, key, ls, mb->me.node, mine, kind, sig);
    if (rc != 0)
        return rc;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "by", mb->me.node);
    cJSON_AddStringToObject(o, "why", p->why);
    cJSON_AddStringToObject(o, "lease", ls);
    cJSON_AddStringToObject(o, "kind", kind);
    cJSON_AddStringToObject(o, "by_lease", mine);
    if (sig[0] != '\0')
        cJSON_AddStringToObject(o, "sig", sig);
    char *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    rc = json ? etcd_put(mb->etcd, key, json, strlen(json), mb->lease,
                         on_sus_put, p)
              : ST_ENOMEM;
    free(json);
    if (rc == 0)
        p->inflight++;
    return rc;
}

static void sus_revoke(mb_t *mb, mb__sus_t *p)
{
    if (etcd_lease_revoke(mb->etcd, p->lease, on_sus_revoked, p) == 0)
        p->inflight++;
}

/* 1 when the stored view names us under the lease we hold: the leader
 * takes a report signed only by such a member. */
static int named_in_view(mb_t *mb)
{
    return mb__holds_lease(mb->state) && mb->lease != 0 &&
           view_names(&mb->view, mb->me.node, mb->lease);
}

/*
 * Whether a revoke of ours may go out now. A request sent while this
 * node cannot reach etcd is not lost for sure: it may arrive when the
 * path comes back (a relay, a connection that resumes), and if it was
 * this node that was cut off, it would evict a healthy member then. So
 * once etcd failed this suspicion, its revoke waits until etcd has
 * answered this node again: a renewal of the lease it holds (etcd was
 * out, not us), or, fenced, the verdict on its old lease: alive (etcd
 * restarted) or gone, and then mb__suspects_forget has dropped it.
 */
static int revoke_ok(const mb_t *mb, const mb__sus_t *p)
{
    if ((mb->state == MB_FENCED || mb->state == MB_REGISTERING) &&
        mb->old_lease != 0)
        return 0;
    return p->failed_ms == 0 || mb->etcd_ok_ms > p->failed_ms;
}

/* Send what a slot still needs: the key while the leader would take it
 * from us, else the revoke, ours to do then (when etcd answers us). */
static void sus_send(mb_t *mb, mb__sus_t *p)
{
    if (!p->put_ok && !named_in_view(mb)) {
        p->revoke = p->may_revoke;
    } else if (!p->put_ok && sus_put(mb, p) != 0) {
        p->revoke = p->may_revoke;
        p->failed_ms = uv_now(mb->loop);
    }
    if (!p->revoke)
        return;
    if (revoke_ok(mb, p))
        sus_revoke(mb, p);
    else
        sus_arm(mb); /* a kick when etcd answers, else the backoff */
}

static void on_sus_timer(uv_timer_t *t)
{
    mb_t *mb = t->data;
    int left = 0;
    for (int i = 0; i < MB_SUSPECTS_MAX; i++) {
        mb__sus_t *p = &mb->sus[i];
        if (p->lease == 0 || p->inflight > 0)
            continue;
        if (sus_moot(mb, p)) {
            sus_free(p);
            continue;
        }
        sus_send(mb, p);
        left = 1;
    }
    if (!left)
        mb->sus_retry_ms = MB_RETRY_MIN_MS;
    mb__blame_checks(mb);
}

/* The next try of every kept suspicion after the backoff. */
static void sus_arm(mb_t *mb)
{
    if (uv_is_active((uv_handle_t *)&mb->sus_timer))
        return;
    long ms = mb->sus_retry_ms;
    mb->sus_retry_ms = ms * 2 > MB_RETRY_MAX_MS ? MB_RETRY_MAX_MS : ms * 2;
    uv_timer_start(&mb->sus_timer, on_sus_timer, (uint64_t)ms, 0);
}

/* A suspected leader cannot act on it: it would keep its lease (and
 * leadership) until the TTL runs out. Its lease is ours to revoke; its
 * records go at once and a new leader is elected. */
static int suspect_leads(mb_t *mb, const char *node, int64_t lease)
{
    mb_kv_t *lk = mb__mirror_find(mb, mb->leader_key);
    return lk != NULL && lk->lease == lease && strcmp(lk->val, node) == 0;
}

/* Whether this node may act on a soft suspicion of the leader: the view
 * has others who would report it too. */
static int soft_leader(mb_t *mb, const mb__sus_t *p)
{
    return !p->may_revoke && mb->view.n_members > 2 &&
           suspect_leads(mb, p->node, p->lease);
}

/* The mirror changed: a kept suspicion whose suspect turns out to lead
 * (its leader key arrived after the suspicion) is revoked by us now, not
 * after the dead leader's TTL; a soft one is judged on the reports. */
void mb__suspects_recheck(mb_t *mb)
{
    for (int i = 0; i < MB_SUSPECTS_MAX; i++) {
        mb__sus_t *p = &mb->sus[i];
        if (p->lease == 0 || p->revoke || p->revoked || p->leader_check)
            continue;
        if (!p->may_revoke) {
            if (soft_leader(mb, p)) {
                p->leader_check = 1;
                mb__blame_checks(mb);
            }
            continue;
        }
        if (!suspect_leads(mb, p->node, p->lease))
            continue;
        RD_INFO("mb %s: the suspect %s leads: revoking its lease %llx",
                mb->me.node, p->node, (unsigned long long)p->lease);
        p->revoke = 1;
        if (p->inflight == 0)
            sus_send(mb, p);
    }
}

/* The reports on suspect/ as read for p, judged as the leader would; the
 * reporter knows only its own report's age. */
static void on_blame_read(int status, const etcd_result_t *res, void *data)
{
    mb__sus_t *p = data;
    mb_t *mb = p->mb;
    p->inflight--;
    p->checking = 0;
    if (sus_moot(mb, p) || !p->leader_check) {
        if (sus_moot(mb, p))
            sus_free(p);
        return;
    }
    if (status != 0) {
        sus_arm(mb); /* read again with the retries (on_sus_timer) */
        return;
    }
    if (!suspect_leads(mb, p->node, p->lease)) {
        p->leader_check = 0; /* a new leader judges it */
        if (sus_moot(mb, p))
            sus_free(p);
        return;
    }
    uint64_t now = uv_now(mb->loop), wake = 0;
    char mine[MB_KEY_MAX];
    mb__report_t *rs = calloc(res->n_kvs + 1, sizeof(*rs));
    if (rs == NULL || mb__suspect_key(mb, p->node, mb->me.node, mine) != 0) {
        free(rs);
        return;
    }
    for (size_t i = 0; i < res->n_kvs; i++) {
        const etcd_kv_t *kv = &res->kvs[i];
        uint64_t age = strcmp(kv->key, mine) == 0 ? now - p->t0_ms : 0;
        mb__report_parse(mb, kv->key, kv->value, kv->value_len, age, &rs[i]);
    }
    int guilty = mb__convicted(mb, rs, res->n_kvs, p->node, p->lease, &wake);
    free(rs);
    if (guilty) {
        RD_INFO("mb %s: the suspect %s leads and the reports convict it: "
                "revoking its lease %llx", mb->me.node, p->node,
                (unsigned long long)p->lease);
        p->leader_check = 0;
        p->revoke = 1;
        mb->blame.convicted++;
        sus_send(mb, p);
    } else {
        p->check_at = now + (wake ? wake : MB_BLAME_GRACE_MS);
        mb__blame_wake(mb, p->check_at - now + 1);
    }
}

void mb__blame_checks(mb_t *mb)
{
    uint64_t now = uv_now(mb->loop);
    for (int i = 0; i < MB_SUSPECTS_MAX; i++) {
        mb__sus_t *p = &mb->sus[i];
        if (p->lease == 0 || !p->leader_check || !p->put_ok ||
            p->checking || p->check_at > now)
            continue;
        if (etcd_get(mb->etcd, mb->suspect_prefix, 1, on_blame_read, p) ==
            0) {
            p->inflight++;
            p->checking = 1;
        }
    }
}

void mb__suspects_forget(mb_t *mb, int64_t lease)
{
    for (int i = 0; lease != 0 && i < MB_SUSPECTS_MAX; i++) {
        mb__sus_t *p = &mb->sus[i];
        if (p->lease == 0 || p->my_lease != lease || p->put_ok)
            continue;
        RD_INFO("mb %s: dropping the suspicion of %s: this node's lease "
                "expired while it was cut off, the job went on without it",
                mb->me.node, p->node);
        p->revoke = p->may_revoke = 0;
        p->put_ok = 1; /* nothing left to send: moot */
        sus_free(p);
    }
}

void mb__suspects_kick(mb_t *mb)
{
    for (int i = 0; i < MB_SUSPECTS_MAX; i++) {
        if (mb->sus[i].lease != 0 && mb->sus[i].inflight == 0) {
            mb->sus_retry_ms = MB_RETRY_MIN_MS;
            uv_timer_start(&mb->sus_timer, on_sus_timer, 0, 0);
            return;
        }
    }
}

/* The slot of (node, lease): the one already kept, else a free one;
 * NULL when all are taken (the lease TTL still bounds that suspect). */
static mb__sus_t *sus_slot(mb_t *mb, const char *node, int64_t lease)
{
    mb__sus_t *free_p = NULL;
    for (int i = 0; i < MB_SUSPECTS_MAX; i++) {
        mb__sus_t *p = &mb->sus[i];
        if (p->lease == lease && strcmp(p->node, node) == 0)
            return p;
        if (free_p == NULL && p->lease == 0 && p->inflight == 0)
            free_p = p;
    }
    if (free_p == NULL)
        return NULL;
    memset(free_p, 0, sizeof(*free_p));
    free_p->mb = mb;
    snprintf(free_p->node, sizeof(free_p->node), "%s", node);
    free_p->lease = lease;
    return free_p;
}

/* Send the report of slot p; a suspected leader's lease is ours to
 * revoke (a hard report, or a soft one nobody else could make), or to
 * judge on the reports (mb__blame_checks). */
static void sus_go(mb_t *mb, mb__sus_t *p, int kept)
{
    if (p->may_revoke && (kept || suspect_leads(mb, p->node, p->lease))) {
        if (!kept)
            RD_INFO("mb %s: the suspect %s leads: revoking its lease %llx",
                    mb->me.node, p->node, (unsigned long long)p->lease);
        p->revoke = 1;
    } else if (!p->may_revoke && suspect_leads(mb, p->node, p->lease)) {
        if (mb->view.n_members <= 2) {
            RD_INFO("mb %s: the suspect %s leads and nobody else could "
                    "report it: revoking its lease %llx", mb->me.node,
                    p->node, (unsigned long long)p->lease);
            p->revoke = 1;
        } else {
            p->leader_check = 1; /* judged on the reports once stored */
        }
    }
    if (p->inflight == 0)
        sus_send(mb, p);
    if (kept)
        sus_arm(mb);
}

/*
 * In a view of two, nobody else can say which end of a failing link is
 * at fault, and the leader convicts on one soft report. So the reporter
 * first checks its own path: MB_SELF_PROBES reads of its record, each
 * answered within MB_SELF_SLOW_MS. A node whose own network loses
 * packets (its reads wait on retransmissions) withholds the report; the
 * healthy end's report convicts it instead.
 */
static void on_self_probe(int status, const etcd_result_t *res, void *data)
{
    mb__sus_t *p = data;
    mb_t *mb = p->mb;
    (void)res;
    p->inflight--;
    uint64_t rtt = uv_now(mb->loop) - p->probe_t0;
    if (sus_moot(mb, p) || mb->view.n_members > 2) {
        p->probing = 0;
        if (sus_moot(mb, p))
            sus_free(p);
        else
            sus_go(mb, p, 0);
        return;
    }
    if (status != 0 || rtt > mb__path_slow_ms(mb)) {
        RD_WARN("mb %s: not reporting %s: this node's own path to etcd is "
                "slow (a read took %llu ms%s), so the fault may be its own",
                mb->me.node, p->node, (unsigned long long)rtt,
                status != 0 ? " and failed" : "");
        p->probing = 0;
        p->lease = 0; /* withheld: a later report probes again */
        mb->blame.withheld++;
        return;
    }
    if (++p->probe_n < MB_SELF_PROBES) {
        self_probe(mb, p);
        return;
    }
    p->probing = 0;
    sus_go(mb, p, 0);
}

static void self_probe(mb_t *mb, mb__sus_t *p)
{
    p->probing = 1;
    uv_update_time(mb->loop);
    p->probe_t0 = uv_now(mb->loop);
    if (etcd_get(mb->etcd, mb->my_key, 0, on_self_probe, p) == 0) {
        p->inflight++;
    } else {
        p->probing = 0;
        p->lease = 0;
    }
}

static int suspect_put(mb_t *mb, const char *node, const char *why,
                       mb_blame_t kind)
{
    int64_t lease = mb__view_lease(mb, node);
    /* Fenced or registering again, the suspicion is kept for when etcd
     * takes this node back. */
    int kept = mb->state == MB_FENCED || mb->state == MB_REGISTERING;
    if ((!mb__holds_lease(mb->state) && !kept) || lease == 0 ||
        (unsigned)kind > MB_BLAME_HARD) {
        RD_ERROR("mb %s: cannot suspect %s (state %s, %s)", mb->me.node,
                 node, mb_state_name(mb->state),
                 lease ? "known" : "not in the current view");
        return ST_EINVAL;
    }
    mb__sus_t *p = sus_slot(mb, node, lease);
    if (p == NULL) {
        RD_WARN("mb %s: suspects %s: %d suspicions already kept; its lease "
                "bounds this one", mb->me.node, node, MB_SUSPECTS_MAX);
        return -EAGAIN;
    }
    int fresh = p->t0_ms == 0;
    uint64_t now = uv_now(mb->loop);
    if (!fresh && kind < p->kind)
        return 0;
    if (!fresh && kind == p->kind &&
        (kind != MB_BLAME_LOSSY || now - p->t0_ms <= MB_BLAME_FRESH_MS))
        return 0; /* said already (a lossy report is renewed when stale) */
    if (!fresh)
        p->put_ok = 0; /* a stronger report replaces ours */
    p->kind = kind;
    p->t0_ms = now;
    snprintf(p->why, sizeof(p->why), "%s", why ? why : "");
    p->may_revoke |= kind == MB_BLAME_HARD;
    p->gen = mb->view.generation;
    p->my_lease = mb->lease;
    RD_INFO("mb %s: suspects %s (%s): %s%s", mb->me.node, node,
            mb__blame_name(kind), p->why,
            kept ? " (kept until etcd takes this node back)" : "");
    if (!p->may_revoke && !kept && mb->view.n_members <= 2) {
        self_probe(mb, p); /* the report goes out if our path is sound */
        return 0;
    }
    sus_go(mb, p, kept);
    return 0;
}

int mb_suspect(mb_t *mb, const char *node, const char *why)
{
    return suspect_put(mb, node, why, MB_BLAME_HARD);
}

int mb_suspect_soft(mb_t *mb, const char *node, mb_blame_t kind,
                    const char *why)
{
    if (kind == MB_BLAME_HARD)
        return ST_EINVAL;
    return suspect_put(mb, node, why, kind);
}

