/*
 * ring.h - fault-aware ring collectives over the transport: allreduce,
 * broadcast, allgather and barrier among the members of one view.
 *
 * A ring_t is made for one view (generation, ordered members, my rank) and
 * dies with it: after any failure or abort every collective on it returns
 * an error, and the owner destroys it and creates one for the next view.
 *
 * Threading: all calls except ring_abort() belong to the thread that owns
 * the tp_t (the ring thread); collectives block that thread. ring_abort()
 * may be called from any thread while the ring exists; the caller must
 * not destroy the ring concurrently with it.
 *
 * Errors: collectives return 0 or a negative ST_ code, logged once:
 *   ST_EPEER          a neighbour's endpoint failed (ring_suspect names it)
 *   ST_EPEER_TIMEOUT  no progress for deadline_ms (ring_suspect names it)
 *   ST_EPEER_SILENT   a neighbour heard from on this ring sent neither
 *                     data nor heartbeats for live_ms (ring_suspect names
 *                     it): its daemon stopped, or the link is cut
 *   ST_EABORTED       ring_abort() was called, or the ring already failed
 *   ST_EINVAL         bad arguments (the ring stays usable)
 * The user's buffer is only ever written with validated data: receives
 * land in ring-owned staging buffers first (see ring/README.md).
 */
#ifndef RINGD_RING_H
#define RINGD_RING_H

#include <stddef.h>
#include <stdint.h>

#include "common/wire.h"
#include "kernels/kern.h"
#include "transport/tp.h"

typedef struct ring ring_t;

/* The view a ring is built for; copied by ring_create. */
typedef struct {
    uint64_t generation;
    uint32_t nranks;
    uint32_t rank;
    /* [nranks] UCX worker addresses and their lengths: only the two
     * neighbours' are read (a grid exchanges the others itself). */
    const void *const *addrs;
    const size_t *addr_lens;
    /* [nranks] or NULL: ranks of one host share a key (the view orders
     * them consecutively); the grid makes a row of each host when all
     * hosts are the same size. */
    const uint32_t *hosts;
    /* With tag_keyed, the generation field of every tag of this ring
     * (transport/tp.h) is tag_gen, a value the owner derives from the job
     * secret (job_auth_tag_gen), not generation mod 2^24: a process
     * without the secret cannot make a tag any receive matches, and every
     * message of ring data without it is dropped as stale. Every rank of
     * the view must pass the same. */
    int tag_keyed;
    uint32_t tag_gen;
} ring_view_t;

typedef void (*ring_fail_cb)(void *arg, uint32_t rank, int status);
/* A neighbour's link stalls (ring_hb.c, "A lossy link"): called on the
 * ring's thread with the ring's generation and the neighbour's rank. */
typedef void (*ring_lossy_cb)(void *arg, uint64_t generation, uint32_t rank);
typedef void (*ring_mismatch_cb)(void *arg, uint64_t generation,
                                 uint32_t rank, unsigned flags);

typedef struct {
    size_t chunk_bytes;   /* pipeline chunk (default RING_CHUNK_DEFAULT) */
    unsigned recv_depth;  /* receives in flight per channel (default 2) */
    unsigned send_depth;  /* sends in flight per channel (default 4) */
    int deadline_ms;      /* no progress this long fails (default 2000) */
    int spin_us;          /* busy-poll this long before sleeping on efd */
    int spin_adaptive;    /* 1 (default): busy-poll only while the last
                             idle spells were shorter than spin_us */
    int bidirectional;    /* allreduce on two rings, half the data each:
                             RING_BIDIR_OFF, _ON (every allreduce of 2
                             elements or more) or _AUTO (default: by
                             size, below) */
    int recv_inplace;     /* 1 (default): receives that only copy (the
                             allgather half, broadcast) land in the
                             user's buffer, not in a staging slot; a
                             rank's own choice, nothing on the wire */
    rd_wire_t wire;       /* compression of f32 allreduce: NONE, BF16
                             or F16 (DEFAULT is what a call's DEFAULT
                             means, so the ring has none of its own) */
    ring_fail_cb on_fail; /* called once with the suspect's rank */
    void *on_fail_arg;
    /* At a deadline, on the ring's thread: 1 when the quiet rank is known
     * to be alive (its daemon holds its lease), so the wait is a slow
     * trainer, not a failure, and the collective waits on. NULL: fail. */
    int (*on_quiet)(void *arg, uint32_t rank);
    void *on_quiet_arg;
    /* Liveness apart from progress (ring/README.md, "Liveness"): every
     * rank heartbeats its neighbours whatever its trainer does; a
     * neighbour heard from on this ring that then sends neither data nor
     * heartbeats for live_ms while a collective waits on it fails the
     * collective with ST_EPEER_SILENT. 0 (default): off, the deadline and
     * on_quiet alone. A rank's own choice, nothing on the wire. */
    int live_ms;
    /* With live_ms set: a neighbour whose heartbeats stall on its link
     * (one came HB_STALL_MS late, not through the sender's own delay,
     * while this rank's other links were on time) is reported here, at
     * most once a second per link. NULL: not watched. With two ranks
     * (one link, nothing to compare with) only after two stalls within
     * a second; which end is at fault is membership's to tell. */
    ring_lossy_cb on_lossy;
    void *on_lossy_arg;
    /* A neighbour's message of the running collective has another size
     * than this rank's (it posted another collective here): called once a
     * collective, on the ring's thread, with the generation, the sender
     * and the flags of that message ORed with this rank's (0 for a longer
     * message, which the transport truncates). The collective waits on,
     * as for any missing message, until the owner aborts it (a new view);
     * the message is dropped and counted in stats.forged. NULL: waits. */
    ring_mismatch_cb on_mismatch;
    void *on_mismatch_arg;
    /* The two-level (grid) allreduce, when nranks >= grid_min_nodes (0:
     * never) and the message is at most grid_max_bytes (0: any size).
     * Every rank of a view must use the same three values. Not with wire
     * compression (the flat ring runs then). */
    uint32_t grid_min_nodes;
    size_t grid_max_bytes;
    uint32_t grid_cols;   /* row width; 0: one row per host, else sqrt */
    int split_lone;       /* 1 (default): an allreduce's segment of 1 MiB
                             or more that would be one chunk goes as two
                             (ring/README.md, "Two rings"); 0: the
                             geometry of rings before that rule */
} ring_opts_t;

