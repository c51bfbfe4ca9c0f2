/*
 * ring_hb.c - liveness apart from progress: every rank of a ring sends a
 * small heartbeat to each neighbour it has an endpoint to every
 * RING_HB_PERIOD_MS, from its collectives' loops and, between them, from
 * ring_service() (the owner's idle loop), whatever its trainer does. A
 * neighbour heard from on this ring and then silent for live_ms (no
 * heartbeat and no data) has stopped: its daemon is stopped or wedged,
 * or the link is cut. A slow trainer never looks like that: its daemon
 * keeps beating while it waits. ring/README.md, "Liveness".
 *
 * A heartbeat is the tag (generation field: the ring's, keyed with a job
 * secret; channel 3; sequence RING_HB_SEQ; index: the sender's rank) and
 * RING_HB_LEN bytes: magic, the sender's rank, the ring's generation, and
 * how late (ms) the sender's tick was. Receives match the whole tag; the
 * payload is checked before it counts.
 *
 * A lossy link: over TCP, a lost segment holds everything behind it for
 * a retransmission timeout (200 ms at least on Linux), so heartbeats come
 * late in bursts although the link is never silent for live_ms. A
 * heartbeat HB_STALL_NS after the one before, less the sender's own
 * lateness (its thread did not run) and this rank's (the heartbeat
 * waited in the socket while this thread did not run: a loaded host, a
 * ring of two whose receiver was starved of CPU by its trainers), and
 * only as long as no data from that rank came either (a heartbeat that
 * waited behind data in the stream says nothing; a stalled TCP stream
 * holds the data too), while this rank's other links were
 * on time (else it is this rank that did not run), is a stall of that
 * link, reported through opts.on_lossy. Both ends of a lossy link see
 * it; membership convicts only a node that two members report
 * (membership/README.md, "Blame"). A ring of two has no other link to
 * compare with: there two stalls within a second are a report, and the
 * reporter checks its own path to etcd before it is sent.
 */
#include "ring/ring-int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"

#define HB_MAGIC 0x32484452u /* "RDH2": with the sender's lateness */
#define HB_UNWIND_NS (1000 * 1000000LL)
#define MS (1000000LL)
/* A gap between two heartbeats this long is a stall (the period is
 * 100 ms): two periods less scheduling noise, so that one TCP
 * retransmission timeout (200 ms) shows. Measured on veths under 30%
 * loss: 85 of 111 gaps on the lossy links were 200 ms or more, 3 of 67
 * on the others (chaos/README.md, "Findings"). */
#define HB_STALL_NS (190 * MS)
/* Another link quiet this long, or ending a gap as long this recently,
 * means this rank (or the whole host) stalled, not one link. */
#define HB_QUIET_NS (150 * MS)
#define HB_TOGETHER_NS (50 * MS)
#define HB_REPORT_NS (1000 * MS) /* at most one report a second a link */

struct ring_hb {
    ring_t *ring;
    tp_req_t rreq, sreq;
    uint8_t rbuf[RING_HB_LEN], sbuf[RING_HB_LEN];
    int rposted, sbusy;
    int64_t heard;    /* last valid heartbeat (ns); 0: never */
    int64_t gap_end;  /* when a gap of HB_QUIET_NS or more last ended */
    int64_t reported; /* the last on_lossy for this link */
    int64_t stalled;  /* two ranks: the last stall seen */
    /* Data from the rank since its last heartbeat (ring__hb_data): when
     * the last came, and the longest time without any. */
    int64_t data_at, data_quiet;
    /* A stall seen at the last heartbeat, judged at the next one
     * (pending_stall): by how much it passed the thresholds (0: none),
     * its gap, the sender's delay then, and whether the ring is two. */
    int64_t pend_excess, pend_gap;
    uint32_t pend_late;
    int pend_two;
};

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

/* The fixed part; the lateness (bytes 16..19) is set at each send. */
static void hb_encode(uint8_t *p, uint32_t rank, uint64_t generation)
{
    memset(p, 0, RING_HB_LEN);
    put_u32(p, HB_MAGIC);
    put_u32(p + 4, rank);
    put_u32(p + 8, (uint32_t)generation);
    put_u32(p + 12, (uint32_t)(generation >> 32));
}

/* Every heartbeat state of the ring but h: the other links. */
static ring_hb_t **hb_at(ring_t *r, uint32_t i);
static uint32_t nlinks(const ring_t *r);

