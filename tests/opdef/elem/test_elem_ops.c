/* The elementwise and random family through the public functions on meshes: every op against
 * a naive reference on host values, with inputs replicated, sharded on either dim of a 2-D
 * mesh and sum-partial; random draws and arange identical on every layout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elem_ref.h"
#include "harness.h"
#include "ops/def_elem.h"
#include "ops/ops_test_util.h"

enum { R = 8, C = 4, N = R * C };

/* Layouts of a rank-2 tensor on the 2-D mesh ("b" x "m"), the last two sum-partial over b. */
enum { NLAY = 7 };
static dt_layout *lay2(const dt_mesh *m, int i)
{
    static const char *s0[NLAY] = {NULL, "b", NULL, "b", "m", NULL, "m"};
    static const char *s1[NLAY] = {NULL, NULL, "m", "m", "b", NULL, NULL};
    return dt_test_layout(m, 2, s0[i], s1[i], i >= 5 ? "b" : NULL);
}

/* Values lo + k / 4 for k in 0..16 (exact through any split of a partial sum): [-2, 2]
 * from lo = -2, [0.5, 4.5] from lo = 0.5. */
static void fill(double *x, int64_t n, int seed, double lo)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (double)((i * 5 + seed * 3) % 17) / 4.0;
}

static dt_tensor *make(const dt_layout *l, dt_dtype t, const int64_t *shape, const double *x,
                       int64_t n)
{
    float *f = malloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)x[i];
    dt_tensor *r = ot_tensor(l, t, shape, t == DT_DTYPE_F32 ? (const void *)f : (const void *)x);
    free(f);
    return r;
}

static double get(const void *p, dt_dtype t, int64_t i)
{
    switch (t) {
    case DT_DTYPE_F32: return ((const float *)p)[i];
    case DT_DTYPE_F64: return ((const double *)p)[i];
    case DT_DTYPE_U8: return ((const uint8_t *)p)[i];
    case DT_DTYPE_I32: return ((const int32_t *)p)[i];
    case DT_DTYPE_I64: return (double)((const int64_t *)p)[i];
    default: return NAN;
    }
}

static int same(double a, double b)
{
    return a == b || (isnan(a) && isnan(b));
}

/* ---- unary ----------------------------------------------------------------------------- */

static dt_status pow25(const dt_tensor *x, dt_tensor **o) { return dt_pow_scalar(x, 2.5, o); }
static dt_status clampf(const dt_tensor *x, dt_tensor **o) { return dt_clamp(x, -0.5, 0.75, o); }
static dt_status adds(const dt_tensor *x, dt_tensor **o) { return dt_add_scalar(x, 1.5, o); }

static const struct {
    const char *name;
    dt_status (*fn)(const dt_tensor *, dt_tensor **);
    double p, q;
} unary[] = {
    {"exp", dt_exp, 0, 0},         {"log", dt_log, 0, 0},
    {"log1p", dt_log1p, 0, 0},     {"sqrt", dt_sqrt, 0, 0},
    {"rsqrt", dt_rsqrt, 0, 0},     {"tanh", dt_tanh, 0, 0},
    {"sigmoid", dt_sigmoid, 0, 0}, {"silu", dt_silu, 0, 0},
    {"neg", dt_neg, 0, 0},         {"abs", dt_abs, 0, 0},
    {"sign", dt_sign, 0, 0},       {"square", dt_square, 0, 0},
    {"reciprocal", dt_reciprocal, 0, 0}, {"pow_scalar", pow25, 2.5, 0},
    {"clamp", clampf, -0.5, 0.75}, {"add_scalar", adds, 1.5, 0},
};

