/* The order of an epoch: a permutation drawn from (seed, epoch) alone, so any client computes
 * any epoch's order without the ones before it (xoshiro256** seeded through splitmix64). */
#include "data/data_impl.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t next(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, n), n >= 1, by rejection (no modulo bias). */
static uint64_t below(uint64_t s[4], uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do
        v = next(s);
    while (v >= limit);
    return v % n;
}

void dd_epoch_order(uint64_t seed, int64_t epoch, int shuffle, int64_t n, int64_t *perm)
{
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    if (!shuffle)
        return;
    uint64_t x = seed ^ (0xd1b54a32d192ed03ULL * ((uint64_t)epoch + 1)), s[4];
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&x);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)below(s, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}
