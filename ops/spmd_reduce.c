/* Distributed reductions: over one axis or all (partial over the mesh dims that shard the
 * reduced dims), bias gradient, squared L2 norm, inf/NaN detection, reading a scalar. */
#include <math.h>
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/half.h"
#include "runtime/record.h"

static void strip(dt__lspec *ls, int keep_sum)
{
    for (int d = 0; d < DT_MESH_MAX_DIMS; d++)
        if (!keep_sum || ls->partial[d] != 1 + (int)DT_REDUCE_SUM)
            ls->partial[d] = 0;
}

static dt_status begin(const char *op, const dt_tensor *x, void *out,
                       const dt__ops_backend **be)
{
    return dt__ops_begin(op, dt__check_f32(op, "x", x), out != NULL, "output pointer", x, NULL,
                         be);
}

/* The local kernels of component i (dt__ops_each_local): x -> y. */
typedef struct red_local {
    const dt__ops_backend *be;
    const dt_tensor *x, *y;
    dt_reduce_op op;
    int linear, all, axis;
    int64_t reduced_count;
} red_local;

static dt_status reduce_one(int i, void *arg)
{
    const red_local *a = arg;
    const DLTensor *lt = dt_tensor_local(a->x, i);
    int64_t outer = 1, len = 1, inner = 1;
    for (int j = 0; j < lt->ndim; j++) {
        if (a->all || j == a->axis)
            len *= lt->shape[j];
        else if (j < a->axis)
            outer *= lt->shape[j];
        else
            inner *= lt->shape[j];
    }
    if (outer * inner == 0)
        return DT_OK;
    float *dst = dt__local_data(a->y, i);
    dt_status st = a->be->reduce_axis(a->linear ? DT_REDUCE_SUM : a->op, outer, len, inner,
                                      dt__local_data(a->x, i), dst);
    /* Mean over the global count, so the partial sums add up to it. */
    if (st == DT_OK && a->op == DT_REDUCE_AVG)
        st = a->be->scale(outer * inner,
                          a->reduced_count ? 1.0f / (float)a->reduced_count : NAN, dst, dst);
    return st;
}

static dt_status bias_grad_one(int i, void *arg)
{
    const red_local *a = arg;
    int64_t cols = dt__local_numel(a->y, i);
    if (cols == 0)
        return DT_OK;
    return a->be->bias_grad(dt__local_numel(a->x, i) / cols, cols, dt__local_data(a->x, i),
                            dt__local_data(a->y, i));
}

/* Every component writes its partial sum, also an empty one (zero). */
static dt_status sq_norm_one(int i, void *arg)
{
    const red_local *a = arg;
    return a->be->sq_norm(dt__local_numel(a->x, i), dt__local_data(a->x, i),
                          dt__local_data(a->y, i));
}

static dt_status nonfinite_one(int i, void *arg)
{
    const red_local *a = arg;
    return a->be->nonfinite(dt__local_numel(a->x, i), dt__local_data(a->x, i),
                            dt_tensor_dtype(a->x), dt__local_data(a->y, i));
}

