/* Distributed elementwise ops: add, sub, mul, scale, axpy, bias add, ReLU and GELU with their
 * backward, and casts. Operands meet in one layout (the cheaper of theirs); sums may stay
 * partial through linear ops, nonlinear ones reduce first. */
#include <string.h>

#include "layout/tensor_dev.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"
#include "runtime/record.h"
#include "ops/def_elem.h"

typedef enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_RELU_GRAD, BIN_GELU_GRAD } bin_kind;

static const char *const bin_names[] = {"dt_add", "dt_sub", "dt_mul", "dt_relu_backward",
                                        "dt_gelu_backward"};

static void strip_partial(dt__lspec *ls)
{
    memset(ls->partial, 0, sizeof ls->partial);
}

static void strip_nonsum(dt__lspec *ls)
{
    for (int d = 0; d < DT_MESH_MAX_DIMS; d++)
        if (ls->partial[d] != 1 + (int)DT_REDUCE_SUM)
            ls->partial[d] = 0;
}

/* The local kernels of one op on component i (dt__ops_each_local): c from a and b. */
typedef struct ew_local {
    const dt__ops_backend *be;
    int kind; /* a bin_kind or un_kind */
    const dt_tensor *a, *b, *c;
    float alpha;
    dt_dtype from, to; /* casts */
} ew_local;

static dt_status bin_one(int i, void *arg)
{
    const ew_local *e = arg;
    const dt__ops_backend *be = e->be;
    int64_t n = dt__local_numel(e->c, i);
    const float *x = dt__local_data(e->a, i), *y = dt__local_data(e->b, i);
    float *z = dt__local_data(e->c, i);
    if (n == 0)
        return DT_OK;
    switch ((bin_kind)e->kind) {
    case BIN_ADD: return be->add(n, x, y, z);
    case BIN_SUB: return be->sub(n, x, y, z);
    case BIN_MUL: return be->mul(n, x, y, z);
    case BIN_RELU_GRAD: return be->relu_grad(n, x, y, z);
    case BIN_GELU_GRAD: return be->gelu_grad(n, x, y, z);
    }
    return DT_OK;
}

static dt_status run_binary(const dt__ops_backend *be, bin_kind kind, const dt_tensor *a,
                            const dt_tensor *b, dt_tensor *c)
{
    ew_local e = {.be = be, .kind = (int)kind, .a = a, .b = b, .c = c};
    dt_status st = dt__ops_each_local(be, c, bin_one, &e);
    if (st == DT_OK && be->sync)
        st = be->sync();
    return st;
}

/* y += alpha x in place: c += alpha a. */
static dt_status axpy_one(int i, void *arg)
{
    const ew_local *e = arg;
    int64_t n = dt__local_numel(e->c, i);
    if (n == 0)
        return DT_OK;
    return e->be->axpy(n, e->alpha, dt__local_data(e->a, i), dt__local_data(e->c, i));
}

/* c = a + b along a's last dim. */
static dt_status bias_add_one(int i, void *arg)
{
    const ew_local *e = arg;
    int64_t n = dt__local_numel(e->c, i);
    if (n == 0)
        return DT_OK;
    const DLTensor *ly = dt_tensor_local(e->c, i);
    int64_t cols = ly->shape[ly->ndim - 1];
    dt_status st = e->be->copy(n, dt__local_data(e->a, i), dt__local_data(e->c, i));
    if (st == DT_OK)
        st = e->be->bias_add(n / cols, cols, dt__local_data(e->b, i), dt__local_data(e->c, i));
    return st;
}

/* c = a cast from `from` to `to`. */
static dt_status cast_one(int i, void *arg)
{
    const ew_local *e = arg;
    int64_t n = dt__local_numel(e->c, i);
    if (n == 0)
        return DT_OK;
    return e->be->cast(n, dt__local_data(e->a, i), e->from, dt__local_data(e->c, i), e->to);
}

/* The layout where a and b meet (binary ops other than the activations' backward): the
 * cheapest of a's, b's and the requested one (a's on a tie), partial dims kept only where
 * the op keeps them. */
