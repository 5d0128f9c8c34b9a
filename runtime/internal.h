/* The runtime's one internal header: what modules share beyond the public API
 * (error setting, the MPI communicator, dtype tables, small helpers). Not installed. */
#ifndef DTENSOR_RUNTIME_INTERNAL_H
#define DTENSOR_RUNTIME_INTERNAL_H

#include <mpi.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dtensor/dtensor.h"

/* Records `fmt` as this thread's error text and returns st, so a failure site reads
 *     return dt__error(DT_ERR_PARSE, "%s:%d:%d: dimension '%s' repeated", ...);  */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
dt_status dt__error(dt_status st, const char *fmt, ...);

/* The runtime's communicator (a duplicate of MPI_COMM_WORLD), MPI_COMM_NULL before dt_init. */
MPI_Comm dt__comm(void);

/* Number of local devices of each client (array of dt_num_clients entries), or NULL. */
const int *dt__client_device_counts(dt_device_type type);

/* Checked size arithmetic: 0 on success, -1 on overflow. */
int dt__mul_size(size_t a, size_t b, size_t *out);

/* Product of shape[0..rank-1] (1 for rank 0). Assumes non-negative entries. */
int64_t dt__numel(int rank, const int64_t *shape);

/* Bounded string copy that always NUL-terminates; returns strlen(src). */
size_t dt__strlcpy(char *dst, const char *src, size_t len);
/* Shape text "[2,3]" ("[]" for rank 0) into buf, for messages; truncated text stays
 * NUL-terminated. Returns buf. */
const char *dt__shape_str(int rank, const int64_t *shape, char *buf, size_t len);

/* ---- runtime/ internals (init.c, topology.c, memory.c, cuda.c) ---- */

/* Records an MPI failure: DT_ERR_COMM with "<what>: <MPI_Error_string text>". */
dt_status dt__mpi_error(int rc, const char *what);

/* MPI thread level provided (MPI_THREAD_*), MPI_THREAD_SINGLE before dt_init. */
int dt__mpi_thread_level(void);

/* Communicator of this job's clients on this host (MPI_COMM_TYPE_SHARED split of dt__comm),
 * MPI_COMM_NULL before dt_init. */
MPI_Comm dt__host_comm(void);

/* topology.c, called by dt_init/dt_finalize: read hwloc (local), then split the host
 * communicator and bind (collective over comm); unload restores the binding and frees all. */
dt_status dt__topology_load(void);
dt_status dt__topology_setup(MPI_Comm comm, int bind);
void dt__topology_unload(void);

/* memory.c: (re)reads DT_POOL_MAX_MB; DT_ERR_INVALID_ARGUMENT naming a bad value. */
dt_status dt__pool_configure(void);

/* Half-precision conversions: round to nearest even, infinities kept, NaN made quiet with
 * its top payload. f16 in runtime/half.c; bf16 here, inline and branch-free so that loops
 * over them vectorise (ops/cast.c). */
float dt__f16_to_f32(uint16_t h);
uint16_t dt__f32_to_f16(float f);

static inline float dt__bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    u |= (u & 0x7fffffffu) > 0x7f800000u ? 0x400000u : 0u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t dt__f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

/* A tensor whose local components are allocated (host pool or device) but not initialised:
 * for producers that overwrite every element (relayout). layout/tensor.c. */
dt_status dt__tensor_empty(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                           dt_tensor **tensor_out);

/* ---- Transport: moves boxes of compact row-major arrays between clients ---------------- */

/* A box inside a compact row-major array of `rank` dims. */
typedef struct dt__region {
    void *base;                  /* start of the array (host or device memory) */
    int rank;
    size_t elem;                 /* bytes per element */
    int64_t shape[DT_MAX_RANK];  /* the array's shape */
    int64_t start[DT_MAX_RANK];  /* the box inside it */
    int64_t count[DT_MAX_RANK];
} dt__region;

/* Transport-private state of one transfer (e.g. an MPI datatype), built on first use and
 * kept by the caller (a cached relayout plan) across calls. Zero-initialise. */
typedef struct dt__xfer_cache {
    void *state;
} dt__xfer_cache;

typedef struct dt__xfer {
    int peer;                    /* the other client */
    dt__region region;
    dt__xfer_cache *cache;       /* NULL: state built and dropped within the call */
} dt__xfer;

/* A mover. The planner decides what goes where; a transport only moves it, so a NCCL mover
 * for device memory takes the same plan. */
typedef struct dt__transport {
    const char *name;
    /* Posts every receive and send, runs local_work(arg) (may be NULL) while they progress,
     * then waits for all. Between two clients, sender and receiver list their transfers in
     * the same order. DT_ERR_COMM on failure. */
    dt_status (*exchange)(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs,
                          size_t nrecvs, void (*local_work)(void *), void *arg);
    /* Frees what exchange cached. */
    void (*release)(dt__xfer_cache *cache);
} dt__transport;

/* The MPI transport for host memory (runtime/transport_mpi.c). */
const dt__transport *dt__transport_mpi(void);

/* Registers fn to run in dt_finalize before MPI is finalised (e.g. to drop cached plans
 * holding MPI datatypes). At most 16 functions. */
dt_status dt__at_finalize(void (*fn)(void));

#endif
