/* Checkpoints of GPU meshes on the simulated accelerator (DT_GPU=sim, DT_GPU_DEVICES=4), whose
 * memory host code cannot touch: GPU tensors saved and restored onto CPU and GPU meshes with
 * other layouts, CPU checkpoints restored onto GPU meshes, partial tensors reduced on the
 * devices, casts on save and on restore, asynchronous saves, all compared bit for bit with the
 * single-device reference (or the same casts computed on a CPU mesh); and the process's peak
 * resident memory during a save and a restore of GPU tensors larger than the staging bound
 * grows by about the bound, not by the tensor (a host copy of the tensor would show). */
#include <mpi.h>
#include <stdio.h>
#if defined(__GLIBC__)
#include <malloc.h> /* malloc_trim */
#endif
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "../../bench/peak_rss.h"
#include "ck_test_util.h"
#include "harness.h"

/* Both meshes are [G/2, 2] over dims (a, b): position p is on the same client on both. */
static int64_t gpu_count(void) { return dt_num_global_devices(DT_DEVICE_GPU); }

static dt_mesh *gpu_mesh(void)
{
    int64_t sizes[2] = {gpu_count() / 2, 2};
    return ck_mesh_of(DT_DEVICE_GPU, 2, sizes);
}

static dt_mesh *cpu_mesh(void)
{
    int64_t sizes[2] = {gpu_count() / 2, 2};
    return ck_mesh(2, sizes);
}

