/* train/rng: the example's own seeded PRNG (xoshiro256** seeded through splitmix64), so the
 * data order is the same on every process and can be saved in a checkpoint and resumed. */
#ifndef TRAIN_RNG_H
#define TRAIN_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct rng {
    uint64_t s[4];
} rng;

/* Bytes of a serialised state (four little-endian 64-bit words). */
#define RNG_STATE_BYTES 32

void rng_seed(rng *r, uint64_t seed);
uint64_t rng_next(rng *r);
/* Uniform in [0, n) without modulo bias; n >= 1. */
uint64_t rng_below(rng *r, uint64_t n);
/* Uniform double in [0, 1), 53 bits. */
double rng_uniform(rng *r);
/* Standard normal (Box-Muller; two draws per call, no cached spare, so the state alone is
 * everything there is to save). */
double rng_normal(rng *r);
/* Fisher-Yates shuffle of n int32 values in place. */
void rng_shuffle(rng *r, int32_t *a, int64_t n);

void rng_save(const rng *r, uint8_t out[RNG_STATE_BYTES]);
/* Returns 0, or -1 for an all-zero state (not one xoshiro can be in). */
int rng_load(rng *r, const uint8_t in[RNG_STATE_BYTES]);

#endif
