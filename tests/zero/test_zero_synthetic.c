/* ZeRO stages 0, 1, 2 and 3 on synthetic gradients, against a single-device reference in plain C
 * (summands added in dp order, then the inner optimizer), bit for bit after every step:
 *  - a 2-D batch x model mesh with parameters sharded along `model` (column-parallel weight
 *    and its bias) next to a replicated one, gradients partial over `batch`, one given in
 *    another sharding and one already reduced;
 *  - mixed precision (bf16 and f16 parameters, f32 master) with dynamic loss scaling and
 *    injected inf / NaN gradients: the steps they hit are skipped everywhere and the scale
 *    follows DeepSpeed's rule. Gradient summands are small multiples of 2^-6 times the
 *    (power of two) loss scale, so every sum and the unscaling are exact in any order and
 *    precision, and the reference master weights rounded to the parameter dtype must equal
 *    the parameters exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "zero_ref_util.h"

enum { STEPS = 20, MAXP = 4, MAXN = 96, MAXDP = 8 };

typedef struct pspec {
    const char *name;
    int rank;
    int64_t shape[2];
    const char *s0, *s1; /* parameter specs */
    int group;
    const char *g0, *g1; /* gradient specs */
    int g_partial;       /* gradient partial over the dp dim (else already reduced) */
    int g_f32;           /* gradient in f32 (else the parameter dtype) */
} pspec;

typedef struct run_cfg {
    const char *label;
    dt_mesh *mesh;
    int stage;
    dt_dtype dtype;
    dt_loss_scaler_opts scaler;
    const pspec *ps;
    int np;
    const dt_optim_hparams *hp[2];
    int dyadic;        /* gradient rule: 1 exact multiples of 2^-6, 0 reals from p */
    const int *inject; /* iterations whose gradient carries an inf (or NaN) */
    int ninject;
} run_cfg;

static int64_t numel(const pspec *p)
{
    return p->rank == 1 ? p->shape[0] : p->shape[0] * p->shape[1];
}

/* Gradient summand of dp coordinate j at iteration t for parameter k (values p). */
static void summand(const run_cfg *c, int k, int64_t t, int64_t j, const float *p, float scale,
                    float *out)
{
    int64_t n = numel(&c->ps[k]);
    uint64_t seed = 1000u * (uint64_t)k + (uint64_t)t;
    for (int64_t e = 0; e < n; e++) {
        if (c->dyadic) {
            out[e] = zt_int_at(seed, (uint64_t)(j * 4096 + e), -8, 8) * 0.015625f * scale;
        } else {
            float u = (float)((double)(zt_hash(seed, (uint64_t)j, (uint64_t)e) >> 11) /
                              9007199254740992.0) *
                          2.0f -
                      1.0f;
            out[e] = 0.25f * (float)(j + 1) * p[e] + u;
        }
    }
}

/* DeepSpeed's dynamic loss scaler as optim.h documents it (the reference's own copy). */
typedef struct ref_scaler {
    dt_loss_scaler_opts o;
    double scale;
    int64_t iter, last_overflow;
    int hyst;
} ref_scaler;

static void scaler_init(ref_scaler *s, const dt_loss_scaler_opts *o)
{
    s->o = *o;
    s->scale = o->mode == DT_LOSS_SCALE_NONE ? 1.0 : o->init_scale;
    s->iter = 0;
    s->last_overflow = -1;
    s->hyst = o->hysteresis;
}

static void scaler_update(ref_scaler *s, int overflow)
{
    if (s->o.mode == DT_LOSS_SCALE_DYNAMIC) {
        if (overflow) {
            if (s->hyst == 1 || s->o.hysteresis == 1)
                s->scale = fmax(s->scale / s->o.factor, s->o.min_scale);
            else
                s->hyst--;
            s->last_overflow = s->iter;
        } else {
            if (s->o.consecutive_hysteresis)
                s->hyst = s->o.hysteresis;
            if ((s->iter - s->last_overflow) % s->o.window == 0) {
                s->hyst = s->o.hysteresis;
                s->scale *= s->o.factor;
            }
        }
    }
    s->iter++;
}

static int overflow_calls;
static double overflow_scale_seen;

