/* CUDA softmax cross-entropy: one block per row (max, then the f64 sum of exponentials, as
 * ops/loss.c), the label check, and the f64 total over rows. */
#include "runtime/cuda/cu_lang.h"
#include "ops/cuda/cuda_ops.h"

__device__ static float block_max(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_down_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = sh[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            m = sh[w] > m ? sh[w] : m;
        sh[0] = m;
    }
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

__device__ static double block_sum(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            s += sh[w];
        sh[0] = s;
    }
    __syncthreads();
    double r = sh[0];
    __syncthreads();
    return r;
}

/* Row max (from x[0], as the CPU) and log(sum(exp(x - max))). */
__device__ static void row_stats(int64_t classes, const float *x, float *mx_out,
                                 double *lse_out)
{
    DT__CU_SHARED(float, shf, [32]);
    DT__CU_SHARED(double, shd, [32]);
    float mx = x[0];
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
        mx = x[j] > mx ? x[j] : mx;
    mx = block_max(mx, shf);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
        s += exp((double)(x[j] - mx));
    s = block_sum(s, shd);
    *mx_out = mx;
    *lse_out = log(s);
}

__global__ static void check_labels_kernel(int64_t rows, int64_t classes,
                                           const int32_t *labels, unsigned long long *bad_row)
{
    DT__CU_FOR(i, rows) {
        if (labels[i] < 0 || labels[i] >= classes)
            atomicMin(bad_row, (unsigned long long)i);
    }
}

__global__ static void xent_rows_kernel(int64_t rows, int64_t classes, const float *logits,
                                        const int32_t *labels, double *row_loss)
{
    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
        const float *x = logits + i * classes;
        float mx;
        double lse;
        row_stats(classes, x, &mx, &lse);
        if (threadIdx.x == 0)
            row_loss[i] = lse - (double)(x[labels[i]] - mx);
    }
}

__global__ static void xent_total_kernel(int64_t rows, const double *row_loss, float scale,
                                         float *loss_out)
{
    DT__CU_SHARED(double, sh, [32]);
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x)
        s += row_loss[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        *loss_out = (float)(s * scale);
}

__global__ static void xent_grad_kernel(int64_t rows, int64_t classes, const float *logits,
                                        const int32_t *labels, float scale, float *dlogits)
{
    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
        const float *x = logits + i * classes;
        float *d = dlogits + i * classes;
        float mx;
        double lse;
        row_stats(classes, x, &mx, &lse); /* every read of x ends here (dlogits may alias) */
        int32_t label = labels[i];
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
            double p = exp((double)(x[j] - mx) - lse);
            d[j] = (float)(scale * (p - (j == label ? 1.0 : 0.0)));
        }
        __syncthreads();
    }
}

static unsigned row_blocks(int64_t rows)
{
    return (unsigned)(rows < 1 ? 1 : (rows > 65535 ? 65535 : rows));
}

/* Threads of a row's block: whole warps covering the classes, at most DT__CU_THREADS (10
 * classes: one warp, not 8 warps of which 7 only join the reductions). */
static unsigned row_threads(int64_t classes)
{
    int64_t t = (classes + 31) / 32 * 32;
    return (unsigned)(t < 32 ? 32 : (t > DT__CU_THREADS ? DT__CU_THREADS : t));
}

extern "C" cudaError_t dt__cuda_xent_check_labels(int64_t rows, int64_t classes,
                                                  const int32_t *labels,
                                                  unsigned long long *bad_row, cudaStream_t s)
{
    DT__CU_LAUNCH(check_labels_kernel, dt__cu_blocks(rows), DT__CU_THREADS, 0, s)(rows, classes, labels,
                                                                       bad_row);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_softmax_xent(int64_t rows, int64_t classes,
                                             const float *logits, const int32_t *labels,
                                             float scale, double *row_loss, float *loss_out,
                                             cudaStream_t s)
{
    if (rows > 0)
        DT__CU_LAUNCH(xent_rows_kernel, row_blocks(rows), row_threads(classes), 0, s)(rows, classes, logits,
                                                                     labels, row_loss);
    DT__CU_LAUNCH(xent_total_kernel, 1, DT__CU_THREADS, 0, s)(rows, row_loss, scale, loss_out);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_softmax_xent_grad(int64_t rows, int64_t classes,
                                                  const float *logits, const int32_t *labels,
                                                  float scale, float *dlogits, cudaStream_t s)
{
    DT__CU_LAUNCH(xent_grad_kernel, row_blocks(rows), row_threads(classes), 0, s)(rows, classes, logits, labels,
                                                                 scale, dlogits);
    return cudaGetLastError();
}
