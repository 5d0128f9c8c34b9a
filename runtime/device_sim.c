/* The simulated GPU device kind (DT_GPU=sim): memory from the no-access arena, every access
 * to it a closure run on the device's stream thread through the shadow view; H2D and D2H
 * copies wait for it, the rest is asynchronous. It says kDLCUDA so that DLPack consumers and
 * the tests treat it exactly as a CUDA device (docs/devices-sim.md). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/device.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/sim.h"
#include "runtime/util.h"

#define DEFAULT_MB 4096
#define MAX_MB (1u << 24) /* 16 TiB of address space, twice */

/* Device memory of this kind: [p, p + bytes) inside the arena. */
static dt_status check_dev(const dt__device *dev, const char *what, const void *p, size_t bytes)
{
    if (bytes == 0 || dt__sim_owns(p, bytes))
        return DT_OK;
    return dt__error(DT_ERR_INVALID_ARGUMENT, "simulated GPU device %d: %s: %p (%zu bytes) is "
                     "not simulated device memory", dev->global_id, what, p, bytes);
}

static dt_status sim_alloc(const dt__device *dev, size_t bytes, void **ptr_out)
{
    return dt__sim_alloc(dev->global_id, bytes, ptr_out);
}

static void sim_free(const dt__device *dev, void *ptr)
{
    if (!ptr)
        return;
    dt__sim_drain_all(); /* as cudaFree: no queued work may still use the block */
    dt__sim_free(ptr);
}

typedef struct copy_args {
    void *dst;
    const void *src;
    size_t bytes;
} copy_args;

static dt_status run_copy(void *arg)
{
    copy_args *a = arg;
    memcpy(dt__sim_xlate(a->dst), dt__sim_xlate(a->src), a->bytes);
    return DT_OK;
}

static dt_status sim_copy(const dt__device *dev, dt__copy_dir dir, void *dst, const void *src,
                          size_t bytes)
{
    if (bytes == 0)
        return DT_OK;
    /* Device sides in the arena; the host side outside it (on a GPU it would fault). */
    const void *host = dir == DT__COPY_H2D ? src : dir == DT__COPY_D2H ? dst : NULL;
    dt_status st = check_dev(dev, "copy destination", dst, dir == DT__COPY_D2H ? 0 : bytes);
    if (st == DT_OK)
        st = check_dev(dev, "copy source", src, dir == DT__COPY_H2D ? 0 : bytes);
    if (st == DT_OK && host && dt__sim_owns(host, 1))
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "simulated GPU device %d: host side of a copy "
                       "(%p) is simulated device memory", dev->global_id, host);
    if (st != DT_OK)
        return st;
    copy_args a = {dst, src, bytes};
    st = dt__sim_submit(dev->ordinal, run_copy, &a, sizeof a);
    if (st == DT_OK && dir != DT__COPY_D2D) /* the host buffer is done with on return */
        st = dt__sim_sync(dev->ordinal);
    return st;
}

typedef struct fill_args {
    void *ptr;
    size_t bytes, elem;
    unsigned char value[16]; /* elem bytes; all zero for memset0 */
} fill_args;

static dt_status run_fill(void *arg)
{
    fill_args *a = arg;
    dt__fill_pattern(dt__sim_xlate(a->ptr), a->bytes, a->value, a->elem);
    return DT_OK;
}

static dt_status sim_fill(const dt__device *dev, void *ptr, int64_t count, const void *value,
                          size_t elem)
{
    fill_args a = {ptr, 0, elem, {0}};
    if (count < 0 || elem == 0 || elem > sizeof a.value ||
        dt__mul_size((size_t)count, elem, &a.bytes) != 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "simulated GPU device %d: fill of %lld "
                         "elements of %zu bytes", dev->global_id, (long long)count, elem);
    dt_status st = check_dev(dev, "fill", ptr, a.bytes);
    if (st != DT_OK || a.bytes == 0)
        return st;
    if (value)
        memcpy(a.value, value, elem);
    return dt__sim_submit(dev->ordinal, run_fill, &a, sizeof a);
}

