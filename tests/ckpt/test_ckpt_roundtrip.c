/* Save on the mesh of all devices with several layouts (sharded on one and two dims, uneven,
 * replicated, scalars, empty, partial), restore on 1, 2, 3 and all devices with other
 * layouts, and compare with the single-device reference bit for bit; named values, names
 * that look like paths, overwriting, dt_sharded_prefix ownership, saving as another dtype. */
#include <dirent.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ck_test_util.h"
#include "ckpt/ckpt_impl.h" /* dt__ckpt_reap_wait */
#include "harness.h"

typedef struct spec {
    const char *name;
    dt_dtype dtype;
    int rank;
    int64_t shape[3];
    const char *save_specs;    /* on the 2-D save mesh (a, b) */
} spec;

static const spec specs[] = {
    {"layer.0/w", DT_DTYPE_F32, 2, {7, 5}, "a,b"},
    {"../emb", DT_DTYPE_BF16, 2, {10, 3}, "b,unsharded"},
    {"step_like", DT_DTYPE_I64, 0, {0}, ""},
    {"bias", DT_DTYPE_F32, 1, {9}, "unsharded"},
    {"m3", DT_DTYPE_I64, 3, {3, 4, 5}, "unsharded,a,b"},
    {"empty", DT_DTYPE_F32, 2, {0, 4}, "a,unsharded"},
    {"tiny", DT_DTYPE_U8, 1, {2}, "b"},
    {"cols", DT_DTYPE_F64, 2, {3, 11}, "unsharded,b"},
};
enum { NT = sizeof specs / sizeof specs[0] };

static dt_mesh *save_mesh(void)
{
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    int64_t sizes[2] = {2, n / 2};
    return ck_mesh(2, sizes);
}

static void save_all(const char *dir, const dt_save_opts *opts)
{
    dt_mesh *m = save_mesh();
    dt_tensor *t[NT];
    const char *names[NT];
    for (int i = 0; i < NT; i++) {
        dt_layout *l = ck_layout(m, specs[i].save_specs);
        t[i] = ck_make(l, specs[i].dtype, specs[i].shape, (uint64_t)i + 1);
        names[i] = specs[i].name;
        dt_layout_destroy(l);
    }
    DT_ASSERT_OK(dt_save(m, dir, NT, names, (const dt_tensor *const *)t, opts));
    for (int i = 0; i < NT; i++)
        dt_tensor_destroy(t[i]);
    dt_mesh_destroy(m);
}

/* Target specs on a mesh with dims a (and b): shard dim 0 on a, dim 1 on b when present. */
static void target_specs(int rank, int ndims, int variant, char *buf, size_t len)
{
    buf[0] = '\0';
    for (int d = 0; d < rank; d++) {
        const char *s = "unsharded";
        if (variant == 0 && d == 0)
            s = "a";
        if (variant == 0 && d == 1 && ndims > 1)
            s = "b";
        if (variant == 1 && d == rank - 1)
            s = "a";
        if (variant == 1 && d == 0 && rank > 1 && ndims > 1)
            s = "b";
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", d ? "," : "", s);
    }
}

static void restore_and_check(const char *dir, int ndims, const int64_t *sizes)
{
    int64_t size = 1;
    for (int d = 0; d < ndims; d++)
        size *= sizes[d];
    if (size > dt_num_global_devices(DT_DEVICE_CPU))
        return;
    dt_mesh *m = ck_mesh(ndims, sizes);
    for (int variant = 0; variant < 3; variant++) {
        dt_layout *l[NT];
        dt_tensor *out[NT];
        const char *names[NT];
        char buf[128];
        for (int i = 0; i < NT; i++) {
            target_specs(specs[i].rank, ndims, variant, buf, sizeof buf);
            l[i] = ck_layout(m, buf);
            names[i] = specs[i].name;
        }
        DT_ASSERT_OK(dt_restore(m, dir, NT, names, (const dt_layout *const *)l, out));
        for (int i = 0; i < NT; i++) {
            int64_t bad = ck_mismatches(out[i], (uint64_t)i + 1);
            if (bad)
                fprintf(stderr, "[rank %d] mesh of %lld, variant %d, tensor '%s': %lld wrong\n",
                        dt_client_id(), (long long)size, variant, names[i], (long long)bad);
            CU_ASSERT_EQUAL(bad, 0);
            CU_ASSERT_EQUAL(dt_tensor_dtype(out[i]), specs[i].dtype);
            CU_ASSERT_EQUAL(dt_tensor_rank(out[i]), specs[i].rank);
            for (int d = 0; d < specs[i].rank; d++)
                CU_ASSERT_EQUAL(dt_tensor_shape(out[i])[d], specs[i].shape[d]);
            dt_tensor_destroy(out[i]);
            dt_layout_destroy(l[i]);
        }
    }
    dt_mesh_destroy(m);
}