static void on_overflow(void *arg, const dt_zero_step_info *info)
{
    (void)arg;
    overflow_calls++;
    overflow_scale_seen = info->loss_scale;
    CU_ASSERT_EQUAL(info->skipped, 1);
}

/* The parameters' current values: the caller's tensors (stages 0-2), or in stage 3 the
 * gathered ones (even groups prefetched first), checked to be refused while released. */
static void stage3_gather(dt_zero *z, int np, dt_tensor *const *pt, dt_tensor **cur)
{
    for (int k = 0; k < np; k++) {
        cur[k] = pt[k];
        dt_tensor *t = NULL;
        dt_status st = dt_zero_param(z, k, &t);
        if (st == DT_OK)
            continue; /* stages 0-2: the caller's tensor */
        CU_ASSERT_EQUAL(st, DT_ERR_STATE);
        CU_ASSERT(strstr(dt_last_error(), "is released") != NULL);
    }
    int last = -1;
    for (int k = 0; k < np; k++) {
        int g = dt_zero_param_group(z, k);
        if (g != last) {
            if (g % 2 == 0)
                DT_ASSERT_OK(dt_zero_prefetch(z, g));
            DT_ASSERT_OK(dt_zero_gather(z, g));
            last = g;
        }
        DT_ASSERT_OK(dt_zero_param(z, k, &cur[k]));
    }
}

static void stage3_release(dt_zero *z, int stage)
{
    int last = -1;
    for (int k = 0; k < dt_zero_num_params(z); k++) {
        int g = dt_zero_param_group(z, k);
        if (g != last)
            DT_ASSERT_OK(dt_zero_release(z, g));
        last = g;
    }
    (void)stage;
}

