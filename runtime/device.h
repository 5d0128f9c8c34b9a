/* The device layer: one interface struct per device kind (CPU, CUDA, simulated GPU) and the
 * registry of this client's local devices. layout/, ckpt/ and optim/ move and reduce memory
 * only through these calls and never ask which kind they hold (docs/devices.md). Not
 * installed. */
#ifndef DTENSOR_RUNTIME_DEVICE_H
#define DTENSOR_RUNTIME_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>
#include <mpi.h>

#include "dtensor/dtype.h"
#include "dtensor/runtime.h"

typedef struct dt__device dt__device;
typedef struct dt__ops_backend dt__ops_backend; /* ops/ops_impl.h: the kernel table */

/* Which sides of a copy are in the device's memory. Host memory is any memory host code may
 * touch (malloc, the host pool, pinned staging). */
typedef enum dt__copy_dir {
    DT__COPY_H2D = 0,
    DT__COPY_D2H = 1,
    DT__COPY_D2D = 2, /* both in device memory of this kind (this device or a local peer) */
} dt__copy_dir;

/* One device kind. Every call on a device is ordered on that device's stream (devices with
 * the same ordinal share one). H2D and D2H copies return when the host side is done (the
 * host buffer may be reused or read, as cudaMemcpy); D2D copies, memset0, fill, reduce_into,
 * divide and the ops kernels may return before the work is done, and `sync` waits for it.
 * Errors of work that ran asynchronously are returned by the next call or sync on that
 * stream, with the failing call's message. All entries are required. */
typedef struct dt__device_kind {
    const char *name;          /* "cpu", "cuda", "sim": for messages and DT_GPU */
    DLDeviceType dl_type;      /* what DLPack tensors of its memory say: kDLCPU, kDLCUDA */
    int host_visible;          /* 1: host code may read and write its memory directly */

    /* Memory: alloc returns DT_ERR_NO_MEMORY naming the device and the bytes. free accepts
     * NULL; it waits for the device's pending work on the block first. */
    dt_status (*alloc)(const dt__device *dev, size_t bytes, void **ptr_out);
    void (*free)(const dt__device *dev, void *ptr);

    /* Host memory suited to staging this kind's copies (page-locked for CUDA). */
    dt_status (*host_alloc)(size_t bytes, void **ptr_out);
    void (*host_free)(void *ptr);

    /* `bytes` from src to dst, `dir` saying which sides are device memory. A D2D copy whose
     * src lies on another local device of the same kind is a peer copy. */
    dt_status (*copy)(const dt__device *dev, dt__copy_dir dir, void *dst, const void *src,
                      size_t bytes);
    /* Sets `bytes` bytes to zero; fill repeats the `elem`-byte pattern `value` (host memory)
     * `count` times. */
    dt_status (*memset0)(const dt__device *dev, void *ptr, size_t bytes);
    dt_status (*fill)(const dt__device *dev, void *ptr, int64_t count, const void *value,
                      size_t elem);
    /* dst[i] = dst[i] op src[i] for n elements of dtype (both in this device's memory; AVG
     * sums). Half types accumulate through f32 and round once per step, as the host does, so
     * every kind computes the same bits. divide: x[i] /= k (AVG's last step). */
    dt_status (*reduce_into)(const dt__device *dev, dt_reduce_op op, dt_dtype dtype,
                             void *dst, const void *src, int64_t n);
    dt_status (*divide)(const dt__device *dev, dt_dtype dtype, void *x, int64_t n, int64_t k);

    /* Waits for every call issued on the device so far. */
    dt_status (*sync)(const dt__device *dev);

    /* The kernel table of the ops (ops/ops_impl.h), NULL when the build has none. */
    const dt__ops_backend *(*ops)(void);

    /* Called by dt_init before the first device of this kind is used, with the number of
     * local devices and physical ordinals it will serve, and by dt_finalize after the last
     * (may be NULL). */
    dt_status (*start)(int ndevices, int nordinals);
    void (*stop)(void);
} dt__device_kind;

/* One local device of this client. */
struct dt__device {
    const dt__device_kind *kind;
    dt_device_type type;  /* the mesh device type it serves */
    int local_index;      /* among this client's devices of `type` */
    int global_id;        /* dense global id (client-major) */
    int ordinal;          /* the physical device: CUDA ordinal (the DLPack device_id) */
    void *impl;           /* the kind's state (a stream, ...) */
};

/* This client's local device `local_index` of `type` (NULL if out of range or before
 * dt_init). Borrowed; valid until dt_finalize. */
