// The CUDA device kind's own kernels: pattern fill and the elementwise reductions of
// relayouts from partial layouts, with the host kernels' rounding (runtime/reduce_host.c).
#include <cuda_fp16.h>
#include <stdint.h>

#include "runtime/cuda/device_kernels.h"
#include "runtime/cuda/cu_lang.h"

namespace {

const int kThreads = 256;

unsigned blocks_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b > 65535 * 8 ? 65535 * 8 : (b < 1 ? 1 : b));
}

template <typename T>
__global__ void fill_kernel(T *x, int64_t n, T v)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = v;
}

// Bit-exact with the host: round to nearest even, NaN made quiet.
__device__ float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    u |= (u & 0x7fffffffu) > 0x7f800000u ? 0x400000u : 0u;
    return __uint_as_float(u);
}

__device__ uint16_t f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

__device__ float f16_to_f32(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

__device__ uint16_t f32_to_f16(float f)
{
    return __half_as_ushort(__float2half_rn(f));
}

struct F16 {};
struct BF16 {};

__device__ float widen(uint16_t v, F16) { return f16_to_f32(v); }
__device__ float widen(uint16_t v, BF16) { return bf16_to_f32(v); }
__device__ uint16_t narrow(float v, F16) { return f32_to_f16(v); }
__device__ uint16_t narrow(float v, BF16) { return f32_to_bf16(v); }

template <typename T>
__device__ T pick(int op, T x, T y)
{
    if (op == 1)
        return x != x ? x : (y > x || y != y ? y : x);
    if (op == 2)
        return x != x ? x : (y < x || y != y ? y : x);
    return (T)(x + y);
}

template <typename T>
__global__ void reduce_native(int op, T *d, const T *s, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        d[i] = pick(op, d[i], s[i]);
}

template <typename H>
__global__ void reduce_half(int op, uint16_t *d, const uint16_t *s, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float u = widen(d[i], H()), v = widen(s[i], H());
        if (op == 0)
            d[i] = narrow(u + v, H());
        else if (op == 1)
            d[i] = u != u ? d[i] : (v > u || v != v ? s[i] : d[i]);
        else
            d[i] = u != u ? d[i] : (v < u || v != v ? s[i] : d[i]);
    }
}

template <typename T>
__global__ void divide_native(T *x, int64_t n, int64_t k)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = (T)(x[i] / (T)k);
}

template <typename H>
__global__ void divide_half(uint16_t *x, int64_t n, int64_t k)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = narrow(widen(x[i], H()) / (float)k, H());
}

template <typename T>
cudaError_t launch_reduce(int op, void *d, const void *s, int64_t n, cudaStream_t st)
{
    DT__CU_LAUNCH(reduce_native<T>, blocks_for(n), kThreads, 0, st)(op, (T *)d, (const T *)s, n);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_divide(void *x, int64_t n, int64_t k, cudaStream_t st)
{
    DT__CU_LAUNCH(divide_native<T>, blocks_for(n), kThreads, 0, st)((T *)x, n, k);
    return cudaGetLastError();
}

} // namespace

// dt_dtype values (include/dtensor/dtype.h).
enum { F32 = 0, F64 = 1, F16V = 2, BF16V = 3, I32 = 4, I64 = 5, U8 = 6 };

extern "C" cudaError_t dt__cudak_fill(void *x, int64_t count, uint64_t pattern, int elem,
                                      cudaStream_t s)
{
    if (count <= 0)
        return cudaSuccess;
    switch (elem) {
    case 1: DT__CU_LAUNCH(fill_kernel, blocks_for(count), kThreads, 0, s)((uint8_t *)x, count, (uint8_t)pattern); break;
    case 2: DT__CU_LAUNCH(fill_kernel, blocks_for(count), kThreads, 0, s)((uint16_t *)x, count, (uint16_t)pattern); break;
    case 4: DT__CU_LAUNCH(fill_kernel, blocks_for(count), kThreads, 0, s)((uint32_t *)x, count, (uint32_t)pattern); break;
    case 8: DT__CU_LAUNCH(fill_kernel, blocks_for(count), kThreads, 0, s)((uint64_t *)x, count, pattern); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cudak_reduce(int op, int dtype, void *d, const void *s, int64_t n,
                                        cudaStream_t st)
{
    if (n <= 0)
        return cudaSuccess;
    if (op == 3)
        op = 0; // AVG sums; the divide comes last
    switch (dtype) {
    case F32: return launch_reduce<float>(op, d, s, n, st);
    case F64: return launch_reduce<double>(op, d, s, n, st);
    case I32: return launch_reduce<int32_t>(op, d, s, n, st);
    case I64: return launch_reduce<int64_t>(op, d, s, n, st);
    case U8: return launch_reduce<uint8_t>(op, d, s, n, st);
    case F16V:
        DT__CU_LAUNCH(reduce_half<F16>, blocks_for(n), kThreads, 0, st)(op, (uint16_t *)d, (const uint16_t *)s, n);
        return cudaGetLastError();
    case BF16V:
        DT__CU_LAUNCH(reduce_half<BF16>, blocks_for(n), kThreads, 0, st)(op, (uint16_t *)d, (const uint16_t *)s, n);
        return cudaGetLastError();
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t dt__cudak_divide(int dtype, void *x, int64_t n, int64_t k,
                                        cudaStream_t st)
{
    if (n <= 0)
        return cudaSuccess;
    switch (dtype) {
    case F32: return launch_divide<float>(x, n, k, st);
    case F64: return launch_divide<double>(x, n, k, st);
    case I32: return launch_divide<int32_t>(x, n, k, st);
    case I64: return launch_divide<int64_t>(x, n, k, st);
    case U8: return launch_divide<uint8_t>(x, n, k, st);
    case F16V:
        DT__CU_LAUNCH(divide_half<F16>, blocks_for(n), kThreads, 0, st)((uint16_t *)x, n, k);
        return cudaGetLastError();
    case BF16V:
        DT__CU_LAUNCH(divide_half<BF16>, blocks_for(n), kThreads, 0, st)((uint16_t *)x, n, k);
        return cudaGetLastError();
    }
    return cudaErrorInvalidValue;
}
