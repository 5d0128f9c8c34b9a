/* ops/ private header of the shape, index and host-transfer family: its definitions, the CPU
 * kernels they point at (k_shape.c, k_index.c) and the small helpers those files share
 * (shape_util.c). Not installed. */
#ifndef DTENSOR_SHAPE_IMPL_H
#define DTENSOR_SHAPE_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ops/opdef_impl.h"
#include "runtime/util.h" /* dt__shape_str */

/* ---- the definitions (def_shape.c, def_index.c); attribute slots:
 *  reshape         i[0] rank, i[1..rank] the shape (at most one -1)
 *  permute         i[0..rank-1] the permutation (input dim of output dim d)
 *  slice           i[0] axis, i[1] start, i[2] stop, i[3] step (Python's clamping)
 *  slice_backward  as slice, plus i[4] the sliced input's size along the axis
 *  concat          i[0] axis
 *  expand          i[0] rank, i[1..rank] the shape (-1 keeps a dim)
 *  expand_backward i[0] rank, i[1..rank] the (expanded) input's shape to sum down to
 *  squeeze         i[0] axis; unsqueeze: i[0] axis (0..rank)
 *  gather, scatter_add, index_select, index_add: i[0] axis
 *  one_hot         i[0] classes, i[1] the output dtype (dt_dtype) */
extern const dt_op_def dt__def_reshape, dt__def_permute, dt__def_slice, dt__def_slice_backward,
    dt__def_concat, dt__def_expand, dt__def_expand_backward, dt__def_squeeze, dt__def_unsqueeze;
extern const dt_op_def dt__def_gather, dt__def_scatter_add, dt__def_index_select, dt__def_index_add,
    dt__def_one_hot;

/* ---- CPU kernels (k_shape.c, k_index.c): on local blocks, any dtype for the data movers,
 * f32 / f64 / i32 / i64 for the ones that add. */
dt_status dt__k_reshape(const dt_op_kernel_args *a);
dt_status dt__k_permute(const dt_op_kernel_args *a);
dt_status dt__k_slice(const dt_op_kernel_args *a);
dt_status dt__k_slice_backward(const dt_op_kernel_args *a);
dt_status dt__k_concat(const dt_op_kernel_args *a);
dt_status dt__k_expand(const dt_op_kernel_args *a);
dt_status dt__k_expand_backward(const dt_op_kernel_args *a); /* f32, f64 */
dt_status dt__k_copy(const dt_op_kernel_args *a);            /* squeeze, unsqueeze: same bytes */
dt_status dt__k_gather(const dt_op_kernel_args *a);
dt_status dt__k_scatter_add(const dt_op_kernel_args *a);
dt_status dt__k_index_select(const dt_op_kernel_args *a);
dt_status dt__k_index_add(const dt_op_kernel_args *a);
dt_status dt__k_one_hot(const dt_op_kernel_args *a);

/* ---- slice arithmetic (Python's): the first index and the count of elements of
 * start:stop:step (step >= 1) over a dim of size n. */
void dt__slice_range(int64_t n, int64_t start, int64_t stop, int64_t step, int64_t *first_out,
                     int64_t *count_out);

/* ---- helpers (shape_util.c) */
/* 1 if dtype is an index dtype (i32, i64). */
int dt__is_index_dtype(dt_dtype dtype);
/* Index element i of a buffer of an index dtype. */
static inline int64_t dt__index_at(const void *p, dt_dtype dtype, int64_t i)
{
    return dtype == DT_DTYPE_I64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}
/* 1 if the adding kernels take dtype (f32, f64, i32, i64). */
int dt__is_addable_dtype(dt_dtype dtype);
/* *dst += *src for one element of an addable dtype. */
static inline void dt__add_elem(dt_dtype dtype, void *dst, const void *src)
{
    switch (dtype) {
    case DT_DTYPE_F32:
        *(float *)dst += *(const float *)src;
        break;
    case DT_DTYPE_F64:
        *(double *)dst += *(const double *)src;
        break;
    case DT_DTYPE_I32:
        *(int32_t *)dst += *(const int32_t *)src;
        break;
    case DT_DTYPE_I64:
        *(int64_t *)dst += *(const int64_t *)src;
        break;
    default:
        break;
    }
}
/* Row-major strides of a local shape (elements). */
void dt__strides(int rank, const int64_t *shape, int64_t *stride_out);
#define DT__RULE_DIM 24 /* letters of one compound dim, NUL included */
/* A rule written piece by piece into a rule_fn's buffer. */
typedef struct dt__rule_text {
    char *buf;
    size_t len, pos;
} dt__rule_text;
void dt__rule_putc(dt__rule_text *r, char c);
/* Appends one operand: dims[0..rank) each a string of factor letters (several: a compound
 * dim, written "(ab)"), then `sep` (',', or 0 for none). */
void dt__rule_operand(dt__rule_text *r, int rank, char (*dims)[DT__RULE_DIM], char sep);
/* DT_OK when the rule fitted, else DT_ERR_INVALID_ARGUMENT naming `op`. */
dt_status dt__rule_done(const dt__rule_text *r, const char *op);
/* The operand of plain letters: lowercase 'a' + d for each dim, except dim `upper` (>= 0)
 * which gets `upper_letter`. */
void dt__rule_plain(dt__rule_text *r, int rank, int upper, char upper_letter, char sep);
/* The backward functions' dy in input 0's dtype (the dtype of the op's output and of its
 * differentiable inputs; the tape seeds a scalar loss in f32): dy retained, or cast. Owned. */
dt_status dt__grad_dy(const dt_op_grad *g, dt_tensor **dy_out);
/* A splitmix64 step (the validator's samples). */
uint64_t dt__shape_rng(uint64_t *state);
/* A zero tensor of x's shape and dtype on x's mesh, laid out as x is but with `axis`
 * unsharded (axis < 0: none) and nothing partial. */
dt_status dt__zeros_for(const dt_tensor *x, int axis, dt_tensor **out);

#endif
