/* ops/ private header of the elementwise and random family (ops/def_elem*.c, ops/k_*.c): the
 * internal helpers other families may call (dt__sum_to), the kernels' entry points and the
 * broadcast iteration plan they share. Not installed. */
#ifndef DTENSOR_DEF_ELEM_H
#define DTENSOR_DEF_ELEM_H

#include <stdint.h>

#include "ops/opdef_impl.h"

/* ---- helpers for backward functions (any family) ------------------------------------- */

/* g reduced by summation to `shape` (rank dims), a shape g was NumPy-broadcast from: the
 * leading dims g has beyond rank and the dims where shape is 1 and g is not are summed.
 * Equal shapes give a new reference to g. The output may be sum-partial where a summed dim
 * of g is sharded. DT_ERR_SHAPE when shape does not broadcast to g's. Collective. */
dt_status dt__sum_to(const dt_tensor *g, int rank, const int64_t *shape, dt_tensor **out);
/* x * c elementwise (the internal op "mul_scalar"; f32 or f64). Collective. */
dt_status dt__mul_scalar(const dt_tensor *x, double c, dt_tensor **out);
/* out = mask ? value : x where invert is 0, out = mask ? x : value where it is 1 (the op
 * "masked_fill" with attribute i[0] = invert). Collective. */
dt_status dt__masked_fill(const dt_tensor *x, const dt_tensor *mask, double value, int invert,
                          dt_tensor **out);

/* ---- kernels (CPU, local blocks) ------------------------------------------------------- */

typedef enum dt__un_op {
    DT__UN_EXP, DT__UN_LOG, DT__UN_LOG1P, DT__UN_SQRT, DT__UN_RSQRT, DT__UN_TANH,
    DT__UN_SIGMOID, DT__UN_SILU, DT__UN_NEG, DT__UN_ABS, DT__UN_SIGN, DT__UN_SQUARE,
    DT__UN_RECIPROCAL, DT__UN_POW_SCALAR, DT__UN_CLAMP, DT__UN_ADD_SCALAR, DT__UN_MUL_SCALAR,
    DT__UN_COUNT_
} dt__un_op;

typedef enum dt__bin_op {
    DT__BIN_ADD, DT__BIN_SUB, DT__BIN_MUL, DT__BIN_DIV, DT__BIN_POW, DT__BIN_MAXIMUM,
    DT__BIN_MINIMUM, DT__BIN_EQ, DT__BIN_NE, DT__BIN_LT, DT__BIN_LE, DT__BIN_GT, DT__BIN_GE,
    DT__BIN_COUNT_
} dt__bin_op;

typedef enum dt__rand_op {
    DT__RAND_UNIFORM, DT__RAND_NORMAL, DT__RAND_BERNOULLI, DT__RAND_ARANGE
} dt__rand_op;

/* ops/k_unary.c: y = f(x) on f32 / f64 (attrs f[0], f[1]: the scalar operands). */
dt_status dt__k_unary(const dt_op_kernel_args *a, dt__un_op op);
/* ops/k_binary.c: out = a op b with broadcasting (arithmetic on f32 / f64; comparisons on
 * f32, f64, i32, i64, u8 into u8). */
dt_status dt__k_binary(const dt_op_kernel_args *a, dt__bin_op op);
/* ops/k_select.c: where (cond, a, b), masked_fill (x, mask; attrs f[0] value, i[0] invert). */
dt_status dt__k_where(const dt_op_kernel_args *a);
dt_status dt__k_masked_fill(const dt_op_kernel_args *a);
/* ops/k_sum.c: sum_to (in 0 summed into the output's shape, f64 accumulation) and mse's
 * partial sum (sum of (p - t)^2 over the local block / global count). */
dt_status dt__k_sum_to(const dt_op_kernel_args *a);
dt_status dt__k_mse(const dt_op_kernel_args *a);
/* ops/k_random.c: Philox-4x32-10 draws keyed by the global row-major index (attrs: i[10]
 * seed, i[11] stream, f[0], f[1] the distribution's parameters). */
dt_status dt__k_random(const dt_op_kernel_args *a, dt__rand_op op);

