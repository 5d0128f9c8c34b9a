/* vit/model: the vision transformer's parameters, forward pass and training pass, every step
 * a public op (dt_reshape, dt_permute, dt_expand, dt_einsum, dt_softmax, dt_layer_norm,
 * dt_gelu, dt_sum, dt_mean, dt_add, dt_cross_entropy), recorded by the autograd tape. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S        VIT_SHARDS
#define M        VIT_GROUPS
#define NAME_LEN 32
#define LN_EPS   1e-5f

/* Parameters of one block, in the order they are registered. */
enum { B_Q, B_K, B_V, B_O, B_OB, B_W1, B_B1, B_W2, B_B2, B_NPARAMS };
/* The model's own parameters around the blocks. */
enum { P_PATCH, P_POS, P_HEAD, P_HEADB, P_NGLOBAL };
_Static_assert(P_NGLOBAL + VIT_MAX_LAYERS * B_NPARAMS == VIT_MAX_PARAMS, "VIT_MAX_PARAMS");

struct vit {
    dt_mesh *mesh;
    vit_config cfg;
    int64_t tokens, pix, head_dim, cols; /* P, K = patch^2, E = D / M, F = mlp / M */
    int nparams;
    dt_tensor *param[VIT_MAX_PARAMS];
    char names[VIT_MAX_PARAMS][NAME_LEN];
    const char *name_ptr[VIT_MAX_PARAMS];
    dt_tensor *ones, *zeros;                /* [D]: the layer norms' fixed gain and bias */
    dt_layout *l_images, *l_labels, *l_act; /* [S, b, 8, 8], [S, b], [S, b, P, D] */
    dt_layout *l_rep3, *l_rep2;             /* replicated: the loss's logits and labels */
    dt_tape *tape;
};

static char own_error[256];

const char *vit_last_error(void)
{
    return own_error[0] ? own_error : dt_last_error();
}

/* ---- a pool of intermediate tensors ---------------------------------------------------------
 * Each helper below takes the pool, does nothing and returns NULL once a call has failed
 * (p->st), and otherwise returns its output, owned by the pool until pool_free (the tape
 * retains what the backward pass needs). So a forward pass reads as its formulas, and the
 * first failure is the status it returns. */
typedef struct pool {
    dt_status st;
    dt_tensor **t;
    int n, cap;
} pool;

static dt_tensor *keep(pool *p, dt_status st, dt_tensor *t)
{
    if (p->st == DT_OK)
        p->st = st;
    if (p->st != DT_OK) {
        dt_tensor_destroy(t);
        return NULL;
    }
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        dt_tensor **nt = realloc(p->t, (size_t)cap * sizeof *nt);
        if (!nt) {
            snprintf(own_error, sizeof own_error, "vit: out of memory");
            p->st = DT_ERR_NO_MEMORY;
            dt_tensor_destroy(t);
            return NULL;
        }
        p->t = nt;
        p->cap = cap;
    }
    p->t[p->n++] = t;
    return t;
}

static void pool_free(pool *p)
{
    for (int i = 0; i < p->n; i++)
        dt_tensor_destroy(p->t[i]);
    free(p->t);
    *p = (pool){DT_OK, NULL, 0, 0};
}

static dt_tensor *einsum(pool *p, const char *eq, const dt_tensor *a, const dt_tensor *b)
{
    dt_tensor *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    const dt_tensor *xs[2] = {a, b};
    dt_status st = dt_einsum(eq, xs, 2, &t);
    return keep(p, st, t);
}

static dt_tensor *add(pool *p, const dt_tensor *a, const dt_tensor *b)
{
    dt_tensor *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    dt_status st = dt_add(a, b, NULL, &t);
    return keep(p, st, t);
}

static dt_tensor *reshape(pool *p, const dt_tensor *x, int rank, const int64_t *shape)
{
    dt_tensor *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    dt_status st = dt_reshape(x, rank, shape, &t);
    return keep(p, st, t);
}

static dt_tensor *permute(pool *p, const dt_tensor *x, const int *perm)
{
    dt_tensor *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    dt_status st = dt_permute(x, perm, &t);
    return keep(p, st, t);
}

static dt_tensor *expand(pool *p, const dt_tensor *x, int rank, const int64_t *shape)
{
    dt_tensor *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    dt_status st = dt_expand(x, rank, shape, &t);
    return keep(p, st, t);
}

