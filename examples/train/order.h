/* train/order: the data order: epochs of a seeded shuffle of the training rows, cut into
 * global batches; the whole state (permutation, position, epoch, PRNG) fits in a checkpoint
 * value, so a resumed run draws exactly the batches an uninterrupted one would. */
#ifndef TRAIN_ORDER_H
#define TRAIN_ORDER_H

#include <stddef.h>
#include <stdint.h>

#include "rng.h"

typedef struct order {
    int64_t n;      /* training rows */
    int32_t *perm;  /* this epoch's permutation of 0..n-1 */
    int64_t cursor; /* next position in perm */
    int64_t epoch;
    rng r;
} order;

/* Starts epoch 0 with a shuffle seeded by `seed`. Returns 0, or -1 when out of memory. */
int order_init(order *o, int64_t n, uint64_t seed);
void order_free(order *o);

/* The next `batch` row indices (batch <= n): the rest of the epoch if at least `batch`
 * remain, else (dropping the remainder) the start of a new, reshuffled epoch. */
void order_next(order *o, int64_t batch, int32_t *rows_out);

/* Serialised form, two blobs: the order (little-endian n, cursor, epoch, then perm as 32-bit
 * values) and the PRNG state (RNG_STATE_BYTES, rng_save). */
size_t order_bytes(const order *o);
void order_serialize(const order *o, uint8_t *out, uint8_t rng_out[RNG_STATE_BYTES]);
/* Returns 0, or -1 (o unchanged) when the bytes are not a valid state for o->n rows. */
int order_deserialize(order *o, const void *data, size_t nbytes, const void *rng_data,
                      size_t rng_nbytes);

#endif
