/* CUDA optimizer updates on flat f32 buffers: SGD (momentum, dampening, Nesterov, weight
 * decay) and Adam/AdamW, the loops of ops/optimizer.c (--fmad=false: the same bits). */
#include "runtime/cuda/cu_lang.h"
#include "ops/cuda/cuda_ops.h"

__global__ static void sgd_plain_kernel(int64_t n, float lr, float wd, float gs, float *param,
                                        const float *grad)
{
    DT__CU_FOR(i, n) {
        param[i] -= lr * (gs * grad[i] + wd * param[i]);
    }
}

__global__ static void sgd_momentum_kernel(int64_t n, float lr, float mu, float damp, float wd,
                                           int nesterov, float gs, float *param,
                                           const float *grad, float *buf)
{
    DT__CU_FOR(i, n) {
        float g = gs * grad[i] + wd * param[i];
        float b = mu * buf[i] + damp * g;
        buf[i] = b;
        param[i] -= lr * (nesterov ? g + mu * b : b);
    }
}

__global__ static void adam_kernel(int64_t n, float b1, float b2, float eps, float gs,
                                   float step_size, float inv_sqrt_bc2, float l2, float decay,
                                   float *param, const float *grad, float *m, float *v)
{
    DT__CU_FOR(i, n) {
        float w = param[i];
        float g = gs * grad[i] + l2 * w;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        w *= decay;
        param[i] = w - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    }
}

extern "C" cudaError_t dt__cuda_sgd(int64_t n, float lr, float momentum, float dampening,
                                    float weight_decay, int nesterov, float grad_scale,
                                    float *param, const float *grad, float *momentum_buf,
                                    cudaStream_t s)
{
    if (momentum == 0.0f)
        DT__CU_LAUNCH(sgd_plain_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, lr, weight_decay,
                                                                     grad_scale, param, grad);
    else
        DT__CU_LAUNCH(sgd_momentum_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(
            n, lr, momentum, 1.0f - dampening, weight_decay, nesterov, grad_scale, param, grad,
            momentum_buf);
    return cudaGetLastError();
}

extern "C" cudaError_t dt__cuda_adam(int64_t n, float beta1, float beta2, float eps,
                                     float grad_scale, float step_size, float inv_sqrt_bc2,
                                     float l2, float decay, float *param, const float *grad,
                                     float *m, float *v, cudaStream_t s)
{
    DT__CU_LAUNCH(adam_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, beta1, beta2, eps, grad_scale,
                                                            step_size, inv_sqrt_bc2, l2, decay,
                                                            param, grad, m, v);
    return cudaGetLastError();
}
