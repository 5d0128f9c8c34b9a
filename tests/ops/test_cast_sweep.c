/* dt_kernel_cast against a reference rounding written here in double arithmetic (frexp, ldexp,
 * nearbyint): special values by hand, every f16 and bf16 bit pattern, a sweep of f32 patterns
 * with every exponent's rounding boundaries, f64 through f32, every short length and
 * alignment. All of it once per kernel path (AVX-512 with and without BF16 and streaming
 * stores, AVX2/F16C, portable). No runtime. */
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ops/ops_impl.h"

/* A binary format: p significand bits (hidden bit included), exponent range, exponent bits. */
typedef struct fmt {
    const char *name;
    int p, emin, emax, ebits;
} fmt;

static const fmt F16 = {"f16", 11, -14, 15, 5};
static const fmt BF16 = {"bf16", 8, -126, 127, 8};
static const fmt F32 = {"f32", 24, -126, 127, 8};

/* x (finite or infinite, not NaN) rounded to nearest even in f; overflow gives infinity. */
static double ref_round(double x, fmt f)
{
    if (x == 0.0 || isinf(x))
        return x;
    int e;
    frexp(fabs(x), &e);
    int E = e - 1 < f.emin ? f.emin : e - 1;       /* exponent of the quantum's binade */
    double q = ldexp(1.0, E - (f.p - 1));          /* spacing of f's values there */
    double r = nearbyint(fabs(x) / q) * q;         /* exact scaling; ties to even */
    double maxf = ldexp(2.0 - ldexp(1.0, 1 - f.p), f.emax);
    if (r > maxf)
        r = INFINITY;
    return copysign(r, x);
}

/* Bits of v in f (v must be a value of f, an infinity or a zero). */
static uint32_t ref_encode(double v, fmt f)
{
    int mbits = f.p - 1, bias = f.emax;
    uint32_t sign = signbit(v) ? (uint32_t)1 << (mbits + f.ebits) : 0;
    double a = fabs(v);
    if (isinf(a))
        return sign | ((((uint32_t)1 << f.ebits) - 1) << mbits);
    if (a == 0.0)
        return sign;
    int e;
    double m = frexp(a, &e);
    if (e - 1 < f.emin)                            /* subnormal: a multiple of the quantum */
        return sign | (uint32_t)(a / ldexp(1.0, f.emin - mbits));
    uint32_t man = (uint32_t)ldexp(2.0 * m - 1.0, mbits);
    return sign | ((uint32_t)(e - 1 + bias) << mbits) | man;
}

/* Value of bits h of f (not a NaN). */
static double ref_decode(uint32_t h, fmt f)
{
    int mbits = f.p - 1, bias = f.emax;
    uint32_t man = h & (((uint32_t)1 << mbits) - 1);
    uint32_t ex = (h >> mbits) & (((uint32_t)1 << f.ebits) - 1);
    int neg = (h >> (mbits + f.ebits)) & 1;
    double v;
    if (ex == ((uint32_t)1 << f.ebits) - 1)
        v = INFINITY;
    else if (ex == 0)
        v = ldexp((double)man, f.emin - mbits);
    else
        v = ldexp(1.0 + ldexp((double)man, -mbits), (int)ex - bias);
    return neg ? -v : v;
}

static int is_nan_bits(uint32_t h, fmt f)
{
    int mbits = f.p - 1;
    uint32_t emask = ((uint32_t)1 << f.ebits) - 1;
    return ((h >> mbits) & emask) == emask && (h & (((uint32_t)1 << mbits) - 1)) != 0;
}

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static dt_dtype dtype_of(fmt f)
{
    return f.p == 11 ? DT_DTYPE_F16 : DT_DTYPE_BF16;
}

/* What casting the f32 with bits u to f must give: the reference rounding, or for a NaN a
 * quiet NaN with the sign and the top payload bits. */