static void test_unary_ops_match_libm_on_every_layout(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C};
    double x[N];
    fill(x, N, 1, -2.0);
    for (int li = 0; li < NLAY; li++) {
        dt_layout *l = lay2(m, li);
        dt_dtype t = li % 2 ? DT_DTYPE_F64 : DT_DTYPE_F32;
        dt_tensor *tx = make(l, t, shape, x, N);
        for (size_t o = 0; o < sizeof unary / sizeof *unary; o++) {
            dt_tensor *y = NULL;
            DT_ASSERT_OK(unary[o].fn(tx, &y));
            CU_ASSERT_EQUAL(dt_tensor_dtype(y), t);
            CU_ASSERT_EQUAL(dt_tensor_rank(y), 2);
            double got[N];
            ot_fetch(y, got);
            int64_t bad = 0;
            for (int i = 0; i < N; i++) {
                double w = ref_unary(unary[o].name, t == DT_DTYPE_F32 ? (double)(float)x[i] : x[i],
                                     unary[o].p, unary[o].q, t == DT_DTYPE_F32);
                if (!same(get(got, t, i), w) && bad++ < 3)
                    fprintf(stderr, "%s layout %d: [%d] %.17g want %.17g\n", unary[o].name, li,
                            i, get(got, t, i), w);
            }
            CU_ASSERT_EQUAL(bad, 0);
            dt_tensor_destroy(y);
        }
        dt_tensor_destroy(tx);
        dt_layout_destroy(l);
    }
    dt_mesh_destroy(m);
}

/* ---- binary ---------------------------------------------------------------------------- */

static dt_status addw(const dt_tensor *a, const dt_tensor *b, dt_tensor **o)
{
    return dt_add(a, b, NULL, o);
}
static dt_status subw(const dt_tensor *a, const dt_tensor *b, dt_tensor **o)
{
    return dt_sub(a, b, NULL, o);
}
static dt_status mulw(const dt_tensor *a, const dt_tensor *b, dt_tensor **o)
{
    return dt_mul(a, b, NULL, o);
}

static const struct {
    const char *name;
    dt_status (*fn)(const dt_tensor *, const dt_tensor *, dt_tensor **);
} binary[] = {
    {"add", addw}, {"sub", subw}, {"mul", mulw}, {"div", dt_div}, {"pow", dt_pow},
    {"maximum", dt_maximum}, {"minimum", dt_minimum}, {"eq", dt_eq}, {"ne", dt_ne},
    {"lt", dt_lt}, {"le", dt_le}, {"gt", dt_gt}, {"ge", dt_ge},
};

/* b's shapes against a [R, C]: a row [C], a column [R, 1], a scalar, the same shape. */
static const struct {
    int rank;
    int64_t shape[2];
    const char *s0, *s1;
} bshape[] = {
    {1, {C, 0}, "m", NULL}, {2, {R, 1}, "b", NULL}, {0, {0, 0}, NULL, NULL},
    {2, {R, C}, NULL, "m"}, {1, {C, 0}, NULL, NULL}, {2, {R, 1}, NULL, NULL},
    {2, {R, C}, "m", NULL},
};

