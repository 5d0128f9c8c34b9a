/* The ZeRO optimizer on a GPU mesh against the same optimizer on a CPU mesh of the same shape:
 * the same gradients give the same parameters, step reports and checkpoints bit for bit
 * (stages 0-2, f32/bf16/f16 parameters, loss scaling with an overflow, clipping, save and
 * load both ways between the meshes). On the simulated GPU (DT_GPU=sim) the device memory is
 * out of the host's reach, so any host access by the optimizer fails the test; its kernels are
 * the CPU's, so the results must be equal, not close. Also the kernel-table entry the
 * optimizer added (sq_sum_f64) on both kinds against its closed form. Skips (77) without GPU
 * devices. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"

enum { NPARAM = 3, STEPS = 4 };

/* The model: a [6, 9] weight sharded on "model" along dim 1, a [9, 5] weight sharded on
 * "model" along dim 0, a replicated bias of 7 (uneven shards: the flat buffers have padding;
 * several chunks). */
static const int64_t shapes[NPARAM][2] = {{6, 9}, {9, 5}, {7, 1}};
static const int ranks[NPARAM] = {2, 2, 1};
static const char *const specs[NPARAM][2] = {{NULL, "model"}, {"model", NULL}, {NULL, NULL}};
static const char *const pnames[NPARAM] = {"w1", "w2", "b"};

static int64_t numel(int p)
{
    return ranks[p] == 2 ? shapes[p][0] * shapes[p][1] : shapes[p][0];
}

static dt_mesh *mesh_of(dt_device_type type)
{
    const char *names[2] = {"batch", "model"};
    int64_t n = dt_num_global_devices(DT_DEVICE_GPU);
    int64_t sizes[2] = {2, n / 2};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(type == DT_DEVICE_GPU ? "g" : "c", 2, names, sizes, type, &m));
    return m;
}

/* Global row-major index of element e of local component i. */
static int64_t global_index(const dt_tensor *t, int i, int64_t e)
{
    const DLTensor *d = dt_tensor_local(t, i);
    const int64_t *off = dt_tensor_local_offset(t, i);
    int64_t idx = 0, stride = 1;
    for (int k = d->ndim - 1; k >= 0; k--) {
        idx += (off[k] + e % d->shape[k]) * stride;
        e /= d->shape[k];
        stride *= dt_tensor_shape(t)[k];
    }
    return idx;
}

/* Value of element idx of parameter p (init) or of its gradient summand at dp rank r, step s
 * (r < 0: the initial value). Step `bad_step` puts an inf into one summand. */
static float value(int p, int64_t idx, int r, int s, int bad_step)
{
    if (r < 0)
        return 0.125f * (float)((idx * 7 + p * 3) % 17 - 8);
    if (s == bad_step && p == 1 && idx == 3 && r == 1)
        return INFINITY;
    return 0.0625f * (float)((idx * 5 + r * 11 + s * 3 + p) % 23 - 11);
}

/* A tensor on `mesh` of parameter p's shape and specs (partial over "batch" for gradients),
 * its values times `scale`, each component written from the host through the device
 * layer. */
static dt_tensor *make(const dt_mesh *mesh, int p, dt_dtype dtype, int grad, int step,
                       int bad_step, float scale)
{
    dt_layout *l = dt_test_layout(mesh, ranks[p], specs[p][0], specs[p][1],
                                  grad ? "batch" : NULL);
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, dtype, shapes[p], &t));
    dt_layout_destroy(l);
    int dp = dt_mesh_dim_index(mesh, "batch");
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        int64_t coords[DT_MESH_MAX_DIMS];
        DT_ASSERT_OK(dt_mesh_coords(mesh, dt_tensor_local_position(t, i), coords));
        const DLTensor *d = dt_tensor_local(t, i);
        int64_t n = 1;
        for (int k = 0; k < d->ndim; k++)
            n *= d->shape[k];
        float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
        void *buf = malloc((size_t)(n ? n : 1) * dt_dtype_size(dtype));
        CU_ASSERT_FATAL(f && buf);
        for (int64_t e = 0; e < n; e++)
            f[e] = scale * value(p, global_index(t, i, e), grad ? (int)coords[dp] : -1, step,
                                 bad_step);
        DT_ASSERT_OK(dt_kernel_cast(n, f, DT_DTYPE_F32, buf, dtype));
        DT_ASSERT_OK(dt_tensor_local_write(t, i, buf, (size_t)n * dt_dtype_size(dtype)));
        free(f);
        free(buf);
    }
    return t;
}

