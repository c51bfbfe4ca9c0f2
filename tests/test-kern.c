/*
 * Kernel tests: every (ISA, dtype, op) against an independent
 * double-precision reference on fresh random data mixed with edge values,
 * every SIMD table bitwise against the scalar one, exhaustive 16-bit round
 * trips, counts from 0 to 2^24+3, and unaligned pointers.
 *
 * The seed is printed on failure; RINGD_TEST_SEED=<n> replays it.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kern.h"
#include "tests/task.h"

/* ---- random data --------------------------------------------------- */

static uint64_t rng_state;
static uint64_t seed_used;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void seed_rng(void)
{
    const char *env = getenv("RINGD_TEST_SEED");
    seed_used = env ? strtoull(env, NULL, 0)
                    : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    rng_state = seed_used;
}

#define FAIL_SEED(...)                                                       \
    TEST_FAIL_("seed %llu (RINGD_TEST_SEED=%llu replays): %s",               \
               (unsigned long long)seed_used,                                \
               (unsigned long long)seed_used, (snprintf(msgbuf,             \
               sizeof(msgbuf), __VA_ARGS__), msgbuf))

static char msgbuf[512];

static double rnd_unit(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0; /* [0,1) */
}

static double rnd_value(void)
{
    return (rnd_unit() * 2 - 1) * ldexp(1.0, (int)(rnd() % 17) - 8);
}

/* Special values mixed in with probability 1/16. */
static const float f32_edges[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN,
                                  -NAN, 1.0f, -1.0f, FLT_MAX, -FLT_MAX,
                                  FLT_MIN, 1e-40f, -1e-45f, 65504.0f,
                                  65520.0f, 6e-8f, 3.0e38f};

static float rnd_f32(void)
{
    if (rnd() % 16 == 0)
        return f32_edges[rnd() % (sizeof(f32_edges) / sizeof(f32_edges[0]))];
    if (rnd() % 16 == 0) {
        uint32_t bits = (uint32_t)rnd();
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    return (float)rnd_value();
}

static double rnd_f64(void)
{
    if (rnd() % 16 == 0) {
        static const double e[] = {0.0, -0.0, INFINITY, -INFINITY, NAN,
                                   DBL_MAX, -DBL_MIN, 4.9e-324, 1.0};
        return e[rnd() % (sizeof(e) / sizeof(e[0]))];
    }
    return rnd_value();
}

/* ---- an independent reference --------------------------------------- */

/*
 * Round x to a binary format with p significand bits, minimum normal
 * exponent emin and largest finite value maxf, to nearest even. This is a
 * separate implementation from kernels/: arithmetic on doubles, not bits.
 */
static double round_fmt(double x, int p, int emin, double maxf)
{
    if (isnan(x) || isinf(x) || x == 0)
        return x;
    int e;
    frexp(fabs(x), &e);
    int exp = e - 1;
    if (exp < emin)
        exp = emin;
    double q = ldexp(1.0, exp - (p - 1));
    double r = nearbyint(x / q) * q;
    if (r == 0)
        return copysign(0.0, x);
    if (fabs(r) > maxf)
        return copysign(INFINITY, x);
    return r;
}

static double ref_f16(double x) { return round_fmt(x, 11, -14, 65504.0); }
static double ref_bf16(double x)
{
    return round_fmt(x, 8, -126, 3.38953138925153547590e38);
}

/* Decode a 16-bit pattern by arithmetic (independent of the kernels). */
static double decode16(uint16_t h, int ebits, int mbits)
{
    int sign = h >> 15;
    int e = (h >> mbits) & ((1 << ebits) - 1);
    int m = h & ((1 << mbits) - 1);
    int bias = (1 << (ebits - 1)) - 1;
    double v;
    if (e == (1 << ebits) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - bias - mbits);
    else
        v = ldexp((double)(m + (1 << mbits)), e - bias - mbits);
    return sign ? -v : v;
}

static double ref_op(kern_op_t op, double a, double b)
{
    switch (op) {
    case KERN_SUM:
    case KERN_AVG:
        return a + b;
    case KERN_PROD:
        return a * b;
    case KERN_MIN:
        if (isnan(a) || isnan(b))
            return NAN;
        if (a == b)
            return signbit(a) ? a : b;
        return a < b ? a : b;
    case KERN_MAX:
        if (isnan(a) || isnan(b))
            return NAN;
        if (a == b)
            return signbit(a) ? b : a;
        return a > b ? a : b;
    default:
        return NAN;
    }
}

/* Same value, NaN matching NaN, and the sign of zero. */
static int same_double(double got, double want)
{
    if (isnan(want))
        return isnan(got);
    return got == want && signbit(got) == signbit(want);
}

/* ---- typed buffers ------------------------------------------------- */

static void fill(kern_dtype_t dt, void *buf, size_t n)
{
    unsigned char *p = buf;
    for (size_t i = 0; i < n; i++) {
        switch (dt) {
        case KERN_F32: {
            float f = rnd_f32();
            memcpy(p + 4 * i, &f, 4);
            break;
        }
        case KERN_F64: {
            double d = rnd_f64();
            memcpy(p + 8 * i, &d, 8);
            break;
        }
        case KERN_F16: {
            uint16_t h = kern_f32_to_f16_one(rnd_f32());
            if (rnd() % 16 == 0)
                h = (uint16_t)rnd();
            memcpy(p + 2 * i, &h, 2);
            break;
        }
        case KERN_BF16: {
            uint16_t h = kern_f32_to_bf16_one(rnd_f32());
            if (rnd() % 16 == 0)
                h = (uint16_t)rnd();
            memcpy(p + 2 * i, &h, 2);
            break;
        }
        case KERN_I32: {
            uint32_t v = (uint32_t)rnd();
            if (rnd() % 4 == 0)
                v = (uint32_t)(int32_t)(rnd() % 7) - 3;
            memcpy(p + 4 * i, &v, 4);
            break;
        }
        case KERN_I64: {
            uint64_t v = rnd();
            if (rnd() % 4 == 0)
                v = (uint64_t)(int64_t)(rnd() % 7) - 3;
            memcpy(p + 8 * i, &v, 8);
            break;
        }
        case KERN_U8:
            p[i] = (unsigned char)rnd();
            break;
        default:
            break;
        }
    }
}

static double get_float(kern_dtype_t dt, const void *buf, size_t i)
{
    const unsigned char *p = buf;
    switch (dt) {
    case KERN_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case KERN_F64: {
        double d;
        memcpy(&d, p + 8 * i, 8);
        return d;
    }
    case KERN_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return decode16(h, 5, 10);
    }
    case KERN_BF16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return decode16(h, 8, 7);
    }
    default:
        return NAN;
    }
}

