/* ZeRO's clipping norm and overflow check combined across pipeline stages
 * (dt_zero_opts.combine): each stage of pipe=2 x batch=B has a dt_zero (stage 1, dp over
 * batch) for its own parameter; the combine callback shares the stages' sums of squares and
 * overflow flags through dt_pipe_share_values. Every stage then clips by the global norm, the
 * norm of the same step with both parameters in one dt_zero on the stage's devices
 * (within rounding: the per-stage sums are added in another order), and an inf in stage 1's
 * gradient makes stage 0 skip the step too. Without the callback (the default) stage 0 sees
 * only its own gradient. Needs every client to hold one stage only (np 2 and 4). A client
 * holding both stages (np 1) steps them with dt_zero_step_begin / _end instead (the combine
 * callback would wait in the first stage's step for the second's); that test runs at any np. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "dtensor/optim.h"
#include "dtensor/pipeline.h"
#include "../ops/ops_test_util.h"

enum { D = 8, STEPS = 3 };
static const double CLIP = 0.1; /* below the gradients' norm: every step clips */

typedef struct share {
    dt_pipe *pipe;
    int stage;
    int calls;
} share;

/* values: sq0, flag0, sq1, flag1; the stages' sums added in stage order. */
static dt_status combine(void *arg, double *sq, int *overflow)
{
    share *c = arg;
    double v[4] = {0, 0, 0, 0};
    int stage_of[4] = {0, 0, 1, 1};
    v[2 * c->stage] = *sq;
    v[2 * c->stage + 1] = *overflow ? 1.0 : 0.0;
    dt_status st = dt_pipe_share_values(c->pipe, 4, stage_of, v);
    if (st != DT_OK)
        return st;
    *sq = v[0] + v[2];
    *overflow = v[1] != 0.0 || v[3] != 0.0;
    c->calls++;
    return DT_OK;
}

static dt_tensor *host_tensor(const dt_mesh *m, uint64_t seed, float scale, int poison)
{
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 2, &rep));
    int64_t shape[2] = {D, D};
    float h[D * D];
    ot_fill_real(h, D * D, -1.0f, 1.0f, seed);
    for (int i = 0; i < D * D; i++)
        h[i] *= scale;
    if (poison)
        h[3] = INFINITY;
    dt_tensor *t = ot_tensor(rep, DT_DTYPE_F32, shape, h);
    dt_layout_destroy(rep);
    return t;
}

static dt_tensor *weight(const dt_mesh *m, int s) { return host_tensor(m, 10 + (uint64_t)s, 0.5f, 0); }
static dt_tensor *grad(const dt_mesh *m, int s, int step, int poison)
{
    return host_tensor(m, 100 + 10 * (uint64_t)step + (uint64_t)s, 0.3f, poison);
}

static dt_zero *make_zero(const dt_mesh *m, share *c)
{
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = 1;
    zo.clip_norm = CLIP;
    if (c) {
        zo.combine = combine;
        zo.combine_arg = c;
    }
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(m, &zo, &z));
    return z;
}

static void add(dt_zero *z, int n, const char *const *names, dt_tensor *const *w)
{
    dt_optim_hparams hp = DT_OPTIM_SGD_INIT;
    hp.lr = 0.5f;
    DT_ASSERT_OK(dt_zero_add_group(z, n, names, w, &hp, NULL));
}

static int setup(dt_mesh **m, dt_pipe **p, int *stage)
{
    if (dt_test_num_devices() % 2 != 0)
        return 0;
    const char *names[2] = {"pipe", "batch"};
    int64_t sizes[2] = {2, dt_test_num_devices() / 2};
    DT_ASSERT_OK(dt_mesh_create("zp", 2, names, sizes, dt_test_device_type(), m));
    DT_ASSERT_OK(dt_pipe_create(*m, "pipe", p));
    if (dt_pipe_holds_stage(*p, 0) && dt_pipe_holds_stage(*p, 1)) {
        dt_pipe_destroy(*p);
        dt_mesh_destroy(*m);
        return 0;
    }
    *stage = dt_pipe_holds_stage(*p, 0) ? 0 : 1;
    return 1;
}

