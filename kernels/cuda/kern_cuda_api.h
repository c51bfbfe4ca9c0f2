/*
 * kern_cuda_api.h - the C ABI between ringd and libringd_cuda.so.
 *
 * The library exports one symbol, kern_cuda_get_api(), returning a table of
 * function pointers. ringd loads it with dlopen (kernels/kern_gpu.c) and
 * never links libcudart or cuBLAS itself, so CPU-only hosts run without any
 * CUDA library installed.
 *
 * Conventions: every function returns 0 or a negative ST_* code and, on
 * error, leaves a message for last_error(). dtype/op values are those of
 * kern_dtype_t/kern_op_t. Pointers are device pointers unless named h_*.
 * stream is a cudaStream_t (NULL = default stream); calls are asynchronous
 * on it except the memory copies to/from the host, which synchronise.
 * Dense-layer matrices are row-major: X[m x k] (batch x in), W[n x k]
 * (out x in), b[n], Y[m x n].
 */
#ifndef RINGD_KERN_CUDA_API_H
#define RINGD_KERN_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KERN_CUDA_ABI_VERSION 1

enum {
    KERN_CUDA_F32_TO_F16 = 0,
    KERN_CUDA_F16_TO_F32 = 1,
    KERN_CUDA_F32_TO_BF16 = 2,
    KERN_CUDA_BF16_TO_F32 = 3,
};

typedef struct kern_cuda_api {
    uint32_t abi_version;
    uint32_t struct_size;

    /* Devices visible; 0 (and an error) without a driver. */
    int (*device_count)(int *count_p);
    /* Select a device and create the context. */
    int (*init)(int device);
    const char *(*last_error)(void);
    /* Device name and memory, for logs. */
    int (*describe)(int device, char *buf, size_t len);

    int (*dev_malloc)(void **ptr_p, size_t bytes);
    void (*dev_free)(void *ptr);
    int (*memcpy_h2d)(void *dst, const void *h_src, size_t bytes);
    int (*memcpy_d2h)(void *h_dst, const void *src, size_t bytes);
    int (*memcpy_d2d)(void *dst, const void *src, size_t bytes, void *stream);
    int (*synchronize)(void *stream);

    /* dst = dst op src / dst = a op b, as kern_reduce/kern_reduce3. */
    int (*reduce)(int dtype, int op, void *dst, const void *src, size_t n,
                  void *stream);
    int (*reduce3)(int dtype, int op, void *dst, const void *a,
                   const void *b, size_t n, void *stream);
    int (*avg_finish)(int dtype, void *buf, size_t n, uint32_t nranks,
                      void *stream);
    /* kind: KERN_CUDA_F32_TO_F16, ... */
    int (*cast)(int kind, void *dst, const void *src, size_t n,
                void *stream);
    /* acc (f32) = acc op wire (f16 or bf16, by wire_dtype). */
    int (*reduce_wire)(int wire_dtype, int op, float *acc, const void *wire,
                       size_t n, void *stream);

    /* cuBLAS: a handle per thread of use. */
    int (*blas_create)(void **handle_p);
    void (*blas_destroy)(void *handle);
    /* Y = X W^T + b */
    int (*dense_forward)(void *handle, int m, int n, int k, const float *X,
                         const float *W, const float *b, float *Y);
    /* dX = dY W, dW = dY^T X, db = column sums of dY; dX may be NULL. */
    int (*dense_backward)(void *handle, int m, int n, int k, const float *X,
                          const float *W, const float *dY, float *dX,
                          float *dW, float *db);
    /* y += alpha x;  x *= alpha */
    int (*axpy)(void *handle, int n, float alpha, const float *x, float *y);
    int (*scal)(void *handle, int n, float alpha, float *x);
} kern_cuda_api_t;

typedef const kern_cuda_api_t *(*kern_cuda_get_api_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* RINGD_KERN_CUDA_API_H */
