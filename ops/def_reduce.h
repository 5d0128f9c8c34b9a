/* ops/ private header of the reduce family (reductions, normalisers, sort, einsum, losses):
 * its definitions (one per op, listed by ops/def_reduce.c's table), their CPU kernels
 * (ops/k_*.c) and the attribute slots each op reads. Not installed. */
#ifndef DTENSOR_DEF_REDUCE_H
#define DTENSOR_DEF_REDUCE_H

#include <stdint.h>

#include "ops/opdef_impl.h"

/* ---- attribute slots ----------------------------------------------------------------------
 * Reductions (sum, mean, max, min, logsumexp, var, argmax, argmin) and reduce_grad:
 *   i[0] bitmask of the reduced axes (bit d: axis d, 0..rank-1; 0: every axis; argmax and
 *   argmin: one bit),
 *   i[1] keepdim, i[2] correction (var), i[3] the forward op (RK_*; reduce_grad only).
 * log_softmax, log_softmax_grad: i[0] axis. cumsum: i[0] axis, i[1] reverse (1: suffix sums,
 *   the gradient). topk_indices: i[0] axis, i[1] k, i[2] largest (sort: k = the axis' size).
 * topk_values, topk_values_grad: i[0] axis.
 * einsum: s the equation; i[c - 'a'] the size of letter c where it is only in the output (the
 *   backward's broadcasts; 0 otherwise, and the public dt_einsum leaves them 0); f[0] a scale
 *   of the result (0 means 1). matmul_broadcast: the same slots, the equation derived from the
 *   ranks (i[] and f[] zero).
 * label_count (i64 out), cross_entropy (its count input i64), cross_entropy_grad:
 *   i[0] ignore_index. */

/* The forward op of a reduction (attrs i[3] of reduce_grad). */
enum { RK_SUM = 0, RK_MEAN, RK_MAX, RK_MIN, RK_LOGSUMEXP, RK_VAR, RK_ARGMAX, RK_ARGMIN };

/* The definitions. */
extern const dt_op_def dt__def_sum, dt__def_mean, dt__def_max, dt__def_min, dt__def_logsumexp,
    dt__def_var, dt__def_argmax, dt__def_argmin, dt__def_reduce_grad;
extern const dt_op_def dt__def_log_softmax, dt__def_log_softmax_grad, dt__def_cumsum,
    dt__def_topk_indices, dt__def_topk_values, dt__def_topk_values_grad;
extern const dt_op_def dt__def_einsum, dt__def_matmul_broadcast;
extern const dt_op_def dt__def_label_count, dt__def_cross_entropy, dt__def_cross_entropy_grad;

/* Kernels (ops/k_reduce.c): the reduction of attrs i[0]'s axes of in[0] with op `kind`
 * (RK_*), and reduce_grad (in: x, the forward output, dy; out: dx). */
dt_status dt__k_reduce(const dt_op_kernel_args *a, int kind);
dt_status dt__k_reduce_grad(const dt_op_kernel_args *a);

/* ops/k_scan.c: log_softmax and its gradient (in: y, dy), cumsum. */
dt_status dt__k_log_softmax(const dt_op_kernel_args *a);
dt_status dt__k_log_softmax_grad(const dt_op_kernel_args *a);
dt_status dt__k_cumsum(const dt_op_kernel_args *a);

/* ops/k_sort.c: the indices of the k largest / smallest along an axis (sorted, stable), the
 * values at indices along an axis (in: x, indices) and its gradient (in: x, indices, dy:
 * dy scattered-added into zeros of x's shape). */
dt_status dt__k_topk_indices(const dt_op_kernel_args *a);
dt_status dt__k_take_along(const dt_op_kernel_args *a);
dt_status dt__k_take_along_grad(const dt_op_kernel_args *a);

/* ops/k_einsum.c. An equation with its '...' expanded to explicit letters for given operand
 * ranks: letters[i][d] for dim d of operand i (the inputs, then the output at index nin). */
