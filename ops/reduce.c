/* Local reductions: sum, max, mean, squared L2 norm of a buffer (f64 accumulation in eight
 * lanes), reductions over one axis, inf/NaN detection in f32, f16, bf16 and f64, and the f64
 * sum of squares of any float buffer (the ZeRO optimizer's norm). */
#include <math.h>
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

#define LANES 8

static dt_status check_full(const char *op, int64_t n, const float *x, const float *out)
{
    const void *p[] = {x};
    dt_status st = dt__kcheck(op, n, 1, p);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL output", op);
    return st;
}

static double sum_f64(int64_t n, const float *x, int squares)
{
    double acc[LANES] = {0};
    int64_t i = 0;
    if (squares) {
        for (; i + LANES <= n; i += LANES)
            for (int j = 0; j < LANES; j++)
                acc[j] += (double)x[i + j] * (double)x[i + j];
        for (; i < n; i++)
            acc[0] += (double)x[i] * (double)x[i];
    } else {
        for (; i + LANES <= n; i += LANES)
            for (int j = 0; j < LANES; j++)
                acc[j] += (double)x[i + j];
        for (; i < n; i++)
            acc[0] += (double)x[i];
    }
    double s = 0.0;
    for (int j = 0; j < LANES; j++)
        s += acc[j];
    return s;
}

dt_status dt_kernel_sum(int64_t n, const float *x, float *out)
{
    dt_status st = check_full("dt_kernel_sum", n, x, out);
    if (st != DT_OK)
        return st;
    *out = (float)sum_f64(n, x, 0);
    return DT_OK;
}

dt_status dt_kernel_mean(int64_t n, const float *x, float *out)
{
    dt_status st = check_full("dt_kernel_mean", n, x, out);
    if (st != DT_OK)
        return st;
    *out = n == 0 ? NAN : (float)(sum_f64(n, x, 0) / (double)n);
    return DT_OK;
}

dt_status dt_kernel_sq_norm(int64_t n, const float *x, float *out)
{
    dt_status st = check_full("dt_kernel_sq_norm", n, x, out);
    if (st != DT_OK)
        return st;
    *out = (float)sum_f64(n, x, 1);
    return DT_OK;
}

dt_status dt_kernel_max(int64_t n, const float *x, float *out)
{
    dt_status st = check_full("dt_kernel_max", n, x, out);
    if (st != DT_OK)
        return st;
    float m = -INFINITY;
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    *out = nan ? NAN : m;
    return DT_OK;
}

static float identity_of(dt_reduce_op op)
{
    switch (op) {
    case DT_REDUCE_MAX: return -INFINITY;
    case DT_REDUCE_MIN: return INFINITY;
    default: return 0.0f;
    }
}

/* The max (is_max) or min of n >= 1 contiguous floats, bit for bit what the row-order loop of
 * dt_kernel_reduce_axis gives: 16 running extremes first; where that loop's answer depends on
 * the order (a NaN: it keeps the last one's payload; a zero extreme: the first of +0 and -0
 * it meets) the row-order loop itself. */
static float row_extreme(int64_t n, const float *x, int is_max)
{
    enum { W = 16 };
    float acc[W];
    int nan = 0;
    for (int j = 0; j < W; j++)
        acc[j] = is_max ? -INFINITY : INFINITY;
    int64_t i = 0;
    if (is_max)
        for (; i + W <= n; i += W)
            for (int j = 0; j < W; j++) {
                acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
                nan |= x[i + j] != x[i + j];
            }
    else
        for (; i + W <= n; i += W)
            for (int j = 0; j < W; j++) {
                acc[j] = x[i + j] < acc[j] ? x[i + j] : acc[j];
                nan |= x[i + j] != x[i + j];
            }
    float m = acc[0];
    for (int j = 1; j < W; j++)
        m = (is_max ? acc[j] > m : acc[j] < m) ? acc[j] : m;
    for (; i < n; i++) {
        m = (is_max ? x[i] > m : x[i] < m) ? x[i] : m;
        nan |= x[i] != x[i];
    }
    if (!nan && m != 0.0f)
        return m;
    m = is_max ? -INFINITY : INFINITY;
    for (i = 0; i < n; i++)
        m = ((is_max ? x[i] > m : x[i] < m) || x[i] != x[i]) ? x[i] : m;
    return m;
}

