/* Local scaled dot-product self-attention with an optional causal mask, and its gradient
 * (which recomputes the attention weights instead of storing them); grouped-query attention
 * (ops/llama.c) runs the same code. Long sequences go to the tiled kernel
 * (ops/attention_tiled.c; dt_attention_kernel_set chooses). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

static dt_status check_attn(const char *op, int64_t batch, int64_t seq, int64_t heads,
                            int64_t head_dim, int nptrs, const void *const *ptrs)
{
    if (batch < 0 || seq < 0 || heads < 0 || head_dim < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: negative size (batch %lld, seq %lld, "
                         "heads %lld, head_dim %lld)", op, (long long)batch, (long long)seq,
                         (long long)heads, (long long)head_dim);
    return dt__kcheck(op, batch * seq * heads * head_dim, nptrs, ptrs);
}

/* Attention weights p[0..n-1] of query row q against key rows k (stride ld), n = t + 1 under
 * the causal mask, else seq. Returns n. */
static int64_t weights(int64_t n, int64_t hd, int64_t ld, float scale, const float *q,
                       const float *k, float *p)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        p[j] = dt__vdot(hd, q, k + j * ld) * scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    double sum = dt__vexp_sum(n, p, mx, p);
    float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < n; j++)
        p[j] *= inv;
    return n;
}

/* The kernel choice: -1 until first read (then DT_ATTENTION_KERNEL from the environment). */
static _Atomic int kernel_choice = -1;

static int choice(void)
{
    int c = atomic_load(&kernel_choice);
    if (c >= 0)
        return c;
    const char *env = getenv("DT_ATTENTION_KERNEL");
    c = DT_ATTENTION_KERNEL_AUTO;
    if (env && strcmp(env, "tiled") == 0)
        c = DT_ATTENTION_KERNEL_TILED;
    else if (env && strcmp(env, "untiled") == 0)
        c = DT_ATTENTION_KERNEL_UNTILED;
    int unread = -1;
    atomic_compare_exchange_strong(&kernel_choice, &unread, c);
    return atomic_load(&kernel_choice);
}

dt_attention_kernel dt_attention_kernel_set(dt_attention_kernel kernel)
{
    int old = choice();
    if (kernel == DT_ATTENTION_KERNEL_AUTO || kernel == DT_ATTENTION_KERNEL_UNTILED ||
        kernel == DT_ATTENTION_KERNEL_TILED)
        atomic_store(&kernel_choice, (int)kernel);
    return (dt_attention_kernel)old;
}

int dt__attention_cuda_tiled(int64_t head_dim)
{
    return choice() == DT_ATTENTION_KERNEL_TILED && head_dim <= DT__CUDA_TILED_MAXD;
}

int dt__attention_use_tiled(int64_t seq)
{
    int c = choice();
    return c == DT_ATTENTION_KERNEL_TILED ||
           (c == DT_ATTENTION_KERNEL_AUTO && seq >= DT_ATTENTION_TILED_MIN_SEQ);
}

/* The kernels proper, for q, y [batch, seq, heads * head_dim] and k, v [batch, seq,
 * kv_heads * head_dim] (query head h reads kv head h / (heads / kv_heads): grouped-query
 * attention; kv_heads == heads is plain attention, so both ops give the same bits), the
 * probabilities dropped as drop says (NULL: none). Sizes are checked and non-empty. */
