/* GPU meshes beside CPU meshes, on whatever GPU devices the runtime has (the simulated
 * accelerator in CI): dt_copy_to_mesh both ways and through the host mesh, DLPack devices and
 * pack's device checks, dt_save/dt_restore bit for bit, running out of device memory; and,
 * with --no-gpu (no GPU devices), what a GPU mesh says is missing. Every component is read and
 * written only through dt_tensor_local_read/write; values are checked against host
 * references (tests/relayout/rl_test_util.h, or bytes the test wrote). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "relayout/rl_test_util.h"

#define U DT_UNSHARDED

static dt_tensor *const SENTINEL = (dt_tensor *)&SENTINEL;

static dt_mesh *line(dt_device_type type, const char *dim, int64_t n)
{
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(NULL, 1, &dim, &n, type, &m));
    return m;
}

static dt_mesh *gpu_line(void)
{
    return line(DT_DEVICE_GPU, "x", dt_num_global_devices(DT_DEVICE_GPU));
}

static int on_sim(void)
{
    return strcmp(dt_device_kind_name(DT_DEVICE_GPU), "sim") == 0;
}

/* Every local component of t is on the DLPack device type `want`. */
static void expect_dl_type(const dt_tensor *t, DLDeviceType want)
{
    for (int i = 0; i < dt_tensor_num_local(t); i++)
        CU_ASSERT_EQUAL(dt_tensor_local(t, i)->device.device_type, want);
}

/* ---- dt_copy_to_mesh between device types ------------------------------------------------ */

static void test_copy_to_mesh_moves_tensors_between_gpu_and_cpu_meshes(void)
{
    dt_mesh *g = gpu_line(), *c = line(DT_DEVICE_CPU, "y", dt_num_global_devices(DT_DEVICE_CPU));
    int64_t shape[2] = {7, 5};
    dt_layout *g_rows = dt_test_layout(g, 2, "x", NULL, NULL);
    dt_layout *g_cols = dt_test_layout(g, 2, NULL, "x", NULL);
    dt_layout *g_part = dt_test_layout(g, 2, NULL, NULL, "x");
    dt_layout *c_cols = dt_test_layout(c, 2, NULL, "y", NULL);
    dt_layout *c_part = dt_test_layout(c, 2, NULL, NULL, "y");
    static const dt_dtype dtypes[] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_I64, DT_DTYPE_U8};
    for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
        uint64_t seed = 100 + k;
        dt_tensor *src = NULL, *on_cpu = NULL, *back = NULL, *part = NULL, *reduced = NULL;
        /* GPU -> CPU -> GPU, each time into another sharding. */
        DT_ASSERT_OK(rl_make_tensor(g_rows, shape, dtypes[k], seed, &src));
        expect_dl_type(src, kDLCUDA);
        DT_ASSERT_OK(dt_copy_to_mesh(src, c_cols, &on_cpu));
        expect_dl_type(on_cpu, kDLCPU);
        CU_ASSERT_EQUAL(rl_check_tensor(on_cpu, g_rows, seed), 0);
        DT_ASSERT_OK(dt_copy_to_mesh(on_cpu, g_cols, &back));
        expect_dl_type(back, kDLCUDA);
        CU_ASSERT_EQUAL(rl_check_tensor(back, g_rows, seed), 0);
        /* A partial source is reduced on the way, either way. */
        DT_ASSERT_OK(rl_make_tensor(g_part, shape, dtypes[k], seed, &part));
        DT_ASSERT_OK(dt_copy_to_mesh(part, c_cols, &reduced));
        CU_ASSERT_EQUAL(rl_check_tensor(reduced, g_part, seed), 0);
        dt_tensor_destroy(reduced);
        dt_tensor_destroy(part);
        DT_ASSERT_OK(rl_make_tensor(c_part, shape, dtypes[k], seed, &part));
        DT_ASSERT_OK(dt_copy_to_mesh(part, g_rows, &reduced));
        expect_dl_type(reduced, kDLCUDA);
        CU_ASSERT_EQUAL(rl_check_tensor(reduced, c_part, seed), 0);
        dt_tensor_destroy(reduced);
        dt_tensor_destroy(part);
        dt_tensor_destroy(back);
        dt_tensor_destroy(on_cpu);
        dt_tensor_destroy(src);
    }
    dt_layout_destroy(c_part);
    dt_layout_destroy(c_cols);
    dt_layout_destroy(g_part);
    dt_layout_destroy(g_cols);
    dt_layout_destroy(g_rows);
    dt_mesh_destroy(c);
    dt_mesh_destroy(g);
}

