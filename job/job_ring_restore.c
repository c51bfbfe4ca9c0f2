/*
 * job_ring_restore.c - a whole job restarting from checkpoints kept in
 * per-node directories.
 *
 * Node r of a checkpoint wrote shard r and the replica of shard r-1 into
 * its own store, so after the whole job stops no node holds the state,
 * yet together the nodes hold every shard (twice). When a REBUILD finds
 * every member at step 0 (nothing alive to resync from) and some member
 * has a complete checkpoint, the members run this, on the ring thread,
 * all in the same order:
 *
 *   1. the candidate step C: the newest any member has (agreed before);
 *   2. its manifest: the lowest-index member that has a copy sends it
 *      (length, then bytes), so all use the very same one;
 *   3. each member decodes the shards of C it holds (primary, else the
 *      replica; delta shards through their bases) and an allreduce MAX
 *      names, per shard, the lowest-index member that could;
 *   4. if every shard has a holder, each shard is broadcast from it into
 *      everyone's state; else every member looks for its newest step
 *      older than C and they agree on the next candidate (MAX), up to
 *      RESTORE_TRIES times.
 *
 * Every decision comes from values all members computed alike, so they
 * leave together, with the same state or all unchanged.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt.h"
#include "common/log.h"
#include "common/status.h"
#include "job/job_ring-int.h"

#define RESTORE_TRIES 4
#define NO_INDEX 0xfffffu

uint64_t job__restore_newest_local(const char *root, uint64_t below)
{
    uint64_t *steps = NULL, best = 0;
    size_t n = 0;
    if (root == NULL || ckpt_store_list(root, &steps, &n) != 0)
        return 0;
    for (size_t i = 0; i < n && best == 0; i++)
        if (steps[i] < below)
            best = steps[i] + 1;
    free(steps);
    return best;
}

/* Step 2: the same manifest of `step` everywhere, or NULL everywhere. */
static int agree_manifest(ring_t *r, uint32_t me, const char *root,
                          uint64_t step, ckpt_manifest_t **m_p)
{
    ckpt_manifest_t *mine = NULL;
    char *json = NULL;
    *m_p = NULL;
    if (root != NULL && ckpt_store_load_manifest(root, step, &mine) == 0)
        (void)ckpt_manifest_to_json(mine, &json);
    ckpt_manifest_free(mine);
    int64_t who = json != NULL ? (int64_t)(NO_INDEX - me) : -1;
    int rc = job__ring_agree(r, &who, 1, KERN_MAX);
    uint32_t src = (uint32_t)(NO_INDEX - (uint64_t)who);
    int64_t len = rc == 0 && who >= 0 && src == me ? (int64_t)strlen(json)
                                                   : 0;
    if (rc == 0 && who >= 0)
        rc = job__ring_agree(r, &len, 1, KERN_MAX);
    if (rc != 0 || who < 0 || len <= 0 || len > (1 << 26)) {
        free(json);
        return rc;
    }
    char *buf = malloc((size_t)len + 1);
    if (buf == NULL) {
        free(json);
        return ST_ENOMEM; /* the others fail on the ring the same way */
    }
    if (src == me)
        memcpy(buf, json, (size_t)len);
    free(json);
    rc = ring_broadcast(r, buf, (size_t)len, src);
    buf[len] = '\0';
    if (rc == 0 && ckpt_manifest_from_json(buf, (size_t)len, m_p) != 0)
        *m_p = NULL; /* the same bytes fail to parse everywhere */
    free(buf);
    return rc;
}

/* Steps 3-4 for manifest m: 0 restored, 1 a shard has no holder. */
static int restore_from(ring_t *r, uint32_t me, const char *root,
                        const ckpt_manifest_t *m, void *state)
{
    uint32_t n = m->nshards;
    void **dec = calloc(n, sizeof(*dec));
    int64_t *key = calloc(n, sizeof(*key));
    int *from_replica = calloc(n, sizeof(*from_replica));
    int rc = dec && key && from_replica ? 0 : ST_ENOMEM;
    unsigned held = 0;
    for (uint32_t i = 0; rc == 0 && root != NULL && i < n; i++) {
        dec[i] = malloc(m->shards[i].size ? m->shards[i].size : 1);
        if (dec[i] != NULL &&
            ckpt_store_read_shard(root, m, i, dec[i], &from_replica[i]) ==
                0) {
            key[i] = (int64_t)(NO_INDEX - me) + 1;
            held++;
        } else {
            free(dec[i]);
            dec[i] = NULL;
        }
    }
    if (rc == 0)
        rc = job__ring_agree(r, key, n, KERN_MAX);
    uint32_t missing = 0;
    for (uint32_t i = 0; rc == 0 && i < n; i++)
        missing += key[i] == 0;
    if (rc == 0 && missing > 0) {
        RD_WARN("restore: step %" PRIu64 " has %u of %u shards on no "
                "member (this node decoded %u)", m->step, missing, n, held);
        rc = 1;
    }
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        uint32_t holder = NO_INDEX - (uint32_t)(key[i] - 1);
        char *dst = (char *)state + m->shards[i].offset;
        if (holder == me) {
            /* Which copy served it, so a repair can be checked. */
            RD_INFO("restore: shard %u of step %" PRIu64 " sent from this "
                    "node's %s copy", i, m->step,
                    from_replica[i] ? "replica" : "primary");
            memcpy(dst, dec[i], m->shards[i].size);
        }
        rc = ring_broadcast(r, dst, m->shards[i].size, holder);
    }
    for (uint32_t i = 0; dec != NULL && i < n; i++)
        free(dec[i]);
    free(dec);
    free(key);
    free(from_replica);
    return rc;
}

int job__ring_restore(ring_t *r, const mb_view_t *v, const char *root,
                     void *state, size_t bytes, uint64_t agreed,
                     uint64_t *step_p)
{
    uint32_t me = (uint32_t)v->my_index;
    uint64_t cand = agreed;
    for (int t = 0; t < RESTORE_TRIES && cand > 0; t++) {
        uint64_t step = cand - 1;
        ckpt_manifest_t *m = NULL;
        int rc = agree_manifest(r, me, root, step, &m);
        if (rc != 0)
            return rc;
        if (m != NULL && m->total_size == bytes) {
            rc = restore_from(r, me, root, m, state);
            ckpt_manifest_free(m);
            if (rc <= 0) {
                if (rc == 0) {
                    *step_p = step;
                    RD_INFO("restore: the state of step %" PRIu64 " came "
                            "from the members' checkpoint stores",
                            step);
                }
                return rc;
            }
        } else {
            RD_WARN("restore: step %" PRIu64 ": %s", step,
                    m == NULL ? "no readable manifest"
                              : "its size is not the state's");
            ckpt_manifest_free(m);
        }
        int64_t next = (int64_t)job__restore_newest_local(root, step);
        rc = job__ring_agree(r, &next, 1, KERN_MAX);
        if (rc != 0)
            return rc;
        cand = (uint64_t)next;
    }
    return 1;
}
