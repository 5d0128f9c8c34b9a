/* ops/def_reduce_scan: definitions and public functions of the ops along one whole axis:
 * log_softmax (and its gradient op), cumsum (reverse: its own gradient), topk and sort (an
 * indices op, then the values at those indices, whose gradient op adds dy back at them). */
#include <ctype.h>
#include <string.h>

#include "ops/def_reduce.h"
#include "runtime/error.h"

/* Operands of `rank` letters with the axis' letter uppercase (whole) or, where `alt` is
 * set, that letter replaced by alt (topk's k). ops: one char per operand, 'x' the plain
 * operand, 'k' the one with alt; the last is the output. */
static dt_status axis_rule(int rank, int axis, const char *ops, char alt, char *buf, size_t len)
{
    char r[96];
    int n = 0, nops = (int)strlen(ops);
    for (int i = 0; i < nops; i++) {
        if (i == nops - 1) {
            r[n++] = '-';
            r[n++] = '>';
        } else if (i) {
            r[n++] = ',';
        }
        for (int d = 0; d < rank; d++)
            r[n++] = d != axis       ? dt__op_letter(d)
                     : ops[i] == 'k' ? alt
                                     : (char)toupper(dt__op_letter(d));
    }
    r[n] = 0;
    if ((size_t)n >= len)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "axis rule: buffer too small");
    memcpy(buf, r, (size_t)n + 1);
    dt__rd_rule_fixup(buf, len);
    return DT_OK;
}

static dt_status check_axis(const char *name, const dt_op_sig *sig)
{
    const dt_op_shape *x = &sig->in[0];
    char s[96];
    if (!dt__rd_float(x->dtype))
        return dt__error(DT_ERR_SHAPE, "%s: x %s is %s, not f32 or f64", name,
                         dt__rd_shape_str(x, s, sizeof(s)), dt_dtype_name(x->dtype));
    if (sig->attrs->i[0] < 0 || sig->attrs->i[0] >= x->rank)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: axis %lld out of range for x %s", name,
                         (long long)sig->attrs->i[0], dt__rd_shape_str(x, s, sizeof(s)));
    return DT_OK;
}

static int same_shape(const dt_op_shape *a, const dt_op_shape *b)
{
    if (a->rank != b->rank)
        return 0;
    for (int d = 0; d < a->rank; d++)
        if (a->dim[d] != b->dim[d])
            return 0;
    return 1;
}

static dt_status axis_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = 1;
    sig->in[0].dtype = DT_DTYPE_F64;
    sig->in[0].rank = (int)dt__rd_randint(&s, 1, 3);
    for (int d = 0; d < sig->in[0].rank; d++)
        sig->in[0].dim[d] = dt__rd_randint(&s, 1, max_dim);
    attrs->i[0] = dt__rd_randint(&s, 0, sig->in[0].rank - 1);
    return DT_OK;
}

/* ---- log_softmax ------------------------------------------------------------------------- */

static dt_status same_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    static const char *const ops[] = {"", "xx", "xxx", "xxxx"};
    return axis_rule(sig->in[0].rank, (int)sig->attrs->i[0], ops[sig->nin], 0, buf, len);
}

static dt_status log_softmax_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    dt_status st = check_axis(sig->nin == 1 ? "log_softmax" : "log_softmax_grad", sig);
    if (st != DT_OK)
        return st;
    if (sig->nin == 2 &&
        (!same_shape(&sig->in[0], &sig->in[1]) || sig->in[1].dtype != sig->in[0].dtype))
        return dt__error(DT_ERR_SHAPE, "log_softmax_grad: dy is not like y");
    *out = sig->in[0];
    return DT_OK;
}

static dt_status log_softmax_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    const dt_tensor *dy;
    dt_tensor *owned;
    dt_status st = dt__rd_dy(g, dt_tensor_dtype(g->out), &dy, &owned);
    if (st == DT_OK)
        st = dt__op_run2(&dt__def_log_softmax_grad, g->out, dy, g->attrs, &g->dx[0]);
    dt_tensor_destroy(owned);
    return st;
}

const dt_op_def dt__def_log_softmax = {
    .name = "log_softmax",
    .nin = 1,
    .rule_fn = same_rule,
    .infer = log_softmax_infer,
    .cpu = dt__k_log_softmax,
    .backward = log_softmax_backward,
    .save_out = 1,
    .doc = "log(softmax(x)) along a whole axis, stable",
    .family = "reduction",
    .sample = axis_sample,
};

