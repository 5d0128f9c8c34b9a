/* Philox-4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
 * SC 2011), written from the paper's definition, and the dropout mask it keys by the global
 * index of each element (docs/attention.md, "Dropout"). */
#include <stdint.h>
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* golden ratio */
#define PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

void dt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Eight blocks at once where the CPU has AVX2 (32-bit lanes; the 32 x 32 -> 64-bit products
 * of even and odd lanes by _mm256_mul_epu32): the same integer rounds, so the same bits as
 * dt_philox4x32_10 (tests/attention/test_dropout.c compares every element). About 4.5 times
 * the scalar loop's speed, which made dropout of the attention probabilities cost as much as
 * the attention itself. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AVX2_PATH 1

/* The mask of blocks blk .. blk+7 (their low words do not wrap: the caller checks) into
 * out[0..31], element order. */
__attribute__((target("avx2"))) static void mask8_avx2(uint64_t blk, uint64_t stream,
                                                      const uint32_t key[2], uint32_t thresh,
                                                      float keep, float *out)
{
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)blk),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i c1 = _mm256_set1_epi32((int)(uint32_t)(blk >> 32));
    __m256i c2 = _mm256_set1_epi32((int)(uint32_t)stream);
    __m256i c3 = _mm256_set1_epi32((int)(uint32_t)(stream >> 32));
    const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        /* products of the even lanes, then of the odd ones (shifted down) */
        __m256i e0 = _mm256_mul_epu32(c0, m0), o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
        __m256i e1 = _mm256_mul_epu32(c2, m1), o1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
        __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
        __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA);
        __m256i lo1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA);
        __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, 0xAA);
        c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
        c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)k1));
        c1 = lo1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    /* kept when (w >> 8) >= thresh (both below 2^25: the signed compare is exact), then the
     * 4 words x 8 blocks transposed into element order 4 block + word */
    const __m256i th = _mm256_set1_epi32((int)thresh);
    const __m256 kv = _mm256_set1_ps(keep);
    const __m256i c[4] = {c0, c1, c2, c3};
    __m256 f[4];
    for (int j = 0; j < 4; j++)
        f[j] = _mm256_andnot_ps(
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(th, _mm256_srli_epi32(c[j], 8))), kv);
    __m256 t0 = _mm256_unpacklo_ps(f[0], f[1]), t1 = _mm256_unpackhi_ps(f[0], f[1]);
    __m256 t2 = _mm256_unpacklo_ps(f[2], f[3]), t3 = _mm256_unpackhi_ps(f[2], f[3]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    _mm256_storeu_ps(out, _mm256_permute2f128_ps(u0, u1, 0x20));
    _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(u2, u3, 0x20));
    _mm256_storeu_ps(out + 16, _mm256_permute2f128_ps(u0, u1, 0x31));
    _mm256_storeu_ps(out + 24, _mm256_permute2f128_ps(u2, u3, 0x31));
}

static int have_avx2(void)
{
    static _Atomic int v = -1;
    int x = v;
    if (x < 0) {
        __builtin_cpu_init();
        x = __builtin_cpu_supports("avx2") ? 1 : 0;
        v = x;
    }
    return x;
}
#else
#define AVX2_PATH 0
#endif

/* Element g: word g % 4 of Philox(counter {g / 4, stream}, key seed); kept when its top 24 bits
 * as u in [0, 1) are >= p. */
void dt__dropout_mask_run(int64_t first, int64_t n, float p, uint64_t seed, uint64_t stream,
                          float *mask)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    float keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    /* Dropped when the 24-bit draw is below p * 2^24 (p = 0 drops nothing, p = 1 all). */
    uint32_t thresh = (uint32_t)((double)p * 16777216.0);
    int64_t g = first, end = first + n;
#if AVX2_PATH
    int avx2 = have_avx2();
#endif
    while (g < end) {
#if AVX2_PATH
        uint64_t b8 = (uint64_t)g >> 2;
        if (avx2 && (g & 3) == 0 && end - g >= 32 && (uint32_t)b8 <= UINT32_MAX - 7) {
            mask8_avx2(b8, stream, key, thresh, keep, mask + (g - first));
            g += 32;
            continue;
        }
#endif
        uint64_t blk = (uint64_t)g >> 2;
        const uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)stream,
                                 (uint32_t)(stream >> 32)};
        uint32_t w[4];
        dt_philox4x32_10(ctr, key, w);
        for (int j = (int)(g & 3); j < 4 && g < end; j++, g++)
            mask[g - first] = (w[j] >> 8) < thresh ? 0.0f : keep;
    }
}

dt_status dt_kernel_dropout_mask(int64_t first, int64_t n, float p, uint64_t seed, uint64_t stream,
                                 float *mask)
{
    if (first < 0 || n < 0 || !(p >= 0.0f && p <= 1.0f))
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_kernel_dropout_mask: first %lld, n %lld "
                         "must be >= 0 and p %g in [0, 1]",
                         (long long)first, (long long)n, (double)p);
    const void *ptrs[] = {mask};
    dt_status st = dt__kcheck("dt_kernel_dropout_mask", n, 1, ptrs);
    if (st != DT_OK || n == 0)
        return st;
    dt__dropout_mask_run(first, n, p, seed, stream, mask);
    return DT_OK;
}