static void test_stages_clip_by_the_global_norm(void)
{
    dt_mesh *m = NULL;
    dt_pipe *p = NULL;
    int s = 0;
    if (!setup(&m, &p, &s))
        return;
    const dt_mesh *sm = dt_pipe_stage_mesh(p, s);
    share c = {p, s, 0};
    /* Pipelined: this stage's parameter in its own optimizer. */
    dt_tensor *w = weight(sm, s);
    dt_zero *z = make_zero(sm, &c);
    const char *name[1] = {s == 0 ? "w0" : "w1"};
    add(z, 1, name, &w);
    /* Reference: both parameters in one optimizer on this stage's devices. */
    dt_tensor *rw[2] = {weight(sm, 0), weight(sm, 1)};
    dt_zero *rz = make_zero(sm, NULL);
    const char *rnames[2] = {"w0", "w1"};
    add(rz, 2, rnames, rw);
    for (int step = 0; step < STEPS; step++) {
        dt_tensor *g = grad(sm, s, step, 0);
        dt_tensor *rg[2] = {grad(sm, 0, step, 0), grad(sm, 1, step, 0)};
        dt_zero_step_info info, rinfo;
        DT_ASSERT_OK(dt_zero_step(z, &g, &info));
        DT_ASSERT_OK(dt_zero_step(rz, rg, &rinfo));
        CU_ASSERT(rinfo.clip_coef < 1.0);
        CU_ASSERT(fabs(info.grad_norm - rinfo.grad_norm) <= 1e-12 * rinfo.grad_norm);
        CU_ASSERT(fabs(info.clip_coef - rinfo.clip_coef) <= 1e-12 * rinfo.clip_coef);
        dt_tensor_destroy(g);
        dt_tensor_destroy(rg[0]);
        dt_tensor_destroy(rg[1]);
    }
    CU_ASSERT_EQUAL(c.calls, STEPS);
    /* Within rounding of the clip factor: a relative 1e-6 of each element. */
    for (int i = 0; i < dt_tensor_num_local(w); i++) {
        float *a = dt_test_local_get(w, i), *b = dt_test_local_get(rw[s], i);
        for (int k = 0; k < D * D; k++)
            CU_ASSERT(fabsf(a[k] - b[k]) <= 1e-6f * fabsf(b[k]) + 1e-7f);
        free(a);
        free(b);
    }
    dt_zero_destroy(z);
    dt_zero_destroy(rz);
    dt_tensor_destroy(w);
    dt_tensor_destroy(rw[0]);
    dt_tensor_destroy(rw[1]);
    dt_pipe_destroy(p);
    dt_mesh_destroy(m);
}

/* An inf in stage 1's gradient: with the callback both stages skip; without it (the default)
 * stage 0 updates with its own finite gradient. */
static void test_an_overflow_on_one_stage_skips_every_stage(void)
{
    dt_mesh *m = NULL;
    dt_pipe *p = NULL;
    int s = 0;
    if (!setup(&m, &p, &s))
        return;
    const dt_mesh *sm = dt_pipe_stage_mesh(p, s);
    for (int with = 1; with >= 0; with--) {
        share c = {p, s, 0};
        dt_tensor *w = weight(sm, s), *w0 = weight(sm, s);
        dt_zero *z = make_zero(sm, with ? &c : NULL);
        const char *name[1] = {"w"};
        add(z, 1, name, &w);
        dt_tensor *g = grad(sm, s, 0, s == 1);
        dt_zero_step_info info;
        DT_ASSERT_OK(dt_zero_step(z, &g, &info));
        int expect_skip = with || s == 1;
        CU_ASSERT_EQUAL(info.skipped, expect_skip);
        for (int i = 0; i < dt_tensor_num_local(w); i++) {
            float *a = dt_test_local_get(w, i), *b = dt_test_local_get(w0, i);
            CU_ASSERT_EQUAL(memcmp(a, b, sizeof(float) * D * D) == 0, expect_skip);
            free(a);
            free(b);
        }
        dt_tensor_destroy(g);
        dt_zero_destroy(z);
        dt_tensor_destroy(w);
        dt_tensor_destroy(w0);
    }
    dt_pipe_destroy(p);
    dt_mesh_destroy(m);
}

/* A failing callback's status comes back from dt_zero_step and nothing is updated. */
static dt_status refuse(void *arg, double *sq, int *overflow)
{
    (void)arg;
    (void)sq;
    (void)overflow;
    return DT_ERR_STATE;
}

static void test_a_failing_combine_returns_its_status(void)
{
    dt_mesh *m = NULL;
    const char *dn[1] = {"batch"};
    int64_t sz[1] = {dt_test_num_devices()};
    DT_ASSERT_OK(dt_mesh_create("zf", 1, dn, sz, dt_test_device_type(), &m));
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.combine = refuse;
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(m, &zo, &z));
    dt_tensor *w = weight(m, 0), *w0 = weight(m, 0), *g = grad(m, 0, 0, 0);
    const char *name[1] = {"w"};
    add(z, 1, name, &w);
    CU_ASSERT_EQUAL(dt_zero_step(z, &g, NULL), DT_ERR_STATE);
    for (int i = 0; i < dt_tensor_num_local(w); i++) {
        float *a = dt_test_local_get(w, i), *b = dt_test_local_get(w0, i);
        CU_ASSERT(memcmp(a, b, sizeof(float) * D * D) == 0);
        free(a);
        free(b);
    }
    dt_zero_destroy(z);
    dt_tensor_destroy(w);
    dt_tensor_destroy(w0);
    dt_tensor_destroy(g);
    dt_mesh_destroy(m);
}