static uint32_t expect_from_f32(uint32_t u, fmt f)
{
    int mbits = f.p - 1;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        uint32_t sign = (u >> 31) << (mbits + f.ebits);
        uint32_t emask = (((uint32_t)1 << f.ebits) - 1) << mbits;
        uint32_t payload = (u & 0x7fffffu) >> (23 - mbits);
        return sign | emask | ((uint32_t)1 << (mbits - 1)) | payload;
    }
    return ref_encode(ref_round((double)bits_f32(u), f), f);
}

/* Casts n f32 patterns to f and counts results that differ from expect_from_f32. */
static int64_t check_f32_patterns(const uint32_t *pat, int64_t n, fmt f)
{
    float *src = malloc((size_t)n * 4);
    uint16_t *dst = malloc((size_t)n * 2);
    CU_ASSERT_FATAL(src && dst);
    for (int64_t i = 0; i < n; i++)
        src[i] = bits_f32(pat[i]);
    DT_ASSERT_OK(dt_kernel_cast(n, src, DT_DTYPE_F32, dst, dtype_of(f)));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t want = expect_from_f32(pat[i], f);
        if (dst[i] != want) {
            if (bad < 8)
                fprintf(stderr, "f32 0x%08x (%.9g) -> %s: got 0x%04x, want 0x%04x\n",
                        (unsigned)pat[i], (double)src[i], f.name, dst[i], (unsigned)want);
            bad++;
        }
    }
    free(src), free(dst);
    return bad;
}

/* ---- special values, by hand --------------------------------------------------------- */

typedef struct special {
    uint32_t f32;     /* input bits */
    uint16_t f16, bf16;
} special;

