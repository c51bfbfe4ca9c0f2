/*
 * kern_cuda_blas.cu - cuBLAS helpers for the example trainer: a dense
 * layer's forward and backward pass and the optimizer's axpy/scal.
 *
 * Matrices are row-major (as the C trainer keeps them); cuBLAS is
 * column-major, so each row-major product is computed as its transpose:
 * Y = X W^T (m x n) is, column-major, Y^T = W X^T, i.e. gemm(T, N) on the
 * buffers as they are. Comments on each call give the mapping.
 */
#include <cublas_v2.h>

#include "kernels/cuda/kern_cuda-int.h"

#define CB_CHECK(call)                                                       \
    do {                                                                     \
        cublasStatus_t s_ = (call);                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                     \
            return kern_cuda__fail(ST_ENOTSUP, #call,                        \
                                   cublasGetStatusString(s_));               \
    } while (0)

int kern_cuda__blas_create(void **handle_p)
{
    cublasHandle_t h;
    CB_CHECK(cublasCreate(&h));
    /* Bitwise-reproducible results across runs: no split-K atomics. */
    CB_CHECK(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED));
    *handle_p = h;
    return 0;
}

void kern_cuda__blas_destroy(void *handle)
{
    if (handle != NULL)
        cublasDestroy((cublasHandle_t)handle);
}

/* Y[i][j] += b[j] */
__global__ static void k_add_bias(float *Y, const float *b, int m, int n)
{
    size_t total = (size_t)m * n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)blockDim.x * gridDim.x)
        Y[i] += b[i % n];
}

/* db[j] = sum_i dY[i][j]; one thread per column, fixed order. */
__global__ static void k_col_sums(const float *dY, float *db, int m, int n)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n)
        return;
    float s = 0;
    for (int i = 0; i < m; i++)
        s += dY[(size_t)i * n + j];
    db[j] = s;
}

int kern_cuda__dense_forward(void *handle, int m, int n, int k,
                             const float *X, const float *W, const float *b,
                             float *Y)
{
    cublasHandle_t h = (cublasHandle_t)handle;
    const float one = 1.0f, zero = 0.0f;
    /* Y^T (n x m) = W (k x n col-major, transposed) * X^T (k x m). */
    CB_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, W, k, X,
                         k, &zero, Y, n));
    if (b != NULL) {
        cudaStream_t s;
        CB_CHECK(cublasGetStream(h, &s));
        k_add_bias<<<kern_cuda__blocks((size_t)m * n), 256, 0, s>>>(Y, b, m,
                                                                    n);
        KC_CHECK(cudaGetLastError());
    }
    return 0;
}

int kern_cuda__dense_backward(void *handle, int m, int n, int k,
                              const float *X, const float *W, const float *dY,
                              float *dX, float *dW, float *db)
{
    cublasHandle_t h = (cublasHandle_t)handle;
    const float one = 1.0f, zero = 0.0f;
    if (dX != NULL) /* dX^T (k x m) = W^T-as-stored (k x n) * dY^T (n x m) */
        CB_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, &one, W, k,
                             dY, n, &zero, dX, k));
    /* dW^T (k x n) = X^T (k x m) * dY (m x n, i.e. dY^T transposed) */
    CB_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, &one, X, k, dY,
                         n, &zero, dW, k));
    if (db != NULL) {
        cudaStream_t s;
        CB_CHECK(cublasGetStream(h, &s));
        k_col_sums<<<(n + 127) / 128, 128, 0, s>>>(dY, db, m, n);
        KC_CHECK(cudaGetLastError());
    }
    return 0;
}

int kern_cuda__axpy(void *handle, int n, float alpha, const float *x,
                    float *y)
{
    CB_CHECK(cublasSaxpy((cublasHandle_t)handle, n, &alpha, x, 1, y, 1));
    return 0;
}

int kern_cuda__scal(void *handle, int n, float alpha, float *x)
{
    CB_CHECK(cublasSscal((cublasHandle_t)handle, n, &alpha, x, 1));
    return 0;
}
