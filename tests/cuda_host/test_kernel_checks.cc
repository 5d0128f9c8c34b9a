/* The host build's kernel executor and CUDA runtime stand-in catch what a GPU would leave
 * undefined or report late: a barrier in divergent code, a barrier after threads returned, a
 * warp operation with a mask that does not match its callers, a kernel that never ends, too much
 * dynamic shared memory, a host pointer given to a kernel, host code reading device memory; and
 * the warp operations, shared memory and atomics behave as CUDA's. Each bad kernel runs in a
 * child process, which must die with the lines at fault on stderr. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "runtime/cuda/cu_lang.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* Runs fn in a child; returns its stderr (owned) and whether it died: a signal, or an exit
 * status other than 0 and 3 (a sanitizer's report exits with its own status). */
static char *run_child(void (*fn)(void), int *signaled)
{
    int fds[2];
    if (pipe(fds) != 0)
        return NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        fn();
        cudaError_t e = cudaDeviceSynchronize();
        fprintf(stderr, "child ended: %s\n", cudaGetErrorName(e));
        _exit(e == cudaSuccess ? 0 : 3);
    }
    close(fds[1]);
    size_t cap = 1 << 16, len = 0;
    char *buf = (char *)calloc(cap, 1);
    ssize_t r;
    while ((r = read(fds[0], buf + len, cap - 1 - len)) > 0)
        len += (size_t)r;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    *signaled = WIFSIGNALED(status) ||
                (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3);
    return buf;
}

#define EXPECT_DIES_SAYING(fn, ...)                                                          \
    do {                                                                                     \
        int sig_ = 0;                                                                        \
        char *err_ = run_child(fn, &sig_);                                                   \
        CU_ASSERT(sig_);                                                                     \
        const char *want_[] = {__VA_ARGS__};                                                 \
        for (const char *w_ : want_) {                                                       \
            CU_ASSERT_PTR_NOT_NULL(strstr(err_, w_));                                        \
            if (!strstr(err_, w_))                                                           \
                fprintf(stderr, "missing '%s' in:\n%s\n", w_, err_);                         \
        }                                                                                    \
        free(err_);                                                                          \
    } while (0)

static int *dev_ints(int n)
{
    int *d = NULL;
    CU_ASSERT_FATAL(cudaMalloc((void **)&d, sizeof(int) * (size_t)n) == cudaSuccess);
    CU_ASSERT_FATAL(cudaMemset(d, 0, sizeof(int) * (size_t)n) == cudaSuccess);
    return d;
}

/* ---- bad kernels --------------------------------------------------------------------------- */

__global__ static void divergent_barrier_kernel(int *out)
{
    if (threadIdx.x < 16)
        __syncthreads(); /* BARRIER-A */
    else
        __syncthreads(); /* BARRIER-B */
    out[threadIdx.x] = 1;
}
static void divergent_barrier(void)
{
    DT__CU_LAUNCH(divergent_barrier_kernel, 1, 48, 0, 0)(dev_ints(48));
}

__global__ static void barrier_after_return_kernel(int *out)
{
    if (threadIdx.x >= 40)
        return;
    __syncthreads(); /* AFTER-RETURN */
    out[threadIdx.x] = 1;
}
static void barrier_after_return(void)
{
    DT__CU_LAUNCH(barrier_after_return_kernel, 2, 50, 0, 0)(dev_ints(50));
}

__global__ static void partial_warp_full_mask_kernel(int *out)
{
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1); /* PARTIAL-SHFL */
}
static void partial_warp_full_mask(void)
{
    DT__CU_LAUNCH(partial_warp_full_mask_kernel, 1, 40, 0, 0)(dev_ints(40)); /* last warp: 8 */
}

__global__ static void mask_mismatch_kernel(int *out)
{
    unsigned mask = threadIdx.x < 16 ? 0x0000ffffu : 0xffffffffu;
    out[threadIdx.x] = __shfl_xor_sync(mask, (int)threadIdx.x, 1); /* MASK-SHFL */
}
static void mask_mismatch(void)
{
    DT__CU_LAUNCH(mask_mismatch_kernel, 1, 32, 0, 0)(dev_ints(32));
}

