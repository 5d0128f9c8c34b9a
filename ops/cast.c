/* Local casts between f32, f16, bf16 and f64 (round to nearest even, NaN made quiet with its
 * top payload, infinities and subnormals kept). Portable loops over runtime/'s scalar
 * conversions everywhere; on x86-64, AVX-512 (BF16) or AVX2/F16C kernels chosen at run time,
 * with streaming stores for calls larger than the last-level cache. Same bits on every path
 * (tests/ops/test_cast_sweep.c runs each). */
#include <stdatomic.h>
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"
#include "runtime/half.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define X86_PATHS 1
#else
#define X86_PATHS 0
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

/* ---- instruction sets ------------------------------------------------------------------ */

enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512_BF16 = 3 };

static _Atomic int isa_cap = ISA_AVX512_BF16;
static _Atomic int64_t stream_min = -1;

void dt__cast_tune(int isa, int64_t stream_bytes)
{
    isa = isa < ISA_PORTABLE ? ISA_PORTABLE : isa > ISA_AVX512_BF16 ? ISA_AVX512_BF16 : isa;
    atomic_store_explicit(&isa_cap, isa, memory_order_relaxed);
    atomic_store_explicit(&stream_min, stream_bytes < 0 ? -1 : stream_bytes, memory_order_relaxed);
}

#if X86_PATHS
static int isa_allowed(int level)
{
    return atomic_load_explicit(&isa_cap, memory_order_relaxed) >= level;
}

/* libgcc's feature bits (checked against what the OS saves, XCR0) are set by a constructor;
 * __builtin_cpu_init makes them valid even when called before it, and is cheap afterwards. */
static int have_avx512(void)
{
    __builtin_cpu_init();
    return isa_allowed(ISA_AVX512) && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
}

static int have_avx2(void)
{
    __builtin_cpu_init();
    return isa_allowed(ISA_AVX2) && __builtin_cpu_supports("avx2");
}

/* F16C and AVX512_BF16 from cpuid (compilers' __builtin_cpu_supports do not all know them),
 * asked once: cpuid can trap to the hypervisor in a virtual machine. Bit 0: F16C, bit 1:
 * AVX512_BF16. */
static int cpuid_bits(void)
{
    static _Atomic int bits = -1;
    int known = atomic_load_explicit(&bits, memory_order_relaxed);
    if (known < 0) {
        unsigned a, b, c, d;
        known = 0;
        if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C))
            known |= 1;
        if (__get_cpuid_max(0, NULL) >= 7) {
            __cpuid_count(7, 1, a, b, c, d);
            if (a & (1u << 5)) /* CPUID.(7,1):EAX.AVX512_BF16 */
                known |= 2;
        }
        atomic_store_explicit(&bits, known, memory_order_relaxed);
    }
    return known;
}

static int have_f16c(void)
{
    __builtin_cpu_init();
    return isa_allowed(ISA_AVX2) && (cpuid_bits() & 1) && __builtin_cpu_supports("avx");
}

static int have_avx512_bf16(void)
{
    return isa_allowed(ISA_AVX512_BF16) && have_avx512() && (cpuid_bits() & 2);
}
#endif

/* ---- portable loops (and every machine's reference) ------------------------------------ */

static void f32_to_f16_portable(int64_t n, const float *src, uint16_t *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt__f32_to_f16(src[i]);
}

static void f16_to_f32_portable(int64_t n, const uint16_t *src, float *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt__f16_to_f32(src[i]);
}

/* The bf16 conversions are inline and branch-free, so these loops vectorise (SSE2). */
static void f32_to_bf16_portable(int64_t n, const float *src, uint16_t *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt__f32_to_bf16(src[i]);
}

static void bf16_to_f32_portable(int64_t n, const uint16_t *src, float *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt__bf16_to_f32(src[i]);
}

#if X86_PATHS
/* Bytes of the last-level cache of this core, from cpuid's deterministic cache parameters
 * (AMD leaf 0x8000001d, else leaf 4): sysconf's figure can be a whole package's, or a
 * hypervisor's sum (384 MiB on an EPYC guest whose cores share 32 MiB). 32 MiB if unknown. */
