/* ops/vmath.c against libm in f64: exp and tanh within their stated ulp bounds over a sweep
 * of f32 bit patterns covering the whole range (and every pattern of the intervals where the
 * formulas switch), special values, GELU and its gradient, the exp sums; every path (AVX2,
 * portable) and every tail length gives the same bits. No runtime. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ops/ops_impl.h"

enum { CHUNK = 4096 };
#define EXP_ULP 2.0
#define TANH_ULP 2.0

static float from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* Error of y against the exact ref in units of the f32 ulp at ref (subnormal ulp below). */
static double ulp_err(float y, double ref)
{
    if (isinf(ref) || fabs(ref) > FLT_MAX)
        return isinf(y) && (y > 0) == (ref > 0) ? 0.0 : INFINITY;
    if (isnan(y) || isinf(y))
        return INFINITY;
    int e = fabs(ref) < FLT_MIN ? -126 : ilogb(ref);
    return fabs((double)y - ref) / ldexp(1.0, e - 23);
}

typedef void (*vfun)(int64_t, const float *, float *);

/* Worst ulp error of f against ref over the patterns lo, lo + step, ... <= hi (positive
 * patterns, then the same with the sign bit); x_worst_out gets where. */
static double sweep(vfun f, double (*ref)(double), uint32_t lo, uint32_t hi, uint32_t step,
                    float *x_worst_out)
{
    static float x[CHUNK], y[CHUNK];
    double worst = 0.0;
    for (int sign = 0; sign < 2; sign++) {
        uint64_t b = lo;
        while (b <= hi) {
            int n = 0;
            for (; n < CHUNK && b <= hi; n++, b += step)
                x[n] = from_bits((uint32_t)b | (sign ? 0x80000000u : 0));
            f(n, x, y);
            for (int i = 0; i < n; i++) {
                double e = ulp_err(y[i], ref((double)x[i]));
                if (e > worst) {
                    worst = e;
                    *x_worst_out = x[i];
                }
            }
        }
    }
    return worst;
}

static void check_sweep(const char *what, vfun f, double (*ref)(double), uint32_t lo,
                        uint32_t hi, uint32_t step, double bound)
{
    float xw = 0.0f;
    double worst = sweep(f, ref, lo, hi, step, &xw);
    if (worst > bound)
        fprintf(stderr, "%s: %.3f ulp at x = %a\n", what, worst, (double)xw);
    CU_ASSERT(worst <= bound);
}

static void test_vexp_is_within_2_ulp_of_libm_over_the_f32_range(void)
{
    /* |x| from 2^-30 (exp rounds to 1 below) to 110 (0 or inf beyond), every 37th pattern. */
    check_sweep("exp", dt__vexp, exp, to_bits(0x1p-30f), to_bits(110.0f), 37, EXP_ULP);
    /* Every pattern where results turn subnormal, and near the overflow edge. */
    check_sweep("exp subnormal", dt__vexp, exp, to_bits(86.0f), to_bits(89.0f), 1, EXP_ULP);
    check_sweep("exp small", dt__vexp, exp, 0, to_bits(0x1p-30f), 4099, EXP_ULP);
}

static void test_vtanh_is_within_2_ulp_of_libm_over_the_f32_range(void)
{
    /* Subnormals up to 12 (tanh rounds to 1 from 9.01), every 29th pattern. */
    check_sweep("tanh", dt__vtanh, tanh, 1, to_bits(12.0f), 29, TANH_ULP);
    /* Every pattern around the switch from polynomial to exp form at 0.625. */
    check_sweep("tanh switch", dt__vtanh, tanh, to_bits(0.5f), to_bits(0.75f), 1, TANH_ULP);
    check_sweep("tanh big", dt__vtanh, tanh, to_bits(12.0f), 0x7f7fffffu, 9973, TANH_ULP);
}