static void test_cast_special_values_to_f16_and_bf16(void)
{
    const special cases[] = {
        {0x00000000u, 0x0000, 0x0000},             /* +0 */
        {0x80000000u, 0x8000, 0x8000},             /* -0 */
        {0x7f800000u, 0x7c00, 0x7f80},             /* +inf */
        {0xff800000u, 0xfc00, 0xff80},             /* -inf */
        {0x7fc00000u, 0x7e00, 0x7fc0},             /* quiet NaN */
        {0xffc00000u, 0xfe00, 0xffc0},             /* negative quiet NaN */
        {0x7fc12345u, 0x7e09, 0x7fc1},             /* quiet NaN, payload 0x12345 */
        {0x7f800001u, 0x7e00, 0x7fc0},             /* signalling NaN, payload only low */
        {0xff812345u, 0xfe09, 0xffc1},             /* signalling NaN with payload */
        {0x7fbfffffu, 0x7fff, 0x7fff},             /* signalling NaN, all payload bits */
        {0x3f800000u, 0x3c00, 0x3f80},             /* 1 */
        {0x477fe000u, 0x7bff, 0x4780},             /* 65504: largest finite f16 */
        {0x477fefffu, 0x7bff, 0x4780},             /* just under 65520: stays finite */
        {0x477ff000u, 0x7c00, 0x4780},             /* 65520: tie, to even = inf */
        {0x47800000u, 0x7c00, 0x4780},             /* 65536 */
        {0x7f7fffffu, 0x7c00, 0x7f80},             /* FLT_MAX: inf in both */
        {0x7f7f0000u, 0x7c00, 0x7f7f},             /* largest finite bf16 */
        {0x7f7f7fffu, 0x7c00, 0x7f7f},             /* just under its rounding point */
        {0x7f7f8000u, 0x7c00, 0x7f80},             /* tie above max bf16: inf */
        {0x38800000u, 0x0400, 0x3880},             /* 2^-14: smallest normal f16 */
        {0x387fc000u, 0x03ff, 0x3880},             /* 1023 * 2^-24: largest f16 subnormal */
        {0x33800000u, 0x0001, 0x3380},             /* 2^-24: smallest f16 subnormal */
        {0x33000000u, 0x0000, 0x3300},             /* 2^-25: tie between 0 and 2^-24 -> 0 */
        {0x33000001u, 0x0001, 0x3300},             /* just above: 2^-24 */
        {0x32ffffffu, 0x0000, 0x3300},             /* just below 2^-25 */
        {0x33c00000u, 0x0002, 0x33c0},             /* 3 * 2^-25: tie 1|2 -> 2 */
        {0x34200000u, 0x0002, 0x3420},             /* 5 * 2^-25: tie 2|3 -> 2 */
        {0x34400000u, 0x0003, 0x3440},             /* 3 * 2^-24: exactly 3 quanta */
        {0x33a00000u, 0x0001, 0x33a0},             /* 5 * 2^-26: 1.25 quanta -> 1 */
        {0x3f801000u, 0x3c00, 0x3f80},             /* 1 + 2^-11: tie -> 1 */
        {0x3f803000u, 0x3c02, 0x3f80},             /* 1 + 3 * 2^-11: tie -> even 2 */
        {0x3f801001u, 0x3c01, 0x3f80},             /* above the tie */
        {0x3f808000u, 0x3c04, 0x3f80},             /* 1 + 2^-8: bf16 tie -> 1 */
        {0x3f818000u, 0x3c0c, 0x3f82},             /* 1 + 3 * 2^-8: bf16 tie -> even */
        {0x3f808001u, 0x3c04, 0x3f81},             /* above the bf16 tie */
        {0x00000001u, 0x0000, 0x0000},             /* 2^-149: smallest f32 subnormal */
        {0x00010000u, 0x0000, 0x0001},             /* 2^-133: smallest bf16 subnormal */
        {0x00008000u, 0x0000, 0x0000},             /* 2^-134: bf16 tie -> 0 */
        {0x00018000u, 0x0000, 0x0002},             /* 3 * 2^-134: tie -> even 2 */
        {0x807fffffu, 0x8000, 0x8080},             /* largest f32 subnormal, negative */
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        float x = bits_f32(cases[i].f32);
        uint16_t h = 0xdead, b = 0xdead;
        DT_ASSERT_OK(dt_kernel_cast(1, &x, DT_DTYPE_F32, &h, DT_DTYPE_F16));
        DT_ASSERT_OK(dt_kernel_cast(1, &x, DT_DTYPE_F32, &b, DT_DTYPE_BF16));
        if (h != cases[i].f16 || b != cases[i].bf16)
            fprintf(stderr, "case %d: f32 0x%08x -> f16 0x%04x (want 0x%04x), bf16 0x%04x "
                    "(want 0x%04x)\n", i, (unsigned)cases[i].f32, h, cases[i].f16, b,
                    cases[i].bf16);
        CU_ASSERT_EQUAL(h, cases[i].f16);
        CU_ASSERT_EQUAL(b, cases[i].bf16);
        /* The hand-worked table agrees with the reference rounding too. */
        CU_ASSERT_EQUAL(expect_from_f32(cases[i].f32, F16), cases[i].f16);
        CU_ASSERT_EQUAL(expect_from_f32(cases[i].f32, BF16), cases[i].bf16);
    }
}