static size_t llc_bytes(void)
{
    static _Atomic size_t cached;
    size_t best = atomic_load_explicit(&cached, memory_order_relaxed);
    if (best != 0)
        return best;
    unsigned leaf = 0, best_level = 0;
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x8000001du)
        leaf = 0x8000001du;
    else if ((unsigned)__get_cpuid_max(0, NULL) >= 4)
        leaf = 4;
    for (unsigned sub = 0; leaf != 0 && sub < 8; sub++) {
        unsigned a, b, c, d;
        __cpuid_count(leaf, sub, a, b, c, d);
        unsigned type = a & 31, level = (a >> 5) & 7;
        if (type == 0)
            break;
        size_t size = (size_t)((b >> 22) + 1) * (((b >> 12) & 0x3ff) + 1) * ((b & 0xfff) + 1) *
                      ((size_t)c + 1);
        if (type != 2 && level >= best_level) { /* data or unified */
            best_level = level;
            best = size;
        }
    }
    best = best >= ((size_t)1 << 20) ? best : (size_t)32 << 20;
    atomic_store_explicit(&cached, best, memory_order_relaxed);
    return best;
}

/* A call that moves more than the last-level cache holds writes with streaming stores: its
 * output cannot stay cached anyway, and they skip reading every line before writing it
 * (1.1-1.3x from DRAM, bench/run ops). Returns how many elements come before dst is 64-byte
 * aligned (at most n; the streaming stores need the alignment), or -1 for ordinary stores. */
static int64_t stream_head(int64_t n, size_t in_size, size_t out_size, const void *dst)
{
    int64_t min = atomic_load_explicit(&stream_min, memory_order_relaxed);
    uint64_t threshold = min >= 0 ? (uint64_t)min : (uint64_t)llc_bytes();
    uintptr_t a = (uintptr_t)dst;
    if ((uint64_t)n * (in_size + out_size) < threshold || a % out_size != 0)
        return -1;
    int64_t head = (int64_t)((((uintptr_t)0 - a) & 63) / out_size);
    return head < n ? head : n;
}

/* ---- AVX-512 (F, BW, DQ, VL: every AVX-512 CPU since Skylake-SP) -------------------------
 * bf16 in integer arithmetic as dt__f32_to_bf16 does it: u + 0x7fff + lsb rounds to nearest
 * even in the top half; a NaN keeps its top half and gets the quiet bit. NaNs are found with vfpclassps, which raises no floating-point exception.
 * Heads and tails use masked loads and stores (masked-off lanes are never touched, nor
 * fault). The bodies are inlined twice, with ordinary and with streaming stores. */
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#define INLINE_AVX512 TARGET_AVX512 __attribute__((always_inline)) static inline

enum { FPCLASS_NAN = 0x81 }; /* quiet | signalling */

INLINE_AVX512 void store_512(void *p, __m512i v, int streaming)
{
    if (streaming)
        _mm512_stream_si512((__m512i *)p, v);
    else
        _mm512_storeu_si512(p, v);
}

/* 16 f32 bit patterns -> 32-bit words whose high halves are the bf16 results. */
INLINE_AVX512 __m512i bf16_round_512(__m512i u)
{
    __mmask16 odd = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x10000));
    __mmask16 nan = _mm512_fpclass_ps_mask(_mm512_castsi512_ps(u), FPCLASS_NAN);
    __m512i r = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
    r = _mm512_mask_add_epi32(r, odd, u, _mm512_set1_epi32(0x8000));
    return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
}

/* The high 16-bit halves of a's and then b's 16 words (vpermt2w). */
INLINE_AVX512 __m512i high_halves_512(__m512i a, __m512i b)
{
    const __m512i idx =
        _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                         25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(a, idx, b);
}

/* m <= 32 elements. */
INLINE_AVX512 void f32_to_bf16_512_part(int64_t m, const float *src, uint16_t *dst)
{
    __mmask32 k = m >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << m) - 1);
    __m512i a = bf16_round_512(_mm512_maskz_loadu_epi32((__mmask16)k, src));
    __m512i b = bf16_round_512(_mm512_maskz_loadu_epi32((__mmask16)(k >> 16), src + 16));
    _mm512_mask_storeu_epi16(dst, k, high_halves_512(a, b));
}

INLINE_AVX512 int64_t f32_to_bf16_512_body(int64_t i, int64_t n, const float *src, uint16_t *dst,
                                           int streaming)
{
    for (; i + 64 <= n; i += 64) {
        __m512i a = bf16_round_512(_mm512_loadu_si512(src + i));
        __m512i b = bf16_round_512(_mm512_loadu_si512(src + i + 16));
        __m512i c = bf16_round_512(_mm512_loadu_si512(src + i + 32));
        __m512i d = bf16_round_512(_mm512_loadu_si512(src + i + 48));
        store_512(dst + i, high_halves_512(a, b), streaming);
        store_512(dst + i + 32, high_halves_512(c, d), streaming);
    }
    return i;
}

