/*
 * The GPU library is optional: without it (or without a driver or device)
 * kern_gpu_open() must fail with ST_ENOTSUP after exactly one log line,
 * and the CPU kernels must work. With a GPU, every device kernel must
 * match the CPU one bit for bit and the cuBLAS helpers a double-precision
 * reference (tests/gpu/gpu-compare.c); without one those tests report
 * SKIP with the reason. tests/gpu/run.sh runs them on a GPU machine.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kern.h"
#include "kernels/kern_gpu.h"
#include "tests/gpu/gpu-compare.h"
#include "tests/helpers.h"
#include "tests/task.h"

/* Run kern_gpu_open with stderr captured; returns rc, fills log. */
static int open_captured(const char *path, kern_gpu_t **gpu_p, char *log,
                         size_t len)
{
    char tmpl[] = "/tmp/ringd-gpulog.XXXXXX";
    int fd = mkstemp(tmpl);
    ASSERT(fd >= 0);
    unlink(tmpl);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    int rc = kern_gpu_open(path, gpu_p);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, log, len - 1, 0);
    log[n > 0 ? n : 0] = '\0';
    close(fd);
    return rc;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

TEST_IMPL(kern_gpu_missing_library)
{
    kern_gpu_t *g = NULL;
    char log[4096];
    int rc = open_captured("/nonexistent/libringd_cuda.so", &g, log,
                           sizeof(log));
    ASSERT_EQ(rc, ST_ENOTSUP);
    ASSERT(g == NULL);
    ASSERT_EQ(count_lines(log), 1);
    ASSERT(strstr(log, "using CPU kernels") != NULL);
    ASSERT(strstr(log, "/nonexistent/libringd_cuda.so") != NULL);
    kern_gpu_close(NULL);
    return 0;
}

TEST_IMPL(kern_gpu_not_a_library)
{
    char *dir = th_mkdtemp("ringd-gpu");
    ASSERT(dir != NULL);
    char path[512];
    snprintf(path, sizeof(path), "%s/libringd_cuda.so", dir);
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs("this is not an ELF file\n", f);
    fclose(f);
    kern_gpu_t *g = NULL;
    char log[4096];
    int rc = open_captured(path, &g, log, sizeof(log));
    th_rmtree(dir);
    free(dir);
    ASSERT_EQ(rc, ST_ENOTSUP);
    ASSERT_EQ(count_lines(log), 1);
    return 0;
}

/*
 * Open the library this tree built. Returns 0 with *gpu_p, or TEST_SKIP
 * with the reason in why: built with CUDA=0, or (after checking the CPU
 * fallback's one log line) no usable GPU here.
 */
static int open_built(kern_gpu_t **gpu_p, char *why, size_t why_len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/libringd_cuda.so", th_bindir());
    if (access(path, R_OK) != 0) {
        snprintf(why, why_len, "built with CUDA=0: no libringd_cuda.so "
                 "next to the tests");
        return TEST_SKIP;
    }
    kern_gpu_t *g = NULL;
    char log[4096];
    int rc = open_captured(path, &g, log, sizeof(log));
    ASSERT_EQ(count_lines(log), 1);
    if (rc == ST_ENOTSUP) {
        ASSERT(g == NULL);
        ASSERT(strstr(log, "using CPU kernels") != NULL);
        /* The reason is kern_gpu_open's own line, past its prefix. */
        const char *msg = strstr(log, "kernels: ");
        msg = msg != NULL ? msg + strlen("kernels: ") : log;
        snprintf(why, why_len, "%.*s", (int)strcspn(msg, "\n"), msg);
        return TEST_SKIP;
    }
    ASSERT_OK(rc);
    ASSERT(kern_gpu_device_count(g) >= 1);
    *gpu_p = g;
    return 0;
}

