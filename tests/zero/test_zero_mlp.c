/* ZeRO stages 0, 1, 2 and 3 training a 2-layer MLP (data parallel matmul, bias, ReLU, softmax
 * cross-entropy; an AdamW group and an SGD-momentum group) for 20 steps on 1, 2, 3, 4 and
 * every data-parallel device, and as a Megatron MLP (W1 column-parallel, W2 row-parallel on
 * `model`) on the batch x model mesh, against a single-device reference: the gradient of each
 * dp shard's rows (and model shard's columns) computed on one device with the local kernels
 * the distributed ops run there, the shards' gradients added in shard order (the order of the
 * library's reduction over the dp dim), and the updates in plain C. f32 throughout, so the
 * parameters must be identical bit for bit after every step. With clipping, a tolerance (see
 * the clipping case). Stage 3 runs the per-layer loop a training loop uses (each layer's group
 * gathered before its forward and again before its backward, the next one prefetched,
 * released after use, gradients given by dt_zero_grad_ready as the backward makes them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "zero_ref_util.h"

enum { B = 20, F = 8, H = 16, C = 4, STEPS = 20, NP = 4 };

/* Parameters: W1 [F,H], b1 [H] (AdamW group), W2 [H,C], b2 [C] (SGD group). */
static const int64_t pshape[NP][2] = {{F, H}, {H, 1}, {H, C}, {C, 1}};
static const int prank[NP] = {2, 1, 2, 1};
static const char *const pname[NP] = {"w1", "b1", "w2", "b2"};

static int64_t pnumel(int i)
{
    return pshape[i][0] * pshape[i][1];
}

static const dt_optim_hparams *hparams(int group)
{
    static dt_optim_hparams adamw = DT_OPTIM_ADAMW_INIT, sgd = DT_OPTIM_SGD_INIT;
    adamw.lr = 0.01f;
    adamw.weight_decay = 0.01f;
    sgd.lr = 0.05f;
    sgd.momentum = 0.9f;
    sgd.nesterov = 1;
    sgd.weight_decay = 1e-3f;
    return group == 0 ? &adamw : &sgd;
}

typedef struct data {
    float x[B * F];
    int32_t labels[B];
    float p[NP][H * H];  /* reference parameters */
    float s1[NP][H * H]; /* exp_avg or momentum */
    float s2[NP][H * H]; /* exp_avg_sq */
} data;

static void init_data(data *d)
{
    memset(d, 0, sizeof *d);
    zt_fill_real(d->x, B * F, -1.0f, 1.0f, 101);
    for (int i = 0; i < B; i++)
        d->labels[i] = (int32_t)zt_int_at(102, (uint64_t)i, 0, C - 1);
    for (int i = 0; i < NP; i++)
        zt_fill_real(d->p[i], pnumel(i), -0.5f, 0.5f, 110 + (uint64_t)i);
}

/* The gradient summand of rows [r0, r0 + r): what the devices of one dp coordinate compute,
 * with the local kernels and arguments the distributed ops use on them (ops/spmd_matmul.c and
 * friends). With `m` model shards (Megatron MLP: W1 column-parallel, W2 row-parallel), model
 * coordinate k holds columns [h0, h0 + hk) of the hidden layer; the logits are partial over
 * the model dim, the bias added on coordinate 0 (zeros elsewhere), then summed in coordinate
 * order. */
