/* ops/k_unary: the CPU kernels of the unary ops (exp ... add_scalar, and the internal
 * mul_scalar) on f32 and f64, computed in the tensor's own precision with libm (tgmath). */
#include <stdint.h>
#include <tgmath.h>

#include "ops/def_elem.h"
#include "runtime/error.h"

#define LOOP(E)                                                                             \
    for (int64_t i = 0; i < n; i++) {                                                       \
        T v = x[i];                                                                         \
        y[i] = (E);                                                                         \
    }                                                                                       \
    break

/* One switch per dtype: the body refers to the local typedef T. */
#define UNARY_BODY                                                                          \
    const T p = (T)f[0], q = (T)f[1], one = (T)1;                                           \
    switch (op) {                                                                           \
    case DT__UN_EXP: LOOP(exp(v));                                                          \
    case DT__UN_LOG: LOOP(log(v));                                                          \
    case DT__UN_LOG1P: LOOP(log1p(v));                                                      \
    case DT__UN_SQRT: LOOP(sqrt(v));                                                        \
    case DT__UN_RSQRT: LOOP(one / sqrt(v));                                                 \
    case DT__UN_TANH: LOOP(tanh(v));                                                        \
    case DT__UN_SIGMOID: LOOP(one / (one + exp(-v)));                                       \
    case DT__UN_SILU: LOOP(v / (one + exp(-v)));                                            \
    case DT__UN_NEG: LOOP(-v);                                                              \
    case DT__UN_ABS: LOOP(fabs(v));                                                         \
    case DT__UN_SIGN: LOOP(v > 0 ? one : v < 0 ? -one : v);                                 \
    case DT__UN_SQUARE: LOOP(v * v);                                                        \
    case DT__UN_RECIPROCAL: LOOP(one / v);                                                  \
    case DT__UN_POW_SCALAR: LOOP(pow(v, p));                                                \
    case DT__UN_CLAMP: LOOP(v < p ? p : v > q ? q : v);                                     \
    case DT__UN_ADD_SCALAR: LOOP(v + p);                                                    \
    case DT__UN_MUL_SCALAR: LOOP(v * p);                                                    \
    default: break;                                                                         \
    }

static void un_f32(dt__un_op op, int64_t n, const void *px, void *py, const double *f)
{
    typedef float T;
    const T *restrict x = px;
    T *restrict y = py;
    UNARY_BODY
}

static void un_f64(dt__un_op op, int64_t n, const void *px, void *py, const double *f)
{
    typedef double T;
    const T *restrict x = px;
    T *restrict y = py;
    UNARY_BODY
}

dt_status dt__k_unary(const dt_op_kernel_args *a, dt__un_op op)
{
    const dt_op_buf *x = &a->in[0], *y = &a->out;
    if ((unsigned)op >= DT__UN_COUNT_ || x->dtype != y->dtype ||
        (x->dtype != DT_DTYPE_F32 && x->dtype != DT_DTYPE_F64))
        return dt__error(DT_ERR_SHAPE, "unary kernel: dtype %s not supported",
                         dt_dtype_name(x->dtype));
    int64_t n = dt__op_numel(y);
    if (x->dtype == DT_DTYPE_F32)
        un_f32(op, n, x->data, y->data, a->attrs.f);
    else
        un_f64(op, n, x->data, y->data, a->attrs.f);
    return DT_OK;
}
