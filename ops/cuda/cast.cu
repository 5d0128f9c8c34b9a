/* CUDA casts between f32, f64, f16 and bf16 with the results of ops/cast.c bit for bit:
 * round to nearest even by the hardware conversions, and NaNs made quiet by hand keeping
 * their top payload bits (the hardware would give one canonical NaN). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/cuda/cu_lang.h"
#include "ops/cuda/cuda_ops.h"

__device__ static float f16_to_f32(uint16_t h)
{
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) /* NaN: quiet, payload on top */
        return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7fc00000u |
                               ((uint32_t)(h & 0x3ffu) << 13));
    return __half2float(__ushort_as_half(h));
}

__device__ static uint16_t f32_to_f16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
    return __half_as_ushort(__float2half_rn(f));
}

__device__ static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16; /* the f32 with these top bits; a NaN made quiet */
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u |= 0x400000u;
    return __uint_as_float(u);
}

__device__ static uint16_t f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

__device__ static double f32_to_f64(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return __longlong_as_double((long long)(((uint64_t)(u & 0x80000000u) << 32) |
                                                0x7ff8000000000000ull |
                                                ((uint64_t)(u & 0x7fffffu) << 29)));
    return (double)f;
}

__device__ static float f64_to_f32(double d)
{
    uint64_t u = (uint64_t)__double_as_longlong(d);
    if ((u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull)
        return __uint_as_float((uint32_t)((u >> 32) & 0x80000000u) | 0x7fc00000u |
                               (uint32_t)((u >> 29) & 0x7fffffu));
    return __double2float_rn(d);
}

__device__ static float load_f32(const void *src, int sf, int64_t i)
{
    switch (sf) {
    case DT__CU_F32: return ((const float *)src)[i];
    case DT__CU_F64: return f64_to_f32(((const double *)src)[i]);
    case DT__CU_F16: return f16_to_f32(((const uint16_t *)src)[i]);
    default: return bf16_to_f32(((const uint16_t *)src)[i]);
    }
}

__device__ static void store_f32(void *dst, int df, int64_t i, float v)
{
    switch (df) {
    case DT__CU_F32: ((float *)dst)[i] = v; break;
    case DT__CU_F64: ((double *)dst)[i] = f32_to_f64(v); break;
    case DT__CU_F16: ((uint16_t *)dst)[i] = f32_to_f16(v); break;
    default: ((uint16_t *)dst)[i] = f32_to_bf16(v); break;
    }
}

/* Every pair goes through f32, as on the CPU (f64 <-> half rounds twice by contract). */
__global__ static void cast_kernel(int64_t n, const void *src, int sf, void *dst, int df)
{
    DT__CU_FOR(i, n) {
        store_f32(dst, df, i, load_f32(src, sf, i));
    }
}

extern "C" cudaError_t dt__cuda_cast(int64_t n, const void *src, int sf, void *dst, int df,
                                     cudaStream_t s)
{
    DT__CU_LAUNCH(cast_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, src, sf, dst, df);
    return cudaGetLastError();
}