static dt_status meet_layout(const char *op, bin_kind kind, const dt_tensor *a,
                             const dt_tensor *b, const dt_layout *layout, const dt_mesh *mesh,
                             dt__lspec *target)
{
    const int64_t *shape = dt_tensor_shape(a);
    dt__lspec cand[3];
    int nc = 0;
    dt__lspec_of(dt_tensor_layout(a), &cand[nc++]);
    dt__lspec_of(dt_tensor_layout(b), &cand[nc++]);
    if (layout) {
        if (dt_layout_rank(layout) != dt_tensor_rank(a) ||
            !dt_mesh_equal(dt_layout_mesh(layout), mesh))
            return dt__error(DT_ERR_SHAPE, "%s: the requested output layout must have rank "
                             "%d on the operands' mesh", op, dt_tensor_rank(a));
        dt__lspec_of(layout, &cand[nc++]);
    }
    dt__lspec want = nc == 3 ? cand[2] : cand[0];
    double best = -1.0;
    for (int i = 0; i < nc; i++) {
        if (kind == BIN_MUL)
            strip_partial(&cand[i]);
        else
            strip_nonsum(&cand[i]);
        dt__lspec a0, b0;
        dt__lspec_of(dt_tensor_layout(a), &a0);
        dt__lspec_of(dt_tensor_layout(b), &b0);
        double cost = dt__relayout_cost(mesh, shape, &a0, &cand[i]) +
                      dt__relayout_cost(mesh, shape, &b0, &cand[i]);
        if (layout)
            cost += dt__relayout_cost(mesh, shape, &cand[i], &want);
        if (best < 0.0 || cost < best) {
            best = cost;
            *target = cand[i];
        }
    }
    return DT_OK;
}

/* Common body of the binary ops: checks, the meeting layout, relayouts, local kernels. */
static dt_status binary(bin_kind kind, const dt_tensor *a, const dt_tensor *b,
                        const dt_layout *layout, dt_tensor **out)
{
    const char *op = bin_names[kind];
    const char *an = kind >= BIN_RELU_GRAD ? "x" : "a", *bn = kind >= BIN_RELU_GRAD ? "dy" : "b";
    if ((dt__is_half(a) || dt__is_half(b)) && out) {
        /* 16-bit operands: computed in f32, rounded to a's dtype when both share it (the
         * activations' backward: x's), else left f32. */
        dt_dtype to = kind >= BIN_RELU_GRAD || dt_tensor_dtype(a) == dt_tensor_dtype(b)
                          ? dt_tensor_dtype(a) : DT_DTYPE_F32;
        dt_tensor *wa = NULL, *wb = NULL, *r = NULL;
        dt_status st = dt__widen(a, &wa);
        if (st == DT_OK)
            st = dt__widen(b, &wb);
        if (st == DT_OK)
            st = binary(kind, wa, wb, layout, &r);
        st = dt__narrow(st, to, &r);
        dt_tensor_destroy(wa);
        dt_tensor_destroy(wb);
        if (st == DT_OK)
            *out = r;
        return st;
    }
    dt_status st = dt__check_f32(op, an, a);
    if (st == DT_OK)
        st = dt__check_like(op, bn, b, a);
    const dt_mesh *mesh = NULL;
    const dt__ops_backend *be = NULL;
    st = dt__ops_begin(op, st, out != NULL, "output pointer", a, &mesh, &be);
    if (st != DT_OK)
        return st;
    const int64_t *shape = dt_tensor_shape(a);
    dt__lspec la, target;
    dt__lspec_of(dt_tensor_layout(a), &la);
    if (kind >= BIN_RELU_GRAD) {
        /* The backward of an activation follows the forward input's (reduced) layout. */
        strip_partial(&la);
        target = la;
    } else {
        st = meet_layout(op, kind, a, b, layout, mesh, &target);
        if (st != DT_OK)
            return st;
    }
    dt_tensor *ra = NULL, *rb = NULL, *c = NULL;
    st = dt__ensure_layout(a, &target, &ra);
    if (st == DT_OK)
        st = dt__ensure_layout(b, &target, &rb);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &target, DT_DTYPE_F32, shape, &c);
    if (st == DT_OK)
        st = run_binary(be, kind, ra, rb, c);
    if (st == DT_OK)
        st = dt__finish_layout(op, layout, &c);
    if (st == DT_OK) {
        *out = c;
        c = NULL;
    }
    dt_tensor_destroy(c);
    dt_tensor_destroy(rb);
    dt_tensor_destroy(ra);
    return st;
}

/* Operands of different shapes (NumPy broadcasting) or both f64 go to the op definitions
 * (ops/def_elem_bin.c, recorded by the generic path); equal shapes keep the path below. */
