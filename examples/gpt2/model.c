/* gpt2/model: GPT-2's parameters (named as docs/foreign.md maps them) in their
 * tensor-parallel layouts, its random init, its optimizer groups (ZeRO stage 3 gathers them
 * per unit), and its forward pass recorded on the tape, whose backward gives the gradients. */
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
    /* gpt2_attach: the optimizer's order (opt[k]: the parameter at position k) and its
     * inverse; in stage 3 the optimizer that holds the parameters. */
    int *opt, *pos;
    int ngroups;
    dt_zero *zero;
    int64_t count;
};

static _Thread_local char own_error[200];

const char *gpt2_last_error(void)
{
    return own_error[0] ? own_error : dt_last_error();
}

const gpt2_config *gpt2_cfg(const gpt2 *m) { return &m->cfg; }
int gpt2_num_params(const gpt2 *m) { return m->n; }
dt_tensor *const *gpt2_params(const gpt2 *m) { return m->p; }
const char *const *gpt2_param_names(const gpt2 *m) { return (const char *const *)m->names; }
int gpt2_param_decays(const gpt2 *m, int i)
{
    int w = i >= 2 && i < m->n - 2 ? (i - 2) % PER_LAYER : -1;
    return i < 2 || w == QW || w == KW || w == VW || w == OW || w == FCW || w == PROJW;
}

int64_t gpt2_param_count(const gpt2 *m)
{
    if (m->zero)
        return m->count;
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
    free(m->opt);
    free(m->pos);
    dt_layout_destroy(m->l_act);
    dt_layout_destroy(m->l_ids);
    free(m);
}

/* The tensor-parallel layout of parameter i (tp: "model", or unsharded without a model dim):
 * the vocabulary of wte, the output columns of q, k, v and fc and their biases, the input rows
 * of the attention output and proj; the rest (wpe, norms, o.b, proj.b) replicated. */
static void param_specs(const gpt2 *m, int i, const char *tp, const char **specs)
{
    int w = i >= 2 && i < m->n - 2 ? (i - 2) % PER_LAYER : -1;
    specs[0] = specs[1] = DT_UNSHARDED;
    if (i == 0 || w == OW || w == PROJW || w == QB || w == KB || w == VB || w == FCB)
        specs[0] = tp;
    else if (w == QW || w == KW || w == VW || w == FCW)
        specs[1] = tp;
}

dt_status gpt2_create(const dt_mesh *mesh, const gpt2_config *cfg, dt_dtype dtype, gpt2 **out)
{
    own_error[0] = '\0';
    int md = dt_mesh_dim_index(mesh, "model");
    int64_t tps = md >= 0 ? dt_mesh_dim_size(mesh, md) : 1;
    if (cfg->layers < 1 || cfg->width < 1 || cfg->heads < 1 || cfg->vocab < 1 ||
        cfg->context < 1 || cfg->width % cfg->heads != 0) {
        snprintf(own_error, sizeof own_error,
                 "gpt2: %lld layers, width %lld, %lld heads, vocabulary %lld, context %lld: "
                 "all must be positive and the heads must divide the width",
                 (long long)cfg->layers, (long long)cfg->width, (long long)cfg->heads,
                 (long long)cfg->vocab, (long long)cfg->context);
        return DT_ERR_INVALID_ARGUMENT;
    }
    if (cfg->heads % tps != 0) {
        snprintf(own_error, sizeof own_error,
                 "gpt2: tensor parallel over model=%lld needs it to divide the %lld heads "
                 "(whole heads per device)", (long long)tps, (long long)cfg->heads);
        return DT_ERR_INVALID_ARGUMENT;
    }
    const char *tp = md >= 0 ? "model" : DT_UNSHARDED;
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
    const char *s_act[3] = {"batch", DT_UNSHARDED, DT_UNSHARDED};
    if (st == DT_OK)
        st = dt_layout_create(mesh, 3, s_act, &m->l_act);
    if (st == DT_OK)
        st = dt_layout_create(mesh, 2, s_act, &m->l_ids);
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
        const char *specs[2];
        param_specs(m, i, tp, specs);
        dt_layout *l = NULL;
        st = m->names[i] ? dt_layout_create(mesh, rank, specs, &l) : DT_ERR_NO_MEMORY;
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

/* Writes each local device's box of the global host f32 array x (t's global shape, rank 1 or
 * 2) into t, converted to t's dtype. */
static dt_status write_global(dt_tensor *t, const float *x)
{
    int rank = dt_tensor_rank(t);
    int64_t cols = rank == 2 ? dt_tensor_shape(t)[1] : 1;
    dt_dtype dt = dt_tensor_dtype(t);
    dt_status st = DT_OK;
    for (int k = 0; st == DT_OK && k < dt_tensor_num_local(t); k++) {
        const DLTensor *c = dt_tensor_local(t, k);
        const int64_t *off = dt_tensor_local_offset(t, k);
        int64_t rows = c->shape[0], lc = rank == 2 ? c->shape[1] : 1;
        int64_t r0 = off[0], c0 = rank == 2 ? off[1] : 0, n = rows * lc;
        float *box = malloc((size_t)(n ? n : 1) * sizeof *box);
        void *buf = malloc((size_t)(n ? n : 1) * dt_dtype_size(dt));
        if (!box || !buf)
            st = DT_ERR_NO_MEMORY;
        for (int64_t r = 0; st == DT_OK && r < rows; r++)
            memcpy(box + r * lc, x + (r0 + r) * cols + c0, (size_t)lc * sizeof *box);
        if (st == DT_OK)
            st = dt_kernel_cast(n, box, DT_DTYPE_F32, buf, dt);
        if (st == DT_OK)
            st = dt_tensor_local_write(t, k, buf, (size_t)n * dt_dtype_size(dt));
        free(box);
        free(buf);
    }
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
        int norm_gain = w == LN1G || w == LN2G || i == m->n - 2;
        int bias = dt_tensor_rank(m->p[i]) == 1 && !norm_gain;
        double std = (w == OW || w == PROJW) ? proj_std : 0.02;
        for (int64_t j = 0; j < n; j++)
            x[j] = norm_gain ? 1.0f : bias ? 0.0f : (float)(rng_normal(&r) * std);
        st = write_global(m->p[i], x);
        free(x);
    }
    return st;
}

