/*
 * The GPU library is optional: without it (or without a driver or device)
 * kern_gpu_open() must fail with ST_ENOTSUP after exactly one log line,
 * and the CPU kernels must work. With a GPU, the device result must match
 * the CPU one (tests/gpu/run.sh checks far more on a GPU machine).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kern.h"
#include "kernels/kern_gpu.h"
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
 * The library built by this tree (if CUDA was built): on a machine without
 * a GPU it loads, finds no device, says so once and returns ST_ENOTSUP;
 * with a GPU, a sum on the device equals the CPU sum bit for bit.
 */
TEST_IMPL(kern_gpu_built_library)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/libringd_cuda.so", th_bindir());
    if (access(path, R_OK) != 0)
        return TEST_SKIP; /* built with CUDA=0 */
    kern_gpu_t *g = NULL;
    char log[4096];
    int rc = open_captured(path, &g, log, sizeof(log));
    ASSERT_EQ(count_lines(log), 1);
    if (rc == ST_ENOTSUP) {
        ASSERT(strstr(log, "using CPU kernels") != NULL);
        float a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
        ASSERT_OK(kern_reduce(KERN_F32, KERN_SUM, a, b, 3));
        ASSERT(a[0] == 5 && a[1] == 7 && a[2] == 9);
        return 0;
    }
    ASSERT_OK(rc);
    const kern_cuda_api_t *api = kern_gpu_api(g);
    ASSERT(kern_gpu_device_count(g) >= 1);
    enum { N = 100003 };
    float *ha = malloc(N * 4), *hb = malloc(N * 4), *hr = malloc(N * 4);
    ASSERT(ha && hb && hr);
    for (int i = 0; i < N; i++) {
        ha[i] = (float)i * 0.25f - 7.0f;
        hb[i] = 1.0f / (float)(i + 1);
    }
    void *da, *db;
    ASSERT_OK(api->dev_malloc(&da, N * 4));
    ASSERT_OK(api->dev_malloc(&db, N * 4));
    ASSERT_OK(api->memcpy_h2d(da, ha, N * 4));
    ASSERT_OK(api->memcpy_h2d(db, hb, N * 4));
    ASSERT_OK(api->reduce(KERN_F32, KERN_SUM, da, db, N, NULL));
    ASSERT_OK(api->memcpy_d2h(hr, da, N * 4));
    ASSERT_OK(kern_reduce(KERN_F32, KERN_SUM, ha, hb, N));
    ASSERT(memcmp(ha, hr, N * 4) == 0);
    api->dev_free(da);
    api->dev_free(db);
    free(ha);
    free(hb);
    free(hr);
    kern_gpu_close(g);
    return 0;
}