static double round_to(kern_dtype_t dt, double x)
{
    switch (dt) {
    case KERN_F32:
        return (float)x;
    case KERN_F16:
        return ref_f16(x);
    case KERN_BF16:
        return ref_bf16(x);
    default:
        return x;
    }
}

/* Integer reference with explicit wrap-around through wide types. */
static int check_int(kern_dtype_t dt, kern_op_t op, const void *a,
                     const void *b, const void *got, size_t n)
{
    size_t sz = kern_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        __int128 x = 0, y = 0, g = 0;
        if (dt == KERN_I32) {
            int32_t t;
            memcpy(&t, (const char *)a + sz * i, 4), x = t;
            memcpy(&t, (const char *)b + sz * i, 4), y = t;
            memcpy(&t, (const char *)got + sz * i, 4), g = t;
        } else if (dt == KERN_I64) {
            int64_t t;
            memcpy(&t, (const char *)a + sz * i, 8), x = t;
            memcpy(&t, (const char *)b + sz * i, 8), y = t;
            memcpy(&t, (const char *)got + sz * i, 8), g = t;
        } else {
            x = ((const uint8_t *)a)[i];
            y = ((const uint8_t *)b)[i];
            g = ((const uint8_t *)got)[i];
        }
        __int128 r;
        switch (op) {
        case KERN_PROD: r = x * y; break;
        case KERN_MIN: r = x < y ? x : y; break;
        case KERN_MAX: r = x > y ? x : y; break;
        default: r = x + y; break;
        }
        /* Wrap to the width: compare the low bits only. */
        unsigned __int128 mask = sz == 16 ? ~(unsigned __int128)0
                                          : (((unsigned __int128)1
                                              << (8 * sz)) - 1);
        if ((((unsigned __int128)r ^ (unsigned __int128)g) & mask) != 0)
            return (int)i + 1;
    }
    return 0;
}

