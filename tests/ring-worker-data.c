/*
 * ring-worker-data.c - the ring test worker's deterministic data and its
 * references: what rank r holds at element i, written and read in every
 * dtype, the exact integer and the tolerant float results the modes check
 * against, and the hash of a result that the launcher compares across
 * ranks (bitwise identity).
 */
#include "tests/ring-worker.h"

#include <math.h>

int is_float(kern_dtype_t dt)
{
    return dt == KERN_F32 || dt == KERN_F64 || dt == KERN_F16 ||
           dt == KERN_BF16;
}

/* Rank r's value at i, before rounding to the dtype. */
double gen_val(kern_dtype_t dt, kern_op_t op, uint32_t r, size_t i)
{
    uint64_t h = (i * 2654435761u + r * 40503u + 17) % 1000;
    if (!is_float(dt)) {
        if (op == KERN_PROD)
            return (double)(h % 3 + 1);
        return (double)h - (dt == KERN_U8 ? 0 : 500);
    }
    if (op == KERN_PROD)
        return 1.0 + ((double)h - 500) / 4096.0;
    return ((double)h - 500) / 64.0;
}

void put(kern_dtype_t dt, void *buf, size_t i, double x)
{
    switch (dt) {
    case KERN_F32: ((float *)buf)[i] = (float)x; break;
    case KERN_F64: ((double *)buf)[i] = x; break;
    case KERN_F16: ((uint16_t *)buf)[i] = kern_f32_to_f16_one((float)x); break;
    case KERN_BF16:
        ((uint16_t *)buf)[i] = kern_f32_to_bf16_one((float)x);
        break;
    case KERN_I32: ((int32_t *)buf)[i] = (int32_t)(int64_t)x; break;
    case KERN_I64: ((int64_t *)buf)[i] = (int64_t)x; break;
    case KERN_U8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)x; break;
    default: break;
    }
}

double get(kern_dtype_t dt, const void *buf, size_t i)
{
    switch (dt) {
    case KERN_F32: return ((const float *)buf)[i];
    case KERN_F64: return ((const double *)buf)[i];
    case KERN_F16: return kern_f16_to_f32_one(((const uint16_t *)buf)[i]);
    case KERN_BF16: return kern_bf16_to_f32_one(((const uint16_t *)buf)[i]);
    case KERN_I32: return ((const int32_t *)buf)[i];
    case KERN_I64: return (double)((const int64_t *)buf)[i];
    case KERN_U8: return ((const uint8_t *)buf)[i];
    default: return 0;
    }
}

/* Wrap an exact integer into the dtype, as two's complement does. */
int64_t wrap(kern_dtype_t dt, uint64_t x)
{
    if (dt == KERN_U8)
        return (uint8_t)x;
    if (dt == KERN_I32)
        return (int32_t)(uint32_t)x;
    return (int64_t)x;
}

int64_t int_ref(kern_dtype_t dt, kern_op_t op, size_t i)
{
    uint64_t acc = 0;
    for (uint32_t r = 0; r < W.n; r++) {
        int64_t x = wrap(dt, (uint64_t)(int64_t)gen_val(dt, op, r, i));
        int64_t a = wrap(dt, acc);
        if (r == 0)
            acc = (uint64_t)x;
        else if (op == KERN_SUM || op == KERN_AVG)
            acc = (uint64_t)wrap(dt, (uint64_t)a + (uint64_t)x);
        else if (op == KERN_PROD)
            acc = (uint64_t)wrap(dt, (uint64_t)a * (uint64_t)x);
        else if (op == KERN_MIN)
            acc = (uint64_t)(x < a ? x : a);
        else
            acc = (uint64_t)(x > a ? x : a);
    }
    int64_t v = wrap(dt, acc);
    if (op == KERN_AVG)
        v = v / (int64_t)W.n;
    return v;
}

static double tol_for(kern_dtype_t dt, int wire)
{
    double t = dt == KERN_F64 ? 1e-12 : dt == KERN_F32 ? 1e-5
             : dt == KERN_F16 ? 4e-3 : 3e-2;
    if (wire)
        t = W.opts.wire == RD_WIRE_BF16 ? 3e-2 : 4e-3;
    return t * W.n;
}

void check_float(kern_dtype_t dt, kern_op_t op, const void *buf,
                 size_t i, const char *what)
{
    double ref = 0, mag = 0;
    for (uint32_t r = 0; r < W.n; r++) {
        char one[8];
        put(dt, one, 0, gen_val(dt, op, r, i));
        double x = get(dt, one, 0);
        if (r == 0)
            ref = x;
        else if (op == KERN_SUM || op == KERN_AVG)
            ref += x;
        else if (op == KERN_PROD)
            ref *= x;
        else if (op == KERN_MIN)
            ref = x < ref ? x : ref;
        else
            ref = x > ref ? x : ref;
        mag += fabs(x);
    }
    if (op == KERN_AVG) {
        ref /= W.n;
        mag /= W.n;
    }
    if (op == KERN_PROD)
        mag = fabs(ref);
    double got = get(dt, buf, i);
    int wire = dt == KERN_F32 && rd_wire_compresses(W.opts.wire);
    int exact = (op == KERN_MIN || op == KERN_MAX) && !wire;
    double tol = exact ? 0 : tol_for(dt, wire) * (mag + 1e-3);
    if (!(fabs(got - ref) <= tol))
        DIE("%s: %s/%s [%zu] = %.9g, want %.9g (tol %.3g)", what,
            kern_dtype_name(dt), kern_op_name(op), i, got, ref, tol);
}

uint64_t fnv(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}