typedef struct dt__einsum_eq {
    int nin;
    int rank[3];
    char letters[3][DT_MAX_RANK];
} dt__einsum_eq;
/* Parses `eq` for operands of ranks in_rank[0..nin-1] (nin 1 or 2): letters a-z, each at most
 * once per operand, one optional '...' per operand, explicit '->'. DT_ERR_INVALID_ARGUMENT
 * naming the equation and the fault. */
dt_status dt__einsum_parse(const char *eq, int nin, const int *in_rank, dt__einsum_eq *out);
/* The equation torch.matmul means for operands of ranks ra, rb >= 1 (buf >= 32 bytes). */
void dt__matmul_broadcast_eq(int ra, int rb, char *buf);
/* The einsum kernel: attrs.s the equation (empty: the matmul_broadcast equation). */
dt_status dt__k_einsum(const dt_op_kernel_args *a);

/* ops/k_xent.c: label_count (in: labels), cross_entropy (in: logits, labels, count) and its
 * gradient (in: logits, labels, count, dy). */
dt_status dt__k_label_count(const dt_op_kernel_args *a);
dt_status dt__k_cross_entropy(const dt_op_kernel_args *a);
dt_status dt__k_cross_entropy_grad(const dt_op_kernel_args *a);

/* The backward functions' dy in dtype `want` (the forward output's): the tape seeds a loss
 * with an f32 scalar whatever its dtype. *owned (to destroy) is the cast, NULL when dy is used
 * as it is. */
dt_status dt__rd_dy(const dt_op_grad *g, dt_dtype want, const dt_tensor **dy, dt_tensor **owned);
/* The backward of an op whose gradient is the op itself with its direction flag (attrs.i[1])
 * flipped (cumsum's reverse scan, rope_half's inverse rotation): dx[0] = def(dy, flipped). */
dt_status dt__rd_grad_flipped(const dt_op_grad *g, const dt_op_def *def);

/* Shared by the kernels: a float element as double, and back. */
static inline double dt__rd_get(const void *p, dt_dtype t, int64_t i)
{
    return t == DT_DTYPE_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}
static inline void dt__rd_set(void *p, dt_dtype t, int64_t i, double v)
{
    if (t == DT_DTYPE_F64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}
/* An integer element (i32, i64 or u8) as int64. */
static inline int64_t dt__rd_geti(const void *p, dt_dtype t, int64_t i)
{
    if (t == DT_DTYPE_I64)
        return ((const int64_t *)p)[i];
    if (t == DT_DTYPE_I32)
        return ((const int32_t *)p)[i];
    return ((const uint8_t *)p)[i];
}

/* The validators' sample functions: a splitmix64 step, and n in lo..hi. */
static inline uint64_t dt__rd_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline int64_t dt__rd_randint(uint64_t *s, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(dt__rd_rand(s) % (uint64_t)(hi - lo + 1));
}
/* A floating dtype this family computes in. */
static inline int dt__rd_float(dt_dtype t)
{
    return t == DT_DTYPE_F32 || t == DT_DTYPE_F64;
}
/* Makes a rule whose last input is rank 0 ("ab,->", "->") parse with that input: the core's
 * rule parser (ops/opdef_rule.c) reads an empty operand just before "->" as no operand, so it
 * becomes "..." (an ellipsis of no dims: the same rank-0 operand). In place; len is buf's
 * size. */
void dt__rd_rule_fixup(char *buf, size_t len);
/* "[2, 3, 4]" into buf (the errors' shapes). */
const char *dt__rd_shape_str(const dt_op_shape *s, char *buf, size_t len);

/* The [outer, len, inner] view of a row-major block along `axis`. */
static inline void dt__rd_split(const dt_op_buf *b, int axis, int64_t *outer, int64_t *len,
                                int64_t *inner)
{
    *outer = 1;
    *inner = 1;
    for (int d = 0; d < axis; d++)
        *outer *= b->shape[d];
    for (int d = axis + 1; d < b->rank; d++)
        *inner *= b->shape[d];
    *len = b->shape[axis];
}

#endif
