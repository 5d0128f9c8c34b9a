/* train_moe: a small Mixtral/DeepSeek-style decoder on the names data (examples/data/names.txt):
 * token and position embeddings; per layer RMS norm, causal multi-head attention, residual,
 * RMS norm, a routed mixture of SwiGLU experts (examples/moe/routed.c; --moe 0: a dense
 * SwiGLU MLP of topk * hidden units, the same active parameters), residual; a final RMS norm
 * and the output projection; AdamW. The mesh is one `batch` dim over every device: the
 * tokens are sharded over it and so are the experts (expert parallelism borrowed from data
 * parallelism: EP = the number of devices, E / EP experts each). Dense gradients are reduced
 * over every device, the experts' gradients are already where their experts are. With
 * --shards S (default 4) every sum over the batch is taken per batch shard and the shards'
 * gradients summed once on every device, so 1, 2 and 4 processes train to the same bits
 * (docs/moe.md, "The same bits at every EP degree").
 * Prints each step's loss, the per-expert load and the dropped fraction, and the held-out
 * loss; --save DIR / --resume DIR checkpoint the parameters, the AdamW moments, the routing
 * bias and the step (restorable at any EP degree); --dump DIR writes what the PyTorch
 * reference (tests/reference/test_moe_reference.py) replays (docs/moe.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dtensor/dtensor.h>

#include "gpt/names.h"
#include "moe/hf.h"
#include "moe/routed.h"

#ifndef TRAIN_MOE_DATA
#define TRAIN_MOE_DATA "examples/data/names.txt"
#endif
#define MAXL 8
#define MAXP (4 + MAXL * 12)

typedef struct opts {
    const char *data, *save, *resume, *dump, *export_dir, *init_hf;
    int64_t experts, topk, hidden, width, heads, layers, batch, steps, heldout, save_at;
    double lr, wd, capacity, aux, z, bias_coeff;
    int score, balance, quiet, bench;
    int64_t zero;
    int64_t shards; /* S: the batch as [S, B/S] in every sum over it (0: one GEMM per device) */
    uint64_t seed;
} opts;

typedef struct model {
    opts o;
    dt_mesh *mesh;
    int np;
    dt_tensor *p[MAXP], *m[MAXP], *v[MAXP];
    char names[MAXP][64];
    float bias[MAXL][64];
    moe_config cfg;
    double phase[4]; /* the training loop's forward phases (moe_routed_timers) */
    dt_zero *zero;   /* --zero S: the dense parameters' optimizer (NULL: dt_adam_step) */
    int dense_idx[MAXP], ndense; /* the parameters it holds, in its order */
    dt_tensor *ones;             /* [C] of 1: the RMS norms' fixed gain when shards > 0 */
} model;

static int64_t T = NAMES_CONTEXT;

static dt_status add_param(model *md, const char *name, int rank, const int64_t *shape,
                           const char *spec0, double std, uint64_t stream)
{
    const char *specs[3] = {spec0 ? spec0 : DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED};
    dt_layout *l = NULL;
    dt_status st = dt_layout_create(md->mesh, rank, specs, &l);
    int i = md->np;
    const float one = 1.0f;
    if (st == DT_OK)
        st = std > 0
                 ? dt_random_normal(l, shape, DT_DTYPE_F32, 0.0, std, md->o.seed, stream, &md->p[i])
                 : dt_tensor_filled(l, DT_DTYPE_F32, shape, &one, &md->p[i]);
    if (st == DT_OK)
        st = dt_tensor_zeros(l, DT_DTYPE_F32, shape, &md->m[i]);
    if (st == DT_OK)
        st = dt_tensor_zeros(l, DT_DTYPE_F32, shape, &md->v[i]);
    snprintf(md->names[i], sizeof md->names[i], "%s", name);
    dt_layout_destroy(l);
    if (st == DT_OK)
        md->np++;
    return st;
}

/* Parameter order: wte, wpe, then per layer attn_norm, wq, wk, wv, wo, mlp_norm and either
 * gate, w1, w3, w2 (MoE) or w1, w3, w2 (dense); then norm, head. */
