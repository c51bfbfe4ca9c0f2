/*
 * ring_wait.c - how a collective waits: the loop that turns the channel
 * engine (ring.c) until the collective is over, its idle spells (busy-poll
 * within the adaptive spin budget, then sleep on the worker's event fd),
 * the per-link deadlines checked while idle, and the wait time they add
 * up to (ring/README.md, "Threading").
 */
#include "ring/ring-int.h"

#include <inttypes.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"

#define RING_SLEEP_MAX_MS 100

/*
 * Per-link deadlines: a receive we wait for, or a send in flight, that has
 * not moved for deadline_ms names that link's neighbour. Timing each link
 * from its own last event (not from any event) makes the hung rank's right
 * neighbour, which starves first, fire first and blame the right rank;
 * the ranks further along only see the cascade. Returns 1 when one fired.
 */
/* Liveness is not progress: a rank whose daemon is alive only waits for
 * its trainer. The wait goes on (logged once per deadline); a view change
 * that removes the rank aborts the collective instead. */
static int keep_waiting(ring_t *r, uint32_t rank, int64_t quiet_ns)
{
    if (r->opts.on_quiet == NULL ||
        !r->opts.on_quiet(r->opts.on_quiet_arg, rank))
        return 0;
    RD_WARN("ring gen %" PRIu64 " seq %u: rank %u quiet for %lld ms but "
            "alive: waiting for it", r->generation, r->seq, rank,
            (long long)(quiet_ns / 1000000));
    return 1;
}

/* A channel quiet past live_ms whose neighbour is silent too (heard from
 * on this ring, then neither heartbeats nor data for live_ms): its daemon
 * stopped or the link is cut. Named at once, not at the deadline. */
static int chan_silent(ring_t *r, uint32_t rank, int64_t quiet_ns,
                       int64_t now)
{
    if (r->opts.live_ms <= 0 ||
        quiet_ns <= (int64_t)r->opts.live_ms * 1000000 ||
        !ring__silent(r, rank, now))
        return 0;
    RD_WARN("ring gen %" PRIu64 " seq %u: rank %u sent no data for %lld ms "
            "and no heartbeat for %lld ms: it stopped answering",
            r->generation, r->seq, rank, (long long)(quiet_ns / 1000000),
            (long long)((now - ring__heard(r, rank)) / 1000000));
    ring__coll_fail(r, ST_EPEER_SILENT, rank);
    return 1;
}

/* One side of a channel that waits on rank, quiet for quiet_ns: 1 when
 * the collective failed, else 0 (with *reset when the wait goes on). */
static int side_check(ring_t *r, uint32_t rank, int64_t quiet_ns,
                      int64_t now, int *reset)
{
    *reset = 0;
    if (chan_silent(r, rank, quiet_ns, now))
        return 1;
    if (quiet_ns <= (int64_t)r->opts.deadline_ms * 1000000)
        return 0;
    if (keep_waiting(r, rank, quiet_ns)) {
        *reset = 1;
        return 0;
    }
    ring__coll_fail(r, ST_EPEER_TIMEOUT, rank);
    return 1;
}

/*
 * A flat neighbour silent past live_ms fails the collective whichever
 * way the data flows: the rank it sends to finds its channel quiet, but
 * the rank that sends to it does not (its sends complete into the
 * socket), and a report from that side too is what lets membership
 * convict at once (membership/README.md, "Blame"). Heartbeats come from
 * the daemon, whatever its trainer does: this is never a slow trainer.
 * When both are silent the one silent longer is named: a live
 * neighbour starved of CPU for a moment (a loaded machine, a sanitizer
 * build) lapses after the one that stopped, and blaming it would evict
 * a live node and keep the stopped one.
 */
static int nbr_silent(ring_t *r, int64_t now)
{
    const ring_link_t *l[2] = {&r->left, &r->right};
    const ring_link_t *worst = NULL;
    int64_t worst_heard = 0;
    for (int i = 0; i < 2 && r->opts.live_ms > 0; i++) {
        if (l[i]->peer == NULL || l[i]->fail_rc != 0 ||
            l[i]->rank == r->rank || !ring__silent(r, l[i]->rank, now))
            continue;
        int64_t heard = ring__heard(r, l[i]->rank);
        if (worst == NULL || heard < worst_heard) {
            worst = l[i];
            worst_heard = heard;
        }
    }
    if (worst == NULL)
        return 0;
    RD_WARN("ring gen %" PRIu64 " seq %u: rank %u sent no heartbeat for "
            "%lld ms: it stopped answering", r->generation, r->seq,
            worst->rank, (long long)((now - worst_heard) / 1000000));
    ring__coll_fail(r, ST_EPEER_SILENT, worst->rank);
    return 1;
}

static int coll_deadline(ring_t *r, int64_t now)
{
    int reset;
    if (nbr_silent(r, now))
        return 1;
    for (unsigned i = 0; i < r->nchan; i++) {
        ring_chan_t *c = &r->chan[i];
        if (!ring__chan_recvs_done(c)) {
            if (side_check(r, c->from->rank, now - c->last_rx, now, &reset))
                return 1;
            if (reset)
                c->last_rx = now;
        }
        if (c->next_send > c->sends_done) {
            if (side_check(r, c->to->rank, now - c->last_tx, now, &reset))
                return 1;
            if (reset)
                c->last_tx = now;
        }
    }
    return 0;
}