dt_status dt__attention_run(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                            int64_t head_dim, int causal, const dt__attn_drop *drop,
                            const float *q, const float *k, const float *v, float *y)
{
    if (dt__attention_use_tiled(seq))
        return dt__attention_tiled_run(batch, seq, heads, kv_heads, head_dim, causal, drop, q, k,
                                       v, y, NULL);
    float *p = malloc(2 * (size_t)seq * sizeof *p);
    if (!p)
        return dt__error(DT_ERR_NO_MEMORY, "attention: out of memory");
    float *z = p + seq;
    int64_t ld = heads * head_dim, kld = kv_heads * head_dim, group = heads / kv_heads;
    float scale = 1.0f / sqrtf((float)head_dim);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t base = b * seq * ld + h * head_dim;
            int64_t kbase = b * seq * kld + (h / group) * head_dim;
            for (int64_t t = 0; t < seq; t++) {
                int64_t n = weights(causal ? t + 1 : seq, head_dim, kld, scale,
                                    q + base + t * ld, k + kbase, p);
                if (drop) {
                    dt__attn_drop_row(drop, b, h, t, 0, n, z);
                    for (int64_t j = 0; j < n; j++)
                        p[j] *= z[j];
                }
                float *yr = y + base + t * ld;
                for (int64_t d = 0; d < head_dim; d++)
                    yr[d] = 0.0f;
                for (int64_t j = 0; j < n; j++)
                    dt__vaxpy(head_dim, p[j], v + kbase + j * kld, yr);
            }
        }
    free(p);
    return DT_OK;
}

dt_status dt__attention_grad_run(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                 int64_t head_dim, int causal, const dt__attn_drop *drop,
                                 const float *q, const float *k, const float *v,
                                 const float *dy, float *dq, float *dk, float *dv)
{
    if (dt__attention_use_tiled(seq))
        return dt__attention_tiled_grad_run(batch, seq, heads, kv_heads, head_dim, causal, drop,
                                            q, k, v, dy, dq, dk, dv);
    float *p = malloc(3 * (size_t)seq * sizeof *p);
    if (!p)
        return dt__error(DT_ERR_NO_MEMORY, "attention gradient: out of memory");
    float *dp = p + seq, *z = dp + seq;
    int64_t total = batch * seq * heads * head_dim, ktotal = batch * seq * kv_heads * head_dim;
    memset(dq, 0, (size_t)total * sizeof *dq);
    memset(dk, 0, (size_t)ktotal * sizeof *dk);
    memset(dv, 0, (size_t)ktotal * sizeof *dv);
    int64_t ld = heads * head_dim, kld = kv_heads * head_dim, group = heads / kv_heads;
    float scale = 1.0f / sqrtf((float)head_dim);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t base = b * seq * ld + h * head_dim;
            int64_t kbase = b * seq * kld + (h / group) * head_dim;
            for (int64_t t = 0; t < seq; t++) {
                const float *qt = q + base + t * ld, *dyt = dy + base + t * ld;
                int64_t n = weights(causal ? t + 1 : seq, head_dim, kld, scale, qt, k + kbase, p);
                if (drop) /* y = sum_j p_j z_j v_j: dL/dp_j = z_j (dy . v_j) */
                    dt__attn_drop_row(drop, b, h, t, 0, n, z);
                double dot = 0.0;
                for (int64_t j = 0; j < n; j++) {
                    float s = dt__vdot(head_dim, dyt, v + kbase + j * kld);
                    dp[j] = drop ? s * z[j] : s;
                    dot += (double)p[j] * dp[j];
                }
                float *dqt = dq + base + t * ld;
                for (int64_t j = 0; j < n; j++) {
                    /* Softmax backward, then the scaled products. */
                    float ds = p[j] * (dp[j] - (float)dot) * scale;
                    const float *kj = k + kbase + j * kld;
                    float *dkj = dk + kbase + j * kld, *dvj = dv + kbase + j * kld;
                    dt__vaxpy(head_dim, ds, kj, dqt);
                    dt__vaxpy(head_dim, ds, qt, dkj);
                    dt__vaxpy(head_dim, drop ? p[j] * z[j] : p[j], dyt, dvj);
                }
            }
        }
    free(p);
    return DT_OK;
}

dt_status dt_kernel_attention(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                              int causal, const float *q, const float *k, const float *v,
                              float *y)
{
    const void *ptrs[] = {q, k, v, y};
    dt_status st = check_attn("dt_kernel_attention", batch, seq, heads, head_dim, 4, ptrs);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    return dt__attention_run(batch, seq, heads, heads, head_dim, causal, NULL, q, k, v, y);
}

