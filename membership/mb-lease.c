/*
 * mb-lease.c - membership: registration (lease grant, node record),
 * keepalive, the fence at the lease deadline and riding out an etcd
 * outage on the caller's collectives, and the lease-holding states'
 * entry and exit actions.
 */
#include "membership/mb-int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"

static void on_retry_timer(uv_timer_t *t)
{
    mb_t *mb = t->data;
    if (mb->state == MB_FENCED)
        mb__transition(mb, MB_EV_RETRY, "etcd retry");
    else if (mb->state == MB_REGISTERING)
        mb__reg_begin(mb);
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
    mb->retry_ms = mb->retry_ms * 2 > MB_REG_RETRY_MAX_MS
                       ? MB_REG_RETRY_MAX_MS : mb->retry_ms * 2;
}

static void schedule_retry(mb_t *mb)
{
    schedule_retry_after(mb, 0, NULL);
}

/*
 * The lease deadline passed with etcd unreachable. Nobody can write a
 * view while etcd is down, so the view this node runs is still the job's
 * and it may keep training in it, provided something other than etcd
 * stops it should the outage be only ours (a partition: etcd expires our
 * lease and the others move to a newer generation without us). That
 * fence is the caller's collectives (mb_ring_progress): one that every
 * member of the view completed proves they all still run it, and the
 * ring drops messages of other generations, so a node the others left
 * behind completes none. They stand in for the lease: a TTL without one
 * (the others gone, or steps with no collective, which a node could
 * complete alone) fences, as a lease would. A node alone in its view has
 * no such proof: it fences. So does one that saw no keepalive fail while
 * it ran (stopped past its deadline, it may wake to a job that moved on)
 * or whose user has no collectives to offer (ride_outage 0).
 */
static int may_ride_outage(mb_t *mb)
{
    return mb->ride_outage && mb->etcd_unreach && mb->state == MB_ACTIVE &&
           mb->view.n_members >= 2 &&
           mb->view.generation == mb->delivered_gen &&
           mb__find_me(mb, &mb->view) >= 0;
}

/* Riding out: the collectives' stand-in for the lease ran out. */
static int ride_expired(mb_t *mb)
{
    return uv_now(mb->loop) >= mb->ring_ok_ms + (uint64_t)mb->ttl_s * 1000;
}

/* Past the lease deadline: 1 when riding out an outage (from now on,
 * if not yet) with a collective in the last TTL, 0 when this node must
 * fence. */
static int ride_outage(mb_t *mb)
{
    if (mb->outage_since_ms == 0) {
        if (!may_ride_outage(mb) || ride_expired(mb))
            return 0;
        mb->outage_since_ms = uv_now(mb->loop);
        RD_WARN("mb %s: etcd unreachable past the lease deadline: keeping "
                "view %llu and training while every ring member does",
                mb->me.node, (unsigned long long)mb->view.generation);
    }
    if (ride_expired(mb)) {
        RD_WARN("mb %s: no collective of view %llu completed for a lease "
                "TTL with etcd unreachable", mb->me.node,
                (unsigned long long)mb->view.generation);
        return 0;
    }
    return 1;
}

static void on_fence_timer(uv_timer_t *t)
{
    mb_t *mb = t->data;
    if (!mb__holds_lease(mb->state))
        return;
    if (!ride_outage(mb)) {
        mb__transition(mb, MB_EV_LEASE_LOST, "lease not renewed in time");
        return;
    }
    uint64_t at = mb->ring_ok_ms + (uint64_t)mb->ttl_s * 1000;
    uint64_t now = uv_now(mb->loop);
    uv_timer_start(&mb->fence_timer, on_fence_timer, at > now ? at - now : 0,
                   0);
}

void mb_ring_progress(mb_t *mb)
{
    mb->ring_ok_ms = uv_now(mb->loop);
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
    mb->etcd_ok_ms = uv_now(mb->loop);
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
    mb__transition(mb, MB_EV_LEASE_LOST, "etcd refused credentials");
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
        mb__transition(mb, MB_EV_LEASE_LOST, "lease expired or revoked");
        return;
    }
    keepalive_renewed(mb);
    uint64_t rtt = uv_now(mb->loop) - mb->ka_sent_ms;
    mb->etcd_srtt_ms = mb->etcd_srtt_ms == 0
                           ? rtt + 1
                           : (7 * mb->etcd_srtt_ms + rtt) / 8 + 1;
    mb__suspects_kick(mb);
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
        mb->old_alive = 0;
        mb->lease = 0;
        schedule_retry_after(mb, status, "the node record");
        return;
    }
    mb->denied = 0;
    mb->my_key_rev = res->revision;
    mb__transition(mb, MB_EV_REGISTERED, "node record written");
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
    mb__suspects_kick(mb);
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

/*
 * A node that lost its place in the job (evicted, or its lease ran out)
 * may have lost it through its own network: a node whose link loses
 * packets is convicted by its neighbours, and one that registered again
 * at once would hold up the next view's first collective until the loss
 * ends. So before it registers again it reads a key MB_SELF_PROBES
 * times; any read slower than mb__path_slow_ms, and it waits a retry and
 * reads again, for at most MB_PATH_WAIT_MS (then it registers anyway: a
 * path that stays slow is the network it has).
 */
static void grant_when_sound(mb_t *mb);

