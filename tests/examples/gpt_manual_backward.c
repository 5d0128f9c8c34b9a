/* gpt_manual_backward: the GPT's hand-written backward pass, the reference the autograd tape
 * must reproduce bit for bit (test_train_gpt.py) and the speed it is measured against
 * (bench/gpt.sh). It reads the model's internals (examples/gpt/model_impl.h). */
#include "gpt_manual_backward.h"

/* Where the backward pass puts the gradients: the array, and who hears of each at once. */
typedef struct grad_sink {
    dt_tensor **g;
    gpt_grad_fn fn;
    void *arg;
} grad_sink;

/* g (the gradient of a parameter, f32, owned) into slot `slot`, and to the sink's function:
 * every parameter has exactly one contribution, so it is final here. */
static dt_status put_grad(grad_sink *grads, int slot, dt_tensor *g)
{
    grads->g[slot] = g;
    return grads->fn ? grads->fn(grads->arg, slot, g) : DT_OK;
}

/* The GPT's backward pass written out op by op over the activations the forward pass kept
 * (p->blk): from the loss back through the head, the blocks in reverse and the embeddings. */
static dt_status backward(gpt *m, pass *p, const dt_tensor *ids, const dt_tensor *y, float dloss,
                          grad_sink *grads)
{
    dt_status st;
    int L = (int)m->cfg.layers;
    int64_t H = m->cfg.heads;
    tape *tp = &p->tp;
    dt_tensor *dlogits = NULL, *df = NULL, *dw = NULL, *dx = NULL, *dg = NULL, *db = NULL;
    dt_tensor *gf = NULL;
    if ((st = gpt__unit_in(m, -1, L)) != DT_OK || /* the last block's (or the embeddings') */
        K(tp, dt_vocab_xent_backward(p->logits, y, dloss, &dlogits), dlogits) != DT_OK ||
        (st = dt_matmul_nd_backward(p->f, gpt__param_of(m, p_wlm(m)), 0, 0, dlogits, NULL, NULL,
                                    &df, &dw)) != DT_OK)
        return st;
    keep(tp, df);
    if ((st = put_grad(grads, p_wlm(m), dw)) != DT_OK ||
        (st = gpt__f32_param(m, p, p_lnf(m, 0), &gf)) != DT_OK ||
        (st = dt_layer_norm_backward(p->xl, gf, df, EPS, &dx, &dg, &db)) != DT_OK ||
        (st = gpt__unit_out(m, L + 1)) != DT_OK)
        return st;
    keep(tp, dx);
    if ((st = put_grad(grads, p_lnf(m, 0), dg)) != DT_OK ||
        (st = put_grad(grads, p_lnf(m, 1), db)) != DT_OK)
        return st;
    for (int l = L - 1; l >= 0; l--) {
        acts *a = &p->blk[l];
        dt_tensor *g1 = NULL, *g2 = NULL, *dgl = NULL, *dh = NULL, *dbn = NULL, *dx1p = NULL;
        dt_tensor *dx1 = NULL, *dy = NULL, *dq = NULL, *dk = NULL, *dv = NULL, *da[3];
        dt_tensor *das = NULL, *das2 = NULL, *dxp = NULL, *dxn = NULL;
        if ((st = gpt__unit_in(m, 1 + l, l)) != DT_OK ||
            (st = gpt__f32_param(m, p, p_n(m, l, N_LN1G), &g1)) != DT_OK ||
            (st = gpt__f32_param(m, p, p_n(m, l, N_LN2G), &g2)) != DT_OK)
            return st;
        /* MLP branch: x2 = x1 + fc2(gelu(fc(ln2(x1)))). */
        if ((st = dt_matmul_nd_backward(a->g, gpt__param_of(m, p_w(m, l, W_FC2)), 0, 0, dx, NULL,
                                        NULL, &dgl, &dw)) != DT_OK)
            return st;
        keep(tp, dgl);
        if ((st = put_grad(grads, p_w(m, l, W_FC2), dw)) != DT_OK ||
            K(tp, dt_gelu_backward(a->h, dgl, &dh), dh) != DT_OK ||
            (st = dt_matmul_nd_backward(a->b, gpt__param_of(m, p_w(m, l, W_FC)), 0, 0, dh, NULL,
                                        NULL, &dbn, &dw)) != DT_OK)
            return st;
        keep(tp, dbn);
        if ((st = put_grad(grads, p_w(m, l, W_FC), dw)) != DT_OK ||
            (st = dt_layer_norm_backward(a->x1, g2, dbn, EPS, &dx1p, &dg, &db)) != DT_OK)
            return st;
        keep(tp, dx1p);
        if ((st = put_grad(grads, p_n(m, l, N_LN2G), dg)) != DT_OK ||
            (st = put_grad(grads, p_n(m, l, N_LN2B), db)) != DT_OK ||
            K(tp, dt_add(dx, dx1p, m->l_act, &dx1), dx1) != DT_OK)
            return st;
        /* Attention branch: x1 = x + proj(attn(q, k, v of ln1(x))). */
        if ((st = dt_matmul_nd_backward(a->y, gpt__param_of(m, p_w(m, l, W_O)), 0, 0, dx1, NULL,
                                        NULL, &dy, &dw)) != DT_OK)
            return st;
        keep(tp, dy);
        if ((st = put_grad(grads, p_w(m, l, W_O), dw)) != DT_OK ||
            (st = dt_attention_backward(a->q, a->k, a->v, H, 1, dy, &dq, &dk, &dv)) != DT_OK)
            return st;
        keep(tp, dq);
        keep(tp, dk);
        keep(tp, dv);
        dt_tensor *dqkv[3] = {dq, dk, dv};
        for (int j = 0; j < 3; j++) {
            if ((st = dt_matmul_nd_backward(a->a, gpt__param_of(m, p_w(m, l, W_Q + j)), 0, 0,
                                            dqkv[j], NULL, NULL, &da[j], &dw)) != DT_OK)
                return st;
            keep(tp, da[j]);
            if ((st = put_grad(grads, p_w(m, l, W_Q + j), dw)) != DT_OK)
                return st;
        }
        if (K(tp, dt_add(da[0], da[1], NULL, &das), das) != DT_OK ||
            K(tp, dt_add(das, da[2], NULL, &das2), das2) != DT_OK ||
            (st = dt_layer_norm_backward(a->x, g1, das2, EPS, &dxp, &dg, &db)) != DT_OK)
            return st;
        keep(tp, dxp);
        if ((st = put_grad(grads, p_n(m, l, N_LN1G), dg)) != DT_OK ||
            (st = put_grad(grads, p_n(m, l, N_LN1B), db)) != DT_OK ||
            K(tp, dt_add(dx1, dxp, m->l_act, &dxn), dxn) != DT_OK ||
            (st = gpt__unit_out(m, 1 + l)) != DT_OK)
            return st;
        dx = dxn;
    }
    /* Embeddings: x0 = wte[ids] + wpe[pos]. */
    dt_tensor *wte = NULL, *wpe = NULL;
    if ((st = gpt__unit_in(m, 0, -1)) != DT_OK ||
        (st = gpt__f32_param(m, p, p_wte(), &wte)) != DT_OK ||
        (st = gpt__f32_param(m, p, p_wpe(), &wpe)) != DT_OK ||
        (st = dt_embedding_backward(wte, ids, dx, NULL, &dw)) != DT_OK ||
        (st = dt_embedding_backward(wpe, p->pos, dx, NULL, &db)) != DT_OK ||
        (st = gpt__unit_out(m, 0)) != DT_OK || (st = put_grad(grads, p_wte(), dw)) != DT_OK ||
        (st = put_grad(grads, p_wpe(), db)) != DT_OK)
        return st;
    return DT_OK;
}

dt_status gpt_manual_backward(gpt *m, pass *p, const dt_tensor *ids, const dt_tensor *y,
                              float dloss, dt_tensor **g, gpt_grad_fn fn, void *arg)
{
    /* What the forward pass does here and this backward does not know. */
    if (m->l_gath) {
        gpt__set_error("train_gpt: --sequence-parallel needs the tape's backward (not "
                       "--manual-backward)");
        return DT_ERR_UNSUPPORTED;
    }
    if (m->dropout > 0.0f) {
        gpt__set_error("train_gpt: --dropout needs the tape's backward (not --manual-backward)");
        return DT_ERR_UNSUPPORTED;
    }
    if (m->cfg.llama) {
        gpt__set_error("train_gpt: --arch llama has no hand-written backward "
                       "(--manual-backward)");
        return DT_ERR_UNSUPPORTED;
    }
    grad_sink sink = {g, fn, arg};
    return backward(m, p, ids, y, dloss, &sink);
}