/* The host mesh of a GPU mesh (the checkpoint's staging mesh) holds its tensors whatever
 * DT_CPU_DEVICES says: the runtime raises the CPU devices to the GPU count, and with more
 * CPU than GPU devices the host mesh still takes each client's own CPU devices. */
static void test_host_mesh_of_gpu_mesh_works_with_fewer_cpu_devices_asked(void)
{
    int ng = dt_num_local_devices(DT_DEVICE_GPU);
    const char *asked = getenv("DT_CPU_DEVICES");
    if (asked && atoi(asked) < ng)
        CU_ASSERT_EQUAL(dt_num_local_devices(DT_DEVICE_CPU), ng);
    CU_ASSERT(dt_num_local_devices(DT_DEVICE_CPU) >= ng);

    int64_t n = dt_num_global_devices(DT_DEVICE_GPU);
    const char *names[2] = {"a", "b"};
    int64_t sizes[2] = {n % 2 == 0 ? 2 : 1, n % 2 == 0 ? n / 2 : n};
    dt_mesh *g = NULL, *host = NULL;
    DT_ASSERT_OK(dt_mesh_create("g", 2, names, sizes, DT_DEVICE_GPU, &g));
    DT_ASSERT_OK(dt_mesh_host_mesh(g, &host));
    CU_ASSERT_EQUAL(dt_mesh_device_type(host), DT_DEVICE_CPU);
    CU_ASSERT_EQUAL(dt_mesh_num_local_devices(host), dt_mesh_num_local_devices(g));
    /* Each GPU device's host device is the CPU device of the same local index on the same
     * client (the ids differ when a client has more CPU than GPU devices). */
    for (int i = 0; i < dt_mesh_num_local_devices(g); i++) {
        int gid = dt_mesh_local_device_id(g, i), hid = dt_mesh_local_device_id(host, i);
        CU_ASSERT_EQUAL(dt_device_client(DT_DEVICE_CPU, hid), dt_client_id());
        CU_ASSERT_EQUAL(hid - dt_local_device_id(DT_DEVICE_CPU, 0),
                        gid - dt_local_device_id(DT_DEVICE_GPU, 0));
    }
    DT_ASSERT_OK(dt_mesh_check_devices(host));
    int64_t shape[2] = {9, 6};
    dt_layout *gl = dt_test_layout(g, 2, "b", "a", NULL);
    dt_layout *hl = dt_test_layout(host, 2, NULL, "b", NULL);
    dt_layout *gl2 = dt_test_layout(g, 2, "a", "b", NULL);
    dt_tensor *src = NULL, *on_host = NULL, *back = NULL;
    DT_ASSERT_OK(rl_make_tensor(gl, shape, DT_DTYPE_I32, 9, &src));
    DT_ASSERT_OK(dt_copy_to_mesh(src, hl, &on_host));
    expect_dl_type(on_host, kDLCPU);
    CU_ASSERT_EQUAL(rl_check_tensor(on_host, gl, 9), 0);
    DT_ASSERT_OK(dt_copy_to_mesh(on_host, gl2, &back));
    CU_ASSERT_EQUAL(rl_check_tensor(back, gl, 9), 0);
    dt_tensor_destroy(back);
    dt_tensor_destroy(on_host);
    dt_tensor_destroy(src);
    dt_layout_destroy(gl2);
    dt_layout_destroy(hl);
    dt_layout_destroy(gl);
    dt_mesh_destroy(host);
    dt_mesh_destroy(g);
}