TARGET_AVX512 static void f32_to_bf16_avx512(int64_t n, const float *src, uint16_t *dst)
{
    int64_t i, head = stream_head(n, 4, 2, dst);
    if (head >= 0) {
        f32_to_bf16_512_part(head, src, dst);
        i = f32_to_bf16_512_body(head, n, src, dst, 1);
        _mm_sfence();
    } else {
        i = f32_to_bf16_512_body(0, n, src, dst, 0);
    }
    for (; i < n; i += 32)
        f32_to_bf16_512_part(n - i, src + i, dst + i);
}

/* With AVX512_BF16: vcvtne2ps2bf16 rounds to nearest even and makes a NaN quiet keeping its
 * top payload, as dt__f32_to_bf16 does, but reads subnormal inputs as zero; a block of 32
 * that holds one takes the integer path instead (rare in real data). 1.05x the integer path
 * from L2 and beyond, 1.5x in L1. */
#define TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#define INLINE_AVX512_BF16 TARGET_AVX512_BF16 __attribute__((always_inline)) static inline

enum { FPCLASS_SUBNORMAL = 0x20 };

INLINE_AVX512_BF16 __m512i bf16_hw_32(__m512i a, __m512i b)
{
    __mmask16 sa = _mm512_fpclass_ps_mask(_mm512_castsi512_ps(a), FPCLASS_SUBNORMAL);
    __mmask16 sb = _mm512_fpclass_ps_mask(_mm512_castsi512_ps(b), FPCLASS_SUBNORMAL);
    if (__builtin_expect((sa | sb) == 0, 1))
        return (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(b), _mm512_castsi512_ps(a));
    return high_halves_512(bf16_round_512(a), bf16_round_512(b));
}

INLINE_AVX512_BF16 int64_t f32_to_bf16_hw_body(int64_t i, int64_t n, const float *src,
                                              uint16_t *dst, int streaming)
{
    for (; i + 64 <= n; i += 64) {
        __m512i a = bf16_hw_32(_mm512_loadu_si512(src + i), _mm512_loadu_si512(src + i + 16));
        __m512i b = bf16_hw_32(_mm512_loadu_si512(src + i + 32), _mm512_loadu_si512(src + i + 48));
        store_512(dst + i, a, streaming);
        store_512(dst + i + 32, b, streaming);
    }
    return i;
}

TARGET_AVX512_BF16 static void f32_to_bf16_avx512_bf16(int64_t n, const float *src, uint16_t *dst)
{
    int64_t i, head = stream_head(n, 4, 2, dst);
    if (head >= 0) {
        f32_to_bf16_512_part(head, src, dst);
        i = f32_to_bf16_hw_body(head, n, src, dst, 1);
        _mm_sfence();
    } else {
        i = f32_to_bf16_hw_body(0, n, src, dst, 0);
    }
    for (; i < n; i += 32)
        f32_to_bf16_512_part(n - i, src + i, dst + i);
}

/* 16 bf16 -> 16 f32 (NaNs made quiet). */
INLINE_AVX512 __m512i bf16_widen_512(__m256i h)
{
    __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    __mmask16 nan = _mm512_fpclass_ps_mask(_mm512_castsi512_ps(u), FPCLASS_NAN);
    return _mm512_mask_or_epi32(u, nan, u, _mm512_set1_epi32(0x400000));
}

/* m <= 16 elements. */
INLINE_AVX512 void bf16_to_f32_512_part(int64_t m, const uint16_t *src, float *dst)
{
    __mmask16 k = m >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << m) - 1);
    _mm512_mask_storeu_epi32(dst, k, bf16_widen_512(_mm256_maskz_loadu_epi16(k, src)));
}

