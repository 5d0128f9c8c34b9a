/* The CUDA Llama-style kernels (ops/cuda/llama.cu) against the CPU kernels (ops/llama.c) on
 * shapes that are no multiple of 32 or of the block size, with the tolerance each one states.
 * Exits 77 (skip) without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "harness.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"

static const dt__ops_backend *gpu;
static uint64_t rng = 0x2545f4914f6cdd1dull;

static float *random_floats(int64_t n, float lo, float hi)
{
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        x[i] = lo + (hi - lo) * (float)(rng >> 40) * (1.0f / 16777216.0f);
    }
    return x;
}

static float *to_dev(const float *host, int64_t n)
{
    float *d = NULL;
    CU_ASSERT_FATAL(cudaMalloc((void **)&d, (size_t)(n ? n : 1) * sizeof *d) == cudaSuccess);
    if (host && n)
        CU_ASSERT_FATAL(cudaMemcpy(d, host, (size_t)n * sizeof *d, cudaMemcpyHostToDevice) ==
                        cudaSuccess);
    return d;
}

/* Elements of the device array d (n) farther than atol + rtol |c| from c. */
static int64_t far_from(const float *d, const float *c, int64_t n, double rtol, double atol,
                        const char *what)
{
    float *g = malloc((size_t)n * sizeof *g);
    CU_ASSERT_FATAL(cudaDeviceSynchronize() == cudaSuccess);
    CU_ASSERT_FATAL(cudaMemcpy(g, d, (size_t)n * sizeof *g, cudaMemcpyDeviceToHost) ==
                    cudaSuccess);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)g[i] - c[i]) <= atol + rtol * fabs((double)c[i]))) {
            if (bad++ < 5)
                fprintf(stderr, "%s: element %lld: gpu %.9g cpu %.9g\n", what, (long long)i,
                        g[i], c[i]);
        }
    free(g);
    return bad;
}

/* RMSNorm: sums of squares in f64 on both sides, in another order; rsqrt in the kernel against
 * 1/sqrt on the CPU: 1e-5 relative. Its gradient: the gain's gradient is a column sum over
 * rows, 1e-5 relative plus 1e-6 absolute for sums that cancel. */
static void test_cuda_rms_norm_and_its_gradient_match_cpu(void)
{
    const int64_t rows = 37, cols = 45;
    float *x = random_floats(rows * cols, -2, 2), *g = random_floats(cols, 0.5f, 1.5f);
    float *dy = random_floats(rows * cols, -1, 1), *y = malloc(rows * cols * 4);
    float *dx = malloc(rows * cols * 4), *dg = malloc(cols * 4);
    float *Dx = to_dev(x, rows * cols), *Dg = to_dev(g, cols), *Ddy = to_dev(dy, rows * cols);
    float *Dy = to_dev(NULL, rows * cols), *Ddx = to_dev(NULL, rows * cols),
          *Ddg = to_dev(NULL, cols);
    DT_ASSERT_OK(dt_kernel_rms_norm(rows, cols, x, g, 1e-5f, y));
    DT_ASSERT_OK(gpu->rms_norm(rows, cols, Dx, Dg, 1e-5f, Dy));
    CU_ASSERT_EQUAL(far_from(Dy, y, rows * cols, 1e-5, 1e-6, "rms_norm"), 0);
    DT_ASSERT_OK(dt_kernel_rms_norm_grad(rows, cols, x, g, dy, 1e-5f, dx, dg));
    DT_ASSERT_OK(gpu->rms_norm_grad(rows, cols, Dx, Dg, Ddy, 1e-5f, Ddx, Ddg));
    CU_ASSERT_EQUAL(far_from(Ddx, dx, rows * cols, 1e-5, 1e-6, "rms_norm dx"), 0);
    CU_ASSERT_EQUAL(far_from(Ddg, dg, cols, 1e-5, 1e-6, "rms_norm dgain"), 0);
    free(x), free(g), free(dy), free(y), free(dx), free(dg);
    cudaFree(Dx), cudaFree(Dg), cudaFree(Ddy), cudaFree(Dy), cudaFree(Ddx), cudaFree(Ddg);
}

/* RoPE: sin and cos of CUDA's libdevice against glibc's (each within 2 ulp of the truth) on
 * angles up to seq * 1 rad: 1e-5 relative plus 1e-6 absolute; forward and inverse. */
static void test_cuda_rope_forward_and_inverse_match_cpu(void)
{
    const int64_t batch = 2, seq = 13, heads = 3, hd = 10, n = batch * seq * heads * hd;
    float *x = random_floats(n, -1, 1), *y = malloc(n * 4);
    float *Dx = to_dev(x, n), *Dy = to_dev(NULL, n);
    for (int inverse = 0; inverse < 2; inverse++) {
        DT_ASSERT_OK(dt_kernel_rope(batch, seq, heads, hd, 5, inverse, x, y));
        DT_ASSERT_OK(gpu->rope(batch, seq, heads, hd, 5, inverse, Dx, Dy));
        CU_ASSERT_EQUAL(far_from(Dy, y, n, 1e-5, 1e-6, inverse ? "rope inverse" : "rope"), 0);
    }
    free(x), free(y);
    cudaFree(Dx), cudaFree(Dy);
}