/* ---- DLPack ------------------------------------------------------------------------------- */

/* Components of a GPU mesh are {kDLCUDA, the GPU's ordinal}, views from unpack too; the
 * simulator is one GPU per process (ordinal 0) shared by its logical devices. */
static void test_gpu_components_are_dlpack_cuda_devices_of_their_ordinal(void)
{
    dt_mesh *g = gpu_line(), *c = line(DT_DEVICE_CPU, "y", dt_num_global_devices(DT_DEVICE_CPU));
    dt_layout *gl = dt_test_layout(g, 1, "x", NULL, NULL);
    dt_layout *cl = dt_test_layout(c, 1, "y", NULL, NULL);
    int64_t shape[1] = {3 * dt_num_global_devices(DT_DEVICE_GPU)};
    dt_tensor *t = NULL, *h = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(gl, DT_DTYPE_F32, shape, &t));
    DT_ASSERT_OK(dt_tensor_zeros(cl, DT_DTYPE_F32, shape, &h));
    int n = dt_tensor_num_local(t);
    DLManagedTensor *views[64];
    CU_ASSERT_FATAL(n <= 64);
    DT_ASSERT_OK(dt_tensor_unpack(t, n, views));
    for (int i = 0; i < n; i++) {
        DLDevice d = dt_tensor_local(t, i)->device;
        CU_ASSERT_EQUAL(d.device_type, kDLCUDA);
        CU_ASSERT(d.device_id >= 0);
        if (on_sim())
            CU_ASSERT_EQUAL(d.device_id, 0);
        CU_ASSERT_EQUAL(views[i]->dl_tensor.device.device_type, kDLCUDA);
        CU_ASSERT_EQUAL(views[i]->dl_tensor.device.device_id, d.device_id);
        views[i]->deleter(views[i]);
    }
    for (int i = 0; i < dt_tensor_num_local(h); i++) {
        CU_ASSERT_EQUAL(dt_tensor_local(h, i)->device.device_type, kDLCPU);
        CU_ASSERT_EQUAL(dt_tensor_local(h, i)->device.device_id, 0);
    }
    dt_tensor_destroy(h);
    dt_tensor_destroy(t);
    dt_layout_destroy(cl);
    dt_layout_destroy(gl);
    dt_mesh_destroy(c);
    dt_mesh_destroy(g);
}

/* DLPack components in device memory (another tensor's components) pack; host memory or
 * another ordinal is refused naming what was given and what the mesh needs. */
static void test_pack_refuses_components_of_wrong_device_type_or_ordinal(void)
{
    dt_mesh *g = gpu_line();
    int64_t shape[2] = {2 * dt_num_global_devices(DT_DEVICE_GPU) + 1, 3};
    dt_layout *l = dt_test_layout(g, 2, "x", NULL, NULL);
    dt_tensor *carrier = NULL, *t = SENTINEL;
    DT_ASSERT_OK(rl_make_tensor(l, shape, DT_DTYPE_F32, 4, &carrier));
    int n = dt_tensor_num_local(carrier), last = n - 1;
    DLTensor comps[64];
    CU_ASSERT_FATAL(n >= 1 && n <= 64);
    for (int i = 0; i < n; i++)
        comps[i] = *dt_tensor_local(carrier, i);
    DLDevice right = comps[last].device;
    char want[64], given[64];
    snprintf(want, sizeof want, "kDLCUDA:%d", right.device_id);

    comps[last].device = (DLDevice){kDLCPU, 0};
    DT_ASSERT_FAILS(dt_tensor_pack(l, shape, n, comps, &t), DT_ERR_DEVICE_MISMATCH);
    DT_ASSERT_ERROR_MENTIONS("kDLCPU:0");
    DT_ASSERT_ERROR_MENTIONS(want);
    comps[last].device = (DLDevice){kDLCUDA, right.device_id + 1};
    snprintf(given, sizeof given, "kDLCUDA:%d", right.device_id + 1);
    DT_ASSERT_FAILS(dt_tensor_pack(l, shape, n, comps, &t), DT_ERR_DEVICE_MISMATCH);
    DT_ASSERT_ERROR_MENTIONS(given);
    DT_ASSERT_ERROR_MENTIONS(want);
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);

    /* The right device packs a copy of the same values. */
    comps[last].device = right;
    DT_ASSERT_OK(dt_tensor_pack(l, shape, n, comps, &t));
    CU_ASSERT_EQUAL(rl_check_tensor(t, l, 4), 0);
    for (int i = 0; i < n; i++)
        CU_ASSERT(dt_tensor_local(t, i)->data != comps[i].data);
    dt_tensor_destroy(t);
    dt_tensor_destroy(carrier);
    dt_layout_destroy(l);
    dt_mesh_destroy(g);
}

