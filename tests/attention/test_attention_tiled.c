/* The tiled attention kernel (ops/attention_tiled.c) against an f64 reference written from the
 * definition and against the untiled kernel: forward, log-sum-exp and gradients, causal and
 * not, sequences shorter than a block, odd lengths not a multiple of the blocks, grouped-query
 * heads, scores whose row max moves from block to block; and the kernel choice. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref.h"
#include "harness.h"

static void fill(float *x, int64_t n, float lo, float hi, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = lo + (hi - lo) * (float)((s >> 11) * 0x1.0p-53);
    }
}

typedef struct shape {
    int64_t B, T, H, KV, D;
} shape;

/* Runs tiled and untiled on one shape and checks both against the reference. `ramp` grows
 * the keys along the sequence so that each later block holds a larger row max. */
static void check_shape(shape s, int causal, int ramp)
{
    int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D, nl = s.B * s.H * s.T;
    float *f = malloc((size_t)(4 * nq + 2 * nk + 4 * nk + nq + nl) * sizeof *f);
    float *q = f, *dy = q + nq, *y = dy + nq, *dq = y + nq, *k = dq + nq, *v = k + nk;
    float *dk = v + nk, *dv = dk + nk, *dk2 = dv + nk, *dv2 = dk2 + nk, *y2 = dv2 + nk;
    float *lse = y2 + nq;
    double *d = malloc((size_t)(2 * nq + 2 * nk + nl) * sizeof *d);
    double *ry = d, *rdq = ry + nq, *rdk = rdq + nq, *rdv = rdk + nk, *rlse = rdv + nk;
    fill(q, nq, -1.5f, 1.5f, (uint64_t)(s.T * 7 + causal));
    fill(k, nk, -1.5f, 1.5f, (uint64_t)(s.T * 7 + 1));
    fill(v, nk, -1, 1, (uint64_t)(s.T * 7 + 2));
    fill(dy, nq, -1, 1, (uint64_t)(s.T * 7 + 3));
    if (ramp)
        for (int64_t i = 0; i < nk; i++)
            k[i] *= 1.0f + 4.0f * (float)((i / (s.KV * s.D)) % s.T) / (float)s.T;
    attn_ref(s.B, s.T, s.H, s.KV, s.D, causal, q, k, v, dy, ry, rlse, rdq, rdk, rdv);

    DT_ASSERT_OK(dt_kernel_attention_tiled(s.B, s.T, s.H, s.KV, s.D, causal, q, k, v, y, lse));
    DT_ASSERT_OK(
        dt_kernel_attention_tiled_grad(s.B, s.T, s.H, s.KV, s.D, causal, q, k, v, dy, dq, dk, dv));
    double e[5] = {attn_rel_err(y, ry, nq), attn_rel_err(lse, rlse, nl), attn_rel_err(dq, rdq, nq),
                   attn_rel_err(dk, rdk, nk), attn_rel_err(dv, rdv, nk)};
    int bad = 0;
    for (int i = 0; i < 5; i++)
        bad |= !(e[i] < 2e-6 * sqrt((double)s.T) + 1e-6);
    if (bad)
        printf("tiled B%lld T%lld H%lld KV%lld D%lld causal %d ramp %d: y %.2g lse %.2g dq %.2g "
               "dk %.2g dv %.2g\n",
               (long long)s.B, (long long)s.T, (long long)s.H, (long long)s.KV, (long long)s.D,
               causal, ramp, e[0], e[1], e[2], e[3], e[4]);
    CU_ASSERT(!bad);

    /* The untiled kernel on the same data agrees with the reference as closely. */
    dt_attention_kernel was = dt_attention_kernel_set(DT_ATTENTION_KERNEL_UNTILED);
    DT_ASSERT_OK(dt_kernel_attention_gqa(s.B, s.T, s.H, s.KV, s.D, causal, q, k, v, y2));
    DT_ASSERT_OK(
        dt_kernel_attention_gqa_grad(s.B, s.T, s.H, s.KV, s.D, causal, q, k, v, dy, dq, dk2, dv2));
    dt_attention_kernel_set(was);
    CU_ASSERT(attn_rel_err(y2, ry, nq) < 2e-6 * sqrt((double)s.T) + 1e-6);
    CU_ASSERT(attn_rel_err(dk2, rdk, nk) < 2e-6 * sqrt((double)s.T) + 1e-6);
    CU_ASSERT(attn_rel_err(dv2, rdv, nk) < 2e-6 * sqrt((double)s.T) + 1e-6);
    free(d);
    free(f);
}