static void test_vexp_and_vtanh_special_values(void)
{
    float x[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.8f, -110.0f, FLT_MAX, -FLT_MAX,
                 FLT_TRUE_MIN};
    enum { N = sizeof x / sizeof x[0] };
    float e[N], t[N];
    dt__vexp(N, x, e);
    dt__vtanh(N, x, t);
    CU_ASSERT_EQUAL(e[0], 1.0f);
    CU_ASSERT_EQUAL(e[1], 1.0f);
    CU_ASSERT(isinf(e[2]) && e[2] > 0);
    CU_ASSERT_EQUAL(to_bits(e[3]), 0u);
    CU_ASSERT(isnan(e[4]));
    CU_ASSERT(isinf(e[5]));
    CU_ASSERT_EQUAL(to_bits(e[6]), 0u);
    CU_ASSERT(isinf(e[7]));
    CU_ASSERT_EQUAL(to_bits(e[8]), 0u);
    CU_ASSERT_EQUAL(e[9], 1.0f);
    CU_ASSERT_EQUAL(to_bits(t[0]), to_bits(0.0f));
    CU_ASSERT_EQUAL(to_bits(t[1]), to_bits(-0.0f));
    CU_ASSERT_EQUAL(t[2], 1.0f);
    CU_ASSERT_EQUAL(t[3], -1.0f);
    CU_ASSERT(isnan(t[4]));
    CU_ASSERT_EQUAL(t[7], 1.0f);
    CU_ASSERT_EQUAL(t[8], -1.0f);
    CU_ASSERT_EQUAL(t[9], FLT_TRUE_MIN);
}

static double gelu_ref(double v)
{
    return 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
}

static double gelu_grad_ref(double v)
{
    double c = sqrt(2 / M_PI), t = tanh(c * (v + 0.044715 * v * v * v));
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v);
}

/* GELU's f32 formula loses what tanh's error is worth next to 1 where tanh nears -1 (x below
 * about -2): bounded by a few ulp of the result plus |x| times tanh's bound at 1. */