static dt_status model_create(model *md)
{
    const opts *o = &md->o;
    int64_t C = o->width, E = o->experts, F = o->hidden, V = NAMES_VOCAB;
    double sd = 0.02;
    uint64_t s = 1;
    char nm[64];
    dt_status st = add_param(md, "wte", 2, (int64_t[]){V, C}, NULL, sd, s++);
    if (st == DT_OK)
        st = add_param(md, "wpe", 2, (int64_t[]){T, C}, NULL, sd, s++);
    for (int64_t l = 0; l < o->layers && st == DT_OK; l++) {
        const char *lin[4] = {"wq", "wk", "wv", "wo"};
        snprintf(nm, sizeof nm, "l%lld.attn_norm", (long long)l);
        st = add_param(md, nm, 1, (int64_t[]){C}, NULL, 0, s++);
        for (int j = 0; j < 4 && st == DT_OK; j++) {
            snprintf(nm, sizeof nm, "l%lld.%s", (long long)l, lin[j]);
            st = add_param(md, nm, 2, (int64_t[]){C, C}, NULL, sd, s++);
        }
        snprintf(nm, sizeof nm, "l%lld.mlp_norm", (long long)l);
        if (st == DT_OK)
            st = add_param(md, nm, 1, (int64_t[]){C}, NULL, 0, s++);
        if (E > 0) {
            snprintf(nm, sizeof nm, "l%lld.gate", (long long)l);
            if (st == DT_OK)
                st = add_param(md, nm, 2, (int64_t[]){C, E}, NULL, sd, s++);
            snprintf(nm, sizeof nm, "l%lld.w1", (long long)l);
            if (st == DT_OK)
                st = add_param(md, nm, 3, (int64_t[]){E, C, F}, "batch", sd, s++);
            snprintf(nm, sizeof nm, "l%lld.w3", (long long)l);
            if (st == DT_OK)
                st = add_param(md, nm, 3, (int64_t[]){E, C, F}, "batch", sd, s++);
            snprintf(nm, sizeof nm, "l%lld.w2", (long long)l);
            if (st == DT_OK)
                st = add_param(md, nm, 3, (int64_t[]){E, F, C}, "batch", sd, s++);
        } else {
            int64_t H = o->topk * F;
            snprintf(nm, sizeof nm, "l%lld.w1", (long long)l);
            if (st == DT_OK)
                st = add_param(md, nm, 2, (int64_t[]){C, H}, NULL, sd, s++);
            snprintf(nm, sizeof nm, "l%lld.w3", (long long)l);
            if (st == DT_OK)
                st = add_param(md, nm, 2, (int64_t[]){C, H}, NULL, sd, s++);
            snprintf(nm, sizeof nm, "l%lld.w2", (long long)l);
            if (st == DT_OK)
                st = add_param(md, nm, 2, (int64_t[]){H, C}, NULL, sd, s++);
        }
    }
    if (st == DT_OK)
        st = add_param(md, "norm", 1, (int64_t[]){C}, NULL, 0, s++);
    if (st == DT_OK)
        st = add_param(md, "head", 2, (int64_t[]){C, V}, NULL, sd, s++);
    return st;
}

static dt_status lin(const char *eq, const dt_tensor *a, const dt_tensor *b, dt_tensor **out)
{
    const dt_tensor *in[2] = {a, b};
    return dt_einsum(eq, in, 2, out);
}

/* The same bits at every EP degree (docs/moe.md): with S = md->o.shards > 0 every sum over
 * the batch is taken per batch shard (the activations viewed as [S, B/S, T, ...], S a batch
 * letter of each einsum, so a device's GEMMs have the same sizes on every mesh) and each
 * parameter enters as S copies (moe_per_shard), whose gradients are summed by expand's
 * backward over all S in f64 on every device. */

/* x [B, T, C] viewed as [S, B/S, T, C] (rank 4) or back to [B, T, C'] (rank 3). */
static dt_status view(const model *md, const dt_tensor *x, int rank, dt_tensor **out)
{
    const int64_t *xs = dt_tensor_shape(x);
    int64_t S = md->o.shards;
    int64_t s4[4] = {S, rank == 4 ? xs[0] / S : 0, T, xs[dt_tensor_rank(x) - 1]};
    int64_t s3[3] = {rank == 3 ? xs[0] * xs[1] : 0, T, xs[dt_tensor_rank(x) - 1]};
    return dt_reshape(x, rank, rank == 4 ? s4 : s3, out);
}

/* h [B, T, C] times w [C, D]: one einsum, or per shard "sbtc,scd->sbtd". */
static dt_status proj(const model *md, const dt_tensor *h, const dt_tensor *w, dt_tensor **out)
{
    if (md->o.shards <= 0)
        return lin("btc,cd->btd", h, w, out);
    dt_tensor *h4 = NULL, *ws = NULL, *y4 = NULL;
    dt_status st = view(md, h, 4, &h4);
    if (st == DT_OK)
        st = moe_per_shard(w, md->o.shards, "batch", 3, &ws);
    if (st == DT_OK)
        st = lin("sbtc,scd->sbtd", h4, ws, &y4);
    if (st == DT_OK)
        st = view(md, y4, 3, out);
    dt_tensor_destroy(y4);
    dt_tensor_destroy(ws);
    dt_tensor_destroy(h4);
    return st;
}

/* RMS norm of x [B, T, C] with gain g [C]: dt_rms_norm's own gain, or (shards) the norm with a
 * fixed gain of 1 times g's per-shard copies [S, 1, 1, C] (dt_rms_norm's dgain would be each
 * device's sum over its rows). */
static dt_status norm(const model *md, const dt_tensor *x, const dt_tensor *g, dt_tensor **out)
{
    if (md->o.shards <= 0)
        return dt_rms_norm(x, g, 1e-5f, out);
    dt_tensor *n = NULL, *n4 = NULL, *gs = NULL, *y4 = NULL;
    dt_status st = dt_rms_norm(x, md->ones, 1e-5f, &n);
    if (st == DT_OK)
        st = view(md, n, 4, &n4);
    if (st == DT_OK)
        st = moe_per_shard(g, md->o.shards, "batch", 4, &gs);
    if (st == DT_OK)
        st = dt_mul(n4, gs, NULL, &y4);
    if (st == DT_OK)
        st = view(md, y4, 3, out);
    dt_tensor_destroy(y4);
    dt_tensor_destroy(gs);
    dt_tensor_destroy(n4);
    dt_tensor_destroy(n);
    return st;
}

/* Token plus position embeddings of ids [B, T]: dt_embedding and dt_add, or (shards) the
 * lookup as one-hot rows times wte's per-shard copies (dt_embedding's backward would
 * scatter-add each device's tokens) plus wpe's copies [S, 1, T, C]. */
