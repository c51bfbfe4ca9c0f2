/*
 * gpu_check - the CUDA kernels against the CPU kernels, on a real GPU.
 *
 * Every (dtype, op) reduce3 and reduce, avg_finish, the four casts and the
 * wire reductions run on the device and must match the CPU tables bit for
 * bit (any NaN matches any NaN); the dense layer forward/backward helpers
 * must match a double-precision CPU computation within 1e-4 relative. Then
 * a TSV table of device bandwidth next to a device-to-device copy:
 *   kernel  dtype  bytes  GBps  d2d_GBps  ratio
 * (bytes read + written, like bench/kernels). Exit 0 all good, 1 a
 * mismatch, 77 no GPU. Built and run by tests/gpu/run.sh; the checks
 * themselves are tests/gpu/gpu-compare.c, which the suite's kern_gpu_*
 * tests run too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/kern.h"
#include "kernels/kern_gpu.h"
#include "tests/gpu/gpu-compare.h"

static const kern_cuda_api_t *api;
static int failures;

#define CHECK(call)                                                          \
    do {                                                                     \
        int rc_ = (call);                                                    \
        if (rc_ != 0) {                                                      \
            fprintf(stderr, "%s:%d %s failed: %s\n", __FILE__, __LINE__,    \
                    #call, api->last_error());                               \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void bandwidth(void)
{
    const size_t bytes = 1ull << 30, n = bytes / 4;
    void *a, *b, *c;
    CHECK(api->dev_malloc(&a, bytes));
    CHECK(api->dev_malloc(&b, bytes));
    CHECK(api->dev_malloc(&c, bytes));
    char *zero = calloc(1, bytes);
    CHECK(api->memcpy_h2d(a, zero, bytes));
    CHECK(api->memcpy_h2d(b, zero, bytes));
    free(zero);
    printf("kernel\tdtype\tbytes\tGBps\td2d_GBps\tratio\n");
    const int reps = 10;
    double d2d = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        CHECK(api->memcpy_d2d(c, a, bytes, NULL));
        CHECK(api->synchronize(NULL));
        if (r > 0 && now_s() - t0 < d2d)
            d2d = now_s() - t0;
    }
    double d2d_gbps = 2.0 * (double)bytes / d2d / 1e9;
    static const kern_dtype_t dts[] = {KERN_F32, KERN_BF16, KERN_F16,
                                       KERN_F64, KERN_I32};
    for (size_t i = 0; i < sizeof(dts) / sizeof(dts[0]); i++) {
        size_t cnt = bytes / kern_dtype_size(dts[i]);
        double best = 1e30;
        for (int r = 0; r < reps + 1; r++) {
            double t0 = now_s();
            CHECK(api->reduce(dts[i], KERN_SUM, a, b, cnt, NULL));
            CHECK(api->synchronize(NULL));
            if (r > 0 && now_s() - t0 < best)
                best = now_s() - t0;
        }
        double g = 3.0 * (double)bytes / best / 1e9;
        printf("sum\t%s\t%zu\t%.1f\t%.1f\t%.3f\n", kern_dtype_name(dts[i]),
               bytes, g, d2d_gbps, g / d2d_gbps);
    }
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        CHECK(api->cast(KERN_CUDA_F32_TO_BF16, c, a, n, NULL));
        CHECK(api->synchronize(NULL));
        if (r > 0 && now_s() - t0 < best)
            best = now_s() - t0;
    }
    double g = 1.5 * (double)bytes / best / 1e9;
    printf("cast_f32_to_bf16\tf32\t%zu\t%.1f\t%.1f\t%.3f\n", bytes, g,
           d2d_gbps, g / d2d_gbps);
    best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        CHECK(api->reduce_wire(KERN_BF16, KERN_SUM, a, c, n, NULL));
        CHECK(api->synchronize(NULL));
        if (r > 0 && now_s() - t0 < best)
            best = now_s() - t0;
    }
    g = 2.5 * (double)bytes / best / 1e9;
    printf("wire_bf16_sum\tf32\t%zu\t%.1f\t%.1f\t%.3f\n", bytes, g, d2d_gbps,
           g / d2d_gbps);
    api->dev_free(a);
    api->dev_free(b);
    api->dev_free(c);
}

int main(int argc, char **argv)
{
    kern_gpu_t *gpu = NULL;
    if (kern_gpu_open(argc > 1 ? argv[1] : NULL, &gpu) != 0) {
        printf("gpu_check: no usable GPU here; skipped\n");
        return 77;
    }
    api = kern_gpu_api(gpu);
    printf("# gpu_check on %s\n", kern_gpu_describe(gpu));
    failures += gpu_compare_kernels(api);
    failures += gpu_compare_blas(api, NULL);
    bandwidth();
    printf("gpu_check: %s (%d mismatches)\n", failures ? "FAIL" : "ok",
           failures);
    kern_gpu_close(gpu);
    return failures ? 1 : 0;
}
