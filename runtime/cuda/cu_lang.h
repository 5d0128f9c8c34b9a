/* The few kernel-language constructs the .cu files spell through macros, so that they compile
 * both with nvcc and, in the host build (-Dcuda=host), as C++ over cuda_host/kernel_lang.h:
 * a launch (DT__CU_LAUNCH(kernel, grid, block, smem, stream)(args...) is
 * kernel<<<grid, block, smem, stream>>>(args...)) and block-shared arrays. Not installed. */
#ifndef DTENSOR_RUNTIME_CUDA_CU_LANG_H
#define DTENSOR_RUNTIME_CUDA_CU_LANG_H

#ifdef __CUDACC__
#define DT__CU_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
/* A __shared__ array: DT__CU_SHARED(double, sh, [32]) is __shared__ double sh[32]. */
#define DT__CU_SHARED(type, name, dims) __shared__ type name dims
/* The dynamic shared memory of the launch as a type *: extern __shared__ type name[]. */
#define DT__CU_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#else
#include "cuda_host/kernel_lang.h"
#endif

#endif
