/* Reference values of the family's elementwise ops for the tests of tests/opdef/elem: libm in
 * the operands' precision, as a naive single-device implementation computes them. */
#ifndef DT_ELEM_REF_H
#define DT_ELEM_REF_H

#include <math.h>
#include <string.h>

/* y = op(x) for the unary op `n` (p, q: its scalar operands), in f32 when f32 is set. */
static inline double ref_unary(const char *n, double x, double p, double q, int f32)
{
#define F(fn) (f32 ? (double)fn##f((float)x) : fn(x))
    if (!strcmp(n, "exp")) return F(exp);
    if (!strcmp(n, "log")) return F(log);
    if (!strcmp(n, "log1p")) return F(log1p);
    if (!strcmp(n, "sqrt")) return F(sqrt);
    if (!strcmp(n, "rsqrt")) return f32 ? (double)(1.0f / sqrtf((float)x)) : 1.0 / sqrt(x);
    if (!strcmp(n, "tanh")) return F(tanh);
    if (!strcmp(n, "sigmoid"))
        return f32 ? (double)(1.0f / (1.0f + expf(-(float)x))) : 1.0 / (1.0 + exp(-x));
    if (!strcmp(n, "silu"))
        return f32 ? (double)((float)x / (1.0f + expf(-(float)x))) : x / (1.0 + exp(-x));
    if (!strcmp(n, "neg")) return -x;
    if (!strcmp(n, "abs")) return fabs(x);
    if (!strcmp(n, "sign")) return x > 0 ? 1 : x < 0 ? -1 : x;
    if (!strcmp(n, "square")) return f32 ? (double)((float)x * (float)x) : x * x;
    if (!strcmp(n, "reciprocal")) return f32 ? (double)(1.0f / (float)x) : 1.0 / x;
    if (!strcmp(n, "pow_scalar")) return f32 ? (double)powf((float)x, (float)p) : pow(x, p);
    if (!strcmp(n, "clamp")) return x < p ? p : x > q ? q : x;
    if (!strcmp(n, "add_scalar")) return f32 ? (double)((float)x + (float)p) : x + p;
    if (!strcmp(n, "mul_scalar")) return f32 ? (double)((float)x * (float)p) : x * p;
#undef F
    return NAN;
}

/* a op b for the binary op or comparison `n` (f32: rounded as f32 arithmetic does). */
static inline double ref_binary(const char *n, double x, double y, int f32)
{
    double r;
    if (!strcmp(n, "add")) r = x + y;
    else if (!strcmp(n, "sub")) r = x - y;
    else if (!strcmp(n, "mul")) r = x * y;
    else if (!strcmp(n, "div")) r = x / y;
    else if (!strcmp(n, "pow")) r = f32 ? (double)powf((float)x, (float)y) : pow(x, y);
    else if (!strcmp(n, "maximum")) r = x > y || x != x ? x : y;
    else if (!strcmp(n, "minimum")) r = x < y || x != x ? x : y;
    else if (!strcmp(n, "eq")) return x == y;
    else if (!strcmp(n, "ne")) return x != y;
    else if (!strcmp(n, "lt")) return x < y;
    else if (!strcmp(n, "le")) return x <= y;
    else if (!strcmp(n, "gt")) return x > y;
    else if (!strcmp(n, "ge")) return x >= y;
    else return NAN;
    return f32 ? (double)(float)r : r;
}

/* Element of a row-major tensor of shape s (rank r) read at output index idx (rank R),
 * NumPy-broadcast (aligned to the right, size-1 dims stretched). */
static inline int64_t ref_bidx(int R, const int64_t *idx, int r, const int64_t *s)
{
    int64_t k = 0;
    for (int d = 0; d < r; d++) {
        int64_t i = idx[R - r + d];
        k = k * s[d] + (s[d] == 1 ? 0 : i);
    }
    return k;
}

#endif
