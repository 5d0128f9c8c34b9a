/* CUDA reductions: sum, squared sum and max of a buffer (f64 per-block partials, then one
 * block), reductions over the middle axis (the CPU's order, so equal bits), inf/NaN check,
 * and the f64 sum of squares of an f32, f16 or bf16 buffer (the ZeRO norm). */
#include <cuda_fp16.h>

#include "runtime/cuda/cu_lang.h"
#include "ops/cuda/cuda_ops.h"

/* NaN-sticky max: a NaN anywhere makes the result NaN, as dt_kernel_max. */
__device__ static double max_nan(double m, double v)
{
    if (m != m)
        return m;
    return (v > m || v != v) ? v : m;
}

__device__ static double block_reduce(int kind, double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1) {
        double w = __shfl_down_sync(0xffffffffu, v, o);
        v = kind == DT__CU_MAX ? max_nan(v, w) : v + w;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    double r = 0.0;
    if (threadIdx.x == 0) {
        r = sh[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            r = kind == DT__CU_MAX ? max_nan(r, sh[w]) : r + sh[w];
    }
    return r; /* valid in thread 0 only */
}

/* Element i of x in format F (DT__CU_F32, F16 or BF16) as a double; a NaN stays a NaN (its
 * payload does not matter to these reductions). */
template <int F>
__device__ static double load(const void *x, int64_t i)
{
    if (F == DT__CU_F32)
        return ((const float *)x)[i];
    if (F == DT__CU_F16)
        return __half2float(__ushort_as_half(((const uint16_t *)x)[i]));
    return __uint_as_float((uint32_t)((const uint16_t *)x)[i] << 16);
}

template <int F>
__global__ static void partial_kernel(int kind, int64_t n, const void *x, double *partials)
{
    DT__CU_SHARED(double, sh, [32]);
    double acc = kind == DT__CU_MAX ? -INFINITY : 0.0;
    DT__CU_FOR(i, n) {
        double v = load<F>(x, i);
        if (kind == DT__CU_MAX)
            acc = max_nan(acc, v);
        else
            acc += kind == DT__CU_SQSUM ? v * v : v;
    }
    double r = block_reduce(kind, acc, sh);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = r;
}

/* out64 non-NULL: the f64 result there as it is; else (float)(r / div) (max: r) into out. */
__global__ static void final_kernel(int kind, int nparts, const double *partials, double div,
                                    float empty, float *out, double *out64)
{
    DT__CU_SHARED(double, sh, [32]);
    double acc = kind == DT__CU_MAX ? -INFINITY : 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x)
        acc = kind == DT__CU_MAX ? max_nan(acc, partials[i]) : acc + partials[i];
    double r = block_reduce(kind, acc, sh);
    if (threadIdx.x == 0 && out64)
        *out64 = nparts == 0 ? 0.0 : r;
    else if (threadIdx.x == 0)
        *out = nparts == 0 ? empty : (float)(kind == DT__CU_MAX ? r : r / div);
}