#define RING_CHUNK_DEFAULT (1024 * 1024) /* ringbench: best busbw */

/*
 * Two rings or one. RING_BIDIR_AUTO runs an allreduce of RING_BIDIR_MIN to
 * RING_BIDIR_MAX bytes of data on two and the rest on one: where two were
 * as fast or faster both in `ringbench --options` (medians of rounds by
 * turns, tcp, n = 2 and 4) and through the daemons (`bench/e2e
 * --vs-ring`). Below 16 MiB the raw ring gained but the daemons' path
 * did not (n = 4, 1 MiB: 0.89x); at 256 MiB n = 2 read 0.89-1.04x.
 * ring/README.md, "Two rings".
 */
enum { RING_BIDIR_OFF = 0, RING_BIDIR_ON = 1, RING_BIDIR_AUTO = 2 };
#define RING_BIDIR_MIN ((size_t)16 << 20)
#define RING_BIDIR_MAX ((size_t)128 << 20)

/*
 * Every rank of a view must use the same chunk_bytes, bidirectional, wire,
 * grid and split_lone fields (ringd carries them in the job's view).
 * Defaults, then the environment: RINGD_RING_CHUNK (bytes),
 * RINGD_RING_DEADLINE_MS, RINGD_RING_SPIN_US, RINGD_RING_BIDIR=0|1|2,
 * RINGD_RING_WIRE=none|bf16|f16, RINGD_RING_GRID_MIN_NODES,
 * RINGD_RING_GRID_MAX_BYTES, RINGD_RING_GRID_COLS, RINGD_RING_SPLIT=0|1, and
 * RINGD_RING_RECV_INPLACE=0|1 and RINGD_RING_LIVE_MS (not on the wire:
 * nodes may differ).
 */
void ring_opts_default(ring_opts_t *opts);

/*
 * Connect to the neighbours of view->rank. opts may be NULL (defaults).
 * Nothing is sent yet; the first collective completes the connection.
 * When a neighbour's endpoint cannot be made (ST_ELINK: on loopback, its
 * port refused the connection), *unreachable_p (if not NULL) names that
 * rank; otherwise it is UINT32_MAX.
 */
int ring_create(tp_t *tp, const ring_view_t *view, const ring_opts_t *opts,
                ring_t **ring_p, uint32_t *unreachable_p);
/*
 * Closes the endpoints and frees. Accepts NULL. A healthy ring flushes
 * them (bounded by 1 s each); a failed ring, or one ring_abort() was
 * called on, closes them at once (a neighbour still using this ring
 * then sees an endpoint failure). Never waits on a collective.
 */
void ring_destroy(ring_t *ring);

/*
 * The node's local sources of an allreduce (its trainers' buffers), for
 * ring_allreduce_t.local. Source i holds the whole region in bufs[i]
 * (nsegs 0 or 1), or, fused, the region's nsegs consecutive pieces of
 * seg_counts[s] elements at bufs[i * nsegs + s]. They are reduced in
 * source order, per element (two: kern_reduce3 of both; otherwise the
 * first copied, then kern_reduce of each next one), whatever range is
 * asked for, so a range holds bitwise what the whole region would.
 */
