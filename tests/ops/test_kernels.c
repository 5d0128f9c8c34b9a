/* Local kernels against brute-force references: GEMM (transposes, strides, f16/bf16 operands,
 * several contraction blocks), elementwise, activations and softmax cross-entropy with
 * finite-difference gradients, reductions, inf/NaN detection, casts (special values and a
 * sweep against a reference rounding in f64), and hand-worked optimizer steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static uint64_t rng_state = 1;
static uint64_t rnd(void)
{
    rng_state += 0x9e3779b97f4a7c15ull;
    uint64_t z = rng_state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rnd_int(int lo, int hi)
{
    return (float)(lo + (int)(rnd() % (uint64_t)(hi - lo + 1)));
}

static float rnd_real(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rnd() >> 11) / 9007199254740992.0);
}

/* ---- reference half formats (independent of the library) ---- */

/* Decodes f16 (ebits 5, mbits 10) or bf16 (ebits 8, mbits 7) bits to double. */
static double decode(uint16_t h, int ebits, int mbits)
{
    int bias = (1 << (ebits - 1)) - 1;
    int sign = h >> 15, e = (h >> mbits) & ((1 << ebits) - 1), man = h & ((1 << mbits) - 1);
    double v;
    if (e == (1 << ebits) - 1)
        v = man ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(man, 1 - bias - mbits);
    else
        v = ldexp(man + (1 << mbits), e - bias - mbits);
    return sign ? -v : v;
}

/* Rounds a finite double to the nearest even value of the format (inf beyond its range). */
static double round_to(double v, int ebits, int mbits)
{
    int bias = (1 << (ebits - 1)) - 1;
    if (v == 0)
        return v;
    int e;
    frexp(fabs(v), &e);        /* |v| in [2^(e-1), 2^e) */
    e -= 1;
    if (e < 1 - bias)
        e = 1 - bias;
    double q = ldexp(1.0, e - mbits);
    double r = nearbyint(v / q) * q;
    double maxv = ldexp(2.0 - ldexp(1.0, -mbits), bias);
    if (fabs(r) > maxv)
        return v < 0 ? -INFINITY : INFINITY;
    return r;
}

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- GEMM ---- */

static void naive_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                       const float *b, int ldb, float beta, float *c, int ldc)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++)
                s += (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                     (tb ? b[j * ldb + p] : b[p * ldb + j]);
            c[i * ldc + j] = (float)(alpha * s + (beta == 0 ? 0 : beta * c[i * ldc + j]));
        }
}

static void test_gemm_matches_naive_for_every_transpose_and_stride(void)
{
    const int m = 7, n = 5, k = 9, pad = 3;
    for (int t = 0; t < 4; t++) {
        int ta = t & 1, tb = t >> 1;
        int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
        float a[16 * 16], b[16 * 16], c[16 * 16], ref[16 * 16];
        for (int i = 0; i < 256; i++) {
            a[i] = rnd_int(-4, 4);
            b[i] = rnd_int(-4, 4);
            c[i] = ref[i] = rnd_int(-4, 4);
        }
        naive_gemm(ta, tb, m, n, k, 2.0f, a, lda, b, ldb, 0.5f, ref, ldc);
        DT_ASSERT_OK(dt_kernel_gemm(ta, tb, m, n, k, 2.0f, a, DT_DTYPE_F32, lda, b,
                                    DT_DTYPE_F32, ldb, 0.5f, c, ldc));
        CU_ASSERT(memcmp(c, ref, sizeof c) == 0);
        /* The same with f16 A and bf16 B (small integers are exact in both). */
        uint16_t ah[256], bh[256];
        DT_ASSERT_OK(dt_kernel_cast(256, a, DT_DTYPE_F32, ah, DT_DTYPE_F16));
        DT_ASSERT_OK(dt_kernel_cast(256, b, DT_DTYPE_F32, bh, DT_DTYPE_BF16));
        float c2[256];
        for (int i = 0; i < 256; i++)
            c2[i] = NAN;    /* beta == 0 ignores the old contents */
        naive_gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, ref, ldc);
        DT_ASSERT_OK(dt_kernel_gemm(ta, tb, m, n, k, 1.0f, ah, DT_DTYPE_F16, lda, bh,
                                    DT_DTYPE_BF16, ldb, 0.0f, c2, ldc));
        for (int i = 0; i < m; i++)
            CU_ASSERT(memcmp(c2 + i * ldc, ref + i * ldc, sizeof(float) * n) == 0);
    }
}

