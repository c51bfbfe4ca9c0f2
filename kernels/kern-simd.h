/*
 * kern-simd.h - the SIMD kernels, written once over a small set of vector
 * primitives. kern_avx2.c and kern_avx512.c define the primitives (VF_*,
 * VD_*, VI*_*) for their width and include this file, which defines every
 * kernel and a fill function named KERN_SIMD_FILL.
 *
 * Tails (n not a multiple of the vector width) run the scalar element
 * operations of kern-int.h, so results are bitwise those of the scalar
 * table. Loads and stores are unaligned: any alignment works, and on
 * current cores unaligned access to aligned data costs nothing.
 */
#ifndef KERN_SIMD_FILL
#error "define the vector primitives and KERN_SIMD_FILL first"
#endif

#include "kernels/kern-int.h"

/* Scalar element operations for the tails. */
static inline float s_addf(float a, float b) { return a + b; }
static inline float s_mulf(float a, float b) { return a * b; }
static inline double s_addd(double a, double b) { return a + b; }
static inline double s_muld(double a, double b) { return a * b; }
static inline int32_t s_add32(int32_t a, int32_t b)
{
    return (int32_t)((uint32_t)a + (uint32_t)b);
}
static inline int32_t s_mul32(int32_t a, int32_t b)
{
    return (int32_t)((uint32_t)a * (uint32_t)b);
}
static inline int32_t s_min32(int32_t a, int32_t b) { return b < a ? b : a; }
static inline int32_t s_max32(int32_t a, int32_t b) { return b > a ? b : a; }
static inline int64_t s_add64(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}
static inline int64_t s_mul64(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a * (uint64_t)b);
}
static inline int64_t s_min64(int64_t a, int64_t b) { return b < a ? b : a; }
static inline int64_t s_max64(int64_t a, int64_t b) { return b > a ? b : a; }
static inline uint8_t s_add8(uint8_t a, uint8_t b)
{
    return (uint8_t)(a + b);
}
static inline uint8_t s_min8(uint8_t a, uint8_t b) { return b < a ? b : a; }
static inline uint8_t s_max8(uint8_t a, uint8_t b) { return b > a ? b : a; }

#define S_HALF(name, TO, FROM, OP)                                           \
    static inline uint16_t name(uint16_t a, uint16_t b)                      \
    {                                                                        \
        return FROM(OP(TO(a), TO(b)));                                       \
    }
S_HALF(s_h_add, kern__f16_to_f32, kern__f32_to_f16, s_addf)
S_HALF(s_h_mul, kern__f16_to_f32, kern__f32_to_f16, s_mulf)
S_HALF(s_h_min, kern__f16_to_f32, kern__f32_to_f16, kern__minf)
S_HALF(s_h_max, kern__f16_to_f32, kern__f32_to_f16, kern__maxf)
S_HALF(s_b_add, kern__bf16_to_f32, kern__f32_to_bf16, s_addf)
S_HALF(s_b_mul, kern__bf16_to_f32, kern__f32_to_bf16, s_mulf)
S_HALF(s_b_min, kern__bf16_to_f32, kern__f32_to_bf16, kern__minf)
S_HALF(s_b_max, kern__bf16_to_f32, kern__f32_to_bf16, kern__maxf)

/* dst = a op b over vectors of LANES, then the scalar tail. */
#define DEF_VEC(name, T, S, LANES, LOAD, STORE, VOP, SOP)                    \
    static void name##3(void *dst, const void *a, const void *b, size_t n)   \
    {                                                                        \
        T *d = dst;                                                          \
        const T *x = a, *y = b;                                              \
        size_t i = 0;                                                        \
        for (; i + 2 * (LANES) <= n; i += 2 * (LANES)) {                     \
            STORE(d + i, VOP(LOAD(x + i), LOAD(y + i)));                     \
            STORE(d + i + (LANES),                                           \
                  VOP(LOAD(x + i + (LANES)), LOAD(y + i + (LANES))));        \
        }                                                                    \
        for (; i + (LANES) <= n; i += (LANES))                               \
            STORE(d + i, VOP(LOAD(x + i), LOAD(y + i)));                     \
        for (; i < n; i++)                                                   \
            kern__st_##S(d, i, SOP(kern__ld_##S(x, i), kern__ld_##S(y, i))); \
    }                                                                        \
    static void name(void *dst, const void *src, size_t n)                   \
    {                                                                        \
        name##3(dst, dst, src, n);                                           \
    }

