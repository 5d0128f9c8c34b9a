/* The CPU device kind: host memory from the pool, synchronous copies and host kernels; its
 * start and stop run the CPU workers that compute several local devices' kernels at once. */
#include <string.h>

#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/shm.h"
#include "runtime/util.h"
#include "runtime/workers.h"

/* Tensor memory from the shm pool (runtime/shm.h) while it is up and has room, so that host
 * peers read it directly; else from the host pool. */
static dt_status cpu_alloc(const dt__device *dev, size_t bytes, void **ptr_out)
{
    if (dt__shm_alloc(bytes, ptr_out))
        return DT_OK;
    dt_status st = dt_host_alloc(bytes ? bytes : 1, ptr_out);
    if (st != DT_OK)
        return dt__error(st, "CPU device %d: no memory for %zu bytes", dev->global_id, bytes);
    return DT_OK;
}

static void cpu_free(const dt__device *dev, void *ptr)
{
    if (!dt__shm_free(ptr))
        dt_host_free(ptr);
}

static dt_status cpu_copy(const dt__device *dev, dt__copy_dir dir, void *dst, const void *src,
                          size_t bytes)
{
    if (bytes)
        dt__copy_large(dst, src, bytes); /* streaming stores from 8 MiB (runtime/copy.c) */
    return DT_OK;
}

static dt_status cpu_memset0(const dt__device *dev, void *ptr, size_t bytes)
{
    if (bytes)
        dt__zero_large(ptr, bytes);
    return DT_OK;
}

static dt_status cpu_fill(const dt__device *dev, void *ptr, int64_t count, const void *value,
                          size_t elem)
{
    dt__fill_pattern(ptr, (size_t)count * elem, value, elem);
    return DT_OK;
}

static dt_status cpu_reduce_into(const dt__device *dev, dt_reduce_op op, dt_dtype dtype,
                                 void *dst, const void *src, int64_t n)
{
    dt__host_reduce(op, dtype, dst, src, n);
    return DT_OK;
}

static dt_status cpu_divide(const dt__device *dev, dt_dtype dtype, void *x, int64_t n,
                            int64_t k)
{
    dt__host_divide(dtype, x, n, k);
    return DT_OK;
}

static dt_status cpu_sync(const dt__device *dev)
{
    return DT_OK;
}

/* The CPU workers (runtime/cpu_workers.c): ops run one share of their per-device kernels on
 * each; every entry above stays synchronous for its caller. */
static dt_status cpu_start(int ndevices, int nordinals)
{
    (void)nordinals;
    return dt__workers_start(ndevices);
}

static void cpu_stop(void)
{
    dt__workers_stop();
}

static const dt__device_kind cpu_kind = {
    .name = "cpu",
    .dl_type = kDLCPU,
    .host_visible = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = dt_host_alloc,
    .host_free = dt_host_free,
    .copy = cpu_copy,
    .memset0 = cpu_memset0,
    .fill = cpu_fill,
    .reduce_into = cpu_reduce_into,
    .divide = cpu_divide,
    .sync = cpu_sync,
    .ops = dt__ops_cpu_backend,
    .start = cpu_start,
    .stop = cpu_stop,
};

const dt__device_kind *dt__device_kind_cpu(void)
{
    return &cpu_kind;
}
