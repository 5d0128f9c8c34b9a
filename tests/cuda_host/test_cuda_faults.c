/* Failing CUDA, cuBLAS calls and kernels on the host build (-Dcuda=host): the stand-ins'
 * fault injection (cuda_host/fault.h) makes one call fail as the real library fails there, and
 * each failure must surface as a dt_status with a message naming the call and the CUDA error,
 * leave nothing allocated (AddressSanitizer's leak check at exit) and leave the device usable
 * for the next call. The CUDA device kind (runtime/device_cuda.c), the ops' scratch and fault
 * word (ops/cuda/backend_cuda.c), cuBLAS (ops/cuda/gemm_cublas.c), a kernel's asynchronous
 * fault at the next synchronisation, and a user op with no CUDA kernel run on host copies.
 * One GPU device (DT_GPU_DEVICES=1) on the stand-in's one device. The cases run in order: the
 * first ones need the cuBLAS handle and the fault word not made yet. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_host/fault.h"
#include "harness.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops_impl.h"
#include "runtime/cuda.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/staging.h"
#include "runtime/transport.h"

static const dt__ops_backend *gpu;
static const dt__device *dev;

/* A device buffer of n floats holding host x (NULL: zeros). */
static float *dev_floats(const float *x, size_t n)
{
    float *p = NULL;
    CU_ASSERT_FATAL(cudaMalloc((void **)&p, n * sizeof *p) == cudaSuccess);
    if (x) {
        CU_ASSERT_FATAL(cudaMemcpy(p, x, n * sizeof *p, cudaMemcpyHostToDevice) == cudaSuccess);
    } else {
        CU_ASSERT_FATAL(cudaMemset(p, 0, n * sizeof *p) == cudaSuccess);
    }
    return p;
}

static void arm(const char *site)
{
    dev = dt__device_local(DT_DEVICE_GPU, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dev);
    CU_ASSERT_FATAL(dt__cuh_fail(site, 1) == 0);
}

/* The armed fault fired (the call reached the stand-in), and is disarmed. */
static void fired(const char *site)
{
    CU_ASSERT(dt__cuh_fail_fired(site));
    dt__cuh_fail(site, 0);
}

static void test_cublas_create_and_sgemm_failures_name_the_cublas_call(void)
{
    float *a = dev_floats(NULL, 64), *c = dev_floats(NULL, 64);
    arm("cublascreate");
    DT_ASSERT_FAILS(gpu->gemm(0, 0, 3, 5, 7, 1.0f, a, DT_DTYPE_F32, 7, a, DT_DTYPE_F32, 5, 0.0f,
                              c, 5), DT_ERR_NO_MEMORY);
    DT_ASSERT_ERROR_MENTIONS("cublasCreate");
    DT_ASSERT_ERROR_MENTIONS("CUBLAS_STATUS_ALLOC_FAILED");
    fired("cublascreate");
    arm("cublas");
    DT_ASSERT_FAILS(gpu->gemm(0, 1, 3, 5, 7, 1.0f, a, DT_DTYPE_F32, 7, a, DT_DTYPE_F32, 7, 0.0f,
                              c, 5), DT_ERR_CUDA);
    DT_ASSERT_ERROR_MENTIONS("cublasSgemm");
    DT_ASSERT_ERROR_MENTIONS("CUBLAS_STATUS_EXECUTION_FAILED");
    fired("cublas");
    arm("getdevice");
    DT_ASSERT_FAILS(gpu->gemm(0, 0, 3, 5, 7, 1.0f, a, DT_DTYPE_F32, 7, a, DT_DTYPE_F32, 5, 0.0f,
                              c, 5), DT_ERR_CUDA);
    DT_ASSERT_ERROR_MENTIONS("cudaGetDevice");
    fired("getdevice");
    /* Then the same product runs: 3x7 zeros times 7x5 zeros. */
    DT_ASSERT_OK(gpu->gemm(0, 0, 3, 5, 7, 1.0f, a, DT_DTYPE_F32, 7, a, DT_DTYPE_F32, 5, 0.0f,
                           c, 5));
    DT_ASSERT_OK(gpu->sync());
    cudaFree(a);
    cudaFree(c);
}

