/*
 * ring-worker.h - what the files of the ring test worker share: its state
 * (one rank's options, ring and output), DIE, the deterministic data and
 * references of ring-worker-data.c, and the local mode of
 * ring-worker-local.c. ring-worker.c holds main and the other modes.
 */
#ifndef RINGD_TEST_RING_WORKER_H
#define RINGD_TEST_RING_WORKER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kern.h"
#include "ring/ring.h"
#include "transport/tp.h"

#define DIE(...)                                                             \
    do {                                                                     \
        fprintf(stderr, "rank %u: ", W.rank);                                \
        fprintf(stderr, __VA_ARGS__);                                        \
        fprintf(stderr, "\n");                                               \
        exit(1);                                                             \
    } while (0)

typedef struct {
    const char *dir, *mode;
    uint32_t rank, n;
    uint64_t gen;
    ring_opts_t opts;
    size_t counts[16];
    int ncounts;
    size_t count;
    int iters, expect_fail, expect_grid, keyed, live_test;
    uint32_t locals;
    int fused, f32_only;
    uint32_t expect_rows;
    int expect_inplace; /* -1: no check; 0: none in place; 1: some */
    int rings[16];      /* rings mode: two rings (1) or one, per count */
    int nrings;
    uint32_t host_size;
    uint32_t *hosts;
    tp_t *tp;
    ring_t *ring;
    FILE *out;
    void **addrs;
    size_t *lens;
    int onfail_count;
    uint32_t onfail_rank;
    atomic_int running;
} worker_t;

extern worker_t W; /* ring-worker.c */

/* Deterministic data and references (ring-worker-data.c): rank r's value
 * at i before rounding to the dtype; element i of buf written and read as
 * a double; an exact integer wrapped into the dtype; the exact integer
 * result at i of op over the W.n ranks; a float result at i checked
 * against a double reference (DIE when out of tolerance); the hash of a
 * result. */
int is_float(kern_dtype_t dt);
double gen_val(kern_dtype_t dt, kern_op_t op, uint32_t r, size_t i);
void put(kern_dtype_t dt, void *buf, size_t i, double x);
double get(kern_dtype_t dt, const void *buf, size_t i);
int64_t wrap(kern_dtype_t dt, uint64_t x);
int64_t int_ref(kern_dtype_t dt, kern_op_t op, size_t i);
void check_float(kern_dtype_t dt, kern_op_t op, const void *buf,
                 size_t i, const char *what);
uint64_t fnv(const void *buf, size_t len);

/* MODE local (ring-worker-local.c). */
void mode_local(void);

#endif /* RINGD_TEST_RING_WORKER_H */
