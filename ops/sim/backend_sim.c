/* The simulated GPU's kernel table: each entry queues the CPU kernel of the same name on the
 * selected simulated GPU's stream, its device pointers translated there to the arena's shadow
 * view. The entries are generated from one list of the kernels' arguments. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/sim.h"

/* Each kernel's arguments in order, as A(kind, type, name), kind being V (a value), D (a
 * pointer into simulated device memory, or NULL) or H (a host struct passed by pointer,
 * copied into the closure: the caller's may be gone when the stream runs it). */
#define ARGS_gemm(A)                                                                        \
    A(V, int, transa) A(V, int, transb) A(V, int64_t, m) A(V, int64_t, n) A(V, int64_t, k) \
    A(V, float, alpha) A(D, const void *, a) A(V, dt_dtype, a_dtype) A(V, int64_t, lda)     \
    A(D, const void *, b) A(V, dt_dtype, b_dtype) A(V, int64_t, ldb) A(V, float, beta)      \
    A(D, float *, c) A(V, int64_t, ldc)
#define ARGS_binary(A) \
    A(V, int64_t, n) A(D, const float *, a) A(D, const float *, b) A(D, float *, out)
#define ARGS_add ARGS_binary
#define ARGS_sub ARGS_binary
#define ARGS_mul ARGS_binary
#define ARGS_scale(A) A(V, int64_t, n) A(V, float, alpha) A(D, const float *, x) A(D, float *, out)
#define ARGS_axpy(A) A(V, int64_t, n) A(V, float, alpha) A(D, const float *, x) A(D, float *, y)
#define ARGS_fill(A) A(V, int64_t, n) A(V, float, value) A(D, float *, x)
#define ARGS_copy(A) A(V, int64_t, n) A(D, const float *, src) A(D, float *, dst)
#define ARGS_bias(A) \
    A(V, int64_t, rows) A(V, int64_t, cols) A(D, const float *, in) A(D, float *, out)
#define ARGS_bias_add ARGS_bias
#define ARGS_bias_grad ARGS_bias
#define ARGS_unary(A) A(V, int64_t, n) A(D, const float *, x) A(D, float *, y)
#define ARGS_relu ARGS_unary
#define ARGS_gelu ARGS_unary
#define ARGS_sum ARGS_unary
#define ARGS_max ARGS_unary
#define ARGS_mean ARGS_unary
#define ARGS_sq_norm ARGS_unary
#define ARGS_grad(A) \
    A(V, int64_t, n) A(D, const float *, x) A(D, const float *, dy) A(D, float *, dx)
#define ARGS_relu_grad ARGS_grad
#define ARGS_gelu_grad ARGS_grad
#define ARGS_xent(A)                                                                       \
    A(V, int64_t, rows) A(V, int64_t, classes) A(D, const float *, logits)                 \
    A(D, const int32_t *, labels) A(V, float, scale) A(D, float *, out)
#define ARGS_softmax_xent ARGS_xent
#define ARGS_softmax_xent_grad ARGS_xent
#define ARGS_reduce_axis(A)                                                                 \
    A(V, dt_reduce_op, op) A(V, int64_t, outer) A(V, int64_t, len) A(V, int64_t, inner)    \
    A(D, const float *, x) A(D, float *, y)
#define ARGS_nonfinite(A) \
    A(V, int64_t, n) A(D, const void *, x) A(V, dt_dtype, dtype) A(D, int32_t *, found_out)
#define ARGS_cast(A)                                                                       \
    A(V, int64_t, n) A(D, const void *, src) A(V, dt_dtype, src_dtype) A(D, void *, dst)   \
    A(V, dt_dtype, dst_dtype)
#define ARGS_sgd(A)                                                                        \
    A(V, int64_t, n) A(H, dt_sgd_opts, opts) A(D, float *, param) A(D, const float *, grad) \
    A(D, float *, momentum_buf)
#define ARGS_adam(A)                                                                       \
    A(V, int64_t, n) A(H, dt_adam_opts, opts) A(V, int64_t, step) A(D, float *, param)     \
    A(D, const float *, grad) A(D, float *, m) A(D, float *, v)

#define ARGS_sq_sum_f64(A) \
    A(V, int64_t, n) A(D, const void *, x) A(V, dt_dtype, dtype) A(D, double *, out)
#define ARGS_layer_norm(A)                                                                 \
    A(V, int64_t, rows) A(V, int64_t, cols) A(D, const float *, x) A(D, const float *, gamma) \
    A(D, const float *, beta) A(V, float, eps) A(D, float *, y)