static void test_ops_fault_word_and_scratch_failures_are_errors_and_leave_nothing(void)
{
    unsigned long long *slot = NULL;
    /* The fault word's allocation, then its first memset, fail; the buffer is freed. */
    arm("malloc");
    DT_ASSERT_FAILS(dt__cuda_fault("embedding (CUDA)", 10, &slot), DT_ERR_NO_MEMORY);
    DT_ASSERT_ERROR_MENTIONS("embedding (CUDA)");
    fired("malloc");
    arm("memset");
    DT_ASSERT_FAILS(dt__cuda_fault("embedding (CUDA)", 10, &slot), DT_ERR_CUDA);
    DT_ASSERT_ERROR_MENTIONS("unspecified launch failure");
    fired("memset");
    CU_ASSERT_PTR_NULL(slot);
    DT_ASSERT_OK(dt__cuda_fault("embedding (CUDA)", 10, &slot));
    CU_ASSERT_PTR_NOT_NULL(slot);
    DT_ASSERT_OK(gpu->sync());
    /* Scratch: growing it frees the old buffer first; a failed cudaMalloc leaves none. */
    void *s = NULL;
    dt__cuda_lock();
    DT_ASSERT_OK(dt__cuda_scratch(1 << 10, &s));
    arm("malloc");
    DT_ASSERT_FAILS(dt__cuda_scratch((size_t)1 << 20, &s), DT_ERR_NO_MEMORY);
    DT_ASSERT_ERROR_MENTIONS("ops scratch: cudaMalloc of 1048576 bytes");
    fired("malloc");
    arm("getdevice");
    DT_ASSERT_FAILS(dt__cuda_scratch(16, &s), DT_ERR_CUDA);
    DT_ASSERT_ERROR_MENTIONS("cudaGetDevice");
    fired("getdevice");
    dt__cuda_unlock();
    /* An op needing scratch (a full sum) fails alike, then runs. */
    float x[37], *dx, *out = dev_floats(NULL, 1), got = 0.0f, want = 0.0f;
    for (int i = 0; i < 37; i++)
        want += x[i] = (float)(i % 5) - 1.5f;
    dx = dev_floats(x, 37);
    arm("malloc");
    DT_ASSERT_FAILS(gpu->sum(37, dx, out), DT_ERR_NO_MEMORY);
    fired("malloc");
    DT_ASSERT_OK(gpu->sum(37, dx, out));
    DT_ASSERT_OK(gpu->sync());
    CU_ASSERT(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess);
    CU_ASSERT_DOUBLE_EQUAL(got, want, 1e-5);
    /* A half-precision product widens its operands in scratch (2 x 8192 and 8192 x 2: 128 KiB
     * of floats, beyond the 64 KiB the sum left): a failed scratch is the product's error. */
    void *h16 = NULL;
    float *c4 = dev_floats(NULL, 4), c[4] = {1, 1, 1, 1};
    CU_ASSERT_FATAL(cudaMalloc(&h16, 16384 * 2) == cudaSuccess);
    CU_ASSERT_FATAL(cudaMemset(h16, 0, 16384 * 2) == cudaSuccess);
    arm("malloc");
    DT_ASSERT_FAILS(gpu->gemm(0, 0, 2, 2, 8192, 1.0f, h16, DT_DTYPE_F16, 8192, h16,
                              DT_DTYPE_BF16, 2, 0.0f, c4, 2), DT_ERR_NO_MEMORY);
    DT_ASSERT_ERROR_MENTIONS("ops scratch");
    fired("malloc");
    DT_ASSERT_OK(gpu->gemm(0, 0, 2, 2, 8192, 1.0f, h16, DT_DTYPE_F16, 8192, h16,
                           DT_DTYPE_BF16, 2, 0.0f, c4, 2));
    DT_ASSERT_OK(gpu->sync());
    CU_ASSERT(cudaMemcpy(c, c4, sizeof c, cudaMemcpyDeviceToHost) == cudaSuccess);
    CU_ASSERT(c[0] == 0.0f && c[1] == 0.0f && c[2] == 0.0f && c[3] == 0.0f);
    cudaFree(h16);
    cudaFree(c4);
    cudaFree(dx);
    cudaFree(out);
}

