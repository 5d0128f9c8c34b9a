/* ops/k_random: the CPU kernels of the random constructors and arange. Element g (its global
 * row-major index, from the block's offset and the global shape) draws one Philox-4x32-10
 * block: counter {g as two words, stream as two words}, key {seed as two words}; so a tensor
 * is the same whatever layout or mesh draws it. uniform: 53 bits of words 0-1; normal:
 * Box-Muller on words 0-1 (radius) and 2-3 (angle); bernoulli: words 0-1 below p. */
#include <math.h>
#include <stdint.h>

#include "ops/def_elem.h"
#include "runtime/error.h"

static void draw(uint64_t g, uint64_t seed, uint64_t stream, uint32_t w[4])
{
    const uint32_t ctr[4] = {(uint32_t)g, (uint32_t)(g >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    dt_philox4x32_10(ctr, key, w);
}

/* A uniform double in [0, 1) from two words (53 bits). */
static double u53(uint32_t hi, uint32_t lo)
{
    return (double)(((uint64_t)(hi >> 5) << 26) | (lo >> 6)) * (1.0 / 9007199254740992.0);
}

/* The value of element g as a double (arange: g itself). */
static double value_at(dt__rand_op op, uint64_t g, uint64_t seed, uint64_t stream,
                       const double *f)
{
    if (op == DT__RAND_ARANGE)
        return (double)g;
    uint32_t w[4];
    draw(g, seed, stream, w);
    double u = u53(w[0], w[1]);
    switch (op) {
    case DT__RAND_UNIFORM: return f[0] + (f[1] - f[0]) * u;
    case DT__RAND_NORMAL: {
        double r = sqrt(-2.0 * log(1.0 - u)); /* 1 - u in (0, 1] */
        return f[0] + f[1] * r * cos(6.283185307179586 * u53(w[2], w[3]));
    }
    case DT__RAND_BERNOULLI: return u < f[0] ? 1.0 : 0.0;
    default: return 0.0;
    }
}

static void store(void *out, int64_t i, dt_dtype t, double v, dt__rand_op op, const double *f)
{
    switch (t) {
    case DT_DTYPE_F32: {
        float x = (float)v;
        /* rounding to f32 may reach hi: uniform stays in [lo, hi) */
        if (op == DT__RAND_UNIFORM && f[1] > f[0] && (double)x >= f[1])
            x = nextafterf((float)f[1], -INFINITY);
        ((float *)out)[i] = x;
        break;
    }
    case DT_DTYPE_F64:
        if (op == DT__RAND_UNIFORM && f[1] > f[0] && v >= f[1])
            v = nextafter(f[1], -INFINITY);
        ((double *)out)[i] = v;
        break;
    case DT_DTYPE_I32: ((int32_t *)out)[i] = (int32_t)v; break;
    case DT_DTYPE_I64: ((int64_t *)out)[i] = (int64_t)v; break;
    case DT_DTYPE_U8: ((uint8_t *)out)[i] = (uint8_t)v; break;
    default: break;
    }
}

dt_status dt__k_random(const dt_op_kernel_args *a, dt__rand_op op)
{
    const dt_op_buf *o = &a->out;
    if (dt__elem_col(o->dtype) < 0)
        return dt__error(DT_ERR_SHAPE, "random kernel: dtype %s not supported",
                         dt_dtype_name(o->dtype));
    uint64_t seed = (uint64_t)a->attrs.i[10], stream = (uint64_t)a->attrs.i[11];
    int r = o->rank;
    int64_t n = dt__op_numel(o);
    if (n == 0)
        return DT_OK;
    int64_t gst[DT_MAX_RANK], idx[DT_MAX_RANK] = {0};
    int64_t s = 1;
    for (int d = r - 1; d >= 0; d--) {
        gst[d] = s;
        s *= o->global[d];
    }
    int64_t len = r ? o->shape[r - 1] : 1, rows = n / len;
    for (int64_t row = 0; row < rows; row++) {
        int64_t g0 = 0;
        for (int d = 0; d < r; d++)
            g0 += (o->offset[d] + idx[d]) * gst[d];
        for (int64_t i = 0; i < len; i++)
            store(o->data, row * len + i, o->dtype,
                  value_at(op, (uint64_t)(g0 + i), seed, stream, a->attrs.f), op, a->attrs.f);
        for (int d = r - 2; d >= 0; d--) {
            if (++idx[d] < o->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return DT_OK;
}
