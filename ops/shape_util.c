/* ops/shape_util: helpers shared by the shape and index family's files (shape_impl.h): slice
 * arithmetic, shape text, dtype classes, strides, the validator's generator, zero tensors. */
#include <stdio.h>
#include <string.h>

#include "ops/shape_impl.h"
#include "runtime/error.h"

void dt__slice_range(int64_t n, int64_t start, int64_t stop, int64_t step, int64_t *first_out,
                     int64_t *count_out)
{
    if (start < 0)
        start = start + n < 0 ? 0 : start + n;
    if (start > n)
        start = n;
    if (stop < 0)
        stop = stop + n < 0 ? 0 : stop + n;
    if (stop > n)
        stop = n;
    if (step < 1)
        step = 1;
    *first_out = start;
    *count_out = stop > start ? (stop - start + step - 1) / step : 0;
}

int dt__is_index_dtype(dt_dtype dtype)
{
    return dtype == DT_DTYPE_I32 || dtype == DT_DTYPE_I64;
}

int dt__is_addable_dtype(dt_dtype dtype)
{
    return dtype == DT_DTYPE_F32 || dtype == DT_DTYPE_F64 || dt__is_index_dtype(dtype);
}

void dt__strides(int rank, const int64_t *shape, int64_t *stride_out)
{
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; d--) {
        stride_out[d] = s;
        s *= shape[d];
    }
}

uint64_t dt__shape_rng(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

dt_status dt__zeros_for(const dt_tensor *x, int axis, dt_tensor **out)
{
    const dt_layout *l = dt_tensor_layout(x);
    int rank = dt_tensor_rank(x);
    const char *specs[DT_MAX_RANK];
    for (int d = 0; d < rank; d++)
        specs[d] =
            d == axis || dt_layout_spec_mesh_dim(l, d) < 0 ? DT_UNSHARDED : dt_layout_spec(l, d);
    dt_layout *z = NULL;
    dt_status st = dt_layout_create(dt_layout_mesh(l), rank, specs, &z);
    if (st == DT_OK)
        st = dt_tensor_zeros(z, dt_tensor_dtype(x), dt_tensor_shape(x), out);
    dt_layout_destroy(z);
    return st;
}

void dt__rule_putc(dt__rule_text *r, char c)
{
    if (r->pos + 1 < r->len)
        r->buf[r->pos] = c;
    r->pos++;
    if (r->len)
        r->buf[r->pos < r->len ? r->pos : r->len - 1] = '\0';
}

void dt__rule_operand(dt__rule_text *r, int rank, char (*dims)[DT__RULE_DIM], char sep)
{
    for (int d = 0; d < rank; d++) {
        size_t n = strlen(dims[d]);
        if (n > 1)
            dt__rule_putc(r, '(');
        for (size_t k = 0; k < n; k++)
            dt__rule_putc(r, dims[d][k]);
        if (n > 1)
            dt__rule_putc(r, ')');
    }
    if (sep)
        dt__rule_putc(r, sep);
}

void dt__rule_plain(dt__rule_text *r, int rank, int upper, char upper_letter, char sep)
{
    for (int d = 0; d < rank; d++)
        dt__rule_putc(r, d == upper ? upper_letter : dt__op_letter(d));
    if (sep)
        dt__rule_putc(r, sep);
}

dt_status dt__rule_done(const dt__rule_text *r, const char *op)
{
    if (r->pos < r->len)
        return DT_OK;
    return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: the rule needs %zu bytes, %zu given", op,
                     r->pos + 1, r->len);
}

dt_status dt__grad_dy(const dt_op_grad *g, dt_tensor **dy_out)
{
    dt_dtype want = dt_tensor_dtype(g->in[0]);
    if (dt_tensor_dtype(g->dy) == want) {
        *dy_out = dt_tensor_retain(g->dy);
        return DT_OK;
    }
    return dt_cast(g->dy, want, dy_out);
}
