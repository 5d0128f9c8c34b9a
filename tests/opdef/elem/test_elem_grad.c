/* Gradients of the elementwise family through a dt_tape against central finite differences
 * in f64 (inputs replicated: one device's arithmetic), and the same gradients from inputs
 * sharded over the mesh dim b. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ops/def_elem.h"
#include "ops/ops_test_util.h"

enum { MAXN = 12 };

typedef dt_status (*fwd_fn)(const dt_tensor *const *in, dt_tensor **out);

typedef struct gcase {
    const char *name;
    fwd_fn fn;
    int nin;
    int rank[3];
    int64_t shape[3][2];
    dt_dtype dtype[3];
    int needs[3]; /* differentiable inputs */
    double vals[3][MAXN];
} gcase;

static int64_t numel(const gcase *c, int k)
{
    int64_t n = 1;
    for (int d = 0; d < c->rank[k]; d++)
        n *= c->shape[k][d];
    return n;
}

static dt_tensor *make(const dt_mesh *m, const char *spec, const gcase *c, int k,
                       const double *v)
{
    dt_layout *l = NULL;
    const char *specs[2] = {DT_UNSHARDED, DT_UNSHARDED};
    if (spec && c->rank[k] > 0 && c->shape[k][0] % 2 == 0)
        specs[0] = spec;
    DT_ASSERT_OK(dt_layout_create(m, c->rank[k], specs, &l));
    uint8_t u[MAXN];
    for (int64_t i = 0; i < numel(c, k); i++)
        u[i] = (uint8_t)v[i];
    dt_tensor *t = ot_tensor(l, c->dtype[k], c->shape[k],
                             c->dtype[k] == DT_DTYPE_U8 ? (const void *)u : (const void *)v);
    dt_layout_destroy(l);
    return t;
}

/* sum(out * w) of the forward on the given input values (w: the output's fixed weights). */
static double loss(const dt_mesh *m, const gcase *c, double (*v)[MAXN], const double *w)
{
    dt_tensor *in[3] = {NULL, NULL, NULL}, *y = NULL;
    for (int k = 0; k < c->nin; k++)
        in[k] = make(m, NULL, c, k, v[k]);
    DT_ASSERT_OK(c->fn((const dt_tensor *const *)in, &y));
    int64_t n = dt_tensor_numel(y);
    double *got = malloc((size_t)n * sizeof *got), s = 0;
    ot_fetch(y, got);
    for (int64_t i = 0; i < n; i++)
        s += got[i] * w[i];
    free(got);
    dt_tensor_destroy(y);
    for (int k = 0; k < c->nin; k++)
        dt_tensor_destroy(in[k]);
    return s;
}

/* The tape's gradients of sum(out * w) into g[k] (inputs laid out by spec on dim 0). */
static void tape_grads(const dt_mesh *m, const char *spec, const gcase *c, const double *w,
                       double (*g)[MAXN])
{
    dt_tensor *in[3] = {NULL, NULL, NULL}, *y = NULL, *tw = NULL;
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    for (int k = 0; k < c->nin; k++) {
        in[k] = make(m, spec, c, k, c->vals[k]);
        if (c->needs[k])
            DT_ASSERT_OK(dt_tape_watch(tape, in[k], k));
    }
    DT_ASSERT_OK(dt_tape_begin(tape));
    DT_ASSERT_OK(c->fn((const dt_tensor *const *)in, &y));
    DT_ASSERT_OK(dt_tape_end(tape));
    int ry = dt_tensor_rank(y);
    if (ry == 0) {
        DT_ASSERT_OK(dt_tape_backward(tape, y, NULL, (float)w[0], NULL));
    } else {
        dt_layout *l = NULL;
        DT_ASSERT_OK(dt_layout_replicated(m, ry, &l));
        tw = ot_tensor(l, DT_DTYPE_F64, dt_tensor_shape(y), w);
        dt_layout_destroy(l);
        DT_ASSERT_OK(dt_tape_backward(tape, y, tw, 1.0f, NULL));
    }
    for (int k = 0; k < c->nin; k++) {
        if (!c->needs[k])
            continue;
        const dt_tensor *gk = NULL;
        DT_ASSERT_OK(dt_tape_grad(tape, k, &gk));
        CU_ASSERT_PTR_NOT_NULL_FATAL(gk);
        CU_ASSERT_EQUAL(dt_tensor_numel(gk), numel(c, k));
        CU_ASSERT_EQUAL(dt_tensor_rank(gk), c->rank[k]);
        if (dt_tensor_dtype(gk) == DT_DTYPE_F64) {
            ot_fetch(gk, g[k]);
        } else {
            float f[MAXN];
            ot_fetch(gk, f);
            for (int64_t i = 0; i < numel(c, k); i++)
                g[k][i] = f[i];
        }
    }
    dt_tensor_destroy(tw);
    dt_tensor_destroy(y);
    for (int k = 0; k < c->nin; k++)
        dt_tensor_destroy(in[k]);
    dt_tape_destroy(tape);
}