static int to_def(const dt_tensor *a, const dt_tensor *b)
{
    if (!a || !b)
        return 0;
    if (dt_tensor_dtype(a) == DT_DTYPE_F64 && dt_tensor_dtype(b) == DT_DTYPE_F64)
        return 1;
    int r = dt_tensor_rank(a);
    if (r != dt_tensor_rank(b))
        return 1;
    return memcmp(dt_tensor_shape(a), dt_tensor_shape(b), (size_t)r * sizeof(int64_t)) != 0;
}

static dt_status by_def(const dt_op_def *def, const dt_tensor *a, const dt_tensor *b,
                        const dt_layout *layout, dt_tensor **out)
{
    const dt_tensor *in[2] = {a, b};
    return dt__op_run(def, in, 2, NULL, layout, out);
}

static dt_status add_run(const dt_tensor *a, const dt_tensor *b, const dt_layout *layout,
                 dt_tensor **out)
{
    return binary(BIN_ADD, a, b, layout, out);
}

/* The public entry: records the call on this thread's tape (autograd/record.h). */
dt_status dt_add(const dt_tensor *a, const dt_tensor *b, const dt_layout *layout,
                 dt_tensor **out)
{
    if (to_def(a, b))
        return by_def(&dt__def_add, a, b, layout, out);
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = add_run(a, b, layout, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_ADD, .nin = 2, .in = {a, b}, .layout = layout};
    return dt__rec_finish(r, st, &rec, t, out);
}

static dt_status sub_run(const dt_tensor *a, const dt_tensor *b, const dt_layout *layout,
                 dt_tensor **out)
{
    return binary(BIN_SUB, a, b, layout, out);
}

/* The public entry: records the call on this thread's tape (autograd/record.h). */
dt_status dt_sub(const dt_tensor *a, const dt_tensor *b, const dt_layout *layout,
                 dt_tensor **out)
{
    if (to_def(a, b))
        return by_def(&dt__def_sub, a, b, layout, out);
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = sub_run(a, b, layout, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_SUB, .nin = 2, .in = {a, b}, .layout = layout};
    return dt__rec_finish(r, st, &rec, t, out);
}

static dt_status mul_run(const dt_tensor *a, const dt_tensor *b, const dt_layout *layout,
                 dt_tensor **out)
{
    return binary(BIN_MUL, a, b, layout, out);
}

/* The public entry: records the call on this thread's tape (autograd/record.h). */
dt_status dt_mul(const dt_tensor *a, const dt_tensor *b, const dt_layout *layout,
                 dt_tensor **out)
{
    if (to_def(a, b))
        return by_def(&dt__def_mul, a, b, layout, out);
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = mul_run(a, b, layout, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_MUL, .nin = 2, .in = {a, b}, .layout = layout};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_relu_backward(const dt_tensor *x, const dt_tensor *dy, dt_tensor **dx_out)
{
    return binary(BIN_RELU_GRAD, x, dy, NULL, dx_out);
}

dt_status dt_gelu_backward(const dt_tensor *x, const dt_tensor *dy, dt_tensor **dx_out)
{
    return binary(BIN_GELU_GRAD, x, dy, NULL, dx_out);
}

typedef enum { UN_SCALE, UN_RELU, UN_GELU } un_kind;

/* scale, ReLU, GELU: c from a. */
static dt_status un_one(int i, void *arg)
{
    const ew_local *e = arg;
    int64_t n = dt__local_numel(e->c, i);
    if (n == 0)
        return DT_OK;
    const float *src = dt__local_data(e->a, i);
    float *dst = dt__local_data(e->c, i);
    switch ((un_kind)e->kind) {
    case UN_SCALE: return e->be->scale(n, e->alpha, src, dst);
    case UN_RELU: return e->be->relu(n, src, dst);
    case UN_GELU: return e->be->gelu(n, src, dst);
    }
    return DT_OK;
}

static dt_status unary(un_kind kind, const dt_tensor *x, float alpha, dt_tensor **out)
{
    static const char *const names[] = {"dt_scale", "dt_relu", "dt_gelu"};
    const char *op = names[kind];
    if (dt__is_half(x) && out) {
        dt_tensor *wx = NULL, *r = NULL;
        dt_status st = dt__widen(x, &wx);
        if (st == DT_OK)
            st = unary(kind, wx, alpha, &r);
        st = dt__narrow(st, dt_tensor_dtype(x), &r);
        dt_tensor_destroy(wx);
        if (st == DT_OK)
            *out = r;
        return st;
    }
    const dt_mesh *mesh = NULL;
    const dt__ops_backend *be = NULL;
    dt_status st = dt__ops_begin(op, dt__check_f32(op, "x", x), out != NULL, "output pointer", x,
                                 &mesh, &be);
    if (st != DT_OK)
        return st;
    dt__lspec ls;
    dt__lspec_of(dt_tensor_layout(x), &ls);
    if (kind == UN_SCALE)
        strip_nonsum(&ls);
    else
        strip_partial(&ls);
    dt_tensor *rx = NULL, *y = NULL;
    st = dt__ensure_layout(x, &ls, &rx);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &ls, DT_DTYPE_F32, dt_tensor_shape(x), &y);
    ew_local e = {.be = be, .kind = (int)kind, .a = rx, .c = y, .alpha = alpha};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, un_one, &e);
    st = dt__ops_finish(be, op, NULL, st, &y, out);
    dt_tensor_destroy(rx);
    return st;
}

