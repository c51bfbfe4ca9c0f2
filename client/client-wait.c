/*
 * client-wait.c - waiting for a daemon that went away (restarted,
 * upgraded, crashed and restarted by systemd) instead of failing the
 * trainer at once.
 *
 * The client owns its memfds (client.c), so a new daemon can map the very
 * same buffers: reconnecting is HELLO, every BUF_ADD and the STATE_SET
 * again (cl__open). What is lost is the step in progress: the new daemon
 * knows nothing of it, so a call inside a step that finds the daemon gone
 * waits, reconnects and answers RINGD_ERESHAPE (the trainer redoes the
 * step from step_begin, where a joiner receives the job's state), and so
 * do the step's outstanding handles.
 *
 * The wait is bounded (opts.reconnect_s, $RINGD_RECONNECT_S, default
 * 30 s): a daemon that is stopped for good leaves the trainer with a
 * clear RINGD_ENODAEMON once the window is over. A drain that stops the
 * daemon (SIGTERM) still tells trainers RINGD_ESHUTDOWN, which is not
 * waited for.
 */
#include "client/client-int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Between two tries: short, since a restart under systemd takes about a
 * second and every trainer of the node waits on it. */
#define CL_RETRY_MS 100
/* Reconnections within one call before it gives up: a daemon that takes
 * every connection and drops it again never lets a window run out. */
#define CL_MAX_REOPENS 16

static uint64_t cl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Resolve opts.reconnect_s (-1: $RINGD_RECONNECT_S, else the default);
 * 0 or RINGD_EINVAL with the reason in c->err. */
int cl__reconnect_window(ringd_client_t *c)
{
    int32_t s = c->opts.reconnect_s;
    if (s == -1) {
        const char *env = getenv("RINGD_RECONNECT_S");
        if (env == NULL || env[0] == '\0') {
            s = RINGD_RECONNECT_DEFAULT_S;
        } else {
            char *end = NULL;
            errno = 0;
            long v = strtol(env, &end, 10);
            if (errno != 0 || end == env || *end != '\0' || v < 0 ||
                v > RINGD_RECONNECT_MAX_S)
                return cl__fail(c, RINGD_EINVAL, "RINGD_RECONNECT_S='%.32s'"
                                ": want seconds, 0..%d", env,
                                RINGD_RECONNECT_MAX_S);
            s = (int32_t)v;
        }
    }
    if (s < 0 || s > RINGD_RECONNECT_MAX_S)
        return cl__fail(c, RINGD_EINVAL, "reconnect_s %d: want -1..%d",
                        (int)s, RINGD_RECONNECT_MAX_S);
    c->opts.reconnect_s = s;
    return 0;
}

/* Whether a lost daemon is waited for at all. */
int cl__waits(const ringd_client_t *c)
{
    return c->opts.auto_reconnect && c->opts.reconnect_s > 0;
}

/* A failed try that a daemon coming back could cure. */
static int cl_retryable(int rc)
{
    return rc == RINGD_ENODAEMON || rc == RINGD_EDISCONNECTED ||
           rc == RINGD_ETIMEDOUT || rc == RINGD_ESHUTDOWN ||
           rc == RINGD_ESYS;
}

/* One try, its replies bounded by what is left of the window (a daemon
 * that accepts but never answers must not hold the wait past it). */
static int cl_try_open(ringd_client_t *c, uint64_t left_ms)
{
    uint32_t saved = c->opts.timeout_ms;
    uint32_t bound = left_ms < CL_RETRY_MS ? CL_RETRY_MS : (uint32_t)left_ms;
    if (saved == 0 || saved > bound)
        c->opts.timeout_ms = bound;
    int rc = cl__open(c);
    c->opts.timeout_ms = saved;
    return rc;
}

