/* dt_zero_save / dt_zero_load: the names and shapes written, a restore into another stage and
 * chunking that then continues bit for bit like the saved run, a restore onto another number
 * of data-parallel ranks, and the errors of a mismatched optimizer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "optim_grad_util.h"

typedef struct pdesc {
    const char *name;
    int rank;
    int64_t shape[2];
    const char *s0, *s1;
    int group;
} pdesc;

/* Group 0: AdamW, bf16; group 1: SGD with momentum, f32. */
static const pdesc descs[4] = {
    {"w1", 2, {5, 3}, NULL, NULL, 0},
    {"w2", 2, {6, 4}, "model", NULL, 0},
    {"w3", 2, {3, 3}, NULL, "model", 1},
    {"b3", 1, {2, 0}, NULL, NULL, 1},
};

static int64_t pnumel(const pdesc *d)
{
    return d->rank == 1 ? d->shape[0] : d->shape[0] * d->shape[1];
}

/* Summand of batch rank dpc: batch rank 0 holds everything, so the reduced value does not
 * depend on the number of ranks. */
static float grad_value(int64_t idx, int64_t dpc, int step, void *arg)
{
    int salt = *(const int *)arg;
    if (step == 1 && salt == 0 && idx == 4 && dpc == 0)
        return INFINITY;
    return dpc == 0 ? (float)((idx * 7 + step * 5 + salt) % 11 - 5) : 0.0f;
}

static const int salts[4] = {0, 1, 2, 3};

typedef struct run {
    dt_mesh *mesh;
    dt_zero *z;
    dt_tensor *params[4];
    int n;
} run;

static void run_open(run *r, int model, int stage, int64_t allgather, int n, float init_shift,
                     dt_optim_kind kind1)
{
    memset(r, 0, sizeof *r);
    r->mesh = model ? og_mesh_2d() : og_mesh_1d();
    r->n = n;
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.stage = stage;
    o.allgather_size = allgather;
    o.scaler.mode = DT_LOSS_SCALE_DYNAMIC;
    o.scaler.init_scale = 64.0;
    o.scaler.window = 2;
    DT_ASSERT_OK(dt_zero_create(r->mesh, &o, &r->z));
    const char *names[4];
    for (int j = 0; j < n; j++) {
        const pdesc *d = &descs[j];
        int64_t ne = pnumel(d);
        float *x = malloc((size_t)ne * sizeof *x);
        for (int64_t i = 0; i < ne; i++)
            x[i] = (float)((i * 13 + j * 3) % 17 - 8) * 0.125f + init_shift;
        dt_layout *l = dt_test_layout(r->mesh, d->rank, model ? d->s0 : NULL, model ? d->s1 : NULL,
                                 NULL);
        r->params[j] = og_tensor(l, d->group == 0 ? DT_DTYPE_BF16 : DT_DTYPE_F32, d->shape, x);
        dt_layout_destroy(l);
        free(x);
        names[j] = d->name;
    }
    dt_optim_hparams h0 = DT_OPTIM_ADAMW_INIT, h1 = DT_OPTIM_SGD_INIT;
    h0.lr = 0.01f;
    h1.lr = 0.05f;
    h1.momentum = 0.9f;
    h1.kind = kind1;
    int n0 = n < 2 ? n : 2;
    DT_ASSERT_OK(dt_zero_add_group(r->z, n0, names, r->params, &h0, NULL));
    if (n > 2)
        DT_ASSERT_OK(dt_zero_add_group(r->z, n - 2, names + 2, r->params + 2, &h1, NULL));
}

static void run_close(run *r)
{
    dt_zero_destroy(r->z);
    for (int j = 0; j < r->n; j++)
        dt_tensor_destroy(r->params[j]);
    dt_mesh_destroy(r->mesh);
}

static void run_step(run *r, int step, dt_zero_step_info *info)
{
    dt_tensor *grads[4];
    float scale = (float)dt_zero_loss_scale(r->z);
    for (int j = 0; j < r->n; j++)
        grads[j] = og_grad(r->params[j], DT_DTYPE_F32, grad_value, step, scale,
                           (void *)&salts[j]);
    DT_ASSERT_OK(dt_zero_step(r->z, grads, info));
    for (int j = 0; j < r->n; j++)
        dt_tensor_destroy(grads[j]);
}

static void same_params(const run *a, const run *b, const char *what)
{
    for (int j = 0; j < a->n; j++) {
        int64_t n = pnumel(&descs[j]);
        float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
        og_fetch(a->params[j], x);
        og_fetch(b->params[j], y);
        char label[96];
        snprintf(label, sizeof label, "%s: %s", what, descs[j].name);
        CU_ASSERT_EQUAL(og_diff(label, y, x, n), 0);
        free(x);
        free(y);
    }
}

