/* dt_zero_opts.offload: the optimizer's state in host memory and its update on the host, on
 * GPU meshes of the simulated accelerator. An optimizer with offload and one without, fed the
 * same gradients for 20 steps, both match a single-device plain-C reference bit for bit after
 * every step (stages 0, 1, 2; f32 on a 1-D mesh, bf16 on batch x model with model-sharded
 * parameters), and the devices hold 12 bytes (Adam) or 8 (SGD momentum) less per partition
 * element. Chunks of 56 (28 on the 2-D mesh) elements and transfer blocks of 3 put several
 * blocks through each device's pipeline. Summands are small multiples of 2^-6, so every
 * order of reduction gives the exact sum. A checkpoint saved with offload restores without it and back (stages changing too)
 * onto the uninterrupted trajectory. Every other step the offloaded optimizer takes its
 * gradients through dt_zero_grad_ready. On CPU meshes offload is refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "zero_ref_util.h"

enum { NP = 3, STEPS = 20, MAXN = 128, MAXDP = 8, BLOCK = 3 };

static const char *const pname[NP] = {"enc/w", "enc/b", "head/w"};
static const int prank[NP] = {2, 1, 2};
static const int64_t pshape[NP][2] = {{6, 16}, {16, 0}, {4, 6}};
static const int pgroup[NP] = {0, 0, 1};
/* Specs on a mesh with a "model" dim. */
static const char *const pspec[NP][2] = {{NULL, "model"}, {"model", NULL}, {"model", NULL}};

static int64_t pnumel(int k)
{
    return zt_numel2(prank[k], pshape[k]);
}

static int on_gpu(void)
{
    if (dt_test_device_type() == DT_DEVICE_GPU)
        return 1;
    printf("(offload equivalence: GPU meshes only; this run has CPU meshes)\n");
    return 0;
}

/* Summand of dp coordinate j for parameter k at iteration t: an exact small multiple of 2^-6. */
static void summand(int64_t t, int k, int64_t j, float *out)
{
    for (int64_t e = 0; e < pnumel(k); e++)
        out[e] = zt_int_at(9000 + 64 * (uint64_t)t + 8 * (uint64_t)k + (uint64_t)j,
                           (uint64_t)e, -4, 4) * 0.015625f;
}

/* ---- one optimizer over its own parameters ---------------------------------------------- */

typedef struct model {
    dt_zero *z;
    dt_tensor *pt[NP];
    dt_layout *pl[NP];
} model;

static void model_make(const dt_mesh *mesh, int stage, int ag, dt_dtype dtype, int offload,
                       float (*init)[MAXN], model *m)
{
    int mdl = dt_mesh_dim_index(mesh, "model") >= 0;
    for (int k = 0; k < NP; k++) {
        m->pl[k] = dt_test_layout(mesh, prank[k], mdl ? pspec[k][0] : NULL,
                                  mdl ? pspec[k][1] : NULL, NULL);
        m->pt[k] = zt_tensor(m->pl[k], dtype, pshape[k], init[k]);
    }
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = stage;
    zo.allgather_size = ag;
    zo.offload = offload;
    zo.offload_block = BLOCK;
    DT_ASSERT_OK(dt_zero_create(mesh, &zo, &m->z));
    DT_ASSERT_OK(dt_zero_add_group(m->z, 2, pname, m->pt, zt_test_hparams(0), NULL));
    DT_ASSERT_OK(dt_zero_add_group(m->z, 1, pname + 2, m->pt + 2, zt_test_hparams(1), NULL));
}

static void model_free(model *m)
{
    dt_zero_destroy(m->z);
    for (int k = 0; k < NP; k++) {
        dt_tensor_destroy(m->pt[k]);
        dt_layout_destroy(m->pl[k]);
    }
    memset(m, 0, sizeof *m);
}

/* ---- the reference trajectory and the shared gradients ----------------------------------- */

typedef struct ref {
    float p[NP][MAXN], s1[NP][MAXN], s2[NP][MAXN];
    int64_t t; /* iterations done */
} ref;

static void ref_init(ref *r, dt_dtype dtype, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    for (int k = 0; k < NP; k++) {
        zt_fill_real(r->p[k], pnumel(k), -0.5f, 0.5f, seed + (uint64_t)k);
        dt_test_round(r->p[k], pnumel(k), dtype); /* the master starts from the parameter */
    }
}

/* Iteration r->t: the gradients (partial over batch, summand j on dp coordinate j) into g,
 * and the reference update. */
