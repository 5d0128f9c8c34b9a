/* ops/def_elem: the family's definition table, its shared checks and validator helpers, and
 * the unary ops (rule "...->..."): definitions, public wrappers and backward functions.
 * Attributes: pow_scalar f[0] = p; clamp f[0] = lo, f[1] = hi; add_scalar and mul_scalar
 * f[0] = c; every other slot zero. */
#include <stdio.h>
#include <string.h>

#include "ops/def_elem.h"
#include "runtime/error.h"

const dt_op_def *const dt__defs_elem[] = {
    &dt__def_exp, &dt__def_log, &dt__def_log1p, &dt__def_sqrt, &dt__def_rsqrt, &dt__def_tanh,
    &dt__def_sigmoid, &dt__def_silu, &dt__def_neg, &dt__def_abs, &dt__def_sign,
    &dt__def_square, &dt__def_reciprocal, &dt__def_pow_scalar, &dt__def_clamp,
    &dt__def_add_scalar, &dt__def_mul_scalar,
    &dt__def_add, &dt__def_sub, &dt__def_mul, &dt__def_div, &dt__def_pow, &dt__def_maximum,
    &dt__def_minimum, &dt__def_eq, &dt__def_ne, &dt__def_lt, &dt__def_le, &dt__def_gt,
    &dt__def_ge, &dt__def_where, &dt__def_masked_fill, &dt__def_sum_to,
    &dt__def_random_uniform, &dt__def_random_normal, &dt__def_random_bernoulli,
    &dt__def_arange, &dt__def_mse,
    NULL};

/* ---- shared checks ------------------------------------------------------------------- */

const char *dt__elem_shape_str(const dt_op_shape *s, char *buf, size_t len)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, len - k, "[");
    for (int d = 0; d < s->rank && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, d ? ",%lld" : "%lld", (long long)s->dim[d]);
    if (k < len)
        snprintf(buf + k, len - k, "] %s", dt_dtype_name(s->dtype));
    return buf;
}

int dt__elem_is_float(dt_dtype t)
{
    return t == DT_DTYPE_F32 || t == DT_DTYPE_F64;
}

dt_status dt__elem_broadcast(const char *op, const dt_op_sig *sig, dt_op_shape *out)
{
    int rank = 0;
    for (int k = 0; k < sig->nin; k++)
        if (sig->in[k].rank > rank)
            rank = sig->in[k].rank;
    out->rank = rank;
    for (int d = 0; d < rank; d++) {
        int64_t n = 1;
        for (int k = 0; k < sig->nin; k++) {
            int j = d - (rank - sig->in[k].rank);
            int64_t m = j >= 0 ? sig->in[k].dim[j] : 1;
            if (m == n || m == 1)
                continue;
            if (n != 1) {
                char b[3][96];
                for (int i = 0; i < sig->nin && i < 3; i++)
                    dt__elem_shape_str(&sig->in[i], b[i], sizeof b[i]);
                return dt__error(DT_ERR_SHAPE, "%s: shapes %s, %s%s%s do not broadcast (dim %d)",
                                 op, b[0], sig->nin > 1 ? b[1] : "",
                                 sig->nin > 2 ? ", " : "", sig->nin > 2 ? b[2] : "", d);
            }
            n = m;
        }
        out->dim[d] = n;
    }
    return DT_OK;
}

/* ---- the validator's helpers ----------------------------------------------------------- */

