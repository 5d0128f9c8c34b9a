/* Local casts between f32, f16, bf16 and f64 (round to nearest even, NaN and infinities
 * kept). Scalar conversions are runtime/half.c's; x86 F16C does f16 in hardware when present
 * (same results: round to nearest even, subnormals exact, NaN quiet with its top payload). */
#include <string.h>

#include "ops/ops_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_F16C_PATH 1
#else
#define HAVE_F16C_PATH 0
#endif

typedef enum { FLOAT_F32, FLOAT_F64, FLOAT_F16, FLOAT_BF16, FLOAT_OTHER } float_kind;

static float_kind kind_of(dt_dtype t)
{
    switch (t) {
    case DT_DTYPE_F32: return FLOAT_F32;
    case DT_DTYPE_F64: return FLOAT_F64;
    case DT_DTYPE_F16: return FLOAT_F16;
    case DT_DTYPE_BF16: return FLOAT_BF16;
    default: return FLOAT_OTHER;
    }
}

#if HAVE_F16C_PATH
static int have_f16c(void)
{
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx") ? 1 : 0;
    }
    return cached;
}

__attribute__((target("avx,f16c"))) static void f32_to_f16_hw(int64_t n, const float *src,
                                                             uint16_t *dst)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = dt__f32_to_f16(src[i]);
}

__attribute__((target("avx,f16c"))) static void f16_to_f32_hw(int64_t n, const uint16_t *src,
                                                             float *dst)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) {
        float f = dt__f16_to_f32(src[i]);
        if (f != f) {    /* quiet, as the hardware does */
            uint32_t u;
            memcpy(&u, &f, sizeof u);
            u |= 0x400000u;
            memcpy(&f, &u, sizeof f);
        }
        dst[i] = f;
    }
}
#endif

/* f32 -> f16 for the scalar tail and machines without F16C. */
static void f32_to_f16_sw(int64_t n, const float *src, uint16_t *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt__f32_to_f16(src[i]);
}

static void f16_to_f32_sw(int64_t n, const uint16_t *src, float *dst)
{
    for (int64_t i = 0; i < n; i++) {
        float f = dt__f16_to_f32(src[i]);
        if (f != f) {
            uint32_t u;
            memcpy(&u, &f, sizeof u);
            u |= 0x400000u;
            memcpy(&f, &u, sizeof f);
        }
        dst[i] = f;
    }
}

static void f32_to_f16(int64_t n, const float *src, uint16_t *dst)
{
#if HAVE_F16C_PATH
    if (have_f16c()) {
        f32_to_f16_hw(n, src, dst);
        return;
    }
#endif
    f32_to_f16_sw(n, src, dst);
}

static void f16_to_f32(int64_t n, const uint16_t *src, float *dst)
{
#if HAVE_F16C_PATH
    if (have_f16c()) {
        f16_to_f32_hw(n, src, dst);
        return;
    }
#endif
    f16_to_f32_sw(n, src, dst);
}

/* The bf16 conversions are inline and branch-free (runtime/internal.h), so these loops
 * vectorise; narrowing 32 -> 16 bits is slow in SSE2, so take AVX-512 or AVX2 when present. */
#if HAVE_F16C_PATH
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void f32_to_bf16(int64_t n, const float *src, uint16_t *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt__f32_to_bf16(src[i]);
}

#if HAVE_F16C_PATH
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void bf16_to_f32(int64_t n, const uint16_t *src, float *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt__bf16_to_f32(src[i]);
}

/* Conversions through f32 in chunks on the stack (f16 <-> bf16, f64 <-> half). */
#define CHUNK 256

static void cast_via_f32(int64_t n, const void *src, float_kind sk, void *dst, float_kind dk)
{
    float tmp[CHUNK];
    const unsigned char *s = src;
    unsigned char *d = dst;
    size_t ss = sk == FLOAT_F64 ? 8 : 2, ds = dk == FLOAT_F64 ? 8 : 2;
    for (int64_t i = 0; i < n; i += CHUNK) {
        int64_t c = n - i < CHUNK ? n - i : CHUNK;
        const void *sp = s + (size_t)i * ss;
        void *dp = d + (size_t)i * ds;
        if (sk == FLOAT_F64)
            for (int64_t j = 0; j < c; j++)
                tmp[j] = (float)((const double *)sp)[j];
        else if (sk == FLOAT_F16)
            f16_to_f32(c, sp, tmp);
        else
            bf16_to_f32(c, sp, tmp);
        if (dk == FLOAT_F64)
            for (int64_t j = 0; j < c; j++)
                ((double *)dp)[j] = tmp[j];
        else if (dk == FLOAT_F16)
            f32_to_f16(c, tmp, dp);
        else
            f32_to_bf16(c, tmp, dp);
    }
}

dt_status dt_kernel_cast(int64_t n, const void *src, dt_dtype src_dtype, void *dst,
                         dt_dtype dst_dtype)
{
    float_kind sk = kind_of(src_dtype), dk = kind_of(dst_dtype);
    if (sk == FLOAT_OTHER || dk == FLOAT_OTHER)
        return dt__error(DT_ERR_UNSUPPORTED, "dt_kernel_cast: %s -> %s (f32, f64, f16 and bf16 "
                         "only)", dt_dtype_name(src_dtype), dt_dtype_name(dst_dtype));
    const void *p[] = {src, dst};
    dt_status st = dt__kcheck("dt_kernel_cast", n, 2, p);
    if (st != DT_OK || n == 0)
        return st;
    if (sk == dk) {
        memmove(dst, src, (size_t)n * dt_dtype_size(src_dtype));
        return DT_OK;
    }
    if (sk == FLOAT_F32) {
        const float *s = src;
        if (dk == FLOAT_F16)
            f32_to_f16(n, s, dst);
        else if (dk == FLOAT_BF16)
            f32_to_bf16(n, s, dst);
        else
            for (int64_t i = 0; i < n; i++)
                ((double *)dst)[i] = s[i];
        return DT_OK;
    }
    if (dk == FLOAT_F32) {
        float *d = dst;
        if (sk == FLOAT_F16)
            f16_to_f32(n, src, d);
        else if (sk == FLOAT_BF16)
            bf16_to_f32(n, src, d);
        else
            for (int64_t i = 0; i < n; i++)
                d[i] = (float)((const double *)src)[i];
        return DT_OK;
    }
    cast_via_f32(n, src, sk, dst, dk);
    return DT_OK;
}