static dt_status embed(const model *md, const dt_tensor *ids, dt_tensor **out)
{
    dt_tensor *x = NULL, *oh = NULL, *oh4 = NULL, *ws = NULL, *ps = NULL, *x4 = NULL;
    dt_status st;
    if (md->o.shards <= 0) {
        st = dt_embedding(md->p[0], ids, NULL, &x);
        if (st == DT_OK)
            st = dt_add(x, md->p[1], NULL, out);
        dt_tensor_destroy(x);
        return st;
    }
    dt_no_grad_begin(); /* integer ids: no gradient (one_hot has no backward) */
    st = dt_one_hot(ids, NAMES_VOCAB, DT_DTYPE_F32, &oh);
    dt_no_grad_end();
    if (st == DT_OK)
        st = view(md, oh, 4, &oh4);
    if (st == DT_OK)
        st = moe_per_shard(md->p[0], md->o.shards, "batch", 3, &ws);
    if (st == DT_OK)
        st = lin("sbtv,svc->sbtc", oh4, ws, &x);
    if (st == DT_OK)
        st = moe_per_shard(md->p[1], md->o.shards, "batch", 4, &ps);
    if (st == DT_OK)
        st = dt_add(x, ps, NULL, &x4);
    if (st == DT_OK)
        st = view(md, x4, 3, out);
    dt_tensor_destroy(x4);
    dt_tensor_destroy(ps);
    dt_tensor_destroy(x);
    dt_tensor_destroy(ws);
    dt_tensor_destroy(oh4);
    dt_tensor_destroy(oh);
    return st;
}

/* The mean cross-entropy; with shards the logits and labels gathered first, so every device
 * sums all rows' losses in row order (sharded rows would leave a sum of per-device sums). */
static dt_status xent(const model *md, const dt_tensor *logits, const dt_tensor *labels,
                      dt_tensor **out)
{
    if (md->o.shards <= 0)
        return dt_cross_entropy(logits, labels, -1, out);
    dt_layout *r3 = NULL, *r2 = NULL;
    dt_tensor *rl = NULL, *ry = NULL;
    dt_status st = dt_layout_replicated(md->mesh, 3, &r3);
    if (st == DT_OK)
        st = dt_layout_replicated(md->mesh, 2, &r2);
    if (st == DT_OK)
        st = dt_relayout(logits, r3, &rl);
    if (st == DT_OK)
        st = dt_relayout(labels, r2, &ry);
    if (st == DT_OK)
        st = dt_cross_entropy(rl, ry, -1, out);
    dt_tensor_destroy(rl);
    dt_tensor_destroy(ry);
    dt_layout_destroy(r3);
    dt_layout_destroy(r2);
    return st;
}

/* x += f(x) helpers keep ownership simple: *x replaced by x + d. */
static dt_status residual(dt_tensor **x, dt_tensor *d)
{
    dt_tensor *y = NULL;
    dt_status st = dt_add(*x, d, NULL, &y);
    dt_tensor_destroy(d);
    if (st == DT_OK) {
        dt_tensor_destroy(*x);
        *x = y;
    }
    return st;
}

/* The forward pass: *loss_out the mean cross-entropy (rank 0), *total_out it plus the
 * auxiliary losses; stats per layer; choices (may be NULL) [L][N*K]. */
static dt_status forward(model *md, const dt_tensor *ids, const dt_tensor *labels,
                         dt_tensor **loss_out, dt_tensor **total_out, moe_route_stats *stats,
                         int64_t *choices)
{
    const opts *o = &md->o;
    int64_t B = dt_tensor_shape(ids)[0], C = o->width, N = B * T, K = o->topk;
    dt_tensor *x = NULL, *total = NULL;
    dt_status st = embed(md, ids, &x);
    int pi = 2;
    for (int64_t l = 0; l < o->layers && st == DT_OK; l++) {
        dt_tensor **w = &md->p[pi];
        dt_tensor *h = NULL, *q = NULL, *k = NULL, *v = NULL, *a = NULL, *ao = NULL;
        st = norm(md, x, w[0], &h);
        if (st == DT_OK)
            st = proj(md, h, w[1], &q);
        if (st == DT_OK)
            st = proj(md, h, w[2], &k);
        if (st == DT_OK)
            st = proj(md, h, w[3], &v);
        if (st == DT_OK)
            st = dt_attention(q, k, v, o->heads, 1, &a);
        if (st == DT_OK)
            st = proj(md, a, w[4], &ao);
        if (st == DT_OK)
            st = residual(&x, ao);
        dt_tensor_destroy(h);
        dt_tensor_destroy(q);
        dt_tensor_destroy(k);
        dt_tensor_destroy(v);
        dt_tensor_destroy(a);
        h = NULL;
        dt_tensor *h2 = NULL, *f = NULL, *f3 = NULL, *aux = NULL;
        if (st == DT_OK)
            st = norm(md, x, w[5], &h);
        if (st == DT_OK && o->experts > 0) {
            moe_params mp = {w[6], w[7], w[8], w[9]};
            int64_t s2[2] = {N, C}, s3[3] = {B, T, C};
            st = dt_reshape(h, 2, s2, &h2);
            if (st == DT_OK)
                st = moe_routed_forward(&md->cfg, &mp, md->bias[l], h2, &f, &aux,
                                        stats ? &stats[l] : NULL,
                                        choices ? choices + l * N * K : NULL);
            if (st == DT_OK)
                st = dt_reshape(f, 3, s3, &f3);
            pi += 10;
        } else if (st == DT_OK) {
            dt_tensor *u1 = NULL, *u3 = NULL, *sg = NULL, *u = NULL;
            st = proj(md, h, w[6], &u1);
            if (st == DT_OK)
                st = proj(md, h, w[7], &u3);
            if (st == DT_OK)
                st = dt_silu(u1, &sg);
            if (st == DT_OK)
                st = dt_mul(sg, u3, NULL, &u);
            if (st == DT_OK)
                st = proj(md, u, w[8], &f3);
            dt_tensor_destroy(u1);
            dt_tensor_destroy(u3);
            dt_tensor_destroy(sg);
            dt_tensor_destroy(u);
            pi += 9;
        }
        if (st == DT_OK) {
            st = residual(&x, f3);
            f3 = NULL;
        }
        if (st == DT_OK && aux) {
            if (total) {
                dt_tensor *t2 = NULL;
                st = dt_add(total, aux, NULL, &t2);
                dt_tensor_destroy(total);
                total = t2;
            } else {
                total = dt_tensor_retain(aux);
            }
        }
        dt_tensor_destroy(aux);
        dt_tensor_destroy(f3);
        dt_tensor_destroy(f);
        dt_tensor_destroy(h2);
        dt_tensor_destroy(h);
    }
    dt_tensor *hn = NULL, *logits = NULL, *loss = NULL;
    if (st == DT_OK)
        st = norm(md, x, md->p[pi], &hn);
    if (st == DT_OK)
        st = proj(md, hn, md->p[pi + 1], &logits);
    if (st == DT_OK)
        st = xent(md, logits, labels, &loss);
    if (st == DT_OK && total_out) {
        if (total) {
            st = dt_add(loss, total, NULL, total_out);
        } else {
            *total_out = dt_tensor_retain(loss);
        }
    }
    if (st == DT_OK)
        *loss_out = loss;
    else
        dt_tensor_destroy(loss);
    dt_tensor_destroy(total);
    dt_tensor_destroy(logits);
    dt_tensor_destroy(hn);
    dt_tensor_destroy(x);
    return st;
}

