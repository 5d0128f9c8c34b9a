/* libdtensor foreign checkpoints: restore tensors from files other programs wrote (Hugging
 * Face safetensors, single or sharded with model.safetensors.index.json; llm.c's GPT-2
 * checkpoints) onto any mesh and layout, box by box, through a caller-supplied name and shape
 * mapping; and export of our GPT-2 checkpoints in Hugging Face's form.
 * Formats, the GPT-2 mapping's names and shapes, and design notes: docs/foreign.md. */
#ifndef DTENSOR_FOREIGN_H
#define DTENSOR_FOREIGN_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/ckpt.h"
#include "dtensor/export.h"
#include "dtensor/layout.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* llm.c's GPT-2 checkpoint header: int32[256], [0] magic, [1] version (3: f32, 5: bf16),
 * [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp. */
#define DT_FOREIGN_LLMC_MAGIC 20240326
#define DT_FOREIGN_LLMC_HEADER_INTS 256

/* ---- a foreign source ----------------------------------------------------------------------- */

typedef struct dt_foreign dt_foreign;

typedef enum dt_foreign_format {
    DT_FOREIGN_SAFETENSORS = 0,   /* one .safetensors file, or HF's sharded set */
    DT_FOREIGN_LLMC_GPT2 = 1,     /* llm.c's gpt2_*.bin (version 3 or 5) */
} dt_foreign_format;

/* Opens a foreign source at `path`:
 *  - a .safetensors file (any name; detected by content: an 8-byte little-endian header
 *    length, then a JSON object);
 *  - an HF index "*.safetensors.index.json" ({"weight_map": {name: file}}, files relative to
 *    its directory; every file it names is opened and its header parsed);
 *  - a directory holding "model.safetensors.index.json" or "model.safetensors" (in that order
 *    of preference);
 *  - an llm.c GPT-2 checkpoint (int32 header, magic 20240326, version 3 or 5), exposed as
 *    named virtual tensors (docs/foreign.md): "wte" [Vp, C], "wpe" [maxT, C],
 *    "h.{l}.ln1w" [C], "h.{l}.ln1b", "h.{l}.qkvw" [3C, C], "h.{l}.qkvb" [3C],
 *    "h.{l}.attprojw" [C, C], "h.{l}.attprojb" [C], "h.{l}.ln2w", "h.{l}.ln2b",
 *    "h.{l}.fcw" [4C, C], "h.{l}.fcb" [4C], "h.{l}.fcprojw" [C, 4C], "h.{l}.fcprojb" [C],
 *    "lnfw" [C], "lnfb" [C] (l from 0; f32 for version 3, bf16 for version 5).
 * Reads headers only (no tensor data) and checks them: every tensor's dtype is known, its
 * data_offsets [begin, end) lie inside the file's buffer and match dtype x shape, tensors do
 * not overlap; an index's files all exist and hold the tensors it maps to them; an llm.c
 * file's size matches its header. Owned handle, close with dt_foreign_close.
 * Returns DT_ERR_NOT_FOUND (no such path, or a directory without either file),
 * DT_ERR_CORRUPT (bad JSON, a header length or offsets that lie, a truncated file, an index
 * naming a tensor its file lacks: the message names the file and the tensor),
 * DT_ERR_UNSUPPORTED (an unknown dtype, an llm.c version other than 3 or 5), DT_ERR_IO,
 * DT_ERR_NO_MEMORY, DT_ERR_INVALID_ARGUMENT. Local (no MPI, no runtime needed). */
DT_API dt_status dt_foreign_open(const char *path, dt_foreign **src_out);
/* Accepts NULL. */
DT_API void dt_foreign_close(dt_foreign *src);

DT_API dt_foreign_format dt_foreign_format_of(const dt_foreign *src);
/* The path given to dt_foreign_open (borrowed). */
DT_API const char *dt_foreign_path(const dt_foreign *src);

/* One stored tensor. Strings borrowed from the handle. */
typedef struct dt_foreign_tensor_info {
    const char *name;
    dt_dtype dtype;               /* F32, F16, BF16, F64 and the integer types are known */
    int rank;
    int64_t shape[DT_MAX_RANK];
    const char *file;             /* path of the file that holds it */
    uint64_t file_offset;         /* absolute offset of its first byte in that file */
    uint64_t bytes;
} dt_foreign_tensor_info;

/* Tensors in file order (for a sharded set: files in the index's order, each in its header's
 * order of data offsets). */
DT_API int64_t dt_foreign_num_tensors(const dt_foreign *src);
DT_API dt_status dt_foreign_tensor(const dt_foreign *src, int64_t i,
                                   dt_foreign_tensor_info *info_out);
/* Index of tensor `name`; DT_ERR_NOT_FOUND (message names the source path and the tensor). */
DT_API dt_status dt_foreign_find(const dt_foreign *src, const char *name, int64_t *index_out);
/* A string of the safetensors "__metadata__" (the first file's, for a sharded set: then
 * the index's "metadata" when the file lacks it), borrowed; NULL when absent. */
DT_API const char *dt_foreign_metadata(const dt_foreign *src, const char *key);

/* ---- views: what one target is made of -------------------------------------------------- */

/* How a target tensor is cut from a stored one. Applied in this order to stored tensor
 * `source` (shape S, rank r):
 *   1. rows [row_begin, row_end) of dim 0 (row_end < 0: to the end);
 *   2. split: when split_parts > 1, part split_index of split_parts equal parts along
 *      split_dim (the size there must divide by split_parts);
 *   3. transpose: when 1, the (then 2-D) result is transposed;
 *   4. pad_rows: when > 0, dim 0 of the result is extended to pad_rows rows (>= the rows it
 *      has), the extra rows zero (a vocabulary padded for sharding).
 * Examples: GPT-2's HF c_attn weight [C, 3C] -> q = {split_dim 1, parts 3, index 0};
 * llm.c's per-layer qkvw [3C, C] -> q in [in, out] = {split_dim 0, parts 3, index 0,
 * transpose 1}; llm.c's wte [Vp, C] -> [V, C] = {row_end V}. */
typedef struct dt_foreign_view {
    const char *source;           /* stored tensor name (borrowed during the call) */
    int64_t row_begin, row_end;
    int split_dim, split_parts, split_index;
    int transpose;
    int64_t pad_rows;
} dt_foreign_view;
#define DT_FOREIGN_VIEW_INIT {NULL, 0, -1, 0, 1, 0, 0, 0}

/* The shape of `view`'s result into *rank_out and shape_out (DT_MAX_RANK entries).
 * DT_ERR_NOT_FOUND (no such tensor), DT_ERR_SHAPE (rows outside the tensor, a split that does
 * not divide or a bad dim or index, transpose of a tensor not 2-D, pad_rows below the rows;
 * the message names the file and the tensor), DT_ERR_INVALID_ARGUMENT. Local. */
DT_API dt_status dt_foreign_view_shape(const dt_foreign *src, const dt_foreign_view *view,
                                       int *rank_out, int64_t *shape_out);

/* Fills tensors[i] (existing tensors, all on one mesh, any layout but not partial) with
 * views[i] of the source. Each target's global shape must equal its view's shape; its dtype
 * may be F32, F64, F16 or BF16 whatever the stored one of those four (converted on the host,
 * rounding to nearest even as dt_cast does). Every device reads from the files exactly the
 * stored bytes its own component needs (pread in contiguous runs of the stored tensor's
 * rows; replicas are read by each device that holds one; zero padding reads nothing), never
 * a whole tensor unless its component is one; components in device memory are filled through
 * a host buffer of their size. Collective over the clients holding devices of the tensors'
 * mesh; every client returns the same status, with the failing client's message.
 * Returns DT_ERR_NOT_FOUND (a missing tensor: names the source and the tensor), DT_ERR_SHAPE
 * (the view is bad, or its shape differs from the target's: names both shapes, the file and
 * the tensor), DT_ERR_CORRUPT (the file is shorter than its header says: names the file and
 * the tensor), DT_ERR_INVALID_ARGUMENT (NULL, tensors on different meshes, a partial layout,
 * a dtype that cannot be converted), DT_ERR_IO, DT_ERR_NO_MEMORY, DT_ERR_COMM. On failure the
 * targets' contents are unspecified. Not thread safe on one handle. */
DT_API dt_status dt_foreign_restore(const dt_foreign *src, int n, const dt_foreign_view *views,
                                    dt_tensor *const *tensors);

/* Bytes this process has read from the source's files into components of the device with
 * global id `device_id` (-1: all devices) since dt_foreign_open (headers excluded). Local. */
DT_API uint64_t dt_foreign_bytes_read(const dt_foreign *src, int device_id);

/* ---- GPT-2 --------------------------------------------------------------------------------- */

/* A GPT-2's sizes as a source gives them. */
typedef struct dt_foreign_gpt2_config {
    int64_t n_layer, n_head, n_embd;
    int64_t n_ctx;                /* rows of wpe */
    int64_t vocab;                /* true vocabulary (50257 for OpenAI's) */
    int64_t padded_vocab;         /* llm.c's Vp; = vocab for HF sources */
} dt_foreign_gpt2_config;

/* The config of a GPT-2 source: llm.c's from its header; an HF source's from its tensor
 * shapes (n_layer: the h.{l} blocks present; n_embd, n_ctx, vocab from wte and wpe) and
 * n_head from Hugging Face's "config.json" beside the file ("n_head"; 0 when there is no file
 * or no n_head in it: the caller then knows it). The sizes config.json gives (n_layer,
 * n_embd, n_positions, n_ctx, vocab_size; null or absent: not given) must match the tensors.
 * DT_ERR_NOT_FOUND (no wte/wpe, with or without the "transformer." prefix), DT_ERR_SHAPE
 * (inconsistent shapes, or config.json disagreeing with them: names the key), DT_ERR_PARSE
 * (config.json not JSON, or a size not a positive integer). Local. */
DT_API dt_status dt_foreign_gpt2_config_of(const dt_foreign *src,
                                           dt_foreign_gpt2_config *cfg_out);

/* One parameter of our GPT-2 and how it is cut from the source. */
typedef struct dt_foreign_map_entry {
    char *name;                   /* our parameter name (owned by the array) */
    dt_foreign_view view;         /* view.source owned by the array */
    int rank;
    int64_t shape[DT_MAX_RANK];   /* the view's (= our parameter's) shape */
} dt_foreign_map_entry;

/* The mapping from a GPT-2 source (HF names, with or without "transformer.", or llm.c's) to
 * our GPT-2's parameters, in this order (docs/foreign.md has the table):
 *   wte [vocab_rows, C], wpe [n_ctx, C], then per layer l:
 *   h.{l}.ln1.g [C], h.{l}.ln1.b [C],
 *   h.{l}.q.w [C, C], h.{l}.q.b [C], h.{l}.k.w, h.{l}.k.b, h.{l}.v.w, h.{l}.v.b,
 *   h.{l}.o.w [C, C], h.{l}.o.b [C] (attention output projection),
 *   h.{l}.ln2.g [C], h.{l}.ln2.b [C],
 *   h.{l}.fc.w [C, 4C], h.{l}.fc.b [4C], h.{l}.proj.w [4C, C], h.{l}.proj.b [C],
 *   then lnf.g [C], lnf.b [C].
 * Weights are [in, out] (y = x @ W + b); the head is tied to wte (no separate tensor).
 * vocab_rows: rows of our wte: 0 for the true vocabulary; larger pads with zero rows (e.g.
 * 50304 for 50257). On success *map_out is an owned array of *count_out entries (free with
 * dt_foreign_map_free) and *cfg_out (may be NULL) the config. Feed each entry's view with
 * the model's tensor of that name to dt_foreign_restore.
 * Returns dt_foreign_gpt2_config_of's errors, DT_ERR_NOT_FOUND (a tensor of the mapping is
 * missing: names the source and the tensor), DT_ERR_SHAPE (a stored shape does not fit the
 * config, or vocab_rows below the vocabulary), DT_ERR_NO_MEMORY. Local. */
DT_API dt_status dt_foreign_gpt2_map(const dt_foreign *src, int64_t vocab_rows,
                                     dt_foreign_map_entry **map_out, int *count_out,
                                     dt_foreign_gpt2_config *cfg_out);
/* Accepts NULL. */
DT_API void dt_foreign_map_free(dt_foreign_map_entry *map, int count);

/* Writes our GPT-2 checkpoint `ckpt` (the parameter names above, any dtype among F32, F16,
 * BF16, written as stored) as one Hugging Face GPT-2 safetensors file at `out_path`: names
 * "wte.weight", "wpe.weight", "h.{l}.ln_1.weight", "h.{l}.ln_1.bias",
 * "h.{l}.attn.c_attn.weight" [C, 3C] (q, k, v fused), "h.{l}.attn.c_attn.bias" [3C],
 * "h.{l}.attn.c_proj.weight" [C, C], "h.{l}.attn.c_proj.bias", "h.{l}.ln_2.weight",
 * "h.{l}.ln_2.bias", "h.{l}.mlp.c_fc.weight" [C, 4C], "h.{l}.mlp.c_fc.bias",
 * "h.{l}.mlp.c_proj.weight" [4C, C], "h.{l}.mlp.c_proj.bias", "ln_f.weight", "ln_f.bias"
 * (Conv1D orientation [in, out], our own; the tied head written once, as wte; no lm_head),
 * __metadata__ {"format": "pt"}. vocab: rows of wte to write (0: all; less drops the
 * padding rows). Reads our tensors through dt_ckpt_read_box (CRCs checked), holding one output
 * tensor (plus one q/k/v part for c_attn) at a time; writes OUT.partial, then renames it.
 * Tensors of the checkpoint outside the mapping (optimizer state) are left out.
 * Beside it, in the same directory, "config.json": Hugging Face's GPT-2 config (model_type
 * "gpt2", architectures ["GPT2LMHeadModel"], vocab_size, n_positions = n_ctx, n_embd,
 * n_layer, n_head, n_inner null, layer_norm_epsilon 1e-5, activation_function "gelu_new",
 * tie_word_embeddings true, torch_dtype), replacing one already there (the directory is the
 * model's, as Hugging Face's save_pretrained has it); dt_foreign_gpt2_config_of reads it back.
 * n_head: opts->heads, else the checkpoint's "train/config" value ("heads=H", as train_gpt2
 * saves it), else DT_ERR_INVALID_ARGUMENT asking for it; it must divide n_embd.
 * DT_ERR_NOT_FOUND (a parameter missing: names it), DT_ERR_SHAPE (shapes that do not fit
 * GPT-2 or vocab too large), DT_ERR_INVALID_ARGUMENT (heads unknown or not dividing the width;
 * out_path a directory, or inside a checkpoint directory or a manager's root: nothing
 * written), DT_ERR_CORRUPT, DT_ERR_IO, DT_ERR_NO_MEMORY. opts: NULL or its fsync and heads
 * fields (max_file_bytes is ignored: one file). Local. */
DT_API dt_status dt_ckpt_export_hf_gpt2(const dt_ckpt *ckpt, const char *out_path,
                                        int64_t vocab, const dt_ckpt_export_opts *opts);


/* ---- Hugging Face model directories: config.json and the Llama family ---------------------- */

/* The architecture family of an HF model directory. */
typedef enum dt_hf_arch {
    DT_HF_GPT2 = 0,               /* model_type "gpt2" (GPT2LMHeadModel) */
    DT_HF_LLAMA = 1,              /* "llama", "qwen2", "mistral" (LlamaForCausalLM and kin) */
} dt_hf_arch;

#define DT_HF_MODEL_TYPE_MAX 32

/* What an HF config.json says about a decoder-only language model (docs/foreign.md). */
typedef struct dt_hf_config {
    dt_hf_arch arch;
    char model_type[DT_HF_MODEL_TYPE_MAX]; /* as written: "gpt2", "llama", "qwen2", "mistral" */
    int64_t vocab;                /* vocab_size */
    int64_t hidden;               /* hidden_size (GPT-2: n_embd) */
    int64_t intermediate;         /* intermediate_size (GPT-2: n_inner, null: 4 hidden) */
    int64_t layers;               /* num_hidden_layers (GPT-2: n_layer) */
    int64_t heads;                /* num_attention_heads (GPT-2: n_head) */
    int64_t kv_heads;             /* num_key_value_heads (absent: heads; GPT-2: heads) */
    int64_t head_dim;             /* head_dim (absent or null: hidden / heads) */
    int64_t max_positions;        /* max_position_embeddings (GPT-2: n_positions) */
    double norm_eps;              /* rms_norm_eps (GPT-2: layer_norm_epsilon) */
    double rope_theta;            /* rope_theta (absent: 10000); unused by GPT-2 */
    /* rope_scaling of rope_type (or type) "llama3": factor, low_freq_factor,
     * high_freq_factor, original_max_position_embeddings; rope_llama3 0 without scaling. */
    int rope_llama3;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max;
    int tie_word_embeddings;      /* absent: 1 for GPT-2, 0 for Llama (Qwen2's files say) */
    int attention_bias;           /* q, k, v biases: Qwen2 always; Llama's "attention_bias" */
    int64_t bos_token_id, eos_token_id; /* -1 when absent or null (the first of a list) */
} dt_hf_config;

/* Reads the config.json of an HF model directory (`path`: the directory or the file).
 * model_type "gpt2" reads GPT-2's keys (n_embd, n_layer, n_head, n_positions, vocab_size,
 * n_inner, layer_norm_epsilon); "llama", "qwen2" and "mistral" read LlamaForCausalLM's
 * (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, head_dim, max_position_embeddings, vocab_size, rms_norm_eps,
 * rope_theta, rope_scaling, tie_word_embeddings, attention_bias, mlp_bias). Every size must
 * be a positive integer, kv heads must divide heads, hidden must be heads x head_dim for
 * GPT-2. Local.
 * Returns DT_ERR_NOT_FOUND (no config.json; a required key missing: the message names the
 * file and the key), DT_ERR_PARSE (not JSON; a key of the wrong type or value: names the
 * key), DT_ERR_UNSUPPORTED (a model_type, a rope_scaling type, mlp_bias true or a
 * hidden_act other than silu / gelu_new: names the key and its value),
 * DT_ERR_INVALID_ARGUMENT (NULL). cfg_out written only on success. */
DT_API dt_status dt_hf_config_read(const char *path, dt_hf_config *cfg_out);

/* Writes cfg as Hugging Face's config.json at `path` (the architecture's keys as
 * dt_hf_config_read reads them, plus architectures, torch_dtype "float32" and
 * hidden_act), replacing the file through a temporary one. Local.
 * DT_ERR_INVALID_ARGUMENT, DT_ERR_IO, DT_ERR_NO_MEMORY. */
DT_API dt_status dt_hf_config_write(const dt_hf_config *cfg, const char *path);

/* The mapping of a Llama-family HF source (names "model.embed_tokens.weight",
 * "model.layers.{l}.self_attn.q_proj.weight", ..., "lm_head.weight"; nn.Linear weights
 * [out, in], transposed by the views into our [in, out]) onto our names, in this order:
 *   embed [V, C];  per layer l: layers.{l}.attn_norm [C], layers.{l}.q.w [C, H*D],
 *   (layers.{l}.q.b [H*D] with attention_bias), layers.{l}.k.w [C, KV*D], (k.b),
 *   layers.{l}.v.w [C, KV*D], (v.b), layers.{l}.o.w [H*D, C], layers.{l}.mlp_norm [C],
 *   layers.{l}.gate.w [C, F], layers.{l}.up.w [C, F], layers.{l}.down.w [F, C];
 *   norm [C]; head [V, C] (HF's lm_head, not transposed; absent when tied).
 * q and k stay in HF's rotate-half order. Checks every stored shape against cfg.
 * Returns DT_ERR_NOT_FOUND (a tensor missing: names the source and the tensor), DT_ERR_SHAPE
 * (a stored shape that does not fit cfg: names both), DT_ERR_INVALID_ARGUMENT,
 * DT_ERR_NO_MEMORY. Local; free the map with dt_foreign_map_free. */
DT_API dt_status dt_foreign_llama_map(const dt_foreign *src, const dt_hf_config *cfg,
                                      dt_foreign_map_entry **map_out, int *count_out);


/* Writes a checkpoint of our parameters of an HF-family model (the names of
 * dt_foreign_llama_map, or of dt_foreign_gpt2_map for cfg->arch DT_HF_GPT2) as a Hugging Face
 * model directory `out_dir` (created; files in it replaced): config.json from cfg
 * (dt_hf_config_write), the weights with HF names in their stored dtype (nn.Linear weights
 * transposed back to [out, in]; GPT-2 as dt_ckpt_export_hf_gpt2 writes it), as one
 * model.safetensors, or, when opts->max_file_bytes is set and the weights exceed it,
 * model-0000i-of-0000N.safetensors files (tensors whole, in order) and
 * model.safetensors.index.json; and the tokenizer files of directory `tokenizer_from` (NULL:
 * none) copied: tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab.json,
 * merges.txt, generation_config.json, those present. Each safetensors file is written under a
 * partial name and renamed. Reads through dt_ckpt_read_box (CRCs checked), one tensor at a
 * time. Local. DT_ERR_NOT_FOUND (a parameter missing: names it), DT_ERR_SHAPE,
 * DT_ERR_INVALID_ARGUMENT (out_dir inside a checkpoint), DT_ERR_CORRUPT, DT_ERR_IO,
 * DT_ERR_NO_MEMORY. */
DT_API dt_status dt_ckpt_export_hf(const dt_ckpt *ckpt, const char *out_dir,
                                   const dt_hf_config *cfg, const char *tokenizer_from,
                                   const dt_ckpt_export_opts *opts);

#ifdef __cplusplus
}
#endif
#endif