DEF_VEC(f32_sum, float, f32, VF_LANES, VF_LOAD, VF_STORE, VF_ADD, s_addf)
DEF_VEC(f32_prod, float, f32, VF_LANES, VF_LOAD, VF_STORE, VF_MUL, s_mulf)
DEF_VEC(f32_min, float, f32, VF_LANES, VF_LOAD, VF_STORE, VF_MIN, kern__minf)
DEF_VEC(f32_max, float, f32, VF_LANES, VF_LOAD, VF_STORE, VF_MAX, kern__maxf)
DEF_VEC(f64_sum, double, f64, VD_LANES, VD_LOAD, VD_STORE, VD_ADD, s_addd)
DEF_VEC(f64_prod, double, f64, VD_LANES, VD_LOAD, VD_STORE, VD_MUL, s_muld)
DEF_VEC(f64_min, double, f64, VD_LANES, VD_LOAD, VD_STORE, VD_MIN, kern__mind)
DEF_VEC(f64_max, double, f64, VD_LANES, VD_LOAD, VD_STORE, VD_MAX, kern__maxd)
DEF_VEC(f16_sum, uint16_t, u16, VF_LANES, VF_LOAD_F16, VF_STORE_F16, VF_ADD,
        s_h_add)
DEF_VEC(f16_prod, uint16_t, u16, VF_LANES, VF_LOAD_F16, VF_STORE_F16, VF_MUL,
        s_h_mul)
DEF_VEC(f16_min, uint16_t, u16, VF_LANES, VF_LOAD_F16, VF_STORE_F16, VF_MIN,
        s_h_min)
DEF_VEC(f16_max, uint16_t, u16, VF_LANES, VF_LOAD_F16, VF_STORE_F16, VF_MAX,
        s_h_max)
DEF_VEC(bf16_sum, uint16_t, u16, VF_LANES, VF_LOAD_BF16, VF_STORE_BF16, VF_ADD,
        s_b_add)
DEF_VEC(bf16_prod, uint16_t, u16, VF_LANES, VF_LOAD_BF16, VF_STORE_BF16, VF_MUL,
        s_b_mul)
DEF_VEC(bf16_min, uint16_t, u16, VF_LANES, VF_LOAD_BF16, VF_STORE_BF16, VF_MIN,
        s_b_min)
DEF_VEC(bf16_max, uint16_t, u16, VF_LANES, VF_LOAD_BF16, VF_STORE_BF16, VF_MAX,
        s_b_max)
DEF_VEC(i32_sum, int32_t, i32, VI32_LANES, VI_LOAD, VI_STORE, VI32_ADD, s_add32)
DEF_VEC(i32_prod, int32_t, i32, VI32_LANES, VI_LOAD, VI_STORE, VI32_MUL, s_mul32)
DEF_VEC(i32_min, int32_t, i32, VI32_LANES, VI_LOAD, VI_STORE, VI32_MIN, s_min32)
DEF_VEC(i32_max, int32_t, i32, VI32_LANES, VI_LOAD, VI_STORE, VI32_MAX, s_max32)
DEF_VEC(i64_sum, int64_t, i64, VI64_LANES, VI_LOAD, VI_STORE, VI64_ADD, s_add64)
DEF_VEC(i64_min, int64_t, i64, VI64_LANES, VI_LOAD, VI_STORE, VI64_MIN, s_min64)
DEF_VEC(i64_max, int64_t, i64, VI64_LANES, VI_LOAD, VI_STORE, VI64_MAX, s_max64)
#ifdef VI64_MUL
DEF_VEC(i64_prod, int64_t, i64, VI64_LANES, VI_LOAD, VI_STORE, VI64_MUL, s_mul64)
#endif
DEF_VEC(u8_sum, uint8_t, u8, VU8_LANES, VI_LOAD, VI_STORE, VU8_ADD, s_add8)
DEF_VEC(u8_min, uint8_t, u8, VU8_LANES, VI_LOAD, VI_STORE, VU8_MIN, s_min8)
DEF_VEC(u8_max, uint8_t, u8, VU8_LANES, VI_LOAD, VI_STORE, VU8_MAX, s_max8)

