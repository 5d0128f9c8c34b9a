/* CUDA activations: ReLU and GELU (tanh form) with their gradients, the formulas of
 * ops/activation.c (tanhf may differ from the host's by an ulp or two). */
#include "runtime/cuda/cu_lang.h"
#include "ops/cuda/cuda_ops.h"

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

__global__ static void relu_kernel(int64_t n, const float *x, float *y)
{
    DT__CU_FOR(i, n) {
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    }
}

__global__ static void relu_grad_kernel(int64_t n, const float *x, const float *dy, float *dx)
{
    DT__CU_FOR(i, n) {
        dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    }
}

__global__ static void gelu_kernel(int64_t n, const float *x, float *y)
{
    DT__CU_FOR(i, n) {
        float v = x[i];
        float u = GELU_C * (v + GELU_A * v * v * v);
        y[i] = 0.5f * v * (1.0f + tanhf(u));
    }
}

__global__ static void gelu_grad_kernel(int64_t n, const float *x, const float *dy, float *dx)
{
    DT__CU_FOR(i, n) {
        float v = x[i];
        float u = GELU_C * (v + GELU_A * v * v * v);
        float t = tanhf(u);
        float du = GELU_C * (1.0f + 3.0f * GELU_A * v * v);
        float g = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
        dx[i] = g * dy[i];
    }
}

extern "C" cudaError_t dt__cuda_relu(int64_t n, const float *x, float *y, cudaStream_t s)
{
    DT__CU_LAUNCH(relu_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_relu_grad(int64_t n, const float *x, const float *dy, float *dx,
                                          cudaStream_t s)
{
    DT__CU_LAUNCH(relu_grad_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, x, dy, dx);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_gelu(int64_t n, const float *x, float *y, cudaStream_t s)
{
    DT__CU_LAUNCH(gelu_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_gelu_grad(int64_t n, const float *x, const float *dy, float *dx,
                                          cudaStream_t s)
{
    DT__CU_LAUNCH(gelu_grad_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, x, dy, dx);
    return cudaGetLastError();
}
