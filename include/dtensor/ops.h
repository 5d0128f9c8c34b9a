/* libdtensor ops: local kernels on raw buffers (CPU; CUDA mirrors them) and the layout-aware
 * distributed operations on dt_tensors that training needs, forward and backward. */
#ifndef DTENSOR_OPS_H
#define DTENSOR_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/export.h"
#include "dtensor/layout.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================================
 * Part 1: local kernels on raw host buffers.
 *
 * Conventions: element counts are int64_t (>= 0); matrices are row-major with a leading
 * dimension (elements between rows); every kernel returns DT_OK or DT_ERR_INVALID_ARGUMENT
 * (negative size, NULL pointer with a non-empty size, bad leading dimension, bad dtype) and
 * then writes nothing. Outputs may alias inputs of the same shape (in-place) unless a comment
 * says otherwise. Scalars a kernel produces (sums, flags) are written through a pointer into
 * the same memory space as the inputs (host here; device memory for the CUDA mirrors), so a
 * distributed op can write them straight into a tensor's local component. Local; thread-safe.
 * The CUDA mirrors (ops/cuda/, built with -Dcuda=enabled) take the same arguments on device
 * pointers. Compute is f32 unless stated.
 * ====================================================================================== */

/* C[m,n] = alpha * op(A)[m,k] . op(B)[k,n] + beta * C, row-major, f32 accumulation.
 * op(X) = X (trans 0) or X^T (trans 1): A is m x k (lda >= k) or, transposed, k x m (lda >= m);
 * likewise B is k x n (ldb >= n) or n x k (ldb >= k); ldc >= n. A and B may be f32, f16 or
 * bf16 (each independently); f16/bf16 inputs are converted to f32 in blocks of the contraction
 * dim into a reused pool buffer. f32 x f32 calls cblas_sgemm directly on the caller's data.
 * beta == 0 ignores C's old contents (NaN included). C must not alias A or B.
 * DT_ERR_UNSUPPORTED for other dtypes or sizes beyond the BLAS int range; DT_ERR_NO_MEMORY. */
DT_API dt_status dt_kernel_gemm(int transa, int transb, int64_t m, int64_t n, int64_t k,
                                float alpha, const void *a, dt_dtype a_dtype, int64_t lda,
                                const void *b, dt_dtype b_dtype, int64_t ldb, float beta,
                                float *c, int64_t ldc);

/* Elementwise, f32, n elements: out = a + b, a - b, a * b; out = alpha * x; y += alpha * x;
 * x = value; dst = src (dst must not partially overlap src). */
DT_API dt_status dt_kernel_add(int64_t n, const float *a, const float *b, float *out);
DT_API dt_status dt_kernel_sub(int64_t n, const float *a, const float *b, float *out);
DT_API dt_status dt_kernel_mul(int64_t n, const float *a, const float *b, float *out);
DT_API dt_status dt_kernel_scale(int64_t n, float alpha, const float *x, float *out);
DT_API dt_status dt_kernel_axpy(int64_t n, float alpha, const float *x, float *y);
DT_API dt_status dt_kernel_fill(int64_t n, float value, float *x);
DT_API dt_status dt_kernel_copy(int64_t n, const float *src, float *dst);

/* Bias over the last dim of a row-major [rows, cols] matrix: y[i,j] += bias[j];
 * and its gradient db[j] = sum_i dy[i,j] (overwrites db; f32 accumulation in row order). */
DT_API dt_status dt_kernel_bias_add(int64_t rows, int64_t cols, const float *bias, float *y);
DT_API dt_status dt_kernel_bias_grad(int64_t rows, int64_t cols, const float *dy, float *db);

/* Activations, n elements. y = max(x, 0); dx = dy * (x > 0).
 * GELU, tanh form (GPT-2, PyTorch approximate='tanh'):
 *   y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));  dx = dy * dy/dx analytically.
 * The backward kernels take the forward *input* x. dx may alias dy. */
DT_API dt_status dt_kernel_relu(int64_t n, const float *x, float *y);
DT_API dt_status dt_kernel_relu_grad(int64_t n, const float *x, const float *dy, float *dx);
DT_API dt_status dt_kernel_gelu(int64_t n, const float *x, float *y);
DT_API dt_status dt_kernel_gelu_grad(int64_t n, const float *x, const float *dy, float *dx);

/* Softmax cross-entropy over row-major logits [rows, classes] with int32 labels [rows]
 * (each in 0..classes-1, else DT_ERR_INVALID_ARGUMENT naming the row), numerically stable
 * (max subtracted, log-sum-exp):
 *   *loss_out = scale * sum_i (logsumexp(logits[i,:]) - logits[i, labels[i]])
 * (scale = 1/rows gives the mean); and its gradient
 *   dlogits[i,j] = scale * (softmax(logits[i,:])_j - (j == labels[i])).
 * dlogits may alias logits. classes >= 1. */
DT_API dt_status dt_kernel_softmax_xent(int64_t rows, int64_t classes, const float *logits,
                                        const int32_t *labels, float scale, float *loss_out);
DT_API dt_status dt_kernel_softmax_xent_grad(int64_t rows, int64_t classes,
                                             const float *logits, const int32_t *labels,
                                             float scale, float *dlogits);

