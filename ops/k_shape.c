/* ops/k_shape: the CPU kernels of the shape ops (reshape, permute, slice and its backward,
 * concat, expand, squeeze / unsqueeze) on local blocks. They move bytes of any dtype; where a
 * rule lets a dim be sharded they place elements by their global coordinates. */
#include <stdlib.h>
#include <string.h>

#include "ops/shape_impl.h"
#include "runtime/error.h"

static int64_t numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= shape[d];
    return n;
}

/* Advances row-major coordinates c over shape; the last dim moves fastest. */
static void next_coords(int rank, const int64_t *shape, int64_t *c)
{
    for (int d = rank - 1; d >= 0; d--) {
        if (++c[d] < shape[d])
            return;
        c[d] = 0;
    }
}

/* 1 if the block is one run of the global row-major order; *start its first global index. */
static int block_run(const dt_op_buf *b, int64_t *start)
{
    int64_t gs[DT_MAX_RANK];
    dt__strides(b->rank, b->global, gs);
    int last = -1;
    for (int d = 0; d < b->rank; d++)
        if (b->shape[d] != b->global[d])
            last = d;
    for (int d = 0; d < last; d++)
        if (b->shape[d] != 1)
            return 0;
    *start = 0;
    for (int d = 0; d < b->rank; d++)
        *start += b->offset[d] * gs[d];
    return 1;
}

dt_status dt__k_reshape(const dt_op_kernel_args *a)
{
    const dt_op_buf *in = &a->in[0], *out = &a->out;
    size_t es = dt_dtype_size(out->dtype);
    int64_t n = dt__op_numel(out), s_in = 0, s_out = 0;
    if (n == 0)
        return DT_OK;
    /* The common case: both blocks are the same run of the global order (whole tensors, or
     * leading-dim shards that stay whole under the reshape). */
    if (dt__op_numel(in) == n && block_run(in, &s_in) && block_run(out, &s_out) && s_in == s_out) {
        memcpy(out->data, in->data, (size_t)n * es);
        return DT_OK;
    }
    int64_t gs_out[DT_MAX_RANK], gs_in[DT_MAX_RANK], ls_in[DT_MAX_RANK], c[DT_MAX_RANK] = {0};
    dt__strides(out->rank, out->global, gs_out);
    dt__strides(in->rank, in->global, gs_in);
    dt__strides(in->rank, in->shape, ls_in);
    const char *src = in->data;
    char *dst = out->data;
    for (int64_t k = 0; k < n; k++) {
        int64_t f = 0, li = 0;
        for (int d = 0; d < out->rank; d++)
            f += (out->offset[d] + c[d]) * gs_out[d];
        for (int d = 0; d < in->rank; d++) {
            int64_t g = f / gs_in[d] - in->offset[d];
            f %= gs_in[d];
            if (g < 0 || g >= in->shape[d])
                return dt__error(DT_ERR_INVALID_ARGUMENT,
                                 "reshape: output element %lld needs "
                                 "an input element outside the local block (a rule bug)",
                                 (long long)k);
            li += g * ls_in[d];
        }
        memcpy(dst + (size_t)k * es, src + (size_t)li * es, es);
        next_coords(out->rank, out->shape, c);
    }
    return DT_OK;
}

