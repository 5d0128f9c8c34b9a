/* gpt2/model: OpenAI's GPT-2 (learned position embeddings, pre-LN blocks with biases in the
 * attention and the MLP, tanh GELU, a final LayerNorm, the head tied to the token embedding)
 * written as a forward pass only, recorded on libdtensor's tape, which runs the backward
 * (the tied head's gradient is the tape's sum of its two uses). Parameters are named and
 * ordered as docs/foreign.md's GPT-2 mapping, so dt_foreign_gpt2_map fills them and
 * `dtensor ckpt export --format hf-gpt2` reads our checkpoints. Activations [B, T, C] are
 * sharded on `batch`; parameters are replicated (a `model` dim replicates everything). */
#ifndef GPT2_MODEL_H
#define GPT2_MODEL_H

#include <stdint.h>

#include <dtensor/dtensor.h>

typedef struct gpt2_config {
    int64_t layers, width, heads, vocab, context;
} gpt2_config;

typedef struct gpt2 gpt2;

/* Parameters of dtype (f32 or bf16) on mesh, zeroed. Collective (no communication). */
dt_status gpt2_create(const dt_mesh *mesh, const gpt2_config *cfg, dt_dtype dtype, gpt2 **out);
void gpt2_destroy(gpt2 *m);

/* GPT-2's initialisation from seed: normal(0, 0.02), residual projections 0.02/sqrt(2L),
 * biases 0, norms 1; the same values on any mesh. Collective. */
dt_status gpt2_init_random(gpt2 *m, uint64_t seed);

int gpt2_num_params(const gpt2 *m);
dt_tensor *const *gpt2_params(const gpt2 *m);   /* borrowed */
const char *const *gpt2_param_names(const gpt2 *m);
int gpt2_param_decays(const gpt2 *m, int i);     /* 1 for 2-D tensors (weights, embeddings) */
int64_t gpt2_param_count(const gpt2 *m);

/* One forward pass on the tape (watched: the parameters, index = position) and its backward:
 * *loss_out the mean cross-entropy, grads_out[i] (owned, f32, partial over batch) the
 * gradients times loss_scale. x, y: i32 [B, T] sharded on batch. Collective. */
dt_status gpt2_grads(gpt2 *m, dt_tape *tape, const dt_tensor *x, const dt_tensor *y,
                     float loss_scale, double *loss_out, dt_tensor **grads_out);

#endif
