/* ops/ private header: the kernel backend table the distributed ops dispatch through (CPU
 * here, CUDA in ops/cuda/), and the shared helpers of the SPMD files. Not installed. */
#ifndef DTENSOR_OPS_IMPL_H
#define DTENSOR_OPS_IMPL_H

#include <stdint.h>

#include "dtensor/dtensor.h"
#include "dtensor/opdef.h"
#include "runtime/device.h"
#include "runtime/workers.h"

/* ---- kernel backends --------------------------------------------------------------------
 * One table per device type. Every entry has exactly the arguments of the public
 * dt_kernel_* function of the same name, on pointers of that backend's memory. Before the
 * kernels of one local component run, the distributed ops call set_device(device_id) with
 * the component's DLTensor device_id (NULL entry: nothing to do); after all local
 * components of one op, sync() (NULL: nothing) so the results are complete before any
 * relayout or host read. */
/* Dropout of the attention probabilities inside the attention kernels (docs/attention.md,
 * "Dropout"): probability p (0 < p < 1), Philox (seed, stream) keyed by the element's index in
 * the global [batch, heads, seq, seq] probabilities; the kernel's local rows sit at global
 * batch b0, head h0, query position q0 and key position k0. */
typedef struct dt__attn_drop {
    float p;
    uint64_t seed, stream;
    int64_t heads, seq;
    int64_t b0, h0, q0, k0;
} dt__attn_drop;

