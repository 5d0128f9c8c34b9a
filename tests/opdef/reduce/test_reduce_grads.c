/* The reduce family's gradients through a dt_tape: for every differentiable op, the gradient
 * of L = sum(op(x) * w) against central finite differences in f64 on one device, the same
 * gradient on a 2x2 mesh with x sharded, and max's gradient split among ties. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "harness.h"
#include "reduce_test_util.h"

typedef struct gcase {
    const char *what;
    rt_fn fn;
    int nin;
    int rank[2];
    int64_t shape[2][3];
    int labels; /* input 1 is labels (i64, not differentiated) */
} gcase;

static dt_status g_sum(const dt_tensor *const *in, dt_tensor **o)
{
    int ax[1] = {1};
    return dt_sum(in[0], ax, 1, 0, o);
}
static dt_status g_mean(const dt_tensor *const *in, dt_tensor **o)
{
    int ax[2] = {0, -1};
    return dt_mean(in[0], ax, 2, 1, o);
}
static dt_status g_max(const dt_tensor *const *in, dt_tensor **o)
{
    int ax[1] = {2};
    return dt_max(in[0], ax, 1, 0, o);
}
static dt_status g_min(const dt_tensor *const *in, dt_tensor **o)
{
    return dt_min(in[0], NULL, 0, 0, o);
}
static dt_status g_lse(const dt_tensor *const *in, dt_tensor **o)
{
    int ax[1] = {1};
    return dt_logsumexp(in[0], ax, 1, 1, o);
}
static dt_status g_var(const dt_tensor *const *in, dt_tensor **o)
{
    int ax[1] = {2};
    return dt_var(in[0], ax, 1, 1, 0, o);
}
static dt_status g_lsm(const dt_tensor *const *in, dt_tensor **o)
{
    return dt_log_softmax(in[0], 1, o);
}
static dt_status g_cumsum(const dt_tensor *const *in, dt_tensor **o)
{
    return dt_cumsum(in[0], 2, o);
}
static dt_status g_topk(const dt_tensor *const *in, dt_tensor **o)
{
    return dt_topk(in[0], 2, 2, 1, o, NULL);
}
static dt_status g_sort(const dt_tensor *const *in, dt_tensor **o)
{
    return dt_sort(in[0], 1, 1, o, NULL);
}
static dt_status g_einsum2(const dt_tensor *const *in, dt_tensor **o)
{
    return dt_einsum("abc,cd->abd", in, 2, o);
}
static dt_status g_einsum_batch(const dt_tensor *const *in, dt_tensor **o)
{
    return dt_einsum("...bc,...cd->...db", in, 2, o);
}
static dt_status g_einsum1(const dt_tensor *const *in, dt_tensor **o)
{
    return dt_einsum("abc->ca", in, 1, o);
}
static dt_status g_matmul(const dt_tensor *const *in, dt_tensor **o)
{
    return dt_matmul_broadcast(in[0], in[1], o);
}
static dt_status g_xent(const dt_tensor *const *in, dt_tensor **o)
{
    return dt_cross_entropy(in[0], in[1], -100, o);
}

static const gcase gcases[] = {
    {"sum", g_sum, 1, {3}, {{2, 3, 4}}, 0},
    {"mean keepdim", g_mean, 1, {3}, {{2, 3, 4}}, 0},
    {"max", g_max, 1, {3}, {{2, 3, 4}}, 0},
    {"min of all", g_min, 1, {3}, {{2, 3, 4}}, 0},
    {"logsumexp keepdim", g_lse, 1, {3}, {{2, 3, 4}}, 0},
    {"var", g_var, 1, {3}, {{2, 3, 4}}, 0},
    {"log_softmax", g_lsm, 1, {3}, {{2, 3, 4}}, 0},
    {"cumsum", g_cumsum, 1, {3}, {{2, 3, 4}}, 0},
    {"topk values", g_topk, 1, {3}, {{2, 3, 4}}, 0},
    {"sort values", g_sort, 1, {3}, {{2, 3, 4}}, 0},
    {"einsum abc,cd->abd", g_einsum2, 2, {3, 2}, {{2, 3, 4}, {4, 2}}, 0},
    {"einsum ...bc,...cd->...db (broadcast)", g_einsum_batch, 2, {3, 3}, {{2, 3, 4}, {1, 4, 2}}, 0},
    {"einsum abc->ca", g_einsum1, 1, {3}, {{2, 3, 4}}, 0},
    {"matmul_broadcast [2,3,4] x [4]", g_matmul, 2, {3, 1}, {{2, 3, 4}, {4}}, 0},
    {"matmul_broadcast [4] x [2,4,3]", g_matmul, 2, {1, 3}, {{4}, {2, 4, 3}}, 0},
    {"cross_entropy", g_xent, 2, {3, 2}, {{2, 3, 4}, {2, 3}}, 1},
};

