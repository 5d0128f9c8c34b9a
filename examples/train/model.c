/* train/model: parameters, input packing, forward/backward and evaluation of the MLP. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

struct mlp {
    dt_mesh *mesh;
    int64_t inputs, hidden, classes;
    dt_layout *l_w1, *l_b1, *l_w2, *l_b2;
    dt_layout *l_rows2; /* [batch, -]: inputs, logits */
    dt_layout *l_rows1; /* [batch]: labels */
    dt_layout *l_rep2;  /* replicated 2-D: logits gathered for the accuracy */
    dt_tensor *param[MLP_NPARAMS];
    dt_zero *zero; /* stage 3: the parameters' owner, group l = layer l + 1 */
};

static const char *const names[MLP_NPARAMS] = {"layer1/weight", "layer1/bias", "layer2/weight",
                                               "layer2/bias"};
static char own_error[160];

const char *mlp_last_error(void)
{
    return own_error[0] ? own_error : dt_last_error();
}

static dt_status no_memory(void)
{
    snprintf(own_error, sizeof own_error, "train_mlp: out of memory");
    return DT_ERR_NO_MEMORY;
}

dt_tensor *const *mlp_params(const mlp *m)
{
    return m->param;
}

const char *const *mlp_param_names(void)
{
    return names;
}

dt_status mlp_attach(mlp *m, dt_zero *zero, const dt_optim_hparams *hp, int stage3)
{
    if (!stage3)
        return dt_zero_add_group(zero, MLP_NPARAMS, names, m->param, hp, NULL);
    dt_status st = DT_OK;
    for (int l = 0; st == DT_OK && l < 2; l++)
        st = dt_zero_add_group(zero, 2, names + 2 * l, m->param + 2 * l, hp, NULL);
    for (int i = 0; st == DT_OK && i < MLP_NPARAMS; i++) {
        dt_tensor_destroy(m->param[i]); /* the shards in the optimizer hold the values */
        m->param[i] = NULL;
    }
    if (st == DT_OK)
        m->zero = zero;
    return st;
}

/* Layer l's weight and bias: the model's own, or (stage 3) gathered by the optimizer, with
 * layer `next`'s gather (>= 0) started to move while this one computes. */
static dt_status layer_in(const mlp *m, int l, int next, const dt_tensor **w, const dt_tensor **b)
{
    if (!m->zero) {
        *w = m->param[2 * l];
        *b = m->param[2 * l + 1];
        return DT_OK;
    }
    dt_tensor *tw = NULL, *tb = NULL;
    dt_status st = dt_zero_gather(m->zero, l);
    if (st == DT_OK && next >= 0)
        st = dt_zero_prefetch(m->zero, next);
    if (st == DT_OK)
        st = dt_zero_param(m->zero, 2 * l, &tw);
    if (st == DT_OK)
        st = dt_zero_param(m->zero, 2 * l + 1, &tb);
    *w = tw;
    *b = tb;
    return st;
}

/* Done with layer l's parameters for now (stage 3: released). */
static dt_status layer_out(const mlp *m, int l)
{
    return m->zero ? dt_zero_release(m->zero, l) : DT_OK;
}

/* A tensor of `layout` whose global value is the row-major host array `global` (rank 1 or
 * 2, element size of dtype): each local device gets its box, written through
 * dt_tensor_local_write (the devices may be GPUs). */
