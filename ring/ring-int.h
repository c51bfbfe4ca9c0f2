/*
 * ring-int.h - ring internals: the channel engine shared by all
 * collectives.
 */
#ifndef RINGD_RING_INT_H
#define RINGD_RING_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "ring/ring.h"
#include "transport/tp.h"

#define RING_MAX_CHAN 2 /* tag channels of ring data (flat and grid) */
#define RING_NCHAN 2    /* engine channels: two rings, or a grid rank's
                           column rings (ring_grid.c) */
#define RING_NO_DEP UINT32_MAX

/*
 * The ring's use of the tag's 20-bit index field: the low RING_IDX_BITS
 * number the message (m mod 2^18), the top two carry the sender's flags
 * (ring_set_flags). Receives match every other bit exactly. The wrap is
 * harmless: a channel's messages come from one neighbour over one
 * endpoint, in order, and UCX matches the oldest message that fits, so
 * message m is always taken before m + 2^18.
 */
#define RING_IDX_BITS 18
#define RING_IDX_MASK ((1u << RING_IDX_BITS) - 1)
#define RING_FLAG_SHIFT RING_IDX_BITS

typedef enum { SLOT_FREE = 0, SLOT_POSTED, SLOT_DONE } ring_slot_state_t;

typedef struct {
    tp_req_t req;
    uint8_t *buf;
    ring_slot_state_t state;
    uint32_t m; /* message index it was posted for */
    int inplace; /* a receive posted straight into the user's buffer */
} ring_slot_t;

typedef enum {
    COLL_ALLREDUCE,
    COLL_ALLGATHER,
    COLL_BCAST,
} ring_coll_t;

/*
 * The collective in flight: what the channel engine's message geometry
 * and apply step read. Set whole by the collective's entry point before
 * coll_begin, so nothing of the previous one leaks into it.
 */
typedef struct {
    ring_coll_t kind;
    kern_dtype_t dt;
    kern_op_t op;
    uint32_t avg_div;    /* KERN_AVG: what each owned chunk is divided by */
    size_t es, wire_es;  /* element size in the buffer, on the wire */
    size_t count;        /* COLL_ALLREDUCE: elements of the whole of it */
    int wire;            /* f32 sent as 16-bit, in wire_fmt */
    rd_wire_t wire_fmt;  /* concrete: DEFAULT resolved to opts.wire */
    uint32_t root;       /* COLL_BCAST */
    /* An allreduce of local sources on the flat ring: the buffer is the
     * region, filled from and written back to these sources chunk by
     * chunk (ring_local.c); NULL otherwise. */
    const ring_local_t *local;
    /* Or the one local source in pieces, reduced in place: the region's
     * elements are its pieces' in order (ring_local.c,
     * ring__pieces_in_place); the region buffer is not used. */
    const ring_local_t *pieces;
    int err;             /* first error of this collective */
    uint32_t err_rank;   /* its suspect */
    int mismatch_told;   /* opts.on_mismatch called for it */
} ring_coll_desc_t;

/* What a received message does to the user's buffer. */
typedef enum { ACT_REDUCE, ACT_REDUCE_FINAL, ACT_COPY } ring_act_t;

/* Heartbeats (ring_hb.c): channel 3 (ring_hello.c's, another sequence),
 * sent every RING_HB_PERIOD_MS on every link. */
#define RING_HB_CHAN 3
#define RING_HB_SEQ (TP_TAG_SEQ_MASK - 1)
#define RING_HB_LEN 24
#define RING_HB_PERIOD_MS 100
typedef struct ring_hb ring_hb_t;

/* One neighbour: the endpoint and who it is, for failure reports. */
typedef struct {
    ring_t *ring;
    tp_peer_t *peer;
    uint32_t rank;
    int fail_rc; /* the endpoint's failure, 0 while healthy */
    uint32_t fail_order; /* 1 for the ring's first failed link, 2... */
    ring_hb_t *hb;       /* its heartbeats, made at the first tick */
} ring_link_t;

/* The grid: rows of consecutive ranks, balanced (widths differ by at
 * most one); see ring_grid.c. NULL in a ring that never uses it. */
typedef struct {
    uint32_t rows;
    uint32_t row, col;     /* my row, my position in it */
    uint32_t wmin, wmax;   /* row widths (wmax = wmin or wmin + 1) */
    uint32_t *row_first;   /* [rows + 1]: the first rank of each row */
    ring_link_t *links;    /* [n]: by rank (see grid_connect) */
    int connected;         /* grid_exchange done */
    size_t *bounds;        /* per allreduce: the merged segment bounds */
} ring_grid_t;

