/* dt__copy_large (runtime/copy.c): the streaming copy gives memcpy's bytes for sizes around
 * its threshold and its four-page blocks, with every misalignment of source and destination
 * it handles differently (the 64-byte head, the lines, the tail), and writes nothing outside
 * the destination. Checked byte by byte against a plain loop; also with streaming off. And
 * dt__zero_large, the same way. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/util.h"

#define GUARD 128      /* bytes checked either side of the destination */
#define FILL 0xA5

/* Sizes: below the threshold, at it, a byte over, partial four-page blocks, odd tails. */
static const size_t sizes[] = {
    0, 1, 63, 4097, DT__COPY_LARGE - 1, DT__COPY_LARGE, DT__COPY_LARGE + 1,
    DT__COPY_LARGE + 3 * 4096 + 5 * 64 + 7, DT__COPY_LARGE + 16384 - 64,
    2 * DT__COPY_LARGE + 12345,
};
static const size_t shifts[] = {0, 1, 15, 16, 33, 63};

static unsigned char *src_buf, *dst_buf;
static size_t cap;

/* A pattern no shift of itself repeats within a line: bytes of a 64-bit LCG. */
static void fill_source(size_t n)
{
    uint64_t x = 0x9E3779B97F4A7C15u;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        src_buf[i] = (unsigned char)(x >> 56);
    }
}

/* 0 if dst[GUARD + dshift ..] holds src[sshift ..] for n bytes and the guards are intact;
 * else the first wrong offset from dst's guard start, plus 1. */
static size_t first_wrong(size_t n, size_t sshift, size_t dshift)
{
    const unsigned char *d = dst_buf + dshift, *s = src_buf + sshift;
    for (size_t i = 0; i < GUARD; i++)
        if (d[i] != FILL || d[GUARD + n + i] != FILL)
            return (d[i] != FILL ? i : GUARD + n + i) + 1;
    for (size_t i = 0; i < n; i++)
        if (d[GUARD + i] != s[i])
            return GUARD + i + 1;
    return 0;
}

static void check_all(int streaming)
{
    dt__copy_set_streaming(streaming);
    for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; a++)
        for (size_t b = 0; b < sizeof shifts / sizeof shifts[0]; b++)
            for (size_t c = 0; c < sizeof shifts / sizeof shifts[0]; c += b % 2 ? 1 : 2) {
                size_t n = sizes[a], ss = shifts[b], ds = shifts[c];
                memset(dst_buf, FILL, n + 2 * GUARD + 64);
                dt__copy_large(dst_buf + ds + GUARD, src_buf + ss, n);
                size_t bad = first_wrong(n, ss, ds);
                if (bad)
                    fprintf(stderr, "size %zu, src +%zu, dst +%zu: wrong at %zu\n", n, ss, ds,
                            bad - 1);
                CU_ASSERT_EQUAL(bad, 0);
            }
    dt__copy_set_streaming(1);
}

/* dt__zero_large: zeros exactly the n bytes at every misalignment, the guards intact. */
static void zero_all(int streaming)
{
    /* below the threshold, at it, and with a partial line and odd tail past it */
    static const size_t zsizes[] = {63, DT__COPY_LARGE, DT__COPY_LARGE + 3 * 4096 + 5 * 64 + 7};
    dt__copy_set_streaming(streaming);
    for (size_t a = 0; a < sizeof zsizes / sizeof zsizes[0]; a++)
        for (size_t c = 0; c < sizeof shifts / sizeof shifts[0]; c += 2) { /* 0, 15, 33 */
            size_t n = zsizes[a], ds = shifts[c], bad = 0;
            memset(dst_buf, FILL, n + 2 * GUARD + 64);
            dt__zero_large(dst_buf + ds + GUARD, n);
            const unsigned char *d = dst_buf + ds;
            for (size_t i = 0; i < GUARD && !bad; i++)
                if (d[i] != FILL || d[GUARD + n + i] != FILL)
                    bad = (d[i] != FILL ? i : GUARD + n + i) + 1;
            for (size_t i = 0; i < n && !bad; i++)
                if (d[GUARD + i] != 0)
                    bad = GUARD + i + 1;
            if (bad)
                fprintf(stderr, "zero %zu bytes, dst +%zu: wrong at %zu\n", n, ds, bad - 1);
            CU_ASSERT_EQUAL(bad, 0);
        }
    dt__copy_set_streaming(1);
}

static void test_zero_large_zeroes_exactly_its_bytes(void)
{
    zero_all(1); /* off, it is memset */
}

static void test_copy_large_matches_bytes_with_streaming(void)
{
    check_all(1);
}

static void test_copy_large_matches_bytes_without_streaming(void)
{
    check_all(0);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_copy_large_matches_bytes_with_streaming),
        DT_TEST(test_copy_large_matches_bytes_without_streaming),
        DT_TEST(test_zero_large_zeroes_exactly_its_bytes),
        DT_TEST_END,
    };
    cap = 2 * DT__COPY_LARGE + 12345 + 2 * GUARD + 128;
    /* 64-byte aligned, so the shifts give exactly those misalignments. */
    if (posix_memalign((void **)&src_buf, 64, cap) || posix_memalign((void **)&dst_buf, 64, cap))
        return 1;
    fill_source(cap);
    int rc = dt_test_main(argc, argv, "runtime_copy", cases, 0);
    free(src_buf);
    free(dst_buf);
    return rc;
}
