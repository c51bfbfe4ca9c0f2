/*
 * base.c - what every daemon file asks of the daemon object: its clock,
 * its references (the handles and pool work that keep it alive after
 * dmn_destroy), and questions about its state that call nothing else.
 *
 * It is the bottom of daemon/: it calls no other daemon file, so any file
 * may call it without making a circle (tools/calls.py --check daemon).
 * The last reference frees the daemon through d->free_fn, which dmn.c
 * sets: freeing is the daemon object's business, not this file's.
 */
#include "daemon/dmn-int.h"

#include "common/clock.h"

uint64_t dmn__now_ms(void)
{
    return rd_now_ns() / 1000000;
}

const char *dmn__step_state_name(dmn_step_state_t s)
{
    static const char *const names[] = {"idle",       "running",
                                        "reducing",   "aborting",
                                        "broken",     "committing",
                                        "drained"};
    return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

void dmn__unref(dmn_t *d)
{
    if (--d->open_handles == 0 && (d->flags & DMN_F_DESTROYING))
        d->free_fn(d);
}

/* The handles live inside d: the last one to close frees it. */
void dmn__handle_closed(uv_handle_t *h)
{
    dmn__unref(h->data);
}

void dmn__state_copied(dmn_t *d, size_t bytes)
{
    if (pthread_equal(pthread_self(), d->loop_thread))
        __atomic_add_fetch(&d->stats.loop_copy_bytes, bytes,
                           __ATOMIC_RELAXED);
}

void dmn__coll_copied(dmn_t *d, size_t bytes)
{
    uint64_t *n = pthread_equal(pthread_self(), d->loop_thread)
                      ? &d->stats.coll_copy_loop_bytes
                      : &d->stats.coll_copy_pool_bytes;
    __atomic_add_fetch(n, bytes, __ATOMIC_RELAXED);
}

uint32_t dmn__trainer_count(const dmn_t *d)
{
    uint32_t n = 0;
    for (const dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        n += dmn__conn_counted(c);
    return n;
}

int dmn_done(const dmn_t *d)
{
    if (d->state != DMN_STEP_DRAINED || !(d->flags & DMN_F_LEAVE_DONE))
        return 0;
    if (d->flags & DMN_F_DRAIN_TIMED_OUT)
        return 1;
    if (d->flags & DMN_F_RESTART) /* tells the trainers nothing */
        return !(d->flags & DMN_F_RESTART_CKPT);
    for (const dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        if (dmn__conn_is_member(c) && c->cstate != DMN_CONN_SHUTDOWN)
            return 0;
    return 1;
}

int dmn_restarting(const dmn_t *d)
{
    return (d->flags & DMN_F_RESTART) != 0;
}