static dt_tensor *sum_axis(pool *p, const dt_tensor *x, int axis)
{
    dt_tensor *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    dt_status st = dt_sum(x, &axis, 1, 0, &t);
    return keep(p, st, t);
}

/* x [S, M, ...] summed over the groups and reduced at once (dt_add would keep a partial sum
 * partial by adding its other operand on one device only: another order of the additions). */
static dt_tensor *sum_groups(pool *p, const vit *m, const dt_tensor *x)
{
    dt_tensor *s = sum_axis(p, x, 1), *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    dt_status st = dt_relayout(s, m->l_act, &t);
    return keep(p, st, t);
}

static dt_tensor *mean_axis(pool *p, const dt_tensor *x, int axis)
{
    dt_tensor *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    dt_status st = dt_mean(x, &axis, 1, 0, &t);
    return keep(p, st, t);
}

static dt_tensor *scale(pool *p, const dt_tensor *x, float alpha)
{
    dt_tensor *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    dt_status st = dt_scale(x, alpha, &t);
    return keep(p, st, t);
}

static dt_tensor *softmax_last(pool *p, const dt_tensor *x)
{
    dt_tensor *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    dt_status st = dt_softmax(x, -1, &t);
    return keep(p, st, t);
}

static dt_tensor *gelu(pool *p, const dt_tensor *x)
{
    dt_tensor *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    dt_status st = dt_gelu(x, &t);
    return keep(p, st, t);
}

/* Layer norm over the last dim without its own gain and bias (fixed 1 and 0): a gain and bias
 * would be summed over every row of the batch, which is not a sum of two terms. */
static dt_tensor *norm(pool *p, const vit *m, const dt_tensor *x)
{
    dt_tensor *t = NULL;
    if (p->st != DT_OK)
        return NULL;
    dt_status st = dt_layer_norm(x, m->ones, m->zeros, LN_EPS, &t);
    return keep(p, st, t);
}

/* A parameter as one copy per batch shard: [S, w's shape...] (a new dim, replicated; its
 * gradient is the sum of the shards' two gradients, partial over `batch`). */
static dt_tensor *per_shard(pool *p, const dt_tensor *w)
{
    int r = dt_tensor_rank(w);
    int64_t shape[DT_MAX_RANK];
    shape[0] = S;
    for (int d = 0; d < r; d++)
        shape[1 + d] = -1;
    return expand(p, w, r + 1, shape);
}

/* A bias [n] as [S, 1, ..., 1, n] of rank `rank`, to add to [S, ..., n]. */
static dt_tensor *per_shard_bias(pool *p, const dt_tensor *b, int rank)
{
    int64_t shape[DT_MAX_RANK];
    shape[0] = S;
    for (int d = 1; d < rank - 1; d++)
        shape[d] = 1;
    shape[rank - 1] = dt_tensor_shape(b)[0];
    return expand(p, b, rank, shape);
}

/* x [S, b, P, D] as one copy per group: [S, M, b, P, D] (the gradient sums the groups' two
 * gradients: partial over `model`, reduced by the layer norm's backward before anything else
 * sees it). */
static dt_tensor *per_group(pool *p, const dt_tensor *x)
{
    const int64_t *s = p->st == DT_OK ? dt_tensor_shape(x) : NULL;
    if (!s)
        return NULL;
    int64_t one[5] = {s[0], 1, s[1], s[2], s[3]}, all[5] = {-1, M, -1, -1, -1};
    return expand(p, reshape(p, x, 5, one), 5, all);
}

/* ---- parameters ------------------------------------------------------------------------------ */

static dt_status make_param(vit *m, const char *name, int rank, const int64_t *shape, int grouped,
                            double std, uint64_t stream)
{
    const char *specs[DT_MAX_RANK];
    int has_model = dt_mesh_dim_index(m->mesh, "model") >= 0;
    for (int d = 0; d < rank; d++)
        specs[d] = d == 0 && grouped && has_model ? "model" : DT_UNSHARDED;
    dt_layout *l = NULL;
    dt_tensor *t = NULL;
    dt_status st = dt_layout_create(m->mesh, rank, specs, &l);
    if (st == DT_OK && std > 0)
        st = dt_random_normal(l, shape, DT_DTYPE_F32, 0.0, std, m->cfg.seed, stream, &t);
    else if (st == DT_OK)
        st = dt_tensor_zeros(l, DT_DTYPE_F32, shape, &t);
    dt_layout_destroy(l);
    if (st != DT_OK)
        return st;
    int i = m->nparams++;
    m->param[i] = t;
    snprintf(m->names[i], NAME_LEN, "%s", name);
    m->name_ptr[i] = m->names[i];
    return DT_OK;
}