/* Full reductions of n f32 elements into one f32 (accumulated in f64 on the CPU):
 * sum, max (-inf for n == 0; NaN if any element is NaN), mean (NaN for n == 0), squared L2
 * norm. */
DT_API dt_status dt_kernel_sum(int64_t n, const float *x, float *out);
DT_API dt_status dt_kernel_max(int64_t n, const float *x, float *out);
DT_API dt_status dt_kernel_mean(int64_t n, const float *x, float *out);
DT_API dt_status dt_kernel_sq_norm(int64_t n, const float *x, float *out);

/* Reduction over the middle dim of x viewed as row-major [outer, len, inner] into
 * y [outer, inner]: op DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_MIN or DT_REDUCE_AVG (sum/len).
 * len == 0 gives the op's identity (0, -inf, +inf; NaN for avg). y must not alias x. */
DT_API dt_status dt_kernel_reduce_axis(dt_reduce_op op, int64_t outer, int64_t len,
                                       int64_t inner, const float *x, float *y);

/* Inf/NaN detection: *found_out = 1 if any of the n elements of x (f32, f16, bf16 or f64) is
 * an infinity or a NaN, else 0. */
DT_API dt_status dt_kernel_nonfinite(int64_t n, const void *x, dt_dtype dtype,
                                     int32_t *found_out);

/* Casts n elements between f32, f16, bf16 and f64: round to nearest even, NaN stays NaN
 * (quiet), infinities and signed zeros kept, values beyond the target's range become
 * infinities; f16 subnormals are produced and read exactly. f64 <-> f16/bf16 go through f32
 * (two roundings). NaN results are quiet NaNs keeping the top payload bits. src_dtype ==
 * dst_dtype copies.
 * dst must not overlap src. DT_ERR_UNSUPPORTED for other dtypes. */
DT_API dt_status dt_kernel_cast(int64_t n, const void *src, dt_dtype src_dtype, void *dst,
                                dt_dtype dst_dtype);

/* Transformer kernels (f32). Layer normalisation over the last dim of row-major
 * [rows, cols] (cols >= 1, eps >= 0; mean and variance accumulated in f64):
 *   y = (x - mean) / sqrt(var + eps) * gamma + beta   (biased variance, as PyTorch);
 * its gradient recomputes the row statistics from x and overwrites dgamma and dbeta [cols]
 * (sums over the rows). dx may alias dy. */
DT_API dt_status dt_kernel_layer_norm(int64_t rows, int64_t cols, const float *x,
                                      const float *gamma, const float *beta, float eps,
                                      float *y);
DT_API dt_status dt_kernel_layer_norm_grad(int64_t rows, int64_t cols, const float *x,
                                           const float *gamma, const float *dy, float eps,
                                           float *dx, float *dgamma, float *dbeta);

/* Softmax along the middle dim of x viewed as row-major [outer, len, inner], numerically
 * stable (the max subtracted, f64 sum of exponentials); its gradient from the forward output
 * y: dx = y (dy - sum(y dy)). Outputs may alias inputs. */
DT_API dt_status dt_kernel_softmax(int64_t outer, int64_t len, int64_t inner, const float *x,
                                   float *y);
DT_API dt_status dt_kernel_softmax_grad(int64_t outer, int64_t len, int64_t inner,
                                        const float *y, const float *dy, float *dx);

/* Scaled dot-product self-attention of q, k, v, y, all row-major [batch, seq, heads * head_dim]
 * (head h owns columns h*head_dim .. (h+1)*head_dim-1): for each batch, head and query t,
 *   p = softmax(q_t . k_j / sqrt(head_dim) over j <= t (causal != 0) or all j),
 *   y_t = sum_j p_j v_j.
 * The gradient recomputes p and overwrites dq, dk, dv. Outputs must not alias inputs.
 * DT_ERR_NO_MEMORY for the row buffer. */
DT_API dt_status dt_kernel_attention(int64_t batch, int64_t seq, int64_t heads,
                                     int64_t head_dim, int causal, const float *q,
                                     const float *k, const float *v, float *y);
DT_API dt_status dt_kernel_attention_grad(int64_t batch, int64_t seq, int64_t heads,
                                          int64_t head_dim, int causal, const float *q,
                                          const float *k, const float *v, const float *dy,
                                          float *dq, float *dk, float *dv);

/* Tiled (flash-attention style) attention, grouped-query form (kv_heads dividing heads; equal
 * for plain attention): blocks of 32 queries against blocks of 64 keys with an online softmax,
 * masked causal blocks skipped, O(32 x head_dim) scratch whatever seq (never seq x seq). lse,
 * when not NULL, gets the log-sum-exp of each row's scaled scores, [batch, heads, seq]. The
 * gradient recomputes each block's probabilities from the rows' log-sum-exp (nothing is kept
 * between the calls) and overwrites dq, dk, dv. Same results as dt_kernel_attention within
 * f32 rounding, not the same bits. DT_ERR_INVALID_ARGUMENT, DT_ERR_NO_MEMORY. Local. */
DT_API dt_status dt_kernel_attention_tiled(int64_t batch, int64_t seq, int64_t heads,
                                           int64_t kv_heads, int64_t head_dim, int causal,
                                           const float *q, const float *k, const float *v,
                                           float *y, float *lse);