static dt_status scale_run(const dt_tensor *x, float alpha, dt_tensor **out)
{
    return unary(UN_SCALE, x, alpha, out);
}

/* The public entry: records the call on this thread's tape (autograd/record.h). */
dt_status dt_scale(const dt_tensor *x, float alpha, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = scale_run(x, alpha, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_SCALE, .nin = 1, .in = {x}, .fattr = {alpha}};
    return dt__rec_finish(r, st, &rec, t, out);
}

static dt_status relu_run(const dt_tensor *x, dt_tensor **out)
{
    return unary(UN_RELU, x, 0.0f, out);
}

/* The public entry: records the call on this thread's tape (autograd/record.h). */
dt_status dt_relu(const dt_tensor *x, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = relu_run(x, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_RELU, .nin = 1, .in = {x}};
    return dt__rec_finish(r, st, &rec, t, out);
}

static dt_status gelu_run(const dt_tensor *x, dt_tensor **out)
{
    return unary(UN_GELU, x, 0.0f, out);
}

/* The public entry: records the call on this thread's tape (autograd/record.h). */
dt_status dt_gelu(const dt_tensor *x, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = gelu_run(x, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_GELU, .nin = 1, .in = {x}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_axpy(float alpha, const dt_tensor *x, dt_tensor *y)
{
    static const char op[] = "dt_axpy";
    dt_status st = dt__check_f32(op, "x", x);
    if (st == DT_OK)
        st = dt__check_like(op, "y", y, x);
    if (st != DT_OK)
        return st;
    dt__lspec ly;
    dt__lspec_of(dt_tensor_layout(y), &ly);
    if (dt__lspec_has_nonsum_partial(&ly))
        return dt__error(DT_ERR_SHAPE, "%s: y is partial with a reduction other than sum; "
                         "adding to it in place is not defined", op);
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(y));
    const dt__ops_backend *be = NULL;
    st = dt__ops_backend_for(mesh, op, &be);
    if (st != DT_OK)
        return st;
    dt_tensor *rx = NULL;
    st = dt__ensure_layout_l(x, dt_tensor_layout(y), &rx);
    ew_local e = {.be = be, .a = rx, .c = y, .alpha = alpha};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, axpy_one, &e);
    if (st == DT_OK && be->sync)
        st = be->sync();
    dt_tensor_destroy(rx);
    return st;
}

int dt__add_in_place(dt_tensor *acc, const dt_tensor *c, dt_status *st)
{
    int r = dt_tensor_rank(acc);
    const dt_layout *la = dt_tensor_layout(acc), *lc = dt_tensor_layout(c);
    if (dt_tensor_dtype(acc) != DT_DTYPE_F32 || dt_tensor_dtype(c) != DT_DTYPE_F32 ||
        r != dt_tensor_rank(c) ||
        memcmp(dt_tensor_shape(acc), dt_tensor_shape(c), sizeof(int64_t) * (size_t)r) != 0 ||
        !dt__layout_same_placement(la, lc) || !dt__tensor_exclusive(acc))
        return 0;
    if (!dt_layout_equal(la, lc)) {
        /* dt_add's result is laid out as the meeting layout: take it only where that is
         * acc's own (then c, placed alike, is read through a view in acc's layout). */
        dt__lspec target, own;
        if (meet_layout("dt_add", BIN_ADD, acc, c, NULL, dt_layout_mesh(la), &target) != DT_OK)
            return 0;
        dt__lspec_of(la, &own);
        int same = target.rank == own.rank;
        for (int d = 0; same && d < r; d++)
            same = target.spec[d] == own.spec[d];
        for (int d = 0; same && d < DT_MESH_MAX_DIMS; d++)
            same = target.partial[d] == own.partial[d];
        if (!same)
            return 0;
        dt_tensor *view = NULL;
        *st = dt__tensor_share(c, la, &view);
        if (*st == DT_OK)
            *st = dt_axpy(1.0f, view, acc);
        dt_tensor_destroy(view);
        return 1;
    }
    *st = dt_axpy(1.0f, c, acc);
    return 1;
}