__global__ static void endless_kernel(int *flag)
{
    while (__atomic_load_n(flag, __ATOMIC_RELAXED) == 0)
        ;
}
static void endless(void)
{
    setenv("DT_CUDA_HOST_TIMEOUT", "1", 1);
    DT__CU_LAUNCH(endless_kernel, 1, 2, 0, 0)(dev_ints(1));
}

static int host_ints[4];
__global__ static void store_kernel(int *out)
{
    out[threadIdx.x] = 7;
}
static void host_pointer_to_kernel(void)
{
    DT__CU_LAUNCH(store_kernel, 1, 4, 0, 0)(host_ints);
    cudaError_t e = cudaDeviceSynchronize();
    fprintf(stderr, "sync: %s\n", cudaGetErrorName(e));
    abort(); /* the parent checks the text */
}

static void host_reads_device_memory(void)
{
    int *d = dev_ints(4);
    fprintf(stderr, "host read %d\n", d[0]); /* SIGSEGV: no device work runs */
}

/* Under the sanitizers: a missing __syncthreads, a warp reduction that assumes lockstep
 * execution, a dynamic shared memory overrun. */
/* (Floats 8 bytes apart: ThreadSanitizer keeps 4 accesses per 8 bytes, and more sharing one
 * cell could push the racing write out before the read.) */
__global__ static void missing_barrier_kernel(float *out)
{
    DT__CU_SHARED(float, tile, [128]);
    tile[2 * threadIdx.x] = (float)threadIdx.x; /* TSAN-WRITE */
    out[threadIdx.x] = tile[2 * (63 - threadIdx.x)]; /* TSAN-READ: no __syncthreads between */
}
static void missing_barrier(void)
{
    float *d = NULL;
    cudaMalloc((void **)&d, 64 * sizeof *d);
    for (int i = 0; i < 8; i++) /* as lockstep's, below */
        DT__CU_LAUNCH(missing_barrier_kernel, 1, 64, 0, 0)(d);
    cudaDeviceSynchronize();
}

__global__ static void lockstep_kernel(float *out)
{
    DT__CU_SHARED(float, s, [64]);
    volatile float *v = s;
    unsigned t = threadIdx.x;
    v[2 * t] = (float)t;
    __syncthreads();
    if (t < 16)
        v[2 * t] += v[2 * (t + 16)]; /* TSAN-LOCKSTEP-1 */
    if (t < 8)
        v[2 * t] += v[2 * (t + 8)]; /* TSAN-LOCKSTEP-2: no __syncwarp */
    if (t == 0)
        out[0] = v[0];
}
/* Launched 8 times: a thread that passes its racing access and then takes the block's lock
 * (its exit) before a peer wakes from the barrier orders the two accesses for ThreadSanitizer
 * (the peer's wake-up takes the same lock), which happens often on a loaded machine; each
 * launch is another chance for the threads to interleave as on a GPU. */
static void lockstep(void)
{
    float *d = NULL;
    cudaMalloc((void **)&d, sizeof *d);
    for (int i = 0; i < 8; i++)
        DT__CU_LAUNCH(lockstep_kernel, 1, 32, 0, 0)(d);
    cudaDeviceSynchronize();
}

__global__ static void smem_overrun_kernel(float *out)
{
    DT__CU_DYNAMIC_SHARED(float, d);
    d[threadIdx.x] = 1.0f; /* ASAN-OVERRUN: the launch gave blockDim - 1 floats */
    out[threadIdx.x] = 0.0f;
}
static void smem_overrun(void)
{
    float *d = NULL;
    cudaMalloc((void **)&d, 32 * sizeof *d);
    DT__CU_LAUNCH(smem_overrun_kernel, 1, 32, 31 * sizeof(float), 0)(d);
}

