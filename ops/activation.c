/* Local activation kernels: ReLU and GELU (tanh form, as GPT-2) with their gradients. */
#include <math.h>

#include "ops/ops_impl.h"

#define GELU_C 0.7978845608028654f   /* sqrt(2/pi) */
#define GELU_A 0.044715f

dt_status dt_kernel_relu(int64_t n, const float *x, float *y)
{
    const void *p[] = {x, y};
    dt_status st = dt__kcheck("dt_kernel_relu", n, 2, p);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return DT_OK;
}

dt_status dt_kernel_relu_grad(int64_t n, const float *x, const float *dy, float *dx)
{
    const void *p[] = {x, dy, dx};
    dt_status st = dt__kcheck("dt_kernel_relu_grad", n, 3, p);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < n; i++)
        dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    return DT_OK;
}

dt_status dt_kernel_gelu(int64_t n, const float *x, float *y)
{
    const void *p[] = {x, y};
    dt_status st = dt__kcheck("dt_kernel_gelu", n, 2, p);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float u = GELU_C * (v + GELU_A * v * v * v);
        y[i] = 0.5f * v * (1.0f + tanhf(u));
    }
    return DT_OK;
}

dt_status dt_kernel_gelu_grad(int64_t n, const float *x, const float *dy, float *dx)
{
    const void *p[] = {x, dy, dx};
    dt_status st = dt__kcheck("dt_kernel_gelu_grad", n, 3, p);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float u = GELU_C * (v + GELU_A * v * v * v);
        float t = tanhf(u);
        float du = GELU_C * (1.0f + 3.0f * GELU_A * v * v);
        float g = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
        dx[i] = g * dy[i];
    }
    return DT_OK;
}
