/* dt_zero_save / dt_zero_load: a run saved at step 10 on 4 data-parallel devices and restored
 * on 2 and on 3 (also changing the stage) continues to step 20 exactly as the uninterrupted
 * run, bit for bit, f32 and bf16, with an AdamW and an SGD-momentum group and dynamic loss
 * scaling whose state (scale, hysteresis, last overflow) must survive the restart. Gradient
 * summands are sums of per-row contributions that are small multiples of 2^-6 times the
 * (power of two) scale, so the gradient of the batch is exact whatever the number of dp
 * shards, and the reference is one single-device trajectory in plain C. The checkpoint's
 * per-parameter state tensors are read back with the ckpt inspection API and compared with the
 * reference state. Stage 3 (parameters as shards) is saved on 2 devices and restored on 4
 * (stage 3) and on 3 (stage 0), and saved on batch x model meshes and restored on other
 * shapes. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "zero_ref_util.h"

enum { NP = 3, ROWS = 12, STEPS = 20, SAVE_AT = 10, MAXN = 40 };

static const char *const pname[NP] = {"enc/w", "enc/b", "head/w"};
static const int prank[NP] = {2, 1, 2};
static const int64_t pshape[NP][2] = {{7, 5}, {5, 0}, {3, 4}};
static const int pgroup[NP] = {0, 0, 1};
/* How each parameter is split on a mesh with a "model" dim (unevenly where it is 2: the flat
 * buffers have padding). */
static const char *const pspec[NP][2] = {{NULL, "model"}, {"model", NULL}, {"model", NULL}};
static const int inject[] = {2, 7, 12, 13};

static int64_t pnumel(int k)
{
    return zt_numel2(prank[k], pshape[k]);
}

static dt_loss_scaler_opts scaler_opts(void)
{
    dt_loss_scaler_opts so = DT_LOSS_SCALER_OPTS_INIT;
    so.mode = DT_LOSS_SCALE_DYNAMIC;
    so.init_scale = 256.0;
    so.window = 3;
    return so;
}

static int injected(int64_t t)
{
    for (size_t i = 0; i < sizeof inject / sizeof inject[0]; i++)
        if (inject[i] == t)
            return 1;
    return 0;
}

/* Contribution of batch row r to parameter k's gradient at iteration t (unscaled). */
static float contrib(int64_t t, int k, int64_t r, int64_t e)
{
    return zt_int_at(7000 + 100 * (uint64_t)t + (uint64_t)k, (uint64_t)(r * 1024 + e), -4, 4) *
           0.015625f;
}

/* ---- the single-device reference trajectory ---------------------------------------------- */

typedef struct ref_state {
    float p[NP][MAXN], s1[NP][MAXN], s2[NP][MAXN];
} ref_state;

typedef struct ref_traj {
    ref_state after[STEPS]; /* master weights and moments after iteration t */
    double scale[STEPS];    /* scale the gradients of iteration t carry */
    double next_scale[STEPS];
    int64_t updates[STEPS];
    float init[NP][MAXN];
} ref_traj;

static void ref_compute(ref_traj *r, dt_dtype dtype)
{
    memset(r, 0, sizeof *r);
    ref_state st;
    memset(&st, 0, sizeof st);
    for (int k = 0; k < NP; k++) {
        zt_fill_real(st.p[k], pnumel(k), -0.5f, 0.5f, 900 + (uint64_t)k);
        dt_test_round(st.p[k], pnumel(k), dtype);
        memcpy(r->init[k], st.p[k], sizeof st.p[k]);
    }
    /* DeepSpeed's dynamic scaler (optim.h). */
    dt_loss_scaler_opts so = scaler_opts();
    double scale = so.init_scale;
    int64_t last = -1, updates = 0;
    int hyst = so.hysteresis;
    for (int64_t t = 0; t < STEPS; t++) {
        r->scale[t] = scale;
        int ov = injected(t);
        if (!ov) {
            updates++;
            for (int k = 0; k < NP; k++) {
                float g[MAXN];
                for (int64_t e = 0; e < pnumel(k); e++) {
                    float a = 0.0f;
                    for (int64_t row = 0; row < ROWS; row++)
                        a += contrib(t, k, row, e);
                    g[e] = a;
                }
                zt_ref_update(pnumel(k), zt_test_hparams(pgroup[k]), updates, st.p[k], g, st.s1[k],
                              st.s2[k]);
            }
        }
        if (ov) {
            if (hyst == 1 || so.hysteresis == 1)
                scale = fmax(scale / so.factor, so.min_scale);
            else
                hyst--;
            last = t;
        } else if ((t - last) % so.window == 0) {
            hyst = so.hysteresis;
            scale *= so.factor;
        }
        r->next_scale[t] = scale;
        r->updates[t] = updates;
        r->after[t] = st;
    }
}