/*
 * The library built by this tree (if CUDA was built): on a machine without
 * a GPU it loads, finds no device, says so in one line and returns
 * ST_ENOTSUP, and the CPU kernels carry on; that is a SKIP (with the
 * line as the reason), not a pass: nothing ran on a GPU. With a GPU it
 * opens and describes a device.
 */
TEST_IMPL(kern_gpu_built_library)
{
    kern_gpu_t *g = NULL;
    char why[256];
    if (open_built(&g, why, sizeof(why)) == TEST_SKIP) {
        float a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
        ASSERT_OK(kern_reduce(KERN_F32, KERN_SUM, a, b, 3));
        ASSERT(a[0] == 5 && a[1] == 7 && a[2] == 9);
        TEST_SKIP_WHY("%s", why);
    }
    const char *d = kern_gpu_describe(g);
    ASSERT(d != NULL && d[0] != '\0');
    fprintf(stderr, "GPU: %s\n", d);
    kern_gpu_close(g);
    return 0;
}

/* Every CUDA kernel equals its CPU kernel bit for bit (a GPU only). */
TEST_IMPL(kern_gpu_kernels_bitwise)
{
    kern_gpu_t *g = NULL;
    char why[256];
    if (open_built(&g, why, sizeof(why)) == TEST_SKIP)
        TEST_SKIP_WHY("%s", why);
    ASSERT_EQ(gpu_compare_kernels(kern_gpu_api(g)), 0);
    kern_gpu_close(g);
    return 0;
}

/* The cuBLAS helpers match a double-precision CPU computation (a GPU
 * only). */
TEST_IMPL(kern_gpu_blas_helpers)
{
    kern_gpu_t *g = NULL;
    char why[256];
    if (open_built(&g, why, sizeof(why)) == TEST_SKIP)
        TEST_SKIP_WHY("%s", why);
    double worst = 0;
    ASSERT_EQ(gpu_compare_blas(kern_gpu_api(g), &worst), 0);
    fprintf(stderr, "dense helpers: worst relative error %.2e\n", worst);
    kern_gpu_close(g);
    return 0;
}

/* ---- the comparison itself, on a stand-in device ----------------------
 *
 * The GPU tests above run only where a GPU exists, so the comparison is
 * checked here on every machine: a function table whose "device" is host
 * memory and whose kernels are the CPU ones must pass it, and one wrong
 * bit in one kernel, or a dense helper off by 1e-3, must not.
 */
static int fake_wrong_reduce3; /* flip the low bit of one f32 sum */
static float fake_dense_scale = 1.0f;