static cudaError_t reduce_launch(int kind, int64_t n, const void *x, int format,
                                 double *partials, double div, float empty, float *out,
                                 double *out64, cudaStream_t s)
{
    int nparts = 0;
    if (n > 0) {
        int64_t want = (n + 4 * DT__CU_THREADS - 1) / (4 * DT__CU_THREADS);
        nparts = (int)(want < DT__CU_REDUCE_BLOCKS ? want : DT__CU_REDUCE_BLOCKS);
        if (format == DT__CU_F16)
            DT__CU_LAUNCH(partial_kernel<DT__CU_F16>, nparts, DT__CU_THREADS, 0, s)(kind, n, x, partials);
        else if (format == DT__CU_BF16)
            DT__CU_LAUNCH(partial_kernel<DT__CU_BF16>, nparts, DT__CU_THREADS, 0, s)(kind, n, x, partials);
        else
            DT__CU_LAUNCH(partial_kernel<DT__CU_F32>, nparts, DT__CU_THREADS, 0, s)(kind, n, x, partials);
    }
    DT__CU_LAUNCH(final_kernel, 1, DT__CU_THREADS, 0, s)(kind, nparts, partials, div, empty, out, out64);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_reduce_full(int kind, int64_t n, const float *x,
                                            double *partials, double div, float empty,
                                            float *out, cudaStream_t s)
{
    return reduce_launch(kind, n, x, DT__CU_F32, partials, div, empty, out, NULL, s);
}

extern "C" cudaError_t dt__cuda_sq_sum_f64(int64_t n, const void *x, int format,
                                           double *partials, double *out, cudaStream_t s)
{
    return reduce_launch(DT__CU_SQSUM, n, x, format, partials, 1.0, 0.0f, NULL, out, s);
}

/* op: dt_reduce_op (0 sum, 1 max, 2 min, 3 avg); the loops of dt_kernel_reduce_axis. */
__global__ static void axis_kernel(int op, int64_t outer, int64_t len, int64_t inner,
                                   const float *x, float *y)
{
    DT__CU_FOR(t, outer * inner) {
        int64_t o = t / inner, j = t % inner;
        const float *xo = x + o * len * inner + j;
        float acc = op == 1 ? -INFINITY : (op == 2 ? INFINITY : 0.0f);
        for (int64_t l = 0; l < len; l++) {
            float v = xo[l * inner];
            if (op == 1)
                acc = (v > acc || v != v) ? v : acc;
            else if (op == 2)
                acc = (v < acc || v != v) ? v : acc;
            else
                acc += v;
        }
        if (op == 3) {
            float inv = len > 0 ? 1.0f / (float)len : NAN;
            acc = len > 0 ? acc * inv : NAN;
        }
        y[t] = acc;
    }
}

extern "C" cudaError_t dt__cuda_reduce_axis(int op, int64_t outer, int64_t len, int64_t inner,
                                            const float *x, float *y, cudaStream_t s)
{
    DT__CU_LAUNCH(axis_kernel, dt__cu_blocks(outer * inner), DT__CU_THREADS, 0, s)(op, outer, len, inner,
                                                                        x, y);
    return cudaGetLastError();
}

template <typename T>
__global__ static void nonfinite_kernel(int64_t n, const T *x, T mask, int32_t *found)
{
    int hit = 0;
    DT__CU_FOR(i, n) {
        hit |= (x[i] & mask) == mask;
    }
    if (__syncthreads_or(hit) && threadIdx.x == 0)
        *found = 1;
}

extern "C" cudaError_t dt__cuda_nonfinite(int64_t n, const void *x, int format,
                                          int32_t *found_out, cudaStream_t s)
{
    cudaError_t err = cudaMemsetAsync(found_out, 0, sizeof *found_out, s);
    if (err != cudaSuccess || n == 0)
        return err;
    unsigned g = dt__cu_blocks(n);
    switch (format) {
    case DT__CU_F32:
        DT__CU_LAUNCH(nonfinite_kernel, g, DT__CU_THREADS, 0, s)(n, (const uint32_t *)x, 0x7f800000u,
                                                      found_out);
        break;
    case DT__CU_F64:
        DT__CU_LAUNCH(nonfinite_kernel, g, DT__CU_THREADS, 0, s)(n, (const uint64_t *)x,
                                                      (uint64_t)0x7ff0000000000000ull,
                                                      found_out);
        break;
    case DT__CU_F16:
        DT__CU_LAUNCH(nonfinite_kernel, g, DT__CU_THREADS, 0, s)(n, (const uint16_t *)x, (uint16_t)0x7c00u,
                                                      found_out);
        break;
    default:
        DT__CU_LAUNCH(nonfinite_kernel, g, DT__CU_THREADS, 0, s)(n, (const uint16_t *)x, (uint16_t)0x7f80u,
                                                      found_out);
        break;
    }
    return cudaGetLastError();
}