static void test_restore_into_another_stage_continues_bit_for_bit(void)
{
    char dir[256], ck[300];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    run a;
    run_open(&a, 1, 2, 0, 4, 0.0f, DT_OPTIM_SGD);
    dt_zero_step_info ia, ib;
    for (int step = 0; step < 3; step++)    /* step 1 overflows */
        run_step(&a, step, &ia);
    CU_ASSERT_EQUAL(ia.step, 2);

    /* An extra tensor and a caller's value go into the same checkpoint. */
    int64_t es[1] = {3};
    float ev[3] = {1, 2, 3};
    dt_layout *el = dt_test_layout(a.mesh, 1, NULL, NULL, NULL);
    dt_tensor *extra = og_tensor(el, DT_DTYPE_F32, es, ev);
    const char *en = "data/cursor";
    dt_ckpt_value uv = {"epoch", DT_CKPT_VALUE_I64, 7, 0.0, NULL, 0};
    dt_save_opts so = DT_SAVE_OPTS_INIT;
    so.fsync = 0;
    so.nvalues = 1;
    so.values = &uv;
    const dt_tensor *ets[1] = {extra};
    DT_ASSERT_OK(dt_zero_save(a.z, ck, 1, &en, ets, &so));

    /* The index: per-parameter state in the parameter's global shape. */
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    struct {
        const char *name;
        int rank;
        int64_t s0, s1;
    } want[] = {
        {"w1/master", 2, 5, 3},
        {"w1/exp_avg", 2, 5, 3},
        {"w1/exp_avg_sq", 2, 5, 3},
        {"w2/master", 2, 6, 4},
        {"w3/momentum", 2, 3, 3},
        {"b3/master", 1, 2, 0},
        {"w1", 2, 5, 3},
        {"data/cursor", 1, 3, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int64_t idx = -1;
        dt_ckpt_tensor_info info;
        DT_ASSERT_OK(dt_ckpt_find(c, want[i].name, &idx));
        DT_ASSERT_OK(dt_ckpt_tensor(c, idx, &info));
        CU_ASSERT_EQUAL(info.rank, want[i].rank);
        CU_ASSERT_EQUAL(info.shape[0], want[i].s0);
        if (want[i].rank > 1)
            CU_ASSERT_EQUAL(info.shape[1], want[i].s1);
    }
    int64_t idx = -1;
    CU_ASSERT_EQUAL(dt_ckpt_find(c, "w3/exp_avg", &idx), DT_ERR_NOT_FOUND);
    int64_t iv = 0;
    double fv = 0.0;
    DT_ASSERT_OK(dt_ckpt_value_i64(c, "zero/step", &iv));
    CU_ASSERT_EQUAL(iv, 2);
    DT_ASSERT_OK(dt_ckpt_value_i64(c, "zero/iteration", &iv));
    CU_ASSERT_EQUAL(iv, 3);
    DT_ASSERT_OK(dt_ckpt_value_i64(c, "zero/last_overflow", &iv));
    CU_ASSERT_EQUAL(iv, 1);
    DT_ASSERT_OK(dt_ckpt_value_i64(c, "zero/hysteresis_left", &iv));
    CU_ASSERT_EQUAL(iv, 1);
    DT_ASSERT_OK(dt_ckpt_value_f64(c, "zero/loss_scale", &fv));
    CU_ASSERT_EQUAL(fv, dt_zero_loss_scale(a.z));
    DT_ASSERT_OK(dt_ckpt_value_f64(c, "zero/group1/lr", &fv));
    CU_ASSERT_EQUAL(fv, (double)0.05f);
    DT_ASSERT_OK(dt_ckpt_value_i64(c, "epoch", &iv));
    CU_ASSERT_EQUAL(iv, 7);
    DT_ASSERT_OK(dt_ckpt_value_i64(c, "zero/state_format", &iv));
    CU_ASSERT_EQUAL(iv, 2);
    /* The saved master of a replicated parameter is its value in f32. */
    float master[15], w1[15];
    DT_ASSERT_OK(dt_ckpt_find(c, "w1/master", &idx));
    DT_ASSERT_OK(dt_ckpt_read_tensor(c, idx, master, sizeof master));
    og_fetch(a.params[0], w1);
    dt_test_round(master, 15, DT_DTYPE_BF16);
    CU_ASSERT_EQUAL(og_diff("w1 master", master, w1, 15), 0);
    dt_ckpt_close(c);

    /* Stage 1 with 7-element chunks, other initial values and learning rates: the load
     * brings everything back, and the next steps match the original run's. */
    run b;
    run_open(&b, 1, 1, 7, 4, 1.0f, DT_OPTIM_SGD);
    DT_ASSERT_OK(dt_zero_set_lr(b.z, 1, 0.5f));
    DT_ASSERT_OK(dt_zero_load(b.z, ck));
    same_params(&a, &b, "after load");
    CU_ASSERT_EQUAL(dt_zero_loss_scale(b.z), dt_zero_loss_scale(a.z));
    for (int step = 3; step < 5; step++) {
        run_step(&a, step, &ia);
        run_step(&b, step, &ib);
        CU_ASSERT_EQUAL(ib.step, ia.step);
        CU_ASSERT_EQUAL(ib.iteration, ia.iteration);
        CU_ASSERT_EQUAL(ib.loss_scale, ia.loss_scale);
        CU_ASSERT_EQUAL(ib.next_loss_scale, ia.next_loss_scale);
        CU_ASSERT(fabs(ib.grad_norm - ia.grad_norm) <= 1e-12 * ia.grad_norm);
        same_params(&a, &b, "continued");
    }
    run_close(&b);
    run_close(&a);
    dt_tensor_destroy(extra);
    dt_layout_destroy(el);
    dt_test_scratch_remove(dir);
}

static void test_restore_onto_another_number_of_dp_ranks(void)
{
    /* Replicated parameters only: saved on the 1-D mesh (every device a dp rank), restored on
     * the 2-D mesh (2 dp ranks), and the other way round. */
    char dir[256], ck[300];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    for (int from = 0; from < 2; from++) {
        run a, b;
        run_open(&a, from, 2, 0, 1, 0.0f, DT_OPTIM_SGD);
        dt_zero_step_info ia, ib;
        run_step(&a, 0, &ia);
        run_step(&a, 2, &ia);
        DT_ASSERT_OK(dt_zero_save(a.z, ck, 0, NULL, NULL, NULL));
        run_open(&b, !from, 1, 5, 1, 2.0f, DT_OPTIM_SGD);
        DT_ASSERT_OK(dt_zero_load(b.z, ck));
        same_params(&a, &b, "loaded");
        run_step(&a, 3, &ia);
        run_step(&b, 3, &ib);
        CU_ASSERT_EQUAL(ib.step, 3);
        same_params(&a, &b, "continued on other ranks");
        run_close(&a);
        run_close(&b);
    }
    dt_test_scratch_remove(dir);
}

static void test_load_names_what_does_not_match(void)
{
    char dir[256], ck[300], missing[320];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(missing, sizeof missing, "%s/none", dir);
    run a, b;
    run_open(&a, 1, 1, 0, 4, 0.0f, DT_OPTIM_SGD);
    DT_ASSERT_OK(dt_zero_save(a.z, ck, 0, NULL, NULL, NULL));
    DT_ASSERT_FAILS(dt_zero_load(a.z, missing), DT_ERR_NOT_FOUND);
    /* Adam where SGD was saved: no moments. */
    run_open(&b, 1, 1, 0, 4, 0.0f, DT_OPTIM_ADAM);
    DT_ASSERT_FAILS(dt_zero_load(b.z, ck), DT_ERR_NOT_FOUND);
    DT_ASSERT_ERROR_MENTIONS("w3/exp_avg");
    run_close(&b);
    /* Sharded differently over the model dim (here: not at all) is fine now. */
    run_open(&b, 0, 1, 0, 4, 0.0f, DT_OPTIM_SGD);
    DT_ASSERT_OK(dt_zero_load(b.z, ck));
    same_params(&a, &b, "loaded onto the 1-D mesh");
    run_close(&b);
    /* A parameter the checkpoint does not have. */
    run_open(&b, 1, 1, 0, 4, 0.0f, DT_OPTIM_SGD);
    dt_layout *l = dt_test_layout(b.mesh, 1, NULL, NULL, NULL);
    int64_t s[1] = {4};
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_F32, s, &t));
    const char *nn = "new_bias";
    dt_optim_hparams hp = DT_OPTIM_SGD_INIT;
    DT_ASSERT_OK(dt_zero_add_group(b.z, 1, &nn, &t, &hp, NULL));
    DT_ASSERT_FAILS(dt_zero_load(b.z, ck), DT_ERR_NOT_FOUND);
    DT_ASSERT_ERROR_MENTIONS("new_bias");
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    run_close(&b);
    run_close(&a);
    dt_test_scratch_remove(dir);
}