static dt_status batch_tensors(model *md, const names *set, int64_t first, int64_t rows,
                               dt_tensor **ids, dt_tensor **labels, int32_t *hx, int32_t *hy)
{
    int32_t *r = malloc((size_t)rows * sizeof *r);
    if (!r)
        return DT_ERR_NO_MEMORY;
    for (int64_t i = 0; i < rows; i++)
        r[i] = (int32_t)((first + i) % set->n);
    names_encode(set, r, rows, hx, hy);
    free(r);
    const char *sp[2] = {"batch", DT_UNSHARDED};
    dt_layout *l = NULL;
    int64_t shape[2] = {rows, T};
    dt_status st = dt_layout_create(md->mesh, 2, sp, &l);
    if (st == DT_OK)
        st = dt_tensor_from_host(l, DT_DTYPE_I32, shape, hx, ids);
    if (st == DT_OK)
        st = dt_tensor_from_host(l, DT_DTYPE_I32, shape, hy, labels);
    dt_layout_destroy(l);
    return st;
}

/* Checkpoint names: p/NAME, m/NAME, v/NAME, bias (the routing biases [L, E]), step [1]. */
static dt_status checkpoint(model *md, const char *dir, int64_t *step, int save)
{
    int n = 3 * md->np + 2;
    const char **nm = calloc((size_t)n, sizeof *nm);
    char(*buf)[80] = calloc((size_t)n, sizeof *buf);
    dt_tensor **t = calloc((size_t)n, sizeof *t);
    dt_layout *r2 = NULL, *r1 = NULL;
    dt_status st = nm && buf && t ? DT_OK : DT_ERR_NO_MEMORY;
    for (int i = 0; i < md->np && st == DT_OK; i++) {
        const char *kind[3] = {"p", "m", "v"};
        dt_tensor *src[3] = {md->p[i], md->m[i], md->v[i]};
        for (int k = 0; k < 3; k++) {
            snprintf(buf[3 * i + k], sizeof buf[0], "%s/%s", kind[k], md->names[i]);
            nm[3 * i + k] = buf[3 * i + k];
            t[3 * i + k] = src[k];
        }
    }
    int64_t L = md->o.layers, E = md->o.experts > 0 ? md->o.experts : 1;
    float *bias = malloc((size_t)(L * E) * sizeof *bias);
    float stepf = (float)*step;
    if (st == DT_OK && !bias)
        st = DT_ERR_NO_MEMORY;
    for (int64_t l = 0; st == DT_OK && l < L; l++)
        for (int64_t e = 0; e < E; e++)
            bias[l * E + e] = md->bias[l][e];
    if (st == DT_OK)
        st = dt_layout_replicated(md->mesh, 2, &r2);
    if (st == DT_OK)
        st = dt_layout_replicated(md->mesh, 1, &r1);
    if (st == DT_OK)
        st = dt_tensor_from_host(r2, DT_DTYPE_F32, (int64_t[]){L, E}, bias, &t[n - 2]);
    if (st == DT_OK)
        st = dt_tensor_from_host(r1, DT_DTYPE_F32, (int64_t[]){1}, &stepf, &t[n - 1]);
    nm[n - 2] = "train/bias";
    nm[n - 1] = "train/step";
    if (st == DT_OK)
        st = save ? dt_save(md->mesh, dir, n, nm, (const dt_tensor *const *)t, NULL)
                  : dt_restore_into(dir, n, nm, t);
    if (st == DT_OK && !save) {
        st = dt_tensor_to_host(t[n - 2], -1, bias, (size_t)(L * E) * sizeof *bias);
        if (st == DT_OK)
            st = dt_tensor_to_host(t[n - 1], -1, &stepf, sizeof stepf);
        for (int64_t l = 0; st == DT_OK && l < L; l++)
            for (int64_t e = 0; e < E; e++)
                md->bias[l][e] = bias[l * E + e];
        *step = (int64_t)stepf;
    }
    if (t) {
        dt_tensor_destroy(t[n - 2]);
        dt_tensor_destroy(t[n - 1]);
    }
    dt_layout_destroy(r1);
    dt_layout_destroy(r2);
    free(bias);
    free(t);
    free(buf);
    free(nm);
    return st;
}