uint64_t dt__elem_rng(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void dt__elem_sample_shape(uint64_t *rng, int max_dim, dt_dtype t, dt_op_shape *s)
{
    memset(s, 0, sizeof *s);
    s->dtype = t;
    s->rank = (int)(dt__elem_rng(rng) % 4);
    for (int d = 0; d < s->rank; d++)
        s->dim[d] = 1 + (int64_t)(dt__elem_rng(rng) % (uint64_t)(max_dim > 0 ? max_dim : 1));
}

void dt__elem_sample_bcast(uint64_t *rng, const dt_op_shape *full, dt_op_shape *s)
{
    *s = *full;
    int drop = full->rank ? (int)(dt__elem_rng(rng) % (uint64_t)(full->rank + 1)) : 0;
    if (dt__elem_rng(rng) % 2)
        drop = 0;
    s->rank = full->rank - drop;
    for (int d = 0; d < s->rank; d++) {
        s->dim[d] = full->dim[d + drop];
        if (dt__elem_rng(rng) % 4 == 0)
            s->dim[d] = 1;
    }
}

void dt__elem_fill_real(uint64_t seed, dt_dtype t, void *host, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) {
        double u = (double)(dt__elem_rng(&seed) >> 11) / 9007199254740992.0;
        double v = lo + (hi - lo) * u;
        if (t == DT_DTYPE_F32)
            ((float *)host)[i] = (float)v;
        else
            ((double *)host)[i] = v;
    }
}

void dt__elem_fill_mask(uint64_t seed, dt_dtype t, void *host, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        int v = (int)(dt__elem_rng(&seed) % 2);
        switch (t) {
        case DT_DTYPE_F32: ((float *)host)[i] = (float)v; break;
        case DT_DTYPE_F64: ((double *)host)[i] = v; break;
        case DT_DTYPE_I32: ((int32_t *)host)[i] = v; break;
        case DT_DTYPE_I64: ((int64_t *)host)[i] = v; break;
        default: ((uint8_t *)host)[i] = (uint8_t)v; break;
        }
    }
}

/* ---- unary: infer, sample, fill -------------------------------------------------------- */

static dt_status unary_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const char *name = sig->user ? (const char *)sig->user : "unary op";
    if (sig->nin != 1 || !dt__elem_is_float(sig->in[0].dtype)) {
        char b[96];
        return dt__error(DT_ERR_SHAPE, "%s: x must be f32 or f64, got %s", name,
                         sig->nin >= 1 ? dt__elem_shape_str(&sig->in[0], b, sizeof b) : "none");
    }
    *out = sig->in[0];
    return DT_OK;
}

static dt_status unary_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    sig->nin = 1;
    dt__elem_sample_shape(&seed, max_dim, seed % 3 == 2 ? DT_DTYPE_F32 : DT_DTYPE_F64, &sig->in[0]);
    (void)attrs;
    return DT_OK;
}

static dt_status sample_pow_scalar(uint64_t seed, int max_dim, dt_op_sig *sig,
                                   dt_op_attrs *attrs)
{
    unary_sample(seed, max_dim, sig, attrs);
    attrs->f[0] = seed % 2 ? 3.0 : 2.5; /* 2.5 with positive inputs (fill_positive) */
    return DT_OK;
}

static dt_status sample_clamp(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    unary_sample(seed, max_dim, sig, attrs);
    attrs->f[0] = -0.5;
    attrs->f[1] = 0.5;
    return DT_OK;
}

static dt_status sample_scalar(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    unary_sample(seed, max_dim, sig, attrs);
    attrs->f[0] = 0.75;
    return DT_OK;
}

/* Inputs in [0.5, 2): the domain of log, sqrt, rsqrt, reciprocal, fractional powers. */
static dt_status fill_positive(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    dt__elem_fill_real(seed, sig->in[i].dtype, host, n, 0.5, 2.0);
    return DT_OK;
}

/* Inputs away from the kinks of abs and sign (|x| in [0.25, 1]). */
static dt_status fill_nonzero(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    dt__elem_fill_real(seed, sig->in[i].dtype, host, n, 0.25, 1.0);
    uint64_t s = seed ^ 0x5bd1e995u;
    for (int64_t k = 0; k < n; k++)
        if (dt__elem_rng(&s) % 2) {
            if (sig->in[i].dtype == DT_DTYPE_F32)
                ((float *)host)[k] = -((float *)host)[k];
            else
                ((double *)host)[k] = -((double *)host)[k];
        }
    return DT_OK;
}

/* ---- unary: backward ----------------------------------------------------------------- */

static dt_status run1(const dt_op_def *d, const dt_tensor *x, dt_tensor **out)
{
    return dt__op_run1(d, x, NULL, out);
}

static dt_status run1f(const dt_op_def *d, const dt_tensor *x, double f0, dt_tensor **out)
{
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.f[0] = f0;
    return dt__op_run1(d, x, &at, out);
}

