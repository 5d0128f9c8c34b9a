/* moe/layer: the user-defined op moe.gate_combine (definition, CPU kernel, backward) and the
 * soft-gated mixture-of-experts layer around it, every other step a public op. */
#include "layer.h"

#include <stddef.h>
#include <string.h>

/* ---- moe.gate_combine ------------------------------------------------------------------------ */

/* y [B, D] from gates [B, E] and h [B, E, D]: ranks 2 and 3, one float dtype, B and E alike
 * (size 1 broadcasts, as the rule binder allows). */
static dt_status combine_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *g = &sig->in[0], *h = &sig->in[1];
    if (g->rank != 2 || h->rank != 3 || g->dtype != h->dtype ||
        (g->dtype != DT_DTYPE_F32 && g->dtype != DT_DTYPE_F64))
        return DT_ERR_SHAPE;
    for (int d = 0; d < 2; d++)
        if (g->dim[d] != h->dim[d] && g->dim[d] != 1 && h->dim[d] != 1)
            return DT_ERR_SHAPE;
    out->dtype = g->dtype;
    out->rank = 2;
    out->dim[0] = g->dim[0] > h->dim[0] ? g->dim[0] : h->dim[0];
    out->dim[1] = h->dim[2];
    return DT_OK;
}

/* One device's block: out[b, d] = sum over its experts e of g[b, e] h[b, e, d], accumulated
 * in f64 in expert order. With the expert dim sharded (a.partial) the block holds only its
 * experts and the sum over the devices stays pending in the output's layout. A dim of size 1
 * against a larger one is read with stride 0 (broadcast). */
static dt_status combine_cpu(const dt_op_kernel_args *a)
{
    const dt_op_buf *g = &a->in[0], *h = &a->in[1];
    int64_t B = a->out.shape[0], D = a->out.shape[1];
    int64_t E = g->shape[1] > h->shape[1] ? g->shape[1] : h->shape[1];
    int64_t gb = g->shape[0] == 1 ? 0 : g->shape[1], ge = g->shape[1] == 1 ? 0 : 1;
    int64_t hb = h->shape[0] == 1 ? 0 : h->shape[1] * D, he = h->shape[1] == 1 ? 0 : D;
    int f64 = a->out.dtype == DT_DTYPE_F64;
    for (int64_t b = 0; b < B; b++)
        for (int64_t d = 0; d < D; d++) {
            double acc = 0.0;
            for (int64_t e = 0; e < E; e++) {
                int64_t gi = b * gb + e * ge, hi = b * hb + e * he + d;
                acc += f64 ? ((const double *)g->data)[gi] * ((const double *)h->data)[hi]
                           : (double)((const float *)g->data)[gi] *
                                 (double)((const float *)h->data)[hi];
            }
            if (f64)
                ((double *)a->out.data)[b * D + d] = acc;
            else
                ((float *)a->out.data)[b * D + d] = (float)acc;
        }
    return DT_OK;
}

/* dg[b, e] = sum_d dy[b, d] h[b, e, d];  dh[b, e, d] = dy[b, d] g[b, e]: public einsums (the
 * tape does not record them). A broadcast input's gradient would need a sum over the
 * broadcast dim: the layer never broadcasts, so that case is refused. */
static dt_status combine_backward(const dt_op_grad *gr)
{
    const dt_tensor *g = gr->in[0], *h = gr->in[1];
    for (int d = 0; d < 2; d++)
        if (dt_tensor_shape(g)[d] != dt_tensor_shape(h)[d])
            return DT_ERR_UNSUPPORTED;
    dt_status st = DT_OK;
    if (gr->needs[0]) {
        const dt_tensor *in[2] = {gr->dy, h};
        st = dt_einsum("bd,bed->be", in, 2, &gr->dx[0]);
    }
    if (st == DT_OK && gr->needs[1]) {
        const dt_tensor *in[2] = {gr->dy, g};
        st = dt_einsum("bd,be->bed", in, 2, &gr->dx[1]);
    }
    return st;
}

/* The validator's cases (dt_op_validate): f64 gates [b, e] and experts' outputs [b, e, d]. */
static dt_status combine_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    (void)attrs;
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
    int64_t dim[3];
    for (int i = 0; i < 3; i++) {
        s ^= s >> 29;
        s *= 0xbf58476d1ce4e5b9ULL;
        s ^= s >> 32;
        dim[i] = 1 + (int64_t)(s % (uint64_t)max_dim);
    }
    sig->nin = 2;
    sig->in[0] = (dt_op_shape){DT_DTYPE_F64, 2, {dim[0], dim[1]}};
    sig->in[1] = (dt_op_shape){DT_DTYPE_F64, 3, {dim[0], dim[1], dim[2]}};
    return DT_OK;
}

