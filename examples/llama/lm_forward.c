/* llama/lm_forward: the key/value cache laid out on the mesh and the incremental forward pass
 * against it: libdtensor's ops for the projections, norms, MLP and head, kv_attend.c's local
 * rotary embeddings and attention on each device's heads (lm.h). */
#include <stdlib.h>
#include <string.h>

#include "kv_attend.h"
#include "lm_impl.h"

/* ---- the cache ----------------------------------------------------------------------------- */

void lm_cache_destroy(lm_cache *c)
{
    if (!c)
        return;
    for (int64_t l = 0; l < c->m->cfg.layers; l++) {
        if (c->k)
            dt_tensor_destroy(c->k[l]);
        if (c->v)
            dt_tensor_destroy(c->v[l]);
    }
    free(c->k);
    free(c->v);
    lm__layouts_free(&c->l);
    free(c);
}

int64_t lm_cache_length(const lm_cache *c)
{
    return c->len;
}
void lm_cache_reset(lm_cache *c)
{
    c->len = 0;
}

dt_status lm_cache_create(const lm *m, int64_t rows, int64_t cap, lm_cache **out)
{
    lm__set_error("%s", "");
    const dt_hf_config *cf = &m->cfg;
    if (rows < 1 || cap < 1 || (cf->arch == DT_HF_GPT2 && cap > cf->max_positions)) {
        lm__set_error("lm_cache_create: %lld rows and %lld positions (GPT-2: at most %lld)",
                      (long long)rows, (long long)cap, (long long)cf->max_positions);
        return DT_ERR_INVALID_ARGUMENT;
    }
    lm_cache *c = calloc(1, sizeof *c);
    if (!c)
        return DT_ERR_NO_MEMORY;
    c->m = m;
    c->rows = rows;
    c->cap = cap;
    c->k = calloc((size_t)cf->layers, sizeof *c->k);
    c->v = calloc((size_t)cf->layers, sizeof *c->v);
    dt_status st = c->k && c->v ? DT_OK : DT_ERR_NO_MEMORY;
    if (st == DT_OK)
        st = lm__layouts(m, rows, &c->l);
    if (st != DT_OK) {
        lm_cache_destroy(c);
        return st;
    }
    int64_t shape[3] = {rows, cap, cf->kv_heads * cf->head_dim};
    for (int64_t l = 0; st == DT_OK && l < cf->layers; l++) {
        st = dt_tensor_zeros(c->l.kv, DT_DTYPE_F32, shape, &c->k[l]);
        if (st == DT_OK)
            st = dt_tensor_zeros(c->l.kv, DT_DTYPE_F32, shape, &c->v[l]);
    }
    if (st != DT_OK) {
        lm_cache_destroy(c);
        return st;
    }
    *out = c;
    return DT_OK;
}

/* ---- the forward pass ---------------------------------------------------------------------- */

/* The tensors one forward pass makes, destroyed together. */
#define KEEP_MAX (MAX_LAYERS + 32)
typedef struct keep_list {
    dt_tensor *t[KEEP_MAX];
    int n;
} keep_list;

static dt_status keep(keep_list *k, dt_status st, dt_tensor **tp)
{
    /* The tensor is read here, after the call that made it (argument order is unspecified). */
    dt_tensor *t = st == DT_OK ? *tp : NULL;
    if (st != DT_OK)
        return st;
    if (k->n == KEEP_MAX) {
        dt_tensor_destroy(t);
        lm__set_error("lm_forward: too many tensors in one step");
        return DT_ERR_STATE;
    }
    k->t[k->n++] = t;
    return DT_OK;
}

static void keep_free(keep_list *k)
{
    for (int i = 0; i < k->n; i++)
        dt_tensor_destroy(k->t[i]);
    k->n = 0;
}

