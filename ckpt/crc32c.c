/* CRC32C (Castagnoli): SSE4.2 instructions over three interleaved streams where the CPU has
 * them, a slicing-by-8 table otherwise, and zlib-style combination of CRCs by GF(2) algebra. */
#include <pthread.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
#define CK_HAVE_X86 1
#endif

#define POLY 0x82F63B78u

static uint32_t table[8][256];
static uint32_t x2n[64];         /* x^(2^k) mod P */
static int have_hw;
static uint32_t shift_1, shift_2;  /* x^(8*BLK), x^(16*BLK): for the 3-stream merge */
static pthread_once_t once = PTHREAD_ONCE_INIT;

enum { BLK = 16384 };            /* bytes per stream per round */

/* a*b mod P, reflected (bit 31 is x^0). */
static uint32_t multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = (uint32_t)1 << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x^(n * 2^k) mod P. */
static uint32_t x2nmodp(uint64_t n, unsigned k)
{
    uint32_t p = (uint32_t)1 << 31;
    while (n) {
        if (n & 1)
            p = multmodp(x2n[k & 63], p);
        n >>= 1;
        k++;
    }
    return p;
}

static void init_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int j = 0; j < 8; j++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
    x2n[0] = (uint32_t)1 << 30;  /* x^1 */
    for (int k = 1; k < 64; k++)
        x2n[k] = multmodp(x2n[k - 1], x2n[k - 1]);
    shift_1 = x2nmodp(BLK, 3);
    shift_2 = x2nmodp(2 * (uint64_t)BLK, 3);
#ifdef CK_HAVE_X86
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2");
#endif
}

/* Raw register update (no pre/post inversion), table version. */
static uint32_t sw_update(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
              table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^
              table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#ifdef CK_HAVE_X86
__attribute__((target("sse4.2"))) static uint32_t hw_update(uint32_t crc, const unsigned char *p,
                                                           size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        crc = _mm_crc32_u8(crc, *p++);
        len--;
    }
    /* Three independent streams hide the instruction's latency; merge by shifting. */
    while (len >= 3 * (size_t)BLK) {
        uint64_t c0 = crc, c1 = 0, c2 = 0, w0, w1, w2;
        for (size_t i = 0; i < BLK; i += 8) {
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + BLK + i, 8);
            memcpy(&w2, p + 2 * BLK + i, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
        }
        crc = multmodp(shift_2, (uint32_t)c0) ^ multmodp(shift_1, (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * (size_t)BLK;
        len -= 3 * (size_t)BLK;
    }
    uint64_t c = crc, w;
    while (len >= 8) {
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        len -= 8;
    }
    crc = (uint32_t)c;
    while (len--)
        crc = _mm_crc32_u8(crc, *p++);
    return crc;
}
#endif

uint32_t dt_crc32c(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&once, init_tables);
    const unsigned char *p = data;
    crc = ~crc;
    if (len == 0)
        return ~crc;
#ifdef CK_HAVE_X86
    if (have_hw)
        return ~hw_update(crc, p, len);
#endif
    return ~sw_update(crc, p, len);
}

uint32_t dt__crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    pthread_once(&once, init_tables);
    return multmodp(x2nmodp(len_b, 3), crc_a) ^ crc_b;
}
