/* ops/def_reduce: the reduce family's definition table, and the definitions and public
 * functions of the reductions over a set of axes (sum, mean, max, min, logsumexp, var,
 * argmax, argmin) with their one gradient op, reduce_grad. Attribute slots: ops/def_reduce.h. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "ops/def_reduce.h"
#include "runtime/error.h"

const dt_op_def *const dt__defs_reduce[] = {&dt__def_sum,
                                            &dt__def_mean,
                                            &dt__def_max,
                                            &dt__def_min,
                                            &dt__def_logsumexp,
                                            &dt__def_var,
                                            &dt__def_argmax,
                                            &dt__def_argmin,
                                            &dt__def_reduce_grad,
                                            &dt__def_log_softmax,
                                            &dt__def_log_softmax_grad,
                                            &dt__def_cumsum,
                                            &dt__def_topk_indices,
                                            &dt__def_topk_values,
                                            &dt__def_topk_values_grad,
                                            &dt__def_einsum,
                                            &dt__def_matmul_broadcast,
                                            &dt__def_label_count,
                                            &dt__def_cross_entropy,
                                            &dt__def_cross_entropy_grad,
                                            NULL};

const char *dt__rd_shape_str(const dt_op_shape *s, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < s->rank && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)s->dim[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
    return buf;
}

dt_status dt__rd_dy(const dt_op_grad *g, dt_dtype want, const dt_tensor **dy, dt_tensor **owned)
{
    *owned = NULL;
    *dy = g->dy;
    if (dt_tensor_dtype(g->dy) == want)
        return DT_OK;
    dt_status st = dt_cast(g->dy, want, owned);
    if (st == DT_OK)
        *dy = *owned;
    return st;
}

dt_status dt__rd_grad_flipped(const dt_op_grad *g, const dt_op_def *def)
{
    if (!g->needs[0])
        return DT_OK;
    dt_op_attrs at = *g->attrs;
    at.i[1] = !at.i[1];
    const dt_tensor *dy;
    dt_tensor *owned;
    dt_status st = dt__rd_dy(g, dt_tensor_dtype(g->in[0]), &dy, &owned);
    if (st == DT_OK)
        st = dt__op_run1(def, dy, &at, &g->dx[0]);
    dt_tensor_destroy(owned);
    return st;
}

void dt__rd_rule_fixup(char *buf, size_t len)
{
    char *arrow = strstr(buf, "->");
    size_t n = strlen(buf);
    if (!arrow || (arrow != buf && arrow[-1] != ',') || n + 4 > len)
        return;
    memmove(arrow + 3, arrow, n + 1 - (size_t)(arrow - buf));
    memcpy(arrow, "...", 3);
}

static const char *const kind_name[] = {"sum",       "mean", "max",    "min",
                                        "logsumexp", "var",  "argmax", "argmin"};

static int kind_of(const void *user)
{
    return (int)(intptr_t)user;
}

/* A sharded reduced axis leaves a partial sum / max / min for these; the others need it
 * whole. */
static int reduces_partially(int kind)
{
    return kind == RK_SUM || kind == RK_MEAN || kind == RK_MAX || kind == RK_MIN;
}

static uint64_t mask_of(const dt_op_attrs *at, int rank)
{
    uint64_t m = (uint64_t)at->i[0];
    return m ? m : (UINT64_C(1) << rank) - 1;
}

static dt_status check_mask(const char *name, const dt_op_shape *x, const dt_op_attrs *at)
{
    uint64_t m = (uint64_t)at->i[0];
    if (at->i[0] < 0 || (x->rank < 63 && m >> x->rank))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: axes mask 0x%llx has an axis beyond rank %d",
                         name, (unsigned long long)m, x->rank);
    return DT_OK;
}

/* "abc->ac" (keepdim: "abc->axc", x a new size-1 factor); reduced letters uppercase when
 * they must be whole. */
