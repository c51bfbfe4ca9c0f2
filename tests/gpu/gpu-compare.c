/*
 * gpu-compare.c - the CUDA library against the CPU kernels, on a real GPU.
 * The suite's kern_gpu_* tests (tests/test-kern-gpu.c) and
 * tests/gpu/gpu_check share it, so the device script and the suite check
 * the same thing.
 */
#include "tests/gpu/gpu-compare.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"

static const kern_cuda_api_t *api;
static int failures;

/* A device call that fails ends the process: in the suite that fails the
 * test (it runs in its own process), in gpu_check it is exit status 1. */
#define CHECK(call)                                                          \
    do {                                                                     \
        int rc_ = (call);                                                    \
        if (rc_ != 0) {                                                      \
            fprintf(stderr, "%s:%d %s failed: %s\n", __FILE__, __LINE__,    \
                    #call, api->last_error());                               \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

static uint64_t rs = 0x1234567;
static uint32_t rnd32(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)rs;
}

static void fill(kern_dtype_t dt, void *p, size_t n)
{
    size_t sz = kern_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        if (dt == KERN_F32 || dt == KERN_F16 || dt == KERN_BF16) {
            float f = ((float)(rnd32() % 20001) - 10000.0f) / 977.0f;
            if (i % 97 == 0)
                f = (i % 3) ? -0.0f : NAN;
            if (dt == KERN_F32)
                memcpy((char *)p + 4 * i, &f, 4);
            else {
                uint16_t h = dt == KERN_F16 ? kern_f32_to_f16_one(f)
                                            : kern_f32_to_bf16_one(f);
                memcpy((char *)p + 2 * i, &h, 2);
            }
        } else if (dt == KERN_F64) {
            double d = ((double)(rnd32() % 20001) - 10000.0) / 977.0;
            memcpy((char *)p + 8 * i, &d, 8);
        } else {
            uint64_t v = ((uint64_t)rnd32() << 32) | rnd32();
            memcpy((char *)p + sz * i, &v, sz);
        }
    }
}

static int is_nan_elem(kern_dtype_t dt, const void *p, size_t i)
{
    if (dt == KERN_F32) {
        float f;
        memcpy(&f, (const char *)p + 4 * i, 4);
        return isnan(f);
    }
    if (dt == KERN_F64) {
        double d;
        memcpy(&d, (const char *)p + 8 * i, 8);
        return isnan(d);
    }
    if (dt == KERN_F16 || dt == KERN_BF16) {
        uint16_t h;
        memcpy(&h, (const char *)p + 2 * i, 2);
        return isnan(dt == KERN_F16 ? kern_f16_to_f32_one(h)
                                    : kern_bf16_to_f32_one(h));
    }
    return 0;
}

static void compare(const char *what, kern_dtype_t dt, const void *cpu,
                    const void *gpu, size_t n)
{
    size_t sz = kern_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)cpu + i * sz, (const char *)gpu + i * sz,
                   sz) == 0)
            continue;
        if (is_nan_elem(dt, cpu, i) && is_nan_elem(dt, gpu, i))
            continue;
        printf("MISMATCH %s %s at %zu\n", what, kern_dtype_name(dt), i);
        failures++;
        return;
    }
}

