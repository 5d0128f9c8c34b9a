/* The ZeRO optimizer's argument checks (each with a clear message), and its memory report
 * against hand-computed byte counts and the host pool's own accounting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "optim_grad_util.h"

static dt_tensor *filled(const dt_mesh *m, int rank, const int64_t *shape, const char *s0,
                         const char *partial, dt_dtype dtype)
{
    dt_layout *l = dt_test_layout(m, rank, s0, NULL, partial);
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, dtype, shape, &t));
    dt_layout_destroy(l);
    return t;
}

static void test_create_rejects_bad_options(void)
{
    dt_mesh *m = og_mesh_2d();
    dt_zero *z = NULL;
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.stage = 4; /* 0-3 exist */
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("stage 4");
    o.stage = 1;
    o.dp_dim = "data";
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("'data'");
    o.dp_dim = NULL;
    o.allgather_size = -1;
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("allgather_size");
    o.allgather_size = 0;
    o.reduce_bucket_size = 0;
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("reduce_bucket_size 0");
    o.reduce_bucket_size = -8;
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("reduce_bucket_size -8");
    o.reduce_bucket_size = 1;
    o.max_live_bucket_bytes = -1;
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("max_live_bucket_bytes -1");
    o.max_live_bucket_bytes = 0;
    o.scaler.mode = DT_LOSS_SCALE_DYNAMIC;
    dt_loss_scaler_opts good = o.scaler;
    o.scaler.window = 0;
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("scaler.window");
    o.scaler = good;
    o.scaler.hysteresis = 0;
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("scaler.hysteresis");
    o.scaler = good;
    o.scaler.min_scale = 0.0;
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("scaler.min_scale");
    o.scaler = good;
    o.scaler.factor = 1.0;
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("scaler.factor");
    o.scaler = good;
    o.scaler.init_scale = -2.0;
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("scaler.init_scale");
    o.scaler = good;
    o.scaler.mode = (dt_loss_scale_mode)7;
    DT_ASSERT_FAILS(dt_zero_create(m, &o, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("scaler.mode");
    DT_ASSERT_FAILS(dt_zero_create(NULL, NULL, &z), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_zero_create(m, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(z);
    /* NULL options are the defaults (stage 1 over "batch"). */
    DT_ASSERT_OK(dt_zero_create(m, NULL, &z));
    CU_ASSERT_EQUAL(dt_zero_num_params(z), 0);
    CU_ASSERT_EQUAL(dt_zero_loss_scale(z), 1.0);
    dt_zero_destroy(z);
    dt_zero_destroy(NULL);

    /* A GPU mesh is accepted where the job has its devices (DT_GPU=sim or real GPUs), by the
     * clients holding them, else refused with the mesh check's status and message. */
    const char *names[1] = {"batch"};
    int64_t sizes[1] = {2};
    dt_mesh *gpu = NULL;
    DT_ASSERT_OK(dt_mesh_create("g", 1, names, sizes, DT_DEVICE_GPU, &gpu));
    z = NULL;
    dt_status want = dt_mesh_check_devices(gpu);
    if (want != DT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        DT_ASSERT_FAILS(dt_zero_create(gpu, NULL, &z), want);
        CU_ASSERT_STRING_EQUAL(dt_last_error(), msg);
        CU_ASSERT_PTR_NULL(z);
    } else if (dt_mesh_num_local_devices(gpu) > 0) { /* clients outside it stay out */
        DT_ASSERT_OK(dt_zero_create(gpu, NULL, &z));
        dt_zero_destroy(z);
    }
    dt_mesh_destroy(gpu);
    dt_mesh_destroy(m);
}

static void test_add_group_rejects_bad_parameters(void)
{
    dt_mesh *m = og_mesh_2d(), *other = og_mesh_1d();
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(m, NULL, &z));
    int64_t shape[1] = {8};
    dt_tensor *good = filled(m, 1, shape, "model", NULL, DT_DTYPE_BF16);
    dt_tensor *good2 = filled(m, 1, shape, NULL, NULL, DT_DTYPE_BF16);
    dt_tensor *partial = filled(m, 1, shape, NULL, "model", DT_DTYPE_BF16);
    dt_tensor *dpshard = filled(m, 1, shape, "batch", NULL, DT_DTYPE_BF16);
    dt_tensor *ints = filled(m, 1, shape, NULL, NULL, DT_DTYPE_I32);
    dt_tensor *f32 = filled(m, 1, shape, NULL, NULL, DT_DTYPE_F32);
    dt_tensor *elsewhere = filled(other, 1, shape, NULL, NULL, DT_DTYPE_BF16);
    dt_optim_hparams hp = DT_OPTIM_ADAM_INIT;
    const char *n2[2] = {"a", "b"};
    dt_tensor *t2[2];

    t2[0] = good;
    t2[1] = partial;
    DT_ASSERT_FAILS(dt_zero_add_group(z, 2, n2, t2, &hp, NULL), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("'b' is partial");
    t2[1] = dpshard;
    DT_ASSERT_FAILS(dt_zero_add_group(z, 2, n2, t2, &hp, NULL), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("data-parallel");
    t2[1] = ints;
    DT_ASSERT_FAILS(dt_zero_add_group(z, 2, n2, t2, &hp, NULL), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("i32");
    t2[1] = f32;
    DT_ASSERT_FAILS(dt_zero_add_group(z, 2, n2, t2, &hp, NULL), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("group's first");
    t2[1] = elsewhere;
    DT_ASSERT_FAILS(dt_zero_add_group(z, 2, n2, t2, &hp, NULL), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("another mesh");
    t2[1] = good;
    DT_ASSERT_FAILS(dt_zero_add_group(z, 2, n2, t2, &hp, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("same tensor");
    const char *dup[2] = {"a", "a"};
    t2[1] = good2;
    DT_ASSERT_FAILS(dt_zero_add_group(z, 2, dup, t2, &hp, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("'a' is already used");
    DT_ASSERT_FAILS(dt_zero_add_group(z, 0, n2, t2, &hp, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_zero_add_group(z, 2, n2, t2, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    dt_optim_hparams bad = hp;
    bad.kind = (dt_optim_kind)9;
    DT_ASSERT_FAILS(dt_zero_add_group(z, 2, n2, t2, &bad, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("kind");
    bad = hp;
    bad.beta2 = 1.0f;
    DT_ASSERT_FAILS(dt_zero_add_group(z, 2, n2, t2, &bad, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("beta2");
    CU_ASSERT_EQUAL(dt_zero_num_params(z), 0);

    /* After all that the optimizer is still usable; names stay unique across groups. */
    int g = -1;
    DT_ASSERT_OK(dt_zero_add_group(z, 2, n2, t2, &hp, &g));
    CU_ASSERT_EQUAL(g, 0);
    const char *again = "b";
    DT_ASSERT_FAILS(dt_zero_add_group(z, 1, &again, &f32, &hp, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("'b' is already used");
    const char *c = "c";
    DT_ASSERT_OK(dt_zero_add_group(z, 1, &c, &f32, &hp, &g));
    CU_ASSERT_EQUAL(g, 1);
    CU_ASSERT_EQUAL(dt_zero_num_params(z), 3);

    /* Gradients: count fixed by the groups, each checked for shape, dtype and mesh. */
    int64_t wrong_shape[1] = {9};
    dt_tensor *g_ok = filled(m, 1, shape, NULL, "batch", DT_DTYPE_F32);
    dt_tensor *g_shape = filled(m, 1, wrong_shape, NULL, "batch", DT_DTYPE_F32);
    dt_tensor *g_int = filled(m, 1, shape, NULL, "batch", DT_DTYPE_I32);
    dt_tensor *g_other = filled(other, 1, shape, NULL, NULL, DT_DTYPE_F32);
    dt_tensor *grads[3] = {g_ok, g_shape, g_ok};
    DT_ASSERT_FAILS(dt_zero_step(z, grads, NULL), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("('b') has shape [9], the parameter [8]");
    grads[1] = g_ok;
    grads[2] = g_int;
    DT_ASSERT_FAILS(dt_zero_step(z, grads, NULL), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("('c') has dtype i32");
    grads[2] = g_other;
    DT_ASSERT_FAILS(dt_zero_step(z, grads, NULL), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("another mesh");
    grads[2] = NULL;
    DT_ASSERT_FAILS(dt_zero_step(z, grads, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_zero_step(z, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    grads[2] = g_ok;
    dt_zero_step_info info;
    DT_ASSERT_OK(dt_zero_step(z, grads, &info));
    CU_ASSERT_EQUAL(info.step, 1);
    CU_ASSERT_EQUAL(info.grad_norm, 0.0);

    dt_tensor *all[] = {good, good2, partial, dpshard, ints, f32, elsewhere, g_ok, g_shape,
                        g_int, g_other};
    /* The optimizer retained its parameters: destroying ours first is fine. */
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dt_tensor_destroy(all[i]);
    dt_zero_destroy(z);
    dt_mesh_destroy(other);
    dt_mesh_destroy(m);
}

/* Parameters "a" [1000] and "b" [4, 6], bf16, replicated over a 1-D dp mesh of N devices:
 * L = 1024 per device, N in {4, 8} divides it. */
static void check_memory(int stage, dt_optim_kind kind)
{
    dt_mesh *m = og_mesh_1d();
    int64_t ndp = dt_mesh_dim_size(m, 0);
    uint64_t nl = (uint64_t)dt_mesh_num_local_devices(m);
    int64_t sa[1] = {1000}, sb[2] = {4, 6};
    dt_tensor *a = filled(m, 1, sa, NULL, NULL, DT_DTYPE_BF16);
    dt_layout *lb = dt_test_layout(m, 2, NULL, NULL, NULL);
    dt_tensor *b = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(lb, DT_DTYPE_BF16, sb, &b));
    dt_pool_stats before, after, stepped;
    dt_host_pool_stats(&before);
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.stage = stage;
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(m, &o, &z));
    const char *names[2] = {"a", "b"};
    dt_tensor *ps[2] = {a, b};
    dt_optim_hparams hp = DT_OPTIM_ADAMW_INIT;
    hp.kind = kind;
    DT_ASSERT_OK(dt_zero_add_group(z, 2, names, ps, &hp, NULL));
    dt_host_pool_stats(&after);
    dt_zero_memory mem;
    DT_ASSERT_OK(dt_zero_memory_usage(z, &mem));

    uint64_t L = 1024, part = stage == 0 ? L : L / (uint64_t)ndp;
    uint64_t state_per = kind == DT_OPTIM_SGD ? 4 : 12;
    CU_ASSERT_EQUAL(mem.param_bytes, nl * L * 2);
    CU_ASSERT_EQUAL(mem.state_bytes, nl * state_per * part);
    CU_ASSERT_EQUAL(mem.grad_bytes, nl * 2 * (stage == 2 ? part : L));
    uint64_t gather = stage == 0 ? nl * 2 * L : stage == 1 ? nl * 2 * (L + part) : nl * 2 * L;
    CU_ASSERT_EQUAL(mem.gather_bytes, gather);
    /* Every byte the optimizer holds comes from the host pool on a CPU mesh; on a GPU mesh
     * it is device memory, and the host pool does not grow. */
    uint64_t from_pool = dt_test_device_type() == DT_DEVICE_CPU ? mem.grad_bytes + mem.state_bytes
                                                                : 0;
    CU_ASSERT_EQUAL(after.bytes_requested - before.bytes_requested, from_pool);
    if (after.bytes_requested - before.bytes_requested != from_pool)
        fprintf(stderr, "stage %d: pool grew by %llu, want %llu\n", stage,
                (unsigned long long)(after.bytes_requested - before.bytes_requested),
                (unsigned long long)from_pool);

    /* A step leaves nothing behind. */
    dt_layout *pa = dt_test_layout(m, 1, NULL, NULL, "batch"), *pb = dt_test_layout(m, 2, NULL, NULL,
                                                                          "batch");
    dt_tensor *grads[2] = {NULL, NULL};
    DT_ASSERT_OK(dt_tensor_zeros(pa, DT_DTYPE_BF16, sa, &grads[0]));
    DT_ASSERT_OK(dt_tensor_zeros(pb, DT_DTYPE_BF16, sb, &grads[1]));
    dt_host_pool_stats(&after);
    DT_ASSERT_OK(dt_zero_step(z, grads, NULL));
    dt_host_pool_stats(&stepped);
    CU_ASSERT_EQUAL(stepped.bytes_requested, after.bytes_requested);
    if (stepped.bytes_requested != after.bytes_requested)
        fprintf(stderr, "stage %d: a step left %lld bytes\n", stage,
                (long long)(stepped.bytes_requested - after.bytes_requested));
    dt_tensor_destroy(grads[0]);
    dt_tensor_destroy(grads[1]);
    dt_zero_destroy(z);
    dt_host_pool_stats(&after);
    /* Destroying it gives everything back (the gradients were made after `before`). */
    CU_ASSERT_EQUAL(after.bytes_requested, before.bytes_requested);
    dt_tensor_destroy(a);
    dt_tensor_destroy(b);
    dt_layout_destroy(pa);
    dt_layout_destroy(pb);
    dt_layout_destroy(lb);
    dt_mesh_destroy(m);
}

static void test_memory_usage_matches_the_hand_computed_bytes(void)
{
    for (int stage = 0; stage < 3; stage++)
        check_memory(stage, DT_OPTIM_ADAMW);
    check_memory(2, DT_OPTIM_SGD);
}

/* allgather_size below the dp size N (N - 1 here): before the chunks were rounded to
 * multiples of N, rank N - 1 owned nothing and the save wrote N - 1 files. Now each of the N
 * devices holds its equal share of the state (4 of 4N elements), in memory and in the save. */
static void test_an_allgather_size_below_the_dp_size_leaves_no_rank_without_state(void)
{
    dt_mesh *m = og_mesh_1d();
    int64_t n = dt_mesh_size(m);
    int64_t shape[1] = {4 * n};
    dt_tensor *w = filled(m, 1, shape, NULL, NULL, DT_DTYPE_F32);
    dt_zero_opts o = DT_ZERO_OPTS_INIT;
    o.allgather_size = n - 1;
    dt_zero *z = NULL;
    DT_ASSERT_OK(dt_zero_create(m, &o, &z));
    const char *name = "w";
    dt_optim_hparams hp = DT_OPTIM_SGD_INIT;
    DT_ASSERT_OK(dt_zero_add_group(z, 1, &name, &w, &hp, NULL));
    dt_zero_memory mem;
    DT_ASSERT_OK(dt_zero_memory_usage(z, &mem));
    CU_ASSERT_EQUAL(mem.state_bytes, (uint64_t)dt_mesh_num_local_devices(m) * 4 * sizeof(float));
    char dir[256], ck[300];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    DT_ASSERT_OK(dt_zero_save(z, ck, 0, NULL, NULL, NULL));
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    CU_ASSERT_EQUAL(dt_ckpt_num_files(c), n);
    int64_t idx = -1;
    dt_ckpt_tensor_info ti;
    DT_ASSERT_OK(dt_ckpt_find(c, "w/master", &idx));
    DT_ASSERT_OK(dt_ckpt_tensor(c, idx, &ti));
    /* Bytes of w/master per data file: 16 in every one. */
    for (int64_t f = 0; f < dt_ckpt_num_files(c); f++) {
        dt_ckpt_file_info fi;
        DT_ASSERT_OK(dt_ckpt_file(c, f, &fi));
        uint64_t bytes = 0;
        for (int64_t k = 0; k < ti.num_slices; k++) {
            dt_ckpt_slice_info si;
            DT_ASSERT_OK(dt_ckpt_slice(c, idx, k, &si));
            if (strcmp(si.file, fi.name) == 0)
                bytes += si.bytes;
        }
        CU_ASSERT_EQUAL(bytes, 4 * sizeof(float));
    }
    dt_ckpt_close(c);
    dt_test_scratch_remove(dir);
    dt_zero_destroy(z);
    dt_tensor_destroy(w);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_create_rejects_bad_options),
        DT_TEST(test_add_group_rejects_bad_parameters),
        DT_TEST(test_memory_usage_matches_the_hand_computed_bytes),
        DT_TEST(test_an_allgather_size_below_the_dp_size_leaves_no_rank_without_state),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "optim_api", cases);
}