static void test_binary_ops_broadcast_on_every_layout(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C};
    double x[N], y[N];
    fill(x, N, 2, 0.5); /* positive: pow's base */
    fill(y, N, 5, -2.125); /* never 0: a / 0 of a partial a is not linear */
    for (int li = 0; li < NLAY; li++) {
        dt_dtype t = li % 2 ? DT_DTYPE_F32 : DT_DTYPE_F64;
        dt_layout *la = lay2(m, li);
        const int bi = li;
        int rb = bshape[bi].rank;
        dt_layout *lb = NULL;
        const char *specs[2] = {bshape[bi].s0 ? bshape[bi].s0 : DT_UNSHARDED,
                                bshape[bi].s1 ? bshape[bi].s1 : DT_UNSHARDED};
        DT_ASSERT_OK(dt_layout_create(m, rb, specs, &lb));
        int64_t nb = 1;
        for (int d = 0; d < rb; d++)
            nb *= bshape[bi].shape[d];
        dt_tensor *ta = make(la, t, shape, x, N), *tb = make(lb, t, bshape[bi].shape, y, nb);
        for (size_t o = 0; o < sizeof binary / sizeof *binary; o++) {
            dt_tensor *z = NULL;
            DT_ASSERT_OK(binary[o].fn(ta, tb, &z));
            int cmp = o >= 7;
            dt_dtype tz = cmp ? DT_DTYPE_U8 : t;
            CU_ASSERT_EQUAL(dt_tensor_dtype(z), tz);
            CU_ASSERT(dt_tensor_rank(z) == 2 && dt_tensor_shape(z)[0] == R &&
                      dt_tensor_shape(z)[1] == C);
            double got[N];
            ot_fetch(z, got);
            int64_t bad = 0;
            for (int i = 0; i < N; i++) {
                int64_t idx[2] = {i / C, i % C};
                double xv = x[i], yv = y[ref_bidx(2, idx, rb, bshape[bi].shape)];
                if (t == DT_DTYPE_F32) {
                    xv = (float)xv;
                    yv = (float)yv;
                }
                double w = ref_binary(binary[o].name, xv, yv, t == DT_DTYPE_F32);
                if (!same(get(got, tz, i), w) && bad++ < 3)
                    fprintf(stderr, "%s layout %d b %d: [%d] %.17g want %.17g\n",
                            binary[o].name, li, bi, i, get(got, tz, i), w);
            }
            CU_ASSERT_EQUAL(bad, 0);
            /* the operands swapped: b op a broadcasts alike */
            dt_tensor *z2 = NULL;
            DT_ASSERT_OK(binary[o].fn(tb, ta, &z2));
            CU_ASSERT(dt_tensor_rank(z2) == 2);
            dt_tensor_destroy(z2);
            dt_tensor_destroy(z);
        }
        dt_tensor_destroy(ta);
        dt_tensor_destroy(tb);
        dt_layout_destroy(la);
        dt_layout_destroy(lb);
    }
    dt_mesh_destroy(m);
}

static void test_add_of_two_partial_operands_is_exact(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C};
    double x[N], y[N];
    fill(x, N, 3, -2.0);
    fill(y, N, 4, -2.0);
    dt_layout *lp = lay2(m, 5), *lq = lay2(m, 6);
    dt_tensor *a = make(lp, DT_DTYPE_F32, shape, x, N), *b = make(lq, DT_DTYPE_F32, shape, y, N);
    dt_tensor *s = NULL, *d = NULL, *p = NULL;
    DT_ASSERT_OK(dt_add(a, b, NULL, &s));
    DT_ASSERT_OK(dt_sub(a, b, NULL, &d));
    DT_ASSERT_OK(dt_mul(a, b, NULL, &p));
    float gs[N], gd[N], gp[N];
    ot_fetch(s, gs);
    ot_fetch(d, gd);
    ot_fetch(p, gp);
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(gs[i], (float)(x[i] + y[i]));
        CU_ASSERT_EQUAL(gd[i], (float)(x[i] - y[i]));
        CU_ASSERT_EQUAL(gp[i], (float)(x[i] * y[i]));
    }
    dt_tensor_destroy(s);
    dt_tensor_destroy(d);
    dt_tensor_destroy(p);
    dt_tensor_destroy(a);
    dt_tensor_destroy(b);
    dt_layout_destroy(lp);
    dt_layout_destroy(lq);
    dt_mesh_destroy(m);
}

/* ---- where, masked_fill, sum_to -------------------------------------------------------- */