static void test_tiled_matches_the_f64_reference_and_the_untiled_kernel(void)
{
    static const shape shapes[] = {
        {1, 1, 1, 1, 8},    /* one query */
        {2, 5, 2, 2, 4},    /* shorter than a block */
        {1, 32, 2, 1, 8},   /* grouped-query */
        {2, 97, 4, 2, 8},   /* odd, inside one block (blocks: 128 x 128) */
        {1, 128, 2, 2, 16}, /* exactly one block */
        {1, 203, 3, 1, 12}, /* odd: a block and 75; odd head_dim tail, 3 heads on one kv */
        {2, 300, 2, 1, 8},  /* two blocks and a tail of 44 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int causal = 0; causal < 2; causal++)
            check_shape(shapes[i], causal, 0);
    check_shape(shapes[5], 1, 1);
    check_shape(shapes[6], 0, 1);
}

static void test_long_sequence_against_the_reference(void)
{
    shape s = {1, 1031, 1, 1, 16};
    check_shape(s, 1, 1);
}

/* AUTO takes the tiled kernel from DT_ATTENTION_TILED_MIN_SEQ on (same bits as the tiled entry)
 * and the untiled one below (same bits as before: the untiled choice). */
static void test_the_kernel_choice(void)
{
    enum { Tl = DT_ATTENTION_TILED_MIN_SEQ + 3, Ts = 40, Hh = 2, Dd = 8 };
    enum { N = Tl * Hh * Dd };
    float *f = malloc(6 * N * sizeof *f);
    float *q = f, *k = q + N, *v = k + N, *a = v + N, *b = a + N, *c = b + N;
    fill(q, N, -1, 1, 1);
    fill(k, N, -1, 1, 2);
    fill(v, N, -1, 1, 3);
    dt_attention_kernel was = dt_attention_kernel_set(DT_ATTENTION_KERNEL_AUTO);
    DT_ASSERT_OK(dt_kernel_attention(1, Tl, Hh, Dd, 1, q, k, v, a));
    DT_ASSERT_OK(dt_kernel_attention_tiled(1, Tl, Hh, Hh, Dd, 1, q, k, v, b, NULL));
    CU_ASSERT_EQUAL(memcmp(a, b, N * sizeof *a), 0);
    int64_t ns = Ts * Hh * Dd;
    DT_ASSERT_OK(dt_kernel_attention(1, Ts, Hh, Dd, 1, q, k, v, a));
    CU_ASSERT_EQUAL(dt_attention_kernel_set(DT_ATTENTION_KERNEL_UNTILED), DT_ATTENTION_KERNEL_AUTO);
    DT_ASSERT_OK(dt_kernel_attention(1, Ts, Hh, Dd, 1, q, k, v, b));
    CU_ASSERT_EQUAL(memcmp(a, b, (size_t)ns * sizeof *a), 0);
    /* TILED everywhere: the short sequence now runs the tiled kernel too. */
    dt_attention_kernel_set(DT_ATTENTION_KERNEL_TILED);
    DT_ASSERT_OK(dt_kernel_attention(1, Ts, Hh, Dd, 1, q, k, v, a));
    DT_ASSERT_OK(dt_kernel_attention_tiled(1, Ts, Hh, Hh, Dd, 1, q, k, v, c, NULL));
    CU_ASSERT_EQUAL(memcmp(a, c, (size_t)ns * sizeof *a), 0);
    /* An unknown value changes nothing. */
    CU_ASSERT_EQUAL(dt_attention_kernel_set((dt_attention_kernel)7), DT_ATTENTION_KERNEL_TILED);
    CU_ASSERT_EQUAL(dt_attention_kernel_set(was), DT_ATTENTION_KERNEL_TILED);
    free(f);
}

static void test_bad_arguments(void)
{
    float x[8] = {0};
    DT_ASSERT_FAILS(dt_kernel_attention_tiled(1, -1, 1, 1, 8, 1, x, x, x, x, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_kernel_attention_tiled(1, 1, 3, 2, 8, 1, x, x, x, x, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("does not divide");
    DT_ASSERT_FAILS(dt_kernel_attention_tiled_grad(1, 1, 1, 1, 8, 1, x, x, x, x, NULL, x, x),
                    DT_ERR_INVALID_ARGUMENT);
    /* Nothing to do is not an error. */
    DT_ASSERT_OK(dt_kernel_attention_tiled(0, 4, 1, 1, 8, 1, NULL, NULL, NULL, NULL, NULL));
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_tiled_matches_the_f64_reference_and_the_untiled_kernel),
        DT_TEST(test_long_sequence_against_the_reference),
        DT_TEST(test_the_kernel_choice),
        DT_TEST(test_bad_arguments),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "attention_tiled", cases, 0);
}
