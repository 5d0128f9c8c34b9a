/* Helper of the checkpoint tests in tests/ckpt_py: `save` writes tensors whose every element is
 * a formula of (tensor id, global flat index, version) that the Python tests recompute on their
 * own; `check` restores a checkpoint onto other layouts and says which version it holds. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/ckpt.h"
#include "dtensor/dtensor.h"

/* The saved tensors; tests/ckpt_py/test_ckpt_files.py holds the same table. "big" (f32,
 * 1-D, sharded on x) is added when --big-mib is given. */
typedef struct spec {
    const char *name;
    dt_dtype dtype;
    int rank;
    int64_t shape[2];
    const char *specs[2];
} spec;

static const spec SPECS[] = {
    {"layer.0/w", DT_DTYPE_F32, 2, {13, 7}, {"x", "y"}},
    {"emb", DT_DTYPE_BF16, 2, {11, 6}, {"x", DT_UNSHARDED}},
    {"table", DT_DTYPE_I64, 2, {5, 3}, {DT_UNSHARDED, DT_UNSHARDED}},
    {"bias", DT_DTYPE_F64, 1, {9, 0}, {"y", NULL}},
    {"scalar", DT_DTYPE_F32, 0, {0, 0}, {NULL, NULL}},
    {"../../escape/me", DT_DTYPE_I32, 2, {4, 2}, {"y", "x"}},
    {"half", DT_DTYPE_F16, 2, {6, 5}, {DT_UNSHARDED, "x"}},
    {"bytes", DT_DTYPE_U8, 1, {37, 0}, {"x", NULL}},
    {"empty", DT_DTYPE_F32, 2, {0, 3}, {"x", DT_UNSHARDED}},
};
enum { NSPECS = sizeof SPECS / sizeof SPECS[0], MAXT = NSPECS + 1 };

static int g_rank;

static uint16_t half_bits(int64_t k) /* |k| < 2048: exact */
{
    if (k == 0)
        return 0;
    uint16_t sign = k < 0 ? 0x8000 : 0;
    int64_t m = llabs(k);
    int e = 0;
    while ((m >> (e + 1)) != 0)
        e++;
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((m << (10 - e)) & 0x3FF));
}

/* Element `i` (global row-major index) of tensor `tid` in version `v`, into out. */
static void element(int tid, dt_dtype dt, int64_t i, int64_t v, void *out)
{
    switch (dt) {
    case DT_DTYPE_F32: {
        float f = (float)((double)((i * 3 + tid * 101 + v * 7919) % 65521 - 30000) * 0.25);
        memcpy(out, &f, 4);
        break;
    }
    case DT_DTYPE_F64: {
        double d = (double)((i * 3 + tid * 101 + v * 7919) % 65521 - 30000) * 0.25;
        memcpy(out, &d, 8);
        break;
    }
    case DT_DTYPE_BF16: {
        float f = (float)((i + tid * 31 + v * 17) % 251 - 125);
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t b = (uint16_t)(u >> 16);
        memcpy(out, &b, 2);
        break;
    }
    case DT_DTYPE_F16: {
        uint16_t h = half_bits((i * 5 + tid * 31 + v * 17) % 2039 - 1000);
        memcpy(out, &h, 2);
        break;
    }
    case DT_DTYPE_I64: {
        int64_t x =
            i * 1000003 + tid * ((int64_t)1 << 40) + v * ((int64_t)1 << 50) - ((int64_t)1 << 55);
        memcpy(out, &x, 8);
        break;
    }
    case DT_DTYPE_I32: {
        int32_t x = (int32_t)(i * 7 + tid * 1000 + v * 100000 - 5000000);
        memcpy(out, &x, 4);
        break;
    }
    case DT_DTYPE_U8: {
        uint8_t x = (uint8_t)((i * 7 + tid * 13 + v * 17) % 256);
        memcpy(out, &x, 1);
        break;
    }
    default:
        break;
    }
}

/* Visits every element of local component c: fill (check == 0) or count mismatches. */
static int64_t walk(const dt_tensor *t, int c, int tid, int64_t v, int check)
{
    const DLTensor *loc = dt_tensor_local(t, c);
    const int64_t *off = dt_tensor_local_offset(t, c);
    const int64_t *gshape = dt_tensor_shape(t);
    int rank = dt_tensor_rank(t);
    dt_dtype dt = dt_tensor_dtype(t);
    size_t es = dt_dtype_size(dt);
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= loc->shape[d];
    int64_t bad = 0;
    unsigned char want[8];
    for (int64_t j = 0; j < n; j++) {
        int64_t rem = j, g = 0, stride = 1;
        for (int d = rank - 1; d >= 0; d--) {
            int64_t idx = rem % loc->shape[d];
            rem /= loc->shape[d];
            g += (off[d] + idx) * stride;
            stride *= gshape[d];
        }
        unsigned char *p = (unsigned char *)loc->data + (size_t)j * es;
        element(tid, dt, g, v, want);
        if (!check)
            memcpy(p, want, es);
        else if (memcmp(p, want, es) != 0)
            bad++;
    }
    return bad;
}

