/* The CUDA device kind: device memory, copies and the reduction kernels on the device's
 * default stream, page-locked staging memory; its kernel table is ops/cuda's. */
#include <stdio.h>
#include <string.h>

#include "runtime/cuda.h"
#include "runtime/cuda/device_kernels.h"
#include "runtime/device.h"
#include "runtime/error.h"

static dt_status select_device(const dt__device *dev, const char *what)
{
    cudaError_t err = cudaSetDevice(dev->ordinal);
    if (err == cudaSuccess)
        return DT_OK;
    char msg[96];
    snprintf(msg, sizeof msg, "%s: cudaSetDevice(%d) for GPU device %d", what, dev->ordinal,
             dev->global_id);
    return dt__cuda_status(err, msg);
}

static dt_status cuda_alloc(const dt__device *dev, size_t bytes, void **ptr_out)
{
    dt_status st = select_device(dev, "device memory");
    if (st != DT_OK)
        return st;
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        cudaGetLastError();
        return dt__error(err == cudaErrorMemoryAllocation ? DT_ERR_NO_MEMORY : DT_ERR_CUDA,
                         "GPU device %d (CUDA device %d): cudaMalloc of %zu bytes failed: %s "
                         "(%zu of %zu bytes free)", dev->global_id, dev->ordinal, bytes,
                         cudaGetErrorString(err), free_b, total_b);
    }
    *ptr_out = p;
    return DT_OK;
}

static void cuda_free(const dt__device *dev, void *ptr)
{
    if (!ptr || select_device(dev, "device memory") != DT_OK)
        return;
    if (cudaFree(ptr) != cudaSuccess) /* waits for the work using it */
        cudaGetLastError();
}

static dt_status cuda_host_alloc(size_t bytes, void **ptr_out)
{
    cudaError_t err = cudaMallocHost(ptr_out, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return dt__error(DT_ERR_NO_MEMORY, "cudaMallocHost of %zu bytes of page-locked staging "
                         "memory: %s", bytes, cudaGetErrorString(err));
    }
    return DT_OK;
}

static void cuda_host_free(void *ptr)
{
    if (ptr && cudaFreeHost(ptr) != cudaSuccess)
        cudaGetLastError();
}

static dt_status cuda_copy(const dt__device *dev, dt__copy_dir dir, void *dst, const void *src,
                           size_t bytes)
{
    if (bytes == 0)
        return DT_OK;
    dt_status st = select_device(dev, "device copy");
    if (st != DT_OK)
        return st;
    cudaError_t err;
    if (dir == DT__COPY_D2D) /* same GPU or a peer: unified addressing finds both */
        err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, 0);
    else
        err = cudaMemcpy(dst, src, bytes, dir == DT__COPY_H2D ? cudaMemcpyHostToDevice
                                                              : cudaMemcpyDeviceToHost);
    return dt__cuda_status(err, dir == DT__COPY_D2D ? "cudaMemcpyAsync (device to device)"
                                : dir == DT__COPY_H2D ? "cudaMemcpy (host to device)"
                                                      : "cudaMemcpy (device to host)");
}

static dt_status cuda_memset0(const dt__device *dev, void *ptr, size_t bytes)
{
    dt_status st = select_device(dev, "device memset");
    if (st == DT_OK && bytes)
        st = dt__cuda_status(cudaMemsetAsync(ptr, 0, bytes, 0), "cudaMemsetAsync");
    return st;
}

static dt_status cuda_fill(const dt__device *dev, void *ptr, int64_t count, const void *value,
                           size_t elem)
{
    uint64_t pattern = 0;
    if (elem > sizeof pattern)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "device fill: %zu-byte elements", elem);
    memcpy(&pattern, value, elem);
    dt_status st = select_device(dev, "device fill");
    if (st == DT_OK)
        st = dt__cuda_status(dt__cudak_fill(ptr, count, pattern, (int)elem, 0), "fill kernel");
    return st;
}

static dt_status cuda_reduce_into(const dt__device *dev, dt_reduce_op op, dt_dtype dtype,
                                  void *dst, const void *src, int64_t n)
{
    dt_status st = select_device(dev, "device reduction");
    if (st == DT_OK)
        st = dt__cuda_status(dt__cudak_reduce((int)op, (int)dtype, dst, src, n, 0),
                             "reduction kernel");
    return st;
}

static dt_status cuda_divide(const dt__device *dev, dt_dtype dtype, void *x, int64_t n,
                             int64_t k)
{
    dt_status st = select_device(dev, "device divide");
    if (st == DT_OK)
        st = dt__cuda_status(dt__cudak_divide((int)dtype, x, n, k, 0), "divide kernel");
    return st;
}

static dt_status cuda_sync(const dt__device *dev)
{
    dt_status st = select_device(dev, "device sync");
    if (st == DT_OK)
        st = dt__cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return st;
}

static const dt__device_kind cuda_kind = {
    .name = "cuda",
    .dl_type = kDLCUDA,
    .host_visible = 0,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy = cuda_copy,
    .memset0 = cuda_memset0,
    .fill = cuda_fill,
    .reduce_into = cuda_reduce_into,
    .divide = cuda_divide,
    .sync = cuda_sync,
    .ops = dt__ops_cuda_backend,
};

const dt__device_kind *dt__device_kind_cuda(void)
{
    return &cuda_kind;
}
