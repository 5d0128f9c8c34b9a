/* libdtensor collectives on tensors beyond relayouts: the ragged all-to-all that dispatches
 * the tokens of a mixture of experts (docs/collective.md). */
#ifndef DTENSOR_COLLECTIVE_H
#define DTENSOR_COLLECTIVE_H

#include <stdint.h>

#include "dtensor/export.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ragged all-to-all over the mesh dim named `mesh_dim` (the counts, then the data), on every
 * transport (MPI, same-host shm, staged, NCCL, and copies between devices of one process).
 *
 * Lines. The devices that share every coordinate but mesh_dim form a line of P members
 * (P = that dim's size), member j at coordinate j. Lines are numbered l = 0..L-1 in row-major
 * order of the other mesh dims' coordinates (L = mesh size / P); device (member m, line l)
 * exchanges only with the members of its line.
 *
 * x: rank >= 1, any dtype (f32, f64, bf16, f16, integers), global dim 0 sharded over mesh_dim
 * (uneven shards allowed), its other dims in any layout that does not use mesh_dim; not partial
 * over mesh_dim (partial over other dims passes through: the op is linear). Each device's
 * local shard holds rows [0, sum_j c[j]) grouped by destination member j (member order),
 * c = that device's row of send_counts; rows past the sum are ignored.
 *
 * send_counts: int64 [P*L, P] (one row per device: row m*L + l is member m of line l, so the
 * natural layout shards dim 0 over mesh_dim and replicates the rest), or int64 [P, P] (row m
 * shared by member m of every line). Any layout: it is gathered (a small relayout). Lines
 * that differ only in coordinates of mesh dims over which x is replicated hold the same data,
 * so their rows must agree: checked under DT_CHECK_COLLECTIVES.
 *
 * out_rows: the local row count of each device's output shard; 0 = the largest number of
 * rows any device of the mesh receives, at least 1 (the library has no zero-size dims: a
 * mesh where nobody receives anything still gets one zero row per device).
 *
 * *y_out: a new tensor in x's layout, global dim 0 = P * out_rows; each device's shard holds
 * the rows received from member 0, then member 1, ... (each source's rows in its own order),
 * zero rows after.
 * *recv_counts_out (may be NULL): int64 in send_counts' shape and layout: the rows each
 * device received from each member (the transpose of send_counts within each line).
 *
 * A device sending or receiving zero rows neither hangs nor errors. DT_ERR_INVALID_ARGUMENT
 * (message naming the device, its line position and counts) for NULL arguments, an unknown
 * mesh_dim, a wrong layout, shape or dtype of send_counts, negative counts, counts summing
 * past a device's shard, or a device receiving more than out_rows; DT_ERR_COMM /
 * DT_ERR_TIMEOUT from the transport; DT_ERR_STATE from DT_CHECK_COLLECTIVES. Outputs are
 * written only on success.
 *
 * Recorded by a recording tape (autograd.h) as the op definition "alltoallv" (opdef.h): its
 * backward is the ragged all-to-all of dy with the received counts and out_rows = x's local
 * rows; send_counts is not differentiated. Recorded by the flight recorder (trace.h).
 * Collective over the mesh's clients; a client outside the mesh gets tensors without
 * components, y's dim 0 then P * max(out_rows, 1). */
DT_API dt_status dt_alltoallv(const dt_tensor *x, const dt_tensor *send_counts,
                              const char *mesh_dim, int64_t out_rows, dt_tensor **y_out,
                              dt_tensor **recv_counts_out);

#ifdef __cplusplus
}
#endif
#endif