/* ---- the distributed runs -------------------------------------------------------------------- */

typedef struct model {
    dt_mesh *mesh;
    dt_layout *l[NP];
    dt_tensor *p[NP];
    dt_zero *z;
    dt_dtype dtype;
    int stage;
} model;

/* Parameters on `mesh` from `init` (NULL: every element 7, to be overwritten by a load). */
static void model_create(model *m, dt_mesh *mesh, int stage, dt_dtype dtype, float init[NP][MAXN])
{
    memset(m, 0, sizeof *m);
    m->mesh = mesh;
    m->dtype = dtype;
    m->stage = stage;
    float sevens[MAXN];
    for (int e = 0; e < MAXN; e++)
        sevens[e] = 7.0f;
    int sharded = dt_mesh_dim_index(mesh, "model") >= 0;
    for (int k = 0; k < NP; k++) {
        m->l[k] = dt_test_layout(mesh, prank[k], sharded ? pspec[k][0] : NULL,
                                 sharded ? pspec[k][1] : NULL, NULL);
        m->p[k] = zt_tensor(m->l[k], dtype, pshape[k], init ? init[k] : sevens);
    }
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = stage;
    zo.scaler = scaler_opts();
    zo.allgather_size = 16;
    DT_ASSERT_OK(dt_zero_create(mesh, &zo, &m->z));
    DT_ASSERT_OK(dt_zero_add_group(m->z, 2, pname, m->p, zt_test_hparams(0), NULL));
    DT_ASSERT_OK(dt_zero_add_group(m->z, 1, pname + 2, m->p + 2, zt_test_hparams(1), NULL));
}

static void model_destroy(model *m)
{
    dt_zero_destroy(m->z);
    for (int k = 0; k < NP; k++) {
        dt_tensor_destroy(m->p[k]);
        dt_layout_destroy(m->l[k]);
    }
}

/* The parameters' values now: the model's tensors, or in stage 3 the gathered ones (both
 * groups gathered; params_done releases them). */
static void params_now(const model *m, dt_tensor **cur)
{
    for (int k = 0; k < NP; k++)
        cur[k] = m->p[k];
    if (m->stage != 3)
        return;
    DT_ASSERT_OK(dt_zero_gather(m->z, 0));
    DT_ASSERT_OK(dt_zero_gather(m->z, 1));
    for (int k = 0; k < NP; k++)
        DT_ASSERT_OK(dt_zero_param(m->z, k, &cur[k]));
}

static void params_done(const model *m)
{
    if (m->stage != 3)
        return;
    DT_ASSERT_OK(dt_zero_release(m->z, 0));
    DT_ASSERT_OK(dt_zero_release(m->z, 1));
}

static int64_t check_params(const model *m, const ref_state *want, const char *label, int64_t t)
{
    int64_t bad = 0;
    char what[128];
    dt_tensor *cur[NP];
    params_now(m, cur);
    for (int k = 0; k < NP && bad == 0; k++) {
        snprintf(what, sizeof what, "%s: %s after iteration %lld", label, pname[k], (long long)t);
        bad += zt_bit_mismatches(what, cur[k], want->p[k]);
    }
    params_done(m);
    return bad;
}

