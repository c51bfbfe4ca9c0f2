/*
 * clock.h - the one clock for intervals and deadlines: CLOCK_MONOTONIC in
 * nanoseconds, so a wall-clock step never stretches or cuts a timeout.
 * Header-only and inline, because the ring engine reads it per message.
 */
#ifndef RINGD_CLOCK_H
#define RINGD_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t rd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif /* RINGD_CLOCK_H */