static dt_status run2(const dt_op_def *d, const dt_tensor *a, const dt_tensor *b,
                      dt_tensor **out)
{
    return dt__op_run2(d, a, b, NULL, out);
}

/* dx = dy * t, t consumed. */
static dt_status times(const dt_tensor *dy, dt_status st, dt_tensor *t, dt_tensor **dx)
{
    if (st == DT_OK)
        st = run2(&dt__def_mul, dy, t, dx);
    dt_tensor_destroy(t);
    return st;
}

static dt_status exp_bw(const dt_op_grad *g)
{
    return run2(&dt__def_mul, g->dy, g->out, &g->dx[0]);
}

static dt_status log_bw(const dt_op_grad *g)
{
    return run2(&dt__def_div, g->dy, g->in[0], &g->dx[0]);
}

static dt_status log1p_bw(const dt_op_grad *g)
{
    dt_tensor *t = NULL;
    dt_status st = run1f(&dt__def_add_scalar, g->in[0], 1.0, &t);
    if (st == DT_OK)
        st = run2(&dt__def_div, g->dy, t, &g->dx[0]);
    dt_tensor_destroy(t);
    return st;
}

static dt_status sqrt_bw(const dt_op_grad *g) /* dy / (2 y) */
{
    dt_tensor *t = NULL;
    dt_status st = run2(&dt__def_div, g->dy, g->out, &t);
    if (st == DT_OK)
        st = run1f(&dt__def_mul_scalar, t, 0.5, &g->dx[0]);
    dt_tensor_destroy(t);
    return st;
}

static dt_status rsqrt_bw(const dt_op_grad *g) /* -0.5 dy y^3 */
{
    dt_tensor *t = NULL, *u = NULL;
    dt_status st = run1f(&dt__def_pow_scalar, g->out, 3.0, &t);
    st = times(g->dy, st, t, &u);
    if (st == DT_OK)
        st = run1f(&dt__def_mul_scalar, u, -0.5, &g->dx[0]);
    dt_tensor_destroy(u);
    return st;
}

/* 1 - t (t consumed). */
static dt_status one_minus(dt_status st, dt_tensor *t, dt_tensor **out)
{
    dt_tensor *u = NULL;
    if (st == DT_OK)
        st = run1f(&dt__def_mul_scalar, t, -1.0, &u);
    if (st == DT_OK)
        st = run1f(&dt__def_add_scalar, u, 1.0, out);
    dt_tensor_destroy(u);
    dt_tensor_destroy(t);
    return st;
}

static dt_status tanh_bw(const dt_op_grad *g) /* dy (1 - y^2) */
{
    dt_tensor *t = NULL, *u = NULL;
    dt_status st = run1(&dt__def_square, g->out, &t);
    st = one_minus(st, t, &u);
    return times(g->dy, st, u, &g->dx[0]);
}

static dt_status sigmoid_bw(const dt_op_grad *g) /* dy y (1 - y) */
{
    dt_tensor *u = NULL, *v = NULL;
    dt_status st = one_minus(DT_OK, dt_tensor_retain(g->out), &u);
    if (st == DT_OK)
        st = run2(&dt__def_mul, g->out, u, &v);
    dt_tensor_destroy(u);
    return times(g->dy, st, v, &g->dx[0]);
}

static dt_status silu_bw(const dt_op_grad *g) /* dy s (1 + x (1 - s)), s = sigmoid(x) */
{
    dt_tensor *s = NULL, *om = NULL, *t = NULL, *u = NULL, *v = NULL;
    dt_status st = run1(&dt__def_sigmoid, g->in[0], &s);
    if (st == DT_OK)
        st = one_minus(st, dt_tensor_retain(s), &om);
    if (st == DT_OK)
        st = run2(&dt__def_mul, g->in[0], om, &t);
    if (st == DT_OK)
        st = run1f(&dt__def_add_scalar, t, 1.0, &u);
    if (st == DT_OK)
        st = run2(&dt__def_mul, s, u, &v);
    dt_tensor_destroy(s);
    dt_tensor_destroy(om);
    dt_tensor_destroy(t);
    dt_tensor_destroy(u);
    return times(g->dy, st, v, &g->dx[0]);
}