/* ---- optimizer groups, one per unit (ZeRO stage 3 gathers them around their use) ---------- */

/* Groups: 0 the embeddings, 1 + 2l block l's weights, 2 + 2l its biases and norms, 2L + 1 the
 * final norm. */
static int group_emb(void) { return 0; }
static int group_w(int l) { return 1 + 2 * l; }
static int group_b(int l) { return 2 + 2 * l; }
static int group_final(const gpt2 *m) { return 2 * (int)m->cfg.layers + 1; }

dt_status gpt2_attach(gpt2 *m, dt_zero *zero, const dt_optim_hparams *hp, int stage3)
{
    own_error[0] = '\0';
    int k = 0;
    m->opt = malloc((size_t)m->n * sizeof *m->opt);
    m->pos = malloc((size_t)m->n * sizeof *m->pos);
    dt_tensor **pt = malloc((size_t)m->n * sizeof *pt);
    const char **nm = malloc((size_t)m->n * sizeof *nm);
    dt_status st = m->opt && m->pos && pt && nm ? DT_OK : DT_ERR_NO_MEMORY;
    dt_optim_hparams plain = *hp;
    plain.weight_decay = 0.0f;
    m->count = gpt2_param_count(m);
    for (int g = 0; st == DT_OK && g <= group_final(m); g++) {
        int first = k, lo, hi, decays = g != group_final(m) && (g == 0 || g % 2 == 1);
        if (g == group_emb()) {
            lo = 0;
            hi = 2;
        } else if (g == group_final(m)) {
            lo = m->n - 2;
            hi = m->n;
        } else {
            lo = slot((g - 1) / 2, 0);
            hi = slot((g - 1) / 2 + 1, 0);
        }
        for (int i = lo; i < hi; i++)
            if (g == group_emb() || g == group_final(m) || gpt2_param_decays(m, i) == decays) {
                m->opt[k] = i;
                m->pos[i] = k;
                pt[k] = m->p[i];
                nm[k++] = m->names[i];
            }
        st = dt_zero_add_group(zero, k - first, nm + first, pt + first, decays ? hp : &plain,
                               NULL);
    }
    free(pt);
    free(nm);
    if (st == DT_OK)
        m->ngroups = group_final(m) + 1;
    for (int i = 0; st == DT_OK && stage3 && i < m->n; i++) {
        dt_tensor_destroy(m->p[i]); /* the optimizer's shards hold the values */
        m->p[i] = NULL;
    }
    if (st == DT_OK && stage3)
        m->zero = zero;
    return st;
}

int gpt2_opt_order(const gpt2 *m, int k) { return m->opt[k]; }

