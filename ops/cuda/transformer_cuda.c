/* The CUDA backend's transformer entries: the CPU kernels' argument checks (the labels of the
 * cross-entropy checked on the device), scratch, then the launches of transformer.cu. */
#include <limits.h>

#include "ops/cuda/cuda_ops.h"
#include "ops/ops_impl.h"
#include "runtime/error.h"

static dt_status sizes_ok(const char *op, int n, const int64_t *sizes)
{
    for (int i = 0; i < n; i++)
        if (sizes[i] < 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: negative size %lld", op,
                             (long long)sizes[i]);
    return DT_OK;
}

static dt_status ptrs_ok(const char *op, int64_t n, int np, const void *const *p)
{
    return dt__kcheck(op, n, np, p);
}

dt_status dt__cu_layer_norm(int64_t rows, int64_t cols, const float *x, const float *gamma,
                            const float *beta, float eps, float *y)
{
    static const char op[] = "dt_kernel_layer_norm (CUDA)";
    const void *p[] = {x, gamma, beta, y};
    if (cols < 1 || !(eps >= 0.0f))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: cols=%lld eps=%g", op, (long long)cols,
                         (double)eps);
    dt_status st = ptrs_ok(op, rows, 4, p);
    if (st != DT_OK || rows == 0)
        return st;
    return dt__cuda_check(dt__cuda_layer_norm(rows, cols, x, gamma, beta, eps, y, 0), op);
}

dt_status dt__cu_layer_norm_grad(int64_t rows, int64_t cols, const float *x, const float *gamma,
                                 const float *dy, float eps, float *dx, float *dgamma,
                                 float *dbeta)
{
    static const char op[] = "dt_kernel_layer_norm_grad (CUDA)";
    const void *p[] = {x, gamma, dy, dx};
    if (cols < 1 || !(eps >= 0.0f) || !dgamma || !dbeta)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: cols=%lld eps=%g, or NULL dgamma/dbeta",
                         op, (long long)cols, (double)eps);
    dt_status st = ptrs_ok(op, rows, 4, p);
    if (st != DT_OK)
        return st;
    void *stats = NULL;
    dt__cuda_lock();
    st = dt__cuda_scratch((size_t)(2 * rows + 2) * sizeof(float), &stats);
    if (st == DT_OK)
        st = dt__cuda_check(dt__cuda_layer_norm_grad(rows, cols, x, gamma, dy, eps, dx, dgamma,
                                                     dbeta, stats, 0), op);
    /* The scratch is reused by the next call on this stream only after this kernel. */
    dt__cuda_unlock();
    return st;
}

dt_status dt__cu_softmax(int64_t outer, int64_t len, int64_t inner, const float *x, float *y)
{
    static const char op[] = "dt_kernel_softmax (CUDA)";
    const int64_t s[] = {outer, len, inner};
    const void *p[] = {x, y};
    dt_status st = sizes_ok(op, 3, s);
    if (st == DT_OK)
        st = ptrs_ok(op, outer * len * inner, 2, p);
    if (st != DT_OK || outer * len * inner == 0)
        return st;
    return dt__cuda_check(dt__cuda_softmax(outer, len, inner, x, y, 0), op);
}

dt_status dt__cu_softmax_grad(int64_t outer, int64_t len, int64_t inner, const float *y,
                              const float *dy, float *dx)
{
    static const char op[] = "dt_kernel_softmax_grad (CUDA)";
    const int64_t s[] = {outer, len, inner};
    const void *p[] = {y, dy, dx};
    dt_status st = sizes_ok(op, 3, s);
    if (st == DT_OK)
        st = ptrs_ok(op, outer * len * inner, 3, p);
    if (st != DT_OK || outer * len * inner == 0)
        return st;
    return dt__cuda_check(dt__cuda_softmax_grad(outer, len, inner, y, dy, dx, 0), op);
}