static void test_gemm_half_operand_spans_several_blocks(void)
{
    /* A f16 4000 x 600: the conversion buffer holds ~262 columns, so three blocks. */
    const int m = 4000, n = 3, k = 600;
    float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
    float *c = malloc(sizeof(float) * m * n), *ref = malloc(sizeof(float) * m * n);
    uint16_t *ah = malloc(sizeof(uint16_t) * m * k);
    for (int i = 0; i < m * k; i++)
        a[i] = rnd_int(-2, 2);
    for (int i = 0; i < k * n; i++)
        b[i] = rnd_int(-2, 2);
    DT_ASSERT_OK(dt_kernel_cast((int64_t)m * k, a, DT_DTYPE_F32, ah, DT_DTYPE_F16));
    for (int ta = 0; ta < 2; ta++) {
        /* Transposed: reinterpret the same buffer as k x m. */
        naive_gemm(ta, 0, m, n, k, 1.0f, a, ta ? m : k, b, n, 0.0f, ref, n);
        DT_ASSERT_OK(dt_kernel_gemm(ta, 0, m, n, k, 1.0f, ah, DT_DTYPE_F16, ta ? m : k, b,
                                    DT_DTYPE_F32, n, 0.0f, c, n));
        CU_ASSERT(memcmp(c, ref, sizeof(float) * m * n) == 0);
    }
    free(a);
    free(b);
    free(c);
    free(ref);
    free(ah);
}

static void test_gemm_empty_contraction_scales_c_and_rejects_bad_args(void)
{
    float c[6] = {1, 2, 3, 4, 5, 6};
    DT_ASSERT_OK(dt_kernel_gemm(0, 0, 2, 3, 0, 1.0f, NULL, DT_DTYPE_F32, 1, NULL, DT_DTYPE_F32,
                                3, 2.0f, c, 3));
    CU_ASSERT_EQUAL(c[5], 12.0f);
    DT_ASSERT_FAILS(dt_kernel_gemm(0, 0, 2, 3, 4, 1.0f, c, DT_DTYPE_F32, 2, c, DT_DTYPE_F32, 3,
                                   0.0f, c, 3), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("lda=2");
    DT_ASSERT_FAILS(dt_kernel_gemm(0, 0, 2, 3, 4, 1.0f, c, DT_DTYPE_I32, 4, c, DT_DTYPE_F32, 3,
                                   0.0f, c, 3), DT_ERR_UNSUPPORTED);
}

/* ---- elementwise ---- */

static void test_elementwise_kernels_in_place_and_out(void)
{
    enum { N = 1003 };
    static float a[N], b[N], o[N];
    for (int i = 0; i < N; i++) {
        a[i] = rnd_int(-50, 50);
        b[i] = rnd_int(-50, 50);
    }
    DT_ASSERT_OK(dt_kernel_add(N, a, b, o));
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(o[i], a[i] + b[i]);
    DT_ASSERT_OK(dt_kernel_sub(N, a, b, o));
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(o[i], a[i] - b[i]);
    DT_ASSERT_OK(dt_kernel_mul(N, a, b, o));
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(o[i], a[i] * b[i]);
    DT_ASSERT_OK(dt_kernel_copy(N, a, o));
    DT_ASSERT_OK(dt_kernel_scale(N, 3.0f, o, o));    /* in place */
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(o[i], 3.0f * a[i]);
    DT_ASSERT_OK(dt_kernel_axpy(N, -2.0f, b, o));
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(o[i], 3.0f * a[i] - 2.0f * b[i]);
    DT_ASSERT_OK(dt_kernel_fill(N, 1.5f, o));
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(o[i], 1.5f);
    DT_ASSERT_OK(dt_kernel_add(0, NULL, NULL, NULL));
    DT_ASSERT_FAILS(dt_kernel_add(3, a, NULL, o), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_kernel_fill(-1, 0.0f, o), DT_ERR_INVALID_ARGUMENT);
}

/* Fill at every size class: vector loop with its tail, and beyond the L2 cache the string
 * store (ops/elementwise.c), at odd counts and unaligned starts, never writing past the end. */
static void test_fill_small_and_large_exact_with_guards(void)
{
    const int64_t sizes[] = {1, 15, 17, 1000, 65535, (int64_t)1 << 20, ((int64_t)1 << 22) + 3};
    enum { GUARD = 32 };
    int64_t cap = ((int64_t)1 << 22) + 3 + 2 * GUARD + 1;
    float *buf = malloc((size_t)cap * sizeof(float));
    CU_ASSERT_FATAL(buf != NULL);
    const float values[] = {-0.0f, 1.5f, 0x1p-140f}; /* sign bit alone, normal, subnormal */
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int off = 0; off < 2; off++) {
            int64_t n = sizes[s];
            float v = values[(s + (size_t)off) % 3];
            float *x = buf + GUARD + off;
            for (int64_t i = 0; i < n + 2 * GUARD + 1; i++)
                buf[i] = 7.0f;
            DT_ASSERT_OK(dt_kernel_fill(n, v, x));
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++)
                bad += memcmp(&x[i], &v, sizeof v) != 0;
            for (int64_t i = 0; i < GUARD + off; i++)
                bad += buf[i] != 7.0f;
            for (int64_t i = 0; i < GUARD; i++)
                bad += x[n + i] != 7.0f;
            if (bad)
                fprintf(stderr, "fill n=%lld off=%d: %lld wrong\n", (long long)n, off,
                        (long long)bad);
            CU_ASSERT_EQUAL(bad, 0);
        }
    free(buf);
}

