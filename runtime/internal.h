/* The runtime's one internal header: what modules share beyond the public API
 * (error setting, the MPI communicator, dtype tables, small helpers). Not installed. */
#ifndef DTENSOR_RUNTIME_INTERNAL_H
#define DTENSOR_RUNTIME_INTERNAL_H

#include <mpi.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

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

/* CUDA present in this build and runtime: 1 or 0. */
int dt__have_cuda(void);

/* Checked size arithmetic: 0 on success, -1 on overflow. */
int dt__mul_size(size_t a, size_t b, size_t *out);

/* Product of shape[0..rank-1] (1 for rank 0). Assumes non-negative entries. */
int64_t dt__numel(int rank, const int64_t *shape);

/* CUDA (runtime/cuda.c). Without CUDA in the build: count 0, version 0, and the memory calls
 * return DT_ERR_UNSUPPORTED. local_index is the client's local GPU index. */
int dt__cuda_device_count(void);
int dt__nccl_version(void);
dt_status dt__device_alloc(int local_index, size_t bytes, void **ptr_out);
void dt__device_free(int local_index, void *ptr);
dt_status dt__device_memset0(int local_index, void *ptr, size_t bytes);
/* Copy between any host/device pointers (unified addressing). */
dt_status dt__device_copy(void *dst, const void *src, size_t bytes);

/* Bounded string copy that always NUL-terminates; returns strlen(src). */
size_t dt__strlcpy(char *dst, const char *src, size_t len);

#endif