static dt_status neg_bw(const dt_op_grad *g)
{
    return run1(&dt__def_neg, g->dy, &g->dx[0]);
}

static dt_status abs_bw(const dt_op_grad *g)
{
    dt_tensor *t = NULL;
    dt_status st = run1(&dt__def_sign, g->in[0], &t);
    return times(g->dy, st, t, &g->dx[0]);
}

static dt_status sign_bw(const dt_op_grad *g) /* zero */
{
    return run1f(&dt__def_mul_scalar, g->dy, 0.0, &g->dx[0]);
}

static dt_status square_bw(const dt_op_grad *g) /* 2 x dy */
{
    dt_tensor *t = NULL;
    dt_status st = run2(&dt__def_mul, g->dy, g->in[0], &t);
    if (st == DT_OK)
        st = run1f(&dt__def_mul_scalar, t, 2.0, &g->dx[0]);
    dt_tensor_destroy(t);
    return st;
}

static dt_status reciprocal_bw(const dt_op_grad *g) /* -dy y^2 */
{
    dt_tensor *t = NULL, *u = NULL;
    dt_status st = run1(&dt__def_square, g->out, &t);
    st = times(g->dy, st, t, &u);
    if (st == DT_OK)
        st = run1(&dt__def_neg, u, &g->dx[0]);
    dt_tensor_destroy(u);
    return st;
}

static dt_status pow_scalar_bw(const dt_op_grad *g) /* p x^(p-1) dy */
{
    double p = g->attrs->f[0];
    if (p == 0.0)
        return run1f(&dt__def_mul_scalar, g->dy, 0.0, &g->dx[0]);
    dt_tensor *t = NULL, *u = NULL;
    dt_status st = run1f(&dt__def_pow_scalar, g->in[0], p - 1.0, &t);
    st = times(g->dy, st, t, &u);
    if (st == DT_OK)
        st = run1f(&dt__def_mul_scalar, u, p, &g->dx[0]);
    dt_tensor_destroy(u);
    return st;
}

static dt_status clamp_bw(const dt_op_grad *g) /* dy where lo <= x <= hi (y == x), else 0 */
{
    dt_tensor *m = NULL;
    dt_status st = run2(&dt__def_ne, g->in[0], g->out, &m);
    if (st == DT_OK)
        st = dt__masked_fill(g->dy, m, 0.0, 0, &g->dx[0]);
    dt_tensor_destroy(m);
    return st;
}

static dt_status add_scalar_bw(const dt_op_grad *g)
{
    g->dx[0] = dt_tensor_retain(g->dy);
    return DT_OK;
}

static dt_status mul_scalar_bw(const dt_op_grad *g)
{
    return run1f(&dt__def_mul_scalar, g->dy, g->attrs->f[0], &g->dx[0]);
}

/* ---- unary: definitions and wrappers --------------------------------------------------- */

#define UN_KERNEL(N, OP)                                                                    \
    static dt_status k_##N(const dt_op_kernel_args *a)                                      \
    {                                                                                       \
        return dt__k_unary(a, OP);                                                          \
    }

#define UN_DEF(N, OP, BW, LIN, SAVE, SAMPLE, FILL, DOC)                                     \
    UN_KERNEL(N, OP)                                                                        \
    const dt_op_def dt__def_##N = {                                                         \
        .name = #N, .nin = 1, .rule = "...->...", .infer = unary_infer, .cpu = k_##N,       \
        .user = (void *)#N,                                                                 \
        .backward = BW, .linearity = LIN, .linear_in = LIN ? 1u : 0u,                       \
        .reduce = DT_REDUCE_SUM, .save_out = SAVE, .doc = DOC, .family = "unary",           \
        .sample = SAMPLE, .fill = FILL};

