/* Helpers of the distributed ops: layouts as mesh-dim index arrays, the relayout traffic
 * model the ops use to pick the cheapest valid layouts, input checks, local component access,
 * one outcome over the mesh's clients for data-dependent failures. */
#include <stdio.h>
#include <string.h>

#include "layout/tensor_dev.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"

void dt__lspec_of(const dt_layout *layout, dt__lspec *out)
{
    memset(out, 0, sizeof *out);
    out->rank = dt_layout_rank(layout);
    for (int i = 0; i < out->rank; i++)
        out->spec[i] = dt_layout_spec_mesh_dim(layout, i);
    for (int i = 0; i < dt_layout_num_partial(layout); i++) {
        int d = -1;
        dt_reduce_op op = DT_REDUCE_SUM;
        if (dt_layout_partial(layout, i, &d, &op) == DT_OK && d >= 0 && d < DT_MESH_MAX_DIMS)
            out->partial[d] = 1 + (int)op;
    }
}

dt_status dt__lspec_layout(const dt_mesh *mesh, const dt__lspec *ls, dt_layout **out)
{
    const char *specs[DT_MAX_RANK];
    const char *pdims[DT_MESH_MAX_DIMS];
    dt_reduce_op pops[DT_MESH_MAX_DIMS];
    int np = 0;
    for (int i = 0; i < ls->rank; i++)
        specs[i] = ls->spec[i] < 0 ? DT_UNSHARDED : dt_mesh_dim_name(mesh, ls->spec[i]);
    for (int d = 0; d < dt_mesh_rank(mesh); d++)
        if (ls->partial[d]) {
            pdims[np] = dt_mesh_dim_name(mesh, d);
            pops[np++] = (dt_reduce_op)(ls->partial[d] - 1);
        }
    return dt_layout_create_partial(mesh, ls->rank, specs, np, pdims, pops, out);
}

int dt__lspec_has_partial(const dt__lspec *ls)
{
    for (int d = 0; d < DT_MESH_MAX_DIMS; d++)
        if (ls->partial[d])
            return 1;
    return 0;
}

int dt__lspec_has_nonsum_partial(const dt__lspec *ls)
{
    for (int d = 0; d < DT_MESH_MAX_DIMS; d++)
        if (ls->partial[d] && ls->partial[d] != 1 + (int)DT_REDUCE_SUM)
            return 1;
    return 0;
}

static void box_of(const dt_mesh *mesh, const int64_t *coords, const int64_t *shape,
                   const dt__lspec *ls, int64_t *off, int64_t *len)
{
    for (int i = 0; i < ls->rank; i++) {
        if (ls->spec[i] < 0) {
            off[i] = 0;
            len[i] = shape[i];
        } else {
            dt_shard_range(shape[i], dt_mesh_dim_size(mesh, ls->spec[i]), coords[ls->spec[i]],
                           &off[i], &len[i]);
        }
    }
}

double dt__relayout_cost(const dt_mesh *mesh, const int64_t *shape, const dt__lspec *from,
                         const dt__lspec *to)
{
    if (memcmp(from, to, sizeof *from) == 0)
        return 0.0;
    int reduce = 0;
    for (int d = 0; d < DT_MESH_MAX_DIMS; d++)
        if (from->partial[d] && from->partial[d] != to->partial[d])
            reduce = 1;
    double total = 0.0;
    int64_t size = dt_mesh_size(mesh);
    for (int64_t p = 0; p < size; p++) {
        int64_t coords[DT_MESH_MAX_DIMS] = {0};
        int64_t fo[DT_MAX_RANK], fl[DT_MAX_RANK], to_o[DT_MAX_RANK], to_l[DT_MAX_RANK];
        dt_mesh_coords(mesh, p, coords);
        box_of(mesh, coords, shape, from, fo, fl);
        box_of(mesh, coords, shape, to, to_o, to_l);
        double vol = 1.0, inter = 1.0;
        for (int i = 0; i < to->rank; i++) {
            vol *= (double)to_l[i];
            int64_t lo = fo[i] > to_o[i] ? fo[i] : to_o[i];
            int64_t hi_f = fo[i] + fl[i], hi_t = to_o[i] + to_l[i];
            int64_t hi = hi_f < hi_t ? hi_f : hi_t;
            inter *= hi > lo ? (double)(hi - lo) : 0.0;
        }
        /* A reduction needs every summand of the destination box: model it as twice the box
         * (reduce-scatter plus all-gather volume). */
        total += reduce ? 2.0 * vol : vol - inter;
    }
    return total;
}

dt_status dt__ensure_layout_l(const dt_tensor *t, const dt_layout *layout, dt_tensor **out)
{
    return dt__relayout_shared(t, layout, out);
}

dt_status dt__ensure_layout(const dt_tensor *t, const dt__lspec *ls, dt_tensor **out)
{
    dt_layout *l = NULL;
    dt_status st = dt__lspec_layout(dt_layout_mesh(dt_tensor_layout(t)), ls, &l);
    if (st != DT_OK)
        return st;
    st = dt__ensure_layout_l(t, l, out);
    dt_layout_destroy(l);
    return st;
}

dt_status dt__ops_finish(const dt__ops_backend *be, const char *op, const dt_layout *layout,
                         dt_status st, dt_tensor **result, dt_tensor **out)
{
    if (st == DT_OK && be && be->sync)
        st = be->sync();
    if (st == DT_OK)
        st = dt__finish_layout(op, layout, result);
    if (st == DT_OK) {
        *out = *result;
        *result = NULL;
    }
    dt_tensor_destroy(*result);
    *result = NULL;
    return st;
}