static void test_bias_add_and_grad_over_rows(void)
{
    float y[12], bias[4] = {1, -2, 3, -4}, db[4], dy[12];
    for (int i = 0; i < 12; i++)
        y[i] = dy[i] = (float)i;
    DT_ASSERT_OK(dt_kernel_bias_add(3, 4, bias, y));
    for (int i = 0; i < 12; i++)
        CU_ASSERT_EQUAL(y[i], (float)i + bias[i % 4]);
    DT_ASSERT_OK(dt_kernel_bias_grad(3, 4, dy, db));
    for (int j = 0; j < 4; j++)
        CU_ASSERT_EQUAL(db[j], (float)(j + (j + 4) + (j + 8)));
    DT_ASSERT_OK(dt_kernel_bias_grad(0, 4, NULL, db));
    CU_ASSERT_EQUAL(db[2], 0.0f);
}

/* ---- activations ---- */

static void test_activations_and_grads_match_formula_and_differences(void)
{
    enum { N = 64 };
    float x[N], y[N], dy[N], dx[N];
    for (int i = 0; i < N; i++) {
        x[i] = rnd_real(-5, 5);
        dy[i] = rnd_real(-1, 1);
    }
    x[0] = 0.0f;
    DT_ASSERT_OK(dt_kernel_relu(N, x, y));
    DT_ASSERT_OK(dt_kernel_relu_grad(N, x, dy, dx));
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(y[i], x[i] > 0 ? x[i] : 0.0f);
        CU_ASSERT_EQUAL(dx[i], x[i] > 0 ? dy[i] : 0.0f);
    }
    DT_ASSERT_OK(dt_kernel_gelu(N, x, y));
    DT_ASSERT_OK(dt_kernel_gelu_grad(N, x, dy, dx));
    for (int i = 0; i < N; i++) {
        double v = x[i];
        double want = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        CU_ASSERT(fabs(y[i] - want) < 1e-6 * (1 + fabs(want)));
        /* Central difference of the f64 formula. */
        double h = 1e-5, f[2];
        for (int s = 0; s < 2; s++) {
            double u = v + (s ? -h : h);
            f[s] = 0.5 * u * (1 + tanh(sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
        }
        double fd = (f[0] - f[1]) / (2 * h) * dy[i];
        CU_ASSERT(fabs(dx[i] - fd) < 1e-5);
    }
    /* dx may alias dy. */
    memcpy(dx, dy, sizeof dx);
    DT_ASSERT_OK(dt_kernel_relu_grad(N, x, dx, dx));
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(dx[i], x[i] > 0 ? dy[i] : 0.0f);
}

/* ---- loss ---- */

static double xent_f64(const float *x, const int32_t *lab, int rows, int cls, double scale)
{
    double t = 0;
    for (int i = 0; i < rows; i++) {
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < cls; j++)
            mx = fmax(mx, x[i * cls + j]);
        for (int j = 0; j < cls; j++)
            s += exp(x[i * cls + j] - mx);
        t += mx + log(s) - x[i * cls + lab[i]];
    }
    return t * scale;
}

