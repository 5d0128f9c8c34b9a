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
    while (g < end) {
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
