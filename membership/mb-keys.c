/*
 * mb-keys.c - the etcd key schema of a job, the one place it is spelled.
 *
 * Everything of job J lives under /ringd/J/, so one prefix watch sees a
 * whole job and one range read lists it. Per-node keys end in the node id
 * (which has no '/'), so a prefix read of a family lists every node's.
 * Checkpoint part records put the step in 20 digits and the rank in 5, so
 * etcd's byte order is numeric order. membership/README.md ("etcd keys")
 * says who writes each key and when.
 */
#include "membership/mb.h"

#include <inttypes.h>
#include <stdio.h>

#include "common/log.h"
#include "common/status.h"

static int key_print(char *buf, size_t n, const char *job,
                     mb_key_t which, const char *node, uint64_t step,
                     uint32_t rank)
{
    switch (which) {
    case MB_KEY_JOB:
        return snprintf(buf, n, "/ringd/%s/", job);
    case MB_KEY_NODES:
        return snprintf(buf, n, "/ringd/%s/nodes/", job);
    case MB_KEY_NODE:
        return snprintf(buf, n, "/ringd/%s/nodes/%s", job, node);
    case MB_KEY_LEADER:
        return snprintf(buf, n, "/ringd/%s/leader", job);
    case MB_KEY_VIEW:
        return snprintf(buf, n, "/ringd/%s/view", job);
    case MB_KEY_DRAIN:
        return snprintf(buf, n, "/ringd/%s/drain/%s", job, node);
    case MB_KEY_SUSPECTS:
        return snprintf(buf, n, "/ringd/%s/suspect/", job);
    case MB_KEY_SUSPECT:
        return snprintf(buf, n, "/ringd/%s/suspect/%s/", job, node);
    case MB_KEY_RESHAPES:
        return snprintf(buf, n, "/ringd/%s/reshape/", job);
    case MB_KEY_RESHAPE:
        return snprintf(buf, n, "/ringd/%s/reshape/%s", job, node);
    case MB_KEY_CKPT_ALL:
        return snprintf(buf, n, "/ringd/%s/ckpt", job);
    case MB_KEY_CKPTS:
        return snprintf(buf, n, "/ringd/%s/ckpt/", job);
    case MB_KEY_CKPT:
        return snprintf(buf, n, "/ringd/%s/ckpt/%" PRIu64, job, step);
    case MB_KEY_CKPT_PARTS:
        return snprintf(buf, n, "/ringd/%s/ckpt-parts/", job);
    case MB_KEY_CKPT_STEP_PARTS:
        return snprintf(buf, n, "/ringd/%s/ckpt-parts/%020" PRIu64 "/",
                        job, step);
    case MB_KEY_CKPT_PART:
        return snprintf(buf, n, "/ringd/%s/ckpt-parts/%020" PRIu64
                        "/%05" PRIu32, job, step, rank);
    case MB_KEY_HOPS:
        return snprintf(buf, n, "/ringd/%s/hop/", job);
    case MB_KEY_HOP:
        return snprintf(buf, n, "/ringd/%s/hop/%s", job, node);
    }
    return -1;
}

int mb_key(char *buf, size_t n, const char *job, mb_key_t which,
           const char *node, uint64_t step, uint32_t rank)
{
    int len = key_print(buf, n, job, which, node ? node : "", step, rank);
    if (len < 0 || (size_t)len >= n) {
        RD_ERROR("mb: key %d of job '%.64s' does not fit in %zu bytes",
                 (int)which, job, n);
        if (n > 0)
            buf[0] = '\0';
        return ST_EINVAL;
    }
    return 0;
}