/* 1 when another link of this rank was quiet too: this rank's thread
 * (or its host) stalled, not h's link; 0 when the others were on time;
 * -1 when there is no other link (two ranks): nothing here tells them
 * apart, see two_ranks_again. */
static int others_quiet(ring_t *r, ring_hb_t *h, int64_t now)
{
    int others = 0;
    for (uint32_t i = 0, n = nlinks(r); i < n; i++) {
        ring_hb_t **o = hb_at(r, i);
        if (o == NULL || *o == NULL || *o == h || (*o)->heard == 0)
            continue;
        others++;
        if (now - (*o)->heard > HB_QUIET_NS ||
            now - (*o)->gap_end < HB_TOGETHER_NS)
            return 1;
    }
    return others > 0 ? 0 : -1;
}

/* Two ranks: a stall counts when it is the second within a second (the
 * reporter's own path is checked by membership). */
static int two_ranks_again(ring_hb_t *h, int64_t now)
{
    int again = h->stalled != 0 && now - h->stalled < HB_REPORT_NS;
    h->stalled = now;
    return again;
}

/*
 * How late this rank's own next tick is at now: its thread did not run
 * (descheduled on a loaded host, stopped) for about that long, and a
 * heartbeat that waited in the socket meanwhile says nothing about the
 * link. The receive callbacks run in the progress call just before the
 * turn's tick, so hb_next still holds the tick that was due.
 */
static int64_t self_late_ns(const ring_t *r, int64_t now)
{
    return r->hb_next != 0 && now > r->hb_next ? now - r->hb_next : 0;
}

/*
 * How long the link from h's rank delivered nothing, of the gap ns that
 * ended at now with a heartbeat: the gap itself, unless data from that
 * rank came in between. A TCP stream that stalls on a lost segment holds
 * the data too; a heartbeat that waited behind data that kept coming (a
 * ring of two moving large buckets on a loaded host) is not a stall.
 */
static int64_t link_quiet_ns(ring_hb_t *h, int64_t gap, int64_t now)
{
    int64_t quiet = gap;
    if (h->data_at > now - gap) {
        quiet = h->data_quiet;
        if (now - h->data_at > quiet)
            quiet = now - h->data_at;
    }
    h->data_at = 0;
    h->data_quiet = 0;
    return quiet;
}

/*
 * A stall found at the heartbeat before this one, judged now that this
 * one says how late its tick was: a sender descheduled right after its
 * tick (a loaded host) sent that heartbeat on time by its clock, but
 * nothing left its socket until it ran again, and this tick is as late
 * as that was long. On a lossy link the sender ran on: this one is on
 * time, and the stall stands.
 */
static void pending_stall(ring_t *r, ring_hb_t *h, uint32_t sender,
                          uint32_t late_ms, int64_t now)
{
    int64_t excess = h->pend_excess - (int64_t)late_ms * MS;
    int64_t gap = h->pend_gap;
    uint32_t late0 = h->pend_late;
    int two = h->pend_two;
    h->pend_excess = 0;
    if (excess < HB_STALL_NS || (two && !two_ranks_again(h, now)))
        return;
    r->stats.hb_stalls++;
    if (h->reported != 0 && now - h->reported < HB_REPORT_NS)
        return;
    h->reported = now;
    r->stats.hb_lossy++;
    RD_WARN("ring gen %" PRIu64 ": rank %u's heartbeat came %lld ms late "
            "(its own delay %u ms, the next one's %u ms): its link stalls",
            r->generation, sender, (long long)(gap / MS), late0, late_ms);
    r->opts.on_lossy(r->opts.on_lossy_arg, r->generation, sender);
}

/* A valid heartbeat from sender came gap ns after the last one, sent
 * late_ms after its tick was due; what either end's own delay explains
 * is not the link's, nor is a gap the link's data filled. A stall is
 * judged at the next heartbeat (pending_stall). */
static void hb_gap(ring_t *r, ring_hb_t *h, uint32_t sender, int64_t gap,
                   uint32_t late_ms, int64_t now)
{
    if (gap >= HB_QUIET_NS)
        h->gap_end = now;
    int64_t quiet = link_quiet_ns(h, gap, now);
    if (r->opts.live_ms <= 0 || r->opts.on_lossy == NULL)
        return;
    if (h->pend_excess > 0)
        pending_stall(r, h, sender, late_ms, now);
    int64_t excess = quiet - (int64_t)late_ms * MS - self_late_ns(r, now);
    if (excess < HB_STALL_NS)
        return;
    int others = others_quiet(r, h, now);
    if (others == 1)
        return;
    h->pend_excess = excess;
    h->pend_gap = gap;
    h->pend_late = late_ms;
    h->pend_two = others < 0;
}

