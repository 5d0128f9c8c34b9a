/* CUDA elementwise f32 kernels: add, sub, mul, scale, axpy, fill, matrix scale, bias add and
 * its gradient; the same arithmetic as ops/elementwise.c (built with --fmad=false). */
#include "runtime/cuda/cu_lang.h"
#include "ops/cuda/cuda_ops.h"

__global__ static void binary_kernel(int op, int64_t n, const float *a, const float *b,
                                     float *out)
{
    DT__CU_FOR(i, n) {
        float x = a[i], y = b[i];
        out[i] = op == DT__CU_ADD ? x + y : (op == DT__CU_SUB ? x - y : x * y);
    }
}

__global__ static void scale_kernel(int64_t n, float alpha, const float *x, float *out)
{
    DT__CU_FOR(i, n) {
        out[i] = alpha * x[i];
    }
}

__global__ static void axpy_kernel(int64_t n, float alpha, const float *x, float *y)
{
    DT__CU_FOR(i, n) {
        y[i] += alpha * x[i];
    }
}

__global__ static void fill_kernel(int64_t n, float value, float *x)
{
    DT__CU_FOR(i, n) {
        x[i] = value;
    }
}

__global__ static void scale_matrix_kernel(int64_t m, int64_t n, float beta, float *c,
                                           int64_t ldc)
{
    DT__CU_FOR(t, m * n) {
        float *p = c + (t / n) * ldc + t % n;
        *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}

__global__ static void bias_add_kernel(int64_t rows, int64_t cols, const float *bias, float *y)
{
    DT__CU_FOR(t, rows * cols) {
        y[t] += bias[t % cols];
    }
}

/* One thread per column, rows in order: the CPU kernel's summation order, so equal bits. */
__global__ static void bias_grad_kernel(int64_t rows, int64_t cols, const float *dy, float *db)
{
    DT__CU_FOR(j, cols) {
        float acc = 0.0f;
        for (int64_t i = 0; i < rows; i++)
            acc += dy[i * cols + j];
        db[j] = acc;
    }
}

extern "C" cudaError_t dt__cuda_binary(int op, int64_t n, const float *a, const float *b,
                                       float *out, cudaStream_t s)
{
    DT__CU_LAUNCH(binary_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(op, n, a, b, out);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_scale(int64_t n, float alpha, const float *x, float *out,
                                      cudaStream_t s)
{
    DT__CU_LAUNCH(scale_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, alpha, x, out);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_axpy(int64_t n, float alpha, const float *x, float *y,
                                     cudaStream_t s)
{
    DT__CU_LAUNCH(axpy_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, alpha, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_fill(int64_t n, float value, float *x, cudaStream_t s)
{
    DT__CU_LAUNCH(fill_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, value, x);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_scale_matrix(int64_t m, int64_t n, float beta, float *c,
                                             int64_t ldc, cudaStream_t s)
{
    DT__CU_LAUNCH(scale_matrix_kernel, dt__cu_blocks(m * n), DT__CU_THREADS, 0, s)(m, n, beta, c, ldc);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_bias_add(int64_t rows, int64_t cols, const float *bias,
                                         float *y, cudaStream_t s)
{
    DT__CU_LAUNCH(bias_add_kernel, dt__cu_blocks(rows * cols), DT__CU_THREADS, 0, s)(rows, cols, bias, y);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_bias_grad(int64_t rows, int64_t cols, const float *dy,
                                          float *db, cudaStream_t s)
{
    DT__CU_LAUNCH(bias_grad_kernel, dt__cu_blocks(cols), DT__CU_THREADS, 0, s)(rows, cols, dy, db);
    return cudaGetLastError();
}