dt_status dt__cu_attention(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                           int causal, const float *q, const float *k, const float *v, float *y)
{
    static const char op[] = "dt_kernel_attention (CUDA)";
    const int64_t s[] = {batch, seq, heads, head_dim};
    const void *p[] = {q, k, v, y};
    int64_t n = batch * seq * heads * head_dim;
    dt_status st = sizes_ok(op, 4, s);
    if (st == DT_OK)
        st = ptrs_ok(op, n, 4, p);
    if (st != DT_OK || n == 0)
        return st;
    if (dt__attention_cuda_tiled(head_dim)) /* ops/cuda/attention_tiled.cu */
        return dt__cuda_check(dt__cuda_attention_tiled(batch, seq, heads, heads, head_dim,
                                                       causal, q, k, v, y, 0), op);
    return dt__cuda_check(dt__cuda_attention(batch, seq, heads, head_dim, causal, q, k, v, y, 0),
                          op);
}

dt_status dt__cu_attention_grad(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                int causal, const float *q, const float *k, const float *v,
                                const float *dy, float *dq, float *dk, float *dv)
{
    static const char op[] = "dt_kernel_attention_grad (CUDA)";
    const int64_t s[] = {batch, seq, heads, head_dim};
    const void *p[] = {q, k, v, dy, dq, dk, dv};
    int64_t n = batch * seq * heads * head_dim;
    dt_status st = sizes_ok(op, 4, s);
    if (st == DT_OK)
        st = ptrs_ok(op, n, 7, p);
    if (st != DT_OK || n == 0)
        return st;
    if (dt__attention_cuda_tiled(head_dim))
        return dt__cuda_check(dt__cuda_attention_tiled_grad(batch, seq, heads, heads, head_dim,
                                                            causal, q, k, v, dy, dq, dk, dv, 0),
                              op);
    return dt__cuda_check(dt__cuda_attention_grad(batch, seq, heads, head_dim, causal, q, k, v,
                                                  dy, dq, dk, dv, 0), op);
}

/* The slice must lie in the table; the ids are checked on the device (dt__cuda_fault). */
static dt_status check_emb(const char *op, int64_t n, int64_t lo, int64_t rows, int64_t vocab,
                           int64_t dim, const void *ids, const void *p2)
{
    const int64_t s[] = {lo, rows, dim};
    const void *p[] = {ids, p2};
    dt_status st = sizes_ok(op, 3, s);
    if (st == DT_OK && lo + rows > vocab)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: bad slice (lo %lld, rows %lld of a "
                       "%lld-row table)", op, (long long)lo, (long long)rows, (long long)vocab);
    if (st == DT_OK)
        st = ptrs_ok(op, n * (dim > 0 ? 1 : 0), 2, p);
    return st;
}

dt_status dt__cu_embedding(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                           int64_t vocab, int64_t dim, const float *table, float *out)
{
    static const char op[] = "dt_kernel_embedding (CUDA)";
    unsigned long long *fault = NULL;
    dt_status st = check_emb(op, n, lo, rows, vocab, dim, ids, out);
    if (st != DT_OK || n * dim == 0)
        return st;
    st = dt__cuda_fault(op, vocab, &fault);
    if (st != DT_OK)
        return st;
    return dt__cuda_check(dt__cuda_embedding(n, ids, lo, rows, vocab, dim, table, out, fault,
                                             0), op);
}

dt_status dt__cu_embedding_grad(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                                int64_t vocab, int64_t dim, const float *dout, float *dtable)
{
    static const char op[] = "dt_kernel_embedding_grad (CUDA)";
    unsigned long long *fault = NULL;
    dt_status st = check_emb(op, n, lo, rows, vocab, dim, ids, dout);
    if (st == DT_OK && rows * dim > 0 && !dtable)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: dtable is NULL", op);
    if (st != DT_OK || rows * dim == 0)
        return st;
    if (n * dim > 0 && (st = dt__cuda_fault(op, vocab, &fault)) != DT_OK)
        return st;
    return dt__cuda_check(dt__cuda_embedding_grad(n, ids, lo, rows, vocab, dim, dout, dtable,
                                                  fault, 0), op);
}

