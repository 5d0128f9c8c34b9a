/* ops/k_index: the CPU kernels of the index ops (gather, scatter_add, index_select,
 * index_add, one_hot) on local blocks. Index values are checked against their range; the adds
 * run in the index's row-major order, so every layout gives a single device's bits. */
#include <string.h>

#include "ops/shape_impl.h"
#include "runtime/error.h"

static void next_coords(int rank, const int64_t *shape, int64_t *c)
{
    for (int d = rank - 1; d >= 0; d--) {
        if (++c[d] < shape[d])
            return;
        c[d] = 0;
    }
}

static dt_status out_of_range(const char *op, int64_t v, int64_t n, int axis)
{
    return dt__error(DT_ERR_INVALID_ARGUMENT,
                     "%s: index %lld out of range [0, %lld) along "
                     "axis %d",
                     op, (long long)v, (long long)n, axis);
}

static dt_status not_local(const char *op)
{
    return dt__error(DT_ERR_INVALID_ARGUMENT,
                     "%s: an element outside the local block (a rule "
                     "bug)",
                     op);
}

dt_status dt__k_gather(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *idx = &a->in[1], *out = &a->out;
    int rank = out->rank, axis = dt__op_axis((int)a->attrs.i[0], rank);
    if (axis < 0 || dt__op_numel(idx) != dt__op_numel(out))
        return not_local("gather");
    size_t es = dt_dtype_size(out->dtype);
    int64_t ls[DT_MAX_RANK], c[DT_MAX_RANK] = {0}, n = dt__op_numel(out);
    dt__strides(rank, x->shape, ls);
    for (int64_t k = 0; k < n; k++) {
        int64_t v = dt__index_at(idx->data, idx->dtype, k), li = 0;
        if (v < 0 || v >= x->global[axis])
            return out_of_range("gather", v, x->global[axis], axis);
        for (int d = 0; d < rank; d++) {
            int64_t g = (d == axis ? v : out->offset[d] + c[d]) - x->offset[d];
            if (g < 0 || g >= x->shape[d])
                return not_local("gather");
            li += g * ls[d];
        }
        memcpy((char *)out->data + (size_t)k * es, (const char *)x->data + (size_t)li * es, es);
        next_coords(rank, out->shape, c);
    }
    return DT_OK;
}

dt_status dt__k_scatter_add(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *idx = &a->in[1], *src = &a->in[2], *out = &a->out;
    int rank = out->rank, axis = dt__op_axis((int)a->attrs.i[0], rank);
    if (axis < 0 || dt__op_numel(x) != dt__op_numel(out))
        return not_local("scatter_add");
    size_t es = dt_dtype_size(out->dtype);
    if (dt__op_numel(out) > 0)
        memcpy(out->data, x->data, (size_t)dt__op_numel(out) * es);
    int64_t lo[DT_MAX_RANK], lsrc[DT_MAX_RANK], c[DT_MAX_RANK] = {0}, n = dt__op_numel(idx);
    dt__strides(rank, out->shape, lo);
    dt__strides(rank, src->shape, lsrc);
    for (int64_t k = 0; k < n; k++, next_coords(rank, idx->shape, c)) {
        int64_t v = dt__index_at(idx->data, idx->dtype, k), lt = 0, lsi = 0;
        if (v < 0 || v >= out->global[axis])
            return out_of_range("scatter_add", v, out->global[axis], axis);
        int mine = 1;
        for (int d = 0; d < rank; d++) {
            int64_t g = idx->offset[d] + c[d], s = g - src->offset[d];
            if (s < 0 || s >= src->shape[d])
                return not_local("scatter_add");
            lsi += s * lsrc[d];
            int64_t t = (d == axis ? v : g) - out->offset[d];
            if (t < 0 || t >= out->shape[d])
                mine = 0; /* another device's block of the output */
            lt += t * lo[d];
        }
        if (mine)
            dt__add_elem(out->dtype, (char *)out->data + (size_t)lt * es,
                         (const char *)src->data + (size_t)lsi * es);
    }
    return DT_OK;
}

