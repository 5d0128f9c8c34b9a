/* 16-bit operands of the f32 elementwise ops and reductions: each f16 / bf16 local component is
 * widened to f32 (exactly), the f32 kernels run (f32 accumulation), and elementwise results are
 * rounded back to the operands' dtype (reductions stay f32, so partial sums added across
 * devices keep their precision). */
#include "ops/ops_impl.h"

int dt__is_half(const dt_tensor *t)
{
    return t && (dt_tensor_dtype(t) == DT_DTYPE_F16 || dt_tensor_dtype(t) == DT_DTYPE_BF16);
}

dt_status dt__widen(const dt_tensor *t, dt_tensor **out)
{
    if (!dt__is_half(t)) {
        *out = dt_tensor_retain(t);
        return DT_OK;
    }
    return dt_cast(t, DT_DTYPE_F32, out);
}

dt_status dt__narrow(dt_status st, dt_dtype dtype, dt_tensor **t)
{
    if (st != DT_OK || dtype == DT_DTYPE_F32)
        return st;
    dt_tensor *n = NULL;
    st = dt_cast(*t, dtype, &n);
    dt_tensor_destroy(*t);
    *t = st == DT_OK ? n : NULL;
    return st;
}