/* Returns 0, or 1 + the index of the first element that differs. */
static size_t check(kern_dtype_t dt, kern_op_t op, const void *a,
                    const void *b, const void *got, size_t n)
{
    if (dt == KERN_I32 || dt == KERN_I64 || dt == KERN_U8)
        return (size_t)check_int(dt, op, a, b, got, n);
    for (size_t i = 0; i < n; i++) {
        double want = round_to(dt, ref_op(op, get_float(dt, a, i),
                                          get_float(dt, b, i)));
        if (!same_double(get_float(dt, got, i), want))
            return i + 1;
    }
    return 0;
}

/* Bitwise equality, except that any NaN equals any NaN. */
static size_t same_bits(kern_dtype_t dt, const void *x, const void *y,
                        size_t n)
{
    size_t sz = kern_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)x + i * sz, (const char *)y + i * sz, sz) ==
            0)
            continue;
        if (dt <= KERN_BF16 && isnan(get_float(dt, x, i)) &&
            isnan(get_float(dt, y, i)))
            continue;
        return i + 1;
    }
    return 0;
}

/*
 * One (table, dtype, op, n) case with byte offsets for unaligned pointers:
 * reduce3 into a fresh buffer, reduce in place, and the aliasing form.
 */
static void run_case(const kern_table_t *t, kern_dtype_t dt, kern_op_t op,
                     size_t n, size_t off)
{
    size_t sz = kern_dtype_size(dt);
    size_t bytes = n * sz + 64;
    char *ma = malloc(bytes), *mb = malloc(bytes), *md = malloc(bytes),
         *mr = malloc(bytes);
    ASSERT(ma && mb && md && mr);
    char *a = ma + off, *b = mb + (off * 3) % 8, *d = md + (off * 5) % 8;
    char *ref = mr;
    fill(dt, a, n);
    fill(dt, b, n);

    t->reduce3[dt][op](d, a, b, n);
    size_t bad = check(dt, op, a, b, d, n);
    if (bad)
        FAIL_SEED("%s %s/%s n=%zu off=%zu: reduce3 element %zu wrong",
                  t->name, kern_dtype_name(dt), kern_op_name(op), n, off,
                  bad - 1);

    /* In place must equal the three-operand form bit for bit. */
    memcpy(ref, a, n * sz);
    t->reduce[dt][op](ref, b, n);
    bad = same_bits(dt, ref, d, n);
    if (bad)
        FAIL_SEED("%s %s/%s n=%zu: reduce differs from reduce3 at %zu",
                  t->name, kern_dtype_name(dt), kern_op_name(op), n, bad - 1);

    /* And equal the scalar table's answer. */
    const kern_table_t *sc = kern_table(KERN_ISA_SCALAR);
    sc->reduce3[dt][op](ref, a, b, n);
    bad = same_bits(dt, ref, d, n);
    if (bad)
        FAIL_SEED("%s %s/%s n=%zu: differs from scalar at %zu", t->name,
                  kern_dtype_name(dt), kern_op_name(op), n, bad - 1);

    /* Aliasing: dst == b. */
    memcpy(ref, b, n * sz);
    t->reduce3[dt][op](ref, a, ref, n);
    bad = same_bits(dt, ref, d, n);
    if (bad)
        FAIL_SEED("%s %s/%s n=%zu: aliased reduce3 differs at %zu", t->name,
                  kern_dtype_name(dt), kern_op_name(op), n, bad - 1);
    free(ma);
    free(mb);
    free(md);
    free(mr);
}