dt_status dt_kernel_reduce_axis(dt_reduce_op op, int64_t outer, int64_t len, int64_t inner,
                                const float *x, float *y)
{
    if (op != DT_REDUCE_SUM && op != DT_REDUCE_MAX && op != DT_REDUCE_MIN &&
        op != DT_REDUCE_AVG)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_reduce_axis: bad reduction %d",
                         (int)op);
    if (outer < 0 || len < 0 || inner < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_reduce_axis: negative size "
                         "[%lld, %lld, %lld]", (long long)outer, (long long)len,
                         (long long)inner);
    if (outer > 0 && inner > 0 && (!y || (len > 0 && !x)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_reduce_axis: NULL pointer");
    float init = identity_of(op);
    if (inner == 1 && len > 0 && (op == DT_REDUCE_MAX || op == DT_REDUCE_MIN)) {
        /* Row extremes (the cross-entropy's row max over the vocabulary): lanes, not one
         * chain of compares. */
        for (int64_t o = 0; o < outer; o++)
            y[o] = row_extreme(len, x + o * len, op == DT_REDUCE_MAX);
        return DT_OK;
    }
    for (int64_t o = 0; o < outer; o++) {
        float *yo = y + o * inner;
        const float *xo = x ? x + o * len * inner : NULL;
        for (int64_t j = 0; j < inner; j++)
            yo[j] = init;
        for (int64_t l = 0; l < len; l++) {
            const float *row = xo + l * inner;
            switch (op) {
            case DT_REDUCE_MAX:
                for (int64_t j = 0; j < inner; j++)
                    yo[j] = (row[j] > yo[j] || row[j] != row[j]) ? row[j] : yo[j];
                break;
            case DT_REDUCE_MIN:
                for (int64_t j = 0; j < inner; j++)
                    yo[j] = (row[j] < yo[j] || row[j] != row[j]) ? row[j] : yo[j];
                break;
            default:
                for (int64_t j = 0; j < inner; j++)
                    yo[j] += row[j];
                break;
            }
        }
        if (op == DT_REDUCE_AVG) {
            float inv = len > 0 ? 1.0f / (float)len : NAN;
            for (int64_t j = 0; j < inner; j++)
                yo[j] = len > 0 ? yo[j] * inv : NAN;
        }
    }
    return DT_OK;
}

/* Whether any element has an all-ones exponent: `mask` selects the exponent bits. */
#define NONFINITE_LOOP(type, mask)                                                          \
    do {                                                                                    \
        const unsigned char *bytes = x;                                                     \
        for (int64_t i = 0; i < n; i++) {                                                   \
            type u;                                                                         \
            memcpy(&u, bytes + i * (int64_t)sizeof u, sizeof u);                            \
            found |= (u & (mask)) == (mask);                                                \
        }                                                                                   \
    } while (0)

dt_status dt_kernel_nonfinite(int64_t n, const void *x, dt_dtype dtype, int32_t *found_out)
{
    const void *p[] = {x};
    dt_status st = dt__kcheck("dt_kernel_nonfinite", n, 1, p);
    if (st != DT_OK)
        return st;
    if (!found_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_nonfinite: NULL found_out");
    int found = 0;
    switch (dtype) {
    case DT_DTYPE_F32: NONFINITE_LOOP(uint32_t, 0x7f800000u); break;
    case DT_DTYPE_F64: NONFINITE_LOOP(uint64_t, 0x7ff0000000000000ull); break;
    case DT_DTYPE_F16: NONFINITE_LOOP(uint16_t, 0x7c00u); break;
    case DT_DTYPE_BF16: NONFINITE_LOOP(uint16_t, 0x7f80u); break;
    default:
        return dt__error(DT_ERR_UNSUPPORTED, "dt_kernel_nonfinite: dtype %s (f32, f64, f16 or "
                         "bf16 expected)", dt_dtype_name(dtype));
    }
    *found_out = found;
    return DT_OK;
}

/* Elements widened to f32 at a time for a 16-bit sq_sum_f64 (a multiple of 4, so only the
 * last block has a tail and the lanes see the elements as one pass would). */
#define SQ_BLOCK 1024

dt_status dt__kernel_sq_sum_f64(int64_t n, const void *x, dt_dtype dtype, double *out)
{
    static const char op[] = "dt__kernel_sq_sum_f64";
    const void *p[] = {x};
    dt_status st = dt__kcheck(op, n, 1, p);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL output", op);
    if (st == DT_OK && dtype != DT_DTYPE_F32 && dtype != DT_DTYPE_F16 && dtype != DT_DTYPE_BF16)
        st = dt__error(DT_ERR_UNSUPPORTED, "%s: dtype %s (f32, f16 or bf16 expected)", op,
                       dt_dtype_name(dtype));
    if (st != DT_OK)
        return st;
    float buf[SQ_BLOCK];
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int64_t block = dtype == DT_DTYPE_F32 ? (n > 0 ? n : 1) : SQ_BLOCK;
    for (int64_t at = 0; at < n; at += block) {
        int64_t b = n - at < block ? n - at : block;
        const float *f = (const float *)x + at;
        if (dtype != DT_DTYPE_F32) {
            st = dt_kernel_cast(b, (const char *)x + (size_t)at * 2, dtype, buf, DT_DTYPE_F32);
            if (st != DT_OK)
                return st;
            f = buf;
        }
        int64_t e = 0;
        for (; e + 4 <= b; e += 4) {
            s0 += (double)f[e] * f[e];
            s1 += (double)f[e + 1] * f[e + 1];
            s2 += (double)f[e + 2] * f[e + 2];
            s3 += (double)f[e + 3] * f[e + 3];
        }
        for (; e < b; e++)
            s0 += (double)f[e] * f[e];
    }
    *out = (s0 + s1) + (s2 + s3);
    return DT_OK;
}
