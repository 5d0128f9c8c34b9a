/* Launchers of the CUDA device kind's own kernels (runtime/cuda/device_kernels.cu): pattern
 * fill and the relayout reductions, on a stream. C linkage. Not installed. */
#ifndef DTENSOR_RUNTIME_CUDA_DEVICE_KERNELS_H
#define DTENSOR_RUNTIME_CUDA_DEVICE_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* x[0 .. count*elem) = count copies of the elem-byte pattern (elem 1, 2, 4 or 8). */
cudaError_t dt__cudak_fill(void *x, int64_t count, uint64_t pattern, int elem, cudaStream_t s);
/* dst op= src for n elements: op 0 sum, 1 max, 2 min (dt_reduce_op; AVG sums); dtype is
 * dt_dtype's value. Half types round through f32 once per step, as the host kernels do. */
cudaError_t dt__cudak_reduce(int op, int dtype, void *dst, const void *src, int64_t n,
                             cudaStream_t s);
cudaError_t dt__cudak_divide(int dtype, void *x, int64_t n, int64_t k, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
