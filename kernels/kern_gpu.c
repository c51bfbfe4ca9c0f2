/*
 * kern_gpu.c - finds and loads libringd_cuda.so, or says in one line why
 * the CPU kernels will be used instead.
 */
#include "kernels/kern_gpu.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"

#define CUDA_LIB_NAME "libringd_cuda.so"

struct kern_gpu {
    void *dl;
    const kern_cuda_api_t *api;
    int ndev;
    char desc[256];
};

/* dlopen the first candidate that loads; keep the first error for the log. */
static void *load_library(const char *path, char *err, size_t errlen)
{
    char exe_dir[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", exe_dir, sizeof(exe_dir) - 1);
    if (n > 0) {
        exe_dir[n] = '\0';
        char *slash = strrchr(exe_dir, '/');
        if (slash)
            *slash = '\0';
    }
    char beside[PATH_MAX + sizeof(CUDA_LIB_NAME) + 2];
    snprintf(beside, sizeof(beside), "%s/%s", exe_dir, CUDA_LIB_NAME);

    const char *candidates[3];
    int nc = 0;
    if (path != NULL) {
        candidates[nc++] = path;
    } else {
        const char *env = getenv("RINGD_CUDA_LIB");
        if (env != NULL && env[0] != '\0') {
            candidates[nc++] = env;
        } else {
            candidates[nc++] = CUDA_LIB_NAME;
            if (exe_dir[0] != '\0')
                candidates[nc++] = beside;
        }
    }

    err[0] = '\0';
    for (int i = 0; i < nc; i++) {
        void *dl = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (dl != NULL)
            return dl;
        const char *e = dlerror();
        /* A library that exists but fails to load says more than
         * "not found" for the other candidates, so prefer that message. */
        if (err[0] == '\0' || (e && !strstr(e, CUDA_LIB_NAME ": cannot open")))
            snprintf(err, errlen, "%s", e ? e : "unknown dlopen error");
    }
    return NULL;
}

int kern_gpu_open(const char *path, kern_gpu_t **gpu_p)
{
    char err[512];
    void *dl = load_library(path, err, sizeof(err));
    if (dl == NULL) {
        RD_INFO("kernels: no GPU kernels (%s); using CPU kernels", err);
        return ST_ENOTSUP;
    }

    kern_cuda_get_api_fn get =
        (kern_cuda_get_api_fn)dlsym(dl, "kern_cuda_get_api");
    const kern_cuda_api_t *api = get ? get() : NULL;
    if (api == NULL || api->abi_version != KERN_CUDA_ABI_VERSION ||
        api->struct_size < sizeof(kern_cuda_api_t)) {
        RD_WARN("kernels: %s has no compatible kern_cuda_get_api (ABI %u "
                "wanted); using CPU kernels", CUDA_LIB_NAME,
                KERN_CUDA_ABI_VERSION);
        dlclose(dl);
        return ST_ENOTSUP;
    }

    /* From the first call into the library on, the CUDA runtime may have
     * registered exit handlers inside it: it stays loaded even on failure
     * (a few MB of mappings, once per process). */
    int ndev = 0;
    if (api->device_count(&ndev) != 0 || ndev <= 0) {
        const char *why = api->last_error();
        RD_INFO("kernels: no usable CUDA device (%s); using CPU kernels",
                why[0] != '\0' ? why : "0 devices");
        return ST_ENOTSUP;
    }
    if (api->init(0) != 0) {
        RD_WARN("kernels: CUDA device 0 failed to initialise (%s); using "
                "CPU kernels", api->last_error());
        return ST_ENOTSUP;
    }

    kern_gpu_t *gpu = calloc(1, sizeof(*gpu));
    if (gpu == NULL)
        return ST_ENOMEM;
    gpu->dl = dl;
    gpu->api = api;
    gpu->ndev = ndev;
    if (api->describe(0, gpu->desc, sizeof(gpu->desc)) != 0)
        snprintf(gpu->desc, sizeof(gpu->desc), "CUDA device 0");
    RD_INFO("kernels: GPU kernels on %s (%d device%s)", gpu->desc, ndev,
            ndev == 1 ? "" : "s");
    *gpu_p = gpu;
    return 0;
}

void kern_gpu_close(kern_gpu_t *gpu)
{
    if (gpu == NULL)
        return;
    /* The CUDA runtime registers atexit handlers inside the library, so it
     * must stay mapped until exit: dlclose would leave them dangling. */
    free(gpu);
}

const kern_cuda_api_t *kern_gpu_api(const kern_gpu_t *gpu)
{
    return gpu->api;
}

int kern_gpu_device_count(const kern_gpu_t *gpu)
{
    return gpu->ndev;
}

const char *kern_gpu_describe(const kern_gpu_t *gpu)
{
    return gpu->desc;
}
