/* gpt/model: a character-level GPT (pre-norm transformer blocks: layer norm, causal
 * self-attention, residual add, layer norm, GELU MLP, residual add; a final layer norm and an
 * output projection) laid out Megatron-style on a mesh with a `batch` dim (data parallel) and
 * an optional `model` dim (tensor parallel):
 *   token embedding [V, C]      vocabulary sharded on model     position embedding [T, C]
 *   q, k, v [C, C], fc [C, 4C]  column parallel (heads / hidden units sharded on model)
 *   proj [C, C], fc2 [4C, C]    row parallel, outputs all-reduced over model
 *   output [C, V]               column parallel: the logits stay vocabulary-sharded and the
 *                               loss is Megatron's vocab-parallel cross-entropy
 *   layer norms                 replicated
 *   activations [B, T, *]       sharded on batch (and along T on a `seq` mesh dim, if any:
 *                               context-parallel attention, docs/attention.md).
 * The forward pass is written with libdtensor's distributed ops and recorded on its autograd
 * tape, which runs the backward pass (gpt_set_backward). */
#ifndef GPT_MODEL_H
#define GPT_MODEL_H

#include <stdint.h>

#include <dtensor/dtensor.h>

typedef struct gpt_config {
    int64_t vocab, context, width, heads, layers;
    /* 1: a Llama-style decoder instead (RMS norms with gains, rotary positions, SwiGLU MLP of
     * 3 * width hidden units, grouped-query attention with kv_heads key/value heads, no
     * position embedding and no biases), its forward pass on the tape only. */
    int llama;
    int64_t kv_heads; /* llama: dividing heads (0: heads / 2, at least 1) */
} gpt_config;

typedef struct gpt gpt;

/* Creates the parameters in `dtype` (f32, bf16 or f16) on `mesh` ("batch" and optionally
 * "model"), initialised from `seed` (GPT-2's: normal(0, 0.02), the residual projections
 * scaled by 1/sqrt(2 layers), layer norms 1 and 0), the same values for any mesh. heads must
 * be divisible by the model dim's size for head-parallel attention (else attention gathers
 * the heads). Collective (no communication). */
dt_status gpt_create(const dt_mesh *mesh, const gpt_config *cfg, dt_dtype dtype, uint64_t seed,
                     gpt **out);
void gpt_destroy(gpt *m);

/* Parameters in optimizer order (those with weight decay first: gpt_num_decay of them), and
 * their names (checkpoint keys). Borrowed. */
int gpt_num_params(const gpt *m);
int gpt_num_decay(const gpt *m);
dt_tensor *const *gpt_params(const gpt *m);
const char *const *gpt_param_names(const gpt *m);
int64_t gpt_param_count(const gpt *m); /* elements of all parameters */

/* Hands the parameters to `zero` (hp: the decayed ones'; the layer norms get no decay): two
 * groups (stages 0-2), or in stage 3 a group per slot range of a unit (embeddings, each
 * block's weights, the head weight, each block's norms, the final norm), after which the
 * model lets its tensors go and its passes gather each unit's parameters before its forward
 * and again before its backward (the next unit prefetched) and release them after.
 * Collective. */
dt_status gpt_attach(gpt *m, dt_zero *zero, const dt_optim_hparams *hp, int stage3);
/* Sets the learning rate of every group gpt_attach made. */
dt_status gpt_set_lr(const gpt *m, dt_zero *zero, float lr);

/* Inputs x and targets y (host [rows, context] int32, the same on every client; y = -1 for
 * ignored positions) laid out over the batch dim. */
dt_status gpt_inputs(const gpt *m, int64_t rows, const int32_t *x, const int32_t *y,
                     dt_tensor **x_out, dt_tensor **y_out);

/* *count_out = the number of targets y (a batch from gpt_inputs or the dataset, [rows,
 * context] i32) counts (those >= 0), on every client. */
dt_status gpt_count_targets(const gpt *m, const dt_tensor *y, int64_t *count_out);

/* One forward and backward pass: *loss_out the mean cross-entropy per counted target
 * (`targets` of them, unscaled), grads_out (gpt_num_params) the gradients multiplied by
 * `loss_scale`, f32, partial over batch. */
dt_status gpt_grads(gpt *m, const dt_tensor *x, const dt_tensor *y, int64_t targets,
                    float loss_scale, double *loss_out, dt_tensor **grads_out);

/* Called by gpt_grads_each as soon as the backward pass has made parameter `index`'s gradient
 * final (last layer first); `grad` stays owned by the pass. A failure stops the pass. */
typedef dt_status (*gpt_grad_fn)(void *arg, int index, const dt_tensor *grad);
/* gpt_grads telling fn (may be NULL) of each gradient as it is made: a training loop hands it
 * to dt_zero_grad_ready, so the reduction overlaps the rest of the backward pass. */