static void shard_grads(const data *d, int64_t r0, int64_t r, int64_t m, float g[NP][H * H])
{
    for (int i = 0; i < NP; i++)
        memset(g[i], 0, sizeof(float) * (size_t)pnumel(i));
    if (r == 0)
        return;
    const float *x = d->x + r0 * F;
    static float z1[8][B * H], a[8][B * H], lg[8][B * C];
    float z2[B * C], dz2[B * C], h[B * H], da[B * H], dz1[B * H], w1k[F * H], dw1k[F * H];
    const float zeros[C] = {0};
    for (int64_t k = 0; k < m; k++) {
        int64_t h0, hk;
        dt_shard_range(H, m, k, &h0, &hk);
        for (int64_t f = 0; f < F; f++)
            memcpy(w1k + f * hk, d->p[0] + f * H + h0, sizeof(float) * (size_t)hk);
        DT_ASSERT_OK(dt_kernel_gemm(0, 0, r, hk, F, 1.0f, x, DT_DTYPE_F32, F, w1k, DT_DTYPE_F32, hk,
                                    0.0f, h, hk));
        DT_ASSERT_OK(dt_kernel_copy(r * hk, h, z1[k]));
        DT_ASSERT_OK(dt_kernel_bias_add(r, hk, d->p[1] + h0, z1[k]));
        DT_ASSERT_OK(dt_kernel_relu(r * hk, z1[k], a[k]));
        DT_ASSERT_OK(dt_kernel_gemm(0, 0, r, C, hk, 1.0f, a[k], DT_DTYPE_F32, hk, d->p[2] + h0 * C,
                                    DT_DTYPE_F32, C, 0.0f, lg[k], C));
        DT_ASSERT_OK(dt_kernel_bias_add(r, C, k == 0 ? d->p[3] : zeros, lg[k]));
    }
    memcpy(z2, lg[0], sizeof(float) * (size_t)(r * C));
    for (int64_t k = 1; k < m; k++)
        for (int64_t e = 0; e < r * C; e++)
            z2[e] = z2[e] + lg[k][e];
    DT_ASSERT_OK(dt_kernel_softmax_xent_grad(r, C, z2, d->labels + r0, 1.0f / (float)B, dz2));
    DT_ASSERT_OK(dt_kernel_bias_grad(r, C, dz2, g[3]));
    for (int64_t k = 0; k < m; k++) {
        int64_t h0, hk;
        dt_shard_range(H, m, k, &h0, &hk);
        DT_ASSERT_OK(dt_kernel_gemm(1, 0, hk, C, r, 1.0f, a[k], DT_DTYPE_F32, hk, dz2, DT_DTYPE_F32,
                                    C, 0.0f, g[2] + h0 * C, C));
        DT_ASSERT_OK(dt_kernel_gemm(0, 1, r, hk, C, 1.0f, dz2, DT_DTYPE_F32, C, d->p[2] + h0 * C,
                                    DT_DTYPE_F32, C, 0.0f, da, hk));
        DT_ASSERT_OK(dt_kernel_relu_grad(r * hk, z1[k], da, dz1));
        DT_ASSERT_OK(dt_kernel_gemm(1, 0, F, hk, r, 1.0f, x, DT_DTYPE_F32, F, dz1, DT_DTYPE_F32, hk,
                                    0.0f, dw1k, hk));
        for (int64_t f = 0; f < F; f++)
            memcpy(g[0] + f * H + h0, dw1k + f * hk, sizeof(float) * (size_t)hk);
        DT_ASSERT_OK(dt_kernel_bias_grad(r, hk, dz1, g[1] + h0));
    }
}

/* The reference step on N dp shards: summands added in shard order, then the updates.
 * Returns the global gradient norm (f64) and applies `coef` (clipping) to the gradient. */
static double ref_step(data *d, int64_t ndp, int64_t m, int64_t step, double clip_norm,
                       double *coef_out)
{
    static float acc[NP][H * H], s[NP][H * H];
    for (int64_t j = 0; j < ndp; j++) {
        int64_t r0, r;
        dt_shard_range(B, ndp, j, &r0, &r);
        shard_grads(d, r0, r, m, j == 0 ? acc : s);
        if (j > 0)
            for (int i = 0; i < NP; i++)
                for (int64_t e = 0; e < pnumel(i); e++)
                    acc[i][e] = acc[i][e] + s[i][e];
    }
    double sq = 0.0;
    for (int i = 0; i < NP; i++)
        for (int64_t e = 0; e < pnumel(i); e++)
            sq += (double)acc[i][e] * acc[i][e];
    double norm = sqrt(sq), coef = 1.0;
    if (clip_norm > 0.0 && norm > clip_norm) {
        coef = clip_norm / (norm + 1e-6);
        for (int i = 0; i < NP; i++)
            for (int64_t e = 0; e < pnumel(i); e++)
                acc[i][e] = (float)coef * acc[i][e];
    }
    for (int i = 0; i < NP; i++)
        zt_ref_update(pnumel(i), hparams(i / 2), step, d->p[i], acc[i], d->s1[i], d->s2[i]);
    *coef_out = coef;
    return norm;
}

/* Parameter layouts: replicated, or (Megatron) W1 column-parallel, b1 with it, W2
 * row-parallel on `model`. */
static const char *const pspec_megatron[NP][2] = {
    {NULL, "model"}, {"model", NULL}, {"model", NULL}, {NULL, NULL}};

/* One training run on a dp mesh of `ndp` devices (megatron: the batch x model mesh of every
 * device, ndp ignored); exact (bitwise) or within a tolerance. */