/*
 * The daemon is gone (c->fd < 0): try to connect again until it answers
 * or the window runs out. 0 once connected (buffers and state region
 * registered again), RINGD_ENODAEMON when the window ran out, or the
 * error of a try that waiting cannot cure (RINGD_EVERSION, RINGD_ENOMEM).
 */
int cl__wait_daemon(ringd_client_t *c)
{
    uint64_t t0 = cl_now_ms();
    uint64_t end = t0 + (uint64_t)c->opts.reconnect_s * 1000;
    char why[sizeof(c->err)];
    snprintf(why, sizeof(why), "%s", c->err);
    fprintf(stderr, "ringd: daemon gone, waiting up to %d s for it to come "
            "back (%s)\n", (int)c->opts.reconnect_s, c->path);
    for (;;) {
        uint64_t now = cl_now_ms();
        int rc = cl_try_open(c, end > now ? end - now : 0);
        if (rc == 0) {
            fprintf(stderr, "ringd: daemon back after %.1f s: reconnected, "
                    "buffers registered again\n",
                    (double)(cl_now_ms() - t0) / 1000.0);
            return 0;
        }
        if (!cl_retryable(rc))
            return rc;
        now = cl_now_ms();
        if (now >= end)
            break;
        uint64_t nap = end - now < CL_RETRY_MS ? end - now : CL_RETRY_MS;
        (void)poll(NULL, 0, (int)nap);
    }
    fprintf(stderr, "ringd: daemon did not come back within %d s (%s)\n",
            (int)c->opts.reconnect_s, c->path);
    return cl__fail(c, RINGD_ENODAEMON, "the ringd daemon at %s went away "
                    "(%.80s) and did not come back within %d s "
                    "(RINGD_RECONNECT_S); is ringd running?", c->path, why,
                    (int)c->opts.reconnect_s);
}

/* The step is lost with the daemon that ran it: every handle of it that
 * the loss failed is a reshape now, and so is the rest of the step. */
static void cl_step_lost(ringd_client_t *c)
{
    for (uint32_t i = 0; i < RINGD_MAX_OUTSTANDING; i++)
        if (c->pend[i].h != 0 && c->pend[i].done &&
            c->pend[i].status == RINGD_EDISCONNECTED)
            c->pend[i].status = RINGD_ERESHAPE;
    c->in_step = 0;
    c->reshaped = 1;
}

/*
 * What a call inside a step returns for rc: rc itself unless it says the
 * daemon went away and the client waits for one; then, once reconnected,
 * RINGD_ERESHAPE (redo the step), else RINGD_ENODAEMON.
 */
int cl__lost(ringd_client_t *c, int rc)
{
    if (rc != RINGD_EDISCONNECTED || !cl__waits(c))
        return rc;
    if (c->fd < 0) {
        int w = cl__wait_daemon(c);
        if (w != 0)
            return w;
    }
    cl_step_lost(c);
    return cl__fail(c, RINGD_ERESHAPE, "the ringd daemon at %s restarted "
                    "during the step: redo it (ringd_step_begin)", c->path);
}

/*
 * STEP_BEGIN on a connection that may be lost: reconnect (waiting for
 * the daemon when the client waits) and ask again, until a reply comes.
 */
int cl__step_begin_waiting(ringd_client_t *c, proto_step_rep_t *rep)
{
    for (int opens = 0;; opens++) {
        if (c->fd < 0) {
            if (opens == CL_MAX_REOPENS)
                return cl__fail(c, RINGD_ENODAEMON, "the ringd daemon at "
                                "%s closed the connection %d times in one "
                                "step_begin", c->path, CL_MAX_REOPENS);
            int rc = cl__open(c);
            if (rc != 0 && cl_retryable(rc))
                rc = cl__wait_daemon(c);
            if (rc != 0)
                return rc;
        }
        int rc = cl__call(c, PROTO_T_STEP_BEGIN, NULL, 0, -1, rep,
                          sizeof(*rep));
        if (rc != RINGD_EDISCONNECTED)
            return rc;
    }
}
