/* The layout module's private header: the dt_layout struct and the constructor every
 * layout-making path (create, helpers, parse) goes through, and the relayout plan shared by
 * relayout*.c. Not installed. */
#ifndef DTENSOR_LAYOUT_IMPL_H
#define DTENSOR_LAYOUT_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtensor/layout.h"
#include "dtensor/mesh.h"
#include "dtensor/relayout.h"
#include "dtensor/tensor.h"
#include "runtime/transport.h"

struct dt_layout {
    atomic_int refs;
    dt_mesh *mesh;                              /* retained; released on the last destroy */
    int rank;                                   /* tensor dims, 0..DT_MAX_RANK */
    int spec_dim[DT_MAX_RANK];                  /* mesh dim sharding tensor dim i, or a
                                                 * DT__SPEC_* value below */
    int npartial;
    int partial_dim[DT_MESH_MAX_DIMS];          /* partial mesh dims, increasing */
    dt_reduce_op partial_op[DT_MESH_MAX_DIMS];  /* their reductions */
    /* Copied from the mesh so that the shard math needs no calls. */
    int mesh_rank;
    int64_t mesh_size;
    int64_t mesh_dim_size[DT_MESH_MAX_DIMS];
};

/* spec_dim values other than mesh dims: unsharded, and TensorFlow's placeholders "any" and
 * "match" (a layout holding one parses and prints but cannot place a tensor). Every negative
 * value splits nothing, so the shard math reads them all as unsharded. */
#define DT__SPEC_UNSHARDED (-1)
#define DT__SPEC_ANY (-2)
#define DT__SPEC_MATCH (-3)

/* Builds a layout from mesh dim indices: spec_dim[i] is a mesh dim index or DT__SPEC_*, the
 * partial dims are mesh dim indices in any order (stored sorted). Validates ranges and that
 * no mesh dim is used twice; DT_ERR_INVALID_ARGUMENT names the offending dim. Retains mesh. */
dt_status dt__layout_new(const dt_mesh *mesh, int rank, const int *spec_dim, int npartial,
                         const int *partial_dim, const dt_reduce_op *partial_op,
                         dt_layout **layout_out);

/* Shard coordinate of tensor dim `dim` on the device at mesh position `position` (0 when the
 * dim is unsharded). The position must be valid. */
int64_t dt__layout_shard_coord(const dt_layout *layout, int dim, int64_t position);

/* Writes the mesh's dim names as "x, y, z" into buf (for error messages); returns buf. */
const char *dt__layout_mesh_dims(const dt_mesh *mesh, char *buf, size_t len);

/* Size of a buffer that holds any dt__layout_mesh_dims text. */
#define DT__MESH_DIMS_TEXT (DT_MESH_MAX_DIMS * (DT_NAME_MAX + 2))

/* ---- relayout (relayout*.c, barrier.c) ------------------------------------------------ */

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
    dt__xfer_cache cache;      /* the plan's transport's per-piece state */
} rl_piece;

/* A plan run as collectives along one mesh dim (relayout_plan_impl.h); NULL: pieces. */
typedef struct rl_coll rl_coll;

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
    uint64_t work;             /* (destination, source group) pairs and holders the planner
                                * examined: what tests bound (docs/relayout.md) */
    /* What moves its pieces between clients (chosen by dt__rl_execute's first run through
     * dt__transport_select, DT_TRANSPORT); releases the pieces' caches. NULL until then. */
    const dt__transport *transport;
    /* A regular pattern's collectives (then no pieces until a transport without collectives
     * makes dt__rl_coll_execute fetch them from the piece planner). */
    rl_coll *coll;
    int fused;                 /* its all-reduce ran fused (relayout_fused.c): stats set */
} rl_plan;

/* Test-only (tests/relayout, bench/run scale): a simulated device table. Device id d of either
 * type belongs to client d / devices_per_client, client c lives on host c / clients_per_host,
 * and the plan is made as client `me`. Nothing is moved with such a plan. */
typedef struct dt__rl_sim {
    int nclients;
    int devices_per_client;
    int clients_per_host;
    int me;
} dt__rl_sim;

/* Builds the plan of moving a tensor of `shape`/`dtype` from `src` to `dst` (layouts on the
 * same or different meshes). Deterministic: every client computes the same global order. */
