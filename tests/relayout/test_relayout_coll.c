/* Relayout's regular patterns run as collectives (layout/relayout_pattern.c, relayout_coll.c):
 * for all-gather, all-to-all, reduce-scatter and all-reduce along each dim of 1-D and 2-D
 * meshes, in f32, f64, i32 and bf16, the result equals element for element (bits) both the
 * piece path (DT_RELAYOUT_PATTERNS=0) and a reference summed here in summand order, the
 * statistics agree with the piece path's, and the collective path ran exactly where every
 * client's devices share one coordinate along the changed dim. Summands are non-integers,
 * so another summation order would show in the last bits. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "layout/layout_impl.h"

static const dt_dtype dtypes[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_I32, DT_DTYPE_BF16};

/* bf16 from f32 by round to nearest even (written here, independently of the library). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(u >> 16 | 0x40);
    u += 0x7fffu + (u >> 16 & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Summand c's value at global element e, before rounding to the dtype. */
static double raw_value(int64_t c, int64_t e)
{
    uint64_t h = (uint64_t)e * 2654435761u + (uint64_t)c * 40503u + 17u;
    return (double)(h % 10007u) / 10007.0 * 3.0 + 1.0 / (double)(c + 3) - 1.5;
}

/* One element in the dtype's storage (8 bytes are enough for all four). */
typedef union elem {
    float f32;
    double f64;
    int32_t i32;
    uint16_t bf16;
} elem;

static elem stored(dt_dtype t, int64_t c, int64_t e)
{
    elem v;
    memset(&v, 0, sizeof v);
    double x = raw_value(c, e);
    switch (t) {
    case DT_DTYPE_F32:
        v.f32 = (float)x;
        break;
    case DT_DTYPE_F64:
        v.f64 = x;
        break;
    case DT_DTYPE_I32:
        v.i32 = (int32_t)(x * 1000.0);
        break;
    default:
        v.bf16 = to_bf16((float)x);
        break;
    }
    return v;
}

/* acc op= x as the library specifies: f32 and f64 in their precision, bf16 through f32 with
 * one rounding per step, i32 exactly. */
static elem add(dt_dtype t, elem acc, elem x)
{
    switch (t) {
    case DT_DTYPE_F32:
        acc.f32 = acc.f32 + x.f32;
        break;
    case DT_DTYPE_F64:
        acc.f64 = acc.f64 + x.f64;
        break;
    case DT_DTYPE_I32:
        acc.i32 = acc.i32 + x.i32;
        break;
    default:
        acc.bf16 = to_bf16(from_bf16(acc.bf16) + from_bf16(x.bf16));
        break;
    }
    return acc;
}

/* The expected element e: summand 0, or with k summands their sum in order 0..k-1. */
static elem reference(dt_dtype t, int64_t k, int64_t e)
{
    elem acc = stored(t, 0, e);
    for (int64_t c = 1; c < k; c++)
        acc = add(t, acc, stored(t, c, e));
    return acc;
}

/* Global row-major index of element i of a box. */
static int64_t global_index(int rank, const int64_t *shape, const int64_t *off, const int64_t *len,
                            int64_t i)
{
    int64_t e = 0, rem = i, idx[DT_MAX_RANK];
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = rem % len[d];
        rem /= len[d];
    }
    for (int d = 0; d < rank; d++)
        e = e * shape[d] + off[d] + idx[d];
    return e;
}

/* The source tensor: summand = the position's coordinate on mesh dim `partial` (or 0). */
static dt_tensor *make_src(const dt_layout *l, const int64_t *shape, dt_dtype t, int partial)
{
    const dt_mesh *m = dt_layout_mesh(l);
    int n = dt_mesh_num_local_devices(m);
    size_t es = dt_dtype_size(t);
    void **bufs = calloc((size_t)n + 1, sizeof *bufs);
    for (int i = 0; i < n; i++) {
        int64_t p = dt_mesh_position(m, dt_mesh_local_device_id(m, i));
        int64_t off[2], len[2], coords[DT_MESH_MAX_DIMS];
        DT_ASSERT_OK(dt_layout_shard(l, shape, p, off, len));
        DT_ASSERT_OK(dt_mesh_coords(m, p, coords));
        int64_t c = partial >= 0 ? coords[partial] : 0;
        bufs[i] = malloc((size_t)(len[0] * len[1]) * es + 1);
        for (int64_t j = 0; j < len[0] * len[1]; j++) {
            elem v = stored(t, c, global_index(2, shape, off, len, j));
            memcpy((char *)bufs[i] + (size_t)j * es, &v, es);
        }
    }
    dt_tensor *src = NULL;
    DT_ASSERT_OK(dt_test_pack_host(l, t, shape, (const void *const *)bufs, &src));
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    return src;
}