dt_status gpt2_set_lr(const gpt2 *m, dt_zero *zero, float lr)
{
    dt_status st = DT_OK;
    for (int g = 0; st == DT_OK && g < m->ngroups; g++)
        st = dt_zero_set_lr(zero, g, lr);
    return st;
}

const dt_tensor *gpt2_param(const gpt2 *m, int i)
{
    if (!m->zero)
        return m->p[i];
    dt_tensor *t = NULL;
    return dt_zero_param(m->zero, m->pos[i], &t) == DT_OK ? t : NULL;
}

dt_status gpt2_gather_all(gpt2 *m)
{
    dt_status st = DT_OK;
    for (int g = 0; st == DT_OK && m->zero && g < m->ngroups; g++)
        st = dt_zero_gather(m->zero, g);
    return st;
}

dt_status gpt2_release_all(gpt2 *m)
{
    dt_status st = DT_OK;
    for (int g = 0; st == DT_OK && m->zero && g < m->ngroups; g++)
        st = dt_zero_release(m->zero, g);
    return st;
}

/* Stage 3, block l: its two groups gathered (completing a prefetch), watched on the tape
 * under the parameters' indices (rebinding the tensors of an earlier gather), and block
 * `next`'s prefetched (next < 0: none). */
static dt_status block_in(const gpt2 *m, dt_tape *tape, int l, int next)
{
    dt_status st = dt_zero_gather(m->zero, group_w(l));
    if (st == DT_OK)
        st = dt_zero_gather(m->zero, group_b(l));
    for (int w = 0; st == DT_OK && w < PER_LAYER; w++) {
        const dt_tensor *t = gpt2_param(m, slot(l, w));
        st = t ? dt_tape_watch(tape, t, slot(l, w)) : DT_ERR_STATE;
    }
    if (st == DT_OK && next >= 0)
        st = dt_zero_prefetch(m->zero, group_w(next));
    if (st == DT_OK && next >= 0)
        st = dt_zero_prefetch(m->zero, group_b(next));
    return st;
}

static dt_status block_out(const gpt2 *m, int l)
{
    dt_status st = dt_zero_release(m->zero, group_w(l));
    dt_status s2 = dt_zero_release(m->zero, group_b(l));
    return st != DT_OK ? st : s2;
}

/* The segment hook of block l (stage 3): before its backward it is gathered again and block
 * l - 1's groups prefetched; after, released. */
typedef struct hook_arg {
    const gpt2 *m;
    dt_tape *tape;
} hook_arg;