DT_API dt_status dt_kernel_attention_tiled_grad(int64_t batch, int64_t seq, int64_t heads,
                                                int64_t kv_heads, int64_t head_dim, int causal,
                                                const float *q, const float *k, const float *v,
                                                const float *dy, float *dq, float *dk,
                                                float *dv);

/* Grouped-query attention (dt_kernel_attention_gqa) with dropout of the attention
 * probabilities: y_t = sum_j P_tj Z_tj v_j, where Z is dt_kernel_dropout_mask(p, seed, stream)
 * of the [batch, heads, seq, seq] tensor of the probabilities P (element ((b heads + h) seq +
 * t) seq + j): 0 for a dropped probability, 1 / (1 - p) for a kept one. The untiled or tiled
 * kernel as dt_attention_kernel_set chooses; p = 0 gives dt_kernel_attention_gqa's bits. The
 * gradient recomputes P and Z. DT_ERR_INVALID_ARGUMENT for p outside [0, 1), bad sizes or
 * NULL pointers; DT_ERR_NO_MEMORY. Local. */
DT_API dt_status dt_kernel_attention_dropout(int64_t batch, int64_t seq, int64_t heads,
                                             int64_t kv_heads, int64_t head_dim, int causal,
                                             float p, uint64_t seed, uint64_t stream,
                                             const float *q, const float *k, const float *v,
                                             float *y);
DT_API dt_status dt_kernel_attention_dropout_grad(int64_t batch, int64_t seq, int64_t heads,
                                                  int64_t kv_heads, int64_t head_dim,
                                                  int causal, float p, uint64_t seed,
                                                  uint64_t stream, const float *q,
                                                  const float *k, const float *v,
                                                  const float *dy, float *dq, float *dk,
                                                  float *dv);

/* Which CPU kernel dt_kernel_attention*, dt_kernel_attention_gqa* and so dt_attention* run (on
 * CPU meshes and the simulated GPU; CUDA keeps its own): AUTO (the default) takes the tiled
 * one from seq >= DT_ATTENTION_TILED_MIN_SEQ on and the untiled one below (so short
 * sequences keep their former bits). The environment variable DT_ATTENTION_KERNEL=tiled,
 * untiled or auto sets the initial choice. Process-wide; returns the previous choice (an
 * unknown value changes nothing). Every process of a job must choose alike. */
typedef enum dt_attention_kernel {
    DT_ATTENTION_KERNEL_AUTO = 0,
    DT_ATTENTION_KERNEL_UNTILED = 1,
    DT_ATTENTION_KERNEL_TILED = 2,
} dt_attention_kernel;
#define DT_ATTENTION_TILED_MIN_SEQ 256
DT_API dt_attention_kernel dt_attention_kernel_set(dt_attention_kernel kernel);

/* Philox-4x32-10 (Salmon et al., SC 2011): out = the 10-round bijection of ctr under key
 * (Random123's known answers). Local, cannot fail. */
DT_API void dt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* The dropout mask of the elements with global row-major indices first .. first+n-1 of a
 * tensor: element g is 0 (dropped) when the top 24 bits of word g % 4 of
 * dt_philox4x32_10({g / 4 as two words, stream as two words}, {seed as two words}), read as
 * u in [0, 1), are below p, else 1 / (1 - p). So a mask depends only on (seed, stream, g),
 * not on how the elements are split. DT_ERR_INVALID_ARGUMENT for a negative first or n, a NULL
 * mask with n > 0, or p outside [0, 1]. Local. */
DT_API dt_status dt_kernel_dropout_mask(int64_t first, int64_t n, float p, uint64_t seed,
                                        uint64_t stream, float *mask);

/* Embedding lookup from the slice of a table of `vocab` rows holding rows lo .. lo+rows-1
 * ([rows, dim]): out[i, :] = table[ids[i] - lo, :] for n ids inside the slice, zeros for the
 * other ids of the table (so the slices' outputs add up to the full lookup). The gradient
 * overwrites dtable [rows, dim] with the sum of dout's rows whose id falls in the slice.
 * DT_ERR_INVALID_ARGUMENT for a slice outside 0..vocab-1, and for an id outside 0..vocab-1
 * (negative or >= vocab, as PyTorch's IndexError), the message naming the id and vocab; the
 * CUDA backend finds such an id on the device and reports it at the next sync of the ops
 * (so dt_embedding still returns it). Local. */
DT_API dt_status dt_kernel_embedding(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                                     int64_t vocab, int64_t dim, const float *table,
                                     float *out);
DT_API dt_status dt_kernel_embedding_grad(int64_t n, const int32_t *ids, int64_t lo,
                                          int64_t rows, int64_t vocab, int64_t dim,
                                          const float *dout, float *dtable);

