/*
 * job_ring_hops.c - how long this node waits on its ring predecessor per
 * step: the histogram per predecessor that /metrics exports
 * (ringd_hop_wait_seconds), and a small record in etcd, put every
 * job_hop_period_ms under the node's lease, from which ringctl status
 * names the slowest node of the last steps without asking any daemon.
 *
 * A straggler (a slow trainer, a slow host) reaches each collective last:
 * its successor waits for its data, the rest of the ring waits in turn,
 * and the straggler itself finds its predecessor's data already there.
 * So the node that waits least per step is the one the ring waits for.
 */
#include "job/job_ring-int.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

/* A step's wait: tens of microseconds on a quiet loopback ring, up to
 * seconds behind an evaluation or a data loader. */
const double job_hop_le[JOB_HOP_BUCKETS] = {
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5};

/* The peer's entry; a new peer takes the place of the least used. */
static job_hop_t *hop_entry(job_hops_t *h, const char *peer)
{
    size_t least = 0;
    for (size_t i = 0; i < h->n; i++) {
        if (strncmp(h->peers[i].peer, peer, sizeof(h->peers[i].peer) - 1)
            == 0)
            return &h->peers[i];
        if (h->peers[i].steps < h->peers[least].steps)
            least = i;
    }
    job_hop_t *e = h->n < JOB_HOP_PEERS ? &h->peers[h->n++]
                                        : &h->peers[least];
    memset(e, 0, sizeof(*e));
    snprintf(e->peer, sizeof(e->peer), "%s", peer);
    return e;
}

void job_hops_record(job_hops_t *h, const char *peer, double wait_s)
{
    job_hop_t *e = hop_entry(h, peer);
    e->steps++;
    e->sum_s += wait_s;
    for (int i = 0; i < JOB_HOP_BUCKETS; i++)
        if (wait_s <= job_hop_le[i]) {
            e->bucket[i]++;
            return;
        }
}

/* op_step_end: the step's waits (summed by on_async) go to the entry of
 * the predecessor of the installed view, and into the next record. */
void job__hops_step(job_ring_t *b)
{
    uint64_t us = b->step_wait_us;
    b->step_wait_us = 0;
    const mb_view_t *v = b->cur;
    if (v == NULL || v->n_members < 2 || v->my_index < 0)
        return;
    size_t pred = ((size_t)v->my_index + v->n_members - 1) % v->n_members;
    job_hops_record(&b->hops, v->members[pred].node, (double)us / 1e6);
    b->win_steps++;
    b->win_wait_us += us;
    snprintf(b->win_peer, sizeof(b->win_peer), "%s", v->members[pred].node);
}

/*
 * Every node putting a record every 2 s is N/2 etcd writes a second: 500
 * at 1000 nodes, more than the job's keepalives (bench/README.md). The
 * period grows with the view instead, so the job's rate stays under
 * JOB_HOP_JOB_PUTS_PER_S; ringctl reads the newest generation's
 * records, which at 1000 nodes are up to 24 s old.
 */
int64_t job_hop_period_ms(size_t n_members, const char *node)
{
    int64_t ms = (int64_t)n_members * 1000 / JOB_HOP_JOB_PUTS_PER_S;
    if (ms < JOB_HOP_PUBLISH_MS)
        ms = JOB_HOP_PUBLISH_MS;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *p = node; p != NULL && *p != '\0'; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return ms + ms * (int64_t)(h % 21) / 100;
}

/* A failed put (etcd down: the job rides it out) skips the next ticks,
 * doubling to JOB_RING_HOP_SKIP_MAX, so an outage is not tried every period;
 * the steps meanwhile go into the next record. */
static void on_hop_put(int status, const etcd_result_t *res, void *data)
{
    job_ring_t *b = data;
    (void)res;
    b->hop_backoff = status == 0 ? 0
                     : b->hop_backoff == 0 ? 1
                     : b->hop_backoff * 2 > JOB_RING_HOP_SKIP_MAX
                         ? JOB_RING_HOP_SKIP_MAX : b->hop_backoff * 2;
    b->hop_skip = b->hop_backoff;
}

/* Put the record of the steps since the last one, under our lease (it
 * goes with the node). A failed put is only the loss of one record. */
static void hop_put(job_ring_t *b)
{
    int64_t lease = b->mb != NULL ? mb_lease(b->mb) : 0;
    if (b->hop_skip > 0) {
        b->hop_skip--;
        return;
    }
    if (b->win_steps == 0 || lease == 0 || b->cur == NULL)
        return;
    char key[MB_KEY_MAX], val[256];
    if (mb_key(key, sizeof(key), b->job_name, MB_KEY_HOP, b->mc.node, 0,
               0) != 0)
        return;
    int n = snprintf(val, sizeof(val),
                     "{\"gen\":\"%llu\",\"peer\":\"%s\",\"steps\":\"%llu\","
                     "\"wait_us\":\"%llu\"}",
                     (unsigned long long)b->cur->generation, b->win_peer,
                     (unsigned long long)b->win_steps,
                     (unsigned long long)b->win_wait_us);
    b->win_steps = b->win_wait_us = 0;
    if (n > 0 && (size_t)n < sizeof(val))
        (void)etcd_put(mb_etcd(b->mb), key, val, (size_t)n, lease,
                       on_hop_put, b);
}

/* Each tick schedules the next for the size of the view it ran in. */
static void on_hop_timer(uv_timer_t *t)
{
    job_ring_t *b = t->data;
    hop_put(b);
    uv_timer_start(&b->hop_timer, on_hop_timer,
                   (uint64_t)job_hop_period_ms(b->cur != NULL ?
                                               b->cur->n_members : 1,
                                               b->mc.node), 0);
}

/* Started with the job: the record waits for a view and a lease. */
void job__hops_init(job_ring_t *b, uv_loop_t *loop)
{
    uv_timer_init(loop, &b->hop_timer);
    b->hop_timer.data = b;
    uv_timer_start(&b->hop_timer, on_hop_timer,
                   (uint64_t)job_hop_period_ms(1, b->mc.node), 0);
}

void job__hops_cmd(job_ring_t *b, const job_ring_cmd_t *c)
{
    if (c->status == 0)
        b->step_wait_us += c->wait_us;
}

void job__hops_get(job_t *be, job_hops_t *hops_p)
{
    *hops_p = ((job_ring_t *)be)->hops;
}
