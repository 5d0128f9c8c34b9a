/* Ring attention over the local components of sequence-sharded tensors (ops/attention_ring.c,
 * docs/attention.md "Ring attention"). Not installed. */
#ifndef DTENSOR_OPS_ATTENTION_RING_H
#define DTENSOR_OPS_ATTENTION_RING_H

#include "ops/ops_impl.h"

/* q [B, T, heads * hd], k, v [B, T, kv_heads * hd] (o's heads, kv_heads, causal mask and
 * dropout of the probabilities, kv_heads resolved), all in one layout sharding the sequence
 * (contiguous shards, dt_shard_range) over mesh dim sdim of a CPU mesh. y (forward) or dq, dk,
 * dv (backward, dy given) are new tensors of that layout, filled. Collective over the clients
 * of sdim's lines (point to point with the neighbours only). */
dt_status dt__attention_ring(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                             const dt_tensor *dy, const dt_attention_opts *o, int sdim,
                             dt_tensor *y, dt_tensor *dq, dt_tensor *dk, dt_tensor *dv);

/* What the ring did on this client since the last reset: bytes sent to other clients, its
 * messages, and the seconds its waits on them took (the communication not hidden behind the
 * compute). For bench/attention_cp.c. Local. */
typedef struct dt__ring_stats {
    double bytes, wait_s;
    long long messages;
} dt__ring_stats;
void dt__attention_ring_stats(dt__ring_stats *out, int reset);

#endif
