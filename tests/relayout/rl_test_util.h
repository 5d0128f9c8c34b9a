/* Helpers of the relayout tests: a seeded generator, an independent shard-box formula, a
 * reference value per (summand, element), and building / checking tensors against it. */
#ifndef DT_RL_TEST_UTIL_H
#define DT_RL_TEST_UTIL_H

#include <stdint.h>

#include "dtensor/dtensor.h"

typedef struct rl_rng {
    uint64_t s;
} rl_rng;

uint64_t rl_next(rl_rng *r);
/* Uniform in [0, n). */
int64_t rl_below(rl_rng *r, int64_t n);

/* The value summand `c` of a partial tensor holds at global element `e` (small integers so
 * that every reduction is exact in every dtype). */
double rl_summand_value(uint64_t seed, int64_t c, int64_t e, dt_dtype dtype);

/* Packs the tensor `layout`/`shape`/`dtype` whose partial summand c (mixed-radix index of the
 * position's coordinates on the layout's partial dims) holds rl_summand_value(seed, c, e). */
dt_status rl_make_tensor(const dt_layout *layout, const int64_t *shape, dt_dtype dtype,
                         uint64_t seed, dt_tensor **out);

/* Checks every local component of `t` against the value of the source (src_layout, seed)
 * relaid out per the relayout rules (reduced src partial dims, kept ones selected by
 * coordinate, zeros off coordinate 0 of new sum-partial dims). Returns the number of
 * mismatching elements and prints the first few. */
int64_t rl_check_tensor(const dt_tensor *t, const dt_layout *src_layout, uint64_t seed);

/* A rank-2 layout with specs a, b, partial (sum) over mesh dim `partial` unless NULL;
 * asserts it was made. */
dt_layout *rl_layout2(const dt_mesh *m, const char *a, const char *b, const char *partial);

/* Shard box by the uneven rule, written independently of the library. */
void rl_box_of(int64_t n, int64_t k, int64_t j, int64_t *off, int64_t *len);

/* A random layout: each tensor dim sharded on an unused mesh dim with probability 1/2; with
 * `partial`, each remaining mesh dim partial with probability 1/3, all with reduction op. */
dt_status rl_random_layout(rl_rng *r, const dt_mesh *m, int rank, int partial, dt_reduce_op op,
                           dt_layout **out);

#endif
