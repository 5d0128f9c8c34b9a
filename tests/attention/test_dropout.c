/* Dropout from Philox-4x32-10 (ops/philox.c, ops/spmd_dropout.c): the generator's published
 * known answers, the mask's statistics and its independence of how the elements are split,
 * then the mask and dt_dropout of sharded, uneven, replicated and partial tensors against the
 * mask of the whole tensor computed on one host, and the tape's gradient (dy times the mask). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../ops/ops_test_util.h"

static void test_philox_known_answers(void)
{
    /* Random123's kat_vectors for philox4x32_10. */
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                       {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
    static const uint32_t key[3][2] = {
        {0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
    static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                        {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                        {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        dt_philox4x32_10(ctr[i], key[i], out);
        CU_ASSERT_EQUAL(memcmp(out, want[i], sizeof out), 0);
    }
}

/* Every element against the documented rule on dt_philox4x32_10 (the kernel runs 8 blocks at
 * once where it can): from 0, from an odd start, and across block 2^32 - 1 (the counter's low
 * word wrapping), p 0.1 and 0.5. */
static void test_the_mask_is_the_documented_rule(void)
{
    enum { N = 4099 };
    static const int64_t starts[] = {0, 13, 4 * (((int64_t)1 << 32) - 5) + 2};
    static const float ps[] = {0.1f, 0.5f};
    float *got = malloc(N * sizeof *got);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 2; b++) {
            const uint64_t seed = 0x1234567890abcdefull, stream = 0xfedcba0987654321ull;
            DT_ASSERT_OK(dt_kernel_dropout_mask(starts[a], N, ps[b], seed, stream, got));
            const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
            int bad = 0;
            for (int64_t i = 0; i < N; i++) {
                uint64_t g = (uint64_t)(starts[a] + i), blk = g / 4;
                const uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)stream,
                                         (uint32_t)(stream >> 32)};
                uint32_t w[4];
                dt_philox4x32_10(ctr, key, w);
                double u = (double)(w[g % 4] >> 8) / 16777216.0;
                float want = u < (double)ps[b] ? 0.0f : 1.0f / (1.0f - ps[b]);
                bad += memcmp(&got[i], &want, sizeof want) != 0;
            }
            CU_ASSERT_EQUAL(bad, 0);
        }
    free(got);
}

static void test_mask_statistics_and_split_independence(void)
{
    enum { N = 200003 };
    float *a = malloc(2 * N * sizeof *a), *b = a + N;
    DT_ASSERT_OK(dt_kernel_dropout_mask(0, N, 0.1f, 42, 7, a));
    int64_t dropped = 0;
    int other = 0;
    for (int i = 0; i < N; i++) {
        dropped += a[i] == 0.0f;
        other += a[i] != 0.0f && a[i] != 1.0f / 0.9f;
    }
    CU_ASSERT_EQUAL(other, 0);
    /* Binomial(N, 0.1): sd 134; 6 sd. */
    CU_ASSERT(llabs(dropped - N / 10) < 800);
    /* Any split gives the same values: odd starts and lengths. */
    int64_t cuts[] = {0, 1, 2, 7, 4096, 4099, 150001, N};
    for (int i = 0; i + 1 < (int)(sizeof cuts / sizeof cuts[0]); i++)
        DT_ASSERT_OK(
            dt_kernel_dropout_mask(cuts[i], cuts[i + 1] - cuts[i], 0.1f, 42, 7, b + cuts[i]));
    CU_ASSERT_EQUAL(memcmp(a, b, N * sizeof *a), 0);
    /* Another stream, another seed: other masks (nearly half... of the 10%: many differ). */
    DT_ASSERT_OK(dt_kernel_dropout_mask(0, N, 0.1f, 42, 8, b));
    int diff = 0;
    for (int i = 0; i < N; i++)
        diff += a[i] != b[i];
    CU_ASSERT(diff > N / 10);
    DT_ASSERT_OK(dt_kernel_dropout_mask(0, N, 0.1f, 43, 7, b));
    diff = 0;
    for (int i = 0; i < N; i++)
        diff += a[i] != b[i];
    CU_ASSERT(diff > N / 10);
    /* p = 0 keeps everything at scale 1. */
    DT_ASSERT_OK(dt_kernel_dropout_mask(5, 1000, 0.0f, 1, 1, b));
    for (int i = 0; i < 1000; i++)
        CU_ASSERT_EQUAL(b[i], 1.0f);
    DT_ASSERT_FAILS(dt_kernel_dropout_mask(0, 4, 1.5f, 1, 1, b), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_kernel_dropout_mask(-1, 4, 0.5f, 1, 1, b), DT_ERR_INVALID_ARGUMENT);
    free(a);
}

static dt_layout *lay3(const dt_mesh *m, const char *s0, const char *s1, const char *s2,
                       const char *partial)
{
    const char *s[3] = {s0 ? s0 : DT_UNSHARDED, s1 ? s1 : DT_UNSHARDED, s2 ? s2 : DT_UNSHARDED};
    dt_reduce_op op = DT_REDUCE_SUM;
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(m, 3, s, partial ? 1 : 0, &partial, &op, &l));
    return l;
}

/* [3, 7, 10]: uneven over 2, 4 or 8 devices along every dim. */
#define D0 3
#define D1 7
#define D2 10
#define N  (D0 * D1 * D2)