/* The whole value of t as f32 (replicated, read back through the device layer). */
static void fetch(const dt_tensor *t, float *out)
{
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(t));
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(mesh, dt_tensor_rank(t), &rep));
    dt_tensor *r = NULL;
    DT_ASSERT_OK(dt_relayout(t, rep, &r));
    int64_t n = dt_tensor_numel(t);
    size_t bytes = (size_t)n * dt_dtype_size(dt_tensor_dtype(t));
    void *buf = malloc(bytes ? bytes : 1);
    CU_ASSERT_FATAL(buf != NULL);
    DT_ASSERT_OK(dt_tensor_local_read(r, 0, buf, bytes));
    DT_ASSERT_OK(dt_kernel_cast(n, buf, dt_tensor_dtype(t), out, DT_DTYPE_F32));
    free(buf);
    dt_tensor_destroy(r);
    dt_layout_destroy(rep);
}

/* One optimizer and its parameters on one mesh. */
typedef struct run {
    dt_mesh *mesh;
    dt_tensor *params[NPARAM];
    dt_zero *zero;
} run;

typedef struct config {
    int stage;
    dt_dtype dtype;
    dt_optim_kind kind;
    int scaled;       /* dynamic loss scaling (and an overflow at step 1) */
    double clip;
} config;

static void run_open(run *r, dt_device_type type, const config *c)
{
    memset(r, 0, sizeof *r);
    r->mesh = mesh_of(type);
    for (int p = 0; p < NPARAM; p++)
        r->params[p] = make(r->mesh, p, c->dtype, 0, 0, -1, 1.0f);
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.stage = c->stage;
    o.allgather_size = 16; /* several chunks, parameters cut across them */
    o.clip_norm = c->clip;
    if (c->scaled) {
        o.scaler.mode = DT_LOSS_SCALE_DYNAMIC;
        o.scaler.init_scale = 1024.0;
        o.scaler.hysteresis = 1;
    }
    DT_ASSERT_OK(dt_zero_create(r->mesh, &o, &r->zero));
    dt_optim_hparams hp = DT_OPTIM_ADAMW_INIT;
    hp.kind = c->kind;
    hp.lr = 0.05f;
    hp.weight_decay = 0.01f;
    if (c->kind == DT_OPTIM_SGD)
        hp.momentum = 0.9f;
    DT_ASSERT_OK(dt_zero_add_group(r->zero, NPARAM, pnames, r->params, &hp, NULL));
}

static void run_close(run *r)
{
    dt_zero_destroy(r->zero);
    for (int p = 0; p < NPARAM; p++)
        dt_tensor_destroy(r->params[p]);
    dt_mesh_destroy(r->mesh);
}

static void run_step(run *r, const config *c, int step, dt_zero_step_info *info)
{
    /* The gradients carry the loss scale, as a scaled backward pass gives them. */
    dt_tensor *g[NPARAM];
    float scale = (float)dt_zero_loss_scale(r->zero);
    for (int p = 0; p < NPARAM; p++)
        g[p] = make(r->mesh, p, c->dtype, 1, step, c->scaled ? 1 : -1, scale);
    DT_ASSERT_OK(dt_zero_step(r->zero, g, info));
    for (int p = 0; p < NPARAM; p++)
        dt_tensor_destroy(g[p]);
}