static dt_status pack_global(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                             const void *global, dt_tensor **out)
{
    const dt_mesh *mesh = dt_layout_mesh(layout);
    int rank = dt_layout_rank(layout), n = dt_mesh_num_local_devices(mesh);
    size_t es = dt_dtype_size(dtype);
    int64_t cols = rank == 2 ? shape[1] : 1;
    dt_tensor *t = NULL;
    void *buf = NULL;
    dt_status st = dt_tensor_zeros(layout, dtype, shape, &t);
    for (int k = 0; st == DT_OK && k < n; k++) {
        int64_t pos = dt_mesh_position(mesh, dt_mesh_local_device_id(mesh, k));
        int64_t off[2] = {0, 0}, sz[2] = {1, 1};
        if ((st = dt_layout_shard(layout, shape, pos, off, sz)) != DT_OK)
            break;
        int64_t r = sz[0], c = rank == 2 ? sz[1] : 1;
        buf = malloc((size_t)(r * c > 0 ? r * c : 1) * es);
        if (!buf) {
            st = no_memory();
            break;
        }
        for (int64_t i = 0; i < r; i++)
            memcpy((char *)buf + (size_t)(i * c) * es,
                   (const char *)global +
                       (size_t)((off[0] + i) * cols + (rank == 2 ? off[1] : 0)) * es,
                   (size_t)c * es);
        st = dt_tensor_local_write(t, k, buf, (size_t)(r * c) * es);
        free(buf);
        buf = NULL;
    }
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        t = NULL;
    }
    *out = t;
    return st;
}

/* A parameter from an f32 host array, cast to dtype. */
static dt_status make_param(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                            const float *global, dt_tensor **out)
{
    dt_tensor *f = NULL;
    dt_status st = pack_global(layout, DT_DTYPE_F32, shape, global, &f);
    if (st != DT_OK || dtype == DT_DTYPE_F32) {
        *out = f;
        return st;
    }
    st = dt_cast(f, dtype, out);
    dt_tensor_destroy(f);
    return st;
}

void mlp_destroy(mlp *m)
{
    if (!m)
        return;
    for (int i = 0; i < MLP_NPARAMS; i++)
        dt_tensor_destroy(m->param[i]);
    dt_layout_destroy(m->l_w1);
    dt_layout_destroy(m->l_b1);
    dt_layout_destroy(m->l_w2);
    dt_layout_destroy(m->l_b2);
    dt_layout_destroy(m->l_rows2);
    dt_layout_destroy(m->l_rows1);
    dt_layout_destroy(m->l_rep2);
    dt_mesh_destroy(m->mesh);
    free(m);
}

