/*
 * kern_cuda.cu - the GPU side of kernels/: the same reductions, casts and
 * wire reduction as the CPU tables, with the same semantics (f16/bf16
 * computed in f32 and rounded once to nearest even, IEEE 754-2019
 * min/max, wrapping integers), plus device management and the exported
 * function table (kern_cuda_get_api).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdio.h>

#include "kernels/cuda/kern_cuda-int.h"
#include "kernels/kern-ieee.h"

enum { DT_F32, DT_F64, DT_F16, DT_BF16, DT_I32, DT_I64, DT_U8 };
enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_AVG };

static thread_local char last_err[512];

int kern_cuda__fail(int rc, const char *what, const char *detail)
{
    snprintf(last_err, sizeof(last_err), "%s: %s", what, detail);
    return rc;
}

static const char *kc_last_error(void)
{
    return last_err;
}

/* ---- element types: load as the compute type, store with one rounding */

template <typename T> struct ty {
    typedef T C;
    static __device__ C ld(T x) { return x; }
    static __device__ T st(C x) { return x; }
};
template <> struct ty<__half> {
    typedef float C;
    static __device__ float ld(__half x) { return __half2float(x); }
    static __device__ __half st(float x) { return __float2half_rn(x); }
};
template <> struct ty<__nv_bfloat16> {
    typedef float C;
    static __device__ float ld(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __nv_bfloat16 st(float x)
    {
        return __float2bfloat16_rn(x);
    }
};

/* ---- operations ------------------------------------------------------ */

template <typename C> __device__ C op_add(C a, C b) { return a + b; }
template <typename C> __device__ C op_mul(C a, C b) { return a * b; }
/* Integers wrap: compute in the unsigned type. */
template <> __device__ int32_t op_add(int32_t a, int32_t b)
{
    return (int32_t)((uint32_t)a + (uint32_t)b);
}
template <> __device__ int32_t op_mul(int32_t a, int32_t b)
{
    return (int32_t)((uint32_t)a * (uint32_t)b);
}
template <> __device__ int64_t op_add(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}
template <> __device__ int64_t op_mul(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a * (uint64_t)b);
}
template <> __device__ uint8_t op_add(uint8_t a, uint8_t b)
{
    return (uint8_t)(a + b);
}
template <> __device__ uint8_t op_mul(uint8_t a, uint8_t b)
{
    return (uint8_t)((unsigned)a * (unsigned)b);
}

template <typename C> __device__ C op_min(C a, C b) { return b < a ? b : a; }
template <typename C> __device__ C op_max(C a, C b) { return b > a ? b : a; }
/* IEEE 754-2019 minimum/maximum, the CPU kernels' own (kern-ieee.h). */
__device__ inline unsigned long long dbl_bits(double d)
{
    return (unsigned long long)__double_as_longlong(d);
}
__device__ inline double bits_dbl(unsigned long long u)
{
    return __longlong_as_double((long long)u);
}
__device__ inline unsigned flt_bits(float f)
{
    return (unsigned)__float_as_int(f);
}
__device__ inline float bits_flt(unsigned u) { return __int_as_float((int)u); }
KERN_IEEE_MINMAX(__device__ inline, ieee_minf, ieee_maxf, float, flt_bits,
                 bits_flt)
KERN_IEEE_MINMAX(__device__ inline, ieee_mind, ieee_maxd, double, dbl_bits,
                 bits_dbl)
template <> __device__ float op_min(float a, float b)
{
    return ieee_minf(a, b);
}
template <> __device__ float op_max(float a, float b)
{
    return ieee_maxf(a, b);
}
template <> __device__ double op_min(double a, double b)
{
    return ieee_mind(a, b);
}
template <> __device__ double op_max(double a, double b)
{
    return ieee_maxd(a, b);
}

template <int OP, typename C> __device__ C apply(C a, C b)
{
    switch (OP) {
    case OP_PROD: return op_mul<C>(a, b);
    case OP_MIN: return op_min<C>(a, b);
    case OP_MAX: return op_max<C>(a, b);
    default: return op_add<C>(a, b);
    }
}

/* ---- kernels ----------------------------------------------------------- */

#define GRID_STRIDE(i, n)                                                    \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);  \
         i += (size_t)blockDim.x * gridDim.x)

template <typename T, int OP>
__global__ void k_reduce3(T *d, const T *a, const T *b, size_t n)
{
    GRID_STRIDE(i, n)
    d[i] = ty<T>::st(apply<OP>(ty<T>::ld(a[i]), ty<T>::ld(b[i])));
}

template <typename T> __global__ void k_scale(T *p, size_t n, float s)
{
    GRID_STRIDE(i, n)
    p[i] = ty<T>::st(ty<T>::ld(p[i]) * s);
}