typedef struct dt__ops_backend {
    const char *name;
    dt_status (*set_device)(int device_id);
    dt_status (*sync)(void);
    dt_status (*gemm)(int transa, int transb, int64_t m, int64_t n, int64_t k, float alpha,
                      const void *a, dt_dtype a_dtype, int64_t lda, const void *b,
                      dt_dtype b_dtype, int64_t ldb, float beta, float *c, int64_t ldc);
    dt_status (*add)(int64_t n, const float *a, const float *b, float *out);
    dt_status (*sub)(int64_t n, const float *a, const float *b, float *out);
    dt_status (*mul)(int64_t n, const float *a, const float *b, float *out);
    dt_status (*scale)(int64_t n, float alpha, const float *x, float *out);
    dt_status (*axpy)(int64_t n, float alpha, const float *x, float *y);
    dt_status (*fill)(int64_t n, float value, float *x);
    dt_status (*copy)(int64_t n, const float *src, float *dst);
    dt_status (*bias_add)(int64_t rows, int64_t cols, const float *bias, float *y);
    dt_status (*bias_grad)(int64_t rows, int64_t cols, const float *dy, float *db);
    dt_status (*relu)(int64_t n, const float *x, float *y);
    dt_status (*relu_grad)(int64_t n, const float *x, const float *dy, float *dx);
    dt_status (*gelu)(int64_t n, const float *x, float *y);
    dt_status (*gelu_grad)(int64_t n, const float *x, const float *dy, float *dx);
    dt_status (*softmax_xent)(int64_t rows, int64_t classes, const float *logits,
                              const int32_t *labels, float scale, float *loss_out);
    dt_status (*softmax_xent_grad)(int64_t rows, int64_t classes, const float *logits,
                                   const int32_t *labels, float scale, float *dlogits);
    dt_status (*sum)(int64_t n, const float *x, float *out);
    dt_status (*max)(int64_t n, const float *x, float *out);
    dt_status (*mean)(int64_t n, const float *x, float *out);
    dt_status (*sq_norm)(int64_t n, const float *x, float *out);
    dt_status (*reduce_axis)(dt_reduce_op op, int64_t outer, int64_t len, int64_t inner,
                             const float *x, float *y);
    dt_status (*nonfinite)(int64_t n, const void *x, dt_dtype dtype, int32_t *found_out);
    dt_status (*cast)(int64_t n, const void *src, dt_dtype src_dtype, void *dst,
                      dt_dtype dst_dtype);
    dt_status (*sgd)(int64_t n, const dt_sgd_opts *opts, float *param, const float *grad,
                     float *momentum_buf);
    dt_status (*adam)(int64_t n, const dt_adam_opts *opts, int64_t step, float *param,
                      const float *grad, float *m, float *v);
    /* Not public (the one entry without a dt_kernel_* twin; the CPU's is
     * dt__kernel_sq_sum_f64): *out (the backend's memory) = the sum of the squares of n
     * elements of x (f32, f16 or bf16) accumulated in f64, inf or NaN when any element is.
     * The ZeRO optimizer's gradient norm and overflow check (optim/step.c). */
    dt_status (*sq_sum_f64)(int64_t n, const void *x, dt_dtype dtype, double *out);
    dt_status (*layer_norm)(int64_t rows, int64_t cols, const float *x, const float *gamma,
                            const float *beta, float eps, float *y);
    dt_status (*layer_norm_grad)(int64_t rows, int64_t cols, const float *x,
                                 const float *gamma, const float *dy, float eps, float *dx,
                                 float *dgamma, float *dbeta);
    dt_status (*softmax)(int64_t outer, int64_t len, int64_t inner, const float *x, float *y);
    dt_status (*softmax_grad)(int64_t outer, int64_t len, int64_t inner, const float *y,
                              const float *dy, float *dx);
    dt_status (*attention)(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                           int causal, const float *q, const float *k, const float *v,
                           float *y);
    dt_status (*attention_grad)(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                int causal, const float *q, const float *k, const float *v,
                                const float *dy, float *dq, float *dk, float *dv);
    dt_status (*embedding)(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                           int64_t vocab, int64_t dim, const float *table, float *out);
    dt_status (*embedding_grad)(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                                int64_t vocab, int64_t dim, const float *dout, float *dtable);
    dt_status (*vocab_xent_stats)(int64_t rows, int64_t cols, const float *logits,
                                  const float *rowmax, int64_t lo, int64_t vocab,
                                  const int32_t *labels, float *sumexp, float *target);
    dt_status (*vocab_xent_loss)(int64_t rows, const float *rowmax, const float *sumexp,
                                 const float *target, const int32_t *labels, float scale,
                                 float *loss_out);
    dt_status (*vocab_xent_grad)(int64_t rows, int64_t cols, const float *logits,
                                 const float *rowmax, const float *sumexp, int64_t lo,
                                 const int32_t *labels, float scale, float *dlogits);
    /* Optional (NULL: the pieces above): the whole-row cross-entropy, the vocabulary on one
     * device, each row read once (ops/vocab.c). rows_stats writes the row max, the sum of
     * exponentials and the target logit; rows_grad the gradient without statistics given. */
    dt_status (*vocab_xent_rows_stats)(int64_t rows, int64_t cols, const float *logits,
                                       const int32_t *labels, float *rowmax, float *sumexp,
                                       float *target);
    dt_status (*vocab_xent_rows_grad)(int64_t rows, int64_t cols, const float *logits,
                                      const int32_t *labels, float scale, float *dlogits);
    /* Llama-style kernels (ops/llama.c). */
    dt_status (*rms_norm)(int64_t rows, int64_t cols, const float *x, const float *gain,
                          float eps, float *y);
    dt_status (*rms_norm_grad)(int64_t rows, int64_t cols, const float *x, const float *gain,
                               const float *dy, float eps, float *dx, float *dgain);
    dt_status (*rope)(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                      int64_t pos_offset, int inverse, const float *x, float *y);
    dt_status (*swiglu)(int64_t n, const float *gate, const float *up, float *y);
    dt_status (*swiglu_grad)(int64_t n, const float *gate, const float *up, const float *dy,
                             float *dgate, float *dup);
    dt_status (*attention_gqa)(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, int causal, const float *q, const float *k,
                               const float *v, float *y);
    dt_status (*attention_gqa_grad)(int64_t batch, int64_t seq, int64_t heads,
                                    int64_t kv_heads, int64_t head_dim, int causal,
                                    const float *q, const float *k, const float *v,
                                    const float *dy, float *dq, float *dk, float *dv);
    /* Not public: attention_gqa whose probabilities are dropped as `drop` says (the CPU's
     * dt__kernel_attention_drop*). NULL where a backend has none (CUDA): the ops then refuse
     * attention dropout with DT_ERR_UNSUPPORTED. */
    dt_status (*attention_drop)(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                int64_t head_dim, int causal, const dt__attn_drop *drop,
                                const float *q, const float *k, const float *v, float *y);
    dt_status (*attention_drop_grad)(int64_t batch, int64_t seq, int64_t heads,
                                     int64_t kv_heads, int64_t head_dim, int causal,
                                     const dt__attn_drop *drop, const float *q,
                                     const float *k, const float *v, const float *dy,
                                     float *dq, float *dk, float *dv);
    /* Runs an op definition's kernel (opdef.h) on this backend's memory for one local
     * device: the CPU calls def->cpu; the simulated GPU queues def->cpu on its stream with the
     * buffers translated; CUDA calls def->cuda, or without one stages the blocks through host
     * memory around def->cpu. */
    dt_status (*run_def)(const dt_op_def *def, const dt_op_kernel_args *args);
} dt__ops_backend;