/* Iterations [t0, t1) on the model's mesh, each checked against the reference. */
static int64_t run_steps(model *m, const ref_traj *r, int64_t t0, int64_t t1, const char *label)
{
    const int dpd = dt_mesh_dim_index(m->mesh, "batch");
    const int64_t ndp = dt_mesh_dim_size(m->mesh, dpd);
    int64_t bad = 0;
    for (int64_t t = t0; t < t1; t++) {
        CU_ASSERT_EQUAL(dt_zero_loss_scale(m->z), r->scale[t]);
        dt_tensor *g[NP];
        for (int k = 0; k < NP; k++) {
            float *sm = calloc((size_t)(ndp * MAXN), sizeof(float));
            const float *srcs[8];
            for (int64_t j = 0; j < ndp; j++) {
                int64_t r0, nr;
                dt_shard_range(ROWS, ndp, j, &r0, &nr);
                float *s = sm + j * MAXN;
                for (int64_t e = 0; e < pnumel(k); e++) {
                    float a = 0.0f;
                    for (int64_t row = r0; row < r0 + nr; row++)
                        a += contrib(t, k, row, e);
                    s[e] = a * (float)r->scale[t];
                }
                srcs[j] = s;
            }
            if (injected(t) && k == 1)
                sm[(ndp - 1) * MAXN + 2] = INFINITY;
            dt_layout *gl = dt_test_layout(m->mesh, prank[k], NULL, NULL, "batch");
            g[k] = zt_tensor_from(gl, m->dtype, pshape[k], dpd, srcs);
            dt_layout_destroy(gl);
            free(sm);
        }
        dt_zero_step_info info;
        memset(&info, 0, sizeof info);
        DT_ASSERT_OK(dt_zero_step(m->z, g, &info));
        for (int k = 0; k < NP; k++)
            dt_tensor_destroy(g[k]);
        CU_ASSERT_EQUAL(info.iteration, t);
        CU_ASSERT_EQUAL(info.step, r->updates[t]);
        CU_ASSERT_EQUAL(info.skipped, injected(t));
        CU_ASSERT_EQUAL(info.loss_scale, r->scale[t]);
        CU_ASSERT_EQUAL(info.next_loss_scale, r->next_scale[t]);
        if (bad == 0)
            bad += check_params(m, &r->after[t], label, t);
    }
    return bad;
}

/* Rank 0 reads the saved state with the inspection API: per parameter "<name>/master" and
 * the moments (flattened local form, here the whole parameter) equal the reference. */
static void check_checkpoint(const char *dir, const ref_state *want, dt_dtype dtype)
{
    if (dt_client_id() != 0)
        return;
    dt_ckpt *ck = NULL;
    DT_ASSERT_OK(dt_ckpt_open(dir, &ck));
    for (int k = 0; k < NP; k++) {
        const char *suffix[3] = {"", "/master", pgroup[k] == 0 ? "/exp_avg" : "/momentum"};
        const float *vals[3] = {want->p[k], want->p[k], want->s1[k]};
        for (int s = 0; s < 4; s++) {
            char name[96];
            const float *w = s < 3 ? vals[s] : want->s2[k];
            if (s == 3 && pgroup[k] != 0)
                continue;
            snprintf(name, sizeof name, "%s%s", pname[k], s < 3 ? suffix[s] : "/exp_avg_sq");
            int64_t idx = -1;
            dt_status st = dt_ckpt_find(ck, name, &idx);
            if (st != DT_OK)
                fprintf(stderr, "checkpoint lacks '%s': %s\n", name, dt_last_error());
            CU_ASSERT_EQUAL(st, DT_OK);
            if (st != DT_OK)
                continue;
            dt_ckpt_tensor_info ti;
            DT_ASSERT_OK(dt_ckpt_tensor(ck, idx, &ti));
            int64_t n = 1;
            for (int d = 0; d < ti.rank; d++)
                n *= ti.shape[d];
            CU_ASSERT_EQUAL(n, pnumel(k));
            /* The parameter in its dtype; the state in f32. */
            CU_ASSERT_EQUAL(ti.dtype, s == 0 ? dtype : DT_DTYPE_F32);
            if (n != pnumel(k) || ti.dtype != (s == 0 ? dtype : DT_DTYPE_F32))
                continue;
            float got[MAXN], exp[MAXN];
            uint16_t half[MAXN];
            memcpy(exp, w, sizeof exp);
            if (s == 0 && dtype != DT_DTYPE_F32) {
                DT_ASSERT_OK(dt_ckpt_read_tensor(ck, idx, half, sizeof half));
                DT_ASSERT_OK(dt_kernel_cast(n, half, dtype, got, DT_DTYPE_F32));
                dt_test_round(exp, n, dtype);
            } else {
                DT_ASSERT_OK(dt_ckpt_read_tensor(ck, idx, got, sizeof got));
            }
            int64_t bad = 0;
            for (int64_t e = 0; e < n; e++)
                bad += memcmp(&got[e], &exp[e], sizeof(float)) != 0;
            if (bad)
                fprintf(stderr,
                        "checkpoint '%s': %lld elements differ from the reference "
                        "(first: %.9g, want %.9g)\n",
                        name, (long long)bad, (double)got[0], (double)exp[0]);
            CU_ASSERT_EQUAL(bad, 0);
        }
    }
    int64_t epoch = -1;
    DT_ASSERT_OK(dt_ckpt_value_i64(ck, "epoch", &epoch));
    CU_ASSERT_EQUAL(epoch, 3);
    dt_ckpt_close(ck);
}