/* y = x @ w (+ b), in `layout` (NULL: the natural one). */
static dt_status linear(keep_list *k, const dt_tensor *x, const dt_tensor *w, const dt_tensor *b,
                        const dt_layout *layout, dt_tensor **out)
{
    dt_tensor *y = NULL, *z = NULL;
    dt_status st = keep(k, dt_matmul_nd(x, w, 0, 0, layout, &y), &y);
    if (st == DT_OK && b) {
        st = keep(k, dt_bias_add(y, b, &z), &z);
        y = z;
    }
    *out = y;
    return st;
}

static dt_status norm(const lm *m, keep_list *k, const dt_tensor *x, const dt_tensor *g,
                      const dt_tensor *b, dt_tensor **out)
{
    dt_tensor *y = NULL;
    float eps = (float)m->cfg.norm_eps;
    dt_status st =
        m->cfg.arch == DT_HF_GPT2 ? dt_layer_norm(x, g, b, eps, &y) : dt_rms_norm(x, g, eps, &y);
    st = keep(k, st, &y);
    *out = y;
    return st;
}

/* A component's element count. */
static int64_t comp_numel(const DLTensor *d)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++)
        n *= d->shape[i];
    return n;
}

/* Layer l's attention core on every local device: rotary embeddings on q and k (Llama), k and
 * v written into the cache at positions len..len+n-1, then q against the cache, into y (a
 * tensor of q's layout). */
static dt_status attend_local(const lm *m, lm_cache *c, int64_t l, int64_t n, dt_tensor *q,
                              dt_tensor *k, dt_tensor *v, dt_tensor **y_out)
{
    const dt_hf_config *cf = &m->cfg;
    int64_t D = cf->head_dim, group = cf->heads / cf->kv_heads;
    dt_tensor *y = NULL;
    dt_status st = dt_tensor_zeros(dt_tensor_layout(q), DT_DTYPE_F32, dt_tensor_shape(q), &y);
    int nl = dt_tensor_num_local(q);
    for (int i = 0; st == DT_OK && i < nl; i++) {
        const DLTensor *dq = dt_tensor_local(q, i), *dk = dt_tensor_local(k, i);
        const DLTensor *dc = dt_tensor_local(c->k[l], i);
        int64_t rl = dq->shape[0], wq = dq->shape[2], wk = dk->shape[2];
        int64_t q0 = dt_tensor_local_offset(q, i)[2] / D;
        int64_t k0 = dt_tensor_local_offset(k, i)[2] / D;
        int64_t nq = comp_numel(dq), nk = comp_numel(dk), nc = comp_numel(dc);
        if (rl == 0 || wq == 0)
            continue;
        float *bq = malloc((size_t)nq * 4), *bk = malloc((size_t)nk * 4);
        float *bv = malloc((size_t)nk * 4), *by = malloc((size_t)nq * 4);
        /* The cache in host memory: the component itself on a CPU device, else a copy. */
        int host = dc->device.device_type == kDLCPU;
        float *ck = host ? (float *)((char *)dc->data + dc->byte_offset) : malloc((size_t)nc * 4);
        const DLTensor *dcv = dt_tensor_local(c->v[l], i);
        float *cv = host ? (float *)((char *)dcv->data + dcv->byte_offset) : malloc((size_t)nc * 4);
        if (!bq || !bk || !bv || !by || !ck || !cv)
            st = DT_ERR_NO_MEMORY;
        if (st == DT_OK)
            st = dt_tensor_local_read(q, i, bq, (size_t)nq * 4);
        if (st == DT_OK)
            st = dt_tensor_local_read(k, i, bk, (size_t)nk * 4);
        if (st == DT_OK)
            st = dt_tensor_local_read(v, i, bv, (size_t)nk * 4);
        if (st == DT_OK && !host)
            st = dt_tensor_local_read(c->k[l], i, ck, (size_t)nc * 4);
        if (st == DT_OK && !host)
            st = dt_tensor_local_read(c->v[l], i, cv, (size_t)nc * 4);
        if (st == DT_OK) {
            if (cf->arch == DT_HF_LLAMA) {
                kv_rope(rl, n, wq / D, D, c->len, m->inv_freq, bq);
                kv_rope(rl, n, wk / D, D, c->len, m->inv_freq, bk);
            }
            for (int64_t r = 0; r < rl; r++)
                for (int64_t t = 0; t < n; t++) {
                    size_t at = (size_t)((r * c->cap + c->len + t) * wk);
                    memcpy(ck + at, bk + (r * n + t) * wk, (size_t)wk * 4);
                    memcpy(cv + at, bv + (r * n + t) * wk, (size_t)wk * 4);
                }
            if (kv_attend(rl, n, c->len, c->cap, wq / D, q0, wk / D, k0, group, D, bq, ck, cv,
                          by) != 0) {
                lm__set_error("lm_forward: a device's query heads need key/value heads it lacks");
                st = DT_ERR_STATE;
            }
        }
        if (st == DT_OK && !host)
            st = dt_tensor_local_write(c->k[l], i, ck, (size_t)nc * 4);
        if (st == DT_OK && !host)
            st = dt_tensor_local_write(c->v[l], i, cv, (size_t)nc * 4);
        if (st == DT_OK)
            st = dt_tensor_local_write(y, i, by, (size_t)nq * 4);
        if (!host) {
            free(ck);
            free(cv);
        }
        free(bq);
        free(bk);
        free(bv);
        free(by);
    }
    if (st != DT_OK) {
        dt_tensor_destroy(y);
        return st;
    }
    *y_out = y;
    return DT_OK;
}

