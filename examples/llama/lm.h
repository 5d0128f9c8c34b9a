/* llama/lm: a decoder-only language model loaded from a Hugging Face model directory (GPT-2,
 * or the Llama family: Llama, Qwen2, Mistral) onto a mesh with a `batch` dim and an optional
 * `model` dim, and run incrementally against a key/value cache laid out on the mesh:
 *   embeddings [V, C]         vocabulary sharded on model (the head too, tied or not)
 *   q, k, v, gate, up, fc     column parallel (heads / hidden units sharded on model)
 *   o, down, proj             row parallel, outputs all-reduced over model
 *   norms, row-parallel biases replicated
 *   activations [rows, n, C]  rows sharded on batch (when it divides them)
 *   cache [rows, cap, KV, D]  per layer for keys and for values, rows as the activations, kv
 *                             heads sharded on model when it divides them and the query heads.
 * Every step is libdtensor's distributed ops (rotary embeddings dt_rope_half, attention
 * against the cache dt_attention_cached) but the cache's append, a local copy per device.
 * Weights in f32 (the source's f16 / bf16 converted). */
#ifndef LLAMA_LM_H
#define LLAMA_LM_H

#include <stdint.h>

#include <stddef.h>

#include <dtensor/dtensor.h>
#include <dtensor/foreign.h>
#include <dtensor/tokenizer.h>

typedef struct lm lm;
typedef struct lm_cache lm_cache;

/* Loads the model of HF directory `dir` (config.json, model.safetensors or its sharded
 * index) onto `mesh`: each device reads only its own boxes. Collective. */
dt_status lm_load(const dt_mesh *mesh, const char *dir, lm **out);
/* A Llama-family model of config `cfg` (no files) initialised at random from `seed`
 * (normal(0, 0.02), o and down by 1/sqrt(2 layers), gains 1, biases 0): the same values on
 * any mesh. Collective (no communication). */
dt_status lm_create_random(const dt_mesh *mesh, const dt_hf_config *cfg, uint64_t seed, lm **out);
void lm_destroy(lm *m);
/* Borrowed. */
const dt_hf_config *lm_config(const lm *m);
/* Bytes of all weights (f32), the head once when tied. */
uint64_t lm_weight_bytes(const lm *m);
/* The model's parameters and our names for them (dt_foreign_gpt2_map's or
 * dt_foreign_llama_map's). Borrowed. */
int lm_num_params(const lm *m);
dt_tensor *const *lm_params(const lm *m);
const char *const *lm_param_names(const lm *m);

/* A cache for `rows` sequences of at most `cap` positions. Collective. */
dt_status lm_cache_create(const lm *m, int64_t rows, int64_t cap, lm_cache **out);
void lm_cache_destroy(lm_cache *c);
/* Positions held (the next token's position). */
int64_t lm_cache_length(const lm_cache *c);
/* Forgets every position (the cache is reused from 0). */
void lm_cache_reset(lm_cache *c);

/* Runs n new tokens per row (ids [rows, n], the same on every client) at positions
 * len..len+n-1 of the cache, appends their keys and values, and gathers the logits to the
 * host: all != 0: logits [rows, n, V]; else the last position's [rows, V]. DT_ERR_SHAPE when
 * the cache would exceed its cap. Collective. */
dt_status lm_forward(lm *m, lm_cache *c, int64_t n, const int32_t *ids, int all, float *logits);

/* Parameter i's values replaced by t's (the same global shape, any layout or float dtype:
 * relaid out and cast to the model's). A trainer of another model (train_gpt2) samples its
 * current weights through this one. Collective. */
dt_status lm_set_param(lm *m, int i, const dt_tensor *t);

/* One sample (lm_sample.c): the end-of-text token `eot` (and `prompt`, may be NULL)
 * continued by at most `tokens` tokens (stopping at eot), sampled at `temperature` (0:
 * greedy) among the top_k (0: all) from `seed`; *text_out the continuation's text (owned,
 * NUL-terminated), *len_out its bytes. Collective. */
dt_status lm_sample_text(lm *m, const dt_tokenizer *tok, int32_t eot, const char *prompt,
                         int64_t tokens, double temperature, int64_t top_k, uint64_t seed,
                         char **text_out, size_t *len_out);

/* ---- training (lm_train.c) ----
 * The model over whole sequences x [rows, T] (ids, the dataset's layout) against targets y,
 * recorded on `tape` (the parameters watched under their indices) and run backward:
 * *loss_out the mean cross-entropy, grads_out[i] (owned, f32) parameter i's gradient; with
 * grads_out NULL the forward only. Collective. */
dt_status lm_grads(lm *m, dt_tape *tape, const dt_tensor *x, const dt_tensor *y, double *loss_out,
                   dt_tensor **grads_out);
/* Sequence parallelism (Megatron, docs/attention.md) in lm_grads on a mesh with `model`:
 * the residual stream and norms sharded along the sequence over `model`, all-gathered before
 * the column-parallel matmuls, the row-parallel outputs reduce-scattered. Local. */
void lm_set_sequence_parallel(lm *m, int on);
/* 1 for the 2-D parameters (weights, embeddings: weight decay), 0 for norms and biases. */
int lm_param_decays(const lm *m, int i);
/* Hands the parameters to `zero` as two groups: the decayed ones with hp, the others without
 * weight decay. stage3: the optimizer then holds them (sharded) and every pass (lm_grads,
 * lm_forward) gathers them whole around itself and releases them after. Collective. */
dt_status lm_attach(lm *m, dt_zero *zero, const dt_optim_hparams *hp, int stage3);
/* The model's parameter index at optimizer position k (after lm_attach). */
int lm_opt_order(const lm *m, int k);
/* Both groups' learning rate. */
dt_status lm_set_lr(const lm *m, dt_zero *zero, float lr);

/* ---- pipeline stages (lm_train.c; driven by lm_pipe.c) ----
 * One micro-batch's pass over blocks lo..hi-1 on the autograd tape of its own run: from ids x
 * (the first stage: embeddings; h NULL) or the previous stage's activation h (x NULL), then
 * with targets y (the last stage) the final norm, head and loss, else *out an owned copy of
 * the activation [rows, T, C] to send on. Collective over m's mesh. */
typedef struct lm_stage_run lm_stage_run;
dt_status lm_stage_forward(lm *m, int64_t lo, int64_t hi, const dt_tensor *x, const dt_tensor *h,
                           const dt_tensor *y, lm_stage_run **run_out, dt_tensor **out);
/* The run's output: the loss on the last stage (borrowed). */
const dt_tensor *lm_stage_output(const lm_stage_run *r);
/* Its backward from dy (the next stage's gradient of the output; NULL on the last stage, the
 * loss seeded with `seed`): each parameter's gradient added into acc[i] (owned; NULL: set),
 * *dx_out the input's gradient (NULL on the first stage). Collective. */
dt_status lm_stage_backward(lm *m, lm_stage_run *r, const dt_tensor *dy, float seed,
                            dt_tensor **acc, dt_tensor **dx_out);
void lm_stage_run_free(lm_stage_run *r);

/* A message for the last failure: this module's own or dt_last_error(). */
const char *lm_last_error(void);

#endif
