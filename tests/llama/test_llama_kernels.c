/* The Llama-style kernels (ops/llama.c) against f64 references written here and worked
 * examples, their gradients against central finite differences of those references, and
 * grouped-query attention against dt_kernel_attention (bit for bit with kv_heads == heads). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define B 2
#define T 5
#define H 4
#define HKV 2
#define HD 4
#define C (H * HD)
#define CK (HKV * HD)
#define N (B * T * C)
#define NK (B * T * CK)

static uint64_t rng_state;

static float uniform(float lo, float hi)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (float)((rng_state >> 40) & 0xffffff) / 16777216.0f;
}

static void fill(float *x, int n, float lo, float hi, uint64_t seed)
{
    rng_state = seed;
    for (int i = 0; i < n; i++)
        x[i] = uniform(lo, hi);
}

static void widen(const float *x, double *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = x[i];
}

static double dotw(const double *a, const float *w, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * w[i];
    return s;
}

/* ---- f64 references --------------------------------------------------------------------- */

static void ref_rms_norm(int rows, int cols, const double *x, const double *g, double *y)
{
    for (int i = 0; i < rows; i++) {
        double ms = 0;
        for (int j = 0; j < cols; j++)
            ms += x[i * cols + j] * x[i * cols + j] / cols;
        for (int j = 0; j < cols; j++)
            y[i * cols + j] = x[i * cols + j] / sqrt(ms + 1e-5) * g[j];
    }
}

/* Rotary embedding of [B, T, heads * hd] at positions off + t. */
static void ref_rope(int seq, int heads, int hd, int off, const double *x, double *y)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < seq; t++)
            for (int h = 0; h < heads; h++)
                for (int i = 0; i < hd / 2; i++) {
                    double a = (off + t) / pow(10000.0, 2.0 * i / hd);
                    int o = (b * seq + t) * heads * hd + h * hd + 2 * i;
                    y[o] = x[o] * cos(a) - x[o + 1] * sin(a);
                    y[o + 1] = x[o] * sin(a) + x[o + 1] * cos(a);
                }
}

static void ref_swiglu(int n, const double *g, const double *u, double *y)
{
    for (int i = 0; i < n; i++)
        y[i] = g[i] / (1 + exp(-g[i])) * u[i];
}

/* Causal attention of q [B, T, H*HD] against k, v [B, T, kvh*HD], head h on kv head
 * h / (H / kvh). */
static void ref_gqa(const double *q, const double *k, const double *v, int kvh, double *y)
{
    int kc = kvh * HD;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / kvh);
            for (int t = 0; t < T; t++) {
                double s[T], mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    s[j] = 0;
                    for (int d = 0; d < HD; d++)
                        s[j] += q[(b * T + t) * C + h * HD + d] * k[(b * T + j) * kc + g * HD + d];
                    s[j] /= sqrt((double)HD);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= t; j++)
                    sum += (s[j] = exp(s[j] - mx));
                for (int d = 0; d < HD; d++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++)
                        acc += s[j] / sum * v[(b * T + j) * kc + g * HD + d];
                    y[(b * T + t) * C + h * HD + d] = acc;
                }
            }
        }
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_rms_norm_kernel_matches_reference_and_finite_differences(void)
{
    enum { ROWS = 6 };
    float x[ROWS * C], g[C], y[ROWS * C], w[ROWS * C], dx[ROWS * C], dg[C];
    double xd[ROWS * C], gd[C], yd[ROWS * C];
    fill(x, ROWS * C, -2, 2, 1);
    fill(g, C, 0.5f, 1.5f, 2);
    fill(w, ROWS * C, -1, 1, 3);
    widen(x, xd, ROWS * C);
    widen(g, gd, C);
    DT_ASSERT_OK(dt_kernel_rms_norm(ROWS, C, x, g, 1e-5f, y));
    ref_rms_norm(ROWS, C, xd, gd, yd);
    int bad = 0;
    for (int i = 0; i < ROWS * C; i++)
        bad += fabs(y[i] - yd[i]) > 1e-5;
    CU_ASSERT_EQUAL(bad, 0);
    /* Worked example: x = (3, 4), gain 1, eps 0: rms = sqrt(12.5), y = x / rms. */
    float x2[2] = {3, 4}, g2[2] = {1, 2}, y2[2];
    DT_ASSERT_OK(dt_kernel_rms_norm(1, 2, x2, g2, 0.0f, y2));
    CU_ASSERT(fabs(y2[0] - 3 / sqrt(12.5)) < 1e-6 && fabs(y2[1] - 8 / sqrt(12.5)) < 1e-6);
    DT_ASSERT_OK(dt_kernel_rms_norm_grad(ROWS, C, x, g, w, 1e-5f, dx, dg));
    double h = 1e-6;
    bad = 0;
    for (int i = 0; i < ROWS * C; i++) {
        double f[2];
        for (int s = 0; s < 2; s++) {
            xd[i] += s ? -2 * h : h;
            ref_rms_norm(ROWS, C, xd, gd, yd);
            f[s] = dotw(yd, w, ROWS * C);
        }
        xd[i] += h;
        bad += fabs(dx[i] - (f[0] - f[1]) / (2 * h)) > 1e-4;
    }
    for (int j = 0; j < C; j++) {
        double f[2];
        for (int s = 0; s < 2; s++) {
            gd[j] += s ? -2 * h : h;
            ref_rms_norm(ROWS, C, xd, gd, yd);
            f[s] = dotw(yd, w, ROWS * C);
        }
        gd[j] += h;
        bad += fabs(dg[j] - (f[0] - f[1]) / (2 * h)) > 1e-4;
    }
    CU_ASSERT_EQUAL(bad, 0);
    /* dx may alias dy. */
    float dyc[ROWS * C];
    memcpy(dyc, w, sizeof dyc);
    DT_ASSERT_OK(dt_kernel_rms_norm_grad(ROWS, C, x, g, dyc, 1e-5f, dyc, dg));
    CU_ASSERT_EQUAL(memcmp(dyc, dx, sizeof dyc), 0);
    DT_ASSERT_FAILS(dt_kernel_rms_norm(ROWS, 0, x, g, 1e-5f, y), DT_ERR_INVALID_ARGUMENT);
}