static void test_where_and_masked_fill_match_the_reference_on_every_layout(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C}, col[2] = {R, 1};
    double x[N], y[N], c[R];
    fill(x, N, 6, -2.0);
    fill(y, N, 7, -2.0);
    for (int i = 0; i < R; i++)
        c[i] = i % 3 == 0 ? 0.0 : 1.0;
    uint8_t mask[C] = {1, 0, 0, 1};
    int64_t mshape[1] = {C};
    for (int li = 0; li < NLAY; li++) {
        dt_layout *l = lay2(m, li), *lc = dt_test_layout(m, 2, li % 2 ? "b" : NULL, NULL, NULL);
        dt_layout *lm = dt_test_layout(m, 1, li % 3 ? "m" : NULL, NULL, NULL);
        dt_tensor *ta = make(l, DT_DTYPE_F64, shape, x, N);
        dt_tensor *tb = make(l, DT_DTYPE_F64, shape, y, N);
        dt_tensor *tc = make(lc, DT_DTYPE_F32, col, c, R);
        dt_tensor *tm = ot_tensor(lm, DT_DTYPE_U8, mshape, mask);
        dt_tensor *w = NULL, *f = NULL;
        DT_ASSERT_OK(dt_where(tc, ta, tb, &w));
        DT_ASSERT_OK(dt_masked_fill(ta, tm, -9.0, &f));
        double gw[N], gf[N];
        ot_fetch(w, gw);
        ot_fetch(f, gf);
        int64_t bad = 0;
        for (int i = 0; i < N; i++) {
            bad += gw[i] != (c[i / C] != 0.0 ? x[i] : y[i]);
            bad += gf[i] != (mask[i % C] ? -9.0 : x[i]);
        }
        CU_ASSERT_EQUAL(bad, 0);
        dt_tensor_destroy(w);
        dt_tensor_destroy(f);
        dt_tensor_destroy(ta);
        dt_tensor_destroy(tb);
        dt_tensor_destroy(tc);
        dt_tensor_destroy(tm);
        dt_layout_destroy(l);
        dt_layout_destroy(lc);
        dt_layout_destroy(lm);
    }
    dt_mesh_destroy(m);
}

static void test_sum_to_reduces_sharded_dims_to_a_partial_sum(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C};
    double x[N];
    fill(x, N, 8, -2.0);
    const struct { int rank; int64_t s[2]; } targets[] = {{1, {C, 0}}, {2, {R, 1}}, {0, {0, 0}},
                                                         {2, {1, C}}};
    for (int li = 0; li < NLAY; li++) {
        dt_layout *l = lay2(m, li);
        dt_tensor *g = make(l, DT_DTYPE_F32, shape, x, N);
        for (size_t k = 0; k < sizeof targets / sizeof *targets; k++) {
            dt_tensor *s = NULL;
            DT_ASSERT_OK(dt__sum_to(g, targets[k].rank, targets[k].s, &s));
            double want[N] = {0};
            for (int i = 0; i < N; i++) {
                int64_t idx[2] = {i / C, i % C};
                want[ref_bidx(2, idx, targets[k].rank, targets[k].s)] += x[i];
            }
            float got[N];
            ot_fetch(s, got);
            int64_t n = dt_tensor_numel(s), bad = 0;
            for (int64_t i = 0; i < n; i++)
                bad += got[i] != (float)want[i];
            CU_ASSERT_EQUAL(bad, 0);
            dt_tensor_destroy(s);
        }
        dt_tensor_destroy(g);
        dt_layout_destroy(l);
    }
    dt_mesh_destroy(m);
}

/* ---- random, arange, mse --------------------------------------------------------------- */