static moe_hf_shape hf_shape(const model *md)
{
    const opts *o = &md->o;
    return (moe_hf_shape){NAMES_VOCAB, T,          o->width, o->heads,
                          o->layers,   o->experts, o->topk,  o->hidden};
}

static dt_status hf_io(model *md, const char *dir, int export)
{
    const char *nm[MAXP];
    for (int i = 0; i < md->np; i++)
        nm[i] = md->names[i];
    moe_hf_shape sh = hf_shape(md);
    float bias[MAXL * 64];
    for (int64_t l = 0; l < md->o.layers; l++)
        for (int64_t e = 0; e < md->o.experts; e++)
            bias[l * md->o.experts + e] = md->bias[l][e];
    if (export)
        return moe_hf_export(dir, &sh, md->np, nm, md->p, bias);
    dt_status st = moe_hf_import(dir, &sh, md->np, nm, md->p, bias);
    for (int64_t l = 0; st == DT_OK && l < md->o.layers; l++)
        for (int64_t e = 0; e < md->o.experts; e++)
            md->bias[l][e] = bias[l * md->o.experts + e];
    return st;
}

/* Writes tensor t gathered to host, raw f32, to DIR/name (client 0). */
static dt_status dump_tensor(const char *dir, const char *name, const dt_tensor *t)
{
    int64_t n = dt_tensor_numel(t);
    float *h = malloc((size_t)n * sizeof *h);
    dt_status st = h ? dt_tensor_to_host(t, -1, h, (size_t)n * sizeof *h) : DT_ERR_NO_MEMORY;
    if (st == DT_OK && dt_client_id() == 0) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s.f32", dir, name);
        for (char *c = path + strlen(dir) + 1; *c; c++)
            if (*c == '/')
                *c = '_';
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(h, sizeof *h, (size_t)n, f) != (size_t)n)
            st = DT_ERR_IO;
        if (f)
            fclose(f);
    }
    free(h);
    return st;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: train_moe [--moe E (0: dense)] [--topk K] [--hidden F] [--width C]\n"
            "  [--heads H] [--layers L] [--batch B] [--steps S] [--lr X] [--wd X] [--seed N]\n"
            "  [--score softmax|sigmoid] [--balance none|bias|aux] [--aux-coeff X]\n"
            "  [--z-coeff X] [--bias-coeff X] [--capacity CF (<= 0: dropless)]\n"
            "  [--zero 0|1|2 (dense parameters through dt_zero)]\n"
            "  [--shards S (the batch's sums per shard, default 4; 0: per device)]\n"
            "  [--heldout N] [--data FILE "
            "(default: the source tree's names.txt)] [--save DIR [--save-at S]] [--resume DIR]\n"
            "  [--dump DIR] [--export HF_DIR] [--init-hf HF_DIR] [--bench] [--quiet]\n");
}