static void run_dtype(kern_dtype_t dt)
{
    static const size_t counts[] = {0, 1, 2, 7, 15, 16, 17, 31, 33, 63, 65,
                                    127, 129, 4097, 100003};
    seed_rng();
    for (int isa = 0; isa < KERN_ISA_COUNT; isa++) {
        const kern_table_t *t = kern_table((kern_isa_t)isa);
        if (t == NULL)
            continue;
        for (int op = 0; op < KERN_OP_COUNT; op++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                for (size_t off = 0; off < 4; off++)
                    run_case(t, dt, (kern_op_t)op, counts[c],
                             counts[c] > 4097 ? off * 0 : off);
    }
}

TEST_IMPL(kern_reduce_f32) { run_dtype(KERN_F32); return 0; }
TEST_IMPL(kern_reduce_f64) { run_dtype(KERN_F64); return 0; }
TEST_IMPL(kern_reduce_f16) { run_dtype(KERN_F16); return 0; }
TEST_IMPL(kern_reduce_bf16) { run_dtype(KERN_BF16); return 0; }
TEST_IMPL(kern_reduce_i32) { run_dtype(KERN_I32); return 0; }
TEST_IMPL(kern_reduce_i64) { run_dtype(KERN_I64); return 0; }
TEST_IMPL(kern_reduce_u8) { run_dtype(KERN_U8); return 0; }

/*
 * 2^24+3 elements: every dtype/op once on the table in use. The reference
 * is checked on a stride and on the whole tail (it is slow); the scalar
 * table and the in-place form are compared on every element.
 */
TEST_IMPL(kern_reduce_huge)
{
    seed_rng();
    const size_t n = (1u << 24) + 3;
    const kern_table_t *t = kern_table_best();
    const kern_table_t *sc = kern_table(KERN_ISA_SCALAR);
    char *a = malloc(n * 8 + 8), *b = malloc(n * 8 + 8);
    char *d = malloc(n * 8 + 8), *r = malloc(n * 8 + 8);
    ASSERT(a && b && d && r);
    for (int dt = 0; dt < KERN_DTYPE_COUNT; dt++) {
        size_t sz = kern_dtype_size((kern_dtype_t)dt);
        char *ua = a + dt % 4; /* a different misalignment per dtype */
        fill((kern_dtype_t)dt, ua, n);
        fill((kern_dtype_t)dt, b, n);
        for (int op = 0; op < KERN_OP_COUNT; op++) {
            t->reduce3[dt][op](d, ua, b, n);
            for (size_t i = 0; i < n; i += (i + 4096 < n ? 257 : 1)) {
                if (check((kern_dtype_t)dt, (kern_op_t)op, ua + i * sz,
                          b + i * sz, d + i * sz, 1))
                    FAIL_SEED("%s %s/%s n=%zu: element %zu wrong", t->name,
                              kern_dtype_name((kern_dtype_t)dt),
                              kern_op_name((kern_op_t)op), n, i);
            }
            sc->reduce3[dt][op](r, ua, b, n);
            size_t bad = same_bits((kern_dtype_t)dt, r, d, n);
            if (bad)
                FAIL_SEED("%s %s/%s n=%zu: differs from scalar at %zu",
                          t->name, kern_dtype_name((kern_dtype_t)dt),
                          kern_op_name((kern_op_t)op), n, bad - 1);
            memcpy(r, ua, n * sz);
            t->reduce[dt][op](r, b, n);
            bad = same_bits((kern_dtype_t)dt, r, d, n);
            if (bad)
                FAIL_SEED("%s %s/%s n=%zu: in-place differs at %zu", t->name,
                          kern_dtype_name((kern_dtype_t)dt),
                          kern_op_name((kern_op_t)op), n, bad - 1);
        }
    }
    free(a);
    free(b);
    free(d);
    free(r);
    return 0;
}

TEST_IMPL(kern_names)
{
    ASSERT_EQ(kern_dtype_size(KERN_F32), 4);
    ASSERT_EQ(kern_dtype_size(KERN_F64), 8);
    ASSERT_EQ(kern_dtype_size(KERN_BF16), 2);
    ASSERT_EQ(kern_dtype_size(KERN_U8), 1);
    ASSERT_EQ(kern_dtype_size((kern_dtype_t)99), 0);
    for (int i = 0; i < KERN_DTYPE_COUNT; i++) {
        kern_dtype_t dt;
        ASSERT_OK(kern_dtype_parse(kern_dtype_name((kern_dtype_t)i), &dt));
        ASSERT_EQ(dt, i);
    }
    for (int i = 0; i < KERN_OP_COUNT; i++) {
        kern_op_t op;
        ASSERT_OK(kern_op_parse(kern_op_name((kern_op_t)i), &op));
        ASSERT_EQ(op, i);
    }
    kern_dtype_t dt;
    ASSERT_EQ(kern_dtype_parse("f8", &dt), ST_EINVAL);
    ASSERT_EQ(kern_dtype_parse(NULL, &dt), ST_EINVAL);
    float x = 1, y = 2;
    ASSERT_EQ(kern_reduce((kern_dtype_t)42, KERN_SUM, &x, &y, 1), ST_EINVAL);
    ASSERT_EQ(kern_reduce(KERN_F32, (kern_op_t)-1, &x, &y, 1), ST_EINVAL);
    ASSERT(x == 1);
    ASSERT_EQ(kern_reduce_wire(KERN_F32, KERN_SUM, &x, &y, 1), ST_EINVAL);
    ASSERT_EQ(kern_avg_finish(KERN_F32, &x, 1, 0), ST_EINVAL);
    ASSERT(kern_table_best() != NULL);
    ASSERT(kern_table(KERN_ISA_SCALAR) != NULL);
    ASSERT(kern_table((kern_isa_t)7) == NULL);
    return 0;
}

/* ---- casts ----------------------------------------------------------- */

typedef void (*cast_fn)(void *, const void *, size_t);

/* All 65,536 patterns: decode matches arithmetic, encode(decode(h)) == h. */
static void roundtrip16(int is_bf16)
{
    uint16_t *h = malloc(65536 * 2 + 8), *back = malloc(65536 * 2 + 8);
    float *f = malloc(65536 * 4 + 8);
    ASSERT(h && back && f);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    for (int isa = 0; isa < KERN_ISA_COUNT; isa++) {
        const kern_table_t *t = kern_table((kern_isa_t)isa);
        if (t == NULL)
            continue;
        cast_fn to32 = is_bf16 ? t->bf16_to_f32 : t->f16_to_f32;
        cast_fn to16 = is_bf16 ? t->f32_to_bf16 : t->f32_to_f16;
        to32(f, h, 65536);
        to16(back, f, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            double want = is_bf16 ? decode16((uint16_t)i, 8, 7)
                                  : decode16((uint16_t)i, 5, 10);
            ASSERT_MSG(same_double(f[i], want),
                       "%s %s: 0x%04x decodes to %g, want %g", t->name,
                       is_bf16 ? "bf16" : "f16", i, (double)f[i], want);
            if (isnan(want))
                ASSERT_MSG(isnan(is_bf16 ? decode16(back[i], 8, 7)
                                         : decode16(back[i], 5, 10)),
                           "%s: NaN 0x%04x came back as 0x%04x", t->name, i,
                           back[i]);
            else
                ASSERT_MSG(back[i] == i, "%s %s: 0x%04x came back as 0x%04x",
                           t->name, is_bf16 ? "bf16" : "f16", i, back[i]);
        }
    }
    free(h);
    free(back);
    free(f);
}

TEST_IMPL(kern_f16_roundtrip) { roundtrip16(0); return 0; }
TEST_IMPL(kern_bf16_roundtrip) { roundtrip16(1); return 0; }

/* Random f32 bit patterns (all exponents) round like the reference. */
TEST_IMPL(kern_cast_rounding)
{
    seed_rng();
    size_t n = 1u << 20;
    float *f = malloc(n * 4 + 4);
    uint16_t *h = malloc(n * 2 + 2);
    ASSERT(f && h);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)rnd();
        /* Bias towards the f16 range, where the interesting cases are. */
        if (i % 2)
            bits = (bits & 0x80ffffffu) | ((uint32_t)(96 + rnd() % 48) << 23);
        if (i % 7 == 0) /* exact ties */
            bits &= ~0x0fffu, bits |= 0x1000u;
        memcpy(&f[i], &bits, 4);
    }
    for (int isa = 0; isa < KERN_ISA_COUNT; isa++) {
        const kern_table_t *t = kern_table((kern_isa_t)isa);
        if (t == NULL)
            continue;
        t->f32_to_f16(h, f, n);
        for (size_t i = 0; i < n; i++)
            if (!same_double(decode16(h[i], 5, 10), ref_f16(f[i])))
                FAIL_SEED("%s f32->f16 of %a gave 0x%04x", t->name,
                          (double)f[i], h[i]);
        t->f32_to_bf16(h, f, n);
        for (size_t i = 0; i < n; i++)
            if (!same_double(decode16(h[i], 8, 7), ref_bf16(f[i])))
                FAIL_SEED("%s f32->bf16 of %a gave 0x%04x", t->name,
                          (double)f[i], h[i]);
    }
    /* Unaligned and odd counts through the public entry points. */
    char *raw = malloc(4 * 1031 + 8);
    char *raw16 = malloc(2 * 1031 + 8);
    ASSERT(raw && raw16);
    memcpy(raw + 1, f, 4 * 1031);
    kern_f32_to_bf16((uint16_t *)(void *)(raw16 + 1),
                     (const float *)(void *)(raw + 1), 1031);
    for (size_t i = 0; i < 1031; i++) {
        uint16_t got;
        memcpy(&got, raw16 + 1 + 2 * i, 2);
        ASSERT_EQ(got, kern_f32_to_bf16_one(f[i]));
    }
    free(raw);
    free(raw16);
    free(f);
    free(h);
    return 0;
}

