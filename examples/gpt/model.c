/* gpt/model: parameters and forward pass of the character-level GPT, its gradients from the
 * autograd tape (see model.h; model_impl.h for what a test-side backward pass reads). */
#include "model_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../train/rng.h"

static char own_error[160];
static gpt__backward_fn backward_hook; /* gpt__set_backward_hook: what gpt_create installs */

void gpt__set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(own_error, sizeof own_error, fmt, ap);
    va_end(ap);
}

const char *gpt_last_error(void)
{
    return own_error[0] ? own_error : dt_last_error();
}

static dt_status no_memory(void)
{
    snprintf(own_error, sizeof own_error, "train_gpt: out of memory");
    return DT_ERR_NO_MEMORY;
}

int gpt_num_params(const gpt *m) { return m->nparams; }
int gpt_num_decay(const gpt *m) { return m->ndecay; }
dt_tensor *const *gpt_params(const gpt *m) { return m->param; }
const char *const *gpt_param_names(const gpt *m) { return (const char *const *)m->names; }

int64_t gpt_param_count(const gpt *m)
{
    if (m->zero)
        return m->count;
    int64_t n = 0;
    for (int i = 0; i < m->nparams; i++)
        n += dt_tensor_numel(m->param[i]);
    return n;
}

/* A tensor of `layout` holding the global host array `global`: every local device views the
 * whole array (replicated), then the relayout slices out its box (no communication). On GPU
 * meshes each device's replica is written from the host instead of viewed. */
static dt_status from_host(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                           const void *global, dt_tensor **out)
{
    const dt_mesh *mesh = dt_layout_mesh(layout);
    int rank = dt_layout_rank(layout), n = dt_mesh_num_local_devices(mesh);
    int gpu = dt_mesh_device_type(mesh) == DT_DEVICE_GPU;
    DLTensor *parts = calloc((size_t)(n ? n : 1), sizeof *parts);
    int64_t shp[DT_MAX_RANK];
    dt_layout *rep = NULL;
    dt_tensor *r = NULL;
    if (!parts)
        return no_memory();
    memcpy(shp, shape, sizeof(int64_t) * (size_t)rank);
    size_t bytes = dt_dtype_size(dtype);
    for (int d = 0; d < rank; d++)
        bytes *= (size_t)shape[d];
    for (int k = 0; k < n; k++)
        parts[k] = (DLTensor){.data = (void *)global, .device = {kDLCPU, 0}, .ndim = rank,
                              .dtype = dt_dtype_to_dlpack(dtype), .shape = shp};
    dt_status st = dt_layout_replicated(mesh, rank, &rep);
    if (st == DT_OK && gpu)
        st = dt_tensor_zeros(rep, dtype, shape, &r);
    else if (st == DT_OK)
        st = dt_tensor_pack(rep, shape, n, parts, &r);
    for (int k = 0; gpu && st == DT_OK && k < n; k++)
        st = dt_tensor_local_write(r, k, global, bytes);
    if (st == DT_OK)
        st = dt_relayout(r, layout, out);
    dt_tensor_destroy(r);
    dt_layout_destroy(rep);
    free(parts);
    return st;
}

static dt_status make_param(gpt *m, int slot, const char *name, const dt_layout *layout,
                            int64_t rows, int64_t cols, const float *init)
{
    int64_t shape[2] = {rows, cols};
    int rank = cols > 0 ? 2 : 1;
    dt_layout *l = NULL;
    dt_status st = DT_OK;
    if (rank == 1) {
        st = dt_layout_replicated(m->mesh, 1, &l);
        layout = l;
    }
    dt_tensor *f = NULL;
    if (st == DT_OK)
        st = from_host(layout, DT_DTYPE_F32, shape, init, &f);
    if (st == DT_OK && m->dtype != DT_DTYPE_F32) {
        st = dt_cast(f, m->dtype, &m->param[slot]);
        dt_tensor_destroy(f);
    } else if (st == DT_OK) {
        m->param[slot] = f;
    }
    dt_layout_destroy(l);
    m->names[slot] = strdup(name);
    if (st == DT_OK && !m->names[slot])
        st = no_memory();
    return st;
}

void gpt_destroy(gpt *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->nparams; i++) {
        if (m->param)
            dt_tensor_destroy(m->param[i]);
        if (m->names)
            free(m->names[i]);
    }
    free(m->param);
    free(m->names);
    dt_layout_destroy(m->l_gath);
    dt_layout *ls[] = {m->l_act, m->l_ids, m->l_col, m->l_row,
                       m->l_vocab, m->l_rep1, m->l_rep2, m->l_rep3};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
        dt_layout_destroy(ls[i]);
    dt_mesh_destroy(m->mesh);
    free(m);
}

static void fill_normal(rng *r, float *x, int64_t n, double std)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(std * rng_normal(r));
}

/* The Llama variant's parameters after the token embedding, drawn in slot order: per block
 * q, k, v, o, gate, up, down (o and down scaled as GPT-2's residual projections) and the two
 * RMS norm gains (1), then the head and the final gain. */
static dt_status llama_params(gpt *m, rng *r, float *buf)
{
    int L = (int)m->cfg.layers;
    int64_t C = m->cfg.width, V = m->cfg.vocab, F = 3 * C;
    int64_t CK = m->cfg.kv_heads * (C / m->cfg.heads);
    double resid = 0.02 / sqrt(2.0 * (double)L);
    static const char *const wn[LW_PER_LAYER] = {"attn/q", "attn/k", "attn/v", "attn/proj",
                                                 "mlp/gate", "mlp/up", "mlp/down"};
    static const char *const nn[LN_PER_LAYER] = {"attn_norm/gain", "mlp_norm/gain"};
    char name[64];
    dt_status st = DT_OK;
    for (int l = 0; l < L && st == DT_OK; l++) {
        for (int w = 0; w < LW_PER_LAYER && st == DT_OK; w++) {
            int64_t rows = w == LW_DOWN ? F : C;
            int64_t cols = w == LW_GATE || w == LW_UP ? F : (w == LW_K || w == LW_V ? CK : C);
            int row_par = w == LW_O || w == LW_DOWN;
            fill_normal(r, buf, rows * cols, row_par ? resid : 0.02);
            snprintf(name, sizeof name, "block%d/%s", l, wn[w]);
            st = make_param(m, p_w(m, l, w), name, row_par ? m->l_row : m->l_col, rows, cols, buf);
        }
        for (int w = 0; w < LN_PER_LAYER && st == DT_OK; w++) {
            for (int64_t j = 0; j < C; j++)
                buf[j] = 1.0f;
            snprintf(name, sizeof name, "block%d/%s", l, nn[w]);
            st = make_param(m, p_n(m, l, w), name, NULL, C, 0, buf);
        }
    }
    if (st == DT_OK) {
        fill_normal(r, buf, C * V, 0.02);
        st = make_param(m, p_wlm(m), "output/weight", m->l_col, C, V, buf);
    }
    for (int64_t j = 0; st == DT_OK && j < C; j++)
        buf[j] = 1.0f;
    if (st == DT_OK)
        st = make_param(m, p_lnf(m, 0), "final_norm/gain", NULL, C, 0, buf);
    return st;
}