/* One direction of data flow around the ring. */
typedef struct {
    ring_t *ring;
    unsigned id;        /* tag channel */
    ring_link_t *to;    /* send to */
    ring_link_t *from;  /* receive from */
    uint32_t pos;       /* my position in this channel's order */
    /* Per collective: the ring this channel runs on (the view, a grid
     * row or column), its first step (a grid row's allgather half starts
     * at step n-1), and whether the last reduce-scatter step finishes
     * the chunk (AVG, wire rounding: never in a grid row). */
    uint32_t n, step0;
    int finish;
    ring_slot_t *rs;    /* [recv_depth] */
    ring_slot_t *ss;    /* [send_depth] */
    /* Per collective. */
    uint8_t *base;      /* the channel's part of the user buffer */
    size_t first;       /* its first element's index in the buffer */
    size_t count;       /* elements in it */
    uint32_t nseg, k;   /* segments, chunks per segment */
    uint32_t nsend, nrecv;
    uint32_t next_send, next_post, next_proc, sends_done;
    int64_t last_rx, last_tx; /* last receive applied / send finished */
    /* coll.local: chunks filled from the sources, in the order of first
     * use (ring__local_fill), and final chunks written back to them. */
    uint32_t filled, published;
} ring_chan_t;

typedef enum {
    RING_READY = 0, /* idle, usable */
    RING_RUNNING,   /* a collective is in progress */
    RING_FAILED,    /* dead: every collective returns an error */
} ring_state_t;

struct ring {
    tp_t *tp;
    ring_opts_t opts;
    uint32_t gen; /* the tags' generation field (ring_view_t.tag_gen) */
    int tag_keyed; /* gen is keyed: its order means nothing */
    uint64_t generation;
    uint32_t n, rank;
    ring_link_t left, right;
    ring_chan_t chan[RING_NCHAN];
    ring_grid_t *grid;
    uint8_t *arena; /* staging buffers of all slots */
    size_t arena_len;
    tp_mem_t *arena_mem;
    /* The send slots of compressed allreduces: in the arena when
     * opts.wire is set, else made by the first per-call one. */
    uint8_t *wire_arena;
    tp_mem_t *wire_mem, *send_mem;
    ring_state_t state;
    int fail_rc;
    uint32_t suspect;
    atomic_int abort_req;
    int leaked; /* requests never completed: keep the arena */
    ring_coll_desc_t coll; /* the collective in flight */
    uint32_t seq;          /* collective sequence, in every tag */
    uint32_t hellos;       /* ring_hello rounds so far, in their tags */
    uint32_t links_failed; /* links whose endpoint failed so far */
    unsigned nchan;
    unsigned flags_out;    /* ring_set_flags: ORed into every send */
    unsigned flags_seen;   /* ours | those of every message applied */
    int flags_all;         /* last collective: flags_seen is every rank's */
    /* Idle spells in a row shorter than spin_us, up to RING_SPIN_TRUST:
     * the adaptive policy busy-polls only at RING_SPIN_TRUST. */
    int spin_credit;
    int64_t hb_next; /* when the next heartbeats are due */
    int hb_closed;   /* ring_destroy: none any more */
    int hb_repost;   /* a heartbeat came: its receive is to post again */
    /* Fault injection for tests (RINGD_TEST_CUT_RIGHT, ring_setup.c):
     * from the allgather half of collective cut_seq on, nothing more is
     * sent to the right neighbour, heartbeats included: a link that
     * stops carrying one direction, at a chosen point of a collective
     * (iptables makes the same cut, but not at a chosen point). */
    uint8_t *barrier_bytes; /* ring_barrier's allgather: n bytes */
    int hb_stall;       /* RINGD_TEST_HB_STALL: beat every fourth tick */
    uint32_t hb_ticks;
    int cut_armed;
    uint32_t cut_seq;
    int cut_right;
    ring_stats_t stats;
};

#define RING_SPIN_TRUST 2

/* x mod n in [0, n), for negative x too. */
static inline uint32_t ring__mod_n(int64_t x, uint32_t n)
{
    int64_t m = x % (int64_t)n;
    return (uint32_t)(m < 0 ? m + n : m);
}

/* tp_fail_cb of a link's endpoint (ring.c); ring_setup.c registers it. */
void ring__on_peer_fail(void *arg, tp_peer_t *peer, int status);

/* The send slots a compressed allreduce converts into (ring_setup.c):
 * 0, or ST_ENOMEM and the like, logged. */
int ring__wire_slots(ring_t *r);

/* Heartbeats (ring_hb.c): send those due at now and post the receives;
 * when rank was last heard from (ns, 0: never); 1 when it was heard on
 * this ring and is silent past opts.live_ms; the teardown. */
void ring__hb_tick(ring_t *r, int64_t now);
/* Data from l's rank was applied at now (the lossy-link test: a link
 * whose data flows is not stalled, whatever its heartbeats show). */
void ring__hb_data(ring_link_t *l, int64_t now);
/* RINGD_TEST_HB_STALL (ring_setup.c): 1 while this rank's data sends are
 * held, as a stalled TCP stream holds them. */
int ring__test_held(const ring_t *r);
int64_t ring__heard(const ring_t *r, uint32_t rank);
int ring__silent(const ring_t *r, uint32_t rank, int64_t now);
void ring__hb_close(ring_t *r);

/* The test cut (above): 1 when this send to the right is not to go
 * out (ring_setup.c); a send it withholds is complete at once. */