/* Parameters of two runs equal bit for bit; returns the differing elements. */
static int64_t compare(const run *a, const run *b, const char *what)
{
    int64_t bad = 0;
    for (int p = 0; p < NPARAM; p++) {
        int64_t n = numel(p);
        float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
        CU_ASSERT_FATAL(x && y);
        fetch(a->params[p], x);
        fetch(b->params[p], y);
        for (int64_t e = 0; e < n; e++)
            if (memcmp(&x[e], &y[e], sizeof x[e]) != 0) {
                if (bad < 5)
                    fprintf(stderr, "%s: %s[%lld]: %.9g vs %.9g\n", what, pnames[p],
                            (long long)e, x[e], y[e]);
                bad++;
            }
        free(x);
        free(y);
    }
    return bad;
}

static void check_infos(const dt_zero_step_info *a, const dt_zero_step_info *b)
{
    CU_ASSERT_EQUAL(a->step, b->step);
    CU_ASSERT_EQUAL(a->skipped, b->skipped);
    CU_ASSERT_EQUAL(memcmp(&a->grad_norm, &b->grad_norm, sizeof a->grad_norm), 0);
    CU_ASSERT_EQUAL(memcmp(&a->clip_coef, &b->clip_coef, sizeof a->clip_coef), 0);
    CU_ASSERT_EQUAL(a->loss_scale, b->loss_scale);
    CU_ASSERT_EQUAL(a->next_loss_scale, b->next_loss_scale);
}

/* STEPS steps on both meshes; the runs stay open for the caller. */
static void steps_on_both(const config *c, run *cpu, run *gpu)
{
    run_open(cpu, DT_DEVICE_CPU, c);
    run_open(gpu, DT_DEVICE_GPU, c);
    CU_ASSERT_EQUAL(compare(cpu, gpu, "initial"), 0);
    int skipped = 0, clipped = 0;
    for (int s = 0; s < STEPS; s++) {
        dt_zero_step_info ic, ig;
        run_step(cpu, c, s, &ic);
        run_step(gpu, c, s, &ig);
        check_infos(&ic, &ig);
        skipped += ig.skipped;
        clipped += ig.clip_coef < 1.0;
        char what[64];
        snprintf(what, sizeof what, "stage %d %s step %d", c->stage, dt_dtype_name(c->dtype),
                 s);
        CU_ASSERT_EQUAL(compare(cpu, gpu, what), 0);
    }
    /* The cases did what they are there for. */
    CU_ASSERT_EQUAL(skipped, c->scaled ? 1 : 0);
    if (c->clip > 0.0)
        CU_ASSERT(clipped > 0);
}

static void test_every_stage_and_dtype_steps_as_on_the_cpu_mesh(void)
{
    const dt_dtype dtypes[3] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F16};
    for (int stage = 0; stage <= 2; stage++)
        for (int d = 0; d < 3; d++) {
            config c = {stage, dtypes[d], DT_OPTIM_ADAMW, dtypes[d] != DT_DTYPE_F32, 0.0};
            run cpu, gpu;
            steps_on_both(&c, &cpu, &gpu);
            run_close(&cpu);
            run_close(&gpu);
        }
}

static void test_sgd_with_momentum_and_clipping_steps_as_on_the_cpu_mesh(void)
{
    for (int stage = 0; stage <= 2; stage += 2) {
        config c = {stage, DT_DTYPE_F32, DT_OPTIM_SGD, 0, 0.5};
        run cpu, gpu;
        steps_on_both(&c, &cpu, &gpu);
        run_close(&cpu);
        run_close(&gpu);
    }
}

/* A checkpoint of the GPU run restores into a fresh CPU run and a fresh GPU run (and the CPU
 * run's into a GPU run); one more step on each matches the original CPU run's. */
