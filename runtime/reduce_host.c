/* Host elementwise reduction kernels (relayouts from partial layouts, on the CPU and
 * simulated devices): a table indexed by reduction and dtype. Half types accumulate through
 * f32 and round once per step. */
/* At -O2 GCC vectorises only loops that need no runtime alias check or remainder loop, which
 * leaves these scalar: the bf16 sum of a gradient reduction then costs about 2 ns an element,
 * more than moving its bytes (docs/optim.md, "Where the reduction's time goes"). Each element
 * is still one f32 addition rounded once, so the bits do not change. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#include "runtime/device.h"
#include "runtime/half.h"

typedef void (*run_fn)(void *dst, const void *src, int64_t n, void *arg);

#define DEFINE_NATIVE(name, T)                                                         \
    static void sum_##name(void *d, const void *s, int64_t n, void *a)                 \
    {                                                                                  \
        T *x = d;                                                                      \
        const T *y = s;                                                                \
        (void)a;                                                                       \
        for (int64_t i = 0; i < n; i++)                                                \
            x[i] = (T)(x[i] + y[i]);                                                   \
    }                                                                                  \
    static void max_##name(void *d, const void *s, int64_t n, void *a)                 \
    {                                                                                  \
        T *x = d;                                                                      \
        const T *y = s;                                                                \
        (void)a;                                                                       \
        for (int64_t i = 0; i < n; i++)                                                \
            x[i] = x[i] != x[i] ? x[i] : (y[i] > x[i] || y[i] != y[i] ? y[i] : x[i]);    \
    }                                                                                  \
    static void min_##name(void *d, const void *s, int64_t n, void *a)                 \
    {                                                                                  \
        T *x = d;                                                                      \
        const T *y = s;                                                                \
        (void)a;                                                                       \
        for (int64_t i = 0; i < n; i++)                                                \
            x[i] = x[i] != x[i] ? x[i] : (y[i] < x[i] || y[i] != y[i] ? y[i] : x[i]);    \
    }                                                                                  \
    static void div_##name(void *d, int64_t n, int64_t k)                              \
    {                                                                                  \
        T *x = d;                                                                      \
        for (int64_t i = 0; i < n; i++)                                                \
            x[i] = (T)(x[i] / (T)k);                                                   \
    }

DEFINE_NATIVE(f32, float)
DEFINE_NATIVE(f64, double)
DEFINE_NATIVE(i32, int32_t)
DEFINE_NATIVE(i64, int64_t)
DEFINE_NATIVE(u8, uint8_t)

#define DEFINE_HALF(name, to_f32, from_f32)                                            \
    static void sum_##name(void *d, const void *s, int64_t n, void *a)                 \
    {                                                                                  \
        uint16_t *x = d;                                                               \
        const uint16_t *y = s;                                                         \
        (void)a;                                                                       \
        for (int64_t i = 0; i < n; i++)                                                \
            x[i] = from_f32(to_f32(x[i]) + to_f32(y[i]));                              \
    }                                                                                  \
    static void max_##name(void *d, const void *s, int64_t n, void *a)                 \
    {                                                                                  \
        uint16_t *x = d;                                                               \
        const uint16_t *y = s;                                                         \
        (void)a;                                                                       \
        for (int64_t i = 0; i < n; i++) {                                              \
            float u = to_f32(x[i]), v = to_f32(y[i]);                                  \
            x[i] = u != u ? x[i] : (v > u || v != v ? y[i] : x[i]);                    \
        }                                                                              \
    }                                                                                  \
    static void min_##name(void *d, const void *s, int64_t n, void *a)                 \
    {                                                                                  \
        uint16_t *x = d;                                                               \
        const uint16_t *y = s;                                                         \
        (void)a;                                                                       \
        for (int64_t i = 0; i < n; i++) {                                              \
            float u = to_f32(x[i]), v = to_f32(y[i]);                                  \
            x[i] = u != u ? x[i] : (v < u || v != v ? y[i] : x[i]);                    \
        }                                                                              \
    }                                                                                  \
    static void div_##name(void *d, int64_t n, int64_t k)                              \
    {                                                                                  \
        uint16_t *x = d;                                                               \
        for (int64_t i = 0; i < n; i++)                                                \
            x[i] = from_f32(to_f32(x[i]) / (float)k);                                  \
    }

DEFINE_HALF(f16, dt__f16_to_f32, dt__f32_to_f16)
DEFINE_HALF(bf16, dt__bf16_to_f32, dt__f32_to_bf16)

typedef struct kernels {
    run_fn sum, max, min;
    void (*div)(void *, int64_t, int64_t);
} kernels;

/* Indexed by dt_dtype. */
static const kernels table[DT_DTYPE_COUNT_] = {
    [DT_DTYPE_F32] = {sum_f32, max_f32, min_f32, div_f32},
    [DT_DTYPE_F64] = {sum_f64, max_f64, min_f64, div_f64},
    [DT_DTYPE_F16] = {sum_f16, max_f16, min_f16, div_f16},
    [DT_DTYPE_BF16] = {sum_bf16, max_bf16, min_bf16, div_bf16},
    [DT_DTYPE_I32] = {sum_i32, max_i32, min_i32, div_i32},
    [DT_DTYPE_I64] = {sum_i64, max_i64, min_i64, div_i64},
    [DT_DTYPE_U8] = {sum_u8, max_u8, min_u8, div_u8},
};

void dt__host_reduce(dt_reduce_op op, dt_dtype dtype, void *dst, const void *src, int64_t n)
{
    const kernels *k = &table[dtype];
    run_fn fn = op == DT_REDUCE_MAX ? k->max : op == DT_REDUCE_MIN ? k->min : k->sum;
    fn(dst, src, n, NULL);
}

void dt__host_divide(dt_dtype dtype, void *x, int64_t n, int64_t k)
{
    table[dtype].div(x, n, k);
}
