/* ops/cuda/ private header: the CUDA launch functions behind the CUDA kernel backend. They take
 * device pointers and a stream (0: the legacy default stream of the current device), check
 * nothing, return the launch status (cudaGetLastError) and never block. Argument checks, error
 * text, scratch memory and the backend table are in backend_cuda.c. Shared by .cu and .c. */
#ifndef DTENSOR_OPS_CUDA_OPS_H
#define DTENSOR_OPS_CUDA_OPS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Float formats of casts, reductions and the inf/NaN check. */
enum { DT__CU_F32 = 0, DT__CU_F64 = 1, DT__CU_F16 = 2, DT__CU_BF16 = 3 };
/* Elementwise binary ops. */
enum { DT__CU_ADD = 0, DT__CU_SUB = 1, DT__CU_MUL = 2 };
/* Full reductions (dt__cuda_reduce_*); REDUCE_AXIS ops are dt_reduce_op's values. */
enum { DT__CU_SUM = 0, DT__CU_SQSUM = 1, DT__CU_MAX = 2 };
/* Per-block partials of a full reduction (doubles of scratch it needs at most). */
#define DT__CU_REDUCE_BLOCKS 1024

/* elementwise.cu */
cudaError_t dt__cuda_binary(int op, int64_t n, const float *a, const float *b, float *out,
                            cudaStream_t s);
cudaError_t dt__cuda_scale(int64_t n, float alpha, const float *x, float *out, cudaStream_t s);
cudaError_t dt__cuda_axpy(int64_t n, float alpha, const float *x, float *y, cudaStream_t s);
cudaError_t dt__cuda_fill(int64_t n, float value, float *x, cudaStream_t s);
/* C[i, j] = beta * C[i, j] for an m x n block of leading dim ldc (beta == 0: zeros). */
cudaError_t dt__cuda_scale_matrix(int64_t m, int64_t n, float beta, float *c, int64_t ldc,
                                  cudaStream_t s);
cudaError_t dt__cuda_bias_add(int64_t rows, int64_t cols, const float *bias, float *y,
                              cudaStream_t s);
cudaError_t dt__cuda_bias_grad(int64_t rows, int64_t cols, const float *dy, float *db,
                               cudaStream_t s);

/* activation.cu */
cudaError_t dt__cuda_relu(int64_t n, const float *x, float *y, cudaStream_t s);
cudaError_t dt__cuda_relu_grad(int64_t n, const float *x, const float *dy, float *dx,
                               cudaStream_t s);
cudaError_t dt__cuda_gelu(int64_t n, const float *x, float *y, cudaStream_t s);
cudaError_t dt__cuda_gelu_grad(int64_t n, const float *x, const float *dy, float *dx,
                               cudaStream_t s);

/* loss.cu. bad_row: *bad_row = smallest row with a label outside 0..classes-1 (must hold
 * all ones before: the caller sets it). row_loss: rows doubles of scratch. */
cudaError_t dt__cuda_xent_check_labels(int64_t rows, int64_t classes, const int32_t *labels,
                                       unsigned long long *bad_row, cudaStream_t s);
cudaError_t dt__cuda_softmax_xent(int64_t rows, int64_t classes, const float *logits,
                                  const int32_t *labels, float scale, double *row_loss,
                                  float *loss_out, cudaStream_t s);
cudaError_t dt__cuda_softmax_xent_grad(int64_t rows, int64_t classes, const float *logits,
                                       const int32_t *labels, float scale, float *dlogits,
                                       cudaStream_t s);

/* reduce.cu. Full reductions in two launches through `partials` (DT__CU_REDUCE_BLOCKS
 * doubles): *out = (float)(result / div) for sums (div 1, or n for a mean), the max as it
 * is; n == 0 gives `empty`. */
cudaError_t dt__cuda_reduce_full(int kind, int64_t n, const float *x, double *partials,
                                 double div, float empty, float *out, cudaStream_t s);
cudaError_t dt__cuda_reduce_axis(int op, int64_t outer, int64_t len, int64_t inner,
                                 const float *x, float *y, cudaStream_t s);
/* *out = the sum of the squares of n elements of x (format DT__CU_F32, F16 or BF16) in
 * f64, through `partials` (DT__CU_REDUCE_BLOCKS doubles); 0 when n == 0. */