dt_status dt_kernel_attention_grad(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                   int causal, const float *q, const float *k, const float *v,
                                   const float *dy, float *dq, float *dk, float *dv)
{
    const void *ptrs[] = {q, k, v, dy, dq, dk, dv};
    dt_status st = check_attn("dt_kernel_attention_grad", batch, seq, heads, head_dim, 7, ptrs);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    return dt__attention_grad_run(batch, seq, heads, heads, head_dim, causal, NULL, q, k, v, dy,
                                  dq, dk, dv);
}

/* ---- with dropout of the probabilities -------------------------------------------------- */

static dt_status check_drop(const char *op, int64_t batch, int64_t seq, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, float p, int nptrs,
                            const void *const *ptrs)
{
    if (!(p >= 0.0f && p < 1.0f))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: dropout %g must be in [0, 1)", op,
                         (double)p);
    if (heads > 0 && (kv_heads < 1 || heads % kv_heads != 0))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: kv_heads %lld does not divide heads %lld",
                         op, (long long)kv_heads, (long long)heads);
    return check_attn(op, batch, seq, heads, head_dim, nptrs, ptrs);
}

dt_status dt__kernel_attention_drop(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, int causal, const dt__attn_drop *drop,
                                    const float *q, const float *k, const float *v, float *y)
{
    const void *ptrs[] = {q, k, v, y, drop};
    dt_status st = check_drop("attention (dropout)", batch, seq, heads, kv_heads, head_dim,
                              drop ? drop->p : 0.0f, 5, ptrs);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    return dt__attention_run(batch, seq, heads, kv_heads, head_dim, causal,
                             drop->p > 0.0f ? drop : NULL, q, k, v, y);
}

dt_status dt__kernel_attention_drop_grad(int64_t batch, int64_t seq, int64_t heads,
                                         int64_t kv_heads, int64_t head_dim, int causal,
                                         const dt__attn_drop *drop, const float *q,
                                         const float *k, const float *v, const float *dy,
                                         float *dq, float *dk, float *dv)
{
    const void *ptrs[] = {q, k, v, dy, dq, dk, dv, drop};
    dt_status st = check_drop("attention gradient (dropout)", batch, seq, heads, kv_heads,
                              head_dim, drop ? drop->p : 0.0f, 8, ptrs);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    return dt__attention_grad_run(batch, seq, heads, kv_heads, head_dim, causal,
                                  drop->p > 0.0f ? drop : NULL, q, k, v, dy, dq, dk, dv);
}

/* The whole tensors: the mask's rows at offsets 0. */
dt_status dt_kernel_attention_dropout(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                      int64_t head_dim, int causal, float p, uint64_t seed,
                                      uint64_t stream, const float *q, const float *k,
                                      const float *v, float *y)
{
    const void *ptrs[] = {q, k, v, y};
    dt_status st = check_drop("dt_kernel_attention_dropout", batch, seq, heads, kv_heads,
                              head_dim, p, 4, ptrs);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    dt__attn_drop d = {.p = p, .seed = seed, .stream = stream, .heads = heads, .seq = seq};
    return dt__attention_run(batch, seq, heads, kv_heads, head_dim, causal, p > 0.0f ? &d : NULL,
                             q, k, v, y);
}

dt_status dt_kernel_attention_dropout_grad(int64_t batch, int64_t seq, int64_t heads,
                                           int64_t kv_heads, int64_t head_dim, int causal,
                                           float p, uint64_t seed, uint64_t stream,
                                           const float *q, const float *k, const float *v,
                                           const float *dy, float *dq, float *dk, float *dv)
{
    const void *ptrs[] = {q, k, v, dy, dq, dk, dv};
    dt_status st = check_drop("dt_kernel_attention_dropout_grad", batch, seq, heads, kv_heads,
                              head_dim, p, 7, ptrs);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    dt__attn_drop d = {.p = p, .seed = seed, .stream = stream, .heads = heads, .seq = seq};
    return dt__attention_grad_run(batch, seq, heads, kv_heads, head_dim, causal,
                                  p > 0.0f ? &d : NULL, q, k, v, dy, dq, dk, dv);
}
