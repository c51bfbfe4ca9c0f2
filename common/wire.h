/*
 * wire.h - the one numbering of an f32 allreduce's compression on the
 * wire, from the trainer's request through the daemon and the job to the
 * ring (ring/README.md, "Wire compression"): 16 bits a value between
 * nodes, accumulated in f32.
 *
 * RD_WIRE_DEFAULT is "whatever the job runs with": a request's 0 takes
 * the job's format (the ring's opts.wire, which every rank of a view
 * shares), so a client that never names one keeps the job's choice. The
 * values equal the public ringd_wire_t's (proto/proto.h asserts it), so
 * the request's field is used as it comes, once validated.
 *
 * Header-only on purpose: the client, proto, ring and job all read it
 * without linking anything.
 */
#ifndef RINGD_COMMON_WIRE_H
#define RINGD_COMMON_WIRE_H

#include <string.h>

typedef enum {
    RD_WIRE_DEFAULT = 0, /* the job's (the ring's opts.wire) */
    RD_WIRE_NONE,        /* f32 on the wire */
    RD_WIRE_BF16,        /* f32 sent as bf16, accumulated in f32 */
    RD_WIRE_F16,         /* f32 sent as f16, accumulated in f32 */
    RD_WIRE_COUNT
} rd_wire_t;

/* "default", "none", "bf16", "f16"; "?" outside the enum. The concrete
 * names are those of configs and of the job's view ("wire" in its
 * options), so they never change. */
static inline const char *rd_wire_name(rd_wire_t w)
{
    static const char *const names[RD_WIRE_COUNT] = {"default", "none",
                                                     "bf16", "f16"};
    return (unsigned)w < RD_WIRE_COUNT ? names[w] : "?";
}

/* A concrete format by name ("none", "bf16", "f16") into *w_p: 0, or -1
 * for any other string ("default" too: a config or a view must say what
 * it means). */
static inline int rd_wire_parse(const char *name, rd_wire_t *w_p)
{
    for (int w = RD_WIRE_NONE; name != NULL && w < RD_WIRE_COUNT; w++)
        if (strcmp(name, rd_wire_name((rd_wire_t)w)) == 0) {
            *w_p = (rd_wire_t)w;
            return 0;
        }
    return -1;
}

/* w with RD_WIRE_DEFAULT resolved to job_default, and to none when that
 * is the default too (a job that names no format sends f32). */
static inline rd_wire_t rd_wire_concrete(rd_wire_t w, rd_wire_t job_default)
{
    if (w != RD_WIRE_DEFAULT)
        return w;
    return job_default != RD_WIRE_DEFAULT ? job_default : RD_WIRE_NONE;
}

/* 1 when w (concrete) sends 16-bit values. */
static inline int rd_wire_compresses(rd_wire_t w)
{
    return w == RD_WIRE_BF16 || w == RD_WIRE_F16;
}

#endif /* RINGD_COMMON_WIRE_H */
