/* Vectorised f32 exp and tanh (the project's own polynomials) and the GELU, softmax and loss
 * loops built on them. One code path, 8 lanes at a time with the tail padded, so every element
 * gets the same operations whatever the CPU or the position: results do not depend on the
 * path taken (docs/ops.md, "Vectorised math"). */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "ops/ops_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* The 8-lane helpers are always inlined: no vector crosses a call, whatever the ABI says. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef double v4d __attribute__((vector_size(32)));

#define INLINE static inline __attribute__((always_inline))

#define SPLAT(c) ((v8f){c, c, c, c, c, c, c, c})

INLINE v8f sel(v8i m, v8f a, v8f b)
{
    return (v8f)((m & (v8i)a) | (~m & (v8i)b));
}

INLINE v8f load8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void store8(float *p, v8f v)
{
    memcpy(p, &v, sizeof v);
}

/* Loads n < 8 floats, the rest `pad`. */
INLINE v8f load_tail(const float *p, int64_t n, float pad)
{
    float b[8];
    for (int i = 0; i < 8; i++)
        b[i] = i < n ? p[i] : pad;
    return load8(b);
}

INLINE void store_tail(float *p, int64_t n, v8f v)
{
    float b[8];
    store8(b, v);
    for (int64_t i = 0; i < n; i++)
        p[i] = b[i];
}

/* exp(x): x = n ln2 + r, |r| <= ln2/2 (ln2 in two parts, n ln2_hi exact), e^r by a degree-6
 * polynomial fitted for relative error (3e-9 before rounding), times 2^(n/2) 2^(n - n/2) so
 * that results down to the subnormals and up to FLT_MAX come out right. x is clamped to
 * [-104, 89], beyond which exp is 0 or inf in f32 anyway; NaN stays NaN. */
INLINE v8f vexp(v8f x)
{
    v8i nan = x != x;
    x = sel(nan, SPLAT(0.0f), x);
    x = sel(x < SPLAT(-104.0f), SPLAT(-104.0f), x);
    x = sel(x > SPLAT(89.0f), SPLAT(89.0f), x);
    /* Round to nearest by the 1.5 * 2^23 shift (exact for |x log2e| < 2^22). */
    v8f n = (x * SPLAT(1.44269504f) + SPLAT(12582912.0f)) - SPLAT(12582912.0f);
    v8f r = (x - n * SPLAT(0.693145751953125f)) - n * SPLAT(1.42860677e-06f);
    v8f p = SPLAT(0.00138146046f);
    p = p * r + SPLAT(0.00836871099f);
    p = p * r + SPLAT(0.041668389f);
    p = p * r + SPLAT(0.166665211f);
    p = p * r + SPLAT(0.49999994f);
    p = p * r + SPLAT(1.0f);
    p = p * r + SPLAT(1.0f);
    v8i ni = __builtin_convertvector(n, v8i);
    v8i h = ni >> 1;
    v8f s1 = (v8f)((h + 127) << 23), s2 = (v8f)((ni - h + 127) << 23);
    v8f y = (p * s1) * s2;
    return sel(nan, SPLAT(NAN), y);
}

/* tanh(x): |x| < 0.625 an odd polynomial x + x^3 P(x^2) fitted for relative error (4e-9
 * before rounding); beyond, 1 - 2 / (exp(2|x|) + 1), which has no cancellation there
 * (tanh >= 0.55); the sign restored by its bit. */
INLINE v8f vtanh(v8f x)
{
    v8i sign = (v8i)x & (v8i)SPLAT(-0.0f);
    v8f a = (v8f)((v8i)x & ~(v8i)SPLAT(-0.0f));
    v8f z = x * x;
    v8f q = SPLAT(-0.00570500037f);
    q = q * z + SPLAT(0.020639101f);
    q = q * z + SPLAT(-0.0537397191f);
    q = q * z + SPLAT(0.133314416f);
    q = q * z + SPLAT(-0.333332807f);
    v8f small = a + a * z * q;
    v8f big = SPLAT(1.0f) - SPLAT(2.0f) / (vexp(a + a) + SPLAT(1.0f));
    v8f t = sel(a < SPLAT(0.625f), small, big);
    /* NaN: a < 0.625 is false and big is NaN, so NaN comes through. */
    return (v8f)((v8i)t | sign);
}

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

INLINE v8f gelu8(v8f v)
{
    v8f u = SPLAT(GELU_C) * (v + SPLAT(GELU_A) * v * v * v);
    return SPLAT(0.5f) * v * (SPLAT(1.0f) + vtanh(u));
}

INLINE v8f gelu_grad8(v8f v, v8f dy)
{
    v8f u = SPLAT(GELU_C) * (v + SPLAT(GELU_A) * v * v * v);
    v8f t = vtanh(u);
    v8f du = SPLAT(GELU_C) * (SPLAT(1.0f) + SPLAT(3.0f * GELU_A) * v * v);
    v8f g = SPLAT(0.5f) * (SPLAT(1.0f) + t) + SPLAT(0.5f) * v * (SPLAT(1.0f) - t * t) * du;
    return g * dy;
}