/* The fused wire step: acc op float(wire), against the reference. */
TEST_IMPL(kern_wire_reduce)
{
    seed_rng();
    static const size_t counts[] = {0, 1, 7, 33, 4097};
    for (int isa = 0; isa < KERN_ISA_COUNT; isa++) {
        const kern_table_t *t = kern_table((kern_isa_t)isa);
        if (t == NULL)
            continue;
        for (int w = 0; w < 2; w++)
            for (int op = 0; op < KERN_OP_COUNT; op++)
                for (size_t c = 0; c < 5; c++) {
                    size_t n = counts[c];
                    float *acc = malloc(n * 4 + 4), *orig = malloc(n * 4 + 4);
                    uint16_t *wire = malloc(n * 2 + 2);
                    fill(KERN_F32, orig, n);
                    fill(w ? KERN_BF16 : KERN_F16, wire, n);
                    memcpy(acc, orig, n * 4);
                    t->wire_reduce[w][op](acc, wire, n);
                    for (size_t i = 0; i < n; i++) {
                        double q = w ? decode16(wire[i], 8, 7)
                                     : decode16(wire[i], 5, 10);
                        double want = (float)ref_op((kern_op_t)op, orig[i], q);
                        if (!same_double(acc[i], want))
                            FAIL_SEED("%s wire %s/%s n=%zu i=%zu: %g op %g "
                                      "gave %g want %g", t->name,
                                      w ? "bf16" : "f16",
                                      kern_op_name((kern_op_t)op), n, i,
                                      (double)orig[i], q, (double)acc[i],
                                      want);
                    }
                    free(acc);
                    free(orig);
                    free(wire);
                }
    }
    return 0;
}