static dt_status write_rule(int rank, uint64_t mask, int keepdim, int whole, int nin, char *buf,
                            size_t len)
{
    char r[128];
    int n = 0, fresh = rank;
    for (int i = 0; i < nin; i++) {
        if (i)
            r[n++] = ',';
        for (int d = 0; d < rank; d++) {
            int red = mask >> d & 1;
            if (i == 0 || !red)
                r[n++] = red && whole ? (char)toupper(dt__op_letter(d)) : dt__op_letter(d);
            else if (keepdim) /* reduce_grad's out and dy: size 1, broadcast */
                r[n++] = whole ? (char)toupper(dt__op_letter(d)) : dt__op_letter(d);
        }
    }
    r[n++] = '-';
    r[n++] = '>';
    for (int d = 0; d < rank; d++) {
        int red = mask >> d & 1;
        if (nin == 3)
            r[n++] = red && whole ? (char)toupper(dt__op_letter(d)) : dt__op_letter(d);
        else if (!red)
            r[n++] = dt__op_letter(d);
        else if (keepdim)
            r[n++] = dt__op_letter(fresh++);
    }
    r[n] = 0;
    if ((size_t)n >= len)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "reduction: rule buffer too small");
    memcpy(buf, r, (size_t)n + 1);
    dt__rd_rule_fixup(buf, len);
    return DT_OK;
}

static dt_status reduce_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    int kind = kind_of(sig->user);
    const dt_op_shape *x = &sig->in[0];
    return write_rule(x->rank, mask_of(sig->attrs, x->rank), sig->attrs->i[1] != 0,
                      !reduces_partially(kind), 1, buf, len);
}

static dt_status reduce_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    int kind = kind_of(sig->user);
    const char *name = kind_name[kind];
    const dt_op_shape *x = &sig->in[0];
    char s[96];
    if (!dt__rd_float(x->dtype))
        return dt__error(DT_ERR_SHAPE, "%s: x %s is %s, not f32 or f64", name,
                         dt__rd_shape_str(x, s, sizeof(s)), dt_dtype_name(x->dtype));
    dt_status st = check_mask(name, x, sig->attrs);
    if (st != DT_OK)
        return st;
    uint64_t m = mask_of(sig->attrs, x->rank);
    if ((kind == RK_ARGMAX || kind == RK_ARGMIN) && (x->rank == 0 || (m & (m - 1))))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: one axis of x %s, not mask 0x%llx", name,
                         dt__rd_shape_str(x, s, sizeof(s)), (unsigned long long)m);
    if (kind == RK_MAX || kind == RK_MIN || kind == RK_ARGMAX || kind == RK_ARGMIN)
        for (int d = 0; d < x->rank; d++)
            if ((m >> d & 1) && x->dim[d] == 0)
                return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: x %s is empty along axis %d", name,
                                 dt__rd_shape_str(x, s, sizeof(s)), d);
    out->dtype = kind == RK_ARGMAX || kind == RK_ARGMIN ? DT_DTYPE_I64 : x->dtype;
    out->rank = 0;
    for (int d = 0; d < x->rank; d++) {
        if (!(m >> d & 1))
            out->dim[out->rank++] = x->dim[d];
        else if (sig->attrs->i[1])
            out->dim[out->rank++] = 1;
    }
    return DT_OK;
}

static dt_status reduce_kernel(const dt_op_kernel_args *a)
{
    return dt__k_reduce(a, kind_of(a->user));
}

static dt_status reduce_backward(const dt_op_grad *g)
{
    int kind = kind_of(g->user);
    if (!g->needs[0])
        return DT_OK;
    if (kind == RK_ARGMAX || kind == RK_ARGMIN)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: not differentiable", kind_name[kind]);
    dt_op_attrs at = *g->attrs;
    at.i[3] = kind;
    const dt_tensor *dy;
    dt_tensor *owned;
    dt_status st = dt__rd_dy(g, dt_tensor_dtype(g->in[0]), &dy, &owned);
    if (st != DT_OK)
        return st;
    /* sum, mean and var do not read the forward output: dy stands in for it. */
    int uses_out = kind == RK_MAX || kind == RK_MIN || kind == RK_LOGSUMEXP;
    const dt_tensor *in[3] = {g->in[0], uses_out ? g->out : dy, dy};
    st = dt__op_run(&dt__def_reduce_grad, in, 3, &at, NULL, &g->dx[0]);
    dt_tensor_destroy(owned);
    return st;
}

/* The validator's sig carries no user pointer: one sample function per kind of axes. */
static dt_status sample_kind(int kind, uint64_t seed, int max_dim, dt_op_sig *sig,
                             dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = 1;
    sig->in[0].dtype = DT_DTYPE_F64;
    sig->in[0].rank = (int)dt__rd_randint(&s, 1, 3);
    for (int d = 0; d < sig->in[0].rank; d++)
        sig->in[0].dim[d] = dt__rd_randint(&s, 1, max_dim);
    if (kind == RK_ARGMAX || kind == RK_ARGMIN)
        attrs->i[0] = INT64_C(1) << dt__rd_randint(&s, 0, sig->in[0].rank - 1);
    else
        attrs->i[0] = dt__rd_randint(&s, 1, (INT64_C(1) << sig->in[0].rank) - 1);
    attrs->i[1] = dt__rd_randint(&s, 0, 1);
    if (kind == RK_VAR) { /* unbiased only over two or more elements (else NaN) */
        int64_t n = 1;
        for (int d = 0; d < sig->in[0].rank; d++)
            n *= attrs->i[0] >> d & 1 ? sig->in[0].dim[d] : 1;
        attrs->i[2] = n > 1 ? dt__rd_randint(&s, 0, 1) : 0;
    }
    return DT_OK;
}