int ring__cut(ring_t *r, const ring_link_t *to, int allgather_half);

/* Drop the unexpected messages no receive will take (ring_stale.c). */
void ring__drain_stale(ring_t *r);

/* Enter FAILED with rc naming rank who (ring.c), for ring_hello.c. */
void ring__fail(ring_t *r, int rc, uint32_t who);

/* The engine for ring_grid.c (ring.c; ring__coll_stats in ring_wait.c).
 * ring__coll_check: a collective may start; ring__coll_begin/run: run the
 * channels set up (their to, from, pos, n, step0, finish, and
 * ring__chan_setup's region), adding the idle time to *wait_ns; the last
 * run of a collective also fails the ring for the next one when a link
 * failed after it was no longer needed. */
int ring__coll_check(ring_t *r);
void ring__chans_flat(ring_t *r);
void ring__chan_setup(ring_chan_t *c, uint8_t *buf, size_t first,
                      size_t count, uint32_t nseg);
void ring__coll_begin(ring_t *r, unsigned nchan);
int ring__coll_run(ring_t *r, int64_t *wait_ns, int last);
void ring__coll_stats(ring_t *r, int64_t t0, int64_t wait_ns);
/* A flat collective the ring runs for itself (the grid's address
 * exchange), not counted in the stats: COLL_ALLREDUCE of count elements
 * of dt, or COLL_ALLGATHER of count bytes per rank (dt KERN_U8). The
 * collective in flight (ring->coll) is kept. */
int ring__flat_own(ring_t *r, ring_coll_t kind, void *buf, size_t count,
                   kern_dtype_t dt, kern_op_t op);

/* The running collective (ring.c) for its wait loop (ring_wait.c): its
 * first error wins and is logged once; one turn of the engine pumps every
 * channel, adds the work done to *work_p and returns 1 when the
 * collective is over. */
void ring__coll_fail(ring_t *r, int rc, uint32_t who);
int ring__coll_turn(ring_t *r, int *work_p);

/* Every receive of the channel is applied. */
static inline int ring__chan_recvs_done(const ring_chan_t *c)
{
    return c->next_proc == c->nrecv;
}

/* How a collective waits (ring_wait.c): turns of the engine until the
 * collective is over, progressing the worker, busy-polling or sleeping on
 * its efd when idle, failing it on a link's deadline; returns the idle
 * time in ns. */
int64_t ring__coll_loop(ring_t *r);

/* Geometry of the channel engine (ring.c): chunk j of segment seg of the
 * channel's region, and where receive m lands and what it does there. */
void ring__chunk_range(const ring_chan_t *c, uint32_t seg, uint32_t j,
                       size_t *off_p, size_t *cnt_p);
void ring__msg_recv(const ring_chan_t *c, uint32_t m, uint32_t *seg_p,
                    ring_act_t *act_p);

/* The local sources of a flat allreduce (ring_local.c, coll.local set):
 * fill the chunks of the order of first use below upto; write back the
 * chunks whose final value has been applied (returns how many); fill one
 * chunk ahead of the ring's need (1 when it did); the whole allreduce of
 * one rank (coll.local unset); the staged order, for the grid (gather
 * all, ring__grid_allreduce, scatter all). */
void ring__local_fill(ring_chan_t *c, uint32_t upto);
int ring__local_publish(ring_chan_t *c);
int ring__local_ahead(ring_t *r);
int ring__pieces_in_place(const ring_t *r, const ring_local_t *l);
uint8_t *ring__region_at(const ring_chan_t *c, size_t off, size_t n);
typedef void (*ring_range_fn)(ring_t *r, void *arg, uint8_t *p, size_t n,
                              size_t done);
void ring__region_each(ring_chan_t *c, size_t off, size_t n,
                       ring_range_fn fn, void *arg);
/* ring_apply.c */
void ring__apply(ring_chan_t *c, ring_slot_t *sl, size_t off, size_t cnt,
                 ring_act_t act);
void ring__pack(ring_chan_t *c, size_t off, size_t cnt, uint8_t *slot_buf);
void ring__local_one(ring_t *r, const ring_local_t *l, void *region,
                     size_t count);
int ring__local_staged(ring_t *r, const ring_local_t *l, void *region,
                       size_t count);

/* Grid (ring_grid.c): the layout at ring_create (0, or an error), its
 * endpoints' close, and the allreduce: 1 when the grid takes this one. */
int ring__grid_on(const ring_opts_t *o, uint32_t n);
int ring__grid_create(ring_t *r, const ring_view_t *v);
void ring__grid_close(ring_t *r, int force);
void ring__grid_free(ring_t *r);
int ring__grid_wants(const ring_t *r, size_t count, size_t es);
int ring__grid_allreduce(ring_t *r, void *buf, size_t count);
/* Of the links of the ring (flat and grid) whose endpoint failed, the one
 * that failed first (the others may be the cascade of its failure), or
 * NULL. */
ring_link_t *ring__failed_link(ring_t *r);

#endif /* RING_INT_H */
