/* libdtensor Layout: how a tensor's dims map onto a mesh's dims, with partial (pending
 * reduction) mesh dims, and the shard math every other module uses. */
#ifndef DTENSOR_LAYOUT_H
#define DTENSOR_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/dtype.h"
#include "dtensor/export.h"
#include "dtensor/mesh.h"
#include "dtensor/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_layout dt_layout;

#define DT_UNSHARDED "unsharded"
/* TensorFlow's placeholder specs: "any" (any sharding will do) and "match" (the sharding of
 * another tensor), used while layouts are being inferred. A layout may hold them (to parse,
 * print and inspect TensorFlow's layouts) but cannot place a tensor: see
 * dt_layout_check_concrete. */
#define DT_ANY "any"
#define DT_MATCH "match"

/* Creates a layout for a tensor of `rank` dims (0..DT_MAX_RANK): specs[i] is DT_UNSHARDED,
 * the name of a mesh dim, or a placeholder (DT_ANY, any number of times; DT_MATCH, at most
 * once, as TensorFlow allows); each mesh dim is used at most once, by specs or by partial dims.
 * `npartial` mesh dims (names in partial_dims, reductions in partial_ops) hold partial values.
 * The layout retains the mesh. DT_ERR_INVALID_ARGUMENT names the bad spec. Local. */
DT_API dt_status dt_layout_create(const dt_mesh *mesh, int rank, const char *const *specs,
                                  dt_layout **layout_out);
DT_API dt_status dt_layout_create_partial(const dt_mesh *mesh, int rank,
                                          const char *const *specs, int npartial,
                                          const char *const *partial_dims,
                                          const dt_reduce_op *partial_ops,
                                          dt_layout **layout_out);

/* Helpers: every dim unsharded; dim `axis` sharded on `mesh_dim` (batch_sharded, TF's
 * Layout.batch_sharded with axis 0 by default; a negative axis counts from the end, as in
 * Python); the last dim sharded on `mesh_dim` (rank >= 1). */
DT_API dt_status dt_layout_replicated(const dt_mesh *mesh, int rank, dt_layout **layout_out);
DT_API dt_status dt_layout_batch_sharded(const dt_mesh *mesh, const char *mesh_dim, int rank,
                                         int axis, dt_layout **layout_out);
DT_API dt_status dt_layout_inner_sharded(const dt_mesh *mesh, const char *mesh_dim, int rank,
                                         dt_layout **layout_out);

/* Parses TensorFlow's layout string "sharding_specs:x,unsharded, mesh:<mesh string>", and
 * the extension for partial dims "sharding_specs:x,unsharded, partial:y=sum;z=max, mesh:<mesh>"
 * (docs/layout.md). Rank 0 is "sharding_specs: mesh:..." (TF's "sharding_specs:scalar," is
 * read too). The mesh may be in short form or "empty_mesh"; "empty_layout" is the layout on the
 * empty mesh. Specs may be the placeholders "any" and "match". DT_ERR_PARSE with the column,
 * what was expected and, where TensorFlow rejects the string too, its reason;
 * DT_ERR_UNSUPPORTED for the "maximal:"/"parted:" layouts of later TensorFlow versions. */
DT_API dt_status dt_layout_parse(const char *text, dt_layout **layout_out);

/* Canonical string into buf, snprintf-style return (length needed, excluding NUL);
 * "empty_layout" for a layout on the empty mesh, as TensorFlow prints it.
 * Round-trips exactly with dt_layout_parse for full mesh strings; partial dims print in mesh
 * dim order. Local. */
DT_API size_t dt_layout_format(const dt_layout *layout, char *buf, size_t len);

/* Reference counting as for meshes. */
DT_API dt_layout *dt_layout_retain(const dt_layout *layout);
DT_API void dt_layout_destroy(dt_layout *layout);