const dt_op_def dt__def_log_softmax_grad = {
    .name = "log_softmax_grad",
    .nin = 2,
    .rule_fn = same_rule,
    .infer = log_softmax_infer,
    .cpu = dt__k_log_softmax_grad,
    .doc = "dx = dy - exp(y) sum(dy) along the axis (y: log_softmax's output)",
    .family = "reduction",
};

/* ---- cumsum ------------------------------------------------------------------------------ */

static dt_status cumsum_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    dt_status st = check_axis("cumsum", sig);
    if (st == DT_OK)
        *out = sig->in[0];
    return st;
}

static dt_status cumsum_backward(const dt_op_grad *g)
{
    return dt__rd_grad_flipped(g, &dt__def_cumsum);
}

const dt_op_def dt__def_cumsum = {
    .name = "cumsum",
    .nin = 1,
    .rule_fn = same_rule,
    .infer = cumsum_infer,
    .cpu = dt__k_cumsum,
    .backward = cumsum_backward,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 1u,
    .doc = "inclusive cumulative sum along a whole axis (attrs i[1]: from the end)",
    .family = "reduction",
    .sample = axis_sample,
};

/* ---- topk / sort ------------------------------------------------------------------------- */

static dt_status topk_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    return axis_rule(sig->in[0].rank, (int)sig->attrs->i[0], "xk", dt__op_letter(sig->in[0].rank),
                     buf, len);
}

static dt_status topk_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    dt_status st = check_axis("topk", sig);
    if (st != DT_OK)
        return st;
    int axis = (int)sig->attrs->i[0];
    int64_t k = sig->attrs->i[1];
    if (k < 0 || k > sig->in[0].dim[axis])
        return dt__error(DT_ERR_INVALID_ARGUMENT, "topk: k %lld outside 0..%lld (axis %d)",
                         (long long)k, (long long)sig->in[0].dim[axis], axis);
    *out = sig->in[0];
    out->dtype = DT_DTYPE_I64;
    out->dim[axis] = k;
    return DT_OK;
}

static dt_status topk_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    dt_status st = axis_sample(seed, max_dim, sig, attrs);
    uint64_t s = seed ^ 0x5bd1e995u;
    attrs->i[1] = dt__rd_randint(&s, 0, sig->in[0].dim[attrs->i[0]]);
    attrs->i[2] = dt__rd_randint(&s, 0, 1);
    return st;
}

const dt_op_def dt__def_topk_indices = {
    .name = "topk_indices",
    .nin = 1,
    .rule_fn = topk_rule,
    .infer = topk_infer,
    .cpu = dt__k_topk_indices,
    .doc = "indices (i64) of the k largest / smallest along a whole axis, sorted, stable",
    .family = "reduction",
    .sample = topk_sample,
};

/* topk_values (x, indices) -> values; topk_values_grad (x, indices, dy) -> dx. */
static dt_status values_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    return axis_rule(sig->in[0].rank, (int)sig->attrs->i[0], sig->nin == 2 ? "xkk" : "xkkx",
                     dt__op_letter(sig->in[0].rank), buf, len);
}

static dt_status values_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const char *name = sig->nin == 2 ? "topk_values" : "topk_values_grad";
    dt_status st = check_axis(name, sig);
    if (st != DT_OK)
        return st;
    const dt_op_shape *x = &sig->in[0], *ix = &sig->in[1];
    char s[96], t[96];
    int axis = (int)sig->attrs->i[0], ok = ix->rank == x->rank;
    for (int d = 0; ok && d < x->rank; d++)
        ok = d == axis || ix->dim[d] == x->dim[d];
    if (!ok || (ix->dtype != DT_DTYPE_I64 && ix->dtype != DT_DTYPE_I32))
        return dt__error(DT_ERR_SHAPE, "%s: indices %s (%s) do not fit x %s along axis %d", name,
                         dt__rd_shape_str(ix, s, sizeof(s)), dt_dtype_name(ix->dtype),
                         dt__rd_shape_str(x, t, sizeof(t)), axis);
    if (sig->nin == 3 && (!same_shape(&sig->in[2], ix) || sig->in[2].dtype != x->dtype))
        return dt__error(DT_ERR_SHAPE, "%s: dy %s is not like indices %s", name,
                         dt__rd_shape_str(&sig->in[2], s, sizeof(s)),
                         dt__rd_shape_str(ix, t, sizeof(t)));
    *out = sig->nin == 2 ? *ix : *x;
    out->dtype = x->dtype;
    return DT_OK;
}