/* The CPU's sq_sum_f64 (ops/reduce.c): four f64 lanes over the elements in order, the tail
 * in the first, summed (l0 + l1) + (l2 + l3); 16-bit inputs widened exactly. */
dt_status dt__kernel_sq_sum_f64(int64_t n, const void *x, dt_dtype dtype, double *out);
/* acc += c in acc's memory where that gives dt_add(acc, c)'s values and layout bit for bit:
 * both f32 of one shape, acc exclusively the caller's (dt__tensor_exclusive), the layouts
 * placing the data alike and dt_add's meeting layout acc's own. Returns 0 when that does not
 * hold (nothing done: call dt_add), else 1 with the status in *st (ops/spmd_elementwise.c). */
int dt__add_in_place(dt_tensor *acc, const dt_tensor *c, dt_status *st);
/* The CPU backend's whole-row cross-entropy (ops/vocab.c; see vocab_xent_rows_stats). */
dt_status dt__kernel_vocab_xent_rows_stats(int64_t rows, int64_t cols, const float *logits,
                                           const int32_t *labels, float *rowmax,
                                           float *sumexp, float *target);
dt_status dt__kernel_vocab_xent_rows_grad(int64_t rows, int64_t cols, const float *logits,
                                          const int32_t *labels, float scale, float *dlogits);

/* The tables (ops/backend.c for the CPU, ops/cuda/, ops/sim/) are declared in
 * runtime/device.h: each device kind's `ops` entry returns its own, and that reference is
 * what links it into every program.
 * The table of this client's devices of the mesh's type; DT_ERR_UNSUPPORTED (message names
 * `op`) when they have none. */
dt_status dt__ops_backend_for(const dt_mesh *mesh, const char *op,
                              const dt__ops_backend **backend_out);

/* ops/cast.c test hook (tests/ops/test_cast_sweep.c), so every path is checked on one
 * machine: caps the cast kernels' instruction set (0 portable loops, 1 up to AVX2/F16C, 2 up
 * to AVX-512, 3, the default, up to AVX-512 BF16; a level the CPU lacks falls back to the
 * next one it has) and sets from how many bytes moved a call uses streaming stores (negative:
 * the last-level cache size, the default; 0: always). Calls running meanwhile may take either
 * path. Tests only. */
void dt__cast_tune(int isa_cap, int64_t stream_bytes);

/* ---- vectorised math (ops/vmath.c) ------------------------------------------------------
 * f32 exp and tanh of the project's own, 8 lanes at a time with one code path for every
 * element and CPU, so results never depend on the path (outputs may alias inputs). Error
 * against the correctly rounded result (tests/ops/test_vmath.c): exp at most 2 ulp, tanh at
 * most 2 ulp, over the whole f32 range (exp: 0 below -104, inf above 88.73). */
void dt__vexp(int64_t n, const float *x, float *y);
void dt__vtanh(int64_t n, const float *x, float *y);
/* GELU (tanh form) and its gradient g(x) dy, element by element, on dt__vtanh's polynomial. */
void dt__vgelu(int64_t n, const float *x, float *y);
void dt__vgelu_grad(int64_t n, const float *x, const float *dy, float *dx);
/* Returns the f64 sum, in a fixed order, of the f32 exp(x[i] - shift); stores them in y
 * unless it is NULL. */
double dt__vexp_sum(int64_t n, const float *x, float shift, float *y);
/* y[i] = (exp(x[i] - shift) * a) * b. */
void dt__vexp_scale(int64_t n, const float *x, float shift, float a, float b, float *y);
/* Dot product of a and b: 8 lane sums added in a fixed order (the attention scores). */
float dt__vdot(int64_t n, const float *a, const float *b);
/* y += alpha x. */
void dt__vaxpy(int64_t n, float alpha, const float *x, float *y);
/* y = (y * a) * b elementwise. */
void dt__vmul2(int64_t n, float a, float b, float *y);
/* Adam's per-element constants (dt_kernel_adam) and its update of the first n - n % 8
 * elements, 8 lanes at a time with the scalar loop's operations in its order (the same bits);
 * returns the count done. */