static void run(const run_cfg *c)
{
    if (!zt_in_mesh(c->mesh))
        return;
    const dt_mesh *mesh = c->mesh;
    const int dpd = dt_mesh_dim_index(mesh, "batch");
    const int64_t ndp = dt_mesh_dim_size(mesh, dpd);
    CU_ASSERT_FATAL(ndp <= MAXDP && c->np <= MAXP);
    static float p[MAXP][MAXN], s1[MAXP][MAXN], s2[MAXP][MAXN];
    static float sm[MAXP][MAXDP][MAXN], acc[MAXP][MAXN];
    memset(s1, 0, sizeof s1);
    memset(s2, 0, sizeof s2);
    dt_tensor *pt[MAXP], *gt[MAXP];
    dt_layout *pl[MAXP], *gl[MAXP];
    const char *names[MAXP];
    for (int k = 0; k < c->np; k++) {
        const pspec *s = &c->ps[k];
        CU_ASSERT_FATAL(numel(s) <= MAXN);
        zt_fill_real(p[k], numel(s), -0.5f, 0.5f, 500 + (uint64_t)k);
        dt_test_round(p[k], numel(s), c->dtype); /* the master starts from the parameter */
        pl[k] = dt_test_layout(mesh, s->rank, s->s0, s->s1, NULL);
        gl[k] = dt_test_layout(mesh, s->rank, s->g0, s->g1, s->g_partial ? "batch" : NULL);
        pt[k] = zt_tensor(pl[k], c->dtype, s->shape, p[k]);
        names[k] = s->name;
    }
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = c->stage;
    zo.scaler = c->scaler;
    zo.allgather_size = 40;
    zo.on_overflow = on_overflow;
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(mesh, &zo, &z));
    /* Groups: consecutive parameters of one group. */
    for (int k = 0; k < c->np;) {
        int e = k;
        while (e < c->np && c->ps[e].group == c->ps[k].group)
            e++;
        int gi = -1;
        DT_ASSERT_OK(dt_zero_add_group(z, e - k, names + k, pt + k, c->hp[c->ps[k].group], &gi));
        k = e;
    }
    ref_scaler rs;
    scaler_init(&rs, &c->scaler);
    int64_t updates = 0, bad = 0;
    int expected_calls = 0;
    overflow_calls = 0;
    CU_ASSERT_EQUAL(dt_zero_loss_scale(z), rs.scale);
    char what[128];
    for (int64_t t = 0; t < STEPS; t++) {
        int ov = 0;
        for (int i = 0; i < c->ninject; i++)
            ov |= c->inject[i] == t;
        float scale = (float)rs.scale;
        for (int k = 0; k < c->np; k++) {
            int64_t n = numel(&c->ps[k]);
            for (int64_t j = 0; j < ndp; j++)
                summand(c, k, t, j, p[k], scale, sm[k][j]);
            if (ov && k == 0) /* one element of the last summand: inf, or NaN every other */
                sm[0][ndp - 1][n / 2] = (t % 2) ? NAN : INFINITY;
            for (int64_t e = 0; e < n; e++) {
                float a = sm[k][0][e];
                for (int64_t j = 1; j < ndp; j++)
                    a = a + sm[k][j][e];
                acc[k][e] = a;
            }
            const float *srcs[MAXDP];
            for (int64_t j = 0; j < ndp; j++)
                srcs[j] = sm[k][j];
            dt_dtype gd = c->ps[k].g_f32 ? DT_DTYPE_F32 : c->dtype;
            gt[k] = c->ps[k].g_partial ? zt_tensor_from(gl[k], gd, c->ps[k].shape, dpd, srcs)
                                       : zt_tensor(gl[k], gd, c->ps[k].shape, acc[k]);
        }
        dt_zero_step_info info;
        memset(&info, 0, sizeof info);
        DT_ASSERT_OK(dt_zero_step(z, gt, &info));
        for (int k = 0; k < c->np; k++)
            dt_tensor_destroy(gt[k]);

        double norm = 0.0;
        if (!ov) {
            float inv = (float)(1.0 / rs.scale);
            updates++;
            for (int k = 0; k < c->np; k++) {
                int64_t n = numel(&c->ps[k]);
                for (int64_t e = 0; e < n; e++) {
                    acc[k][e] = acc[k][e] * inv;
                    norm += (double)acc[k][e] * acc[k][e];
                }
                zt_ref_update(n, c->hp[c->ps[k].group], updates, p[k], acc[k], s1[k], s2[k]);
            }
            norm = sqrt(norm);
        } else {
            expected_calls++;
        }
        double used = rs.scale;
        scaler_update(&rs, ov);
        CU_ASSERT_EQUAL(info.iteration, t);
        CU_ASSERT_EQUAL(info.step, updates);
        CU_ASSERT_EQUAL(info.skipped, ov);
        CU_ASSERT_EQUAL(info.loss_scale, used);
        CU_ASSERT_EQUAL(info.next_loss_scale, rs.scale);
        CU_ASSERT_EQUAL(dt_zero_loss_scale(z), rs.scale);
        if (ov) {
            CU_ASSERT(!isfinite(info.grad_norm));
            CU_ASSERT_EQUAL(overflow_scale_seen, used);
        } else {
            CU_ASSERT(fabs(info.grad_norm - norm) <= 1e-5 * norm);
            CU_ASSERT_EQUAL(info.clip_coef, 1.0);
        }
        dt_tensor *cur[MAXP];
        stage3_gather(z, c->np, pt, cur);
        for (int k = 0; k < c->np && bad == 0; k++) {
            snprintf(what, sizeof what, "%s stage %d iteration %lld %s", c->label, c->stage,
                     (long long)t, c->ps[k].name);
            bad += zt_bit_mismatches(what, cur[k], p[k]);
        }
        stage3_release(z, c->stage);
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(overflow_calls, expected_calls);
    dt_zero_destroy(z);
    for (int k = 0; k < c->np; k++) {
        dt_tensor_destroy(pt[k]);
        dt_layout_destroy(pl[k]);
        dt_layout_destroy(gl[k]);
    }
}

static const dt_optim_hparams *adam_l2(void)
{
    static dt_optim_hparams h = DT_OPTIM_ADAM_INIT;
    h.lr = 0.01f;
    h.weight_decay = 0.01f;
    return &h;
}

static const dt_optim_hparams *adamw(void)
{
    static dt_optim_hparams h = DT_OPTIM_ADAMW_INIT;
    h.lr = 0.02f;
    h.weight_decay = 0.05f;
    h.beta2 = 0.99f;
    return &h;
}