/* AVG: k contributions summed, then one scale by 1/k. */
TEST_IMPL(kern_avg)
{
    seed_rng();
    for (int dt = 0; dt < KERN_DTYPE_COUNT; dt++) {
        size_t n = 1031, sz = kern_dtype_size((kern_dtype_t)dt);
        for (uint32_t k = 1; k <= 5; k++) {
            char *acc = calloc(n, sz), *x = malloc(n * sz);
            double *exact = calloc(n, sizeof(double));
            ASSERT(acc && x && exact);
            for (uint32_t r = 0; r < k; r++) {
                /* Small exact values so every partial sum is exact. */
                for (size_t i = 0; i < n; i++) {
                    int v = (int)(rnd() % 64);
                    exact[i] += v;
                    switch (dt) {
                    case KERN_F32: ((float *)(void *)x)[i] = (float)v; break;
                    case KERN_F64: ((double *)(void *)x)[i] = v; break;
                    case KERN_F16:
                        ((uint16_t *)(void *)x)[i] =
                            kern_f32_to_f16_one((float)v);
                        break;
                    case KERN_BF16:
                        ((uint16_t *)(void *)x)[i] =
                            kern_f32_to_bf16_one((float)v);
                        break;
                    case KERN_I32: ((int32_t *)(void *)x)[i] = v; break;
                    case KERN_I64: ((int64_t *)(void *)x)[i] = v; break;
                    default: ((uint8_t *)x)[i] = (uint8_t)(v % 50); break;
                    }
                    if (dt == KERN_U8)
                        exact[i] += (v % 50) - v;
                }
                ASSERT_OK(kern_reduce((kern_dtype_t)dt, KERN_AVG, acc, x, n));
            }
            ASSERT_OK(kern_avg_finish((kern_dtype_t)dt, acc, n, k));
            for (size_t i = 0; i < n; i++) {
                double want;
                if (dt >= KERN_I32)
                    want = (double)((int64_t)exact[i] / (int64_t)k);
                else if (dt == KERN_F64)
                    want = exact[i] * (1.0 / k);
                else
                    want = round_to((kern_dtype_t)dt,
                                    (double)((float)round_to(
                                                 (kern_dtype_t)dt, exact[i]) *
                                             (1.0f / (float)k)));
                double got = dt >= KERN_I32
                                 ? (dt == KERN_I32
                                        ? ((int32_t *)(void *)acc)[i]
                                        : dt == KERN_I64
                                              ? (double)((int64_t *)(void *)
                                                             acc)[i]
                                              : ((uint8_t *)acc)[i])
                                 : get_float((kern_dtype_t)dt, acc, i);
                ASSERT_MSG(same_double(got, want),
                           "%s avg k=%u i=%zu: got %g want %g (sum %g)",
                           kern_dtype_name((kern_dtype_t)dt), k, i, got, want,
                           exact[i]);
            }
            free(acc);
            free(x);
            free(exact);
        }
    }
    return 0;
}