void vit_destroy(vit *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->nparams; i++)
        dt_tensor_destroy(m->param[i]);
    dt_tensor_destroy(m->ones);
    dt_tensor_destroy(m->zeros);
    dt_layout_destroy(m->l_images);
    dt_layout_destroy(m->l_labels);
    dt_layout_destroy(m->l_act);
    dt_layout_destroy(m->l_rep3);
    dt_layout_destroy(m->l_rep2);
    dt_tape_destroy(m->tape);
    dt_mesh_destroy(m->mesh);
    free(m);
}

dt_status vit_create(const dt_mesh *mesh, const vit_config *cfg, vit **out)
{
    own_error[0] = '\0';
    if ((cfg->patch != 2 && cfg->patch != 4) || cfg->dim < M || cfg->dim % M || cfg->mlp < M ||
        cfg->mlp % M || cfg->layers < 1 || cfg->layers > VIT_MAX_LAYERS) {
        snprintf(own_error, sizeof own_error,
                 "vit: patch %lld (2 or 4), dim %lld and mlp %lld (multiples of %d), layers "
                 "%lld (1..%d)",
                 (long long)cfg->patch, (long long)cfg->dim, (long long)cfg->mlp, M,
                 (long long)cfg->layers, VIT_MAX_LAYERS);
        return DT_ERR_INVALID_ARGUMENT;
    }
    vit *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(own_error, sizeof own_error, "vit: out of memory");
        return DT_ERR_NO_MEMORY;
    }
    m->mesh = dt_mesh_retain(mesh);
    m->cfg = *cfg;
    int64_t g = VIT_SIDE / cfg->patch, D = cfg->dim;
    m->tokens = g * g;
    m->pix = cfg->patch * cfg->patch;
    m->head_dim = D / M;
    m->cols = cfg->mlp / M;
    int64_t P = m->tokens, K = m->pix, E = m->head_dim, F = m->cols, C = VIT_CLASSES;

    /* Normal weights of std 1/sqrt(fan-in), a small head, zero biases; one Philox stream per
     * parameter, so every layout of every mesh draws the same global values. */
    int64_t s_patch[2] = {K, D}, s_pos[2] = {P, D}, s_head[2] = {D, C}, s_headb[1] = {C};
    dt_status st = make_param(m, "patch/weight", 2, s_patch, 0, 1.0 / sqrt((double)K), 1);
    if (st == DT_OK)
        st = make_param(m, "pos", 2, s_pos, 0, 0.1, 2);
    if (st == DT_OK)
        st = make_param(m, "head/weight", 2, s_head, 0, 0.1 / sqrt((double)D), 3);
    if (st == DT_OK)
        st = make_param(m, "head/bias", 1, s_headb, 0, 0.0, 4);
    for (int64_t l = 0; st == DT_OK && l < cfg->layers; l++) {
        static const char *const bn[B_NPARAMS] = {"attn/q", "attn/k",      "attn/v",
                                                  "attn/o", "attn/o_bias", "mlp/w1",
                                                  "mlp/b1", "mlp/w2",      "mlp/b2"};
        int64_t s_qkv[3] = {M, D, E}, s_o[3] = {M, E, D}, s_d[1] = {D}, s_w1[3] = {M, D, F},
                s_b1[2] = {M, F}, s_w2[3] = {M, F, D};
        const int64_t *shapes[B_NPARAMS] = {s_qkv, s_qkv, s_qkv, s_o, s_d, s_w1, s_b1, s_w2, s_d};
        const int ranks[B_NPARAMS] = {3, 3, 3, 3, 1, 3, 2, 3, 1};
        const int grouped[B_NPARAMS] = {1, 1, 1, 1, 0, 1, 1, 1, 0};
        const double sd = 1.0 / sqrt((double)D), sf = 1.0 / sqrt((double)cfg->mlp);
        const double stds[B_NPARAMS] = {sd, sd, sd, 0.5 * sd, 0.0, sd, 0.0, 0.5 * sf, 0.0};
        for (int k = 0; st == DT_OK && k < B_NPARAMS; k++) {
            char name[NAME_LEN];
            snprintf(name, sizeof name, "block%lld/%s", (long long)l, bn[k]);
            st = make_param(m, name, ranks[k], shapes[k], grouped[k], stds[k],
                            (uint64_t)(16 + 16 * l + k));
        }
    }
    dt_layout *rep = NULL;
    float one = 1.0f;
    const char *s_img[4] = {"batch", DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED};
    if (st == DT_OK)
        st = dt_layout_replicated(mesh, 1, &rep);
    if (st == DT_OK)
        st = dt_tensor_filled(rep, DT_DTYPE_F32, &D, &one, &m->ones);
    if (st == DT_OK)
        st = dt_tensor_zeros(rep, DT_DTYPE_F32, &D, &m->zeros);
    if (st == DT_OK)
        st = dt_layout_create(mesh, 4, s_img, &m->l_images);
    if (st == DT_OK)
        st = dt_layout_create(mesh, 2, s_img, &m->l_labels);
    if (st == DT_OK)
        st = dt_layout_create(mesh, 4, s_img, &m->l_act);
    if (st == DT_OK)
        st = dt_layout_replicated(mesh, 3, &m->l_rep3);
    if (st == DT_OK)
        st = dt_layout_replicated(mesh, 2, &m->l_rep2);
    if (st == DT_OK)
        st = dt_tape_create(NULL, &m->tape);
    for (int i = 0; st == DT_OK && i < m->nparams; i++)
        st = dt_tape_watch(m->tape, m->param[i], i);
    dt_layout_destroy(rep);
    if (st != DT_OK) {
        vit_destroy(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

int vit_num_params(const vit *m)
{
    return m->nparams;
}

dt_tensor *const *vit_params(const vit *m)
{
    return m->param;
}

const char *const *vit_param_names(const vit *m)
{
    return m->name_ptr;
}

const dt_layout *vit_image_layout(const vit *m)
{
    return m->l_images;
}

const dt_layout *vit_label_layout(const vit *m)
{
    return m->l_labels;
}

/* ---- forward -----------------------------------------------------------------------------------
 */

/* Images [S, b, 8, 8] to tokens [S, b, P, patch^2]: the rows and columns split into
 * (grid, patch) pairs, the two patch dims moved last, merged. */
static dt_tensor *patches(pool *p, const vit *m, const dt_tensor *img)
{
    int64_t b = dt_tensor_shape(img)[1], ps = m->cfg.patch, g = VIT_SIDE / ps;
    int64_t split[6] = {S, b, g, ps, g, ps}, merged[4] = {S, b, m->tokens, m->pix};
    static const int perm[6] = {0, 1, 2, 4, 3, 5}; /* [S, b, gy, gx, py, px] */
    return reshape(p, permute(p, reshape(p, img, 6, split), perm), 4, merged);
}

/* Pre-norm self-attention over the tokens, one head per group: x + o(attn(norm(x))). */
static dt_tensor *attention(pool *p, const vit *m, dt_tensor *const *w, const dt_tensor *x)
{
    dt_tensor *h = per_group(p, norm(p, m, x)); /* [S, M, b, P, D] */
    dt_tensor *q = einsum(p, "smbpd,smde->smbpe", h, per_shard(p, w[B_Q]));
    dt_tensor *k = einsum(p, "smbpd,smde->smbpe", h, per_shard(p, w[B_K]));
    dt_tensor *v = einsum(p, "smbpd,smde->smbpe", h, per_shard(p, w[B_V]));
    dt_tensor *scores =
        scale(p, einsum(p, "smbpe,smbqe->smbpq", q, k), (float)(1.0 / sqrt((double)m->head_dim)));
    dt_tensor *ctx = einsum(p, "smbpq,smbqe->smbpe", softmax_last(p, scores), v);
    /* Each group's share of the output projection, summed over the groups. */
    dt_tensor *o = sum_groups(p, m, einsum(p, "smbpe,smed->smbpd", ctx, per_shard(p, w[B_O])));
    return add(p, add(p, x, o), per_shard_bias(p, w[B_OB], 4));
}

/* Pre-norm MLP, its hidden columns in groups: x + w2(gelu(w1 norm(x) + b1)) + b2. */
static dt_tensor *mlp(pool *p, const vit *m, dt_tensor *const *w, const dt_tensor *x)
{
    int64_t b1_shape[4] = {M, 1, 1, m->cols}, b1_rep[5] = {S, M, 1, 1, m->cols};
    dt_tensor *h = per_group(p, norm(p, m, x));
    dt_tensor *u = einsum(p, "smbpd,smdf->smbpf", h, per_shard(p, w[B_W1]));
    dt_tensor *b1 = expand(p, reshape(p, w[B_B1], 4, b1_shape), 5, b1_rep);
    dt_tensor *y = einsum(p, "smbpf,smfd->smbpd", gelu(p, add(p, u, b1)), per_shard(p, w[B_W2]));
    return add(p, add(p, x, sum_groups(p, m, y)), per_shard_bias(p, w[B_B2], 4));
}

dt_status vit_forward(const vit *m, const dt_tensor *images, dt_tensor **logits_out)
{
    own_error[0] = '\0';
    pool p = {DT_OK, NULL, 0, 0};
    int64_t pos_shape[4] = {S, 1, m->tokens, m->cfg.dim};
    dt_tensor *const *w = m->param;
    dt_tensor *x = einsum(&p, "sbpk,skd->sbpd", patches(&p, m, images), per_shard(&p, w[P_PATCH]));
    x = add(&p, x, expand(&p, w[P_POS], 4, pos_shape)); /* learned positions, broadcast */
    for (int64_t l = 0; l < m->cfg.layers; l++) {
        dt_tensor *const *bw = w + P_NGLOBAL + l * B_NPARAMS;
        x = mlp(&p, m, bw, attention(&p, m, bw, x));
    }
    /* Mean over the tokens, a last norm, the classifier. */
    dt_tensor *pooled = norm(&p, m, mean_axis(&p, x, 2)); /* [S, b, D] */
    dt_tensor *logits = add(&p, einsum(&p, "sbd,sdc->sbc", pooled, per_shard(&p, w[P_HEAD])),
                            per_shard_bias(&p, w[P_HEADB], 3));
    dt_status st = p.st;
    if (st == DT_OK)
        *logits_out = dt_tensor_retain(logits);
    pool_free(&p);
    return st;
}

dt_status vit_loss(const vit *m, const dt_tensor *logits, const dt_tensor *labels,
                   dt_tensor **loss_out)
{
    /* The rows gathered first: each device then sums every row's loss in row order, as one
     * device does (sharded rows would leave a sum of per-device sums, rounded otherwise). The
     * gradient is per row, so the backward pass only slices it back. */
    dt_tensor *rl = NULL, *ry = NULL;
    dt_status st = dt_relayout(logits, m->l_rep3, &rl);
    if (st == DT_OK)
        st = dt_relayout(labels, m->l_rep2, &ry);
    if (st == DT_OK)
        st = dt_cross_entropy(rl, ry, -1, loss_out);
    dt_tensor_destroy(rl);
    dt_tensor_destroy(ry);
    return st;
}

dt_status vit_grads(vit *m, const dt_tensor *images, const dt_tensor *labels, double *loss_out,
                    dt_tensor **grads_out)
{
    own_error[0] = '\0';
    dt_tensor *logits = NULL, *loss = NULL;
    double lv = 0;
    dt_status st = dt_tape_begin(m->tape);
    if (st != DT_OK)
        return st;
    st = vit_forward(m, images, &logits);
    if (st == DT_OK)
        st = vit_loss(m, logits, labels, &loss);
    dt_status st_end = dt_tape_end(m->tape);
    if (st == DT_OK)
        st = st_end;
    dt_tensor_destroy(logits); /* the tape keeps what the backward pass needs */
    dt_backward_opts bo = DT_BACKWARD_OPTS_INIT;
    bo.require_all = 1;
    if (st == DT_OK)
        st = dt_item(loss, &lv);
    if (st == DT_OK)
        st = dt_tape_backward(m->tape, loss, NULL, 1.0f, &bo);
    int n = 0;
    for (; st == DT_OK && n < m->nparams; n++)
        st = dt_tape_take_grad(m->tape, n, &grads_out[n]);
    if (st != DT_OK) {
        for (int i = 0; i < n; i++) {
            dt_tensor_destroy(grads_out[i]);
            grads_out[i] = NULL;
        }
        dt_tape_reset(m->tape);
    } else {
        *loss_out = lv;
    }
    dt_tensor_destroy(loss);
    return st;
}
