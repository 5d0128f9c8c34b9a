/* ops/def_elem_bin: the broadcasting binary ops (add ... minimum; rule "...,...->..."), the
 * comparisons (u8 out), where and masked_fill, and the internal sum_to that their backward
 * functions share: definitions, public wrappers, backward functions.
 * Attributes: masked_fill f[0] = value, i[0] = invert (internal: 1 fills where the mask is
 * zero); sum_to i[0] = the target's rank, i[1 + d] its dims; every other slot zero. */
#include <string.h>

#include "ops/def_elem.h"
#include "runtime/error.h"

/* ---- infer, sample, fill --------------------------------------------------------------- */

static const char *op_name(const dt_op_sig *sig, const char *fallback)
{
    return sig->user ? (const char *)sig->user : fallback;
}

/* Operands alike in dtype (`floats`: f32 or f64 only; else any of the comparisons'). */
static dt_status same_dtype(const char *name, const dt_op_sig *sig, int first, int last,
                            int floats)
{
    for (int k = first; k <= last; k++) {
        dt_dtype t = sig->in[k].dtype;
        int ok = floats ? dt__elem_is_float(t) : dt__elem_col(t) >= 0;
        if (!ok || t != sig->in[first].dtype) {
            char b0[96], b1[96];
            return dt__error(DT_ERR_SHAPE, "%s: operands %s and %s must share one dtype (%s)",
                             name, dt__elem_shape_str(&sig->in[first], b0, sizeof b0),
                             dt__elem_shape_str(&sig->in[k], b1, sizeof b1),
                             floats ? "f32 or f64" : "f32, f64, i32, i64 or u8");
        }
    }
    return DT_OK;
}

static dt_status binary_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const char *name = op_name(sig, "binary op");
    dt_status st = same_dtype(name, sig, 0, 1, 1);
    if (st == DT_OK)
        st = dt__elem_broadcast(name, sig, out);
    out->dtype = sig->in[0].dtype;
    return st;
}

static dt_status compare_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const char *name = op_name(sig, "comparison");
    dt_status st = same_dtype(name, sig, 0, 1, 0);
    if (st == DT_OK)
        st = dt__elem_broadcast(name, sig, out);
    out->dtype = DT_DTYPE_U8;
    return st;
}

static dt_status where_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    dt_status st = dt__elem_col(sig->in[0].dtype) < 0 && !(sig->in[0].dtype == DT_DTYPE_F16 ||
                                                           sig->in[0].dtype == DT_DTYPE_BF16)
                       ? dt__error(DT_ERR_SHAPE, "where: cond has no valid dtype")
                       : DT_OK;
    if (st == DT_OK) /* a and b of one dtype, integers too (indices, masks) */
        st = same_dtype("where", sig, 1, 2, 0);
    if (st == DT_OK)
        st = dt__elem_broadcast("where", sig, out);
    out->dtype = sig->in[1].dtype;
    return st;
}

static dt_status masked_fill_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    char b0[96], b1[96];
    if (dt__elem_col(sig->in[0].dtype) < 0 || dt_dtype_size(sig->in[1].dtype) == 0)
        return dt__error(DT_ERR_SHAPE, "masked_fill: x %s must be f32, f64, i32, i64 or u8 "
                         "(mask %s)",
                         dt__elem_shape_str(&sig->in[0], b0, sizeof b0),
                         dt__elem_shape_str(&sig->in[1], b1, sizeof b1));
    dt_status st = dt__elem_broadcast("masked_fill", sig, out);
    int same = st == DT_OK && out->rank == sig->in[0].rank;
    for (int d = 0; same && d < out->rank; d++)
        same = out->dim[d] == sig->in[0].dim[d];
    if (st == DT_OK && !same)
        st = dt__error(DT_ERR_SHAPE, "masked_fill: mask %s does not broadcast to x %s",
                       dt__elem_shape_str(&sig->in[1], b1, sizeof b1),
                       dt__elem_shape_str(&sig->in[0], b0, sizeof b0));
    *out = sig->in[0];
    return st;
}