typedef struct dt__adam_consts {
    float grad_scale, l2, b1, b2, decay, step_size, inv_sqrt_bc2, eps;
} dt__adam_consts;
int64_t dt__vadam(int64_t n, const dt__adam_consts *k, float *param, const float *grad,
                  float *m, float *v);
/* Test hook: caps the instruction set of the loops above (0 portable SSE2, 1 AVX2 where the
 * CPU has it, the default). Tests only. */
void dt__vmath_tune(int isa_cap);

/* ---- BLAS threads (ops/blas_threads.c) ------------------------------------------------ */
/* Threads for OpenBLAS: cores / (clients on the host x CPU worker lanes), at least 1. */
int dt__blas_threads_for(int cores, int clients_on_host, int workers);
/* Sets OpenBLAS's thread count the first time after the runtime is up, for one lane
 * (dt__blas_threads_for with this process's cores and host clients), unless
 * OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set; a no-op afterwards (the kernels call it). */
void dt__blas_threads_once(void);
/* The count for a job on `lanes` lanes at once (1: the plain loop), set when it differs from
 * the last; called by dt__ops_each_local before the job, on the calling thread only. */
void dt__blas_threads_job(int lanes);

/* ---- shared argument checks of the kernels --------------------------------------------- */

/* DT_ERR_INVALID_ARGUMENT naming `op` unless n >= 0 and every non-NULL-required pointer of
 * the list is non-NULL when n > 0. */
dt_status dt__kcheck(const char *op, int64_t n, int nptrs, const void *const *ptrs);

/* ---- SPMD helpers (ops/spmd_util.c) ---------------------------------------------------- */

/* A layout described by mesh-dim indices: spec[i] = mesh dim sharding tensor dim i or -1;
 * partial[d] = 1 + dt_reduce_op if mesh dim d is partial, else 0. */
typedef struct dt__lspec {
    int rank;
    int spec[DT_MAX_RANK];
    int partial[DT_MESH_MAX_DIMS];
} dt__lspec;

void dt__lspec_of(const dt_layout *layout, dt__lspec *out);
dt_status dt__lspec_layout(const dt_mesh *mesh, const dt__lspec *ls, dt_layout **out);
/* 1 if any partial dim; 1 if any partial dim with an op other than sum. */
int dt__lspec_has_partial(const dt__lspec *ls);
int dt__lspec_has_nonsum_partial(const dt__lspec *ls);
/* Estimated elements moved in total by a relayout from `from` to `to` of a tensor of `shape`
 * (0 when `to` is obtained by slicing or equal). */
double dt__relayout_cost(const dt_mesh *mesh, const int64_t *shape, const dt__lspec *from,
                         const dt__lspec *to);

/* Relays `t` out to `ls` unless already there: *out gets a new reference either way, and
 * where the layouts place `t` alike (they differ only over mesh dims of one device) it shares
 * t's buffers (dt__relayout_shared): read it, do not write into it. */
dt_status dt__ensure_layout(const dt_tensor *t, const dt__lspec *ls, dt_tensor **out);
dt_status dt__ensure_layout_l(const dt_tensor *t, const dt_layout *layout, dt_tensor **out);

/* Replaces *t by its relayout to `layout` when `layout` is non-NULL and differs (consumes
 * the reference on success; where the placement agrees, a view sharing its buffers, so *t
 * must be the op's own result). Checks mesh and rank, naming `op`. */
dt_status dt__finish_layout(const char *op, const dt_layout *layout, dt_tensor **t);

/* The common end of a distributed op: waits for the backend's work (be->sync), applies the
 * requested output layout (dt__finish_layout; NULL keeps the natural one), then hands
 * *result to *out on success or destroys it on failure. Returns the final status. */
dt_status dt__ops_finish(const dt__ops_backend *be, const char *op, const dt_layout *layout,
                         dt_status st, dt_tensor **result, dt_tensor **out);

/* Common input checks: non-NULL, dtype (f32 unless `dtype_any`), mesh equality with `ref`. */
dt_status dt__check_tensor(const char *op, const char *what, const dt_tensor *t,
                           const dt_tensor *ref);
dt_status dt__check_f32(const char *op, const char *what, const dt_tensor *t);
dt_status dt__check_same_shape(const char *op, const dt_tensor *a, const dt_tensor *b);