static void check_case(const dt_mesh *m, const gcase *c)
{
    double w[MAXN];
    for (int i = 0; i < MAXN; i++)
        w[i] = 0.5 + 0.1 * i * (i % 2 ? -1 : 1); /* w[0] exact: a scalar seed */
    double g[3][MAXN], gs[3][MAXN];
    tape_grads(m, NULL, c, w, g);
    const double h = 1e-6;
    for (int k = 0; k < c->nin; k++) {
        if (!c->needs[k])
            continue;
        for (int64_t i = 0; i < numel(c, k); i++) {
            double v[3][MAXN];
            memcpy(v, c->vals, sizeof v);
            v[k][i] = c->vals[k][i] + h;
            double lp = loss(m, c, v, w);
            v[k][i] = c->vals[k][i] - h;
            double lm = loss(m, c, v, w);
            double fd = (lp - lm) / (2 * h);
            if (!(fabs(fd - g[k][i]) <= 1e-6 * (1 + fabs(fd))))
                fprintf(stderr, "%s: d input %d [%lld]: tape %.12g, finite differences %.12g\n",
                        c->name, k, (long long)i, g[k][i], fd);
            CU_ASSERT(fabs(fd - g[k][i]) <= 1e-6 * (1 + fabs(fd)));
        }
    }
    /* the inputs sharded on their first dim: the same gradients */
    tape_grads(m, "b", c, w, gs);
    for (int k = 0; k < c->nin; k++)
        for (int64_t i = 0; c->needs[k] && i < numel(c, k); i++)
            CU_ASSERT(fabs(gs[k][i] - g[k][i]) <= 1e-12 * (1 + fabs(g[k][i])));
}

/* ---- the cases ------------------------------------------------------------------------- */

#define U1(N, CALL)                                                                         \
    static dt_status f_##N(const dt_tensor *const *in, dt_tensor **out)                    \
    {                                                                                       \
        return CALL;                                                                        \
    }
U1(exp, dt_exp(in[0], out))
U1(log, dt_log(in[0], out))
U1(log1p, dt_log1p(in[0], out))
U1(sqrt, dt_sqrt(in[0], out))
U1(rsqrt, dt_rsqrt(in[0], out))
U1(tanh, dt_tanh(in[0], out))
U1(sigmoid, dt_sigmoid(in[0], out))
U1(silu, dt_silu(in[0], out))
U1(neg, dt_neg(in[0], out))
U1(abs, dt_abs(in[0], out))
U1(sign, dt_sign(in[0], out))
U1(square, dt_square(in[0], out))
U1(reciprocal, dt_reciprocal(in[0], out))
U1(pow_scalar, dt_pow_scalar(in[0], 2.5, out))
U1(clamp, dt_clamp(in[0], -0.5, 0.75, out))
U1(add_scalar, dt_add_scalar(in[0], 1.5, out))
U1(add, dt_add(in[0], in[1], NULL, out))
U1(sub, dt_sub(in[0], in[1], NULL, out))
U1(mul, dt_mul(in[0], in[1], NULL, out))
U1(div, dt_div(in[0], in[1], out))
U1(pow, dt_pow(in[0], in[1], out))
U1(maximum, dt_maximum(in[0], in[1], out))
U1(minimum, dt_minimum(in[0], in[1], out))
U1(where, dt_where(in[0], in[1], in[2], out))
U1(masked_fill, dt_masked_fill(in[0], in[1], 2.0, out))
U1(mse, dt_mse(in[0], in[1], out))
/* x used twice: the tape sums the two f64 contributions with dt_add */
U1(mul_self, dt_mul(in[0], in[0], NULL, out))

