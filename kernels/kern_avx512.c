/*
 * kern_avx512.c - vector primitives for AVX-512 F/BW/VL/DQ (16 f32 lanes).
 * Only called after a CPUID check (kern.c).
 */
#include <immintrin.h>

#include "kernels/kern-int.h"

#define VF_LANES 16
#define VD_LANES 8
#define VI32_LANES 16
#define VI64_LANES 8
#define VU8_LANES 64

#define VF_LOAD(p) _mm512_loadu_ps(p)
#define VF_STORE(p, v) _mm512_storeu_ps(p, v)
#define VD_LOAD(p) _mm512_loadu_pd(p)
#define VD_STORE(p, v) _mm512_storeu_pd(p, v)
#define VI_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define VI_STORE(p, v) _mm512_storeu_si512((void *)(p), v)

#define VF_ADD _mm512_add_ps
#define VF_MUL _mm512_mul_ps
#define VF_SET1 _mm512_set1_ps
#define VD_SET1 _mm512_set1_pd
#define VD_ADD _mm512_add_pd
#define VD_MUL _mm512_mul_pd
#define VI32_ADD _mm512_add_epi32
#define VI32_MUL _mm512_mullo_epi32
#define VI32_MIN _mm512_min_epi32
#define VI32_MAX _mm512_max_epi32
#define VI64_ADD _mm512_add_epi64
#define VI64_MUL _mm512_mullo_epi64
#define VI64_MIN _mm512_min_epi64
#define VI64_MAX _mm512_max_epi64
#define VU8_ADD _mm512_add_epi8
#define VU8_MIN _mm512_min_epu8
#define VU8_MAX _mm512_max_epu8

/* IEEE 754-2019 minimum/maximum; see kern_avx2.c for the reasoning. */
static inline __m512 vf_min(__m512 a, __m512 b)
{
    __m512 r = _mm512_min_ps(a, b);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), r,
                             _mm512_or_ps(a, b));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), r,
                                _mm512_add_ps(a, b));
}

static inline __m512 vf_max(__m512 a, __m512 b)
{
    __m512 r = _mm512_max_ps(a, b);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), r,
                             _mm512_and_ps(a, b));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), r,
                                _mm512_add_ps(a, b));
}

static inline __m512d vd_min(__m512d a, __m512d b)
{
    __m512d r = _mm512_min_pd(a, b);
    r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ), r,
                             _mm512_or_pd(a, b));
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, b, _CMP_UNORD_Q), r,
                                _mm512_add_pd(a, b));
}

static inline __m512d vd_max(__m512d a, __m512d b)
{
    __m512d r = _mm512_max_pd(a, b);
    r = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ), r,
                             _mm512_and_pd(a, b));
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, b, _CMP_UNORD_Q), r,
                                _mm512_add_pd(a, b));
}

#define VF_MIN vf_min
#define VF_MAX vf_max
#define VD_MIN vd_min
#define VD_MAX vd_max

static inline __m512 vf_load_f16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}

static inline void vf_store_f16(uint16_t *p, __m512 v)
{
    _mm256_storeu_si256((__m256i *)(void *)p,
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT |
                                               _MM_FROUND_NO_EXC));
}

static inline __m512 vf_load_bf16(const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256((const __m256i *)(const void *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/*
 * Round to nearest even on the bits and quiet NaNs, as kern__f32_to_bf16.
 * VCVTNEPS2BF16 is not used: it flushes subnormals to zero.
 */
static inline void vf_store_bf16(uint16_t *p, __m512 v)
{
    __m512i x = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16),
                                   _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(x, _mm512_add_epi32(
                                        lsb, _mm512_set1_epi32(0x7fff)));
    r = _mm512_srli_epi32(r, 16);
    __m512i nan = _mm512_or_si512(_mm512_srli_epi32(x, 16),
                                  _mm512_set1_epi32(0x40));
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r,
                                nan);
    _mm256_storeu_si256((__m256i *)(void *)p, _mm512_cvtepi32_epi16(r));
}

#define VF_LOAD_F16 vf_load_f16
#define VF_STORE_F16 vf_store_f16
#define VF_LOAD_BF16 vf_load_bf16
#define VF_STORE_BF16 vf_store_bf16

#define KERN_SIMD_FILL kern__fill_avx512_ops
void kern__fill_avx512_ops(kern_table_t *t);
#include "kernels/kern-simd.h"

void kern__fill_avx512(kern_table_t *t)
{
    t->isa = KERN_ISA_AVX512;
    t->name = "avx512";
    kern__fill_avx512_ops(t);
}
