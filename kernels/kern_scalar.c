/*
 * kern_scalar.c - the portable implementation and the reference the SIMD
 * ones are tested against. Every (dtype, op) pair is generated from one
 * macro so the semantics cannot drift between pairs.
 */
#include "kernels/kern-int.h"

/* Element operations per C type. Integer ops run on unsigned to wrap. */
#define SUM_(a, b) ((a) + (b))
#define PROD_(a, b) ((a) * (b))
#define MIN_(a, b) ((b) < (a) ? (b) : (a))
#define MAX_(a, b) ((b) > (a) ? (b) : (a))

#define DEF_PLAIN(name, T, S, U, expr)                                       \
    static void name##3(void *dst, const void *a, const void *b, size_t n)   \
    {                                                                        \
        for (size_t i = 0; i < n; i++) {                                     \
            U p = (U)kern__ld_##S(a, i), q = (U)kern__ld_##S(b, i);          \
            kern__st_##S(dst, i, (T)(expr));                                 \
        }                                                                    \
    }                                                                        \
    static void name(void *dst, const void *src, size_t n)                   \
    {                                                                        \
        name##3(dst, dst, src, n);                                           \
    }

/* f16/bf16: widen to f32, operate, round once. */
#define DEF_HALF(name, TO32, FROM32, expr)                                   \
    static void name##3(void *dst, const void *a, const void *b, size_t n)   \
    {                                                                        \
        for (size_t i = 0; i < n; i++) {                                     \
            float p = TO32(kern__ld_u16(a, i)), q = TO32(kern__ld_u16(b, i)); \
            kern__st_u16(dst, i, FROM32(expr));                              \
        }                                                                    \
    }                                                                        \
    static void name(void *dst, const void *src, size_t n)                   \
    {                                                                        \
        name##3(dst, dst, src, n);                                           \
    }

DEF_PLAIN(f32_sum, float, f32, float, p + q)
DEF_PLAIN(f32_prod, float, f32, float, p * q)
DEF_PLAIN(f32_min, float, f32, float, kern__minf(p, q))
DEF_PLAIN(f32_max, float, f32, float, kern__maxf(p, q))
DEF_PLAIN(f64_sum, double, f64, double, p + q)
DEF_PLAIN(f64_prod, double, f64, double, p * q)
DEF_PLAIN(f64_min, double, f64, double, kern__mind(p, q))
DEF_PLAIN(f64_max, double, f64, double, kern__maxd(p, q))

DEF_HALF(f16_sum, kern__f16_to_f32, kern__f32_to_f16, p + q)
DEF_HALF(f16_prod, kern__f16_to_f32, kern__f32_to_f16, p * q)
DEF_HALF(f16_min, kern__f16_to_f32, kern__f32_to_f16, kern__minf(p, q))
DEF_HALF(f16_max, kern__f16_to_f32, kern__f32_to_f16, kern__maxf(p, q))
DEF_HALF(bf16_sum, kern__bf16_to_f32, kern__f32_to_bf16, p + q)
DEF_HALF(bf16_prod, kern__bf16_to_f32, kern__f32_to_bf16, p * q)
DEF_HALF(bf16_min, kern__bf16_to_f32, kern__f32_to_bf16, kern__minf(p, q))
DEF_HALF(bf16_max, kern__bf16_to_f32, kern__f32_to_bf16, kern__maxf(p, q))

DEF_PLAIN(i32_sum, int32_t, i32, uint32_t, p + q)
DEF_PLAIN(i32_prod, int32_t, i32, uint32_t, p * q)
DEF_PLAIN(i32_min, int32_t, i32, int32_t, MIN_(p, q))
DEF_PLAIN(i32_max, int32_t, i32, int32_t, MAX_(p, q))
DEF_PLAIN(i64_sum, int64_t, i64, uint64_t, p + q)
DEF_PLAIN(i64_prod, int64_t, i64, uint64_t, p * q)
DEF_PLAIN(i64_min, int64_t, i64, int64_t, MIN_(p, q))
DEF_PLAIN(i64_max, int64_t, i64, int64_t, MAX_(p, q))
/* u8 promotes to int: multiply in unsigned to keep the wrap defined. */
DEF_PLAIN(u8_sum, uint8_t, u8, unsigned, p + q)
DEF_PLAIN(u8_prod, uint8_t, u8, unsigned, p * q)
DEF_PLAIN(u8_min, uint8_t, u8, unsigned, MIN_(p, q))
DEF_PLAIN(u8_max, uint8_t, u8, unsigned, MAX_(p, q))

