/* Local kernels of the vocabulary-sharded layers: embedding lookup of the rows a device holds
 * (ids of the table outside its slice give zeros, ids outside the table are errors) and its
 * gradient, and the pieces of Megatron's vocab-parallel cross-entropy (per-row sum of
 * exponentials and target logit of the local slice given the global row max, the loss from
 * the reduced statistics, the gradient). */
#include <math.h>
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

static dt_status check_emb(const char *op, int64_t n, int64_t lo, int64_t rows, int64_t vocab,
                           int64_t dim, int nptrs, const void *const *ptrs)
{
    if (lo < 0 || rows < 0 || dim < 0 || lo + rows > vocab)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: bad slice (lo %lld, rows %lld of a "
                         "%lld-row table, dim %lld)", op, (long long)lo, (long long)rows,
                         (long long)vocab, (long long)dim);
    return dt__kcheck(op, n * (dim > 0 ? 1 : 0), nptrs, ptrs);
}

/* Every id must index the whole table (PyTorch's IndexError), wherever the slice is. */
static dt_status check_ids(const char *op, int64_t n, const int32_t *ids, int64_t vocab)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: id %d (position %lld) is outside "
                             "the table of %lld rows (ids 0..%lld)", op, (int)ids[i],
                             (long long)i, (long long)vocab, (long long)(vocab - 1));
    return DT_OK;
}

dt_status dt_kernel_embedding(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                              int64_t vocab, int64_t dim, const float *table, float *out)
{
    static const char op[] = "dt_kernel_embedding";
    const void *p[] = {ids, out};
    dt_status st = check_emb(op, n, lo, rows, vocab, dim, 2, p);
    if (st == DT_OK && dim > 0)
        st = check_ids(op, n, ids, vocab);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = (int64_t)ids[i] - lo;
        if (r >= 0 && r < rows)
            memcpy(out + i * dim, table + r * dim, (size_t)dim * sizeof *out);
        else
            memset(out + i * dim, 0, (size_t)dim * sizeof *out);
    }
    return DT_OK;
}

dt_status dt_kernel_embedding_grad(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                                   int64_t vocab, int64_t dim, const float *dout, float *dtable)
{
    static const char op[] = "dt_kernel_embedding_grad";
    const void *p[] = {ids, dout};
    dt_status st = check_emb(op, n, lo, rows, vocab, dim, 2, p);
    if (st == DT_OK && rows * dim > 0 && !dtable)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: dtable is NULL", op);
    if (st == DT_OK && dim > 0)
        st = check_ids(op, n, ids, vocab);
    if (st != DT_OK)
        return st;
    if (rows * dim > 0)
        memset(dtable, 0, (size_t)(rows * dim) * sizeof *dtable);
    for (int64_t i = 0; i < n; i++) {
        int64_t r = (int64_t)ids[i] - lo;
        if (r < 0 || r >= rows)
            continue;
        for (int64_t j = 0; j < dim; j++)
            dtable[r * dim + j] += dout[i * dim + j];
    }
    return DT_OK;
}

dt_status dt_kernel_vocab_xent_stats(int64_t rows, int64_t cols, const float *logits,
                                     const float *rowmax, int64_t lo, int64_t vocab,
                                     const int32_t *labels, float *sumexp, float *target)
{
    static const char op[] = "dt_kernel_vocab_xent_stats";
    const void *p[] = {rowmax, labels, sumexp, target};
    dt_status st = dt__kcheck(op, rows, 4, p);
    if (st == DT_OK && (cols < 0 || lo < 0 || lo + cols > vocab || (rows * cols > 0 && !logits)))
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: bad slice (cols %lld at %lld of %lld)", op,
                       (long long)cols, (long long)lo, (long long)vocab);
    for (int64_t i = 0; st == DT_OK && i < rows; i++)
        if (labels[i] >= vocab)
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: label %d of row %lld outside 0..%lld",
                           op, (int)labels[i], (long long)i, (long long)(vocab - 1));
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < rows; i++) {
        const float *x = logits + i * cols;
        double s = dt__vexp_sum(cols, x, rowmax[i], NULL);
        int64_t t = (int64_t)labels[i] - lo;
        sumexp[i] = (float)s;
        target[i] = t >= 0 && t < cols ? x[t] : 0.0f;
    }
    return DT_OK;
}

