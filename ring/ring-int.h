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

#define RING_MAX_CHAN 2
#define RING_NO_DEP UINT32_MAX

/*
 * The ring's use of the tag's 20-bit index field: the low RING_IDX_BITS
 * number the message (m mod 2^18), the top two carry the sender's flags
 * (ring_set_flags). Receives match every other bit exactly. The wrap is
 * harmless: a channel's messages come from one neighbour over one
 * endpoint, in order, and UCX matches the oldest message that fits, so
 * message m is always taken before m + 2^18 (the field wrapped at 2^20
 * before, for the same reason).
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
    int wire;            /* f32 sent as 16-bit (opts.wire) */
    uint32_t root;       /* COLL_BCAST */
    int err;             /* first error of this collective */
    uint32_t err_rank;   /* its suspect */
} ring_coll_desc_t;

/* What a received message does to the user's buffer. */
typedef enum { ACT_REDUCE, ACT_REDUCE_FINAL, ACT_COPY } ring_act_t;

/* One neighbour: the endpoint and who it is, for failure reports. */
typedef struct {
    ring_t *ring;
    tp_peer_t *peer;
    uint32_t rank;
    int fail_rc; /* the endpoint's failure, 0 while healthy */
} ring_link_t;

/* One direction of data flow around the ring. */
typedef struct {
    ring_t *ring;
    unsigned id;        /* tag channel */
    ring_link_t *to;    /* send to */
    ring_link_t *from;  /* receive from */
    uint32_t pos;       /* my position in this channel's order */
    ring_slot_t *rs;    /* [recv_depth] */
    ring_slot_t *ss;    /* [send_depth] */
    /* Per collective. */
    uint8_t *base;      /* the channel's part of the user buffer */
    size_t count;       /* elements in it */
    uint32_t nseg, k;   /* segments, chunks per segment */
    uint32_t nsend, nrecv;
    uint32_t next_send, next_post, next_proc, sends_done;
    int64_t last_rx, last_tx; /* last receive applied / send finished */
} ring_chan_t;

typedef enum {
    RING_READY = 0, /* idle, usable */
    RING_RUNNING,   /* a collective is in progress */
    RING_FAILED,    /* dead: every collective returns an error */
} ring_state_t;

struct ring {
    tp_t *tp;
    ring_opts_t opts;
    uint32_t gen; /* generation mod 2^24 */
    uint64_t generation;
    uint32_t n, rank;
    ring_link_t left, right;
    ring_chan_t chan[RING_MAX_CHAN];
    uint8_t *arena; /* staging buffers of all slots */
    size_t arena_len;
    tp_mem_t *arena_mem;
    ring_state_t state;
    int fail_rc;
    uint32_t suspect;
    atomic_int abort_req;
    int leaked; /* requests never completed: keep the arena */
    ring_coll_desc_t coll; /* the collective in flight */
    uint32_t seq;          /* collective sequence, in every tag */
    uint32_t hellos;       /* ring_hello rounds so far, in their tags */
    unsigned nchan;
    unsigned flags_out;    /* ring_set_flags: ORed into every send */
    unsigned flags_seen;   /* ours | those of every message applied */
    int flags_all;         /* last collective: flags_seen is every rank's */
    ring_stats_t stats;
};

/* x mod n in [0, n), for negative x too. */
static inline uint32_t ring__mod_n(int64_t x, uint32_t n)
{
    int64_t m = x % (int64_t)n;
    return (uint32_t)(m < 0 ? m + n : m);
}

/* tp_fail_cb of a link's endpoint (ring.c); ring_setup.c registers it. */
void ring__on_peer_fail(void *arg, tp_peer_t *peer, int status);

/* Enter FAILED with rc naming rank who (ring.c), for ring_hello.c. */
void ring__fail(ring_t *r, int rc, uint32_t who);

#endif /* RING_INT_H */
