/* train/order: epochs of shuffled row indices, and their checkpoint form. */
#include "order.h"

#include <stdlib.h>
#include <string.h>

#include "le.h"

int order_init(order *o, int64_t n, uint64_t seed)
{
    o->n = n;
    o->cursor = 0;
    o->epoch = 0;
    o->perm = malloc((size_t)(n ? n : 1) * sizeof *o->perm);
    if (!o->perm)
        return -1;
    for (int64_t i = 0; i < n; i++)
        o->perm[i] = (int32_t)i;
    rng_seed(&o->r, seed);
    rng_shuffle(&o->r, o->perm, n);
    return 0;
}

void order_free(order *o)
{
    free(o->perm);
    o->perm = NULL;
}

void order_next(order *o, int64_t batch, int32_t *rows_out)
{
    if (o->cursor + batch > o->n) {
        rng_shuffle(&o->r, o->perm, o->n);
        o->cursor = 0;
        o->epoch++;
    }
    memcpy(rows_out, o->perm + o->cursor, (size_t)batch * sizeof *rows_out);
    o->cursor += batch;
}

size_t order_bytes(const order *o)
{
    return 24 + (size_t)o->n * 4;
}

void order_serialize(const order *o, uint8_t *out, uint8_t rng_out[RNG_STATE_BYTES])
{
    le_put_u64(out, (uint64_t)o->n);
    le_put_u64(out + 8, (uint64_t)o->cursor);
    le_put_u64(out + 16, (uint64_t)o->epoch);
    rng_save(&o->r, rng_out);
    uint8_t *p = out + 24;
    for (int64_t i = 0; i < o->n; i++)
        for (int b = 0; b < 4; b++)
            p[4 * i + b] = (uint8_t)((uint32_t)o->perm[i] >> (8 * b));
}

int order_deserialize(order *o, const void *data, size_t nbytes, const void *rng_data,
                      size_t rng_nbytes)
{
    const uint8_t *p = data;
    if (nbytes != order_bytes(o) || (int64_t)le_get_u64(p) != o->n)
        return -1;
    int64_t cursor = (int64_t)le_get_u64(p + 8), epoch = (int64_t)le_get_u64(p + 16);
    if (cursor < 0 || cursor > o->n || epoch < 0)
        return -1;
    rng r;
    if (rng_nbytes != RNG_STATE_BYTES || rng_load(&r, rng_data) != 0)
        return -1;
    /* A permutation: every index once. */
    uint8_t *seen = calloc((size_t)(o->n ? o->n : 1), 1);
    int32_t *perm = malloc((size_t)(o->n ? o->n : 1) * sizeof *perm);
    int rc = (seen && perm) ? 0 : -1;
    const uint8_t *q = p + 24;
    for (int64_t i = 0; rc == 0 && i < o->n; i++) {
        uint32_t v = (uint32_t)q[4 * i] | (uint32_t)q[4 * i + 1] << 8 |
                     (uint32_t)q[4 * i + 2] << 16 | (uint32_t)q[4 * i + 3] << 24;
        if ((int64_t)v >= o->n || seen[v])
            rc = -1;
        else {
            seen[v] = 1;
            perm[i] = (int32_t)v;
        }
    }
    free(seen);
    if (rc != 0) {
        free(perm);
        return -1;
    }
    free(o->perm);
    o->perm = perm;
    o->cursor = cursor;
    o->epoch = epoch;
    o->r = r;
    return 0;
}