static dt_status binary_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    dt_op_shape full;
    dt__elem_sample_shape(&seed, max_dim, seed % 3 == 2 ? DT_DTYPE_F32 : DT_DTYPE_F64, &full);
    sig->nin = 2;
    dt__elem_sample_bcast(&seed, &full, &sig->in[0]);
    dt__elem_sample_bcast(&seed, &full, &sig->in[1]);
    (void)attrs;
    return DT_OK;
}

static dt_status where_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    dt_op_shape full;
    dt__elem_sample_shape(&seed, max_dim, seed % 3 == 2 ? DT_DTYPE_F32 : DT_DTYPE_F64, &full);
    sig->nin = 3;
    dt__elem_sample_bcast(&seed, &full, &sig->in[0]);
    sig->in[0].dtype = DT_DTYPE_U8;
    dt__elem_sample_bcast(&seed, &full, &sig->in[1]);
    dt__elem_sample_bcast(&seed, &full, &sig->in[2]);
    (void)attrs;
    return DT_OK;
}

static dt_status masked_fill_sample(uint64_t seed, int max_dim, dt_op_sig *sig,
                                    dt_op_attrs *attrs)
{
    sig->nin = 2;
    dt__elem_sample_shape(&seed, max_dim, seed % 3 == 2 ? DT_DTYPE_F32 : DT_DTYPE_F64, &sig->in[0]);
    dt__elem_sample_bcast(&seed, &sig->in[0], &sig->in[1]);
    sig->in[1].dtype = DT_DTYPE_U8;
    attrs->f[0] = -0.25;
    return DT_OK;
}

/* div's divisor and pow's base: |x| in [0.5, 2) (pow: positive). */
static dt_status fill_div(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    if (i != 1)
        return DT_ERR_UNSUPPORTED; /* plain reals */
    dt__elem_fill_real(seed, sig->in[i].dtype, host, n, 0.5, 2.0);
    return DT_OK;
}

static dt_status fill_pow(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    if (i != 0)
        return DT_ERR_UNSUPPORTED; /* plain reals */
    dt__elem_fill_real(seed, sig->in[i].dtype, host, n, 0.5, 2.0);
    return DT_OK;
}

/* where's condition and masked_fill's mask: 0 / 1. */
static dt_status fill_cond(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    if (i != (sig->nin == 3 ? 0 : 1))
        return DT_ERR_UNSUPPORTED; /* plain reals */
    dt__elem_fill_mask(seed, sig->in[i].dtype, host, n);
    return DT_OK;
}

/* ---- backward -------------------------------------------------------------------------- */

/* dx[k] = sum_to(t, shape of input k); t consumed. */
static dt_status to_input(const dt_op_grad *g, int k, dt_status st, dt_tensor *t)
{
    if (st == DT_OK)
        st = dt__sum_to(t, dt_tensor_rank(g->in[k]), dt_tensor_shape(g->in[k]), &g->dx[k]);
    dt_tensor_destroy(t);
    return st;
}

static dt_status run2(const dt_op_def *d, const dt_tensor *a, const dt_tensor *b,
                      dt_tensor **out)
{
    return dt__op_run2(d, a, b, NULL, out);
}

static dt_status add_bw(const dt_op_grad *g)
{
    dt_status st = DT_OK;
    for (int k = 0; k < 2 && st == DT_OK; k++)
        if (g->needs[k])
            st = to_input(g, k, DT_OK, dt_tensor_retain(g->dy));
    return st;
}

static dt_status sub_bw(const dt_op_grad *g)
{
    dt_status st = DT_OK;
    if (g->needs[0])
        st = to_input(g, 0, DT_OK, dt_tensor_retain(g->dy));
    if (st == DT_OK && g->needs[1]) {
        dt_tensor *t = NULL;
        st = dt__op_run1(&dt__def_neg, g->dy, NULL, &t);
        st = to_input(g, 1, st, t);
    }
    return st;
}