cudaError_t dt__cuda_sq_sum_f64(int64_t n, const void *x, int format, double *partials,
                                double *out, cudaStream_t s);
/* *found_out = 1 if any element of x (format DT__CU_*) is inf or NaN, else 0. */
cudaError_t dt__cuda_nonfinite(int64_t n, const void *x, int format, int32_t *found_out,
                               cudaStream_t s);

/* cast.cu: n elements from format sf to format df (DT__CU_*), as dt_kernel_cast rounds. */
cudaError_t dt__cuda_cast(int64_t n, const void *src, int sf, void *dst, int df,
                          cudaStream_t s);

/* llama.cu: the kernels of ops/llama.c (no checks). rms_norm_grad needs `stats`: rows floats
 * of scratch. */
cudaError_t dt__cuda_rms_norm(int64_t rows, int64_t cols, const float *x, const float *g,
                              float eps, float *y, cudaStream_t s);
cudaError_t dt__cuda_rms_norm_grad(int64_t rows, int64_t cols, const float *x, const float *g,
                                   const float *dy, float eps, float *dx, float *dg,
                                   float *stats, cudaStream_t s);
cudaError_t dt__cuda_rope(int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                          int64_t pos_offset, int inverse, const float *x, float *y,
                          cudaStream_t s);
cudaError_t dt__cuda_swiglu(int64_t n, const float *gate, const float *up, float *y,
                            cudaStream_t s);
cudaError_t dt__cuda_swiglu_grad(int64_t n, const float *gate, const float *up,
                                 const float *dy, float *dgate, float *dup, cudaStream_t s);
cudaError_t dt__cuda_attention_gqa(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                   int64_t hd, int causal, const float *q, const float *k,
                                   const float *v, float *y, cudaStream_t s);
cudaError_t dt__cuda_attention_gqa_grad(int64_t batch, int64_t seq, int64_t heads,
                                        int64_t kv_heads, int64_t hd, int causal,
                                        const float *q, const float *k, const float *v,
                                        const float *dy, float *dq, float *dk, float *dv,
                                        cudaStream_t s);

/* transformer.cu: the transformer kernels of ops/norm.c, attention.c and vocab.c (no checks).
 * layer_norm_grad needs `stats`: 2 * rows floats of scratch. */
cudaError_t dt__cuda_layer_norm(int64_t rows, int64_t cols, const float *x, const float *g,
                                const float *b, float eps, float *y, cudaStream_t s);
cudaError_t dt__cuda_layer_norm_grad(int64_t rows, int64_t cols, const float *x, const float *g,
                                     const float *dy, float eps, float *dx, float *dg,
                                     float *db, float *stats, cudaStream_t s);
cudaError_t dt__cuda_softmax(int64_t outer, int64_t len, int64_t inner, const float *x,
                             float *y, cudaStream_t s);
cudaError_t dt__cuda_softmax_grad(int64_t outer, int64_t len, int64_t inner, const float *y,
                                  const float *dy, float *dx, cudaStream_t s);
cudaError_t dt__cuda_attention(int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                               int causal, const float *q, const float *k, const float *v,
                               float *y, cudaStream_t s);
cudaError_t dt__cuda_attention_grad(int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                                    int causal, const float *q, const float *k, const float *v,
                                    const float *dy, float *dq, float *dk, float *dv,
                                    cudaStream_t s);
/* Ids outside 0..vocab-1 give zero rows (no gradient) and lower *fault to their
 * dt__cuda_fault_word (a dt__cuda_fault slot). */
cudaError_t dt__cuda_embedding(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                               int64_t vocab, int64_t dim, const float *table, float *out,
                               unsigned long long *fault, cudaStream_t s);
cudaError_t dt__cuda_embedding_grad(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                                    int64_t vocab, int64_t dim, const float *dout,
                                    float *dtable, unsigned long long *fault, cudaStream_t s);
cudaError_t dt__cuda_vocab_xent_stats(int64_t rows, int64_t cols, const float *logits,
                                      const float *rowmax, int64_t lo, const int32_t *labels,
                                      float *sumexp, float *target, cudaStream_t s);
cudaError_t dt__cuda_vocab_xent_loss(int64_t rows, const float *rowmax, const float *sumexp,
                                     const float *target, const int32_t *labels, float scale,
                                     float *loss_out, cudaStream_t s);