static void test_softmax_xent_is_stable_and_its_grad_matches_differences(void)
{
    enum { ROWS = 5, CL = 9 };
    float x[ROWS * CL], d[ROWS * CL], loss;
    int32_t lab[ROWS] = {0, 8, 3, 3, 5};
    for (int i = 0; i < ROWS * CL; i++)
        x[i] = rnd_real(-3, 3);
    x[0] = 1000.0f;     /* exp would overflow without the max shift */
    x[CL + 1] = -1000.0f;
    DT_ASSERT_OK(dt_kernel_softmax_xent(ROWS, CL, x, lab, 0.2f, &loss));
    double want = xent_f64(x, lab, ROWS, CL, 0.2);
    CU_ASSERT(isfinite(loss));
    CU_ASSERT(fabs(loss - want) < 1e-5 * (1 + fabs(want)));
    DT_ASSERT_OK(dt_kernel_softmax_xent_grad(ROWS, CL, x, lab, 0.2f, d));
    for (int i = 0; i < ROWS * CL; i++) {
        if (fabsf(x[i]) > 100)
            continue;
        float save = x[i];
        double h = 1e-2;
        x[i] = (float)(save + h);
        double lp = xent_f64(x, lab, ROWS, CL, 0.2);
        x[i] = (float)(save - h);
        double lm = xent_f64(x, lab, ROWS, CL, 0.2);
        x[i] = save;
        CU_ASSERT(fabs((lp - lm) / (2 * h) - d[i]) < 1e-4);
    }
    CU_ASSERT(fabs(d[0] - 0.2 * (1.0 - 1.0)) < 1e-7);    /* softmax ~1 at the label */
    lab[2] = 9;
    DT_ASSERT_FAILS(dt_kernel_softmax_xent(ROWS, CL, x, lab, 1.0f, &loss),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("row 2");
}

/* ---- reductions ---- */

static void test_reductions_full_and_over_one_axis(void)
{
    enum { O = 3, L = 5, I = 4 };
    float x[O * L * I], y[O * I], out;
    double s = 0, sq = 0, mx = -INFINITY;
    for (int i = 0; i < O * L * I; i++) {
        x[i] = rnd_int(-9, 9);
        s += x[i];
        sq += (double)x[i] * x[i];
        mx = fmax(mx, x[i]);
    }
    DT_ASSERT_OK(dt_kernel_sum(O * L * I, x, &out));
    CU_ASSERT_EQUAL(out, (float)s);
    DT_ASSERT_OK(dt_kernel_sq_norm(O * L * I, x, &out));
    CU_ASSERT_EQUAL(out, (float)sq);
    DT_ASSERT_OK(dt_kernel_max(O * L * I, x, &out));
    CU_ASSERT_EQUAL(out, (float)mx);
    DT_ASSERT_OK(dt_kernel_mean(O * L * I, x, &out));
    CU_ASSERT(fabs(out - s / (O * L * I)) < 1e-6);
    DT_ASSERT_OK(dt_kernel_sum(0, NULL, &out));
    CU_ASSERT_EQUAL(out, 0.0f);
    DT_ASSERT_OK(dt_kernel_max(0, NULL, &out));
    CU_ASSERT(isinf(out) && out < 0);
    float withnan[3] = {1, NAN, 2};
    DT_ASSERT_OK(dt_kernel_max(3, withnan, &out));
    CU_ASSERT(isnan(out));
    dt_reduce_op ops[4] = {DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_MIN, DT_REDUCE_AVG};
    for (int k = 0; k < 4; k++) {
        DT_ASSERT_OK(dt_kernel_reduce_axis(ops[k], O, L, I, x, y));
        for (int o = 0; o < O; o++)
            for (int i = 0; i < I; i++) {
                double acc = k == 1 ? -INFINITY : k == 2 ? INFINITY : 0;
                for (int l = 0; l < L; l++) {
                    double v = x[(o * L + l) * I + i];
                    acc = k == 1 ? fmax(acc, v) : k == 2 ? fmin(acc, v) : acc + v;
                }
                if (k == 3)
                    acc /= L;
                CU_ASSERT(fabs(y[o * I + i] - acc) < 1e-6);
            }
    }
    DT_ASSERT_OK(dt_kernel_reduce_axis(DT_REDUCE_MAX, O, 0, I, NULL, y));
    CU_ASSERT(isinf(y[0]) && y[0] < 0);
}

/* The row-order definition of a max (min) over a contiguous row: a NaN wins and the last
 * one's payload stays; of +0 and -0 the first met stays. */
static uint32_t row_order_extreme(int64_t n, const float *x, int is_max)
{
    float m = is_max ? -INFINITY : INFINITY;
    for (int64_t i = 0; i < n; i++)
        m = ((is_max ? x[i] > m : x[i] < m) || x[i] != x[i]) ? x[i] : m;
    uint32_t u;
    memcpy(&u, &m, sizeof u);
    return u;
}

static float nan_payload(uint32_t payload)
{
    uint32_t u = 0x7fc00000u | payload;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_reduce_axis_row_extremes_bit_equal_to_row_order(void)
{
    /* Row lengths around the kernel's 16 lanes; rows of random values, of zeros of both signs
     * (the extreme a zero), with NaNs of different payloads, all -inf. */
    enum { N = 70 };
    int lens[] = {1, 5, 15, 16, 17, 31, 32, 33, 64, 70};
    float x[8 * N], y[8];
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int64_t n = lens[li];
        for (int64_t i = 0; i < n; i++) {
            x[0 * n + i] = rnd_real(-5, 5);
            x[1 * n + i] = -rnd_real(1, 5);
            x[2 * n + i] = (i % 3 == 0) ? -0.0f : (i % 3 == 1 ? 0.0f : -1.0f);
            x[3 * n + i] = (i % 2 == 0) ? 0.0f : -0.0f;
            x[4 * n + i] = rnd_real(-5, 5);
            x[5 * n + i] = -INFINITY;
            x[6 * n + i] = rnd_real(1, 5);
            x[7 * n + i] = rnd_real(1, 5);
        }
        /* Row 7: the extreme a zero, +0 met first (at 1) and -0 after it in the first lane
         * (at 16): an order over lanes would keep -0. Row 3 with -0 first. */
        x[7 * n + 1] = 0.0f;
        if (n > 16)
            x[7 * n + 16] = -0.0f;
        for (int64_t i = 0; i < n && li > 0; i++)
            x[3 * n + i] = i == 1 ? -0.0f : (i == 16 ? 0.0f : -2.0f);
        x[4 * n + n / 2] = nan_payload(1);
        x[4 * n + n - 1] = nan_payload(2);
        x[6 * n] = nan_payload(3);
        for (int is_max = 0; is_max < 2; is_max++) {
            dt_reduce_op op = is_max ? DT_REDUCE_MAX : DT_REDUCE_MIN;
            DT_ASSERT_OK(dt_kernel_reduce_axis(op, 8, n, 1, x, y));
            for (int r = 0; r < 8; r++) {
                uint32_t got;
                memcpy(&got, &y[r], sizeof got);
                uint32_t want = row_order_extreme(n, x + r * n, is_max);
                if (got != want)
                    printf("len %lld row %d %s: %08x, row order %08x\n", (long long)n, r,
                           is_max ? "max" : "min", got, want);
                CU_ASSERT_EQUAL(got, want);
            }
        }
    }
}

static void test_nonfinite_detects_inf_and_nan_in_every_float_dtype(void)
{
    float f[100];
    double d[100];
    uint16_t h[100], bh[100];
    int32_t found = -1;
    for (int i = 0; i < 100; i++)
        f[i] = d[i] = rnd_real(-65000, 65000);
    DT_ASSERT_OK(dt_kernel_cast(100, f, DT_DTYPE_F32, h, DT_DTYPE_F16));
    DT_ASSERT_OK(dt_kernel_cast(100, f, DT_DTYPE_F32, bh, DT_DTYPE_BF16));
    const void *bufs[4] = {f, d, h, bh};
    dt_dtype ts[4] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_F16, DT_DTYPE_BF16};
    for (int k = 0; k < 4; k++) {
        DT_ASSERT_OK(dt_kernel_nonfinite(100, bufs[k], ts[k], &found));
        CU_ASSERT_EQUAL(found, 0);
    }
    f[97] = NAN;
    d[3] = -INFINITY;
    h[50] = 0x7c00;     /* +inf */
    bh[99] = 0xffc1;    /* NaN */
    for (int k = 0; k < 4; k++) {
        DT_ASSERT_OK(dt_kernel_nonfinite(100, bufs[k], ts[k], &found));
        CU_ASSERT_EQUAL(found, 1);
    }
    /* 65504 is finite in f16, 65520 rounds to inf. */
    float big[2] = {65504.0f, 65519.0f};
    DT_ASSERT_OK(dt_kernel_cast(2, big, DT_DTYPE_F32, h, DT_DTYPE_F16));
    DT_ASSERT_OK(dt_kernel_nonfinite(2, h, DT_DTYPE_F16, &found));
    CU_ASSERT_EQUAL(found, 0);
    DT_ASSERT_FAILS(dt_kernel_nonfinite(2, h, DT_DTYPE_I32, &found), DT_ERR_UNSUPPORTED);
}