/* SwiGLU: expf of libdevice against the CPU's (a few ulp): 1e-5 relative plus 1e-7. */
static void test_cuda_swiglu_and_its_gradient_match_cpu(void)
{
    const int64_t n = 1003;
    float *a = random_floats(n, -6, 6), *b = random_floats(n, -2, 2), *dy = random_floats(n, -1, 1);
    float *y = malloc(n * 4), *da = malloc(n * 4), *db = malloc(n * 4);
    float *Da = to_dev(a, n), *Db = to_dev(b, n), *Ddy = to_dev(dy, n), *Dy = to_dev(NULL, n);
    float *Dda = to_dev(NULL, n), *Ddb = to_dev(NULL, n);
    DT_ASSERT_OK(dt_kernel_swiglu(n, a, b, y));
    DT_ASSERT_OK(gpu->swiglu(n, Da, Db, Dy));
    CU_ASSERT_EQUAL(far_from(Dy, y, n, 1e-5, 1e-7, "swiglu"), 0);
    DT_ASSERT_OK(dt_kernel_swiglu_grad(n, a, b, dy, da, db));
    DT_ASSERT_OK(gpu->swiglu_grad(n, Da, Db, Ddy, Dda, Ddb));
    CU_ASSERT_EQUAL(far_from(Dda, da, n, 1e-5, 1e-7, "swiglu dgate"), 0);
    CU_ASSERT_EQUAL(far_from(Ddb, db, n, 1e-5, 1e-7, "swiglu dup"), 0);
    free(a), free(b), free(dy), free(y), free(da), free(db);
    cudaFree(Da), cudaFree(Db), cudaFree(Ddy), cudaFree(Dy), cudaFree(Dda), cudaFree(Ddb);
}

/* Grouped-query attention, causal and not: exp and the softmax sums in another order, 1e-5
 * relative plus 1e-6; dk and dv are sums over the query rows and heads of a group by atomic
 * adds in any order: 1e-4 relative plus 1e-5. */
static void test_cuda_grouped_query_attention_and_its_gradient_match_cpu(void)
{
    const int64_t batch = 2, seq = 13, heads = 4, kv = 2, hd = 10;
    const int64_t nq = batch * seq * heads * hd, nk = batch * seq * kv * hd;
    float *q = random_floats(nq, -1, 1), *k = random_floats(nk, -1, 1);
    float *v = random_floats(nk, -1, 1), *dy = random_floats(nq, -1, 1);
    float *y = malloc(nq * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    float *Dq = to_dev(q, nq), *Dk = to_dev(k, nk), *Dv = to_dev(v, nk), *Ddy = to_dev(dy, nq);
    float *Dy = to_dev(NULL, nq), *Ddq = to_dev(NULL, nq), *Ddk = to_dev(NULL, nk),
          *Ddv = to_dev(NULL, nk);
    for (int causal = 0; causal < 2; causal++) {
        DT_ASSERT_OK(dt_kernel_attention_gqa(batch, seq, heads, kv, hd, causal, q, k, v, y));
        DT_ASSERT_OK(gpu->attention_gqa(batch, seq, heads, kv, hd, causal, Dq, Dk, Dv, Dy));
        CU_ASSERT_EQUAL(far_from(Dy, y, nq, 1e-5, 1e-6, "gqa"), 0);
        DT_ASSERT_OK(dt_kernel_attention_gqa_grad(batch, seq, heads, kv, hd, causal, q, k, v,
                                                  dy, dq, dk, dv));
        DT_ASSERT_OK(gpu->attention_gqa_grad(batch, seq, heads, kv, hd, causal, Dq, Dk, Dv, Ddy,
                                             Ddq, Ddk, Ddv));
        CU_ASSERT_EQUAL(far_from(Ddq, dq, nq, 1e-5, 1e-6, "gqa dq"), 0);
        CU_ASSERT_EQUAL(far_from(Ddk, dk, nk, 1e-4, 1e-5, "gqa dk"), 0);
        CU_ASSERT_EQUAL(far_from(Ddv, dv, nk, 1e-4, 1e-5, "gqa dv"), 0);
    }
    free(q), free(k), free(v), free(dy), free(y), free(dq), free(dk), free(dv);
    cudaFree(Dq), cudaFree(Dk), cudaFree(Dv), cudaFree(Ddy), cudaFree(Dy), cudaFree(Ddq);
    cudaFree(Ddk), cudaFree(Ddv);
}

int main(int argc, char **argv)
{
    if (dt__gpu_physical_count() == 0) {
        fprintf(stderr, "test_llama_cuda: no CUDA device, skipped\n");
        return 77;
    }
    if (cudaSetDevice(0) != cudaSuccess)
        return 77;
    gpu = dt__ops_cuda_backend();
    static const dt_test_case cases[] = {
        DT_TEST(test_cuda_rms_norm_and_its_gradient_match_cpu),
        DT_TEST(test_cuda_rope_forward_and_inverse_match_cpu),
        DT_TEST(test_cuda_swiglu_and_its_gradient_match_cpu),
        DT_TEST(test_cuda_grouped_query_attention_and_its_gradient_match_cpu),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "llama_cuda", cases, 0);
}