/* *bad_row = smallest row with a label >= vocab (negative labels are allowed: ignored rows);
 * *bad_row must hold all ones before. */
cudaError_t dt__cuda_vocab_check_labels(int64_t rows, int64_t vocab, const int32_t *labels,
                                        unsigned long long *bad_row, cudaStream_t s);
cudaError_t dt__cuda_vocab_xent_grad(int64_t rows, int64_t cols, const float *logits,
                                     const float *rowmax, const float *sumexp, int64_t lo,
                                     const int32_t *labels, float scale, float *dlogits,
                                     cudaStream_t s);

/* optimizer.cu: dt_kernel_sgd's and dt_kernel_adam's loops; adam's step_size, inv_sqrt_bc2,
 * l2 and decay are computed by the caller exactly as the CPU kernel does. */
cudaError_t dt__cuda_sgd(int64_t n, float lr, float momentum, float dampening,
                         float weight_decay, int nesterov, float grad_scale, float *param,
                         const float *grad, float *momentum_buf, cudaStream_t s);
cudaError_t dt__cuda_adam(int64_t n, float beta1, float beta2, float eps, float grad_scale,
                          float step_size, float inv_sqrt_bc2, float l2, float decay,
                          float *param, const float *grad, float *m, float *v, cudaStream_t s);

/* attention_tiled.cu: tiled (flash-style) attention and its gradient, grouped-query form
 * (kv_heads == heads: plain attention), head_dim <= DT__CU_TILED_MAXD; the grid is
 * batch * heads * ceil(seq / 64) blocks (below 2^31). */
#define DT__CU_TILED_MAXD 128 /* = DT__CUDA_TILED_MAXD of ops/ops_impl.h */
cudaError_t dt__cuda_attention_tiled(int64_t batch, int64_t seq, int64_t heads,
                                     int64_t kv_heads, int64_t hd, int causal, const float *q,
                                     const float *k, const float *v, float *y, cudaStream_t s);
cudaError_t dt__cuda_attention_tiled_grad(int64_t batch, int64_t seq, int64_t heads,
                                          int64_t kv_heads, int64_t hd, int causal,
                                          const float *q, const float *k, const float *v,
                                          const float *dy, float *dq, float *dk, float *dv,
                                          cudaStream_t s);

#ifdef __cplusplus
}
#endif

/* ---- the C side (backend_cuda.c, gemm_cublas.c) ---------------------------------------- */
#if !defined(__CUDACC__) && !defined(DT__CU_HOST_KERNELS)
#include "dtensor/status.h"
#include "dtensor/tensor.h"

/* Most CUDA devices (ordinals) the backend keeps state for. */
#define DT__CU_MAX_DEVICES 64

/* DT_ERR_CUDA naming `what` and the CUDA error (clears the sticky last error), or DT_OK. */
dt_status dt__cuda_check(cudaError_t err, const char *what);

/* The one lock around per-device scratch use: hold it from dt__cuda_scratch until the
 * kernels reading the scratch are enqueued (all on the legacy stream, so a later user's
 * kernels run after them). */
void dt__cuda_lock(void);
void dt__cuda_unlock(void);
/* At least `bytes` of device scratch on the current device (grows, never shrinks), under
 * dt__cuda_lock. DT_ERR_NO_MEMORY / DT_ERR_CUDA. */
dt_status dt__cuda_scratch(size_t bytes, void **ptr_out);
/* Errors found by kernels on the device, without a host round trip at launch: the current
 * device's fault word (device memory, all ones while no fault) into *slot_out, for a kernel
 * that lowers it with atomicMin to dt__cuda_fault_word(position, id) of each bad id, so the
 * smallest position wins. The backend's next sync (on this thread) reads the word of every
 * device it handed out since, resets it, and fails with DT_ERR_INVALID_ARGUMENT: "<op>: id
 * <id> (position <p>) is outside the table of <limit> rows (ids 0..<limit-1>)". Local.
 * DT_ERR_NO_MEMORY / DT_ERR_CUDA. */
dt_status dt__cuda_fault(const char *op, int64_t limit, unsigned long long **slot_out);
#define DT__CUDA_FAULT_NONE (~0ull)

/* llama_cuda.c: the Llama-style entries of the CUDA table (dt_kernel_* arguments). */
dt_status dt__cu_rms_norm(int64_t rows, int64_t cols, const float *x, const float *gain,
                          float eps, float *y);
