/* The CUDA backend's Llama-style entries: the CPU kernels' argument checks (ops/llama.c),
 * scratch for the RMS norm gradient, then the launches of llama.cu. */
#include "ops/cuda/cuda_ops.h"
#include "ops/ops_impl.h"
#include "runtime/error.h"

dt_status dt__cu_rms_norm(int64_t rows, int64_t cols, const float *x, const float *gain,
                          float eps, float *y)
{
    static const char op[] = "dt_kernel_rms_norm (CUDA)";
    const void *p[] = {x, gain, y};
    if (cols < 1 || !(eps >= 0.0f))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: cols=%lld eps=%g", op, (long long)cols,
                         (double)eps);
    dt_status st = dt__kcheck(op, rows, 3, p);
    if (st != DT_OK || rows == 0)
        return st;
    return dt__cuda_check(dt__cuda_rms_norm(rows, cols, x, gain, eps, y, 0), op);
}

dt_status dt__cu_rms_norm_grad(int64_t rows, int64_t cols, const float *x, const float *gain,
                               const float *dy, float eps, float *dx, float *dgain)
{
    static const char op[] = "dt_kernel_rms_norm_grad (CUDA)";
    const void *p[] = {x, gain, dy, dx};
    if (cols < 1 || !(eps >= 0.0f) || !dgain)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: cols=%lld eps=%g, or NULL dgain", op,
                         (long long)cols, (double)eps);
    dt_status st = dt__kcheck(op, rows, 4, p);
    if (st != DT_OK)
        return st;
    void *stats = NULL;
    dt__cuda_lock();
    st = dt__cuda_scratch((size_t)(rows + 1) * sizeof(float), &stats);
    if (st == DT_OK)
        st = dt__cuda_check(dt__cuda_rms_norm_grad(rows, cols, x, gain, dy, eps, dx, dgain,
                                                   stats, 0), op);
    dt__cuda_unlock();
    return st;
}

dt_status dt__cu_rope(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                      int64_t pos_offset, int inverse, const float *x, float *y)
{
    static const char op[] = "dt_kernel_rope (CUDA)";
    if (batch < 0 || seq < 0 || heads < 0 || head_dim < 0 || head_dim % 2 != 0 ||
        pos_offset < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: bad sizes (head_dim %lld must be even, "
                         "pos_offset %lld >= 0)", op, (long long)head_dim,
                         (long long)pos_offset);
    const void *p[] = {x, y};
    int64_t n = batch * seq * heads * head_dim;
    dt_status st = dt__kcheck(op, n, 2, p);
    if (st != DT_OK || n == 0)
        return st;
    return dt__cuda_check(dt__cuda_rope(batch, seq, heads, head_dim, pos_offset, inverse, x, y,
                                        0), op);
}

dt_status dt__cu_swiglu(int64_t n, const float *gate, const float *up, float *y)
{
    static const char op[] = "dt_kernel_swiglu (CUDA)";
    const void *p[] = {gate, up, y};
    dt_status st = dt__kcheck(op, n, 3, p);
    if (st != DT_OK || n == 0)
        return st;
    return dt__cuda_check(dt__cuda_swiglu(n, gate, up, y, 0), op);
}

dt_status dt__cu_swiglu_grad(int64_t n, const float *gate, const float *up, const float *dy,
                             float *dgate, float *dup)
{
    static const char op[] = "dt_kernel_swiglu_grad (CUDA)";
    const void *p[] = {gate, up, dy, dgate, dup};
    dt_status st = dt__kcheck(op, n, 5, p);
    if (st != DT_OK || n == 0)
        return st;
    return dt__cuda_check(dt__cuda_swiglu_grad(n, gate, up, dy, dgate, dup, 0), op);
}

static dt_status gqa_ok(const char *op, int64_t batch, int64_t seq, int64_t heads,
                        int64_t kv_heads, int64_t head_dim, int nq, const void *const *pq,
                        int nk, const void *const *pk)
{
    if (batch < 0 || seq < 0 || heads < 0 || head_dim < 0 || kv_heads < 0 ||
        (heads > 0 && (kv_heads < 1 || heads % kv_heads != 0)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: bad sizes (heads %lld, kv_heads %lld)",
                         op, (long long)heads, (long long)kv_heads);
    dt_status st = dt__kcheck(op, batch * seq * heads * head_dim, nq, pq);
    if (st == DT_OK)
        st = dt__kcheck(op, batch * seq * kv_heads * head_dim, nk, pk);
    return st;
}

dt_status dt__cu_attention_gqa(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, int causal, const float *q, const float *k,
                               const float *v, float *y)
{
    static const char op[] = "dt_kernel_attention_gqa (CUDA)";
    const void *pq[] = {q, y}, *pk[] = {k, v};
    dt_status st = gqa_ok(op, batch, seq, heads, kv_heads, head_dim, 2, pq, 2, pk);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    if (dt__attention_cuda_tiled(head_dim)) /* ops/cuda/attention_tiled.cu */
        return dt__cuda_check(dt__cuda_attention_tiled(batch, seq, heads, kv_heads, head_dim,
                                                       causal, q, k, v, y, 0), op);
    return dt__cuda_check(dt__cuda_attention_gqa(batch, seq, heads, kv_heads, head_dim, causal,
                                                 q, k, v, y, 0), op);
}

dt_status dt__cu_attention_gqa_grad(int64_t batch, int64_t seq, int64_t heads,
                                    int64_t kv_heads, int64_t head_dim, int causal,
                                    const float *q, const float *k, const float *v,
                                    const float *dy, float *dq, float *dk, float *dv)
{
    static const char op[] = "dt_kernel_attention_gqa_grad (CUDA)";
    const void *pq[] = {q, dy, dq}, *pk[] = {k, v, dk, dv};
    dt_status st = gqa_ok(op, batch, seq, heads, kv_heads, head_dim, 3, pq, 4, pk);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    if (dt__attention_cuda_tiled(head_dim))
        return dt__cuda_check(dt__cuda_attention_tiled_grad(batch, seq, heads, kv_heads,
                                                            head_dim, causal, q, k, v, dy, dq,
                                                            dk, dv, 0), op);
    return dt__cuda_check(dt__cuda_attention_gqa_grad(batch, seq, heads, kv_heads, head_dim,
                                                      causal, q, k, v, dy, dq, dk, dv, 0), op);
}
