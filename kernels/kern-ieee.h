/*
 * kern-ieee.h - IEEE 754-2019 minimum and maximum, written once for the
 * CPU kernels (kern-int.h) and the CUDA ones (cuda/kern_cuda.cu), so the
 * two can never disagree on a NaN or a signed zero.
 *
 * NaN if either operand is NaN (a + b gives the quiet NaN the SIMD
 * versions produce too), else the smaller/larger, with -0 < +0: equal
 * operands differ at most in the sign bit, and OR-ing their bits keeps a
 * sign (min), AND-ing drops it (max).
 *
 * KERN_IEEE_MINMAX(Q, min, max, T, bits, from) defines Q T min(T, T) and
 * Q T max(T, T); bits(x) is x's bit pattern as an unsigned integer of T's
 * width, from(u) its inverse. Q is "static inline" in C, "__device__
 * inline" in CUDA. Needs isnan (math.h, or CUDA's device math).
 */
#ifndef RINGD_KERN_IEEE_H
#define RINGD_KERN_IEEE_H

#define KERN_IEEE_MINMAX(Q, min, max, T, bits, from)                        \
    Q T min(T a, T b)                                                       \
    {                                                                       \
        if (isnan(a) || isnan(b))                                           \
            return a + b;                                                   \
        if (a < b)                                                          \
            return a;                                                       \
        if (b < a)                                                          \
            return b;                                                       \
        return from(bits(a) | bits(b));                                     \
    }                                                                       \
    Q T max(T a, T b)                                                       \
    {                                                                       \
        if (isnan(a) || isnan(b))                                           \
            return a + b;                                                   \
        if (a > b)                                                          \
            return a;                                                       \
        if (b > a)                                                          \
            return b;                                                       \
        return from(bits(a) & bits(b));                                     \
    }

#endif /* RINGD_KERN_IEEE_H */
