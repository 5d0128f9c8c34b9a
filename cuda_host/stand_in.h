/* What the stand-ins of the host build (cudart.cc, cublas.cc, nccl.cc) share: queueing host
 * work on a stream and telling device memory from host memory. Host build only; C++. */
#ifndef DTENSOR_CUDA_HOST_STAND_IN_H
#define DTENSOR_CUDA_HOST_STAND_IN_H

#include <cuda_runtime_api.h>
#include <stddef.h>

extern "C" {
/* Runs fn(arg) on the stream's worker (0: the current device's legacy stream), in order. */
void dt__cuh_enqueue(cudaStream_t s, void (*fn)(void *), void *arg);
/* 1 if [p, p + n) lies in one allocation of device memory. */
int dt__cuh_is_device(const void *p, size_t n);
}

#endif