dt_status gpt_grads_each(gpt *m, const dt_tensor *x, const dt_tensor *y, int64_t targets,
                         float loss_scale, double *loss_out, gpt_grad_fn fn, void *arg,
                         dt_tensor **grads_out);

/* Sequence parallelism (Megatron style, docs/attention.md): outside the tensor-parallel
 * matmuls the activations are sharded along the sequence over `model`; the column-parallel
 * matmuls' inputs are all-gathered along it (dt_relayout on the tape) and the row-parallel
 * outputs reduce-scattered into that layout. Call right after gpt_create, before gpt_inputs;
 * the tape's backward only. DT_ERR_UNSUPPORTED on a mesh with a `seq` dim. */
dt_status gpt_set_sequence_parallel(gpt *m);

/* How gpt_grads makes the gradients: the forward pass is recorded on an autograd tape
 * (dtensor/autograd.h) and the tape runs it backward; checkpoint_blocks != 0 makes each block
 * a recomputed checkpoint segment (its activations dropped after the forward and recomputed in
 * the backward pass: the same bits). */
void gpt_set_backward(gpt *m, int checkpoint_blocks);
/* Dropout with probability p (0: none) in the training passes of gpt_grads*: on each block's
 * attention and MLP outputs (residual) and on its attention probabilities, from Philox keyed
 * by (seed, pass, site, global element index): the same mask on every mesh. `pass_index` numbers the next training pass (then counted
 * up by one per pass; train_gpt sets it to the step). Needs the tape's backward. */
void gpt_set_dropout(gpt *m, float p, uint64_t seed, uint64_t pass_index);
/* The most bytes (this client's devices) a tape has held for the backward pass in any
 * gpt_grads so far: the activations kept. */
uint64_t gpt_peak_saved(const gpt *m);
/* The forward calls the last tape backward re-ran for its checkpoint segments. */
int64_t gpt_recomputed(const gpt *m);

/* Mean cross-entropy per counted target of a forward pass (no gradients). */
dt_status gpt_loss(gpt *m, const dt_tensor *x, const dt_tensor *y, int64_t targets,
                   double *loss_out);

/* The logits [rows, context, vocab] of a forward pass gathered to host `logits`. */
dt_status gpt_logits(gpt *m, const dt_tensor *x, float *logits);

/* ---- pipeline stages (examples/gpt/pipe.c, docs/pipeline.md) ----
 * A model's units: 0 the embeddings, 1 + l block l, L + 1 the final norm, head and loss. */
int gpt_num_units(const gpt *m);
/* The parameter slots of unit u into slots (at most 16); returns their count. */
int gpt_unit_param_slots(const gpt *m, int u, int *slots);
/* 1 when the model holds parameter `slot` (a stage's own units), else 0. */
int gpt_holds_slot(const gpt *m, int slot);
/* Restricts the model to units [lo, hi), a pipeline stage's (or chunk's): the parameters of
 * the other units are freed (gpt_params gives NULL for them) and the passes run only these
 * units. Not after gpt_attach in stage 3 (DT_ERR_INVALID_ARGUMENT). Local. */
dt_status gpt_set_units(gpt *m, int lo, int hi);
/* What one stage's forward keeps for its backward; freed after the tape's backward. */
typedef struct gpt_stage_pass gpt_stage_pass;
void gpt_stage_pass_free(gpt_stage_pass *sp);
/* The forward pass of the model's units recorded on `tape` (which the caller created, began
 * and watches the parameters on under their slots, and `in` when it is an activation):
 * `in` the ids [rows, T] when the units start with the embeddings, else the previous stage's
 * activation [rows, T, C] (f32, sharded on batch); *out the activation after the last unit,
 * or with the head the mean cross-entropy over all of y's positions (dt_vocab_xent; the
 * caller seeds the backward with rows / counted targets). Collective over the mesh. */
dt_status gpt_stage_forward(gpt *m, dt_tape *tape, const dt_tensor *in, const dt_tensor *y,
                            gpt_stage_pass **pass_out, dt_tensor **out);

/* A forward pass of the model's units without gradients (gpt_loss and gpt_logits are the
 * whole model's): `in` as gpt_stage_forward's. Units ending before the head give the
 * activation in *act_out; with the head, y (may be NULL) gives *loss_out, the mean
 * cross-entropy per counted target (`targets`), and logits (may be NULL) gets the logits
 * [rows, T, vocab] gathered to the host. Collective over the mesh. */
dt_status gpt_stage_eval(gpt *m, const dt_tensor *in, const dt_tensor *y, int64_t targets,
                         double *loss_out, float *logits, dt_tensor **act_out);

/* A message for the last failure: this module's own or dt_last_error(). */
const char *gpt_last_error(void);

#endif