int ring__test_held(const ring_t *r)
{
    return r->hb_stall && r->hb_ticks % 4 != 1;
}

void ring__hb_data(ring_link_t *l, int64_t now)
{
    ring_hb_t *h = l->hb;
    if (h == NULL || h->heard == 0)
        return;
    int64_t since = h->data_at > h->heard ? h->data_at : h->heard;
    if (now - since > h->data_quiet)
        h->data_quiet = now - since;
    h->data_at = now;
}

static uint64_t hb_tag(const ring_t *r, uint32_t sender)
{
    return tp_tag_make(r->gen, RING_HB_CHAN, RING_HB_SEQ, sender);
}

static void on_hb_recv(tp_req_t *req)
{
    ring_hb_t *h = req->data;
    ring_t *r = h->ring;
    h->rposted = 0;
    if (req->status == ST_EABORTED || r == NULL)
        return;
    r->hb_repost = 1; /* the next tick posts it again */
    uint8_t want[RING_HB_LEN];
    uint32_t sender = tp_tag_idx(req->tag);
    hb_encode(want, sender, r->generation);
    if (req->status != 0 || req->length != RING_HB_LEN ||
        memcmp(h->rbuf, want, 16) != 0) {
        r->stats.hb_forged++;
        return;
    }
    int64_t now = rd_now_ns(), prev = h->heard;
    h->heard = now;
    r->stats.hb_recv++;
    if (prev != 0)
        hb_gap(r, h, sender, now - prev, get_u32(h->rbuf + 16), now);
}

static void on_hb_sent(tp_req_t *req)
{
    ring_hb_t *h = req->data; /* never the ring: it may be gone */
    h->sbusy = 0;
}

/* The links a rank sends heartbeats on: the flat neighbours (one when
 * n == 2) and the grid's, once made; NULL past the last. */
static ring_link_t *link_at(ring_t *r, uint32_t i)
{
    if (i == 0)
        return &r->right;
    if (i == 1)
        return r->left.peer != r->right.peer ? &r->left : NULL;
    ring_grid_t *g = r->grid;
    if (g == NULL || g->links == NULL || i - 2 >= r->n)
        return NULL;
    return &g->links[i - 2];
}

static uint32_t nlinks(const ring_t *r)
{
    return 2 + (r->grid != NULL && r->grid->links != NULL ? r->n : 0);
}

static ring_hb_t *hb_of(ring_t *r, ring_link_t *l)
{
    if (l->hb == NULL) {
        l->hb = calloc(1, sizeof(*l->hb));
        if (l->hb == NULL)
            return NULL;
        l->hb->ring = r;
        hb_encode(l->hb->sbuf, r->rank, r->generation);
        if (l == &r->right && r->n == 2)
            r->left.hb = l->hb; /* two ranks: one endpoint both ways */
    }
    return l->hb;
}

static void hb_link(ring_t *r, ring_link_t *l, int send, uint32_t late_ms)
{
    if (l->peer == NULL || l->fail_rc != 0 || l->rank == r->rank)
        return;
    ring_hb_t *h = hb_of(r, l);
    if (h == NULL)
        return;
    if (!h->rposted) {
        h->rreq.cb = on_hb_recv;
        h->rreq.data = h;
        h->rposted = 1;
        if (tp_recv(r->tp, h->rbuf, RING_HB_LEN, hb_tag(r, l->rank),
                    UINT64_MAX, NULL, &h->rreq) != 0)
            h->rposted = 0;
    }
    if (send && !h->sbusy && !ring__cut(r, l, 0)) {
        h->sreq.cb = on_hb_sent;
        h->sreq.data = h;
        h->sbusy = 1;
        put_u32(h->sbuf + 16, late_ms);
        if (tp_send(l->peer, h->sbuf, RING_HB_LEN, hb_tag(r, r->rank), NULL,
                    &h->sreq) != 0)
            h->sbusy = 0;
        else
            r->stats.hb_sent++;
    }
}

