/*
 * kern.h - the arithmetic of the ring: element-wise reductions and casts.
 *
 * All functions are pure, thread-safe, take any count (0 included) and any
 * alignment, and never allocate. The fastest implementation the CPU supports
 * (AVX-512, AVX2+F16C, scalar) is picked once, at first use; the per-ISA
 * tables stay reachable through kern_table() so tests can compare each one
 * with the scalar reference.
 *
 * Semantics, identical in every implementation (bitwise, NaN payloads aside):
 *  - f16/bf16 are computed in f32 and rounded to nearest even once.
 *    Because f32 has more than 2p+2 bits for p = 11 (f16) and 8 (bf16), that
 *    is the correctly rounded 16-bit result.
 *  - Float sum/prod follow IEEE (NaN and Inf propagate). min/max follow
 *    IEEE 754-2019 minimum/maximum: a NaN operand gives NaN, and -0 < +0.
 *  - Integer sum and prod wrap (two's complement), never undefined.
 *  - KERN_AVG reduces as KERN_SUM; kern_avg_finish() then scales once by
 *    1/n (floats: multiply by the float 1/n; integers: divide, truncating).
 */
#ifndef RINGD_KERN_H
#define RINGD_KERN_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    KERN_F32 = 0,
    KERN_F64,
    KERN_F16,
    KERN_BF16,
    KERN_I32,
    KERN_I64,
    KERN_U8,
    KERN_DTYPE_COUNT
} kern_dtype_t;

typedef enum {
    KERN_SUM = 0,
    KERN_PROD,
    KERN_MIN,
    KERN_MAX,
    KERN_AVG,
    KERN_OP_COUNT
} kern_op_t;

typedef enum {
    KERN_ISA_SCALAR = 0,
    KERN_ISA_AVX2,   /* AVX2 + F16C + FMA */
    KERN_ISA_AVX512, /* AVX-512 F/BW/VL + F16C */
    KERN_ISA_COUNT
} kern_isa_t;

/* dst[i] = dst[i] op src[i] */
typedef void (*kern_reduce_fn)(void *dst, const void *src, size_t n);
/* dst[i] = a[i] op b[i]; dst may alias a or b exactly (not partially). */
typedef void (*kern_reduce3_fn)(void *dst, const void *a, const void *b,
                                size_t n);
/* Conversions between f32 and a 16-bit format. */
typedef void (*kern_cast_fn)(void *dst, const void *src, size_t n);
/* acc[i] = acc[i] op (float)wire[i], wire being f16 or bf16. */
typedef void (*kern_wire_fn)(float *acc, const void *wire, size_t n);
/* buf[i] = buf[i] * s: AVG's last step on floats (kern_avg_finish). */
typedef void (*kern_scale_f32_fn)(float *buf, float s, size_t n);
typedef void (*kern_scale_f64_fn)(double *buf, double s, size_t n);

/* One implementation: a full table, no NULL entries. */
typedef struct {
    kern_isa_t isa;
    const char *name;
    kern_reduce_fn reduce[KERN_DTYPE_COUNT][KERN_OP_COUNT];
    kern_reduce3_fn reduce3[KERN_DTYPE_COUNT][KERN_OP_COUNT];
    kern_cast_fn f32_to_f16, f16_to_f32, f32_to_bf16, bf16_to_f32;
    /* [0] for f16 wire, [1] for bf16 wire; indexed by op. */
    kern_wire_fn wire_reduce[2][KERN_OP_COUNT];
    kern_scale_f32_fn scale_f32;
    kern_scale_f64_fn scale_f64;
} kern_table_t;

/* Size in bytes of one element; 0 for an invalid dtype. */
size_t kern_dtype_size(kern_dtype_t dt);
const char *kern_dtype_name(kern_dtype_t dt);
const char *kern_op_name(kern_op_t op);
const char *kern_isa_name(kern_isa_t isa);
/* Parse "f32", "bf16", ... / "sum", "avg", ...; 0 or ST_EINVAL. */
int kern_dtype_parse(const char *s, kern_dtype_t *dt_p);
int kern_op_parse(const char *s, kern_op_t *op_p);

/*
 * The table of one ISA, or NULL when this CPU (or this build) lacks it.
 * kern_table_best() is never NULL. RINGD_KERN_ISA=scalar|avx2|avx512 caps
 * the choice (for debugging and benchmarks).
 */
const kern_table_t *kern_table(kern_isa_t isa);
const kern_table_t *kern_table_best(void);

/*
 * Convenience entry points on the best table. They return 0, or ST_EINVAL
 * for a bad dtype/op (nothing is touched then).
 */
int kern_reduce(kern_dtype_t dt, kern_op_t op, void *dst, const void *src,
                size_t n);
int kern_reduce3(kern_dtype_t dt, kern_op_t op, void *dst, const void *a,
                 const void *b, size_t n);
/* Final step of KERN_AVG: buf[i] = buf[i] / nranks (nranks >= 1). */
int kern_avg_finish(kern_dtype_t dt, void *buf, size_t n, uint32_t nranks);

/* memcpy of bytes with non-temporal stores (x86-64; memcpy elsewhere):
 * for a large destination nothing reads again soon. The bytes are
 * visible to other threads once it returns. */
void kern_copy_stream(void *dst, const void *src, size_t bytes);

/* f32 <-> f16/bf16, round to nearest even, NaN stays NaN. */
void kern_f32_to_f16(uint16_t *dst, const float *src, size_t n);
void kern_f16_to_f32(float *dst, const uint16_t *src, size_t n);
void kern_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void kern_bf16_to_f32(float *dst, const uint16_t *src, size_t n);

/*
 * The fused wire-compression step: acc[i] = acc[i] op float(wire[i]), with
 * wire_dt KERN_F16 or KERN_BF16 and acc in f32. KERN_AVG sums.
 */
int kern_reduce_wire(kern_dtype_t wire_dt, kern_op_t op, float *acc,
                     const void *wire, size_t n);

/* Scalar single-element conversions (exact reference, used by all ISAs). */
uint16_t kern_f32_to_f16_one(float f);
float kern_f16_to_f32_one(uint16_t h);
uint16_t kern_f32_to_bf16_one(float f);
float kern_bf16_to_f32_one(uint16_t h);

/*
 * GPU kernels live in libringd_cuda.so, loaded at run time (never linked).
 * kern_gpu_open() returns ST_ENOTSUP, after logging one line saying why,
 * when the library, the driver or a device is missing; the caller then uses
 * the CPU functions above. See kern_gpu.h for the device API.
 */

#endif /* RINGD_KERN_H */