/* Saves a checkpoint of the older per-model-row format by hand: parameter w1 (replicated,
 * so its rows are its flattened value) and its state as 1-D tensors, the values without
 * "zero/state_format"; `state` holds master, exp_avg, exp_avg_sq (15 each). w2_len > 0 adds
 * parameter w2 zeros and its state of shape [2, w2_len]. */
static void save_legacy(const run *a, const char *dir, float state[3][15], int64_t w2_len)
{
    dt_layout *l1 = dt_test_layout(a->mesh, 1, NULL, NULL, NULL);
    dt_layout *l2 = dt_test_layout(a->mesh, 2, NULL, NULL, NULL);
    int64_t s15[1] = {15}, s2[2] = {2, w2_len};
    dt_tensor *t[8];
    const char *names[8] = {"w1", "w1/master", "w1/exp_avg", "w1/exp_avg_sq", "w2",
                            "w2/master", "w2/exp_avg", "w2/exp_avg_sq"};
    t[0] = a->params[0];
    for (int k = 0; k < 3; k++)
        t[1 + k] = og_tensor(l1, DT_DTYPE_F32, s15, state[k]);
    int n = 4;
    float zeros[64] = {0};
    if (w2_len > 0) {
        t[4] = a->params[1];
        for (int k = 0; k < 3; k++)
            t[5 + k] = og_tensor(l2, DT_DTYPE_F32, s2, zeros);
        n = 8;
    }
    dt_ckpt_value v[6] = {
        {"zero/step", DT_CKPT_VALUE_I64, 2, 0.0, NULL, 0},
        {"zero/iteration", DT_CKPT_VALUE_I64, 3, 0.0, NULL, 0},
        {"zero/loss_scale", DT_CKPT_VALUE_F64, 0, dt_zero_loss_scale(a->z), NULL, 0},
        {"zero/hysteresis_left", DT_CKPT_VALUE_I64, 1, 0.0, NULL, 0},
        {"zero/last_overflow", DT_CKPT_VALUE_I64, 1, 0.0, NULL, 0},
        {"zero/group0/lr", DT_CKPT_VALUE_F64, 0, (double)0.01f, NULL, 0},
    };
    dt_save_opts so = DT_SAVE_OPTS_INIT;
    so.fsync = 0;
    so.nvalues = 6;
    so.values = v;
    DT_ASSERT_OK(dt_save(a->mesh, dir, n, names, (const dt_tensor *const *)t, &so));
    for (int k = 1; k < n; k++)
        if (k != 4)
            dt_tensor_destroy(t[k]);
    dt_layout_destroy(l1);
    dt_layout_destroy(l2);
}