static void test_vgelu_and_its_gradient_match_the_f64_formula(void)
{
    enum { N = 20001 };
    static float x[N], y[N], dy[N], dx[N];
    for (int i = 0; i < N; i++) {
        x[i] = -12.0f + 24.0f * (float)i / (N - 1);
        dy[i] = 1.0f - 0.5f * (float)(i % 3);
    }
    dt__vgelu(N, x, y);
    dt__vgelu_grad(N, x, dy, dx);
    double slack = TANH_ULP * FLT_EPSILON / 2;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        double want = gelu_ref(x[i]), g = gelu_grad_ref(x[i]) * dy[i];
        double tol = 8 * FLT_EPSILON * fabs(want) + slack * fabs(x[i]) + FLT_MIN;
        /* The gradient's terms reach about 1.2 in size before they cancel. */
        double gtol = 16 * FLT_EPSILON * (1.0 + fabs(x[i]) * fabs(x[i])) * fabs(dy[i]);
        if (!(fabs(y[i] - want) <= tol) || !(fabs(dx[i] - g) <= gtol)) {
            if (bad++ < 5)
                fprintf(stderr, "gelu x=%a: %a vs %a, grad %a vs %a\n", (double)x[i],
                        (double)y[i], want, (double)dx[i], g);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* The same bits whatever the tail length, alignment or instruction set. */
static void test_vmath_gives_the_same_bits_on_every_path(void)
{
    enum { N = 203 };
    static float x[N + 8], ref[4][N], out[N];
    for (int i = 0; i < N + 8; i++)
        x[i] = (float)(sin(i * 0.731) * 9.0);
    dt__vmath_tune(1);
    dt__vexp(N, x, ref[0]);
    dt__vtanh(N, x, ref[1]);
    dt__vgelu(N, x, ref[2]);
    dt__vgelu_grad(N, x, x + 3, ref[3]);
    double sum_ref = dt__vexp_sum(N, x, 1.5f, NULL);
    for (int isa = 1; isa >= 0; isa--) {
        dt__vmath_tune(isa);
        for (int n = 1; n <= N; n += (n < 20 ? 1 : 37)) {
            for (int off = 0; off + n <= N; off += (n < 20 ? 5 : 41)) {
                dt__vexp(n, x + off, out);
                CU_ASSERT(memcmp(out, ref[0] + off, (size_t)n * 4) == 0);
                dt__vtanh(n, x + off, out);
                CU_ASSERT(memcmp(out, ref[1] + off, (size_t)n * 4) == 0);
                dt__vgelu(n, x + off, out);
                CU_ASSERT(memcmp(out, ref[2] + off, (size_t)n * 4) == 0);
                dt__vgelu_grad(n, x + off, x + off + 3, out);
                CU_ASSERT(memcmp(out, ref[3] + off, (size_t)n * 4) == 0);
            }
        }
        /* In place. */
        memcpy(out, x, sizeof out);
        dt__vexp(N, out, out);
        CU_ASSERT(memcmp(out, ref[0], sizeof out) == 0);
        CU_ASSERT_EQUAL(dt__vexp_sum(N, x, 1.5f, NULL), sum_ref);
    }
    dt__vmath_tune(1);
}

/* dt__vexp_sum: the f32 exps of x - shift it stores, and their sum, against f64 libm. */
static void test_vexp_sum_and_scale_match_libm(void)
{
    enum { N = 1003 };
    static float x[N], y[N], z[N];
    double want = 0.0;
    for (int i = 0; i < N; i++) {
        x[i] = (float)(cos(i * 0.37) * 20.0);
        want += exp((double)(x[i] - 20.0f));
    }
    for (int n = 1; n <= 9; n++) { /* short rows: the padding adds nothing */
        double w = 0.0;
        for (int i = 0; i < n; i++)
            w += exp((double)(x[i] - 20.0f));
        CU_ASSERT(fabs(dt__vexp_sum(n, x, 20.0f, NULL) - w) <= 4 * FLT_EPSILON * w);
    }
    double s = dt__vexp_sum(N, x, 20.0f, y);
    CU_ASSERT(fabs(s - want) <= 4 * FLT_EPSILON * want);
    double acc = 0.0;
    for (int i = 0; i < N; i++) {
        CU_ASSERT(ulp_err(y[i], exp((double)(x[i] - 20.0f))) <= EXP_ULP);
        acc += y[i];
    }
    CU_ASSERT(fabs(acc - s) <= 1e-12 * s);
    dt__vexp_scale(N, x, 20.0f, 0.5f, 3.0f, z);
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(z[i], (y[i] * 0.5f) * 3.0f);
}

/* dt__vdot against the f64 dot within n eps of the sum of |a b|; dt__vaxpy exactly as the
 * scalar loop; both the same bits on every path and tail length. */
static void test_vdot_and_vaxpy_match_references_on_every_path(void)
{
    enum { N = 77 };
    static float a[N], b[N], y[N], y2[N], ref_dot[N + 1];
    for (int i = 0; i < N; i++) {
        a[i] = (float)sin(i * 1.3);
        b[i] = (float)cos(i * 0.7) * 3.0f;
    }
    dt__vmath_tune(1);
    for (int n = 0; n <= N; n++)
        ref_dot[n] = dt__vdot(n, a, b);
    for (int isa = 1; isa >= 0; isa--) {
        dt__vmath_tune(isa);
        for (int n = 0; n <= N; n++) {
            double want = 0.0, mag = 0.0;
            for (int i = 0; i < n; i++) {
                want += (double)a[i] * b[i];
                mag += fabs((double)a[i] * b[i]);
            }
            float d = dt__vdot(n, a, b);
            CU_ASSERT(fabs(d - want) <= n * FLT_EPSILON * mag);
            CU_ASSERT_EQUAL(to_bits(d), to_bits(ref_dot[n]));
            memcpy(y, b, sizeof y);
            memcpy(y2, b, sizeof y2);
            dt__vaxpy(n, 0.37f, a, y);
            for (int i = 0; i < n; i++)
                y2[i] += 0.37f * a[i];
            CU_ASSERT(memcmp(y, y2, sizeof y) == 0);
        }
    }
    dt__vmath_tune(1);
}

/* dt_kernel_adam (vectorised groups of 8, scalar tail) against PyTorch's Adam/AdamW update
 * written here element by element in f32, bit for bit, on both paths, every tail length. */
static void adam_reference(int64_t n, const dt_adam_opts *o, int64_t step, float *p,
                           const float *g, float *m, float *v)
{
    double bc1 = 1.0 - pow((double)o->beta1, (double)step);
    double bc2 = 1.0 - pow((double)o->beta2, (double)step);
    float step_size = (float)(o->lr / bc1), ib = (float)(1.0 / sqrt(bc2));
    for (int64_t i = 0; i < n; i++) {
        float w = p[i];
        float gi = o->grad_scale * g[i] + (o->decoupled ? 0.0f : o->weight_decay) * w;
        m[i] = o->beta1 * m[i] + (1.0f - o->beta1) * gi;
        v[i] = o->beta2 * v[i] + (1.0f - o->beta2) * gi * gi;
        if (o->decoupled)
            w *= 1.0f - o->lr * o->weight_decay;
        p[i] = w - step_size * m[i] / (sqrtf(v[i]) * ib + o->eps);
    }
}

static void test_adam_kernel_matches_the_scalar_update_on_every_path(void)
{
    enum { N = 45 };
    static float p0[N], g[N], m0[N], v0[N], p[2][N], m[2][N], v[2][N];
    for (int i = 0; i < N; i++) {
        p0[i] = (float)sin(i * 0.9);
        g[i] = (float)cos(i * 1.7) * 0.01f * (float)(i % 5);
        m0[i] = (float)sin(i * 0.3) * 1e-3f;
        v0[i] = (float)(i % 7) * 1e-6f;
    }
    dt_adam_opts opts[2] = {DT_ADAM_OPTS_INIT, DT_ADAMW_OPTS_INIT};
    opts[0].weight_decay = 0.05f;
    opts[1].grad_scale = 0.5f;
    int bad = 0;
    for (int isa = 1; isa >= 0; isa--) {
        dt__vmath_tune(isa);
        for (int k = 0; k < 2; k++)
            for (int n = 0; n <= N; n++) {
                for (int s = 0; s < 2; s++) {
                    memcpy(p[s], p0, sizeof p0);
                    memcpy(m[s], m0, sizeof m0);
                    memcpy(v[s], v0, sizeof v0);
                }
                for (int64_t step = 1; step <= 3; step++) {
                    CU_ASSERT_EQUAL(dt_kernel_adam(n, &opts[k], step, p[0], g, m[0], v[0]),
                                    DT_OK);
                    adam_reference(n, &opts[k], step, p[1], g, m[1], v[1]);
                }
                bad += memcmp(p[0], p[1], sizeof p0) != 0 || memcmp(m[0], m[1], sizeof m0) != 0 ||
                       memcmp(v[0], v[1], sizeof v0) != 0;
            }
    }
    dt__vmath_tune(1);
    CU_ASSERT_EQUAL(bad, 0);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_vexp_is_within_2_ulp_of_libm_over_the_f32_range),
        DT_TEST(test_vtanh_is_within_2_ulp_of_libm_over_the_f32_range),
        DT_TEST(test_vexp_and_vtanh_special_values),
        DT_TEST(test_vgelu_and_its_gradient_match_the_f64_formula),
        DT_TEST(test_vmath_gives_the_same_bits_on_every_path),
        DT_TEST(test_vexp_sum_and_scale_match_libm),
        DT_TEST(test_vdot_and_vaxpy_match_references_on_every_path),
        DT_TEST(test_adam_kernel_matches_the_scalar_update_on_every_path),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "vmath", cases, 0);
}