/* AVG's last step on floats, every ISA's table against x * s element by
 * element: bit for bit (NaN, Inf, subnormals, -0 included), at every
 * length of the vector bodies' tails and at a misaligned start. */
TEST_IMPL(kern_scale_matches_scalar)
{
    seed_rng();
    enum { N = 301 };
    float f[N + 1], fr[N + 1];
    double d[N + 1], dr[N + 1];
    static const float sf[] = {0.5f, 1.0f / 3.0f, 1.0f / 7.0f, 0.125f};
    for (int isa = 0; isa < KERN_ISA_COUNT; isa++) {
        const kern_table_t *t = kern_table((kern_isa_t)isa);
        if (t == NULL)
            continue;
        ASSERT(t->scale_f32 != NULL && t->scale_f64 != NULL);
        for (size_t n = 0; n <= 70; n += (n < 40 ? 1 : 15))
            for (size_t k = 0; k < sizeof(sf) / sizeof(sf[0]); k++) {
                for (size_t i = 0; i < N + 1; i++) {
                    uint32_t b = (uint32_t)rnd();
                    uint64_t b64 = ((uint64_t)rnd() << 32) ^ (uint64_t)rnd();
                    memcpy(&f[i], &b, 4);
                    memcpy(&d[i], &b64, 8);
                }
                f[1] = -0.0f, f[2] = INFINITY, f[3] = 1e-40f;
                memcpy(fr, f, sizeof(f));
                memcpy(dr, d, sizeof(d));
                t->scale_f32(f + 1, sf[k], n); /* misaligned by 4 bytes */
                t->scale_f64(d + 1, (double)sf[k], n);
                for (size_t i = 0; i < N + 1; i++) {
                    float wf = i >= 1 && i <= n ? fr[i] * sf[k] : fr[i];
                    double wd = i >= 1 && i <= n ? dr[i] * (double)sf[k]
                                                 : dr[i];
                    ASSERT_MSG(memcmp(&f[i], &wf, 4) == 0,
                               "%s scale_f32 n=%zu: [%zu] %a, want %a",
                               t->name, n, i, (double)f[i], (double)wf);
                    ASSERT_MSG(memcmp(&d[i], &wd, 8) == 0,
                               "%s scale_f64 n=%zu: [%zu] %a, want %a",
                               t->name, n, i, d[i], wd);
                }
            }
    }
    return 0;
}

/* The write-back's streaming copy: every length around its 256-byte
 * cut-off and its 64-byte loop, every alignment of both ends, the bytes
 * either side untouched. */
TEST_IMPL(kern_copy_stream_matches_memcpy)
{
    seed_rng();
    enum { MAX = 4096 + 200 };
    static uint8_t src[MAX + 64], dst[MAX + 64], want[MAX + 64];
    static const size_t lens[] = {0, 1, 15, 17, 255, 256, 257, 319, 320,
                                  1000, 4096, 4096 + 63, MAX};
    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = (uint8_t)rnd();
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
        for (size_t da = 0; da < 17; da += 3)
            for (size_t sa = 0; sa < 17; sa += 4) {
                size_t n = lens[li];
                for (size_t i = 0; i < sizeof(dst); i++)
                    dst[i] = want[i] = (uint8_t)(i * 7 + 1);
                memcpy(want + 8 + da, src + sa, n);
                kern_copy_stream(dst + 8 + da, src + sa, n);
                ASSERT_MSG(memcmp(dst, want, sizeof(dst)) == 0,
                           "len %zu dst+%zu src+%zu differs", n, da, sa);
            }
    return 0;
}
