/*
 * drain.c - the node's drain: a stop (SIGTERM, the job's drain key), a
 * restart (SIGUSR2: trainers wait for the next ringd) and the end of a
 * job its trainers named all finish the step in progress, leave the job
 * and end the loop, bounded by DMN_DRAIN_TIMEOUT_MS.
 */
#include "daemon/dmn-int.h"

#include "common/log.h"

#define DMN_DRAIN_TIMEOUT_MS 10000

static void on_drain_timeout(uv_timer_t *t)
{
    dmn_t *d = t->data;
    RD_WARN("drain: trainers did not come back within %d ms; exiting",
            DMN_DRAIN_TIMEOUT_MS);
    /* A trainer stuck mid-step never lets the step close: give up on it
     * (dmn_done() accepts a timed-out drain). */
    d->flags |= DMN_F_DRAIN_TIMED_OUT;
    d->flags |= DMN_F_LEAVE_DONE;
    dmn__step_force_drained(d);
    uv_stop(d->loop);
}

/* Membership's drain key: the same as SIGTERM. */
void dmn__on_backend_drain(void *arg)
{
    dmn_drain(arg);
}

void dmn_drain(dmn_t *d)
{
    if (d->flags & DMN_F_DRAIN_REQUESTED)
        return;
    RD_INFO("drain requested: finishing step %llu",
            (unsigned long long)d->step);
    uv_timer_start(&d->drain_timer, on_drain_timeout, DMN_DRAIN_TIMEOUT_MS,
                   0);
    dmn__step_drain(d);
}

int dmn_restart(dmn_t *d)
{
    if (d->flags & DMN_F_DRAIN_REQUESTED)
        return dmn_restarting(d); /* a stop under way stays a stop */
    d->flags |= DMN_F_RESTART;
    RD_INFO("restart requested: trainers will wait for the next ringd");
    dmn_drain(d);
    return 1;
}