static const double labels[6] = {1, -100, 3, 0, 2, 2};

static int64_t numel(int rank, const int64_t *s)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= s[d];
    return n;
}

/* L = einsum(y, w) with w fixed weights of y's shape. */
static dt_status weighted_sum(const dt_tensor *y, dt_tensor **loss)
{
    int r = dt_tensor_rank(y);
    int64_t n = dt_tensor_numel(y);
    double w[64];
    for (int64_t e = 0; e < n; e++)
        w[e] = 0.5 + 0.25 * (double)(e % 5) - 0.1 * (double)(e % 3);
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(dt_layout_mesh(dt_tensor_layout(y)), r, &rep));
    dt_tensor *tw = rt_tensor(rep, DT_DTYPE_F64, r, dt_tensor_shape(y), w);
    char eq[32], lt[9];
    for (int d = 0; d < r; d++)
        lt[d] = (char)('a' + d);
    lt[r] = 0;
    snprintf(eq, sizeof eq, "%s,%s->", lt, lt);
    const dt_tensor *in[2] = {y, tw};
    dt_status st = dt_einsum(eq, in, 2, loss);
    dt_tensor_destroy(tw);
    dt_layout_destroy(rep);
    return st;
}

/* The inputs of case c on mesh m: x[i] in layout l[i] (replicated when NULL). */
static void make_in(const gcase *c, const dt_mesh *m, dt_layout *const *l, double *const *x,
                    dt_tensor **in)
{
    for (int i = 0; i < c->nin; i++) {
        dt_layout *rep = NULL;
        DT_ASSERT_OK(dt_layout_replicated(m, c->rank[i], &rep));
        int lab = c->labels && i == 1;
        in[i] = rt_tensor(l && l[i] ? l[i] : rep, lab ? DT_DTYPE_I64 : DT_DTYPE_F64, c->rank[i],
                          c->shape[i], lab ? labels : x[i]);
        dt_layout_destroy(rep);
    }
}

static double loss_at(const gcase *c, const dt_mesh *m, double *const *x)
{
    dt_tensor *in[2] = {NULL, NULL}, *y = NULL, *loss = NULL;
    make_in(c, m, NULL, x, in);
    DT_ASSERT_OK(c->fn((const dt_tensor *const *)in, &y));
    DT_ASSERT_OK(weighted_sum(y, &loss));
    double v = 0;
    DT_ASSERT_OK(dt_item(loss, &v));
    dt_tensor_destroy(loss);
    dt_tensor_destroy(y);
    for (int i = 0; i < c->nin; i++)
        dt_tensor_destroy(in[i]);
    return v;
}

/* The tape's gradients of L for the differentiable inputs into g[i]. */
static void tape_grads(const gcase *c, const dt_mesh *m, dt_layout *const *l, double *const *x,
                       double *const *g)
{
    dt_tensor *in[2] = {NULL, NULL}, *y = NULL, *loss = NULL;
    make_in(c, m, l, x, in);
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    for (int i = 0; i < c->nin; i++)
        if (!(c->labels && i == 1))
            DT_ASSERT_OK(dt_tape_watch(tape, in[i], i));
    DT_ASSERT_OK(dt_tape_begin(tape));
    dt_status st = c->fn((const dt_tensor *const *)in, &y);
    if (st == DT_OK)
        st = weighted_sum(y, &loss);
    DT_ASSERT_OK(dt_tape_end(tape));
    DT_ASSERT_OK(st);
    st = dt_tape_backward(tape, loss, NULL, 1.0f, NULL);
    if (st != DT_OK)
        fprintf(stderr, "%s: backward: %s: %s\n", c->what, dt_status_name(st), dt_last_error());
    CU_ASSERT_EQUAL_FATAL(st, DT_OK);
    for (int i = 0; i < c->nin; i++) {
        if (c->labels && i == 1)
            continue;
        const dt_tensor *gi = NULL;
        DT_ASSERT_OK(dt_tape_grad(tape, i, &gi));
        CU_ASSERT_PTR_NOT_NULL_FATAL(gi);
        rt_fetch(gi, g[i], numel(c->rank[i], c->shape[i]));
    }
    dt_tape_destroy(tape);
    dt_tensor_destroy(loss);
    dt_tensor_destroy(y);
    for (int i = 0; i < c->nin; i++)
        dt_tensor_destroy(in[i]);
}