#define ARGS_layer_norm_grad(A)                                                            \
    A(V, int64_t, rows) A(V, int64_t, cols) A(D, const float *, x) A(D, const float *, gamma) \
    A(D, const float *, dy) A(V, float, eps) A(D, float *, dx) A(D, float *, dgamma)        \
    A(D, float *, dbeta)
#define ARGS_softmax(A) \
    A(V, int64_t, outer) A(V, int64_t, len) A(V, int64_t, inner) A(D, const float *, x) A(D, float *, y)
#define ARGS_softmax_grad(A)                                                                \
    A(V, int64_t, outer) A(V, int64_t, len) A(V, int64_t, inner) A(D, const float *, y)     \
    A(D, const float *, dy) A(D, float *, dx)
#define ARGS_attention(A)                                                                   \
    A(V, int64_t, batch) A(V, int64_t, seq) A(V, int64_t, heads) A(V, int64_t, head_dim)    \
    A(V, int, causal) A(D, const float *, q) A(D, const float *, k) A(D, const float *, v)  \
    A(D, float *, y)
#define ARGS_attention_grad(A)                                                              \
    A(V, int64_t, batch) A(V, int64_t, seq) A(V, int64_t, heads) A(V, int64_t, head_dim)    \
    A(V, int, causal) A(D, const float *, q) A(D, const float *, k) A(D, const float *, v)  \
    A(D, const float *, dy) A(D, float *, dq) A(D, float *, dk) A(D, float *, dv)
#define ARGS_embedding(A)                                                                   \
    A(V, int64_t, n) A(D, const int32_t *, ids) A(V, int64_t, lo) A(V, int64_t, rows)       \
    A(V, int64_t, vocab) A(V, int64_t, dim) A(D, const float *, table) A(D, float *, out)
#define ARGS_embedding_grad(A)                                                              \
    A(V, int64_t, n) A(D, const int32_t *, ids) A(V, int64_t, lo) A(V, int64_t, rows)       \
    A(V, int64_t, vocab) A(V, int64_t, dim) A(D, const float *, dout) A(D, float *, dtable)
#define ARGS_vocab_xent_stats(A)                                                            \
    A(V, int64_t, rows) A(V, int64_t, cols) A(D, const float *, logits)                     \
    A(D, const float *, rowmax) A(V, int64_t, lo) A(V, int64_t, vocab)                      \
    A(D, const int32_t *, labels) A(D, float *, sumexp) A(D, float *, target)
#define ARGS_vocab_xent_loss(A)                                                             \
    A(V, int64_t, rows) A(D, const float *, rowmax) A(D, const float *, sumexp)             \
    A(D, const float *, target) A(D, const int32_t *, labels) A(V, float, scale)            \
    A(D, float *, loss_out)
#define ARGS_vocab_xent_grad(A)                                                             \
    A(V, int64_t, rows) A(V, int64_t, cols) A(D, const float *, logits)                     \
    A(D, const float *, rowmax) A(D, const float *, sumexp) A(V, int64_t, lo)               \
    A(D, const int32_t *, labels) A(V, float, scale) A(D, float *, dlogits)
#define ARGS_vocab_xent_rows_stats(A)                                                       \
    A(V, int64_t, rows) A(V, int64_t, cols) A(D, const float *, logits)                     \
    A(D, const int32_t *, labels) A(D, float *, rowmax) A(D, float *, sumexp)               \
    A(D, float *, target)
#define ARGS_vocab_xent_rows_grad(A)                                                        \
    A(V, int64_t, rows) A(V, int64_t, cols) A(D, const float *, logits)                     \
    A(D, const int32_t *, labels) A(V, float, scale) A(D, float *, dlogits)

#define ARGS_rms_norm(A)                                                                   \
    A(V, int64_t, rows) A(V, int64_t, cols) A(D, const float *, x) A(D, const float *, gain) \
    A(V, float, eps) A(D, float *, y)
#define ARGS_rms_norm_grad(A)                                                              \
    A(V, int64_t, rows) A(V, int64_t, cols) A(D, const float *, x) A(D, const float *, gain) \
    A(D, const float *, dy) A(V, float, eps) A(D, float *, dx) A(D, float *, dgain)
#define ARGS_rope(A)                                                                       \
    A(V, int64_t, batch) A(V, int64_t, seq) A(V, int64_t, heads) A(V, int64_t, head_dim)   \
    A(V, int64_t, pos_offset) A(V, int, inverse) A(D, const float *, x) A(D, float *, y)