static void on_path_probe(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    (void)res;
    mb->path_inflight = 0;
    if (mb->state != MB_REGISTERING || mb->path_gen != mb->reg_gen)
        return;
    uint64_t now = uv_now(mb->loop), rtt = now - mb->path_t0;
    if (status != 0 || rtt > mb__path_slow_ms(mb)) {
        if (mb->path_slow_logged == 0)
            RD_WARN("mb %s: this node's path to etcd is slow (a read took "
                    "%llu ms%s): joining again once it is sound, or in %d "
                    "s", mb->me.node, (unsigned long long)rtt,
                    status != 0 ? " and failed" : "", MB_PATH_WAIT_MS / 1000);
        mb->path_slow_logged = 1;
        mb->path_ok = 0;
        uv_timer_start(&mb->retry_timer, on_retry_timer, MB_RETRY_MIN_MS, 0);
        return;
    }
    if (++mb->path_ok < MB_SELF_PROBES) {
        grant_when_sound(mb);
        return;
    }
    if (mb->path_slow_logged)
        RD_INFO("mb %s: this node's path to etcd is sound again", mb->me.node);
    mb->path_check = 0;
    grant(mb);
}

static void grant_when_sound(mb_t *mb)
{
    uv_update_time(mb->loop);
    uint64_t now = uv_now(mb->loop);
    if (!mb->path_check || now - mb->path_since >= MB_PATH_WAIT_MS) {
        mb->path_check = 0;
        grant(mb);
        return;
    }
    if (mb->path_inflight)
        return;
    mb->path_t0 = now;
    mb->path_gen = mb->reg_gen;
    if (etcd_get(mb->etcd, mb->leader_key, 0, on_path_probe, mb) == 0)
        mb->path_inflight = 1;
    else
        schedule_retry(mb);
}

uint64_t mb__path_slow_ms(const mb_t *mb)
{
    return MB_SELF_SLOW_MS + 2 * mb->etcd_srtt_ms;
}

static void on_old_revoked(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    (void)res;
    if (mb->state != MB_REGISTERING)
        return;
    if (status != 0 && status != -ENOENT) {
        /* etcd is not answering yet, or refuses us */
        schedule_retry_after(mb, status, "the old lease's revoke");
        return;
    }
    mb->old_lease = 0;
    mb->old_alive = 0;
    mb__suspects_kick(mb); /* etcd is back: the dead go before the view */
    grant_when_sound(mb);
}

/*
 * Whether the lost lease still lives, asked before it is revoked: alive,
 * etcd was out (a restart renews every lease) and what we suspected
 * under it holds; gone, it expired while etcd ran, so the job went on
 * without us and what we suspected is no news. A read, unlike the
 * revoke: one that timed out but was applied cannot make a later answer
 * lie (it did: a revoke sent while etcd restarted, applied and not
 * answered, made the retry's "not found" look like an expiry).
 */
static void on_old_ttl(int status, const etcd_result_t *res, void *data)
{
    mb_t *mb = data;
    if (mb->state != MB_REGISTERING)
        return;
    if (status != 0) {
        schedule_retry_after(mb, status, "the old lease's check");
        return;
    }
    if (res->ttl > 0) {
        mb->old_alive = 1;
        mb->etcd_ok_ms = uv_now(mb->loop); /* it lived: etcd was out */
        if (etcd_lease_revoke(mb->etcd, mb->old_lease, on_old_revoked,
                              mb) != 0)
            schedule_retry(mb);
        return;
    }
    mb__suspects_forget(mb, mb->old_lease);
    mb->old_lease = 0;
    mb__suspects_kick(mb);
    grant_when_sound(mb);
}

/* Give back a lost lease first: after an etcd restart it comes back to
 * life for a TTL, and with it our old leader key. */
void mb__reg_begin(mb_t *mb)
{
    mb->reg_gen++;
    if (mb->old_lease == 0) {
        grant_when_sound(mb);
        return;
    }
    int rc = mb->old_alive
                 ? etcd_lease_revoke(mb->etcd, mb->old_lease, on_old_revoked,
                                     mb)
                 : etcd_lease_timetolive(mb->etcd, mb->old_lease, on_old_ttl,
                                         mb);
    if (rc != 0)
        schedule_retry(mb);
}

void mb__stop_lease_timers(mb_t *mb)
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

void mb__enter_joining(mb_t *mb)
{
    uint64_t period = (uint64_t)mb->ttl_s * 1000 / 3;
    mb->retry_ms = MB_RETRY_MIN_MS;
    mb->ka_gen = mb->reg_gen;
    uv_timer_start(&mb->ka_timer, on_ka_timer, period, period);
    mb__restart_watch(mb);
}

void mb__enter_fenced(mb_t *mb)
{
    /* Check our own path before registering again (grant_when_sound). */
    mb->path_check = 1;
    mb->path_ok = 0;
    mb->path_slow_logged = 0;
    mb->path_since = uv_now(mb->loop);
    mb->old_alive = 0;
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

int mb_lease_valid(mb_t *mb)
{
    if (!mb__holds_lease(mb->state) || mb->lease == 0)
        return 0;
    uv_update_time(mb->loop); /* after a stop, the cached time is old */
    /* Past the deadline before the fence timer ran: decide as it will. */
    return uv_now(mb->loop) < mb->fence_at_ms || ride_outage(mb);
}
