/* The CUDA kernels (ops/cuda/) against the CPU kernels on the same data: bit for bit where the
 * arithmetic is the same (elementwise, casts, axis reductions, optimizers), within rounding
 * elsewhere (tanh, exp, f64 sums in another order, GEMM). Exits 77 (skip) without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "harness.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"

static const dt__ops_backend *gpu;

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Uniform in [lo, hi). */
static float uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(next_u32() >> 8) * (1.0f / 16777216.0f);
}

static float *random_floats(int64_t n, float lo, float hi)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    CU_ASSERT_FATAL(x != NULL);
    for (int64_t i = 0; i < n; i++)
        x[i] = uniform(lo, hi);
    return x;
}

static void *to_dev(const void *host, size_t bytes)
{
    void *d = NULL;
    CU_ASSERT_FATAL(cudaMalloc(&d, bytes ? bytes : 1) == cudaSuccess);
    if (bytes && host) /* NULL: uninitialised (cudaMemcpy from NULL fails) */
        CU_ASSERT_FATAL(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    return d;
}

static void *from_dev(const void *dev, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    CU_ASSERT_FATAL(h != NULL);
    CU_ASSERT_FATAL(cudaDeviceSynchronize() == cudaSuccess);
    if (bytes)
        CU_ASSERT_FATAL(cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
}

/* Number of positions where the two byte arrays (elements of `elem` bytes) differ. */
static int64_t count_bit_diffs(const void *a, const void *b, int64_t n, size_t elem,
                               const char *what)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem) != 0) {
            if (bad < 5)
                fprintf(stderr, "%s: element %lld differs\n", what, (long long)i);
            bad++;
        }
    return bad;
}

/* Elements where |gpu - cpu| > atol + rtol |cpu| (NaN must match NaN). */
static int64_t count_far(const float *g, const float *c, int64_t n, double rtol, double atol,
                         const char *what)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int ok = isnan(c[i]) ? isnan(g[i])
                             : (g[i] == c[i] || fabs((double)g[i] - c[i]) <=
                                                    atol + rtol * fabs((double)c[i]));
        if (!ok) {
            if (bad < 5)
                fprintf(stderr, "%s: element %lld: gpu %.9g cpu %.9g\n", what, (long long)i,
                        g[i], c[i]);
            bad++;
        }
    }
    return bad;
}

/* Sizes: a GPU's, or with DT_TEST_SMALL=1 (the host build of the CUDA sources, whose blocks run
 * as OS threads: docs/cuda_host.md) small ones, still no multiple of 32 or of the block size. */
static int small;
#define SIZE(gpu_n, host_n) ((int64_t)(small ? (host_n) : (gpu_n)))
#define N SIZE(100003, 1003)

typedef dt_status (*binary_fn)(int64_t, const float *, const float *, float *);

static void check_binary(binary_fn cpu_fn, binary_fn gpu_fn, const char *what)
{
    float *a = random_floats(N, -3, 3), *b = random_floats(N, -3, 3), *c = malloc(N * 4);
    float *da = to_dev(a, N * 4), *db = to_dev(b, N * 4), *dc = to_dev(a, N * 4);
    DT_ASSERT_OK(cpu_fn(N, a, b, c));
    DT_ASSERT_OK(gpu_fn(N, da, db, dc));
    float *g = from_dev(dc, N * 4);
    CU_ASSERT_EQUAL(count_bit_diffs(g, c, N, 4, what), 0);
    /* In place on a: out aliases the first input. */
    DT_ASSERT_OK(gpu_fn(N, da, db, da));
    free(g);
    g = from_dev(da, N * 4);
    CU_ASSERT_EQUAL(count_bit_diffs(g, c, N, 4, what), 0);
    free(a), free(b), free(c), free(g);
    cudaFree(da), cudaFree(db), cudaFree(dc);
}

static void test_cuda_add_sub_mul_match_cpu_bitwise(void)
{
    check_binary(dt_kernel_add, gpu->add, "add");
    check_binary(dt_kernel_sub, gpu->sub, "sub");
    check_binary(dt_kernel_mul, gpu->mul, "mul");
}