INLINE void vexp_impl(int64_t n, const float *x, float *y)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8(y + i, vexp(load8(x + i)));
    if (i < n)
        store_tail(y + i, n - i, vexp(load_tail(x + i, n - i, 0.0f)));
}

INLINE void vtanh_impl(int64_t n, const float *x, float *y)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8(y + i, vtanh(load8(x + i)));
    if (i < n)
        store_tail(y + i, n - i, vtanh(load_tail(x + i, n - i, 0.0f)));
}

INLINE void vgelu_impl(int64_t n, const float *x, float *y)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8(y + i, gelu8(load8(x + i)));
    if (i < n)
        store_tail(y + i, n - i, gelu8(load_tail(x + i, n - i, 0.0f)));
}

INLINE void vgelu_grad_impl(int64_t n, const float *x, const float *dy, float *dx)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8(dx + i, gelu_grad8(load8(x + i), load8(dy + i)));
    if (i < n)
        store_tail(dx + i, n - i,
                   gelu_grad8(load_tail(x + i, n - i, 0.0f), load_tail(dy + i, n - i, 0.0f)));
}

/* Adds the 8 f32 lanes of e, in f64, to the two accumulators. */
INLINE void acc8(v4d *lo, v4d *hi, v8f e)
{
    typedef float v4f __attribute__((vector_size(16)));
    v4f a = {e[0], e[1], e[2], e[3]}, b = {e[4], e[5], e[6], e[7]};
    *lo += __builtin_convertvector(a, v4d);
    *hi += __builtin_convertvector(b, v4d);
}

INLINE double hsum(v4d lo, v4d hi)
{
    v4d s = lo + hi;
    return (s[0] + s[1]) + (s[2] + s[3]);
}

INLINE double vexp_sum_impl(int64_t n, const float *x, float shift, float *y)
{
    v4d lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0};
    v8f sh = SPLAT(shift);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f e = vexp(load8(x + i) - sh);
        if (y)
            store8(y + i, e);
        acc8(&lo, &hi, e);
    }
    if (i < n) {
        /* Padding of -inf gives exp 0: nothing added. */
        v8f e = vexp(load_tail(x + i, n - i, -INFINITY) - sh);
        if (y)
            store_tail(y + i, n - i, e);
        acc8(&lo, &hi, e);
    }
    return hsum(lo, hi);
}

INLINE void vexp_scale_impl(int64_t n, const float *x, float shift, float a, float b, float *y)
{
    v8f sh = SPLAT(shift), fa = SPLAT(a), fb = SPLAT(b);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8(y + i, (vexp(load8(x + i) - sh) * fa) * fb);
    if (i < n)
        store_tail(y + i, n - i, (vexp(load_tail(x + i, n - i, 0.0f) - sh) * fa) * fb);
}

/* y = (y * a) * b, each element on its own (the products of vexp_scale on stored exps). */
INLINE void vmul2_impl(int64_t n, float a, float b, float *y)
{
    v8f fa = SPLAT(a), fb = SPLAT(b);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8(y + i, (load8(y + i) * fa) * fb);
    for (; i < n; i++)
        y[i] = (y[i] * a) * b;
}

