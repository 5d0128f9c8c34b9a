/* ops/k_select: the CPU kernels that pick elements by a condition: where (cond ? a : b, all
 * three broadcast) and masked_fill (mask ? value : x, the mask broadcast to x). A condition
 * of any dtype is true where it is nonzero. */
#include <stdint.h>
#include <string.h>

#include "ops/def_elem.h"
#include "runtime/error.h"

/* Element i of a condition block: nonzero? */
static int truth(const void *p, dt_dtype t, int64_t i)
{
    switch (t) {
    case DT_DTYPE_F32: return ((const float *)p)[i] != 0.0f;
    case DT_DTYPE_F64: return ((const double *)p)[i] != 0.0;
    case DT_DTYPE_I32: return ((const int32_t *)p)[i] != 0;
    case DT_DTYPE_I64: return ((const int64_t *)p)[i] != 0;
    case DT_DTYPE_U8: return ((const uint8_t *)p)[i] != 0;
    case DT_DTYPE_F16:
    case DT_DTYPE_BF16: return (((const uint16_t *)p)[i] & 0x7fffu) != 0;
    default: return 0;
    }
}

typedef struct sel_run {
    const dt_op_kernel_args *a;
    size_t es[DT_OP_MAX_IN], eo;
    int64_t inner[DT_OP_MAX_IN]; /* the inputs' strides in the inner loop: 0 or 1 */
    int invert;
    unsigned char value[8]; /* masked_fill's value in the output's dtype */
} sel_run;

static void where_row(int64_t row, const int64_t *offs, int64_t len, void *ctx)
{
    const sel_run *r = ctx;
    const dt_op_kernel_args *a = r->a;
    const char *c = (const char *)a->in[0].data + (size_t)offs[0] * r->es[0];
    const char *pa = (const char *)a->in[1].data + (size_t)offs[1] * r->es[1];
    const char *pb = (const char *)a->in[2].data + (size_t)offs[2] * r->es[2];
    char *o = (char *)a->out.data + (size_t)(row * len) * r->eo;
    size_t e = r->eo;
    for (int64_t i = 0; i < len; i++) {
        int t = truth(c, a->in[0].dtype, i * r->inner[0]);
        const char *src = t ? pa + (size_t)(i * r->inner[1]) * e
                            : pb + (size_t)(i * r->inner[2]) * e;
        memcpy(o + (size_t)i * e, src, e);
    }
}

static void fill_row(int64_t row, const int64_t *offs, int64_t len, void *ctx)
{
    const sel_run *r = ctx;
    const dt_op_kernel_args *a = r->a;
    const char *x = (const char *)a->in[0].data + (size_t)offs[0] * r->es[0];
    const char *m = (const char *)a->in[1].data + (size_t)offs[1] * r->es[1];
    char *o = (char *)a->out.data + (size_t)(row * len) * r->eo;
    size_t e = r->eo;
    for (int64_t i = 0; i < len; i++) {
        int t = truth(m, a->in[1].dtype, i * r->inner[1]) != r->invert;
        const char *src = t ? (const char *)r->value : x + (size_t)(i * r->inner[0]) * e;
        memcpy(o + (size_t)i * e, src, e);
    }
}

static void inner_strides(const dt__ew_plan *p, sel_run *r)
{
    int last = p->rank - 1;
    for (int k = 0; k < p->nin; k++)
        r->inner[k] = p->n[last] == 1 ? 0 : p->st[k][last];
}

dt_status dt__k_where(const dt_op_kernel_args *a)
{
    if (a->in[1].dtype != a->in[2].dtype || a->out.dtype != a->in[1].dtype ||
        dt_dtype_size(a->in[0].dtype) == 0)
        return dt__error(DT_ERR_SHAPE, "where kernel: dtypes %s, %s, %s not supported",
                         dt_dtype_name(a->in[0].dtype), dt_dtype_name(a->in[1].dtype),
                         dt_dtype_name(a->in[2].dtype));
    dt__ew_plan p;
    if (dt__ew_plan_make(a->out.rank, a->out.shape, 3, a->in, &p) == 0)
        return DT_OK;
    sel_run r = {.a = a, .eo = dt_dtype_size(a->out.dtype)};
    for (int k = 0; k < 3; k++)
        r.es[k] = dt_dtype_size(a->in[k].dtype);
    inner_strides(&p, &r);
    dt__ew_plan_rows(&p, where_row, &r);
    return DT_OK;
}

dt_status dt__k_masked_fill(const dt_op_kernel_args *a)
{
    dt_dtype t = a->in[0].dtype;
    if (a->out.dtype != t || dt__elem_col(t) < 0 || dt_dtype_size(a->in[1].dtype) == 0)
        return dt__error(DT_ERR_SHAPE, "masked_fill kernel: dtypes %s and %s not supported",
                         dt_dtype_name(t), dt_dtype_name(a->in[1].dtype));
    dt__ew_plan p;
    if (dt__ew_plan_make(a->out.rank, a->out.shape, 2, a->in, &p) == 0)
        return DT_OK;
    sel_run r = {.a = a, .eo = dt_dtype_size(t), .invert = a->attrs.i[0] != 0};
    r.es[0] = dt_dtype_size(t);
    r.es[1] = dt_dtype_size(a->in[1].dtype);
    double v = a->attrs.f[0];
    switch (t) {
    case DT_DTYPE_F32: { float w = (float)v; memcpy(r.value, &w, sizeof w); break; }
    case DT_DTYPE_F64: memcpy(r.value, &v, sizeof v); break;
    case DT_DTYPE_I32: { int32_t w = (int32_t)v; memcpy(r.value, &w, sizeof w); break; }
    case DT_DTYPE_I64: { int64_t w = (int64_t)v; memcpy(r.value, &w, sizeof w); break; }
    default: { uint8_t w = (uint8_t)v; memcpy(r.value, &w, sizeof w); break; }
    }
    inner_strides(&p, &r);
    dt__ew_plan_rows(&p, fill_row, &r);
    return DT_OK;
}
