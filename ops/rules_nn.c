/* ops/rules_nn: backward rules of the transformer and loss ops and the activations, each
 * a call of its explicit *_backward function (ops.h). */
#include "ops/opdef_impl.h"
#include "runtime/error.h"
#include "dtensor/ops.h"

/* ---- layer_norm: in {x, gamma, beta}; fattr {eps}; saves x, gamma ------------------------- */

static dt_status layer_norm_bw(dt__ag_ctx *c)
{
    dt_tensor *dx = NULL, *dg = NULL, *db = NULL;
    dt_status st = dt_layer_norm_backward(c->in[0], c->in[1], c->dy, c->fattr[0], &dx, &dg, &db);
    if (st != DT_OK)
        return st;
    c->dx[0] = dx;
    c->dx[1] = dg;
    c->dx[2] = db;
    return DT_OK;
}

static dt_status layer_norm_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_layer_norm(in[0], in[1], in[2], c->fattr[0], out);
}

const dt__ag_rule dt__ag_rule_layer_norm = {"dt_layer_norm", 3, 0, layer_norm_bw, layer_norm_re, 0};

/* ---- softmax: in {x}; iattr {axis}; saves the output y ------------------------------------ */

static dt_status softmax_bw(dt__ag_ctx *c)
{
    return dt_softmax_backward(c->out, c->dy, (int)c->iattr[0], &c->dx[0]);
}

static dt_status softmax_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_softmax(in[0], (int)c->iattr[0], out);
}

const dt__ag_rule dt__ag_rule_softmax = {"dt_softmax", 0, 1, softmax_bw, softmax_re, 0};

/* ---- attention: in {q, k, v}; iattr {heads, causal}; saves q, k, v ------------------------- */

static dt_status attention_bw(dt__ag_ctx *c)
{
    dt_tensor *dq = NULL, *dk = NULL, *dv = NULL;
    dt_status st = dt_attention_backward(c->in[0], c->in[1], c->in[2], c->iattr[0],
                                         (int)c->iattr[1], c->dy, &dq, &dk, &dv);
    if (st != DT_OK)
        return st;
    c->dx[0] = dq;
    c->dx[1] = dk;
    c->dx[2] = dv;
    return DT_OK;
}

static dt_status attention_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_attention(in[0], in[1], in[2], c->iattr[0], (int)c->iattr[1], out);
}

const dt__ag_rule dt__ag_rule_attention = {"dt_attention", 7, 0, attention_bw, attention_re, 0};

/* ---- embedding: in {table, ids}; layout; saves both ------------------------------------------ */

static dt_status embedding_bw(dt__ag_ctx *c)
{
    if (!c->needs[0])
        return DT_OK;
    return dt_embedding_backward(c->in[0], c->in[1], c->dy, NULL, &c->dx[0]);
}

static dt_status embedding_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_embedding(in[0], in[1], c->layout, out);
}

const dt__ag_rule dt__ag_rule_embedding = {"dt_embedding", 3, 0, embedding_bw, embedding_re, 0};

/* ---- vocab_xent, softmax_xent: in {logits, labels}; layout; saves both; scalar dy ----------- */

static dt_status vocab_xent_bw(dt__ag_ctx *c)
{
    float dloss = 0;
    dt_status st = dt__ag_dy_scalar(c, &dloss);
    if (st == DT_OK && c->needs[0])
        st = dt_vocab_xent_backward(c->in[0], c->in[1], dloss, &c->dx[0]);
    return st;
}

static dt_status vocab_xent_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_vocab_xent(in[0], in[1], c->layout, out);
}

const dt__ag_rule dt__ag_rule_vocab_xent = {"dt_vocab_xent", 3, 0, vocab_xent_bw, vocab_xent_re, 1};

static dt_status softmax_xent_bw(dt__ag_ctx *c)
{
    float dloss = 0;
    dt_status st = dt__ag_dy_scalar(c, &dloss);
    if (st == DT_OK && c->needs[0])
        st = dt_softmax_xent_backward(c->in[0], c->in[1], dloss, &c->dx[0]);
    return st;
}

static dt_status softmax_xent_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_softmax_xent(in[0], in[1], c->layout, out);
}

const dt__ag_rule dt__ag_rule_softmax_xent = {"dt_softmax_xent", 3, 0, softmax_xent_bw,
                                              softmax_xent_re,   1};

/* ---- gelu, relu: in {x}; saves x ---------------------------------------------------------- */

static dt_status gelu_bw(dt__ag_ctx *c)
{
    return dt_gelu_backward(c->in[0], c->dy, &c->dx[0]);
}

static dt_status gelu_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    (void)c;
    return dt_gelu(in[0], out);
}

const dt__ag_rule dt__ag_rule_gelu = {"dt_gelu", 1, 0, gelu_bw, gelu_re, 0};

static dt_status relu_bw(dt__ag_ctx *c)
{
    return dt_relu_backward(c->in[0], c->dy, &c->dx[0]);
}

static dt_status relu_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    (void)c;
    return dt_relu(in[0], out);
}

const dt__ag_rule dt__ag_rule_relu = {"dt_relu", 1, 0, relu_bw, relu_re, 0};