static void test_cast_special_values_widen_exactly(void)
{
    const struct {
        uint16_t h;
        dt_dtype t;
        double v;
    } cases[] = {
        {0x0000, DT_DTYPE_F16, 0.0},        {0x8000, DT_DTYPE_F16, -0.0},
        {0x7c00, DT_DTYPE_F16, INFINITY},   {0xfc00, DT_DTYPE_F16, -INFINITY},
        {0x0001, DT_DTYPE_F16, 0x1p-24},    {0x03ff, DT_DTYPE_F16, 1023 * 0x1p-24},
        {0x0400, DT_DTYPE_F16, 0x1p-14},    {0x7bff, DT_DTYPE_F16, 65504.0},
        {0x3c01, DT_DTYPE_F16, 1 + 0x1p-10}, {0xc000, DT_DTYPE_F16, -2.0},
        {0x0000, DT_DTYPE_BF16, 0.0},       {0x8000, DT_DTYPE_BF16, -0.0},
        {0x7f80, DT_DTYPE_BF16, INFINITY},  {0xff80, DT_DTYPE_BF16, -INFINITY},
        {0x0001, DT_DTYPE_BF16, 0x1p-133},  {0x7f7f, DT_DTYPE_BF16, 0x1.fep127},
        {0x3f81, DT_DTYPE_BF16, 1 + 0x1p-7}, {0x0080, DT_DTYPE_BF16, 0x1p-126},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float f = 0.0f;
        double d = 0.0;
        DT_ASSERT_OK(dt_kernel_cast(1, &cases[i].h, cases[i].t, &f, DT_DTYPE_F32));
        DT_ASSERT_OK(dt_kernel_cast(1, &cases[i].h, cases[i].t, &d, DT_DTYPE_F64));
        CU_ASSERT((double)f == cases[i].v && !signbit(f) == !signbit(cases[i].v));
        CU_ASSERT(d == cases[i].v && !signbit(d) == !signbit(cases[i].v));
    }
    /* NaNs come out quiet with sign and payload: f16 0x7d55 (signalling, payload 0x155). */
    uint16_t snan[2] = {0x7d55, 0xff81};
    float f[2];
    DT_ASSERT_OK(dt_kernel_cast(1, &snan[0], DT_DTYPE_F16, &f[0], DT_DTYPE_F32));
    DT_ASSERT_OK(dt_kernel_cast(1, &snan[1], DT_DTYPE_BF16, &f[1], DT_DTYPE_F32));
    CU_ASSERT_EQUAL(f32_bits(f[0]), 0x7fc00000u | (0x155u << 13));
    CU_ASSERT_EQUAL(f32_bits(f[1]), 0xffc10000u);
}

/* ---- every 16-bit pattern ------------------------------------------------------------- */

/* Widening every pattern of f is exact (the reference decoding), NaNs come out as quiet NaNs
 * with sign and payload, and narrowing back gives the pattern again (NaNs: made quiet). */
