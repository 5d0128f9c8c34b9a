/* CUDA and NCCL parts of the runtime (CUDA builds only): the GPUs present and the split of
 * a host's GPUs among its clients. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "runtime/cuda.h"
#include "runtime/error.h"

static _Thread_local char absence[160];

int dt__cuda_device_count(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: behave as 0 GPUs */
        snprintf(absence, sizeof absence, "cudaGetDeviceCount: %s", cudaGetErrorString(err));
        return 0;
    }
    if (n == 0)
        snprintf(absence, sizeof absence, "the CUDA driver reports no device");
    return n;
}

const char *dt__cuda_absence(void)
{
    if (dt__cuda_device_count() > 0)
        snprintf(absence, sizeof absence, "every GPU is in use by other clients");
    return absence;
}

int dt__nccl_version(void)
{
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess)
        return 0;
    return v;
}

dt_status dt__cuda_status(cudaError_t err, const char *what)
{
    if (err == cudaSuccess)
        return DT_OK;
    cudaGetLastError();
    return dt__error(err == cudaErrorMemoryAllocation ? DT_ERR_NO_MEMORY : DT_ERR_CUDA,
                     "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
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

dt_status dt__cuda_assign(MPI_Comm host_comm, int use, int *first_out, int *count_out)
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
    /* Every client of the host takes part, whatever `use` says, so all stay in step. */
    rc = MPI_Allgather(mine, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, host_comm);
    if (rc != MPI_SUCCESS) {
        st = dt__mpi_error(rc, "dt_init: MPI_Allgather of GPU lists (host communicator)");
        goto out;
    }
    int same = 1;
    for (int r = 0; r < hsize; r++)
        if (all[2 * r] != mine[0] || all[2 * r + 1] != mine[1])
            same = 0;
    if (!use || n == 0) {
        *first_out = *count_out = 0;
    } else if (!same || hsize == 1) {
        *first_out = 0;
        *count_out = n;
    } else if (n < hsize) {
        /* Fewer GPUs than clients: they share, hsize / n clients (or one more) per GPU. */
        *first_out = (int)((long long)hrank * n / hsize);
        *count_out = 1;
    } else {
        /* Contiguous equal split. */
        int base = n / hsize, extra = n % hsize;
        *first_out = hrank * base + (hrank < extra ? hrank : extra);
        *count_out = base + (hrank < extra);
    }
out:
    free(all);
    return st;
}