/* Vocab-parallel cross-entropy pieces (Megatron). `logits` [rows, cols] holds classes
 * lo .. lo+cols-1 of `vocab`; rowmax [rows] the max over all classes. stats writes
 * sumexp[i] = sum_j exp(logits[i,j] - rowmax[i]) and target[i] = logits[i, labels[i] - lo]
 * when the label is in the slice, else 0 (both summed over the slices afterwards). A negative
 * label marks a row to ignore (padding: no loss, zero gradient); labels >= vocab are
 * DT_ERR_INVALID_ARGUMENT naming the row. loss writes
 *   *loss_out = scale * sum over rows with labels[i] >= 0 of
 *               (log(sumexp[i]) + rowmax[i] - target[i]);
 * grad writes dlogits = scale * (exp(logits - rowmax) / sumexp - onehot(labels - lo)), zeros
 * on ignored rows. */
DT_API dt_status dt_kernel_vocab_xent_stats(int64_t rows, int64_t cols, const float *logits,
                                            const float *rowmax, int64_t lo, int64_t vocab,
                                            const int32_t *labels, float *sumexp,
                                            float *target);
DT_API dt_status dt_kernel_vocab_xent_loss(int64_t rows, const float *rowmax,
                                           const float *sumexp, const float *target,
                                           const int32_t *labels, float scale,
                                           float *loss_out);
DT_API dt_status dt_kernel_vocab_xent_grad(int64_t rows, int64_t cols, const float *logits,
                                           const float *rowmax, const float *sumexp,
                                           int64_t lo, const int32_t *labels, float scale,
                                           float *dlogits);

/* Optimizer updates on flat f32 buffers of n elements. `grad` is read only; the gradient
 * used is g = grad_scale * grad (grad_scale undoes loss scaling or clips). */

/* SGD with momentum (PyTorch torch.optim.SGD semantics, zero-initialised momentum buffer):
 *   g += weight_decay * p
 *   buf = momentum * buf + (1 - dampening) * g      (skipped when momentum == 0)
 *   d = nesterov ? g + momentum * buf : buf          (d = g when momentum == 0)
 *   p -= lr * d
 * momentum_buf may be NULL when momentum == 0. (PyTorch starts the buffer at the first g
 * instead of zero: the same when dampening == 0.) */
typedef struct dt_sgd_opts {
    float lr;
    float momentum;
    float dampening;
    float weight_decay;
    int nesterov;
    float grad_scale;
} dt_sgd_opts;
#define DT_SGD_OPTS_INIT {0.01f, 0.0f, 0.0f, 0.0f, 0, 1.0f}

DT_API dt_status dt_kernel_sgd(int64_t n, const dt_sgd_opts *opts, float *param,
                               const float *grad, float *momentum_buf);

/* Adam (decoupled == 0: L2, g += weight_decay * p) and AdamW (decoupled == 1:
 * p -= lr * weight_decay * p before the step), PyTorch semantics, zero-initialised moments:
 *   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
 *   p -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
 * `step` is the 1-based count of this update (bias correction); step < 1 is
 * DT_ERR_INVALID_ARGUMENT. */
typedef struct dt_adam_opts {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
    int decoupled;
    float grad_scale;
} dt_adam_opts;
#define DT_ADAM_OPTS_INIT {0.001f, 0.9f, 0.999f, 1e-8f, 0.0f, 0, 1.0f}
#define DT_ADAMW_OPTS_INIT {0.001f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1.0f}

DT_API dt_status dt_kernel_adam(int64_t n, const dt_adam_opts *opts, int64_t step, float *param,
                                const float *grad, float *m, float *v);

/* ======================================================================================
 * Part 2: distributed ops on dt_tensors (SPMD; docs/ops.md has the layout rules table).
 *
 * Each op takes tensors on one mesh, decides the output layout from the input layouts,
 * relays inputs out as needed (dt_relayout, cheapest valid choice by a traffic-plus-compute
 * model) and runs the local kernel on every local component. Where an op takes
 * `layout` (may be NULL), NULL asks for the natural output layout (possibly partial) and a
 * layout asks for exactly that one (e.g. reduced instead of partial); it must be on the
 * inputs' mesh with the output's rank. Inputs are never modified except where stated;
 * outputs are new owned tensors written only on success.
 *
 * All are collective: every client holding devices of the mesh calls them in the same order
 * with the same arguments. Dtype is f32 unless stated. Errors: DT_ERR_INVALID_ARGUMENT for
 * NULL arguments; DT_ERR_SHAPE for mismatched shapes, ranks, dtypes or meshes (message names
 * the operand and the shapes); DT_ERR_UNSUPPORTED for a GPU mesh without CUDA kernels; and
 * whatever dt_relayout returns (DT_ERR_COMM).
 * ====================================================================================== */

/* C = op(A) . op(B) for 2-D A, B (f32, f16 or bf16; C is f32); op as in dt_kernel_gemm.
 * Natural layouts (mesh dims of op(A) = [m, k], op(B) = [k, n]):
 *   data parallel:   A [b, -] x B [-, -]  -> C [b, -]
 *   column parallel: A [-, -] x B [-, c]  -> C [-, c]
 *   row parallel:    A [-, r] x B [r, -]  -> C [-, -] partial r (sum)
 *   and their combinations (A [b, r] x B [r, c] -> C [b, c] partial r); a sum-partial operand
 *   whose mesh dim the other operand leaves replicated passes through to C.
 * Any other combination is first relaid out to the cheapest of these. */
DT_API dt_status dt_matmul(const dt_tensor *a, const dt_tensor *b, int transa, int transb,
                           const dt_layout *layout, dt_tensor **out);