static void ref_step(ref *r, const dt_mesh *mesh, dt_dtype dtype, dt_tensor **g)
{
    int dpd = dt_mesh_dim_index(mesh, "batch");
    int mdl = dt_mesh_dim_index(mesh, "model") >= 0;
    int64_t ndp = dt_mesh_dim_size(mesh, dpd);
    CU_ASSERT_FATAL(ndp <= MAXDP);
    static float sm[MAXDP][MAXN];
    float acc[MAXN];
    for (int k = 0; k < NP; k++) {
        const float *srcs[MAXDP];
        for (int64_t j = 0; j < ndp; j++) {
            summand(r->t, k, j, sm[j]);
            srcs[j] = sm[j];
        }
        for (int64_t e = 0; e < pnumel(k); e++) {
            float a = sm[0][e];
            for (int64_t j = 1; j < ndp; j++)
                a = a + sm[j][e];
            acc[e] = a;
        }
        dt_layout *gl = dt_test_layout(mesh, prank[k], mdl ? pspec[k][0] : NULL,
                                       mdl ? pspec[k][1] : NULL, "batch");
        g[k] = zt_tensor_from(gl, dtype, pshape[k], dpd, srcs);
        dt_layout_destroy(gl);
        zt_ref_update(pnumel(k), zt_test_hparams(pgroup[k]), r->t + 1, r->p[k], acc, r->s1[k], r->s2[k]);
    }
    r->t++;
}

static int64_t check(const char *label, const model *m, const ref *r)
{
    int64_t bad = 0;
    char what[160];
    for (int k = 0; k < NP && bad == 0; k++) {
        snprintf(what, sizeof what, "%s iteration %lld %s", label, (long long)r->t, pname[k]);
        bad += zt_bit_mismatches(what, m->pt[k], r->p[k]);
    }
    return bad;
}

/* Device state bytes the formula gives: per element of a device's partition of a group's flat
 * buffer, 4 bytes of master plus 4 per moment (AdamW: 2, SGD with momentum: 1). */
static uint64_t state_formula(const dt_mesh *mesh, int stage)
{
    int mdl = dt_mesh_dim_index(mesh, "model");
    int64_t msz = mdl >= 0 ? dt_mesh_dim_size(mesh, mdl) : 1;
    int64_t ndp = stage == 0 ? 1 : dt_mesh_dim_size(mesh, dt_mesh_dim_index(mesh, "batch"));
    int64_t l0 = (pnumel(0) + pnumel(1)) / msz, l1 = pnumel(2) / msz;
    return (uint64_t)dt_mesh_num_local_devices(mesh) * (uint64_t)(12 * l0 + 8 * l1) /
           (uint64_t)ndp;
}