INLINE_AVX512 int64_t bf16_to_f32_512_body(int64_t i, int64_t n, const uint16_t *src, float *dst,
                                           int streaming)
{
    for (; i + 64 <= n; i += 64) {
        __m512i a = bf16_widen_512(_mm256_loadu_si256((const void *)(src + i)));
        __m512i b = bf16_widen_512(_mm256_loadu_si256((const void *)(src + i + 16)));
        __m512i c = bf16_widen_512(_mm256_loadu_si256((const void *)(src + i + 32)));
        __m512i d = bf16_widen_512(_mm256_loadu_si256((const void *)(src + i + 48)));
        store_512(dst + i, a, streaming);
        store_512(dst + i + 16, b, streaming);
        store_512(dst + i + 32, c, streaming);
        store_512(dst + i + 48, d, streaming);
    }
    return i;
}

TARGET_AVX512 static void bf16_to_f32_avx512(int64_t n, const uint16_t *src, float *dst)
{
    int64_t i, head = stream_head(n, 2, 4, dst);
    if (head >= 0) {
        bf16_to_f32_512_part(head, src, dst);
        i = bf16_to_f32_512_body(head, n, src, dst, 1);
        _mm_sfence();
    } else {
        i = bf16_to_f32_512_body(0, n, src, dst, 0);
    }
    for (; i < n; i += 16)
        bf16_to_f32_512_part(n - i, src + i, dst + i);
}

/* f16 in hardware: vcvtps2ph with an explicit round-to-nearest-even rounds subnormals exactly
 * and keeps a NaN's top payload bits, made quiet, as dt__f32_to_f16 does; vcvtph2ps widens
 * exactly (subnormals too) and makes a signalling NaN quiet. */
#define F16_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* m <= 16 elements. */
INLINE_AVX512 void f32_to_f16_512_part(int64_t m, const float *src, uint16_t *dst)
{
    __mmask16 k = m >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << m) - 1);
    _mm256_mask_storeu_epi16(dst, k, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src), F16_RNE));
}

INLINE_AVX512 int64_t f32_to_f16_512_body(int64_t i, int64_t n, const float *src, uint16_t *dst,
                                          int streaming)
{
    for (; i + 64 <= n; i += 64) {
        __m256i a = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), F16_RNE);
        __m256i b = _mm512_cvtps_ph(_mm512_loadu_ps(src + i + 16), F16_RNE);
        __m256i c = _mm512_cvtps_ph(_mm512_loadu_ps(src + i + 32), F16_RNE);
        __m256i d = _mm512_cvtps_ph(_mm512_loadu_ps(src + i + 48), F16_RNE);
        store_512(dst + i, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1), streaming);
        store_512(dst + i + 32, _mm512_inserti64x4(_mm512_castsi256_si512(c), d, 1), streaming);
    }
    return i;
}

TARGET_AVX512 static void f32_to_f16_avx512(int64_t n, const float *src, uint16_t *dst)
{
    int64_t i, head = stream_head(n, 4, 2, dst);
    if (head >= 0) {
        for (i = 0; i < head; i += 16) /* up to 31 */
            f32_to_f16_512_part(head - i < 16 ? head - i : 16, src + i, dst + i);
        i = f32_to_f16_512_body(head, n, src, dst, 1);
        _mm_sfence();
    } else {
        i = f32_to_f16_512_body(0, n, src, dst, 0);
    }
    for (; i < n; i += 16)
        f32_to_f16_512_part(n - i, src + i, dst + i);
}

/* m <= 16 elements. */
INLINE_AVX512 void f16_to_f32_512_part(int64_t m, const uint16_t *src, float *dst)
{
    __mmask16 k = m >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << m) - 1);
    _mm512_mask_storeu_ps(dst, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src)));
}

INLINE_AVX512 int64_t f16_to_f32_512_body(int64_t i, int64_t n, const uint16_t *src, float *dst,
                                          int streaming)
{
    for (; i + 64 <= n; i += 64) {
        __m512i h0 = _mm512_loadu_si512(src + i), h1 = _mm512_loadu_si512(src + i + 32);
        __m512 a = _mm512_cvtph_ps(_mm512_castsi512_si256(h0));
        __m512 b = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h0, 1));
        __m512 c = _mm512_cvtph_ps(_mm512_castsi512_si256(h1));
        __m512 d = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h1, 1));
        store_512(dst + i, _mm512_castps_si512(a), streaming);
        store_512(dst + i + 16, _mm512_castps_si512(b), streaming);
        store_512(dst + i + 32, _mm512_castps_si512(c), streaming);
        store_512(dst + i + 48, _mm512_castps_si512(d), streaming);
    }
    return i;
}

