/* libdtensor general ops: the math, shape, index, reduction, linear-algebra, random and loss
 * ops any model needs, each one op definition (opdef.h) with its factor rule and backward
 * (docs/ops.md has the table and every rule).
 *
 * Conventions for every function below. Inputs are dt_tensors of one mesh; the output is a
 * new owned tensor written only on success, in the layout the propagator picks from the
 * inputs' layouts (it may be partial: relay it out, or call dt_op_call with a layout, to force
 * another). Floating inputs are f32 or f64 (both operands of a binary op alike; f64 is what
 * the validator's finite differences use); integer index tensors are i32 or i64; comparisons
 * give u8 (0 or 1); index outputs (argmax, topk, sort) are i64. Binary ops broadcast as NumPy
 * does (dims aligned from the right; a dim of size 1 or a missing one stretches). Axes may be
 * negative (counted from the end). A recording tape records every call (autograd.h) and its
 * backward is the op's own. All are collective over the mesh's clients; errors:
 * DT_ERR_INVALID_ARGUMENT (NULL arguments, an axis or attribute out of range), DT_ERR_SHAPE
 * (shapes that do not broadcast or fit, different meshes, a dtype the op does not take; the
 * message names the op and the operands' shapes), and dt_relayout's (DT_ERR_COMM). */
#ifndef DTENSOR_OPS_GENERAL_H
#define DTENSOR_OPS_GENERAL_H

#include <stdint.h>

#include "dtensor/export.h"
#include "dtensor/layout.h"
#include "dtensor/opdef.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- unary math (family "unary"; rule "...->...") ----------------------------------------
 * y = f(x) elementwise. log, log1p, sqrt, rsqrt, reciprocal follow IEEE (NaN / inf outside
 * their domain, as PyTorch). sign(0) = 0; abs' and sign's gradients at 0 are 0 (PyTorch). */