/* async: through dt_zero_save_async, the extra tensor stored as bf16 (its values are exact
 * in bf16), and one more step (iteration t) taken before the save completes. */
static void save_model_as(model *m, const char *dir, int async, const ref_traj *r, int64_t t,
                          const char *label)
{
    /* An extra tensor (replicated, f32) and a value of the caller ride along. */
    dt_layout *l = dt_test_layout(m->mesh, 1, NULL, NULL, NULL);
    const float cursor[5] = {4, 3, 2, 1, 0};
    int64_t shape[1] = {5};
    dt_tensor *extra = zt_tensor(l, DT_DTYPE_F32, shape, cursor);
    const char *en[1] = {"data/cursor"};
    const dt_tensor *et[1] = {extra};
    dt_ckpt_value v = {"epoch", DT_CKPT_VALUE_I64, 3, 0.0, NULL, 0};
    dt_save_opts so = DT_SAVE_OPTS_INIT;
    so.fsync = 0;
    so.nvalues = 1;
    so.values = &v;
    if (async) {
        const dt_dtype as[1] = {DT_DTYPE_BF16};
        so.save_dtypes = as;
        dt_save_request *req = NULL;
        DT_ASSERT_OK(dt_zero_save_async(m->z, dir, 1, en, et, &so, &req));
        /* The save has its own copy: the next step may run at once. */
        CU_ASSERT_EQUAL(run_steps(m, r, t, t + 1, label), 0);
        DT_ASSERT_OK(dt_save_wait(req));
    } else {
        DT_ASSERT_OK(dt_zero_save(m->z, dir, 1, en, et, &so));
    }
    dt_tensor_destroy(extra);
    dt_layout_destroy(l);
}

static void save_model(model *m, const char *dir)
{
    save_model_as(m, dir, 0, NULL, 0, NULL);
}

static void check_extra(dt_mesh *mesh, const char *dir)
{
    dt_layout *l = dt_test_layout(mesh, 1, NULL, NULL, NULL);
    const char *en[1] = {"data/cursor"};
    const dt_layout *ls[1] = {l};
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_restore(mesh, dir, 1, en, ls, &t));
    const float cursor[5] = {4, 3, 2, 1, 0};
    CU_ASSERT_EQUAL(zt_bit_mismatches("data/cursor", t, cursor), 0);
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
}

