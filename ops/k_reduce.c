/* ops/k_reduce: CPU kernels of the reductions over a set of axes (sum, mean, max, min,
 * logsumexp, var, argmax, argmin) and of their one gradient op (reduce_grad), on local blocks.
 * Every output element reduces its elements in row-major order with f64 accumulation, so a
 * layout that keeps the reduced axes whole gives the single device's bits. */
#include <math.h>
#include <stdlib.h>

#include "ops/def_reduce.h"
#include "runtime/error.h"

/* How a block's elements are visited: the kept dims (adjacent ones merged) by an odometer in
 * row-major order, and for each kept position the reduced sub-box in row-major order: red[r]
 * the offsets of its outer dims, then `len` elements `step` apart (its innermost run of
 * adjacent reduced dims, merged). Memory: one offset per outer position, not per element. */
typedef struct offsets {
    int nk;
    int64_t ksz[DT_MAX_RANK], kst[DT_MAX_RANK], nkept;
    int64_t *red, nred, len, step;
} offsets;

#define FOR_RED(o, base, i)                                                                        \
    for (int64_t r_ = 0; r_ < (o)->nred; r_++)                                                     \
        for (int64_t j_ = 0, i = (base) + (o)->red[r_]; j_ < (o)->len; j_++, i += (o)->step)

static dt_status offsets_make(const dt_op_buf *x, uint64_t mask, offsets *o)
{
    int64_t stride[DT_MAX_RANK], rsz[DT_MAX_RANK], rst[DT_MAX_RANK];
    int nr = 0;
    int64_t s = 1;
    for (int d = x->rank - 1; d >= 0; d--) {
        stride[d] = s;
        s *= x->shape[d];
    }
    o->nk = 0;
    o->nkept = 1;
    for (int d = 0; d < x->rank; d++) {
        int red = mask >> d & 1, merge = d > 0 && (mask >> (d - 1) & 1) == (uint64_t)red;
        int64_t *sz = red ? rsz : o->ksz, *st = red ? rst : o->kst;
        int *n = red ? &nr : &o->nk;
        if (merge) {
            sz[*n - 1] *= x->shape[d];
            st[*n - 1] = stride[d];
        } else {
            sz[*n] = x->shape[d];
            st[(*n)++] = stride[d];
        }
        if (!red)
            o->nkept *= x->shape[d];
    }
    o->len = nr ? rsz[nr - 1] : 1;
    o->step = nr ? rst[nr - 1] : 0;
    o->nred = 1;
    for (int d = 0; d < nr - 1; d++)
        o->nred *= rsz[d];
    if (o->len == 0)
        o->nred = 0;
    o->red = malloc(sizeof(int64_t) * (size_t)(o->nred > 0 ? o->nred : 1));
    if (!o->red)
        return dt__error(DT_ERR_NO_MEMORY, "reduction: no memory for %lld offsets",
                         (long long)o->nred);
    int64_t idx[DT_MAX_RANK] = {0}, off = 0;
    for (int64_t c = 0; c < o->nred; c++) {
        o->red[c] = off;
        for (int d = nr - 2; d >= 0; d--) {
            if (++idx[d] < rsz[d]) {
                off += rst[d];
                break;
            }
            off -= rst[d] * (rsz[d] - 1);
            idx[d] = 0;
        }
    }
    return DT_OK;
}

/* The next kept position's base offset (row-major odometer over the kept dims). */
static void next_kept(const offsets *o, int64_t *idx, int64_t *base)
{
    for (int d = o->nk - 1; d >= 0; d--) {
        if (++idx[d] < o->ksz[d]) {
            *base += o->kst[d];
            return;
        }
        *base -= o->kst[d] * (o->ksz[d] - 1);
        idx[d] = 0;
    }
}

static void offsets_free(offsets *o)
{
    free(o->red);
}

/* attrs i[0]'s axes; 0 means every axis. */
static uint64_t reduced_mask(const dt_op_kernel_args *a)
{
    uint64_t m = (uint64_t)a->attrs.i[0];
    return m ? m : (UINT64_C(1) << a->in[0].rank) - 1;
}

/* The number of reduced elements in the whole tensor (mean's and var's divisor). */
static double global_count(const dt_op_buf *x, uint64_t mask)
{
    double n = 1;
    for (int d = 0; d < x->rank; d++)
        if (mask >> d & 1)
            n *= (double)x->global[d];
    return n;
}

static double extreme(const void *x, dt_dtype t, int64_t base, const offsets *o, int is_max)
{
    double m = is_max ? -INFINITY : INFINITY;
    FOR_RED(o, base, i)
    {
        double v = dt__rd_get(x, t, i);
        if (isnan(v))
            return v;
        if (is_max ? v > m : v < m)
            m = v;
    }
    return m;
}

