/* ops/k_reduce: CPU kernels of the reductions over a set of axes (sum, mean, max, min,
 * logsumexp, var, argmax, argmin) and of their one gradient op (reduce_grad), on local blocks.
 * x is read once per pass in memory order into f64 accumulators of the output's size; every
 * output element still sees its elements in row-major order, so a layout that keeps the
 * reduced axes whole gives the single device's bits. */
#include <math.h>
#include <stdlib.h>

#include "ops/def_reduce.h"
#include "runtime/error.h"

/* x's dims with size-1 dims dropped and adjacent kept (or reduced) dims merged: each with its
 * output stride (0 when reduced); the last one is walked as contiguous runs. */
typedef struct walk {
    int n, rd; /* merged dims; the reduced dim (argmax), -1 if none */
    int64_t size[DT_MAX_RANK];
    int64_t ostride[DT_MAX_RANK]; /* 0: reduced */
    int64_t nout, numel;
} walk;

/* attrs i[0]'s axes; 0 means every axis. */
static uint64_t reduced_mask(const dt_op_kernel_args *a)
{
    uint64_t m = (uint64_t)a->attrs.i[0];
    return m ? m : (UINT64_C(1) << a->in[0].rank) - 1;
}

static void walk_make(const dt_op_buf *x, uint64_t mask, walk *w)
{
    int red[DT_MAX_RANK];
    w->n = 0;
    w->rd = -1;
    w->nout = 1;
    w->numel = 1;
    for (int d = 0; d < x->rank; d++) {
        int r = mask >> d & 1;
        w->numel *= x->shape[d];
        if (!r)
            w->nout *= x->shape[d];
        if (x->shape[d] == 1)
            continue;
        if (w->n > 0 && red[w->n - 1] == r) {
            w->size[w->n - 1] *= x->shape[d];
        } else {
            red[w->n] = r;
            w->size[w->n++] = x->shape[d];
        }
    }
    int64_t s = 1;
    for (int d = w->n - 1; d >= 0; d--) {
        w->ostride[d] = red[d] ? 0 : s;
        if (!red[d])
            s *= w->size[d];
        if (red[d])
            w->rd = d;
    }
}

/* What a pass does with element v of x at output position o. */
enum {
    W_SUM, /* acc[o] += v */
    W_MAX, /* acc[o] = max (NaN sticks) */
    W_MIN,
    W_ARGMAX, /* acc[o], arg[o]: the first extreme (NaN counts as it) */
    W_ARGMIN,
    W_EXPSUM, /* acc[o] += exp(v - aux[o]), aux finite */
    W_SQDEV,  /* acc[o] += (v - aux[o])^2 */
    W_TIES,   /* acc[o] += v == aux[o] */
};

static inline void step(int mode, double v, int64_t o, int64_t coord, double *acc,
                        const double *aux, int64_t *arg)
{
    switch (mode) {
    case W_SUM:
        acc[o] += v;
        break;
    case W_MAX:
        if (isnan(v) || v > acc[o])
            acc[o] = v;
        break;
    case W_MIN:
        if (isnan(v) || v < acc[o])
            acc[o] = v;
        break;
    case W_ARGMAX:
    case W_ARGMIN:
        if (!isnan(acc[o]) && (isnan(v) || (mode == W_ARGMAX ? v > acc[o] : v < acc[o]))) {
            acc[o] = v;
            arg[o] = coord;
        }
        break;
    case W_EXPSUM:
        if (isfinite(aux[o]))
            acc[o] += exp(v - aux[o]);
        break;
    case W_SQDEV:
        acc[o] += (v - aux[o]) * (v - aux[o]);
        break;
    default:
        acc[o] += v == aux[o];
    }
}

/* One pass over x in memory order. The mode's switch sits outside the inner loops only in
 * effect: it is inlined into each loop, whose trip count is a run of the last merged dim. */
