/* Helper of the checkpoint tests in tests/ckpt_py: `save` writes tensors whose every element is
 * a formula of (tensor id, global flat index, version) that the Python tests recompute on their
 * own; `check` restores a checkpoint onto other layouts and says which version it holds.
 * With --pieces, tensors given as explicitly placed pieces (dt_save_opts.pieces) are saved and
 * checked too. */
#include <math.h>
#include <mpi.h>
#include <signal.h>
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
enum { NSPECS = sizeof SPECS / sizeof SPECS[0] };

/* Tensors saved as pieces with --pieces (test_ckpt_files.py holds the same table); how each is
 * cut over the devices is in make_pieces. */
static const spec PSPECS[] = {
    {"zero/m", DT_DTYPE_F32, 1, {50, 0}, {NULL, NULL}},
    {"zero/v", DT_DTYPE_BF16, 2, {7, 5}, {NULL, NULL}},
    {"zero/c", DT_DTYPE_I64, 2, {4, 3}, {NULL, NULL}},
};
enum { NPSPECS = sizeof PSPECS / sizeof PSPECS[0], PIECE_TID = 20,
       MAXT = NSPECS + 1 + NPSPECS, MAXP = 64 };

static int g_rank;
/* save --async: dt_save_async, then dt_save_wait ("staged secs=" when the call returned);
 * save --step: DIR is a manager root, VERSION the step (keep the last 2). */
static int g_async, g_step;
/* save --lose-first: client 1 kills itself just before the save, so the save's first use of
 * the mesh's group (its creation) finds it gone. */
static int g_lose_first;
/* A save or restore ended with DT_ERR_TIMEOUT (a lost client): MPI_Finalize could wait for
 * the lost process, so the program aborts instead (docs/multihost.md). */
static int g_lost;

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