dt_status mlp_create(const dt_mesh *mesh, int64_t inputs, int64_t hidden, int64_t classes,
                     dt_dtype dtype, uint64_t seed, mlp **out)
{
    own_error[0] = '\0';
    mlp *m = calloc(1, sizeof *m);
    float *w1 = malloc((size_t)(inputs * hidden) * sizeof *w1);
    float *w2 = malloc((size_t)(hidden * classes) * sizeof *w2);
    float *zeros = calloc((size_t)(hidden > classes ? hidden : classes), sizeof *zeros);
    dt_status st;
    if (!m || !w1 || !w2 || !zeros) {
        free(m);
        m = NULL;
        st = no_memory();
        goto out;
    }
    m->mesh = dt_mesh_retain(mesh);
    m->inputs = inputs;
    m->hidden = hidden;
    m->classes = classes;
    const char *tp = dt_mesh_dim_index(mesh, "model") >= 0 ? "model" : DT_UNSHARDED;
    const char *s_w1[2] = {DT_UNSHARDED, tp}, *s_b1[1] = {tp}, *s_w2[2] = {tp, DT_UNSHARDED};
    const char *s_rows2[2] = {"batch", DT_UNSHARDED}, *s_rows1[1] = {"batch"};
    if ((st = dt_layout_create(mesh, 2, s_w1, &m->l_w1)) != DT_OK ||
        (st = dt_layout_create(mesh, 1, s_b1, &m->l_b1)) != DT_OK ||
        (st = dt_layout_create(mesh, 2, s_w2, &m->l_w2)) != DT_OK ||
        (st = dt_layout_replicated(mesh, 1, &m->l_b2)) != DT_OK ||
        (st = dt_layout_create(mesh, 2, s_rows2, &m->l_rows2)) != DT_OK ||
        (st = dt_layout_create(mesh, 1, s_rows1, &m->l_rows1)) != DT_OK ||
        (st = dt_layout_replicated(mesh, 2, &m->l_rep2)) != DT_OK)
        goto out;

    /* He-normal weights (ReLU follows layer 1), drawn for the whole global matrices on every
     * client so that any mesh starts from the same model. */
    rng r;
    rng_seed(&r, seed ^ 0x1a2b3c4d5e6f7788ULL);
    double sd1 = sqrt(2.0 / (double)inputs), sd2 = sqrt(2.0 / (double)(hidden + classes));
    for (int64_t i = 0; i < inputs * hidden; i++)
        w1[i] = (float)(sd1 * rng_normal(&r));
    for (int64_t i = 0; i < hidden * classes; i++)
        w2[i] = (float)(sd2 * rng_normal(&r));
    int64_t sh_w1[2] = {inputs, hidden}, sh_b1[1] = {hidden}, sh_w2[2] = {hidden, classes},
            sh_b2[1] = {classes};
    if ((st = make_param(m->l_w1, dtype, sh_w1, w1, &m->param[0])) != DT_OK ||
        (st = make_param(m->l_b1, dtype, sh_b1, zeros, &m->param[1])) != DT_OK ||
        (st = make_param(m->l_w2, dtype, sh_w2, w2, &m->param[2])) != DT_OK ||
        (st = make_param(m->l_b2, dtype, sh_b2, zeros, &m->param[3])) != DT_OK)
        goto out;
out:
    free(w1);
    free(w2);
    free(zeros);
    if (st != DT_OK) {
        mlp_destroy(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

dt_status mlp_inputs(const mlp *m, int64_t rows, const float *x, const int32_t *y,
                     dt_tensor **x_out, dt_tensor **y_out)
{
    own_error[0] = '\0';
    int64_t sx[2] = {rows, m->inputs}, sy[1] = {rows};
    dt_tensor *tx = NULL;
    dt_status st = pack_global(m->l_rows2, DT_DTYPE_F32, sx, x, &tx);
    if (st == DT_OK)
        st = pack_global(m->l_rows1, DT_DTYPE_I32, sy, y, y_out);
    if (st != DT_OK) {
        dt_tensor_destroy(tx);
        return st;
    }
    *x_out = tx;
    return DT_OK;
}

/* The forward pass up to the logits. */
typedef struct fwd {
    dt_tensor *b1, *b2; /* f32 biases (the parameters' values; cast if 16-bit) */
    dt_tensor *h;       /* x W1 + b1: [batch, model] */
    dt_tensor *a;       /* relu(h) */
    dt_tensor *logits;  /* a W2 + b2, summed over model: [batch, -] */
} fwd;

static void fwd_free(fwd *f)
{
    dt_tensor_destroy(f->b1);
    dt_tensor_destroy(f->b2);
    dt_tensor_destroy(f->h);
    dt_tensor_destroy(f->a);
    dt_tensor_destroy(f->logits);
    *f = (fwd){0};
}

static dt_status bias_f32(const dt_tensor *b, dt_tensor **out)
{
    if (dt_tensor_dtype(b) == DT_DTYPE_F32) {
        *out = dt_tensor_retain(b);
        return DT_OK;
    }
    return dt_cast(b, DT_DTYPE_F32, out);
}

/* What a recorded pass needs: the tape and what the layers' unit hooks see. */
typedef struct pass {
    const mlp *m;
    dt_tape *tape; /* NULL: not recorded (evaluation) */
    mlp_grad_fn fn;
    void *arg;
} pass;

/* Stage 3: layer l's unit hook. Layer 1 is still gathered from the forward pass when its
 * backward starts (layer 0's gather is started then); layer 0 is gathered again and its new
 * tensors watched under their indices; each is released after its backward. */
static dt_status unit_hook(void *arg, int l, dt_segment_phase phase)
{
    pass *p = arg;
    const mlp *m = p->m;
    if (!m->zero)
        return DT_OK;
    if (phase == DT_SEGMENT_POST)
        return layer_out(m, l);
    if (l == 1)
        return dt_zero_prefetch(m->zero, 0);
    const dt_tensor *w = NULL, *b = NULL;
    dt_status st = layer_in(m, l, -1, &w, &b);
    if (st == DT_OK)
        st = dt_tape_watch(p->tape, w, 2 * l);
    if (st == DT_OK)
        st = dt_tape_watch(p->tape, b, 2 * l + 1);
    return st;
}

/* Layer l's parameters watched on the pass's tape and its calls recorded as one unit. */
static dt_status unit_begin(pass *p, int l, const dt_tensor *w, const dt_tensor *b)
{
    if (!p->tape)
        return DT_OK;
    dt_checkpoint_opts co = DT_CHECKPOINT_OPTS_INIT;
    co.recompute = 0;
    co.borrow_watched = p->m->zero != NULL; /* stage 3: released between forward and backward */
    co.hook = unit_hook;
    co.hook_arg = p;
    co.id = l;
    dt_status st = dt_tape_watch(p->tape, w, 2 * l);
    if (st == DT_OK)
        st = dt_tape_watch(p->tape, b, 2 * l + 1);
    if (st == DT_OK)
        st = dt_tape_checkpoint_begin(p->tape, &co);
    return st;
}

static dt_status unit_end(pass *p)
{
    return p->tape ? dt_tape_checkpoint_end(p->tape) : DT_OK;
}

/* The forward pass (recorded when p->tape records); layer 2's parameters stay in for the
 * backward pass. */
static dt_status forward(pass *p, const dt_tensor *x, fwd *f)
{
    const mlp *m = p->m;
    dt_tensor *xw = NULL, *aw = NULL;
    const dt_tensor *w1 = NULL, *b1 = NULL, *w2 = NULL, *b2 = NULL;
    dt_status st;
    *f = (fwd){0};
    /* Column parallel: x [batch, -] . W1 [-, model] -> [batch, model], no communication. */
    if ((st = layer_in(m, 0, 1, &w1, &b1)) != DT_OK || (st = unit_begin(p, 0, w1, b1)) != DT_OK ||
        (st = bias_f32(b1, &f->b1)) != DT_OK ||
        (st = dt_matmul(x, w1, 0, 0, NULL, &xw)) != DT_OK ||
        (st = dt_bias_add(xw, f->b1, &f->h)) != DT_OK || (st = dt_relu(f->h, &f->a)) != DT_OK ||
        (st = unit_end(p)) != DT_OK || (st = layer_out(m, 0)) != DT_OK)
        goto out;
    /* Row parallel: a [batch, model] . W2 [model, -] is partial over model; asking for
     * [batch, -] sums it (an all-reduce along model). */
    if ((st = layer_in(m, 1, -1, &w2, &b2)) != DT_OK || (st = unit_begin(p, 1, w2, b2)) != DT_OK ||
        (st = bias_f32(b2, &f->b2)) != DT_OK ||
        (st = dt_matmul(f->a, w2, 0, 0, m->l_rows2, &aw)) != DT_OK ||
        (st = dt_bias_add(aw, f->b2, &f->logits)) != DT_OK || (st = unit_end(p)) != DT_OK)
        goto out;
out:
    dt_tensor_destroy(xw);
    dt_tensor_destroy(aw);
    if (st != DT_OK)
        fwd_free(f);
    return st;
}

dt_status mlp_grads(const mlp *m, const dt_tensor *x, const dt_tensor *y, float loss_scale,
                    double *loss_out, dt_tensor *grads_out[MLP_NPARAMS])
{
    return mlp_grads_each(m, x, y, loss_scale, loss_out, NULL, NULL, grads_out);
}

/* The tape's grad-ready callback, handed on to the caller's fn. */
static dt_status tell(void *arg, int index, const dt_tensor *param, const dt_tensor *grad)
{
    pass *p = arg;
    (void)param;
    return p->fn ? p->fn(p->arg, index, grad) : DT_OK;
}

/* The backward pass is the tape's (include/dtensor/autograd.h): it runs dt_softmax_xent_backward
 * (with the loss scale as its seed), dt_bias_grad, dt_matmul_backward and dt_relu_backward in
 * reverse order of the recorded forward calls. Every gradient comes out partial (sum) over
 * batch, which the optimizer reduces. */
dt_status mlp_grads_each(const mlp *m, const dt_tensor *x, const dt_tensor *y, float loss_scale,
                         double *loss_out, mlp_grad_fn fn, void *arg,
                         dt_tensor *grads_out[MLP_NPARAMS])
{
    own_error[0] = '\0';
    pass p = {m, NULL, fn, arg};
    dt_tensor *loss = NULL;
    dt_tensor *g[MLP_NPARAMS] = {NULL, NULL, NULL, NULL};
    double lv = 0;
    fwd f = {0};
    dt_status st = dt_tape_create(NULL, &p.tape);
    if (st != DT_OK)
        return st;
    if ((st = dt_tape_begin(p.tape)) != DT_OK)
        goto out;
    st = forward(&p, x, &f);
    /* Mean over the global batch: each batch shard's sum of ce_i / rows, partial over batch. */
    if (st == DT_OK)
        st = dt_softmax_xent(f.logits, y, NULL, &loss);
    dt_status st_end = dt_tape_end(p.tape);
    if (st == DT_OK)
        st = st_end;
    fwd_free(&f); /* the tape keeps what the backward pass needs */
    dt_backward_opts bo = DT_BACKWARD_OPTS_INIT;
    bo.grad_fn = tell;
    bo.grad_arg = &p;
    bo.require_all = 1;
    if (st != DT_OK || (st = dt_item(loss, &lv)) != DT_OK ||
        (st = dt_tape_backward(p.tape, loss, NULL, loss_scale, &bo)) != DT_OK)
        goto out;
    for (int i = 0; st == DT_OK && i < MLP_NPARAMS; i++)
        st = dt_tape_take_grad(p.tape, i, &g[i]);
    if (st != DT_OK)
        goto out;
    for (int i = 0; i < MLP_NPARAMS; i++) {
        grads_out[i] = g[i];
        g[i] = NULL;
    }
    *loss_out = lv;
out:
    for (int i = 0; i < MLP_NPARAMS; i++)
        dt_tensor_destroy(g[i]);
    dt_tensor_destroy(loss);
    fwd_free(&f);
    dt_tape_destroy(p.tape);
    return st;
}

dt_status mlp_evaluate(const mlp *m, const dt_tensor *x, const dt_tensor *y, const int32_t *labels,
                       double *loss_out, double *acc_out)
{
    own_error[0] = '\0';
    fwd f;
    pass p = {m, NULL, NULL, NULL};
    dt_status st = forward(&p, x, &f);
    if (st == DT_OK)
        st = layer_out(m, 1);
    if (st != DT_OK)
        return st;
    dt_tensor *loss = NULL, *all = NULL;
    double lv = 0;
    if ((st = dt_softmax_xent(f.logits, y, NULL, &loss)) != DT_OK ||
        (st = dt_item(loss, &lv)) != DT_OK ||
        (st = dt_relayout(f.logits, m->l_rep2, &all)) != DT_OK)
        goto out;
    /* Every local device holds all the logits now; the first one's copy is enough. */
    int64_t rows = dt_tensor_shape(all)[0], correct = 0;
    size_t bytes = (size_t)(rows * m->classes) * sizeof(float);
    float *v = NULL;
    if (dt_tensor_num_local(all) > 0) {
        if (!(v = malloc(bytes ? bytes : 1))) {
            st = no_memory();
            goto out;
        }
        if ((st = dt_tensor_local_read(all, 0, v, bytes)) != DT_OK) {
            free(v);
            goto out;
        }
    }
    if (v) {
        for (int64_t i = 0; i < rows; i++) {
            int64_t best = 0;
            for (int64_t j = 1; j < m->classes; j++)
                if (v[i * m->classes + j] > v[i * m->classes + best])
                    best = j;
            correct += best == labels[i];
        }
        free(v);
    }
    *loss_out = lv;
    *acc_out = rows ? (double)correct / (double)rows : 0.0;
out:
    dt_tensor_destroy(all);
    dt_tensor_destroy(loss);
    fwd_free(&f);
    return st;
}