static void walk_pass(const walk *w, const dt_op_buf *x, int mode, double *acc, const double *aux,
                      int64_t *arg)
{
    int last = w->n - 1;
    int64_t run = w->n ? w->size[last] : 1, runs = run ? w->numel / run : 0;
    int red_run = w->n && w->ostride[last] == 0;
    int64_t idx[DT_MAX_RANK] = {0}, xo = 0, oo = 0;
    for (int64_t r = 0; r < runs; r++, xo += run) {
        int64_t coord = w->rd >= 0 && w->rd < last ? idx[w->rd] : 0;
        if (mode == W_SUM && x->dtype == DT_DTYPE_F32) { /* the common case, typed */
            const float *xf = (const float *)x->data + xo;
            if (red_run) {
                double sum = acc[oo];
                for (int64_t j = 0; j < run; j++)
                    sum += xf[j];
                acc[oo] = sum;
            } else {
                for (int64_t j = 0; j < run; j++)
                    acc[oo + j] += xf[j];
            }
        } else if (red_run)
            for (int64_t j = 0; j < run; j++)
                step(mode, dt__rd_get(x->data, x->dtype, xo + j), oo, j, acc, aux, arg);
        else
            for (int64_t j = 0; j < run; j++)
                step(mode, dt__rd_get(x->data, x->dtype, xo + j), oo + j, coord, acc, aux, arg);
        for (int d = last - 1; d >= 0; d--) {
            if (++idx[d] < w->size[d]) {
                oo += w->ostride[d];
                break;
            }
            oo -= w->ostride[d] * (w->size[d] - 1);
            idx[d] = 0;
        }
    }
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

static dt_status scratch(int64_t n, int k, double **buf)
{
    *buf = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1) * (size_t)k);
    if (!*buf)
        return dt__error(DT_ERR_NO_MEMORY, "reduction: no memory for %lld accumulators",
                         (long long)n * k);
    return DT_OK;
}

static void fill(double *a, int64_t n, double v)
{
    for (int64_t i = 0; i < n; i++)
        a[i] = v;
}

dt_status dt__k_reduce(const dt_op_kernel_args *a, int kind)
{
    const dt_op_buf *x = &a->in[0];
    uint64_t mask = reduced_mask(a);
    walk w;
    walk_make(x, mask, &w);
    double count = global_count(x, mask), *acc;
    dt_status st = scratch(w.nout, 2, &acc);
    if (st != DT_OK)
        return st;
    double *aux = acc + (w.nout > 0 ? w.nout : 1);
    int64_t n = w.nout;
    switch (kind) {
    case RK_ARGMAX:
    case RK_ARGMIN: {
        int64_t *y = a->out.data, off = 0;
        for (int d = 0; d < x->rank; d++)
            if (mask >> d & 1)
                off = x->offset[d];
        fill(acc, n, kind == RK_ARGMAX ? -INFINITY : INFINITY);
        for (int64_t o = 0; o < n; o++)
            y[o] = 0;
        walk_pass(&w, x, kind == RK_ARGMAX ? W_ARGMAX : W_ARGMIN, acc, NULL, y);
        for (int64_t o = 0; o < n; o++)
            y[o] += off;
        break;
    }
    case RK_MAX:
    case RK_MIN:
        fill(acc, n, kind == RK_MAX ? -INFINITY : INFINITY);
        walk_pass(&w, x, kind == RK_MAX ? W_MAX : W_MIN, acc, NULL, NULL);
        break;
    case RK_LOGSUMEXP:
        fill(aux, n, -INFINITY);
        walk_pass(&w, x, W_MAX, aux, NULL, NULL);
        fill(acc, n, 0);
        walk_pass(&w, x, W_EXPSUM, acc, aux, NULL);
        for (int64_t o = 0; o < n; o++)
            acc[o] = isfinite(aux[o]) ? aux[o] + log(acc[o]) : aux[o];
        break;
    case RK_VAR:
        fill(aux, n, 0);
        walk_pass(&w, x, W_SUM, aux, NULL, NULL);
        for (int64_t o = 0; o < n; o++)
            aux[o] /= count;
        fill(acc, n, 0);
        walk_pass(&w, x, W_SQDEV, acc, aux, NULL);
        for (int64_t o = 0; o < n; o++)
            acc[o] /= count - (double)a->attrs.i[2];
        break;
    default: /* sum, mean */
        fill(acc, n, 0);
        walk_pass(&w, x, W_SUM, acc, NULL, NULL);
        if (kind == RK_MEAN)
            for (int64_t o = 0; o < n; o++)
                acc[o] /= count;
    }
    if (kind != RK_ARGMAX && kind != RK_ARGMIN)
        for (int64_t o = 0; o < n; o++)
            dt__rd_set(a->out.data, a->out.dtype, o, acc[o]);
    free(acc);
    return DT_OK;
}

