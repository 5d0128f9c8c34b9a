/* libdtensor runtime: processes (clients), local devices, topology, memory. */
#ifndef DTENSOR_RUNTIME_H
#define DTENSOR_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/export.h"
#include "dtensor/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device kinds. The runtime holds CPU and GPU devices; TPU and OTHER exist so that meshes and
 * layouts naming them (as TensorFlow programs print and save) can be parsed, printed and
 * inspected. A tensor cannot be placed on them (dt_mesh_check_devices says why). OTHER is any
 * further type a TensorFlow device name may spell (XLA_CPU, TPU_SYSTEM, ...); the mesh keeps
 * its name (dt_mesh_device_type_name). */
typedef enum dt_device_type {
    DT_DEVICE_CPU = 0,
    DT_DEVICE_GPU = 1,
    DT_DEVICE_TPU = 2,
    DT_DEVICE_OTHER = 3,
} dt_device_type;

/* "CPU", "GPU", "TPU", or "OTHER" (also for values outside the enum). Static string. */
DT_API const char *dt_device_type_name(dt_device_type type);

/* What runs this client's devices of `type`: "cpu", "cuda", "sim", or "none" when the client
 * has no device of that type (always "none" before dt_init). Static string. Local. */
DT_API const char *dt_device_kind_name(dt_device_type type);

/* Parses "CPU"/"GPU"/"TPU" (case-insensitive). DT_ERR_PARSE otherwise. */
DT_API dt_status dt_device_type_parse(const char *text, dt_device_type *type_out);

/* Options of dt_init. Initialise with DT_INIT_OPTS_INIT, then set fields. */
typedef struct dt_init_opts {
    /* CPU devices per client. 0: from the environment variable DT_CPU_DEVICES, else 1. */
    int cpu_devices;
    /* Bind each process to its share of the host's cores (hwloc). 1 (default) or 0.
     * The environment variable DT_BIND=0 also turns binding off. */
    int bind_cores;
    /* Give this client GPU devices (1, the default) or none (0). Which GPUs: the environment
     * variable DT_GPU=auto (default: CUDA GPUs when built with CUDA and present), cuda (CUDA
     * GPUs or an error naming what is missing) or sim (a simulated accelerator on the CPU,
     * docs/devices.md). */
    int use_gpus;
    /* GPU devices per client: logical devices spread over the client's share of the host's
     * GPUs, so one GPU can hold a whole mesh (TensorFlow's logical GPUs). 0: the environment
     * variable DT_GPU_DEVICES, else one per GPU of the client's share (1 on sim). */
    int gpu_devices;
} dt_init_opts;

#define DT_INIT_OPTS_INIT {0, 1, 1, 0}

/* Starts the runtime. Works under mpirun (every process calls it) and as a plain single
 * process (MPI singleton). Initialises MPI unless the program already did (then the
 * program also finalises it). opts may be NULL for defaults. argc/argv may be NULL.
 * Collective over MPI_COMM_WORLD.
 * Returns DT_ERR_STATE if already initialised, DT_ERR_INVALID_ARGUMENT for a bad option or
 * DT_CPU_DEVICES value, DT_ERR_COMM if MPI fails. */
DT_API dt_status dt_init(int *argc, char ***argv, const dt_init_opts *opts);

/* Stops the runtime, frees its pools and finalises MPI if dt_init started it. Collective.
 * Safe to call when not initialised. */
DT_API void dt_finalize(void);

/* 1 between a successful dt_init and dt_finalize, else 0. Local. */
DT_API int dt_is_initialized(void);

/* Number of clients (MPI processes) and this client's id (its rank). 1 and 0 before dt_init. */
DT_API int dt_num_clients(void);
DT_API int dt_client_id(void);

/* Devices of a type on this client, and on all clients together. Global device ids are
 * dense, 0..N-1, ordered by client, then local index (docs/devices.md). 0 before dt_init. */
DT_API int dt_num_local_devices(dt_device_type type);
DT_API int dt_num_global_devices(dt_device_type type);

/* Global id of this client's local device `local_index`, or -1 if out of range. */
DT_API int dt_local_device_id(dt_device_type type, int local_index);

/* Client owning global device `device_id`, or -1 if out of range. */
DT_API int dt_device_client(dt_device_type type, int device_id);

/* What hwloc found on this host, and what this process is bound to. */
typedef struct dt_topology_info {
    int packages;        /* sockets */
    int numa_nodes;
    int cores;           /* physical cores */
    int pus;             /* hardware threads */
    int gpus;            /* GPUs visible (hwloc OS devices, or CUDA when built with it) */
    int host_clients;    /* processes of this job on this host */
    int host_rank;       /* this process's index among them */
    int bound;           /* 1 if this process was bound to cores */
    char cpuset[128];    /* this process's binding, as a list like "0-3" ("" if unbound) */
    char hostname[64];
} dt_topology_info;

/* Fills *info_out from the topology read once at dt_init. DT_ERR_STATE before dt_init. Local. */
DT_API dt_status dt_topology(dt_topology_info *info_out);

/* Host memory from the runtime's reuse pool: 64-byte aligned, contents undefined.
 * Freed blocks are kept for reuse so hot paths do not touch fresh pages each call; the pool
 * caches at most DT_POOL_MAX_MB MiB (default 2048, 0 turns caching off), beyond which freed
 * blocks go back to the system. Requests are rounded up to a size class (docs/runtime.md).
 * dt_host_alloc: DT_ERR_INVALID_ARGUMENT if ptr_out is NULL, DT_ERR_NO_MEMORY on failure.
 * dt_host_free accepts NULL; a pointer that is not a live block of the pool (a double free,
 * a foreign pointer) is ignored and counted in bad_frees where the pool can tell.
 * Thread-safe. Local. Usable before dt_init and after dt_finalize (dt_finalize trims). */
DT_API dt_status dt_host_alloc(size_t bytes, void **ptr_out);
DT_API void dt_host_free(void *ptr);

/* Pool statistics, for tests and benchmarks. */
typedef struct dt_pool_stats {
    uint64_t allocs;         /* dt_host_alloc calls that succeeded */
    uint64_t reuses;         /* of those, served from the pool */
    uint64_t bytes_cached;   /* bytes held in the pool's free lists now (class sizes) */
    uint64_t bytes_in_use;   /* bytes handed out and not yet freed (class sizes) */
    uint64_t bad_frees;      /* dt_host_free calls ignored: double free or foreign pointer */
    uint64_t bytes_limit;    /* most bytes the free lists may hold (DT_POOL_MAX_MB) */
    uint64_t bytes_requested; /* bytes asked for by the live blocks' holders (what they hold,
                               * without class rounding) */
    uint64_t peak_bytes_requested; /* the most bytes_requested since the start or the last
                                    * dt_host_pool_reset_peak */
} dt_pool_stats;
DT_API void dt_host_pool_stats(dt_pool_stats *stats_out);

/* Sets peak_bytes_requested to bytes_requested now, so that a caller can measure the peak
 * of one phase (a training step, say). Local. */
DT_API void dt_host_pool_reset_peak(void);

/* Returns all cached blocks to the system. Local. */
DT_API void dt_host_pool_trim(void);

#ifdef __cplusplus
}
#endif
#endif