static dt_status block(const lm *m, lm_cache *c, int64_t l, int64_t n, dt_tensor *x,
                       dt_tensor **out)
{
    const layer *w = &m->ly[l];
    keep_list k = {.n = 0};
    dt_tensor *a, *q, *kk, *v, *y = NULL, *o, *x1 = NULL, *b, *h = NULL, *mo;
    dt_tensor *x2 = NULL;
    int gpt2 = m->cfg.arch == DT_HF_GPT2;
    dt_status st;
    if ((st = norm(m, &k, x, w->n1g, w->n1b, &a)) != DT_OK ||
        (st = linear(&k, a, w->qw, w->qb, c->l.q, &q)) != DT_OK ||
        (st = linear(&k, a, w->kw, w->kb, c->l.kv, &kk)) != DT_OK ||
        (st = linear(&k, a, w->vw, w->vb, c->l.kv, &v)) != DT_OK ||
        (st = keep(&k, attend_local(m, c, l, n, q, kk, v, &y), &y)) != DT_OK ||
        (st = linear(&k, y, w->ow, w->ob, c->l.act, &o)) != DT_OK ||
        (st = keep(&k, dt_add(x, o, c->l.act, &x1), &x1)) != DT_OK ||
        (st = norm(m, &k, x1, w->n2g, w->n2b, &b)) != DT_OK)
        goto out;
    if (gpt2) {
        dt_tensor *f;
        if ((st = linear(&k, b, w->w1, w->b1, NULL, &f)) != DT_OK ||
            (st = keep(&k, dt_gelu(f, &h), &h)) != DT_OK)
            goto out;
    } else {
        dt_tensor *g, *u;
        if ((st = linear(&k, b, w->w1, NULL, NULL, &g)) != DT_OK ||
            (st = linear(&k, b, w->w3, NULL, NULL, &u)) != DT_OK ||
            (st = keep(&k, dt_swiglu(g, u, &h), &h)) != DT_OK)
            goto out;
    }
    if ((st = linear(&k, h, w->w2, w->b2, c->l.act, &mo)) != DT_OK)
        goto out;
    st = dt_add(x1, mo, c->l.act, &x2);
out:
    keep_free(&k);
    if (st == DT_OK)
        *out = x2;
    return st;
}