static void test_cuda_scale_axpy_fill_copy_match_cpu_bitwise(void)
{
    float *x = random_floats(N, -5, 5), *y = random_floats(N, -5, 5), *c = malloc(N * 4);
    float *dx = to_dev(x, N * 4), *dy = to_dev(y, N * 4), *g;

    DT_ASSERT_OK(dt_kernel_scale(N, 0.37f, x, c));
    DT_ASSERT_OK(gpu->scale(N, 0.37f, dx, dy));
    g = from_dev(dy, N * 4);
    CU_ASSERT_EQUAL(count_bit_diffs(g, c, N, 4, "scale"), 0);
    free(g);

    memcpy(c, y, N * 4);
    CU_ASSERT_FATAL(cudaMemcpy(dy, y, N * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    DT_ASSERT_OK(dt_kernel_axpy(N, -1.7f, x, c));
    DT_ASSERT_OK(gpu->axpy(N, -1.7f, dx, dy));
    g = from_dev(dy, N * 4);
    CU_ASSERT_EQUAL(count_bit_diffs(g, c, N, 4, "axpy"), 0);
    free(g);

    DT_ASSERT_OK(dt_kernel_fill(N, 2.5f, c));
    DT_ASSERT_OK(gpu->fill(N, 2.5f, dy));
    g = from_dev(dy, N * 4);
    CU_ASSERT_EQUAL(count_bit_diffs(g, c, N, 4, "fill"), 0);
    free(g);

    DT_ASSERT_OK(gpu->copy(N, dx, dy));
    g = from_dev(dy, N * 4);
    CU_ASSERT_EQUAL(count_bit_diffs(g, x, N, 4, "copy"), 0);
    free(g);

    /* The CPU kernels' argument errors. */
    DT_ASSERT_FAILS(gpu->add(-1, dx, dx, dy), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->scale(5, 1.0f, NULL, dy), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(gpu->fill(0, 1.0f, NULL));
    free(x), free(y), free(c);
    cudaFree(dx), cudaFree(dy);
}

static void test_cuda_bias_add_and_grad_match_cpu_bitwise(void)
{
    const int64_t rows = SIZE(517, 37), cols = SIZE(259, 45);
    float *y = random_floats(rows * cols, -2, 2), *bias = random_floats(cols, -1, 1);
    float *dy = to_dev(y, (size_t)(rows * cols) * 4), *dbias = to_dev(bias, cols * 4);
    DT_ASSERT_OK(dt_kernel_bias_add(rows, cols, bias, y));
    DT_ASSERT_OK(gpu->bias_add(rows, cols, dbias, dy));
    float *g = from_dev(dy, (size_t)(rows * cols) * 4);
    CU_ASSERT_EQUAL(count_bit_diffs(g, y, rows * cols, 4, "bias_add"), 0);
    free(g);

    float *db = malloc(cols * 4);
    DT_ASSERT_OK(dt_kernel_bias_grad(rows, cols, y, db));
    DT_ASSERT_OK(gpu->bias_grad(rows, cols, dy, dbias));
    g = from_dev(dbias, cols * 4);
    CU_ASSERT_EQUAL(count_bit_diffs(g, db, cols, 4, "bias_grad"), 0);
    free(g), free(db), free(y), free(bias);
    cudaFree(dy), cudaFree(dbias);
}

static void test_cuda_activations_match_cpu(void)
{
    float *x = random_floats(N, -8, 8), *d = random_floats(N, -1, 1);
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 1e-30f, x[3] = -1e-30f, x[4] = 30.0f, x[5] = -30.0f;
    float *c = malloc(N * 4), *g;
    float *dx = to_dev(x, N * 4), *dd = to_dev(d, N * 4), *dout = to_dev(x, N * 4);

    DT_ASSERT_OK(dt_kernel_relu(N, x, c));
    DT_ASSERT_OK(gpu->relu(N, dx, dout));
    g = from_dev(dout, N * 4);
    CU_ASSERT_EQUAL(count_bit_diffs(g, c, N, 4, "relu"), 0);
    free(g);
    DT_ASSERT_OK(dt_kernel_relu_grad(N, x, d, c));
    DT_ASSERT_OK(gpu->relu_grad(N, dx, dd, dout));
    g = from_dev(dout, N * 4);
    CU_ASSERT_EQUAL(count_bit_diffs(g, c, N, 4, "relu_grad"), 0);
    free(g);
    /* tanhf of CUDA and of the C library differ by an ulp or two. */
    DT_ASSERT_OK(dt_kernel_gelu(N, x, c));
    DT_ASSERT_OK(gpu->gelu(N, dx, dout));
    g = from_dev(dout, N * 4);
    CU_ASSERT_EQUAL(count_far(g, c, N, 1e-5, 1e-6, "gelu"), 0);
    free(g);
    DT_ASSERT_OK(dt_kernel_gelu_grad(N, x, d, c));
    DT_ASSERT_OK(gpu->gelu_grad(N, dx, dd, dd)); /* dx aliasing dy */
    g = from_dev(dd, N * 4);
    CU_ASSERT_EQUAL(count_far(g, c, N, 1e-5, 1e-6, "gelu_grad"), 0);
    free(g), free(x), free(d), free(c);
    cudaFree(dx), cudaFree(dd), cudaFree(dout);
}

static void test_cuda_softmax_xent_matches_cpu_and_checks_labels(void)
{
    const int64_t rows = SIZE(257, 131), classes = SIZE(1000, 299);
    float *x = random_floats(rows * classes, -20, 20);
    x[5] = 1e4f; /* a row far from 0: stable only with the max subtracted */
    int32_t *lab = malloc(rows * sizeof *lab);
    for (int64_t i = 0; i < rows; i++)
        lab[i] = (int32_t)(next_u32() % classes);
    float *dx = to_dev(x, (size_t)(rows * classes) * 4);
    int32_t *dlab = to_dev(lab, rows * sizeof *lab);
    float *dloss = to_dev(NULL, 4);
    float loss = 0.0f, scale = 1.0f / (float)rows;

    DT_ASSERT_OK(dt_kernel_softmax_xent(rows, classes, x, lab, scale, &loss));
    DT_ASSERT_OK(gpu->softmax_xent(rows, classes, dx, dlab, scale, dloss));
    float *g = from_dev(dloss, 4);
    CU_ASSERT(isfinite(loss));
    CU_ASSERT_EQUAL(count_far(g, &loss, 1, 1e-6, 0, "softmax_xent"), 0);
    free(g);

    float *c = malloc((size_t)(rows * classes) * 4);
    DT_ASSERT_OK(dt_kernel_softmax_xent_grad(rows, classes, x, lab, scale, c));
    DT_ASSERT_OK(gpu->softmax_xent_grad(rows, classes, dx, dlab, scale, dx)); /* in place */
    g = from_dev(dx, (size_t)(rows * classes) * 4);
    CU_ASSERT_EQUAL(count_far(g, c, rows * classes, 1e-6, 1e-12, "softmax_xent_grad"), 0);
    free(g);

    /* A bad label (row 100) fails naming the row and writes nothing. */
    int32_t bad = (int32_t)classes;
    CU_ASSERT_FATAL(cudaMemcpy(dlab + 100, &bad, 4, cudaMemcpyHostToDevice) == cudaSuccess);
    float sentinel = 42.0f;
    CU_ASSERT_FATAL(cudaMemcpy(dloss, &sentinel, 4, cudaMemcpyHostToDevice) == cudaSuccess);
    DT_ASSERT_FAILS(gpu->softmax_xent(rows, classes, dx, dlab, scale, dloss),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("row 100");
    g = from_dev(dloss, 4);
    CU_ASSERT_EQUAL(*g, 42.0f);
    free(g);
    DT_ASSERT_FAILS(gpu->softmax_xent_grad(rows, classes, dx, dlab, scale, dx),
                    DT_ERR_INVALID_ARGUMENT);
    free(x), free(lab), free(c);
    cudaFree(dx), cudaFree(dlab), cudaFree(dloss);
}

typedef dt_status (*full_fn)(int64_t, const float *, float *);

static void check_full(full_fn cpu_fn, full_fn gpu_fn, const float *x, const float *dx,
                       int64_t n, double rtol, const char *what)
{
    float c = 0.0f, *dout = to_dev(NULL, 4);
    DT_ASSERT_OK(cpu_fn(n, x, &c));
    DT_ASSERT_OK(gpu_fn(n, dx, dout));
    float *g = from_dev(dout, 4);
    CU_ASSERT_EQUAL(count_far(g, &c, 1, rtol, 0, what), 0);
    free(g);
    cudaFree(dout);
}

static void test_cuda_full_reductions_match_cpu(void)
{
    const int64_t n = SIZE(1000003, 20011);
    float *x = random_floats(n, -1, 3);
    float *dx = to_dev(x, (size_t)n * 4);
    check_full(dt_kernel_sum, gpu->sum, x, dx, n, 1e-6, "sum");
    check_full(dt_kernel_mean, gpu->mean, x, dx, n, 1e-6, "mean");
    check_full(dt_kernel_sq_norm, gpu->sq_norm, x, dx, n, 1e-6, "sq_norm");
    check_full(dt_kernel_max, gpu->max, x, dx, n, 0, "max");
    check_full(dt_kernel_sum, gpu->sum, x, dx, 7, 1e-6, "sum of 7");
    /* Empty: 0, -inf, NaN, 0. */
    check_full(dt_kernel_sum, gpu->sum, x, dx, 0, 0, "sum of 0");
    check_full(dt_kernel_max, gpu->max, x, dx, 0, 0, "max of 0");
    check_full(dt_kernel_mean, gpu->mean, x, dx, 0, 0, "mean of 0");
    /* One NaN makes the max NaN. */
    x[n / 9 * 7] = NAN;
    CU_ASSERT_FATAL(cudaMemcpy(dx, x, (size_t)n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    check_full(dt_kernel_max, gpu->max, x, dx, n, 0, "max with NaN");
    free(x);
    cudaFree(dx);
}

static void test_cuda_reduce_axis_matches_cpu_bitwise(void)
{
    const int64_t outer = 3, len = SIZE(517, 97), inner = 33, n = outer * len * inner;
    float *x = random_floats(n, -4, 4);
    x[100] = NAN;
    float *dx = to_dev(x, (size_t)n * 4), *dy = to_dev(NULL, outer * inner * 4);
    float *c = malloc(outer * inner * 4);
    const dt_reduce_op ops[] = {DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_MIN, DT_REDUCE_AVG};
    for (int k = 0; k < 4; k++) {
        for (int64_t l = 0; l <= len; l += len) { /* len and 0 */
            DT_ASSERT_OK(dt_kernel_reduce_axis(ops[k], outer, l, inner, x, c));
            DT_ASSERT_OK(gpu->reduce_axis(ops[k], outer, l, inner, dx, dy));
            float *g = from_dev(dy, outer * inner * 4);
            CU_ASSERT_EQUAL(count_bit_diffs(g, c, outer * inner, 4, dt_reduce_op_name(ops[k])),
                            0);
            free(g);
        }
    }
    DT_ASSERT_FAILS(gpu->reduce_axis((dt_reduce_op)9, 1, 1, 1, dx, dy),
                    DT_ERR_INVALID_ARGUMENT);
    free(x), free(c);
    cudaFree(dx), cudaFree(dy);
}

static void test_cuda_nonfinite_finds_inf_and_nan_in_every_dtype(void)
{
    const dt_dtype types[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_F16, DT_DTYPE_BF16};
    const int64_t n = SIZE(70001, 7001);
    float *x = random_floats(n, -60000, 60000); /* finite in every target */
    for (int t = 0; t < 4; t++) {
        size_t es = dt_dtype_size(types[t]);
        void *h = malloc((size_t)n * es);
        int32_t *dfound = to_dev(NULL, 4);
        for (int where = -1; where < 2; where++) {
            DT_ASSERT_OK(dt_kernel_cast(n, x, DT_DTYPE_F32, h, types[t]));
            if (where >= 0) {
                float bad = where == 0 ? INFINITY : NAN;
                DT_ASSERT_OK(dt_kernel_cast(1, &bad, DT_DTYPE_F32,
                                            (char *)h + (size_t)(where ? n - 1 : n / 2) * es,
                                            types[t]));
            }
            void *d = to_dev(h, (size_t)n * es);
            int32_t want = -1;
            DT_ASSERT_OK(dt_kernel_nonfinite(n, h, types[t], &want));
            DT_ASSERT_OK(gpu->nonfinite(n, d, types[t], dfound));
            int32_t *got = from_dev(dfound, 4);
            CU_ASSERT_EQUAL(want, where >= 0);
            CU_ASSERT_EQUAL(*got, want);
            free(got);
            cudaFree(d);
        }
        free(h);
        cudaFree(dfound);
    }
    DT_ASSERT_FAILS(gpu->nonfinite(1, x, DT_DTYPE_I32, (int32_t *)x), DT_ERR_UNSUPPORTED);
    free(x);
}

/* Source values for the casts: every 16-bit pattern, a sweep of f32 patterns (with NaNs of
 * both kinds and payloads), or doubles around the f32 and f16 limits. */
static void *cast_source(dt_dtype t, int64_t *n_out)
{
    if (t == DT_DTYPE_F16 || t == DT_DTYPE_BF16) {
        uint16_t *h = malloc(65536 * 2);
        for (int64_t i = 0; i < 65536; i++)
            h[i] = (uint16_t)i;
        *n_out = 65536;
        return h;
    }
    if (t == DT_DTYPE_F32) {
        int64_t step = small ? 1048573 : 4099, n = ((int64_t)1 << 32) / step + 1;
        uint32_t *u = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++)
            u[i] = (uint32_t)(i * step);
        *n_out = n;
        return u;
    }
    int64_t n = SIZE(200000, 4001);
    double *d = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) {
        uint64_t bits = ((uint64_t)next_u32() << 32) | next_u32();
        memcpy(d + i, &bits, 8);
        if (i % 3 == 0)
            d[i] = ldexp((double)(int32_t)next_u32(), (int)(next_u32() % 300) - 180);
    }
    *n_out = n;
    return d;
}

static void test_cuda_casts_match_cpu_bitwise_for_every_pair(void)
{
    const dt_dtype types[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_F16, DT_DTYPE_BF16};
    for (int s = 0; s < 4; s++) {
        int64_t n = 0;
        void *src = cast_source(types[s], &n);
        void *dsrc = to_dev(src, (size_t)n * dt_dtype_size(types[s]));
        for (int d = 0; d < 4; d++) {
            size_t bytes = (size_t)n * dt_dtype_size(types[d]);
            void *c = malloc(bytes), *ddst = to_dev(NULL, bytes);
            DT_ASSERT_OK(dt_kernel_cast(n, src, types[s], c, types[d]));
            DT_ASSERT_OK(gpu->cast(n, dsrc, types[s], ddst, types[d]));
            void *g = from_dev(ddst, bytes);
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s", dt_dtype_name(types[s]),
                     dt_dtype_name(types[d]));
            CU_ASSERT_EQUAL(count_bit_diffs(g, c, n, dt_dtype_size(types[d]), what), 0);
            free(g), free(c);
            cudaFree(ddst);
        }
        free(src);
        cudaFree(dsrc);
    }
    DT_ASSERT_FAILS(gpu->cast(1, &types, DT_DTYPE_I32, (void *)&types, DT_DTYPE_F32),
                    DT_ERR_UNSUPPORTED);
}

static void test_cuda_sgd_and_adam_match_cpu_bitwise(void)
{
    const int64_t n = SIZE(50001, 5001);
    float *p0 = random_floats(n, -1, 1), *gr = random_floats(n, -0.1f, 0.1f);
    float *dgr = to_dev(gr, (size_t)n * 4);
    dt_sgd_opts sgds[3] = {DT_SGD_OPTS_INIT, DT_SGD_OPTS_INIT, DT_SGD_OPTS_INIT};
    sgds[0].weight_decay = 0.01f, sgds[0].grad_scale = 0.5f;
    sgds[1].momentum = 0.9f, sgds[1].dampening = 0.1f, sgds[1].weight_decay = 1e-4f;
    sgds[2].momentum = 0.9f, sgds[2].nesterov = 1;
    for (int k = 0; k < 3; k++) {
        float *p = malloc((size_t)n * 4), *buf = calloc((size_t)n, 4);
        memcpy(p, p0, (size_t)n * 4);
        float *dp = to_dev(p, (size_t)n * 4), *dbuf = to_dev(buf, (size_t)n * 4);
        for (int step = 0; step < 3; step++) {
            DT_ASSERT_OK(dt_kernel_sgd(n, &sgds[k], p, gr, buf));
            DT_ASSERT_OK(gpu->sgd(n, &sgds[k], dp, dgr, sgds[k].momentum != 0 ? dbuf : NULL));
        }
        float *g = from_dev(dp, (size_t)n * 4);
        CU_ASSERT_EQUAL(count_bit_diffs(g, p, n, 4, "sgd param"), 0);
        free(g);
        g = from_dev(dbuf, (size_t)n * 4);
        CU_ASSERT_EQUAL(count_bit_diffs(g, buf, n, 4, "sgd momentum"), 0);
        free(g), free(p), free(buf);
        cudaFree(dp), cudaFree(dbuf);
    }
    dt_adam_opts adams[2] = {DT_ADAM_OPTS_INIT, DT_ADAMW_OPTS_INIT};
    adams[0].weight_decay = 0.01f;
    adams[1].grad_scale = 0.25f;
    for (int k = 0; k < 2; k++) {
        float *p = malloc((size_t)n * 4), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
        memcpy(p, p0, (size_t)n * 4);
        float *dp = to_dev(p, (size_t)n * 4), *dm = to_dev(m, (size_t)n * 4);
        float *dv = to_dev(v, (size_t)n * 4);
        for (int64_t step = 1; step <= 3; step++) {
            DT_ASSERT_OK(dt_kernel_adam(n, &adams[k], step, p, gr, m, v));
            DT_ASSERT_OK(gpu->adam(n, &adams[k], step, dp, dgr, dm, dv));
        }
        float *g = from_dev(dp, (size_t)n * 4);
        CU_ASSERT_EQUAL(count_bit_diffs(g, p, n, 4, "adam param"), 0);
        free(g);
        g = from_dev(dv, (size_t)n * 4);
        CU_ASSERT_EQUAL(count_bit_diffs(g, v, n, 4, "adam v"), 0);
        free(g), free(p), free(m), free(v);
        cudaFree(dp), cudaFree(dm), cudaFree(dv);
        DT_ASSERT_FAILS(gpu->adam(n, &adams[k], 0, dp, dgr, dm, dv), DT_ERR_INVALID_ARGUMENT);
    }
    free(p0), free(gr);
    cudaFree(dgr);
}

/* One GEMM case: operands in the given dtypes with padded leading dims, C with NaN (beta 0
 * must ignore it) or values. Compares with the CPU kernel within f32 rounding of the dot
 * products (|error| <= 1e-5 sum |a||b|, bounded here by k max|a| max|b|). */
static void check_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, dt_dtype at,
                       dt_dtype bt, float beta)
{
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int64_t lda = ac + 3, ldb = bc + 1, ldc = n + 2;
    float *af = random_floats(ar * lda, -1, 1), *bf = random_floats(br * ldb, -1, 1);
    float *c = random_floats(m * ldc, -1, 1);
    if (beta == 0.0f)
        for (int64_t i = 0; i < m * ldc; i++)
            c[i] = NAN;
    void *a = malloc((size_t)(ar * lda) * dt_dtype_size(at));
    void *b = malloc((size_t)(br * ldb) * dt_dtype_size(bt));
    DT_ASSERT_OK(dt_kernel_cast(ar * lda, af, DT_DTYPE_F32, a, at));
    DT_ASSERT_OK(dt_kernel_cast(br * ldb, bf, DT_DTYPE_F32, b, bt));
    void *da = to_dev(a, (size_t)(ar * lda) * dt_dtype_size(at));
    void *db = to_dev(b, (size_t)(br * ldb) * dt_dtype_size(bt));
    float *dc = to_dev(c, (size_t)(m * ldc) * 4);
    DT_ASSERT_OK(dt_kernel_gemm(ta, tb, m, n, k, 0.75f, a, at, lda, b, bt, ldb, beta, c, ldc));
    DT_ASSERT_OK(gpu->gemm(ta, tb, m, n, k, 0.75f, da, at, lda, db, bt, ldb, beta, dc, ldc));
    float *g = from_dev(dc, (size_t)(m * ldc) * 4);
    int64_t bad = 0;
    double tol = 1e-5 * (double)(k + 1) + 1e-6;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double d = fabs((double)g[i * ldc + j] - c[i * ldc + j]);
            if (!(d <= tol)) {
                if (bad < 5)
                    fprintf(stderr, "gemm %d%d %lldx%lldx%lld %s x %s: C[%lld,%lld] gpu %g cpu "
                            "%g\n", ta, tb, (long long)m, (long long)n, (long long)k,
                            dt_dtype_name(at), dt_dtype_name(bt), (long long)i, (long long)j,
                            g[i * ldc + j], c[i * ldc + j]);
                bad++;
            }
        }
    CU_ASSERT_EQUAL(bad, 0);
    free(af), free(bf), free(c), free(a), free(b), free(g);
    cudaFree(da), cudaFree(db), cudaFree(dc);
}

static void test_cuda_gemm_matches_cpu_for_transposes_dtypes_and_beta(void)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_gemm(ta, tb, 67, 45, 129, DT_DTYPE_F32, DT_DTYPE_F32, 0.0f);
            check_gemm(ta, tb, 33, 70, 64, DT_DTYPE_F32, DT_DTYPE_F32, 0.5f);
        }
    check_gemm(0, 1, 40, 24, 96, DT_DTYPE_F16, DT_DTYPE_BF16, 0.0f);
    check_gemm(1, 0, 24, 40, 80, DT_DTYPE_BF16, DT_DTYPE_F32, 1.0f);
    check_gemm(0, 0, 17, 19, 33, DT_DTYPE_F16, DT_DTYPE_F16, 0.25f);
    check_gemm(0, 0, 5, 6, 0, DT_DTYPE_F32, DT_DTYPE_F32, 0.0f);  /* k = 0: C = 0 */
    check_gemm(0, 0, 5, 6, 0, DT_DTYPE_F32, DT_DTYPE_F32, 2.0f);  /* k = 0: C = 2 C */
    float one = 1.0f;
    DT_ASSERT_FAILS(gpu->gemm(0, 0, 2, 2, 2, 1.0f, &one, DT_DTYPE_F32, 1, &one, DT_DTYPE_F32, 2,
                              0.0f, &one, 2), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->gemm(0, 0, 2, 2, 2, 1.0f, &one, DT_DTYPE_F64, 2, &one, DT_DTYPE_F32, 2,
                              0.0f, &one, 2), DT_ERR_UNSUPPORTED);
}

