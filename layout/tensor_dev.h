/* What layout/ offers the modules above the runtime besides the public API: a component's
 * device, tensors allocated but not initialised, and relayouts that share buffers where the
 * placement does not change. Not installed. */
#ifndef DTENSOR_LAYOUT_TENSOR_DEV_H
#define DTENSOR_LAYOUT_TENSOR_DEV_H

#include "dtensor/tensor.h"
#include "runtime/device.h"

/* The device of a tensor's local component i (NULL if out of range). */
const dt__device *dt__tensor_device(const dt_tensor *t, int i);

/* A tensor whose local components are allocated (host pool or device) but not initialised:
 * for producers that overwrite every element (relayout). */
dt_status dt__tensor_empty(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                           dt_tensor **tensor_out);

/* 1 if layouts a and b place every element of any tensor on the same devices at the same
 * local offsets: the same mesh and rank, and they differ at most by splits or pending sums
 * (partial) over mesh dims of one device. Local, no status. */
int dt__layout_same_placement(const dt_layout *a, const dt_layout *b);

/* A tensor laid out as `layout` that shares src's local buffers (it retains src; writes into
 * either show in both). The layout must place src like its own (dt__layout_same_placement);
 * DT_ERR_SHAPE if a component would differ. Local. */
dt_status dt__tensor_share(const dt_tensor *src, const dt_layout *layout, dt_tensor **tensor_out);

/* 1 when writing into t's memory in place can be seen through no other handle: one
 * reference, not a view of another tensor, every component's memory its own allocation (not
 * a managed tensor taken over). Local. */
int dt__tensor_exclusive(const dt_tensor *t);

/* dt_relayout for callers that only read the result or hold the last reference to src: where
 * the layouts place src alike (dt__layout_same_placement) it moves nothing and hands back a
 * tensor sharing src's buffers (dt__tensor_share), a reference to src itself if the layouts
 * are equal; otherwise a dt_relayout. Collective (every client takes the same branch, since
 * the choice depends only on the layouts). */
dt_status dt__relayout_shared(const dt_tensor *src, const dt_layout *layout, dt_tensor **out);

#endif