/* dt_zero_save_joint: each stage's AdamW optimizer (no clipping) saves its parameter into one
 * checkpoint from the whole mesh; one optimizer holding both parameters on this stage's
 * devices (no pipeline) restores it with dt_zero_load and then has, bit for bit, the
 * parameters and the next step of the same two parameters trained in one optimizer. A mesh
 * without the optimizer's devices is refused before anything is written. */
/* Whatever stages this client holds (both at np 1): each held stage's optimizer steps in two
 * halves, the halves' values shared and added in stage order between them. Every stage then
 * clips by the norm of one optimizer holding both parameters, and an inf in stage 1's
 * gradient (step 1) makes every stage skip. The halves out of order are refused. */
static void test_stages_held_by_one_client_step_in_two_halves(void)
{
    if (dt_test_num_devices() % 2 != 0)
        return;
    const char *dims[2] = {"pipe", "batch"};
    int64_t sizes[2] = {2, dt_test_num_devices() / 2};
    dt_mesh *m = NULL;
    dt_pipe *p = NULL;
    DT_ASSERT_OK(dt_mesh_create("zp", 2, dims, sizes, dt_test_device_type(), &m));
    DT_ASSERT_OK(dt_pipe_create(m, "pipe", &p));
    dt_zero *z[2] = {NULL, NULL}, *rz[2] = {NULL, NULL};
    dt_tensor *w[2] = {NULL, NULL}, *rw[2][2] = {{NULL, NULL}, {NULL, NULL}};
    const char *names[2] = {"w0", "w1"};
    for (int s = 0; s < 2; s++) {
        if (!dt_pipe_holds_stage(p, s))
            continue;
        const dt_mesh *sm = dt_pipe_stage_mesh(p, s);
        w[s] = weight(sm, s);
        z[s] = make_zero(sm, NULL);
        add(z[s], 1, &names[s], &w[s]);
        rw[s][0] = weight(sm, 0);
        rw[s][1] = weight(sm, 1);
        rz[s] = make_zero(sm, NULL);
        add(rz[s], 2, names, rw[s]);
    }
    dt_zero_step_info info;
    for (int s = 0; s < 2; s++)
        if (z[s])
            CU_ASSERT_EQUAL(dt_zero_step_end(z[s], 1.0, 0, &info), DT_ERR_STATE);
    for (int step = 0; step < STEPS; step++) {
        int poison = step == 1; /* stage 1's gradient has an inf */
        double v[4] = {0, 0, 0, 0};
        int stage_of[4] = {0, 0, 1, 1};
        dt_tensor *g[2] = {NULL, NULL};
        for (int s = 0; s < 2; s++) {
            if (!z[s])
                continue;
            g[s] = grad(dt_pipe_stage_mesh(p, s), s, step, poison && s == 1);
            int of = 0;
            DT_ASSERT_OK(dt_zero_step_begin(z[s], &g[s], &v[2 * s], &of));
            v[2 * s + 1] = of;
            if (step == 0) { /* a second begin while one is pending */
                double sq;
                CU_ASSERT_EQUAL(dt_zero_step_begin(z[s], &g[s], &sq, &of), DT_ERR_STATE);
            }
        }
        DT_ASSERT_OK(dt_pipe_share_values(p, 4, stage_of, v));
        for (int s = 0; s < 2; s++) {
            if (!z[s])
                continue;
            const dt_mesh *sm = dt_pipe_stage_mesh(p, s);
            dt_tensor *rg[2] = {grad(sm, 0, step, 0), grad(sm, 1, step, poison)};
            dt_zero_step_info rinfo;
            DT_ASSERT_OK(dt_zero_step_end(z[s], v[0] + v[2], v[1] != 0.0 || v[3] != 0.0, &info));
            DT_ASSERT_OK(dt_zero_step(rz[s], rg, &rinfo));
            CU_ASSERT_EQUAL(info.skipped, poison);
            CU_ASSERT_EQUAL(info.step, rinfo.step);
            CU_ASSERT_EQUAL(rinfo.skipped, poison);
            if (!poison) {
                CU_ASSERT(rinfo.clip_coef < 1.0);
                CU_ASSERT(fabs(info.grad_norm - rinfo.grad_norm) <= 1e-12 * rinfo.grad_norm);
                CU_ASSERT(fabs(info.clip_coef - rinfo.clip_coef) <= 1e-12 * rinfo.clip_coef);
            }
            dt_tensor_destroy(rg[0]);
            dt_tensor_destroy(rg[1]);
            dt_tensor_destroy(g[s]);
        }
    }
    for (int s = 0; s < 2; s++) {
        if (!z[s])
            continue;
        for (int i = 0; i < dt_tensor_num_local(w[s]); i++) {
            float *a = dt_test_local_get(w[s], i), *b = dt_test_local_get(rw[s][s], i);
            for (int k = 0; k < D * D; k++)
                CU_ASSERT(fabsf(a[k] - b[k]) <= 1e-6f * fabsf(b[k]) + 1e-7f);
            free(a);
            free(b);
        }
        dt_zero_destroy(z[s]);
        dt_zero_destroy(rz[s]);
        dt_tensor_destroy(w[s]);
        dt_tensor_destroy(rw[s][0]);
        dt_tensor_destroy(rw[s][1]);
    }
    dt_pipe_destroy(p);
    dt_mesh_destroy(m);
}