static const dt_optim_hparams *sgd(int nesterov)
{
    static dt_optim_hparams h[2] = {DT_OPTIM_SGD_INIT, DT_OPTIM_SGD_INIT};
    h[nesterov].lr = 0.05f;
    h[nesterov].momentum = 0.9f;
    h[nesterov].nesterov = nesterov;
    h[nesterov].dampening = nesterov ? 0.0f : 0.1f;
    h[nesterov].weight_decay = nesterov ? 1e-3f : 0.0f;
    return &h[nesterov];
}

static void test_zero_2d_mesh_model_sharded_params_match_reference_bitwise(void)
{
    /* W: column-parallel weight (its gradient arrives sharded on the other dim), V: replicated
     * (gradient already reduced), b: the column bias. */
    static const pspec ps[3] = {
        {"w", 2, {6, 11}, NULL, "model", 0, "model", NULL, 1, 0},
        {"v", 2, {5, 3}, NULL, NULL, 0, NULL, NULL, 0, 0},
        {"b", 1, {11, 0}, "model", NULL, 1, "model", NULL, 1, 0},
    };
    dt_mesh *mesh = zt_mesh_batch_model();
    for (int stage = 0; stage <= 3; stage++) {
        run_cfg c = {
            "2-D", mesh, stage, DT_DTYPE_F32, DT_LOSS_SCALER_OPTS_INIT, ps, 3, {adam_l2(), sgd(0)},
            0,     NULL, 0};
        run(&c);
    }
    dt_mesh_destroy(mesh);
}

static void mixed(dt_dtype dtype)
{
    static const pspec ps[3] = {
        {"a", 2, {7, 9}, NULL, NULL, 0, NULL, NULL, 1, 0},
        {"c", 1, {9, 0}, NULL, NULL, 0, NULL, NULL, 1, 0},
        {"d", 2, {4, 6}, NULL, NULL, 1, NULL, NULL, 1, 1},
    };
    static const int inject[] = {3, 4, 9, 10, 11, 15};
    dt_loss_scaler_opts so = DT_LOSS_SCALER_OPTS_INIT;
    so.mode = DT_LOSS_SCALE_DYNAMIC;
    so.init_scale = 1024.0;
    so.window = 4;
    int64_t n = zt_num_devices();
    int64_t sizes[2] = {n, 3};
    for (int s = 0; s < 2; s++) {
        if (sizes[s] > n || (s == 1 && n == 3))
            continue;
        dt_mesh *mesh = zt_mesh_dp(sizes[s]);
        for (int stage = 0; stage <= 3; stage++) {
            char label[64];
            snprintf(label, sizeof label, "%s dp %lld", dt_dtype_name(dtype), (long long)sizes[s]);
            run_cfg c = {label,
                         mesh,
                         stage,
                         dtype,
                         so,
                         ps,
                         3,
                         {adamw(), sgd(1)},
                         1,
                         inject,
                         (int)(sizeof inject / sizeof inject[0])};
            run(&c);
        }
        dt_mesh_destroy(mesh);
    }
}

static void test_zero_bf16_dynamic_loss_scale_with_overflows_matches_reference_bitwise(void)
{
    mixed(DT_DTYPE_BF16);
}

static void test_zero_f16_dynamic_loss_scale_with_overflows_matches_reference_bitwise(void)
{
    mixed(DT_DTYPE_F16);
}

#define EXPECT_STATUS(call, want, text)                                                            \
    do {                                                                                           \
        dt_status st_ = (call);                                                                    \
        CU_ASSERT_EQUAL(st_, want);                                                                \
        if (st_ != DT_OK && !strstr(dt_last_error(), text)) {                                      \
            fprintf(stderr, "message '%s' lacks '%s'\n", dt_last_error(), text);                   \
            CU_FAIL("status message");                                                             \
        }                                                                                          \
    } while (0)

/* Stage 3's refusals: every misuse of gather / prefetch / release / param gives DT_ERR_STATE
 * (or DT_ERR_INVALID_ARGUMENT) with a message naming it and changes nothing: the parameters
 * gathered afterwards still hold their values, the memory report follows the gathers, and in
 * stage 1 the same calls are no-ops that hand out the caller's tensors. */