static void test_sharded_masks_equal_the_unsharded_one(void)
{
    float want[N], x[N], xm[N], got[N];
    const float p = 0.3f;
    const uint64_t seed = 0x123456789abcull, stream = 5;
    DT_ASSERT_OK(dt_kernel_dropout_mask(0, N, p, seed, stream, want));
    ot_fill_real(x, N, -1, 1, 9);
    for (int i = 0; i < N; i++)
        xm[i] = x[i] * want[i];
    int64_t shape[3] = {D0, D1, D2};
    for (int two = 0; two < 2; two++) {
        dt_mesh *m = two ? ot_mesh_2d() : ot_mesh_1d();
        const char *a = two ? "b" : "x", *b = two ? "m" : NULL;
        const char *specs[6][3] = {{NULL, NULL, NULL}, {a, NULL, NULL}, {NULL, a, NULL},
                                   {NULL, NULL, a},    {a, b, NULL},    {NULL, b, a}};
        for (int i = 0; i < 6; i++) {
            dt_layout *l = lay3(m, specs[i][0], specs[i][1], specs[i][2], NULL);
            dt_tensor *mask = NULL, *tx = ot_tensor(l, DT_DTYPE_F32, shape, x), *y = NULL;
            DT_ASSERT_OK(dt_dropout_mask(l, shape, p, seed, stream, &mask));
            ot_fetch(mask, got);
            CU_ASSERT_EQUAL(ot_mismatches("mask", got, want, N, 0, 0), 0);
            DT_ASSERT_OK(dt_dropout(tx, p, seed, stream, &y));
            ot_fetch(y, got);
            CU_ASSERT_EQUAL(ot_mismatches("dropout", got, xm, N, 0, 0), 0);
            dt_tensor_destroy(y);
            dt_tensor_destroy(tx);
            dt_tensor_destroy(mask);
            dt_layout_destroy(l);
        }
        /* A partial input: the mask ignores the partial dim, the product is the same. */
        const char *pd = two ? "m" : "x";
        dt_layout *lp = lay3(m, two ? "b" : NULL, NULL, NULL, pd);
        dt_layout *lr = lay3(m, two ? "b" : NULL, NULL, NULL, NULL);
        dt_tensor *full = ot_tensor(lr, DT_DTYPE_F32, shape, x), *part = NULL, *y = NULL;
        DT_ASSERT_OK(dt_relayout(full, lp, &part));
        DT_ASSERT_OK(dt_dropout(part, p, seed, stream, &y));
        ot_fetch(y, got);
        CU_ASSERT_EQUAL(ot_mismatches("dropout of partial", got, xm, N, 1e-6f, 1e-6f), 0);
        dt_tensor *mask = NULL;
        DT_ASSERT_OK(dt_dropout_mask(lp, shape, p, seed, stream, &mask));
        CU_ASSERT(!ot_is_partial(mask));
        dt_tensor_destroy(mask);
        dt_tensor_destroy(y);
        dt_tensor_destroy(part);
        dt_tensor_destroy(full);
        dt_layout_destroy(lp);
        dt_layout_destroy(lr);
        dt_mesh_destroy(m);
    }
}

static void test_the_tape_gradient_is_dy_times_the_mask(void)
{
    float want[N], x[N], dy[N], gw[N], got[N];
    const float p = 0.25f;
    DT_ASSERT_OK(dt_kernel_dropout_mask(0, N, p, 77, 3, want));
    ot_fill_real(x, N, -1, 1, 10);
    ot_fill_real(dy, N, -1, 1, 11);
    for (int i = 0; i < N; i++)
        gw[i] = dy[i] * want[i];
    int64_t shape[3] = {D0, D1, D2};
    dt_mesh *m = ot_mesh_2d();
    dt_layout *l = lay3(m, "b", NULL, "m", NULL);
    dt_tensor *tx = ot_tensor(l, DT_DTYPE_F32, shape, x),
              *tdy = ot_tensor(l, DT_DTYPE_F32, shape, dy);
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    DT_ASSERT_OK(dt_tape_watch(tape, tx, 0));
    DT_ASSERT_OK(dt_tape_begin(tape));
    dt_tensor *y = NULL;
    DT_ASSERT_OK(dt_dropout(tx, p, 77, 3, &y));
    DT_ASSERT_OK(dt_tape_end(tape));
    DT_ASSERT_OK(dt_tape_backward(tape, y, tdy, 0, NULL));
    const dt_tensor *g = NULL;
    DT_ASSERT_OK(dt_tape_grad(tape, 0, &g));
    ot_fetch(g, got);
    CU_ASSERT_EQUAL(ot_mismatches("dropout grad", got, gw, N, 0, 0), 0);
    /* dt_dropout of dy is the same backward. */
    dt_tensor *dx = NULL;
    DT_ASSERT_OK(dt_dropout(tdy, p, 77, 3, &dx));
    ot_fetch(dx, got);
    CU_ASSERT_EQUAL(ot_mismatches("dropout backward", got, gw, N, 0, 0), 0);
    dt_tensor_destroy(dx);
    dt_tensor_destroy(y);
    dt_tape_destroy(tape);
    dt_tensor_destroy(tdy);
    dt_tensor_destroy(tx);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_philox_known_answers),
        DT_TEST(test_the_mask_is_the_documented_rule),
        DT_TEST(test_mask_statistics_and_split_independence),
        DT_TEST(test_sharded_masks_equal_the_unsharded_one),
        DT_TEST(test_the_tape_gradient_is_dy_times_the_mask),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "dropout", cases);
}