static void test_restore_on_1_2_3_and_all_devices_matches_reference(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    save_all(ck, NULL);
    int64_t one[1] = {1}, two[1] = {2}, three[1] = {3}, two_by[2] = {2, 1};
    restore_and_check(ck, 1, one);
    restore_and_check(ck, 1, two);
    restore_and_check(ck, 1, three);
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    int64_t all1[1] = {n}, all2[2] = {n / 2, 2};
    restore_and_check(ck, 1, all1);
    restore_and_check(ck, 2, all2);
    restore_and_check(ck, 2, two_by);
    dt_test_scratch_remove(dir);
}

static void test_small_chunks_and_no_fsync_round_trip(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    /* 4 KiB chunks over a slice of 40 KB: reads cross chunk boundaries mid-row. */
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    o.chunk_bytes = 4096;
    o.fsync = 0;
    dt_mesh *m = save_mesh();
    dt_layout *l = ck_layout(m, "a,b");
    int64_t shape[2] = {101, 203};
    dt_tensor *t = ck_make(l, DT_DTYPE_F32, shape, 77);
    const char *name = "big";
    DT_ASSERT_OK(dt_save(m, ck, 1, &name, (const dt_tensor *const *)&t, &o));
    int64_t three[1] = {3};
    dt_mesh *m3 = ck_mesh(1, three);
    const char *sp[] = {"unsharded,a", "a,unsharded", "unsharded,unsharded"};
    for (int v = 0; v < 3; v++)
        CU_ASSERT_EQUAL(ck_restored_mismatches(m3, ck, name, sp[v], 77), 0);
    dt_mesh_destroy(m3);
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(dir);
}

static void test_partial_tensor_is_saved_reduced(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    dt_mesh *m = save_mesh();
    const char *sp[1] = {"b"}, *pd[1] = {"a"};
    dt_reduce_op op[1] = {DT_REDUCE_SUM};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(m, 1, sp, 1, pd, op, &l));
    int64_t shape[1] = {13};
    dt_tensor *t = ck_make(l, DT_DTYPE_I64, shape, 5);
    const char *name = "grad";
    DT_ASSERT_OK(dt_save(m, ck, 1, &name, (const dt_tensor *const *)&t, NULL));
    CU_ASSERT_EQUAL(ck_restored_mismatches(m, ck, name, "unsharded", 5), 0);
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(dir);
}

static void test_restore_into_existing_tensors_and_shape_mismatch(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    save_all(ck, NULL);
    int64_t two[1] = {2};
    dt_mesh *m = ck_mesh(1, two);
    dt_layout *l = ck_layout(m, "unsharded,a");
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_F32, specs[0].shape, &t));
    const char *name = specs[0].name;
    DT_ASSERT_OK(dt_restore_into(ck, 1, &name, &t));
    CU_ASSERT_EQUAL(ck_mismatches(t, 1), 0);
    dt_tensor_destroy(t);
    int64_t wrong[2] = {7, 6};
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_F32, wrong, &t));
    DT_ASSERT_FAILS(dt_restore_into(ck, 1, &name, &t), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("layer.0/w");
    dt_tensor_destroy(t);
    /* f32 saved: an integer target is no cast (a float one is, see the bf16 test). */
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_I64, specs[0].shape, &t));
    DT_ASSERT_FAILS(dt_restore_into(ck, 1, &name, &t), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("i64");
    dt_tensor_destroy(t);
    const char *missing = "nope";
    dt_tensor *out = NULL;
    DT_ASSERT_FAILS(dt_restore(m, ck, 1, &missing, (const dt_layout *const *)&l, &out),
                    DT_ERR_NOT_FOUND);
    DT_ASSERT_ERROR_MENTIONS("nope");
    CU_ASSERT_PTR_NULL(out);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(dir);
}

