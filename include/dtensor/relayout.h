/* libdtensor: moving tensors between layouts and meshes, and the mesh barrier. */
#ifndef DTENSOR_RELAYOUT_H
#define DTENSOR_RELAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/export.h"
#include "dtensor/layout.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returns a new tensor holding the same global value as `src` laid out as `layout` (same mesh,
 * same rank). Any pair of layouts: sharding, unsharding (all-gather), moving a shard between
 * tensor dims or mesh dims (all-to-all), several dims at once, partial -> replicated
 * (all-reduce) or sharded (reduce-scatter), unsharded/sharded -> partial (one member of each
 * new partial group holds the value, the others the reduction's identity), uneven sizes, any
 * dtype. Every piece moves once, from the holder nearest its receiver. Plans are cached.
 * Collective: every client holding devices of the mesh calls it, in the same order.
 * DT_ERR_SHAPE if the layout's rank or mesh does not fit; DT_ERR_COMM on transport failure. */
DT_API dt_status dt_relayout(const dt_tensor *src, const dt_layout *layout, dt_tensor **out);

/* Like dt_relayout into an existing tensor `dst` (its layout, shape and dtype fixed), so a
 * caller can reuse its buffers. `dst` must not share memory with `src`. Collective. */
DT_API dt_status dt_relayout_into(const dt_tensor *src, dt_tensor *dst);

/* Copies `src` onto another mesh (same or different device count and type, e.g. a GPU mesh
 * to its host mesh, or 4 devices to 2) with `layout` on that mesh. Collective over the
 * clients of both meshes. */
DT_API dt_status dt_copy_to_mesh(const dt_tensor *src, const dt_layout *layout, dt_tensor **out);

/* Traffic of one local device in the last relayout this client executed. Bytes moved between
 * different devices count as sent by the holder and received by the receiver; a piece a
 * device copies to itself counts as `bytes_self`. `bytes_*_remote` is the part that crossed
 * to or from another process, `bytes_*_cross_host` the part of that which crossed to or from
 * another host (bytes_sent - bytes_sent_cross_host stayed inside this host). */
typedef struct dt_relayout_stats {
    int device_id;
    dt_device_type device_type;
    uint64_t bytes_sent;
    uint64_t bytes_received;
    uint64_t bytes_sent_remote;
    uint64_t bytes_received_remote;
    uint64_t bytes_self;
    uint64_t bytes_sent_cross_host;
    uint64_t bytes_received_cross_host;
} dt_relayout_stats;

/* Writes the stats of up to `cap` devices of this client that took part in the last relayout
 * (source or destination side), ordered by device type then id; *count_out gets the total.
 * Also reports whether the plan came from the cache (*cached_out, may be NULL). Local.
 * DT_ERR_STATE if this client has executed no relayout. */
DT_API dt_status dt_relayout_last_stats(int cap, dt_relayout_stats *stats_out, int *count_out,
                                        int *cached_out);

/* Drops every cached relayout plan (they are also dropped by dt_finalize). Local. */
DT_API void dt_relayout_cache_clear(void);

/* DTensor's barrier: an all-reduce of ones over the mesh's devices, checked against the mesh
 * size. `name` (may be NULL) must be the same on every client; a mismatch is DT_ERR_STATE.
 * After timeout_seconds (<= 0: DT_COMM_TIMEOUT's, default 300 s, docs/multihost.md),
 * DT_ERR_TIMEOUT with a message listing the clients that never arrived and their hosts (the
 * job must then be aborted).
 * Collective over the clients holding devices of the mesh. */
DT_API dt_status dt_barrier(const dt_mesh *mesh, const char *name, double timeout_seconds);

#ifdef __cplusplus
}
#endif
#endif