static dt_status reduce_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    return sample_kind(RK_SUM, seed, max_dim, sig, attrs);
}

static dt_status var_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    return sample_kind(RK_VAR, seed, max_dim, sig, attrs);
}

static dt_status arg_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    return sample_kind(RK_ARGMAX, seed, max_dim, sig, attrs);
}

#define REDUCTION(var, nm, k, lin, red, save, text)                                                \
    const dt_op_def var = {.name = nm,                                                             \
                           .nin = 1,                                                               \
                           .rule_fn = reduce_rule,                                                 \
                           .infer = reduce_infer,                                                  \
                           .cpu = reduce_kernel,                                                   \
                           .backward =                                                             \
                               (k) == RK_ARGMAX || (k) == RK_ARGMIN ? NULL : reduce_backward,      \
                           .linearity = lin,                                                       \
                           .linear_in = (lin) ? 1u : 0u,                                           \
                           .reduce = red,                                                          \
                           .save_out = save,                                                       \
                           .user = (void *)(intptr_t)(k),                                          \
                           .doc = text,                                                            \
                           .family = "reduction",                                                  \
                           .sample = (k) == RK_VAR                          ? var_sample           \
                                     : (k) == RK_ARGMAX || (k) == RK_ARGMIN ? arg_sample           \
                                                                            : reduce_sample}

REDUCTION(dt__def_sum, "sum", RK_SUM, DT_OP_LINEAR_MULTI, DT_REDUCE_SUM, 0,
          "sum over axes (a sharded axis: partial sum)");
REDUCTION(dt__def_mean, "mean", RK_MEAN, DT_OP_LINEAR_MULTI, DT_REDUCE_SUM, 0,
          "mean over axes (divides by the global count: a sharded axis gives a partial sum)");
REDUCTION(dt__def_max, "max", RK_MAX, DT_OP_LINEAR_NONE, DT_REDUCE_MAX, 1,
          "max over axes (a sharded axis: partial max); gradient split among ties");
REDUCTION(dt__def_min, "min", RK_MIN, DT_OP_LINEAR_NONE, DT_REDUCE_MIN, 1,
          "min over axes (a sharded axis: partial min); gradient split among ties");
REDUCTION(dt__def_logsumexp, "logsumexp", RK_LOGSUMEXP, DT_OP_LINEAR_NONE, DT_REDUCE_SUM, 1,
          "log of the sum of exponentials over whole axes, stable");
REDUCTION(dt__def_var, "var", RK_VAR, DT_OP_LINEAR_NONE, DT_REDUCE_SUM, 0,
          "variance over whole axes with a correction (1: unbiased)");
REDUCTION(dt__def_argmax, "argmax", RK_ARGMAX, DT_OP_LINEAR_NONE, DT_REDUCE_SUM, 0,
          "first index of the max along one whole axis (i64)");
REDUCTION(dt__def_argmin, "argmin", RK_ARGMIN, DT_OP_LINEAR_NONE, DT_REDUCE_SUM, 0,
          "first index of the min along one whole axis (i64)");

/* ---- reduce_grad: dx of every reduction (in: x, the forward output, dy) ------------------ */

static dt_status grad_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    int kind = (int)sig->attrs->i[3];
    const dt_op_shape *x = &sig->in[0];
    int whole = kind == RK_MAX || kind == RK_MIN || kind == RK_VAR;
    return write_rule(x->rank, mask_of(sig->attrs, x->rank), sig->attrs->i[1] != 0, whole, 3, buf,
                      len);
}