typedef struct {
    void *const *bufs;
    uint32_t nbufs;           /* >= 1 */
    uint32_t nsegs;
    const size_t *seg_counts; /* [nsegs] when nsegs > 1 */
} ring_local_t;

/* dst[0..count) = the reduction of the sources' elements [first,
 * first + count) of dt under op (op KERN_AVG sums). dst may be the first
 * source's range itself (whole sources: the region in bufs[0]), never a
 * partial overlap. */
void ring_local_gather(const ring_local_t *l, kern_dtype_t dt, kern_op_t op,
                       void *dst, size_t first, size_t count);
/* src[0..count), elements of es bytes, into every source at [first,
 * first + count) (a source that is src itself is skipped). */
void ring_local_scatter(const ring_local_t *l, size_t es, const void *src,
                        size_t first, size_t count);

/*
 * One allreduce, described whole: every field but local must be the same
 * on every rank (local is a rank's own business). Zeroed fields are the
 * plain case: no divisor, the ring's wire format, one buffer.
 */
typedef struct {
    void *buf;       /* count elements of dt, reduced in place; with
                        local, the region the ring runs in: staging,
                        whose contents on entry do not matter, or, with
                        whole sources, bufs[0] itself (a daemon's way:
                        no third buffer to sum into and copy out of) */
    size_t count;
    kern_dtype_t dt;
    kern_op_t op;
    /* KERN_AVG: what the sum is divided by; 0: the number of ranks. A
     * daemon passes the job's trainers, not its nodes. Each chunk is
     * divided once, by the rank that owns it after the reduce-scatter,
     * so there is no extra pass over buf. Must be 0 for the other ops. */
    uint32_t divisor;
    /* An f32 allreduce sent as 16-bit values and accumulated in f32
     * (other dtypes ignore it); RD_WIRE_DEFAULT: opts.wire. */
    rd_wire_t wire;
    /* NULL: buf holds this rank's input. Otherwise the input is the
     * reduction of these sources, and the result goes back into each of
     * them as well as into buf (see ring_allreduce). */
    const ring_local_t *local;
} ring_allreduce_t;

/*
 * buf[0..count) of dt becomes the reduction under op over all ranks,
 * bitwise identical on every rank. a is read during the call only.
 *
 * Wire compression: the first compressed call of a ring made with wire
 * none allocates its send slots (send_depth chunks a channel): ST_ENOMEM
 * then, and the ring stays usable.
 *
 * Local sources: each chunk of buf is filled with the sources' reduction
 * (ring_local_gather) just before the ring first uses it, in the order
 * the ring needs them, and while the ring waits for the network a few
 * chunks ahead; each chunk is written back into every source as it
 * becomes final (the own chunks after the last reduce-scatter step, the
 * others as the allgather delivers them). Every receive is validated in a
 * staging slot before it touches buf. The result is bitwise that of
 * gathering the whole region first, reducing it without local, and
 * scattering it back. The grid keeps that staged order (it gathers all,
 * runs, scatters all); ring_stats' local_pipelined counts the calls that
 * ran pipelined. One source in pieces that do not overlap (a fused group
 * of one trainer) is not gathered at all on the flat ring: its chunks
 * are addressed in the pieces (one that crosses two is packed into a
 * send slot, and applied piece by piece), buf is left alone, and
 * local_in_place counts the call. On failure the sources and buf hold
 * undefined data.
 *
 * ST_EINVAL (logged, the ring stays usable) for a dt or op outside
 * kern's, a NULL buf with count > 0, a divisor with an op other than
 * KERN_AVG, a wire outside rd_wire_t, or local sources that do not make
 * count elements.
 */
int ring_allreduce(ring_t *ring, const ring_allreduce_t *a);
/* bytes of buf on rank root end up on every rank. */
int ring_broadcast(ring_t *ring, void *buf, size_t bytes, uint32_t root);
/*
 * In place: buf holds nranks blocks of block_bytes; on entry rank r's
 * block r is its contribution, on return every block is filled.
 */
int ring_allgather(ring_t *ring, void *buf, size_t block_bytes);
/* Returns once every rank has entered the barrier: an allgather of one
 * byte a rank on the flat ring (n - 1 hops), a one-byte allreduce on the
 * grid. */
int ring_barrier(ring_t *ring);

/*
 * Before the first collective, for a handshake of the owner's: len bytes
 * to each neighbour (to_left, to_right) and len bytes from each (into
 * from_left, from_right; with two ranks both are the one neighbour's).
 * Raw-channel messages of this generation, bounded by deadline_ms. On a
 * failure (ST_EPEER, ST_EPEER_TIMEOUT, ST_EPEER_FORGED for a wrong size)
 * *rank_p names the neighbour and the ring is failed. A neighbour whose
 * answer the owner rejects is the owner's to report (ring_abort, then
 * ring_destroy closes the endpoints at once).
 */