/* The line of a marker comment in this file (DT_TEST_SRCDIR: tests/, as meson runs it). */
static char *line_of(const char *marker)
{
    static char buf[8][64];
    static int next;
    const char *dir = getenv("DT_TEST_SRCDIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/cuda_host/test_kernel_checks.cc", dir ? dir : ".");
    FILE *fp = fopen(path, "r");
    if (!fp)
        fp = fopen(__FILE__, "r");
    char line[512];
    int n = 0;
    char *out = buf[next++ % 8];
    snprintf(out, 64, "?");
    while (fp && fgets(line, sizeof line, fp)) {
        n++;
        if (strstr(line, marker) && !strstr(line, "line_of(")) {
            snprintf(out, 64, "test_kernel_checks.cc:%d", n);
            break;
        }
    }
    if (fp)
        fclose(fp);
    return out;
}

/* Whether a child running fn reports a ThreadSanitizer data race naming every line in want: in
 * one of 8 runs (a race shows when TSan still holds both accesses in its shadow, which depends on
 * how the threads interleave). */
static int tsan_reports(void (*fn)(void), int nwant, const char *const *want)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        int died = 0, all = 1;
        char *err = run_child(fn, &died);
        all = died && strstr(err, "ThreadSanitizer: data race") != NULL;
        for (int i = 0; i < nwant && all; i++)
            all = strstr(err, want[i]) != NULL;
        free(err);
        if (all)
            return 1;
    }
    return 0;
}

[[maybe_unused]] static void test_tsan_reports_a_missing_syncthreads_with_both_lines(void)
{
    const char *want[] = {line_of("TSAN-WRITE"), line_of("TSAN-READ")};
    CU_ASSERT(tsan_reports(missing_barrier, 2, want));
}

[[maybe_unused]] static void test_tsan_reports_a_warp_reduction_that_assumes_lockstep(void)
{
    const char *want[] = {line_of("TSAN-LOCKSTEP-2")};
    CU_ASSERT(tsan_reports(lockstep, 1, want));
}

[[maybe_unused]] static void test_asan_reports_a_dynamic_shared_memory_overrun_at_its_line(void)
{
    int sig = 0;
    char *err = run_child(smem_overrun, &sig);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "AddressSanitizer: heap-buffer-overflow"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, line_of("ASAN-OVERRUN")));
    free(err);
}

/* ---- the tests ------------------------------------------------------------------------------ */

static void test_a_barrier_in_divergent_code_is_an_error_naming_both_lines(void)
{
    EXPECT_DIES_SAYING(divergent_barrier, "threads reach different barriers",
                       line_of("BARRIER-A"), line_of("BARRIER-B"),
                       "divergent_barrier_kernel");
}

static void test_a_barrier_that_returned_threads_never_reach_is_an_error(void)
{
    EXPECT_DIES_SAYING(barrier_after_return, line_of("AFTER-RETURN"), "returned");
}

static void test_a_shuffle_whose_mask_names_lanes_past_a_partial_warp_is_an_error(void)
{
    EXPECT_DIES_SAYING(partial_warp_full_mask, "__shfl_down_sync at",
                       line_of("PARTIAL-SHFL"), "names lanes past the 8 of warp 1");
}

static void test_lanes_of_one_shuffle_with_different_masks_are_an_error(void)
{
    EXPECT_DIES_SAYING(mask_mismatch, "__shfl_xor_sync", line_of("MASK-SHFL"));
}

static void test_a_kernel_that_never_ends_is_an_error_within_the_time_bound(void)
{
    EXPECT_DIES_SAYING(endless, "did not finish within 1 s", "endless_kernel");
}

static void test_a_host_pointer_given_to_a_kernel_is_an_illegal_address_at_the_next_sync(void)
{
    EXPECT_DIES_SAYING(host_pointer_to_kernel, "argument 1 points outside device memory",
                       "sync: cudaErrorIllegalAddress");
}