static dt_status block_hook(void *arg, int l, dt_segment_phase phase)
{
    const hook_arg *h = arg;
    if (phase == DT_SEGMENT_POST)
        return block_out(h->m, l);
    return block_in(h->m, h->tape, l, l - 1);
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
    const dt_tensor *t = gpt2_param(m, i);
    if (!t)
        return DT_ERR_STATE;
    if (m->dtype == DT_DTYPE_F32) {
        *out = t;
        return DT_OK;
    }
    dt_tensor *c = NULL;
    dt_status st = keep(p, dt_cast(t, DT_DTYPE_F32, &c), &c);
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

/* y = x @ W + b (out_layout as dt_matmul_nd's). A column-parallel W gives y sharded on its
 * columns and takes its bias sharded alike; a row-parallel W with out_layout the activations'
 * gives the sum over `model`, to which the (replicated) bias is added once. */
static dt_status linear(const gpt2 *m, pass *p, const dt_tensor *x, int w, int b,
                        const dt_layout *out_layout, dt_tensor **out)
{
    dt_tensor *y = NULL, *z = NULL;
    const dt_tensor *bias = NULL, *wt = gpt2_param(m, w);
    dt_status st = wt ? DT_OK : DT_ERR_STATE;
    if (st == DT_OK)
        st = keep(p, dt_matmul_nd(x, wt, 0, 0, out_layout, &y), &y);
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

/* Block l: h -> h + o(attn(q, k, v of ln1(h))) -> + proj(gelu(fc(ln2(.)))), into *out. */
static dt_status block(const gpt2 *m, pass *p, int l, dt_tensor *h, dt_tensor **out)
{
    dt_tensor *a, *q, *k, *v, *att = NULL, *o, *h1 = NULL, *b, *fc, *g = NULL, *pr;
    dt_tensor *h2 = NULL;
    dt_status st;
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
        return st;
    *out = h2;
    return DT_OK;
}

/* The forward pass: the loss (owned by p). Stage 3: block l is a segment of the tape (its
 * records borrow the watched parameters, which the hook gathers again for the backward). */
static dt_status forward(const gpt2 *m, pass *p, dt_tape *tape, hook_arg *ha,
                         const dt_tensor *x, const dt_tensor *y, dt_tensor **loss_out)
{
    const dt_tensor *wte = NULL, *wpe = NULL;
    dt_tensor *pos = NULL, *te = NULL, *pe = NULL, *h = NULL;
    int L = (int)m->cfg.layers;
    dt_status st = DT_OK;
    if (m->zero)
        st = dt_zero_prefetch(m->zero, group_w(0));
    if (st == DT_OK && m->zero)
        st = dt_zero_prefetch(m->zero, group_b(0));
    if (st == DT_OK)
        st = f32(m, p, 0, &wte);
    if (st == DT_OK)
        st = f32(m, p, 1, &wpe);
    if (st == DT_OK)
        st = keep(p, positions(m, x, &pos), &pos);
    /* The vocabulary-sharded lookup is partial over model: all-reduced to the activations'. */
    if (st == DT_OK)
        st = keep(p, dt_embedding(wte, x, m->l_act, &te), &te);
    if (st == DT_OK)
        st = keep(p, dt_embedding(wpe, pos, m->l_act, &pe), &pe);
    if (st == DT_OK)
        st = keep(p, dt_add(te, pe, m->l_act, &h), &h);
    for (int l = 0; st == DT_OK && l < L; l++) {
        dt_tensor *h2 = NULL;
        if (m->zero) {
            dt_checkpoint_opts co = DT_CHECKPOINT_OPTS_INIT;
            co.recompute = 0;
            co.borrow_watched = 1;
            co.hook = block_hook;
            co.hook_arg = ha;
            co.id = l;
            if ((st = block_in(m, tape, l, l + 1 < L ? l + 1 : -1)) != DT_OK ||
                (st = dt_tape_checkpoint_begin(tape, &co)) != DT_OK)
                break;
        }
        st = block(m, p, l, h, &h2);
        if (m->zero) {
            dt_status e = dt_tape_checkpoint_end(tape);
            dt_status r = block_out(m, l);
            st = st != DT_OK ? st : e != DT_OK ? e : r;
        }
        h = h2;
    }
    dt_tensor *f = NULL, *logits = NULL, *loss = NULL;
    if (st == DT_OK)
        st = layer_norm(m, p, h, m->n - 2, m->n - 1, &f);
    /* The head tied to the token embedding: logits = f @ wte^T, sharded on the vocabulary
     * when wte is (column parallel in wte^T); the cross-entropy reduces over the shards. */
    if (st == DT_OK)
        st = keep(p, dt_matmul_nd(f, wte, 0, 1, NULL, &logits), &logits);
    if (st == DT_OK)
        st = keep(p, dt_vocab_xent(logits, y, NULL, &loss), &loss);
    *loss_out = loss;
    return st;
}

/* Stage 3: the embeddings and the final norm, gathered for the whole pass, watched. */
static dt_status ends_in(const gpt2 *m, dt_tape *tape)
{
    dt_status st = dt_zero_gather(m->zero, group_emb());
    if (st == DT_OK)
        st = dt_zero_gather(m->zero, group_final(m));
    int ids[4] = {0, 1, m->n - 2, m->n - 1};
    for (int i = 0; st == DT_OK && i < 4; i++) {
        const dt_tensor *t = gpt2_param(m, ids[i]);
        st = t ? dt_tape_watch(tape, t, ids[i]) : DT_ERR_STATE;
    }
    return st;
}

dt_status gpt2_grads(gpt2 *m, dt_tape *tape, const dt_tensor *x, const dt_tensor *y,
                     float loss_scale, double *loss_out, dt_tensor **grads_out)
{
    pass p = {NULL, 0, 0};
    hook_arg ha = {m, tape};
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && !m->zero && i < m->n; i++)
        st = dt_tape_watch(tape, m->p[i], i);
    if (st == DT_OK && m->zero)
        st = ends_in(m, tape);
    if (st == DT_OK)
        st = dt_tape_begin(tape);
    if (st != DT_OK)
        return st;
    dt_tensor *loss = NULL;
    st = forward(m, &p, tape, &ha, x, y, &loss);
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
    if (m->zero) {
        /* The tape lets the gathered tensors go; the ends are released for the step. */
        for (int i = 0; i < m->n; i++)
            dt_tape_watch(tape, NULL, i);
        dt_status e = dt_zero_release(m->zero, group_emb());
        dt_status f = dt_zero_release(m->zero, group_final(m));
        if (st == DT_OK)
            st = e != DT_OK ? e : f;
    }
    return st;
}
