/* ops/k_xent: CPU kernels of cross_entropy (PyTorch's reduction='mean' with ignore_index):
 * the count of the positions that are not ignored (label_count), the local sum of
 * (logsumexp(row) - row[label]) / count over the block's rows (f64, row order), and its
 * gradient dy / count * (softmax(row) - onehot(label)), zero on ignored rows. */
#include <math.h>

#include "ops/def_reduce.h"
#include "runtime/error.h"

dt_status dt__k_label_count(const dt_op_kernel_args *a)
{
    const dt_op_buf *lb = &a->in[0];
    int64_t n = dt__op_numel(lb), c = 0;
    for (int64_t r = 0; r < n; r++)
        c += dt__rd_geti(lb->data, lb->dtype, r) != a->attrs.i[0];
    *(int64_t *)a->out.data = c;
    return DT_OK;
}

/* Row r's label, -1 when ignored; DT_ERR_INVALID_ARGUMENT outside 0..classes-1. */
static dt_status label_at(const dt_op_buf *lb, int64_t r, int64_t classes, int64_t ignore,
                          int64_t *out)
{
    int64_t l = dt__rd_geti(lb->data, lb->dtype, r);
    if (l == ignore) {
        *out = -1;
        return DT_OK;
    }
    if (l < 0 || l >= classes)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "cross_entropy: label %lld out of range 0..%lld (ignore_index %lld)",
                         (long long)l, (long long)classes - 1, (long long)ignore);
    *out = l;
    return DT_OK;
}

static double row_lse(const dt_op_buf *x, int64_t base, int64_t classes)
{
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < classes; j++) {
        double v = dt__rd_get(x->data, x->dtype, base + j);
        if (v > m || isnan(v))
            m = v;
    }
    if (isinf(m))
        return m;
    for (int64_t j = 0; j < classes; j++)
        s += exp(dt__rd_get(x->data, x->dtype, base + j) - m);
    return m + log(s);
}

dt_status dt__k_cross_entropy(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *lb = &a->in[1];
    int64_t classes = x->shape[x->rank - 1];
    int64_t rows = classes ? dt__op_numel(x) / classes : dt__op_numel(lb);
    double count = (double)dt__rd_geti(a->in[2].data, a->in[2].dtype, 0), acc = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t l = -1;
        dt_status st = label_at(lb, r, classes, a->attrs.i[0], &l);
        if (st != DT_OK)
            return st;
        if (l >= 0)
            acc +=
                row_lse(x, r * classes, classes) - dt__rd_get(x->data, x->dtype, r * classes + l);
    }
    dt__rd_set(a->out.data, a->out.dtype, 0, acc / count);
    return DT_OK;
}

dt_status dt__k_cross_entropy_grad(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *lb = &a->in[1];
    int64_t classes = x->shape[x->rank - 1];
    int64_t rows = classes ? dt__op_numel(x) / classes : 0;
    double count = (double)dt__rd_geti(a->in[2].data, a->in[2].dtype, 0);
    double g = dt__rd_get(a->in[3].data, a->in[3].dtype, 0) / count;
    for (int64_t r = 0; r < rows; r++) {
        int64_t l = -1;
        dt_status st = label_at(lb, r, classes, a->attrs.i[0], &l);
        if (st != DT_OK)
            return st;
        double lse = l >= 0 ? row_lse(x, r * classes, classes) : 0;
        for (int64_t j = 0; j < classes; j++) {
            int64_t k = r * classes + j;
            double d = 0;
            if (l >= 0)
                d = g * (exp(dt__rd_get(x->data, x->dtype, k) - lse) - (j == l));
            dt__rd_set(a->out.data, a->out.dtype, k, d);
        }
    }
    return DT_OK;
}