static void test_random_draws_are_identical_on_every_layout(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C};
    float ref[3][N];
    for (int li = 0; li < 5; li++) { /* not partial */
        dt_layout *l = lay2(m, li);
        dt_tensor *t[3] = {NULL, NULL, NULL};
        DT_ASSERT_OK(dt_random_uniform(l, shape, DT_DTYPE_F32, -1.0, 1.0, 42, 3, &t[0]));
        DT_ASSERT_OK(dt_random_normal(l, shape, DT_DTYPE_F32, 0.0, 1.0, 42, 3, &t[1]));
        DT_ASSERT_OK(dt_random_bernoulli(l, shape, DT_DTYPE_F32, 0.5, 42, 3, &t[2]));
        for (int k = 0; k < 3; k++) {
            CU_ASSERT(dt_layout_equal(dt_tensor_layout(t[k]), l));
            float got[N];
            ot_fetch(t[k], got);
            if (li == 0)
                memcpy(ref[k], got, sizeof got);
            else
                CU_ASSERT(memcmp(got, ref[k], sizeof got) == 0);
            dt_tensor_destroy(t[k]);
        }
        dt_layout_destroy(l);
    }
    /* a mesh of one device (one process: the others hold none of it) draws the same bits */
    if (dt_num_clients() == 1) {
        const char *dn[1] = {"one"};
        int64_t ds[1] = {1};
        dt_mesh *m1 = NULL;
        DT_ASSERT_OK(dt_mesh_create("single", 1, dn, ds, dt_test_device_type(), &m1));
        dt_layout *l1 = NULL;
        DT_ASSERT_OK(dt_layout_replicated(m1, 2, &l1));
        dt_tensor *t1 = NULL;
        DT_ASSERT_OK(dt_random_normal(l1, shape, DT_DTYPE_F32, 0.0, 1.0, 42, 3, &t1));
        float g1[N];
        ot_fetch(t1, g1);
        CU_ASSERT(memcmp(g1, ref[1], sizeof g1) == 0);
        dt_tensor_destroy(t1);
        dt_layout_destroy(l1);
        dt_mesh_destroy(m1);
    }
    /* another seed or stream draws another tensor */
    dt_layout *l = lay2(m, 3);
    dt_tensor *u = NULL;
    float got[N];
    DT_ASSERT_OK(dt_random_uniform(l, shape, DT_DTYPE_F32, -1.0, 1.0, 42, 4, &u));
    ot_fetch(u, got);
    CU_ASSERT(memcmp(got, ref[0], sizeof got) != 0);
    dt_tensor_destroy(u);
    /* moments of a larger sharded draw */
    int64_t big[2] = {64, 128};
    dt_tensor *z = NULL;
    DT_ASSERT_OK(dt_random_normal(l, big, DT_DTYPE_F64, 1.0, 2.0, 7, 0, &z));
    double *v = malloc(64 * 128 * sizeof *v), s = 0, s2 = 0;
    ot_fetch(z, v);
    for (int i = 0; i < 64 * 128; i++) {
        s += v[i];
        s2 += v[i] * v[i];
    }
    double mean = s / 8192, var = s2 / 8192 - mean * mean;
    CU_ASSERT(fabs(mean - 1.0) < 5 * 2.0 / sqrt(8192.0));
    CU_ASSERT(fabs(var - 4.0) < 0.4);
    free(v);
    dt_tensor_destroy(z);
    /* errors: a partial layout, a bad range */
    dt_layout *lp = lay2(m, 5);
    DT_ASSERT_FAILS(dt_random_uniform(lp, shape, DT_DTYPE_F32, 0, 1, 1, 0, &u),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_random_uniform(l, shape, DT_DTYPE_F32, 1, 0, 1, 0, &u),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_random_bernoulli(l, shape, DT_DTYPE_F32, 1.5, 1, 0, &u),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_random_normal(l, shape, DT_DTYPE_I32, 0, 1, 1, 0, &u), DT_ERR_SHAPE);
    dt_layout_destroy(lp);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