static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){.data = TRAIN_MOE_DATA,
                .experts = 4,
                .topk = 2,
                .hidden = 16,
                .width = 32,
                .heads = 4,
                .layers = 2,
                .batch = 8,
                .steps = 20,
                .heldout = 256,
                .lr = 3e-3,
                .wd = 0.0,
                .capacity = 0,
                .aux = 1e-2,
                .z = 0,
                .bias_coeff = 1e-3,
                .score = MOE_SCORE_SOFTMAX,
                .balance = MOE_BALANCE_BIAS,
                .seed = 1234,
                .save_at = -1,
                .shards = 4};
    /* the options that take a value, by kind: a table, not a chain of ifs */
    const struct {
        const char *flag;
        int64_t *i;
        double *d;
        const char **s;
    } val[] = {
        {"--moe", &o->experts, NULL, NULL},
        {"--topk", &o->topk, NULL, NULL},
        {"--hidden", &o->hidden, NULL, NULL},
        {"--width", &o->width, NULL, NULL},
        {"--heads", &o->heads, NULL, NULL},
        {"--layers", &o->layers, NULL, NULL},
        {"--batch", &o->batch, NULL, NULL},
        {"--steps", &o->steps, NULL, NULL},
        {"--zero", &o->zero, NULL, NULL},
        {"--shards", &o->shards, NULL, NULL},
        {"--heldout", &o->heldout, NULL, NULL},
        {"--save-at", &o->save_at, NULL, NULL},
        {"--lr", NULL, &o->lr, NULL},
        {"--wd", NULL, &o->wd, NULL},
        {"--capacity", NULL, &o->capacity, NULL},
        {"--aux-coeff", NULL, &o->aux, NULL},
        {"--z-coeff", NULL, &o->z, NULL},
        {"--bias-coeff", NULL, &o->bias_coeff, NULL},
        {"--export", NULL, NULL, &o->export_dir},
        {"--init-hf", NULL, NULL, &o->init_hf},
        {"--data", NULL, NULL, &o->data},
        {"--save", NULL, NULL, &o->save},
        {"--resume", NULL, NULL, &o->resume},
        {"--dump", NULL, NULL, &o->dump},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        size_t k = 0, nval = sizeof val / sizeof val[0];
        while (k < nval && (strcmp(a, val[k].flag) != 0 || !v))
            k++;
        if (k < nval) {
            if (val[k].i)
                *val[k].i = strtoll(v, NULL, 10);
            else if (val[k].d)
                *val[k].d = strtod(v, NULL);
            else
                *val[k].s = v;
            i++;
            continue;
        }
        if (!strcmp(a, "--seed") && v) {
            o->seed = strtoull(v, NULL, 10);
            i++;
            continue;
        }
        if (!strcmp(a, "--score") && v) {
            o->score = !strcmp(v, "sigmoid") ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX;
            i++;
            continue;
        }
        if (!strcmp(a, "--balance") && v) {
            o->balance = !strcmp(v, "aux")    ? MOE_BALANCE_AUX
                         : !strcmp(v, "none") ? MOE_BALANCE_NONE
                                              : MOE_BALANCE_BIAS;
            i++;
            continue;
        }
        if (!strcmp(a, "--bench")) { /* then the dense model too: key=value lines */
            o->bench = 1;
            continue;
        }
        if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
            continue;
        }
        usage();
        return -1;
    }
    if (o->layers < 1 || o->layers > MAXL || o->experts < 0 || o->experts > 64 ||
        (o->experts > 0 && (o->topk < 1 || o->topk > o->experts)) || o->width % o->heads) {
        usage();
        return -1;
    }
    return 0;
}

/* Builds md's mesh and parameters (or restores them), trains md->o.steps steps, prints the
 * held-out loss; *secs_out the training loop's wall time. Collective. */