/* Mismatches of t against the reference with k summands (k = 1: a copy). */
static int64_t check_reference(const dt_tensor *t, const int64_t *shape, int64_t k)
{
    const dt_layout *l = dt_tensor_layout(t);
    const dt_mesh *m = dt_layout_mesh(l);
    dt_dtype dt = dt_tensor_dtype(t);
    size_t es = dt_dtype_size(dt);
    int64_t bad = 0;
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        int64_t p = dt_mesh_position(m, dt_mesh_local_device_id(m, i)), off[2], len[2];
        DT_ASSERT_OK(dt_layout_shard(l, shape, p, off, len));
        unsigned char *got = dt_test_local_get(t, i);
        for (int64_t j = 0; j < len[0] * len[1]; j++) {
            elem want = reference(dt, k, global_index(2, shape, off, len, j));
            if (memcmp(got + (size_t)j * es, &want, es) != 0 && bad++ < 3)
                fprintf(stderr, "%s: device %d element %lld differs from the reference\n",
                        dt_dtype_name(dt), dt_mesh_local_device_id(m, i), (long long)j);
        }
        free(got);
    }
    return bad;
}

/* Components of a and b differing in any bit. */
static int64_t check_same_bits(const dt_tensor *a, const dt_tensor *b)
{
    int64_t bad = 0;
    for (int i = 0; i < dt_tensor_num_local(a); i++) {
        void *x = dt_test_local_get(a, i), *y = dt_test_local_get(b, i);
        bad += memcmp(x, y, dt_test_local_bytes(a, i)) != 0;
        free(x);
        free(y);
    }
    return bad;
}

/* 1 if every client's devices of m share one coordinate along mesh dim `dim` (computed here
 * from the device table, independently of the planner). */
static int expect_collective(const dt_mesh *m, int dim)
{
    int n = dt_num_clients();
    int64_t *coord = malloc((size_t)n * sizeof *coord), c[DT_MESH_MAX_DIMS];
    int ok = dt_mesh_dim_size(m, dim) > 1 && n > 1;
    for (int i = 0; i < n; i++)
        coord[i] = -1;
    for (int64_t p = 0; ok && p < dt_mesh_size(m); p++) {
        int cl = dt_device_client(dt_mesh_device_type(m), dt_mesh_device_id(m, p));
        DT_ASSERT_OK(dt_mesh_coords(m, p, c));
        ok = coord[cl] < 0 || coord[cl] == c[dim];
        coord[cl] = c[dim];
    }
    free(coord);
    return ok;
}

/* 1 if a pattern plan on m along `dim` runs as collectives here: m qualifies, the devices are
 * CPU ones, and the transport is MPI (forced by the test's registration: the staged and shm
 * transports have no collectives, and shm wins the automatic choice on one host). */
static int collectives_expected(const dt_mesh *m, int dim)
{
    const char *t = getenv("DT_TRANSPORT");
    return expect_collective(m, dim) && dt_test_device_type() == DT_DEVICE_CPU && t &&
           strcmp(t, "mpi") == 0;
}

typedef struct pcase {
    const char *what;
    const char *s0, *s1, *partial; /* source */
    const char *d0, *d1;           /* destination */
    int dim;                       /* the mesh dim that changes */
    int small;                     /* shape [1, k-1]: too small to split an all-reduce into
                                    * reduce-scatter + all-gather, so it runs as one */
} pcase;

/* 1 if an all-reduce pattern on m along `dim` runs fused through shm here
 * (layout/relayout_fused.c): m qualifies, CPU devices, DT_TRANSPORT=shm. */
static int fused_expected(const dt_mesh *m, int dim, const pcase *pc)
{
    const char *t = getenv("DT_TRANSPORT");
    int allreduce = pc->partial && (!pc->d0 || strcmp(pc->d0, pc->partial) != 0) &&
                    (!pc->d1 || strcmp(pc->d1, pc->partial) != 0);
    return allreduce && expect_collective(m, dim) && dt_test_device_type() == DT_DEVICE_CPU &&
           t && strcmp(t, "shm") == 0;
}

/* src -> dst with and without patterns; returns the stats of the run through `s`, the
 * collective and fused runs. */
