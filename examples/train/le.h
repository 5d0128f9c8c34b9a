/* train/le: little-endian 64-bit words in byte buffers, the form of every piece of state the
 * example saves as a checkpoint value (RNG, data order, history). */
#ifndef TRAIN_LE_H
#define TRAIN_LE_H

#include <stdint.h>

static inline void le_put_u64(uint8_t *p, uint64_t v)
{
    for (int b = 0; b < 8; b++)
        p[b] = (uint8_t)(v >> (8 * b));
}

static inline uint64_t le_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int b = 0; b < 8; b++)
        v |= (uint64_t)p[b] << (8 * b);
    return v;
}

#endif
