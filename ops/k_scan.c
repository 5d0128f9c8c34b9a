/* ops/k_scan: CPU kernels of the ops along one whole axis: log_softmax (stable: the max
 * subtracted, f64 sum of exponentials), its gradient dx = dy - exp(y) sum(dy), and cumsum
 * (inclusive, f64 running sum; reverse: suffix sums, cumsum's gradient). */
#include <math.h>

#include "ops/def_reduce.h"

dt_status dt__k_log_softmax(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0];
    int64_t outer, len, inner;
    dt__rd_split(x, (int)a->attrs.i[0], &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            double m = -INFINITY, s = 0;
            for (int64_t j = 0; j < len; j++) {
                double v = dt__rd_get(x->data, x->dtype, base + j * inner);
                if (v > m || isnan(v))
                    m = v;
            }
            if (isinf(m)) /* all -inf (or some +inf): x - m as the limit gives */
                m = m > 0 ? m : 0;
            for (int64_t j = 0; j < len; j++)
                s += exp(dt__rd_get(x->data, x->dtype, base + j * inner) - m);
            double lse = m + log(s);
            for (int64_t j = 0; j < len; j++)
                dt__rd_set(a->out.data, a->out.dtype, base + j * inner,
                           dt__rd_get(x->data, x->dtype, base + j * inner) - lse);
        }
    return DT_OK;
}

dt_status dt__k_log_softmax_grad(const dt_op_kernel_args *a)
{
    const dt_op_buf *y = &a->in[0], *dy = &a->in[1];
    int64_t outer, len, inner;
    dt__rd_split(y, (int)a->attrs.i[0], &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            double s = 0;
            for (int64_t j = 0; j < len; j++)
                s += dt__rd_get(dy->data, dy->dtype, base + j * inner);
            for (int64_t j = 0; j < len; j++) {
                int64_t k = base + j * inner;
                double g =
                    dt__rd_get(dy->data, dy->dtype, k) - exp(dt__rd_get(y->data, y->dtype, k)) * s;
                dt__rd_set(a->out.data, a->out.dtype, k, g);
            }
        }
    return DT_OK;
}

dt_status dt__k_cumsum(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0];
    int reverse = a->attrs.i[1] != 0;
    int64_t outer, len, inner;
    dt__rd_split(x, (int)a->attrs.i[0], &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            double s = 0;
            for (int64_t j = 0; j < len; j++) {
                int64_t k = base + (reverse ? len - 1 - j : j) * inner;
                s += dt__rd_get(x->data, x->dtype, k);
                dt__rd_set(a->out.data, a->out.dtype, k, s);
            }
        }
    return DT_OK;
}