static void check_every_pattern(fmt f)
{
    uint16_t *h = malloc(65536 * 2), *back = malloc(65536 * 2);
    float *w = malloc(65536 * 4);
    double *d = malloc(65536 * 8);
    CU_ASSERT_FATAL(h && back && w && d);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    DT_ASSERT_OK(dt_kernel_cast(65536, h, dtype_of(f), w, DT_DTYPE_F32));
    DT_ASSERT_OK(dt_kernel_cast(65536, w, DT_DTYPE_F32, back, dtype_of(f)));
    DT_ASSERT_OK(dt_kernel_cast(65536, h, dtype_of(f), d, DT_DTYPE_F64));
    int mbits = f.p - 1;
    uint16_t quiet = (uint16_t)(1u << (mbits - 1));
    int64_t bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        int ok;
        uint32_t u = f32_bits(w[i]);
        if (is_nan_bits(i, f)) {
            uint32_t sign = (i >> 15) << 31;
            uint32_t want = sign | 0x7fc00000u | ((i & ((1u << mbits) - 1)) << (23 - mbits));
            ok = u == want && back[i] == (i | quiet) && isnan(d[i]) &&
                 !signbit(d[i]) == !sign;
        } else {
            double v = ref_decode(i, f);
            ok = (double)w[i] == v && !signbit(w[i]) == !signbit(v) && back[i] == i &&
                 d[i] == v && !signbit(d[i]) == !signbit(v);
        }
        if (!ok) {
            if (bad < 8)
                fprintf(stderr, "%s 0x%04x: f32 0x%08x, back 0x%04x, f64 %.17g\n", f.name,
                        (unsigned)i, (unsigned)u, back[i], d[i]);
            bad++;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    free(h), free(back), free(w), free(d);
}

static void test_cast_every_f16_pattern_widens_exactly_and_round_trips(void)
{
    check_every_pattern(F16);
}

static void test_cast_every_bf16_pattern_widens_exactly_and_round_trips(void)
{
    check_every_pattern(BF16);
}

/* f16 <-> bf16 directly: every pattern, rounded as the reference rounds its value. */
static void test_cast_between_f16_and_bf16_every_pattern(void)
{
    uint16_t *h = malloc(65536 * 2), *o = malloc(65536 * 2);
    CU_ASSERT_FATAL(h && o);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    for (int dir = 0; dir < 2; dir++) {
        fmt from = dir ? BF16 : F16, to = dir ? F16 : BF16;
        DT_ASSERT_OK(dt_kernel_cast(65536, h, dtype_of(from), o, dtype_of(to)));
        int64_t bad = 0;
        for (uint32_t i = 0; i < 65536; i++) {
            uint32_t want;
            if (is_nan_bits(i, from)) {
                /* Through f32: quiet, payload truncated from the top. */
                int fm = from.p - 1, tm = to.p - 1;
                uint32_t pay = i & ((1u << fm) - 1);
                pay = fm > tm ? pay >> (fm - tm) : pay << (tm - fm);
                want = ((i >> 15) << 15) | ((((1u << to.ebits) - 1)) << tm) |
                       (1u << (tm - 1)) | pay;
            } else {
                want = ref_encode(ref_round(ref_decode(i, from), to), to);
            }
            if (o[i] != want) {
                if (bad < 8)
                    fprintf(stderr, "%s 0x%04x -> %s: got 0x%04x, want 0x%04x\n", from.name,
                            (unsigned)i, to.name, o[i], (unsigned)want);
                bad++;
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
    free(h), free(o);
}

/* ---- f32 patterns --------------------------------------------------------------------- */

/* Every 4099th f32 pattern (4099 is prime: every exponent and mantissa residue is hit). */
static void test_cast_f32_sweep_to_f16_and_bf16_matches_reference(void)
{
    int64_t n = (((int64_t)1 << 32) + 4098) / 4099;
    uint32_t *pat = malloc((size_t)n * 4);
    CU_ASSERT_FATAL(pat != NULL);
    for (int64_t i = 0; i < n; i++)
        pat[i] = (uint32_t)(i * 4099);
    CU_ASSERT_EQUAL(check_f32_patterns(pat, n, F16), 0);
    CU_ASSERT_EQUAL(check_f32_patterns(pat, n, BF16), 0);
    free(pat);
}

/* For every exponent and sign, mantissas around every bit position: a lone bit, all ones
 * below it, one above, and the odd/even ties 0b11 << k and their neighbours, so the rounding
 * point of each target (normal and subnormal) is met exactly, just below and just above. */
static void test_cast_f32_exponent_boundaries_match_reference(void)
{
    int64_t cap = 2 * 256 * (23 * 6 + 2), n = 0;
    uint32_t *pat = malloc((size_t)cap * 4);
    CU_ASSERT_FATAL(pat != NULL);
    for (uint32_t s = 0; s < 2; s++)
        for (uint32_t e = 0; e < 256; e++) {
            uint32_t base = (s << 31) | (e << 23);
            pat[n++] = base;
            pat[n++] = base | 0x7fffffu;
            for (int k = 0; k < 23; k++) {
                uint32_t bit = 1u << k, tie = (3u << k) & 0x7fffffu;
                uint32_t m[6] = {bit, bit - 1, bit + 1, tie, tie - 1, tie + 1};
                for (int j = 0; j < 6; j++)
                    pat[n++] = base | (m[j] & 0x7fffffu);
            }
        }
    CU_ASSERT_EQUAL(n, cap);
    CU_ASSERT_EQUAL(check_f32_patterns(pat, n, F16), 0);
    CU_ASSERT_EQUAL(check_f32_patterns(pat, n, BF16), 0);
    free(pat);
}

/* ---- f64 ---------------------------------------------------------------------------- */

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* f64 -> f32 rounds once (reference with f32's format); f64 -> f16/bf16 rounds twice, to f32
 * and then to the target, as documented; f32 -> f64 is exact. Random bit patterns (NaNs and
 * subnormals among them) and values near the limits of every format. */
static void test_cast_f64_matches_reference_through_f32(void)
{
    enum { NV = 300000 };
    double *d = malloc(NV * 8), *back = malloc(NV * 8);
    float *f = malloc(NV * 4);
    uint16_t *h = malloc(NV * 2), *b = malloc(NV * 2);
    CU_ASSERT_FATAL(d && back && f && h && b);
    for (int i = 0; i < NV; i++) {
        uint64_t u = next_u64();
        if (i % 2 == 0) {
            memcpy(&d[i], &u, 8);
        } else {
            /* 40-bit significands at exponents from f32's subnormals to beyond its max. */
            double m = (double)(u >> 24) * 0x1p-40;
            d[i] = ldexp(u & 1 ? -m : m, (int)((u >> 1) % 320) - 170);
        }
    }
    d[0] = 1 + 0x1p-11 + 0x1p-40; /* to f16 directly: 1 + 2^-10; through f32: a tie, so 1 */
    DT_ASSERT_OK(dt_kernel_cast(NV, d, DT_DTYPE_F64, f, DT_DTYPE_F32));
    DT_ASSERT_OK(dt_kernel_cast(NV, d, DT_DTYPE_F64, h, DT_DTYPE_F16));
    DT_ASSERT_OK(dt_kernel_cast(NV, d, DT_DTYPE_F64, b, DT_DTYPE_BF16));
    DT_ASSERT_OK(dt_kernel_cast(NV, f, DT_DTYPE_F32, back, DT_DTYPE_F64));
    CU_ASSERT_EQUAL(h[0], 0x3c00);
    int64_t bad = 0;
    for (int i = 0; i < NV; i++) {
        uint32_t want32;
        if (isnan(d[i])) {
            uint64_t u;
            memcpy(&u, &d[i], 8);
            want32 = (uint32_t)(u >> 63) << 31 | 0x7fc00000u |
                     (uint32_t)((u >> 29) & 0x7fffffu);
        } else {
            want32 = ref_encode(ref_round(d[i], F32), F32);
        }
        int ok = f32_bits(f[i]) == want32 && h[i] == expect_from_f32(want32, F16) &&
                 b[i] == expect_from_f32(want32, BF16);
        ok = ok && (isnan(f[i]) ? isnan(back[i]) : back[i] == (double)f[i]);
        if (!ok) {
            if (bad < 8)
                fprintf(stderr, "f64 %a: f32 0x%08x (want 0x%08x), f16 0x%04x, bf16 0x%04x\n",
                        d[i], (unsigned)f32_bits(f[i]), (unsigned)want32, h[i], b[i]);
            bad++;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    free(d), free(back), free(f), free(h), free(b);
}

/* ---- every length and alignment ------------------------------------------------------- */

/* Bits of the f32 that widening the pattern h of f must give (exact; NaN: quiet, payload). */
static uint32_t expect_widened(uint32_t h, fmt f)
{
    int mbits = f.p - 1;
    if (is_nan_bits(h, f))
        return (h >> (mbits + f.ebits)) << 31 | 0x7fc00000u |
               (h & ((1u << mbits) - 1)) << (23 - mbits);
    return f32_bits((float)ref_decode(h, f));
}

/* Lengths 0..200 from starts 0..3 elements past an aligned address, both directions: the
 * vector bodies, their tails and masked stores, element by element against the reference,
 * and nothing written before the start or after the end. Inputs mix NaNs (quiet and
 * signalling), infinities, subnormals, ties of both targets and random patterns. */
static void test_cast_every_length_and_offset_matches_reference_and_stays_in_bounds(void)
{
    enum { MAXN = 200, OFFS = 4, PAD = 40, TOT = MAXN + OFFS + PAD };
    static const uint32_t specials[] = {
        0x7fc12345u, 0xff812345u, 0x7f800001u, 0x7fbfffffu, 0x7f800000u, 0xff800000u,
        0x00000001u, 0x807fffffu, 0x00018000u, 0x33000000u, 0x387fc000u, 0x3f808000u,
        0x3f818000u, 0x3f801000u, 0x477ff000u, 0x7f7f8000u, 0x80000000u, 0x00000000u,
    };
    enum { NSPECIAL = sizeof specials / sizeof specials[0] };
    float *src = malloc(TOT * 4), *wide = malloc(TOT * 4);
    uint16_t *half = malloc(TOT * 2), *narrow = malloc(TOT * 2);
    CU_ASSERT_FATAL(src && wide && half && narrow);
    for (int i = 0; i < TOT; i++) {
        uint64_t r = next_u64();
        src[i] = bits_f32(i % 3 == 0 ? specials[(i / 3) % NSPECIAL] : (uint32_t)r);
        half[i] = (uint16_t)(r >> 32);
    }
    const fmt *fmts[] = {&F16, &BF16};
    int64_t bad = 0;
    for (int k = 0; k < 2; k++) {
        fmt f = *fmts[k];
        for (int off = 0; off < OFFS; off++)
            for (int n = 0; n <= MAXN; n++) {
                for (int i = 0; i < TOT; i++) {
                    narrow[i] = 0xdead;
                    wide[i] = bits_f32(0xdeadbeefu);
                }
                DT_ASSERT_OK(dt_kernel_cast(n, src + off, DT_DTYPE_F32, narrow + off, dtype_of(f)));
                DT_ASSERT_OK(dt_kernel_cast(n, half + off, dtype_of(f), wide + off, DT_DTYPE_F32));
                for (int i = 0; i < TOT; i++) {
                    int in = i >= off && i < off + n;
                    uint16_t want16 = in ? (uint16_t)expect_from_f32(f32_bits(src[i]), f) : 0xdead;
                    uint32_t want32 = in ? expect_widened(half[i], f) : 0xdeadbeefu;
                    if (narrow[i] != want16 || f32_bits(wide[i]) != want32) {
                        if (bad < 8)
                            fprintf(stderr, "%s n=%d off=%d [%d]: narrow 0x%04x (want 0x%04x), "
                                    "wide 0x%08x (want 0x%08x)\n", f.name, n, off, i,
                                    narrow[i], want16, (unsigned)f32_bits(wide[i]),
                                    (unsigned)want32);
                        bad++;
                    }
                }
            }
    }
    CU_ASSERT_EQUAL(bad, 0);
    free(src), free(wide), free(half), free(narrow);
}

/* A long cast (in the streaming suite with streaming stores from the first 64-byte-aligned
 * element on) gives the same bits as the same cast done in pieces of 4096 elements (checked
 * against the reference above), with the destination one element off alignment. */
static void test_cast_long_run_matches_small_pieces(void)
{
    enum { N = (1 << 20) + 999, PIECE = 4096 };
    float *src = malloc((size_t)N * 4), *wide = malloc((size_t)(N + 1) * 4);
    float *wide2 = malloc((size_t)(N + 1) * 4);
    uint16_t *hsrc = malloc((size_t)N * 2), *half = malloc((size_t)(N + 1) * 2);
    uint16_t *half2 = malloc((size_t)(N + 1) * 2);
    CU_ASSERT_FATAL(src && wide && wide2 && hsrc && half && half2);
    for (int64_t i = 0; i < N; i++) {
        uint64_t r = next_u64();
        src[i] = bits_f32((uint32_t)r);
        hsrc[i] = (uint16_t)(r >> 40);
    }
    const fmt *fmts[] = {&F16, &BF16};
    for (int k = 0; k < 2; k++) {
        dt_dtype t = dtype_of(*fmts[k]);
        DT_ASSERT_OK(dt_kernel_cast(N, src, DT_DTYPE_F32, half + 1, t));
        DT_ASSERT_OK(dt_kernel_cast(N, hsrc, t, wide + 1, DT_DTYPE_F32));
        for (int64_t i = 0; i < N; i += PIECE) {
            int64_t m = N - i < PIECE ? N - i : PIECE;
            DT_ASSERT_OK(dt_kernel_cast(m, src + i, DT_DTYPE_F32, half2 + 1 + i, t));
            DT_ASSERT_OK(dt_kernel_cast(m, hsrc + i, t, wide2 + 1 + i, DT_DTYPE_F32));
        }
        CU_ASSERT(memcmp(half + 1, half2 + 1, (size_t)N * 2) == 0);
        CU_ASSERT(memcmp(wide + 1, wide2 + 1, (size_t)N * 4) == 0);
    }
    free(src), free(wide), free(wide2), free(hsrc), free(half), free(half2);
}

static void test_cast_rejects_other_dtypes_and_bad_sizes(void)
{
    float x = 1.0f;
    int32_t i = 0;
    DT_ASSERT_FAILS(dt_kernel_cast(1, &x, DT_DTYPE_F32, &i, DT_DTYPE_I32), DT_ERR_UNSUPPORTED);
    DT_ASSERT_FAILS(dt_kernel_cast(-1, &x, DT_DTYPE_F32, &x, DT_DTYPE_F16),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_kernel_cast(1, NULL, DT_DTYPE_F32, &x, DT_DTYPE_F16),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(dt_kernel_cast(0, NULL, DT_DTYPE_F32, NULL, DT_DTYPE_F16));
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_cast_special_values_to_f16_and_bf16),
        DT_TEST(test_cast_special_values_widen_exactly),
        DT_TEST(test_cast_every_f16_pattern_widens_exactly_and_round_trips),
        DT_TEST(test_cast_every_bf16_pattern_widens_exactly_and_round_trips),
        DT_TEST(test_cast_between_f16_and_bf16_every_pattern),
        DT_TEST(test_cast_f32_sweep_to_f16_and_bf16_matches_reference),
        DT_TEST(test_cast_f32_exponent_boundaries_match_reference),
        DT_TEST(test_cast_f64_matches_reference_through_f32),
        DT_TEST(test_cast_every_length_and_offset_matches_reference_and_stays_in_bounds),
        DT_TEST(test_cast_long_run_matches_small_pieces),
        DT_TEST(test_cast_rejects_other_dtypes_and_bad_sizes),
        DT_TEST_END,
    };
    if (fegetround() != FE_TONEAREST)
        return 1; /* the reference's nearbyint needs the default rounding mode */
    /* Every kernel path this CPU has: AVX-512 (BF16, then without) with streaming stores
     * at every size, then as configured, AVX2/F16C, the portable loops. */
    static const struct {
        const char *suite;
        int isa;
        int64_t stream_bytes;
    } paths[] = {
        {"cast_sweep_avx512_bf16_streaming", 3, 0},
        {"cast_sweep_avx512_streaming", 2, 0},
        {"cast_sweep_avx512_bf16", 3, -1},
        {"cast_sweep_avx512", 2, -1},
        {"cast_sweep_avx2_f16c", 1, -1},
        {"cast_sweep_portable", 0, -1},
    };
    int failed = 0;
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        dt__cast_tune(paths[i].isa, paths[i].stream_bytes);
        failed |= dt_test_main(argc, argv, paths[i].suite, cases, 0);
    }
    dt__cast_tune(3, -1);
    return failed;
}