static dt_status train_run(model *md, const names *train, const names *test, double *secs_out)
{
    const opts *o = &md->o;
    int root = dt_client_id() == 0;
    dt_status st = DT_OK;
    int64_t P = dt_num_global_devices(DT_DEVICE_CPU);
    const char *dn[1] = {"batch"};
    st = dt_mesh_create("moe", 1, dn, &P, DT_DEVICE_CPU, &md->mesh);
    if (st == DT_OK && (o->batch % P || (o->experts > 0 && o->experts % P))) {
        fprintf(stderr,
                "train_moe: --batch %lld and --moe %lld must be multiples of the %lld "
                "devices\n",
                (long long)o->batch, (long long)o->experts, (long long)P);
        return DT_ERR_INVALID_ARGUMENT;
    }
    if (st == DT_OK && o->shards > 0 && (o->batch % o->shards || o->shards % P)) {
        fprintf(stderr,
                "train_moe: --batch %lld must be a multiple of --shards %lld, and that of "
                "the %lld devices (--shards 0: per-device sums)\n",
                (long long)o->batch, (long long)o->shards, (long long)P);
        return DT_ERR_INVALID_ARGUMENT;
    }
    if (st == DT_OK && o->shards > 0) {
        const float one = 1.0f;
        dt_layout *r1 = NULL;
        st = dt_layout_replicated(md->mesh, 1, &r1);
        if (st == DT_OK)
            st = dt_tensor_filled(r1, DT_DTYPE_F32, &o->width, &one, &md->ones);
        dt_layout_destroy(r1);
    }
    md->cfg = (moe_config)MOE_CONFIG_INIT;
    md->cfg.experts = o->experts, md->cfg.topk = o->topk, md->cfg.hidden = o->hidden;
    md->cfg.score = o->score, md->cfg.balance = o->balance;
    md->cfg.capacity_factor = o->capacity, md->cfg.group = T;
    md->cfg.aux_coeff = o->aux, md->cfg.z_coeff = o->z, md->cfg.bias_coeff = o->bias_coeff;
    md->cfg.shards = o->shards;
    if (st == DT_OK)
        st = model_create(md);
    int64_t step = 0;
    if (st == DT_OK && o->resume)
        st = checkpoint(md, o->resume, &step, 0);
    if (st == DT_OK && o->init_hf)
        st = hf_io(md, o->init_hf, 0);
    if (st == DT_OK && o->zero > 0 && (o->save || o->resume)) {
        fprintf(stderr, "train_moe: --zero with --save/--resume is not supported yet\n");
        st = DT_ERR_UNSUPPORTED;
    }
    if (st == DT_OK && o->zero > 0) {
        /* ZeRO over `batch` for the replicated (dense) parameters; the experts, sharded over
         * the same dim, already hold 1 / EP of their state each and step by dt_adam_step */
        dt_zero_opts zo = DT_ZERO_OPTS_INIT;
        zo.stage = (int)o->zero;
        dt_optim_hparams hp = DT_OPTIM_ADAMW_INIT;
        hp.lr = (float)o->lr;
        hp.weight_decay = (float)o->wd;
        const char *nm[MAXP];
        dt_tensor *ps[MAXP];
        for (int i = 0; i < md->np; i++)
            if (!(o->experts > 0 && dt_tensor_rank(md->p[i]) == 3)) {
                md->dense_idx[md->ndense] = i;
                nm[md->ndense] = md->names[i];
                ps[md->ndense++] = md->p[i];
            }
        st = dt_zero_create(md->mesh, &zo, &md->zero);
        if (st == DT_OK)
            st = dt_zero_add_group(md->zero, md->ndense, nm, ps, &hp, NULL);
    }
    if (st != DT_OK)
        return st;
    int64_t B = o->batch, N = B * T, K = o->topk, L = o->layers;
    int64_t E = o->experts;
    if (root && !o->quiet)
        printf("train_moe: %lld devices (EP %lld), %s %lld experts top %lld, %d params%s\n",
               (long long)P, (long long)(E > 0 ? P : 0), E > 0 ? "moe" : "dense", (long long)E,
               (long long)K, md->np, o->resume ? " (resumed)" : "");
    if (o->dump && step == 0)
        for (int i = 0; i < md->np && st == DT_OK; i++) {
            char nm[80];
            snprintf(nm, sizeof nm, "init_%s", md->names[i]);
            st = dump_tensor(o->dump, nm, md->p[i]);
        }
    int32_t *hx = malloc((size_t)N * sizeof *hx), *hy = malloc((size_t)N * sizeof *hy);
    int64_t *choices = calloc((size_t)(L * N * K), sizeof *choices);
    moe_route_stats stats[MAXL];
    FILE *dumpf = NULL;
    if (o->dump && root) {
        char path[512];
        snprintf(path, sizeof path, "%s/steps.txt", o->dump);
        dumpf = fopen(path, "w");
    }
    dt_adam_opts ao = DT_ADAMW_OPTS_INIT;
    ao.lr = (float)o->lr;
    ao.weight_decay = (float)o->wd;
    struct timespec ts0, ts1;
    moe_routed_timers(&md->phase[0], &md->phase[1], &md->phase[2], &md->phase[3], 1);
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    for (; step < o->steps && st == DT_OK; step++) {
        dt_tensor *ids = NULL, *lab = NULL, *loss = NULL, *total = NULL;
        dt_tape *tape = NULL;
        st = batch_tensors(md, train, step * B, B, &ids, &lab, hx, hy);
        if (st == DT_OK)
            st = dt_tape_create(NULL, &tape);
        for (int i = 0; i < md->np && st == DT_OK; i++)
            st = dt_tape_watch(tape, md->p[i], i);
        if (st == DT_OK)
            st = dt_tape_begin(tape);
        if (st == DT_OK)
            st = forward(md, ids, lab, &loss, &total, stats, choices);
        if (st == DT_OK)
            st = dt_tape_end(tape);
        dt_backward_opts bo = DT_BACKWARD_OPTS_INIT;
        if (st == DT_OK)
            st = dt_tape_backward(tape, total, NULL, 1.0f, &bo);
        double lv = 0, tv = 0;
        if (st == DT_OK)
            st = dt_item(loss, &lv);
        if (st == DT_OK)
            st = dt_item(total, &tv);
        if (o->dump && step == 0)
            for (int i = 0; i < md->np && st == DT_OK; i++) {
                const dt_tensor *g = NULL;
                char nm[80];
                snprintf(nm, sizeof nm, "grad0_%s", md->names[i]);
                st = dt_tape_grad(tape, i, &g);
                if (st == DT_OK)
                    st = dump_tensor(o->dump, nm, g);
            }
        for (int i = 0; i < md->np && st == DT_OK; i++) {
            const dt_tensor *g = NULL;
            if (md->zero && !(o->experts > 0 && dt_tensor_rank(md->p[i]) == 3))
                continue; /* dt_zero_step below */
            st = dt_tape_grad(tape, i, &g);
            if (st == DT_OK)
                st = dt_adam_step(&ao, step + 1, md->p[i], g, md->m[i], md->v[i]);
        }
        if (st == DT_OK && md->zero) {
            dt_tensor *gs[MAXP];
            for (int j = 0; j < md->ndense && st == DT_OK; j++) {
                const dt_tensor *g = NULL;
                st = dt_tape_grad(tape, md->dense_idx[j], &g);
                gs[j] = (dt_tensor *)g; /* read, not modified */
            }
            if (st == DT_OK)
                st = dt_zero_step(md->zero, gs, NULL);
        }
        int64_t dropped = 0;
        for (int64_t l = 0; l < L && E > 0 && st == DT_OK; l++) {
            dropped += stats[l].dropped;
            if (o->balance == MOE_BALANCE_BIAS)
                moe_bias_update(&md->cfg, stats[l].load, md->bias[l]);
        }
        if (st == DT_OK && root && !o->quiet) {
            printf("step %lld loss %.9g total %.9g", (long long)step + 1, lv, tv);
            if (E > 0) {
                printf(" dropped %.4f load", (double)dropped / (double)(L * N * K));
                for (int64_t e = 0; e < E; e++)
                    printf("%s%lld", e ? "," : " ", (long long)stats[L - 1].load[e]);
            }
            printf("\n");
        }
        if (dumpf && st == DT_OK) {
            fprintf(dumpf, "step %lld loss %.9g total %.9g\n", (long long)step + 1, lv, tv);
            fprintf(dumpf, "ids");
            for (int64_t i = 0; i < N; i++)
                fprintf(dumpf, " %d", hx[i]);
            fprintf(dumpf, "\nlabels");
            for (int64_t i = 0; i < N; i++)
                fprintf(dumpf, " %d", hy[i]);
            fprintf(dumpf, "\n");
            if (step == 0) {
                fprintf(dumpf, "choices");
                for (int64_t i = 0; i < L * N * K && E > 0; i++)
                    fprintf(dumpf, " %lld", (long long)choices[i]);
                fprintf(dumpf, "\n");
            }
        }
        dt_tensor_destroy(total);
        dt_tensor_destroy(loss);
        dt_tensor_destroy(lab);
        dt_tensor_destroy(ids);
        dt_tape_destroy(tape);
        if (st == DT_OK && o->save && step + 1 == o->save_at) {
            int64_t s1 = step + 1;
            st = checkpoint(md, o->save, &s1, 1);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    moe_routed_timers(&md->phase[0], &md->phase[1], &md->phase[2], &md->phase[3], 0);
    double secs = *secs_out =
        (double)(ts1.tv_sec - ts0.tv_sec) + 1e-9 * (double)(ts1.tv_nsec - ts0.tv_nsec);
    /* held-out loss over the test names, in batches of B */
    double held = 0;
    int64_t nb = 0;
    for (int64_t first = 0; st == DT_OK && first + B <= test->n; first += B, nb++) {
        dt_tensor *ids = NULL, *lab = NULL, *loss = NULL;
        double lv = 0;
        st = batch_tensors(md, test, first, B, &ids, &lab, hx, hy);
        if (st == DT_OK)
            st = forward(md, ids, lab, &loss, NULL, NULL, NULL);
        if (st == DT_OK)
            st = dt_item(loss, &lv);
        held += lv;
        dt_tensor_destroy(loss);
        dt_tensor_destroy(lab);
        dt_tensor_destroy(ids);
    }
    if (st == DT_OK && root) {
        printf("heldout %.17g\n", nb ? held / (double)nb : 0.0);
        if (!o->quiet)
            printf("train_seconds %.3f tokens_per_s %.1f\n", secs,
                   secs > 0 ? (double)(o->steps * N) / secs : 0.0);
    }
    if (dumpf)
        fclose(dumpf);
    free(choices);
    free(hx);
    free(hy);
    if (st == DT_OK && o->save && o->save_at < 0)
        st = checkpoint(md, o->save, &step, 1);
    if (st == DT_OK && o->export_dir && o->experts > 0)
        st = hf_io(md, o->export_dir, 1);
    return st;
}

int main(int argc, char **argv)
{
    dt_status st = dt_init(&argc, &argv, NULL);
    if (st != DT_OK) {
        fprintf(stderr, "train_moe: dt_init: %s\n", dt_last_error());
        return 1;
    }
    model *md = calloc(1, sizeof *md), *dense = NULL;
    int rc = 1, root = dt_client_id() == 0;
    names all = {0}, train = {0}, test = {0};
    char err[256];
    if (parse(argc, argv, &md->o) != 0)
        goto out;
    const opts *o = &md->o;
    if (names_load(o->data, &all, err, sizeof err) != 0 ||
        names_split(&all, o->heldout, 42, &train, &test) != 0) {
        fprintf(stderr, "train_moe: %s\n", err);
        goto out;
    }
    double secs = 0;
    st = train_run(md, &train, &test, &secs);
    if (st == DT_OK && md->o.bench) {
        /* the dense model of equal active parameters (topk * hidden units), the same run */
        double r = md->phase[0], d = md->phase[1], x = md->phase[2], c = md->phase[3];
        double dsecs = 0;
        dense = calloc(1, sizeof *dense);
        st = dense ? DT_OK : DT_ERR_NO_MEMORY;
        if (st == DT_OK) {
            dense->o = md->o;
            dense->o.experts = 0;
            dense->o.save = dense->o.resume = dense->o.dump = NULL;
            st = train_run(dense, &train, &test, &dsecs);
        }
        if (st == DT_OK && root) {
            double tok = (double)(md->o.steps * md->o.batch * T);
            printf("moe_step_tokens_per_s=%.1f dense_step_tokens_per_s=%.1f "
                   "moe_vs_dense=%.3f\n",
                   tok / secs, tok / dsecs, dsecs / secs);
            /* forward phases over the whole MoE training step (forward and backward) */
            printf("moe_dispatch_combine_share=%.3f moe_route_share=%.3f "
                   "moe_experts_share=%.3f\n",
                   (d + c) / secs, r / secs, x / secs);
        }
    }

    if (st != DT_OK)
        fprintf(stderr, "train_moe: %s: %s\n", dt_status_name(st), dt_last_error());
    else
        rc = 0;
out:
    if (md) {
        dt_zero_destroy(md->zero);
        dt_tensor_destroy(md->ones);
    }
    if (dense) {
        dt_zero_destroy(dense->zero);
        dt_tensor_destroy(dense->ones);
    }
    for (int i = 0; md && i < md->np; i++) {
        dt_tensor_destroy(md->p[i]);
        dt_tensor_destroy(md->m[i]);
        dt_tensor_destroy(md->v[i]);
    }
    for (int i = 0; dense && i < dense->np; i++) {
        dt_tensor_destroy(dense->p[i]);
        dt_tensor_destroy(dense->m[i]);
        dt_tensor_destroy(dense->v[i]);
    }
    if (dense)
        dt_mesh_destroy(dense->mesh);
    free(dense);
    if (md)
        dt_mesh_destroy(md->mesh);
    free(md);
    names_free(&all);
    names_free(&train);
    names_free(&test);
    dt_finalize();
    return rc;
}
