/* The CUDA device kind's own kernels (runtime/cuda/device_kernels.cu: pattern fill, the
 * relayout reductions and the average's divide) against the host kernels (runtime/box.c,
 * runtime/reduce_host.c), bit for bit, for every width and dtype, on 1003 elements (no multiple
 * of 32 or of the block size). Exits 77 (skip) without a GPU. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "harness.h"
#include "runtime/cuda/device_kernels.h"
#include "runtime/device.h"

enum { N = 1003 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next64(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* n elements of dtype t: small integers, or floats in -8..8 (halves rounded from f32). */
static void *random_of(dt_dtype t, int64_t n)
{
    size_t es = dt_dtype_size(t);
    void *h = malloc((size_t)n * es);
    float *f = malloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)((int64_t)(next64() % 16001) - 8000) / 1000.0f;
    if (t == DT_DTYPE_F32 || t == DT_DTYPE_F64 || t == DT_DTYPE_F16 || t == DT_DTYPE_BF16) {
        CU_ASSERT_FATAL(dt_kernel_cast(n, f, DT_DTYPE_F32, h, t) == DT_OK);
    } else {
        for (int64_t i = 0; i < n; i++) {
            int64_t v = (int64_t)(next64() % 200);
            if (t == DT_DTYPE_U8)
                ((uint8_t *)h)[i] = (uint8_t)v;
            else if (t == DT_DTYPE_I32)
                ((int32_t *)h)[i] = (int32_t)v - 100;
            else
                ((int64_t *)h)[i] = v - 100;
        }
    }
    free(f);
    return h;
}

static void *to_dev(const void *h, size_t bytes)
{
    void *d = NULL;
    CU_ASSERT_FATAL(cudaMalloc(&d, bytes) == cudaSuccess);
    CU_ASSERT_FATAL(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    return d;
}

static int same_as_device(const void *want, const void *d, size_t bytes)
{
    void *g = malloc(bytes);
    CU_ASSERT_FATAL(cudaDeviceSynchronize() == cudaSuccess);
    CU_ASSERT_FATAL(cudaMemcpy(g, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    int same = memcmp(g, want, bytes) == 0;
    free(g);
    return same;
}

static void test_cuda_fill_repeats_the_pattern_at_every_width(void)
{
    const uint64_t pattern = 0x0123456789abcdefull;
    for (int elem = 1; elem <= 8; elem *= 2) {
        size_t bytes = (size_t)N * (size_t)elem;
        char *want = malloc(bytes);
        dt__fill_pattern(want, bytes, &pattern, (size_t)elem); /* little endian: the low bytes */
        void *d = to_dev(want, bytes);
        CU_ASSERT_FATAL(cudaMemset(d, 0, bytes) == cudaSuccess);
        CU_ASSERT_EQUAL(dt__cudak_fill(d, N, pattern, elem, 0), cudaSuccess);
        CU_ASSERT(same_as_device(want, d, bytes));
        free(want);
        cudaFree(d);
    }
    CU_ASSERT_EQUAL(dt__cudak_fill(NULL, N, pattern, 3, 0), cudaErrorInvalidValue);
}

static void test_cuda_reduce_and_divide_give_the_host_kernels_bits_for_every_dtype(void)
{
    for (int t = 0; t < DT_DTYPE_COUNT_; t++) {
        size_t bytes = (size_t)N * dt_dtype_size((dt_dtype)t);
        for (int op = DT_REDUCE_SUM; op <= DT_REDUCE_AVG; op++) {
            void *dst = random_of((dt_dtype)t, N), *src = random_of((dt_dtype)t, N);
            void *dd = to_dev(dst, bytes), *ds = to_dev(src, bytes);
            dt__host_reduce((dt_reduce_op)op, (dt_dtype)t, dst, src, N);
            CU_ASSERT_EQUAL(dt__cudak_reduce(op, t, dd, ds, N, 0), cudaSuccess);
            CU_ASSERT(same_as_device(dst, dd, bytes));
            if (op == DT_REDUCE_AVG) { /* the average's last step */
                dt__host_divide((dt_dtype)t, dst, N, 3);
                CU_ASSERT_EQUAL(dt__cudak_divide(t, dd, N, 3, 0), cudaSuccess);
                CU_ASSERT(same_as_device(dst, dd, bytes));
            }
            if (!same_as_device(dst, dd, bytes))
                fprintf(stderr, "dtype %s op %d differs\n", dt_dtype_name((dt_dtype)t), op);
            free(dst), free(src);
            cudaFree(dd), cudaFree(ds);
        }
    }
    CU_ASSERT_EQUAL(dt__cudak_reduce(0, 99, NULL, NULL, N, 0), cudaErrorInvalidValue);
    CU_ASSERT_EQUAL(dt__cudak_divide(99, NULL, N, 2, 0), cudaErrorInvalidValue);
}

int main(int argc, char **argv)
{
    if (dt__gpu_physical_count() == 0) {
        fprintf(stderr, "test_device_kernels_cuda: no CUDA device, skipped\n");
        return 77;
    }
    if (cudaSetDevice(0) != cudaSuccess)
        return 77;
    static const dt_test_case cases[] = {
        DT_TEST(test_cuda_fill_repeats_the_pattern_at_every_width),
        DT_TEST(test_cuda_reduce_and_divide_give_the_host_kernels_bits_for_every_dtype),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "device_kernels_cuda", cases, 0);
}