static void test_device_kind_failures_name_the_call_and_the_device(void)
{
    dev = dt__device_local(DT_DEVICE_GPU, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dev);
    const dt__device_kind *k = dev->kind;
    void *p = NULL;
    arm("malloc");
    DT_ASSERT_FAILS(k->alloc(dev, 1000, &p), DT_ERR_NO_MEMORY);
    DT_ASSERT_ERROR_MENTIONS("cudaMalloc of 1000 bytes failed: out of memory");
    DT_ASSERT_ERROR_MENTIONS("bytes free");
    fired("malloc");
    CU_ASSERT_PTR_NULL(p);
    arm("setdevice");
    DT_ASSERT_FAILS(k->alloc(dev, 1000, &p), DT_ERR_CUDA);
    DT_ASSERT_ERROR_MENTIONS("cudaSetDevice(0) for GPU device");
    DT_ASSERT_ERROR_MENTIONS("cudaErrorDevicesUnavailable");
    fired("setdevice");
    DT_ASSERT_OK(k->alloc(dev, 1000, &p));
    void *h = NULL;
    arm("mallochost");
    DT_ASSERT_FAILS(k->host_alloc(1 << 12, &h), DT_ERR_NO_MEMORY);
    DT_ASSERT_ERROR_MENTIONS("cudaMallocHost of 4096 bytes");
    fired("mallochost");
    DT_ASSERT_OK(k->host_alloc(1 << 12, &h));
    memset(h, 7, 1 << 12);
    static const struct { dt__copy_dir dir; const char *says; } copies[] = {
        {DT__COPY_H2D, "cudaMemcpy (host to device)"},
        {DT__COPY_D2H, "cudaMemcpy (device to host)"},
        {DT__COPY_D2D, "cudaMemcpyAsync (device to device)"},
    };
    for (int i = 0; i < 3; i++) {
        void *dst = copies[i].dir == DT__COPY_D2H ? h : p;
        const void *src = copies[i].dir == DT__COPY_H2D ? h : p;
        arm("memcpy");
        DT_ASSERT_FAILS(k->copy(dev, copies[i].dir, dst, src, 500), DT_ERR_CUDA);
        DT_ASSERT_ERROR_MENTIONS(copies[i].says);
        DT_ASSERT_ERROR_MENTIONS("cudaErrorLaunchFailure");
        fired("memcpy");
    }
    DT_ASSERT_OK(k->copy(dev, DT__COPY_H2D, p, h, 0)); /* nothing to copy: no call */
    arm("memset");
    DT_ASSERT_FAILS(k->memset0(dev, p, 1000), DT_ERR_CUDA);
    DT_ASSERT_ERROR_MENTIONS("cudaMemsetAsync");
    fired("memset");
    /* After the failures the device works: write, zero half, read back. */
    DT_ASSERT_OK(k->copy(dev, DT__COPY_H2D, p, h, 1000));
    DT_ASSERT_OK(k->memset0(dev, p, 500));
    DT_ASSERT_OK(k->copy(dev, DT__COPY_D2H, h, p, 1000));
    DT_ASSERT_OK(k->sync(dev));
    CU_ASSERT_EQUAL(((unsigned char *)h)[499], 0);
    CU_ASSERT_EQUAL(((unsigned char *)h)[500], 7);
    uint64_t wide[2] = {1, 2};
    DT_ASSERT_FAILS(k->fill(dev, p, 4, wide, sizeof wide), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("16-byte elements");
    k->free(dev, NULL);
    k->free(dev, h); /* not device memory: cudaFree's error is dropped, nothing freed */
    k->host_free(h);
    k->host_free(p); /* not page-locked memory: cudaFreeHost's error is dropped */
    arm("setdevice");
    k->free(dev, p); /* cannot select the device: leaks nothing the stand-in would see... */
    fired("setdevice");
    k->free(dev, p); /* ...and the next free releases it */
}

/* A kernel that faults on the device: the launch succeeds, the error surfaces at the next
 * synchronisation as the device's sticky error, through the device kind and the ops' sync. */
static void test_a_kernel_fault_surfaces_at_the_next_synchronisation(void)
{
    dev = dt__device_local(DT_DEVICE_GPU, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dev);
    const dt__device_kind *k = dev->kind;
    void *p = NULL;
    DT_ASSERT_OK(k->alloc(dev, 64 * sizeof(float), &p));
    float one = 1.0f;
    arm("kernel");
    DT_ASSERT_OK(k->fill(dev, p, 64, &one, sizeof one));
    fired("kernel");
    DT_ASSERT_FAILS(k->sync(dev), DT_ERR_CUDA);
    DT_ASSERT_ERROR_MENTIONS("cudaDeviceSynchronize: unspecified launch failure");
    dt__cuh_fail_reset_sticky();
    DT_ASSERT_OK(gpu->set_device(dev->ordinal));
    arm("kernel");
    DT_ASSERT_OK(gpu->fill(64, 2.0f, p));
    fired("kernel");
    DT_ASSERT_FAILS(gpu->sync(), DT_ERR_CUDA);
    DT_ASSERT_ERROR_MENTIONS("cudaErrorLaunchFailure");
    dt__cuh_fail_reset_sticky();
    /* Then kernels run again: the fill's 2s, summed. */
    float *out = dev_floats(NULL, 1), got = 0.0f;
    DT_ASSERT_OK(gpu->fill(64, 2.0f, p));
    DT_ASSERT_OK(gpu->sum(64, p, out));
    DT_ASSERT_OK(gpu->sync());
    CU_ASSERT(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess);
    CU_ASSERT_DOUBLE_EQUAL(got, 128.0, 0.0);
    cudaFree(out);
    k->free(dev, p);
}

/* A user op with only a CPU kernel runs on GPU buffers through host copies: y = 2 x + 1. */
static dt_status affine_cpu(const dt_op_kernel_args *a)
{
    const float *x = a->in[0].data;
    float *y = a->out.data;
    for (int64_t i = 0; i < a->out.shape[0]; i++)
        y[i] = 2.0f * x[i] + 1.0f;
    return DT_OK;
}

static void test_an_op_without_a_cuda_kernel_runs_on_host_copies_and_fails_cleanly(void)
{
    dt_op_def def = {.name = "test.affine", .nin = 1, .cpu = affine_cpu};
    float x[19], y[19];
    for (int i = 0; i < 19; i++)
        x[i] = (float)i * 0.25f - 2.0f;
    float *dx = dev_floats(x, 19), *dy = dev_floats(NULL, 19);
    dt_op_kernel_args args = {.nin = 1};
    args.in[0] = (dt_op_buf){.data = dx, .dtype = DT_DTYPE_F32, .rank = 1, .shape = {19}};
    args.out = (dt_op_buf){.data = dy, .dtype = DT_DTYPE_F32, .rank = 1, .shape = {19}};
    DT_ASSERT_OK(gpu->run_def(&def, &args));
    CU_ASSERT(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int i = 0; i < 19; i++)
        CU_ASSERT_EQUAL(y[i], 2.0f * x[i] + 1.0f);
    arm("memcpy");
    DT_ASSERT_FAILS(gpu->run_def(&def, &args), DT_ERR_CUDA);
    DT_ASSERT_ERROR_MENTIONS("test.affine");
    fired("memcpy");
    cudaFree(dx);
    cudaFree(dy);
}

/* Argument checks the kernel tests do not reach: sizes, NULL outputs, dtypes. */
static void test_backend_argument_checks(void)
{
    float *f = dev_floats(NULL, 64);
    double d = 0.0;
    DT_ASSERT_FAILS(gpu->bias_add(-1, 4, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->bias_grad(2, 4, f, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->softmax_xent(2, 0, f, (const int32_t *)f, 1.0f, f),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->softmax_xent(2, 4, f, (const int32_t *)f, 1.0f, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->softmax_xent(2, 4, NULL, (const int32_t *)f, 1.0f, f),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->sum(4, f, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->reduce_axis(DT_REDUCE_SUM, -1, 2, 2, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->reduce_axis(DT_REDUCE_SUM, 2, 2, 2, f, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(gpu->reduce_axis(DT_REDUCE_SUM, 0, 2, 2, f, f));
    DT_ASSERT_FAILS(gpu->nonfinite(4, f, DT_DTYPE_F32, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->sq_sum_f64(4, f, DT_DTYPE_I32, &d), DT_ERR_UNSUPPORTED);
    DT_ASSERT_FAILS(gpu->sgd(4, NULL, f, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->adam(4, NULL, 1, f, f, f, f), DT_ERR_INVALID_ARGUMENT);
    /* sq_sum_f64 of 37 floats against the sum in double on the host (f64 partial sums in
     * another order: a relative 1e-12). */
    float x[37];
    double want = 0.0;
    for (int i = 0; i < 37; i++) {
        x[i] = (float)i * 0.37f - 5.0f;
        want += (double)x[i] * x[i];
    }
    float *dx = dev_floats(x, 37);
    double *dd = NULL;
    CU_ASSERT_FATAL(cudaMalloc((void **)&dd, sizeof *dd) == cudaSuccess);
    DT_ASSERT_OK(gpu->sq_sum_f64(37, dx, DT_DTYPE_F32, dd));
    DT_ASSERT_OK(gpu->sync());
    CU_ASSERT(cudaMemcpy(&d, dd, sizeof d, cudaMemcpyDeviceToHost) == cudaSuccess);
    CU_ASSERT(fabs(d - want) <= 1e-12 * want);
    cudaFree(dd);
    cudaFree(dx);
    cudaFree(f);
}

/* runtime/cuda.c: the NCCL version, why no GPU is free, and a GPU whose PCI bus id cannot be
 * read (DT_CUDA_HOST_FAIL=pcibusid:1 failed it during dt_init's split of the GPUs, which went
 * on with the ordinal in its place: this process has its GPU device). */
static void test_runtime_cuda_facts(void)
{
    CU_ASSERT(dt__nccl_version() >= 21800); /* NCCL 2.18 or later: NCCL_VERSION_CODE */
    CU_ASSERT(dt__cuda_device_count() == 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt__cuda_absence(), "in use by other clients"));
    CU_ASSERT(dt__cuh_fail_fired("pcibusid"));
    CU_ASSERT_PTR_NOT_NULL(dt__device_local(DT_DEVICE_GPU, 0));
    arm("setdevice");
    DT_ASSERT_FAILS(dt__cuda_status(cudaSetDevice(0), "a test's cudaSetDevice"), DT_ERR_CUDA);
    DT_ASSERT_ERROR_MENTIONS("a test's cudaSetDevice: CUDA-capable device(s) is/are busy or "
                             "unavailable (cudaErrorDevicesUnavailable)");
    fired("setdevice");
}

/* A staged exchange of a rows x cols f32 box of device memory with client `peer` (this client
 * itself: MPI to self, through page-locked staging), received into device memory or, with
 * host_recv, host memory: src holds 1000 * row + column. got: what arrived. */
static dt_status staged_to(int peer, int rows, int cols, int host_recv, float *got)
{
    const dt__device *d = dt__device_local(DT_DEVICE_GPU, 0);
    size_t n = (size_t)rows * (size_t)cols, cap = n ? n : 1;
    float *host = malloc(cap * sizeof *host);
    CU_ASSERT_PTR_NOT_NULL_FATAL(host);
    for (size_t i = 0; i < n; i++)
        host[i] = (float)(1000 * (i / (size_t)cols) + i % (size_t)cols);
    float *ds = dev_floats(host, cap), *dr = dev_floats(NULL, cap);
    dt__xfer send = {.peer = peer,
                     .region = {.base = ds, .dev = d, .rank = 2, .elem = sizeof(float),
                                .shape = {rows, cols}, .start = {0, 0}, .count = {rows, cols}}};
    dt__xfer recv = send;
    recv.region.base = host_recv ? (void *)got : (void *)dr;
    recv.region.dev = host_recv ? NULL : d;
    if (!host_recv)
        memset(got, 0, n * sizeof *got);
    dt_status st = dt__transport_staged()->exchange(&send, 1, &recv, 1, NULL, NULL);
    char detail[512];
    snprintf(detail, sizeof detail, "%s", st == DT_OK ? "" : dt_last_error());
    if (st == DT_OK && !host_recv && n)
        CU_ASSERT_FATAL(cudaMemcpy(got, dr, n * sizeof *got, cudaMemcpyDeviceToHost) ==
                        cudaSuccess);
    cudaFree(ds);
    cudaFree(dr);
    free(host);
    if (st != DT_OK) /* the message the test checks, after the frees' own calls */
        st = dt__error(st, "%s", detail);
    return st;
}

static dt_status staged_self(int rows, float *got)
{
    return staged_to(dt_client_id(), rows, 256, 0, got);
}

static int wrong_cells(const float *got, int rows, int cols)
{
    int bad = 0;
    for (int i = 0; i < rows * cols; i++)
        bad += got[i] != (float)(1000 * (i / cols) + i % cols);
    return bad;
}

static int wrong_rows(const float *got, int rows)
{
    return wrong_cells(got, rows, 256);
}

/* The staged transport's CUDA failures (runtime/transport_staged.c): page-locked staging that
 * cannot be had even after the pool emptied itself (cudaMallocHost failing twice), a chunk's
 * copy to the host before its send and one to the device after its receive, each an error
 * naming the call with nothing posted left behind: the next exchange moves every row right.
 * 3 rows in 1 KiB chunks: 3 chunks each way, the pipeline's slots refilled. */
static void test_staged_transfer_failures_name_the_call_and_leave_nothing_behind(void)
{
    float got[3 * 256];
    CU_ASSERT_FATAL(setenv("DT_STAGED_CHUNK_KB", "1", 1) == 0);
    dt__staging_trim();
    CU_ASSERT_FATAL(dt__cuh_fail_times("mallochost", 1, 2) == 0);
    dt_status st = staged_self(3, got);
    CU_ASSERT_NOT_EQUAL(st, DT_OK);
    DT_ASSERT_ERROR_MENTIONS("cudaMallocHost of 4096 bytes of page-locked staging");
    fired("mallochost");
    DT_ASSERT_OK(staged_self(3, got));
    CU_ASSERT_EQUAL(wrong_rows(got, 3), 0);
    /* memcpy:2 (after staged_self's copy of src) is the first chunk's copy to the host;
     * memcpy:5, after the 3 sends' copies, the first received chunk's copy to the device. */
    static const long nth[2] = {2, 5};
    for (int k = 0; k < 2; k++) {
        CU_ASSERT_FATAL(dt__cuh_fail("memcpy", nth[k]) == 0);
        DT_ASSERT_FAILS(staged_self(3, got), DT_ERR_CUDA);
        DT_ASSERT_ERROR_MENTIONS("cudaErrorLaunchFailure");
        fprintf(stderr, "staged, memcpy:%ld: %s\n", nth[k], dt_last_error());
        fired("memcpy");
        DT_ASSERT_OK(staged_self(3, got));
        CU_ASSERT_EQUAL(wrong_rows(got, 3), 0);
    }
    unsetenv("DT_STAGED_CHUNK_KB");
}

/* The staged transport's other paths: rows of 2 KiB in 1 KiB chunks (a chunk per row, 6 each
 * way: the 4 slots refilled), host memory received (copied through the CPU device), an empty
 * box, and refusals before anything is posted (no such client, bad DT_STAGED_CHUNK_KB and
 * DT_COMM_TIMEOUT). */
static void test_staged_transport_pipelines_rows_larger_than_a_chunk_and_refuses_bad_input(void)
{
    static float got[6 * 512];
    CU_ASSERT_FATAL(setenv("DT_STAGED_CHUNK_KB", "1", 1) == 0);
    uint64_t before = dt__transport_staged_chunks();
    DT_ASSERT_OK(staged_to(dt_client_id(), 6, 512, 0, got));
    CU_ASSERT_EQUAL(wrong_cells(got, 6, 512), 0);
    CU_ASSERT_EQUAL(dt__transport_staged_chunks() - before, 12);
    memset(got, 0, sizeof got);
    DT_ASSERT_OK(staged_to(dt_client_id(), 3, 100, 1, got));
    CU_ASSERT_EQUAL(wrong_cells(got, 3, 100), 0);
    before = dt__transport_staged_chunks();
    DT_ASSERT_OK(staged_to(dt_client_id(), 0, 256, 0, got));
    CU_ASSERT_EQUAL(dt__transport_staged_chunks(), before);
    DT_ASSERT_FAILS(staged_to(7, 1, 256, 0, got), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("staged transport: no client 7");
    CU_ASSERT_FATAL(setenv("DT_STAGED_CHUNK_KB", "0", 1) == 0);
    DT_ASSERT_FAILS(staged_self(1, got), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_STAGED_CHUNK_KB='0'");
    unsetenv("DT_STAGED_CHUNK_KB");
    char keep[32];
    snprintf(keep, sizeof keep, "%s", getenv("DT_COMM_TIMEOUT") ? getenv("DT_COMM_TIMEOUT") : "");
    setenv("DT_COMM_TIMEOUT", "never", 1);
    DT_ASSERT_FAILS(staged_self(1, got), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_COMM_TIMEOUT='never'");
    if (keep[0])
        setenv("DT_COMM_TIMEOUT", keep, 1);
    else
        unsetenv("DT_COMM_TIMEOUT");
    dt__xfer_cache cache = {0};
    dt__transport_staged()->release(&cache); /* nothing cached: both are no-ops */
    dt__transport_staged()->release(NULL);
    DT_ASSERT_OK(staged_self(2, got));
    CU_ASSERT_EQUAL(wrong_rows(got, 2), 0);
}

int main(int argc, char **argv)
{
    if (dt__gpu_physical_count() == 0) {
        fprintf(stderr, "test_cuda_faults: no CUDA device, skipped\n");
        return 77;
    }
    gpu = dt__ops_cuda_backend();
    static const dt_test_case cases[] = {
        DT_TEST(test_cublas_create_and_sgemm_failures_name_the_cublas_call),
        DT_TEST(test_ops_fault_word_and_scratch_failures_are_errors_and_leave_nothing),
        DT_TEST(test_device_kind_failures_name_the_call_and_the_device),
        DT_TEST(test_a_kernel_fault_surfaces_at_the_next_synchronisation),
        DT_TEST(test_an_op_without_a_cuda_kernel_runs_on_host_copies_and_fails_cleanly),
        DT_TEST(test_backend_argument_checks),
        DT_TEST(test_runtime_cuda_facts),
        DT_TEST(test_staged_transfer_failures_name_the_call_and_leave_nothing_behind),
        DT_TEST(test_staged_transport_pipelines_rows_larger_than_a_chunk_and_refuses_bad_input),
        DT_TEST_END,
    };
    return dt_test_main_gpu(argc, argv, "cuda_faults", cases);
}