static void test_rope_kernel_rotates_pairs_by_position_and_inverts(void)
{
    /* Worked example: one head of 4, position 1 (offset 1, t = 0): pair 0 turns by 1 rad,
     * pair 1 by 10000^(-1/2) = 0.01 rad. */
    float x1[4] = {1, 0, 0, 2}, y1[4];
    DT_ASSERT_OK(dt_kernel_rope(1, 1, 1, 4, 1, 0, x1, y1));
    CU_ASSERT(fabs(y1[0] - cos(1.0)) < 1e-6 && fabs(y1[1] - sin(1.0)) < 1e-6);
    CU_ASSERT(fabs(y1[2] + 2 * sin(0.01)) < 1e-6 && fabs(y1[3] - 2 * cos(0.01)) < 1e-6);
    /* Position 0 is the identity. */
    DT_ASSERT_OK(dt_kernel_rope(1, 1, 1, 4, 0, 0, x1, y1));
    CU_ASSERT_EQUAL(memcmp(x1, y1, sizeof y1), 0);

    float x[N], y[N], w[N], dx[N], back[N];
    double xd[N], yd[N];
    fill(x, N, -1, 1, 4);
    fill(w, N, -1, 1, 5);
    widen(x, xd, N);
    DT_ASSERT_OK(dt_kernel_rope(B, T, H, HD, 3, 0, x, y));
    ref_rope(T, H, HD, 3, xd, yd);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += fabs(y[i] - yd[i]) > 1e-6;
    CU_ASSERT_EQUAL(bad, 0);
    /* The inverse undoes it; in place. */
    memcpy(back, y, sizeof back);
    DT_ASSERT_OK(dt_kernel_rope(B, T, H, HD, 3, 1, back, back));
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += fabs(back[i] - x[i]) > 1e-6;
    CU_ASSERT_EQUAL(bad, 0);
    /* The gradient of sum(w rope(x)) is the inverse rotation of w. */
    DT_ASSERT_OK(dt_kernel_rope(B, T, H, HD, 3, 1, w, dx));
    double h = 1e-6;
    bad = 0;
    for (int i = 0; i < N; i++) {
        double f[2];
        for (int s = 0; s < 2; s++) {
            xd[i] += s ? -2 * h : h;
            ref_rope(T, H, HD, 3, xd, yd);
            f[s] = dotw(yd, w, N);
        }
        xd[i] += h;
        bad += fabs(dx[i] - (f[0] - f[1]) / (2 * h)) > 1e-5;
    }
    CU_ASSERT_EQUAL(bad, 0);
    /* Offset: the last 2 positions of a sequence of 5 at offset 0 are positions 3..4, the
     * same as a sequence of 2 at offset 3. */
    float tail[B * 2 * C], yt[B * 2 * C], full[N];
    DT_ASSERT_OK(dt_kernel_rope(B, T, H, HD, 0, 0, x, full));
    for (int b = 0; b < B; b++)
        memcpy(tail + b * 2 * C, x + (b * T + 3) * C, 2 * C * sizeof(float));
    DT_ASSERT_OK(dt_kernel_rope(B, 2, H, HD, 3, 0, tail, yt));
    for (int b = 0; b < B; b++)
        CU_ASSERT_EQUAL(memcmp(yt + b * 2 * C, full + (b * T + 3) * C, 2 * C * sizeof(float)), 0);
    DT_ASSERT_FAILS(dt_kernel_rope(B, T, H * 2, 2 * HD - 1, 0, 0, x, y), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_kernel_rope(B, T, H, HD, -1, 0, x, y), DT_ERR_INVALID_ARGUMENT);
}