dt_status dt_kernel_vocab_xent_loss(int64_t rows, const float *rowmax, const float *sumexp,
                                    const float *target, const int32_t *labels, float scale,
                                    float *loss_out)
{
    const void *p[] = {rowmax, sumexp, target, labels};
    dt_status st = dt__kcheck("dt_kernel_vocab_xent_loss", rows, 4, p);
    if (st == DT_OK && !loss_out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_vocab_xent_loss: loss_out is NULL");
    if (st != DT_OK)
        return st;
    double total = 0.0;
    for (int64_t i = 0; i < rows; i++)
        if (labels[i] >= 0)
            total += log((double)sumexp[i]) + (double)rowmax[i] - (double)target[i];
    *loss_out = (float)(scale * total);
    return DT_OK;
}

dt_status dt_kernel_vocab_xent_grad(int64_t rows, int64_t cols, const float *logits,
                                    const float *rowmax, const float *sumexp, int64_t lo,
                                    const int32_t *labels, float scale, float *dlogits)
{
    const void *p[] = {rowmax, sumexp, labels};
    dt_status st = dt__kcheck("dt_kernel_vocab_xent_grad", rows, 3, p);
    if (st == DT_OK && (cols < 0 || lo < 0 || (rows * cols > 0 && (!logits || !dlogits))))
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_vocab_xent_grad: bad slice (cols "
                       "%lld at %lld) or NULL logits", (long long)cols, (long long)lo);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < rows; i++) {
        const float *x = logits + i * cols;
        float *d = dlogits + i * cols;
        float inv = 1.0f / sumexp[i];
        int64_t t = (int64_t)labels[i] - lo;
        if (labels[i] < 0) {
            memset(d, 0, (size_t)cols * sizeof *d);
            continue;
        }
        /* scale (p - one_hot), p = exp(x - max) / sumexp. */
        dt__vexp_scale(cols, x, rowmax[i], inv, scale, d);
        if (t >= 0 && t < cols) {
            float pt;
            dt__vexp_scale(1, x + t, rowmax[i], inv, 1.0f, &pt);
            d[t] = scale * (pt - 1.0f);
        }
    }
    return DT_OK;
}

/* Whole-row cross-entropy (the vocabulary on one device: lo 0, cols == vocab), row by row so
 * that each row of logits is read from memory once and its other passes hit the cache. The
 * results are bit for bit those of the pieces above: the same row max (the reduce kernel on
 * one row), the same sum of exponentials, the same products. */

static dt_status rows_check(const char *op, int64_t rows, int64_t cols, const float *logits,
                            const int32_t *labels, const void *out)
{
    const void *p[] = {labels, out};
    dt_status st = dt__kcheck(op, rows, 2, p);
    if (st == DT_OK && (cols < 1 || (rows > 0 && !logits)))
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %lld classes or NULL logits", op,
                       (long long)cols);
    for (int64_t i = 0; st == DT_OK && i < rows; i++)
        if (labels[i] >= cols)
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: label %d of row %lld outside 0..%lld",
                           op, (int)labels[i], (long long)i, (long long)(cols - 1));
    return st;
}

dt_status dt__kernel_vocab_xent_rows_stats(int64_t rows, int64_t cols, const float *logits,
                                           const int32_t *labels, float *rowmax,
                                           float *sumexp, float *target)
{
    static const char op[] = "dt_kernel_vocab_xent_stats";
    dt_status st = rows_check(op, rows, cols, logits, labels, rowmax);
    if (st == DT_OK && rows > 0 && (!sumexp || !target))
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL output", op);
    for (int64_t i = 0; st == DT_OK && i < rows; i++) {
        const float *x = logits + i * cols;
        st = dt_kernel_reduce_axis(DT_REDUCE_MAX, 1, cols, 1, x, rowmax + i);
        if (st != DT_OK)
            break;
        sumexp[i] = (float)dt__vexp_sum(cols, x, rowmax[i], NULL);
        target[i] = labels[i] >= 0 ? x[labels[i]] : 0.0f;
    }
    return st;
}

dt_status dt__kernel_vocab_xent_rows_grad(int64_t rows, int64_t cols, const float *logits,
                                          const int32_t *labels, float scale, float *dlogits)
{
    static const char op[] = "dt_kernel_vocab_xent_grad";
    dt_status st = rows_check(op, rows, cols, logits, labels, dlogits);
    for (int64_t i = 0; st == DT_OK && i < rows; i++) {
        const float *x = logits + i * cols;
        float *d = dlogits + i * cols;
        int64_t t = labels[i];
        if (t < 0) {
            memset(d, 0, (size_t)cols * sizeof *d);
            continue;
        }
        float mx;
        st = dt_kernel_reduce_axis(DT_REDUCE_MAX, 1, cols, 1, x, &mx);
        if (st != DT_OK)
            break;
        /* d = exp(x - max) while summing, then scale (d / sumexp - onehot) in the cache. */
        float inv = 1.0f / (float)dt__vexp_sum(cols, x, mx, d);
        dt__vmul2(cols, inv, scale, d);
        float pt;
        dt__vexp_scale(1, x + t, mx, inv, 1.0f, &pt);
        d[t] = scale * (pt - 1.0f);
    }
    return st;
}
