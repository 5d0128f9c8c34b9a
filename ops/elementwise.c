/* Local elementwise f32 kernels: add, sub, mul, scale, axpy, fill, copy, bias add and its
 * gradient. Plain loops the compiler vectorises (outputs may alias inputs); large fills use
 * the CPU's string store on x86-64. */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

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

/* Stores only. Up to about the size of the L2 cache: vector stores, 64 or 32 bytes at a time
 * where the CPU has AVX-512 or AVX. Beyond it, on x86-64, `rep stosl`: the CPU's fast-string
 * path writes whole lines without reading them first (no read-for-ownership) and still
 * leaves them cached; 1.2-1.4x the vector loop from L3 to DRAM sizes (bench/run ops). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define X86_FILL 1
#else
#define X86_FILL 0
#endif

static void fill_loop(int64_t n, float value, float *x)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = value;
}

#if X86_FILL
__attribute__((target("avx512f"))) static void fill_avx512(int64_t n, float value, float *x)
{
    const __m512 v = _mm512_set1_ps(value);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        _mm512_storeu_ps(x + i, v);
        _mm512_storeu_ps(x + i + 16, v);
        _mm512_storeu_ps(x + i + 32, v);
        _mm512_storeu_ps(x + i + 48, v);
    }
    for (; i < n; i += 16) {
        int64_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        _mm512_mask_storeu_ps(x + i, m, v);
    }
}

__attribute__((target("avx"))) static void fill_avx(int64_t n, float value, float *x)
{
    const __m256 v = _mm256_set1_ps(value);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm256_storeu_ps(x + i, v);
        _mm256_storeu_ps(x + i + 8, v);
        _mm256_storeu_ps(x + i + 16, v);
        _mm256_storeu_ps(x + i + 24, v);
    }
    fill_loop(n - i, value, x + i);
}

/* Bytes from which `rep stosl` is used: 3/4 of the L2 cache (1 MiB assumed if unknown). */
static size_t string_fill_bytes(void)
{
    static _Atomic size_t cached;
    size_t t = atomic_load_explicit(&cached, memory_order_relaxed);
    if (t == 0) {
        long l2 = -1;
#if defined(_SC_LEVEL2_CACHE_SIZE)
        l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
        t = (l2 >= 65536 ? (size_t)l2 : (size_t)1 << 20) / 4 * 3;
        atomic_store_explicit(&cached, t, memory_order_relaxed);
    }
    return t;
}

static void fill_string(int64_t n, float value, float *x)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    uint64_t count = (uint64_t)n;
    __asm__ volatile("rep stosl" : "+D"(x), "+c"(count) : "a"(bits) : "memory");
}
#endif

dt_status dt_kernel_fill(int64_t n, float value, float *x)
{
    CHECK("dt_kernel_fill", n, x)
    if (st_ != DT_OK)
        return st_;
#if X86_FILL
    if ((uint64_t)n * sizeof(float) >= string_fill_bytes()) {
        fill_string(n, value, x);
        return DT_OK;
    }
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        fill_avx512(n, value, x);
        return DT_OK;
    }
    if (__builtin_cpu_supports("avx")) {
        fill_avx(n, value, x);
        return DT_OK;
    }
#endif
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

/* 32-byte vectors where the CPU has them: with 16-byte ones the in-cache loop is bound by
 * instruction fetch, and its speed then hangs on where the linker puts it (0.8-0.95 of
 * memcpy); GCC's AVX-512 clone of this loop ran a fifth slower from DRAM (bench/run ops). */
/* Not under ThreadSanitizer: the clones' ifunc resolver runs at load, before TSan is up, and
 * crashes there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx2", "default")))
#endif
static void bias_add_rows(int64_t rows, int64_t cols, const float *bias, float *y)
{
    for (int64_t i = 0; i < rows; i++) {
        float *row = y + i * cols;
        for (int64_t j = 0; j < cols; j++)
            row[j] += bias[j];
    }
}

dt_status dt_kernel_bias_add(int64_t rows, int64_t cols, const float *bias, float *y)
{
    dt_status st = check_matrix("dt_kernel_bias_add", rows, cols, bias, y);
    if (st != DT_OK)
        return st;
    bias_add_rows(rows, cols, bias, y);
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