static void test_swiglu_kernel_matches_reference_and_finite_differences(void)
{
    enum { M = 40 };
    float g[M], u[M], y[M], w[M], dg[M], du[M];
    double gd[M], ud[M], yd[M];
    fill(g, M, -4, 4, 6);
    fill(u, M, -2, 2, 7);
    fill(w, M, -1, 1, 8);
    widen(g, gd, M);
    widen(u, ud, M);
    DT_ASSERT_OK(dt_kernel_swiglu(M, g, u, y));
    ref_swiglu(M, gd, ud, yd);
    int bad = 0;
    for (int i = 0; i < M; i++)
        bad += fabs(y[i] - yd[i]) > 1e-6 * (1 + fabs(yd[i]));
    CU_ASSERT_EQUAL(bad, 0);
    /* silu(0) = 0, silu(large) ~ identity. */
    float z[2] = {0, 30}, one[2] = {1, 1}, yz[2];
    DT_ASSERT_OK(dt_kernel_swiglu(2, z, one, yz));
    CU_ASSERT(yz[0] == 0.0f && fabs(yz[1] - 30) < 1e-5);
    DT_ASSERT_OK(dt_kernel_swiglu_grad(M, g, u, w, dg, du));
    double h = 1e-6;
    bad = 0;
    double *in[2] = {gd, ud};
    const float *gr[2] = {dg, du};
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < M; i++) {
            double f[2];
            for (int s = 0; s < 2; s++) {
                in[a][i] += s ? -2 * h : h;
                ref_swiglu(M, gd, ud, yd);
                f[s] = dotw(yd, w, M);
            }
            in[a][i] += h;
            bad += fabs(gr[a][i] - (f[0] - f[1]) / (2 * h)) > 1e-4;
        }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_gqa_kernel_matches_reference_and_finite_differences(void)
{
    float q[N], k[NK], v[NK], y[N], w[N], dq[N], dk[NK], dv[NK];
    double qd[N], kd[NK], vd[NK], yd[N];
    fill(q, N, -1, 1, 9);
    fill(k, NK, -1, 1, 10);
    fill(v, NK, -1, 1, 11);
    fill(w, N, -1, 1, 12);
    widen(q, qd, N);
    widen(k, kd, NK);
    widen(v, vd, NK);
    DT_ASSERT_OK(dt_kernel_attention_gqa(B, T, H, HKV, HD, 1, q, k, v, y));
    ref_gqa(qd, kd, vd, HKV, yd);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += fabs(y[i] - yd[i]) > 1e-5;
    CU_ASSERT_EQUAL(bad, 0);
    DT_ASSERT_OK(dt_kernel_attention_gqa_grad(B, T, H, HKV, HD, 1, q, k, v, w, dq, dk, dv));
    double *in[3] = {qd, kd, vd};
    const float *g[3] = {dq, dk, dv};
    int len[3] = {N, NK, NK};
    double h = 1e-6;
    bad = 0;
    for (int a = 0; a < 3; a++)
        for (int i = 0; i < len[a]; i++) {
            double f[2];
            for (int s = 0; s < 2; s++) {
                in[a][i] += s ? -2 * h : h;
                ref_gqa(qd, kd, vd, HKV, yd);
                f[s] = dotw(yd, w, N);
            }
            in[a][i] += h;
            bad += fabs(g[a][i] - (f[0] - f[1]) / (2 * h)) > 1e-4;
        }
    CU_ASSERT_EQUAL(bad, 0);
    DT_ASSERT_FAILS(dt_kernel_attention_gqa(B, T, H, 3, HD, 1, q, k, v, y),
                    DT_ERR_INVALID_ARGUMENT);
}

