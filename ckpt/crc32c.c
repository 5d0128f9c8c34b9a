/* CRC32C (Castagnoli): carry-less multiplication folding (AVX-512 VPCLMULQDQ) together with
 * the SSE4.2 CRC32 instruction where the CPU has both, the CRC32 instruction over three
 * interleaved streams where it has SSE4.2 only, a slicing-by-8 table otherwise; zlib-style
 * combination of CRCs by GF(2) algebra. */
#include <pthread.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <nmmintrin.h>
#define CK_HAVE_X86 1
#endif

#define POLY 0x82F63B78u

static uint32_t table[8][256];
static uint32_t x2n[64];         /* x^(2^k) mod P */
static int have_hw, have_fold;
static uint32_t shift_1, shift_2;  /* x^(8*BLK), x^(16*BLK): for the 3-stream merge */
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* Folding constants (see fold512): for a distance of d bits, x^(d+63) and x^(d-1) mod P,
 * reflected, in the upper half of a 64-bit word. */
static uint64_t fold_4096[2], fold_512[2], fold_384[2], fold_256[2], fold_128[2];
/* Hybrid blocks (hybrid_block): HYB_ROUNDS folding rounds of 512 bytes, and three CRC32
 * streams of HYB_STEP bytes per round; hyb_shift[m-1] = x^(8 m HYB_STREAM - 33) mod P. */
enum { HYB_ROUNDS = 32, HYB_STEP = 96 };
#define HYB_FOLD   ((size_t)HYB_ROUNDS * 512)
#define HYB_STREAM ((size_t)HYB_ROUNDS * HYB_STEP)
#define HYB_BYTES  (HYB_FOLD + 3 * HYB_STREAM)
static uint32_t hyb_shift[3];

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
    uint64_t *k[] = {fold_4096, fold_512, fold_384, fold_256, fold_128};
    const unsigned d[] = {4096, 512, 384, 256, 128};
    for (int i = 0; i < 5; i++) {
        k[i][0] = (uint64_t)x2nmodp(d[i] + 63, 0) << 32;
        k[i][1] = (uint64_t)x2nmodp(d[i] - 1, 0) << 32;
    }
    for (int m = 1; m <= 3; m++)
        hyb_shift[m - 1] = x2nmodp(8 * (uint64_t)m * HYB_STREAM - 33, 0);
#ifdef CK_HAVE_X86
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2");
    have_fold = have_hw && __builtin_cpu_supports("avx512f") &&
                __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul");
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

#ifdef CK_HAVE_X86
#define FOLD_TARGET __attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq")))

/* One 128-bit lane A (message bits, first bit in bit 0: bit i stands for x^(127-i)) moved d
 * bits further: A = H x^64 + L becomes H x^(d+64) + L x^d, with the powers replaced by their
 * residues mod P (degree < 32, so the sum fits a lane). A carry-less product of two reflected
 * 64-bit words comes out one bit short (x^(126-k) at bit k), hence x^(d+63) and x^(d-1). */
FOLD_TARGET static inline __m512i fold512(__m512i a, __m512i k, __m512i next)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
                                     _mm512_clmulepi64_epi128(a, k, 0x11), next, 0x96);
}

FOLD_TARGET static inline __m128i fold128(__m128i a, const uint64_t *k, __m128i next)
{
    __m128i kk = _mm_set_epi64x((long long)k[1], (long long)k[0]);
    __m128i lo = _mm_clmulepi64_si128(a, kk, 0x00), hi = _mm_clmulepi64_si128(a, kk, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

/* A pair of folding constants in every lane. */
FOLD_TARGET static inline __m512i lanes(const uint64_t *k)
{
    return _mm512_broadcast_i32x4(_mm_set_epi64x((long long)k[1], (long long)k[0]));
}

/* The raw register of the message folded into x[0..7] (eight consecutive 64-byte blocks):
 * x[0..6] fold into x[7], its four lanes into one, and the CRC32 instruction reduces that
 * lane mod P. */
FOLD_TARGET static uint32_t fold_reduce(__m512i *x)
{
    __m512i k512 = lanes(fold_512);
    for (int i = 1; i < 8; i++)
        x[i] = fold512(x[i - 1], k512, x[i]);
    __m128i last = _mm512_extracti32x4_epi32(x[7], 3);
    __m128i r = fold128(_mm512_extracti32x4_epi32(x[7], 0), fold_384, last);
    r = fold128(_mm512_extracti32x4_epi32(x[7], 1), fold_256, r);
    r = fold128(_mm512_extracti32x4_epi32(x[7], 2), fold_128, r);
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(r));
    return (uint32_t)_mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(r, 1));
}