static dt_status reduce_run(const dt_tensor *x, dt_reduce_op op, int axis, const dt_layout *layout,
                    dt_tensor **out)
{
    static const char name[] = "dt_reduce";
    if (dt__is_half(x) && out) {
        /* f16 / bf16: reduced in f32, the result f32. */
        dt_tensor *wx = NULL;
        dt_status st = dt__widen(x, &wx);
        if (st == DT_OK)
            st = dt_reduce(wx, op, axis, layout, out);
        dt_tensor_destroy(wx);
        return st;
    }
    const dt__ops_backend *be = NULL;
    dt_status st = begin(name, x, out, &be);
    if (st != DT_OK)
        return st;
    if (op != DT_REDUCE_SUM && op != DT_REDUCE_MAX && op != DT_REDUCE_MIN &&
        op != DT_REDUCE_AVG)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: bad reduction %d", name, (int)op);
    int r = dt_tensor_rank(x);
    int all = axis == DT_ALL_AXES;
    if (!all && axis < 0)
        axis += r;
    if (!all && (axis < 0 || axis >= r))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: axis out of range for rank %d", name, r);
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(x));
    const int64_t *shape = dt_tensor_shape(x);
    dt__lspec lx, ly;
    dt__lspec_of(dt_tensor_layout(x), &lx);
    int linear = op == DT_REDUCE_SUM || op == DT_REDUCE_AVG;
    strip(&lx, linear);
    memset(&ly, 0, sizeof ly);
    memcpy(ly.partial, lx.partial, sizeof ly.partial);
    int64_t yshape[DT_MAX_RANK], reduced_count = 1;
    dt_reduce_op pop = linear ? DT_REDUCE_SUM : op;
    for (int i = 0; i < r; i++) {
        if (all || i == axis) {
            reduced_count *= shape[i];
            if (lx.spec[i] >= 0)
                ly.partial[lx.spec[i]] = 1 + (int)pop;
        } else {
            yshape[ly.rank] = shape[i];
            ly.spec[ly.rank++] = lx.spec[i];
        }
    }
    dt_tensor *rx = NULL, *y = NULL;
    st = dt__ensure_layout(x, &lx, &rx);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &ly, DT_DTYPE_F32, yshape, &y);
    red_local rl = {be, rx, y, op, linear, all, axis, reduced_count};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, reduce_one, &rl);
    st = dt__ops_finish(be, name, layout, st, &y, out);
    dt_tensor_destroy(rx);
    return st;
}

/* The public entry: records the call on this thread's tape (runtime/record.h). */
dt_status dt_reduce(const dt_tensor *x, dt_reduce_op op, int axis, const dt_layout *layout,
                    dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = reduce_run(x, op, axis, layout, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_REDUCE, .nin = 1, .in = {x}, .layout = layout, .iattr = {(int64_t)op, axis}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_bias_grad(const dt_tensor *dy, const dt_layout *layout, dt_tensor **out)
{
    static const char name[] = "dt_bias_grad";
    const dt__ops_backend *be = NULL;
    dt_status st = begin(name, dy, out, &be);
    if (st != DT_OK)
        return st;
    int r = dt_tensor_rank(dy);
    if (r < 1)
        return dt__error(DT_ERR_SHAPE, "%s: dy must have rank >= 1", name);
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(dy));
    dt__lspec lx, ly;
    dt__lspec_of(dt_tensor_layout(dy), &lx);
    strip(&lx, 1);
    memset(&ly, 0, sizeof ly);
    memcpy(ly.partial, lx.partial, sizeof ly.partial);
    ly.rank = 1;
    ly.spec[0] = lx.spec[r - 1];
    for (int i = 0; i < r - 1; i++)
        if (lx.spec[i] >= 0)
            ly.partial[lx.spec[i]] = 1 + (int)DT_REDUCE_SUM;
    int64_t yshape[1] = {dt_tensor_shape(dy)[r - 1]};
    dt_tensor *rx = NULL, *y = NULL;
    st = dt__ensure_layout(dy, &lx, &rx);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &ly, DT_DTYPE_F32, yshape, &y);
    red_local rl = {.be = be, .x = rx, .y = y};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, bias_grad_one, &rl);
    st = dt__ops_finish(be, name, layout, st, &y, out);
    dt_tensor_destroy(rx);
    return st;
}

dt_status dt_sq_norm(const dt_tensor *x, const dt_layout *layout, dt_tensor **out)
{
    static const char name[] = "dt_sq_norm";
    const dt__ops_backend *be = NULL;
    dt_status st = begin(name, x, out, &be);
    if (st != DT_OK)
        return st;
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(x));
    dt__lspec lx, ly;
    dt__lspec_of(dt_tensor_layout(x), &lx);
    strip(&lx, 0);
    memset(&ly, 0, sizeof ly);
    for (int i = 0; i < lx.rank; i++)
        if (lx.spec[i] >= 0)
            ly.partial[lx.spec[i]] = 1 + (int)DT_REDUCE_SUM;
    dt_tensor *rx = NULL, *y = NULL;
    st = dt__ensure_layout(x, &lx, &rx);
    int64_t none[1] = {0};
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &ly, DT_DTYPE_F32, none, &y);
    red_local rl = {.be = be, .x = rx, .y = y};
    if (st == DT_OK)
        st = dt__ops_each_local(be, rx, sq_norm_one, &rl);
    st = dt__ops_finish(be, name, layout, st, &y, out);
    dt_tensor_destroy(rx);
    return st;
}