/* ---- checkpoints -------------------------------------------------------------------------- */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Local component i of rank-2 t against its box of the row-major host array `ref`. */
static int box_equals(const dt_tensor *t, int i, const unsigned char *ref)
{
    size_t es = dt_dtype_size(dt_tensor_dtype(t));
    const int64_t *off = dt_tensor_local_offset(t, i), *len = dt_tensor_local(t, i)->shape;
    int64_t cols = dt_tensor_shape(t)[1];
    unsigned char *got = dt_test_local_get(t, i);
    int eq = 1;
    for (int64_t r = 0; r < len[0] && len[1] > 0; r++)
        eq &= memcmp(got + (size_t)(r * len[1]) * es,
                     ref + (size_t)((off[0] + r) * cols + off[1]) * es, (size_t)len[1] * es) == 0;
    free(got);
    return eq;
}

#define NSAVE 4

/* Random bit patterns (NaN payloads and all) saved from a GPU mesh come back bit for bit:
 * in the files, restored onto the GPU mesh in another sharding, and onto a CPU mesh. */
static void test_save_and_restore_of_gpu_tensors_are_bit_exact(void)
{
    static const dt_dtype dtypes[NSAVE] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F16,
                                           DT_DTYPE_I64};
    const char *names[NSAVE] = {"w_f32", "w_bf16", "w_f16", "step_i64"};
    int64_t ng = dt_num_global_devices(DT_DEVICE_GPU), shape[2] = {2 * ng + 3, 5};
    dt_mesh *g = gpu_line(), *c = line(DT_DEVICE_CPU, "y", dt_num_global_devices(DT_DEVICE_CPU));
    dt_layout *rep = dt_test_layout(g, 2, NULL, NULL, NULL);
    dt_layout *rows = dt_test_layout(g, 2, "x", NULL, NULL);
    dt_layout *cols = dt_test_layout(g, 2, NULL, "x", NULL);
    dt_layout *c_rows = dt_test_layout(c, 2, "y", NULL, NULL);
    unsigned char *ref[NSAVE];
    size_t bytes[NSAVE];
    dt_tensor *saved[NSAVE];
    for (int k = 0; k < NSAVE; k++) {
        bytes[k] = (size_t)(shape[0] * shape[1]) * dt_dtype_size(dtypes[k]);
        ref[k] = malloc(bytes[k]);
        for (size_t b = 0; b < bytes[k]; b++)
            ref[k][b] = (unsigned char)mix((uint64_t)k << 32 | b);
        /* Replicated from the host bytes, then sharded on the devices. */
        const void *comps[64];
        for (int i = 0; i < dt_mesh_num_local_devices(g) && i < 64; i++)
            comps[i] = ref[k];
        dt_tensor *whole = NULL;
        DT_ASSERT_OK(dt_test_pack_host(rep, dtypes[k], shape, comps, &whole));
        DT_ASSERT_OK(dt_relayout(whole, rows, &saved[k]));
        dt_tensor_destroy(whole);
    }
    char dir[512], ck[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    DT_ASSERT_OK(dt_save(g, ck, NSAVE, names, (const dt_tensor *const *)saved, NULL));

    /* The files, read without the runtime. */
    dt_ckpt *ckpt = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &ckpt));
    for (int k = 0; k < NSAVE; k++) {
        int64_t idx = -1;
        DT_ASSERT_OK(dt_ckpt_find(ckpt, names[k], &idx));
        unsigned char *got = malloc(bytes[k]);
        DT_ASSERT_OK(dt_ckpt_read_tensor(ckpt, idx, got, bytes[k]));
        CU_ASSERT(memcmp(got, ref[k], bytes[k]) == 0);
        free(got);
    }
    dt_ckpt_close(ckpt);

    /* Restored onto the GPU mesh sharded the other way, and onto a CPU mesh. */
    const dt_layout *on_gpu[NSAVE] = {cols, cols, cols, cols};
    const dt_layout *on_cpu[NSAVE] = {c_rows, c_rows, c_rows, c_rows};
    dt_tensor *back[NSAVE], *host[NSAVE];
    DT_ASSERT_OK(dt_restore(g, ck, NSAVE, names, on_gpu, back));
    DT_ASSERT_OK(dt_restore(c, ck, NSAVE, names, on_cpu, host));
    for (int k = 0; k < NSAVE; k++) {
        CU_ASSERT_EQUAL(dt_tensor_dtype(back[k]), dtypes[k]);
        expect_dl_type(back[k], kDLCUDA);
        expect_dl_type(host[k], kDLCPU);
        for (int i = 0; i < dt_tensor_num_local(back[k]); i++)
            CU_ASSERT(box_equals(back[k], i, ref[k]));
        for (int i = 0; i < dt_tensor_num_local(host[k]); i++)
            CU_ASSERT(box_equals(host[k], i, ref[k]));
        dt_tensor_destroy(host[k]);
        dt_tensor_destroy(back[k]);
        dt_tensor_destroy(saved[k]);
        free(ref[k]);
    }
    dt_test_scratch_remove(dir);
    dt_layout_destroy(c_rows);
    dt_layout_destroy(cols);
    dt_layout_destroy(rows);
    dt_layout_destroy(rep);
    dt_mesh_destroy(c);
    dt_mesh_destroy(g);
}