/* ---- the broadcast iteration plan (ops/k_binary.c) -------------------------------------
 * The output's dims with size-1 dims dropped and neighbours merged where every input steps
 * through them alike; per input the element stride of each (0: broadcast). The last dim is
 * the inner loop: its strides are 0 or 1. rank >= 1 (a single element: n[0] = 1). */
typedef struct dt__ew_plan {
    int rank, nin;
    int64_t n[DT_MAX_RANK];
    int64_t st[DT_OP_MAX_IN][DT_MAX_RANK];
} dt__ew_plan;

/* The plan of `out` (shape dims) reading nin inputs of shapes in[k] (ranks <= out's, aligned
 * to the right, each dim equal to out's or 1). Returns the number of output elements. */
int64_t dt__ew_plan_make(int rank, const int64_t *shape, int nin, const dt_op_buf *in,
                         dt__ew_plan *p);
/* Walks the plan's rows: calls fn(row, offs, len, ctx) for each inner row, offs[k] the
 * element offset of input k at the row's start (the output's is row * len). */
typedef void (*dt__ew_row_fn)(int64_t row, const int64_t *offs, int64_t len, void *ctx);
void dt__ew_plan_rows(const dt__ew_plan *p, dt__ew_row_fn fn, void *ctx);

/* The dtypes' column in the kernels' tables: f32 0, f64 1, i32 2, i64 3, u8 4; -1 others. */
static inline int dt__elem_col(dt_dtype t)
{
    switch (t) {
    case DT_DTYPE_F32: return 0;
    case DT_DTYPE_F64: return 1;
    case DT_DTYPE_I32: return 2;
    case DT_DTYPE_I64: return 3;
    case DT_DTYPE_U8: return 4;
    default: return -1;
    }
}

/* ---- the definitions (ops/def_elem.c: unary and the table; def_elem_bin.c: binary,
 * comparisons, where, masked_fill, sum_to; def_elem_rand.c: random, arange, mse) -------- */
extern const dt_op_def dt__def_exp, dt__def_log, dt__def_log1p, dt__def_sqrt, dt__def_rsqrt,
    dt__def_tanh, dt__def_sigmoid, dt__def_silu, dt__def_neg, dt__def_abs, dt__def_sign,
    dt__def_square, dt__def_reciprocal, dt__def_pow_scalar, dt__def_clamp, dt__def_add_scalar,
    dt__def_mul_scalar;
extern const dt_op_def dt__def_add, dt__def_sub, dt__def_mul, dt__def_div, dt__def_pow,
    dt__def_maximum, dt__def_minimum, dt__def_eq, dt__def_ne, dt__def_lt, dt__def_le,
    dt__def_gt, dt__def_ge, dt__def_where, dt__def_masked_fill, dt__def_sum_to;
extern const dt_op_def dt__def_random_uniform, dt__def_random_normal,
    dt__def_random_bernoulli, dt__def_arange, dt__def_mse;

/* Shared by the definition files (ops/def_elem.c). */
/* "[2,3] f32" into buf. */
const char *dt__elem_shape_str(const dt_op_shape *s, char *buf, size_t len);
/* 1 for f32 and f64. */
int dt__elem_is_float(dt_dtype t);
/* The NumPy broadcast of sig's nin inputs' shapes into out->rank / out->dim (dtype left
 * alone); DT_ERR_SHAPE naming `op` and the shapes when they do not broadcast. */
dt_status dt__elem_broadcast(const char *op, const dt_op_sig *sig, dt_op_shape *out);
/* The validator's helpers (the samples draw f64, f32 for one seed in three): a generator, a
 * random shape (rank 0..3, dims 1..max_dim), a
 * shape broadcast-compatible with `full` (leading dims dropped, dims set to 1 at random). */
uint64_t dt__elem_rng(uint64_t *state);
void dt__elem_sample_shape(uint64_t *rng, int max_dim, dt_dtype t, dt_op_shape *s);
void dt__elem_sample_bcast(uint64_t *rng, const dt_op_shape *full, dt_op_shape *s);
/* Values for the validator: n elements of t uniform in [lo, hi) (f32 or f64), or 0 / 1. */
void dt__elem_fill_real(uint64_t seed, dt_dtype t, void *host, int64_t n, double lo, double hi);
void dt__elem_fill_mask(uint64_t seed, dt_dtype t, void *host, int64_t n);

#endif