static void fill_distinct(double *x, int64_t n, uint64_t seed)
{
    /* distinct values (no ties: max, min, topk and sort are differentiable there) */
    for (int64_t e = 0; e < n; e++)
        x[e] = -1.0 + 2.0 * (double)((e * 7 + (int64_t)seed) % n) / (double)n + 0.001 * (double)e;
}

static void test_gradients_match_central_differences_in_f64(void)
{
    dt_mesh *m = rt_mesh(0);
    if (!rt_here(m)) {
        dt_mesh_destroy(m);
        return;
    }
    for (size_t k = 0; k < sizeof(gcases) / sizeof(*gcases); k++) {
        const gcase *c = &gcases[k];
        double xa[24], xb[24], ga[24], gb[24];
        double *x[2] = {xa, xb}, *g[2] = {ga, gb};
        for (int i = 0; i < c->nin; i++)
            fill_distinct(x[i], numel(c->rank[i], c->shape[i]), 3 + (uint64_t)i);
        tape_grads(c, m, NULL, x, g);
        const double h = 1e-6;
        for (int i = 0; i < c->nin; i++) {
            if (c->labels && i == 1)
                continue;
            int64_t n = numel(c->rank[i], c->shape[i]), bad = 0;
            for (int64_t e = 0; e < n; e++) {
                double keep = x[i][e];
                x[i][e] = keep + h;
                double lp = loss_at(c, m, x);
                x[i][e] = keep - h;
                double lm = loss_at(c, m, x);
                x[i][e] = keep;
                double fd = (lp - lm) / (2 * h);
                if (!(fabs(g[i][e] - fd) <= 1e-6 * (1 + fabs(fd))) && bad++ < 3)
                    fprintf(stderr, "%s: d input %d [%lld] is %.12g, differences %.12g\n", c->what,
                            i, (long long)e, g[i][e], fd);
            }
            CU_ASSERT_EQUAL(bad, 0);
        }
    }
    dt_mesh_destroy(m);
}

static void test_gradients_on_a_sharded_2x2_mesh_match_one_device(void)
{
    dt_mesh *m1 = rt_mesh(0), *m4 = rt_mesh(2);
    for (size_t k = 0; k < sizeof(gcases) / sizeof(*gcases); k++) {
        const gcase *c = &gcases[k];
        double xa[24], xb[24], ga[24], gb[24], ha[24], hb[24];
        double *x[2] = {xa, xb}, *g[2] = {ga, gb}, *h[2] = {ha, hb};
        for (int i = 0; i < c->nin; i++)
            fill_distinct(x[i], numel(c->rank[i], c->shape[i]), 3 + (uint64_t)i);
        if (rt_here(m1))
            tape_grads(c, m1, NULL, x, g);
        /* x sharded: dim 0 over b, its last dim over m (2 divides both here or pads) */
        dt_layout *l[2] = {NULL, NULL};
        for (int i = 0; i < c->nin; i++) {
            const char *specs[3] = {DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED};
            specs[0] = "b";
            if (c->rank[i] > 1)
                specs[c->rank[i] - 1] = "m";
            DT_ASSERT_OK(dt_layout_create(m4, c->rank[i], specs, &l[i]));
        }
        tape_grads(c, m4, l, x, h);
        for (int i = 0; i < c->nin; i++) {
            dt_layout_destroy(l[i]);
            if ((c->labels && i == 1) || !rt_here(m1) || !rt_here(m4))
                continue;
            int64_t n = numel(c->rank[i], c->shape[i]), bad = 0;
            for (int64_t e = 0; e < n; e++)
                if (!(fabs(g[i][e] - h[i][e]) <= 1e-12 * (1 + fabs(g[i][e]))) && bad++ < 3)
                    fprintf(stderr, "%s: d input %d [%lld] is %.17g on 2x2, %.17g on one\n",
                            c->what, i, (long long)e, h[i][e], g[i][e]);
            CU_ASSERT_EQUAL(bad, 0);
        }
    }
    dt_mesh_destroy(m1);
    dt_mesh_destroy(m4);
}