/* Stage 3's forward and backward, layer by layer (group 0: W1, b1; group 1: W2, b2); the
 * gradients go to dt_zero_grad_ready and are destroyed into g (left NULL). */
static void layered_step(dt_zero *z, const dt_tensor *x, const dt_tensor *labels, dt_tensor **g)
{
    dt_tensor *w[NP], *h = NULL, *z1 = NULL, *a = NULL, *lg = NULL, *z2 = NULL, *dz2 = NULL;
    dt_tensor *da = NULL, *dz1 = NULL;
    DT_ASSERT_OK(dt_zero_gather(z, 0));
    DT_ASSERT_OK(dt_zero_prefetch(z, 1)); /* moves while layer 1 computes */
    DT_ASSERT_OK(dt_zero_param(z, 0, &w[0]));
    DT_ASSERT_OK(dt_zero_param(z, 1, &w[1]));
    DT_ASSERT_OK(dt_matmul(x, w[0], 0, 0, NULL, &h));
    DT_ASSERT_OK(dt_bias_add(h, w[1], &z1));
    DT_ASSERT_OK(dt_relu(z1, &a));
    DT_ASSERT_OK(dt_zero_release(z, 0));
    DT_ASSERT_OK(dt_zero_gather(z, 1));
    DT_ASSERT_OK(dt_zero_param(z, 2, &w[2]));
    DT_ASSERT_OK(dt_zero_param(z, 3, &w[3]));
    DT_ASSERT_OK(dt_matmul(a, w[2], 0, 0, NULL, &lg));
    DT_ASSERT_OK(dt_bias_add(lg, w[3], &z2));
    DT_ASSERT_OK(dt_softmax_xent_backward(z2, labels, 1.0f, &dz2));
    DT_ASSERT_OK(dt_zero_prefetch(z, 0)); /* layer 1's backward needs it again */
    DT_ASSERT_OK(dt_matmul_backward(a, w[2], 0, 0, dz2, NULL, NULL, &da, &g[2]));
    DT_ASSERT_OK(dt_bias_grad(dz2, NULL, &g[3]));
    DT_ASSERT_OK(dt_zero_release(z, 1));
    DT_ASSERT_OK(dt_zero_grad_ready(z, 2, g[2]));
    DT_ASSERT_OK(dt_zero_grad_ready(z, 3, g[3]));
    DT_ASSERT_OK(dt_zero_gather(z, 0));
    DT_ASSERT_OK(dt_zero_param(z, 0, &w[0]));
    DT_ASSERT_OK(dt_relu_backward(z1, da, &dz1));
    DT_ASSERT_OK(dt_matmul_backward(x, w[0], 0, 0, dz1, NULL, NULL, NULL, &g[0]));
    DT_ASSERT_OK(dt_bias_grad(dz1, NULL, &g[1]));
    DT_ASSERT_OK(dt_zero_release(z, 0));
    DT_ASSERT_OK(dt_zero_grad_ready(z, 0, g[0]));
    DT_ASSERT_OK(dt_zero_grad_ready(z, 1, g[1]));
    dt_tensor *tmp[] = {h, z1, a, lg, z2, dz2, da, dz1};
    for (int i = 0; i < 8; i++)
        dt_tensor_destroy(tmp[i]);
    for (int i = 0; i < NP; i++) {
        dt_tensor_destroy(g[i]);
        g[i] = NULL;
    }
}