int main(int argc, char **argv)
{
    const char *sm = getenv("DT_TEST_SMALL");
    small = sm && strcmp(sm, "1") == 0;
    if (dt__gpu_physical_count() == 0) {
        fprintf(stderr, "test_ops_cuda: no CUDA device, skipped\n");
        return 77;
    }
    if (cudaSetDevice(0) != cudaSuccess)
        return 77;
    gpu = dt__ops_cuda_backend();
    static const dt_test_case cases[] = {
        DT_TEST(test_cuda_add_sub_mul_match_cpu_bitwise),
        DT_TEST(test_cuda_scale_axpy_fill_copy_match_cpu_bitwise),
        DT_TEST(test_cuda_bias_add_and_grad_match_cpu_bitwise),
        DT_TEST(test_cuda_activations_match_cpu),
        DT_TEST(test_cuda_softmax_xent_matches_cpu_and_checks_labels),
        DT_TEST(test_cuda_full_reductions_match_cpu),
        DT_TEST(test_cuda_reduce_axis_matches_cpu_bitwise),
        DT_TEST(test_cuda_nonfinite_finds_inf_and_nan_in_every_dtype),
        DT_TEST(test_cuda_casts_match_cpu_bitwise_for_every_pair),
        DT_TEST(test_cuda_sgd_and_adam_match_cpu_bitwise),
        DT_TEST(test_cuda_gemm_matches_cpu_for_transposes_dtypes_and_beta),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ops_cuda", cases, 0);
}