/* Fills a compact box (off, size) of tensor tid (global shape gshape) with version v. */
static void fill_box(int tid, dt_dtype dt, int rank, const int64_t *gshape, const int64_t *off,
                     const int64_t *size, int64_t v, unsigned char *dst)
{
    size_t es = dt_dtype_size(dt);
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= size[d];
    for (int64_t j = 0; j < n; j++) {
        int64_t rem = j, g = 0, stride = 1;
        for (int d = rank - 1; d >= 0; d--) {
            g += (off[d] + rem % size[d]) * stride;
            rem /= size[d];
            stride *= gshape[d];
        }
        element(tid, dt, g, v, dst + (size_t)j * es);
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

/* Tensor id of entry k of a set (ids of pieces' tensors start at PIECE_TID). */
static int set_tid(int k, int big_mib)
{
    int nfirst = NSPECS + (big_mib > 0);
    return k < nfirst ? k : PIECE_TID + (k - nfirst);
}

/* The tensors on `mesh`; `restore_layouts`: a 1-D mesh "z" for check, dim 0 sharded on z, and
 * then the pieces' tensors too when `pieces`. */
static dt_status make_set(const dt_mesh *mesh, int big_mib, int restore_layouts, int pieces,
                          tensor_set *s)
{
    memset(s, 0, sizeof *s);
    int nfirst = NSPECS + (big_mib > 0);
    for (int k = 0; k < nfirst + (restore_layouts && pieces ? NPSPECS : 0); k++) {
        spec sp = k < NSPECS   ? SPECS[k]
                  : k < nfirst ? (spec){"big", DT_DTYPE_F32, 1, {(int64_t)big_mib << 18, 0},
                                        {"x", NULL}}
                               : PSPECS[k - nfirst];
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
    g_lost |= st == DT_ERR_TIMEOUT;
    printf("status=%s\n", dt_status_name(st));
    fprintf(stderr, "make_ckpt[%d]: %s: %s: %s\n", g_rank, what, dt_status_name(st),
            dt_last_error());
    fflush(stdout);
    return 1;
}

/* One piece of the global list: the tensor (PSPECS index), its device's mesh position, box. */
typedef struct gpiece {
    int t;
    int64_t position;
    int64_t off[2], size[2];
} gpiece;

static void add_piece(gpiece *g, int *n, int t, int64_t pos, int64_t o0, int64_t o1,
                      int64_t s0, int64_t s1)
{
    if (*n < MAXP)
        g[(*n)++] = (gpiece){t, pos, {o0, o1}, {s0, s1}};
}

/* Cut points of the flat ranges: device r of N holds [cut(r), cut(r + 1)). zero/m (50
 * elements): uneven, device 1's empty; zero/v (35): uneven. */
static int64_t cut_m(int64_t r, int64_t N)
{
    return r == 0 ? 0 : r == N ? 50 : r <= 2 ? 50 / (N * N) : 50 * r * r / (N * N);
}

static int64_t cut_v(int64_t r, int64_t N)
{
    return r == N ? 35 : 35 * r / N + (r % 2);
}

/* Every device's pieces (the same list on every client), as the ZeRO optimizer cuts its state:
 * zero/m in flat ranges (the last device's in two pieces), zero/v in flat ranges cut into row
 * boxes (several per device), zero/c in column blocks. */
static int make_pieces(int64_t N, gpiece *g)
{
    int n = 0;
    for (int64_t r = 0; r < N; r++) {
        int64_t lo = cut_m(r, N), hi = cut_m(r + 1, N);
        if (r == N - 1 && hi - lo >= 2) {
            int64_t mid = lo + (hi - lo) / 3;
            add_piece(g, &n, 0, r, lo, 0, mid - lo, 0);
            add_piece(g, &n, 0, r, mid, 0, hi - mid, 0);
        } else {
            add_piece(g, &n, 0, r, lo, 0, hi - lo, 0);
        }
    }
    for (int64_t r = 0; r < N; r++)
        for (int64_t lo = cut_v(r, N), hi = cut_v(r + 1, N), len; lo < hi; lo += len) {
            int64_t row = lo / 5, col = lo % 5;
            if (col != 0 || hi - lo < 5) {   /* a partial row */
                len = hi - lo < 5 - col ? hi - lo : 5 - col;
                add_piece(g, &n, 1, r, row, col, 1, len);
            } else {                         /* full rows */
                len = (hi - lo) / 5 * 5;
                add_piece(g, &n, 1, r, row, 0, len / 5, 5);
            }
        }
    for (int k = 0; k < 3; k++)
        add_piece(g, &n, 2, (2 * k + 1) % N, 0, k, 4, 1);
    return n;
}

/* This client's pieces of the global list, filled with version v (buffers into bufs). */
static int local_pieces(const dt_mesh *mesh, int64_t v, dt_ckpt_piece *out, void **bufs,
                        gpiece *g)
{
    int ng = make_pieces(dt_mesh_size(mesh), g), n = 0;
    for (int i = 0; i < ng; i++) {
        int id = dt_mesh_device_id(mesh, g[i].position), li = -1;
        for (int k = 0; k < dt_mesh_num_local_devices(mesh); k++)
            if (dt_mesh_local_device_id(mesh, k) == id)
                li = k;
        if (li < 0)
            continue;
        const spec *sp = &PSPECS[g[i].t];
        bufs[n] = malloc((size_t)(g[i].size[0] * (sp->rank > 1 ? g[i].size[1] : 1)) * 8 + 1);
        if (!bufs[n])
            break;
        fill_box(PIECE_TID + g[i].t, sp->dtype, sp->rank, sp->shape, g[i].off, g[i].size, v,
                 bufs[n]);
        out[n] = (dt_ckpt_piece){.name = sp->name, .dtype = sp->dtype, .rank = sp->rank,
                                 .shape = sp->shape, .offsets = g[i].off, .sizes = g[i].size,
                                 .device = li, .data = bufs[n]};
        n++;
    }
    return n;
}

static int do_save(const char *dir, int64_t version, int big_mib, int announce, int pieces)
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
    gpiece g[MAXP];
    dt_ckpt_piece pc[MAXP];
    void *bufs[MAXP] = {0};
    int rc = 1, np = 0;
    st = make_set(mesh, big_mib, 0, 0, &s);
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
    np = pieces ? local_pieces(mesh, version, pc, bufs, g) : 0;
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
    opts.npieces = np;
    opts.pieces = pc;
    MPI_Barrier(MPI_COMM_WORLD);
    if (announce && g_rank == 0) {
        printf("saving\n");
        fflush(stdout);
    }
    if (g_lose_first && g_rank == 1)
        raise(SIGKILL);
    double t0 = MPI_Wtime();
    dt_ckpt_keep keep = {.last = 2, .every = 0};
    const dt_tensor *const *tt = (const dt_tensor *const *)t;
    if (g_async) {
        dt_save_request *req = NULL;
        st = g_step ? dt_save_step_async(mesh, dir, version, &keep, s.n, s.names, tt, &opts,
                                         &req)
                    : dt_save_async(mesh, dir, s.n, s.names, tt, &opts, &req);
        if (st == DT_OK && g_rank == 0) {
            printf("staged secs=%.4f\n", MPI_Wtime() - t0);
            fflush(stdout);
        }
        if (st == DT_OK)
            st = dt_save_wait(req);
    } else {
        st = g_step ? dt_save_step(mesh, dir, version, &keep, s.n, s.names, tt, &opts)
                    : dt_save(mesh, dir, s.n, s.names, tt, &opts);
    }
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
    for (int i = 0; i < np; i++)
        free(bufs[i]);
    free_set(&s);
    dt_mesh_destroy(mesh);
    return rc;
}

/* Restores `dir` onto a 1-D mesh of every device with other layouts and prints one line
 * "result DIR version=V" when every element of every tensor and every value is version V's
 * (V read from the value "step"), "result DIR mix version=V" when not, "result DIR error=S"
 * when the restore fails. Returns 0 only in the first case. */
static int check_one(const dt_mesh *mesh, const char *dir, int big_mib, int pieces)
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
        st = make_set(mesh, big_mib, 1, pieces, &s);
    else
        s.n = 0;
    if (st == DT_OK)
        st = dt_restore(mesh, dir, s.n, s.names, (const dt_layout *const *)s.layouts, t);
    if (st != DT_OK) {
        g_lost |= st == DT_ERR_TIMEOUT;
        if (g_rank == 0)
            printf("result %s error=%s\n", dir, dt_status_name(st));
        fprintf(stderr, "make_ckpt[%d]: %s: %s: %s\n", g_rank, dir, dt_status_name(st),
                dt_last_error());
        goto out;
    }
    long long bad[MAXT] = {0}, all[MAXT];
    for (int k = 0; k < s.n; k++) {
        int tid = set_tid(k, big_mib);
        int rank = dt_layout_rank(s.layouts[k]);
        int shape_ok = dt_tensor_dtype(t[k]) == s.dtypes[k] && dt_tensor_rank(t[k]) == rank;
        for (int d = 0; shape_ok && d < dt_tensor_rank(t[k]); d++)
            shape_ok = dt_tensor_shape(t[k])[d] == s.shapes[k][d];
        bad[k] = shape_ok ? 0 : 1;
        for (int c = 0; shape_ok && c < dt_tensor_num_local(t[k]); c++)
            bad[k] += walk(t[k], c, tid, version, 1);
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

static int do_check(int ndirs, char **dirs, int big_mib, int pieces)
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
        rc |= check_one(mesh, dirs[i], big_mib, pieces);
    dt_mesh_destroy(mesh);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: make_ckpt save DIR VERSION [--big-mib M] [--announce] "
                        "[--pieces] [--async] [--step] [--lose-first]\n"
                        "       make_ckpt check [--big-mib M] [--pieces] DIR...\n");
        return 2;
    }
    int big_mib = 0, announce = 0, ndirs = 0, pieces = 0;
    char *dirs[256];
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--big-mib") == 0 && i + 1 < argc)
            big_mib = atoi(argv[++i]);
        else if (strcmp(argv[i], "--announce") == 0)
            announce = 1;
        else if (strcmp(argv[i], "--pieces") == 0)
            pieces = 1;
        else if (strcmp(argv[i], "--async") == 0)
            g_async = 1;
        else if (strcmp(argv[i], "--step") == 0)
            g_step = 1;
        else if (strcmp(argv[i], "--lose-first") == 0)
            g_lose_first = 1;
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
        rc = do_save(dirs[0], atoll(dirs[1]), big_mib, announce, pieces);
    else if (strcmp(argv[1], "check") == 0)
        rc = do_check(ndirs, dirs, big_mib, pieces);
    else
        rc = 2;
    if (g_lost) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, rc);
    }
    dt_finalize();
    return rc;
}
