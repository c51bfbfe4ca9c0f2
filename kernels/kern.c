/*
 * kern.c - names, run-time ISA selection and the convenience entry points.
 *
 * The tables are built once (pthread_once) and never change afterwards, so
 * any thread may read them without locks.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "kernels/kern-int.h"

static const char *const dtype_names[KERN_DTYPE_COUNT] = {
    "f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
static const size_t dtype_sizes[KERN_DTYPE_COUNT] = {4, 8, 2, 2, 4, 8, 1};
static const char *const op_names[KERN_OP_COUNT] = {"sum", "prod", "min",
                                                     "max", "avg"};
static const char *const isa_names[KERN_ISA_COUNT] = {"scalar", "avx2",
                                                      "avx512"};

size_t kern_dtype_size(kern_dtype_t dt)
{
    return (unsigned)dt < KERN_DTYPE_COUNT ? dtype_sizes[dt] : 0;
}

const char *kern_dtype_name(kern_dtype_t dt)
{
    return (unsigned)dt < KERN_DTYPE_COUNT ? dtype_names[dt] : "invalid";
}

const char *kern_op_name(kern_op_t op)
{
    return (unsigned)op < KERN_OP_COUNT ? op_names[op] : "invalid";
}

const char *kern_isa_name(kern_isa_t isa)
{
    return (unsigned)isa < KERN_ISA_COUNT ? isa_names[isa] : "invalid";
}

int kern_dtype_parse(const char *s, kern_dtype_t *dt_p)
{
    for (int i = 0; s != NULL && i < KERN_DTYPE_COUNT; i++) {
        if (strcmp(s, dtype_names[i]) == 0) {
            *dt_p = (kern_dtype_t)i;
            return 0;
        }
    }
    return ST_EINVAL;
}

int kern_op_parse(const char *s, kern_op_t *op_p)
{
    for (int i = 0; s != NULL && i < KERN_OP_COUNT; i++) {
        if (strcmp(s, op_names[i]) == 0) {
            *op_p = (kern_op_t)i;
            return 0;
        }
    }
    return ST_EINVAL;
}

static kern_table_t tables[KERN_ISA_COUNT];
static int table_ok[KERN_ISA_COUNT];
static const kern_table_t *best;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static int cpu_has(kern_isa_t isa)
{
    __builtin_cpu_init();
    switch (isa) {
    case KERN_ISA_SCALAR:
        return 1;
    case KERN_ISA_AVX2:
        return __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case KERN_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("f16c");
    default:
        return 0;
    }
}

static void tables_init(void)
{
    kern__fill_scalar(&tables[KERN_ISA_SCALAR]);
    table_ok[KERN_ISA_SCALAR] = 1;
    if (cpu_has(KERN_ISA_AVX2)) {
        tables[KERN_ISA_AVX2] = tables[KERN_ISA_SCALAR];
        kern__fill_avx2(&tables[KERN_ISA_AVX2]);
        table_ok[KERN_ISA_AVX2] = 1;
    }
    if (cpu_has(KERN_ISA_AVX512) && table_ok[KERN_ISA_AVX2]) {
        tables[KERN_ISA_AVX512] = tables[KERN_ISA_AVX2];
        kern__fill_avx512(&tables[KERN_ISA_AVX512]);
        table_ok[KERN_ISA_AVX512] = 1;
    }

    int cap = KERN_ISA_COUNT - 1;
    const char *env = getenv("RINGD_KERN_ISA");
    if (env != NULL && env[0] != '\0') {
        int found = -1;
        for (int i = 0; i < KERN_ISA_COUNT; i++)
            if (strcmp(env, isa_names[i]) == 0)
                found = i;
        if (found < 0)
            RD_WARN("RINGD_KERN_ISA=%s is not scalar|avx2|avx512; ignored",
                    env);
        else
            cap = found;
    }
    for (int i = cap; i >= 0; i--) {
        if (table_ok[i]) {
            best = &tables[i];
            break;
        }
    }
    RD_DEBUG("kernels: using %s", best->name);
}

const kern_table_t *kern_table(kern_isa_t isa)
{
    pthread_once(&tables_once, tables_init);
    if ((unsigned)isa >= KERN_ISA_COUNT || !table_ok[isa])
        return NULL;
    return &tables[isa];
}

const kern_table_t *kern_table_best(void)
{
    pthread_once(&tables_once, tables_init);
    return best;
}

static int valid(kern_dtype_t dt, kern_op_t op)
{
    return (unsigned)dt < KERN_DTYPE_COUNT && (unsigned)op < KERN_OP_COUNT;
}

int kern_reduce(kern_dtype_t dt, kern_op_t op, void *dst, const void *src,
                size_t n)
{
    if (!valid(dt, op))
        return ST_EINVAL;
    kern_table_best()->reduce[dt][op](dst, src, n);
    return 0;
}

int kern_reduce3(kern_dtype_t dt, kern_op_t op, void *dst, const void *a,
                 const void *b, size_t n)
{
    if (!valid(dt, op))
        return ST_EINVAL;
    kern_table_best()->reduce3[dt][op](dst, a, b, n);
    return 0;
}

int kern_reduce_wire(kern_dtype_t wire_dt, kern_op_t op, float *acc,
                     const void *wire, size_t n)
{
    if ((wire_dt != KERN_F16 && wire_dt != KERN_BF16) ||
        (unsigned)op >= KERN_OP_COUNT)
        return ST_EINVAL;
    kern_table_best()->wire_reduce[wire_dt == KERN_BF16][op](acc, wire, n);
    return 0;
}

/*
 * The last step of an average. Floats multiply by the rounded reciprocal
 * (one rounding of 1/n, then one per element): a multiply is several
 * times cheaper than a divide per element, and every rank rounds the same
 * 1/n, so replicas stay bitwise equal; 16-bit floats do that in f32. Integers divide and
 * truncate toward zero, which is the only exact choice there.
 */
