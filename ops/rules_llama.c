/* ops/rules_llama: backward rules of the Llama-style ops (ops/spmd_llama.c), each a call
 * of its explicit *_backward function. */
#include "ops/opdef_impl.h"
#include "runtime/error.h"
#include "dtensor/ops.h"

/* ---- rms_norm: in {x, gain}; fattr {eps}; saves x, gain ----------------------------------- */

static dt_status rms_norm_bw(dt__ag_ctx *c)
{
    dt_tensor *dx = NULL, *dg = NULL;
    dt_status st = dt_rms_norm_backward(c->in[0], c->in[1], c->dy, c->fattr[0], &dx, &dg);
    if (st != DT_OK)
        return st;
    c->dx[0] = dx;
    c->dx[1] = dg;
    return DT_OK;
}

static dt_status rms_norm_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_rms_norm(in[0], in[1], c->fattr[0], out);
}

const dt__ag_rule dt__ag_rule_rms_norm = {"dt_rms_norm", 3, 0, rms_norm_bw, rms_norm_re, 0};

/* ---- rope: in {x}; iattr {heads, pos_offset}; saves nothing (linear in x) ----------------- */

static dt_status rope_bw(dt__ag_ctx *c)
{
    return dt_rope_backward(c->dy, c->iattr[0], c->iattr[1], &c->dx[0]);
}

static dt_status rope_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_rope(in[0], c->iattr[0], c->iattr[1], out);
}

const dt__ag_rule dt__ag_rule_rope = {"dt_rope", 0, 0, rope_bw, rope_re, 0};

/* ---- swiglu: in {gate, up}; saves both ---------------------------------------------------- */

static dt_status swiglu_bw(dt__ag_ctx *c)
{
    dt_tensor *dg = NULL, *du = NULL;
    dt_status st = dt_swiglu_backward(c->in[0], c->in[1], c->dy, &dg, &du);
    if (st != DT_OK)
        return st;
    c->dx[0] = dg;
    c->dx[1] = du;
    return DT_OK;
}

static dt_status swiglu_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    (void)c;
    return dt_swiglu(in[0], in[1], out);
}

const dt__ag_rule dt__ag_rule_swiglu = {"dt_swiglu", 3, 0, swiglu_bw, swiglu_re, 0};

/* ---- attention_gqa (dt_attention_gqa, dt_attention_ex): in {q, k, v}; iattr {heads,
 * kv_heads, causal, seed, stream}, fattr {dropout}; saves q, k, v ------------------------- */

static dt_attention_opts gqa_opts(const dt__ag_ctx *c)
{
    dt_attention_opts o = {.heads = c->iattr[0], .kv_heads = c->iattr[1],
                           .causal = (int)c->iattr[2], .dropout = c->fattr[0],
                           .seed = (uint64_t)c->iattr[3], .stream = (uint64_t)c->iattr[4]};
    return o;
}

static dt_status gqa_bw(dt__ag_ctx *c)
{
    dt_tensor *dq = NULL, *dk = NULL, *dv = NULL;
    dt_attention_opts o = gqa_opts(c);
    dt_status st = dt_attention_ex_backward(c->in[0], c->in[1], c->in[2], &o, c->dy, &dq, &dk,
                                            &dv);
    if (st != DT_OK)
        return st;
    c->dx[0] = dq;
    c->dx[1] = dk;
    c->dx[2] = dv;
    return DT_OK;
}

static dt_status gqa_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    dt_attention_opts o = gqa_opts(c);
    return dt_attention_ex(in[0], in[1], in[2], &o, out);
}

const dt__ag_rule dt__ag_rule_attention_gqa = {"dt_attention_gqa", 7, 0, gqa_bw, gqa_re, 0};