static dt_status mul_bw(const dt_op_grad *g)
{
    dt_status st = DT_OK;
    for (int k = 0; k < 2 && st == DT_OK; k++)
        if (g->needs[k]) {
            dt_tensor *t = NULL;
            st = run2(&dt__def_mul, g->dy, g->in[1 - k], &t);
            st = to_input(g, k, st, t);
        }
    return st;
}

static dt_status div_bw(const dt_op_grad *g) /* da = dy / b, db = -(dy / b) y */
{
    dt_tensor *q = NULL;
    dt_status st = run2(&dt__def_div, g->dy, g->in[1], &q);
    if (st == DT_OK && g->needs[0])
        st = to_input(g, 0, DT_OK, dt_tensor_retain(q));
    if (st == DT_OK && g->needs[1]) {
        dt_tensor *t = NULL, *u = NULL;
        st = run2(&dt__def_mul, q, g->out, &t);
        if (st == DT_OK)
            st = dt__op_run1(&dt__def_neg, t, NULL, &u);
        dt_tensor_destroy(t);
        st = to_input(g, 1, st, u);
    }
    dt_tensor_destroy(q);
    return st;
}

static dt_status pow_bw(const dt_op_grad *g) /* da = dy b a^(b-1), db = dy y ln a */
{
    dt_status st = DT_OK;
    if (g->needs[0]) {
        dt_tensor *bm1 = NULL, *t = NULL, *u = NULL, *v = NULL;
        dt_op_attrs at = DT_OP_ATTRS_INIT;
        at.f[0] = -1.0;
        st = dt__op_run1(&dt__def_add_scalar, g->in[1], &at, &bm1);
        if (st == DT_OK)
            st = run2(&dt__def_pow, g->in[0], bm1, &t);
        if (st == DT_OK)
            st = run2(&dt__def_mul, t, g->in[1], &u);
        if (st == DT_OK)
            st = run2(&dt__def_mul, g->dy, u, &v);
        dt_tensor_destroy(bm1);
        dt_tensor_destroy(t);
        dt_tensor_destroy(u);
        st = to_input(g, 0, st, v);
    }
    if (st == DT_OK && g->needs[1]) {
        dt_tensor *la = NULL, *t = NULL, *v = NULL;
        st = dt__op_run1(&dt__def_log, g->in[0], NULL, &la);
        if (st == DT_OK)
            st = run2(&dt__def_mul, g->out, la, &t);
        if (st == DT_OK)
            st = run2(&dt__def_mul, g->dy, t, &v);
        dt_tensor_destroy(la);
        dt_tensor_destroy(t);
        st = to_input(g, 1, st, v);
    }
    return st;
}

/* maximum (sign 1) and minimum (-1): the winner's share w = (sign(s (a - b)) + 1) / 2 is 1,
 * 1/2 on ties, 0; da = dy w, db = dy (1 - w). */
static dt_status extreme_bw(const dt_op_grad *g, double s)
{
    dt_tensor *d = NULL, *sg = NULL, *t = NULL, *w[2] = {NULL, NULL};
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    dt_status st = run2(&dt__def_sub, g->in[0], g->in[1], &d);
    if (st == DT_OK)
        st = dt__op_run1(&dt__def_sign, d, NULL, &sg);
    at.f[0] = 0.5 * s;
    if (st == DT_OK)
        st = dt__op_run1(&dt__def_mul_scalar, sg, &at, &t);
    at.f[0] = 0.5;
    if (st == DT_OK)
        st = dt__op_run1(&dt__def_add_scalar, t, &at, &w[0]); /* (1 + s sign) / 2 */
    dt_tensor_destroy(t);
    t = NULL;
    at.f[0] = -0.5 * s;
    if (st == DT_OK)
        st = dt__op_run1(&dt__def_mul_scalar, sg, &at, &t);
    at.f[0] = 0.5;
    if (st == DT_OK)
        st = dt__op_run1(&dt__def_add_scalar, t, &at, &w[1]); /* (1 - s sign) / 2 */
    for (int k = 0; k < 2 && st == DT_OK; k++)
        if (g->needs[k]) {
            dt_tensor *v = NULL;
            st = run2(&dt__def_mul, g->dy, w[k], &v);
            st = to_input(g, k, st, v);
        }
    dt_tensor_destroy(d);
    dt_tensor_destroy(sg);
    dt_tensor_destroy(t);
    dt_tensor_destroy(w[0]);
    dt_tensor_destroy(w[1]);
    return st;
}

