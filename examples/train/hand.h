/* Handing gradients to the ZeRO optimizer from inside a backward pass (train_mlp, train_gpt):
 * the callback their models' *_grads_each functions call as each gradient is made. */
#ifndef TRAIN_HAND_H
#define TRAIN_HAND_H

#include <dtensor/dtensor.h>

typedef struct grad_hand {
    dt_zero *zero;
    dt_dtype dtype;   /* the parameters' dtype: gradients are cast to it first */
} grad_hand;

/* dt_zero_grad_ready(h->zero, index, grad in h->dtype): the optimizer copies it into its flat
 * buffer and starts the reduction of every bucket it completes in the background, while the
 * backward pass goes on with the earlier layers (mixed precision: an f16 overflow shows up as
 * inf and the step is skipped). arg is a grad_hand. */
dt_status hand_grad(void *arg, int index, const dt_tensor *grad);

#endif