typedef struct tensor_set {
    int n;
    const char *names[MAXT];
    dt_dtype dtypes[MAXT];
    dt_layout *layouts[MAXT];
    int64_t shapes[MAXT][2];
} tensor_set;

/* The tensors on `mesh`; `restore_layouts`: a 1-D mesh "z" for check, dim 0 sharded on z. */
static dt_status make_set(const dt_mesh *mesh, int big_mib, int restore_layouts, tensor_set *s)
{
    memset(s, 0, sizeof *s);
    for (int k = 0; k < NSPECS + (big_mib > 0); k++) {
        spec sp = k < NSPECS
                      ? SPECS[k]
                      : (spec){"big", DT_DTYPE_F32, 1, {(int64_t)big_mib << 18, 0}, {"x", NULL}};
        const char *specs[2] = {sp.specs[0], sp.specs[1]};
        if (restore_layouts)
            for (int d = 0; d < sp.rank; d++)
                specs[d] = d == 0 ? "z" : DT_UNSHARDED;
        s->names[k] = sp.name;
        s->dtypes[k] = sp.dtype;
        memcpy(s->shapes[k], sp.shape, sizeof sp.shape);
        dt_status st = dt_layout_create(mesh, sp.rank, specs, &s->layouts[k]);
        if (st != DT_OK)
            return st;
        s->n = k + 1;
    }
    return DT_OK;
}

static void free_set(tensor_set *s)
{
    for (int k = 0; k < s->n; k++)
        dt_layout_destroy(s->layouts[k]);
}

static int fail(const char *what, dt_status st)
{
    printf("status=%s\n", dt_status_name(st));
    fprintf(stderr, "make_ckpt[%d]: %s: %s: %s\n", g_rank, what, dt_status_name(st),
            dt_last_error());
    fflush(stdout);
    return 1;
}

static int do_save(const char *dir, int64_t version, int big_mib, int announce)
{
    int ndev = dt_num_global_devices(DT_DEVICE_CPU);
    const char *dims[2] = {"x", "y"};
    int64_t sizes[2] = {ndev, 1};
    if (ndev >= 4 && ndev % 2 == 0) {
        sizes[0] = 2;
        sizes[1] = ndev / 2;
    }
    dt_mesh *mesh = NULL;
    dt_status st = dt_mesh_create(NULL, 2, dims, sizes, DT_DEVICE_CPU, &mesh);
    if (st != DT_OK)
        return fail("mesh", st);
    tensor_set s;
    dt_tensor *t[MAXT] = {0};
    int rc = 1;
    st = make_set(mesh, big_mib, 0, &s);
    if (st != DT_OK) {
        rc = fail("layout", st);
        goto out;
    }
    for (int k = 0; k < s.n; k++) {
        st = dt_tensor_zeros(s.layouts[k], s.dtypes[k], s.shapes[k], &t[k]);
        if (st != DT_OK) {
            rc = fail("tensor", st);
            goto out;
        }
        for (int c = 0; c < dt_tensor_num_local(t[k]); c++)
            walk(t[k], c, k, version, 0);
    }
    unsigned char rng[16];
    for (int i = 0; i < 16; i++)
        rng[i] = (unsigned char)((version * 7 + i) & 255);
    dt_ckpt_value vals[3] = {
        {.name = "step", .type = DT_CKPT_VALUE_I64, .i64 = version},
        {.name = "lr", .type = DT_CKPT_VALUE_F64, .f64 = 0.001 * (double)version},
        {.name = "rng", .type = DT_CKPT_VALUE_BYTES, .bytes = rng, .nbytes = sizeof rng},
    };
    dt_save_opts opts = DT_SAVE_OPTS_INIT;
    opts.values = vals;
    opts.nvalues = 3;
    MPI_Barrier(MPI_COMM_WORLD);
    if (announce && g_rank == 0) {
        printf("saving\n");
        fflush(stdout);
    }
    double t0 = MPI_Wtime();
    st = dt_save(mesh, dir, s.n, s.names, (const dt_tensor *const *)t, &opts);
    double secs = MPI_Wtime() - t0;
    if (st != DT_OK) {
        rc = fail("dt_save", st);
        goto out;
    }
    if (g_rank == 0) {
        printf("saved secs=%.4f\n", secs);
        fflush(stdout);
    }
    rc = 0;
out:
    for (int k = 0; k < MAXT; k++)
        dt_tensor_destroy(t[k]);
    free_set(&s);
    dt_mesh_destroy(mesh);
    return rc;
}

/* Restores `dir` onto a 1-D mesh of every device with other layouts and prints one line
 * "result DIR version=V" when every element of every tensor and every value is version V's
 * (V read from the value "step"), "result DIR mix version=V" when not, "result DIR error=S"
 * when the restore fails. Returns 0 only in the first case. */
