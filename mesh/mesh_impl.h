/* The mesh module's private header: the dt_mesh struct and the one validating constructor that
 * the three front ends (dims, TensorFlow string, YAML) share. Not installed. */
#ifndef DTENSOR_MESH_IMPL_H
#define DTENSOR_MESH_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtensor/dtensor.h"

/* Global device id -> mesh position, sorted by id for bsearch. */
typedef struct dt__mesh_slot {
    int id;
    int64_t position;
} dt__mesh_slot;

/* A fact a planner derived from the whole device table under one world (the key), kept on
 * the mesh (mesh_facts.c). */
enum { DT__MESH_FACT_KEY = 4, DT__MESH_NFACTS = 4 }; /* KEY == mesh_facts.h's KEY_INTS */
typedef struct dt__mesh_fact {
    int used;
    int key[DT__MESH_FACT_KEY];
    uint64_t value;
} dt__mesh_fact;

/* The empty mesh (TensorFlow's "empty_mesh") has rank 0, size 0 and no devices. */
struct dt_mesh {
    atomic_int refs;
    char name[DT_NAME_MAX];
    dt_device_type type;
    char type_name[DT_NAME_MAX]; /* the type as the device names spell it: "CPU", "XLA_CPU" */
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
    /* NULL, or num_global_devices names kept verbatim. TensorFlow does not tie their number
     * to the mesh size, and neither do we: they are only printed back and renamed. */
    char **global_devices;
    int64_t num_global_devices;
    int use_xla_spmd;
    /* Derived facts (a cache: the mesh stays logically immutable), under facts_lock. */
    atomic_flag facts_lock;
    dt__mesh_fact facts[DT__MESH_NFACTS];
    int facts_next;        /* the slot the next new key replaces */
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
    /* Device type, used when there are no device names; else the names decide. type_name:
     * NULL for dt_device_type_name(type), else the name to use (the short form's "*XLA_CPU"). */
    dt_device_type type;
    const char *type_name;
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
     * is initialised, else all, named /job:localhost/replica:0/task:T/device:TYPE:I; 1 (the short
     * string form): this client's devices only when the runtime runs several clients, else all
     * of them on task 0, named as TensorFlow's expansion names them,
     * /job:localhost/task:T/device:TYPE:I. */
    int local_rule;
    /* 1 (the string form): a mesh with no devices (no global ids, or a dimension of size 0 in
     * the short form) is TensorFlow's empty mesh rather than an error. */
    int allow_empty;
    dt_status code;         /* status for invalid input: DT_ERR_PARSE or DT_ERR_INVALID_ARGUMENT */
    dt__mesh_where_fn where; /* NULL: no prefix */
    const void *where_ctx;
} dt__mesh_desc;

/* Validates d and builds an owned mesh (refs 1). On failure sets the error text, prefixed with
 * the location of the faulty piece, and returns d->code (DT_ERR_NO_MEMORY when out of memory). */
dt_status dt__mesh_build(const dt__mesh_desc *d, dt_mesh **mesh_out);

/* The empty mesh, owned. */
dt_status dt__mesh_empty(dt_mesh **mesh_out);

/* ---- device names (device_name.c) ---------------------------------------------------- */

/* What a TensorFlow device name holds, as DeviceNameUtils::ParseFullOrLocalName reads it. */
typedef struct dt__device_name {
    int has_job, has_task, has_type; /* "job:*" and the like count as absent */
    size_t type_off, type_len;       /* where the type is spelled in the name */
    const char *legacy_type;         /* "CPU"/"GPU" for "/cpu:0"-style names, else NULL */
} dt__device_name;

/* Parses a full name (/job:J/replica:R/task:T/device:TYPE:ID, parts optional, in any order,
 * legacy /cpu:ID and /gpu:ID) or a local one (TYPE:ID). 0 on success, -1 if malformed. */
int dt__device_name_parse(const char *name, dt__device_name *out);

/* The type a parsed name names ("" if none) into buf, snprintf-style. */
size_t dt__device_name_type(const char *name, const dt__device_name *dn, char *buf, size_t len);

/* 1 if a device type name is one a device name can spell (a letter, then letters, digits,
 * '_'), at most DT_NAME_MAX-1 bytes. */
int dt__device_type_name_ok(const char *type_name);

/* DT_DEVICE_CPU/GPU/TPU for those exact names, else DT_DEVICE_OTHER. */
dt_device_type dt__device_type_of(const char *type_name);

/* The same name with its type replaced by `type` (malloc'd), or NULL if the name names no type
 * or memory ran out. */
char *dt__device_name_with_type(const char *name, const char *type);

/* Strict decimal integer: "0" or [1-9][0-9]*, optionally preceded by '-' when allow_neg,
 * the whole of [s, s+n). 0 on success, -1 if malformed or out of int64 range. */
int dt__mesh_parse_int(const char *s, size_t n, int allow_neg, int64_t *out);

/* "mesh 'train'", or "unnamed mesh (x=2,y=2)": how messages name a mesh (mesh.c). */
void dt__mesh_label(const dt_mesh *m, char *buf, size_t len);

#endif