static dt_status grad_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0];
    char s[96], t[96];
    dt_status st = check_mask("reduce_grad", x, sig->attrs);
    if (st != DT_OK)
        return st;
    if (sig->attrs->i[3] < RK_SUM || sig->attrs->i[3] > RK_VAR)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "reduce_grad: no gradient for kind %lld",
                         (long long)sig->attrs->i[3]);
    dt_op_shape want;
    dt_op_sig fw = *sig;
    fw.user = (void *)(intptr_t)sig->attrs->i[3];
    st = reduce_infer(&fw, &want);
    if (st != DT_OK)
        return st;
    for (int i = 1; i < 3; i++) {
        int same = sig->in[i].rank == want.rank && dt__rd_float(sig->in[i].dtype);
        for (int d = 0; same && d < want.rank; d++)
            same = sig->in[i].dim[d] == want.dim[d];
        if (!same)
            return dt__error(DT_ERR_SHAPE, "reduce_grad: input %d is %s, the reduction of x %s", i,
                             dt__rd_shape_str(&sig->in[i], s, sizeof(s)),
                             dt__rd_shape_str(x, t, sizeof(t)));
    }
    *out = *x;
    return DT_OK;
}

const dt_op_def dt__def_reduce_grad = {
    .name = "reduce_grad",
    .nin = 3,
    .rule_fn = grad_rule,
    .infer = grad_infer,
    .cpu = dt__k_reduce_grad,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 4u,
    .reduce = DT_REDUCE_SUM,
    .doc = "gradient of a reduction (x, its output, dy; attrs i[3]: which reduction)",
    .family = "reduction",
};

/* ---- public functions ------------------------------------------------------------------- */

static dt_status axes_attrs(const char *name, const dt_tensor *x, const int *axes, int naxes,
                            int keepdim, dt_op_attrs *at)
{
    if (!x || naxes < 0 || (naxes > 0 && !axes))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL tensor or axes, or naxes %d", name,
                         naxes);
    int rank = dt_tensor_rank(x);
    uint64_t m = 0;
    for (int i = 0; i < naxes; i++) {
        int a = dt__op_axis(axes[i], rank);
        if (a < 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: axis %d out of range for rank %d", name,
                             axes[i], rank);
        if (m >> a & 1)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: axis %d listed twice", name, axes[i]);
        m |= UINT64_C(1) << a;
    }
    if (naxes == 0)
        m = (UINT64_C(1) << rank) - 1;
    at->i[0] = (int64_t)m;
    at->i[1] = keepdim != 0;
    return DT_OK;
}

static dt_status run_reduction(const dt_op_def *def, const char *name, const dt_tensor *x,
                               const int *axes, int naxes, int keepdim, int correction,
                               dt_tensor **out)
{
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    dt_status st = axes_attrs(name, x, axes, naxes, keepdim, &at);
    if (st != DT_OK)
        return st;
    if (!out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL out", name);
    at.i[2] = correction;
    return dt__op_run1(def, x, &at, out);
}

dt_status dt_sum(const dt_tensor *x, const int *axes, int naxes, int keepdim, dt_tensor **out)
{
    return run_reduction(&dt__def_sum, "sum", x, axes, naxes, keepdim, 0, out);
}

dt_status dt_mean(const dt_tensor *x, const int *axes, int naxes, int keepdim, dt_tensor **out)
{
    return run_reduction(&dt__def_mean, "mean", x, axes, naxes, keepdim, 0, out);
}

dt_status dt_max(const dt_tensor *x, const int *axes, int naxes, int keepdim, dt_tensor **out)
{
    return run_reduction(&dt__def_max, "max", x, axes, naxes, keepdim, 0, out);
}

dt_status dt_min(const dt_tensor *x, const int *axes, int naxes, int keepdim, dt_tensor **out)
{
    return run_reduction(&dt__def_min, "min", x, axes, naxes, keepdim, 0, out);
}

dt_status dt_logsumexp(const dt_tensor *x, const int *axes, int naxes, int keepdim, dt_tensor **out)
{
    return run_reduction(&dt__def_logsumexp, "logsumexp", x, axes, naxes, keepdim, 0, out);
}

dt_status dt_var(const dt_tensor *x, const int *axes, int naxes, int correction, int keepdim,
                 dt_tensor **out)
{
    if (correction < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "var: correction %d < 0", correction);
    return run_reduction(&dt__def_var, "var", x, axes, naxes, keepdim, correction, out);
}

dt_status dt_argmax(const dt_tensor *x, int axis, int keepdim, dt_tensor **out)
{
    return run_reduction(&dt__def_argmax, "argmax", x, &axis, 1, keepdim, 0, out);
}

dt_status dt_argmin(const dt_tensor *x, int axis, int keepdim, dt_tensor **out)
{
    return run_reduction(&dt__def_argmin, "argmin", x, &axis, 1, keepdim, 0, out);
}
