/* ops/k_sum: the CPU kernels of the family's two sums: sum_to (a gradient summed back to the
 * shape an operand was broadcast from) and mse's partial sum of squared differences. Both
 * accumulate in f64 in row-major order of the local block, whatever the dtype. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/def_elem.h"
#include "runtime/error.h"

typedef struct sum_run {
    const void *g;
    dt_dtype t;
    double *acc;
    int inner; /* the output's inner stride: 0 or 1 */
} sum_run;

static void sum_row(int64_t row, const int64_t *offs, int64_t len, void *ctx)
{
    const sum_run *r = ctx;
    double *acc = r->acc + offs[0];
    if (r->t == DT_DTYPE_F32) {
        const float *g = (const float *)r->g + row * len;
        if (r->inner)
            for (int64_t i = 0; i < len; i++)
                acc[i] += (double)g[i];
        else
            for (int64_t i = 0; i < len; i++)
                acc[0] += (double)g[i];
    } else {
        const double *g = (const double *)r->g + row * len;
        if (r->inner)
            for (int64_t i = 0; i < len; i++)
                acc[i] += g[i];
        else
            for (int64_t i = 0; i < len; i++)
                acc[0] += g[i];
    }
}

dt_status dt__k_sum_to(const dt_op_kernel_args *a)
{
    const dt_op_buf *g = &a->in[0], *o = &a->out;
    if (g->dtype != o->dtype || (g->dtype != DT_DTYPE_F32 && g->dtype != DT_DTYPE_F64))
        return dt__error(DT_ERR_SHAPE, "sum_to kernel: dtype %s not supported",
                         dt_dtype_name(g->dtype));
    int64_t no = dt__op_numel(o);
    double *acc = g->dtype == DT_DTYPE_F64 ? o->data : malloc((size_t)(no ? no : 1) * sizeof *acc);
    if (!acc)
        return dt__error(DT_ERR_NO_MEMORY, "sum_to: %lld accumulators", (long long)no);
    memset(acc, 0, (size_t)no * sizeof *acc);
    dt__ew_plan p;
    if (dt__ew_plan_make(g->rank, g->shape, 1, o, &p) > 0) {
        sum_run r = {.g = g->data, .t = g->dtype, .acc = acc,
                     .inner = p.n[p.rank - 1] > 1 && p.st[0][p.rank - 1] != 0};
        dt__ew_plan_rows(&p, sum_row, &r);
    }
    if (g->dtype == DT_DTYPE_F32) {
        float *y = o->data;
        for (int64_t i = 0; i < no; i++)
            y[i] = (float)acc[i];
        free(acc);
    }
    return DT_OK;
}

dt_status dt__k_mse(const dt_op_kernel_args *a)
{
    const dt_op_buf *p = &a->in[0], *t = &a->in[1];
    if (p->dtype != t->dtype || a->out.dtype != p->dtype ||
        (p->dtype != DT_DTYPE_F32 && p->dtype != DT_DTYPE_F64))
        return dt__error(DT_ERR_SHAPE, "mse kernel: dtypes %s and %s not supported",
                         dt_dtype_name(p->dtype), dt_dtype_name(t->dtype));
    int64_t n = dt__op_numel(p), count = 1;
    for (int d = 0; d < p->rank; d++)
        count *= p->global[d];
    double s = 0.0;
    if (p->dtype == DT_DTYPE_F32) {
        const float *x = p->data, *y = t->data;
        for (int64_t i = 0; i < n; i++) {
            double d = (double)x[i] - (double)y[i];
            s += d * d;
        }
        *(float *)a->out.data = count ? (float)(s / (double)count) : NAN;
    } else {
        const double *x = p->data, *y = t->data;
        for (int64_t i = 0; i < n; i++) {
            double d = x[i] - y[i];
            s += d * d;
        }
        *(double *)a->out.data = count ? s / (double)count : (double)NAN;
    }
    return DT_OK;
}