/* Client 0 flips one data byte of the first data file of checkpoint ck (between barriers). */
static void damage_first_file(const char *ck)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (dt_client_id() == 0) {
        DIR *d = opendir(ck);
        struct dirent *e;
        char path[600] = "";
        while (d && (e = readdir(d)))
            if (strncmp(e->d_name, "data-00000-of-", 14) == 0)
                snprintf(path, sizeof path, "%s/%s", ck, e->d_name);
        if (d)
            closedir(d);
        FILE *f = fopen(path, "r+b");
        unsigned char len[8], b;
        CU_ASSERT_FATAL(f != NULL);
        CU_ASSERT_FATAL(fread(len, 1, 8, f) == 8);
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--)
            hlen = hlen << 8 | len[i];
        CU_ASSERT_FATAL(fseek(f, (long)(8 + hlen + 10), SEEK_SET) == 0);
        CU_ASSERT_FATAL(fread(&b, 1, 1, f) == 1);
        b ^= 0x40;
        CU_ASSERT_FATAL(fseek(f, (long)(8 + hlen + 10), SEEK_SET) == 0);
        CU_ASSERT_FATAL(fwrite(&b, 1, 1, f) == 1);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_gpu_tensors_round_trip_through_cpu_and_gpu_meshes(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    dt_mesh *g = gpu_mesh(), *c = cpu_mesh();
    int64_t G = gpu_count();
    /* A sharded f32 matrix, a replicated bf16 one, a scalar, and a partial i64 vector (summed
     * over b on the devices before it is written). */
    dt_layout *lw = ck_layout(g, "a,b"), *lh = ck_layout(g, "unsharded,b"),
              *ls = ck_layout(g, "");
    const char *sp[1] = {"a"}, *pd[1] = {"b"};
    dt_reduce_op op[1] = {DT_REDUCE_SUM};
    dt_layout *lp = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(g, 1, sp, 1, pd, op, &lp));
    int64_t sw[2] = {8 * G + 5, 300}, sh[2] = {16, 10}, sv[1] = {3 * G + 1};
    dt_tensor *t[4] = {ck_make(lw, DT_DTYPE_F32, sw, 1), ck_make(lh, DT_DTYPE_BF16, sh, 2),
                       ck_make(ls, DT_DTYPE_F64, sv, 3), ck_make(lp, DT_DTYPE_I64, sv, 4)};
    const char *names[4] = {"w", "h", "s", "p"};
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    o.fsync = 0;
    o.chunk_bytes = 8192;
    o.staging_bytes = 16384;      /* far below the tensors: many pieces through the ring */
    DT_ASSERT_OK(dt_save(g, ck, 4, names, (const dt_tensor *const *)t, &o));

    /* Onto CPU meshes and back onto the GPU mesh, with other layouts. */
    CU_ASSERT_EQUAL(ck_restored_mismatches(c, ck, "w", "b,a", 1), 0);
    CU_ASSERT_EQUAL(ck_restored_mismatches(c, ck, "h", "a,unsharded", 2), 0);
    CU_ASSERT_EQUAL(ck_restored_mismatches(c, ck, "s", "", 3), 0);
    CU_ASSERT_EQUAL(ck_restored_mismatches(c, ck, "p", "unsharded", 4), 0);
    CU_ASSERT_EQUAL(ck_restored_mismatches(g, ck, "w", "unsharded,a", 1), 0);
    CU_ASSERT_EQUAL(ck_restored_mismatches(g, ck, "w", "a,b", 1), 0);
    CU_ASSERT_EQUAL(ck_restored_mismatches(g, ck, "h", "b,unsharded", 2), 0);
    CU_ASSERT_EQUAL(ck_restored_mismatches(g, ck, "s", "", 3), 0);
    CU_ASSERT_EQUAL(ck_restored_mismatches(g, ck, "p", "b", 4), 0);

    /* Into existing GPU tensors (replicated: one client's devices hold the same block). */
    dt_layout *rep = ck_layout(g, "unsharded,unsharded");
    dt_tensor *into = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(rep, DT_DTYPE_F32, sw, &into));
    DT_ASSERT_OK(dt_restore_into(ck, 1, (const char *const[]){"w"}, &into));
    CU_ASSERT_EQUAL(ck_mismatches(into, 1), 0);

    /* A CPU mesh's checkpoint restored onto the GPU mesh. */
    dt_layout *cl = ck_layout(c, "b,a");
    dt_tensor *ct = ck_make(cl, DT_DTYPE_F16, sw, 9);
    const char *cn = "cpu";
    DT_ASSERT_OK(dt_save(c, ck, 1, &cn, (const dt_tensor *const *)&ct, &o));
    CU_ASSERT_EQUAL(ck_restored_mismatches(g, ck, "cpu", "a,b", 9), 0);
    CU_ASSERT_EQUAL(ck_restored_mismatches(g, ck, "cpu", "unsharded,unsharded", 9), 0);

    /* Damaged data are caught on the way to the devices, naming the field. */
    damage_first_file(ck);
    dt_layout *rl = ck_layout(g, "unsharded,unsharded");
    dt_tensor *bad = NULL;
    CU_ASSERT_EQUAL(dt_restore(g, ck, 1, &cn, (const dt_layout *const *)&rl, &bad),
                    DT_ERR_CORRUPT);
    CU_ASSERT(strstr(dt_last_error(), "chunk_crc32c") != NULL);
    CU_ASSERT(bad == NULL);
    dt_layout_destroy(rl);

    dt_tensor_destroy(ct);
    dt_layout_destroy(cl);
    dt_tensor_destroy(into);
    dt_layout_destroy(rep);
    for (int i = 0; i < 4; i++)
        dt_tensor_destroy(t[i]);
    dt_layout_destroy(lw);
    dt_layout_destroy(lh);
    dt_layout_destroy(ls);
    dt_layout_destroy(lp);
    dt_mesh_destroy(c);
    dt_mesh_destroy(g);
    dt_test_scratch_remove(dir);
}

/* Bytes of component i of t, read through the device layer. */
static unsigned char *component_bytes(const dt_tensor *t, int i, size_t *n_out)
{
    const DLTensor *x = dt_tensor_local(t, i);
    size_t n = dt_dtype_size(dt_tensor_dtype(t));
    for (int d = 0; d < x->ndim; d++)
        n *= (size_t)x->shape[d];
    unsigned char *b = malloc(n + 1);
    CU_ASSERT_FATAL(b != NULL);
    DT_ASSERT_OK(dt_tensor_local_read(t, i, b, n));
    *n_out = n;
    return b;
}