static void train(int64_t ndp, int megatron, int stage, double clip_norm, int exact)
{
    dt_mesh *mesh = megatron ? zt_mesh_batch_model() : zt_mesh_dp(ndp);
    if (!zt_in_mesh(mesh)) {
        dt_mesh_destroy(mesh);
        return;
    }
    int64_t nmodel = 1;
    if (megatron) {
        ndp = dt_mesh_dim_size(mesh, dt_mesh_dim_index(mesh, "batch"));
        nmodel = dt_mesh_dim_size(mesh, dt_mesh_dim_index(mesh, "model"));
    }
    data *d = malloc(sizeof *d);
    init_data(d);
    float xs[B * F];
    memcpy(xs, d->x, sizeof xs);
    float lab_f[B];
    for (int i = 0; i < B; i++)
        lab_f[i] = (float)d->labels[i];
    dt_layout *rows2 = dt_test_layout(mesh, 2, "batch", NULL, NULL);
    dt_layout *rows1 = dt_test_layout(mesh, 1, "batch", NULL, NULL);
    int64_t xshape[2] = {B, F}, lshape[1] = {B};
    dt_tensor *x = zt_tensor(rows2, DT_DTYPE_F32, xshape, xs);
    /* Labels: i32 from the float copy (small integers convert exactly). */
    dt_tensor *labels = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(rows1, DT_DTYPE_I32, lshape, &labels));
    for (int i = 0; i < dt_tensor_num_local(labels); i++) {
        int64_t off = dt_tensor_local_offset(labels, i)[0];
        int64_t rows = dt_tensor_local(labels, i)->shape[0];
        int32_t lab[B];
        for (int64_t r = 0; r < rows; r++)
            lab[r] = (int32_t)lab_f[off + r];
        dt_test_local_set(labels, i, lab);
    }
    dt_tensor *p[NP];
    for (int i = 0; i < NP; i++) {
        dt_layout *l = dt_test_layout(mesh, prank[i], megatron ? pspec_megatron[i][0] : NULL,
                                 megatron ? pspec_megatron[i][1] : NULL, NULL);
        p[i] = zt_tensor(l, DT_DTYPE_F32, pshape[i], d->p[i]);
        dt_layout_destroy(l);
    }

    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = stage;
    zo.clip_norm = clip_norm;
    zo.allgather_size = 100; /* several chunks per group */
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(mesh, &zo, &z));
    int g0 = -1, g1 = -1;
    DT_ASSERT_OK(dt_zero_add_group(z, 2, pname, p, hparams(0), &g0));
    DT_ASSERT_OK(dt_zero_add_group(z, 2, pname + 2, p + 2, hparams(1), &g1));
    CU_ASSERT_EQUAL(g0, 0);
    CU_ASSERT_EQUAL(g1, 1);
    CU_ASSERT_EQUAL(dt_zero_num_params(z), NP);
    CU_ASSERT_EQUAL(dt_zero_loss_scale(z), 1.0);

    char what[64];
    int64_t bad = 0;
    for (int t = 0; t < STEPS; t++) {
        dt_tensor *h = NULL, *z1 = NULL, *a = NULL, *lg = NULL, *z2 = NULL, *dz2 = NULL;
        dt_tensor *da = NULL, *dz1 = NULL, *g[NP] = {NULL, NULL, NULL, NULL};
        if (stage == 3) {
            layered_step(z, x, labels, g);
            goto stepped;
        }
        DT_ASSERT_OK(dt_matmul(x, p[0], 0, 0, NULL, &h));
        DT_ASSERT_OK(dt_bias_add(h, p[1], &z1));
        DT_ASSERT_OK(dt_relu(z1, &a));
        DT_ASSERT_OK(dt_matmul(a, p[2], 0, 0, NULL, &lg));
        DT_ASSERT_OK(dt_bias_add(lg, p[3], &z2));
        DT_ASSERT_OK(dt_softmax_xent_backward(z2, labels, 1.0f, &dz2));
        DT_ASSERT_OK(dt_matmul_backward(a, p[2], 0, 0, dz2, NULL, NULL, &da, &g[2]));
        DT_ASSERT_OK(dt_bias_grad(dz2, NULL, &g[3]));
        DT_ASSERT_OK(dt_relu_backward(z1, da, &dz1));
        DT_ASSERT_OK(dt_matmul_backward(x, p[0], 0, 0, dz1, NULL, NULL, NULL, &g[0]));
        DT_ASSERT_OK(dt_bias_grad(dz1, NULL, &g[1]));
        if (ndp > 1) /* the natural gradient layout: partial over the dp dim */
            CU_ASSERT(dt_layout_num_partial(dt_tensor_layout(g[0])) == 1);

        dt_zero_step_info info;
    stepped:
        memset(&info, 0, sizeof info);
        DT_ASSERT_OK(dt_zero_step(z, stage == 3 ? NULL : g, &info));
        dt_tensor *cur[NP];
        for (int i = 0; i < NP; i++)
            cur[i] = p[i];
        if (stage == 3) {
            DT_ASSERT_OK(dt_zero_gather(z, 0));
            DT_ASSERT_OK(dt_zero_gather(z, 1));
            for (int i = 0; i < NP; i++)
                DT_ASSERT_OK(dt_zero_param(z, i, &cur[i]));
        }
        double coef = 1.0;
        double norm = ref_step(d, ndp, nmodel, t + 1, clip_norm, &coef);
        CU_ASSERT_EQUAL(info.iteration, t);
        CU_ASSERT_EQUAL(info.step, t + 1);
        CU_ASSERT_EQUAL(info.skipped, 0);
        CU_ASSERT_EQUAL(info.loss_scale, 1.0);
        CU_ASSERT_EQUAL(info.next_loss_scale, 1.0);
        /* The norm sums partitions in an order that depends on the stage and the mesh. */
        CU_ASSERT(fabs(info.grad_norm - norm) <= 1e-5 * norm);
        CU_ASSERT(fabs(info.clip_coef - coef) <= 1e-5 * coef);
        if (clip_norm <= 0.0)
            CU_ASSERT_EQUAL(info.clip_coef, 1.0);
        for (int i = 0; i < NP && bad == 0; i++) {
            snprintf(what, sizeof what, "stage %d dp %lld model %lld step %d %s", stage,
                     (long long)ndp, (long long)nmodel, t + 1, pname[i]);
            /* Clipping multiplies by a factor computed from a norm whose summation order is
             * the implementation's: 1-ulp differences in the factor, so a tolerance. */
            bad += exact ? zt_bit_mismatches(what, cur[i], d->p[i])
                         : zt_mismatches(what, cur[i], d->p[i], 1e-6f, 1e-4f);
        }
        if (stage == 3) {
            DT_ASSERT_OK(dt_zero_release(z, 0));
            DT_ASSERT_OK(dt_zero_release(z, 1));
        }
        dt_tensor_destroy(h);
        dt_tensor_destroy(z1);
        dt_tensor_destroy(a);
        dt_tensor_destroy(lg);
        dt_tensor_destroy(z2);
        dt_tensor_destroy(dz2);
        dt_tensor_destroy(da);
        dt_tensor_destroy(dz1);
        for (int i = 0; i < NP; i++)
            dt_tensor_destroy(g[i]);
        /* After a first difference keep stepping (the other clients do) without comparing. */
    }
    CU_ASSERT_EQUAL(bad, 0);
    dt_zero_destroy(z);
    for (int i = 0; i < NP; i++)
        dt_tensor_destroy(p[i]);
    dt_tensor_destroy(x);
    dt_tensor_destroy(labels);
    dt_layout_destroy(rows2);
    dt_layout_destroy(rows1);
    dt_mesh_destroy(mesh);
    free(d);
}