static void test_named_values_round_trip(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    unsigned char rng[37];
    for (int i = 0; i < 37; i++)
        rng[i] = (unsigned char)(i * 41 + 3);
    dt_ckpt_value v[4] = {
        {.name = "step", .type = DT_CKPT_VALUE_I64, .i64 = -9007199254740993LL},
        {.name = "loss_scale", .type = DT_CKPT_VALUE_F64, .f64 = 0.1},
        {.name = "rng/state", .type = DT_CKPT_VALUE_BYTES, .bytes = rng, .nbytes = 37},
        {.name = "nan", .type = DT_CKPT_VALUE_F64, .f64 = -__builtin_nan("")},
    };
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    o.values = v;
    o.nvalues = 4;
    save_all(ck, &o);
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    int64_t i64 = 0;
    double f = 0;
    const void *b = NULL;
    size_t nb = 0;
    DT_ASSERT_OK(dt_ckpt_value_i64(c, "step", &i64));
    CU_ASSERT_EQUAL(i64, -9007199254740993LL);
    DT_ASSERT_OK(dt_ckpt_value_f64(c, "loss_scale", &f));
    CU_ASSERT_EQUAL(memcmp(&f, &v[1].f64, 8), 0);
    DT_ASSERT_OK(dt_ckpt_value_f64(c, "nan", &f));
    CU_ASSERT_EQUAL(memcmp(&f, &v[3].f64, 8), 0);
    DT_ASSERT_OK(dt_ckpt_value_bytes(c, "rng/state", &b, &nb));
    CU_ASSERT_EQUAL(nb, 37);
    CU_ASSERT(b && memcmp(b, rng, 37) == 0);
    DT_ASSERT_FAILS(dt_ckpt_value_i64(c, "loss_scale", &i64), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_ckpt_value_i64(c, "absent", &i64), DT_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(dt_ckpt_num_values(c), 4);
    dt_ckpt_close(c);
    dt_test_scratch_remove(dir);
}

/* Names are keys: path-like names create no file outside (or inside) the directory. */
static void test_path_like_names_stay_keys(void)
{
    char dir[256], ck[300], p[400];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/sub/ckpt", dir);
    if (dt_client_id() == 0) {
        snprintf(p, sizeof p, "%s/sub", dir);
        mkdir(p, 0755);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    save_all(ck, NULL);
    struct stat sb;
    snprintf(p, sizeof p, "%s/emb", dir);          /* where "../emb" would land */
    CU_ASSERT_NOT_EQUAL(stat(p, &sb), 0);
    snprintf(p, sizeof p, "%s/sub/emb", dir);
    CU_ASSERT_NOT_EQUAL(stat(p, &sb), 0);
    snprintf(p, sizeof p, "%s/layer.0", ck);
    CU_ASSERT_NOT_EQUAL(stat(p, &sb), 0);
    /* Bad names are rejected before anything is written. */
    dt_mesh *m = save_mesh();
    dt_layout *l = ck_layout(m, "unsharded");
    int64_t shape[1] = {3};
    dt_tensor *t = ck_make(l, DT_DTYPE_F32, shape, 3);
    const char *bad[] = {"", "__metadata__", "a\nb", "tab\there", "\xff\xfe"};
    for (int i = 0; i < 5; i++) {
        const char *nm = bad[i];
        DT_ASSERT_FAILS(dt_save(m, ck, 1, &nm, (const dt_tensor *const *)&t, NULL),
                        DT_ERR_INVALID_ARGUMENT);
    }
    const char *twice[2] = {"x", "x"};
    const dt_tensor *tt[2] = {t, t};
    DT_ASSERT_FAILS(dt_save(m, ck, 2, twice, tt, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("repeated");
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    restore_and_check(ck, 1, (int64_t[1]){2});
    dt_test_scratch_remove(dir);
}

/* Descriptors of this process that point at deleted files below `dir`. */
static int deleted_files_open(const char *dir)
{
    DIR *d = opendir("/proc/self/fd");
    CU_ASSERT_FATAL(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char link[300], target[1024];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len <= 0)
            continue;
        target[len] = '\0';
        if (strncmp(target, dir, strlen(dir)) == 0 && strstr(target, " (deleted)"))
            n++;
    }
    closedir(d);
    return n;
}

static void test_overwrite_replaces_the_checkpoint(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    dt_mesh *m = save_mesh();
    dt_layout *l = ck_layout(m, "a");
    int64_t shape[1] = {21};
    const char *name = "v";
    for (uint64_t seed = 10; seed < 13; seed++) {
        dt_tensor *t = ck_make(l, DT_DTYPE_I32, shape, seed);
        DT_ASSERT_OK(dt_save(m, ck, 1, &name, (const dt_tensor *const *)&t, NULL));
        dt_tensor_destroy(t);
        dt_tensor *out = NULL;
        DT_ASSERT_OK(dt_restore(m, ck, 1, &name, (const dt_layout *const *)&l, &out));
        CU_ASSERT_EQUAL(ck_mismatches(out, seed), 0);
        dt_tensor_destroy(out);
    }
    /* No leftovers beside it. */
    struct stat sb;
    char p[400];
    snprintf(p, sizeof p, "%s.dtensor-tmp", ck);
    CU_ASSERT_NOT_EQUAL(stat(p, &sb), 0);
    snprintf(p, sizeof p, "%s.dtensor-old", ck);
    CU_ASSERT_NOT_EQUAL(stat(p, &sb), 0);
    /* The replaced files' blocks are freed in the background; once that is done this
     * process holds no descriptor of a deleted file under the scratch directory. */
    dt__ckpt_reap_wait();
    CU_ASSERT_EQUAL(deleted_files_open(dir), 0);
    /* A directory that is not a checkpoint is never overwritten. */
    char other[320];
    snprintf(other, sizeof other, "%s/other", dir);
    if (dt_client_id() == 0) {
        mkdir(other, 0755);
        snprintf(p, sizeof p, "%s/keep.txt", other);
        FILE *f = fopen(p, "w");
        fputs("x", f);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    dt_tensor *t = ck_make(l, DT_DTYPE_I32, shape, 1);
    DT_ASSERT_FAILS(dt_save(m, other, 1, &name, (const dt_tensor *const *)&t, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("not a checkpoint");
    snprintf(p, sizeof p, "%s/keep.txt", other);
    CU_ASSERT_EQUAL(stat(p, &sb), 0);
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(dir);
}

/* A crash between the two renames leaves only <dir>.dtensor-old: readers use it, and the
 * next save completes the replacement. */
static void test_interrupted_commit_falls_back_to_old(void)
{
    char dir[256], ck[300], old[340];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    snprintf(old, sizeof old, "%s.dtensor-old", ck);
    save_all(ck, NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    if (dt_client_id() == 0)
        CU_ASSERT_EQUAL(rename(ck, old), 0);
    MPI_Barrier(MPI_COMM_WORLD);
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_ckpt_path(c), ".dtensor-old"));
    dt_ckpt_close(c);
    restore_and_check(ck, 1, (int64_t[1]){2});
    save_all(ck, NULL);
    struct stat sb;
    CU_ASSERT_NOT_EQUAL(stat(old, &sb), 0);
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    CU_ASSERT_PTR_NULL(strstr(dt_ckpt_path(c), ".dtensor-old"));
    dt_ckpt_close(c);
    dt_test_scratch_remove(dir);
}

/* Every block has one owner among its holders, and replicas spread over devices. */
static void test_sharded_prefix_owners_are_unique_and_spread(void)
{
    dt_mesh *m = save_mesh();
    int64_t size = dt_mesh_size(m);
    enum { K = 16 };
    dt_tensor *t[K];
    const char *names[K];
    char nb[K][16];
    dt_layout *rep = ck_layout(m, "unsharded");
    int64_t shape[1] = {64};
    for (int i = 0; i < K; i++) {
        t[i] = ck_make(rep, DT_DTYPE_F32, shape, (uint64_t)i);
        snprintf(nb[i], sizeof nb[i], "r%d", i);
        names[i] = nb[i];
    }
    dt_ckpt_shard *sh = NULL;
    int count = 0;
    DT_ASSERT_OK(dt_sharded_prefix(m, "/x/ck/", K, names, (const dt_tensor *const *)t, &sh,
                                   &count));
    /* 16 replicated tensors of equal size over `size` devices: each device writes 16/size. */
    CU_ASSERT_EQUAL(count, size < K ? size : K);
    int64_t total = 0;
    for (int f = 0; f < count; f++) {
        char want[128];
        snprintf(want, sizeof want, "/x/ck/data-%05d-of-%05d.safetensors", f, count);
        CU_ASSERT_STRING_EQUAL(sh[f].path, want);
        CU_ASSERT_EQUAL(sh[f].num_slices, K / count);
        CU_ASSERT_EQUAL(sh[f].data_bytes, (uint64_t)(K / count) * 64 * 4);
        CU_ASSERT(f == 0 || sh[f].position > sh[f - 1].position);
        total += sh[f].num_slices;
    }
    CU_ASSERT_EQUAL(total, K);
    dt_ckpt_shards_free(sh, count);
    /* A fully sharded tensor: every device writes its own block. */
    dt_layout *l2 = ck_layout(m, "a,b");
    int64_t s2[2] = {4, 8};
    dt_tensor *x = ck_make(l2, DT_DTYPE_F32, s2, 1);
    const char *xn = "x";
    DT_ASSERT_OK(dt_sharded_prefix(m, "d", 1, &xn, (const dt_tensor *const *)&x, &sh, &count));
    CU_ASSERT_EQUAL(count, size);
    for (int f = 0; f < count; f++)
        CU_ASSERT_EQUAL(sh[f].position, f);
    dt_ckpt_shards_free(sh, count);
    dt_tensor_destroy(x);
    dt_layout_destroy(l2);
    for (int i = 0; i < K; i++)
        dt_tensor_destroy(t[i]);
    dt_layout_destroy(rep);
    dt_mesh_destroy(m);
}

/* Value of global element g of the cast test's tensor (finite, most not exact in bf16). */
static float cast_value(int64_t g)
{
    return (float)((double)g * 0.37 - 50.0);
}

/* bf16 of an f32, round to nearest even, by hand (finite values only). */
static float bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* Fills (fill != 0) a 2-D f32/f64 tensor with cast_value, or counts elements differing from
 * `want(cast_value)`. */
static int64_t cast_walk(dt_tensor *t, int fill, float (*want)(float))
{
    int64_t bad = 0, gcols = dt_tensor_shape(t)[1];
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *x = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        for (int64_t r = 0; r < x->shape[0]; r++)
            for (int64_t c = 0; c < x->shape[1]; c++) {
                int64_t k = r * x->shape[1] + c, g = (off[0] + r) * gcols + off[1] + c;
                float v = want ? want(cast_value(g)) : cast_value(g);
                if (fill)
                    ((float *)x->data)[k] = v;
                else if (dt_tensor_dtype(t) == DT_DTYPE_F64)
                    bad += ((double *)x->data)[k] != (double)v;
                else
                    bad += ((float *)x->data)[k] != v;
            }
    }
    return bad;
}

/* TensorFlow's should_cast: f32 saved as bf16 (the files hold BF16), restored into f32 and
 * f64 targets as the bf16 values; a non-float target or cast is refused. */
static void test_f32_saved_as_bf16_restores_into_f32(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    dt_mesh *m = save_mesh();
    dt_layout *l = ck_layout(m, "a,b"), *r = ck_layout(m, "b,unsharded");
    int64_t shape[2] = {9, 14};
    dt_tensor *w = NULL, *f32 = NULL, *f64 = NULL, *i32 = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_F32, shape, &w));
    cast_walk(w, 1, NULL);
    const char *name = "master";
    dt_dtype as = DT_DTYPE_BF16;
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    o.save_dtypes = &as;
    DT_ASSERT_OK(dt_save(m, ck, 1, &name, (const dt_tensor *const *)&w, &o));
    dt_ckpt *c = NULL;
    dt_ckpt_tensor_info ti;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    DT_ASSERT_OK(dt_ckpt_tensor(c, 0, &ti));
    CU_ASSERT_EQUAL(ti.dtype, DT_DTYPE_BF16);
    dt_ckpt_close(c);
    DT_ASSERT_OK(dt_tensor_zeros(r, DT_DTYPE_F32, shape, &f32));
    DT_ASSERT_OK(dt_tensor_zeros(r, DT_DTYPE_F64, shape, &f64));
    DT_ASSERT_OK(dt_tensor_zeros(r, DT_DTYPE_I32, shape, &i32));
    DT_ASSERT_OK(dt_restore_into(ck, 1, &name, &f32));
    CU_ASSERT_EQUAL(cast_walk(f32, 0, bf16_round), 0);
    DT_ASSERT_OK(dt_restore_into(ck, 1, &name, &f64));
    CU_ASSERT_EQUAL(cast_walk(f64, 0, bf16_round), 0);
    DT_ASSERT_FAILS(dt_restore_into(ck, 1, &name, &i32), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("bf16");
    dt_dtype bad = DT_DTYPE_I32;
    o.save_dtypes = &bad;
    DT_ASSERT_FAILS(dt_save(m, ck, 1, &name, (const dt_tensor *const *)&w, &o),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("master");
    dt_tensor_destroy(w);
    dt_tensor_destroy(f32);
    dt_tensor_destroy(f64);
    dt_tensor_destroy(i32);
    dt_layout_destroy(l);
    dt_layout_destroy(r);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_restore_on_1_2_3_and_all_devices_matches_reference),
        DT_TEST(test_small_chunks_and_no_fsync_round_trip),
        DT_TEST(test_partial_tensor_is_saved_reduced),
        DT_TEST(test_restore_into_existing_tensors_and_shape_mismatch),
        DT_TEST(test_named_values_round_trip),
        DT_TEST(test_path_like_names_stay_keys),
        DT_TEST(test_overwrite_replaces_the_checkpoint),
        DT_TEST(test_interrupted_commit_falls_back_to_old),
        DT_TEST(test_sharded_prefix_owners_are_unique_and_spread),
        DT_TEST(test_f32_saved_as_bf16_restores_into_f32),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ckpt_roundtrip", cases, 1);
}