static double reduce_one(const dt_op_kernel_args *a, int kind, int64_t base, const offsets *o,
                         double count)
{
    const void *x = a->in[0].data;
    dt_dtype t = a->in[0].dtype;
    double acc = 0;
    switch (kind) {
    case RK_SUM:
    case RK_MEAN:
        FOR_RED(o, base, i)
        acc += dt__rd_get(x, t, i);
        return kind == RK_MEAN ? acc / count : acc;
    case RK_MAX:
    case RK_MIN:
        return extreme(x, t, base, o, kind == RK_MAX);
    case RK_LOGSUMEXP: {
        double m = extreme(x, t, base, o, 1);
        if (isnan(m) || isinf(m))
            return m;
        FOR_RED(o, base, i)
        acc += exp(dt__rd_get(x, t, i) - m);
        return m + log(acc);
    }
    case RK_VAR: {
        double mean = 0;
        FOR_RED(o, base, i)
        mean += dt__rd_get(x, t, i);
        mean /= count;
        FOR_RED(o, base, i)
        {
            double d = dt__rd_get(x, t, i) - mean;
            acc += d * d;
        }
        return acc / (count - (double)a->attrs.i[2]);
    }
    default:
        return NAN;
    }
}

/* argmax / argmin along the one reduced axis: the first index of the extreme (NaN counts as
 * the extreme, as PyTorch). */
static int64_t arg_one(const dt_op_kernel_args *a, int is_max, int64_t base, const offsets *o)
{
    const void *x = a->in[0].data;
    dt_dtype t = a->in[0].dtype;
    int64_t best = 0, r = 0;
    double m = 0;
    FOR_RED(o, base, i)
    { /* one reduced axis: r is its index */
        double v = dt__rd_get(x, t, i);
        if (isnan(v))
            return r;
        if (r == 0 || (is_max ? v > m : v < m)) {
            m = v;
            best = r;
        }
        r++;
    }
    return best;
}

dt_status dt__k_reduce(const dt_op_kernel_args *a, int kind)
{
    const dt_op_buf *x = &a->in[0];
    uint64_t mask = reduced_mask(a);
    offsets o;
    dt_status st = offsets_make(x, mask, &o);
    if (st != DT_OK)
        return st;
    double count = global_count(x, mask);
    if (kind == RK_ARGMAX || kind == RK_ARGMIN) {
        int axis = 0;
        while (axis < x->rank && !(mask >> axis & 1))
            axis++;
        int64_t off = axis < x->rank ? x->offset[axis] : 0;
        int64_t *y = a->out.data, idx[DT_MAX_RANK] = {0}, base = 0;
        for (int64_t k = 0; k < o.nkept; k++, next_kept(&o, idx, &base))
            y[k] = off + arg_one(a, kind == RK_ARGMAX, base, &o);
    } else {
        int64_t idx[DT_MAX_RANK] = {0}, base = 0;
        for (int64_t k = 0; k < o.nkept; k++, next_kept(&o, idx, &base))
            dt__rd_set(a->out.data, a->out.dtype, k, reduce_one(a, kind, base, &o, count));
    }
    offsets_free(&o);
    return DT_OK;
}

/* dx of a reduction: in[0] x, in[1] the forward output, in[2] dy (out and dy: one element
 * per kept position, keepdim or not). */
dt_status dt__k_reduce_grad(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0];
    dt_dtype t = x->dtype;
    uint64_t mask = reduced_mask(a);
    int kind = (int)a->attrs.i[3];
    offsets o;
    dt_status st = offsets_make(x, mask, &o);
    if (st != DT_OK)
        return st;
    double count = global_count(x, mask);
    const void *y = a->in[1].data, *dy = a->in[2].data;
    void *dx = a->out.data;
    int64_t idx[DT_MAX_RANK] = {0}, base = 0;
    for (int64_t k = 0; k < o.nkept; k++, next_kept(&o, idx, &base)) {
        double g = dt__rd_get(dy, a->in[2].dtype, k);
        double yk = dt__rd_get(y, a->in[1].dtype, k);
        double scale = g, mean = 0;
        if (kind == RK_MEAN)
            scale = g / count;
        if (kind == RK_MAX || kind == RK_MIN) {
            int64_t ties = 0;
            FOR_RED(&o, base, i)
            ties += dt__rd_get(x->data, t, i) == yk;
            scale = ties ? g / (double)ties : 0;
        }
        if (kind == RK_VAR) {
            FOR_RED(&o, base, i)
            mean += dt__rd_get(x->data, t, i);
            mean /= count;
            scale = 2 * g / (count - (double)a->attrs.i[2]);
        }
        FOR_RED(&o, base, i)
        {
            double v = dt__rd_get(x->data, t, i), d;
            switch (kind) {
            case RK_MAX:
            case RK_MIN:
                d = v == yk ? scale : 0;
                break;
            case RK_LOGSUMEXP:
                d = g * exp(v - yk);
                break;
            case RK_VAR:
                d = scale * (v - mean);
                break;
            default:
                d = scale;
            }
            dt__rd_set(dx, a->out.dtype, i, d);
        }
    }
    offsets_free(&o);
    return DT_OK;
}