/* Loads the first 512 bytes into x, the register entering as the first 32 message bits. */
FOLD_TARGET static inline void fold_start(__m512i *x, uint32_t crc, const unsigned char *p)
{
    for (int i = 0; i < 8; i++)
        x[i] = _mm512_loadu_si512(p + 64 * i);
    x[0] = _mm512_xor_si512(x[0], _mm512_castsi128_si512(_mm_cvtsi32_si128((int)crc)));
}

/* Raw register update by carry-less multiplication (PCLMULQDQ folding, Intel's "Fast CRC
 * Computation for Generic Polynomials"), 512 bytes per round in eight 512-bit accumulators
 * (enough to hide the multiplier's latency); len >= 512, whole rounds only: returns the
 * register after the first len / 512 * 512 bytes. */
FOLD_TARGET static uint32_t fold_rounds(uint32_t crc, const unsigned char *p, size_t len)
{
    __m512i k4096 = lanes(fold_4096);
    __m512i x[8];
    fold_start(x, crc, p);
    for (size_t at = 512; at + 512 <= len; at += 512)
        for (int i = 0; i < 8; i++)
            x[i] = fold512(x[i], k4096, _mm512_loadu_si512(p + at + 64 * i));
    return fold_reduce(x);
}

/* a * x^e mod P for k = x^(e-33) mod P (reflected): the carry-less product of two reflected
 * 32-bit values is a 64-bit message worth a*k*x, which the CRC32 instruction multiplies by
 * x^32 and reduces. */
FOLD_TARGET static inline uint32_t mul_by(uint32_t a, uint32_t k)
{
    __m128i p = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)a), _mm_cvtsi32_si128((int)k), 0);
    return (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(p));
}

/* One block of HYB_BYTES: the multiplier folds the first HYB_FOLD bytes while the CRC32
 * instruction, which runs on other execution units, takes three streams of HYB_STREAM bytes
 * after them, 96 bytes of each per folding round; the four parts are merged by shifting. */
FOLD_TARGET static uint32_t hybrid_block(uint32_t crc, const unsigned char *p)
{
    __m512i k4096 = lanes(fold_4096);
    const unsigned char *s = p + HYB_FOLD;
    uint64_t c1 = 0, c2 = 0, c3 = 0, w1, w2, w3;
    __m512i x[8];
    fold_start(x, crc, p);
    for (size_t r = 0; r < HYB_ROUNDS; r++) {
        if (r > 0)
            for (int i = 0; i < 8; i++)
                x[i] = fold512(x[i], k4096, _mm512_loadu_si512(p + 512 * r + 64 * i));
        for (size_t j = r * HYB_STEP; j < (r + 1) * HYB_STEP; j += 8) {
            memcpy(&w1, s + j, 8);
            memcpy(&w2, s + HYB_STREAM + j, 8);
            memcpy(&w3, s + 2 * HYB_STREAM + j, 8);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            c3 = _mm_crc32_u64(c3, w3);
        }
    }
    uint32_t cf = fold_reduce(x);
    return mul_by(cf, hyb_shift[2]) ^ mul_by((uint32_t)c1, hyb_shift[1]) ^
           mul_by((uint32_t)c2, hyb_shift[0]) ^ (uint32_t)c3;
}

/* Raw register update for len >= 1024: hybrid blocks, then folding rounds, then the CRC32
 * instruction for the last bytes. */
FOLD_TARGET static uint32_t fold_update(uint32_t crc, const unsigned char *p, size_t len)
{
    for (; len >= HYB_BYTES; p += HYB_BYTES, len -= HYB_BYTES)
        crc = hybrid_block(crc, p);
    if (len >= 1024) {
        crc = fold_rounds(crc, p, len);
        p += len / 512 * 512;
        len %= 512;
    }
    uint64_t c = crc, w;
    for (; len >= 8; p += 8, len -= 8) {
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
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
    if (have_fold && len >= 1024)
        return ~fold_update(crc, p, len);
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
