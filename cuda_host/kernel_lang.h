/* The CUDA kernel language as C++ for the host build (-Dcuda=host): threadIdx and friends read
 * the calling thread's context, __shared__ arrays and the dynamic shared memory come from the
 * running block, __syncthreads, the *_sync warp operations and atomics call the block executor
 * (cuda_host/kernel_exec.cc), which runs each thread of a block as an OS thread and checks
 * every barrier. Included through runtime/cuda/cu_lang.h; never with nvcc. */
#ifndef DTENSOR_CUDA_HOST_KERNEL_LANG_H
#define DTENSOR_CUDA_HOST_KERNEL_LANG_H

#ifndef __cplusplus
#error "cuda_host/kernel_lang.h is for the .cu files compiled as C++"
#endif

#include <cuda_runtime_api.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_host/exec.h"

/* Tells ops/cuda/cuda_ops.h that this is a kernel compilation. */
#define DT__CU_HOST_KERNELS 1

/* Execution spaces mean nothing on the host (NVIDIA's headers define them as attributes). */
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __constant__ static const
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
/* A bare __shared__ would be one object for every block of every stream: use DT__CU_SHARED. */
#define __shared__ DT__CU_SHARED_is_required_in_host_builds

#define threadIdx (dt__cuh_cur->tid)
#define blockIdx (dt__cuh_cur->bid)
#define blockDim (dt__cuh_cur->bdim)
#define gridDim (dt__cuh_cur->gdim)
#define warpSize 32

/* DT__CU_SHARED(double, sh, [32]): the running block's instance of this declaration (one per
 * declaration and block, keyed by a static's address, filled with 0xFF at the block's start). */