static void test_arange_counts_the_global_index_on_a_sharded_layout(void)
{
    dt_mesh *m = ot_mesh_1d();
    int64_t n = 4 * dt_test_num_devices();
    dt_layout *l = dt_test_layout(m, 1, "x", NULL, NULL);
    dt_tensor *a = NULL, *f = NULL;
    DT_ASSERT_OK(dt_arange(l, n, DT_DTYPE_I64, &a));
    DT_ASSERT_OK(dt_arange(l, n, DT_DTYPE_F32, &f));
    int64_t *gi = malloc((size_t)n * sizeof *gi);
    float *gf = malloc((size_t)n * sizeof *gf);
    ot_fetch(a, gi);
    ot_fetch(f, gf);
    for (int64_t i = 0; i < n; i++)
        CU_ASSERT(gi[i] == i && gf[i] == (float)i);
    free(gi);
    free(gf);
    dt_tensor_destroy(a);
    dt_tensor_destroy(f);
    DT_ASSERT_FAILS(dt_arange(l, -1, DT_DTYPE_I64, &a), DT_ERR_INVALID_ARGUMENT);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

static void test_mse_is_the_mean_square_on_every_layout(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C};
    double x[N], y[N], want = 0;
    fill(x, N, 9, -2.0);
    fill(y, N, 10, -2.0);
    for (int i = 0; i < N; i++)
        want += (x[i] - y[i]) * (x[i] - y[i]);
    want /= N; /* exact: multiples of 1/64 over a power of two */
    for (int li = 0; li < NLAY; li++) {
        dt_layout *l = lay2(m, li), *l2 = lay2(m, (li + 3) % NLAY);
        dt_tensor *p = make(l, DT_DTYPE_F32, shape, x, N), *t = make(l2, DT_DTYPE_F32, shape, y, N);
        dt_tensor *e = NULL;
        DT_ASSERT_OK(dt_mse(p, t, &e));
        CU_ASSERT_EQUAL(dt_tensor_rank(e), 0);
        float got;
        ot_fetch(e, &got);
        CU_ASSERT_EQUAL(got, (float)want);
        dt_tensor_destroy(e);
        dt_tensor_destroy(p);
        dt_tensor_destroy(t);
        dt_layout_destroy(l);
        dt_layout_destroy(l2);
    }
    dt_mesh_destroy(m);
}

/* ---- errors ------------------------------------------------------------------------------ */

static void test_bad_operands_fail_with_a_message_naming_the_op(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t s1[2] = {R, C}, s2[2] = {C, R};
    double z[N] = {0};
    dt_layout *l = lay2(m, 0);
    dt_tensor *a = make(l, DT_DTYPE_F32, s1, z, N), *b = make(l, DT_DTYPE_F32, s2, z, N);
    dt_tensor *d = make(l, DT_DTYPE_F64, s1, z, N), *o = NULL;
    DT_ASSERT_FAILS(dt_div(a, b, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("div");
    DT_ASSERT_ERROR_MENTIONS("[8,4]");
    DT_ASSERT_FAILS(dt_add(a, b, NULL, &o), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_maximum(a, d, &o), DT_ERR_SHAPE); /* f32 against f64 */
    DT_ASSERT_ERROR_MENTIONS("maximum");
    DT_ASSERT_FAILS(dt_where(a, a, d, &o), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_masked_fill(a, b, 0.0, &o), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_mse(a, b, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("mse");
    DT_ASSERT_FAILS(dt_clamp(a, 1.0, -1.0, &o), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(o);
    dt_tensor_destroy(a);
    dt_tensor_destroy(b);
    dt_tensor_destroy(d);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_unary_ops_match_libm_on_every_layout),
        DT_TEST(test_binary_ops_broadcast_on_every_layout),
        DT_TEST(test_add_of_two_partial_operands_is_exact),
        DT_TEST(test_where_and_masked_fill_match_the_reference_on_every_layout),
        DT_TEST(test_sum_to_reduces_sharded_dims_to_a_partial_sum),
        DT_TEST(test_random_draws_are_identical_on_every_layout),
        DT_TEST(test_arange_counts_the_global_index_on_a_sharded_layout),
        DT_TEST(test_mse_is_the_mean_square_on_every_layout),
        DT_TEST(test_bad_operands_fail_with_a_message_naming_the_op),
        DT_TEST_END};
    return dt_test_main_device(argc, argv, "opdef_elem_ops", cases);
}
