/*
 * ringctl-hops.c - the slowest node of the last steps, for ringctl
 * status, from the records the daemons put in etcd every 2 s or more
 * (/ringd/J/hop/<node>: steps and wait_us on the node's ring predecessor
 * since its previous record, job/job_ring_hops.c). A straggler reaches
 * each collective last: the others wait for its data, it waits for
 * nobody, so the node waiting least per step is the one the ring waits
 * for. One range read; no daemon is asked.
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "membership/mb.h"
#include "tools/ringctl.h"

/* One record: 0 with its generation, steps and mean wait, or -1. */
static int hop_parse(const etcd_kv_t *kv, uint64_t *gen_p, uint64_t *steps_p,
                     double *ms_p)
{
    cJSON *j = cJSON_ParseWithLength(kv->value, kv->value_len);
    uint64_t gen = 0, steps = 0, us = 0;
    int rc = j != NULL && rd_json_u64(j, "gen", &gen) == 0 &&
                     rd_json_u64(j, "steps", &steps) == 0 &&
                     rd_json_u64(j, "wait_us", &us) == 0 && steps > 0
                 ? 0 : -1;
    cJSON_Delete(j);
    if (rc == 0) {
        *gen_p = gen;
        *steps_p = steps;
        *ms_p = (double)us / 1e3 / (double)steps;
    }
    return rc;
}

/* Among the newest generation's records: the least waiting node and the
 * others' range. 0 with s filled, 1 with fewer than two records. */
static int pick(const ctl_reply_t *r, const char *prefix, ctl_slowest_t *s)
{
    uint64_t top = 0, gen, steps;
    double ms;
    for (size_t i = 0; i < r->n_kvs; i++)
        if (hop_parse(&r->kvs[i], &gen, &steps, &ms) == 0 && gen > top)
            top = gen;
    memset(s, 0, sizeof(*s));
    int slow = -1;
    double least = 0;
    for (size_t i = 0; i < r->n_kvs; i++) {
        if (hop_parse(&r->kvs[i], &gen, &steps, &ms) != 0 || gen != top)
            continue;
        if (s->nodes == 0 || ms < least) {
            least = ms;
            slow = (int)i;
        }
        s->nodes++;
        s->steps += steps;
    }
    if (s->nodes < 2)
        return 1;
    s->generation = top;
    s->own_ms = least;
    ctl_safe(ctl_key_tail(r->kvs[slow].key, prefix), s->node,
             sizeof(s->node));
    int first = 1;
    for (size_t i = 0; i < r->n_kvs; i++) {
        if ((int)i == slow || hop_parse(&r->kvs[i], &gen, &steps, &ms) != 0 ||
            gen != top)
            continue;
        if (first || ms < s->others_min_ms)
            s->others_min_ms = ms;
        if (first || ms > s->others_max_ms)
            s->others_max_ms = ms;
        first = 0;
    }
    return 0;
}

int ctl_slowest(const ctl_opts_t *o, ctl_slowest_t *s_p)
{
    char prefix[MB_KEY_MAX];
    if (mb_key(prefix, sizeof(prefix), o->job, MB_KEY_HOPS, NULL, 0, 0))
        return EXIT_USAGE;
    ctl_etcd_t c;
    ctl_reply_t r;
    int rc = ctl_open(o, &c);
    if (rc != 0)
        return rc;
    rc = ctl_get(&c, prefix, 1, &r);
    if (rc == 0) {
        rc = pick(&r, prefix, s_p);
        ctl_reply_free(&r);
    }
    etcd_destroy(c.etcd);
    return rc;
}