static dt_zero *adamw_zero(const dt_mesh *m, int n, const char *const *names, dt_tensor **w)
{
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = 1;
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(m, &zo, &z));
    dt_optim_hparams hp = DT_OPTIM_ADAMW_INIT;
    hp.lr = 0.05f;
    DT_ASSERT_OK(dt_zero_add_group(z, n, names, w, &hp, NULL));
    return z;
}

static void assert_same_bits(const dt_tensor *a, const dt_tensor *b)
{
    for (int i = 0; i < dt_tensor_num_local(a); i++) {
        float *x = dt_test_local_get(a, i), *y = dt_test_local_get(b, i);
        CU_ASSERT(memcmp(x, y, sizeof(float) * D * D) == 0);
        free(x);
        free(y);
    }
}

static void test_a_joint_save_restores_into_one_optimizer(void)
{
    dt_mesh *m = NULL;
    dt_pipe *p = NULL;
    int s = 0;
    if (!setup(&m, &p, &s))
        return;
    const dt_mesh *sm = dt_pipe_stage_mesh(p, s);
    const char *both[2] = {"w0", "w1"};
    dt_tensor *w = weight(sm, s), *rw[2] = {weight(sm, 0), weight(sm, 1)};
    dt_tensor *lw[2] = {weight(sm, 0), weight(sm, 1)};
    dt_zero *z = adamw_zero(sm, 1, both + s, &w);
    dt_zero *rz = adamw_zero(sm, 2, both, rw), *lz = adamw_zero(sm, 2, both, lw);
    for (int step = 0; step < 2; step++) {
        dt_tensor *g = grad(sm, s, step, 0);
        dt_tensor *rg[2] = {grad(sm, 0, step, 0), grad(sm, 1, step, 0)};
        DT_ASSERT_OK(dt_zero_step(z, &g, NULL));
        DT_ASSERT_OK(dt_zero_step(rz, rg, NULL));
        dt_tensor_destroy(g);
        dt_tensor_destroy(rg[0]);
        dt_tensor_destroy(rg[1]);
    }
    char dir[512], ck[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/joint", dir);
    CU_ASSERT_EQUAL(dt_zero_save_joint(z, dt_pipe_stage_mesh(p, 1 - s), ck, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT(strstr(dt_last_error(), "is not in mesh") != NULL);
    DT_ASSERT_OK(dt_zero_save_joint(z, m, ck, NULL));
    DT_ASSERT_OK(dt_zero_load(lz, ck));
    assert_same_bits(lw[0], rw[0]);
    assert_same_bits(lw[1], rw[1]);
    assert_same_bits(w, rw[s]);
    /* The restored moments and step count: the next step equals the uninterrupted one's. */
    dt_tensor *rg[2] = {grad(sm, 0, 2, 0), grad(sm, 1, 2, 0)};
    dt_tensor *lg[2] = {grad(sm, 0, 2, 0), grad(sm, 1, 2, 0)};
    DT_ASSERT_OK(dt_zero_step(rz, rg, NULL));
    DT_ASSERT_OK(dt_zero_step(lz, lg, NULL));
    assert_same_bits(lw[0], rw[0]);
    assert_same_bits(lw[1], rw[1]);
    for (int k = 0; k < 2; k++) {
        dt_tensor_destroy(rg[k]);
        dt_tensor_destroy(lg[k]);
        dt_tensor_destroy(rw[k]);
        dt_tensor_destroy(lw[k]);
    }
    dt_test_scratch_remove(dir);
    dt_zero_destroy(z);
    dt_zero_destroy(rz);
    dt_zero_destroy(lz);
    dt_tensor_destroy(w);
    dt_pipe_destroy(p);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_stages_clip_by_the_global_norm),
        DT_TEST(test_an_overflow_on_one_stage_skips_every_stage),
        DT_TEST(test_a_failing_combine_returns_its_status),
        DT_TEST(test_stages_held_by_one_client_step_in_two_halves),
        DT_TEST(test_a_joint_save_restores_into_one_optimizer),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "pipe_zero", cases);
}
