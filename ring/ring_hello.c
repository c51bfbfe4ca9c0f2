/*
 * ring_hello.c - one message each way with both neighbours before the
 * first collective, for the owner's handshake (job/job_auth.c proves the
 * job secret with it). It travels on the raw channel, so it can never be
 * taken for ring data, and its buffers are the ring's own.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "ring/ring-int.h"

#define HELLO_CHAN 3
#define HELLO_SEQ TP_TAG_SEQ_MASK /* never a collective's in practice */
#define HELLO_RIGHTWARD 0 /* index bit 0: sent to the right neighbour */
#define HELLO_LEFTWARD 1  /* the rest: the round, so rounds never mix */
#define HELLO_UNWIND_NS (2 * 1000000000LL)

typedef struct {
    tp_req_t req;
    int posted, done;
} hello_op_t;

/* [0] recv from left, [1] recv from right, [2] send right, [3] send left */
typedef struct {
    hello_op_t op[4];
    uint8_t *buf[4];
} hello_t;

static void hello_cb(tp_req_t *req)
{
    ((hello_op_t *)req->data)->done = 1;
}

static int hello_post(ring_t *r, hello_t *h, size_t len)
{
    static const unsigned idx[4] = {HELLO_RIGHTWARD, HELLO_LEFTWARD,
                                    HELLO_RIGHTWARD, HELLO_LEFTWARD};
    tp_peer_t *to[4] = {NULL, NULL, r->right.peer, r->left.peer};
    for (int i = 0; i < 4; i++) {
        hello_op_t *o = &h->op[i];
        uint64_t tag = tp_tag_make(r->gen, HELLO_CHAN, HELLO_SEQ,
                                   (uint64_t)r->hellos << 1 | idx[i]);
        o->req.cb = hello_cb;
        o->req.data = o;
        o->posted = 1;
        int rc = i < 2 ? tp_recv(r->tp, h->buf[i], len, tag, ~0ULL, NULL,
                                 &o->req)
                       : tp_send(to[i], h->buf[i], len, tag, NULL, &o->req);
        if (rc != 0) {
            o->posted = 0;
            return rc;
        }
    }
    return 0;
}

static int hello_pending(const hello_t *h)
{
    for (int i = 0; i < 4; i++)
        if (h->op[i].posted && !h->op[i].done)
            return 1;
    return 0;
}

/* The neighbour a still-unfinished operation waits on. */
static uint32_t hello_blame(const ring_t *r, const hello_t *h)
{
    const hello_op_t *o = h->op;
    if ((o[0].posted && !o[0].done) || (o[3].posted && !o[3].done))
        return r->left.rank;
    return r->right.rank;
}

/* Everything done, or the first failure and whom it names. */
static int hello_wait(ring_t *r, hello_t *h, uint32_t *who)
{
    int64_t end = rd_now_ns() + (int64_t)r->opts.deadline_ms * 1000000;
    while (hello_pending(h)) {
        if (atomic_load_explicit(&r->abort_req, memory_order_acquire))
            return ST_EABORTED;
        ring_link_t *bad = r->left.fail_rc ? &r->left
                           : r->right.fail_rc ? &r->right : NULL;
        if (bad != NULL) {
            *who = bad->rank;
            return bad->fail_rc;
        }
        ring__hb_tick(r, rd_now_ns());
        if (tp_progress(r->tp) != 0)
            continue;
        if (rd_now_ns() > end) {
            *who = hello_blame(r, h);
            return ST_EPEER_TIMEOUT;
        }
        tp_wait(r->tp, 50);
    }
    return 0;
}

static int hello_check(const ring_t *r, const hello_t *h, size_t len,
                       uint32_t *who)
{
    for (int i = 0; i < 4; i++) {
        const tp_req_t *q = &h->op[i].req;
        uint32_t peer = i == 0 || i == 3 ? r->left.rank : r->right.rank;
        int rc = q->status;
        if (rc == 0 && i < 2 && q->length != len)
            rc = ST_EPEER_FORGED;
        if (rc != 0) {
            *who = peer;
            return rc;
        }
    }
    return 0;
}

/* After a failure: let go of every request (bounded), or leak the ring's
 * buffers as coll_unwind does. Returns 1 when everything let go. */
static int hello_unwind(ring_t *r, hello_t *h)
{
    for (int i = 0; i < 2; i++)
        if (h->op[i].posted && !h->op[i].done)
            tp_cancel(r->tp, &h->op[i].req);
    if (hello_pending(h)) {
        tp_peer_close(r->left.peer, 1);
        if (r->right.peer != r->left.peer)
            tp_peer_close(r->right.peer, 1);
        r->left.peer = r->right.peer = NULL;
    }
    int64_t end = rd_now_ns() + HELLO_UNWIND_NS;
    while (hello_pending(h) && rd_now_ns() < end)
        tp_progress(r->tp);
    if (!hello_pending(h))
        return 1;
    RD_ERROR("ring gen %" PRIu64 ": hello requests outlived the abort; "
             "leaking them", r->generation);
    r->leaked = 1;
    return 0;
}

int ring_hello(ring_t *r, const void *to_left, const void *to_right,
               void *from_left, void *from_right, size_t len,
               uint32_t *rank_p)
{
    if (r->n == 1)
        return 0;
    if (r->state != RING_READY || r->stats.collectives != 0 || len == 0)
        return ST_EINVAL;
    hello_t *h = calloc(1, sizeof(*h));
    uint8_t *mem = calloc(4, len);
    if (h == NULL || mem == NULL) {
        free(h);
        free(mem);
        return ST_ENOMEM;
    }
    for (int i = 0; i < 4; i++)
        h->buf[i] = mem + (size_t)i * len;
    memcpy(h->buf[2], to_right, len);
    memcpy(h->buf[3], to_left, len);
    uint32_t who = r->rank;
    int rc = hello_post(r, h, len);
    r->hellos++;
    if (rc == 0)
        rc = hello_wait(r, h, &who);
    if (rc == 0)
        rc = hello_check(r, h, len, &who);
    if (rc == 0) {
        memcpy(from_left, h->buf[0], len);
        memcpy(from_right, h->buf[1], len);
    } else {
        RD_ERROR("ring gen %" PRIu64 ": hello with rank %u: %s",
                 r->generation, who, st_strerror(rc));
        ring__fail(r, rc, who);
        if (!hello_unwind(r, h))
            mem = NULL, h = NULL; /* UCX still holds them */
    }
    free(mem);
    free(h);
    *rank_p = who;
    return rc;
}