static void test_casts_on_save_and_restore_run_on_the_devices_as_on_a_cpu_mesh(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    dt_mesh *g = gpu_mesh(), *c = cpu_mesh();
    int64_t shape[2] = {4 * gpu_count() + 3, 33};
    dt_layout *gl = ck_layout(g, "a,unsharded"), *cl = ck_layout(c, "a,unsharded");
    dt_tensor *w = ck_make(gl, DT_DTYPE_F32, shape, 11);
    const char *name = "w";
    dt_dtype as = DT_DTYPE_BF16;
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    o.fsync = 0;
    o.save_dtypes = &as;
    DT_ASSERT_OK(dt_save(g, ck, 1, &name, (const dt_tensor *const *)&w, &o));
    /* Restored into an f32 GPU tensor: f32 -> bf16 -> f32, as the same casts on a CPU mesh. */
    dt_tensor *into = NULL, *ref = ck_make(cl, DT_DTYPE_F32, shape, 11), *r16 = NULL,
              *r32 = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(gl, DT_DTYPE_F32, shape, &into));
    DT_ASSERT_OK(dt_restore_into(ck, 1, &name, &into));
    DT_ASSERT_OK(dt_cast(ref, DT_DTYPE_BF16, &r16));
    DT_ASSERT_OK(dt_cast(r16, DT_DTYPE_F32, &r32));
    CU_ASSERT_EQUAL(dt_tensor_num_local(into), dt_tensor_num_local(r32));
    int same = 1;
    for (int i = 0; i < dt_tensor_num_local(into) && i < dt_tensor_num_local(r32); i++) {
        size_t na, nb;
        unsigned char *a = component_bytes(into, i, &na), *b = component_bytes(r32, i, &nb);
        same &= na == nb && memcmp(a, b, na) == 0;
        free(a);
        free(b);
    }
    CU_ASSERT(same);
    dt_tensor_destroy(r32);
    dt_tensor_destroy(r16);
    dt_tensor_destroy(ref);
    dt_tensor_destroy(into);
    dt_tensor_destroy(w);
    dt_layout_destroy(gl);
    dt_layout_destroy(cl);
    dt_mesh_destroy(c);
    dt_mesh_destroy(g);
    dt_test_scratch_remove(dir);
}

/* Overwrites every local component of t through the device layer. */
static void scribble(dt_tensor *t)
{
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        size_t n;
        unsigned char *b = component_bytes(t, i, &n);
        memset(b, 0xA5, n);
        DT_ASSERT_OK(dt_tensor_local_write(t, i, b, n));
        free(b);
    }
}

static void test_async_save_of_gpu_tensors_holds_the_values_of_the_call(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    dt_mesh *g = gpu_mesh(), *c = cpu_mesh();
    int64_t shape[2] = {64 * gpu_count(), 512};
    dt_layout *l = ck_layout(g, "a,b");
    dt_tensor *w = ck_make(l, DT_DTYPE_F32, shape, 21);
    const char *name = "w";
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    o.fsync = 0;
    o.staging_bytes = 64 << 10;   /* below this client's bytes: the call waits for the writer */
    dt_save_request *req = NULL;
    DT_ASSERT_OK(dt_save_async(g, ck, 1, &name, (const dt_tensor *const *)&w, &o, &req));
    scribble(w);
    DT_ASSERT_OK(dt_save_wait(req));
    CU_ASSERT_EQUAL(ck_restored_mismatches(c, ck, "w", "unsharded,a", 21), 0);
    CU_ASSERT_EQUAL(ck_restored_mismatches(g, ck, "w", "b,unsharded", 21), 0);
    dt_tensor_destroy(w);
    dt_layout_destroy(l);
    dt_mesh_destroy(c);
    dt_mesh_destroy(g);
    dt_test_scratch_remove(dir);
}