/* One-input loops: casts and the fused wire reduction. */
#define DEF_CAST(name, TD, SD, TS, SS, LOAD, STORE, SCONV)                   \
    static void name(void *dst, const void *src, size_t n)                   \
    {                                                                        \
        TD *d = dst;                                                         \
        const TS *s = src;                                                   \
        size_t i = 0;                                                        \
        for (; i + 2 * VF_LANES <= n; i += 2 * VF_LANES) {                   \
            STORE(d + i, LOAD(s + i));                                       \
            STORE(d + i + VF_LANES, LOAD(s + i + VF_LANES));                 \
        }                                                                    \
        for (; i + VF_LANES <= n; i += VF_LANES)                             \
            STORE(d + i, LOAD(s + i));                                       \
        for (; i < n; i++)                                                   \
            kern__st_##SD(d, i, SCONV(kern__ld_##SS(s, i)));                 \
    }

DEF_CAST(f32_to_f16, uint16_t, u16, float, f32, VF_LOAD, VF_STORE_F16,
         kern__f32_to_f16)
DEF_CAST(f16_to_f32, float, f32, uint16_t, u16, VF_LOAD_F16, VF_STORE,
         kern__f16_to_f32)
DEF_CAST(f32_to_bf16, uint16_t, u16, float, f32, VF_LOAD, VF_STORE_BF16,
         kern__f32_to_bf16)
DEF_CAST(bf16_to_f32, float, f32, uint16_t, u16, VF_LOAD_BF16, VF_STORE,
         kern__bf16_to_f32)

#define DEF_WIRE(name, LOADW, TO, VOP, SOP)                                  \
    static void name(float *acc, const void *wire, size_t n)                 \
    {                                                                        \
        const uint16_t *w = wire;                                            \
        size_t i = 0;                                                        \
        for (; i + VF_LANES <= n; i += VF_LANES)                             \
            VF_STORE(acc + i, VOP(VF_LOAD(acc + i), LOADW(w + i)));          \
        for (; i < n; i++)                                                   \
            kern__st_f32(acc, i, SOP(kern__ld_f32(acc, i),                   \
                                     TO(kern__ld_u16(w, i))));               \
    }

DEF_WIRE(wire_f16_sum, VF_LOAD_F16, kern__f16_to_f32, VF_ADD, s_addf)
DEF_WIRE(wire_f16_prod, VF_LOAD_F16, kern__f16_to_f32, VF_MUL, s_mulf)
DEF_WIRE(wire_f16_min, VF_LOAD_F16, kern__f16_to_f32, VF_MIN, kern__minf)
DEF_WIRE(wire_f16_max, VF_LOAD_F16, kern__f16_to_f32, VF_MAX, kern__maxf)
DEF_WIRE(wire_bf16_sum, VF_LOAD_BF16, kern__bf16_to_f32, VF_ADD, s_addf)
DEF_WIRE(wire_bf16_prod, VF_LOAD_BF16, kern__bf16_to_f32, VF_MUL, s_mulf)
DEF_WIRE(wire_bf16_min, VF_LOAD_BF16, kern__bf16_to_f32, VF_MIN, kern__minf)
DEF_WIRE(wire_bf16_max, VF_LOAD_BF16, kern__bf16_to_f32, VF_MAX, kern__maxf)