static void test_host_code_reading_device_memory_faults(void)
{
    int sig = 0;
    char *err = run_child(host_reads_device_memory, &sig);
    CU_ASSERT(sig || strstr(err, "SEGV")); /* AddressSanitizer reports it and exits */
    CU_ASSERT_PTR_NULL(strstr(err, "host read "));
    free(err);
}

/* ---- good kernels: CUDA's semantics ----------------------------------------------------------- */

__global__ static void warp_ops_kernel(int *out, int width)
{
    int t = (int)threadIdx.x, n = (int)blockDim.x;
    unsigned lanes = (unsigned)(n - (t & ~31)) >= 32 ? 0xffffffffu : (1u << (n & 31)) - 1;
    out[0 * n + t] = __shfl_down_sync(lanes, t, 3, width);
    out[1 * n + t] = __shfl_up_sync(lanes, t, 2, width);
    out[2 * n + t] = __shfl_xor_sync(lanes, t, 1, width);
    out[3 * n + t] = __shfl_sync(lanes, t, 5, width);
    out[4 * n + t] = (int)__ballot_sync(lanes, t % 3 == 0);
    out[5 * n + t] = __any_sync(lanes, t == 33) + 2 * __all_sync(lanes, t < 1000);
}

static void test_shuffles_and_votes_follow_cuda_on_full_and_partial_warps(void)
{
    const int n = 44, width = 4; /* a partial last warp of 12 lanes: 3 segments */
    int *d = dev_ints(6 * n), h[6 * n];
    DT__CU_LAUNCH(warp_ops_kernel, 1, n, 0, 0)(d, width);
    CU_ASSERT_FATAL(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int t = 0; t < n; t++) {
        int warp0 = t & ~31, lane = t & 31, seg = lane & ~(width - 1), pos = lane & (width - 1);
        int nl = n - warp0 >= 32 ? 32 : n - warp0;
        CU_ASSERT_EQUAL(h[0 * n + t], pos + 3 < width ? t + 3 : t);
        CU_ASSERT_EQUAL(h[1 * n + t], pos >= 2 ? t - 2 : t);
        CU_ASSERT_EQUAL(h[2 * n + t], t ^ 1);
        CU_ASSERT_EQUAL(h[3 * n + t], warp0 + seg + (5 & (width - 1)));
        unsigned ballot = 0;
        for (int l = 0; l < nl; l++)
            if ((warp0 + l) % 3 == 0)
                ballot |= 1u << l;
        CU_ASSERT_EQUAL((unsigned)h[4 * n + t], ballot);
        CU_ASSERT_EQUAL(h[5 * n + t], (warp0 == 32 ? 1 : 0) + 2);
    }
    cudaFree(d);
}

__global__ static void shared_kernel(float *out, int *sum)
{
    DT__CU_SHARED(float, tile, [64]);
    DT__CU_DYNAMIC_SHARED(float, dyn);
    out[threadIdx.x] = tile[threadIdx.x]; /* never written: 0xFF bytes, a NaN */
    __syncthreads();
    tile[threadIdx.x] = (float)threadIdx.x;
    dyn[threadIdx.x] = 2.0f * (float)threadIdx.x;
    __syncthreads();
    out[64 + threadIdx.x] = tile[63 - threadIdx.x] + dyn[63 - threadIdx.x];
    atomicAdd(sum, (int)threadIdx.x);
}