static dt_status maximum_bw(const dt_op_grad *g)
{
    return extreme_bw(g, 1.0);
}

static dt_status minimum_bw(const dt_op_grad *g)
{
    return extreme_bw(g, -1.0);
}

static dt_status where_bw(const dt_op_grad *g) /* da = cond ? dy : 0, db = cond ? 0 : dy */
{
    dt_status st = DT_OK;
    for (int k = 1; k <= 2 && st == DT_OK; k++)
        if (g->needs[k]) {
            dt_tensor *t = NULL;
            st = dt__masked_fill(g->dy, g->in[0], 0.0, k == 1, &t);
            st = to_input(g, k, st, t);
        }
    return st;
}

static dt_status masked_fill_bw(const dt_op_grad *g)
{
    return dt__masked_fill(g->dy, g->in[1], 0.0, (int)g->attrs->i[0], &g->dx[0]);
}

/* ---- definitions and wrappers ---------------------------------------------------------- */

#define BIN_DEF(N, OP, INFER, BW, LIN, LIN_IN, SAVE, SAMPLE, FILL, FAM, DOC)                \
    static dt_status k_##N(const dt_op_kernel_args *a)                                      \
    {                                                                                       \
        return dt__k_binary(a, OP);                                                         \
    }                                                                                       \
    const dt_op_def dt__def_##N = {                                                         \
        .name = #N, .nin = 2, .rule = "...,...->...", .infer = INFER, .cpu = k_##N,         \
        .user = (void *)#N,                                                                 \
        .backward = BW, .linearity = LIN, .linear_in = LIN_IN, .reduce = DT_REDUCE_SUM,     \
        .save_out = SAVE, .doc = DOC, .family = FAM, .sample = SAMPLE, .fill = FILL};

#define NL DT_OP_LINEAR_NONE
#define BS binary_sample
BIN_DEF(add, DT__BIN_ADD, binary_infer, add_bw, DT_OP_LINEAR_ADDITIVE, 3u, 0, BS, NULL,
        "binary", "a + b (broadcasting)")
BIN_DEF(sub, DT__BIN_SUB, binary_infer, sub_bw, DT_OP_LINEAR_ADDITIVE, 3u, 0, BS, NULL,
        "binary", "a - b (broadcasting)")
BIN_DEF(mul, DT__BIN_MUL, binary_infer, mul_bw, DT_OP_LINEAR_MULTI, 3u, 0, BS, NULL,
        "binary", "a * b (broadcasting)")
BIN_DEF(div, DT__BIN_DIV, binary_infer, div_bw, DT_OP_LINEAR_MULTI, 1u, 1, BS, fill_div,
        "binary", "a / b (broadcasting)")
BIN_DEF(pow, DT__BIN_POW, binary_infer, pow_bw, NL, 0u, 1, BS, fill_pow, "binary",
        "a^b (broadcasting; b's gradient needs a > 0)")
BIN_DEF(maximum, DT__BIN_MAXIMUM, binary_infer, maximum_bw, NL, 0u, 0, BS, NULL, "binary",
        "max(a, b) (NaN propagates; ties split the gradient)")