dt_status dt__rl_plan_build(const dt_layout *src, const dt_layout *dst, int rank,
                            const int64_t *shape, dt_dtype dtype, rl_plan **plan_out);
void dt__rl_plan_free(rl_plan *plan);

/* dt__rl_plan_build as client sim->me of the simulated table `sim` (NULL: the runtime). */
dt_status dt__rl_plan_build_as(const dt_layout *src, const dt_layout *dst, int rank,
                               const int64_t *shape, dt_dtype dtype, const dt__rl_sim *sim,
                               rl_plan **plan_out);

/* The piece planner alone (no regular patterns): tests compare its plans with the former
 * planner's, and a pattern plan falls back on it. */
dt_status dt__rl_plan_build_general(const dt_layout *src, const dt_layout *dst, int rank,
                                    const int64_t *shape, dt_dtype dtype, const dt__rl_sim *sim,
                                    rl_plan **plan_out);

/* The former planner, which walks every source group for every destination position
 * (O(N^2) per client): the reference the tests compare plans with, piece by piece. */
dt_status dt__rl_plan_build_ref(const dt_layout *src, const dt_layout *dst, int rank,
                                const int64_t *shape, dt_dtype dtype, const dt__rl_sim *sim,
                                rl_plan **plan_out);

/* The two-level route across hosts (docs/multihost.md): when src -> dst moves data across
 * hosts and both layouts are replicated over a mesh dim whose lines each lie on one host,
 * *mid_out gets dst's layout with a free tensor dim also sharded over that dim: src -> mid
 * then crosses hosts with 1/k of the data per device (k: that dim's size) and mid -> dst is
 * an all-gather inside each host. NULL when no such route helps. */
dt_status dt__rl_host_mid(const dt_layout *src, const dt_layout *dst, const int64_t *shape,
                          dt_layout **mid_out);

/* Runs a pattern plan (plan->coll) as collectives when the plan's transport has them
 * (*done_out 1); otherwise replaces plan->coll by the piece planner's pieces and statistics
 * (*done_out 0, the caller runs the pieces). relayout_coll.c. */
dt_status dt__rl_coll_execute(rl_plan *plan, const dt_tensor *src, dt_tensor *dst,
                              int *done_out);
void dt__rl_coll_free(rl_coll *coll);
/* Pattern plans this client has run as collectives since it started (tests, bench). Local. */
unsigned long dt__rl_coll_runs(void);

/* Chooses the plan's transport if not yet done (relayout_exec.c). */
dt_status dt__rl_plan_transport(rl_plan *plan);
/* 1 if the plan is an all-reduce pattern whose transport shows summands in place (shm), so
 * that it runs fused as one plan (no middle tensor); the same answer on every client.
 * relayout_fused.c. */
int dt__rl_fused_applies(rl_plan *plan);
dt_status dt__rl_fused_allreduce(rl_plan *plan, const dt_tensor *src, dt_tensor *dst);
/* All-reduces this client has run fused since it started (tests, bench). Local. */
unsigned long dt__rl_fused_runs(void);

/* Executes a plan from `src` into `dst` (already allocated with the plan's dst layout). */
dt_status dt__rl_execute(rl_plan *plan, const dt_tensor *src, dt_tensor *dst);

/* The flight recorder's entries for a relayout and a barrier, and DT_CHECK_COLLECTIVES's
 * agreement before them (relayout_trace.c, runtime/trace.h): begin records the call over the
 * meshes' clients (a mismatch found by the check: DT_ERR_STATE), end its path and outcome. */
dt_status dt__rl_trace_begin(const dt_tensor *src, const dt_layout *dst, long *token);
void dt__rl_trace_end(long token, rl_plan *const *plans, int nplans, dt_status st);
dt_status dt__barrier_trace_begin(const dt_mesh *mesh, const char *name, long *token);

/* The layout's text without its mesh, for messages and the flight recorder: the part of
 * dt_layout_format's text before ", mesh:" ("sharding_specs:x,unsharded" or
 * "sharding_specs:x, partial:y=sum"), without formatting the mesh. layout_string.c. */
void dt__layout_format_specs(const dt_layout *layout, char *buf, size_t len);

#endif