/* Gradients of C = op(A) . op(B) given dC: dA and dB (either output pointer may be NULL to
 * skip it), each in its natural layout (e.g. for data parallel dB is partial over the batch
 * mesh dim, which a ZeRO optimizer reduce-scatters) or in da_layout / db_layout if given. */
DT_API dt_status dt_matmul_backward(const dt_tensor *a, const dt_tensor *b, int transa,
                                    int transb, const dt_tensor *dc, const dt_layout *da_layout,
                                    const dt_layout *db_layout, dt_tensor **da_out,
                                    dt_tensor **db_out);

/* Elementwise binary ops on equal shapes (f32, f16 or bf16: 16-bit operands are widened to
 * f32, computed in f32 and the result rounded to their dtype when both share it, else f32;
 * the same for dt_scale, dt_relu, dt_gelu and their backward). Natural output layout: a's or b's, whichever needs
 * the cheaper relayout of the other operand (a's on a tie). Sum-partial operands stay partial
 * for add and sub; mul reduces partial operands first. */
DT_API dt_status dt_add(const dt_tensor *a, const dt_tensor *b, const dt_layout *layout,
                        dt_tensor **out);
DT_API dt_status dt_sub(const dt_tensor *a, const dt_tensor *b, const dt_layout *layout,
                        dt_tensor **out);
DT_API dt_status dt_mul(const dt_tensor *a, const dt_tensor *b, const dt_layout *layout,
                        dt_tensor **out);
/* out = alpha * x, in x's layout (sum-partial stays partial). */
DT_API dt_status dt_scale(const dt_tensor *x, float alpha, dt_tensor **out);
/* In place: y += alpha * x, in y's layout (x relaid out to it). */
DT_API dt_status dt_axpy(float alpha, const dt_tensor *x, dt_tensor *y);

/* y = x + bias over x's last dim (bias 1-D of that size), in x's layout; the bias is relaid
 * out to be sharded like x's last dim and replicated over every other mesh dim. */
DT_API dt_status dt_bias_add(const dt_tensor *x, const dt_tensor *bias, dt_tensor **out);
/* db = sum of dy over every dim but the last: sharded like dy's last dim, partial (sum) over
 * the mesh dims sharding dy's other dims (natural), or `layout` if given. */
DT_API dt_status dt_bias_grad(const dt_tensor *dy, const dt_layout *layout, dt_tensor **out);

/* Activations in x's layout (a partial x is reduced first); backward takes the forward input
 * x and dy, and gives dx in x's (reduced) layout. */