/* An operand `what` like `ref`: f32, on ref's mesh, of ref's shape. */
dt_status dt__check_like(const char *op, const char *what, const dt_tensor *t,
                         const dt_tensor *ref);

/* The common start of a distributed op once its operand checks gave `st`: unless st is an
 * error already, DT_ERR_INVALID_ARGUMENT "<op>: <out_name> is NULL" when not outs_given,
 * then the backend of t's mesh (dt__ops_backend_for) into *be_out and that mesh into
 * *mesh_out (when not NULL). Returns the first failure. */
dt_status dt__ops_begin(const char *op, dt_status st, int outs_given, const char *out_name,
                        const dt_tensor *t, const dt_mesh **mesh_out,
                        const dt__ops_backend **be_out);


/* Local component i's data pointer (NULL if empty), its element count. */
void *dt__local_data(const dt_tensor *t, int i);
int64_t dt__local_numel(const dt_tensor *t, int i);

/* A new uninitialised tensor with the given lspec on t's mesh. */
dt_status dt__tensor_new(const dt_mesh *mesh, const dt__lspec *ls, dt_dtype dtype,
                         const int64_t *shape, dt_tensor **out);

/* ---- N-d helpers (ops/spmd_view.c, ops/spmd_nn_util.c) --------------------------------- */

/* 1 if sharding `lead` rows over mesh dim `mesh_dim` (-1: none) gives the same blocks as
 * sharding lead * inner rows, scaled by inner (so a flattened view keeps its local blocks). */
int dt__rows_aligned(const dt_mesh *mesh, int mesh_dim, int64_t lead, int64_t inner);
/* A zero-copy view of t with another global shape and layout `ls` whose local blocks hold the
 * same elements in the same order (DT_ERR_SHAPE otherwise); holds a reference on t's memory. */
dt_status dt__tensor_view(const dt_tensor *t, const dt__lspec *ls, const int64_t *shape,
                          dt_tensor **out);
/* 16-bit operands (ops/spmd_half.c): 1 for an f16 or bf16 tensor; widen: an f32 copy (a new
 * reference to t when it is not 16-bit); narrow: when st is DT_OK and dtype is 16-bit, replaces
 * *t by its cast to dtype (on failure *t is destroyed and NULL). Returns the final status. */
int dt__is_half(const dt_tensor *t);
dt_status dt__widen(const dt_tensor *t, dt_tensor **out);
dt_status dt__narrow(dt_status st, dt_dtype dtype, dt_tensor **t);

/* Runs fn(i, arg) for every local component i of t: for the CPU backend with CPU workers
 * running and at least two non-empty components, the components at once on the worker
 * lanes (dt__workers_run, runtime/workers.h); otherwise one after another here, after
 * set_device for each. fn must write only component i's memory (reads of shared inputs
 * aside) and no shared state. Returns DT_OK or the lowest failing component's status, with
 * its message as this thread's dt_last_error text. The caller still syncs (dt__ops_finish). */
dt_status dt__ops_each_local(const dt__ops_backend *be, const dt_tensor *t, dt__work_fn fn,
                             void *arg);

/* set_device for local component i of t (nothing for backends without it). */
dt_status dt__set_device_of(const dt__ops_backend *be, const dt_tensor *t, int i);
/* t's layout spec with dim `dim` (-1: none) unsharded and partial dims dropped. */
void dt__lspec_gathered(const dt_tensor *t, int dim, dt__lspec *out);

/* Attention and grouped-query attention (q, y: heads; k, v: kv_heads dividing heads), sizes
 * checked and non-empty: ops/attention.c, shared by dt_kernel_attention* and
 * dt_kernel_attention_gqa* (ops/llama.c) so that kv_heads == heads gives the same bits. */
dt_status dt__attention_run(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                            int64_t head_dim, int causal, const dt__attn_drop *drop,
                            const float *q, const float *k, const float *v, float *y);
dt_status dt__attention_grad_run(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                 int64_t head_dim, int causal, const dt__attn_drop *drop,
                                 const float *q, const float *k, const float *v,
                                 const float *dy, float *dq, float *dk, float *dv);
/* The CPU backend's attention_drop entries: dt__attention_run / _grad_run with dropout. */
dt_status dt__kernel_attention_drop(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, int causal, const dt__attn_drop *drop,
                                    const float *q, const float *k, const float *v, float *y);