dt_status lm_forward(lm *m, lm_cache *c, int64_t n, const int32_t *ids, int all, float *logits)
{
    lm__set_error("%s", "");
    const dt_hf_config *cf = &m->cfg;
    int64_t rows = c->rows, V = cf->vocab;
    if (n < 1 || c->len + n > c->cap) {
        lm__set_error("lm_forward: %lld new positions after %lld exceed the cache's %lld",
                      (long long)n, (long long)c->len, (long long)c->cap);
        return DT_ERR_SHAPE;
    }
    keep_list k = {.n = 0};
    int64_t shape[2] = {rows, n};
    dt_status g = lm__gather(m);
    if (g != DT_OK)
        return g;
    dt_tensor *tid = NULL, *x = NULL, *f = NULL, *lg = NULL, *rep = NULL;
    dt_status st = keep(&k, lm__from_host(c->l.ids, DT_DTYPE_I32, shape, ids, &tid), &tid);
    if (st == DT_OK)
        st = keep(&k, dt_embedding(m->embed, tid, c->l.act, &x), &x);
    if (st == DT_OK && m->pos) {
        int32_t *pos = malloc((size_t)(rows * n) * sizeof *pos);
        dt_tensor *tp = NULL, *pe = NULL, *x2 = NULL;
        if (!pos)
            st = DT_ERR_NO_MEMORY;
        for (int64_t i = 0; st == DT_OK && i < rows * n; i++)
            pos[i] = (int32_t)(c->len + i % n);
        if (st == DT_OK)
            st = keep(&k, lm__from_host(c->l.ids, DT_DTYPE_I32, shape, pos, &tp), &tp);
        free(pos);
        if (st == DT_OK)
            st = keep(&k, dt_embedding(m->pos, tp, c->l.act, &pe), &pe);
        if (st == DT_OK)
            st = keep(&k, dt_add(x, pe, c->l.act, &x2), &x2);
        x = x2;
    }
    for (int64_t l = 0; st == DT_OK && l < cf->layers; l++) {
        dt_tensor *x2 = NULL;
        st = keep(&k, block(m, c, l, n, x, &x2), &x2);
        x = x2;
    }
    /* Only the last position's logits wanted: its activation alone goes through the final
     * norm and the head (the head is a fifth of a small model's prefill). */
    int64_t nl = all ? n : 1;
    if (st == DT_OK && nl < n) {
        int64_t C = cf->hidden, shape1[3] = {rows, 1, C};
        float *h = malloc((size_t)(rows * n * C) * sizeof *h);
        dt_tensor *xr = NULL, *x1 = NULL;
        st = h ? keep(&k, dt_relayout(x, c->l.rep3, &xr), &xr) : DT_ERR_NO_MEMORY;
        if (st == DT_OK)
            st = dt_tensor_local_read(xr, 0, h, (size_t)(rows * n * C) * sizeof *h);
        for (int64_t r = 0; st == DT_OK && r < rows; r++)
            memmove(h + r * C, h + (r * n + n - 1) * C, (size_t)C * sizeof *h);
        if (st == DT_OK)
            st = keep(&k, lm__from_host(c->l.act, DT_DTYPE_F32, shape1, h, &x1), &x1);
        free(h);
        x = x1;
    }
    if (st == DT_OK)
        st = norm(m, &k, x, m->nfg, m->nfb, &f);
    if (st == DT_OK)
        st = keep(&k, dt_matmul_nd(f, m->head, 0, 1, NULL, &lg), &lg);
    if (st == DT_OK)
        st = keep(&k, dt_relayout(lg, c->l.rep3, &rep), &rep);
    if (st == DT_OK)
        st = dt_tensor_local_read(rep, 0, logits, (size_t)(rows * nl * V) * sizeof *logits);
    keep_free(&k);
    dt_status r = lm__release(m);
    st = st != DT_OK ? st : r;
    if (st == DT_OK)
        c->len += n;
    return st;
}