/* ---- casts ---- */

static void test_cast_special_values(void)
{
    const float in[] = {0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65519.99f, 65520.0f,
                        0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f, 1.0f + 0x1p-11f,
                        1.0f + 0x3p-11f, 3.0e38f, 0x1p-133f, 0x1p-134f};
    const uint16_t want16[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7bff, 0x7bff, 0x7c00,
                               0x0001, 0x0000, 0x0001, 0x0400, 0x3c00, 0x3c02, 0x7c00,
                               0x0000, 0x0000};
    enum { N = sizeof in / sizeof in[0] };
    uint16_t h[N], b[N];
    float back[N];
    DT_ASSERT_OK(dt_kernel_cast(N, in, DT_DTYPE_F32, h, DT_DTYPE_F16));
    for (int i = 0; i < N; i++) {
        if (h[i] != want16[i])
            fprintf(stderr, "f16 of %a: %#x, want %#x\n", (double)in[i], h[i], want16[i]);
        CU_ASSERT_EQUAL(h[i], want16[i]);
    }
    DT_ASSERT_OK(dt_kernel_cast(N, in, DT_DTYPE_F32, b, DT_DTYPE_BF16));
    for (int i = 0; i < N; i++) {
        double r = round_to(in[i], 8, 7);
        CU_ASSERT(decode(b[i], 8, 7) == r || (isnan(r) && isnan(decode(b[i], 8, 7))));
        CU_ASSERT_EQUAL(b[i] >> 15, signbit(in[i]) ? 1 : 0);
    }
    CU_ASSERT_EQUAL(b[14], 0x0001);    /* smallest bf16 subnormal */
    /* NaN stays NaN in every direction, with its sign. */
    float nans[2] = {NAN, -NAN};
    DT_ASSERT_OK(dt_kernel_cast(2, nans, DT_DTYPE_F32, h, DT_DTYPE_F16));
    DT_ASSERT_OK(dt_kernel_cast(2, nans, DT_DTYPE_F32, b, DT_DTYPE_BF16));
    CU_ASSERT(isnan(decode(h[0], 5, 10)) && isnan(decode(b[1], 8, 7)));
    CU_ASSERT_EQUAL(h[1] >> 15, 1);
    uint16_t snan16 = 0x7c01;
    DT_ASSERT_OK(dt_kernel_cast(1, &snan16, DT_DTYPE_F16, back, DT_DTYPE_F32));
    CU_ASSERT(isnan(back[0]));
    DT_ASSERT_OK(dt_kernel_cast(1, &snan16, DT_DTYPE_F16, b, DT_DTYPE_BF16));
    CU_ASSERT(isnan(decode(b[0], 8, 7)));
    double dd[2] = {1e300, -1e-300};
    DT_ASSERT_OK(dt_kernel_cast(2, dd, DT_DTYPE_F64, h, DT_DTYPE_F16));
    CU_ASSERT_EQUAL(h[0], 0x7c00);
    CU_ASSERT_EQUAL(h[1], 0x8000);
}

