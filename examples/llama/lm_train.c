/* llama/lm_train: the model's training pass over whole sequences recorded on the autograd
 * tape (no cache), its gradients, and its ZeRO groups (lm.h). Rotary embeddings are
 * dt_rope_half's (its gradient the inverse rotation); attention is dt_attention_gqa's
 * (dt_attention's for GPT-2). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lm_impl.h"

/* Every tensor one pass makes, destroyed after its backward. */
#define PASS_MAX (32 * MAX_LAYERS + 64)
typedef struct pass {
    dt_tensor *t[PASS_MAX];
    int n;
} pass;

static dt_status keep(pass *p, dt_status st, dt_tensor **tp)
{
    /* The tensor is read here, after the call that made it (argument order is unspecified). */
    dt_tensor *t = st == DT_OK ? *tp : NULL;
    if (st != DT_OK)
        return st;
    if (p->n == PASS_MAX) {
        dt_tensor_destroy(t);
        lm__set_error("lm_grads: too many tensors in one pass");
        return DT_ERR_STATE;
    }
    p->t[p->n++] = t;
    return DT_OK;
}

static void pass_free(pass *p)
{
    for (int i = 0; i < p->n; i++)
        dt_tensor_destroy(p->t[i]);
    p->n = 0;
}

/* Rotary embeddings of x [rows, T, heads * D] on the tape: viewed [rows, T, heads, D] for
 * dt_rope_half (positions 0..T-1), then back. */
static dt_status rope(const lm *m, pass *p, const dt_tensor *x, int64_t heads, dt_tensor **out)
{
    const int64_t *s = dt_tensor_shape(x);
    int64_t D = m->cfg.head_dim, s4[4] = {s[0], s[1], heads, D}, s3[3] = {s[0], s[1], heads * D};
    dt_rope_opts ro;
    lm__rope_opts(m, &ro);
    dt_tensor *x4 = NULL, *y4 = NULL;
    dt_status st = keep(p, dt_reshape(x, 4, s4, &x4), &x4);
    if (st == DT_OK)
        st = keep(p, dt_rope_half(x4, 0, &ro, &y4), &y4);
    if (st == DT_OK)
        st = keep(p, dt_reshape(y4, 3, s3, out), out);
    return st;
}

static dt_status linear(pass *p, const dt_tensor *x, const dt_tensor *w, const dt_tensor *b,
                        const dt_layout *layout, dt_tensor **out)
{
    dt_tensor *y = NULL, *z = NULL;
    dt_status st = keep(p, dt_matmul_nd(x, w, 0, 0, layout, &y), &y);
    if (st == DT_OK && b) {
        st = keep(p, dt_bias_add(y, b, &z), &z);
        y = z;
    }
    *out = y;
    return st;
}

static dt_status norm(const lm *m, pass *p, const dt_tensor *x, const dt_tensor *g,
                      const dt_tensor *b, dt_tensor **out)
{
    dt_tensor *y = NULL;
    float eps = (float)m->cfg.norm_eps;
    dt_status st =
        m->cfg.arch == DT_HF_GPT2 ? dt_layer_norm(x, g, b, eps, &y) : dt_rms_norm(x, g, eps, &y);
    st = keep(p, st, &y);
    *out = y;
    return st;
}

/* Sequence parallelism: x (sharded along the sequence) all-gathered along it for a
 * column-parallel matmul, recorded on the tape (its backward reduce-scatters). Otherwise x. */
static dt_status gather_seq(pass *p, const lm_layouts *l, dt_tensor *x, dt_tensor **out)
{
    *out = x;
    if (!l->sp)
        return DT_OK;
    return keep(p, dt_relayout(x, l->act, out), out);
}

/* The mean cross-entropy of ids x against targets y [rows, T] (forward, on the tape). Under
 * sequence parallelism (l->sp) the residual stream and the norms are sharded along the
 * sequence over `model` (Megatron): gathered before the column-parallel matmuls, the
 * row-parallel outputs reduce-scattered into it. */
/* A pipeline stage's part of it: from ids x (the first stage: embeddings) or the activation
 * hin [rows, T, C], blocks lo..hi-1, then with `last` the final norm, the head and the loss
 * against y into *out, else the activation. */