static void test_zero_stage3_misuse_gives_clear_statuses(void)
{
    int64_t n = zt_num_devices() < 4 ? zt_num_devices() : 4;
    dt_mesh *mesh = zt_mesh_dp(n);
    if (!zt_in_mesh(mesh)) {
        dt_mesh_destroy(mesh);
        return;
    }
    float v[2][MAXN];
    int64_t shape[2][2] = {{6, 5}, {7, 0}};
    dt_layout *l2 = dt_test_layout(mesh, 2, NULL, NULL, NULL);
    dt_layout *l1 = dt_test_layout(mesh, 1, NULL, NULL, NULL);
    zt_fill_real(v[0], 30, -1.0f, 1.0f, 71);
    zt_fill_real(v[1], 7, -1.0f, 1.0f, 72);
    dt_test_round(v[0], 30, DT_DTYPE_BF16);
    dt_test_round(v[1], 7, DT_DTYPE_BF16);
    {
        /* Offload keeps the state on the host beside whole parameters: not with stage 3. */
        dt_zero_opts bad = DT_ZERO_OPTS_INIT;
        bad.stage = 3;
        bad.offload = 1;
        dt_zero *zb = NULL;
        EXPECT_STATUS(dt_zero_create(mesh, &bad, &zb), DT_ERR_UNSUPPORTED, "not stage 3");
    }
    for (int stage = 1; stage <= 3; stage += 2) {
        dt_tensor *pt[2] = {zt_tensor(l2, DT_DTYPE_BF16, shape[0], v[0]),
                            zt_tensor(l1, DT_DTYPE_BF16, shape[1], v[1])};
        const char *names[2] = {"layer0/w", "layer1/b"};
        dt_zero_opts zo = DT_ZERO_OPTS_INIT;
        zo.stage = stage;
        zo.allgather_size = 8;
        dt_zero *z = NULL;
        DT_ASSERT_OK(dt_zero_create(mesh, &zo, &z));
        DT_ASSERT_OK(dt_zero_add_group(z, 1, names, pt, adamw(), NULL));
        DT_ASSERT_OK(dt_zero_add_group(z, 1, names + 1, pt + 1, adamw(), NULL));
        CU_ASSERT_EQUAL(dt_zero_param_group(z, 1), 1);
        CU_ASSERT_EQUAL(dt_zero_param_group(z, 2), -1);
        dt_tensor *t = NULL;
        EXPECT_STATUS(dt_zero_gather(z, 2), DT_ERR_INVALID_ARGUMENT, "group 2");
        EXPECT_STATUS(dt_zero_param(z, 5, &t), DT_ERR_INVALID_ARGUMENT, "parameter 5");
        if (stage == 1) {
            /* Always whole: the calls only check their arguments. */
            DT_ASSERT_OK(dt_zero_gather(z, 0));
            DT_ASSERT_OK(dt_zero_gather(z, 0));
            DT_ASSERT_OK(dt_zero_release(z, 0));
            DT_ASSERT_OK(dt_zero_param(z, 0, &t));
            CU_ASSERT_PTR_EQUAL(t, pt[0]);
        } else {
            dt_zero_memory m0, m1;
            DT_ASSERT_OK(dt_zero_memory_usage(z, &m0));
            EXPECT_STATUS(dt_zero_param(z, 0, &t), DT_ERR_STATE, "'layer0/w') is released");
            EXPECT_STATUS(dt_zero_release(z, 0), DT_ERR_STATE, "not gathered");
            DT_ASSERT_OK(dt_zero_prefetch(z, 0));
            EXPECT_STATUS(dt_zero_prefetch(z, 0), DT_ERR_STATE, "already prefetched");
            EXPECT_STATUS(dt_zero_release(z, 0), DT_ERR_STATE, "only prefetched");
            EXPECT_STATUS(dt_zero_param(z, 0, &t), DT_ERR_STATE, "released");
            EXPECT_STATUS(dt_zero_step(z, NULL, NULL), DT_ERR_INVALID_ARGUMENT, "grads");
            DT_ASSERT_OK(dt_zero_gather(z, 0));
            EXPECT_STATUS(dt_zero_gather(z, 0), DT_ERR_STATE, "gathered twice");
            EXPECT_STATUS(dt_zero_prefetch(z, 0), DT_ERR_STATE, "already gathered");
            DT_ASSERT_OK(dt_zero_param(z, 0, &t));
            CU_ASSERT_EQUAL(zt_bit_mismatches("layer0/w gathered", t, v[0]), 0);
            DT_ASSERT_OK(dt_zero_memory_usage(z, &m1));
            /* The whole parameter on every local device, now. */
            CU_ASSERT_EQUAL(m1.param_bytes - m0.param_bytes,
                            (uint64_t)dt_tensor_num_local(t) * 30 * 2);
            /* The update writes the shards: refused while a group is whole. */
            dt_tensor *g[2] = {NULL, NULL};
            dt_layout *gl2 = dt_test_layout(mesh, 2, NULL, NULL, "batch");
            dt_layout *gl1 = dt_test_layout(mesh, 1, NULL, NULL, "batch");
            float zeros[MAXN] = {0};
            g[0] = zt_tensor(gl2, DT_DTYPE_BF16, shape[0], zeros);
            g[1] = zt_tensor(gl1, DT_DTYPE_BF16, shape[1], zeros);
            EXPECT_STATUS(dt_zero_step(z, g, NULL), DT_ERR_STATE, "group 0 is still gathered");
            char dir[256];
            dt_test_scratch_dir(dir, sizeof dir);
            EXPECT_STATUS(dt_zero_save(z, dir, 0, NULL, NULL, NULL), DT_ERR_STATE,
                          "still gathered");
            dt_save_request *req = NULL;
            EXPECT_STATUS(dt_zero_save_async(z, dir, 0, NULL, NULL, NULL, &req), DT_ERR_UNSUPPORTED,
                          "synchronously");
            dt_test_scratch_remove(dir);
            DT_ASSERT_OK(dt_zero_release(z, 0));
            EXPECT_STATUS(dt_zero_release(z, 0), DT_ERR_STATE, "released already");
            EXPECT_STATUS(dt_zero_param(z, 0, &t), DT_ERR_STATE, "dt_zero_gather its group 0");
            DT_ASSERT_OK(dt_zero_memory_usage(z, &m1));
            CU_ASSERT_EQUAL(m1.param_bytes, m0.param_bytes);
            /* The refusals changed nothing: a zero-gradient step (Adam's update of a zero
             * gradient with decoupled decay only) matches the reference on both. */
            DT_ASSERT_OK(dt_zero_step(z, g, NULL));
            for (int k = 0; k < 2; k++) {
                float s1[MAXN] = {0}, s2[MAXN] = {0};
                int64_t ne = k == 0 ? 30 : 7;
                zt_ref_update(ne, adamw(), 1, v[k], zeros, s1, s2);
                DT_ASSERT_OK(dt_zero_gather(z, k));
                DT_ASSERT_OK(dt_zero_param(z, k, &t));
                CU_ASSERT_EQUAL(zt_bit_mismatches(names[k], t, v[k]), 0);
                DT_ASSERT_OK(dt_zero_release(z, k));
            }
            dt_tensor_destroy(g[0]);
            dt_tensor_destroy(g[1]);
            dt_layout_destroy(gl2);
            dt_layout_destroy(gl1);
        }
        /* Stage 3 let the caller's tensors go: destroying them is the caller's. */
        dt_tensor_destroy(pt[0]);
        dt_tensor_destroy(pt[1]);
        dt_zero_destroy(z);
    }
    dt_layout_destroy(l2);
    dt_layout_destroy(l1);
    dt_mesh_destroy(mesh);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_zero_2d_mesh_model_sharded_params_match_reference_bitwise),
        DT_TEST(test_zero_bf16_dynamic_loss_scale_with_overflows_matches_reference_bitwise),
        DT_TEST(test_zero_f16_dynamic_loss_scale_with_overflows_matches_reference_bitwise),
        DT_TEST(test_zero_stage3_misuse_gives_clear_statuses),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "zero_synthetic", cases);
}
