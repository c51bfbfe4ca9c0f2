/*
 * ring_apply.c - what a message does to the region: a validated receive
 * reduced into it or copied over it (the owner's division and the wire's
 * rounding with it), and a send packed into its slot when it cannot go
 * from the region as it lies (compressed, or across two pieces of one
 * local source). Every range goes through ring__region_each, so the flat
 * region and a source's pieces take the same code.
 */
#include "ring/ring-int.h"

#include <string.h>

/* Round f32 values to the wire format and back: what everyone receives. */
static void wire_round(ring_t *r, float *x, void *tmp, size_t n)
{
    if (r->coll.wire_fmt == RD_WIRE_BF16) {
        kern_f32_to_bf16(tmp, x, n);
        kern_bf16_to_f32(x, tmp, n);
    } else {
        kern_f32_to_f16(tmp, x, n);
        kern_f16_to_f32(x, tmp, n);
    }
}

static kern_dtype_t wire_dt(const ring_t *r)
{
    return r->coll.wire_fmt == RD_WIRE_BF16 ? KERN_BF16 : KERN_F16;
}

typedef struct {
    ring_slot_t *sl;
    ring_act_t act;
} apply_arg_t;

/* Apply elements [done, done + cnt) of a validated message to dst. */
static void apply_range(ring_t *r, void *arg, uint8_t *dst, size_t cnt,
                        size_t done)
{
    apply_arg_t *a = arg;
    ring_act_t act = a->act;
    void *src = a->sl->buf + done * r->coll.wire_es;
    if (act == ACT_COPY) {
        if (r->coll.wire && r->coll.wire_es == 2) {
            if (r->coll.wire_fmt == RD_WIRE_BF16)
                kern_bf16_to_f32((float *)dst, src, cnt);
            else
                kern_f16_to_f32((float *)dst, src, cnt);
        } else {
            memcpy(dst, src, cnt * r->coll.es);
        }
        return;
    }
    if (r->coll.wire)
        kern_reduce_wire(wire_dt(r), r->coll.op, (float *)dst, src, cnt);
    else
        kern_reduce(r->coll.dt, r->coll.op, dst, src, cnt);
    if (act != ACT_REDUCE_FINAL)
        return;
    /* This rank owns the chunk now: finish it once for everyone. */
    if (r->coll.op == KERN_AVG)
        kern_avg_finish(r->coll.dt, dst, cnt, r->coll.avg_div);
    if (r->coll.wire)
        wire_round(r, (float *)dst, src, cnt);
}

/* Apply a validated message to the user's buffer (to each piece of it
 * the chunk covers, when the region is a source's pieces). */
void ring__apply(ring_chan_t *c, ring_slot_t *sl, size_t off, size_t cnt,
                 ring_act_t act)
{
    if (act == ACT_COPY && sl->inplace)
        return; /* it landed there */
    apply_arg_t a = {.sl = sl, .act = act};
    ring__region_each(c, off, cnt, apply_range, &a);
}

/* Elements [done, done + n) of a send, from p into the slot slot_buf: in
 * the wire format when compressed. */
static void pack_range(ring_t *r, void *slot_buf, uint8_t *p, size_t n,
                       size_t done)
{
    uint8_t *dst = (uint8_t *)slot_buf + done * r->coll.wire_es;
    if (!r->coll.wire)
        memcpy(dst, p, n * r->coll.es);
    else if (r->coll.wire_fmt == RD_WIRE_BF16)
        kern_f32_to_bf16((uint16_t *)dst, (const float *)p, n);
    else
        kern_f32_to_f16((uint16_t *)dst, (const float *)p, n);
}

/* Channel elements [off, off + cnt) into a send slot: compressed, or
 * (one source in pieces) a chunk that crosses two pieces. */
void ring__pack(ring_chan_t *c, size_t off, size_t cnt, uint8_t *slot_buf)
{
    ring__region_each(c, off, cnt, pack_range, slot_buf);
}
