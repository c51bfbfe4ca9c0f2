/*
 * ring_stale.c - dropping what no receive will ever take: unexpected
 * messages of older generations and collectives, and heartbeats of other
 * rings, drained at every collective's start and end (ring.c).
 */
#include "ring/ring-int.h"

#include <inttypes.h>

#include "common/log.h"

static int serial_lt(uint32_t a, uint32_t b, unsigned bits)
{
    uint32_t half = 1u << (bits - 1), mask = (1u << bits) - 1;
    return a != b && ((b - a) & mask) < half;
}

/*
 * Messages of older generations, or older collectives of this one. A
 * keyed generation field has no order: ring data of any other value is
 * an older ring's or nobody's, never a newer ring's: keyed tags come
 * with the owner's handshake (job/job_ring_auth.c), and a rank sends a
 * new ring's data only to neighbours it has passed it with (so they are
 * on that ring already), or to grid links made by an exchange every rank
 * of that ring takes part in.
 */
static int is_stale(void *arg, uint64_t tag)
{
    ring_t *r = arg;
    uint32_t g = tp_tag_gen(tag);
    /* A heartbeat of another ring (one destroyed, or that never came to
     * be here): nobody will take it. A newer ring's, when the generation
     * is keyed: lost, the next one comes a period later. */
    if (tp_tag_chan(tag) == RING_HB_CHAN &&
        tp_tag_seq(tag) == RING_HB_SEQ && g != r->gen)
        return r->tag_keyed || serial_lt(g, r->gen, TP_TAG_GEN_BITS);
    if (tp_tag_chan(tag) >= RING_MAX_CHAN)
        return 0; /* not ring data: someone else's to take */
    if (g != r->gen)
        return r->tag_keyed || serial_lt(g, r->gen, TP_TAG_GEN_BITS);
    return serial_lt(tp_tag_seq(tag), r->seq, TP_TAG_SEQ_BITS);
}

void ring__drain_stale(ring_t *r)
{
    int n = tp_drain(r->tp, is_stale, r);
    if (n > 0) {
        r->stats.stale_dropped += (uint64_t)n;
        RD_WARN("ring gen %" PRIu64 ": dropped %d stale message(s)",
                r->generation, n);
    }
}
