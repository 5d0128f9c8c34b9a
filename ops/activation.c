/* Local activation kernels: ReLU and GELU (tanh form, as GPT-2, on ops/vmath.c's tanh) with
 * their gradients. */
#include "ops/ops_impl.h"

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
    dt__vgelu(n, x, y);
    return DT_OK;
}

dt_status dt_kernel_gelu_grad(int64_t n, const float *x, const float *dy, float *dx)
{
    const void *p[] = {x, dy, dx};
    dt_status st = dt__kcheck("dt_kernel_gelu_grad", n, 3, p);
    if (st != DT_OK)
        return st;
    dt__vgelu_grad(n, x, dy, dx);
    return DT_OK;
}
