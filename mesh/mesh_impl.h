/* The mesh module's private header: the dt_mesh struct and the one validating constructor that
 * the three front ends (dims, TensorFlow string, YAML) share. Not installed. */
#ifndef DTENSOR_MESH_IMPL_H
#define DTENSOR_MESH_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/internal.h"

/* Global device id -> mesh position, sorted by id for bsearch. */
typedef struct dt__mesh_slot {
    int id;
    int64_t position;
} dt__mesh_slot;

struct dt_mesh {
    atomic_int refs;
    char name[DT_NAME_MAX];
    dt_device_type type;
    int rank;
    char dim_names[DT_MESH_MAX_DIMS][DT_NAME_MAX];
    int64_t dim_sizes[DT_MESH_MAX_DIMS];
    int64_t strides[DT_MESH_MAX_DIMS]; /* row-major: strides[rank-1] == 1 */
    int64_t size;
    int *global_ids;      /* size entries, in position order */
    dt__mesh_slot *by_id; /* size entries, sorted by id */
    int num_local;
    int *local_ids;        /* num_local entries, as listed */
    char **local_devices;  /* num_local device names, kept verbatim */
    char **global_devices; /* NULL, or size device names kept verbatim */
    int use_xla_spmd;
};

/* Which piece of the input a validation message is about, so each front end can prefix it with
 * its own location ("mesh.yaml:7:12: ", "mesh string column 9: ", or nothing). */
typedef enum dt__mesh_part {
    DT__MESH_AT_MESH,          /* the mesh as a whole */
    DT__MESH_AT_NAME,          /* the mesh name */
    DT__MESH_AT_DIMS,          /* the dimension list */
    DT__MESH_AT_DIM_NAME,      /* index: the dimension */
    DT__MESH_AT_DIM_SIZE,      /* index: the dimension */
    DT__MESH_AT_GLOBAL_IDS,    /* the global id list */
    DT__MESH_AT_GLOBAL_ID,     /* index: the entry */
    DT__MESH_AT_LOCAL_IDS,     /* the local id list */
    DT__MESH_AT_LOCAL_ID,      /* index: the entry */
    DT__MESH_AT_LOCAL_DEVICES, /* the local device name list */
    DT__MESH_AT_LOCAL_DEVICE,  /* index: the entry */
    DT__MESH_AT_GLOBAL_DEVICES,
    DT__MESH_AT_GLOBAL_DEVICE,
} dt__mesh_part;

/* Writes the location prefix for `part` (and `index`) into buf, e.g. "mesh.yaml:7:12: ". */
typedef void (*dt__mesh_where_fn)(const void *ctx, dt__mesh_part part, int64_t index, char *buf,
                                  size_t len);

/* Everything a mesh is made from, before validation. Arrays are borrowed. */
typedef struct dt__mesh_desc {
    const char *name; /* NULL or "" for none */
    int rank;         /* may exceed DT_MESH_MAX_DIMS by one: that is reported */
    const char *const *dim_names;
    const int64_t *dim_sizes;
    /* Device type, used when there are no device names; else the names decide. */
    dt_device_type type;
    /* NULL: 0..size-1. Else num_global entries. */
    const int64_t *global_ids;
    int64_t num_global;
    /* NULL: the local devices come from the runtime (see local_rule). Else num_local ids and
     * num_local_devices names (names may be NULL only with num_local_devices == 0). */
    const int64_t *local_ids;
    int64_t num_local;
    const char *const *local_devices;
    int64_t num_local_devices;
    /* NULL, or num_global_devices names. */
    const char *const *global_devices;
    int64_t num_global_devices;
    int use_xla_spmd;
    /* When local_ids is NULL: 0 (dt_mesh_create, YAML): this client's devices when the runtime
     * is initialised, else all; 1 (the short string form): this client's devices only when the
     * runtime runs several clients, else all of them on task 0. */
    int local_rule;
    dt_status code;         /* status for invalid input: DT_ERR_PARSE or DT_ERR_INVALID_ARGUMENT */
    dt__mesh_where_fn where; /* NULL: no prefix */
    const void *where_ctx;
} dt__mesh_desc;

/* Validates d and builds an owned mesh (refs 1). On failure sets the error text, prefixed with
 * the location of the faulty piece, and returns d->code (DT_ERR_UNSUPPORTED for a device type
 * other than CPU/GPU in a device name, DT_ERR_NO_MEMORY when out of memory). */
dt_status dt__mesh_build(const dt__mesh_desc *d, dt_mesh **mesh_out);

/* Strict decimal integer: "0" or [1-9][0-9]*, optionally preceded by '-' when allow_neg,
 * the whole of [s, s+n). 0 on success, -1 if malformed or out of int64 range. */
int dt__mesh_parse_int(const char *s, size_t n, int allow_neg, int64_t *out);

#endif
