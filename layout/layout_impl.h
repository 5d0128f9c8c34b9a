/* The layout module's private header: the dt_layout struct and the constructor every
 * layout-making path (create, helpers, parse) goes through. Not installed. */
#ifndef DTENSOR_LAYOUT_IMPL_H
#define DTENSOR_LAYOUT_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtensor/layout.h"
#include "dtensor/mesh.h"

struct dt_layout {
    atomic_int refs;
    dt_mesh *mesh;                              /* retained; released on the last destroy */
    int rank;                                   /* tensor dims, 0..DT_MAX_RANK */
    int spec_dim[DT_MAX_RANK];                  /* mesh dim sharding tensor dim i, or -1 */
    int npartial;
    int partial_dim[DT_MESH_MAX_DIMS];          /* partial mesh dims, increasing */
    dt_reduce_op partial_op[DT_MESH_MAX_DIMS];  /* their reductions */
    /* Copied from the mesh so that the shard math needs no calls. */
    int mesh_rank;
    int64_t mesh_size;
    int64_t mesh_dim_size[DT_MESH_MAX_DIMS];
};

/* Builds a layout from mesh dim indices: spec_dim[i] is a mesh dim index or -1, the
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

#endif