/* dx of a reduction: in[0] x, in[1] the forward output, in[2] dy (out and dy: one element
 * per kept position, keepdim or not). */
dt_status dt__k_reduce_grad(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0];
    uint64_t mask = reduced_mask(a);
    int kind = (int)a->attrs.i[3];
    walk w;
    walk_make(x, mask, &w);
    double count = global_count(x, mask), *y;
    int64_t n = w.nout;
    dt_status st = scratch(n, 3, &y);
    if (st != DT_OK)
        return st;
    double *g = y + (n > 0 ? n : 1), *acc = g + (n > 0 ? n : 1);
    for (int64_t o = 0; o < n; o++) {
        y[o] = dt__rd_get(a->in[1].data, a->in[1].dtype, o);
        g[o] = dt__rd_get(a->in[2].data, a->in[2].dtype, o);
    }
    /* The factor of dy per output position: 1 / count (mean), 1 / ties (max, min),
     * 2 / (count - correction) (var, whose y becomes the mean). */
    switch (kind) {
    case RK_MEAN:
        for (int64_t o = 0; o < n; o++)
            g[o] /= count;
        break;
    case RK_MAX:
    case RK_MIN:
        fill(acc, n, 0);
        walk_pass(&w, x, W_TIES, acc, y, NULL);
        for (int64_t o = 0; o < n; o++)
            g[o] = acc[o] > 0 ? g[o] / acc[o] : 0;
        break;
    case RK_VAR:
        fill(y, n, 0);
        walk_pass(&w, x, W_SUM, y, NULL, NULL);
        for (int64_t o = 0; o < n; o++) {
            y[o] /= count;
            g[o] *= 2 / (count - (double)a->attrs.i[2]);
        }
        break;
    default:
        break;
    }
    int last = w.n - 1;
    int64_t run = w.n ? w.size[last] : 1, runs = run ? w.numel / run : 0;
    int red_run = w.n && w.ostride[last] == 0;
    int64_t idx[DT_MAX_RANK] = {0}, xo = 0, oo = 0;
    for (int64_t r = 0; r < runs; r++, xo += run) {
        for (int64_t j = 0; j < run; j++) {
            int64_t o = red_run ? oo : oo + j;
            double v = dt__rd_get(x->data, x->dtype, xo + j), d;
            switch (kind) {
            case RK_MAX:
            case RK_MIN:
                d = v == y[o] ? g[o] : 0;
                break;
            case RK_LOGSUMEXP:
                d = g[o] * exp(v - y[o]);
                break;
            case RK_VAR:
                d = g[o] * (v - y[o]);
                break;
            default: /* sum, mean */
                d = g[o];
            }
            dt__rd_set(a->out.data, a->out.dtype, xo + j, d);
        }
        for (int d = last - 1; d >= 0; d--) {
            if (++idx[d] < w.size[d]) {
                oo += w.ostride[d];
                break;
            }
            oo -= w.ostride[d] * (w.size[d] - 1);
            idx[d] = 0;
        }
    }
    free(y);
    return DT_OK;
}
