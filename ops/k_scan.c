/* ops/k_scan: CPU kernels of the ops along one whole axis: log_softmax (stable: the max
 * subtracted, f64 sum of exponentials), its gradient dx = dy - exp(y) sum(dy), and cumsum
 * (inclusive, f64 running sum; reverse: suffix sums, cumsum's gradient). Each works on the
 * [outer, len, inner] view a slice [len, inner] at a time in memory order, with f64 state per
 * inner position (every line still sees its elements in axis order). */
#include <math.h>
#include <stdlib.h>

#include "ops/def_reduce.h"
#include "runtime/error.h"

static dt_status state(int64_t inner, int k, double **buf)
{
    *buf = malloc(sizeof(double) * (size_t)(inner > 0 ? inner : 1) * (size_t)k);
    if (!*buf)
        return dt__error(DT_ERR_NO_MEMORY, "axis op: no memory for %lld accumulators",
                         (long long)inner * k);
    return DT_OK;
}

dt_status dt__k_log_softmax(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0];
    int64_t outer, len, inner;
    dt__rd_split(x, (int)a->attrs.i[0], &outer, &len, &inner);
    double *m;
    dt_status st = state(inner, 2, &m);
    if (st != DT_OK)
        return st;
    double *s = m + (inner > 0 ? inner : 1);
    for (int64_t o = 0; o < outer; o++) {
        int64_t base = o * len * inner;
        for (int64_t i = 0; i < inner; i++) {
            m[i] = -INFINITY;
            s[i] = 0;
        }
        for (int64_t j = 0; j < len; j++)
            for (int64_t i = 0; i < inner; i++) {
                double v = dt__rd_get(x->data, x->dtype, base + j * inner + i);
                if (v > m[i] || isnan(v))
                    m[i] = v;
            }
        for (int64_t i = 0; i < inner; i++)
            if (isinf(m[i])) /* all -inf (or some +inf): x - m as the limit gives */
                m[i] = m[i] > 0 ? m[i] : 0;
        for (int64_t j = 0; j < len; j++)
            for (int64_t i = 0; i < inner; i++)
                s[i] += exp(dt__rd_get(x->data, x->dtype, base + j * inner + i) - m[i]);
        for (int64_t i = 0; i < inner; i++)
            m[i] += log(s[i]); /* the log-sum-exp */
        for (int64_t j = 0; j < len; j++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t k = base + j * inner + i;
                dt__rd_set(a->out.data, a->out.dtype, k, dt__rd_get(x->data, x->dtype, k) - m[i]);
            }
    }
    free(m);
    return DT_OK;
}

dt_status dt__k_log_softmax_grad(const dt_op_kernel_args *a)
{
    const dt_op_buf *y = &a->in[0], *dy = &a->in[1];
    int64_t outer, len, inner;
    dt__rd_split(y, (int)a->attrs.i[0], &outer, &len, &inner);
    double *s;
    dt_status st = state(inner, 1, &s);
    if (st != DT_OK)
        return st;
    for (int64_t o = 0; o < outer; o++) {
        int64_t base = o * len * inner;
        for (int64_t i = 0; i < inner; i++)
            s[i] = 0;
        for (int64_t j = 0; j < len; j++)
            for (int64_t i = 0; i < inner; i++)
                s[i] += dt__rd_get(dy->data, dy->dtype, base + j * inner + i);
        for (int64_t j = 0; j < len; j++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t k = base + j * inner + i;
                double g = dt__rd_get(dy->data, dy->dtype, k) -
                           exp(dt__rd_get(y->data, y->dtype, k)) * s[i];
                dt__rd_set(a->out.data, a->out.dtype, k, g);
            }
    }
    free(s);
    return DT_OK;
}

dt_status dt__k_cumsum(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0];
    int reverse = a->attrs.i[1] != 0;
    int64_t outer, len, inner;
    dt__rd_split(x, (int)a->attrs.i[0], &outer, &len, &inner);
    double *s;
    dt_status st = state(inner, 1, &s);
    if (st != DT_OK)
        return st;
    for (int64_t o = 0; o < outer; o++) {
        int64_t base = o * len * inner;
        for (int64_t i = 0; i < inner; i++)
            s[i] = 0;
        for (int64_t jj = 0; jj < len; jj++) {
            int64_t row = base + (reverse ? len - 1 - jj : jj) * inner;
            for (int64_t i = 0; i < inner; i++) {
                s[i] += dt__rd_get(x->data, x->dtype, row + i);
                dt__rd_set(a->out.data, a->out.dtype, row + i, s[i]);
            }
        }
    }
    free(s);
    return DT_OK;
}