BIN_DEF(minimum, DT__BIN_MINIMUM, binary_infer, minimum_bw, NL, 0u, 0, BS, NULL, "binary",
        "min(a, b) (NaN propagates; ties split the gradient)")
BIN_DEF(eq, DT__BIN_EQ, compare_infer, NULL, NL, 0u, 0, BS, NULL, "comparison", "a == b (u8)")
BIN_DEF(ne, DT__BIN_NE, compare_infer, NULL, NL, 0u, 0, BS, NULL, "comparison", "a != b (u8)")
BIN_DEF(lt, DT__BIN_LT, compare_infer, NULL, NL, 0u, 0, BS, NULL, "comparison", "a < b (u8)")
BIN_DEF(le, DT__BIN_LE, compare_infer, NULL, NL, 0u, 0, BS, NULL, "comparison", "a <= b (u8)")
BIN_DEF(gt, DT__BIN_GT, compare_infer, NULL, NL, 0u, 0, BS, NULL, "comparison", "a > b (u8)")
BIN_DEF(ge, DT__BIN_GE, compare_infer, NULL, NL, 0u, 0, BS, NULL, "comparison", "a >= b (u8)")

const dt_op_def dt__def_where = {
    .name = "where", .nin = 3, .rule = "...,...,...->...", .infer = where_infer,
    .cpu = dt__k_where, .backward = where_bw, .linearity = DT_OP_LINEAR_ADDITIVE,
    .linear_in = 6u, .reduce = DT_REDUCE_SUM, .doc = "cond ? a : b (broadcasting; cond "
    "nonzero is true)", .family = "binary", .sample = where_sample, .fill = fill_cond};

const dt_op_def dt__def_masked_fill = {
    .name = "masked_fill", .nin = 2, .rule = "...,...->...", .infer = masked_fill_infer,
    .cpu = dt__k_masked_fill, .backward = masked_fill_bw, .reduce = DT_REDUCE_SUM,
    .doc = "mask ? value : x (mask broadcast to x; attrs f[0] = value)", .family = "binary",
    .sample = masked_fill_sample, .fill = fill_cond};

#define BIN_WRAP(N)                                                                         \
    dt_status dt_##N(const dt_tensor *a, const dt_tensor *b, dt_tensor **out)              \
    {                                                                                       \
        return dt__op_run2(&dt__def_##N, a, b, NULL, out);                                  \
    }
BIN_WRAP(div)
BIN_WRAP(pow)
BIN_WRAP(maximum)
BIN_WRAP(minimum)
BIN_WRAP(eq)
BIN_WRAP(ne)
BIN_WRAP(lt)
BIN_WRAP(le)
BIN_WRAP(gt)
BIN_WRAP(ge)

dt_status dt_where(const dt_tensor *cond, const dt_tensor *a, const dt_tensor *b,
                   dt_tensor **out)
{
    const dt_tensor *in[3] = {cond, a, b};
    return dt__op_run(&dt__def_where, in, 3, NULL, NULL, out);
}

dt_status dt__masked_fill(const dt_tensor *x, const dt_tensor *mask, double value, int invert,
                          dt_tensor **out)
{
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.f[0] = value;
    at.i[0] = invert != 0;
    return dt__op_run2(&dt__def_masked_fill, x, mask, &at, out);
}

dt_status dt_masked_fill(const dt_tensor *x, const dt_tensor *mask, double value,
                         dt_tensor **out)
{
    return dt__masked_fill(x, mask, value, 0, out);
}

/* ---- sum_to ---------------------------------------------------------------------------- */

/* g's dims aligned to the target's from the right: kept where the sizes match (the same
 * factor), summed where the target has no dim or a 1 against a larger one (g's factor is
 * contracting: sharded, the output is sum-partial; the target's 1 is a new factor). */
static dt_status sum_to_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    const dt_op_shape *g = &sig->in[0];
    int r = (int)sig->attrs->i[0], lead = g->rank - r;
    size_t k = 0;
    if (len < (size_t)(2 * DT_MAX_RANK + 4) || lead < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "sum_to: no room for the rule");
    for (int d = 0; d < g->rank; d++)
        buf[k++] = dt__op_letter(d);
    buf[k++] = '-';
    buf[k++] = '>';
    for (int d = 0; d < r; d++)
        buf[k++] = sig->attrs->i[1 + d] == g->dim[lead + d] ? dt__op_letter(lead + d)
                                                          : dt__op_letter(DT_MAX_RANK + d);
    buf[k] = '\0';
    return DT_OK;
}