/* ---- peak host memory ---- */

/* Resets the peak to the current resident set (Linux >= 4.0); returns it, or -1. Free heap
 * pages go back to the system first, so that what the call allocates shows as growth. */
static int64_t reset_peak(void)
{
    dt_host_pool_trim();
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
    return peak_rss_reset();
}

enum { BOUND = 1 << 20, SLACK = 3 << 20 };

static void test_gpu_save_and_restore_hold_host_memory_to_the_staging_bound(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    dt_mesh *g = gpu_mesh();
    int64_t G = gpu_count();
    /* 8 MiB of f32 per client, sharded: 8 times the bound. */
    int64_t shape[2] = {128 * G, 4096};
    dt_layout *l = ck_layout(g, "a,b");
    dt_tensor *w = ck_make(l, DT_DTYPE_F32, shape, 31), *into = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_F32, shape, &into)); /* its pages exist already */
    int64_t local = 0;
    for (int i = 0; i < dt_tensor_num_local(w); i++)
        local += dt_tensor_local(w, i)->shape[0] * dt_tensor_local(w, i)->shape[1] * 4;
    CU_ASSERT(local >= 8 * BOUND);
    const char *name = "w";
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    o.fsync = 0;
    o.staging_bytes = BOUND;
    o.chunk_bytes = 256 << 10;    /* restore buffers (BOUND / 2) hold whole chunks */
    CU_ASSERT_EQUAL(setenv("DT_CKPT_STAGING_MB", "1", 1), 0);

    int64_t base = reset_peak();
    CU_ASSERT_FATAL(base > 0);    /* /proc/self/clear_refs must reset VmHWM */
    DT_ASSERT_OK(dt_save(g, ck, 1, &name, (const dt_tensor *const *)&w, &o));
    int64_t grew = peak_rss_bytes() - base;
    CU_ASSERT(grew < BOUND + SLACK);
    if (grew >= BOUND + SLACK)
        fprintf(stderr, "save: peak resident memory grew by %lld bytes (%lld local bytes)\n",
                (long long)grew, (long long)local);

    base = reset_peak();
    DT_ASSERT_OK(dt_restore_into(ck, 1, &name, &into));
    grew = peak_rss_bytes() - base;
    CU_ASSERT(grew < BOUND + SLACK);
    if (grew >= BOUND + SLACK)
        fprintf(stderr, "restore: peak resident memory grew by %lld bytes (%lld local bytes)\n",
                (long long)grew, (long long)local);
    CU_ASSERT_EQUAL(ck_mismatches(into, 31), 0);

    /* A bad bound is refused, naming the variable; the target is untouched. */
    CU_ASSERT_EQUAL(setenv("DT_CKPT_STAGING_MB", "lots", 1), 0);
    CU_ASSERT_EQUAL(dt_restore_into(ck, 1, &name, &into), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT(strstr(dt_last_error(), "DT_CKPT_STAGING_MB") != NULL);
    CU_ASSERT_EQUAL(unsetenv("DT_CKPT_STAGING_MB"), 0);
    CU_ASSERT_EQUAL(ck_mismatches(into, 31), 0);

    dt_tensor_destroy(into);
    dt_tensor_destroy(w);
    dt_layout_destroy(l);
    dt_mesh_destroy(g);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_gpu_tensors_round_trip_through_cpu_and_gpu_meshes),
        DT_TEST(test_casts_on_save_and_restore_run_on_the_devices_as_on_a_cpu_mesh),
        DT_TEST(test_async_save_of_gpu_tensors_holds_the_values_of_the_call),
        DT_TEST(test_gpu_save_and_restore_hold_host_memory_to_the_staging_bound),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ckpt_gpu", cases, 1);
}