TARGET_AVX512 static void f16_to_f32_avx512(int64_t n, const uint16_t *src, float *dst)
{
    int64_t i, head = stream_head(n, 2, 4, dst);
    if (head >= 0) {
        f16_to_f32_512_part(head, src, dst);
        i = f16_to_f32_512_body(head, n, src, dst, 1);
        _mm_sfence();
    } else {
        i = f16_to_f32_512_body(0, n, src, dst, 0);
    }
    for (; i < n; i += 16)
        f16_to_f32_512_part(n - i, src + i, dst + i);
}

/* ---- AVX2 (bf16) and F16C (f16): 8 lanes, scalar tails, ordinary stores ----------------- */
#define TARGET_AVX2 __attribute__((target("avx2")))
#define TARGET_F16C __attribute__((target("avx,f16c")))

/* 8 f32 bit patterns -> the bf16 results in the low halves of 32-bit words. */
TARGET_AVX2 static inline __m256i bf16_round_256(__m256i u)
{
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    return _mm256_srli_epi32(r, 16);
}

TARGET_AVX2 static void f32_to_bf16_avx2(int64_t n, const float *src, uint16_t *dst)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = bf16_round_256(_mm256_loadu_si256((const void *)(src + i)));
        __m256i b = bf16_round_256(_mm256_loadu_si256((const void *)(src + i + 8)));
        /* packus is per 128-bit lane: a0 b0 a1 b1 -> a0 a1 b0 b1 */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
        _mm256_storeu_si256((void *)(dst + i), p);
    }
    f32_to_bf16_portable(n - i, src + i, dst + i);
}

TARGET_AVX2 static void bf16_to_f32_avx2(int64_t n, const uint16_t *src, float *dst)
{
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x400000);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const void *)(src + i));
        __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
        u = _mm256_or_si256(u, _mm256_and_si256(nan, quiet));
        _mm256_storeu_si256((void *)(dst + i), u);
    }
    bf16_to_f32_portable(n - i, src + i, dst + i);
}

TARGET_F16C static void f32_to_f16_f16c(int64_t n, const float *src, uint16_t *dst)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), F16_RNE);
        __m128i b = _mm256_cvtps_ph(_mm256_loadu_ps(src + i + 8), F16_RNE);
        _mm_storeu_si128((void *)(dst + i), a);
        _mm_storeu_si128((void *)(dst + i + 8), b);
    }
    f32_to_f16_portable(n - i, src + i, dst + i);
}

TARGET_F16C static void f16_to_f32_f16c(int64_t n, const uint16_t *src, float *dst)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm_loadu_si128((const void *)(src + i));
        __m128i b = _mm_loadu_si128((const void *)(src + i + 8));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(a));
        _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(b));
    }
    f16_to_f32_portable(n - i, src + i, dst + i);
}
#endif /* X86_PATHS */

/* ---- dispatch ------------------------------------------------------------------------- */

static void f32_to_f16(int64_t n, const float *src, uint16_t *dst)
{
#if X86_PATHS
    if (have_avx512()) {
        f32_to_f16_avx512(n, src, dst);
        return;
    }
    if (have_f16c()) {
        f32_to_f16_f16c(n, src, dst);
        return;
    }
#endif
    f32_to_f16_portable(n, src, dst);
}

static void f16_to_f32(int64_t n, const uint16_t *src, float *dst)
{
#if X86_PATHS
    if (have_avx512()) {
        f16_to_f32_avx512(n, src, dst);
        return;
    }
    if (have_f16c()) {
        f16_to_f32_f16c(n, src, dst);
        return;
    }
#endif
    f16_to_f32_portable(n, src, dst);
}

static void f32_to_bf16(int64_t n, const float *src, uint16_t *dst)
{
#if X86_PATHS
    if (have_avx512_bf16()) {
        f32_to_bf16_avx512_bf16(n, src, dst);
        return;
    }
    if (have_avx512()) {
        f32_to_bf16_avx512(n, src, dst);
        return;
    }
    if (have_avx2()) {
        f32_to_bf16_avx2(n, src, dst);
        return;
    }
#endif
    f32_to_bf16_portable(n, src, dst);
}

static void bf16_to_f32(int64_t n, const uint16_t *src, float *dst)
{
#if X86_PATHS
    if (have_avx512()) {
        bf16_to_f32_avx512(n, src, dst);
        return;
    }
    if (have_avx2()) {
        bf16_to_f32_avx2(n, src, dst);
        return;
    }
#endif
    bf16_to_f32_portable(n, src, dst);
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