/* dp sizes 1, 2, 3 (uneven shards of the flat buffers), 4 and every device. */
static void train_all_sizes(int stage, double clip_norm, int exact)
{
    int64_t n = zt_num_devices();
    int64_t sizes[5] = {1, 2, 3, 4, n};
    for (int s = 0; s < 5; s++) {
        if (sizes[s] > n || (s == 4 && n <= 4))
            continue;
        train(sizes[s], 0, stage, clip_norm, exact);
    }
}

static void test_zero_stage0_mlp_matches_single_device_bitwise(void)
{
    train_all_sizes(0, 0.0, 1);
}

static void test_zero_stage1_mlp_matches_single_device_bitwise(void)
{
    train_all_sizes(1, 0.0, 1);
}

static void test_zero_stage2_mlp_matches_single_device_bitwise(void)
{
    train_all_sizes(2, 0.0, 1);
}

/* The Megatron MLP on the batch x model mesh: W1, b1 and W2 sharded on `model`, ZeRO over
 * `batch`. */
static void test_zero_stage3_layered_mlp_matches_single_device_bitwise(void)
{
    train_all_sizes(3, 0.0, 1);
}

static void test_zero_2d_mesh_megatron_mlp_matches_single_device_bitwise(void)
{
    for (int stage = 0; stage <= 3; stage++)
        train(0, 1, stage, 0.0, 1);
}

static void test_zero_stage2_mlp_with_clipping_close_to_single_device(void)
{
    train(zt_num_devices(), 0, 2, 0.05, 0);
    train(3, 0, 1, 0.05, 0);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_zero_stage0_mlp_matches_single_device_bitwise),
        DT_TEST(test_zero_stage1_mlp_matches_single_device_bitwise),
        DT_TEST(test_zero_stage2_mlp_matches_single_device_bitwise),
        DT_TEST(test_zero_stage3_layered_mlp_matches_single_device_bitwise),
        DT_TEST(test_zero_2d_mesh_megatron_mlp_matches_single_device_bitwise),
        DT_TEST(test_zero_stage2_mlp_with_clipping_close_to_single_device),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "zero_mlp", cases);
}
