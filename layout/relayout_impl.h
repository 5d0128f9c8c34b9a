/* Relayout internals shared by relayout_plan.c, relayout_exec.c, relayout.c and barrier.c.
 * (To be folded into layout_impl.h: the module's one private header.) */
#ifndef DTENSOR_RELAYOUT_IMPL_H
#define DTENSOR_RELAYOUT_IMPL_H

#include <stdint.h>

#include "runtime/internal.h"

/* A box of a global tensor: offset and length per dim. */
typedef struct rl_box {
    int64_t off[DT_MAX_RANK];
    int64_t len[DT_MAX_RANK];
} rl_box;

/* One piece of a plan: the part `box` of the source block held at src_pos, needed by the
 * destination device at dst_pos. `summand` orders the contributions of a reduction
 * (0 initialises, the rest accumulate in increasing order); -1 for plain copies. Only the
 * pieces this client sends, receives or copies are kept. */
typedef struct rl_piece {
    int64_t src_pos, dst_pos;
    int src_client, dst_client;
    int src_local, dst_local;  /* component index on this client, -1 if not ours */
    int summand;
    rl_box box;
    uint64_t bytes;
    dt__xfer_cache cache;      /* the transport's per-piece state (datatypes) */
} rl_piece;

typedef struct rl_plan {
    dt_layout *src, *dst;      /* retained; meshes may differ (copy_to_mesh) */
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK];
    /* Reduction over the source's partial dims that the destination does not keep. */
    int nsummands;             /* 0: no reduction */
    dt_reduce_op op;
    rl_piece *pieces;          /* in global plan order (destination position, then source) */
    size_t npieces;
    unsigned char *zero_dst;   /* per destination local component: fill with zeros first */
    int ndst_local;
    dt_relayout_stats *stats;  /* per local device taking part */
    int nstats;
} rl_plan;

/* Builds the plan of moving a tensor of `shape`/`dtype` from `src` to `dst` (layouts on the
 * same or different meshes). Deterministic: every client computes the same global order. */
dt_status dt__rl_plan_build(const dt_layout *src, const dt_layout *dst, int rank,
                            const int64_t *shape, dt_dtype dtype, rl_plan **plan_out);
void dt__rl_plan_free(rl_plan *plan);

/* Executes a plan from `src` into `dst` (already allocated with the plan's dst layout). */
dt_status dt__rl_execute(rl_plan *plan, const dt_tensor *src, dt_tensor *dst);

/* Strided helpers over a box inside a compact row-major component. */
typedef void (*rl_run_fn)(void *dst, const void *src, int64_t n, void *arg);
/* Copies (or reduces with fn) the region `box` (global coordinates) from the component with
 * global offset/shape (so, soff, sshape) to the one with (doff, dshape). Either side may be
 * a contiguous buffer holding exactly the box (pass its box as offset and shape). */
void dt__rl_box_apply(int rank, size_t elem, const rl_box *box, void *dst, const int64_t *doff,
                      const int64_t *dshape, const void *src, const int64_t *soff,
                      const int64_t *sshape, rl_run_fn fn, void *arg);

/* Elementwise reduction kernels: dst[i] = op(dst[i], src[i]) for n elements of dtype. */
rl_run_fn dt__rl_reduce_kernel(dt_reduce_op op, dt_dtype dtype);
/* dst[i] /= k for n elements (the final step of AVG). */
void dt__rl_divide(void *dst, int64_t n, dt_dtype dtype, int64_t k);

#endif