static dt_status values_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    const dt_tensor *dy;
    dt_tensor *owned;
    dt_status st = dt__rd_dy(g, dt_tensor_dtype(g->in[0]), &dy, &owned);
    const dt_tensor *in[3] = {g->in[0], g->in[1], dy};
    if (st == DT_OK)
        st = dt__op_run(&dt__def_topk_values_grad, in, 3, g->attrs, NULL, &g->dx[0]);
    dt_tensor_destroy(owned);
    return st;
}

static dt_status values_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    dt_status st = axis_sample(seed, max_dim, sig, attrs);
    uint64_t s = seed ^ 0x27d4eb2fu;
    sig->nin = 2;
    sig->in[1] = sig->in[0];
    sig->in[1].dtype = DT_DTYPE_I64;
    sig->in[1].dim[attrs->i[0]] = dt__rd_randint(&s, 1, max_dim);
    return st;
}

static dt_status values_fill(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    if (i != 1)
        return DT_ERR_UNSUPPORTED; /* x: plain reals */
    uint64_t s = seed;
    int64_t len = sig->in[0].dim[sig->attrs->i[0]];
    for (int64_t e = 0; e < n; e++)
        ((int64_t *)host)[e] = dt__rd_randint(&s, 0, len - 1);
    return DT_OK;
}

const dt_op_def dt__def_topk_values = {
    .name = "topk_values",
    .nin = 2,
    .rule_fn = values_rule,
    .infer = values_infer,
    .cpu = dt__k_take_along,
    .backward = values_backward,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 1u,
    .doc = "x's values at indices along a whole axis (topk's and sort's values)",
    .family = "reduction",
    .sample = values_sample,
    .fill = values_fill,
};

const dt_op_def dt__def_topk_values_grad = {
    .name = "topk_values_grad",
    .nin = 3,
    .rule_fn = values_rule,
    .infer = values_infer,
    .cpu = dt__k_take_along_grad,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 4u,
    .reduce = DT_REDUCE_SUM,
    .doc = "dy added at indices along an axis into zeros of x's shape",
    .family = "reduction",
};

/* ---- public functions ------------------------------------------------------------------- */

static dt_status axis_attrs(const char *name, const dt_tensor *x, int axis, dt_op_attrs *at)
{
    if (!x)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL tensor", name);
    int a = dt__op_axis(axis, dt_tensor_rank(x));
    if (a < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: axis %d out of range for rank %d", name,
                         axis, dt_tensor_rank(x));
    at->i[0] = a;
    return DT_OK;
}

dt_status dt_log_softmax(const dt_tensor *x, int axis, dt_tensor **out)
{
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    dt_status st = axis_attrs("log_softmax", x, axis, &at);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "log_softmax: NULL out");
    return st == DT_OK ? dt__op_run1(&dt__def_log_softmax, x, &at, out) : st;
}

dt_status dt_cumsum(const dt_tensor *x, int axis, dt_tensor **out)
{
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    dt_status st = axis_attrs("cumsum", x, axis, &at);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "cumsum: NULL out");
    return st == DT_OK ? dt__op_run1(&dt__def_cumsum, x, &at, out) : st;
}

static dt_status topk_run(const char *name, const dt_tensor *x, int64_t k, int axis, int largest,
                          dt_tensor **values_out, dt_tensor **indices_out)
{
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    dt_status st = axis_attrs(name, x, axis, &at);
    if (st != DT_OK)
        return st;
    if (k < 0)
        k = dt_tensor_shape(x)[at.i[0]]; /* sort */
    at.i[1] = k;
    at.i[2] = largest != 0;
    dt_tensor *idx = NULL, *val = NULL;
    st = dt__op_run1(&dt__def_topk_indices, x, &at, &idx);
    dt_op_attrs vat = DT_OP_ATTRS_INIT; /* topk_values: the axis only */
    vat.i[0] = at.i[0];
    if (st == DT_OK && values_out)
        st = dt__op_run2(&dt__def_topk_values, x, idx, &vat, &val);
    if (st != DT_OK) {
        dt_tensor_destroy(idx);
        return st;
    }
    if (values_out)
        *values_out = val;
    if (indices_out)
        *indices_out = idx;
    else
        dt_tensor_destroy(idx);
    return DT_OK;
}

dt_status dt_topk(const dt_tensor *x, int64_t k, int axis, int largest, dt_tensor **values_out,
                  dt_tensor **indices_out)
{
    if (k < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "topk: k %lld < 0", (long long)k);
    return topk_run("topk", x, k, axis, largest, values_out, indices_out);
}

dt_status dt_sort(const dt_tensor *x, int axis, int descending, dt_tensor **values_out,
                  dt_tensor **indices_out)
{
    return topk_run("sort", x, -1, axis, descending, values_out, indices_out);
}