static dt_status sim_memset0(const dt__device *dev, void *ptr, size_t bytes)
{
    return sim_fill(dev, ptr, (int64_t)bytes, NULL, 1);
}

typedef struct reduce_args {
    int divide; /* 0: dst op= src; 1: dst /= k */
    dt_reduce_op op;
    dt_dtype dtype;
    void *dst;
    const void *src;
    int64_t n, k;
} reduce_args;

static dt_status run_reduce(void *arg)
{
    reduce_args *a = arg;
    if (a->divide)
        dt__host_divide(a->dtype, dt__sim_xlate(a->dst), a->n, a->k);
    else
        dt__host_reduce(a->op, a->dtype, dt__sim_xlate(a->dst), dt__sim_xlate(a->src), a->n);
    return DT_OK;
}

static dt_status submit_reduce(const dt__device *dev, const reduce_args *a)
{
    size_t size = dt_dtype_size(a->dtype), bytes = 0;
    if (size == 0 || a->n < 0 || dt__mul_size((size_t)a->n, size, &bytes) != 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "simulated GPU device %d: %s of %lld "
                         "elements of dtype %d", dev->global_id,
                         a->divide ? "divide" : "reduction", (long long)a->n, (int)a->dtype);
    dt_status st = check_dev(dev, a->divide ? "divide" : "reduction destination", a->dst, bytes);
    if (st == DT_OK && !a->divide)
        st = check_dev(dev, "reduction source", a->src, bytes);
    if (st != DT_OK || bytes == 0)
        return st;
    return dt__sim_submit(dev->ordinal, run_reduce, a, sizeof *a);
}

static dt_status sim_reduce_into(const dt__device *dev, dt_reduce_op op, dt_dtype dtype,
                                 void *dst, const void *src, int64_t n)
{
    reduce_args a = {0, op, dtype, dst, src, n, 0};
    return submit_reduce(dev, &a);
}

static dt_status sim_divide(const dt__device *dev, dt_dtype dtype, void *x, int64_t n,
                            int64_t k)
{
    reduce_args a = {1, DT_REDUCE_SUM, dtype, x, NULL, n, k};
    return submit_reduce(dev, &a);
}

static dt_status sim_sync(const dt__device *dev)
{
    return dt__sim_sync(dev->ordinal);
}

/* DT_SIM_MEMORY_MB: the arena's size (unset: DEFAULT_MB). */
static dt_status parse_memory(size_t *bytes_out)
{
    uint64_t bytes = 0;
    dt_status st = dt__env_mib("DT_SIM_MEMORY_MB", DEFAULT_MB, 1, MAX_MB,
                               "MiB of simulated GPU memory per process", &bytes);
    if (st == DT_OK)
        *bytes_out = (size_t)bytes;
    return st;
}

static dt_status sim_start(int ndevices, int nordinals)
{
    size_t bytes = 0;
    dt_status st = parse_memory(&bytes);
    if (st == DT_OK)
        st = dt__sim_arena_open(bytes);
    if (st != DT_OK)
        return st;
    st = dt__sim_streams_start(nordinals);
    if (st != DT_OK)
        dt__sim_arena_close();
    return st;
}

static void sim_stop(void)
{
    dt__sim_streams_stop();
    dt__sim_arena_close();
}

static const dt__device_kind sim_kind = {
    .name = "sim",
    .dl_type = kDLCUDA, /* the same DLPack view and tests as a CUDA device */
    .host_visible = 0,
    .alloc = sim_alloc,
    .free = sim_free,
    .host_alloc = dt_host_alloc,
    .host_free = dt_host_free,
    .copy = sim_copy,
    .memset0 = sim_memset0,
    .fill = sim_fill,
    .reduce_into = sim_reduce_into,
    .divide = sim_divide,
    .sync = sim_sync,
    .ops = dt__ops_sim_backend,
    .start = sim_start,
    .stop = sim_stop,
};

const dt__device_kind *dt__device_kind_sim(void)
{
    return &sim_kind;
}
