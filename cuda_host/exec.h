/* The block executor's interface (cuda_host/kernel_exec.cc) to the kernel-language header and
 * to the CUDA runtime stand-in: thread context, shared memory, barriers, warp operations and
 * launches. Host build only (-Dcuda=host); C++. */
#ifndef DTENSOR_CUDA_HOST_EXEC_H
#define DTENSOR_CUDA_HOST_EXEC_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#define DT__CUH_API __attribute__((visibility("default")))

/* One CUDA thread's view of its launch. */
struct dt__cuh_thread {
    uint3 tid, bid;
    dim3 bdim, gdim;
    unsigned linear;     /* linear thread id in the block */
    struct dt__cuh_block *blk;
};
extern "C" DT__CUH_API __thread struct dt__cuh_thread *dt__cuh_cur;

enum { DT__CUH_BAR_PLAIN, DT__CUH_BAR_OR, DT__CUH_BAR_AND, DT__CUH_BAR_COUNT };
enum {
    DT__CUH_WARP_SYNC, DT__CUH_WARP_IDX, DT__CUH_WARP_UP, DT__CUH_WARP_DOWN, DT__CUH_WARP_XOR,
    DT__CUH_WARP_BALLOT, DT__CUH_WARP_ANY, DT__CUH_WARP_ALL
};

struct dt__cuh_launch_desc {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    const char *key; /* the kernel's name as spelled: cudaFuncSetAttribute's key */
    const char *name, *file;
    int line;
    int bad_arg; /* 1 + the index of an argument pointing outside device memory, or 0 */
};

extern "C" {
DT__CUH_API void *dt__cuh_shared(const void *key, size_t bytes, size_t align, const char *file,
                                 int line);
DT__CUH_API void *dt__cuh_dynamic_shared(void);
/* 1 if p lies inside an allocation of device memory. */
DT__CUH_API int dt__cuh_in_device_memory(const void *p);
/* cudaFuncSetAttribute of a kernel by its name (cudaFuncAttributeMaxDynamicSharedMemorySize). */
DT__CUH_API cudaError_t dt__cuh_func_set_attribute(const char *key, enum cudaFuncAttribute attr,
                                                   int value);
DT__CUH_API int dt__cuh_syncthreads(int kind, int pred, const char *file, int line);
DT__CUH_API void dt__cuh_warp(int kind, unsigned mask, const uint64_t *in, uint64_t *out,
                              int lane_or_delta, int width, const char *file, int line);
/* Checks the launch (cudaGetLastError reports a bad one) and queues it on its stream. */
DT__CUH_API void dt__cuh_launch(const struct dt__cuh_launch_desc *d, void (*body)(void *),
                                void *closure, void (*destroy)(void *));

/* Runs a checked launch now, on the calling thread (a stream worker): every block in turn,
 * each thread of the block as an OS thread. Aborts the process with the lines at fault on a
 * barrier error or a kernel past its time (DT_CUDA_HOST_TIMEOUT seconds, default 60). */
void dt__cuh_run_kernel(const struct dt__cuh_launch_desc *d, void (*body)(void *), void *closure);
/* The dynamic shared memory limit cudaFuncSetAttribute set for a kernel (48 KiB without). */
size_t dt__cuh_kernel_smem_limit(const char *key);
}

#endif
