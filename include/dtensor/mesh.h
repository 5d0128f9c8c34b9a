/* libdtensor Mesh: a named N-d grid of devices, its YAML and TensorFlow string forms. */
#ifndef DTENSOR_MESH_H
#define DTENSOR_MESH_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/export.h"
#include "dtensor/runtime.h"
#include "dtensor/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_mesh dt_mesh;

/* Limits. Names longer than DT_NAME_MAX-1 bytes are rejected with DT_ERR_INVALID_ARGUMENT. */
#define DT_MESH_MAX_DIMS 8
#define DT_NAME_MAX 64

/* A mesh position is the row-major index of a coordinate in the mesh grid, 0..size-1. The
 * device at position p is dt_mesh_device_id(mesh, p); for a mesh created from dims, the device
 * ids are 0..size-1 in order so position == device id. */

/* Creates a mesh of `ndims` dimensions (names unique, non-empty, [A-Za-z_][A-Za-z0-9_]*;
 * not "unsharded", "any" or "match"; sizes >= 1), with global device ids 0..size-1 row-major,
 * of type CPU, GPU or TPU (a TPU mesh describes devices; it cannot hold tensors).
 * Local device ids are this client's devices among them when the runtime is initialised, else
 * all of them. name may be NULL or "" (else printable ASCII without space or '|').
 * Returns an owned handle. DT_ERR_INVALID_ARGUMENT names the offending dimension. Local. */
DT_API dt_status dt_mesh_create(const char *name, int ndims, const char *const *dim_names,
                                const int64_t *dim_sizes, dt_device_type type,
                                dt_mesh **mesh_out);

/* Parses TensorFlow DTensor's Mesh string, accepting what TensorFlow's Mesh::FromString accepts
 * (docs/mesh.md lists where we are stricter):
 *   [name]|d1=s1,d2=s2|global ids|local ids|local device names[|global device names][|use_xla_spmd]
 * the short test form "|x=2,y=2|*CPU" (all devices local to this one client), and "empty_mesh"
 * (also what a string without devices, or a short form with a dimension of size 0, gives).
 * Device type comes from the device names (CPU when the string names no device), any type
 * TensorFlow's device names can spell (CPU, GPU, TPU, or OTHER with its name kept:
 * dt_mesh_device_type_name); names are kept verbatim. DT_ERR_PARSE with the column and, where
 * TensorFlow rejects the string too, TensorFlow's reason. Local. */
DT_API dt_status dt_mesh_parse(const char *text, dt_mesh **mesh_out);

/* Writes the canonical TensorFlow string (NUL-terminated) into buf; "empty_mesh" for the empty
 * mesh. Returns the length
 * the full string needs (excluding NUL), like snprintf; the text is complete iff < len.
 * A mesh parsed from a full string formats back to exactly that string. Local. */
DT_API size_t dt_mesh_format(const dt_mesh *mesh, char *buf, size_t len);

/* Reads meshes from YAML (libyaml). The document holds either one `mesh:` mapping or a
 * `meshes:` sequence of them:
 *     mesh:
 *       name: train
 *       device_type: CPU          # CPU or GPU, default CPU
 *       dims: {batch: 2, model: 2}   # ordered mapping, or a sequence of {name: size}
 *       device_ids: [0, 1, 2, 3]  # optional, default 0..size-1
 * `select` picks a mesh by name (NULL: the only mesh, or the first one).
 * Errors: DT_ERR_PARSE with "file:line:column: message" in dt_last_error(); DT_ERR_NOT_FOUND
 * when `select` names no mesh; DT_ERR_IO when the file cannot be read. Local. */
DT_API dt_status dt_mesh_from_yaml_file(const char *path, const char *select, dt_mesh **mesh_out);
DT_API dt_status dt_mesh_from_yaml_string(const char *text, const char *select,
                                          dt_mesh **mesh_out);

/* Names of the meshes in a YAML file, for listing. Writes up to `cap` names (each at most
 * DT_NAME_MAX bytes with NUL) into names_out and the total count into *count_out. Local. */
DT_API dt_status dt_mesh_yaml_names(const char *path, int cap, char (*names_out)[DT_NAME_MAX],
                                    int *count_out);

/* Reference counting: a new reference to the same mesh. Never fails. */
DT_API dt_mesh *dt_mesh_retain(const dt_mesh *mesh);
/* Drops one reference; frees on the last. Accepts NULL. */
DT_API void dt_mesh_destroy(dt_mesh *mesh);

/* Queries. Borrowed strings live as long as the mesh. Local; never fail on valid handles. */
DT_API const char *dt_mesh_name(const dt_mesh *mesh);          /* "" if none */
DT_API dt_device_type dt_mesh_device_type(const dt_mesh *mesh);
/* The type as the device names spell it: "CPU", "GPU", "TPU", or another ("XLA_CPU") for
 * DT_DEVICE_OTHER; "" for the empty mesh. */