__global__ void k_scale_f64(double *p, size_t n, double s)
{
    GRID_STRIDE(i, n)
    p[i] *= s;
}

template <typename T> __global__ void k_div(T *p, size_t n, T k)
{
    GRID_STRIDE(i, n)
    p[i] = (T)(p[i] / k);
}

template <typename D, typename S> __global__ void k_cast(D *d, const S *s,
                                                         size_t n)
{
    GRID_STRIDE(i, n)
    d[i] = ty<D>::st(ty<S>::ld(s[i]));
}

template <typename W, int OP>
__global__ void k_wire(float *acc, const W *w, size_t n)
{
    GRID_STRIDE(i, n)
    acc[i] = apply<OP>(acc[i], ty<W>::ld(w[i]));
}

/* ---- host dispatch ----------------------------------------------------- */

template <typename T>
static int launch3(int op, void *d, const void *a, const void *b, size_t n,
                   cudaStream_t s)
{
    unsigned g = kern_cuda__blocks(n);
    T *D = (T *)d;
    const T *A = (const T *)a, *B = (const T *)b;
    switch (op) {
    case OP_SUM:
    case OP_AVG: k_reduce3<T, OP_SUM><<<g, 256, 0, s>>>(D, A, B, n); break;
    case OP_PROD: k_reduce3<T, OP_PROD><<<g, 256, 0, s>>>(D, A, B, n); break;
    case OP_MIN: k_reduce3<T, OP_MIN><<<g, 256, 0, s>>>(D, A, B, n); break;
    case OP_MAX: k_reduce3<T, OP_MAX><<<g, 256, 0, s>>>(D, A, B, n); break;
    default: return kern_cuda__fail(ST_EINVAL, "reduce", "bad op");
    }
    KC_CHECK(cudaGetLastError());
    return 0;
}

