/* dt_zero_opts.reduce_dtype: 16-bit gradients summed in f32 across the dp ranks give the f32
 * reference sum (norm and update), in stages 0-2, through dt_zero_step and through early
 * buckets, where the sum in the parameters' dtype loses the small summands. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "optim_grad_util.h"

/* dp rank 0 holds `big` (256 for bf16, 2048 for f16: one more is below half an ulp), every
 * other rank 1: a 16-bit running sum stays at big, the f32 sum is big + (N - 1). */
typedef struct gen {
    float big;
} gen;

static float grad_value(int64_t idx, int64_t dpc, int step, void *arg)
{
    const gen *g = arg;
    (void)idx;
    return dpc == 0 ? g->big * (float)(step + 1) : 1.0f;
}

static float init_value(int64_t idx)
{
    return (float)(idx % 5) * 0.5f;
}

/* Runs 2 SGD steps (lr 1/64) of a [6, 4] parameter of dtype dt and checks the norm and the
 * parameter against the host reference of f32 sums; returns the last step's norm. */
static double run_case(int model, int stage, int early, dt_dtype dt, int reduce_dtype)
{
    dt_mesh *m = model ? og_mesh_2d() : og_mesh_1d();
    int64_t ndp = dt_mesh_dim_size(m, dt_mesh_dim_index(m, "batch"));
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.stage = stage;
    o.reduce_dtype = reduce_dtype;
    if (early)
        o.reduce_bucket_size = 12;
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(m, &o, &z));
    enum { N = 24 };
    const int64_t shape[2] = {6, 4};
    float x[N], ref[N], red[N];
    for (int i = 0; i < N; i++)
        x[i] = init_value(i);
    dt_test_round(x, N, dt);
    memcpy(ref, x, sizeof ref);
    dt_layout *l = dt_test_layout(m, 2, model ? "model" : NULL, NULL, NULL);
    dt_tensor *p = og_tensor(l, dt, shape, x);
    dt_layout_destroy(l);
    dt_optim_hparams hp = DT_OPTIM_SGD_INIT;
    hp.lr = 1.0f / 64.0f;
    const char *name = "w";
    DT_ASSERT_OK(dt_zero_add_group(z, 1, &name, &p, &hp, NULL));
    gen g = {dt == DT_DTYPE_BF16 ? 256.0f : 2048.0f};
    double norm = 0.0;
    for (int step = 0; step < 2; step++) {
        dt_tensor *grad = og_grad(p, dt, grad_value, step, 1.0f, &g);
        dt_zero_step_info info;
        if (early) {
            DT_ASSERT_OK(dt_zero_grad_ready(z, 0, grad));
            DT_ASSERT_OK(dt_zero_step(z, NULL, &info));
        } else {
            DT_ASSERT_OK(dt_zero_step(z, &grad, &info));
        }
        dt_tensor_destroy(grad);
        /* The f32 reference: every summand is exact in f32, so is their sum. */
        og_grad_ref(N, ndp, grad_value, step, 1.0f, &g, red);
        double sq = 0.0;
        for (int i = 0; i < N; i++) {
            sq += (double)red[i] * red[i];
            ref[i] -= hp.lr * red[i];
        }
        norm = info.grad_norm;
        if (reduce_dtype == DT_ZERO_REDUCE_F32) {
            CU_ASSERT(fabs(info.grad_norm - sqrt(sq)) <= 1e-12 * sqrt(sq));
            float got[N], want[N];
            og_fetch(p, got);
            memcpy(want, ref, sizeof want);
            dt_test_round(want, N, dt);
            char what[96];
            snprintf(what, sizeof what, "%s stage %d model %d early %d step %d",
                     dt_dtype_name(dt), stage, model, early, step);
            CU_ASSERT_EQUAL(og_diff(what, got, want, N), 0);
        }
    }
    dt_zero_destroy(z);
    dt_tensor_destroy(p);
    dt_mesh_destroy(m);
    return norm;
}

static void test_bf16_and_f16_gradients_reduced_in_f32_give_the_f32_reference_sum(void)
{
    const dt_dtype dts[2] = {DT_DTYPE_BF16, DT_DTYPE_F16};
    for (int d = 0; d < 2; d++)
        for (int model = 0; model < 2; model++)
            for (int stage = 0; stage < 3; stage++)
                for (int early = 0; early < 2; early++)
                    run_case(model, stage, early, dts[d], DT_ZERO_REDUCE_F32);
}

static void test_the_sum_in_the_parameters_dtype_loses_what_f32_keeps(void)
{
    /* Where there are several dp ranks, the default reduction rounds each partial sum to
     * bf16 and its norm is that of big alone: (2 * 256) * sqrt(24) at the second step. */
    dt_mesh *m = og_mesh_1d();
    int64_t ndp = dt_mesh_dim_size(m, 0);
    dt_mesh_destroy(m);
    for (int stage = 0; stage < 3; stage++) {
        double lossy = run_case(0, stage, 0, DT_DTYPE_BF16, DT_ZERO_REDUCE_PARAM);
        double exact = run_case(0, stage, 0, DT_DTYPE_BF16, DT_ZERO_REDUCE_F32);
        CU_ASSERT(fabs(exact - (512.0 + (double)(ndp - 1)) * sqrt(24.0)) < 1e-9 * exact);
        if (ndp > 1)
            CU_ASSERT(fabs(lossy - 512.0 * sqrt(24.0)) < 1e-9 * lossy);
    }
}

static void test_reduce_dtype_is_checked_at_create(void)
{
    dt_mesh *m = og_mesh_1d();
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.reduce_dtype = 7;
    dt_zero *z = NULL;
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("reduce_dtype 7");
    CU_ASSERT_PTR_NULL(z);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_bf16_and_f16_gradients_reduced_in_f32_give_the_f32_reference_sum),
        DT_TEST(test_the_sum_in_the_parameters_dtype_loses_what_f32_keeps),
        DT_TEST(test_reduce_dtype_is_checked_at_create),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "optim_reduce", cases);
}
