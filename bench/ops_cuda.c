/* The CUDA kernels of ops/cuda/ against references on the same device buffers, in the same
 * run: GEMM through dt_kernel_gemm's CUDA table entry against a direct cublasSgemm call, and
 * the elementwise, cast and optimizer kernels against cudaMemcpy (device to device) of the
 * same bytes (bytes read + bytes written by the kernel, counted as one copy of half that).
 * One process, GPU 0. Prints key=value lines (docs/bench.md); exits 77 without a GPU.
 *   bench_ops_cuda [--reps N] [--mib LIST] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "bench_util.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "bench_ops_cuda: %s: %s\n", #x, cudaGetErrorString(e_));           \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const dt__ops_backend *gpu;
static int reps = 20;
static int failures;

/* What one timed call does; `which` 0 = ours, 1 = reference. */
typedef struct job {
    const char *name;
    int64_t n;           /* elements */
    size_t bytes_moved;  /* read + written by ours */
    void *a, *b, *c, *d; /* device buffers */
    dt_dtype from, to;
} job;

static void run_ours(const job *j)
{
    dt_status st = DT_OK;
    if (!strcmp(j->name, "add"))
        st = gpu->add(j->n, j->a, j->b, j->c);
    else if (!strcmp(j->name, "axpy"))
        st = gpu->axpy(j->n, 0.5f, j->a, j->c);
    else if (!strcmp(j->name, "fill"))
        st = gpu->fill(j->n, 1.5f, j->c);
    else if (!strcmp(j->name, "relu"))
        st = gpu->relu(j->n, j->a, j->c);
    else if (!strncmp(j->name, "cast", 4))
        st = gpu->cast(j->n, j->a, j->from, j->c, j->to);
    else if (!strcmp(j->name, "adam")) {
        dt_adam_opts o = DT_ADAM_OPTS_INIT;
        st = gpu->adam(j->n, &o, 1, j->c, j->a, j->b, j->d);
    }
    if (st != DT_OK) {
        fprintf(stderr, "bench_ops_cuda: %s: %s\n", j->name, dt_last_error());
        exit(1);
    }
}

/* Median seconds of `reps` calls (each synchronised). */
static double time_it(const job *j, int ref)
{
    double *t = malloc((size_t)reps * sizeof *t);
    for (int r = -2; r < reps; r++) {
        CK(cudaDeviceSynchronize());
        double t0 = now();
        if (ref)
            CK(cudaMemcpy(j->d ? j->d : j->b, j->a, j->bytes_moved / 2, cudaMemcpyDeviceToDevice));
        else
            run_ours(j);
        CK(cudaDeviceSynchronize());
        if (r >= 0)
            t[r] = now() - t0;
    }
    double m = bu_median(t, reps);
    free(t);
    return m;
}

static void bench_stream(const char *name, int64_t n, size_t in_elem, size_t out_elem,
                         int inputs, dt_dtype from, dt_dtype to)
{
    job j = {name, n, 0, NULL, NULL, NULL, NULL, from, to};
    j.bytes_moved = (size_t)n * (in_elem * (size_t)inputs + out_elem);
    size_t big = (size_t)n * 4; /* every operand, and the reference copy's half */
    if (big < j.bytes_moved / 2)
        big = j.bytes_moved / 2;
    CK(cudaMalloc(&j.a, big));
    CK(cudaMalloc(&j.b, big));
    CK(cudaMalloc(&j.c, big));
    CK(cudaMalloc(&j.d, big));
    CK(cudaMemset(j.a, 0x3c, big));
    CK(cudaMemset(j.b, 0x3c, big));
    CK(cudaMemset(j.c, 0, big));
    CK(cudaMemset(j.d, 0, big));
    double ours = time_it(&j, 0), ref = time_it(&j, 1);
    bu_line l;
    bu_line_init(&l);
    bu_line_add(&l, "case", "%s", name);
    bu_line_add(&l, "device", "%s", "gpu");
    bu_line_add(&l, "elems", "%lld", (long long)n);
    bu_line_add(&l, "bytes", "%zu", j.bytes_moved);
    bu_line_add(&l, "ours_gbs", "%.1f", (double)j.bytes_moved / ours / 1e9);
    bu_line_add(&l, "ref", "%s", "cudaMemcpy_d2d");
    bu_line_add(&l, "ref_gbs", "%.1f", (double)j.bytes_moved / ref / 1e9);
    bu_line_add(&l, "ratio", "%.2f", ref / ours);
    bu_line_print(&l);
    cudaFree(j.a);
    cudaFree(j.b);
    cudaFree(j.c);
    cudaFree(j.d);
}

