/* gpt_manual_backward: the GPT's hand-written backward pass (a gpt__backward_fn). */
#ifndef GPT_MANUAL_BACKWARD_H
#define GPT_MANUAL_BACKWARD_H

#include "model_impl.h"

/* The gradients of the forward pass p by the backward pass written out by hand (see
 * gpt__backward_fn). DT_ERR_UNSUPPORTED, with gpt_last_error's message, for what it does not
 * cover: dropout, the Llama variant, sequence parallelism. Collective. */
dt_status gpt_manual_backward(gpt *m, pass *p, const dt_tensor *ids, const dt_tensor *y,
                              float dloss, dt_tensor **g, gpt_grad_fn fn, void *arg);

#endif