static dt_tensor *run(const dt_tensor *src, const dt_layout *dst_l, const char *patterns,
                      dt_relayout_stats *s, int *ns, unsigned long *colls, unsigned long *fused)
{
    dt_tensor *dst = NULL;
    setenv("DT_RELAYOUT_PATTERNS", patterns, 1);
    dt_relayout_cache_clear();
    unsigned long before = dt__rl_coll_runs(), fused0 = dt__rl_fused_runs();
    DT_ASSERT_OK(dt_relayout(src, dst_l, &dst));
    *colls = dt__rl_coll_runs() - before;
    *fused = dt__rl_fused_runs() - fused0;
    DT_ASSERT_OK(dt_relayout_last_stats(16, s, ns, NULL));
    unsetenv("DT_RELAYOUT_PATTERNS");
    return dst;
}


/* Replaces the piece path's statistics sg by what the fused all-reduce moves (sent as much as
 * received, on one host: the job's totals then agree as on the other paths). */
static void fused_stats_expected(const dt_mesh *m, const dt_layout *dl, const int64_t *shape,
                                 int dim, dt_dtype t, dt_relayout_stats *sg, int ng)
{
    int64_t k = dt_mesh_dim_size(m, dim);
    size_t es = dt_dtype_size(t);
    for (int i = 0; i < ng && i < 16; i++) {
        int64_t p = dt_mesh_position(m, sg[i].device_id), off[2], len[2], c[DT_MESH_MAX_DIMS];
        DT_ASSERT_OK(dt_layout_shard(dl, shape, p, off, len));
        DT_ASSERT_OK(dt_mesh_coords(m, p, c));
        int64_t n = len[0] * len[1], mine = n / k + (c[dim] < n % k);
        uint64_t moved = (uint64_t)((k - 1) * mine + (n - mine)) * es;
        sg[i].bytes_received = sg[i].bytes_received_remote = moved;
        sg[i].bytes_sent = sg[i].bytes_sent_remote = moved;
        sg[i].bytes_received_cross_host = 0;
        sg[i].bytes_self = (uint64_t)mine * es;
    }
}