static dt_status forward_range(const lm *m, pass *p, const lm_layouts *l, const dt_tensor *x,
                               const dt_tensor *hin, int64_t lo, int64_t hi, int last,
                               const dt_tensor *y, dt_tensor **out)
{
    const dt_hf_config *cf = &m->cfg;
    const dt_tensor *first = x ? x : hin;
    int64_t rows = dt_tensor_shape(first)[0], T = dt_tensor_shape(first)[1];
    int llama = cf->arch == DT_HF_LLAMA;
    dt_tensor *h = (dt_tensor *)hin;
    dt_status st = DT_OK;
    const dt_layout *res = l->sp ? l->sp : l->act; /* the residual stream's layout */
    if (x && (st = keep(p, dt_embedding(m->embed, x, res, &h), &h)) != DT_OK)
        return st;
    if (x && m->pos) {
        int32_t *pos = malloc((size_t)(rows * T) * sizeof *pos);
        int64_t shape[2] = {rows, T};
        dt_tensor *tp = NULL, *pe = NULL, *h2 = NULL;
        for (int64_t i = 0; pos && i < rows * T; i++)
            pos[i] = (int32_t)(i % T);
        st = pos ? keep(p, lm__from_host(l->ids, DT_DTYPE_I32, shape, pos, &tp), &tp)
                 : DT_ERR_NO_MEMORY;
        free(pos);
        if (st == DT_OK)
            st = keep(p, dt_embedding(m->pos, tp, res, &pe), &pe);
        if (st == DT_OK)
            st = keep(p, dt_add(h, pe, res, &h2), &h2);
        h = h2;
    }
    for (int64_t i = lo; st == DT_OK && i < hi; i++) {
        const layer *w = &m->ly[i];
        dt_tensor *a, *q, *k, *v, *qr, *kr, *att = NULL, *o, *h1 = NULL, *b, *f, *g = NULL;
        dt_tensor *mo, *h2 = NULL;
        if ((st = norm(m, p, h, w->n1g, w->n1b, &a)) != DT_OK ||
            (st = gather_seq(p, l, a, &a)) != DT_OK ||
            (st = linear(p, a, w->qw, w->qb, l->q, &q)) != DT_OK ||
            (st = linear(p, a, w->kw, w->kb, l->kv, &k)) != DT_OK ||
            (st = linear(p, a, w->vw, w->vb, l->kv, &v)) != DT_OK)
            break;
        qr = q;
        kr = k;
        if (llama && ((st = rope(m, p, q, cf->heads, &qr)) != DT_OK ||
                      (st = rope(m, p, k, cf->kv_heads, &kr)) != DT_OK))
            break;
        st = llama ? dt_attention_gqa(qr, kr, v, cf->heads, cf->kv_heads, 1, &att)
                   : dt_attention(qr, kr, v, cf->heads, 1, &att);
        if ((st = keep(p, st, &att)) != DT_OK ||
            (st = linear(p, att, w->ow, w->ob, res, &o)) != DT_OK ||
            (st = keep(p, dt_add(h, o, res, &h1), &h1)) != DT_OK ||
            (st = norm(m, p, h1, w->n2g, w->n2b, &b)) != DT_OK ||
            (st = gather_seq(p, l, b, &b)) != DT_OK)
            break;
        if (llama) {
            dt_tensor *u;
            if ((st = linear(p, b, w->w1, NULL, NULL, &f)) != DT_OK ||
                (st = linear(p, b, w->w3, NULL, NULL, &u)) != DT_OK ||
                (st = keep(p, dt_swiglu(f, u, &g), &g)) != DT_OK)
                break;
        } else if ((st = linear(p, b, w->w1, w->b1, NULL, &f)) != DT_OK ||
                   (st = keep(p, dt_gelu(f, &g), &g)) != DT_OK) {
            break;
        }
        if ((st = linear(p, g, w->w2, w->b2, res, &mo)) != DT_OK ||
            (st = keep(p, dt_add(h1, mo, res, &h2), &h2)) != DT_OK)
            break;
        h = h2;
    }
    if (!last) {
        *out = h;
        return st;
    }
    dt_tensor *fo = NULL, *logits = NULL, *loss = NULL;
    if (st == DT_OK)
        st = norm(m, p, h, m->nfg, m->nfb, &fo);
    if (st == DT_OK)
        st = gather_seq(p, l, fo, &fo);
    if (st == DT_OK)
        st = keep(p, dt_matmul_nd(fo, m->head, 0, 1, NULL, &logits), &logits);
    if (st == DT_OK)
        st = keep(p, dt_vocab_xent(logits, y, NULL, &loss), &loss);
    *out = loss;
    return st;
}