static void bench_gemm(int64_t m, int64_t n, int64_t k)
{
    float *a, *b, *c;
    CK(cudaMalloc((void **)&a, (size_t)(m * k) * 4));
    CK(cudaMalloc((void **)&b, (size_t)(k * n) * 4));
    CK(cudaMalloc((void **)&c, (size_t)(m * n) * 4));
    CK(cudaMemset(a, 0x3c, (size_t)(m * k) * 4));
    CK(cudaMemset(b, 0x3c, (size_t)(k * n) * 4));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_ops_cuda: cublasCreate failed\n");
        exit(1);
    }
    double *t0 = malloc((size_t)reps * sizeof *t0), *t1 = malloc((size_t)reps * sizeof *t1);
    const float one = 1.0f, zero = 0.0f;
    for (int r = -2; r < reps; r++) {
        CK(cudaDeviceSynchronize());
        double s = now();
        if (gpu->gemm(0, 0, m, n, k, 1.0f, a, DT_DTYPE_F32, k, b, DT_DTYPE_F32, n, 0.0f, c, n) !=
            DT_OK) {
            fprintf(stderr, "bench_ops_cuda: gemm: %s\n", dt_last_error());
            exit(1);
        }
        CK(cudaDeviceSynchronize());
        double e = now();
        /* Row-major C = A B is column-major C^T = B^T A^T. */
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, b, (int)n, a,
                    (int)k, &zero, c, (int)n);
        CK(cudaDeviceSynchronize());
        if (r >= 0) {
            t0[r] = e - s;
            t1[r] = now() - e;
        }
    }
    double ours = bu_median(t0, reps), ref = bu_median(t1, reps);
    double flops = 2.0 * (double)m * (double)n * (double)k;
    bu_line l;
    bu_line_init(&l);
    bu_line_add(&l, "case", "%s", "gemm_f32");
    bu_line_add(&l, "device", "%s", "gpu");
    bu_line_add(&l, "m", "%lld", (long long)m);
    bu_line_add(&l, "n", "%lld", (long long)n);
    bu_line_add(&l, "k", "%lld", (long long)k);
    bu_line_add(&l, "ours_tflops", "%.2f", flops / ours / 1e12);
    bu_line_add(&l, "ref", "%s", "cublasSgemm");
    bu_line_add(&l, "ref_tflops", "%.2f", flops / ref / 1e12);
    bu_line_add(&l, "ratio", "%.2f", ref / ours);
    bu_line_print(&l);
    if (ref / ours < 0.5)
        failures++;
    free(t0);
    free(t1);
    cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
}

int main(int argc, char **argv)
{
    int mib[8] = {1, 64, 512};
    int nmib = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            nmib = bu_parse_int_list(argv[++i], mib, 8);
        else {
            fprintf(stderr, "usage: bench_ops_cuda [--reps N] [--mib LIST]\n");
            return 2;
        }
    }
    if (reps < 1 || nmib < 1) {
        fprintf(stderr, "usage: bench_ops_cuda [--reps N] [--mib LIST]\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "bench_ops_cuda: no GPU\n");
        return 77;
    }
    gpu = dt__ops_cuda_backend();
    if (!gpu) {
        fprintf(stderr, "bench_ops_cuda: this build has no CUDA kernels\n");
        return 1;
    }
    CK(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# GPU 0: %s, %d SMs; median of %d reps\n", prop.name, prop.multiProcessorCount,
           reps);
    for (int i = 0; i < nmib; i++) {
        int64_t n = (int64_t)mib[i] << 18; /* f32 elements in mib MiB */
        bench_stream("add", n, 4, 4, 2, DT_DTYPE_F32, DT_DTYPE_F32);
        bench_stream("axpy", n, 4, 4, 2, DT_DTYPE_F32, DT_DTYPE_F32);
        bench_stream("fill", n, 0, 4, 0, DT_DTYPE_F32, DT_DTYPE_F32);
        bench_stream("relu", n, 4, 4, 1, DT_DTYPE_F32, DT_DTYPE_F32);
        bench_stream("cast_f32_bf16", n, 4, 2, 1, DT_DTYPE_F32, DT_DTYPE_BF16);
        bench_stream("cast_bf16_f32", n, 2, 4, 1, DT_DTYPE_BF16, DT_DTYPE_F32);
        bench_stream("cast_f32_f16", n, 4, 2, 1, DT_DTYPE_F32, DT_DTYPE_F16);
        /* adam reads p, g, m, v and writes p, m, v. */
        bench_stream("adam", n, 4, 12, 4, DT_DTYPE_F32, DT_DTYPE_F32);
    }
    bench_gemm(1024, 1024, 1024);
    bench_gemm(4096, 4096, 4096);
    bench_gemm(8192, 1024, 4096);
    return failures ? 1 : 0;
}
