/* Local kernels of a Llama-style decoder: RMS normalisation with a gain, rotary position
 * embeddings (interleaved pairs), the fused SwiGLU product and grouped-query attention, each
 * with its gradient. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

/* 1/sqrt(mean(x^2) + eps) of one row, accumulated in f64. */
static float row_rstd(int64_t cols, const float *x, float eps)
{
    double s2 = 0.0;
    for (int64_t j = 0; j < cols; j++)
        s2 += (double)x[j] * x[j];
    return (float)(1.0 / sqrt(s2 / (double)cols + (double)eps));
}

static dt_status check_rms(const char *op, int64_t rows, int64_t cols, float eps, int nptrs,
                           const void *const *ptrs)
{
    if (cols < 1 || !(eps >= 0.0f))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: cols=%lld eps=%g (cols >= 1, eps >= 0)",
                         op, (long long)cols, (double)eps);
    return dt__kcheck(op, rows, nptrs, ptrs);
}

dt_status dt_kernel_rms_norm(int64_t rows, int64_t cols, const float *x, const float *gain,
                             float eps, float *y)
{
    const void *p[] = {x, gain, y};
    dt_status st = check_rms("dt_kernel_rms_norm", rows, cols, eps, 3, p);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * cols;
        float *yr = y + i * cols;
        float r = row_rstd(cols, xr, eps);
        for (int64_t j = 0; j < cols; j++)
            yr[j] = xr[j] * r * gain[j];
    }
    return DT_OK;
}

dt_status dt_kernel_rms_norm_grad(int64_t rows, int64_t cols, const float *x, const float *gain,
                                  const float *dy, float eps, float *dx, float *dgain)
{
    const void *p[] = {x, gain, dy, dx, dgain};
    dt_status st = check_rms("dt_kernel_rms_norm_grad", rows, cols, eps, 4, p);
    if (st == DT_OK && !dgain)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_rms_norm_grad: dgain is NULL");
    if (st != DT_OK)
        return st;
    for (int64_t j = 0; j < cols; j++)
        dgain[j] = 0.0f;
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * cols, *dyr = dy + i * cols;
        float *dxr = dx + i * cols;
        float r = row_rstd(cols, xr, eps);
        /* With xh = x r and g = dy gain: dx = r (g - xh mean(g xh)). */
        double sgx = 0.0;
        for (int64_t j = 0; j < cols; j++) {
            float xh = xr[j] * r;
            sgx += (double)(dyr[j] * gain[j]) * xh;
            dgain[j] += dyr[j] * xh;
        }
        float mgx = (float)(sgx / (double)cols);
        for (int64_t j = 0; j < cols; j++) {
            float xh = xr[j] * r;
            dxr[j] = r * (dyr[j] * gain[j] - xh * mgx);
        }
    }
    return DT_OK;
}

dt_status dt_kernel_rope(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                         int64_t pos_offset, int inverse, const float *x, float *y)
{
    static const char op[] = "dt_kernel_rope";
    if (batch < 0 || seq < 0 || heads < 0 || head_dim < 0 || head_dim % 2 != 0 ||
        pos_offset < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: batch %lld, seq %lld, heads %lld, "
                         "head_dim %lld (even), pos_offset %lld (>= 0)", op, (long long)batch,
                         (long long)seq, (long long)heads, (long long)head_dim,
                         (long long)pos_offset);
    const void *p[] = {x, y};
    dt_status st = dt__kcheck(op, batch * seq * heads * head_dim, 2, p);
    if (st != DT_OK)
        return st;
    int64_t half = head_dim / 2, ld = heads * head_dim;
    for (int64_t t = 0; t < seq; t++)
        for (int64_t i = 0; i < half; i++) {
            /* theta_i = 10000^(-2i / head_dim), angle = position * theta_i, in f64. */
            double ang = (double)(pos_offset + t) * pow(10000.0, -2.0 * (double)i /
                                                                 (double)head_dim);
            float c = (float)cos(ang), s = (float)sin(ang);
            if (inverse)
                s = -s;
            for (int64_t b = 0; b < batch; b++)
                for (int64_t h = 0; h < heads; h++) {
                    int64_t o = (b * seq + t) * ld + h * head_dim + 2 * i;
                    float x0 = x[o], x1 = x[o + 1];
                    y[o] = x0 * c - x1 * s;
                    y[o + 1] = x0 * s + x1 * c;
                }
        }
    return DT_OK;
}

static float sigmoidf_(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

dt_status dt_kernel_swiglu(int64_t n, const float *gate, const float *up, float *y)
{
    const void *p[] = {gate, up, y};
    dt_status st = dt__kcheck("dt_kernel_swiglu", n, 3, p);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        y[i] = g * sigmoidf_(g) * up[i];
    }
    return DT_OK;
}

dt_status dt_kernel_swiglu_grad(int64_t n, const float *gate, const float *up, const float *dy,
                                float *dgate, float *dup)
{
    const void *p[] = {gate, up, dy, dgate, dup};
    dt_status st = dt__kcheck("dt_kernel_swiglu_grad", n, 5, p);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i], d = dy[i];
        float s = sigmoidf_(g);
        /* silu(g) = g s; silu'(g) = s (1 + g (1 - s)). */
        dgate[i] = d * u * (s * (1.0f + g * (1.0f - s)));
        dup[i] = d * (g * s);
    }
    return DT_OK;
}

static dt_status check_gqa(const char *op, int64_t batch, int64_t seq, int64_t heads,
                           int64_t kv_heads, int64_t head_dim, int nq, const void *const *pq,
                           int nk, const void *const *pk)
{
    if (batch < 0 || seq < 0 || heads < 0 || head_dim < 0 || kv_heads < 0 ||
        (heads > 0 && (kv_heads < 1 || heads % kv_heads != 0)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: batch %lld, seq %lld, heads %lld, "
                         "kv_heads %lld (dividing heads), head_dim %lld", op, (long long)batch,
                         (long long)seq, (long long)heads, (long long)kv_heads,
                         (long long)head_dim);
    dt_status st = dt__kcheck(op, batch * seq * heads * head_dim, nq, pq);
    if (st == DT_OK)
        st = dt__kcheck(op, batch * seq * kv_heads * head_dim, nk, pk);
    return st;
}

dt_status dt_kernel_attention_gqa(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim, int causal, const float *q, const float *k,
                                  const float *v, float *y)
{
    const void *pq[] = {q, y}, *pk[] = {k, v};
    dt_status st = check_gqa("dt_kernel_attention_gqa", batch, seq, heads, kv_heads, head_dim,
                             2, pq, 2, pk);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    return dt__attention_run(batch, seq, heads, kv_heads, head_dim, causal, NULL, q, k, v, y);
}

dt_status dt_kernel_attention_gqa_grad(int64_t batch, int64_t seq, int64_t heads,
                                       int64_t kv_heads, int64_t head_dim, int causal,
                                       const float *q, const float *k, const float *v,
                                       const float *dy, float *dq, float *dk, float *dv)
{
    const void *pq[] = {q, dy, dq}, *pk[] = {k, v, dk, dv};
    dt_status st = check_gqa("dt_kernel_attention_gqa_grad", batch, seq, heads, kv_heads,
                             head_dim, 3, pq, 4, pk);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    return dt__attention_grad_run(batch, seq, heads, kv_heads, head_dim, causal, NULL, q, k, v, dy,
                                  dq, dk, dv);
}