static void resume(dt_dtype dtype)
{
    static ref_traj r;
    ref_compute(&r, dtype);
    char dir[256], ck[320];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    dt_mesh *mesh4 = zt_mesh_dp(4);
    dt_mesh *mesh2 = zt_mesh_dp(2);
    dt_mesh *mesh3 = zt_mesh_dp(3);
    char label[96];
    model m;
    /* The uninterrupted run, stage 1 on 4 devices. */
    static float final[NP][MAXN];
    int have_final = 0;
    if (zt_in_mesh(mesh4)) {
        model_create(&m, mesh4, 1, dtype, r.init);
        snprintf(label, sizeof label, "%s uninterrupted", dt_dtype_name(dtype));
        CU_ASSERT_EQUAL(run_steps(&m, &r, 0, STEPS, label), 0);
        for (int k = 0; k < NP; k++) {
            void *p0 = dt_test_local_get(m.p[k], 0);
            DT_ASSERT_OK(dt_kernel_cast(pnumel(k), p0, dtype, final[k], DT_DTYPE_F32));
            free(p0);
        }
        have_final = 1;
        model_destroy(&m);
    }
    for (int save_stage = 1; save_stage <= 3; save_stage++) {
        /* Stage 3 is saved on 2 devices and restored on 4 (stage 3) and 3 (stage 0). */
        dt_mesh *from = save_stage == 3 ? mesh2 : mesh4;
        if (zt_in_mesh(from)) {
            model_create(&m, from, save_stage, dtype, r.init);
            snprintf(label, sizeof label, "%s stage %d before the save", dt_dtype_name(dtype),
                     save_stage);
            CU_ASSERT_EQUAL(run_steps(&m, &r, 0, SAVE_AT, label), 0);
            save_model(&m, ck);
            model_destroy(&m);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        check_checkpoint(ck, &r.after[SAVE_AT - 1], dtype);
        /* Restore on 2 and on 3 devices, with another stage or the same. */
        struct {
            dt_mesh *mesh;
            int stage;
        } to[2] = {
            {save_stage == 3 ? mesh4 : mesh2, save_stage == 1   ? 2
                                              : save_stage == 2 ? 0
                                                                : 3},
            {mesh3, save_stage == 1   ? 1
                    : save_stage == 2 ? 2
                                      : 0},
        };
        for (int i = 0; i < 2; i++) {
            if (!zt_in_mesh(to[i].mesh))
                continue;
            model_create(&m, to[i].mesh, to[i].stage, dtype, NULL);
            DT_ASSERT_OK(dt_zero_load(m.z, ck));
            snprintf(label, sizeof label,
                     "%s saved at stage %d on %lld, loaded at stage %d on "
                     "%lld",
                     dt_dtype_name(dtype), save_stage, (long long)dt_mesh_size(from), to[i].stage,
                     (long long)dt_mesh_size(to[i].mesh));
            CU_ASSERT_EQUAL(check_params(&m, &r.after[SAVE_AT - 1], label, SAVE_AT - 1), 0);
            CU_ASSERT_EQUAL(run_steps(&m, &r, SAVE_AT, STEPS, label), 0);
            if (have_final) {
                int64_t bad = 0;
                dt_tensor *cur[NP];
                params_now(&m, cur);
                for (int k = 0; k < NP; k++) {
                    char what[160];
                    snprintf(what, sizeof what, "%s: %s vs the uninterrupted run", label, pname[k]);
                    bad += zt_bit_mismatches(what, cur[k], final[k]);
                }
                params_done(&m);
                CU_ASSERT_EQUAL(bad, 0);
            }
            check_extra(to[i].mesh, ck);
            model_destroy(&m);
        }
    }
    dt_mesh_destroy(mesh4);
    dt_mesh_destroy(mesh2);
    dt_mesh_destroy(mesh3);
    dt_test_scratch_remove(dir);
}

/* Saved on one batch x model mesh, restored on another shape (the model dim resized: the
 * parameters' shards and the flat buffers change), continued to the end: every iteration
 * equals the mesh-independent reference bit for bit, so the run also equals an uninterrupted
 * one on the target mesh. One save is asynchronous. */
static void reshape(dt_dtype dtype)
{
    static ref_traj r;
    ref_compute(&r, dtype);
    char dir[256], ck[320];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    static const struct {
        int64_t b, m;
        int stage;
        int64_t tb, tm;
        int tstage;
    } cases[5] = {
        {2, 2, 2, 4, 1, 1}, {4, 1, 1, 1, 2, 0}, {2, 2, 1, 1, 1, 2},
        {2, 2, 3, 4, 1, 3}, {2, 1, 3, 2, 2, 3},
    };
    for (int c = 0; c < 5; c++) {
        dt_mesh *from = zt_mesh_bm(cases[c].b, cases[c].m);
        dt_mesh *to = zt_mesh_bm(cases[c].tb, cases[c].tm);
        char label[128];
        snprintf(label, sizeof label, "%s saved at stage %d on %lldx%lld, loaded at stage %d on "
                 "%lldx%lld", dt_dtype_name(dtype), cases[c].stage, (long long)cases[c].b,
                 (long long)cases[c].m, cases[c].tstage, (long long)cases[c].tb,
                 (long long)cases[c].tm);
        model m;
        if (zt_in_mesh(from)) {
            model_create(&m, from, cases[c].stage, dtype, r.init);
            CU_ASSERT_EQUAL(run_steps(&m, &r, 0, SAVE_AT, label), 0);
            save_model_as(&m, ck, c == 1, &r, SAVE_AT, label);
            model_destroy(&m);
        }
        /* The saving clients' commit is seen by every client. */
        MPI_Barrier(MPI_COMM_WORLD);
        check_checkpoint(ck, &r.after[SAVE_AT - 1], dtype);
        if (dt_client_id() == 0) {
            /* save_dtypes reached the extra tensor only (the parameters kept theirs, above). */
            dt_ckpt *ckp = NULL;
            int64_t idx = -1;
            dt_ckpt_tensor_info ti;
            DT_ASSERT_OK(dt_ckpt_open(ck, &ckp));
            DT_ASSERT_OK(dt_ckpt_find(ckp, "data/cursor", &idx));
            DT_ASSERT_OK(dt_ckpt_tensor(ckp, idx, &ti));
            CU_ASSERT_EQUAL(ti.dtype, c == 1 ? DT_DTYPE_BF16 : DT_DTYPE_F32);
            dt_ckpt_close(ckp);
        }
        if (zt_in_mesh(to)) {
            model_create(&m, to, cases[c].tstage, dtype, NULL);
            DT_ASSERT_OK(dt_zero_load(m.z, ck));
            CU_ASSERT_EQUAL(check_params(&m, &r.after[SAVE_AT - 1], label, SAVE_AT - 1), 0);
            CU_ASSERT_EQUAL(run_steps(&m, &r, SAVE_AT, STEPS, label), 0);
            check_extra(to, ck);
            model_destroy(&m);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        dt_mesh_destroy(from);
        dt_mesh_destroy(to);
    }
    dt_test_scratch_remove(dir);
}

static void test_zero_saved_on_one_mesh_shape_restores_on_another_and_continues_exactly(void)
{
    reshape(DT_DTYPE_F32);
    reshape(DT_DTYPE_BF16);
}

static void test_zero_f32_saved_on_4_restored_on_2_and_3_continues_exactly(void)
{
    resume(DT_DTYPE_F32);
}

static void test_zero_bf16_saved_on_4_restored_on_2_and_3_continues_exactly(void)
{
    resume(DT_DTYPE_BF16);
}

/* A load into an optimizer with a parameter the checkpoint lacks, or of another shape, fails
 * with a status naming it, on every client; and a missing checkpoint is DT_ERR_NOT_FOUND. */
static void test_zero_load_names_missing_or_mismatched_parameters(void)
{
    static ref_traj r;
    ref_compute(&r, DT_DTYPE_F32);
    char dir[256], ck[320];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    dt_mesh *mesh = zt_mesh_dp(2);
    if (zt_in_mesh(mesh)) {
        model m;
        model_create(&m, mesh, 2, DT_DTYPE_F32, r.init);
        CU_ASSERT_EQUAL(run_steps(&m, &r, 0, 3, "short run"), 0);
        save_model(&m, ck);
        model_destroy(&m);

        dt_layout *l2 = dt_test_layout(mesh, 2, NULL, NULL, NULL);
        float z[MAXN] = {0};
        int64_t other[2] = {4, 3}, extra_shape[2] = {2, 2};
        dt_zero *zz = NULL;
        dt_zero_opts zo = DT_ZERO_OPTS_INIT;
        zo.stage = 1;
        /* head/w with a transposed shape. */
        dt_tensor *p3[NP];
        for (int k = 0; k < NP; k++) {
            dt_layout *l = dt_test_layout(mesh, prank[k], NULL, NULL, NULL);
            p3[k] = zt_tensor(l, DT_DTYPE_F32, k == 2 ? other : pshape[k], z);
            dt_layout_destroy(l);
        }
        DT_ASSERT_OK(dt_zero_create(mesh, &zo, &zz));
        DT_ASSERT_OK(dt_zero_add_group(zz, 2, pname, p3, zt_test_hparams(0), NULL));
        DT_ASSERT_OK(dt_zero_add_group(zz, 1, pname + 2, p3 + 2, zt_test_hparams(1), NULL));
        DT_ASSERT_FAILS(dt_zero_load(zz, ck), DT_ERR_SHAPE);
        DT_ASSERT_ERROR_MENTIONS("head/w");
        dt_zero_destroy(zz);
        /* An extra parameter the checkpoint does not have (head/w of the right shape). */
        dt_tensor *pq[2] = {zt_tensor(l2, DT_DTYPE_F32, pshape[2], z),
                            zt_tensor(l2, DT_DTYPE_F32, extra_shape, z)};
        const char *qn[2] = {"head/w", "extra/q"};
        DT_ASSERT_OK(dt_zero_create(mesh, &zo, &zz));
        DT_ASSERT_OK(dt_zero_add_group(zz, 2, pname, p3, zt_test_hparams(0), NULL));
        DT_ASSERT_OK(dt_zero_add_group(zz, 2, qn, pq, zt_test_hparams(1), NULL));
        DT_ASSERT_FAILS(dt_zero_load(zz, ck), DT_ERR_NOT_FOUND);
        DT_ASSERT_ERROR_MENTIONS("extra/q");
        char nowhere[400];
        snprintf(nowhere, sizeof nowhere, "%s/none", dir);
        DT_ASSERT_FAILS(dt_zero_load(zz, nowhere), DT_ERR_NOT_FOUND);
        dt_zero_destroy(zz);
        dt_tensor_destroy(pq[0]);
        dt_tensor_destroy(pq[1]);
        for (int k = 0; k < NP; k++)
            dt_tensor_destroy(p3[k]);
        dt_layout_destroy(l2);
    }
    dt_mesh_destroy(mesh);
    dt_test_scratch_remove(dir);
}

/* dt_zero_save_step after steps 1, 2 and 3 keeping the last 2: steps 2 and 3 stay, latest is
 * 3, and loading it on 2 devices continues exactly as the reference; a NULL root is refused. */
static void test_zero_save_step_keeps_the_newest_and_latest_resumes(void)
{
    static ref_traj r;
    ref_compute(&r, DT_DTYPE_F32);
    char root[256], latest[400];
    dt_test_scratch_dir(root, sizeof root);
    dt_mesh *mesh = zt_mesh_dp(2);
    if (zt_in_mesh(mesh)) {
        model m;
        model_create(&m, mesh, 1, DT_DTYPE_F32, r.init);
        const dt_ckpt_keep keep = {2, 0};
        for (int64_t t = 1; t <= 3; t++) {
            CU_ASSERT_EQUAL(run_steps(&m, &r, t - 1, t, "before a managed save"), 0);
            DT_ASSERT_OK(dt_zero_save_step(m.z, root, t, &keep, 0, NULL, NULL, NULL));
        }
        DT_ASSERT_FAILS(dt_zero_save_step(m.z, NULL, 4, &keep, 0, NULL, NULL, NULL),
                        DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("root");
        model_destroy(&m);
        dt_ckpt_step *steps = NULL;
        int64_t n = 0, step = -1;
        DT_ASSERT_OK(dt_ckpt_list_steps(root, &steps, &n));
        CU_ASSERT_EQUAL_FATAL(n, 2);
        CU_ASSERT(steps[0].step == 2 && steps[1].step == 3 && steps[0].complete &&
                  steps[1].complete);
        dt_ckpt_steps_free(steps);
        DT_ASSERT_OK(dt_ckpt_latest(root, &step, latest, sizeof latest));
        CU_ASSERT_EQUAL(step, 3);
        model_create(&m, mesh, 2, DT_DTYPE_F32, NULL);
        DT_ASSERT_OK(dt_zero_load(m.z, latest));
        CU_ASSERT_EQUAL(check_params(&m, &r.after[2], "loaded from the latest step", 2), 0);
        CU_ASSERT_EQUAL(run_steps(&m, &r, 3, STEPS, "after the managed resume"), 0);
        model_destroy(&m);
    }
    dt_mesh_destroy(mesh);
    dt_test_scratch_remove(root);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_zero_f32_saved_on_4_restored_on_2_and_3_continues_exactly),
        DT_TEST(test_zero_bf16_saved_on_4_restored_on_2_and_3_continues_exactly),
        DT_TEST(test_zero_load_names_missing_or_mismatched_parameters),
        DT_TEST(test_zero_save_step_keeps_the_newest_and_latest_resumes),
        DT_TEST(test_zero_saved_on_one_mesh_shape_restores_on_another_and_continues_exactly),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "zero_resume", cases);
}