dt_status dt__finish_layout(const char *op, const dt_layout *layout, dt_tensor **t)
{
    if (!layout)
        return DT_OK;
    const dt_layout *have = dt_tensor_layout(*t);
    if (!dt_mesh_equal(dt_layout_mesh(layout), dt_layout_mesh(have)))
        return dt__error(DT_ERR_SHAPE, "%s: the requested output layout is on another mesh than "
                         "the inputs", op);
    if (dt_layout_rank(layout) != dt_layout_rank(have))
        return dt__error(DT_ERR_SHAPE, "%s: the requested output layout has rank %d, the output "
                         "has rank %d", op, dt_layout_rank(layout), dt_layout_rank(have));
    if (dt_layout_equal(layout, have))
        return DT_OK;
    /* *t is the op's own result: a view of it (where the placement agrees) is as fresh. */
    dt_tensor *r = NULL;
    dt_status st = dt__relayout_shared(*t, layout, &r);
    if (st != DT_OK)
        return st;
    dt_tensor_destroy(*t);
    *t = r;
    return DT_OK;
}

dt_status dt__check_tensor(const char *op, const char *what, const dt_tensor *t,
                           const dt_tensor *ref)
{
    if (!t)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, what);
    if (ref && !dt_mesh_equal(dt_layout_mesh(dt_tensor_layout(t)),
                              dt_layout_mesh(dt_tensor_layout(ref))))
        return dt__error(DT_ERR_SHAPE, "%s: %s is on another mesh than the first operand", op,
                         what);
    return DT_OK;
}

dt_status dt__check_f32(const char *op, const char *what, const dt_tensor *t)
{
    if (!t)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, what);
    if (dt_tensor_dtype(t) != DT_DTYPE_F32)
        return dt__error(DT_ERR_SHAPE, "%s: %s has dtype %s, f32 expected", op, what,
                         dt_dtype_name(dt_tensor_dtype(t)));
    return DT_OK;
}

dt_status dt__check_same_shape(const char *op, const dt_tensor *a, const dt_tensor *b)
{
    int ra = dt_tensor_rank(a), rb = dt_tensor_rank(b);
    int same = ra == rb;
    for (int i = 0; same && i < ra; i++)
        same = dt_tensor_shape(a)[i] == dt_tensor_shape(b)[i];
    if (same)
        return DT_OK;
    char sa[128], sb[128];
    return dt__error(DT_ERR_SHAPE, "%s: shapes %s and %s differ", op,
                     dt__shape_str(ra, dt_tensor_shape(a), sa, sizeof sa),
                     dt__shape_str(rb, dt_tensor_shape(b), sb, sizeof sb));
}

dt_status dt__check_like(const char *op, const char *what, const dt_tensor *t,
                         const dt_tensor *ref)
{
    dt_status st = dt__check_f32(op, what, t);
    if (st == DT_OK)
        st = dt__check_tensor(op, what, t, ref);
    if (st == DT_OK)
        st = dt__check_same_shape(op, ref, t);
    return st;
}

dt_status dt__ops_begin(const char *op, dt_status st, int outs_given, const char *out_name,
                        const dt_tensor *t, const dt_mesh **mesh_out,
                        const dt__ops_backend **be_out)
{
    if (st == DT_OK && !outs_given)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, out_name);
    if (st != DT_OK)
        return st;
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(t));
    if (mesh_out)
        *mesh_out = mesh;
    return dt__ops_backend_for(mesh, op, be_out);
}

void *dt__local_data(const dt_tensor *t, int i)
{
    const DLTensor *d = dt_tensor_local(t, i);
    if (!d || !d->data)
        return NULL;
    return (char *)d->data + d->byte_offset;
}

dt_status dt__ops_each_local(const dt__ops_backend *be, const dt_tensor *t, dt__work_fn fn,
                             void *arg)
{
    int n = dt_tensor_num_local(t), busy = 0, cpu = be == dt__ops_cpu_backend();
    if (cpu && dt__workers_lanes() > 1)
        for (int i = 0; i < n && busy < 2; i++)
            busy += dt__local_numel(t, i) > 0;
    /* One BLAS thread per lane when the lanes compute at once, all of the process's share
     * otherwise; set here, before the job, never by a worker while others are in BLAS. */
    if (cpu)
        dt__blas_threads_job(busy >= 2 ? dt__workers_lanes() : 1);
    if (busy >= 2)
        return dt__workers_run(n, fn, arg);
    for (int i = 0; i < n; i++) {
        dt_status st = dt__set_device_of(be, t, i);
        if (st == DT_OK)
            st = fn(i, arg);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

int64_t dt__local_numel(const dt_tensor *t, int i)
{
    const DLTensor *d = dt_tensor_local(t, i);
    return d ? dt__numel(d->ndim, d->shape) : 0;
}

dt_status dt__tensor_new(const dt_mesh *mesh, const dt__lspec *ls, dt_dtype dtype,
                         const int64_t *shape, dt_tensor **out)
{
    dt_layout *l = NULL;
    dt_status st = dt__lspec_layout(mesh, ls, &l);
    if (st != DT_OK)
        return st;
    st = dt__tensor_empty(l, dtype, shape, out);
    dt_layout_destroy(l);
    return st;
}

