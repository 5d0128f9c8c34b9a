/* What the relayout planner (relayout_plan.c) shares with its reference (relayout_plan_ref.c,
 * the former all-pairs planner kept for tests and bench/run scale): the world the plan is
 * made for (the runtime's clients, or a simulated device table), the partial-dim map, and the
 * helpers that fill a plan. Not installed. */
#ifndef DTENSOR_RELAYOUT_PLAN_IMPL_H
#define DTENSOR_RELAYOUT_PLAN_IMPL_H

#include "layout/layout_impl.h"

/* Who owns which device, as the planner sees it: the runtime's table (sim NULL) or the
 * simulated one of dt__rl_sim. */
typedef struct rl_world {
    const dt__rl_sim *sim;
    int me;
    int one_host;          /* every client on one host (or no topology) */
    int nclients;
    int *first[2];         /* runtime: per device type (CPU, GPU), nclients + 1 first ids */
    /* Per device type, this client's device ids mine_first .. + mine_count - 1 and the index
     * of each one's entry in the plan's statistics (-1: none yet). */
    int mine_first[2], mine_count[2];
    int *stat_of[2];
} rl_world;

dt_status dt__rl_world_init(rl_world *w, const dt__rl_sim *sim);
void dt__rl_world_free(rl_world *w);
int dt__rl_client(const rl_world *w, dt_device_type type, int device_id);
int dt__rl_host(const rl_world *w, int client);
/* The device ids of `client` of `type`: [*first, *first + *count). */
void dt__rl_client_devices(const rl_world *w, dt_device_type type, int client, int *first,
                           int *count);
/* Component index of mesh position pos on this client (-1 if not ours), and the count. */
int dt__rl_local_index(const rl_world *w, const dt_mesh *mesh, int64_t pos);
int dt__rl_num_local(const rl_world *w, const dt_mesh *mesh);

/* Mesh dims of the source that stay partial in the destination (same name, size and op),
 * those that are reduced, and the destination's new partial dims. */
typedef struct rl_partial_map {
    int nkeep;
    int keep_src[DT_MESH_MAX_DIMS], keep_dst[DT_MESH_MAX_DIMS];
    int nreduce;
    int reduce_src[DT_MESH_MAX_DIMS];
    dt_reduce_op reduce_op;
    int nnew;
    int new_dst[DT_MESH_MAX_DIMS];
    dt_reduce_op new_op[DT_MESH_MAX_DIMS];
} rl_partial_map;

dt_status dt__rl_map_partials(const dt_layout *src, const dt_layout *dst, rl_partial_map *pm);

/* 1 if destination position q (coords qcoords) gets the reduction's identity rather than
 * data: it is not the first member along a new sum-partial dim. */
int dt__rl_gets_zeros(const rl_partial_map *pm, const int64_t *qcoords);

/* The intersection of two boxes; 0 if it is empty (rank 0: always 1). */
int dt__rl_box_intersect(int rank, const rl_box *a, const rl_box *b, rl_box *out);

/* A new plan with everything but its pieces and statistics (world w decides the local
 * destination count). */
dt_status dt__rl_plan_new(const rl_world *w, const dt_layout *src, const dt_layout *dst,
                          int rank, const int64_t *shape, dt_dtype dtype,
                          const rl_partial_map *pm, rl_plan **plan_out);

/* Adds piece p (client w->me sends, receives or copies it) to the plan's statistics;
 * sid/did are the source and destination device ids. */
dt_status dt__rl_count_piece(rl_plan *plan, const rl_world *w, const rl_piece *p,
                             dt_device_type stype, int sid, dt_device_type dtype, int did);

/* Sorts the statistics by device; call once the pieces are in. */
void dt__rl_plan_sort_stats(rl_plan *plan);

/* ---- regular patterns (relayout_pattern.c plans, relayout_coll.c runs) ----------------- */

typedef enum rl_coll_kind {
    RL_COLL_ALLGATHER,       /* sharded (tensor dim a) over m -> not using m */
    RL_COLL_ALLTOALL,        /* sharded on a over m -> sharded on b over m */
    RL_COLL_REDUCE_SCATTER,  /* partial over m -> sharded on b over m */
    RL_COLL_ALLREDUCE,       /* partial over m -> not using m */
} rl_coll_kind;

/* The line along mesh dim m through one local device: positions base + j*stride, j < k. */
typedef struct rl_line {
    int64_t pos, base, coord;  /* the device's position, the line's first, its coordinate */
    int local;                 /* component index of the device in either tensor */
    int *clients;              /* member j's client */
} rl_line;

struct rl_coll {
    rl_coll_kind kind;
    int m;                     /* the mesh dim */
    int64_t k, stride;         /* its size and position stride */
    int a, b;                  /* tensor dims: source's and destination's use of m (or < 0) */
    int nlines;
    rl_line *lines;            /* in line order (base), the order of the collectives */
};

/* DT_RELAYOUT_PATTERNS: 1 (default) or 0 (the piece planner only, for comparisons). */
dt_status dt__rl_patterns_enabled(int *on_out);

/* The plan of src -> dst as a pattern along one mesh dim, or *plan_out NULL when it is not
 * one (or its mesh does not suit: relayout_pattern.c). O(mesh size) checks, O(local devices
 * times the dim's size) work. */
dt_status dt__rl_pattern_plan(const rl_world *w, const dt_layout *src, const dt_layout *dst,
                              int rank, const int64_t *shape, dt_dtype dtype,
                              rl_plan **plan_out);

#endif