static void test_checkpoints_move_between_the_gpu_and_cpu_meshes(void)
{
    config c = {1, DT_DTYPE_BF16, DT_OPTIM_ADAM, 1, 1.0};
    run cpu, gpu;
    steps_on_both(&c, &cpu, &gpu);
    char dir[256], gdir[300], cdir[300];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(gdir, sizeof gdir, "%s/gpu", dir);
    snprintf(cdir, sizeof cdir, "%s/cpu", dir);
    DT_ASSERT_OK(dt_zero_save(gpu.zero, gdir, 0, NULL, NULL, NULL));
    DT_ASSERT_OK(dt_zero_save(cpu.zero, cdir, 0, NULL, NULL, NULL));

    /* The two checkpoints hold the same state: every saved tensor reads back equal. */
    dt_ckpt *a = NULL, *b = NULL;
    DT_ASSERT_OK(dt_ckpt_open(gdir, &a));
    DT_ASSERT_OK(dt_ckpt_open(cdir, &b));
    CU_ASSERT_EQUAL(dt_ckpt_num_tensors(a), dt_ckpt_num_tensors(b));
    for (int64_t k = 0; k < dt_ckpt_num_tensors(a); k++) {
        dt_ckpt_tensor_info ia;
        int64_t kb = -1;
        DT_ASSERT_OK(dt_ckpt_tensor(a, k, &ia));
        DT_ASSERT_OK(dt_ckpt_find(b, ia.name, &kb));
        int64_t offs[DT_MAX_RANK] = {0}, n = 1;
        for (int j = 0; j < ia.rank; j++)
            n *= ia.shape[j];
        size_t bytes = (size_t)n * dt_dtype_size(ia.dtype);
        void *x = malloc(bytes ? bytes : 1), *y = malloc(bytes ? bytes : 1);
        CU_ASSERT_FATAL(x && y);
        DT_ASSERT_OK(dt_ckpt_read_box(a, k, offs, ia.shape, x, bytes));
        DT_ASSERT_OK(dt_ckpt_read_box(b, kb, offs, ia.shape, y, bytes));
        if (memcmp(x, y, bytes) != 0) {
            fprintf(stderr, "checkpoint tensor '%s' differs\n", ia.name);
            CU_FAIL("a saved tensor differs between the GPU and CPU checkpoints");
        }
        free(x);
        free(y);
    }
    dt_ckpt_close(a);
    dt_ckpt_close(b);

    /* Fresh runs (initial parameters, no steps) restored from each other's saves. */
    run cpu_from_gpu, gpu_from_gpu, gpu_from_cpu;
    run_open(&cpu_from_gpu, DT_DEVICE_CPU, &c);
    run_open(&gpu_from_gpu, DT_DEVICE_GPU, &c);
    run_open(&gpu_from_cpu, DT_DEVICE_GPU, &c);
    DT_ASSERT_OK(dt_zero_load(cpu_from_gpu.zero, gdir));
    DT_ASSERT_OK(dt_zero_load(gpu_from_gpu.zero, gdir));
    DT_ASSERT_OK(dt_zero_load(gpu_from_cpu.zero, cdir));
    CU_ASSERT_EQUAL(dt_zero_loss_scale(gpu_from_gpu.zero), dt_zero_loss_scale(cpu.zero));
    dt_zero_step_info want, got;
    run_step(&cpu, &c, STEPS, &want);
    run *restored[3] = {&cpu_from_gpu, &gpu_from_gpu, &gpu_from_cpu};
    const char *what[3] = {"cpu from gpu", "gpu from gpu", "gpu from cpu"};
    for (int k = 0; k < 3; k++) {
        run_step(restored[k], &c, STEPS, &got);
        check_infos(&want, &got);
        CU_ASSERT_EQUAL(compare(&cpu, restored[k], what[k]), 0);
        run_close(restored[k]);
    }
    run_close(&cpu);
    run_close(&gpu);
    dt_test_scratch_remove(dir);
}