static dt_status forward(const lm *m, pass *p, const lm_layouts *l, const dt_tensor *x,
                         const dt_tensor *y, dt_tensor **loss_out)
{
    return forward_range(m, p, l, x, NULL, 0, m->cfg.layers, 1, y, loss_out);
}

dt_status lm_grads(lm *m, dt_tape *tape, const dt_tensor *x, const dt_tensor *y, double *loss_out,
                   dt_tensor **grads_out)
{
    lm__set_error("%s", "");
    pass *p = calloc(1, sizeof *p);
    lm_layouts l;
    memset(&l, 0, sizeof l);
    dt_status st = p ? lm__layouts(m, dt_tensor_shape(x)[0], &l) : DT_ERR_NO_MEMORY;
    if (st == DT_OK)
        st = lm__gather(m);
    for (int i = 0; st == DT_OK && i < m->n; i++)
        st = dt_tape_watch(tape, m->p[i], i);
    if (st == DT_OK)
        st = dt_tape_begin(tape);
    if (st == DT_OK) {
        dt_tensor *loss = NULL;
        st = forward(m, p, &l, x, y, &loss);
        dt_status end = dt_tape_end(tape);
        if (st == DT_OK)
            st = end;
        if (st == DT_OK && loss_out)
            st = dt_item(loss, loss_out);
        if (st == DT_OK && grads_out)
            st = dt_tape_backward(tape, loss, NULL, 1.0f, NULL);
        for (int i = 0; st == DT_OK && grads_out && i < m->n; i++) {
            st = dt_tape_take_grad(tape, i, &grads_out[i]);
            if (st == DT_OK && !grads_out[i])
                st = DT_ERR_STATE;
        }
        dt_tape_reset(tape);
    }
    if (p)
        pass_free(p);
    if (m->zero) {
        /* The tape lets the gathered tensors go before the optimizer frees them. */
        for (int i = 0; i < m->n; i++)
            dt_tape_watch(tape, NULL, i);
        dt_status r = lm__release(m);
        st = st != DT_OK ? st : r;
    }
    free(p);
    lm__layouts_free(&l);
    return st;
}

void lm_set_sequence_parallel(lm *m, int on)
{
    m->seqpar = on;
}

int lm_param_decays(const lm *m, int i)
{
    return dt_tensor_rank(m->p[i]) == 2;
}

dt_status lm__gather(lm *m)
{
    if (!m->zero || m->gathered)
        return DT_OK;
    dt_status st = dt_zero_gather(m->zero, m->groups[0]);
    if (st == DT_OK && (st = dt_zero_gather(m->zero, m->groups[1])) != DT_OK)
        dt_zero_release(m->zero, m->groups[0]);
    for (int k = 0; st == DT_OK && k < m->n; k++)
        st = dt_zero_param(m->zero, k, &m->p[m->opt[k]]);
    if (st == DT_OK)
        lm__rebind(m);
    m->gathered = st == DT_OK;
    return st;
}

dt_status lm__release(lm *m)
{
    if (!m->zero || !m->gathered)
        return DT_OK;
    for (int i = 0; i < m->n; i++)
        m->p[i] = NULL;
    m->gathered = 0;
    dt_status a = dt_zero_release(m->zero, m->groups[0]);
    dt_status b = dt_zero_release(m->zero, m->groups[1]);
    return a != DT_OK ? a : b;
}

dt_status lm_attach(lm *m, dt_zero *zero, const dt_optim_hparams *hp, int stage3)
{
    lm__set_error("%s", "");
    dt_tensor **pt = malloc((size_t)m->n * sizeof *pt);
    const char **nm = malloc((size_t)m->n * sizeof *nm);
    free(m->opt);
    m->opt = malloc((size_t)m->n * sizeof *m->opt);
    dt_status st = pt && nm && m->opt ? DT_OK : DT_ERR_NO_MEMORY;
    dt_optim_hparams plain = *hp;
    plain.weight_decay = 0.0f;
    int k = 0;
    for (int g = 0; st == DT_OK && g < 2; g++) {
        int first = k;
        for (int i = 0; i < m->n; i++)
            if (lm_param_decays(m, i) == (g == 0)) {
                m->opt[k] = i;
                pt[k] = m->p[i];
                nm[k++] = m->names[i];
            }
        st = dt_zero_add_group(zero, k - first, nm + first, pt + first, g == 0 ? hp : &plain,
                               &m->groups[g]);
    }
    free(pt);
    free(nm);
    /* Stage 3: the optimizer's shards hold the values; the passes gather them (lm__gather). */
    for (int i = 0; st == DT_OK && stage3 && i < m->n; i++) {
        dt_tensor_destroy(m->p[i]);
        m->p[i] = NULL;
    }
    if (st == DT_OK && stage3)
        m->zero = zero;
    return st;
}