DT_API const char *dt_mesh_device_type_name(const dt_mesh *mesh);
/* 1 for the empty mesh (TensorFlow's "empty_mesh": no dimensions, no devices), else 0. */
DT_API int dt_mesh_is_empty(const dt_mesh *mesh);
DT_API int dt_mesh_rank(const dt_mesh *mesh);                  /* number of dimensions */
DT_API int64_t dt_mesh_size(const dt_mesh *mesh);              /* number of devices */
DT_API const char *dt_mesh_dim_name(const dt_mesh *mesh, int dim);   /* NULL if out of range */
DT_API int64_t dt_mesh_dim_size(const dt_mesh *mesh, int dim);       /* 0 if out of range */
/* Index of a named dimension, or -1. */
DT_API int dt_mesh_dim_index(const dt_mesh *mesh, const char *dim_name);
DT_API int dt_mesh_device_id(const dt_mesh *mesh, int64_t position); /* -1 if out of range */
/* Position of a global device id in the mesh, or -1 if the mesh does not hold it. */
DT_API int64_t dt_mesh_position(const dt_mesh *mesh, int device_id);
/* This client's devices in the mesh, as listed in the mesh (parsed) or from the runtime. 0 on
 * a client outside the mesh (see "Clients outside a mesh" below). */
DT_API int dt_mesh_num_local_devices(const dt_mesh *mesh);
DT_API int dt_mesh_local_device_id(const dt_mesh *mesh, int local_index); /* -1 if out of range */
/* 1 if two meshes have the same dims, device type (by name) and device ids (names may differ). */
DT_API int dt_mesh_equal(const dt_mesh *a, const dt_mesh *b);

/* Coordinates <-> positions. coords has dt_mesh_rank entries. */
DT_API dt_status dt_mesh_coords(const dt_mesh *mesh, int64_t position, int64_t *coords_out);
DT_API dt_status dt_mesh_position_of(const dt_mesh *mesh, const int64_t *coords,
                                     int64_t *position_out);

/* The devices along dimension `dim` through `position`: those sharing every other coordinate,
 * in order of their coordinate on `dim`. Writes dt_mesh_dim_size(dim) positions. */
DT_API dt_status dt_mesh_dim_group(const dt_mesh *mesh, int dim, int64_t position,
                                   int64_t *positions_out);

/* The CPU mesh of the same shape and device ids (itself, retained, if already CPU); the
 * checkpoint saver writes from it. Owned handle. */
DT_API dt_status dt_mesh_host_mesh(const dt_mesh *mesh, dt_mesh **host_out);

/* Clients outside a mesh. A mesh may hold the devices of only some clients (a pipeline's stage
 * meshes do, as TensorFlow DTensor's meshes may): a client holding none of its devices is
 * outside it. On such a client every call on the mesh that works on its devices (tensor
 * creation, relayout, barrier, save, restore, the ops) returns DT_OK at once
 * with no local component and no communication: the collectives are collective over the
 * mesh's clients only, and make their outcome agree among those. Local calls that name a
 * component (dt_tensor_local_read/_write) fail there with DT_ERR_INVALID_ARGUMENT saying the
 * client holds no device of the mesh, and so does dt_tensor_pack (whose dtype comes from a
 * component: use dt_tensor_zeros there) and the calls handing a value to the host (dt_item,
 * dt_nonfinite: DT_ERR_STATE); objects kept per device (dt_zero, dt_dataset) are
 * refused there (their headers say how). A program that wants every client in its mesh calls
 * dt_mesh_check_clients, which answers the same on every client (docs/mesh.md). */

/* The number of clients holding at least one device of the mesh: the same on every client,
 * computed without communication from the runtime's device table. 0 before dt_init, for the
 * empty mesh or NULL; -1 if out of memory. Local. */
DT_API int dt_mesh_num_clients(const dt_mesh *mesh);

/* dt_mesh_check_devices, then checks that every client holds at least one device of the mesh
 * (dt_mesh_num_clients == dt_num_clients), else DT_ERR_DEVICE_MISMATCH naming the clients left
 * out and the devices present (a 4-device mesh under `DT_CPU_DEVICES=4 mpiexec -n 2` lies on
 * client 0 alone). Every client gets the same answer for the same mesh (unless its own
 * dt_mesh_check_devices fails), so a program may stop on it without leaving a client waiting
 * in a collective. DT_ERR_NO_MEMORY. Local. */
DT_API dt_status dt_mesh_check_clients(const dt_mesh *mesh);

/* Checks that the mesh can hold data here: it is not the empty mesh (DT_ERR_INVALID_ARGUMENT),
 * its devices are CPUs or GPUs (DT_ERR_UNSUPPORTED naming the type, for TPU and OTHER meshes),
 * the runtime is initialised, the clients hold at
 * least dt_mesh_size devices of the mesh's type (a mesh may use a subset of them, e.g. to
 * copy a tensor onto fewer devices), every device id is one of them,
 * and the mesh's local devices (if listed explicitly) are this client's. DT_ERR_DEVICE_MISMATCH
 * with the counts otherwise; DT_ERR_STATE before dt_init. Local. */
DT_API dt_status dt_mesh_check_devices(const dt_mesh *mesh);

#ifdef __cplusplus
}
#endif
#endif
