/*
 * kern_cuda-int.h - shared between the .cu files of libringd_cuda.so.
 */
#ifndef RINGD_KERN_CUDA_INT_H
#define RINGD_KERN_CUDA_INT_H

#include <cuda_runtime.h>

#include "common/status.h"
#include "kernels/cuda/kern_cuda_api.h"

/* Remember a message for last_error(); returns rc for tail calls. */
int kern_cuda__fail(int rc, const char *what, const char *detail);

#define KC_CHECK(call)                                                       \
    do {                                                                     \
        cudaError_t e_ = (call);                                             \
        if (e_ != cudaSuccess)                                               \
            return kern_cuda__fail(ST_ENOTSUP, #call,                        \
                                   cudaGetErrorString(e_));                  \
    } while (0)

/* A grid for a grid-stride loop over n elements. */
static inline unsigned kern_cuda__blocks(size_t n)
{
    size_t b = (n + 255) / 256;
    if (b > 8192)
        b = 8192;
    return b ? (unsigned)b : 1u;
}

extern "C" {
int kern_cuda__blas_create(void **handle_p);
void kern_cuda__blas_destroy(void *handle);
int kern_cuda__dense_forward(void *handle, int m, int n, int k,
                             const float *X, const float *W, const float *b,
                             float *Y);
int kern_cuda__dense_backward(void *handle, int m, int n, int k,
                              const float *X, const float *W, const float *dY,
                              float *dX, float *dW, float *db);
int kern_cuda__axpy(void *handle, int n, float alpha, const float *x,
                    float *y);
int kern_cuda__scal(void *handle, int n, float alpha, float *x);
}

#endif /* RINGD_KERN_CUDA_INT_H */