dt_status dt__k_permute(const dt_op_kernel_args *a)
{
    const dt_op_buf *in = &a->in[0], *out = &a->out;
    size_t es = dt_dtype_size(out->dtype);
    int rank = out->rank;
    int64_t ls_in[DT_MAX_RANK], st[DT_MAX_RANK], c[DT_MAX_RANK] = {0};
    dt__strides(rank, in->shape, ls_in);
    for (int d = 0; d < rank; d++) {
        int p = dt__op_axis((int)a->attrs.i[d], rank);
        if (p < 0 || in->shape[p] != out->shape[d])
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "permute: local blocks do not match the "
                             "permutation at output dim %d",
                             d);
        st[d] = ls_in[p];
    }
    int64_t n = dt__op_numel(out);
    const char *src = in->data;
    char *dst = out->data;
    if (rank == 0 && n == 1) {
        memcpy(dst, src, es);
        return DT_OK;
    }
    int64_t inner = rank ? out->shape[rank - 1] : 1, sl = rank ? st[rank - 1] : 0;
    for (int64_t k = 0; k < n; k += inner) {
        int64_t off = 0;
        for (int d = 0; d < rank - 1; d++)
            off += c[d] * st[d];
        if (es == 4) {
            for (int64_t j = 0; j < inner; j++)
                memcpy(dst + (size_t)(k + j) * 4, src + (size_t)(off + j * sl) * 4, 4);
        } else if (es == 8) {
            for (int64_t j = 0; j < inner; j++)
                memcpy(dst + (size_t)(k + j) * 8, src + (size_t)(off + j * sl) * 8, 8);
        } else {
            for (int64_t j = 0; j < inner; j++)
                memcpy(dst + (size_t)(k + j) * es, src + (size_t)(off + j * sl) * es, es);
        }
        if (rank >= 2)
            next_coords(rank - 1, out->shape, c);
    }
    return DT_OK;
}

/* Elements before and after `axis` of a local block. */
static void outer_inner(const dt_op_buf *b, int axis, int64_t *outer, int64_t *inner)
{
    *outer = numel(axis, b->shape);
    *inner = numel(b->rank - axis - 1, b->shape + axis + 1);
}

dt_status dt__k_slice(const dt_op_kernel_args *a)
{
    const dt_op_buf *in = &a->in[0], *out = &a->out;
    int axis = dt__op_axis((int)a->attrs.i[0], in->rank);
    if (axis < 0 || in->shape[axis] != in->global[axis])
        return dt__error(DT_ERR_INVALID_ARGUMENT, "slice: the sliced axis must be whole");
    int64_t first, count, step = a->attrs.i[3], outer, inner;
    dt__slice_range(in->global[axis], a->attrs.i[1], a->attrs.i[2], step, &first, &count);
    if (out->shape[axis] != count)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "slice: output block of %lld, want %lld",
                         (long long)out->shape[axis], (long long)count);
    outer_inner(out, axis, &outer, &inner);
    size_t es = dt_dtype_size(out->dtype), row = (size_t)inner * es;
    int64_t n = in->shape[axis];
    if (dt__op_numel(out) == 0)
        return DT_OK;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < count; j++)
            memcpy((char *)out->data + (size_t)(o * count + j) * row,
                   (const char *)in->data + (size_t)(o * n + first + j * step) * row, row);
    return DT_OK;
}

dt_status dt__k_slice_backward(const dt_op_kernel_args *a)
{
    const dt_op_buf *dy = &a->in[0], *out = &a->out;
    int axis = dt__op_axis((int)a->attrs.i[0], out->rank);
    if (axis < 0 || out->shape[axis] != out->global[axis])
        return dt__error(DT_ERR_INVALID_ARGUMENT, "slice_backward: the axis must be whole");
    int64_t first, count, step = a->attrs.i[3], outer, inner, n = out->shape[axis];
    dt__slice_range(n, a->attrs.i[1], a->attrs.i[2], step, &first, &count);
    if (dy->shape[axis] != count)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "slice_backward: input block of %lld, "
                         "want %lld",
                         (long long)dy->shape[axis], (long long)count);
    outer_inner(out, axis, &outer, &inner);
    size_t es = dt_dtype_size(out->dtype), row = (size_t)inner * es;
    if (dt__op_numel(out) > 0)
        memset(out->data, 0, (size_t)dt__op_numel(out) * es);
    if (dt__op_numel(dy) == 0)
        return DT_OK;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < count; j++)
            memcpy((char *)out->data + (size_t)(o * n + first + j * step) * row,
                   (const char *)dy->data + (size_t)(o * count + j) * row, row);
    return DT_OK;
}

