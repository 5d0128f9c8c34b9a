/* gpt2/model: OpenAI's GPT-2 (learned position embeddings, pre-LN blocks with biases in the
 * attention and the MLP, tanh GELU, a final LayerNorm, the head tied to the token embedding)
 * written as a forward pass only, recorded on libdtensor's tape, which runs the backward
 * (the tied head's gradient is the tape's sum of its two uses). Parameters are named and
 * ordered as docs/foreign.md's GPT-2 mapping, so dt_foreign_gpt2_map fills them and
 * `dtensor ckpt export --format hf-gpt2` reads our checkpoints. Activations [B, T, C] are
 * sharded on `batch`; a `model` mesh dim makes it tensor parallel (Megatron's layout: q, k, v
 * and fc column parallel with their biases sharded, the attention output and proj row
 * parallel, the tied embedding and head sharded on the vocabulary; docs/gpt2.md). */
#ifndef GPT2_MODEL_H
#define GPT2_MODEL_H

#include <stdint.h>

#include <dtensor/dtensor.h>

typedef struct gpt2_config {
    int64_t layers, width, heads, vocab, context;
} gpt2_config;

typedef struct gpt2 gpt2;

/* Parameters of dtype (f32 or bf16) on mesh, zeroed, in their tensor-parallel layouts.
 * DT_ERR_INVALID_ARGUMENT (gpt2_last_error says why) when the heads do not divide the width,
 * or the `model` dim's size does not divide the heads. A vocabulary it does not divide (GPT-2's
 * 50257) is split unevenly, as every layout may be (the first V % model shards one row
 * longer), so no padding and no mask in the cross-entropy are needed. Collective (no
 * communication). */
dt_status gpt2_create(const dt_mesh *mesh, const gpt2_config *cfg, dt_dtype dtype, gpt2 **out);
void gpt2_destroy(gpt2 *m);

/* This thread's message for the model's last failure (the library's when the model has none). */
const char *gpt2_last_error(void);

/* GPT-2's initialisation from seed: normal(0, 0.02), residual projections 0.02/sqrt(2L),
 * biases 0, norms 1; the whole global tensors drawn on every client, each device keeping its
 * box: the same values on any mesh. Collective. */
dt_status gpt2_init_random(gpt2 *m, uint64_t seed);

/* The model's sizes (borrowed). */
const gpt2_config *gpt2_cfg(const gpt2 *m);

int gpt2_num_params(const gpt2 *m);
/* The model's parameters (borrowed; NULL entries once attached in stage 3: the optimizer
 * holds them then, gpt2_param gives them while gathered). */
dt_tensor *const *gpt2_params(const gpt2 *m);
const char *const *gpt2_param_names(const gpt2 *m);
int gpt2_param_decays(const gpt2 *m, int i);     /* 1 for 2-D tensors (weights, embeddings) */
int64_t gpt2_param_count(const gpt2 *m);

/* The optimizer groups, one per unit: the embeddings (wte, wpe), each block's weights, each
 * block's biases and norms, the final norm (weight decay hp->weight_decay on the weights and
 * embeddings, none on the rest), added to zero in that order. In stage 3 the model gives its
 * parameters up to the optimizer and gathers each unit around its use (gpt2_grads). The
 * optimizer's parameter order is gpt2_opt_order's. Collective. */
dt_status gpt2_attach(gpt2 *m, dt_zero *zero, const dt_optim_hparams *hp, int stage3);
/* The model's parameter index at optimizer position k (after gpt2_attach). */
int gpt2_opt_order(const gpt2 *m, int k);
/* Sets every group's learning rate (after gpt2_attach). Local, the same on every client. */
dt_status gpt2_set_lr(const gpt2 *m, dt_zero *zero, float lr);
/* Stage 3: every group gathered (gpt2_param gives each parameter whole), or released again.
 * Nothing to do in other stages. Collective. */
dt_status gpt2_gather_all(gpt2 *m);
dt_status gpt2_release_all(gpt2 *m);
/* Parameter i: the model's own, or (stage 3) the optimizer's gathered one; NULL when its
 * group is released. Borrowed. */
const dt_tensor *gpt2_param(const gpt2 *m, int i);

/* One forward pass on the tape (watched: the parameters, index = position) and its backward:
 * *loss_out the mean cross-entropy, grads_out[i] (owned, f32, partial over batch, in the
 * parameter's layout) the gradients times loss_scale. x, y: i32 [B, T] sharded on batch.
 * Stage 3: each block's groups gathered before its forward and its backward, released
 * after; the embeddings and final norm stay gathered for the pass (the tied wte is used at
 * both ends). Collective. */
dt_status gpt2_grads(gpt2 *m, dt_tape *tape, const dt_tensor *x, const dt_tensor *y,
                     float loss_scale, double *loss_out, dt_tensor **grads_out);

#endif
