/* Local optimizer updates on flat f32 buffers: SGD with momentum, dampening, Nesterov and
 * weight decay; Adam and AdamW with bias correction (PyTorch's formulas). */
#include <math.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

dt_status dt_kernel_sgd(int64_t n, const dt_sgd_opts *opts, float *param, const float *grad,
                        float *momentum_buf)
{
    if (!opts)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_sgd: NULL opts");
    const void *p[] = {param, grad, opts->momentum != 0.0f ? (const void *)momentum_buf : opts};
    dt_status st = dt__kcheck("dt_kernel_sgd", n, 3, p);
    if (st != DT_OK)
        return st;
    const float lr = opts->lr, mu = opts->momentum, damp = 1.0f - opts->dampening;
    const float wd = opts->weight_decay, gs = opts->grad_scale;
    if (mu == 0.0f) {
        for (int64_t i = 0; i < n; i++)
            param[i] -= lr * (gs * grad[i] + wd * param[i]);
        return DT_OK;
    }
    if (opts->nesterov) {
        for (int64_t i = 0; i < n; i++) {
            float g = gs * grad[i] + wd * param[i];
            float b = mu * momentum_buf[i] + damp * g;
            momentum_buf[i] = b;
            param[i] -= lr * (g + mu * b);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            float g = gs * grad[i] + wd * param[i];
            float b = mu * momentum_buf[i] + damp * g;
            momentum_buf[i] = b;
            param[i] -= lr * b;
        }
    }
    return DT_OK;
}

dt_status dt_kernel_adam(int64_t n, const dt_adam_opts *opts, int64_t step, float *param,
                         const float *grad, float *m, float *v)
{
    if (!opts)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_adam: NULL opts");
    if (step < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_adam: step %lld (the first update "
                         "is step 1)", (long long)step);
    const void *p[] = {param, grad, m, v};
    dt_status st = dt__kcheck("dt_kernel_adam", n, 4, p);
    if (st != DT_OK)
        return st;
    const float b1 = opts->beta1, b2 = opts->beta2, eps = opts->eps, gs = opts->grad_scale;
    const float lr = opts->lr, wd = opts->weight_decay;
    /* Bias corrections in double: beta^step underflows gracefully, no drift in f32. */
    const double bc1 = 1.0 - pow((double)b1, (double)step);
    const double bc2 = 1.0 - pow((double)b2, (double)step);
    const float step_size = (float)(lr / bc1);
    const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    const float l2 = opts->decoupled ? 0.0f : wd;
    const float decay = opts->decoupled ? 1.0f - lr * wd : 1.0f;
    const dt__adam_consts k = {gs, l2, b1, b2, decay, step_size, inv_sqrt_bc2, eps};
    /* Groups of 8 vectorised (the same operations), the tail below. */
    for (int64_t i = dt__vadam(n, &k, param, grad, m, v); i < n; i++) {
        float w = param[i];
        float g = gs * grad[i] + l2 * w;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        w *= decay;
        param[i] = w - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    }
    return DT_OK;
}
