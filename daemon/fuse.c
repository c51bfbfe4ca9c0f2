/*
 * fuse.c - fusion by arrival: which asynchronous allreduces queued behind
 * the running collective the next ring operation takes, agreed by the
 * nodes (step-queue.c launches; daemon/README.md, "Fusion by arrival").
 *
 * Alone, each allreduce pays the ring's per-operation latency (64 x 1 MiB
 * ran at 0.79-0.97 of one 64 MiB). Every node must put the same ones in
 * an operation, and what has arrived differs by node, so the nodes ask
 * first: an i64 MIN allreduce of how many each could take (its offer),
 * whose answer is a run every node has queued, with two signatures (the
 * head's, and the history of the view's launches) and their negations,
 * equal on every node exactly when the nodes agree. An ask costs a small
 * collective's latency, so it is made only where fusion can pay: never
 * for an entry of DMN_FUSE_ENTRY_MAX or more, and after asks answered 1
 * in a row (trainers that wait on each result) the next 0, 1, 2, 4 ...
 * DMN_FUSE_BACKOFF_MAX eligible launches go without one. Skips count
 * launches, which every node makes alike (dmn__fuse_epoch), so all nodes
 * ask at the same launches.
 */
#include "daemon/dmn-int.h"

#include "common/log.h"
#include "common/status.h"

/* Larger allreduces neither start nor join a run: an operation's fixed
 * cost (about a 4 KiB step's, 0.15-0.4 ms at n = 2 here) is a small share
 * of theirs (2 ms and more), and they are the ones trainers overlap with
 * compute (DDP's 25 MiB buckets), where an ask before each would cost
 * about what fusing saves. */
#define DMN_FUSE_ENTRY_MAX (4u << 20)
#define DMN_FUSE_BACKOFF_MAX 64u
/* FNV-1a's offset basis, below 2^62 like every signature */
#define DMN_SIG_START (0xcbf29ce484222325ull & DMN_SIG_MASK)
#define DMN_SIG_MASK ((1ull << 62) - 1)

static uint64_t entry_bytes(const proto_coll_req_t *r)
{
    return r->count * proto_dtype_size(r->dtype);
}

/* A job of several nodes with a cap: only what every node knows alike,
 * since the nodes must ask at the same launches (a node's own settings
 * shape its offer, dmn__fuse_run). A one-node job's group would only add
 * a gather and a scatter. */
int dmn__fuse_on(const dmn_t *d)
{
    return d->view.node_count > 1 && d->view.fuse_bytes > 0;
}

int dmn__fuse_eligible(const proto_coll_req_t *h)
{
    return h->kind == PROTO_COLL_ALLREDUCE &&
           entry_bytes(h) < DMN_FUSE_ENTRY_MAX;
}

/* sig with one entry's matched fields mixed in (FNV-1a), kept below 2^62
 * so that the ask can carry its negation. */
static uint64_t sig_mix(uint64_t sig, const proto_coll_req_t *r)
{
    uint64_t f[] = {r->kind, r->count, r->dtype, r->op, r->wire, r->root};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        for (int b = 0; b < 64; b += 8) {
            sig ^= (f[i] >> b) & 0xff;
            sig *= 0x100000001b3ull;
        }
    return sig & DMN_SIG_MASK;
}

/*
 * Entry s of c's queue can run in one operation with entries 0..s-1: an
 * allreduce outside a group of the head's dtype, op and wire whose memory
 * overlaps none of theirs (run at once, an overlap would change what a
 * later one reads: each alone, it reads the earlier one's result). With
 * several trainers it must follow entry s-1 end to end in the same buffer
 * (step-queue.c's fused_layout: else the group is gathered into staging
 * and scattered back, two copies that cost more than fusion saves).
 */
static int fuse_joins(dmn_conn_t *c, uint32_t s, int several)
{
    const proto_coll_req_t *h = &dmn__conn_q(c, 0)->req;
    const proto_coll_req_t *q = &dmn__conn_q(c, s)->req;
    if (q->kind != PROTO_COLL_ALLREDUCE || q->dtype != h->dtype ||
        q->op != h->op || q->wire != h->wire ||
        entry_bytes(q) >= DMN_FUSE_ENTRY_MAX)
        return 0;
    if (several) {
        const proto_coll_req_t *p = &dmn__conn_q(c, s - 1)->req;
        return q->buf_id == p->buf_id &&
               q->offset == p->offset + entry_bytes(p);
    }
    uint64_t lo = q->offset, hi = q->offset + entry_bytes(q);
    for (uint32_t k = 0; k < s; k++) {
        const proto_coll_req_t *p = &dmn__conn_q(c, k)->req;
        if (p->buf_id == q->buf_id && p->offset < hi &&
            lo < p->offset + entry_bytes(p))
            return 0;
    }
    return 1;
}