dt_status dt_nonfinite(const dt_tensor *x, int *found_out)
{
    static const char name[] = "dt_nonfinite";
    dt_status st = dt__check_tensor(name, "x", x, NULL);
    if (st == DT_OK && !found_out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: found_out is NULL", name);
    if (st != DT_OK)
        return st;
    dt_dtype dt = dt_tensor_dtype(x);
    if (dt != DT_DTYPE_F32 && dt != DT_DTYPE_F64 && dt != DT_DTYPE_F16 && dt != DT_DTYPE_BF16)
        return dt__error(DT_ERR_SHAPE, "%s: dtype %s is not a float type", name,
                         dt_dtype_name(dt));
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(x));
    const dt__ops_backend *be = NULL;
    st = dt__ops_backend_for(mesh, name, &be);
    if (st != DT_OK)
        return st;
    /* One int32 flag per device, partial (max) over every mesh dim, then read replicated. */
    dt__lspec ly;
    memset(&ly, 0, sizeof ly);
    for (int d = 0; d < dt_mesh_rank(mesh); d++)
        ly.partial[d] = 1 + (int)DT_REDUCE_MAX;
    dt_tensor *flag = NULL;
    int64_t none[1] = {0};
    st = dt__tensor_new(mesh, &ly, DT_DTYPE_I32, none, &flag);
    red_local rl = {.be = be, .x = x, .y = flag};
    if (st == DT_OK)
        st = dt__ops_each_local(be, x, nonfinite_one, &rl);
    if (st == DT_OK && be->sync)
        st = be->sync();
    double v = 0.0;
    if (st == DT_OK)
        st = dt_item(flag, &v);
    if (st == DT_OK)
        *found_out = v != 0.0;
    dt_tensor_destroy(flag);
    return st;
}

dt_status dt_item(const dt_tensor *x, double *value_out)
{
    static const char name[] = "dt_item";
    dt_status st = dt__check_tensor(name, "x", x, NULL);
    if (st == DT_OK && !value_out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: value_out is NULL", name);
    if (st != DT_OK)
        return st;
    if (dt_tensor_rank(x) != 0)
        return dt__error(DT_ERR_SHAPE, "%s: x has rank %d, a scalar (rank 0) expected", name,
                         dt_tensor_rank(x));
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(x));
    dt_layout *rep = NULL;
    dt_tensor *r = NULL;
    st = dt_layout_replicated(mesh, 0, &rep);
    if (st == DT_OK)
        st = dt__ensure_layout_l(x, rep, &r);
    dt_layout_destroy(rep);
    if (st != DT_OK)
        return st;
    if (dt_tensor_num_local(r) < 1) {
        dt_tensor_destroy(r);
        return dt__error(DT_ERR_STATE, "%s: this client holds no device of the mesh", name);
    }
    unsigned char bytes[8] = {0};
    st = dt_tensor_local_read(r, 0, bytes, dt_dtype_size(dt_tensor_dtype(r)));
    dt_dtype dt = dt_tensor_dtype(r);
    dt_tensor_destroy(r);
    if (st != DT_OK)
        return st;
    double v = 0.0;
    float f;
    uint16_t h;
    int32_t i32;
    int64_t i64;
    switch (dt) {
    case DT_DTYPE_F32: memcpy(&f, bytes, 4); v = f; break;
    case DT_DTYPE_F64: memcpy(&v, bytes, 8); break;
    case DT_DTYPE_F16: memcpy(&h, bytes, 2); v = dt__f16_to_f32(h); break;
    case DT_DTYPE_BF16: memcpy(&h, bytes, 2); v = dt__bf16_to_f32(h); break;
    case DT_DTYPE_I32: memcpy(&i32, bytes, 4); v = i32; break;
    case DT_DTYPE_I64: memcpy(&i64, bytes, 8); v = (double)i64; break;
    default:
        return dt__error(DT_ERR_UNSUPPORTED, "%s: dtype %s", name, dt_dtype_name(dt));
    }
    *value_out = v;
    return DT_OK;
}
