/*
 * kern_avx2.c - vector primitives for AVX2 + F16C (8 f32 lanes). Built
 * with -mavx2 -mfma -mf16c; only called after a CPUID check (kern.c).
 */
#include <immintrin.h>

#include "kernels/kern-int.h"

#define VF_LANES 8
#define VD_LANES 4
#define VI32_LANES 8
#define VI64_LANES 4
#define VU8_LANES 32

#define VF_LOAD(p) _mm256_loadu_ps(p)
#define VF_STORE(p, v) _mm256_storeu_ps(p, v)
#define VD_LOAD(p) _mm256_loadu_pd(p)
#define VD_STORE(p, v) _mm256_storeu_pd(p, v)
#define VI_LOAD(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define VI_STORE(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), v)

#define VF_ADD _mm256_add_ps
#define VF_MUL _mm256_mul_ps
#define VF_SET1 _mm256_set1_ps
#define VD_SET1 _mm256_set1_pd
#define VD_ADD _mm256_add_pd
#define VD_MUL _mm256_mul_pd
#define VI32_ADD _mm256_add_epi32
#define VI32_MUL _mm256_mullo_epi32
#define VI32_MIN _mm256_min_epi32
#define VI32_MAX _mm256_max_epi32
#define VI64_ADD _mm256_add_epi64
#define VU8_ADD _mm256_add_epi8
#define VU8_MIN _mm256_min_epu8
#define VU8_MAX _mm256_max_epu8

/*
 * IEEE 754-2019 minimum/maximum, as kern__minf: MINPS gives a<b?a:b; fix
 * equal operands (OR the bits for min so -0 wins, AND for max) and NaNs
 * (a+b gives the same quiet NaN the scalar code gives).
 */
static inline __m256 vf_min(__m256 a, __m256 b)
{
    __m256 r = _mm256_min_ps(a, b);
    r = _mm256_blendv_ps(r, _mm256_or_ps(a, b),
                         _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
    return _mm256_blendv_ps(r, _mm256_add_ps(a, b),
                            _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}

static inline __m256 vf_max(__m256 a, __m256 b)
{
    __m256 r = _mm256_max_ps(a, b);
    r = _mm256_blendv_ps(r, _mm256_and_ps(a, b),
                         _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
    return _mm256_blendv_ps(r, _mm256_add_ps(a, b),
                            _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}

static inline __m256d vd_min(__m256d a, __m256d b)
{
    __m256d r = _mm256_min_pd(a, b);
    r = _mm256_blendv_pd(r, _mm256_or_pd(a, b),
                         _mm256_cmp_pd(a, b, _CMP_EQ_OQ));
    return _mm256_blendv_pd(r, _mm256_add_pd(a, b),
                            _mm256_cmp_pd(a, b, _CMP_UNORD_Q));
}

static inline __m256d vd_max(__m256d a, __m256d b)
{
    __m256d r = _mm256_max_pd(a, b);
    r = _mm256_blendv_pd(r, _mm256_and_pd(a, b),
                         _mm256_cmp_pd(a, b, _CMP_EQ_OQ));
    return _mm256_blendv_pd(r, _mm256_add_pd(a, b),
                            _mm256_cmp_pd(a, b, _CMP_UNORD_Q));
}

static inline __m256i vi64_min(__m256i a, __m256i b)
{
    return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b));
}

static inline __m256i vi64_max(__m256i a, __m256i b)
{
    return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a));
}

#define VF_MIN vf_min
#define VF_MAX vf_max
#define VD_MIN vd_min
#define VD_MAX vd_max
#define VI64_MIN vi64_min
#define VI64_MAX vi64_max

static inline __m256 vf_load_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

static inline void vf_store_f16(uint16_t *p, __m256 v)
{
    _mm_storeu_si128((__m128i *)(void *)p,
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT |
                                            _MM_FROUND_NO_EXC));
}

static inline __m256 vf_load_bf16(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(
        _mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Round to nearest even on the bits, quiet NaNs: kern__f32_to_bf16. */
static inline __m256i vf_round_bf16(__m256 v)
{
    __m256i x = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16),
                                   _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(
                                        lsb, _mm256_set1_epi32(0x7fff)));
    r = _mm256_srli_epi32(r, 16);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(x, 16),
                                  _mm256_set1_epi32(0x40));
    __m256 unord = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_blendv_epi8(r, nan, _mm256_castps_si256(unord));
}

static inline void vf_store_bf16(uint16_t *p, __m256 v)
{
    __m256i r = vf_round_bf16(v);
    /* packus works per 128-bit lane: gather the two low quads. */
    __m256i packed = _mm256_packus_epi32(r, r);
    packed = _mm256_permute4x64_epi64(packed, 0x08);
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_castsi256_si128(packed));
}

#define VF_LOAD_F16 vf_load_f16
#define VF_STORE_F16 vf_store_f16
#define VF_LOAD_BF16 vf_load_bf16
#define VF_STORE_BF16 vf_store_bf16

#define KERN_SIMD_FILL kern__fill_avx2_ops
void kern__fill_avx2_ops(kern_table_t *t);
#include "kernels/kern-simd.h"

void kern__fill_avx2(kern_table_t *t)
{
    t->isa = KERN_ISA_AVX2;
    t->name = "avx2";
    kern__fill_avx2_ops(t);
}