/* Every f16 and bf16 pattern widens exactly and narrows back to itself; a sweep of f32 bit
 * patterns (all exponents, random mantissas, ties) rounds as the f64 reference does. */
static void test_cast_sweep_against_reference_rounding(void)
{
    static uint16_t all[65536], back[65536];
    static float wide[65536];
    for (int i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    for (int fmt = 0; fmt < 2; fmt++) {
        dt_dtype t = fmt ? DT_DTYPE_BF16 : DT_DTYPE_F16;
        int eb = fmt ? 8 : 5, mb = fmt ? 7 : 10;
        DT_ASSERT_OK(dt_kernel_cast(65536, all, t, wide, DT_DTYPE_F32));
        DT_ASSERT_OK(dt_kernel_cast(65536, wide, DT_DTYPE_F32, back, t));
        int64_t bad = 0;
        for (int i = 0; i < 65536; i++) {
            double r = decode(all[i], eb, mb);
            if (isnan(r))
                bad += !isnan(wide[i]) || !isnan(decode(back[i], eb, mb));
            else
                bad += (double)wide[i] != r || back[i] != all[i];
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
    enum { S = 1 << 16 };
    static float src[S];
    static uint16_t h[S];
    for (int i = 0; i < S; i++) {
        uint32_t u = (uint32_t)rnd();
        if (i % 4 == 1)    /* exact ties of f16 / bf16 */
            u = (u & ~0x1fffu) | 0x1000u;
        else if (i % 4 == 2)
            u = (u & ~0xffffu) | 0x8000u;
        if ((u & 0x7f800000u) == 0x7f800000u)
            u ^= 0x40000000u;    /* keep finite; specials are tested above */
        src[i] = f32_of(u);
    }
    for (int fmt = 0; fmt < 2; fmt++) {
        dt_dtype t = fmt ? DT_DTYPE_BF16 : DT_DTYPE_F16;
        int eb = fmt ? 8 : 5, mb = fmt ? 7 : 10;
        DT_ASSERT_OK(dt_kernel_cast(S, src, DT_DTYPE_F32, h, t));
        int64_t bad = 0;
        for (int i = 0; i < S; i++) {
            double want = round_to(src[i], eb, mb), got = decode(h[i], eb, mb);
            int ok = got == want && (signbit(got) == signbit((double)src[i]));
            if (!ok && bad < 5)
                fprintf(stderr, "%s of %a: got %a want %a\n", fmt ? "bf16" : "f16",
                        (double)src[i], got, want);
            bad += !ok;
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
    DT_ASSERT_FAILS(dt_kernel_cast(1, src, DT_DTYPE_F32, h, DT_DTYPE_I64), DT_ERR_UNSUPPORTED);
}

/* ---- optimizers: hand-worked steps ---- */

static void test_sgd_momentum_weight_decay_hand_worked(void)
{
    float p = 1.0f, g = 0.5f, buf = 0.0f;
    dt_sgd_opts o = DT_SGD_OPTS_INIT;
    o.lr = 0.1f;
    o.momentum = 0.9f;
    o.weight_decay = 0.1f;
    /* step 1: g' = 0.5 + 0.1*1 = 0.6, buf = 0.6, p = 1 - 0.06 = 0.94 */
    DT_ASSERT_OK(dt_kernel_sgd(1, &o, &p, &g, &buf));
    CU_ASSERT(fabsf(buf - 0.6f) < 1e-6f && fabsf(p - 0.94f) < 1e-6f);
    /* step 2: g' = 0.5 + 0.094 = 0.594, buf = 0.54 + 0.594 = 1.134, p = 0.94 - 0.1134 */
    DT_ASSERT_OK(dt_kernel_sgd(1, &o, &p, &g, &buf));
    CU_ASSERT(fabsf(buf - 1.134f) < 1e-6f && fabsf(p - 0.8266f) < 1e-6f);
    /* Nesterov step 1: buf = 0.6, d = 0.6 + 0.9*0.6 = 1.14, p = 1 - 0.114 */
    p = 1.0f;
    buf = 0.0f;
    o.nesterov = 1;
    DT_ASSERT_OK(dt_kernel_sgd(1, &o, &p, &g, &buf));
    CU_ASSERT(fabsf(p - 0.886f) < 1e-6f);
    /* Plain SGD with a gradient scale: g = 0.5 * 2 = 1, p = 1 - 0.1 */
    dt_sgd_opts plain = DT_SGD_OPTS_INIT;
    plain.lr = 0.1f;
    plain.grad_scale = 0.5f;
    float g2 = 2.0f;
    p = 1.0f;
    DT_ASSERT_OK(dt_kernel_sgd(1, &plain, &p, &g2, NULL));
    CU_ASSERT(fabsf(p - 0.9f) < 1e-6f);
}

static void test_adam_and_adamw_bias_correction_hand_worked(void)
{
    float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
    dt_adam_opts o = DT_ADAM_OPTS_INIT;
    o.lr = 0.1f;
    /* step 1: m = 0.05, v = 0.00025, m^ = 0.5, v^ = 0.25: p = 1 - 0.1 * 0.5 / 0.5 = 0.9 */
    DT_ASSERT_OK(dt_kernel_adam(1, &o, 1, &p, &g, &m, &v));
    CU_ASSERT(fabsf(m - 0.05f) < 1e-7f && fabsf(v - 0.00025f) < 1e-8f);
    CU_ASSERT(fabsf(p - 0.9f) < 1e-6f);
    /* step 2, same gradient: m^ = 0.095/0.19 = 0.5, v^ = 0.00049975/0.001999 = 0.25 */
    DT_ASSERT_OK(dt_kernel_adam(1, &o, 2, &p, &g, &m, &v));
    CU_ASSERT(fabsf(p - 0.8f) < 1e-5f);
    /* Adam with L2 decay 0.1: g = 0.6, step 1 moves p by lr exactly: 0.9 */
    p = 1.0f;
    m = v = 0.0f;
    o.weight_decay = 0.1f;
    DT_ASSERT_OK(dt_kernel_adam(1, &o, 1, &p, &g, &m, &v));
    CU_ASSERT(fabsf(p - 0.9f) < 1e-6f && fabsf(m - 0.06f) < 1e-7f);
    /* AdamW: p = 1 * (1 - 0.1*0.1) - 0.1 = 0.89, moments from the raw gradient */
    dt_adam_opts w = DT_ADAMW_OPTS_INIT;
    w.lr = 0.1f;
    w.weight_decay = 0.1f;
    p = 1.0f;
    m = v = 0.0f;
    DT_ASSERT_OK(dt_kernel_adam(1, &w, 1, &p, &g, &m, &v));
    CU_ASSERT(fabsf(p - 0.89f) < 1e-6f && fabsf(m - 0.05f) < 1e-7f);
    DT_ASSERT_FAILS(dt_kernel_adam(1, &w, 0, &p, &g, &m, &v), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("step 0");
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_gemm_matches_naive_for_every_transpose_and_stride),
        DT_TEST(test_gemm_half_operand_spans_several_blocks),
        DT_TEST(test_gemm_empty_contraction_scales_c_and_rejects_bad_args),
        DT_TEST(test_elementwise_kernels_in_place_and_out),
        DT_TEST(test_fill_small_and_large_exact_with_guards),
        DT_TEST(test_bias_add_and_grad_over_rows),
        DT_TEST(test_activations_and_grads_match_formula_and_differences),
        DT_TEST(test_softmax_xent_is_stable_and_its_grad_matches_differences),
        DT_TEST(test_reductions_full_and_over_one_axis),
        DT_TEST(test_reduce_axis_row_extremes_bit_equal_to_row_order),
        DT_TEST(test_nonfinite_detects_inf_and_nan_in_every_float_dtype),
        DT_TEST(test_cast_special_values),
        DT_TEST(test_cast_sweep_against_reference_rounding),
        DT_TEST(test_sgd_momentum_weight_decay_hand_worked),
        DT_TEST(test_adam_and_adamw_bias_correction_hand_worked),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ops_kernels", cases, 0);
}