dt_status dt__k_concat(const dt_op_kernel_args *a)
{
    const dt_op_buf *out = &a->out;
    int axis = dt__op_axis((int)a->attrs.i[0], out->rank);
    if (axis < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "concat: bad axis");
    int64_t outer, inner, total = 0;
    outer_inner(out, axis, &outer, &inner);
    for (int k = 0; k < a->nin; k++)
        total += a->in[k].shape[axis];
    if (total != out->shape[axis])
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "concat: input blocks of %lld along the "
                         "axis, output block of %lld",
                         (long long)total, (long long)out->shape[axis]);
    size_t es = dt_dtype_size(out->dtype), row = (size_t)inner * es;
    for (int64_t o = 0; o < outer; o++) {
        int64_t pos = 0;
        for (int k = 0; k < a->nin; k++) {
            int64_t len = a->in[k].shape[axis];
            if (len > 0 && row > 0)
                memcpy((char *)out->data + (size_t)(o * total + pos) * row,
                       (const char *)a->in[k].data + (size_t)(o * len) * row, (size_t)len * row);
            pos += len;
        }
    }
    return DT_OK;
}

dt_status dt__k_expand(const dt_op_kernel_args *a)
{
    const dt_op_buf *in = &a->in[0], *out = &a->out;
    size_t es = dt_dtype_size(out->dtype);
    int lead = out->rank - in->rank;
    int64_t ls_in[DT_MAX_RANK], c[DT_MAX_RANK] = {0};
    dt__strides(in->rank, in->shape, ls_in);
    for (int d = 0; d < in->rank; d++) {
        if (in->shape[d] == 1 && out->shape[d + lead] != 1)
            ls_in[d] = 0; /* broadcast: every output position reads the one element */
        else if (in->shape[d] != out->shape[d + lead])
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "expand: local blocks do not match at "
                             "dim %d",
                             d);
    }
    int64_t n = dt__op_numel(out);
    const char *src = in->data;
    char *dst = out->data;
    for (int64_t k = 0; k < n; k++) {
        int64_t li = 0;
        for (int d = 0; d < in->rank; d++)
            li += c[d + lead] * ls_in[d];
        memcpy(dst + (size_t)k * es, src + (size_t)li * es, es);
        next_coords(out->rank, out->shape, c);
    }
    return DT_OK;
}

dt_status dt__k_expand_backward(const dt_op_kernel_args *a)
{
    const dt_op_buf *dy = &a->in[0], *out = &a->out;
    int lead = dy->rank - out->rank;
    int64_t ls[DT_MAX_RANK], st[DT_MAX_RANK] = {0}, c[DT_MAX_RANK] = {0};
    int64_t m = dt__op_numel(out), n = dt__op_numel(dy);
    dt__strides(out->rank, out->shape, ls);
    for (int d = 0; d < out->rank; d++) {
        if (out->shape[d] == dy->shape[d + lead])
            st[d + lead] = ls[d];
        else if (out->shape[d] != 1)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "expand_backward: local blocks do not "
                             "match at dim %d",
                             d);
    }
    /* Sums in f64, in dy's row-major order: the same on every device for its block. */
    double *acc = calloc((size_t)(m > 0 ? m : 1), sizeof *acc);
    if (!acc)
        return dt__error(DT_ERR_NO_MEMORY, "expand_backward: out of memory");
    int f64 = dy->dtype == DT_DTYPE_F64;
    for (int64_t k = 0; k < n; k++) {
        int64_t o = 0;
        for (int d = lead; d < dy->rank; d++)
            o += c[d] * st[d];
        acc[o] += f64 ? ((const double *)dy->data)[k] : (double)((const float *)dy->data)[k];
        next_coords(dy->rank, dy->shape, c);
    }
    for (int64_t k = 0; k < m; k++) {
        if (f64)
            ((double *)out->data)[k] = acc[k];
        else
            ((float *)out->data)[k] = (float)acc[k];
    }
    free(acc);
    return DT_OK;
}

dt_status dt__k_copy(const dt_op_kernel_args *a)
{
    int64_t n = dt__op_numel(&a->out);
    if (dt__op_numel(&a->in[0]) != n)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "reshape: local blocks of %lld and %lld "
                         "elements",
                         (long long)dt__op_numel(&a->in[0]), (long long)n);
    if (n)
        memcpy(a->out.data, a->in[0].data, (size_t)n * dt_dtype_size(a->out.dtype));
    return DT_OK;
}
