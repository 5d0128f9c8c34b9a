/* The callback that hands each gradient to dt_zero_grad_ready as the backward pass makes it. */
#include "hand.h"

dt_status hand_grad(void *arg, int index, const dt_tensor *grad)
{
    grad_hand *h = arg;
    if (h->dtype == DT_DTYPE_F32)
        return dt_zero_grad_ready(h->zero, index, grad);
    dt_tensor *gc = NULL;
    dt_status st = dt_cast(grad, h->dtype, &gc);
    if (st == DT_OK)
        st = dt_zero_grad_ready(h->zero, index, gc);
    dt_tensor_destroy(gc);
    return st;
}