static int kc_reduce3(int dt, int op, void *d, const void *a, const void *b,
                      size_t n, void *stream)
{
    if (n == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    switch (dt) {
    case DT_F32: return launch3<float>(op, d, a, b, n, s);
    case DT_F64: return launch3<double>(op, d, a, b, n, s);
    case DT_F16: return launch3<__half>(op, d, a, b, n, s);
    case DT_BF16: return launch3<__nv_bfloat16>(op, d, a, b, n, s);
    case DT_I32: return launch3<int32_t>(op, d, a, b, n, s);
    case DT_I64: return launch3<int64_t>(op, d, a, b, n, s);
    case DT_U8: return launch3<uint8_t>(op, d, a, b, n, s);
    default: return kern_cuda__fail(ST_EINVAL, "reduce", "bad dtype");
    }
}

static int kc_reduce(int dt, int op, void *d, const void *src, size_t n,
                     void *stream)
{
    return kc_reduce3(dt, op, d, d, src, n, stream);
}

static int kc_avg_finish(int dt, void *buf, size_t n, uint32_t nranks,
                         void *stream)
{
    if (nranks == 0)
        return kern_cuda__fail(ST_EINVAL, "avg_finish", "nranks is 0");
    if (n == 0 || nranks == 1)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    unsigned g = kern_cuda__blocks(n);
    float sf = 1.0f / (float)nranks;
    switch (dt) {
    case DT_F32: k_scale<float><<<g, 256, 0, s>>>((float *)buf, n, sf); break;
    case DT_F64:
        k_scale_f64<<<g, 256, 0, s>>>((double *)buf, n, 1.0 / nranks);
        break;
    case DT_F16: k_scale<__half><<<g, 256, 0, s>>>((__half *)buf, n, sf); break;
    case DT_BF16:
        k_scale<__nv_bfloat16><<<g, 256, 0, s>>>((__nv_bfloat16 *)buf, n, sf);
        break;
    case DT_I32:
        k_div<int32_t><<<g, 256, 0, s>>>((int32_t *)buf, n, (int32_t)nranks);
        break;
    case DT_I64:
        k_div<int64_t><<<g, 256, 0, s>>>((int64_t *)buf, n, (int64_t)nranks);
        break;
    case DT_U8:
        k_div<uint8_t><<<g, 256, 0, s>>>((uint8_t *)buf, n,
                                         (uint8_t)(nranks > 255 ? 255 : nranks));
        if (nranks > 255) /* every u8 sum / n > 255 is 0 */
            KC_CHECK(cudaMemsetAsync(buf, 0, n, s));
        break;
    default: return kern_cuda__fail(ST_EINVAL, "avg_finish", "bad dtype");
    }
    KC_CHECK(cudaGetLastError());
    return 0;
}

static int kc_cast(int kind, void *d, const void *src, size_t n, void *stream)
{
    if (n == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    unsigned g = kern_cuda__blocks(n);
    switch (kind) {
    case KERN_CUDA_F32_TO_F16:
        k_cast<__half, float><<<g, 256, 0, s>>>((__half *)d,
                                                (const float *)src, n);
        break;
    case KERN_CUDA_F16_TO_F32:
        k_cast<float, __half><<<g, 256, 0, s>>>((float *)d,
                                                (const __half *)src, n);
        break;
    case KERN_CUDA_F32_TO_BF16:
        k_cast<__nv_bfloat16, float><<<g, 256, 0, s>>>(
            (__nv_bfloat16 *)d, (const float *)src, n);
        break;
    case KERN_CUDA_BF16_TO_F32:
        k_cast<float, __nv_bfloat16><<<g, 256, 0, s>>>(
            (float *)d, (const __nv_bfloat16 *)src, n);
        break;
    default: return kern_cuda__fail(ST_EINVAL, "cast", "bad kind");
    }
    KC_CHECK(cudaGetLastError());
    return 0;
}

template <typename W>
static int launch_wire(int op, float *acc, const void *wire, size_t n,
                       cudaStream_t s)
{
    unsigned g = kern_cuda__blocks(n);
    const W *w = (const W *)wire;
    switch (op) {
    case OP_SUM:
    case OP_AVG: k_wire<W, OP_SUM><<<g, 256, 0, s>>>(acc, w, n); break;
    case OP_PROD: k_wire<W, OP_PROD><<<g, 256, 0, s>>>(acc, w, n); break;
    case OP_MIN: k_wire<W, OP_MIN><<<g, 256, 0, s>>>(acc, w, n); break;
    case OP_MAX: k_wire<W, OP_MAX><<<g, 256, 0, s>>>(acc, w, n); break;
    default: return kern_cuda__fail(ST_EINVAL, "reduce_wire", "bad op");
    }
    KC_CHECK(cudaGetLastError());
    return 0;
}

static int kc_reduce_wire(int wire_dt, int op, float *acc, const void *wire,
                          size_t n, void *stream)
{
    if (n == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (wire_dt == DT_F16)
        return launch_wire<__half>(op, acc, wire, n, s);
    if (wire_dt == DT_BF16)
        return launch_wire<__nv_bfloat16>(op, acc, wire, n, s);
    return kern_cuda__fail(ST_EINVAL, "reduce_wire", "wire dtype not f16/bf16");
}

/* ---- devices and memory ------------------------------------------------ */

static int kc_device_count(int *count_p)
{
    int n = 0; /* left unset by the runtime when the driver is missing */
    cudaError_t e = cudaGetDeviceCount(&n);
    *count_p = e == cudaSuccess ? n : 0;
    if (e != cudaSuccess)
        return kern_cuda__fail(ST_ENOTSUP, "cudaGetDeviceCount",
                               cudaGetErrorString(e));
    return 0;
}

static int kc_init(int device)
{
    KC_CHECK(cudaSetDevice(device));
    KC_CHECK(cudaFree(0)); /* create the context now, not on first use */
    return 0;
}

static int kc_describe(int device, char *buf, size_t len)
{
    cudaDeviceProp p;
    KC_CHECK(cudaGetDeviceProperties(&p, device));
    snprintf(buf, len, "%s (sm_%d%d, %.0f GiB)", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024 * 1024));
    return 0;
}

static int kc_malloc(void **p, size_t bytes)
{
    KC_CHECK(cudaMalloc(p, bytes));
    return 0;
}

static void kc_free(void *p)
{
    cudaFree(p);
}

static int kc_h2d(void *d, const void *h, size_t bytes)
{
    KC_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return 0;
}

static int kc_d2h(void *h, const void *d, size_t bytes)
{
    KC_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return 0;
}

static int kc_d2d(void *d, const void *s, size_t bytes, void *stream)
{
    KC_CHECK(cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice,
                             (cudaStream_t)stream));
    return 0;
}

static int kc_sync(void *stream)
{
    KC_CHECK(stream ? cudaStreamSynchronize((cudaStream_t)stream)
                    : cudaDeviceSynchronize());
    return 0;
}

static const kern_cuda_api_t api = {
    KERN_CUDA_ABI_VERSION,
    sizeof(kern_cuda_api_t),
    kc_device_count,
    kc_init,
    kc_last_error,
    kc_describe,
    kc_malloc,
    kc_free,
    kc_h2d,
    kc_d2h,
    kc_d2d,
    kc_sync,
    kc_reduce,
    kc_reduce3,
    kc_avg_finish,
    kc_cast,
    kc_reduce_wire,
    kern_cuda__blas_create,
    kern_cuda__blas_destroy,
    kern_cuda__dense_forward,
    kern_cuda__dense_backward,
    kern_cuda__axpy,
    kern_cuda__scal,
};

extern "C" __attribute__((visibility("default"))) const kern_cuda_api_t *
kern_cuda_get_api(void)
{
    return &api;
}