#define DT__CU_SHARED(type, name, dims)                                                     \
    static char name##_dt__cuh_key;                                                          \
    type(&name) dims = *reinterpret_cast<type(*) dims>(                                      \
        dt__cuh_shared(&name##_dt__cuh_key, sizeof(type dims), alignof(type), __FILE__, __LINE__))
#define DT__CU_DYNAMIC_SHARED(type, name) type *name = (type *)dt__cuh_dynamic_shared()

#define __syncthreads() dt__cuh_syncthreads(DT__CUH_BAR_PLAIN, 0, __FILE__, __LINE__)
#define __syncthreads_or(p) dt__cuh_syncthreads(DT__CUH_BAR_OR, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_and(p) dt__cuh_syncthreads(DT__CUH_BAR_AND, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_count(p) dt__cuh_syncthreads(DT__CUH_BAR_COUNT, (p) != 0, __FILE__, __LINE__)
#define __syncwarp(...) dt__cuh_syncwarp(__FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_sync(...) dt__cuh_shfl<DT__CUH_WARP_IDX>(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) dt__cuh_shfl<DT__CUH_WARP_UP>(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) dt__cuh_shfl<DT__CUH_WARP_DOWN>(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) dt__cuh_shfl<DT__CUH_WARP_XOR>(__FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, p) dt__cuh_vote(DT__CUH_WARP_BALLOT, (mask), (p), __FILE__, __LINE__)
#define __any_sync(mask, p) dt__cuh_vote(DT__CUH_WARP_ANY, (mask), (p), __FILE__, __LINE__)
#define __all_sync(mask, p) dt__cuh_vote(DT__CUH_WARP_ALL, (mask), (p), __FILE__, __LINE__)

static inline void dt__cuh_syncwarp(const char *file, int line, unsigned mask = 0xffffffffu)
{
    uint64_t none = 0;
    dt__cuh_warp(DT__CUH_WARP_SYNC, mask, &none, &none, 0, 32, file, line);
}

template <int K, typename T>
static inline T dt__cuh_shfl(const char *file, int line, unsigned mask, T v, int lane_or_delta,
                             int width = 32)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of T");
    uint64_t in = 0, out = 0;
    memcpy(&in, &v, sizeof v);
    dt__cuh_warp(K, mask, &in, &out, lane_or_delta, width, file, line);
    T r;
    memcpy(&r, &out, sizeof r);
    return r;
}

static inline unsigned dt__cuh_vote(int kind, unsigned mask, int pred, const char *file, int line)
{
    uint64_t in = pred != 0, out = 0;
    dt__cuh_warp(kind, mask, &in, &out, 0, 32, file, line);
    return (unsigned)out;
}

/* Atomics: relaxed, as on the GPU (ThreadSanitizer sees no ordering through them either). */
template <typename T> static inline T dt__cuh_atomic_rmw(T *p, T (*f)(T, T), T v)
{
    T old, want;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do
        want = f(old, v);
    while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
template <typename T> static inline T dt__cuh_add(T a, T b) { return a + b; }
template <typename T> static inline T dt__cuh_min(T a, T b) { return b < a ? b : a; }
template <typename T> static inline T dt__cuh_max(T a, T b) { return b > a ? b : a; }
template <typename T> static inline T atomicAdd(T *p, T v) { return dt__cuh_atomic_rmw(p, dt__cuh_add<T>, v); }
template <typename T> static inline T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
template <typename T> static inline T atomicMin(T *p, T v) { return dt__cuh_atomic_rmw(p, dt__cuh_min<T>, v); }
template <typename T> static inline T atomicMax(T *p, T v) { return dt__cuh_atomic_rmw(p, dt__cuh_max<T>, v); }
template <typename T> static inline T atomicExch(T *p, T v)
{
    T old;
    __atomic_exchange(p, &v, &old, __ATOMIC_RELAXED);
    return old;
}
template <typename T> static inline T atomicCAS(T *p, T cmp, T v)
{
    __atomic_compare_exchange(p, &cmp, &v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* Reinterpretations and the intrinsics the kernels use, at the precision nvcc gives them with
 * --fmad=false, or as near as the host's libm gets (the tests state each kernel's tolerance). */
template <typename To, typename From> static inline To dt__cuh_bits(From f)
{
    static_assert(sizeof(To) == sizeof(From), "bit cast of equal sizes");
    To t;
    memcpy(&t, &f, sizeof t);
    return t;
}
static inline unsigned __float_as_uint(float x) { return dt__cuh_bits<unsigned>(x); }
static inline float __uint_as_float(unsigned x) { return dt__cuh_bits<float>(x); }
static inline int __float_as_int(float x) { return dt__cuh_bits<int>(x); }
static inline float __int_as_float(int x) { return dt__cuh_bits<float>(x); }
static inline long long __double_as_longlong(double x) { return dt__cuh_bits<long long>(x); }
static inline double __longlong_as_double(long long x) { return dt__cuh_bits<double>(x); }
static inline float __double2float_rn(double x) { return (float)x; }
#define __expf(x) expf(x)
#define __logf(x) logf(x)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }

/* The launch: DT__CU_LAUNCH(k, grid, block, smem, stream)(args...) copies the arguments, as a
 * launch does, and queues the kernel on the stream (cuda_host/cudart.cc). The kernel is called
 * through a generic lambda, so that a template kernel's arguments deduce as under nvcc; the
 * kernel is known to cudaFuncSetAttribute by its name as spelled at the launch. */
/* A pointer argument of a launch must point into device memory (or be NULL): a host pointer
 * given to a kernel is an illegal address on a GPU. 0 when it does not. */
template <typename T> static inline int dt__cuh_arg_ok(T *p)
{
    return p == NULL || dt__cuh_in_device_memory((const void *)p);
}
template <typename T> static inline int dt__cuh_arg_ok(const T &)
{
    return 1;
}

template <typename F> struct dt__cuh_launcher {
    F call;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    const char *name, *file;
    int line;
    template <typename... A> void operator()(A &&...a) const
    {
        using args_t = std::tuple<std::decay_t<A>...>;
        struct closure {
            F call;
            args_t args;
        };
        closure *c = new closure{call, args_t(std::forward<A>(a)...)};
        dt__cuh_launch_desc d = {grid, block, smem, stream, name, name, file, line, 0};
        int k = 0;
        (void)((dt__cuh_arg_ok(a) ? (k++, true) : (d.bad_arg = k + 1, false)) && ...);
        dt__cuh_launch(&d,
                       [](void *p) {
                           const closure *cl = (const closure *)p;
                           std::apply(cl->call, cl->args);
                       },
                       c, [](void *p) { delete (closure *)p; });
    }
};
template <typename F>
static inline dt__cuh_launcher<F> dt__cuh_make_launcher(F call, dim3 g, dim3 b, size_t smem,
                                                       cudaStream_t s, const char *name,
                                                       const char *file, int line)
{
    return dt__cuh_launcher<F>{call, g, b, smem, s, name, file, line};
}
#define DT__CU_LAUNCH(kernel, grid, block, smem, stream)                                     \
    dt__cuh_make_launcher([](auto... dt__cuh_a) { kernel(dt__cuh_a...); }, dim3(grid),        \
                          dim3(block), (smem), (stream), #kernel, __FILE__, __LINE__)
/* cudaFuncSetAttribute(kernel, ...) in a .cu names the kernel as its launches spell it. */
#define cudaFuncSetAttribute(kernel, attr, value) dt__cuh_func_set_attribute(#kernel, attr, value)

#endif