/* buf[i] *= s, the same multiply per element as the scalar table. */
#define DEF_SCALE(name, T, S, LANES, LOAD, STORE, MUL, SET1)                 \
    static void name(T *buf, T s, size_t n)                                  \
    {                                                                        \
        size_t i = 0;                                                        \
        for (; i + 2 * (LANES) <= n; i += 2 * (LANES)) {                     \
            STORE(buf + i, MUL(LOAD(buf + i), SET1(s)));                     \
            STORE(buf + i + (LANES), MUL(LOAD(buf + i + (LANES)), SET1(s))); \
        }                                                                    \
        for (; i + (LANES) <= n; i += (LANES))                               \
            STORE(buf + i, MUL(LOAD(buf + i), SET1(s)));                     \
        for (; i < n; i++)                                                   \
            kern__st_##S(buf, i, kern__ld_##S(buf, i) * s);                  \
    }
DEF_SCALE(scale_f32, float, f32, VF_LANES, VF_LOAD, VF_STORE, VF_MUL, VF_SET1)
DEF_SCALE(scale_f64, double, f64, VD_LANES, VD_LOAD, VD_STORE, VD_MUL, VD_SET1)

#define SET_OP(t, DT, OP, fn)                                                \
    do {                                                                     \
        (t)->reduce[DT][OP] = fn;                                            \
        (t)->reduce3[DT][OP] = fn##3;                                        \
    } while (0)

#define SET_ROW(t, DT, pfx)                                                  \
    do {                                                                     \
        SET_OP(t, DT, KERN_SUM, pfx##_sum);                                  \
        SET_OP(t, DT, KERN_AVG, pfx##_sum);                                  \
        SET_OP(t, DT, KERN_MIN, pfx##_min);                                  \
        SET_OP(t, DT, KERN_MAX, pfx##_max);                                  \
    } while (0)

void KERN_SIMD_FILL(kern_table_t *t)
{
    SET_ROW(t, KERN_F32, f32);
    SET_OP(t, KERN_F32, KERN_PROD, f32_prod);
    SET_ROW(t, KERN_F64, f64);
    SET_OP(t, KERN_F64, KERN_PROD, f64_prod);
    SET_ROW(t, KERN_F16, f16);
    SET_OP(t, KERN_F16, KERN_PROD, f16_prod);
    SET_ROW(t, KERN_BF16, bf16);
    SET_OP(t, KERN_BF16, KERN_PROD, bf16_prod);
    SET_ROW(t, KERN_I32, i32);
    SET_OP(t, KERN_I32, KERN_PROD, i32_prod);
    SET_ROW(t, KERN_I64, i64);
#ifdef VI64_MUL
    SET_OP(t, KERN_I64, KERN_PROD, i64_prod);
#endif
    /* u8 prod has no byte multiply: the scalar entry stays. */
    SET_ROW(t, KERN_U8, u8);

    t->scale_f32 = scale_f32;
    t->scale_f64 = scale_f64;
    t->f32_to_f16 = f32_to_f16;
    t->f16_to_f32 = f16_to_f32;
    t->f32_to_bf16 = f32_to_bf16;
    t->bf16_to_f32 = bf16_to_f32;
    t->wire_reduce[0][KERN_SUM] = wire_f16_sum;
    t->wire_reduce[0][KERN_AVG] = wire_f16_sum;
    t->wire_reduce[0][KERN_PROD] = wire_f16_prod;
    t->wire_reduce[0][KERN_MIN] = wire_f16_min;
    t->wire_reduce[0][KERN_MAX] = wire_f16_max;
    t->wire_reduce[1][KERN_SUM] = wire_bf16_sum;
    t->wire_reduce[1][KERN_AVG] = wire_bf16_sum;
    t->wire_reduce[1][KERN_PROD] = wire_bf16_prod;
    t->wire_reduce[1][KERN_MIN] = wire_bf16_min;
    t->wire_reduce[1][KERN_MAX] = wire_bf16_max;
}
