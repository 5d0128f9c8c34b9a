/* ops/rules_linear: backward rules of the matmuls and the elementwise arithmetic ops
 * (their explicit backward functions, or the identities they reduce to). */
#include "ops/opdef_impl.h"
#include "runtime/error.h"
#include "dtensor/ops.h"

/* ---- matmul, matmul_nd: in {a, b}; iattr {transa, transb}; layout ------------------------ */

static dt_status matmul_bw(dt__ag_ctx *c)
{
    return dt_matmul_backward(c->in[0], c->in[1], (int)c->iattr[0], (int)c->iattr[1], c->dy, NULL,
                              NULL, c->needs[0] ? &c->dx[0] : NULL, c->needs[1] ? &c->dx[1] : NULL);
}

static dt_status matmul_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_matmul(in[0], in[1], (int)c->iattr[0], (int)c->iattr[1], c->layout, out);
}

const dt__ag_rule dt__ag_rule_matmul = {"dt_matmul", 3, 0, matmul_bw, matmul_re, 0};

static dt_status matmul_nd_bw(dt__ag_ctx *c)
{
    return dt_matmul_nd_backward(c->in[0], c->in[1], (int)c->iattr[0], (int)c->iattr[1], c->dy,
                                 NULL, NULL, c->needs[0] ? &c->dx[0] : NULL,
                                 c->needs[1] ? &c->dx[1] : NULL);
}

static dt_status matmul_nd_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_matmul_nd(in[0], in[1], (int)c->iattr[0], (int)c->iattr[1], c->layout, out);
}

const dt__ag_rule dt__ag_rule_matmul_nd = {"dt_matmul_nd", 3, 0, matmul_nd_bw, matmul_nd_re, 0};

/* ---- add, sub, mul: in {a, b}; layout ---------------------------------------------------- */

/* d(a + b) = dy for both: the same tensor handed on, in its layout (partial stays partial). */
static dt_status add_bw(dt__ag_ctx *c)
{
    for (int i = 0; i < 2; i++)
        if (c->needs[i])
            c->dx[i] = dt_tensor_retain(c->dy);
    return DT_OK;
}

static dt_status add_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_add(in[0], in[1], c->layout, out);
}

const dt__ag_rule dt__ag_rule_add = {"dt_add", 0, 0, add_bw, add_re, 0};

/* d(a - b) = (dy, -dy). */
static dt_status sub_bw(dt__ag_ctx *c)
{
    if (c->needs[0])
        c->dx[0] = dt_tensor_retain(c->dy);
    return c->needs[1] ? dt_scale(c->dy, -1.0f, &c->dx[1]) : DT_OK;
}

static dt_status sub_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_sub(in[0], in[1], c->layout, out);
}

const dt__ag_rule dt__ag_rule_sub = {"dt_sub", 0, 0, sub_bw, sub_re, 0};

/* d(a * b) = (dy * b, dy * a). */
static dt_status mul_bw(dt__ag_ctx *c)
{
    dt_status st = DT_OK;
    if (c->needs[0])
        st = dt_mul(c->dy, c->in[1], NULL, &c->dx[0]);
    if (st == DT_OK && c->needs[1])
        st = dt_mul(c->dy, c->in[0], NULL, &c->dx[1]);
    return st;
}

static dt_status mul_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_mul(in[0], in[1], c->layout, out);
}

const dt__ag_rule dt__ag_rule_mul = {"dt_mul", 3, 0, mul_bw, mul_re, 0};

/* ---- scale: in {x}; fattr {alpha}: dx = alpha dy ------------------------------------------ */

static dt_status scale_bw(dt__ag_ctx *c)
{
    return dt_scale(c->dy, c->fattr[0], &c->dx[0]);
}

static dt_status scale_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_scale(in[0], c->fattr[0], out);
}

const dt__ag_rule dt__ag_rule_scale = {"dt_scale", 0, 0, scale_bw, scale_re, 0};

/* ---- bias_add: in {x, bias}: dx = dy, dbias = dt_bias_grad(dy) ----------------------------- */

static dt_status bias_add_bw(dt__ag_ctx *c)
{
    if (c->needs[0])
        c->dx[0] = dt_tensor_retain(c->dy);
    return c->needs[1] ? dt_bias_grad(c->dy, NULL, &c->dx[1]) : DT_OK;
}

static dt_status bias_add_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    (void)c;
    return dt_bias_add(in[0], in[1], out);
}

const dt__ag_rule dt__ag_rule_bias_add = {"dt_bias_add", 0, 0, bias_add_bw, bias_add_re, 0};