static dt_status g_max_all(const dt_tensor *const *in, dt_tensor **o)
{
    int ax[1] = {1};
    return dt_max(in[0], ax, 1, 0, o);
}

static void test_max_and_min_gradients_are_split_among_ties(void)
{
    dt_mesh *m = rt_mesh(2);
    /* x [2, 4]: rows {1, 3, 3, 0} and {2, 2, 2, -1}: max's gradient 1/2 and 1/3 per tie. */
    gcase c = {"max ties", g_max_all, 1, {2}, {{2, 4}}, 0};
    double x[8] = {1, 3, 3, 0, 2, 2, 2, -1}, g[8];
    double *xs[2] = {x, NULL}, *gs[2] = {g, NULL};
    const char *specs[2] = {"b", "m"};
    dt_layout *l[2] = {NULL, NULL};
    DT_ASSERT_OK(dt_layout_create(m, 2, specs, &l[0]));
    tape_grads(&c, m, l, xs, gs);
    if (rt_here(m)) {
        /* w = 0.5 + 0.25 (e % 5) - 0.1 (e % 3) for e = 0, 1: 0.5 and 0.65 */
        double want[8] = {0, 0.25, 0.25, 0, 0.65 / 3, 0.65 / 3, 0.65 / 3, 0};
        for (int e = 0; e < 8; e++)
            CU_ASSERT_DOUBLE_EQUAL(g[e], want[e], 1e-15);
    }
    dt_layout_destroy(l[0]);
    dt_mesh_destroy(m);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* dt_einsum("ij,jk->ik") on one device against cblas_sgemm on the same host arrays, 512^3:
 * the generic path adds the propagator's cached decision and the output's allocation. The
 * ratio is printed; asserted (>= 0.95) only where timings are trusted (DT_TEST_TIMING=1). */
static void test_einsum_through_the_generic_path_runs_at_sgemm_speed(void)
{
    enum { N = 512 };
    dt_mesh *m = rt_mesh(0);
    if (!rt_here(m)) {
        dt_mesh_destroy(m);
        return;
    }
    float *a = malloc(sizeof(float) * N * N), *b = malloc(sizeof(float) * N * N),
          *c = malloc(sizeof(float) * N * N);
    CU_ASSERT_FATAL(a && b && c);
    for (int i = 0; i < N * N; i++) {
        a[i] = (float)((i * 7) % 5 - 2);
        b[i] = (float)((i * 3) % 7 - 3);
    }
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 2, &rep));
    int64_t sh[2] = {N, N};
    dt_tensor *ta = ot_tensor(rep, DT_DTYPE_F32, sh, a), *tb = ot_tensor(rep, DT_DTYPE_F32, sh, b);
    const dt_tensor *in[2] = {ta, tb};
    double best_e = 1e9, best_g = 1e9;
    for (int rep_i = 0; rep_i < 7; rep_i++) {
        dt_tensor *o = NULL;
        double t0 = now_s();
        DT_ASSERT_OK(dt_einsum("ij,jk->ik", in, 2, &o));
        double t1 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N, 0.0f, c,
                    N);
        double t2 = now_s();
        dt_tensor_destroy(o);
        best_e = t1 - t0 < best_e ? t1 - t0 : best_e;
        best_g = t2 - t1 < best_g ? t2 - t1 : best_g;
    }
    fprintf(stderr,
            "dt_einsum ij,jk->ik 512 on one device: %.3f ms, cblas_sgemm %.3f ms "
            "(ratio %.3f)\n",
            best_e * 1e3, best_g * 1e3, best_g / best_e);
    const char *timing = getenv("DT_TEST_TIMING");
    if (timing && timing[0] == '1')
        CU_ASSERT(best_g / best_e >= 0.95);
    dt_tensor_destroy(ta);
    dt_tensor_destroy(tb);
    dt_layout_destroy(rep);
    dt_mesh_destroy(m);
    free(a);
    free(b);
    free(c);
}

static const dt_test_case cases[] = {
    DT_TEST(test_gradients_match_central_differences_in_f64),
    DT_TEST(test_gradients_on_a_sharded_2x2_mesh_match_one_device),
    DT_TEST(test_max_and_min_gradients_are_split_among_ties),
    DT_TEST(test_einsum_through_the_generic_path_runs_at_sgemm_speed),
    DT_TEST_END,
};

int main(int argc, char **argv)
{
    return dt_test_main(argc, argv, "opdef_reduce_grads", cases, 1);
}
