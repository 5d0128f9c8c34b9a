/* gpt2/model: GPT-2's parameters (named as docs/foreign.md maps them), its random init, and
 * its forward pass recorded on the tape, whose backward gives the gradients. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../train/rng.h"

#define EPS 1e-5f
#define PER_LAYER 16
enum { LN1G, LN1B, QW, QB, KW, KB, VW, VB, OW, OB, LN2G, LN2B, FCW, FCB, PROJW, PROJB };
static const char *const layer_names[PER_LAYER] = {
    "ln1.g", "ln1.b", "q.w", "q.b", "k.w", "k.b", "v.w", "v.b",
    "o.w",   "o.b",   "ln2.g", "ln2.b", "fc.w", "fc.b", "proj.w", "proj.b"};

struct gpt2 {
    const dt_mesh *mesh;
    gpt2_config cfg;
    dt_dtype dtype;
    int n;
    dt_tensor **p;
    char **names;
    dt_layout *l_act, *l_ids;
};

int gpt2_num_params(const gpt2 *m) { return m->n; }
dt_tensor *const *gpt2_params(const gpt2 *m) { return m->p; }
const char *const *gpt2_param_names(const gpt2 *m) { return (const char *const *)m->names; }
int gpt2_param_decays(const gpt2 *m, int i) { return dt_tensor_rank(m->p[i]) == 2; }

int64_t gpt2_param_count(const gpt2 *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->n; i++)
        n += dt_tensor_numel(m->p[i]);
    return n;
}

static int slot(int l, int w) { return 2 + PER_LAYER * l + w; }

void gpt2_destroy(gpt2 *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n; i++) {
        dt_tensor_destroy(m->p ? m->p[i] : NULL);
        free(m->names ? m->names[i] : NULL);
    }
    free(m->p);
    free(m->names);
    dt_layout_destroy(m->l_act);
    dt_layout_destroy(m->l_ids);
    free(m);
}

/* A layout with dim 0 on `batch` (when sharded) and the rest unsharded. */
static dt_status layout_of(const dt_mesh *mesh, int rank, int sharded, dt_layout **out)
{
    const char *specs[3] = {sharded ? "batch" : DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED};
    return dt_layout_create(mesh, rank, specs, out);
}

