/* llama/lm_forward: the key/value cache laid out on the mesh and the incremental forward pass
 * against it, all libdtensor ops (rotary embeddings dt_rope_half, attention against the cache
 * dt_attention_cached) but the cache's append, a local copy on each device (lm.h). */
#include <stdlib.h>
#include <string.h>

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
    /* [rows, cap, KV, D]: rows as the activations', kv heads as k's. */
    int64_t shape[4] = {rows, cap, cf->kv_heads, cf->head_dim};
    const char *u = DT_UNSHARDED;
    const char *spec[4] = {dt_layout_spec(c->l.kv, 0), u,
                           dt_layout_spec(c->l.kv, 2), u};
    dt_layout *cl = NULL;
    st = dt_layout_create(m->mesh, 4, spec, &cl);
    for (int64_t l = 0; st == DT_OK && l < cf->layers; l++) {
        st = dt_tensor_zeros(cl, DT_DTYPE_F32, shape, &c->k[l]);
        if (st == DT_OK)
            st = dt_tensor_zeros(cl, DT_DTYPE_F32, shape, &c->v[l]);
    }
    dt_layout_destroy(cl);
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

/* Writes n new positions (k, v [rows, n, KV, D] in the cache's layout) into layer l's cache
 * at positions len..len+n-1, device by device: in place on a CPU device, else through a host
 * copy of the component. */
static dt_status cache_append(lm_cache *c, int64_t l, int64_t n, const dt_tensor *k,
                              const dt_tensor *v)
{
    dt_status st = DT_OK;
    for (int which = 0; which < 2 && st == DT_OK; which++) {
        dt_tensor *dst = which ? c->v[l] : c->k[l];
        const dt_tensor *src = which ? v : k;
        for (int i = 0; st == DT_OK && i < dt_tensor_num_local(dst); i++) {
            const DLTensor *dc = dt_tensor_local(dst, i), *ds = dt_tensor_local(src, i);
            int64_t rl = dc->shape[0], w = dc->shape[2] * dc->shape[3];
            size_t nc = (size_t)(rl * c->cap * w), ns = (size_t)(rl * n * w);
            if (nc == 0)
                continue;
            int host = dc->device.device_type == kDLCPU;
            float *cc = host ? (float *)((char *)dc->data + dc->byte_offset) : malloc(nc * 4);
            float *cs = malloc((ns ? ns : 1) * 4);
            st = cc && cs ? DT_OK : DT_ERR_NO_MEMORY;
            if (st == DT_OK && ds->shape[2] * ds->shape[3] != w)
                st = DT_ERR_STATE; /* not in the cache's layout */
            if (st == DT_OK)
                st = dt_tensor_local_read(src, i, cs, ns * 4);
            if (st == DT_OK && !host)
                st = dt_tensor_local_read(dst, i, cc, nc * 4);
            for (int64_t r = 0; st == DT_OK && r < rl; r++)
                memcpy(cc + (r * c->cap + c->len) * w, cs + r * n * w, (size_t)(n * w) * 4);
            if (st == DT_OK && !host)
                st = dt_tensor_local_write(dst, i, cc, nc * 4);
            if (!host)
                free(cc);
            free(cs);
        }
    }
    return st;
}

/* Layer l's attention core: q [rows, n, H*D], k, v [rows, n, KV*D] viewed per head, rotary
 * embeddings on q and k at positions len.. (Llama: dt_rope_half), k and v appended to the
 * cache, then q (its heads grouped under their kv heads) against the cache
 * (dt_attention_cached), into y [rows, n, H*D]. */
static dt_status attend(const lm *m, lm_cache *c, keep_list *kl, int64_t l, int64_t n,
                        const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                        dt_tensor **y_out)
{
    const dt_hf_config *cf = &m->cfg;
    int64_t rows = c->rows, D = cf->head_dim, KV = cf->kv_heads, G = cf->heads / KV;
    int64_t sq[4] = {rows, n, KV * G, D}, sq5[5] = {rows, n, KV, G, D};
    int64_t skv[4] = {rows, n, KV, D}, sy[3] = {rows, n, KV * G * D};
    dt_tensor *q4 = NULL, *q5 = NULL, *k4 = NULL, *v4 = NULL, *kc = NULL, *vc = NULL;
    dt_tensor *y5 = NULL, *y = NULL;
    dt_status st;
    if ((st = keep(kl, dt_reshape(q, 4, sq, &q4), &q4)) != DT_OK ||
        (st = keep(kl, dt_reshape(k, 4, skv, &k4), &k4)) != DT_OK ||
        (st = keep(kl, dt_reshape(v, 4, skv, &v4), &v4)) != DT_OK)
        return st;
    if (cf->arch == DT_HF_LLAMA) {
        dt_rope_opts ro;
        lm__rope_opts(m, &ro);
        dt_tensor *qr = NULL, *kr = NULL;
        if ((st = keep(kl, dt_rope_half(q4, c->len, &ro, &qr), &qr)) != DT_OK ||
            (st = keep(kl, dt_rope_half(k4, c->len, &ro, &kr), &kr)) != DT_OK)
            return st;
        q4 = qr;
        k4 = kr;
    }
    if ((st = keep(kl, dt_reshape(q4, 5, sq5, &q5), &q5)) != DT_OK)
        return st;
    const dt_layout *cl = dt_tensor_layout(c->k[l]);
    if ((st = keep(kl, dt_relayout(k4, cl, &kc), &kc)) != DT_OK ||
        (st = keep(kl, dt_relayout(v4, cl, &vc), &vc)) != DT_OK ||
        (st = cache_append(c, l, n, kc, vc)) != DT_OK ||
        (st = keep(kl, dt_attention_cached(q5, c->k[l], c->v[l], c->len, &y5), &y5)) != DT_OK ||
        (st = keep(kl, dt_reshape(y5, 3, sy, &y), &y)) != DT_OK)
        return st;
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
        (st = attend(m, c, &k, l, n, q, kk, v, &y)) != DT_OK ||
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