#define ARGS_swiglu(A) \
    A(V, int64_t, n) A(D, const float *, gate) A(D, const float *, up) A(D, float *, y)
#define ARGS_swiglu_grad(A)                                                                \
    A(V, int64_t, n) A(D, const float *, gate) A(D, const float *, up) A(D, const float *, dy) \
    A(D, float *, dgate) A(D, float *, dup)
#define ARGS_attention_gqa(A)                                                              \
    A(V, int64_t, batch) A(V, int64_t, seq) A(V, int64_t, heads) A(V, int64_t, kv_heads)   \
    A(V, int64_t, head_dim) A(V, int, causal) A(D, const float *, q) A(D, const float *, k) \
    A(D, const float *, v) A(D, float *, y)
#define ARGS_attention_gqa_grad(A)                                                         \
    A(V, int64_t, batch) A(V, int64_t, seq) A(V, int64_t, heads) A(V, int64_t, kv_heads)   \
    A(V, int64_t, head_dim) A(V, int, causal) A(D, const float *, q) A(D, const float *, k) \
    A(D, const float *, v) A(D, const float *, dy) A(D, float *, dq) A(D, float *, dk)      \
    A(D, float *, dv)

#define ARGS_attention_drop(A)                                                             \
    A(V, int64_t, batch) A(V, int64_t, seq) A(V, int64_t, heads) A(V, int64_t, kv_heads)   \
    A(V, int64_t, head_dim) A(V, int, causal) A(H, dt__attn_drop, drop)                    \
    A(D, const float *, q) A(D, const float *, k) A(D, const float *, v) A(D, float *, y)
#define ARGS_attention_drop_grad(A)                                                        \
    A(V, int64_t, batch) A(V, int64_t, seq) A(V, int64_t, heads) A(V, int64_t, kv_heads)   \
    A(V, int64_t, head_dim) A(V, int, causal) A(H, dt__attn_drop, drop)                    \
    A(D, const float *, q) A(D, const float *, k) A(D, const float *, v)                   \
    A(D, const float *, dy) A(D, float *, dq) A(D, float *, dk) A(D, float *, dv)

#define KERNELS(K)                                                                          \
    K(gemm) K(add) K(sub) K(mul) K(scale) K(axpy) K(fill) K(copy) K(bias_add) K(bias_grad)  \
    K(relu) K(relu_grad) K(gelu) K(gelu_grad) K(softmax_xent) K(softmax_xent_grad) K(sum)   \
    K(max) K(mean) K(sq_norm) K(reduce_axis) K(nonfinite) K(cast) K(sgd) K(adam)            \
    K(sq_sum_f64)                                                                          \
    K(layer_norm) K(layer_norm_grad) K(softmax) K(softmax_grad) K(attention)                \
    K(attention_grad) K(embedding) K(embedding_grad) K(vocab_xent_stats) K(vocab_xent_loss) \
    K(vocab_xent_grad) K(vocab_xent_rows_stats) K(vocab_xent_rows_grad)                     \
    K(rms_norm) K(rms_norm_grad) K(rope) K(swiglu) K(swiglu_grad) K(attention_gqa)          \
    K(attention_gqa_grad) K(attention_drop) K(attention_drop_grad)

/* What A(kind, type, name) becomes in each place. */
#define FIELD(kind, t, n) FIELD_##kind(t, n)
#define FIELD_V(t, n) t n;
#define FIELD_D(t, n) t n;
#define FIELD_H(t, n) t n; int n##_set;
#define PARAM(kind, t, n) , PARAM_##kind(t, n)
#define PARAM_V(t, n) t n
#define PARAM_D(t, n) t n
#define PARAM_H(t, n) const t *n
#define STORE(kind, t, n) STORE_##kind(t, n)
#define STORE_V(t, n) clo_.n = n;
#define STORE_D(t, n) clo_.n = n; if (n && !dt__sim_owns(n, 1)) return foreign(kname, #n, n);
#define STORE_H(t, n) if ((clo_.n##_set = n != NULL)) clo_.n = *n;
#define PASS(kind, t, n) , PASS_##kind(t, n)
#define PASS_V(t, n) clo_->n
#define PASS_D(t, n) (t)dt__sim_xlate(clo_->n)
#define PASS_H(t, n) clo_->n##_set ? &clo_->n : NULL
#define DROP_FIRST(x, ...) __VA_ARGS__
#define LIST(...) DROP_FIRST(__VA_ARGS__)

/* The device this thread's kernels go to (set_device), and the streams it queued work on
 * since its last sync (a bit per ordinal). */
static _Thread_local int current;
static _Thread_local uint64_t touched;