/*
 * An idle spell of the collective loop: from the first turn without work
 * to the next turn with some.
 */
typedef struct {
    int64_t start;   /* 0: not idle */
    int64_t spun_ns; /* busy-polled before the first sleep */
    int slept;
} ring_spell_t;

/*
 * How long this spell may busy-poll. Spinning pays when the next event
 * comes within spin_us: it saves a sleep and a wakeup. When it does not
 * (a late neighbour, or one waiting for a CPU on an oversubscribed
 * machine), every spin_us spent is taken from the processes the ring
 * waits for. So the adaptive policy spins only after RING_SPIN_TRUST
 * spells in a row ended within spin_us (a single short one after a
 * sleep may be luck), and a long spell blocks the next one at once.
 */
static int64_t spin_budget_ns(const ring_t *r)
{
    if (r->opts.spin_adaptive && r->spin_credit < RING_SPIN_TRUST)
        return 0;
    return (int64_t)r->opts.spin_us * 1000;
}

/* A spell ended with work at now: count it and learn from its length. */
static void spell_end(ring_t *r, ring_spell_t *sp, int64_t now)
{
    if (!sp->slept) {
        r->stats.spin_hits++;
    } else {
        r->stats.sleeps++;
        if (sp->spun_ns >= (int64_t)r->opts.spin_us * 1000 &&
            r->opts.spin_us > 0) {
            r->stats.spin_misses++;
            r->stats.spin_waste_us += (uint64_t)sp->spun_ns / 1000;
        }
    }
    if (now - sp->start <= (int64_t)r->opts.spin_us * 1000) {
        if (r->spin_credit < RING_SPIN_TRUST)
            r->spin_credit++;
    } else {
        r->spin_credit = 0;
    }
    sp->start = 0;
}

/*
 * Idle: check the deadlines, then, past the spell's spin budget, sleep on
 * the efd (at most RING_SLEEP_MAX_MS, so deadlines are checked at least
 * that often; an abort wakes it through tp_signal). Returns 1 when a
 * deadline fired.
 */
static int coll_idle(ring_t *r, int64_t now, ring_spell_t *sp,
                     int64_t *wait_ns)
{
    if (coll_deadline(r, now))
        return 1;
    if (now - sp->start < spin_budget_ns(r))
        return 0;
    if (!sp->slept) {
        sp->slept = 1;
        sp->spun_ns = now - sp->start;
    }
    /* Not past the next heartbeat: a late tick shows its neighbours a
     * late heartbeat, and the lateness it carries blunts their lossy-link
     * test (ring_hb.c). */
    int ms = RING_SLEEP_MAX_MS;
    if (r->hb_next > now && r->hb_next - now < (int64_t)ms * 1000000)
        ms = (int)((r->hb_next - now) / 1000000) + 1;
    int64_t t0 = rd_now_ns();
    tp_wait(r->tp, ms);
    *wait_ns += rd_now_ns() - t0;
    return 0;
}

void ring__coll_stats(ring_t *r, int64_t t0, int64_t wait_ns)
{
    uint64_t w = (uint64_t)wait_ns / 1000;
    r->stats.last_wait_us = w;
    r->stats.total_wait_us += w;
    if (w > r->stats.max_wait_us)
        r->stats.max_wait_us = w;
    r->stats.last_usec = (uint64_t)(rd_now_ns() - t0) / 1000;
}

/* Progress until the collective is over; returns the idle time in ns. */
int64_t ring__coll_loop(ring_t *r)
{
    int64_t wait_ns = 0, spin_t = 0;
    ring_spell_t sp = {0};
    for (;;) {
        int work = 0;
        if (ring__coll_turn(r, &work))
            break;
        work += (int)tp_progress(r->tp);
        /* One local chunk ahead a turn, after what arrived was applied
         * and forwarded: while UCX moves the chunks in flight, the sums
         * the next receives land on get ready, so a dependent send never
         * waits for one (and an idle turn does useful work). */
        if (r->coll.local != NULL)
            work += ring__local_ahead(r);
        int64_t now = rd_now_ns();
        ring__hb_tick(r, now);
        if (work) {
            if (coll_deadline(r, now)) /* another channel kept us busy */
                break;
            if (spin_t)
                wait_ns += now - spin_t;
            spin_t = 0;
            if (sp.start)
                spell_end(r, &sp, now);
            continue;
        }
        if (!spin_t)
            spin_t = now;
        if (!sp.start)
            sp = (ring_spell_t){.start = now};
        int64_t before = wait_ns;
        if (coll_idle(r, now, &sp, &wait_ns))
            break;
        if (wait_ns != before)
            spin_t = rd_now_ns(); /* slept time is already counted */
    }
    if (sp.start) /* the last turn's events ended the collective */
        spell_end(r, &sp, rd_now_ns());
    return wait_ns;
}