dt_status dt__cu_rms_norm_grad(int64_t rows, int64_t cols, const float *x, const float *gain,
                               const float *dy, float eps, float *dx, float *dgain);
dt_status dt__cu_rope(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                      int64_t pos_offset, int inverse, const float *x, float *y);
dt_status dt__cu_swiglu(int64_t n, const float *gate, const float *up, float *y);
dt_status dt__cu_swiglu_grad(int64_t n, const float *gate, const float *up, const float *dy,
                             float *dgate, float *dup);
dt_status dt__cu_attention_gqa(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, int causal, const float *q, const float *k,
                               const float *v, float *y);
dt_status dt__cu_attention_gqa_grad(int64_t batch, int64_t seq, int64_t heads,
                                    int64_t kv_heads, int64_t head_dim, int causal,
                                    const float *q, const float *k, const float *v,
                                    const float *dy, float *dq, float *dk, float *dv);

/* transformer_cuda.c: the transformer entries of the CUDA table (dt_kernel_* arguments). */
dt_status dt__cu_layer_norm(int64_t rows, int64_t cols, const float *x, const float *gamma,
                            const float *beta, float eps, float *y);
dt_status dt__cu_layer_norm_grad(int64_t rows, int64_t cols, const float *x, const float *gamma,
                                 const float *dy, float eps, float *dx, float *dgamma,
                                 float *dbeta);
dt_status dt__cu_softmax(int64_t outer, int64_t len, int64_t inner, const float *x, float *y);
dt_status dt__cu_softmax_grad(int64_t outer, int64_t len, int64_t inner, const float *y,
                              const float *dy, float *dx);
dt_status dt__cu_attention(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                           int causal, const float *q, const float *k, const float *v, float *y);
dt_status dt__cu_attention_grad(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                int causal, const float *q, const float *k, const float *v,
                                const float *dy, float *dq, float *dk, float *dv);
dt_status dt__cu_embedding(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                           int64_t vocab, int64_t dim, const float *table, float *out);
dt_status dt__cu_embedding_grad(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                                int64_t vocab, int64_t dim, const float *dout, float *dtable);
dt_status dt__cu_vocab_xent_stats(int64_t rows, int64_t cols, const float *logits,
                                  const float *rowmax, int64_t lo, int64_t vocab,
                                  const int32_t *labels, float *sumexp, float *target);
dt_status dt__cu_vocab_xent_loss(int64_t rows, const float *rowmax, const float *sumexp,
                                 const float *target, const int32_t *labels, float scale,
                                 float *loss_out);
dt_status dt__cu_vocab_xent_grad(int64_t rows, int64_t cols, const float *logits,
                                 const float *rowmax, const float *sumexp, int64_t lo,
                                 const int32_t *labels, float scale, float *dlogits);

/* gemm_cublas.c: dt_kernel_gemm on device pointers through cuBLAS (f16/bf16 operands widened
 * to f32 scratch first), on the legacy stream of the current device. */
dt_status dt__cuda_gemm(int transa, int transb, int64_t m, int64_t n, int64_t k, float alpha,
                        const void *a, dt_dtype a_dtype, int64_t lda, const void *b,
                        dt_dtype b_dtype, int64_t ldb, float beta, float *c, int64_t ldc);
/* Destroys the cuBLAS handle of every device (dt_finalize). */
void dt__cuda_gemm_release(void);
#endif

#if defined(__CUDACC__) || defined(DT__CU_HOST_KERNELS)
/* Launch shape shared by the .cu files: 256 threads, grid-stride loops over int64 indices. */
#define DT__CU_THREADS 256
static inline unsigned dt__cu_blocks(int64_t n)
{
    int64_t b = (n + DT__CU_THREADS - 1) / DT__CU_THREADS;
    return (unsigned)(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}
#define DT__CU_FOR(i, n)                                                                    \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
         i += (int64_t)gridDim.x * blockDim.x)
/* A bad id's word for a dt__cuda_fault slot: position (capped below all ones) high, id low. */
__device__ static inline unsigned long long dt__cuda_fault_word(int64_t pos, int32_t id)
{
    unsigned long long p = pos < 0xfffffffell ? (unsigned long long)pos : 0xfffffffeull;
    return p << 32 | (unsigned long long)(uint32_t)id;
}
#endif

#endif
