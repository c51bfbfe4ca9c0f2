/*
 * kern_gpu.h - optional GPU kernels, loaded at run time.
 *
 * kern_gpu_open() dlopens libringd_cuda.so and checks that a CUDA device is
 * usable. When the library, its CUDA dependencies, the driver or a device is
 * missing it logs exactly one line saying which, and returns ST_ENOTSUP: the
 * caller carries on with the CPU kernels of kern.h.
 *
 * Library search order: the path argument; $RINGD_CUDA_LIB; the dynamic
 * linker's path ("libringd_cuda.so"); the running executable's directory.
 */
#ifndef RINGD_KERN_GPU_H
#define RINGD_KERN_GPU_H

#include "kernels/cuda/kern_cuda_api.h"

typedef struct kern_gpu kern_gpu_t;

/* On success *gpu_p owns the loaded library; device 0 is initialised. */
int kern_gpu_open(const char *path, kern_gpu_t **gpu_p);
/* Accepts NULL. Unloads the library. */
void kern_gpu_close(kern_gpu_t *gpu);
/* The function table; valid until kern_gpu_close(). */
const kern_cuda_api_t *kern_gpu_api(const kern_gpu_t *gpu);
int kern_gpu_device_count(const kern_gpu_t *gpu);
/* Human-readable: "NVIDIA H200, 139 GiB" or the like. */
const char *kern_gpu_describe(const kern_gpu_t *gpu);

#endif /* RINGD_KERN_GPU_H */