/* Dot product: 8 lane sums (the tail zero-padded), added in a fixed tree. */
INLINE float vdot_impl(int64_t n, const float *a, const float *b)
{
    v8f acc = SPLAT(0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc += load8(a + i) * load8(b + i);
    if (i < n)
        acc += load_tail(a + i, n - i, 0.0f) * load_tail(b + i, n - i, 0.0f);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* y += alpha x (each element on its own: the same bits as the scalar loop). */
INLINE void vaxpy_impl(int64_t n, float alpha, const float *x, float *y)
{
    v8f a = SPLAT(alpha);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8(y + i, load8(y + i) + a * load8(x + i));
    for (; i < n; i++)
        y[i] += alpha * x[i];
}

/* Square roots of 8 lanes, each correctly rounded (as sqrtf): two SSE halves on x86-64, both
 * paths (sqrtps is exact, so the halves give the bits of the scalar sqrtss). */
INLINE v8f vsqrt(v8f x)
{
#if defined(__x86_64__)
    __m128 h[2];
    memcpy(h, &x, sizeof h);
    h[0] = _mm_sqrt_ps(h[0]);
    h[1] = _mm_sqrt_ps(h[1]);
    memcpy(&x, h, sizeof h);
#else
    for (int j = 0; j < 8; j++)
        x[j] = sqrtf(x[j]);
#endif
    return x;
}

/* Adam's update of whole groups of 8 (dt_kernel_adam's scalar loop, operation for operation:
 * the same bits); returns how many elements it did, the caller does the rest. */
INLINE int64_t vadam_impl(int64_t n, const dt__adam_consts *k, float *param, const float *grad,
                          float *m, float *v)
{
    v8f gs = SPLAT(k->grad_scale), l2 = SPLAT(k->l2), b1 = SPLAT(k->b1), b2 = SPLAT(k->b2);
    v8f ob1 = SPLAT(1.0f - k->b1), ob2 = SPLAT(1.0f - k->b2), decay = SPLAT(k->decay);
    v8f step = SPLAT(k->step_size), ibc2 = SPLAT(k->inv_sqrt_bc2), eps = SPLAT(k->eps);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f w = load8(param + i);
        v8f g = gs * load8(grad + i) + l2 * w;
        v8f mi = b1 * load8(m + i) + ob1 * g;
        v8f vi = b2 * load8(v + i) + ob2 * g * g;
        store8(m + i, mi);
        store8(v + i, vi);
        w = w * decay;
        store8(param + i, w - step * mi / (vsqrt(vi) * ibc2 + eps));
    }
    return i;
}

/* Each loop twice: for AVX2 (32-byte vectors) where the CPU has it, else in SSE2 pairs. The
 * same operations in the same order either way (no FMA: c11 mode does not contract), so the
 * same bits; tests/ops/test_vmath.c runs both. Chosen by hand, not target_clones, so that the
 * test can pick (and no ifunc resolver runs at load under ThreadSanitizer). */
#if defined(__x86_64__) && defined(__GNUC__)
#define AVX2_PATH 1
#define AVX2 __attribute__((target("avx2")))
#else
#define AVX2_PATH 0
#define AVX2
#endif

static _Atomic int isa = -1; /* 0 portable, 1 AVX2; -1 not looked at yet */

static int have_avx2(void)
{
    int v = isa;
    if (v < 0) {
#if AVX2_PATH
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") ? 1 : 0;
#else
        v = 0;
#endif
        isa = v;
    }
    return v;
}

void dt__vmath_tune(int isa_cap)
{
    isa = -1;
    if (isa_cap < 1 || !have_avx2())
        isa = 0;
}

#define PATHS_VOID(name, params, args)                                                      \
    AVX2 static void name##_avx2 params { name##_impl args; }                               \
    static void name##_portable params { name##_impl args; }                                \
    void dt__##name params                                                                  \
    {                                                                                       \
        if (have_avx2())                                                                    \
            name##_avx2 args;                                                               \
        else                                                                                \
            name##_portable args;                                                           \
    }

PATHS_VOID(vexp, (int64_t n, const float *x, float *y), (n, x, y))
PATHS_VOID(vtanh, (int64_t n, const float *x, float *y), (n, x, y))
PATHS_VOID(vgelu, (int64_t n, const float *x, float *y), (n, x, y))
PATHS_VOID(vgelu_grad, (int64_t n, const float *x, const float *dy, float *dx), (n, x, dy, dx))
PATHS_VOID(vexp_scale, (int64_t n, const float *x, float shift, float a, float b, float *y),
           (n, x, shift, a, b, y))

PATHS_VOID(vmul2, (int64_t n, float a, float b, float *y), (n, a, b, y))
PATHS_VOID(vaxpy, (int64_t n, float alpha, const float *x, float *y), (n, alpha, x, y))

AVX2 static int64_t vadam_avx2(int64_t n, const dt__adam_consts *k, float *param,
                               const float *grad, float *m, float *v)
{
    return vadam_impl(n, k, param, grad, m, v);
}

static int64_t vadam_portable(int64_t n, const dt__adam_consts *k, float *param,
                              const float *grad, float *m, float *v)
{
    return vadam_impl(n, k, param, grad, m, v);
}

int64_t dt__vadam(int64_t n, const dt__adam_consts *k, float *param, const float *grad,
                  float *m, float *v)
{
    return have_avx2() ? vadam_avx2(n, k, param, grad, m, v)
                       : vadam_portable(n, k, param, grad, m, v);
}

AVX2 static float vdot_avx2(int64_t n, const float *a, const float *b)
{
    return vdot_impl(n, a, b);
}

static float vdot_portable(int64_t n, const float *a, const float *b)
{
    return vdot_impl(n, a, b);
}

float dt__vdot(int64_t n, const float *a, const float *b)
{
    return have_avx2() ? vdot_avx2(n, a, b) : vdot_portable(n, a, b);
}

AVX2 static double vexp_sum_avx2(int64_t n, const float *x, float shift, float *y)
{
    return vexp_sum_impl(n, x, shift, y);
}

static double vexp_sum_portable(int64_t n, const float *x, float shift, float *y)
{
    return vexp_sum_impl(n, x, shift, y);
}

double dt__vexp_sum(int64_t n, const float *x, float shift, float *y)
{
    return have_avx2() ? vexp_sum_avx2(n, x, shift, y) : vexp_sum_portable(n, x, shift, y);
}