/* ---- device memory ------------------------------------------------------------------------ */

/* With a small simulated memory (DT_SIM_MEMORY_MB, per process): creating, copying in or
 * relaying out more than fits is DT_ERR_NO_MEMORY naming the device and the bytes, the
 * output untouched; the tensors held keep their values and the memory is usable after. */
static void test_out_of_device_memory_is_no_memory_and_keeps_tensors(void)
{
    const char *mb = getenv("DT_SIM_MEMORY_MB");
    if (!on_sim() || !mb)
        return; /* needs a known, small device memory */
    int64_t cap = atoll(mb) << 20, ng = dt_num_global_devices(DT_DEVICE_GPU);
    int64_t nl = dt_num_local_devices(DT_DEVICE_GPU);
    dt_mesh *g = gpu_line(), *c = line(DT_DEVICE_CPU, "y", dt_num_global_devices(DT_DEVICE_CPU));
    dt_layout *rows = dt_test_layout(g, 2, "x", NULL, NULL);
    dt_layout *rep = dt_test_layout(g, 2, NULL, NULL, NULL);
    dt_layout *c_rows = dt_test_layout(c, 2, "y", NULL, NULL);
    dt_tensor *keep = NULL, *t = SENTINEL;
    int64_t kshape[2] = {4 * ng, 8};
    DT_ASSERT_OK(rl_make_tensor(rows, kshape, DT_DTYPE_F32, 21, &keep));

    /* Every local device asks for a whole memory's worth. */
    int64_t big[2] = {ng * (cap / 4096 + 1), 1024};
    DT_ASSERT_FAILS(dt_tensor_zeros(rows, DT_DTYPE_F32, big, &t), DT_ERR_NO_MEMORY);
    DT_ASSERT_ERROR_MENTIONS("device");
    DT_ASSERT_ERROR_MENTIONS("bytes");
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);

    /* A host tensor of 5/8 of the memory per process fits sharded, not replicated on every
     * device (ng >= 2: 5/4 of the memory or more). */
    int64_t part[2] = {ng * (cap * 5 / 8 / nl / 4096), 1024};
    dt_tensor *h = NULL, *on_g = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(c_rows, DT_DTYPE_F32, part, &h));
    if (ng >= 2) {
        DT_ASSERT_FAILS(dt_copy_to_mesh(h, rep, &t), DT_ERR_NO_MEMORY);
        CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    }
    DT_ASSERT_OK(dt_copy_to_mesh(h, rows, &on_g));
    if (ng >= 2) {
        DT_ASSERT_FAILS(dt_relayout(on_g, rep, &t), DT_ERR_NO_MEMORY);
        CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    }
    dt_tensor_destroy(on_g);
    dt_tensor_destroy(h);

    CU_ASSERT_EQUAL(rl_check_tensor(keep, rows, 21), 0);
    /* What the failed calls took was given back: half the memory is free again. */
    int64_t half[2] = {ng * (cap / 2 / nl / 4096), 1024};
    DT_ASSERT_OK(dt_tensor_zeros(rows, DT_DTYPE_F32, half, &t));
    dt_tensor_destroy(t);
    dt_tensor_destroy(keep);
    dt_layout_destroy(c_rows);
    dt_layout_destroy(rep);
    dt_layout_destroy(rows);
    dt_mesh_destroy(c);
    dt_mesh_destroy(g);
}