static int check_one(const dt_mesh *mesh, const char *dir, int big_mib)
{
    dt_ckpt *ck = NULL;
    int64_t version = -1;
    double lr = 0;
    const void *rng = NULL;
    size_t nrng = 0;
    int values_ok = 0;
    dt_status st = dt_ckpt_open(dir, &ck);
    if (st == DT_OK)
        st = dt_ckpt_value_i64(ck, "step", &version);
    if (st == DT_OK)
        st = dt_ckpt_value_f64(ck, "lr", &lr);
    if (st == DT_OK)
        st = dt_ckpt_value_bytes(ck, "rng", &rng, &nrng);
    if (st == DT_OK) {
        values_ok = lr == 0.001 * (double)version && nrng == 16;
        for (size_t i = 0; values_ok && i < nrng; i++)
            values_ok = ((const unsigned char *)rng)[i] == (unsigned char)((version * 7 + i) & 255);
    }
    dt_ckpt_close(ck);

    tensor_set s;
    dt_tensor *t[MAXT] = {0};
    int rc = 1;
    if (st == DT_OK)
        st = make_set(mesh, big_mib, 1, &s);
    else
        s.n = 0;
    if (st == DT_OK)
        st = dt_restore(mesh, dir, s.n, s.names, (const dt_layout *const *)s.layouts, t);
    if (st != DT_OK) {
        if (g_rank == 0)
            printf("result %s error=%s\n", dir, dt_status_name(st));
        fprintf(stderr, "make_ckpt[%d]: %s: %s: %s\n", g_rank, dir, dt_status_name(st),
                dt_last_error());
        goto out;
    }
    long long bad[MAXT] = {0}, all[MAXT];
    for (int k = 0; k < s.n; k++) {
        int shape_ok = dt_tensor_dtype(t[k]) == s.dtypes[k] &&
                       dt_tensor_rank(t[k]) == (k < NSPECS ? SPECS[k].rank : 1);
        for (int d = 0; shape_ok && d < dt_tensor_rank(t[k]); d++)
            shape_ok = dt_tensor_shape(t[k])[d] == s.shapes[k][d];
        bad[k] = shape_ok ? 0 : 1;
        for (int c = 0; shape_ok && c < dt_tensor_num_local(t[k]); c++)
            bad[k] += walk(t[k], c, k, version, 1);
    }
    MPI_Allreduce(bad, all, s.n, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    long long total = 0;
    for (int k = 0; k < s.n; k++) {
        total += all[k];
        if (all[k] && g_rank == 0)
            printf("mismatch %s tensor=%s elements=%lld version=%lld\n", dir, s.names[k], all[k],
                   (long long)version);
    }
    if (!values_ok && g_rank == 0)
        printf("mismatch %s values version=%lld\n", dir, (long long)version);
    rc = total || !values_ok;
    if (g_rank == 0)
        printf("result %s %sversion=%lld\n", dir, rc ? "mix " : "", (long long)version);
out:
    fflush(stdout);
    for (int k = 0; k < MAXT; k++)
        dt_tensor_destroy(t[k]);
    free_set(&s);
    return rc;
}

static int do_check(int ndirs, char **dirs, int big_mib)
{
    int ndev = dt_num_global_devices(DT_DEVICE_CPU);
    const char *dims[1] = {"z"};
    int64_t sizes[1] = {ndev};
    dt_mesh *mesh = NULL;
    dt_status st = dt_mesh_create(NULL, 1, dims, sizes, DT_DEVICE_CPU, &mesh);
    if (st != DT_OK)
        return fail("mesh", st);
    int rc = 0;
    for (int i = 0; i < ndirs; i++)
        rc |= check_one(mesh, dirs[i], big_mib);
    dt_mesh_destroy(mesh);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: make_ckpt save DIR VERSION [--big-mib M] [--announce]\n"
                        "       make_ckpt check [--big-mib M] DIR...\n");
        return 2;
    }
    int big_mib = 0, announce = 0, ndirs = 0;
    char *dirs[256];
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--big-mib") == 0 && i + 1 < argc)
            big_mib = atoi(argv[++i]);
        else if (strcmp(argv[i], "--announce") == 0)
            announce = 1;
        else if (ndirs < 256)
            dirs[ndirs++] = argv[i];
    }
    dt_init_opts io = DT_INIT_OPTS_INIT;
    io.bind_cores = 0;
    dt_status st = dt_init(&argc, &argv, &io);
    if (st != DT_OK)
        return fail("dt_init", st);
    g_rank = dt_client_id();
    int rc;
    if (strcmp(argv[1], "save") == 0 && ndirs == 2)
        rc = do_save(dirs[0], atoll(dirs[1]), big_mib, announce);
    else if (strcmp(argv[1], "check") == 0)
        rc = do_check(ndirs, dirs, big_mib);
    else
        rc = 2;
    dt_finalize();
    return rc;
}
