/* train/rng: xoshiro256** (Blackman and Vigna, 2018) seeded by splitmix64, with bounded
 * integers, uniform and normal doubles, a shuffle, and a byte-order-independent state. */
#include "rng.h"

#include <math.h>

#include "le.h"

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

void rng_seed(rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

uint64_t rng_next(rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t rng_below(rng *r, uint64_t n)
{
    /* Reject the top partial range so every residue is equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do
        v = rng_next(r);
    while (v >= limit);
    return v % n;
}

double rng_uniform(rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

double rng_normal(rng *r)
{
    double u1 = 1.0 - rng_uniform(r); /* (0, 1]: log is finite */
    double u2 = rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void rng_shuffle(rng *r, int32_t *a, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rng_below(r, (uint64_t)i + 1);
        int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

void rng_save(const rng *r, uint8_t out[RNG_STATE_BYTES])
{
    for (int i = 0; i < 4; i++)
        le_put_u64(out + 8 * i, r->s[i]);
}

int rng_load(rng *r, const uint8_t in[RNG_STATE_BYTES])
{
    uint64_t s[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++)
        s[i] = le_get_u64(in + 8 * i);
    if ((s[0] | s[1] | s[2] | s[3]) == 0)
        return -1;
    for (int i = 0; i < 4; i++)
        r->s[i] = s[i];
    return 0;
}