static void test_older_per_model_row_checkpoint_restores_on_its_mesh_or_is_refused(void)
{
    char dir[256], ck[300], old[300];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(old, sizeof old, "%s/old", dir);
    /* w1 alone, 1-D mesh: three steps (one overflows), saved in today's format; its state,
     * read back whole, is the older format's too (one row: the flattened value). */
    run a, b;
    run_open(&a, 0, 1, 0, 1, 0.0f, DT_OPTIM_SGD);
    dt_zero_step_info ia, ib;
    for (int step = 0; step < 3; step++)
        run_step(&a, step, &ia);
    DT_ASSERT_OK(dt_zero_save(a.z, ck, 0, NULL, NULL, NULL));
    float state[3][15];
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    const char *kinds[3] = {"w1/master", "w1/exp_avg", "w1/exp_avg_sq"};
    for (int k = 0; k < 3; k++) {
        int64_t idx = -1;
        DT_ASSERT_OK(dt_ckpt_find(c, kinds[k], &idx));
        DT_ASSERT_OK(dt_ckpt_read_tensor(c, idx, state[k], sizeof state[k]));
    }
    dt_ckpt_close(c);
    save_legacy(&a, old, state, 0);
    run_open(&b, 0, 2, 4, 1, 1.0f, DT_OPTIM_SGD);
    DT_ASSERT_OK(dt_zero_load(b.z, old));
    same_params(&a, &b, "older format loaded");
    for (int step = 3; step < 5; step++) {
        run_step(&a, step, &ia);
        run_step(&b, step, &ib);
        CU_ASSERT_EQUAL(ib.step, ia.step);
        same_params(&a, &b, "older format continued");
    }
    run_close(&b);
    /* w2 with state rows for 2 model coordinates, loaded where w2 is whole: refused, saying
     * why. */
    run_close(&a);
    run_open(&a, 0, 1, 0, 2, 0.0f, DT_OPTIM_SGD);
    save_legacy(&a, old, state, 12);
    run_open(&b, 0, 1, 0, 2, 0.0f, DT_OPTIM_SGD);
    DT_ASSERT_FAILS(dt_zero_load(b.z, old), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("w2/master");
    DT_ASSERT_ERROR_MENTIONS("per-model-row");
    run_close(&b);
    run_close(&a);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_restore_into_another_stage_continues_bit_for_bit),
        DT_TEST(test_restore_onto_another_number_of_dp_ranks),
        DT_TEST(test_load_names_what_does_not_match),
        DT_TEST(test_older_per_model_row_checkpoint_restores_on_its_mesh_or_is_refused),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "optim_ckpt", cases);
}