static const dt_op_def combine_def = {
    .name = MOE_COMBINE_OP,
    .nin = 2,
    .rule = "be,bed->bd", /* e contracts: sharded, it leaves a partial sum */
    .infer = combine_infer,
    .cpu = combine_cpu,
    .backward = combine_backward,
    .linearity = DT_OP_LINEAR_MULTI, /* bilinear: one partial input passes through */
    .linear_in = 3u,
    .reduce = DT_REDUCE_SUM,
    .doc = "mixture of experts: y[b,d] = sum_e gates[b,e] h[b,e,d]",
    .family = "moe",
    .sample = combine_sample,
};

dt_status moe_combine_op(const dt_op **op_out)
{
    const dt_op *op = dt_op_find(MOE_COMBINE_OP);
    dt_status st = DT_OK;
    if (!op) {
        st = dt_op_register(&combine_def, &op);
        if (st != DT_OK && (op = dt_op_find(MOE_COMBINE_OP)) != NULL)
            st = DT_OK; /* another thread registered it first */
    }
    if (st == DT_OK)
        *op_out = op;
    return st;
}

dt_status moe_combine(const dt_tensor *gates, const dt_tensor *h, dt_tensor **y_out)
{
    const dt_op *op = NULL;
    dt_status st = moe_combine_op(&op);
    if (st != DT_OK)
        return st;
    const dt_tensor *in[2] = {gates, h};
    return dt_op_call(op, in, 2, NULL, NULL, y_out);
}

/* ---- the layer ---------------------------------------------------------------------------------
 */

/* softmax(x) over the last axis as exp(log_softmax(x)) (both take f64). */
static dt_status softmax_last(const dt_tensor *x, dt_tensor **out)
{
    dt_tensor *ls = NULL;
    dt_status st = dt_log_softmax(x, -1, &ls);
    if (st == DT_OK)
        st = dt_exp(ls, out);
    dt_tensor_destroy(ls);
    return st;
}

dt_status moe_gates(const dt_tensor *x, const dt_tensor *gate, int64_t k, dt_tensor **gates_out)
{
    int64_t E = dt_tensor_shape(gate)[1];
    if (k < 1 || k > E)
        return DT_ERR_INVALID_ARGUMENT;
    dt_tensor *logits = NULL, *vals = NULL, *idx = NULL, *p = NULL, *onehot = NULL;
    const dt_tensor *xw[2] = {x, gate};
    dt_status st = dt_einsum("bd,de->be", xw, 2, &logits);
    if (st != DT_OK)
        return st;
    if (k == E) {
        st = softmax_last(logits, gates_out);
        dt_tensor_destroy(logits);
        return st;
    }
    /* The k largest logits of each row, their softmax, scattered back to the experts by a
     * one-hot product: the gradient reaches the chosen logits only. */
    st = dt_topk(logits, k, -1, 1, &vals, &idx);
    if (st == DT_OK)
        st = softmax_last(vals, &p);
    /* No gradient flows through integer indices, but the tape marks every output of a
     * recorded op as needing one (and dt_detach takes floats only): one_hot, whose rule has no
     * backward, is kept off the tape. */
    if (st == DT_OK) {
        dt_no_grad_begin();
        st = dt_one_hot(idx, E, dt_tensor_dtype(logits), &onehot);
        dt_no_grad_end();
    }
    if (st == DT_OK) {
        const dt_tensor *in[2] = {p, onehot};
        st = dt_einsum("bk,bke->be", in, 2, gates_out);
    }
    dt_tensor_destroy(onehot);
    dt_tensor_destroy(p);
    dt_tensor_destroy(idx);
    dt_tensor_destroy(vals);
    dt_tensor_destroy(logits);
    return st;
}

dt_status moe_forward(const dt_tensor *x, const moe_weights *w, int64_t k, dt_tensor **y_out)
{
    dt_tensor *gates = NULL, *u = NULL, *a = NULL, *h = NULL;
    dt_status st = moe_gates(x, w->gate, k, &gates);
    if (st == DT_OK) { /* every expert on every row: [B, E, F] */
        const dt_tensor *in[2] = {x, w->w1};
        st = dt_einsum("bd,edf->bef", in, 2, &u);
    }
    if (st == DT_OK)
        st = dt_silu(u, &a);
    if (st == DT_OK) {
        const dt_tensor *in[2] = {a, w->w2};
        st = dt_einsum("bef,efd->bed", in, 2, &h);
    }
    if (st == DT_OK)
        st = moe_combine(gates, h, y_out);
    dt_tensor_destroy(h);
    dt_tensor_destroy(a);
    dt_tensor_destroy(u);
    dt_tensor_destroy(gates);
    return st;
}