static dt_status bias_add_run(const dt_tensor *x, const dt_tensor *bias, dt_tensor **out)
{
    static const char op[] = "dt_bias_add";
    dt_status st = dt__check_f32(op, "x", x);
    if (st == DT_OK)
        st = dt__check_f32(op, "bias", bias);
    if (st == DT_OK)
        st = dt__check_tensor(op, "bias", bias, x);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: output pointer is NULL", op);
    if (st != DT_OK)
        return st;
    int r = dt_tensor_rank(x);
    if (r < 1 || dt_tensor_rank(bias) != 1 || dt_tensor_shape(bias)[0] != dt_tensor_shape(x)[r - 1])
        return dt__error(DT_ERR_SHAPE, "%s: bias must be 1-D of x's last dim (x rank %d, bias "
                         "rank %d)", op, r, dt_tensor_rank(bias));
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(x));
    const dt__ops_backend *be = NULL;
    st = dt__ops_backend_for(mesh, op, &be);
    if (st != DT_OK)
        return st;
    dt__lspec lx, lb;
    dt__lspec_of(dt_tensor_layout(x), &lx);
    strip_nonsum(&lx);
    /* The bias follows x's last dim, and x's sum-partial dims (its value on one member). */
    memset(&lb, 0, sizeof lb);
    lb.rank = 1;
    lb.spec[0] = lx.spec[r - 1];
    memcpy(lb.partial, lx.partial, sizeof lb.partial);
    dt_tensor *rx = NULL, *rb = NULL, *y = NULL;
    st = dt__ensure_layout(x, &lx, &rx);
    if (st == DT_OK)
        st = dt__ensure_layout(bias, &lb, &rb);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &lx, DT_DTYPE_F32, dt_tensor_shape(x), &y);
    ew_local e = {.be = be, .a = rx, .b = rb, .c = y};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, bias_add_one, &e);
    st = dt__ops_finish(be, op, NULL, st, &y, out);
    dt_tensor_destroy(rb);
    dt_tensor_destroy(rx);
    return st;
}

/* The public entry: records the call on this thread's tape (autograd/record.h). */
dt_status dt_bias_add(const dt_tensor *x, const dt_tensor *bias, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = bias_add_run(x, bias, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_BIAS_ADD, .nin = 2, .in = {x, bias}};
    return dt__rec_finish(r, st, &rec, t, out);
}

static dt_status cast_run(const dt_tensor *x, dt_dtype dtype, dt_tensor **out)
{
    static const char op[] = "dt_cast";
    dt_status st = dt__check_tensor(op, "x", x, NULL);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: output pointer is NULL", op);
    if (st != DT_OK)
        return st;
    dt_dtype from = dt_tensor_dtype(x);
    int ok_from = from == DT_DTYPE_F32 || from == DT_DTYPE_F64 || from == DT_DTYPE_F16 ||
                  from == DT_DTYPE_BF16;
    int ok_to = dtype == DT_DTYPE_F32 || dtype == DT_DTYPE_F64 || dtype == DT_DTYPE_F16 ||
                dtype == DT_DTYPE_BF16;
    if (!ok_from || !ok_to)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: %s -> %s (f32, f64, f16 and bf16 only)", op,
                         dt_dtype_name(from), dt_dtype_name(dtype));
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(x));
    const dt__ops_backend *be = NULL;
    st = dt__ops_backend_for(mesh, op, &be);
    if (st != DT_OK)
        return st;
    dt_tensor *y = NULL;
    st = dt__tensor_empty(dt_tensor_layout(x), dtype, dt_tensor_shape(x), &y);
    ew_local e = {.be = be, .a = x, .c = y, .from = from, .to = dtype};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, cast_one, &e);
    st = dt__ops_finish(be, op, NULL, st, &y, out);
    return st;
}

/* The public entry: records the call on this thread's tape (autograd/record.h). */
dt_status dt_cast(const dt_tensor *x, dt_dtype dtype, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = cast_run(x, dtype, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_CAST, .nin = 1, .in = {x}, .iattr = {(int64_t)dtype}};
    return dt__rec_finish(r, st, &rec, t, out);
}