dt_status dt__kernel_attention_drop_grad(int64_t batch, int64_t seq, int64_t heads,
                                         int64_t kv_heads, int64_t head_dim, int causal,
                                         const dt__attn_drop *drop, const float *q,
                                         const float *k, const float *v, const float *dy,
                                         float *dq, float *dk, float *dv);

/* The tiled kernels (ops/attention_tiled.c), same contract; lse [batch, heads, seq] or NULL.
 * dt__attention_use_tiled: whether dt__attention_run/_grad_run take them for this seq
 * (dt_attention_kernel_set, DT_ATTENTION_KERNEL). */
dt_status dt__attention_tiled_run(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim, int causal, const dt__attn_drop *drop,
                                  const float *q, const float *k, const float *v, float *y,
                                  float *lse);
dt_status dt__attention_tiled_grad_run(int64_t batch, int64_t seq, int64_t heads,
                                       int64_t kv_heads, int64_t head_dim, int causal,
                                       const dt__attn_drop *drop, const float *q,
                                       const float *k, const float *v, const float *dy,
                                       float *dq, float *dk, float *dv);
/* The same on a slice of seq queries whose first sits at position qoff of kv_seq keys (the
 * sequence-sharded dt_attention: keys and values gathered, queries local); dq gets the
 * slice's rows, dk, dv [batch, kv_seq, kv_heads * head_dim] its contributions (overwritten,
 * or added to with accumulate). */
dt_status dt__attention_tiled_part(int64_t batch, int64_t seq, int64_t qoff, int64_t kv_seq,
                                   int64_t heads, int64_t kv_heads, int64_t head_dim,
                                   int causal, const dt__attn_drop *drop, const float *q,
                                   const float *k, const float *v, float *y, float *lse);
dt_status dt__attention_tiled_grad_part(int64_t batch, int64_t seq, int64_t qoff,
                                        int64_t kv_seq, int64_t heads, int64_t kv_heads,
                                        int64_t head_dim, int causal, const dt__attn_drop *drop,
                                        const float *q,
                                        const float *k, const float *v, const float *dy,
                                        float *dq, float *dk, float *dv, int accumulate);
int dt__attention_use_tiled(int64_t seq);
/* Sequence-sharded attention (ops/attention_cp.c): the mesh dim sharding q's sequence when the
 * op takes that path (a CPU mesh, the tiled kernel chosen for this length, the dim not also
 * in the working spec ls), else -1; the forward and backward on the working spec ls with the
 * sequence sharded over sdim (output, dq, dk, dv in that layout). */
int dt__attention_cp_dim(const dt_tensor *q, const dt__lspec *ls);
dt_status dt__attention_cp_forward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                   const dt_attention_opts *o, const dt__lspec *ls, int sdim,
                                   dt_tensor **out);
dt_status dt__attention_cp_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                    const dt_tensor *dy, const dt_attention_opts *o,
                                    const dt__lspec *ls, int sdim, dt_tensor **dq_out,
                                    dt_tensor **dk_out, dt_tensor **dv_out);
/* The CUDA backend: 1 to run ops/cuda/attention_tiled.cu, only when chosen explicitly
 * (DT_ATTENTION_KERNEL_TILED; AUTO keeps CUDA on its untiled kernels) and head_dim fits. */
#define DT__CUDA_TILED_MAXD 128
int dt__attention_cuda_tiled(int64_t head_dim);

/* dt_kernel_dropout_mask without the checks (ops/philox.c). */
void dt__dropout_mask_run(int64_t first, int64_t n, float p, uint64_t seed, uint64_t stream,
                          float *mask);

/* The keep factors (0 or 1 / (1 - p)) of the attention probabilities P[b, h, i, j .. j+n-1]
 * of local batch row b, local head h, local query row i from key row j on: element
 * ((b0 + b) H + h0 + h) T + q0 + i) T + k0 + j of the global [batch, H, T, T] probabilities'
 * dt__dropout_mask_run, so every layout drops what one device does. */
static inline void dt__attn_drop_row(const dt__attn_drop *d, int64_t b, int64_t h, int64_t i,
                                     int64_t j, int64_t n, float *mask)
{
    int64_t g = (((d->b0 + b) * d->heads + d->h0 + h) * d->seq + d->q0 + i) * d->seq + d->k0 + j;
    dt__dropout_mask_run(g, n, d->p, d->seed, d->stream, mask);
}

#endif
