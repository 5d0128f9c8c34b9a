/* Distributed layer normalisation (over the last dim) and softmax (along any dim): the
 * normalised dim is gathered, every other dim keeps its sharding; the gain and bias gradients
 * are partial over the mesh dims sharding the rows. */
#include <string.h>

#include "layout/tensor_dev.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"
#include "runtime/record.h"

static dt_status check_x(const char *op, const dt_tensor *x, const void *out)
{
    dt_status st = dt__check_f32(op, "x", x);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: output pointer is NULL", op);
    if (st == DT_OK && dt_tensor_rank(x) < 1)
        st = dt__error(DT_ERR_SHAPE, "%s: x must have rank 1 or more", op);
    return st;
}

/* gamma (and beta) 1-D of x's last dim, f32, on x's mesh. */
static dt_status check_param(const char *op, const char *what, const dt_tensor *p,
                             const dt_tensor *x)
{
    dt_status st = dt__check_f32(op, what, p);
    if (st == DT_OK)
        st = dt__check_tensor(op, what, p, x);
    if (st == DT_OK && (dt_tensor_rank(p) != 1 ||
                        dt_tensor_shape(p)[0] != dt_tensor_shape(x)[dt_tensor_rank(x) - 1]))
        st = dt__error(DT_ERR_SHAPE, "%s: %s must be 1-D of x's last dim (%lld)", op, what,
                       (long long)dt_tensor_shape(x)[dt_tensor_rank(x) - 1]);
    return st;
}

static dt_status replicated(const dt_tensor *p, dt_tensor **out)
{
    dt__lspec ls;
    dt__lspec_gathered(p, 0, &ls);
    return dt__ensure_layout(p, &ls, out);
}

/* The local kernels on component i (dt__ops_each_local). */
typedef struct norm_local {
    const dt__ops_backend *be;
    const dt_tensor *in[3]; /* x, gamma, beta (or dy); softmax: x, dy or NULL */
    const dt_tensor *out[3];
    int64_t cols;
    float eps;
    int axis;
} norm_local;

static dt_status ln_one(int i, void *arg)
{
    const norm_local *a = arg;
    int64_t n = dt__local_numel(a->out[0], i);
    if (n == 0 || a->cols == 0)
        return DT_OK;
    return a->be->layer_norm(n / a->cols, a->cols, dt__local_data(a->in[0], i),
                             dt__local_data(a->in[1], i), dt__local_data(a->in[2], i), a->eps,
                             dt__local_data(a->out[0], i));
}

/* Also for empty rows: the partial gain and bias gradients are still written (zeros). */
static dt_status ln_grad_one(int i, void *arg)
{
    const norm_local *a = arg;
    int64_t n = dt__local_numel(a->out[0], i);
    if (a->cols == 0)
        return DT_OK;
    return a->be->layer_norm_grad(n / a->cols, a->cols, dt__local_data(a->in[0], i),
                                  dt__local_data(a->in[1], i), dt__local_data(a->in[2], i),
                                  a->eps, dt__local_data(a->out[0], i),
                                  dt__local_data(a->out[1], i), dt__local_data(a->out[2], i));
}

static dt_status layer_norm_run(const dt_tensor *x, const dt_tensor *gamma, const dt_tensor *beta,
                        float eps, dt_tensor **out)
{
    static const char op[] = "dt_layer_norm";
    dt_status st = check_x(op, x, out);
    if (st == DT_OK)
        st = check_param(op, "gamma", gamma, x);
    if (st == DT_OK)
        st = check_param(op, "beta", beta, x);
    const dt__ops_backend *be = NULL;
    st = dt__ops_begin(op, st, 1, NULL, x, NULL, &be); /* check_x checked out */
    if (st != DT_OK)
        return st;
    int r = dt_tensor_rank(x);
    int64_t cols = dt_tensor_shape(x)[r - 1];
    dt__lspec ls;
    dt__lspec_gathered(x, r - 1, &ls);
    dt_tensor *rx = NULL, *rg = NULL, *rb = NULL, *y = NULL;
    st = dt__ensure_layout(x, &ls, &rx);
    if (st == DT_OK)
        st = replicated(gamma, &rg);
    if (st == DT_OK)
        st = replicated(beta, &rb);
    if (st == DT_OK)
        st = dt__tensor_empty(dt_tensor_layout(rx), DT_DTYPE_F32, dt_tensor_shape(x), &y);
    norm_local nl = {be, {rx, rg, rb}, {y}, cols, eps, 0};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, ln_one, &nl);
    st = dt__ops_finish(be, op, NULL, st, &y, out);
    dt_tensor_destroy(rb);
    dt_tensor_destroy(rg);
    dt_tensor_destroy(rx);
    return st;
}