static void test_gqa_kernel_equals_attention_with_repeated_kv_heads(void)
{
    float q[N], k[N], v[N], dy[N], y1[N], y2[N], g1[3][N], g2[3][N];
    fill(q, N, -1, 1, 13);
    fill(k, N, -1, 1, 14);
    fill(v, N, -1, 1, 15);
    fill(dy, N, -1, 1, 16);
    /* kv_heads == heads: dt_kernel_attention's bits, forward and backward, causal or not. */
    for (int causal = 0; causal < 2; causal++) {
        DT_ASSERT_OK(dt_kernel_attention(B, T, H, HD, causal, q, k, v, y1));
        DT_ASSERT_OK(dt_kernel_attention_gqa(B, T, H, H, HD, causal, q, k, v, y2));
        CU_ASSERT_EQUAL(memcmp(y1, y2, sizeof y1), 0);
        DT_ASSERT_OK(dt_kernel_attention_grad(B, T, H, HD, causal, q, k, v, dy, g1[0], g1[1],
                                              g1[2]));
        DT_ASSERT_OK(dt_kernel_attention_gqa_grad(B, T, H, H, HD, causal, q, k, v, dy, g2[0],
                                                  g2[1], g2[2]));
        CU_ASSERT_EQUAL(memcmp(g1, g2, sizeof g1), 0);
    }
    /* HKV kv heads repeated to H heads: the same output bits; dk, dv the group sums. */
    float kr[N], vr[N], ks[NK], vs[NK], dk[NK], dv[NK];
    fill(ks, NK, -1, 1, 17);
    fill(vs, NK, -1, 1, 18);
    for (int r = 0; r < B * T; r++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < HD; d++) {
                kr[r * C + h * HD + d] = ks[r * CK + (h / (H / HKV)) * HD + d];
                vr[r * C + h * HD + d] = vs[r * CK + (h / (H / HKV)) * HD + d];
            }
    DT_ASSERT_OK(dt_kernel_attention(B, T, H, HD, 1, q, kr, vr, y1));
    DT_ASSERT_OK(dt_kernel_attention_gqa(B, T, H, HKV, HD, 1, q, ks, vs, y2));
    CU_ASSERT_EQUAL(memcmp(y1, y2, sizeof y1), 0);
    DT_ASSERT_OK(dt_kernel_attention_grad(B, T, H, HD, 1, q, kr, vr, dy, g1[0], g1[1], g1[2]));
    DT_ASSERT_OK(dt_kernel_attention_gqa_grad(B, T, H, HKV, HD, 1, q, ks, vs, dy, g2[0], dk,
                                              dv));
    CU_ASSERT_EQUAL(memcmp(g1[0], g2[0], sizeof g1[0]), 0);
    int bad = 0;
    for (int r = 0; r < B * T; r++)
        for (int kh = 0; kh < HKV; kh++)
            for (int d = 0; d < HD; d++) {
                float sk = 0, sv = 0;
                for (int h = kh * (H / HKV); h < (kh + 1) * (H / HKV); h++) {
                    sk += g1[1][r * C + h * HD + d];
                    sv += g1[2][r * C + h * HD + d];
                }
                bad += fabsf(dk[r * CK + kh * HD + d] - sk) > 1e-5f;
                bad += fabsf(dv[r * CK + kh * HD + d] - sv) > 1e-5f;
            }
    CU_ASSERT_EQUAL(bad, 0);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_rms_norm_kernel_matches_reference_and_finite_differences),
        DT_TEST(test_rope_kernel_rotates_pairs_by_position_and_inverts),
        DT_TEST(test_swiglu_kernel_matches_reference_and_finite_differences),
        DT_TEST(test_gqa_kernel_matches_reference_and_finite_differences),
        DT_TEST(test_gqa_kernel_equals_attention_with_repeated_kv_heads),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "llama_kernels", cases, 0);
}