const dt__device *dt__device_local(dt_device_type type, int local_index);

/* The local device whose global id is `global_id`, or NULL when another client owns it. */
const dt__device *dt__device_by_id(dt_device_type type, int global_id);

/* Device memory through the per-device cache of freed blocks (runtime/device_pool.c): what
 * every caller outside the kinds uses. free takes the size given to alloc. configure reads
 * DT_DEVICE_POOL_MAX_MB (dt_init); trim frees every cached block (dt_finalize). */
dt_status dt__device_alloc(const dt__device *dev, size_t bytes, void **ptr_out);
void dt__device_free(const dt__device *dev, void *ptr, size_t bytes);
dt_status dt__device_pool_configure(void);
void dt__device_pool_trim(void);

/* Waits for the work of every local device of `type` (all when type < 0). */
dt_status dt__device_sync_all(int type);

/* The kind GPU meshes run on in this process (cuda or sim), NULL when none: set at dt_init
 * from DT_GPU (sim|cuda|auto) and what is present. */
const dt__device_kind *dt__gpu_kind(void);

/* ---- dt_init / dt_finalize (runtime/device.c) ----
 * Chooses the GPU kind from `mode` (DT_GPU: auto, cuda, sim; NULL = auto) and splits this
 * client's GPU devices (`want` logical devices, 0 = one per physical GPU of its share) over
 * the host's GPUs; *count_out gets the number of GPU devices (0 when use_gpus is 0 or none is
 * present under auto). Collective over host_comm in CUDA builds. */
dt_status dt__gpu_select(MPI_Comm host_comm, int use_gpus, const char *mode, int want,
                         int *count_out);
/* Builds the local device table (global ids from the given firsts) and starts the kinds. */
dt_status dt__devices_open(int ncpu, int cpu_first_id, int gpu_first_id);
void dt__devices_close(void);
/* Physical GPUs visible (0 without CUDA), and why there are none, for messages. */
int dt__gpu_physical_count(void);
const char *dt__gpu_absence(void);

/* ---- the kinds (one file each; runtime/device.c is the only place that knows which were
 * compiled in), and their kernel tables (ops/: the registry's references link them in) ---- */
const dt__device_kind *dt__device_kind_cpu(void);
const dt__device_kind *dt__device_kind_sim(void);
const dt__device_kind *dt__device_kind_cuda(void);
const dt__ops_backend *dt__ops_cpu_backend(void);
const dt__ops_backend *dt__ops_sim_backend(void);
const dt__ops_backend *dt__ops_cuda_backend(void);

/* Host kernels of reduce_into and divide (runtime/reduce_host.c), for the kinds whose
 * memory host code reaches (cpu, and sim on its stream). dtype must be valid. */
void dt__host_reduce(dt_reduce_op op, dt_dtype dtype, void *dst, const void *src, int64_t n);
void dt__host_divide(dt_dtype dtype, void *x, int64_t n, int64_t k);
/* Fills `bytes` bytes of host memory with the `elem`-byte pattern at value by doubling
 * copies (bytes a multiple of elem). runtime/box.c. */
void dt__fill_pattern(void *dst, size_t bytes, const void *value, size_t elem);

/* Calls fn once per contiguous run of the box (global offset box_off, lengths box_len)
 * inside two compact row-major arrays: dst holds the block at global offset doff of shape
 * dshape, src the block at soff of shape sshape (a buffer holding exactly the box passes the
 * box as its offset and shape). Whole trailing dims are merged into one run. runtime/box.c. */
typedef void (*dt__run_fn)(void *dst, const void *src, int64_t n, void *arg);
void dt__box_apply(int rank, size_t elem, const int64_t *box_off, const int64_t *box_len,
                   void *dst, const int64_t *doff, const int64_t *dshape, const void *src,
                   const int64_t *soff, const int64_t *sshape, dt__run_fn fn, void *arg);

/* Copies a box between two compact row-major arrays through the device's copy: the box
 * `len` at global offset `box_off`, dst holding the block at `doff` of shape `dshape`, src
 * the block at `soff` of shape `sshape`. One call per contiguous run (whole trailing dims
 * merged). */
dt_status dt__device_copy_box(const dt__device *dev, dt__copy_dir dir, int rank, size_t elem,
                              const int64_t *box_off, const int64_t *len, void *dst,
                              const int64_t *doff, const int64_t *dshape, const void *src,
                              const int64_t *soff, const int64_t *sshape);

#endif
