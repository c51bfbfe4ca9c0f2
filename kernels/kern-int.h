/*
 * kern-int.h - internals shared by the kernel implementations.
 *
 * The element-wise scalar operations live here as static inline functions so
 * every ISA uses the very same code for its tail elements, and the SIMD
 * bodies can be checked against them bit for bit.
 */
#ifndef RINGD_KERN_INT_H
#define RINGD_KERN_INT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kern-ieee.h"
#include "kernels/kern.h"

/*
 * Element access through memcpy: buffers may have any alignment (a chunk of
 * a packed wire message, say), and a misaligned T* dereference is undefined
 * behaviour in C. GCC turns each of these into a single move.
 */
#define KERN__DEF_LDST(sfx, T)                                               \
    static inline T kern__ld_##sfx(const void *p, size_t i)                  \
    {                                                                        \
        T v;                                                                 \
        memcpy(&v, (const char *)p + i * sizeof(T), sizeof(T));              \
        return v;                                                            \
    }                                                                        \
    static inline void kern__st_##sfx(void *p, size_t i, T v)                \
    {                                                                        \
        memcpy((char *)p + i * sizeof(T), &v, sizeof(T));                    \
    }
KERN__DEF_LDST(f32, float)
KERN__DEF_LDST(f64, double)
KERN__DEF_LDST(u16, uint16_t)
KERN__DEF_LDST(i32, int32_t)
KERN__DEF_LDST(i64, int64_t)
KERN__DEF_LDST(u8, uint8_t)

static inline uint32_t kern__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float kern__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint64_t kern__f64_bits(double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    return u;
}

static inline double kern__bits_f64(uint64_t u)
{
    double f;
    memcpy(&f, &u, 8);
    return f;
}

/* IEEE 754-2019 minimum/maximum (kern-ieee.h, shared with CUDA). */
KERN_IEEE_MINMAX(static inline, kern__minf, kern__maxf, float, kern__f32_bits,
                 kern__bits_f32)
KERN_IEEE_MINMAX(static inline, kern__mind, kern__maxd, double,
                 kern__f64_bits, kern__bits_f64)

/*
 * f32 -> f16, round to nearest even, matching x86 F16C (VCVTPS2PH with
 * imm 0) bit for bit, NaN payloads included: a NaN keeps its sign and top
 * payload bits and is made quiet.
 */
static inline uint16_t kern__f32_to_f16(float f)
{
    uint32_t x = kern__f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t absx = x & 0x7fffffffu;

    if (absx >= 0x7f800000u) {
        if (absx > 0x7f800000u)
            return (uint16_t)(sign | 0x7e00u | ((absx >> 13) & 0x3ffu));
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) {
        /* Result is subnormal or zero: shift the full significand. */
        if (absx < 0x33000000u) /* below half the smallest subnormal */
            return sign;
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (112 - e), from 14 to 24 */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    /* Normal: rebias exponent, round the 13 dropped bits to nearest even. */
    uint32_t r = absx - 0x38000000u; /* exponent bias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

static inline float kern__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t x;
    if (e == 0x1f) {
        /* Inf, or a NaN made quiet as VCVTPH2PS does. */
        x = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0);
    } else if (e != 0) {
        x = sign | ((e + 112) << 23) | (m << 13);
    } else if (m == 0) {
        x = sign;
    } else {
        /* Subnormal: normalise. */
        e = 113;
        while ((m & 0x400u) == 0) {
            m <<= 1;
            e--;
        }
        x = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    return kern__bits_f32(x);
}

/*
 * f32 -> bf16, round to nearest even on the bits. This handles subnormals
 * and overflow to Inf correctly (unlike VCVTNEPS2BF16, which flushes
 * subnormals, so it is not used); a NaN is made quiet.
 */
static inline uint16_t kern__f32_to_bf16(float f)
{
    uint32_t x = kern__f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float kern__bf16_to_f32(uint16_t h)
{
    return kern__bits_f32((uint32_t)h << 16);
}

/* Tables of each ISA, filled over a copy of the scalar table. */
void kern__fill_scalar(kern_table_t *t);
void kern__fill_avx2(kern_table_t *t);
void kern__fill_avx512(kern_table_t *t);

#endif /* RINGD_KERN_INT_H */