static int fake_count(int *count_p) { *count_p = 1; return 0; }
static const char *fake_error(void) { return "fake"; }
static int fake_malloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    return *p != NULL ? 0 : ST_ENOMEM;
}
static void fake_free(void *p) { free(p); }
static int fake_copy(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return 0;
}
static int fake_reduce(int dt, int op, void *dst, const void *src, size_t n,
                       void *stream)
{
    (void)stream;
    return kern_reduce((kern_dtype_t)dt, (kern_op_t)op, dst, src, n);
}
static int fake_reduce3(int dt, int op, void *dst, const void *a,
                        const void *b, size_t n, void *stream)
{
    (void)stream;
    int rc = kern_reduce3((kern_dtype_t)dt, (kern_op_t)op, dst, a, b, n);
    if (fake_wrong_reduce3 && dt == KERN_F32 && op == KERN_SUM && n > 1)
        ((uint32_t *)dst)[n / 2] ^= 1;
    return rc;
}
static int fake_avg_finish(int dt, void *buf, size_t n, uint32_t nranks,
                           void *stream)
{
    (void)stream;
    return kern_avg_finish((kern_dtype_t)dt, buf, n, nranks);
}
static int fake_cast(int kind, void *dst, const void *src, size_t n,
                     void *stream)
{
    (void)stream;
    if (kind == KERN_CUDA_F32_TO_F16)
        kern_f32_to_f16(dst, src, n);
    else if (kind == KERN_CUDA_F16_TO_F32)
        kern_f16_to_f32(dst, src, n);
    else if (kind == KERN_CUDA_F32_TO_BF16)
        kern_f32_to_bf16(dst, src, n);
    else
        kern_bf16_to_f32(dst, src, n);
    return 0;
}
static int fake_wire(int wdt, int op, float *acc, const void *wire, size_t n,
                     void *stream)
{
    (void)stream;
    return kern_reduce_wire((kern_dtype_t)wdt, (kern_op_t)op, acc, wire, n);
}
static int fake_blas_create(void **h) { *h = &fake_dense_scale; return 0; }
static void fake_blas_destroy(void *h) { (void)h; }
static int fake_forward(void *h, int m, int n, int k, const float *X,
                        const float *W, const float *b, float *Y)
{
    (void)h;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = b[j];
            for (int t = 0; t < k; t++)
                s += (double)X[i * k + t] * W[j * k + t];
            Y[i * n + j] = (float)s * fake_dense_scale;
        }
    return 0;
}
static int fake_backward(void *h, int m, int n, int k, const float *X,
                         const float *W, const float *dY, float *dX,
                         float *dW, float *db)
{
    (void)h;
    for (int i = 0; dX != NULL && i < m; i++)
        for (int t = 0; t < k; t++) {
            double s = 0;
            for (int j = 0; j < n; j++)
                s += (double)dY[i * n + j] * W[j * k + t];
            dX[i * k + t] = (float)s;
        }
    for (int j = 0; j < n; j++) {
        for (int t = 0; t < k; t++) {
            double s = 0;
            for (int i = 0; i < m; i++)
                s += (double)dY[i * n + j] * X[i * k + t];
            dW[j * k + t] = (float)s;
        }
        double s = 0;
        for (int i = 0; i < m; i++)
            s += dY[i * n + j];
        db[j] = (float)s;
    }
    return 0;
}
static int fake_axpy(void *h, int n, float alpha, const float *x, float *y)
{
    (void)h;
    for (int i = 0; i < n; i++)
        y[i] += alpha * x[i];
    return 0;
}
static int fake_scal(void *h, int n, float alpha, float *x)
{
    (void)h;
    for (int i = 0; i < n; i++)
        x[i] *= alpha;
    return 0;
}
static int fake_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)stream;
    return fake_copy(dst, src, bytes);
}
static int fake_sync(void *stream) { (void)stream; return 0; }

static const kern_cuda_api_t fake_api = {
    .abi_version = KERN_CUDA_ABI_VERSION,
    .struct_size = sizeof(kern_cuda_api_t),
    .device_count = fake_count,
    .last_error = fake_error,
    .dev_malloc = fake_malloc,
    .dev_free = fake_free,
    .memcpy_h2d = fake_copy,
    .memcpy_d2h = fake_copy,
    .memcpy_d2d = fake_d2d,
    .synchronize = fake_sync,
    .reduce = fake_reduce,
    .reduce3 = fake_reduce3,
    .avg_finish = fake_avg_finish,
    .cast = fake_cast,
    .reduce_wire = fake_wire,
    .blas_create = fake_blas_create,
    .blas_destroy = fake_blas_destroy,
    .dense_forward = fake_forward,
    .dense_backward = fake_backward,
    .axpy = fake_axpy,
    .scal = fake_scal,
};

TEST_IMPL(kern_gpu_compare_catches)
{
    ASSERT_EQ(gpu_compare_kernels(&fake_api), 0);
    ASSERT_EQ(gpu_compare_blas(&fake_api, NULL), 0);
    fake_wrong_reduce3 = 1;
    ASSERT_EQ(gpu_compare_kernels(&fake_api), 1);
    fake_wrong_reduce3 = 0;
    fake_dense_scale = 1.001f;
    double worst = 0;
    ASSERT_EQ(gpu_compare_blas(&fake_api, &worst), 1);
    ASSERT(worst > 1e-4);
    return 0;
}