int lm_opt_order(const lm *m, int k)
{
    return m->opt[k];
}

dt_status lm_set_lr(const lm *m, dt_zero *zero, float lr)
{
    dt_status st = dt_zero_set_lr(zero, m->groups[0], lr);
    return st == DT_OK ? dt_zero_set_lr(zero, m->groups[1], lr) : st;
}

/* ---- pipeline stages (lm_pipe.c) --------------------------------------------------------- */

struct lm_stage_run {
    dt_tape *tape;
    pass p;
    lm_layouts l;
    dt_tensor *in;  /* the stage's own copy of its input activation (watched as m->n) */
    dt_tensor *out; /* the activation sent on, or the loss */
};

void lm_stage_run_free(lm_stage_run *r)
{
    if (!r)
        return;
    dt_tape_destroy(r->tape);
    pass_free(&r->p);
    dt_tensor_destroy(r->in);
    lm__layouts_free(&r->l);
    free(r);
}

dt_status lm_stage_forward(lm *m, int64_t lo, int64_t hi, const dt_tensor *x, const dt_tensor *h,
                           const dt_tensor *y, lm_stage_run **run_out, dt_tensor **out)
{
    lm__set_error("%s", "");
    lm_stage_run *r = calloc(1, sizeof *r);
    if (!r)
        return DT_ERR_NO_MEMORY;
    const dt_tensor *rows_of = x ? x : h;
    dt_tape_opts to = DT_TAPE_OPTS_INIT;
    dt_status st = lm__layouts(m, dt_tensor_shape(rows_of)[0], &r->l);
    if (st == DT_OK)
        st = dt_tape_create(&to, &r->tape);
    for (int i = 0; st == DT_OK && i < m->n; i++)
        if (m->p[i]) /* a pipeline stage holds its own parameters only */
            st = dt_tape_watch(r->tape, m->p[i], i);
    if (st == DT_OK && h && (st = dt_detach(h, &r->in)) == DT_OK)
        st = dt_tape_watch(r->tape, r->in, m->n);
    if (st == DT_OK)
        st = dt_tape_begin(r->tape);
    if (st == DT_OK) {
        st = forward_range(m, &r->p, &r->l, x, r->in, lo, hi, y != NULL, y, &r->out);
        dt_status end = dt_tape_end(r->tape);
        st = st != DT_OK ? st : end;
    }
    /* The activation handed on: a copy the receiver owns. */
    if (st == DT_OK && !y)
        st = dt_detach(r->out, out);
    if (st != DT_OK) {
        lm_stage_run_free(r);
        return st;
    }
    *run_out = r;
    return DT_OK;
}

const dt_tensor *lm_stage_output(const lm_stage_run *r)
{
    return r->out;
}

dt_status lm_stage_backward(lm *m, lm_stage_run *r, const dt_tensor *dy, float seed,
                            dt_tensor **acc, dt_tensor **dx_out)
{
    dt_status st = dt_tape_backward(r->tape, r->out, dy, seed, NULL);
    for (int i = 0; st == DT_OK && i < m->n; i++) {
        dt_tensor *g = NULL, *sum = NULL;
        if (!m->p[i])
            continue;
        st = dt_tape_take_grad(r->tape, i, &g);
        if (st != DT_OK || !g)
            continue;
        if (!acc[i]) {
            acc[i] = g;
            continue;
        }
        st = dt_add(acc[i], g, NULL, &sum);
        dt_tensor_destroy(g);
        if (st == DT_OK) {
            dt_tensor_destroy(acc[i]);
            acc[i] = sum;
        }
    }
    if (st == DT_OK && dx_out)
        st = r->in ? dt_tape_take_grad(r->tape, m->n, dx_out) : DT_OK;
    return st;
}