/* ---- without GPU devices (--no-gpu) --------------------------------------------------------- */

/* No GPU (DT_GPU unset, a build without CUDA or a machine without a GPU): a GPU mesh can be
 * described, but holding data on it fails saying what is missing and how to get it. */
static void test_gpu_mesh_without_gpu_devices_names_what_is_missing(void)
{
    if (dt_num_global_devices(DT_DEVICE_GPU) > 0)
        return; /* GPUs present: nothing is missing */
    dt_mesh *g = line(DT_DEVICE_GPU, "x", 2), *c = line(DT_DEVICE_CPU, "y", 1);
    dt_layout *gl = dt_test_layout(g, 1, "x", NULL, NULL), *cl = dt_test_layout(c, 1, NULL, NULL,
                                                                                NULL);
    int64_t shape[1] = {4};
    dt_tensor *t = SENTINEL, *h = NULL;
    DT_ASSERT_FAILS(dt_tensor_zeros(gl, DT_DTYPE_F32, shape, &t), DT_ERR_DEVICE_MISMATCH);
    DT_ASSERT_ERROR_MENTIONS("GPU");
    DT_ASSERT_ERROR_MENTIONS("DT_GPU=sim");
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    DT_ASSERT_OK(dt_tensor_zeros(cl, DT_DTYPE_F32, shape, &h));
    DT_ASSERT_FAILS(dt_copy_to_mesh(h, gl, &t), DT_ERR_DEVICE_MISMATCH);
    DT_ASSERT_ERROR_MENTIONS("DT_GPU=sim");
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    dt_tensor_destroy(h);
    dt_layout_destroy(cl);
    dt_layout_destroy(gl);
    dt_mesh_destroy(c);
    dt_mesh_destroy(g);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_copy_to_mesh_moves_tensors_between_gpu_and_cpu_meshes),
        DT_TEST(test_host_mesh_of_gpu_mesh_works_with_fewer_cpu_devices_asked),
        DT_TEST(test_gpu_components_are_dlpack_cuda_devices_of_their_ordinal),
        DT_TEST(test_pack_refuses_components_of_wrong_device_type_or_ordinal),
        DT_TEST(test_save_and_restore_of_gpu_tensors_are_bit_exact),
        DT_TEST(test_out_of_device_memory_is_no_memory_and_keeps_tensors),
        DT_TEST_END,
    };
    static const dt_test_case without[] = {
        DT_TEST(test_gpu_mesh_without_gpu_devices_names_what_is_missing),
        DT_TEST_END,
    };
    if (argc > 1 && strcmp(argv[1], "--no-gpu") == 0)
        return dt_test_main(argc, argv, "gpu_mesh_absent", without, 1);
    return dt_test_main_gpu(argc, argv, "gpu_mesh", cases);
}
