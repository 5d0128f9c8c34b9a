/* train/model: the example's model, a 64-H-10 MLP with ReLU, laid out on a mesh with a `batch`
 * dim (data parallel) and an optional `model` dim (tensor parallel hidden layer):
 *   W1 [64, H]  column parallel (H sharded on model)    b1 [H]  sharded on model
 *   W2 [H, 10]  row parallel (H sharded on model)       b2 [10] replicated
 *   activations [rows, *] sharded on batch; the row-parallel product is summed over model.
 * The forward pass is written with libdtensor's distributed ops and recorded on a tape
 * (include/dtensor/autograd.h), which runs the backward pass. */
#ifndef TRAIN_MODEL_H
#define TRAIN_MODEL_H

#include <stdint.h>

#include <dtensor/dtensor.h>

#define MLP_NPARAMS 4

typedef struct mlp mlp;

/* Creates the parameters in `dtype` (f32, bf16 or f16) on `mesh` (which must have a dim
 * named "batch"; "model" is optional), initialised from `seed` (He-normal weights, zero
 * biases), identically on every client. Collective (no communication). */
dt_status mlp_create(const dt_mesh *mesh, int64_t inputs, int64_t hidden, int64_t classes,
                     dt_dtype dtype, uint64_t seed, mlp **out);
void mlp_destroy(mlp *m);

/* The parameters, in optimizer order, and their names (checkpoint keys). Borrowed. */
dt_tensor *const *mlp_params(const mlp *m);
const char *const *mlp_param_names(void);

/* Hands the parameters to `zero` with hyper-parameters hp: one group (stages 0-2; the
 * checkpoints' layout), or in stage 3 one group per layer, after which the model lets its own
 * tensors go and its passes take each layer's parameters from the optimizer (dt_zero_gather
 * before the layer's forward and again before its backward, the next layer prefetched,
 * dt_zero_release after use). Collective. */
dt_status mlp_attach(mlp *m, dt_zero *zero, const dt_optim_hparams *hp, int stage3);

/* Lays `rows` samples (x: rows x inputs f32, y: rows labels; the same on every client) out
 * over the batch dim: each batch shard gets its contiguous block of rows. */
dt_status mlp_inputs(const mlp *m, int64_t rows, const float *x, const int32_t *y,
                     dt_tensor **x_out, dt_tensor **y_out);

/* One forward and backward pass: *loss_out the mean cross-entropy (unscaled), grads_out the
 * gradients of the parameters, multiplied by `loss_scale`, f32, partial over batch. */
dt_status mlp_grads(const mlp *m, const dt_tensor *x, const dt_tensor *y, float loss_scale,
                    double *loss_out, dt_tensor *grads_out[MLP_NPARAMS]);

/* Called by mlp_grads_each as soon as the backward pass has made parameter `index`'s gradient
 * final (last layer first); `grad` stays owned by the pass. A failure stops the pass. */
typedef dt_status (*mlp_grad_fn)(void *arg, int index, const dt_tensor *grad);
/* mlp_grads telling fn (may be NULL) of each gradient as it is made: a training loop hands it
 * to dt_zero_grad_ready, so the reduction overlaps the rest of the backward pass. */
dt_status mlp_grads_each(const mlp *m, const dt_tensor *x, const dt_tensor *y, float loss_scale,
                         double *loss_out, mlp_grad_fn fn, void *arg,
                         dt_tensor *grads_out[MLP_NPARAMS]);

/* Mean cross-entropy and accuracy over rows (labels: the same rows' labels on the host). */
dt_status mlp_evaluate(const mlp *m, const dt_tensor *x, const dt_tensor *y, const int32_t *labels,
                       double *loss_out, double *acc_out);

/* A message for the last failure: this module's own (out of memory) or dt_last_error(). */
const char *mlp_last_error(void);

#endif