int kern_avg_finish(kern_dtype_t dt, void *buf, size_t n, uint32_t nranks)
{
    if ((unsigned)dt >= KERN_DTYPE_COUNT || nranks == 0)
        return ST_EINVAL;
    if (nranks == 1)
        return 0;
    float sf = 1.0f / (float)nranks;
    double sd = 1.0 / (double)nranks;
    /* Floats through the table (a scalar loop here costs as much as the
     * ring's whole reduction of the chunk: -O2 does not vectorise a loop
     * that needs a tail); the rest one loop per type, not a switch per
     * element. */
#define SCALE_LOOP(S, expr)                                                  \
    for (size_t i = 0; i < n; i++) {                                         \
        __typeof__(kern__ld_##S(buf, 0)) x = kern__ld_##S(buf, i);           \
        kern__st_##S(buf, i, (expr));                                        \
    }                                                                        \
    break
    switch (dt) {
    case KERN_F32:
        kern_table_best()->scale_f32(buf, sf, n);
        break;
    case KERN_F64:
        kern_table_best()->scale_f64(buf, sd, n);
        break;
    case KERN_F16: SCALE_LOOP(u16, kern__f32_to_f16(kern__f16_to_f32(x) * sf));
    case KERN_BF16:
        SCALE_LOOP(u16, kern__f32_to_bf16(kern__bf16_to_f32(x) * sf));
    case KERN_I32: SCALE_LOOP(i32, x / (int32_t)nranks);
    case KERN_I64: SCALE_LOOP(i64, x / (int64_t)nranks);
    case KERN_U8: SCALE_LOOP(u8, (uint8_t)(x / nranks));
    default: return ST_EINVAL;
    }
#undef SCALE_LOOP
    return 0;
}

void kern_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    kern_table_best()->f32_to_f16(dst, src, n);
}

void kern_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    kern_table_best()->f16_to_f32(dst, src, n);
}

void kern_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    kern_table_best()->f32_to_bf16(dst, src, n);
}

void kern_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    kern_table_best()->bf16_to_f32(dst, src, n);
}

uint16_t kern_f32_to_f16_one(float f)
{
    return kern__f32_to_f16(f);
}

float kern_f16_to_f32_one(uint16_t h)
{
    return kern__f16_to_f32(h);
}

uint16_t kern_f32_to_bf16_one(float f)
{
    return kern__f32_to_bf16(f);
}

float kern_bf16_to_f32_one(uint16_t h)
{
    return kern__bf16_to_f32(h);
}

/*
 * memcpy with non-temporal stores: for a destination nothing here reads
 * again soon (a trainer's buffer the result is written back into). Plain
 * stores first read every destination line into the cache (a read for
 * ownership) and evict what the ring still uses; streaming ones write
 * the lines whole. SSE2 is in every x86-64; elsewhere, memcpy.
 */
#if defined(__x86_64__)
#include <emmintrin.h>
void kern_copy_stream(void *dst, const void *src, size_t bytes)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (bytes < 256 || head > bytes) {
        memcpy(dst, src, bytes);
        return;
    }
    memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    size_t i = 0;
    for (; i + 64 <= bytes; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence(); /* the stores are weakly ordered: visible before done */
    memcpy(d + i, s + i, bytes - i);
}
#else
void kern_copy_stream(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}
#endif