DT_API dt_status dt_exp(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_log(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_log1p(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_sqrt(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_rsqrt(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_tanh(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_sigmoid(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_silu(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_neg(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_abs(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_sign(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_square(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_reciprocal(const dt_tensor *x, dt_tensor **out);
/* y = x^p (a scalar exponent); y = min(max(x, lo), hi) (gradient 1 inside [lo, hi], else 0);
 * y = x + c. */
DT_API dt_status dt_pow_scalar(const dt_tensor *x, double p, dt_tensor **out);
DT_API dt_status dt_clamp(const dt_tensor *x, double lo, double hi, dt_tensor **out);
DT_API dt_status dt_add_scalar(const dt_tensor *x, double c, dt_tensor **out);

/* ---- binary, broadcasting (family "binary"; rule "...,...->...") ------------------------
 * div, pow (a^b; b's gradient a^b log a needs a > 0), maximum, minimum (on ties the gradient
 * is split in halves between a and b, as PyTorch). dt_add, dt_sub, dt_mul (ops.h) broadcast
 * too. */
DT_API dt_status dt_div(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);
DT_API dt_status dt_pow(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);
DT_API dt_status dt_maximum(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);
DT_API dt_status dt_minimum(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);
/* Comparisons: u8 1 where the relation holds, else 0 (NaN compares false, ne true). Not
 * differentiable. */
DT_API dt_status dt_eq(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);
DT_API dt_status dt_ne(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);
DT_API dt_status dt_lt(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);
DT_API dt_status dt_le(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);
DT_API dt_status dt_gt(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);
DT_API dt_status dt_ge(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);
/* out = cond ? a : b (cond u8 or any integer/float dtype, nonzero is true), all three
 * broadcast; out = mask ? value : x (mask broadcast to x). */
DT_API dt_status dt_where(const dt_tensor *cond, const dt_tensor *a, const dt_tensor *b,
                          dt_tensor **out);
DT_API dt_status dt_masked_fill(const dt_tensor *x, const dt_tensor *mask, double value,
                                dt_tensor **out);

/* ---- reductions (family "reduction") -----------------------------------------------------
 * Over the `naxes` axes listed (naxes == 0: every axis), keepdim keeping them as size 1.
 * sum and mean leave a sharded reduced axis partial (sum); max and min partial (max / min);
 * argmax, argmin (one axis, the first index of the extreme value, i64), logsumexp and var
 * (correction: 1 unbiased, 0 biased) gather the reduced axes. The gradient of max / min goes
 * to every position equal to the extreme, divided among them (PyTorch's amax). */
DT_API dt_status dt_sum(const dt_tensor *x, const int *axes, int naxes, int keepdim,
                        dt_tensor **out);
DT_API dt_status dt_mean(const dt_tensor *x, const int *axes, int naxes, int keepdim,
                         dt_tensor **out);
DT_API dt_status dt_max(const dt_tensor *x, const int *axes, int naxes, int keepdim,
                        dt_tensor **out);
DT_API dt_status dt_min(const dt_tensor *x, const int *axes, int naxes, int keepdim,
                        dt_tensor **out);
DT_API dt_status dt_logsumexp(const dt_tensor *x, const int *axes, int naxes, int keepdim,
                              dt_tensor **out);
DT_API dt_status dt_var(const dt_tensor *x, const int *axes, int naxes, int correction,
                        int keepdim, dt_tensor **out);
DT_API dt_status dt_argmax(const dt_tensor *x, int axis, int keepdim, dt_tensor **out);
DT_API dt_status dt_argmin(const dt_tensor *x, int axis, int keepdim, dt_tensor **out);
/* log(softmax(x)) along axis, stable (dt_softmax, ops.h, is the softmax). */
DT_API dt_status dt_log_softmax(const dt_tensor *x, int axis, dt_tensor **out);
/* Inclusive cumulative sum along axis. */
DT_API dt_status dt_cumsum(const dt_tensor *x, int axis, dt_tensor **out);
/* The k largest (largest != 0) or smallest along axis, sorted, with their indices (i64; ties
 * by the lower index first); the values' gradient scatters dy to the indices. sort: all of
 * them (descending != 0: largest first), stable. Either output pointer may be NULL. */
DT_API dt_status dt_topk(const dt_tensor *x, int64_t k, int axis, int largest,
                         dt_tensor **values_out, dt_tensor **indices_out);
DT_API dt_status dt_sort(const dt_tensor *x, int axis, int descending, dt_tensor **values_out,
                         dt_tensor **indices_out);

/* ---- shape (family "shape") --------------------------------------------------------------
 * reshape: shape with at most one -1 (inferred); the rule merges and splits factors
 * ("(ij)k->i(jk)"), so a sharded leading factor stays sharded when its blocks stay whole.
 * permute: perm a permutation of 0..rank-1; transpose swaps two dims. slice: elements
 * start, start+step, ... < stop of one axis (step >= 1; start, stop clamped as Python's; a
 * negative start or stop counts from the end). concat along axis (n >= 1 tensors, equal
 * other dims), split into n parts of `sizes` (summing to the axis' size), stack along a new
 * axis. expand: broadcast to `shape` (-1 keeps a dim), no copy semantics promised.
 * squeeze drops a size-1 axis; unsqueeze inserts one at axis (0..rank). */
DT_API dt_status dt_reshape(const dt_tensor *x, int rank, const int64_t *shape,
                            dt_tensor **out);
DT_API dt_status dt_permute(const dt_tensor *x, const int *perm, dt_tensor **out);
DT_API dt_status dt_transpose(const dt_tensor *x, int axis0, int axis1, dt_tensor **out);
DT_API dt_status dt_slice(const dt_tensor *x, int axis, int64_t start, int64_t stop,
                          int64_t step, dt_tensor **out);
DT_API dt_status dt_concat(const dt_tensor *const *xs, int n, int axis, dt_tensor **out);
DT_API dt_status dt_split(const dt_tensor *x, int axis, const int64_t *sizes, int n,
                          dt_tensor **outs);
DT_API dt_status dt_stack(const dt_tensor *const *xs, int n, int axis, dt_tensor **out);
DT_API dt_status dt_expand(const dt_tensor *x, int rank, const int64_t *shape,
                           dt_tensor **out);
DT_API dt_status dt_squeeze(const dt_tensor *x, int axis, dt_tensor **out);
DT_API dt_status dt_unsqueeze(const dt_tensor *x, int axis, dt_tensor **out);

/* ---- indexing (family "index") -----------------------------------------------------------
 * gather (torch.gather): out[..., j, ...] = x[..., index[..., j, ...], ...] along axis, index
 * of x's rank (other dims <= x's). scatter_add: x with src added at index along axis
 * (out = x; out[index[p] along axis] += src[p]). index_select: the slices of x along axis at
 * the 1-D index. index_add: x with src's slices added at the 1-D index along axis. one_hot:
 * [index's shape..., classes] of `dtype` (f32 or f64) with 1 at each index. An index outside
 * its range is DT_ERR_INVALID_ARGUMENT naming it, on every client. */
DT_API dt_status dt_gather(const dt_tensor *x, int axis, const dt_tensor *index,
                           dt_tensor **out);
DT_API dt_status dt_scatter_add(const dt_tensor *x, int axis, const dt_tensor *index,
                                const dt_tensor *src, dt_tensor **out);
DT_API dt_status dt_index_select(const dt_tensor *x, int axis, const dt_tensor *index,
                                 dt_tensor **out);
DT_API dt_status dt_index_add(const dt_tensor *x, int axis, const dt_tensor *index,
                              const dt_tensor *src, dt_tensor **out);
DT_API dt_status dt_one_hot(const dt_tensor *index, int64_t classes, dt_dtype dtype,
                            dt_tensor **out);

/* ---- linear algebra (family "linear") ----------------------------------------------------
 * einsum of one or two operands, any equation in NumPy's notation with explicit output
 * ("bij,bjk->bik", "...ij,jk->...ik", "ii->i" is not supported: a letter appears at most
 * once per operand); its factor rule is the equation itself, so a sharded contracted letter
 * gives a partial output, and two operands run as one batched GEMM (BLAS) after a permute.
 * matmul_broadcast: torch.matmul for ranks >= 1 with broadcast batch dims. */
DT_API dt_status dt_einsum(const char *equation, const dt_tensor *const *xs, int n,
                           dt_tensor **out);
DT_API dt_status dt_matmul_broadcast(const dt_tensor *a, const dt_tensor *b, dt_tensor **out);

/* ---- random and constructors (family "random", "host") ----------------------------------
 * A new tensor of `shape` in `layout` (not partial) drawn from Philox-4x32-10 keyed by (seed,
 * stream) and each element's global row-major index, so every mesh and layout draws the same
 * global tensor: uniform in [lo, hi), normal (Box-Muller on two uniforms), bernoulli (1 with
 * probability p, of `dtype`). dtype f32 or f64. Local: no communication. */
DT_API dt_status dt_random_uniform(const dt_layout *layout, const int64_t *shape,
                                   dt_dtype dtype, double lo, double hi, uint64_t seed,
                                   uint64_t stream, dt_tensor **out);
DT_API dt_status dt_random_normal(const dt_layout *layout, const int64_t *shape,
                                  dt_dtype dtype, double mean, double std, uint64_t seed,
                                  uint64_t stream, dt_tensor **out);
DT_API dt_status dt_random_bernoulli(const dt_layout *layout, const int64_t *shape,
                                     dt_dtype dtype, double p, uint64_t seed, uint64_t stream,
                                     dt_tensor **out);
/* 0, 1, ..., n-1 as a 1-D tensor of dtype (i32, i64, f32, f64) in layout. Local. */
DT_API dt_status dt_arange(const dt_layout *layout, int64_t n, dt_dtype dtype,
                           dt_tensor **out);
/* A tensor of `shape` in `layout` from a row-major host array that every client passes whole
 * (each device copies its block; local), or that only client `root` passes (the others pass
 * NULL; scattered over the transport: collective). dt_tensor_to_host gathers the whole
 * tensor (partial dims reduced) into `data` (numel * dtype size bytes) on client root, or on
 * every client when root < 0. Collective. */
DT_API dt_status dt_tensor_from_host(const dt_layout *layout, dt_dtype dtype,
                                     const int64_t *shape, const void *data, dt_tensor **out);
DT_API dt_status dt_tensor_scatter_from(const dt_layout *layout, dt_dtype dtype,
                                        const int64_t *shape, const void *data, int root,
                                        dt_tensor **out);
DT_API dt_status dt_tensor_to_host(const dt_tensor *x, int root, void *data, size_t bytes);

/* ---- losses (family "loss") --------------------------------------------------------------
 * mse: mean of (pred - target)^2 over every element (rank 0). cross_entropy: logits
 * [..., C] (class on the last axis), labels [...] (i32 or i64); the mean over the positions
 * whose label is not ignore_index of -log softmax(logits)[label] (PyTorch's reduction='mean',
 * NaN when every position is ignored); a label outside 0..C-1 other than ignore_index is
 * DT_ERR_INVALID_ARGUMENT. */
DT_API dt_status dt_mse(const dt_tensor *pred, const dt_tensor *target, dt_tensor **out);
DT_API dt_status dt_cross_entropy(const dt_tensor *logits, const dt_tensor *labels,
                                  int64_t ignore_index, dt_tensor **out);

/* ---- decoding (family "transformer"; docs/generate.md) -------------------------------------
 * rope_half: rotary position embeddings in the rotate-half form (Hugging Face's Llama, Qwen2,
 * Mistral) on x [..., T, heads, head_dim] (head_dim even): within each head, elements i and
 * i + head_dim/2 at sequence index t are rotated by the angle (pos_offset + t) * inv_freq[i],
 *   y[i] = x[i] cos - x[i + D/2] sin;  y[i + D/2] = x[i + D/2] cos + x[i] sin,
 * inv_freq[i] = theta^(-2i / head_dim), scaled as Llama 3.1 does when opts->llama3 (wavelengths
 * above original_max / low_freq_factor divided by factor, below original_max /
 * high_freq_factor kept, interpolated between). f32: the angle, cos and sin in f64 rounded to
 * f32. Rule "...thD->...thD": sequence- and head-sharded x rotate without communication, each
 * block at its global positions; linear (a partial x passes through). Its gradient is the
 * inverse rotation. opts NULL: theta 10000, no scaling. */
typedef struct dt_rope_opts {
    double theta;
    int llama3;
    double factor, low_freq_factor, high_freq_factor;
    int64_t original_max;
} dt_rope_opts;
#define DT_ROPE_OPTS_INIT {10000.0, 0, 8.0, 1.0, 4.0, 8192}
DT_API dt_status dt_rope_half(const dt_tensor *x, int64_t pos_offset, const dt_rope_opts *opts,
                              dt_tensor **out);
/* attention_cached: causal attention of T new queries at positions pos_offset..pos_offset+T-1
 * against a key/value cache holding positions 0..pos_offset+T-1 (the new ones written):
 * q [B, T, KV, G, D] (query head kv * G + g, grouped under its key/value head), k_cache,
 * v_cache [B, S, KV, D] with S >= pos_offset + T (positions beyond are not read); query t
 * attends to positions 0..pos_offset+t with scale 1/sqrt(D). Output like q. Rule
 * "btkgD,bSkD,bSkD->btkgD": batch, query positions, kv heads and groups shard with no
 * communication (the cache positions whole). Not differentiable (decoding; training uses
 * dt_attention_gqa). */
DT_API dt_status dt_attention_cached(const dt_tensor *q, const dt_tensor *k_cache,
                                     const dt_tensor *v_cache, int64_t pos_offset,
                                     dt_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