/* The public entry: records the call on this thread's tape (runtime/record.h). */
dt_status dt_layer_norm(const dt_tensor *x, const dt_tensor *gamma, const dt_tensor *beta,
                        float eps, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = layer_norm_run(x, gamma, beta, eps, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_LAYER_NORM, .nin = 3, .in = {x, gamma, beta}, .fattr = {eps}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_layer_norm_backward(const dt_tensor *x, const dt_tensor *gamma, const dt_tensor *dy,
                                 float eps, dt_tensor **dx_out, dt_tensor **dgamma_out,
                                 dt_tensor **dbeta_out)
{
    static const char op[] = "dt_layer_norm_backward";
    dt_status st = check_x(op, x, dx_out);
    if (st == DT_OK)
        st = check_param(op, "gamma", gamma, x);
    if (st == DT_OK)
        st = dt__check_like(op, "dy", dy, x);
    const dt_mesh *mesh = NULL;
    const dt__ops_backend *be = NULL;
    st = dt__ops_begin(op, st, dgamma_out && dbeta_out, "output pointer", x, &mesh, &be);
    if (st != DT_OK)
        return st;
    int r = dt_tensor_rank(x);
    int64_t cols = dt_tensor_shape(x)[r - 1];
    dt__lspec ls, lp;
    dt__lspec_gathered(x, r - 1, &ls);
    memset(&lp, 0, sizeof lp);
    lp.rank = 1;
    lp.spec[0] = -1;
    for (int d = 0; d < r - 1; d++)
        if (ls.spec[d] >= 0)
            lp.partial[ls.spec[d]] = 1 + (int)DT_REDUCE_SUM;
    dt_tensor *rx = NULL, *rg = NULL, *rdy = NULL, *dx = NULL, *dg = NULL, *db = NULL;
    st = dt__ensure_layout(x, &ls, &rx);
    if (st == DT_OK)
        st = replicated(gamma, &rg);
    if (st == DT_OK)
        st = dt__ensure_layout(dy, &ls, &rdy);
    if (st == DT_OK)
        st = dt__tensor_empty(dt_tensor_layout(rx), DT_DTYPE_F32, dt_tensor_shape(x), &dx);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &lp, DT_DTYPE_F32, &cols, &dg);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &lp, DT_DTYPE_F32, &cols, &db);
    norm_local nl = {be, {rx, rg, rdy}, {dx, dg, db}, cols, eps, 0};
    if (st == DT_OK)
        st = dt__ops_each_local(be, dx, ln_grad_one, &nl);
    if (st == DT_OK && be->sync)
        st = be->sync();
    if (st == DT_OK) {
        *dx_out = dx;
        *dgamma_out = dg;
        *dbeta_out = db;
        dx = dg = db = NULL;
    }
    dt_tensor_destroy(db);
    dt_tensor_destroy(dg);
    dt_tensor_destroy(dx);
    dt_tensor_destroy(rdy);
    dt_tensor_destroy(rg);
    dt_tensor_destroy(rx);
    return st;
}

/* [outer, len, inner] of x around `axis` (already checked). */
static void split3(const int64_t *shape, int rank, int axis, int64_t *outer, int64_t *len,
                   int64_t *inner)
{
    *outer = *inner = 1;
    for (int d = 0; d < axis; d++)
        *outer *= shape[d];
    for (int d = axis + 1; d < rank; d++)
        *inner *= shape[d];
    *len = shape[axis];
}

static dt_status check_axis(const char *op, const dt_tensor *x, int *axis)
{
    int r = dt_tensor_rank(x);
    int a = *axis < 0 ? *axis + r : *axis;
    if (a < 0 || a >= r)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: axis %d out of range for rank %d", op,
                         *axis, r);
    *axis = a;
    return DT_OK;
}

static dt_status softmax_one(int i, void *arg)
{
    const norm_local *a = arg;
    const DLTensor *l = dt_tensor_local(a->out[0], i);
    int64_t outer, len, inner;
    split3(l->shape, l->ndim, a->axis, &outer, &len, &inner);
    if (outer * len * inner == 0)
        return DT_OK;
    if (a->in[1])
        return a->be->softmax_grad(outer, len, inner, dt__local_data(a->in[0], i),
                                   dt__local_data(a->in[1], i), dt__local_data(a->out[0], i));
    return a->be->softmax(outer, len, inner, dt__local_data(a->in[0], i),
                          dt__local_data(a->out[0], i));
}

/* Softmax (dy NULL: of x) or its backward (x is the forward output y), along `axis`. */
static dt_status softmax_common(const char *op, const dt_tensor *x, const dt_tensor *dy,
                                int axis, dt_tensor **out)
{
    dt_status st = check_x(op, x, out);
    if (st == DT_OK && dy)
        st = dt__check_like(op, "dy", dy, x);
    if (st == DT_OK)
        st = check_axis(op, x, &axis);
    const dt__ops_backend *be = NULL;
    st = dt__ops_begin(op, st, 1, NULL, x, NULL, &be); /* check_x checked out */
    if (st != DT_OK)
        return st;
    dt__lspec ls;
    dt__lspec_gathered(x, axis, &ls);
    dt_tensor *rx = NULL, *rdy = NULL, *y = NULL;
    st = dt__ensure_layout(x, &ls, &rx);
    if (st == DT_OK && dy)
        st = dt__ensure_layout(dy, &ls, &rdy);
    if (st == DT_OK)
        st = dt__tensor_empty(dt_tensor_layout(rx), DT_DTYPE_F32, dt_tensor_shape(x), &y);
    norm_local nl = {be, {rx, rdy}, {y}, 0, 0.0f, axis};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, softmax_one, &nl);
    st = dt__ops_finish(be, op, NULL, st, &y, out);
    dt_tensor_destroy(rdy);
    dt_tensor_destroy(rx);
    return st;
}

static dt_status softmax_run(const dt_tensor *x, int axis, dt_tensor **out)
{
    return softmax_common("dt_softmax", x, NULL, axis, out);
}

/* The public entry: records the call on this thread's tape (runtime/record.h). */
dt_status dt_softmax(const dt_tensor *x, int axis, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = softmax_run(x, axis, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_SOFTMAX, .nin = 1, .in = {x}, .iattr = {axis}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_softmax_backward(const dt_tensor *y, const dt_tensor *dy, int axis,
                              dt_tensor **dx_out)
{
    return softmax_common("dt_softmax_backward", y, dy, axis, dx_out);
}
