/* CUDA and NCCL parts of the runtime: GPU count, the split of a host's GPUs among its clients,
 * device memory and copies. Without CUDA in the build every GPU count is 0 and the memory
 * calls return DT_ERR_UNSUPPORTED. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/version.h"
#include "runtime/internal.h"

#if DT_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

/* The CUDA ordinals [gpu_first, gpu_first + gpu_count) are this client's local GPUs. */
static int gpu_first, gpu_count;

int dt__cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: behave as 0 GPUs */
        return 0;
    }
    return n;
}

int dt__nccl_version(void)
{
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess)
        return 0;
    return v;
}

int dt__have_cuda(void)
{
    return gpu_count > 0;
}

static dt_status cuda_error(cudaError_t err, const char *what)
{
    cudaGetLastError();
    return dt__error(DT_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(err),
                     cudaGetErrorName(err));
}

static dt_status set_local_device(int local_index, const char *caller)
{
    if (local_index < 0 || local_index >= gpu_count)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: local GPU %d out of range 0..%d", caller,
                         local_index, gpu_count - 1);
    cudaError_t err = cudaSetDevice(gpu_first + local_index);
    if (err != cudaSuccess)
        return cuda_error(err, caller);
    return DT_OK;
}

/* FNV-1a over the PCI bus ids of the visible GPUs, so clients can tell whether they see the
 * same GPUs (then they split them) or a launcher already gave each its own. */
static uint64_t visible_gpus_hash(int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        char bus[64] = "";
        if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, i) != cudaSuccess) {
            cudaGetLastError();
            snprintf(bus, sizeof bus, "ordinal-%d", i);
        }
        for (const char *p = bus; *p; p++)
            h = (h ^ (unsigned char)*p) * 1099511628211ull;
        h = (h ^ ';') * 1099511628211ull;
    }
    return h;
}

dt_status dt__cuda_assign(MPI_Comm host_comm, int use_gpus, int *count_out)
{
    int n = dt__cuda_device_count();
    int hsize, hrank, rc;
    uint64_t mine[2] = {(uint64_t)n, n > 0 ? visible_gpus_hash(n) : 0};
    uint64_t *all = NULL;
    dt_status st = DT_OK;

    if ((rc = MPI_Comm_size(host_comm, &hsize)) != MPI_SUCCESS ||
        (rc = MPI_Comm_rank(host_comm, &hrank)) != MPI_SUCCESS)
        return dt__mpi_error(rc, "dt_init: MPI_Comm_size/rank (host communicator)");
    all = malloc(sizeof *all * 2 * (size_t)hsize);
    if (!all)
        return dt__error(DT_ERR_NO_MEMORY, "dt_init: no memory for %d GPU records", hsize);
    /* Every client of the host takes part, whatever use_gpus says, so all stay in step. */
    rc = MPI_Allgather(mine, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, host_comm);
    if (rc != MPI_SUCCESS) {
        st = dt__mpi_error(rc, "dt_init: MPI_Allgather of GPU lists (host communicator)");
        goto out;
    }
    int same = 1;
    for (int r = 0; r < hsize; r++)
        if (all[2 * r] != mine[0] || all[2 * r + 1] != mine[1])
            same = 0;
    if (!use_gpus || n == 0) {
        gpu_first = gpu_count = 0;
    } else if (!same || hsize == 1) {
        gpu_first = 0;
        gpu_count = n;
    } else {
        /* Contiguous equal split; with fewer GPUs than clients the first n get one each. */
        int base = n / hsize, extra = n % hsize;
        gpu_first = hrank * base + (hrank < extra ? hrank : extra);
        gpu_count = base + (hrank < extra);
    }
    *count_out = gpu_count;
out:
    free(all);
    return st;
}

void dt__cuda_release(void)
{
    gpu_first = gpu_count = 0;
}

int dt__cuda_ordinal(int local_index)
{
    return local_index >= 0 && local_index < gpu_count ? gpu_first + local_index : -1;
}

int dt__cuda_local_index(int ordinal)
{
    return ordinal >= gpu_first && ordinal < gpu_first + gpu_count ? ordinal - gpu_first : -1;
}

dt_status dt__device_alloc(int local_index, size_t bytes, void **ptr_out)
{
    void *p = NULL;
    dt_status st = set_local_device(local_index, "dt__device_alloc: cudaSetDevice");
    if (st != DT_OK)
        return st;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return dt__error(err == cudaErrorMemoryAllocation ? DT_ERR_NO_MEMORY : DT_ERR_CUDA,
                         "cudaMalloc of %zu bytes on local GPU %d (CUDA device %d): %s", bytes,
                         local_index, gpu_first + local_index, cudaGetErrorString(err));
    }
    *ptr_out = p;
    return DT_OK;
}

void dt__device_free(int local_index, void *ptr)
{
    if (!ptr)
        return;
    if (set_local_device(local_index, "dt__device_free: cudaSetDevice") != DT_OK)
        return;
    if (cudaFree(ptr) != cudaSuccess)
        cudaGetLastError();
}

dt_status dt__device_memset0(int local_index, void *ptr, size_t bytes)
{
    dt_status st = set_local_device(local_index, "dt__device_memset0: cudaSetDevice");
    if (st != DT_OK)
        return st;
    cudaError_t err = cudaMemset(ptr, 0, bytes);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(0); /* callers treat the memory as zeroed on return */
    if (err != cudaSuccess)
        return cuda_error(err, "dt__device_memset0: cudaMemset");
    return DT_OK;
}

dt_status dt__device_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return DT_OK;
    cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (err != cudaSuccess)
        return cuda_error(err, "dt__device_copy: cudaMemcpy");
    return DT_OK;
}

#else /* !DT_HAVE_CUDA */

int dt__cuda_device_count(void)
{
    return 0;
}

int dt__nccl_version(void)
{
    return 0;
}

int dt__have_cuda(void)
{
    return 0;
}

dt_status dt__cuda_assign(MPI_Comm host_comm, int use_gpus, int *count_out)
{
    *count_out = 0;
    return DT_OK;
}

void dt__cuda_release(void)
{
}

int dt__cuda_ordinal(int local_index)
{
    return -1;
}

int dt__cuda_local_index(int ordinal)
{
    return -1;
}

dt_status dt__device_alloc(int local_index, size_t bytes, void **ptr_out)
{
    return dt__error(DT_ERR_UNSUPPORTED, "device memory: libdtensor was built without CUDA");
}

void dt__device_free(int local_index, void *ptr)
{
}

dt_status dt__device_memset0(int local_index, void *ptr, size_t bytes)
{
    return dt__error(DT_ERR_UNSUPPORTED, "device memory: libdtensor was built without CUDA");
}

dt_status dt__device_copy(void *dst, const void *src, size_t bytes)
{
    return dt__error(DT_ERR_UNSUPPORTED, "device copies: libdtensor was built without CUDA");
}

#endif