void ring__hb_tick(ring_t *r, int64_t now)
{
    if (r->n < 2 || r->hb_closed)
        return;
    int send = now >= r->hb_next;
    if (!send && !r->hb_repost)
        return; /* the loops call this every turn: nothing to walk */
    r->hb_repost = 0;
    /* How late this tick is: the receivers take it off the gap they see,
     * so a busy sender is not taken for a lossy link. */
    int64_t late = r->hb_next != 0 && send ? (now - r->hb_next) / MS : 0;
    uint32_t late_ms = late > 0xffff ? 0xffff : (uint32_t)late;
    if (send)
        r->hb_next = now + RING_HB_PERIOD_MS * MS;
    if (send && r->hb_stall && r->hb_ticks++ % 4 != 0)
        send = 0; /* the test stall (ring_setup.c) */
    for (uint32_t i = 0, n = nlinks(r); i < n; i++) {
        ring_link_t *l = link_at(r, i);
        if (l != NULL)
            hb_link(r, l, send, late_ms);
    }
}

void ring_service(ring_t *r)
{
    if (r != NULL)
        ring__hb_tick(r, rd_now_ns());
}

int64_t ring__heard(const ring_t *r, uint32_t rank)
{
    const ring_link_t *l = NULL;
    if (rank == r->right.rank)
        l = &r->right;
    else if (rank == r->left.rank)
        l = &r->left;
    else if (r->grid != NULL && r->grid->links != NULL && rank < r->n)
        l = &r->grid->links[rank];
    return l != NULL && l->hb != NULL ? l->hb->heard : 0;
}

int ring__silent(const ring_t *r, uint32_t rank, int64_t now)
{
    if (r->opts.live_ms <= 0)
        return 0;
    int64_t h = ring__heard(r, rank);
    return h != 0 && now - h > (int64_t)r->opts.live_ms * 1000000;
}

int ring_set_liveness(ring_t *r, int live_ms)
{
    if (live_ms < 0) {
        RD_ERROR("ring_set_liveness: %d ms", live_ms);
        return ST_EINVAL;
    }
    r->opts.live_ms = live_ms;
    return 0;
}

/* Every heartbeat state of the ring, each once (the flat neighbours'
 * is one when n == 2), whatever became of the endpoints: NULL past the
 * last. */
static ring_hb_t **hb_at(ring_t *r, uint32_t i)
{
    if (i == 0)
        return &r->right.hb;
    if (i == 1)
        return r->left.hb != r->right.hb ? &r->left.hb : NULL;
    ring_grid_t *g = r->grid;
    if (g == NULL || g->links == NULL || i - 2 >= r->n)
        return NULL;
    return &g->links[i - 2].hb;
}

static int hb_busy(const ring_hb_t *h)
{
    return h != NULL && (h->rposted || h->sbusy);
}

/*
 * At ring_destroy, after the endpoints were closed (their sends complete
 * then): cancel the receives and wait, bounded, until UCX let go of every
 * heartbeat buffer; what it still holds is leaked, not freed under it,
 * and its callbacks no longer touch the ring.
 */
void ring__hb_close(ring_t *r)
{
    r->hb_closed = 1;
    uint32_t n = nlinks(r);
    for (uint32_t i = 0; i < n; i++) {
        ring_hb_t **h = hb_at(r, i);
        if (h != NULL && *h != NULL && (*h)->rposted)
            tp_cancel(r->tp, &(*h)->rreq);
    }
    int64_t deadline = rd_now_ns() + HB_UNWIND_NS;
    for (;;) {
        int busy = 0;
        for (uint32_t i = 0; i < n; i++) {
            ring_hb_t **h = hb_at(r, i);
            busy |= h != NULL && hb_busy(*h);
        }
        if (!busy || rd_now_ns() > deadline)
            break;
        tp_progress(r->tp);
    }
    for (uint32_t i = 0; i < n; i++) {
        ring_hb_t **h = hb_at(r, i);
        if (h == NULL || *h == NULL)
            continue;
        if (hb_busy(*h)) {
            RD_ERROR("ring gen %" PRIu64 ": a heartbeat request outlived "
                     "the close; leaking it", r->generation);
            (*h)->ring = NULL; /* its callback must not touch the ring */
        } else {
            free(*h);
        }
        if (i == 0 && r->left.hb == *h)
            r->left.hb = NULL;
        *h = NULL;
    }
}