#define DEF_CAST(name, SD, SS, CONV)                                         \
    static void name(void *dst, const void *src, size_t n)                   \
    {                                                                        \
        for (size_t i = 0; i < n; i++)                                       \
            kern__st_##SD(dst, i, CONV(kern__ld_##SS(src, i)));              \
    }

DEF_CAST(f32_to_f16, u16, f32, kern__f32_to_f16)
DEF_CAST(f16_to_f32, f32, u16, kern__f16_to_f32)
DEF_CAST(f32_to_bf16, u16, f32, kern__f32_to_bf16)
DEF_CAST(bf16_to_f32, f32, u16, kern__bf16_to_f32)

#define DEF_WIRE(name, TO32, expr)                                           \
    static void name(float *acc, const void *wire, size_t n)                 \
    {                                                                        \
        for (size_t i = 0; i < n; i++) {                                     \
            float p = kern__ld_f32(acc, i), q = TO32(kern__ld_u16(wire, i)); \
            kern__st_f32(acc, i, (expr));                                    \
        }                                                                    \
    }

DEF_WIRE(wire_f16_sum, kern__f16_to_f32, p + q)
DEF_WIRE(wire_f16_prod, kern__f16_to_f32, p * q)
DEF_WIRE(wire_f16_min, kern__f16_to_f32, kern__minf(p, q))
DEF_WIRE(wire_f16_max, kern__f16_to_f32, kern__maxf(p, q))
DEF_WIRE(wire_bf16_sum, kern__bf16_to_f32, p + q)
DEF_WIRE(wire_bf16_prod, kern__bf16_to_f32, p * q)
DEF_WIRE(wire_bf16_min, kern__bf16_to_f32, kern__minf(p, q))
DEF_WIRE(wire_bf16_max, kern__bf16_to_f32, kern__maxf(p, q))

static void scale_f32(float *buf, float s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kern__st_f32(buf, i, kern__ld_f32(buf, i) * s);
}

static void scale_f64(double *buf, double s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kern__st_f64(buf, i, kern__ld_f64(buf, i) * s);
}

#define SET_ROW(t, DT, pfx)                                                  \
    do {                                                                     \
        (t)->reduce[DT][KERN_SUM] = pfx##_sum;                               \
        (t)->reduce[DT][KERN_PROD] = pfx##_prod;                             \
        (t)->reduce[DT][KERN_MIN] = pfx##_min;                               \
        (t)->reduce[DT][KERN_MAX] = pfx##_max;                               \
        (t)->reduce[DT][KERN_AVG] = pfx##_sum;                               \
        (t)->reduce3[DT][KERN_SUM] = pfx##_sum3;                             \
        (t)->reduce3[DT][KERN_PROD] = pfx##_prod3;                           \
        (t)->reduce3[DT][KERN_MIN] = pfx##_min3;                             \
        (t)->reduce3[DT][KERN_MAX] = pfx##_max3;                             \
        (t)->reduce3[DT][KERN_AVG] = pfx##_sum3;                             \
    } while (0)

void kern__fill_scalar(kern_table_t *t)
{
    t->isa = KERN_ISA_SCALAR;
    t->name = "scalar";
    SET_ROW(t, KERN_F32, f32);
    SET_ROW(t, KERN_F64, f64);
    SET_ROW(t, KERN_F16, f16);
    SET_ROW(t, KERN_BF16, bf16);
    SET_ROW(t, KERN_I32, i32);
    SET_ROW(t, KERN_I64, i64);
    SET_ROW(t, KERN_U8, u8);
    t->f32_to_f16 = f32_to_f16;
    t->f16_to_f32 = f16_to_f32;
    t->f32_to_bf16 = f32_to_bf16;
    t->bf16_to_f32 = bf16_to_f32;
    t->wire_reduce[0][KERN_SUM] = wire_f16_sum;
    t->wire_reduce[0][KERN_PROD] = wire_f16_prod;
    t->wire_reduce[0][KERN_MIN] = wire_f16_min;
    t->wire_reduce[0][KERN_MAX] = wire_f16_max;
    t->wire_reduce[0][KERN_AVG] = wire_f16_sum;
    t->wire_reduce[1][KERN_SUM] = wire_bf16_sum;
    t->wire_reduce[1][KERN_PROD] = wire_bf16_prod;
    t->wire_reduce[1][KERN_MIN] = wire_bf16_min;
    t->wire_reduce[1][KERN_MAX] = wire_bf16_max;
    t->wire_reduce[1][KERN_AVG] = wire_bf16_sum;
    t->scale_f32 = scale_f32;
    t->scale_f64 = scale_f64;
}