int ring_hello(ring_t *ring, const void *to_left, const void *to_right,
               void *from_left, void *from_right, size_t len,
               uint32_t *rank_p);

/*
 * Thread-safe. Makes the collective in progress (and every later one)
 * return ST_EABORTED within the bound, without touching user buffers.
 */
void ring_abort(ring_t *ring);

/*
 * Owner thread, between collectives: the deadline of the next ones. Ranks
 * reach the first collective of a new ring at different times (a node's
 * trainers may still be computing), so an owner can create the ring with
 * a long deadline for that one and set the normal one after it. ST_EINVAL
 * for deadline_ms < 1.
 */
int ring_set_deadline(ring_t *ring, int deadline_ms);
/*
 * Owner thread, between collectives: live_ms of the next ones (0: off).
 * An owner whose ranks may be busy between the first collectives of a
 * ring (a restore) creates it with 0 and sets it once they are past.
 * ST_EINVAL for live_ms < 0.
 */
int ring_set_liveness(ring_t *ring, int live_ms);
/*
 * Owner thread: send the heartbeats due and take those that came. The
 * collectives do it themselves; between them the owner calls it at least
 * every RING_SERVICE_MS, or its neighbours find it silent. Accepts NULL.
 */
#define RING_SERVICE_MS 50
void ring_service(ring_t *ring);

/*
 * Flags piggybacked on the collectives' messages, for the owner's control
 * traffic (the job's "the trainer counts must be agreed again"). Owner
 * thread, between collectives: the next collectives OR flags
 * (RING_FLAGS_MASK) into every message this rank sends, with every
 * flag it has received so far in the collective, hop by hop.
 */
#define RING_FLAGS_MASK 3u
void ring_set_flags(ring_t *ring, unsigned flags);
/*
 * After a collective returned 0: 1 when it reached every rank's flags, with
 * *flags_p their OR (the same on every rank), else 0. Allreduce, barrier
 * and allgather of a non-zero size reach them (every rank's last receive
 * descends, hop by hop, from a send of each other rank); broadcast (the
 * flags of ranks downstream of the root never travel back) and zero
 * sizes (no message) do not. With one rank *flags_p is its own.
 */
int ring_flags_seen(const ring_t *ring, unsigned *flags_p);

/* The failure that killed the ring: 0, or its code and the suspect rank. */
int ring_suspect(const ring_t *ring, uint32_t *rank_p);

/* The neighbour other than `named` whose endpoint failed too (both of a
 * rank's neighbours die at once): 1 with its rank, or 0. */
int ring_other_failed(const ring_t *ring, uint32_t named, uint32_t *rank_p);

typedef struct {
    uint64_t collectives;    /* completed successfully */
    uint64_t stale_dropped;  /* messages of old generations/collectives */
    uint64_t forged;         /* messages of a collective, of another size */
    uint32_t left_rank;      /* whom the waits below are spent on */
    uint64_t last_wait_us;   /* last collective: time idle waiting */
    uint64_t max_wait_us;
    uint64_t total_wait_us;
    uint64_t last_usec;      /* last collective: wall time */
    uint32_t next_seq;       /* sequence number of the next collective */
    uint64_t grid;           /* allreduces that ran on the grid */
    uint32_t grid_rows;      /* its rows; 0: the ring has no grid */
    uint64_t local_pipelined; /* allreduces of local sources that reduced
                                 them chunk by chunk in the ring */
    uint64_t local_in_place;  /* allreduces of one local source in pieces
                                 that ran in the pieces themselves */
    uint64_t two_rings;       /* allreduces that ran on two rings
                                 (ring_opts_t.bidirectional) */
    uint64_t recv_inplace;  /* receives applied that had landed in the
                               user's buffer (no staging copy) */
    /* Idle spells of collectives (no work from UCX or the channels until
     * the next event): */
    uint64_t spin_hits;     /* ended by an event while busy-polling */
    uint64_t sleeps;        /* slept on the efd at least once */
    uint64_t spin_misses;   /* of those, busy-polled spin_us first */
    uint64_t spin_waste_us; /* busy-polled in the misses, for nothing */
    /* Heartbeats (liveness, ring_hb.c): */
    uint64_t hb_sent;
    uint64_t hb_recv;       /* valid ones taken */
    uint64_t hb_forged;     /* a heartbeat's tag, not its payload */
    uint64_t hb_stalls;     /* late on one link while the others were not */
    uint64_t hb_lossy;      /* on_lossy calls */
} ring_stats_t;

void ring_stats(const ring_t *ring, ring_stats_t *stats_p);

#endif /* RINGD_RING_H */