#define NL DT_OP_LINEAR_NONE
UN_DEF(exp, DT__UN_EXP, exp_bw, NL, 1, unary_sample, NULL, "y = e^x")
UN_DEF(log, DT__UN_LOG, log_bw, NL, 0, unary_sample, fill_positive, "y = ln x")
UN_DEF(log1p, DT__UN_LOG1P, log1p_bw, NL, 0, unary_sample, fill_positive, "y = ln(1 + x)")
UN_DEF(sqrt, DT__UN_SQRT, sqrt_bw, NL, 1, unary_sample, fill_positive, "y = sqrt(x)")
UN_DEF(rsqrt, DT__UN_RSQRT, rsqrt_bw, NL, 1, unary_sample, fill_positive, "y = 1 / sqrt(x)")
UN_DEF(tanh, DT__UN_TANH, tanh_bw, NL, 1, unary_sample, NULL, "y = tanh x")
UN_DEF(sigmoid, DT__UN_SIGMOID, sigmoid_bw, NL, 1, unary_sample, NULL, "y = 1 / (1 + e^-x)")
UN_DEF(silu, DT__UN_SILU, silu_bw, NL, 0, unary_sample, NULL, "y = x sigmoid(x)")
UN_DEF(neg, DT__UN_NEG, neg_bw, DT_OP_LINEAR_MULTI, 0, unary_sample, NULL, "y = -x")
UN_DEF(abs, DT__UN_ABS, abs_bw, NL, 0, unary_sample, fill_nonzero, "y = |x|")
UN_DEF(sign, DT__UN_SIGN, sign_bw, NL, 0, unary_sample, fill_nonzero, "y = sign(x) (0 at 0)")
UN_DEF(square, DT__UN_SQUARE, square_bw, NL, 0, unary_sample, NULL, "y = x^2")
UN_DEF(reciprocal, DT__UN_RECIPROCAL, reciprocal_bw, NL, 1, unary_sample, fill_positive,
       "y = 1 / x")
UN_DEF(pow_scalar, DT__UN_POW_SCALAR, pow_scalar_bw, NL, 0, sample_pow_scalar, fill_positive,
       "y = x^p (attrs f[0] = p)")
UN_DEF(clamp, DT__UN_CLAMP, clamp_bw, NL, 1, sample_clamp, NULL,
       "y = min(max(x, lo), hi) (attrs f[0] = lo, f[1] = hi)")
UN_DEF(add_scalar, DT__UN_ADD_SCALAR, add_scalar_bw, NL, 0, sample_scalar, NULL,
       "y = x + c (attrs f[0] = c)")
UN_DEF(mul_scalar, DT__UN_MUL_SCALAR, mul_scalar_bw, DT_OP_LINEAR_MULTI, 0, sample_scalar,
       NULL, "y = c x (attrs f[0] = c; internal: the family's backward functions)")

#define UN_WRAP(N)                                                                          \
    dt_status dt_##N(const dt_tensor *x, dt_tensor **out)                                   \
    {                                                                                       \
        return dt__op_run1(&dt__def_##N, x, NULL, out);                                     \
    }
UN_WRAP(exp)
UN_WRAP(log)
UN_WRAP(log1p)
UN_WRAP(sqrt)
UN_WRAP(rsqrt)
UN_WRAP(tanh)
UN_WRAP(sigmoid)
UN_WRAP(silu)
UN_WRAP(neg)
UN_WRAP(abs)
UN_WRAP(sign)
UN_WRAP(square)
UN_WRAP(reciprocal)

dt_status dt_pow_scalar(const dt_tensor *x, double p, dt_tensor **out)
{
    return run1f(&dt__def_pow_scalar, x, p, out);
}

dt_status dt_clamp(const dt_tensor *x, double lo, double hi, dt_tensor **out)
{
    if (!(lo <= hi))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "clamp: lo %g must not exceed hi %g", lo, hi);
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.f[0] = lo;
    at.f[1] = hi;
    return dt__op_run1(&dt__def_clamp, x, &at, out);
}

dt_status dt_add_scalar(const dt_tensor *x, double c, dt_tensor **out)
{
    return run1f(&dt__def_add_scalar, x, c, out);
}

dt_status dt__mul_scalar(const dt_tensor *x, double c, dt_tensor **out)
{
    return run1f(&dt__def_mul_scalar, x, c, out);
}
