/* moe/hf: train_moe's parameters as a Hugging Face directory with Mixtral's names
 * (model.layers.N.block_sparse_moe.gate.weight, ...experts.E.w1/w2/w3.weight, nn.Linear
 * weights [out, in]) and back (docs/moe.md, "Export"). */
#ifndef MOE_HF_H
#define MOE_HF_H

#include <stdint.h>

#include <dtensor/dtensor.h>

/* The model's shape as the export needs it. */
typedef struct moe_hf_shape {
    int64_t vocab, context, width, heads, layers, experts, topk, hidden;
} moe_hf_shape;

/* The HF name of our parameter `name` (train_moe's: wte, wpe, lN.attn_norm, lN.wq, wk, wv, wo,
 * lN.mlp_norm, lN.gate, lN.w1, lN.w3, lN.w2, norm, head), expert e for the expert weights
 * (ignored otherwise), into buf; *transpose_out 1 when HF stores its transpose. Returns 0, or
 * -1 for an unknown name. Local. */
int moe_hf_name(const char *name, int64_t e, char *buf, size_t len, int *transpose_out);

/* Writes dir/config.json (model_type "mixtral") and dir/model.safetensors (f32) from the
 * parameters params[i] named names[i] (the experts' [E, ...] split into E tensors, matrices
 * transposed to [out, in]), and the routing biases bias[l * E + e] as DeepSeek-V3 names them
 * (model.layers.N.block_sparse_moe.gate.e_score_correction_bias): gathered to client 0, which
 * writes. Collective. */
dt_status moe_hf_export(const char *dir, const moe_hf_shape *shape, int n, const char *const *names,
                        dt_tensor *const *params, const float *bias);

/* Reads dir/model.safetensors back into the existing parameters (any layout): each expert's
 * tensor read through dt_foreign_restore (transposed by its view) and stacked into [E, ...];
 * the routing biases into bias[l * E + e]. Collective. */
dt_status moe_hf_import(const char *dir, const moe_hf_shape *shape, int n, const char *const *names,
                        dt_tensor **params, float *bias);

#endif