/* Labels beyond vocab-1 fail naming the first such row (this waits for the device). */
static dt_status check_labels(const char *op, int64_t rows, int64_t vocab,
                              const int32_t *labels)
{
    void *scratch = NULL;
    unsigned long long bad = ULLONG_MAX;
    dt__cuda_lock();
    dt_status st = dt__cuda_scratch(sizeof bad, &scratch);
    if (st == DT_OK)
        st = dt__cuda_check(cudaMemsetAsync(scratch, 0xff, sizeof bad, 0), op);
    if (st == DT_OK)
        st = dt__cuda_check(dt__cuda_vocab_check_labels(rows, vocab, labels, scratch, 0), op);
    if (st == DT_OK)
        st = dt__cuda_check(cudaMemcpy(&bad, scratch, sizeof bad, cudaMemcpyDeviceToHost), op);
    dt__cuda_unlock();
    if (st == DT_OK && bad != ULLONG_MAX) { /* the CPU kernel's text: the label, then the row */
        int32_t label = 0;
        st = dt__cuda_check(cudaMemcpy(&label, labels + bad, sizeof label,
                                       cudaMemcpyDeviceToHost), op);
        if (st == DT_OK)
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: label %d of row %llu outside 0..%lld",
                           op, (int)label, bad, (long long)(vocab - 1));
    }
    return st;
}

dt_status dt__cu_vocab_xent_stats(int64_t rows, int64_t cols, const float *logits,
                                  const float *rowmax, int64_t lo, int64_t vocab,
                                  const int32_t *labels, float *sumexp, float *target)
{
    static const char op[] = "dt_kernel_vocab_xent_stats (CUDA)";
    const void *p[] = {rowmax, labels, sumexp, target};
    dt_status st = ptrs_ok(op, rows, 4, p);
    if (st == DT_OK && (cols < 0 || lo < 0 || lo + cols > vocab || (rows * cols > 0 && !logits)))
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: bad slice (cols %lld at %lld of %lld)", op,
                       (long long)cols, (long long)lo, (long long)vocab);
    if (st == DT_OK && rows > 0)
        st = check_labels(op, rows, vocab, labels);
    if (st != DT_OK || rows == 0)
        return st;
    return dt__cuda_check(dt__cuda_vocab_xent_stats(rows, cols, logits, rowmax, lo, labels,
                                                    sumexp, target, 0), op);
}

dt_status dt__cu_vocab_xent_loss(int64_t rows, const float *rowmax, const float *sumexp,
                                 const float *target, const int32_t *labels, float scale,
                                 float *loss_out)
{
    static const char op[] = "dt_kernel_vocab_xent_loss (CUDA)";
    const void *p[] = {rowmax, sumexp, target, labels};
    dt_status st = ptrs_ok(op, rows, 4, p);
    if (st == DT_OK && !loss_out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: loss_out is NULL", op);
    if (st != DT_OK)
        return st;
    return dt__cuda_check(dt__cuda_vocab_xent_loss(rows, rowmax, sumexp, target, labels, scale,
                                                   loss_out, 0), op);
}

dt_status dt__cu_vocab_xent_grad(int64_t rows, int64_t cols, const float *logits,
                                 const float *rowmax, const float *sumexp, int64_t lo,
                                 const int32_t *labels, float scale, float *dlogits)
{
    static const char op[] = "dt_kernel_vocab_xent_grad (CUDA)";
    const void *p[] = {rowmax, sumexp, labels};
    dt_status st = ptrs_ok(op, rows, 3, p);
    if (st == DT_OK && (cols < 0 || lo < 0 || (rows * cols > 0 && (!logits || !dlogits))))
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: bad slice or NULL logits", op);
    if (st != DT_OK || rows * cols == 0)
        return st;
    return dt__cuda_check(dt__cuda_vocab_xent_grad(rows, cols, logits, rowmax, sumexp, lo,
                                                   labels, scale, dlogits, 0), op);
}