/* sq_sum_f64 of 1, 2, ..., n (exact in every dtype up to 256) is n (n + 1) (2n + 1) / 6 on the
 * CPU's and the GPU's table; an inf or a NaN anywhere gives inf or NaN; n = 0 gives 0. */
static void test_the_sum_of_squares_kernel_matches_the_closed_form_on_cpu_and_gpu(void)
{
    enum { N = 256 };
    const dt_dtype dtypes[3] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F16};
    const dt__device *devs[2] = {dt__device_local(DT_DEVICE_CPU, 0),
                                 dt__device_local(DT_DEVICE_GPU, 0)};
    float host[N];
    for (int k = 0; k < 2; k++) {
        const dt__device *dev = devs[k];
        CU_ASSERT_PTR_NOT_NULL_FATAL(dev);
        const dt__ops_backend *be = dev->kind->ops();
        CU_ASSERT_PTR_NOT_NULL_FATAL(be);
        void *x = NULL, *out = NULL;
        DT_ASSERT_OK(dev->kind->alloc(dev, N * sizeof(float), &x));
        DT_ASSERT_OK(dev->kind->alloc(dev, 4 * sizeof(double), &out));
        for (int d = 0; d < 3; d++) {
            uint16_t buf[2 * N];
            for (int case_ = 0; case_ < 3; case_++) {
                for (int i = 0; i < N; i++)
                    host[i] = (float)(i + 1);
                if (case_ > 0)
                    host[N / 3] = case_ == 1 ? -INFINITY : NAN;
                DT_ASSERT_OK(dt_kernel_cast(N, host, DT_DTYPE_F32, buf, dtypes[d]));
                size_t bytes = N * dt_dtype_size(dtypes[d]);
                DT_ASSERT_OK(dev->kind->copy(dev, DT__COPY_H2D, x, buf, bytes));
                if (be->set_device)
                    DT_ASSERT_OK(be->set_device(dev->ordinal));
                DT_ASSERT_OK(be->sq_sum_f64(N, x, dtypes[d], (double *)out));
                DT_ASSERT_OK(be->sq_sum_f64(7, x, dtypes[d], (double *)out + 1));
                DT_ASSERT_OK(be->sq_sum_f64(0, x, dtypes[d], (double *)out + 2));
                DT_ASSERT_OK(dev->kind->sync(dev));
                double got[3];
                DT_ASSERT_OK(dev->kind->copy(dev, DT__COPY_D2H, got, out, sizeof got));
                double want = case_ == 0 ? (double)N * (N + 1) * (2 * N + 1) / 6
                                         : case_ == 1 ? INFINITY : NAN;
                CU_ASSERT(case_ == 2 ? isnan(got[0]) : got[0] == want);
                CU_ASSERT_EQUAL(got[1], 7.0 * 8 * 15 / 6);
                CU_ASSERT_EQUAL(got[2], 0.0);
            }
        }
        /* A bad dtype fails at the call or, where kernels run asynchronously, at the sync. */
        dt_status st = be->sq_sum_f64(1, x, DT_DTYPE_I32, (double *)out);
        if (st == DT_OK)
            st = dev->kind->sync(dev);
        CU_ASSERT_EQUAL(st, DT_ERR_UNSUPPORTED);
        DT_ASSERT_ERROR_MENTIONS("i32");
        dev->kind->free(dev, x);
        dev->kind->free(dev, out);
    }
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_every_stage_and_dtype_steps_as_on_the_cpu_mesh),
        DT_TEST(test_sgd_with_momentum_and_clipping_steps_as_on_the_cpu_mesh),
        DT_TEST(test_checkpoints_move_between_the_gpu_and_cpu_meshes),
        DT_TEST(test_the_sum_of_squares_kernel_matches_the_closed_form_on_cpu_and_gpu),
        DT_TEST_END,
    };
    return dt_test_main_gpu(argc, argv, "optim_gpu", cases);
}
