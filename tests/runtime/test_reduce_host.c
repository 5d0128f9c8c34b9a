/* The host reduction kernels (runtime/reduce_host.c), which the compiler vectorises: for every
 * dtype and op, any length (the vector body and its remainder), misaligned and aliased
 * buffers give the bits of one element at a time, and hand-worked bf16 ties round to even. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/device.h"
#include "runtime/half.h"

/* A 16-bit pattern: mostly ordinary values, sometimes inf, NaN, zero or a subnormal. */
static uint16_t pattern(unsigned *seed, int bf16)
{
    *seed = *seed * 1103515245u + 12345u;
    unsigned r = *seed >> 8;
    switch (r % 16) {
    case 0: return bf16 ? 0x7f80 : 0x7c00;                 /* +inf */
    case 1: return bf16 ? 0xffc1 : 0xfe01;                 /* NaN with a payload */
    case 2: return (uint16_t)(r & 0x8000);                 /* +-0 */
    case 3: return (uint16_t)((r >> 4) & 0x007f);          /* subnormal */
    default: return (uint16_t)(bf16 ? 0x3c00 + (r >> 4) % 0x0600 : 0x3000 + (r >> 4) % 0x1800);
    }
}

/* The element-at-a-time result (volatile: never vectorised). */
static uint16_t ref_half(dt_reduce_op op, int bf16, uint16_t x, uint16_t y)
{
    volatile float u = bf16 ? dt__bf16_to_f32(x) : dt__f16_to_f32(x);
    volatile float v = bf16 ? dt__bf16_to_f32(y) : dt__f16_to_f32(y);
    if (op == DT_REDUCE_SUM) {
        float s = u + v;
        return bf16 ? dt__f32_to_bf16(s) : dt__f32_to_f16(s);
    }
    if (u != u)
        return x;
    int take = op == DT_REDUCE_MAX ? (v > u || v != v) : (v < u || v != v);
    return take ? y : x;
}

static void check_half(dt_dtype dtype, dt_reduce_op op)
{
    static const int64_t lens[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 1000, 4099};
    int bf16 = dtype == DT_DTYPE_BF16;
    unsigned seed = 17u + (unsigned)op * 3u + (unsigned)bf16;
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
        for (int shift = 0; shift < 4; shift++) {
            int64_t n = lens[l];
            uint16_t *x = malloc((size_t)(n + 8) * 2), *y = malloc((size_t)(n + 8) * 2);
            uint16_t *want = malloc((size_t)(n + 8) * 2);
            CU_ASSERT_PTR_NOT_NULL_FATAL(x && y && want);
            for (int64_t i = 0; i < n + 8; i++) {
                x[i] = pattern(&seed, bf16);
                y[i] = pattern(&seed, bf16);
            }
            /* Destination and source misaligned differently. */
            uint16_t *d = x + shift, *s = y + (3 - shift);
            for (int64_t i = 0; i < n; i++)
                want[i] = ref_half(op, bf16, d[i], s[i]);
            uint16_t guard = x[shift + n];
            dt__host_reduce(op, dtype, d, s, n);
            int64_t bad = -1;
            for (int64_t i = 0; i < n && bad < 0; i++)
                if (d[i] != want[i])
                    bad = i;
            if (bad >= 0)
                fprintf(stderr, "dtype %d op %d n %lld shift %d: element %lld is 0x%04x, "
                        "want 0x%04x\n", (int)dtype, (int)op, (long long)n, shift,
                        (long long)bad, d[bad], want[bad]);
            CU_ASSERT_EQUAL(bad, -1);
            CU_ASSERT_EQUAL(x[shift + n], guard); /* nothing written past the end */
            /* Aliased: x + x, element by element. */
            for (int64_t i = 0; i < n; i++)
                want[i] = ref_half(op, bf16, d[i], d[i]);
            dt__host_reduce(op, dtype, d, d, n);
            CU_ASSERT_EQUAL(memcmp(d, want, (size_t)n * 2), 0);
            free(x);
            free(y);
            free(want);
        }
}

static void test_half_kernels_give_the_element_at_a_time_bits(void)
{
    const dt_reduce_op ops[] = {DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_MIN};
    for (int k = 0; k < 3; k++) {
        check_half(DT_DTYPE_BF16, ops[k]);
        check_half(DT_DTYPE_F16, ops[k]);
    }
}

/* bf16 has 7 fraction bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 and rounds to the even
 * 1 (0x3f80); (1 + 2^-7) + 2^-8 is halfway between 0x3f81 and 0x3f82 and rounds to 0x3f82;
 * 2 + 3 = 5 exactly (0x40a0); inf + 1 = inf; inf + -inf is a NaN. */
static void test_bf16_sum_rounds_ties_to_even(void)
{
    uint16_t x[5] = {0x3f80, 0x3f81, 0x4000, 0x7f80, 0x7f80};
    const uint16_t y[5] = {0x3b80, 0x3b80, 0x4040, 0x3f80, 0xff80};
    dt__host_reduce(DT_REDUCE_SUM, DT_DTYPE_BF16, x, y, 5);
    CU_ASSERT_EQUAL(x[0], 0x3f80);
    CU_ASSERT_EQUAL(x[1], 0x3f82);
    CU_ASSERT_EQUAL(x[2], 0x40a0);
    CU_ASSERT_EQUAL(x[3], 0x7f80);
    CU_ASSERT((x[4] & 0x7f80) == 0x7f80 && (x[4] & 0x007f) != 0);
}

/* The native types over the same lengths: sums against a plain loop, integer and float. */
static void test_native_sums_match_a_plain_loop(void)
{
    for (int64_t n = 0; n < 70; n += 3) {
        float xf[80], yf[80], wf[80];
        int32_t xi[80], yi[80], wi[80];
        for (int64_t i = 0; i < n + 1; i++) {
            xf[i] = (float)(i * 0.37 - 5);
            yf[i] = (float)(1.0 / (i + 1));
            xi[i] = (int32_t)(i * 7919 - 300);
            yi[i] = (int32_t)(i * i);
        }
        for (int64_t i = 0; i < n; i++) {
            volatile float s = xf[i + 1] + yf[i];
            wf[i] = s;
            wi[i] = xi[i + 1] + yi[i];
        }
        dt__host_reduce(DT_REDUCE_SUM, DT_DTYPE_F32, xf + 1, yf, n);
        dt__host_reduce(DT_REDUCE_SUM, DT_DTYPE_I32, xi + 1, yi, n);
        CU_ASSERT_EQUAL(memcmp(xf + 1, wf, (size_t)n * sizeof(float)), 0);
        CU_ASSERT_EQUAL(memcmp(xi + 1, wi, (size_t)n * sizeof(int32_t)), 0);
    }
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_half_kernels_give_the_element_at_a_time_bits),
        DT_TEST(test_bf16_sum_rounds_ties_to_even),
        DT_TEST(test_native_sums_match_a_plain_loop),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "runtime_reduce_host", cases, 0);
}