/* 20 steps of an optimizer with offload and one without, both against the reference. */
static void run_pair(const dt_mesh *mesh, int stage, int ag, dt_dtype dtype)
{
    if (!zt_in_mesh(mesh))
        return;
    ref r;
    ref_init(&r, dtype, 100);
    model off, on;
    model_make(mesh, stage, ag, dtype, 0, r.p, &off);
    model_make(mesh, stage, ag, dtype, 1, r.p, &on);
    int64_t bad = 0;
    char label[64];
    for (int s = 0; s < STEPS; s++) {
        dt_tensor *g[NP];
        ref_step(&r, mesh, dtype, g);
        dt_zero_step_info a, b;
        DT_ASSERT_OK(dt_zero_step(off.z, g, &a));
        /* Every other step the offloaded optimizer gets its gradients early (the background
         * reduction), last parameter first. */
        if (s % 2) {
            for (int k = NP - 1; k >= 0; k--)
                DT_ASSERT_OK(dt_zero_grad_ready(on.z, k, g[k]));
            DT_ASSERT_OK(dt_zero_step(on.z, NULL, &b));
        } else {
            DT_ASSERT_OK(dt_zero_step(on.z, g, &b));
        }
        CU_ASSERT_EQUAL(a.step, b.step);
        CU_ASSERT_EQUAL(a.grad_norm, b.grad_norm);
        for (int k = 0; k < NP; k++)
            dt_tensor_destroy(g[k]);
        snprintf(label, sizeof label, "stage %d %s no offload", stage, dt_dtype_name(dtype));
        bad += check(label, &off, &r);
        snprintf(label, sizeof label, "stage %d %s offload", stage, dt_dtype_name(dtype));
        bad += check(label, &on, &r);
    }
    CU_ASSERT_EQUAL(bad, 0);

    /* Memory: the state leaves the devices for the host; the rest is as without offload. */
    dt_zero_memory mo, mn;
    DT_ASSERT_OK(dt_zero_memory_usage(off.z, &mo));
    DT_ASSERT_OK(dt_zero_memory_usage(on.z, &mn));
    uint64_t want = state_formula(mesh, stage);
    uint64_t blocks = (uint64_t)(dt_mesh_num_local_devices(mesh) > 0) * 5 * BLOCK * 4;
    if (mo.state_bytes != want || mn.state_bytes != 0 || mn.host_bytes != want + blocks)
        printf("stage %d: state %llu (formula %llu), offloaded: device %llu, host %llu\n", stage,
               (unsigned long long)mo.state_bytes, (unsigned long long)want,
               (unsigned long long)mn.state_bytes, (unsigned long long)mn.host_bytes);
    CU_ASSERT_EQUAL(mo.state_bytes, want);
    CU_ASSERT_EQUAL(mn.state_bytes, 0);
    CU_ASSERT_EQUAL(mn.host_bytes, want + blocks);
    CU_ASSERT_EQUAL(mo.host_bytes, 0);
    CU_ASSERT_EQUAL(mo.param_bytes, mn.param_bytes);
    CU_ASSERT_EQUAL(mo.grad_bytes, mn.grad_bytes);
    model_free(&off);
    model_free(&on);
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_zero_offload_refused_on_cpu_mesh(void)
{
    const char *names[1] = {"batch"};
    int64_t sizes[1] = {1};
    dt_mesh *mesh = NULL;
    DT_ASSERT_OK(dt_mesh_create("cpu1", 1, names, sizes, DT_DEVICE_CPU, &mesh));
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.offload = 1;
    dt_zero *z = NULL;
    DT_ASSERT_FAILS(dt_zero_create(mesh, &zo, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("nothing to offload");
    CU_ASSERT_PTR_NULL(z);
    zo.offload = 0;
    zo.offload_block = -1;
    DT_ASSERT_FAILS(dt_zero_create(mesh, &zo, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("offload_block");
    dt_mesh_destroy(mesh);
}

static void test_zero_offload_f32_stages_0_1_2_match_reference_bitwise(void)
{
    if (!on_gpu())
        return;
    dt_mesh *mesh = zt_mesh_dp(zt_num_devices());
    for (int stage = 0; stage <= 2; stage++)
        run_pair(mesh, stage, 56, DT_DTYPE_F32);
    dt_mesh_destroy(mesh);
}

static void test_zero_offload_bf16_model_sharded_matches_reference_bitwise(void)
{
    if (!on_gpu())
        return;
    dt_mesh *mesh = zt_mesh_batch_model();
    for (int stage = 1; stage <= 2; stage++)
        run_pair(mesh, stage, 28, DT_DTYPE_BF16);
    dt_mesh_destroy(mesh);
}

static void steps(model *m, ref *r, const dt_mesh *mesh, int n)
{
    for (int s = 0; s < n; s++) {
        dt_tensor *g[NP];
        ref_step(r, mesh, DT_DTYPE_F32, g);
        DT_ASSERT_OK(dt_zero_step(m->z, g, NULL));
        for (int k = 0; k < NP; k++)
            dt_tensor_destroy(g[k]);
    }
}

/* Saved with offload (stage 1) at 8, restored without (stage 2) and saved at 14, restored
 * with offload (stage 1) and run to 20: on the reference trajectory throughout. */
static void test_zero_offload_checkpoint_restores_without_offload_and_back(void)
{
    if (!on_gpu())
        return;
    dt_mesh *mesh = zt_mesh_dp(zt_num_devices());
    char dir[512], d1[600], d2[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(d1, sizeof d1, "%s/with", dir);
    snprintf(d2, sizeof d2, "%s/without", dir);
    ref r, fresh;
    ref_init(&r, DT_DTYPE_F32, 300);
    ref_init(&fresh, DT_DTYPE_F32, 700); /* other values, which the restore must replace */
    model a, b, c;
    model_make(mesh, 1, 8, DT_DTYPE_F32, 1, r.p, &a);
    steps(&a, &r, mesh, 8);
    CU_ASSERT_EQUAL(check("offload before save", &a, &r), 0);
    DT_ASSERT_OK(dt_zero_save(a.z, d1, 0, NULL, NULL, NULL));
    model_free(&a);

    model_make(mesh, 2, 56, DT_DTYPE_F32, 0, fresh.p, &b);
    DT_ASSERT_OK(dt_zero_load(b.z, d1));
    CU_ASSERT_EQUAL(check("restored without offload", &b, &r), 0);
    steps(&b, &r, mesh, 6);
    CU_ASSERT_EQUAL(check("after restore without offload", &b, &r), 0);
    DT_ASSERT_OK(dt_zero_save(b.z, d2, 0, NULL, NULL, NULL));
    model_free(&b);

    model_make(mesh, 1, 8, DT_DTYPE_F32, 1, fresh.p, &c);
    DT_ASSERT_OK(dt_zero_load(c.z, d2));
    CU_ASSERT_EQUAL(check("restored with offload", &c, &r), 0);
    steps(&c, &r, mesh, STEPS - 14);
    CU_ASSERT_EQUAL(check("after restore with offload", &c, &r), 0);
    model_free(&c);
    dt_test_scratch_remove(dir);
    dt_mesh_destroy(mesh);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_zero_offload_refused_on_cpu_mesh),
        DT_TEST(test_zero_offload_f32_stages_0_1_2_match_reference_bitwise),
        DT_TEST(test_zero_offload_bf16_model_sharded_matches_reference_bitwise),
        DT_TEST(test_zero_offload_checkpoint_restores_without_offload_and_back),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "zero_offload", cases);
}