/* Every (dtype, op) and cast on the device against the CPU tables. */
static void check_reductions(void)
{
    const size_t n = 1000003;
    char *ha = malloc(n * 8), *hb = malloc(n * 8), *hc = malloc(n * 8),
         *hg = malloc(n * 8);
    void *da, *db, *dc;
    CHECK(api->dev_malloc(&da, n * 8));
    CHECK(api->dev_malloc(&db, n * 8));
    CHECK(api->dev_malloc(&dc, n * 8));
    for (int dt = 0; dt < KERN_DTYPE_COUNT; dt++) {
        size_t bytes = n * kern_dtype_size((kern_dtype_t)dt);
        fill((kern_dtype_t)dt, ha, n);
        fill((kern_dtype_t)dt, hb, n);
        CHECK(api->memcpy_h2d(da, ha, bytes));
        CHECK(api->memcpy_h2d(db, hb, bytes));
        for (int op = 0; op < KERN_OP_COUNT; op++) {
            char what[64];
            snprintf(what, sizeof(what), "reduce3/%s",
                     kern_op_name((kern_op_t)op));
            CHECK(api->reduce3(dt, op, dc, da, db, n, NULL));
            CHECK(api->memcpy_d2h(hg, dc, bytes));
            kern_reduce3((kern_dtype_t)dt, (kern_op_t)op, hc, ha, hb, n);
            compare(what, (kern_dtype_t)dt, hc, hg, n);
        }
        /* In place, then the average's final scale. */
        CHECK(api->reduce(dt, KERN_AVG, da, db, n, NULL));
        CHECK(api->avg_finish(dt, da, n, 3, NULL));
        CHECK(api->memcpy_d2h(hg, da, bytes));
        kern_reduce((kern_dtype_t)dt, KERN_AVG, ha, hb, n);
        kern_avg_finish((kern_dtype_t)dt, ha, n, 3);
        compare("avg", (kern_dtype_t)dt, ha, hg, n);
    }
    /* Casts and the wire reduction. */
    fill(KERN_F32, ha, n);
    CHECK(api->memcpy_h2d(da, ha, n * 4));
    for (int w = 0; w < 2; w++) {
        kern_dtype_t wdt = w ? KERN_BF16 : KERN_F16;
        CHECK(api->cast(w ? KERN_CUDA_F32_TO_BF16 : KERN_CUDA_F32_TO_F16, db,
                        da, n, NULL));
        CHECK(api->memcpy_d2h(hg, db, n * 2));
        (w ? kern_f32_to_bf16 : kern_f32_to_f16)((uint16_t *)(void *)hc,
                                                 (float *)(void *)ha, n);
        compare("cast_from_f32", wdt, hc, hg, n);
        CHECK(api->cast(w ? KERN_CUDA_BF16_TO_F32 : KERN_CUDA_F16_TO_F32, dc,
                        db, n, NULL));
        CHECK(api->memcpy_d2h(hg, dc, n * 4));
        (w ? kern_bf16_to_f32 : kern_f16_to_f32)((float *)(void *)hb,
                                                 (uint16_t *)(void *)hc, n);
        compare("cast_to_f32", KERN_F32, hb, hg, n);
        for (int op = 0; op < KERN_OP_COUNT; op++) {
            CHECK(api->memcpy_h2d(dc, ha, n * 4));
            CHECK(api->reduce_wire(wdt, op, dc, db, n, NULL));
            CHECK(api->memcpy_d2h(hg, dc, n * 4));
            memcpy(hb, ha, n * 4);
            kern_reduce_wire(wdt, (kern_op_t)op, (float *)(void *)hb, hc, n);
            compare("wire", KERN_F32, hb, hg, n);
        }
    }
    api->dev_free(da);
    api->dev_free(db);
    api->dev_free(dc);
    free(ha);
    free(hb);
    free(hc);
    free(hg);
}

/* Worst relative error of the dense layer's outputs (Y = X W^T + b,
 * dX = dY W, dW = dY^T X, db = column sums of dY) against double. */
static double dense_ref_error(int m, int n, int k, const float *X,
                              const float *W, const float *b,
                              const float *dY, const float *Y,
                              const float *dX, const float *dW,
                              const float *db)
{
    double worst = 0;
#define REL(got, want)                                                       \
    do {                                                                     \
        double e_ = fabs((double)(got) - (want)) / (fabs(want) + 1.0);       \
        if (e_ > worst)                                                      \
            worst = e_;                                                      \
    } while (0)
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = b[j];
            for (int t = 0; t < k; t++)
                s += (double)X[i * k + t] * W[j * k + t];
            REL(Y[i * n + j], s);
        }
    for (int i = 0; i < m; i++)
        for (int t = 0; t < k; t++) {
            double s = 0;
            for (int j = 0; j < n; j++)
                s += (double)dY[i * n + j] * W[j * k + t];
            REL(dX[i * k + t], s);
        }
    for (int j = 0; j < n; j++) {
        double sb = 0;
        for (int t = 0; t < k; t++) {
            double s = 0;
            for (int i = 0; i < m; i++)
                s += (double)dY[i * n + j] * X[i * k + t];
            REL(dW[j * k + t], s);
        }
        for (int i = 0; i < m; i++)
            sb += dY[i * n + j];
        REL(db[j], sb);
    }
#undef REL
    return worst;
}

/* The cuBLAS dense-layer helpers against a double-precision CPU
 * computation; returns the worst relative error. */