/* Queries (borrowed results, valid while the layout lives). */
DT_API const dt_mesh *dt_layout_mesh(const dt_layout *layout);
DT_API int dt_layout_rank(const dt_layout *layout);
DT_API const char *dt_layout_spec(const dt_layout *layout, int dim); /* NULL if out of range */
/* Mesh dim index sharding tensor dim `dim`, or -1 if unsharded, a placeholder or out of
 * range. */
DT_API int dt_layout_spec_mesh_dim(const dt_layout *layout, int dim);
DT_API int dt_layout_num_partial(const dt_layout *layout);
/* i-th partial dim: its mesh dim index and reduction. DT_ERR_INVALID_ARGUMENT if out of range. */
DT_API dt_status dt_layout_partial(const dt_layout *layout, int i, int *mesh_dim_out,
                                   dt_reduce_op *op_out);
/* 1 if every dim is unsharded (no placeholder) and nothing is partial. */
DT_API int dt_layout_is_replicated(const dt_layout *layout);
/* DT_OK if the layout can place a tensor: its mesh is not the empty mesh and no spec is a
 * placeholder (DT_ANY, DT_MATCH). Else DT_ERR_INVALID_ARGUMENT naming the placeholder and its
 * tensor dim (or the empty layout). Tensor creation fails with this error (through
 * dt_layout_shard). Local. */
DT_API dt_status dt_layout_check_concrete(const dt_layout *layout);
/* 1 if equal meshes, specs and partial dims. */
DT_API int dt_layout_equal(const dt_layout *a, const dt_layout *b);
/* Number of shards along tensor dim `dim` (the mesh dim size, or 1 for unsharded and
 * placeholder dims; 0 if out of range). */
DT_API int64_t dt_layout_num_shards(const dt_layout *layout, int dim);

/* Shard math. `shape` is the global shape (dt_layout_rank entries, each >= 0); the layout must
 * be concrete (dt_layout_check_concrete's error otherwise). Along a dim of
 * size n split k ways, shard j has n/k elements plus one if j < n%k, at offset
 * j*(n/k) + min(j, n%k) (DeepSpeed's partitioning); so a shard may be empty.
 * The device is given by its mesh position. Writes rank entries to each output. Local. */
DT_API dt_status dt_layout_shard(const dt_layout *layout, const int64_t *shape,
                                 int64_t position, int64_t *offset_out, int64_t *shape_out);
/* Same for one dim and one shard index (writes 0, 0 unless n >= 0, k >= 1, 0 <= j < k;
 * either output may be NULL). */
DT_API void dt_shard_range(int64_t n, int64_t k, int64_t j, int64_t *offset_out,
                           int64_t *size_out);

/* Block index of a position: the row-major index of its shard coordinates over the tensor
 * dims (0..prod(num_shards)-1); -1 for a bad position. Positions with equal block index hold
 * the same block (replicas, or partial summands when partial dims are present). */
DT_API int64_t dt_layout_block_index(const dt_layout *layout, int64_t position);

/* Positions holding the same block as `position`, in increasing order, `position` included.
 * Writes at most `cap`; *count_out gets the total. Local. */
DT_API dt_status dt_layout_replicas(const dt_layout *layout, int64_t position, int64_t cap,
                                    int64_t *positions_out, int64_t *count_out);

/* A text picture of the layout over `shape`, like JAX's visualize_array_sharding: tensor
 * dims 0 and 1 drawn as an ASCII grid of blocks (rows and columns labelled with their index
 * ranges), each block labelled with the device ids that hold it; one grid per combination of
 * the shards of the dims after the first two, headed by its index ranges; partial dims in a
 * header line (docs/layout.md). snprintf-style return; on a NULL layout/shape or a negative
 * shape entry it writes "", returns 0 and sets dt_last_error(). Local. */
DT_API size_t dt_layout_picture(const dt_layout *layout, const int64_t *shape, char *buf,
                                size_t len);

#ifdef __cplusplus
}
#endif
#endif