static dt_status sum_to_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *g = &sig->in[0];
    int r = (int)sig->attrs->i[0];
    char b[96];
    if (!dt__elem_is_float(g->dtype))
        return dt__error(DT_ERR_SHAPE, "sum_to: g %s must be f32 or f64",
                         dt__elem_shape_str(g, b, sizeof b));
    if (r < 0 || r > g->rank)
        return dt__error(DT_ERR_SHAPE, "sum_to: target rank %d for g %s", r,
                         dt__elem_shape_str(g, b, sizeof b));
    out->dtype = g->dtype;
    out->rank = r;
    for (int d = 0; d < r; d++) {
        int64_t n = sig->attrs->i[1 + d], m = g->dim[g->rank - r + d];
        if (n != m && n != 1)
            return dt__error(DT_ERR_SHAPE, "sum_to: target dim %d is %lld, g %s has %lld there",
                             d, (long long)n, dt__elem_shape_str(g, b, sizeof b), (long long)m);
        out->dim[d] = n;
    }
    return DT_OK;
}

/* d sum_to(g) / dg: dy broadcast back to g's shape (zeros in g's layout plus dy). */
static dt_status sum_to_bw(const dt_op_grad *g)
{
    dt_tensor *z = NULL;
    dt_status st = dt_tensor_zeros(dt_tensor_layout(g->in[0]), dt_tensor_dtype(g->in[0]),
                                   dt_tensor_shape(g->in[0]), &z);
    if (st == DT_OK)
        st = run2(&dt__def_add, z, g->dy, &g->dx[0]);
    dt_tensor_destroy(z);
    return st;
}

static dt_status sum_to_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    dt_op_shape t;
    sig->nin = 1;
    dt__elem_sample_shape(&seed, max_dim, seed % 3 == 2 ? DT_DTYPE_F32 : DT_DTYPE_F64, &sig->in[0]);
    dt__elem_sample_bcast(&seed, &sig->in[0], &t);
    attrs->i[0] = t.rank;
    for (int d = 0; d < t.rank; d++)
        attrs->i[1 + d] = t.dim[d];
    return DT_OK;
}

const dt_op_def dt__def_sum_to = {
    .name = "sum_to", .nin = 1, .rule_fn = sum_to_rule, .infer = sum_to_infer,
    .cpu = dt__k_sum_to, .backward = sum_to_bw, .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 1u, .reduce = DT_REDUCE_SUM,
    .doc = "g summed to a shape it was broadcast from (attrs i[0] = rank, i[1..] = dims; "
           "internal: the binary ops' backward)",
    .family = "reduction", .sample = sum_to_sample};

dt_status dt__sum_to(const dt_tensor *g, int rank, const int64_t *shape, dt_tensor **out)
{
    if (!g || !out || (rank > 0 && !shape) || rank < 0 || rank > DT_MAX_RANK)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "sum_to: NULL argument or rank %d", rank);
    int gr = dt_tensor_rank(g);
    const int64_t *gs = dt_tensor_shape(g);
    int same = gr == rank;
    for (int d = 0; same && d < rank; d++)
        same = gs[d] == shape[d];
    if (same) {
        *out = dt_tensor_retain(g);
        return DT_OK;
    }
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = rank;
    for (int d = 0; d < rank; d++)
        at.i[1 + d] = shape[d];
    return dt__op_run1(&dt__def_sum_to, g, &at, out);
}