static dt_status foreign(const char *kernel, const char *arg, const void *p)
{
    return dt__error(DT_ERR_INVALID_ARGUMENT, "sim kernel %s: argument %s (%p) is not "
                     "simulated device memory", kernel, arg, p);
}

static dt_status launch(dt_status (*run)(void *), const void *closure, size_t size)
{
    dt_status st = dt__sim_submit(current, run, closure, size);
    if (st == DT_OK)
        touched |= (uint64_t)1 << current;
    return st;
}

/* Per kernel: its closure, what runs on the stream, the entry of the table. */
#define DEFINE_KERNEL(kn)                                                                   \
    typedef struct kn##_closure { ARGS_##kn(FIELD) } kn##_closure;                          \
    static dt_status kn##_run(void *arg)                                                    \
    {                                                                                       \
        const kn##_closure *clo_ = arg;                                                     \
        return dt__ops_cpu_backend()->kn(LIST(~ ARGS_##kn(PASS)));                          \
    }                                                                                       \
    static dt_status sim_##kn(LIST(~ ARGS_##kn(PARAM)))                                     \
    {                                                                                       \
        static const char kname[] = #kn;                                                    \
        kn##_closure clo_; /* named so that no kernel argument shadows it */                \
        memset(&clo_, 0, sizeof clo_);                                                      \
        ARGS_##kn(STORE)                                                                    \
        return launch(kn##_run, &clo_, sizeof clo_);                                        \
    }
KERNELS(DEFINE_KERNEL)

static dt_status sim_set_device(int ordinal)
{
    if (ordinal < 0 || ordinal >= dt__sim_num_ordinals())
        return dt__error(DT_ERR_INVALID_ARGUMENT, "sim kernels: set_device(%d): this process's "
                         "simulated GPUs are ordinals 0..%d", ordinal,
                         dt__sim_num_ordinals() - 1);
    current = ordinal;
    return DT_OK;
}

/* Stops at the first failure; the streams not waited for yet stay for the next sync. */
static dt_status sim_sync(void)
{
    for (int i = 0; touched; i++) {
        uint64_t bit = (uint64_t)1 << i;
        if (!(touched & bit))
            continue;
        touched &= ~bit;
        dt_status st = dt__sim_sync(i);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

/* A kernel added to dt__ops_backend but not to KERNELS stops the build here. */
#define COUNT(kn) +1
_Static_assert(sizeof(dt__ops_backend) == (4 KERNELS(COUNT)) * sizeof(void *),
               "every kernel of dt__ops_backend is in KERNELS");

/* An op definition's kernel: the arguments go to the heap (they outgrow a closure) and the
 * stream thread translates the blocks' device pointers before it runs the CPU kernel. */
typedef struct def_closure {
    const dt_op_def *def;
    dt_op_kernel_args *args;
} def_closure;

static dt_status def_run(void *arg)
{
    const def_closure *c = arg;
    dt_op_kernel_args *a = c->args;
    for (int i = 0; i < a->nin; i++)
        a->in[i].data = dt__sim_xlate(a->in[i].data);
    a->out.data = dt__sim_xlate(a->out.data);
    dt_status st = c->def->cpu(a);
    free(a);
    return st;
}

static void def_drop(void *arg) /* skipped behind an earlier failure */
{
    free(((def_closure *)arg)->args);
}

static dt_status sim_run_def(const dt_op_def *def, const dt_op_kernel_args *args)
{
    for (int i = 0; i < args->nin; i++)
        if (args->in[i].data && !dt__sim_owns(args->in[i].data, 1))
            return foreign(def->name, "input", args->in[i].data);
    if (args->out.data && !dt__sim_owns(args->out.data, 1))
        return foreign(def->name, "output", args->out.data);
    def_closure c = {def, malloc(sizeof *args)};
    if (!c.args)
        return dt__error(DT_ERR_NO_MEMORY, "sim kernel %s: no memory", def->name);
    *c.args = *args;
    dt_status st = dt__sim_submit_owned(current, def_run, def_drop, &c, sizeof c);
    if (st == DT_OK)
        touched |= (uint64_t)1 << current;
    else
        free(c.args);
    return st;
}

#define TABLE_ENTRY(kn) .kn = sim_##kn,
static const dt__ops_backend sim_backend = {
    .name = "sim",
    .set_device = sim_set_device,
    .sync = sim_sync,
    .run_def = sim_run_def,
    KERNELS(TABLE_ENTRY)
};

const dt__ops_backend *dt__ops_sim_backend(void)
{
    return &sim_backend;
}