#define F64 DT_DTYPE_F64
#define POS {0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6}
#define MIX                                                                                 \
    {-0.935, -0.765, -0.595, -0.425, -0.255, -0.085, 0.085, 0.255, 0.425, 0.595, 0.765, 0.935}
#define ROW {0.1, -0.3, 0.5}
#define COL {0.1, -0.3, 0.5, 0.2}
#define DROW {0.8, -1.2, 1.5}
#define DCOL {0.8, -1.2, 1.5, 0.9}
#define PROW {0.5, 1.5, -0.7}
#define PCOL {0.5, 1.5, -0.7, 2.0}
#define UN(N, V) {#N, f_##N, 1, {2}, {{4, 3}}, {F64}, {1}, {V}}
/* a [4, 3] against b [3] (a row), b [4, 1] (a column) */
#define BR(N, VA, VB) {#N, f_##N, 2, {2, 1}, {{4, 3}, {3}}, {F64, F64}, {1, 1}, {VA, VB}}
#define BC(N, VA, VB) {#N, f_##N, 2, {2, 2}, {{4, 3}, {4, 1}}, {F64, F64}, {1, 1}, {VA, VB}}

static const gcase cases[] = {
    UN(exp, MIX), UN(log, POS), UN(log1p, POS), UN(sqrt, POS), UN(rsqrt, POS), UN(tanh, MIX),
    UN(sigmoid, MIX), UN(silu, MIX), UN(neg, MIX), UN(abs, MIX), UN(sign, MIX),
    UN(square, MIX), UN(reciprocal, POS), UN(pow_scalar, POS), UN(clamp, MIX),
    UN(add_scalar, MIX), UN(mul_self, MIX),
    BR(add, MIX, ROW), BC(add, MIX, COL), BR(sub, MIX, ROW), BC(sub, MIX, COL),
    BR(mul, MIX, ROW), BC(mul, MIX, COL), BR(div, MIX, DROW), BC(div, MIX, DCOL),
    BR(pow, POS, PROW), BC(pow, POS, PCOL), BR(maximum, MIX, ROW), BC(maximum, MIX, COL),
    BR(minimum, MIX, ROW), BC(minimum, MIX, COL),
    {"where", f_where, 3, {2, 2, 1}, {{4, 1}, {4, 3}, {3}}, {DT_DTYPE_U8, F64, F64}, {0, 1, 1},
     {{1, 0, 0, 1}, MIX, ROW}},
    {"masked_fill", f_masked_fill, 2, {2, 1}, {{4, 3}, {3}}, {F64, DT_DTYPE_U8}, {1, 0},
     {MIX, {0, 1, 0}}},
    {"mse", f_mse, 2, {2, 2}, {{4, 3}, {4, 3}}, {F64, F64}, {1, 1}, {MIX, POS}},
};

static void test_gradients_match_finite_differences_in_f64(void)
{
    dt_mesh *m = ot_mesh_2d();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_case(m, &cases[i]);
    dt_mesh_destroy(m);
}

static void test_comparisons_and_random_have_no_gradient(void)
{
    int n = 0;
    for (int i = 0; dt__defs_elem[i]; i++) {
        const dt_op_def *d = dt__defs_elem[i];
        if (!strcmp(d->family, "comparison") || !strcmp(d->family, "random")) {
            CU_ASSERT_PTR_NULL(d->backward);
            n++;
        } else {
            CU_ASSERT_PTR_NOT_NULL(d->backward);
        }
    }
    CU_ASSERT_EQUAL(n, 10);
}

int main(int argc, char **argv)
{
    static const dt_test_case tcases[] = {
        DT_TEST(test_gradients_match_finite_differences_in_f64),
        DT_TEST(test_comparisons_and_random_have_no_gradient),
        DT_TEST_END};
    return dt_test_main(argc, argv, "opdef_elem_grad", tcases, 1);
}