static double check_dense(void)
{
    const int m = 67, n = 45, k = 129;
    const size_t f = sizeof(float);
    float *X = malloc(f * m * k), *W = malloc(f * n * k);
    float *b = malloc(f * n), *dY = malloc(f * m * n);
    float *Y = malloc(f * m * n), *dX = malloc(f * m * k);
    float *dW = malloc(f * n * k), *db = malloc(f * n);
    for (int i = 0; i < m * k; i++)
        X[i] = (float)((int)(rnd32() % 2001) - 1000) / 1000.0f;
    for (int i = 0; i < n * k; i++)
        W[i] = (float)((int)(rnd32() % 2001) - 1000) / 1000.0f;
    for (int i = 0; i < n; i++)
        b[i] = (float)i / 10.0f;
    for (int i = 0; i < m * n; i++)
        dY[i] = (float)((int)(rnd32() % 2001) - 1000) / 1000.0f;
    void *h, *dXd, *dWd, *dbd, *dYd, *dXp, *dWp, *dYp, *dbp;
    CHECK(api->blas_create(&h));
    CHECK(api->dev_malloc(&dXd, sizeof(float) * m * k));
    CHECK(api->dev_malloc(&dWd, sizeof(float) * n * k));
    CHECK(api->dev_malloc(&dbd, sizeof(float) * n));
    CHECK(api->dev_malloc(&dYd, sizeof(float) * m * n));
    CHECK(api->dev_malloc(&dXp, sizeof(float) * m * k));
    CHECK(api->dev_malloc(&dWp, sizeof(float) * n * k));
    CHECK(api->dev_malloc(&dYp, sizeof(float) * m * n));
    CHECK(api->dev_malloc(&dbp, sizeof(float) * n));
    CHECK(api->memcpy_h2d(dXd, X, sizeof(float) * m * k));
    CHECK(api->memcpy_h2d(dWd, W, sizeof(float) * n * k));
    CHECK(api->memcpy_h2d(dbd, b, sizeof(float) * n));
    CHECK(api->memcpy_h2d(dYp, dY, sizeof(float) * m * n));
    CHECK(api->dense_forward(h, m, n, k, dXd, dWd, dbd, dYd));
    CHECK(api->dense_backward(h, m, n, k, dXd, dWd, dYp, dXp, dWp, dbp));
    CHECK(api->memcpy_d2h(Y, dYd, sizeof(float) * m * n));
    CHECK(api->memcpy_d2h(dX, dXp, sizeof(float) * m * k));
    CHECK(api->memcpy_d2h(dW, dWp, sizeof(float) * n * k));
    CHECK(api->memcpy_d2h(db, dbp, sizeof(float) * n));
    double worst = dense_ref_error(m, n, k, X, W, b, dY, Y, dX, dW, db);
    /* axpy/scal: y = 2*(y + 0.5 x) */
    CHECK(api->axpy(h, n, 0.5f, dbd, dbp));
    CHECK(api->scal(h, n, 2.0f, dbp));
    float *y2 = malloc(sizeof(float) * n);
    CHECK(api->memcpy_d2h(y2, dbp, sizeof(float) * n));
    for (int j = 0; j < n; j++) {
        double want = 2.0 * ((double)db[j] + 0.5 * b[j]);
        double e = fabs((double)y2[j] - want) / (fabs(want) + 1.0);
        worst = e > worst ? e : worst;
    }
    printf("# dense layer max relative error %.2e\n", worst);
    if (worst > 1e-4) {
        printf("MISMATCH dense helpers (%.2e)\n", worst);
        failures++;
    }
    api->blas_destroy(h);
    void *all[] = {dXd, dWd, dbd, dYd, dXp, dWp, dYp, dbp};
    for (int i = 0; i < 8; i++)
        api->dev_free(all[i]);
    free(X), free(W), free(b), free(dY), free(Y), free(dX), free(dW),
        free(db), free(y2);
    return worst;
}

int gpu_compare_kernels(const kern_cuda_api_t *a)
{
    api = a;
    failures = 0;
    check_reductions();
    return failures;
}

int gpu_compare_blas(const kern_cuda_api_t *a, double *worst_p)
{
    api = a;
    failures = 0;
    double worst = check_dense();
    if (worst_p != NULL)
        *worst_p = worst;
    return failures;
}
