/* CUDA parts of the runtime (CUDA builds only): the GPUs present and the split of a host's
 * GPUs among its clients. Not installed. */
#ifndef DTENSOR_RUNTIME_CUDA_H
#define DTENSOR_RUNTIME_CUDA_H

#include <cuda_runtime_api.h>
#include <mpi.h>

#include "dtensor/status.h"

/* CUDA GPUs visible to this process (0 without a driver or device). */
int dt__cuda_device_count(void);
/* Why no GPU is usable ("no CUDA driver: ...", "no CUDA device"), a static or thread-local
 * string for messages. */
const char *dt__cuda_absence(void);
int dt__nccl_version(void);

/* This client's share of the host's GPUs, ordinals [*first_out, *first_out + *count_out):
 * clients that see the same GPUs split them in contiguous blocks, and share them round-robin
 * when there are fewer GPUs than clients; clients that see different GPUs (a launcher gave
 * each its own) keep what they see. use 0: count 0. Collective over host_comm. */
dt_status dt__cuda_assign(MPI_Comm host_comm, int use, int *first_out, int *count_out);

/* DT_ERR_CUDA (DT_ERR_NO_MEMORY for an allocation failure) "<what>: <text> (<name>)", or
 * DT_OK for cudaSuccess; clears CUDA's last error. */
dt_status dt__cuda_status(cudaError_t err, const char *what);

#endif