dt_status gpt_create(const dt_mesh *mesh, const gpt_config *cfg, dt_dtype dtype, uint64_t seed,
                     gpt **out)
{
    own_error[0] = '\0';
    if (cfg->layers < 1 || cfg->layers > MAX_LAYERS || cfg->heads < 1 ||
        cfg->width % cfg->heads != 0) {
        snprintf(own_error, sizeof own_error,
                 "train_gpt: %lld layers (1..%d) and %lld heads must divide width %lld",
                 (long long)cfg->layers, MAX_LAYERS, (long long)cfg->heads,
                 (long long)cfg->width);
        return DT_ERR_INVALID_ARGUMENT;
    }
    gpt_config c2 = *cfg;
    if (c2.llama && c2.kv_heads == 0)
        c2.kv_heads = c2.heads / 2 > 0 ? c2.heads / 2 : 1;
    if (c2.llama && (c2.kv_heads < 1 || c2.heads % c2.kv_heads != 0 ||
                     (cfg->width / cfg->heads) % 2 != 0)) {
        snprintf(own_error, sizeof own_error, "train_gpt: --kv-heads %lld must divide %lld "
                 "heads, and the head width must be even (rotary pairs)",
                 (long long)c2.kv_heads, (long long)c2.heads);
        return DT_ERR_INVALID_ARGUMENT;
    }
    cfg = &c2;
    gpt *m = calloc(1, sizeof *m);
    int64_t C = cfg->width, V = cfg->vocab, T = cfg->context;
    int64_t F = (cfg->llama ? 3 : 4) * cfg->width;
    int64_t big = (V > T ? V : T) * C;
    if (F * C > big)
        big = F * C;
    float *buf = malloc((size_t)big * sizeof *buf);
    if (!m || !buf) {
        free(m);
        free(buf);
        return no_memory();
    }
    m->mesh = dt_mesh_retain(mesh);
    m->cfg = *cfg;
    m->backward = backward_hook;
    m->u_lo = 0;
    m->u_hi = (int)cfg->layers + 2;
    m->dtype = dtype;
    int L = (int)cfg->layers;
    m->nemb = cfg->llama ? 1 : 2;
    m->wpl = cfg->llama ? LW_PER_LAYER : W_PER_LAYER;
    m->npl = cfg->llama ? LN_PER_LAYER : N_PER_LAYER;
    m->nfinal = cfg->llama ? 1 : 2;
    m->ndecay = m->nemb + 1 + m->wpl * L;
    m->nparams = m->ndecay + m->npl * L + m->nfinal;
    m->param = calloc((size_t)m->nparams, sizeof *m->param);
    m->names = calloc((size_t)m->nparams, sizeof *m->names);
    dt_status st = m->param && m->names ? DT_OK : no_memory();
    const char *tp = dt_mesh_dim_index(mesh, "model") >= 0 ? "model" : DT_UNSHARDED;
    /* A `seq` mesh dim shards the sequence of the activations (context parallel attention). */
    const char *cp = dt_mesh_dim_index(mesh, "seq") >= 0 ? "seq" : DT_UNSHARDED;
    const char *s_act[3] = {"batch", cp, DT_UNSHARDED};
    const char *s_col[2] = {DT_UNSHARDED, tp}, *s_row[2] = {tp, DT_UNSHARDED};
    if (st == DT_OK &&
        ((st = dt_layout_create(mesh, 3, s_act, &m->l_act)) != DT_OK ||
         (st = dt_layout_create(mesh, 2, s_act, &m->l_ids)) != DT_OK ||
         (st = dt_layout_create(mesh, 2, s_col, &m->l_col)) != DT_OK ||
         (st = dt_layout_create(mesh, 2, s_row, &m->l_row)) != DT_OK ||
         (st = dt_layout_create(mesh, 2, s_row, &m->l_vocab)) != DT_OK ||
         (st = dt_layout_replicated(mesh, 1, &m->l_rep1)) != DT_OK ||
         (st = dt_layout_replicated(mesh, 2, &m->l_rep2)) != DT_OK ||
         (st = dt_layout_replicated(mesh, 3, &m->l_rep3)) != DT_OK))
        goto out;
    /* Every client draws the whole global matrices in the same order: any mesh starts from
     * the same model. */
    rng r;
    rng_seed(&r, seed);
    double resid = 0.02 / sqrt(2.0 * (double)L);
    char name[64];
    if (st == DT_OK) {
        fill_normal(&r, buf, V * C, 0.02);
        st = make_param(m, p_wte(), "embed/token", m->l_vocab, V, C, buf);
    }
    if (cfg->llama) {
        st = st == DT_OK ? llama_params(m, &r, buf) : st;
        goto out;
    }
    if (st == DT_OK) {
        fill_normal(&r, buf, T * C, 0.01);
        st = make_param(m, p_wpe(), "embed/position", m->l_rep2, T, C, buf);
    }
    static const char *const wn[W_PER_LAYER] = {"attn/q", "attn/k", "attn/v", "attn/proj",
                                                "mlp/fc", "mlp/proj"};
    static const char *const nn[N_PER_LAYER] = {"ln1/gain", "ln1/bias", "ln2/gain", "ln2/bias"};
    for (int l = 0; l < L && st == DT_OK; l++) {
        for (int w = 0; w < W_PER_LAYER && st == DT_OK; w++) {
            int64_t rows = w == W_FC2 ? F : C, cols = w == W_FC ? F : C;
            int row_par = w == W_O || w == W_FC2;
            fill_normal(&r, buf, rows * cols, row_par ? resid : 0.02);
            snprintf(name, sizeof name, "block%d/%s", l, wn[w]);
            st = make_param(m, p_w(m, l, w), name, row_par ? m->l_row : m->l_col, rows, cols, buf);
        }
        for (int w = 0; w < N_PER_LAYER && st == DT_OK; w++) {
            for (int64_t j = 0; j < C; j++)
                buf[j] = (w == N_LN1G || w == N_LN2G) ? 1.0f : 0.0f;
            snprintf(name, sizeof name, "block%d/%s", l, nn[w]);
            st = make_param(m, p_n(m, l, w), name, NULL, C, 0, buf);
        }
    }
    if (st == DT_OK) {
        fill_normal(&r, buf, C * V, 0.02);
        st = make_param(m, p_wlm(m), "output/weight", m->l_col, C, V, buf);
    }
    for (int b = 0; b < 2 && st == DT_OK; b++) {
        for (int64_t j = 0; j < C; j++)
            buf[j] = b ? 0.0f : 1.0f;
        st = make_param(m, p_lnf(m, b), b ? "final_ln/bias" : "final_ln/gain", NULL, C, 0, buf);
    }
out:
    free(buf);
    if (st != DT_OK) {
        gpt_destroy(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

dt_status gpt_inputs(const gpt *m, int64_t rows, const int32_t *x, const int32_t *y,
                     dt_tensor **x_out, dt_tensor **y_out)
{
    int64_t shape[2] = {rows, m->cfg.context};
    dt_status st = from_host(m->l_ids, DT_DTYPE_I32, shape, x, x_out);
    if (st == DT_OK && y) {
        st = from_host(m->l_ids, DT_DTYPE_I32, shape, y, y_out);
        if (st != DT_OK) {
            dt_tensor_destroy(*x_out);
            *x_out = NULL;
        }
    }
    return st;
}

dt_status gpt_count_targets(const gpt *m, const dt_tensor *y, int64_t *count_out)
{
    dt_tensor *r = NULL;
    int64_t n = dt_tensor_numel(y), count = 0;
    int32_t *buf = malloc((size_t)(n > 0 ? n : 1) * sizeof *buf);
    if (!buf)
        return no_memory();
    dt_status st = dt_relayout(y, m->l_rep2, &r);
    if (st == DT_OK)
        st = dt_tensor_local_read(r, 0, buf, (size_t)n * sizeof *buf);
    for (int64_t i = 0; st == DT_OK && i < n; i++)
        count += buf[i] >= 0;
    if (st == DT_OK)
        *count_out = count;
    dt_tensor_destroy(r);
    free(buf);
    return st;
}

/* ---- forward and backward ------------------------------------------------------------------ */

/* Parameter `slot`: the model's own, or (stage 3) the optimizer's gathered one (NULL, with
 * the optimizer's message, when its unit is not gathered). */
dt_tensor *gpt__param_of(const gpt *m, int slot)
{
    if (!m->zero)
        return m->param[slot];
    dt_tensor *t = NULL;
    return dt_zero_param(m->zero, slot, &t) == DT_OK ? t : NULL;
}

/* The optimizer groups of unit u (-1: none): its weights' and its norms'. */
static void unit_groups(const gpt *m, int u, int g[2])
{
    int L = (int)m->cfg.layers;
    g[0] = u;                       /* embed, block u - 1, head weight */
    g[1] = u == 0 ? -1 : L + 1 + u; /* block norms, final norm */
}

/* Stage 3: unit u's parameters gathered (u >= 0), unit `next`'s (>= 0) prefetched. */
dt_status gpt__unit_in(const gpt *m, int u, int next)
{
    int g[2], n[2];
    dt_status st = DT_OK;
    if (!m->zero)
        return DT_OK;
    if (u >= 0)
        unit_groups(m, u, g);
    for (int i = 0; st == DT_OK && u >= 0 && i < 2; i++)
        if (g[i] >= 0)
            st = dt_zero_gather(m->zero, g[i]);
    if (next >= 0)
        unit_groups(m, next, n);
    for (int i = 0; st == DT_OK && next >= 0 && i < 2; i++)
        if (n[i] >= 0)
            st = dt_zero_prefetch(m->zero, n[i]);
    return st;
}

dt_status gpt__unit_out(const gpt *m, int u)
{
    int g[2];
    dt_status st = DT_OK;
    if (!m->zero)
        return DT_OK;
    unit_groups(m, u, g);
    for (int i = 0; st == DT_OK && i < 2; i++)
        if (g[i] >= 0)
            st = dt_zero_release(m->zero, g[i]);
    return st;
}

dt_status gpt_attach(gpt *m, dt_zero *zero, const dt_optim_hparams *hp, int stage3)
{
    dt_optim_hparams plain = *hp;
    plain.weight_decay = 0.0f;
    int L = (int)m->cfg.layers;
    /* Slot ranges: stages 0-2 the decayed and the plain; stage 3 the embeddings, each
     * block's weights, the head weight, each block's norms, the final norm. */
    int cuts[2 * MAX_LAYERS + 8], n = 0;
    cuts[n++] = 0;
    if (stage3) {
        for (int l = 0; l < L; l++)
            cuts[n++] = p_w(m, l, 0);
        cuts[n++] = p_wlm(m);
        for (int l = 0; l < L; l++)
            cuts[n++] = p_n(m, l, 0);
        cuts[n++] = p_lnf(m, 0);
    } else {
        cuts[n++] = m->ndecay;
    }
    cuts[n] = m->nparams;
    m->count = gpt_param_count(m);
    dt_status st = DT_OK;
    for (int k = 0; st == DT_OK && k < n; k++)
        st = dt_zero_add_group(zero, cuts[k + 1] - cuts[k], (const char *const *)m->names + cuts[k],
                               m->param + cuts[k], cuts[k] < m->ndecay ? hp : &plain, NULL);
    m->ngroups = n;
    for (int i = 0; st == DT_OK && stage3 && i < m->nparams; i++) {
        dt_tensor_destroy(m->param[i]); /* the optimizer's shards hold the values */
        m->param[i] = NULL;
    }
    if (st == DT_OK && stage3)
        m->zero = zero;
    return st;
}

dt_status gpt_set_lr(const gpt *m, dt_zero *zero, float lr)
{
    dt_status st = DT_OK;
    for (int g = 0; st == DT_OK && g < m->ngroups; g++)
        st = dt_zero_set_lr(zero, g, lr);
    return st;
}

/* Parameter slot as f32 (layer norms and embeddings run in f32; matmuls read bf16/f16
 * weights directly). */
dt_status gpt__f32_param(const gpt *m, pass *p, int slot, dt_tensor **out)
{
    if (m->dtype == DT_DTYPE_F32) {
        *out = gpt__param_of(m, slot);
        return *out ? DT_OK : DT_ERR_STATE;
    }
    dt_tensor *c = NULL;
    dt_status st = dt_cast(gpt__param_of(m, slot), DT_DTYPE_F32, &c);
    if (st == DT_OK)
        *out = keep(&p->tp, c);
    return st;
}

/* Position ids 0..T-1 for every row. */
static dt_status positions(const gpt *m, pass *p, int64_t rows)
{
    int64_t T = m->cfg.context;
    int32_t *ids = malloc((size_t)(rows * T) * sizeof *ids);
    if (!ids)
        return no_memory();
    for (int64_t i = 0; i < rows * T; i++)
        ids[i] = (int32_t)(i % T);
    int64_t shape[2] = {rows, T};
    dt_tensor *t = NULL;
    dt_status st = from_host(m->l_ids, DT_DTYPE_I32, shape, ids, &t);
    free(ids);
    if (st == DT_OK)
        p->pos = keep(&p->tp, t);
    return st;
}

/* ---- units on the autograd tape ------------------------------------------------------------ */

/* The parameter slots of unit u (0 embeddings, 1 + l block l, L + 1 the head). */
static int unit_slots(const gpt *m, int u, int *slots)
{
    int L = (int)m->cfg.layers, n = 0;
    if (u == 0) {
        for (int e = 0; e < m->nemb; e++)
            slots[n++] = p_wte() + e;
    } else if (u <= L) {
        for (int w = 0; w < m->wpl; w++)
            slots[n++] = p_w(m, u - 1, w);
        for (int w = 0; w < m->npl; w++)
            slots[n++] = p_n(m, u - 1, w);
    } else {
        slots[n++] = p_wlm(m);
        for (int b = 0; b < m->nfinal; b++)
            slots[n++] = p_lnf(m, b);
    }
    return n;
}

/* Stage 3: the tape watches unit u's gathered parameters under their slots. */
static dt_status watch_unit(const gpt *m, dt_tape *atape, int u)
{
    int slots[MAX_PER_LAYER];
    int n = unit_slots(m, u, slots);
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < n; i++) {
        dt_tensor *t = gpt__param_of(m, slots[i]);
        st = t ? dt_tape_watch(atape, t, slots[i]) : DT_ERR_STATE;
    }
    return st;
}

/* A unit's segment hook: before its backward, stage 3 gathers it (the head stays gathered
 * from the forward pass) and prefetches the unit before it, as the hand-written pass did;
 * after, releases it. */
static dt_status unit_hook(void *arg, int u, dt_segment_phase phase)
{
    const unit_hook_arg *h = arg;
    const gpt *m = h->m;
    int L = (int)m->cfg.layers;
    if (!m->zero)
        return DT_OK;
    if (phase == DT_SEGMENT_POST)
        return gpt__unit_out(m, u);
    dt_status st = u == L + 1 ? gpt__unit_in(m, -1, L) : gpt__unit_in(m, u, u - 1);
    return st == DT_OK ? watch_unit(m, h->tape, u) : st;
}

/* Under sequence parallelism the ops whose outputs a block re-runs in the backward pass
 * instead of keeping them: the all-gathers along the sequence (relayouts) and the norms that
 * feed them. So the tape holds no whole-sequence input of a column-parallel matmul (Megatron
 * gathers it again in its backward too); everything else is kept as needed, never re-run
 * (the tape lets go of the kept outputs nothing reads at the segment's end). */
#define SEQPAR_RECOMPUTED \
    (DT_OP_BIT(DT_OP_RELAYOUT) | DT_OP_BIT(DT_OP_LAYER_NORM) | DT_OP_BIT(DT_OP_RMS_NORM))

/* Opens unit u's segment on the recording tape (when one records and the unit needs one:
 * stage 3's gathers, a checkpointed block, or a block under sequence parallelism); *open
 * says whether it did. */
static dt_status unit_begin(const gpt *m, pass *p, unit_hook_arg *ha, int u, int *open)
{
    int L = (int)m->cfg.layers, block = u >= 1 && u <= L;
    int seqpar = block && m->l_gath && !m->checkpoint_blocks;
    *open = 0;
    if (!p->tape || (!m->zero && !(block && m->checkpoint_blocks) && !seqpar))
        return DT_OK;
    dt_checkpoint_opts co = DT_CHECKPOINT_OPTS_INIT;
    co.recompute = (block && m->checkpoint_blocks) || seqpar;
    co.keep_ops = seqpar ? ~(uint64_t)SEQPAR_RECOMPUTED : 0;
    co.borrow_watched = m->zero != NULL;
    co.hook = unit_hook;
    co.hook_arg = ha;
    co.id = u;
    dt_status st = dt_tape_checkpoint_begin(p->tape, &co);
    *open = st == DT_OK;
    return st;
}

static dt_status unit_end(pass *p, int open, dt_status st)
{
    if (open) {
        dt_status e = dt_tape_checkpoint_end(p->tape);
        if (st == DT_OK)
            st = e;
    }
    return st;
}

/* Sequence parallelism: *x (sharded along the sequence over `model`) all-gathered along the
 * sequence for a column-parallel matmul, recorded on the tape (its backward reduce-scatters
 * the gradient back to the sequence shards). Otherwise *x as it is. */
static dt_status gather_seq(const gpt *m, pass *p, dt_tensor **x)
{
    if (!m->l_gath)
        return DT_OK;
    dt_status st;
    dt_tensor *g = NULL;
    if (K(&p->tp, dt_relayout(*x, m->l_gath, &g), g) != DT_OK)
        return st;
    *x = g;
    return DT_OK;
}

/* Residual dropout (gpt_set_dropout) of a block's branch output *o, site `site` (< 512) of the
 * pass:
 * Philox keyed by the global element index (dt_dropout), so every mesh drops the same
 * elements. Nothing outside training passes or at p = 0. */
static dt_status drop(const gpt *m, pass *p, int site, dt_tensor **o)
{
    if (!m->drop_on || m->dropout <= 0.0f)
        return DT_OK;
    dt_tensor *d = NULL;
    dt_status st = dt_dropout(*o, m->dropout, m->drop_seed, m->drop_pass * 1024u + (uint64_t)site,
                              &d);
    if (st == DT_OK)
        *o = keep(&p->tp, d);
    return st;
}

/* Block l's causal self-attention; in training passes with dropout on, its probabilities are
 * dropped too (dt_attention_ex, site 512 + l of the pass). gqa: dt_attention_gqa's kernel
 * when nothing is dropped (the Llama blocks), else dt_attention's. */
static dt_status attend(const gpt *m, int l, int gqa, const dt_tensor *q, const dt_tensor *k,
                        const dt_tensor *v, int64_t heads, int64_t kv_heads, dt_tensor **y)
{
    if (m->drop_on && m->dropout > 0.0f) {
        dt_attention_opts o = {.heads = heads, .kv_heads = kv_heads, .causal = 1,
                               .dropout = m->dropout, .seed = m->drop_seed,
                               .stream = m->drop_pass * 1024u + 512u + (uint64_t)l};
        return dt_attention_ex(q, k, v, &o, y);
    }
    if (gqa)
        return dt_attention_gqa(q, k, v, heads, kv_heads, 1, y);
    return dt_attention(q, k, v, heads, 1, y);
}

/* Stage 3 with a tape: unit u's gathered parameters watched (after its unit_in). */
static dt_status watched_in(const gpt *m, pass *p, int u, int next)
{
    dt_status st = gpt__unit_in(m, u, next);
    if (st == DT_OK && p->tape && m->zero)
        st = watch_unit(m, p->tape, u);
    return st;
}

/* The Llama variant's forward pass (pre-norm blocks: RMS norm, q/k/v projections, rotary
 * positions on q and k, grouped-query causal attention, output projection, residual add;
 * RMS norm, SwiGLU MLP, residual add; a final RMS norm and the head), recorded on the tape:
 * it has no hand-written backward. */
static dt_status llama_forward(gpt *m, pass *p, const dt_tensor *ids)
{
    dt_status st = DT_OK;
    int L = (int)m->cfg.layers, open = 0;
    int64_t H = m->cfg.heads, KV = m->cfg.kv_heads;
    dt_tensor *wte = NULL, *x = NULL;
    p->ha = (unit_hook_arg){m, p->tape};
    if (m->u_lo > 0) { /* a later pipeline stage: the previous stage's activation */
        x = (dt_tensor *)p->in;
        goto blocks;
    }
    if ((st = watched_in(m, p, 0, 1)) != DT_OK ||
        (st = unit_begin(m, p, &p->ha, 0, &open)) != DT_OK ||
        (st = gpt__f32_param(m, p, p_wte(), &wte)) != DT_OK ||
        K(&p->tp, dt_embedding(wte, ids, m->l_act, &x), x) != DT_OK ||
        (st = unit_end(p, open, st)) != DT_OK || (st = gpt__unit_out(m, 0)) != DT_OK)
        return st;
blocks:
    for (int l = 0; l < L; l++) {
        if (1 + l < m->u_lo || 1 + l >= m->u_hi)
            continue; /* another pipeline stage's block */
        dt_tensor *g1, *g2, *a = NULL, *q = NULL, *k = NULL, *v = NULL, *qr = NULL, *kr = NULL;
        dt_tensor *y = NULL, *o = NULL, *x1 = NULL, *b = NULL, *gt = NULL, *up = NULL;
        dt_tensor *sw = NULL, *mo = NULL;
        if ((st = watched_in(m, p, 1 + l, 2 + l)) != DT_OK ||
            (st = unit_begin(m, p, &p->ha, 1 + l, &open)) != DT_OK ||
            (st = gpt__f32_param(m, p, p_n(m, l, LN_ATTN), &g1)) != DT_OK ||
            (st = gpt__f32_param(m, p, p_n(m, l, LN_MLP), &g2)) != DT_OK)
            return st;
        if (K(&p->tp, dt_rms_norm(x, g1, EPS, &a), a) != DT_OK ||
            (st = gather_seq(m, p, &a)) != DT_OK ||
            K(&p->tp, dt_matmul_nd(a, gpt__param_of(m, p_w(m, l, LW_Q)), 0, 0, NULL, &q), q) !=
                DT_OK ||
            K(&p->tp, dt_matmul_nd(a, gpt__param_of(m, p_w(m, l, LW_K)), 0, 0, NULL, &k), k) !=
                DT_OK ||
            K(&p->tp, dt_matmul_nd(a, gpt__param_of(m, p_w(m, l, LW_V)), 0, 0, NULL, &v), v) !=
                DT_OK ||
            K(&p->tp, dt_rope(q, H, 0, &qr), qr) != DT_OK ||
            K(&p->tp, dt_rope(k, KV, 0, &kr), kr) != DT_OK ||
            K(&p->tp, attend(m, l, 1, qr, kr, v, H, KV, &y), y) != DT_OK ||
            K(&p->tp, dt_matmul_nd(y, gpt__param_of(m, p_w(m, l, LW_O)), 0, 0, m->l_act, &o), o) !=
                DT_OK ||
            (st = drop(m, p, 2 * l, &o)) != DT_OK ||
            K(&p->tp, dt_add(x, o, m->l_act, &x1), x1) != DT_OK ||
            K(&p->tp, dt_rms_norm(x1, g2, EPS, &b), b) != DT_OK ||
            (st = gather_seq(m, p, &b)) != DT_OK ||
            K(&p->tp, dt_matmul_nd(b, gpt__param_of(m, p_w(m, l, LW_GATE)), 0, 0, NULL, &gt), gt) !=
                DT_OK ||
            K(&p->tp, dt_matmul_nd(b, gpt__param_of(m, p_w(m, l, LW_UP)), 0, 0, NULL, &up), up) !=
                DT_OK ||
            K(&p->tp, dt_swiglu(gt, up, &sw), sw) != DT_OK ||
            K(&p->tp, dt_matmul_nd(sw, gpt__param_of(m, p_w(m, l, LW_DOWN)), 0, 0, m->l_act, &mo),
              mo) != DT_OK ||
            (st = drop(m, p, 2 * l + 1, &mo)) != DT_OK ||
            K(&p->tp, dt_add(x1, mo, m->l_act, &x), x) != DT_OK ||
            (st = unit_end(p, open, st)) != DT_OK || (st = gpt__unit_out(m, 1 + l)) != DT_OK)
            return st;
    }
    p->xl = x;
    if (m->u_hi <= L + 1)
        return DT_OK; /* the head is on a later pipeline stage */
    dt_tensor *gf;
    if ((st = watched_in(m, p, L + 1, -1)) != DT_OK ||
        (st = unit_begin(m, p, &p->ha, L + 1, &p->head_open)) != DT_OK ||
        (st = gpt__f32_param(m, p, p_lnf(m, 0), &gf)) != DT_OK ||
        K(&p->tp, dt_rms_norm(x, gf, EPS, &p->f), p->f) != DT_OK ||
        (st = gather_seq(m, p, &p->f)) != DT_OK ||
        K(&p->tp, dt_matmul_nd(p->f, gpt__param_of(m, p_wlm(m)), 0, 0, NULL, &p->logits),
          p->logits) != DT_OK)
        return st;
    return DT_OK;
}

static dt_status forward(gpt *m, pass *p, const dt_tensor *ids)
{
    if (m->cfg.llama)
        return llama_forward(m, p, ids);
    dt_status st = DT_OK;
    int L = (int)m->cfg.layers, open = 0;
    int64_t H = m->cfg.heads;
    dt_tensor *wte = NULL, *wpe = NULL, *te = NULL, *pe = NULL, *x = NULL;
    p->ha = (unit_hook_arg){m, p->tape};
    if (m->u_lo > 0) { /* a later pipeline stage: the previous stage's activation */
        x = (dt_tensor *)p->in;
        goto blocks;
    }
    if ((st = watched_in(m, p, 0, 1)) != DT_OK ||
        (st = positions(m, p, dt_tensor_shape(ids)[0])) != DT_OK ||
        (st = unit_begin(m, p, &p->ha, 0, &open)) != DT_OK ||
        (st = gpt__f32_param(m, p, p_wte(), &wte)) != DT_OK ||
        (st = gpt__f32_param(m, p, p_wpe(), &wpe)) != DT_OK)
        return st;
    /* The vocabulary-sharded lookup is partial over model: all-reduced to the activations'
     * layout. */
    if ((st = dt_embedding(wte, ids, m->l_act, &te)) != DT_OK)
        return st;
    keep(&p->tp, te);
    if ((st = dt_embedding(wpe, p->pos, m->l_act, &pe)) != DT_OK)
        return st;
    keep(&p->tp, pe);
    if ((st = dt_add(te, pe, m->l_act, &x)) != DT_OK)
        return st;
    keep(&p->tp, x);
    if ((st = unit_end(p, open, st)) != DT_OK || (st = gpt__unit_out(m, 0)) != DT_OK)
        return st;
blocks:
    for (int l = 0; l < L; l++) {
        if (1 + l < m->u_lo || 1 + l >= m->u_hi)
            continue; /* another pipeline stage's block */
        acts *a = &p->blk[l];
        dt_tensor *g1, *b1, *g2, *b2, *o = NULL, *mo = NULL;
        a->x = x;
        if ((st = watched_in(m, p, 1 + l, 2 + l)) != DT_OK ||
            (st = unit_begin(m, p, &p->ha, 1 + l, &open)) != DT_OK ||
            (st = gpt__f32_param(m, p, p_n(m, l, N_LN1G), &g1)) != DT_OK ||
            (st = gpt__f32_param(m, p, p_n(m, l, N_LN1B), &b1)) != DT_OK ||
            (st = gpt__f32_param(m, p, p_n(m, l, N_LN2G), &g2)) != DT_OK ||
            (st = gpt__f32_param(m, p, p_n(m, l, N_LN2B), &b2)) != DT_OK)
            return st;
        if (K(&p->tp, dt_layer_norm(x, g1, b1, EPS, &a->a), a->a) != DT_OK ||
            (st = gather_seq(m, p, &a->a)) != DT_OK ||
            K(&p->tp, dt_matmul_nd(a->a, gpt__param_of(m, p_w(m, l, W_Q)), 0, 0, NULL, &a->q),
              a->q) != DT_OK ||
            K(&p->tp, dt_matmul_nd(a->a, gpt__param_of(m, p_w(m, l, W_K)), 0, 0, NULL, &a->k),
              a->k) != DT_OK ||
            K(&p->tp, dt_matmul_nd(a->a, gpt__param_of(m, p_w(m, l, W_V)), 0, 0, NULL, &a->v),
              a->v) != DT_OK ||
            K(&p->tp, attend(m, l, 0, a->q, a->k, a->v, H, H, &a->y), a->y) != DT_OK ||
            K(&p->tp, dt_matmul_nd(a->y, gpt__param_of(m, p_w(m, l, W_O)), 0, 0, m->l_act, &o),
              o) != DT_OK ||
            (st = drop(m, p, 2 * l, &o)) != DT_OK ||
            K(&p->tp, dt_add(x, o, m->l_act, &a->x1), a->x1) != DT_OK ||
            K(&p->tp, dt_layer_norm(a->x1, g2, b2, EPS, &a->b), a->b) != DT_OK ||
            (st = gather_seq(m, p, &a->b)) != DT_OK ||
            K(&p->tp, dt_matmul_nd(a->b, gpt__param_of(m, p_w(m, l, W_FC)), 0, 0, NULL, &a->h),
              a->h) != DT_OK ||
            K(&p->tp, dt_gelu(a->h, &a->g), a->g) != DT_OK ||
            K(&p->tp, dt_matmul_nd(a->g, gpt__param_of(m, p_w(m, l, W_FC2)), 0, 0, m->l_act, &mo),
              mo) != DT_OK ||
            (st = drop(m, p, 2 * l + 1, &mo)) != DT_OK ||
            K(&p->tp, dt_add(a->x1, mo, m->l_act, &x), x) != DT_OK ||
            (st = unit_end(p, open, st)) != DT_OK || (st = gpt__unit_out(m, 1 + l)) != DT_OK)
            return st;
    }
    p->xl = x;
    if (m->u_hi <= L + 1)
        return DT_OK; /* the head is on a later pipeline stage */
    dt_tensor *gf, *bf;
    /* The head stays gathered for the backward pass; its segment stays open for the loss. */
    if ((st = watched_in(m, p, L + 1, -1)) != DT_OK ||
        (st = unit_begin(m, p, &p->ha, L + 1, &p->head_open)) != DT_OK ||
        (st = gpt__f32_param(m, p, p_lnf(m, 0), &gf)) != DT_OK ||
        (st = gpt__f32_param(m, p, p_lnf(m, 1), &bf)) != DT_OK ||
        K(&p->tp, dt_layer_norm(x, gf, bf, EPS, &p->f), p->f) != DT_OK ||
        (st = gather_seq(m, p, &p->f)) != DT_OK ||
        K(&p->tp, dt_matmul_nd(p->f, gpt__param_of(m, p_wlm(m)), 0, 0, NULL, &p->logits),
          p->logits) != DT_OK)
        return st;
    return DT_OK;
}

/* The mean loss per counted target of a forward pass. */
static dt_status pass_loss(const gpt *m, pass *p, const dt_tensor *y, int64_t targets,
                           double *loss_out)
{
    dt_tensor *loss = NULL;
    double v = 0;
    dt_status st = dt_vocab_xent(p->logits, y, NULL, &loss);
    if (st == DT_OK)
        st = dt_item(loss, &v);
    dt_tensor_destroy(loss);
    int64_t rows = dt_tensor_numel(y);
    if (st == DT_OK)
        *loss_out = targets > 0 ? v * (double)rows / (double)targets : 0.0;
    (void)m;
    return st;
}

dt_status gpt_grads(gpt *m, const dt_tensor *x, const dt_tensor *y, int64_t targets,
                    float loss_scale, double *loss_out, dt_tensor **grads_out)
{
    return gpt_grads_each(m, x, y, targets, loss_scale, loss_out, NULL, NULL, grads_out);
}

uint64_t gpt_peak_saved(const gpt *m)
{
    return m->peak_saved;
}

int64_t gpt_recomputed(const gpt *m)
{
    return m->recomputed;
}

dt_status gpt_set_sequence_parallel(gpt *m)
{
    own_error[0] = '\0';
    if (dt_mesh_dim_index(m->mesh, "seq") >= 0) {
        snprintf(own_error, sizeof own_error,
                 "train_gpt: --sequence-parallel with a `seq` mesh "
                 "dim is not supported (the sequence is sharded over seq already)");
        return DT_ERR_UNSUPPORTED;
    }
    const char *tp = dt_mesh_dim_index(m->mesh, "model") >= 0 ? "model" : DT_UNSHARDED;
    const char *s_act[3] = {"batch", tp, DT_UNSHARDED};
    const char *s_gath[3] = {"batch", DT_UNSHARDED, DT_UNSHARDED};
    dt_layout *act = NULL, *ids = NULL, *gath = NULL;
    dt_status st;
    if ((st = dt_layout_create(m->mesh, 3, s_act, &act)) != DT_OK ||
        (st = dt_layout_create(m->mesh, 2, s_act, &ids)) != DT_OK ||
        (st = dt_layout_create(m->mesh, 3, s_gath, &gath)) != DT_OK) {
        dt_layout_destroy(act);
        dt_layout_destroy(ids);
        return st;
    }
    dt_layout_destroy(m->l_act);
    dt_layout_destroy(m->l_ids);
    dt_layout_destroy(m->l_gath);
    m->l_act = act;
    m->l_ids = ids;
    m->l_gath = gath;
    return DT_OK;
}

void gpt_set_dropout(gpt *m, float p, uint64_t seed, uint64_t pass_index)
{
    m->dropout = p;
    m->drop_seed = seed;
    m->drop_pass = pass_index;
}

void gpt_set_backward(gpt *m, int checkpoint_blocks)
{
    m->checkpoint_blocks = checkpoint_blocks;
}

void gpt__set_backward_hook(gpt__backward_fn fn)
{
    backward_hook = fn;
}

/* The tape's gradient callback, handed on to the caller's (gpt_grad_fn). */
typedef struct tape_sink {
    gpt_grad_fn fn;
    void *arg;
} tape_sink;

static dt_status tape_grad(void *arg, int index, const dt_tensor *param, const dt_tensor *grad)
{
    const tape_sink *s = arg;
    (void)param;
    return s->fn ? s->fn(s->arg, index, grad) : DT_OK;
}

/* The forward pass recorded on a tape, the loss, and the tape's backward pass from the loss
 * seeded with dloss: the gradients into g (owned). */
static dt_status tape_grads(gpt *m, pass *p, const dt_tensor *x, const dt_tensor *y,
                            int64_t targets, float dloss, double *loss_out, gpt_grad_fn fn,
                            void *arg, dt_tensor **g)
{
    dt_tape_opts to = DT_TAPE_OPTS_INIT;
    to.accumulate = 0;
    dt_tape *atape = NULL;
    dt_tensor *loss = NULL;
    double v = 0;
    dt_status st = dt_tape_create(&to, &atape);
    for (int i = 0; st == DT_OK && !m->zero && i < m->nparams; i++)
        st = dt_tape_watch(atape, m->param[i], i);
    if (st == DT_OK)
        st = dt_tape_begin(atape);
    p->tape = atape;
    if (st == DT_OK)
        st = forward(m, p, x);
    if (st == DT_OK)
        st = dt_vocab_xent(p->logits, y, NULL, &loss);
    st = unit_end(p, p->head_open, st);
    p->head_open = 0;
    if (atape && dt_tape_current() == atape) {
        dt_status e = dt_tape_end(atape);
        if (st == DT_OK)
            st = e;
    }
    if (st == DT_OK)
        st = dt_item(loss, &v);
    int64_t rows = dt_tensor_numel(y);
    if (st == DT_OK)
        *loss_out = targets > 0 ? v * (double)rows / (double)targets : 0.0;
    tape_sink sink = {fn, arg};
    dt_backward_opts bo = DT_BACKWARD_OPTS_INIT;
    bo.grad_fn = tape_grad;
    bo.grad_arg = &sink;
    bo.require_all = 1;
    dt_tape_stats ts;
    if (st == DT_OK && dt_tape_get_stats(atape, &ts) == DT_OK && ts.peak_saved_bytes > m->peak_saved)
        m->peak_saved = ts.peak_saved_bytes;
    if (st == DT_OK)
        st = dt_tape_backward(atape, loss, NULL, dloss, &bo);
    if (st == DT_OK && dt_tape_get_stats(atape, &ts) == DT_OK) {
        if (ts.peak_saved_bytes > m->peak_saved)
            m->peak_saved = ts.peak_saved_bytes;
        m->recomputed = ts.recomputed;
    }
    for (int i = 0; st == DT_OK && i < m->nparams; i++)
        st = dt_tape_take_grad(atape, i, &g[i]);
    dt_tensor_destroy(loss);
    dt_tape_destroy(atape);
    p->tape = NULL;
    return st;
}

dt_status gpt_grads_each(gpt *m, const dt_tensor *x, const dt_tensor *y, int64_t targets,
                         float loss_scale, double *loss_out, gpt_grad_fn fn, void *arg,
                         dt_tensor **grads_out)
{
    own_error[0] = '\0';
    pass *p = calloc(1, sizeof *p);
    dt_tensor **g = calloc((size_t)m->nparams, sizeof *g);
    if (!p || !g) {
        free(p);
        free(g);
        return no_memory();
    }
    int64_t rows = dt_tensor_numel(y);
    float dloss = targets > 0 ? loss_scale * (float)((double)rows / (double)targets) : 0.0f;
    dt_status st = DT_OK;
    if (!m->backward) {
        m->drop_on = 1;
        st = tape_grads(m, p, x, y, targets, dloss, loss_out, fn, arg, g);
        m->drop_on = 0;
        m->drop_pass++;
    } else {
        /* A test program's backward pass (gpt__set_backward_hook) over an unrecorded forward. */
        st = forward(m, p, x);
        if (st == DT_OK)
            st = pass_loss(m, p, y, targets, loss_out);
        if (st == DT_OK)
            st = m->backward(m, p, x, y, dloss, g, fn, arg);
    }
    for (int i = 0; i < m->nparams; i++) {
        if (st == DT_OK)
            grads_out[i] = g[i];
        else
            dt_tensor_destroy(g[i]);
    }
    tape_free(&p->tp);
    free(p);
    free(g);
    return st;
}

dt_status gpt_stage_eval(gpt *m, const dt_tensor *in, const dt_tensor *y, int64_t targets,
                         double *loss_out, float *logits, dt_tensor **act_out)
{
    own_error[0] = '\0';
    pass *p = calloc(1, sizeof *p);
    if (!p)
        return no_memory();
    int L = (int)m->cfg.layers;
    dt_tensor *r = NULL;
    p->in = in;
    dt_status st = forward(m, p, m->u_lo == 0 ? in : NULL);
    if (st == DT_OK && m->u_hi < L + 2) {
        *act_out = dt_tensor_retain(p->xl);
    } else if (st == DT_OK) {
        st = gpt__unit_out(m, L + 1);
        if (st == DT_OK && y)
            st = pass_loss(m, p, y, targets, loss_out);
        if (st == DT_OK && logits)
            st = dt_relayout(p->logits, m->l_rep3, &r);
        if (st == DT_OK && logits)
            st = dt_tensor_local_read(r, 0, logits, (size_t)dt_tensor_numel(r) * sizeof(float));
    }
    dt_tensor_destroy(r);
    tape_free(&p->tp);
    free(p);
    return st;
}

dt_status gpt_loss(gpt *m, const dt_tensor *x, const dt_tensor *y, int64_t targets,
                   double *loss_out)
{
    return gpt_stage_eval(m, x, y, targets, loss_out, NULL, NULL);
}

dt_status gpt_logits(gpt *m, const dt_tensor *x, float *logits)
{
    return gpt_stage_eval(m, x, NULL, 0, NULL, logits, NULL);
}

/* ---- pipeline stages (gpt_set_units, gpt_stage_forward; docs/pipeline.md) ------------------ */

int gpt_num_units(const gpt *m) { return (int)m->cfg.layers + 2; }

int gpt_unit_param_slots(const gpt *m, int u, int *slots)
{
    return u < 0 || u >= gpt_num_units(m) ? 0 : unit_slots(m, u, slots);
}

int gpt_holds_slot(const gpt *m, int slot)
{
    return slot >= 0 && slot < m->nparams && m->param[slot] != NULL;
}

dt_status gpt_set_units(gpt *m, int lo, int hi)
{
    own_error[0] = '\0';
    if (m->zero || lo < 0 || hi > gpt_num_units(m) || lo >= hi) {
        snprintf(own_error, sizeof own_error, "train_gpt: units [%d, %d) of %d (not in stage 3)",
                 lo, hi, gpt_num_units(m));
        return DT_ERR_INVALID_ARGUMENT;
    }
    m->u_lo = lo;
    m->u_hi = hi;
    int slots[MAX_PER_LAYER];
    for (int u = 0; u < gpt_num_units(m); u++) {
        if (u >= lo && u < hi)
            continue;
        int n = unit_slots(m, u, slots);
        for (int i = 0; i < n; i++) {
            dt_tensor_destroy(m->param[slots[i]]);
            m->param[slots[i]] = NULL;
        }
    }
    return DT_OK;
}

struct gpt_stage_pass {
    pass p;
};

void gpt_stage_pass_free(gpt_stage_pass *sp)
{
    if (!sp)
        return;
    tape_free(&sp->p.tp);
    free(sp);
}

dt_status gpt_stage_forward(gpt *m, dt_tape *atape, const dt_tensor *in, const dt_tensor *y,
                            gpt_stage_pass **pass_out, dt_tensor **out)
{
    own_error[0] = '\0';
    *out = NULL;
    *pass_out = NULL;
    gpt_stage_pass *sp = calloc(1, sizeof *sp);
    if (!sp)
        return no_memory();
    pass *p = &sp->p;
    p->tape = atape;
    p->in = in;
    int L = (int)m->cfg.layers;
    dt_status st = forward(m, p, m->u_lo == 0 ? in : NULL);
    if (st == DT_OK && m->u_hi == L + 2)
        st = dt_vocab_xent(p->logits, y, NULL, out);
    else if (st == DT_OK)
        *out = dt_tensor_retain(p->xl);
    p->tape = NULL;
    if (st != DT_OK) {
        gpt_stage_pass_free(sp);
        return st;
    }
    *pass_out = sp;
    return DT_OK;
}