static void test_shared_memory_is_per_block_and_uninitialised_reads_give_nan(void)
{
    float *d = NULL, h[128];
    int *sum = dev_ints(1), hs = 0;
    CU_ASSERT_FATAL(cudaMalloc((void **)&d, sizeof h) == cudaSuccess);
    DT__CU_LAUNCH(shared_kernel, 3, 64, 64 * sizeof(float), 0)(d, sum);
    CU_ASSERT_FATAL(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
    CU_ASSERT_FATAL(cudaMemcpy(&hs, sum, sizeof hs, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int t = 0; t < 64; t++) {
        CU_ASSERT(h[t] != h[t]);
        CU_ASSERT_EQUAL(h[64 + t], 3.0f * (float)(63 - t));
    }
    CU_ASSERT_EQUAL(hs, 3 * 63 * 64 / 2);
    cudaFree(d);
    cudaFree(sum);
}

static void test_dynamic_shared_memory_past_48_kib_needs_the_attribute(void)
{
    float *d = NULL;
    int *sum = dev_ints(1);
    CU_ASSERT_FATAL(cudaMalloc((void **)&d, 128 * sizeof(float)) == cudaSuccess);
    DT__CU_LAUNCH(shared_kernel, 1, 64, 64 * 1024, 0)(d, sum);
    CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidValue);
    CU_ASSERT_EQUAL(cudaFuncSetAttribute(shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         64 * 1024), cudaSuccess);
    DT__CU_LAUNCH(shared_kernel, 1, 64, 64 * 1024, 0)(d, sum);
    CU_ASSERT_EQUAL(cudaGetLastError(), cudaSuccess);
    CU_ASSERT_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
    DT__CU_LAUNCH(shared_kernel, 1, 2048, 0, 0)(d, sum);
    CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidConfiguration);
    cudaFree(d);
    cudaFree(sum);
}

static void test_work_on_two_streams_is_ordered_by_an_event(void)
{
    cudaStream_t a, b;
    cudaEvent_t e;
    CU_ASSERT_FATAL(cudaStreamCreate(&a) == cudaSuccess);
    CU_ASSERT_FATAL(cudaStreamCreate(&b) == cudaSuccess);
    CU_ASSERT_FATAL(cudaEventCreate(&e) == cudaSuccess);
    int *d = dev_ints(4), h[4] = {0};
    DT__CU_LAUNCH(store_kernel, 1, 4, 0, a)(d);
    CU_ASSERT(cudaEventRecord(e, a) == cudaSuccess);
    CU_ASSERT(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
    int *pinned = NULL;
    CU_ASSERT_FATAL(cudaMallocHost((void **)&pinned, sizeof h) == cudaSuccess);
    CU_ASSERT(cudaMemcpyAsync(pinned, d, sizeof h, cudaMemcpyDeviceToHost, b) == cudaSuccess);
    CU_ASSERT(cudaStreamSynchronize(b) == cudaSuccess);
    memcpy(h, pinned, sizeof h);
    for (int i = 0; i < 4; i++)
        CU_ASSERT_EQUAL(h[i], 7);
    CU_ASSERT(cudaEventQuery(e) == cudaSuccess);
    cudaFreeHost(pinned);
    cudaEventDestroy(e);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaFree(d);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("cuda_host_checks", NULL, NULL);
#define ADD(fn) CU_add_test(s, #fn, fn)
    ADD(test_a_barrier_in_divergent_code_is_an_error_naming_both_lines);
    ADD(test_a_barrier_that_returned_threads_never_reach_is_an_error);
    ADD(test_a_shuffle_whose_mask_names_lanes_past_a_partial_warp_is_an_error);
    ADD(test_lanes_of_one_shuffle_with_different_masks_are_an_error);
    ADD(test_a_kernel_that_never_ends_is_an_error_within_the_time_bound);
    ADD(test_a_host_pointer_given_to_a_kernel_is_an_illegal_address_at_the_next_sync);
    ADD(test_host_code_reading_device_memory_faults);
#if defined(__SANITIZE_THREAD__)
    ADD(test_tsan_reports_a_missing_syncthreads_with_both_lines);
    ADD(test_tsan_reports_a_warp_reduction_that_assumes_lockstep);
#endif
#if defined(__SANITIZE_ADDRESS__)
    ADD(test_asan_reports_a_dynamic_shared_memory_overrun_at_its_line);
#endif
    ADD(test_shuffles_and_votes_follow_cuda_on_full_and_partial_warps);
    ADD(test_shared_memory_is_per_block_and_uninitialised_reads_give_nan);
    ADD(test_dynamic_shared_memory_past_48_kib_needs_the_attribute);
    ADD(test_work_on_two_streams_is_ordered_by_an_event);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