dt_status gpt2_create(const dt_mesh *mesh, const gpt2_config *cfg, dt_dtype dtype, gpt2 **out)
{
    gpt2 *m = calloc(1, sizeof *m);
    if (!m)
        return DT_ERR_NO_MEMORY;
    m->mesh = mesh;
    m->cfg = *cfg;
    m->dtype = dtype;
    int L = (int)cfg->layers;
    int64_t C = cfg->width;
    m->n = 2 + PER_LAYER * L + 2;
    m->p = calloc((size_t)m->n, sizeof *m->p);
    m->names = calloc((size_t)m->n, sizeof *m->names);
    dt_status st = m->p && m->names ? DT_OK : DT_ERR_NO_MEMORY;
    if (st == DT_OK)
        st = layout_of(mesh, 3, 1, &m->l_act);
    if (st == DT_OK)
        st = layout_of(mesh, 2, 1, &m->l_ids);
    for (int i = 0; st == DT_OK && i < m->n; i++) {
        char name[64];
        int64_t shape[2] = {C, 0};
        int rank = 1;
        if (i == 0 || i == 1) {
            snprintf(name, sizeof name, "%s", i == 0 ? "wte" : "wpe");
            shape[0] = i == 0 ? cfg->vocab : cfg->context;
            shape[1] = C;
            rank = 2;
        } else if (i >= m->n - 2) {
            snprintf(name, sizeof name, "lnf.%s", i == m->n - 2 ? "g" : "b");
        } else {
            int l = (i - 2) / PER_LAYER, w = (i - 2) % PER_LAYER;
            snprintf(name, sizeof name, "h.%d.%s", l, layer_names[w]);
            if (w == QW || w == KW || w == VW || w == OW) {
                rank = 2;
                shape[1] = C;
            } else if (w == FCW) {
                rank = 2;
                shape[1] = 4 * C;
            } else if (w == PROJW) {
                rank = 2;
                shape[0] = 4 * C;
                shape[1] = C;
            } else if (w == FCB) {
                shape[0] = 4 * C;
            }
        }
        m->names[i] = strdup(name);
        dt_layout *l = NULL;
        st = m->names[i] ? layout_of(mesh, rank, 0, &l) : DT_ERR_NO_MEMORY;
        if (st == DT_OK)
            st = dt_tensor_zeros(l, dtype, shape, &m->p[i]);
        dt_layout_destroy(l);
    }
    if (st != DT_OK) {
        gpt2_destroy(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

/* Writes the host f32 value of a replicated tensor into every local component. */
static dt_status write_replicated(dt_tensor *t, const float *x, int64_t n)
{
    dt_dtype dt = dt_tensor_dtype(t);
    size_t bytes = (size_t)n * dt_dtype_size(dt);
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf)
        return DT_ERR_NO_MEMORY;
    dt_status st = dt_kernel_cast(n, x, DT_DTYPE_F32, buf, dt);
    int nl = dt_mesh_num_local_devices(dt_layout_mesh(dt_tensor_layout(t)));
    for (int k = 0; st == DT_OK && k < nl; k++)
        st = dt_tensor_local_write(t, k, buf, bytes);
    free(buf);
    return st;
}

dt_status gpt2_init_random(gpt2 *m, uint64_t seed)
{
    rng r;
    rng_seed(&r, seed);
    dt_status st = DT_OK;
    double proj_std = 0.02 / sqrt(2.0 * (double)m->cfg.layers);
    for (int i = 0; st == DT_OK && i < m->n; i++) {
        int64_t n = dt_tensor_numel(m->p[i]);
        float *x = malloc((size_t)n * sizeof *x);
        if (!x)
            return DT_ERR_NO_MEMORY;
        int w = i >= 2 && i < m->n - 2 ? (i - 2) % PER_LAYER : -1;
        const char *nm = m->names[i];
        int norm_gain = w == LN1G || w == LN2G || i == m->n - 2;
        int bias = dt_tensor_rank(m->p[i]) == 1 && !norm_gain;
        double std = (w == OW || w == PROJW) ? proj_std : 0.02;
        for (int64_t j = 0; j < n; j++)
            x[j] = norm_gain ? 1.0f : bias ? 0.0f : (float)(rng_normal(&r) * std);
        (void)nm;
        st = write_replicated(m->p[i], x, n);
        free(x);
    }
    return st;
}

/* Tensors made by one pass, freed together after its backward. */
typedef struct pass {
    dt_tensor **t;
    int n, cap;
} pass;

/* Keeps *t, the output of the call whose status is st, for pass_free: called as
 * keep(p, op(..., &t), &t). It takes t's address, not its value: C leaves the order in which
 * a call's arguments are evaluated unspecified, so keep(p, op(..., &t), t) may read t before
 * op has written it (GCC does: every output was kept as NULL and leaked). On failure *t is
 * destroyed and NULL. */
static dt_status keep(pass *p, dt_status st, dt_tensor **t)
{
    if (st != DT_OK)
        return st;
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        dt_tensor **g = realloc(p->t, (size_t)cap * sizeof *g);
        if (!g) {
            dt_tensor_destroy(*t);
            *t = NULL;
            return DT_ERR_NO_MEMORY;
        }
        p->t = g;
        p->cap = cap;
    }
    p->t[p->n++] = *t;
    return DT_OK;
}

static void pass_free(pass *p)
{
    for (int i = 0; i < p->n; i++)
        dt_tensor_destroy(p->t[i]);
    free(p->t);
}

/* Parameter i as f32 (a recorded cast for bf16 parameters). */
static dt_status f32(const gpt2 *m, pass *p, int i, const dt_tensor **out)
{
    if (m->dtype == DT_DTYPE_F32) {
        *out = m->p[i];
        return DT_OK;
    }
    dt_tensor *c = NULL;
    dt_status st = keep(p, dt_cast(m->p[i], DT_DTYPE_F32, &c), &c);
    *out = c;
    return st;
}

/* Position ids 0..T-1 on every row of a [B, T] batch, sharded as the inputs. */
static dt_status positions(const gpt2 *m, const dt_tensor *x, dt_tensor **out)
{
    const int64_t *shape = dt_tensor_shape(x);
    dt_tensor *t = NULL;
    dt_status st = dt_tensor_zeros(m->l_ids, DT_DTYPE_I32, shape, &t);
    int nl = dt_mesh_num_local_devices(m->mesh);
    for (int k = 0; st == DT_OK && k < nl; k++) {
        int64_t pos = dt_mesh_position(m->mesh, dt_mesh_local_device_id(m->mesh, k));
        int64_t off[2], sz[2];
        st = dt_layout_shard(m->l_ids, shape, pos, off, sz);
        size_t cnt = (size_t)(sz[0] * sz[1]);
        int32_t *ids = malloc((cnt ? cnt : 1) * sizeof *ids);
        if (st == DT_OK && !ids)
            st = DT_ERR_NO_MEMORY;
        for (size_t j = 0; st == DT_OK && j < cnt; j++)
            ids[j] = (int32_t)(j % (size_t)shape[1]);
        if (st == DT_OK && cnt)
            st = dt_tensor_local_write(t, k, ids, cnt * sizeof *ids);
        free(ids);
    }
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

/* y = x @ W + b (out_layout as dt_matmul_nd's). */
static dt_status linear(const gpt2 *m, pass *p, const dt_tensor *x, int w, int b,
                        const dt_layout *out_layout, dt_tensor **out)
{
    dt_tensor *y = NULL, *z = NULL;
    const dt_tensor *bias = NULL;
    dt_status st = keep(p, dt_matmul_nd(x, m->p[w], 0, 0, out_layout, &y), &y);
    if (st == DT_OK)
        st = f32(m, p, b, &bias);
    if (st == DT_OK)
        st = keep(p, dt_bias_add(y, bias, &z), &z);
    *out = z;
    return st;
}

static dt_status layer_norm(const gpt2 *m, pass *p, const dt_tensor *x, int g, int b,
                            dt_tensor **out)
{
    const dt_tensor *tg = NULL, *tb = NULL;
    dt_status st = f32(m, p, g, &tg);
    if (st == DT_OK)
        st = f32(m, p, b, &tb);
    dt_tensor *y = NULL;
    if (st == DT_OK)
        st = keep(p, dt_layer_norm(x, tg, tb, EPS, &y), &y);
    *out = y;
    return st;
}

/* The forward pass: the loss (owned by p). */
static dt_status forward(const gpt2 *m, pass *p, const dt_tensor *x, const dt_tensor *y,
                         dt_tensor **loss_out)
{
    const dt_tensor *wte = NULL, *wpe = NULL;
    dt_tensor *pos = NULL, *te = NULL, *pe = NULL, *h = NULL;
    dt_status st = f32(m, p, 0, &wte);
    if (st == DT_OK)
        st = f32(m, p, 1, &wpe);
    if (st == DT_OK)
        st = keep(p, positions(m, x, &pos), &pos);
    if (st == DT_OK)
        st = keep(p, dt_embedding(wte, x, m->l_act, &te), &te);
    if (st == DT_OK)
        st = keep(p, dt_embedding(wpe, pos, m->l_act, &pe), &pe);
    if (st == DT_OK)
        st = keep(p, dt_add(te, pe, m->l_act, &h), &h);
    for (int l = 0; st == DT_OK && l < (int)m->cfg.layers; l++) {
        dt_tensor *a, *q, *k, *v, *att = NULL, *o, *h1 = NULL, *b, *fc, *g = NULL, *pr;
        dt_tensor *h2 = NULL;
        if ((st = layer_norm(m, p, h, slot(l, LN1G), slot(l, LN1B), &a)) != DT_OK ||
            (st = linear(m, p, a, slot(l, QW), slot(l, QB), NULL, &q)) != DT_OK ||
            (st = linear(m, p, a, slot(l, KW), slot(l, KB), NULL, &k)) != DT_OK ||
            (st = linear(m, p, a, slot(l, VW), slot(l, VB), NULL, &v)) != DT_OK ||
            (st = keep(p, dt_attention(q, k, v, m->cfg.heads, 1, &att), &att)) != DT_OK ||
            (st = linear(m, p, att, slot(l, OW), slot(l, OB), m->l_act, &o)) != DT_OK ||
            (st = keep(p, dt_add(h, o, m->l_act, &h1), &h1)) != DT_OK ||
            (st = layer_norm(m, p, h1, slot(l, LN2G), slot(l, LN2B), &b)) != DT_OK ||
            (st = linear(m, p, b, slot(l, FCW), slot(l, FCB), NULL, &fc)) != DT_OK ||
            (st = keep(p, dt_gelu(fc, &g), &g)) != DT_OK ||
            (st = linear(m, p, g, slot(l, PROJW), slot(l, PROJB), m->l_act, &pr)) != DT_OK ||
            (st = keep(p, dt_add(h1, pr, m->l_act, &h2), &h2)) != DT_OK)
            break;
        h = h2;
    }
    dt_tensor *f = NULL, *logits = NULL, *loss = NULL;
    if (st == DT_OK)
        st = layer_norm(m, p, h, m->n - 2, m->n - 1, &f);
    /* The head tied to the token embedding: logits = f @ wte^T. */
    if (st == DT_OK)
        st = keep(p, dt_matmul_nd(f, wte, 0, 1, NULL, &logits), &logits);
    if (st == DT_OK)
        st = keep(p, dt_vocab_xent(logits, y, NULL, &loss), &loss);
    *loss_out = loss;
    return st;
}

dt_status gpt2_grads(gpt2 *m, dt_tape *tape, const dt_tensor *x, const dt_tensor *y,
                     float loss_scale, double *loss_out, dt_tensor **grads_out)
{
    pass p = {NULL, 0, 0};
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < m->n; i++)
        st = dt_tape_watch(tape, m->p[i], i);
    if (st == DT_OK)
        st = dt_tape_begin(tape);
    if (st != DT_OK)
        return st;
    dt_tensor *loss = NULL;
    st = forward(m, &p, x, y, &loss);
    dt_status end = dt_tape_end(tape);
    if (st == DT_OK)
        st = end;
    if (st == DT_OK)
        st = dt_item(loss, loss_out);
    if (st == DT_OK)
        st = dt_tape_backward(tape, loss, NULL, loss_scale, NULL);
    for (int i = 0; st == DT_OK && i < m->n; i++) {
        st = dt_tape_take_grad(tape, i, &grads_out[i]);
        if (st == DT_OK && !grads_out[i])
            st = DT_ERR_STATE;
    }
    /* The recording is spent (gradients taken): drop it and what it still holds. */
    dt_tape_reset(tape);
    pass_free(&p);
    return st;
}
