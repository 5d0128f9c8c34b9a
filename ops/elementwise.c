/* Local elementwise f32 kernels: add, sub, mul, scale, axpy, fill, copy, bias add and its
 * gradient. Plain loops the compiler vectorises (outputs may alias inputs). */
#include <string.h>

#include "ops/ops_impl.h"

#define CHECK(op, n, ...)                                                                   \
    const void *ptrs_[] = {__VA_ARGS__};                                                    \
    dt_status st_ = dt__kcheck(op, n, (int)(sizeof ptrs_ / sizeof ptrs_[0]), ptrs_);

dt_status dt_kernel_add(int64_t n, const float *a, const float *b, float *out)
{
    CHECK("dt_kernel_add", n, a, b, out)
    if (st_ != DT_OK)
        return st_;
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
    return DT_OK;
}

dt_status dt_kernel_sub(int64_t n, const float *a, const float *b, float *out)
{
    CHECK("dt_kernel_sub", n, a, b, out)
    if (st_ != DT_OK)
        return st_;
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] - b[i];
    return DT_OK;
}

dt_status dt_kernel_mul(int64_t n, const float *a, const float *b, float *out)
{
    CHECK("dt_kernel_mul", n, a, b, out)
    if (st_ != DT_OK)
        return st_;
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] * b[i];
    return DT_OK;
}

dt_status dt_kernel_scale(int64_t n, float alpha, const float *x, float *out)
{
    CHECK("dt_kernel_scale", n, x, out)
    if (st_ != DT_OK)
        return st_;
    for (int64_t i = 0; i < n; i++)
        out[i] = alpha * x[i];
    return DT_OK;
}

dt_status dt_kernel_axpy(int64_t n, float alpha, const float *x, float *y)
{
    CHECK("dt_kernel_axpy", n, x, y)
    if (st_ != DT_OK)
        return st_;
    for (int64_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
    return DT_OK;
}

/* Stores only: wide vectors matter in cache, so take AVX-512 or AVX2 where the CPU has it. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void fill_loop(int64_t n, float value, float *x)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = value;
}

dt_status dt_kernel_fill(int64_t n, float value, float *x)
{
    CHECK("dt_kernel_fill", n, x)
    if (st_ != DT_OK)
        return st_;
    fill_loop(n, value, x);
    return DT_OK;
}

dt_status dt_kernel_copy(int64_t n, const float *src, float *dst)
{
    CHECK("dt_kernel_copy", n, src, dst)
    if (st_ != DT_OK)
        return st_;
    if (n > 0 && dst != src)
        memmove(dst, src, (size_t)n * sizeof(float));
    return DT_OK;
}

static dt_status check_matrix(const char *op, int64_t rows, int64_t cols, const void *p,
                              const void *q)
{
    if (rows < 0 || cols < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: negative size %lld x %lld", op,
                         (long long)rows, (long long)cols);
    if ((cols > 0 && !p) || (rows > 0 && cols > 0 && !q))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL pointer for %lld x %lld", op,
                         (long long)rows, (long long)cols);
    return DT_OK;
}

dt_status dt_kernel_bias_add(int64_t rows, int64_t cols, const float *bias, float *y)
{
    dt_status st = check_matrix("dt_kernel_bias_add", rows, cols, bias, y);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < rows; i++) {
        float *row = y + i * cols;
        for (int64_t j = 0; j < cols; j++)
            row[j] += bias[j];
    }
    return DT_OK;
}

dt_status dt_kernel_bias_grad(int64_t rows, int64_t cols, const float *dy, float *db)
{
    dt_status st = check_matrix("dt_kernel_bias_grad", rows, cols, db, dy);
    if (st != DT_OK)
        return st;
    for (int64_t j = 0; j < cols; j++)
        db[j] = 0.0f;
    for (int64_t i = 0; i < rows; i++) {
        const float *row = dy + i * cols;
        for (int64_t j = 0; j < cols; j++)
            db[j] += row[j];
    }
    return DT_OK;
}