DT_API dt_status dt_relu(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_relu_backward(const dt_tensor *x, const dt_tensor *dy, dt_tensor **dx_out);
DT_API dt_status dt_gelu(const dt_tensor *x, dt_tensor **out);
DT_API dt_status dt_gelu_backward(const dt_tensor *x, const dt_tensor *dy, dt_tensor **dx_out);

/* Mean softmax cross-entropy of logits [rows, classes] against int32 labels [rows]:
 * loss = (1/rows) sum_i ce_i, a rank-0 f32 tensor. The class dim is unsharded first (if
 * sharded); rows keep their sharding and the labels follow it. Natural output: partial (sum)
 * over the mesh dims sharding the rows; `layout` (rank 0) asks for another one.
 * The backward gives dlogits = dloss * d(loss)/d(logits) in the logits' (class-unsharded)
 * layout; dloss is the incoming scalar gradient (1, or the loss scale). */
DT_API dt_status dt_softmax_xent(const dt_tensor *logits, const dt_tensor *labels,
                                 const dt_layout *layout, dt_tensor **loss_out);
DT_API dt_status dt_softmax_xent_backward(const dt_tensor *logits, const dt_tensor *labels,
                                          float dloss, dt_tensor **dlogits_out);

/* Reduces x (f32, or f16 / bf16 widened to f32: f32 accumulation and an f32 result) over `axis`
 * (negative counts from the end; DT_ALL_AXES: every dim, rank-0
 * result) with DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_MIN or DT_REDUCE_AVG (mean over the
 * global count). The reduced dims drop out. Natural output: the kept dims keep their
 * sharding; a reduced dim sharded on mesh dim d makes the result partial over d (sum for sum
 * and mean, max, min); `layout` asks for another one. A sum-partial x stays partial for sum
 * and mean and is reduced first for max and min. */
#define DT_ALL_AXES 0x7fff
DT_API dt_status dt_reduce(const dt_tensor *x, dt_reduce_op op, int axis,
                           const dt_layout *layout, dt_tensor **out);
/* Squared L2 norm of all of x: rank-0 f32, partial (sum) over the mesh dims sharding x. */
DT_API dt_status dt_sq_norm(const dt_tensor *x, const dt_layout *layout, dt_tensor **out);
/* *found_out = 1 on every client if any element of x (f32, f16, bf16, f64) anywhere on the
 * mesh is inf or NaN, else 0 (the summands of a partial x are checked as they are). */
DT_API dt_status dt_nonfinite(const dt_tensor *x, int *found_out);

/* A tensor of the same layout and shape in another dtype (f32, f16, bf16, f64), rounding as
 * dt_kernel_cast. */
DT_API dt_status dt_cast(const dt_tensor *x, dt_dtype dtype, dt_tensor **out);

/* The value of a rank-0 tensor (any layout, partial ones reduced; f32, f64, f16, bf16, i32,
 * i64) as a double, on every client. */
DT_API dt_status dt_item(const dt_tensor *x, double *value_out);

/* Optimizer steps on tensors: param, momentum / moments share one non-partial layout and
 * shape (f32); grad (any layout, partial ones included) is relaid out to it first (a
 * reduce-scatter for a partial gradient against a sharded parameter). In place. */
DT_API dt_status dt_sgd_step(const dt_sgd_opts *opts, dt_tensor *param, const dt_tensor *grad,
                             dt_tensor *momentum_buf);
DT_API dt_status dt_adam_step(const dt_adam_opts *opts, int64_t step, dt_tensor *param,
                              const dt_tensor *grad, dt_tensor *m, dt_tensor *v);

/* ---- transformer ops (docs/ops.md, "Transformer ops") -------------------------------------
 * f32 activations; every op below is collective, with the errors listed above. */

/* N-d matmul. A projection a [..., k] x op(b) (b 2-D; transa must be 0): a's leading dims are
 * flattened into rows by a zero-copy view (dims 1..r-2 are gathered first, and dim 0 too when
 * its blocks are not whole rows of the view), then every dt_matmul layout rule applies (data
 * parallel over the rows, column parallel, row parallel giving a partial output); the result is
 * viewed back as [..., n]. A batched product a [..., m, k] x b [..., k, n] (equal ranks >= 3,
 * equal leading dims; transposes swap the last two dims) keeps a's batch sharding (b follows
 * it), gathers the matrix dims and runs one GEMM per local matrix. a, b: f32, f16 or bf16;
 * the output is f32. `layout` as for dt_matmul. */
DT_API dt_status dt_matmul_nd(const dt_tensor *a, const dt_tensor *b, int transa, int transb,
                              const dt_layout *layout, dt_tensor **out);
/* Gradients of dt_matmul_nd (dA and/or dB; either output pointer may be NULL). For a
 * projection dB sums over every leading dim: partial over the mesh dims sharding the rows. */
DT_API dt_status dt_matmul_nd_backward(const dt_tensor *a, const dt_tensor *b, int transa,
                                       int transb, const dt_tensor *dc,
                                       const dt_layout *da_layout, const dt_layout *db_layout,
                                       dt_tensor **da_out, dt_tensor **db_out);

/* Layer normalisation over x's last dim with gain gamma and bias beta (1-D of that size):
 * the last dim is gathered, the others keep x's sharding (a partial x is reduced); gamma and
 * beta are replicated. The backward gives dx in that layout and dgamma, dbeta [C] partial
 * (sum) over the mesh dims sharding x's other dims (a ZeRO optimizer reduce-scatters them). */
DT_API dt_status dt_layer_norm(const dt_tensor *x, const dt_tensor *gamma, const dt_tensor *beta,
                               float eps, dt_tensor **out);
DT_API dt_status dt_layer_norm_backward(const dt_tensor *x, const dt_tensor *gamma,
                                        const dt_tensor *dy, float eps, dt_tensor **dx_out,
                                        dt_tensor **dgamma_out, dt_tensor **dbeta_out);

/* Softmax along `axis` (negative counts from the end), numerically stable: that dim is
 * gathered, the others keep x's sharding. The backward takes the forward output y and dy. */
DT_API dt_status dt_softmax(const dt_tensor *x, int axis, dt_tensor **out);
DT_API dt_status dt_softmax_backward(const dt_tensor *y, const dt_tensor *dy, int axis,
                                     dt_tensor **dx_out);

/* Self-attention (dt_kernel_attention) of q, k, v [batch, seq, heads * head_dim] with `heads`
 * heads, causal mask when causal != 0. The sequence is gathered; batch keeps q's sharding;
 * the width keeps q's sharding when its mesh dim's size divides `heads` (each device then
 * holds whole heads: Megatron's head-parallel attention, no communication), else it is
 * gathered; k and v are relaid out to q's working layout. Output and gradients (dq, dk, dv,
 * all three required) are in that layout. Sequence-sharded q on a CPU mesh with the tiled
 * kernel (dt_attention_kernel_set; seq >= DT_ATTENTION_TILED_MIN_SEQ under AUTO): the
 * sequence stays sharded instead (context parallel: k, v all-gathered, each device computes
 * its own query rows; dk, dv reduce-scattered), docs/attention.md. */
DT_API dt_status dt_attention(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                              int64_t heads, int causal, dt_tensor **out);
DT_API dt_status dt_attention_backward(const dt_tensor *q, const dt_tensor *k,
                                       const dt_tensor *v, int64_t heads, int causal,
                                       const dt_tensor *dy, dt_tensor **dq_out,
                                       dt_tensor **dk_out, dt_tensor **dv_out);

/* Dropout. dt_dropout_mask: a new f32 tensor of `shape` in `layout` (its partial dims
 * dropped) holding dt_kernel_dropout_mask of every element's global row-major index: the same
 * values on any mesh and layout as on one device. No communication (each process fills its
 * own components; on GPU meshes through a host buffer). dt_dropout: x times that mask in x's
 * layout (dt_mul, so a recording tape records the product and its backward is dy times the
 * same mask; dt_dropout(dy, ...) with the same p, seed and stream is also the backward).
 * DT_ERR_INVALID_ARGUMENT for NULL arguments or p outside [0, 1); dt_mul's errors. Use a new
 * stream (or seed) for every dropout site and step. Collective as dt_mul (dt_dropout). */
DT_API dt_status dt_dropout_mask(const dt_layout *layout, const int64_t *shape, float p,
                                 uint64_t seed, uint64_t stream, dt_tensor **out);
DT_API dt_status dt_dropout(const dt_tensor *x, float p, uint64_t seed, uint64_t stream,
                            dt_tensor **out);

/* Embedding lookup: table [vocab, dim] (f32), ids i32 of any shape -> [ids' shape..., dim].
 * The table keeps its vocabulary sharding (dim gathered); each device looks up the ids in its
 * slice and writes zeros for the others, so the natural output is partial (sum) over the
 * vocabulary's mesh dim; ids keep their sharding except on that mesh dim. An id outside
 * 0..vocab-1 (the whole table's rows, not a device's slice) is DT_ERR_INVALID_ARGUMENT naming
 * the id and vocab, on every client of the mesh (they agree on the outcome, also when the ids
 * are sharded over clients and only one of them holds the bad id). The backward gives dtable
 * in the table's layout, partial (sum) over the mesh dims sharding the ids, and checks the ids
 * alike. `layout` asks for another output layout. Collective over the mesh's clients. */
DT_API dt_status dt_embedding(const dt_tensor *table, const dt_tensor *ids,
                              const dt_layout *layout, dt_tensor **out);
DT_API dt_status dt_embedding_backward(const dt_tensor *table, const dt_tensor *ids,
                                       const dt_tensor *dout, const dt_layout *layout,
                                       dt_tensor **dtable_out);

/* Mean cross-entropy of logits [..., vocab] against i32 labels [...] (each in 0..vocab-1, or
 * negative: an ignored position, which adds 0 but still counts in the mean's divisor, so a
 * caller with padding rescales by rows / counted rows)
 * without gathering the vocabulary (Megatron's vocab-parallel loss): the vocabulary keeps
 * its sharding, the local row maxima are all-reduced (max), then the local sums of
 * exponentials and the target logits (summed). The loss is rank 0, partial (sum) over the
 * mesh dims sharding the rows (natural). The backward gives dlogits = dloss * d(loss) in the
 * logits' (reduced) layout, recomputing the row statistics. */
DT_API dt_status dt_vocab_xent(const dt_tensor *logits, const dt_tensor *labels,
                               const dt_layout *layout, dt_tensor **loss_out);
DT_API dt_status dt_vocab_xent_backward(const dt_tensor *logits, const dt_tensor *labels,
                                        float dloss, dt_tensor **dlogits_out);

/* ======================================================================================
 * Part 3: Llama-style decoder ops (ops/llama.c kernels, ops/spmd_llama.c distributed ops,
 * mirrored in ops/cuda/llama.cu and the simulator's table). f32, conventions of parts 1-2.
 * ====================================================================================== */

/* RMS normalisation over the last dim of row-major [rows, cols] with a gain (cols >= 1,
 * eps >= 0; the mean square accumulated in f64):
 *   y = x / sqrt(mean(x^2) + eps) * gain;
 * its gradient recomputes the row statistic and overwrites dgain [cols] (sum over the rows).
 * dx may alias dy. */
DT_API dt_status dt_kernel_rms_norm(int64_t rows, int64_t cols, const float *x,
                                    const float *gain, float eps, float *y);
DT_API dt_status dt_kernel_rms_norm_grad(int64_t rows, int64_t cols, const float *x,
                                         const float *gain, const float *dy, float eps,
                                         float *dx, float *dgain);

/* Rotary position embeddings on x, y [batch, seq, heads * head_dim] (head_dim even), the
 * interleaved-pair form (the original Llama / GPT-J): within every head, the pair
 * (2i, 2i+1) at sequence index t is rotated by the angle
 *   a = (pos_offset + t) * 10000^(-2i / head_dim)      (f64, then cos, sin rounded to f32)
 *   y[2i] = x[2i] cos a - x[2i+1] sin a;  y[2i+1] = x[2i] sin a + x[2i+1] cos a.
 * inverse != 0 rotates by -a: the gradient (the rotation's transpose), dx = rope^-1(dy).
 * y may alias x. */
DT_API dt_status dt_kernel_rope(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                int64_t pos_offset, int inverse, const float *x, float *y);

/* The SwiGLU product of n elements, fused: y = silu(gate) * up, silu(g) = g sigmoid(g);
 * its gradient dgate = dy up silu'(g), dup = dy silu(g). Outputs may alias dy. */
DT_API dt_status dt_kernel_swiglu(int64_t n, const float *gate, const float *up, float *y);
DT_API dt_status dt_kernel_swiglu_grad(int64_t n, const float *gate, const float *up,
                                       const float *dy, float *dgate, float *dup);

/* Grouped-query attention: q, y [batch, seq, heads * head_dim], k, v [batch, seq,
 * kv_heads * head_dim], kv_heads dividing heads; query head h attends with key/value head
 * h / (heads / kv_heads). Otherwise dt_kernel_attention (kv_heads == heads gives its bits);
 * the gradient overwrites dq and dk, dv (the sums over each group's query heads). */
DT_API dt_status dt_kernel_attention_gqa(int64_t batch, int64_t seq, int64_t heads,
                                         int64_t kv_heads, int64_t head_dim, int causal,
                                         const float *q, const float *k, const float *v,
                                         float *y);
DT_API dt_status dt_kernel_attention_gqa_grad(int64_t batch, int64_t seq, int64_t heads,
                                              int64_t kv_heads, int64_t head_dim, int causal,
                                              const float *q, const float *k, const float *v,
                                              const float *dy, float *dq, float *dk,
                                              float *dv);

/* dt_rms_norm: x [..., C], gain [C]; output in x's layout with the last dim gathered (reduced
 * if partial); the backward gives dx in that layout and dgain [C] partial (sum) over the mesh
 * dims sharding the rows (as dt_layer_norm's dgamma). */
DT_API dt_status dt_rms_norm(const dt_tensor *x, const dt_tensor *gain, float eps,
                             dt_tensor **out);
DT_API dt_status dt_rms_norm_backward(const dt_tensor *x, const dt_tensor *gain,
                                      const dt_tensor *dy, float eps, dt_tensor **dx_out,
                                      dt_tensor **dgain_out);

/* dt_rope: x [B, T, heads * head_dim] in x's own layout (partial reduced; the width stays
 * sharded when its mesh dim splits the heads evenly, else it is gathered). No communication
 * for batch-, sequence- or head-sharded x: each local block is rotated at its own global
 * positions (pos_offset + its offset along T). dt_rope_backward: dx = the inverse rotation of
 * dy, in dy's layout by the same rule. */
DT_API dt_status dt_rope(const dt_tensor *x, int64_t heads, int64_t pos_offset,
                         dt_tensor **out);
DT_API dt_status dt_rope_backward(const dt_tensor *dy, int64_t heads, int64_t pos_offset,
                                  dt_tensor **dx_out);

/* dt_swiglu: gate, up of one shape; output in gate's layout (partial reduced), up relaid out
 * to it; the backward gives dgate, dup in that layout. */
DT_API dt_status dt_swiglu(const dt_tensor *gate, const dt_tensor *up, dt_tensor **out);
DT_API dt_status dt_swiglu_backward(const dt_tensor *gate, const dt_tensor *up,
                                    const dt_tensor *dy, dt_tensor **dgate_out,
                                    dt_tensor **dup_out);

/* dt_attention_gqa: q [B, T, heads * D], k, v [B, T, kv_heads * D]; the sequence gathered,
 * batch as q's, the widths sharded over q's width mesh dim when its size divides kv_heads
 * (each device holds whole key/value groups and their query heads: no communication), else
 * gathered; k, v follow q. kv_heads == heads gives dt_attention's bits. The backward gives dq
 * in that layout and dk, dv in the same layout of their shape. A sequence-sharded q keeps its
 * sharding under the same conditions as dt_attention's. */
DT_API dt_status dt_attention_gqa(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                  int64_t heads, int64_t kv_heads, int causal,
                                  dt_tensor **out);
DT_API dt_status dt_attention_gqa_backward(const dt_tensor *q, const dt_tensor *k,
                                           const dt_tensor *v, int64_t heads,
                                           int64_t kv_heads, int causal, const dt_tensor *dy,
                                           dt_tensor **dq_out, dt_tensor **dk_out,
                                           dt_tensor **dv_out);

/* Attention with every option: query heads, key/value heads (grouped-query attention; 0 means
 * `heads`), the causal mask, and dropout of the attention probabilities with probability
 * `dropout` in [0, 1) from Philox (seed, stream) keyed by each probability's index in the
 * global [batch, heads, seq, seq] tensor (dt_kernel_attention_dropout), so every mesh, layout
 * and process count drops the same probabilities as one device. Layouts as dt_attention_gqa's
 * (the sequence-sharded ring included). dropout 0 gives dt_attention_gqa's results. A
 * recording tape records the call; its backward (dt_attention_ex_backward) uses the same
 * mask. Use a new stream (or seed) for every call site and step. DT_ERR_INVALID_ARGUMENT
 * (NULL opts, dropout outside [0, 1)), DT_ERR_UNSUPPORTED for dropout on CUDA meshes (not
 * implemented there), and the errors of dt_attention_gqa. Collective over q's mesh. */
typedef struct dt_attention_opts {
    int64_t heads;
    int64_t kv_heads;
    int causal;
    float dropout;
    uint64_t seed, stream;
} dt_attention_opts;
DT_API dt_status dt_attention_ex(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                 const dt_attention_opts *opts, dt_tensor **out);
DT_API dt_status dt_attention_ex_backward(const dt_tensor *q, const dt_tensor *k,
                                          const dt_tensor *v, const dt_attention_opts *opts,
                                          const dt_tensor *dy, dt_tensor **dq_out,
                                          dt_tensor **dk_out, dt_tensor **dv_out);

#ifdef __cplusplus
}
#endif
#endif