uint32_t dmn__fuse_run(dmn_t *d)
{
    dmn_conn_t *first = NULL;
    uint32_t posted = 0, qmin = UINT32_MAX;
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next) {
        if (c->cstate != DMN_CONN_POSTED)
            continue;
        first = first != NULL ? first : c;
        posted++;
        qmin = c->q_len < qmin ? c->q_len : qmin;
    }
    if (first == NULL)
        return 0;
    if (!d->q.zero_copy)
        return 1; /* the copying path is there to compare results with */
    uint64_t bytes = entry_bytes(&dmn__conn_q(first, 0)->req);
    uint32_t g = 1;
    for (; g < qmin; g++) {
        uint64_t b = entry_bytes(&dmn__conn_q(first, g)->req);
        if (bytes + b > d->view.fuse_bytes)
            break;
        dmn_conn_t *c = first;
        for (; c != NULL; c = c->next)
            if (c->cstate == DMN_CONN_POSTED && !fuse_joins(c, g, posted > 1))
                break;
        if (c != NULL)
            break;
        bytes += b;
    }
    return g;
}

/*
 * The state goes on from a step to the next one of the same view (every
 * node counted the last, so every node made the same launches in it: a
 * trainer that waits on each result asks about once in 64 launches, not
 * at every step). A new view, a redone step (some launches of its last
 * try may have been made on some nodes only) or a step after one without
 * launches begin from no skip and no history. An answer no launch took
 * (a failed step's) never outlives its step.
 */
void dmn__fuse_epoch(dmn_t *d)
{
    if (d->q.fuse_starts == d->starts)
        return;
    int next = d->q.fuse_gen == d->view.generation &&
               d->step == d->q.fuse_step + 1;
    d->q.fuse_starts = d->starts;
    d->q.fuse_gen = d->view.generation;
    d->q.fuse_step = d->step;
    d->q.fuse_agreed = 0;
    if (next && d->q.fuse_skip == UINT32_MAX)
        d->q.fuse_skip = 0; /* off for the step only (fuse_check) */
    if (next)
        return;
    d->q.fuse_skip = 0;
    d->q.fuse_backoff = 0;
    d->q.fuse_hist = DMN_SIG_START;
}

void dmn__fuse_launched(dmn_t *d, dmn_conn_t *first, uint32_t g)
{
    for (uint32_t s = 0; s < g; s++)
        d->q.fuse_hist = sig_mix(d->q.fuse_hist, &dmn__conn_q(first, s)->req);
}

int dmn__fuse_ask(dmn_t *d, uint32_t mine, job_done_cb cb)
{
    uint64_t head = sig_mix(DMN_SIG_START, &d->q.coll);
    int64_t *a = d->q.fuse_ask;
    a[0] = mine;
    a[1] = (int64_t)head;
    a[2] = -(int64_t)head;
    a[3] = (int64_t)d->q.fuse_hist;
    a[4] = -(int64_t)d->q.fuse_hist;
    d->q.fuse_mine = mine;
    d->q.fuse_ask_buf[0] = a;
    d->stats.fuse_asks++;
    job_reduce_t red = {.bufs = d->q.fuse_ask_buf, .nbufs = 1, .count = 5,
                        .dt = KERN_I64, .op = KERN_MIN,
                        .wire = RD_WIRE_NONE};
    return job_allreduce(d->job, &red, cb, d);
}

/*
 * 1 when every node's signatures were this one's. Signatures that differ
 * mean the trainers' collectives differ. A head
 * that differs is left to the ring (no fusion for the rest of the step:
 * the head runs alone, and the ring names a size that differs as it
 * always does); a history that differs means a fused operation whose
 * entries differed, which the ring cannot see (it checks the total):
 * ST_EMISMATCH.
 */
static int fuse_check(dmn_t *d)
{
    const int64_t *a = d->q.fuse_ask;
    if (a[1] != -a[2]) {
        RD_WARN("collective %u of step %llu: the nodes' trainers posted "
                "different collectives here; fusion stays off for the "
                "step", d->q.coll.coll_seq, (unsigned long long)d->step);
        d->q.fuse_skip = UINT32_MAX;
        d->q.fuse_agreed = 1;
        return 0;
    }
    if (a[3] != -a[4]) {
        RD_ERROR("step %llu: the nodes ran different collectives in it "
                 "before collective %u (a fused group's entries differed "
                 "by node): the trainers' collectives differ",
                 (unsigned long long)d->step, d->q.coll.coll_seq);
        return ST_EMISMATCH;
    }
    return 1;
}

int dmn__fuse_answer(dmn_t *d)
{
    int64_t m = d->q.fuse_ask[0];
    if (m < 1 || m > d->q.fuse_mine) {
        /* A MIN that includes this node's offer cannot exceed it. */
        RD_ERROR("the nodes answered %lld to how many allreduces to "
                 "fuse, outside 1..%u (this node's offer)", (long long)m,
                 d->q.fuse_mine);
        return ST_EPROTO;
    }
    int rc = fuse_check(d);
    if (rc <= 0)
        return rc;
    if (m == 1) {
        /* The first 1 skips nothing: a burst's first allreduce is alone
         * when the ring is idle, and the rest arrive during its ask. */
        uint32_t b = d->q.fuse_backoff;
        d->q.fuse_skip = b;
        d->q.fuse_backoff = b == 0 ? 1
                            : b * 2 > DMN_FUSE_BACKOFF_MAX
                                ? DMN_FUSE_BACKOFF_MAX
                                : b * 2;
    } else {
        d->q.fuse_backoff = 0;
    }
    d->q.fuse_agreed = (uint32_t)m;
    return 0;
}