static void run_case(const dt_mesh *m, const pcase *pc, dt_dtype t)
{
    int64_t n = dt_mesh_size(m), shape[2] = {4 * n, 2 * n};
    if (pc->small) {
        shape[0] = 1;
        shape[1] = dt_mesh_dim_size(m, pc->dim) > 2 ? dt_mesh_dim_size(m, pc->dim) - 1 : 1;
    }
    dt_layout *sl = dt_test_layout(m, 2, pc->s0, pc->s1, pc->partial);
    dt_layout *dl = dt_test_layout(m, 2, pc->d0, pc->d1, NULL);
    int partial = pc->partial ? pc->dim : -1;
    int64_t k = pc->partial ? dt_mesh_dim_size(m, pc->dim) : 1;
    dt_tensor *src = make_src(sl, shape, t, partial);
    dt_relayout_stats sc[16], sg[16];
    int nc = 0, ng = 0;
    unsigned long cc = 0, cg = 0, fc = 0, fg = 0;
    dt_tensor *a = run(src, dl, "1", sc, &nc, &cc, &fc);
    dt_tensor *b = run(src, dl, "0", sg, &ng, &cg, &fg);
    int want = collectives_expected(m, pc->dim), fused = fused_expected(m, pc->dim, pc);
    if ((fc > 0) != fused || fg != 0)
        fprintf(stderr, "%s %s: %lu fused runs, %lu without patterns (want %s)\n", pc->what,
                dt_dtype_name(t), fc, fg, fused ? "one" : "none");
    CU_ASSERT_EQUAL(fc, (unsigned long)fused);
    CU_ASSERT_EQUAL(fg, 0);
    if ((cc > 0) != want || cg != 0)
        fprintf(stderr, "%s %s: %lu collective runs, %lu without patterns (want %s)\n", pc->what,
                dt_dtype_name(t), cc, cg, want ? "some" : "none");
    CU_ASSERT_EQUAL(cc > 0, want);
    CU_ASSERT_EQUAL(cg, 0);
    if (pc->small && want) /* one all-reduce, not reduce-scatter + all-gather */
        CU_ASSERT_EQUAL(cc, 1);
    CU_ASSERT_EQUAL(check_reference(a, shape, k), 0);
    CU_ASSERT_EQUAL(check_reference(b, shape, k), 0);
    CU_ASSERT_EQUAL(check_same_bits(a, b), 0);
    /* Statistics: what each device receives and keeps is the same on both paths; what is
     * sent may come from another replica, so only the job's totals agree. The fused
     * all-reduce splits the flattened shard k ways and keeps its own summand's slice; it
     * receives the others' summands of that slice, then their reduced slices. */
    CU_ASSERT_EQUAL(nc, ng);
    if (fused)
        fused_stats_expected(m, dl, shape, pc->dim, t, sg, ng);
    long long tot[4] = {0, 0, 0, 0}, all[4];
    for (int i = 0; i < nc && i < ng && i < 16; i++) {
        CU_ASSERT_EQUAL(sc[i].device_id, sg[i].device_id);
        CU_ASSERT_EQUAL(sc[i].bytes_received, sg[i].bytes_received);
        CU_ASSERT_EQUAL(sc[i].bytes_received_remote, sg[i].bytes_received_remote);
        CU_ASSERT_EQUAL(sc[i].bytes_received_cross_host, sg[i].bytes_received_cross_host);
        CU_ASSERT_EQUAL(sc[i].bytes_self, sg[i].bytes_self);
        tot[0] += (long long)sc[i].bytes_sent;
        tot[1] += (long long)sg[i].bytes_sent;
        tot[2] += (long long)sc[i].bytes_sent_remote;
        tot[3] += (long long)sg[i].bytes_sent_remote;
    }
    MPI_Allreduce(tot, all, 4, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    CU_ASSERT_EQUAL(all[0], all[1]);
    CU_ASSERT_EQUAL(all[2], all[3]);
    dt_tensor_destroy(a);
    dt_tensor_destroy(b);
    dt_tensor_destroy(src);
    dt_layout_destroy(dl);
    dt_layout_destroy(sl);
}

static const pcase cases_1d[] = {
    {"all-gather dim 0", "x", NULL, NULL, NULL, NULL, 0, 0},
    {"all-gather dim 1", NULL, "x", NULL, NULL, NULL, 0, 0},
    {"all-to-all 0->1", "x", NULL, NULL, NULL, "x", 0, 0},
    {"all-to-all 1->0", NULL, "x", NULL, "x", NULL, 0, 0},
    {"reduce-scatter dim 0", NULL, NULL, "x", "x", NULL, 0, 0},
    {"reduce-scatter dim 1", NULL, NULL, "x", NULL, "x", 0, 0},
    {"all-reduce", NULL, NULL, "x", NULL, NULL, 0, 0},
    {"all-reduce in one step", NULL, NULL, "x", NULL, NULL, 0, 1},
};

static const pcase cases_2d[] = {
    {"all-gather a", "a", "b", NULL, NULL, "b", 0, 0},
    {"all-gather b", "a", "b", NULL, "a", NULL, 1, 0},
    {"all-to-all a", "a", NULL, NULL, NULL, "a", 0, 0},
    {"all-to-all b", "b", NULL, NULL, NULL, "b", 1, 0},
    {"reduce-scatter a", NULL, "b", "a", "a", "b", 0, 0},
    {"reduce-scatter b", "a", NULL, "b", "a", "b", 1, 0},
    {"all-reduce a", "b", NULL, "a", "b", NULL, 0, 0},
    {"all-reduce b", NULL, "a", "b", NULL, "a", 1, 0},
    {"all-reduce a in one step", NULL, NULL, "a", NULL, NULL, 0, 1},
};

/* Runs every case in every dtype on m, then destroys m. */
static void run_cases_and_destroy(dt_mesh *m, const pcase *cases, size_t ncases)
{
    for (size_t i = 0; i < ncases; i++)
        for (size_t t = 0; t < sizeof dtypes / sizeof *dtypes; t++)
            run_case(m, &cases[i], dtypes[t]);
    dt_mesh_destroy(m);
}

static void test_patterns_on_a_1d_mesh(void)
{
    const char *names[1] = {"x"};
    int64_t sizes[1] = {dt_test_num_devices()};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("line", 1, names, sizes, dt_test_device_type(), &m));
    run_cases_and_destroy(m, cases_1d, sizeof cases_1d / sizeof *cases_1d);
}

static void test_patterns_on_a_2d_mesh(void)
{
    int64_t n = dt_test_num_devices();
    if (n < 4 || n % 2) {
        printf("(needs an even number >= 4 of devices) ");
        return;
    }
    /* With several devices per client, b = that count: each client holds a row (a is the
     * collective dim, b the piece path's); with one, both dims are collective. */
    int64_t per = n / dt_num_clients(), b = dt_num_clients() > 1 && per >= 2 ? per : 2;
    const char *names[2] = {"a", "b"};
    int64_t sizes[2] = {n / b, b};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("grid", 2, names, sizes, dt_test_device_type(), &m));
    run_cases_and_destroy(m, cases_2d, sizeof cases_2d / sizeof *cases_2d);
}

/* Reduce-scatter and all-reduce with max and avg: bits equal the piece path's; max also equals
 * the largest summand (any order gives it). */