dt_status dt__k_index_select(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *idx = &a->in[1], *out = &a->out;
    int rank = out->rank, axis = dt__op_axis((int)a->attrs.i[0], rank);
    if (axis < 0 || x->shape[axis] != x->global[axis] || idx->shape[0] != out->shape[axis])
        return not_local("index_select");
    int64_t outer = 1, inner = 1, m = out->shape[axis], nx = x->shape[axis];
    for (int d = 0; d < axis; d++)
        outer *= out->shape[d];
    for (int d = axis + 1; d < rank; d++)
        inner *= out->shape[d];
    size_t row = (size_t)inner * dt_dtype_size(out->dtype);
    for (int64_t j = 0; j < m; j++) {
        int64_t v = dt__index_at(idx->data, idx->dtype, j);
        if (v < 0 || v >= nx)
            return out_of_range("index_select", v, nx, axis);
    }
    if (row == 0)
        return DT_OK;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < m; j++) {
            int64_t v = dt__index_at(idx->data, idx->dtype, j);
            memcpy((char *)out->data + (size_t)(o * m + j) * row,
                   (const char *)x->data + (size_t)(o * nx + v) * row, row);
        }
    return DT_OK;
}

dt_status dt__k_index_add(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *idx = &a->in[1], *src = &a->in[2], *out = &a->out;
    int rank = out->rank, axis = dt__op_axis((int)a->attrs.i[0], rank);
    if (axis < 0 || out->shape[axis] != out->global[axis] || src->shape[axis] != idx->shape[0] ||
        dt__op_numel(x) != dt__op_numel(out))
        return not_local("index_add");
    size_t es = dt_dtype_size(out->dtype);
    if (dt__op_numel(out) > 0)
        memcpy(out->data, x->data, (size_t)dt__op_numel(out) * es);
    int64_t outer = 1, inner = 1, m = idx->shape[0], n = out->shape[axis];
    for (int d = 0; d < axis; d++)
        outer *= out->shape[d];
    for (int d = axis + 1; d < rank; d++)
        inner *= out->shape[d];
    for (int64_t j = 0; j < m; j++) {
        int64_t v = dt__index_at(idx->data, idx->dtype, j);
        if (v < 0 || v >= n)
            return out_of_range("index_add", v, n, axis);
    }
    /* j outermost: each output element takes its adds in index order, on every layout. */
    for (int64_t j = 0; j < m; j++) {
        int64_t v = dt__index_at(idx->data, idx->dtype, j);
        for (int64_t o = 0; o < outer; o++) {
            char *dst = (char *)out->data + (size_t)((o * n + v) * inner) * es;
            const char *s = (const char *)src->data + (size_t)((o * m + j) * inner) * es;
            for (int64_t i = 0; i < inner; i++)
                dt__add_elem(out->dtype, dst + (size_t)i * es, s + (size_t)i * es);
        }
    }
    return DT_OK;
}

dt_status dt__k_one_hot(const dt_op_kernel_args *a)
{
    const dt_op_buf *idx = &a->in[0], *out = &a->out;
    int64_t classes = a->attrs.i[0], n = dt__op_numel(idx);
    int last = out->rank - 1;
    int64_t len = out->shape[last], off = out->offset[last];
    if (n * len != dt__op_numel(out))
        return not_local("one_hot");
    for (int64_t p = 0; p < n; p++) {
        int64_t v = dt__index_at(idx->data, idx->dtype, p);
        if (v < 0 || v >= classes)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "one_hot: index %lld out of range "
                             "[0, %lld)",
                             (long long)v, (long long)classes);
        for (int64_t c = 0; c < len; c++) {
            double one = off + c == v ? 1.0 : 0.0;
            if (out->dtype == DT_DTYPE_F64)
                ((double *)out->data)[p * len + c] = one;
            else
                ((float *)out->data)[p * len + c] = (float)one;
        }
    }
    return DT_OK;
}