static void test_max_and_avg_reductions_match_the_piece_path(void)
{
    const char *names[1] = {"x"};
    int64_t n = dt_test_num_devices(), shape[2] = {4 * n, 2 * n};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("line", 1, names, &n, dt_test_device_type(), &m));
    const dt_reduce_op ops[2] = {DT_REDUCE_MAX, DT_REDUCE_AVG};
    const char *dsts[2][2] = {{"x", NULL}, {NULL, NULL}};
    const dt_dtype types[2] = {DT_DTYPE_F32, DT_DTYPE_BF16};
    for (int o = 0; o < 2; o++)
        for (int d = 0; d < 2; d++)
            for (int t = 0; t < 2; t++) {
                const char *specs[2] = {DT_UNSHARDED, DT_UNSHARDED}, *pn[1] = {"x"};
                const char *dspecs[2] = {dsts[d][0] ? dsts[d][0] : DT_UNSHARDED, DT_UNSHARDED};
                dt_layout *sl = NULL, *dl = NULL;
                DT_ASSERT_OK(dt_layout_create_partial(m, 2, specs, 1, pn, &ops[o], &sl));
                DT_ASSERT_OK(dt_layout_create(m, 2, dspecs, &dl));
                dt_tensor *src = make_src(sl, shape, types[t], 0);
                dt_relayout_stats s[16];
                int ns = 0;
                unsigned long cc = 0, cg = 0, fc = 0, fg = 0;
                const pcase pc = {"", NULL, NULL, "x", dsts[d][0], NULL, 0, 0};
                dt_tensor *a = run(src, dl, "1", s, &ns, &cc, &fc);
                dt_tensor *b = run(src, dl, "0", s, &ns, &cg, &fg);
                CU_ASSERT_EQUAL(cc > 0, collectives_expected(m, 0));
                CU_ASSERT_EQUAL(fc, (unsigned long)fused_expected(m, 0, &pc));
                CU_ASSERT_EQUAL(check_same_bits(a, b), 0);
                for (int i = 0; o == 0 && i < dt_tensor_num_local(a); i++) {
                    int64_t p = dt_tensor_local_position(a, i), off[2], len[2], bad = 0;
                    DT_ASSERT_OK(dt_layout_shard(dl, shape, p, off, len));
                    unsigned char *got = dt_test_local_get(a, i);
                    size_t es = dt_dtype_size(types[t]);
                    for (int64_t j = 0; j < len[0] * len[1]; j++) {
                        int64_t e = global_index(2, shape, off, len, j);
                        elem best = stored(types[t], 0, e);
                        for (int64_t c = 1; c < n; c++) {
                            elem x = stored(types[t], c, e);
                            int more = types[t] == DT_DTYPE_F32
                                           ? x.f32 > best.f32
                                           : from_bf16(x.bf16) > from_bf16(best.bf16);
                            if (more)
                                best = x;
                        }
                        bad += memcmp(got + (size_t)j * es, &best, es) != 0;
                    }
                    CU_ASSERT_EQUAL(bad, 0);
                    free(got);
                }
                dt_tensor_destroy(a);
                dt_tensor_destroy(b);
                dt_tensor_destroy(src);
                dt_layout_destroy(dl);
                dt_layout_destroy(sl);
            }
    dt_mesh_destroy(m);
}

static void test_patterns_switch_rejects_bad_values(void)
{
    const char *names[1] = {"x"};
    int64_t sizes[1] = {dt_test_num_devices()}, shape[2] = {8, 8};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("line", 1, names, sizes, dt_test_device_type(), &m));
    dt_layout *sl = dt_test_layout(m, 2, "x", NULL, NULL),
              *dl = dt_test_layout(m, 2, NULL, NULL, NULL);
    dt_tensor *src = make_src(sl, shape, DT_DTYPE_F32, -1), *dst = NULL;
    setenv("DT_RELAYOUT_PATTERNS", "yes", 1);
    dt_relayout_cache_clear();
    DT_ASSERT_FAILS(dt_relayout(src, dl, &dst), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_RELAYOUT_PATTERNS");
    unsetenv("DT_RELAYOUT_PATTERNS");
    dt_tensor_destroy(src);
    dt_layout_destroy(dl);
    dt_layout_destroy(sl);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_patterns_on_a_1d_mesh),
        DT_TEST(test_patterns_on_a_2d_mesh),
        DT_TEST(test_max_and_avg_reductions_match_the_piece_path),
        DT_TEST(test_patterns_switch_rejects_bad_values),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "relayout_coll", cases);
}
