/* Distributed self-attention on q [batch, seq, heads * head_dim] and k, v [batch, seq,
 * kv_heads * head_dim]: dt_attention, dt_attention_gqa and dt_attention_ex (dropout of the
 * probabilities) share one implementation. The sequence is gathered, batch keeps q's
 * sharding and the heads stay sharded over q's model dim when whole key/value groups fall on
 * each device (Megatron's head-parallel attention: no communication). With the tiled kernel
 * on a CPU mesh, a sequence-sharded q keeps its sharding (ops/attention_cp.c). */
#include <string.h>

#include "layout/tensor_dev.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"
#include "runtime/record.h"

/* Which kernel of the backend runs: dt_attention's, dt_attention_gqa's (so each op keeps its
 * kernel's bits), or the one with dropout. */
typedef enum att_kind { ATT_PLAIN, ATT_GQA, ATT_DROP } att_kind;

static dt_status check_qkv(const char *op, const dt_tensor *q, const dt_tensor *k,
                           const dt_tensor *v, int64_t heads)
{
    const dt_tensor *t[3] = {q, k, v};
    static const char *const names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++) {
        dt_status st = dt__check_like(op, names[i], t[i], q);
        if (st != DT_OK)
            return st;
    }
    if (dt_tensor_rank(q) != 3)
        return dt__error(DT_ERR_SHAPE, "%s: q, k and v must be [batch, seq, heads * head_dim] "
                         "(rank %d)", op, dt_tensor_rank(q));
    if (heads < 1 || dt_tensor_shape(q)[2] % heads != 0)
        return dt__error(DT_ERR_SHAPE, "%s: %lld heads do not divide the width %lld", op,
                         (long long)heads, (long long)dt_tensor_shape(q)[2]);
    return DT_OK;
}

/* q [B, T, heads * D]; k, v [B, T, kv_heads * D], f32 on q's mesh. */
static dt_status check_gqa(const char *op, const dt_tensor *q, const dt_tensor *k,
                           const dt_tensor *v, int64_t heads, int64_t kv_heads)
{
    dt_status st = dt__check_f32(op, "q", q);
    if (st == DT_OK)
        st = dt__check_f32(op, "k", k);
    if (st == DT_OK)
        st = dt__check_tensor(op, "k", k, q);
    if (st == DT_OK)
        st = dt__check_like(op, "v", v, k);
    if (st != DT_OK)
        return st;
    if (dt_tensor_rank(q) != 3)
        return dt__error(DT_ERR_SHAPE, "%s: x must be [batch, seq, heads * head_dim] (rank %d)",
                         op, dt_tensor_rank(q));
    const int64_t *sq = dt_tensor_shape(q), *sk = dt_tensor_shape(k);
    if (heads < 1 || sq[2] % heads != 0)
        return dt__error(DT_ERR_SHAPE, "%s: %lld heads do not divide the width %lld into whole "
                         "heads", op, (long long)heads, (long long)sq[2]);
    if (kv_heads < 1 || heads % kv_heads != 0)
        return dt__error(DT_ERR_SHAPE, "%s: kv_heads %lld must divide heads %lld", op,
                         (long long)kv_heads, (long long)heads);
    if (dt_tensor_rank(k) != 3 || sk[0] != sq[0] || sk[1] != sq[1] ||
        sk[2] != kv_heads * (sq[2] / heads))
        return dt__error(DT_ERR_SHAPE, "%s: k and v must be [%lld, %lld, %lld] (kv_heads * "
                         "head_dim)", op, (long long)sq[0], (long long)sq[1],
                         (long long)(kv_heads * (sq[2] / heads)));
    return DT_OK;
}

static dt_status check(const char *op, att_kind kind, const dt_tensor *q, const dt_tensor *k,
                       const dt_tensor *v, const dt_attention_opts *o)
{
    if (kind == ATT_PLAIN)
        return check_qkv(op, q, k, v, o->heads);
    return check_gqa(op, q, k, v, o->heads, o->kv_heads);
}

/* The local kernels of attention and its backward on component i (dt__ops_each_local): in
 * q, k, v (and dy), out y (or dq, dk, dv). */
typedef struct att_local {
    const dt__ops_backend *be;
    const dt_tensor *in[4];
    const dt_tensor *out[3];
    const dt_attention_opts *o;
    att_kind kind;
    int64_t hd;
} att_local;

/* Component i's place in the global probabilities (whole sequence, its batch rows and heads). */
static dt__attn_drop drop_of(const att_local *a, int i)
{
    const int64_t *off = dt_tensor_local_offset(a->in[0], i);
    dt__attn_drop d = {.p = a->o->dropout, .seed = a->o->seed, .stream = a->o->stream,
                       .heads = a->o->heads, .seq = dt_tensor_shape(a->in[0])[1],
                       .b0 = off[0], .h0 = off[2] / a->hd};
    return d;
}

static dt_status att_one(int i, void *arg)
{
    const att_local *a = arg;
    const DLTensor *l = dt_tensor_local(a->out[0], i);
    if (dt__numel(3, l->shape) == 0)
        return DT_OK;
    int64_t lh = l->shape[2] / a->hd, lkv = lh / (a->o->heads / a->o->kv_heads);
    const float *q = dt__local_data(a->in[0], i), *k = dt__local_data(a->in[1], i),
                *v = dt__local_data(a->in[2], i);
    float *y = dt__local_data(a->out[0], i);
    if (a->kind == ATT_PLAIN)
        return a->be->attention(l->shape[0], l->shape[1], lh, a->hd, a->o->causal, q, k, v, y);
    if (a->kind == ATT_GQA)
        return a->be->attention_gqa(l->shape[0], l->shape[1], lh, lkv, a->hd, a->o->causal, q,
                                    k, v, y);
    dt__attn_drop d = drop_of(a, i);
    return a->be->attention_drop(l->shape[0], l->shape[1], lh, lkv, a->hd, a->o->causal, &d, q,
                                 k, v, y);
}

static dt_status att_grad_one(int i, void *arg)
{
    const att_local *a = arg;
    const DLTensor *l = dt_tensor_local(a->in[0], i);
    if (dt__numel(3, l->shape) == 0)
        return DT_OK;
    int64_t lh = l->shape[2] / a->hd, lkv = lh / (a->o->heads / a->o->kv_heads);
    const float *q = dt__local_data(a->in[0], i), *k = dt__local_data(a->in[1], i),
                *v = dt__local_data(a->in[2], i), *dy = dt__local_data(a->in[3], i);
    float *dq = dt__local_data(a->out[0], i), *dk = dt__local_data(a->out[1], i),
          *dv = dt__local_data(a->out[2], i);
    if (a->kind == ATT_PLAIN)
        return a->be->attention_grad(l->shape[0], l->shape[1], lh, a->hd, a->o->causal, q, k, v,
                                     dy, dq, dk, dv);
    if (a->kind == ATT_GQA)
        return a->be->attention_gqa_grad(l->shape[0], l->shape[1], lh, lkv, a->hd, a->o->causal,
                                         q, k, v, dy, dq, dk, dv);
    dt__attn_drop d = drop_of(a, i);
    return a->be->attention_drop_grad(l->shape[0], l->shape[1], lh, lkv, a->hd, a->o->causal, &d,
                                      q, k, v, dy, dq, dk, dv);
}

/* The layout attention runs in: q's batch sharding, the sequence gathered, the width sharded
 * as q's when its mesh dim splits the key/value groups (the heads, for plain attention)
 * evenly. */
static void attn_spec(const dt_tensor *q, int64_t kv_heads, dt__lspec *ls)
{
    dt__lspec_gathered(q, 1, ls);
    int m = ls->spec[2];
    if (m >= 0 && kv_heads % dt_mesh_dim_size(dt_layout_mesh(dt_tensor_layout(q)), m) != 0)
        ls->spec[2] = -1;
}

/* The checks every entry shares, and the backend; refuses dropout where it has no kernel. */
static dt_status begin(const char *op, att_kind kind, const dt_tensor *q, const dt_tensor *k,
                       const dt_tensor *v, const dt_tensor *dy, const dt_attention_opts *o,
                       int outs_given, const dt__ops_backend **be)
{
    dt_status st = check(op, kind, q, k, v, o);
    if (st == DT_OK && dy)
        st = dt__check_like(op, "dy", dy, q);
    st = dt__ops_begin(op, st, outs_given, dy ? "output pointer" : "out", q, NULL, be);
    if (st == DT_OK && kind == ATT_DROP && !(*be)->attention_drop)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: dropout of the attention probabilities is not "
                         "implemented for %s meshes (dropout %g)", op, (*be)->name,
                         (double)o->dropout);
    return st;
}

static dt_status attention_run(const char *op, att_kind kind, const dt_tensor *q,
                               const dt_tensor *k, const dt_tensor *v,
                               const dt_attention_opts *o, dt_tensor **out)
{
    const dt__ops_backend *be = NULL;
    dt_status st = begin(op, kind, q, k, v, NULL, o, out != NULL, &be);
    if (st != DT_OK)
        return st;
    const int64_t *s = dt_tensor_shape(q);
    dt__lspec ls;
    attn_spec(q, o->kv_heads, &ls);
    int sdim = dt__attention_cp_dim(q, &ls);
    if (sdim >= 0) { /* the sequence stays sharded (ops/attention_cp.c) */
        dt_tensor *t = NULL;
        st = dt__attention_cp_forward(q, k, v, o, &ls, sdim, &t);
        return dt__ops_finish(be, op, NULL, st, &t, out);
    }
    dt_tensor *rq = NULL, *rk = NULL, *rv = NULL, *y = NULL;
    st = dt__ensure_layout(q, &ls, &rq);
    if (st == DT_OK)
        st = dt__ensure_layout(k, &ls, &rk);
    if (st == DT_OK)
        st = dt__ensure_layout(v, &ls, &rv);
    if (st == DT_OK)
        st = dt__tensor_empty(dt_tensor_layout(rq), DT_DTYPE_F32, s, &y);
    att_local al = {be, {rq, rk, rv, NULL}, {y, NULL, NULL}, o, kind, s[2] / o->heads};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, att_one, &al);
    st = dt__ops_finish(be, op, NULL, st, &y, out);
    dt_tensor_destroy(rv);
    dt_tensor_destroy(rk);
    dt_tensor_destroy(rq);
    return st;
}

static dt_status attention_backward(const char *op, att_kind kind, const dt_tensor *q,
                                    const dt_tensor *k, const dt_tensor *v,
                                    const dt_attention_opts *o, const dt_tensor *dy,
                                    dt_tensor **dq_out, dt_tensor **dk_out, dt_tensor **dv_out)
{
    const dt__ops_backend *be = NULL;
    dt_status st = begin(op, kind, q, k, v, dy, o, dq_out && dk_out && dv_out, &be);
    if (st != DT_OK)
        return st;
    dt__lspec ls;
    attn_spec(q, o->kv_heads, &ls);
    int sdim = dt__attention_cp_dim(q, &ls);
    if (sdim >= 0) /* the sequence stays sharded (ops/attention_cp.c) */
        return dt__attention_cp_backward(q, k, v, dy, o, &ls, sdim, dq_out, dk_out, dv_out);
    dt_tensor *in[4] = {NULL, NULL, NULL, NULL}, *g[3] = {NULL, NULL, NULL};
    const dt_tensor *src[4] = {q, k, v, dy};
    for (int j = 0; j < 4 && st == DT_OK; j++)
        st = dt__ensure_layout(src[j], &ls, &in[j]);
    for (int j = 0; j < 3 && st == DT_OK; j++)
        st = dt__tensor_empty(dt_tensor_layout(in[j]), DT_DTYPE_F32, dt_tensor_shape(src[j]),
                              &g[j]);
    att_local al = {be, {in[0], in[1], in[2], in[3]}, {g[0], g[1], g[2]}, o, kind,
                    dt_tensor_shape(q)[2] / o->heads};
    if (st == DT_OK)
        st = dt__ops_each_local(be, in[0], att_grad_one, &al);
    if (st == DT_OK && be->sync)
        st = be->sync();
    if (st == DT_OK) {
        *dq_out = g[0];
        *dk_out = g[1];
        *dv_out = g[2];
        g[0] = g[1] = g[2] = NULL;
    }
    for (int j = 0; j < 4; j++)
        dt_tensor_destroy(in[j]);
    for (int j = 0; j < 3; j++)
        dt_tensor_destroy(g[j]);
    return st;
}

/* dt_attention_ex's options resolved (kv_heads 0 is heads) and checked; the kernel kind. */
static dt_status resolve(const char *op, const dt_attention_opts *opts, dt_attention_opts *o,
                         att_kind *kind)
{
    if (!opts)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: opts is NULL", op);
    *o = *opts;
    if (o->kv_heads == 0)
        o->kv_heads = o->heads;
    if (!(o->dropout >= 0.0f && o->dropout < 1.0f))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: dropout %g must be in [0, 1)", op,
                         (double)o->dropout);
    *kind = o->dropout > 0.0f ? ATT_DROP : ATT_GQA;
    return DT_OK;
}

/* ---- the public entries: the forwards record the call on this thread's tape ------------ */

dt_status dt_attention(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                       int64_t heads, int causal, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_attention_opts o = {.heads = heads, .kv_heads = heads, .causal = causal};
    dt_status st = attention_run("dt_attention", ATT_PLAIN, q, k, v, &o, out ? &t : NULL);
    dt__op_record rec = {.kind = DT_OP_ATTENTION, .nin = 3, .in = {q, k, v},
                         .iattr = {heads, causal}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_attention_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                int64_t heads, int causal, const dt_tensor *dy,
                                dt_tensor **dq_out, dt_tensor **dk_out, dt_tensor **dv_out)
{
    dt_attention_opts o = {.heads = heads, .kv_heads = heads, .causal = causal};
    return attention_backward("dt_attention_backward", ATT_PLAIN, q, k, v, &o, dy, dq_out,
                              dk_out, dv_out);
}

dt_status dt_attention_gqa(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                           int64_t heads, int64_t kv_heads, int causal, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_attention_opts o = {.heads = heads, .kv_heads = kv_heads, .causal = causal};
    dt_status st = attention_run("dt_attention_gqa", ATT_GQA, q, k, v, &o, out ? &t : NULL);
    dt__op_record rec = {.kind = DT_OP_ATTENTION_GQA, .nin = 3, .in = {q, k, v},
                         .iattr = {heads, kv_heads, causal}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_attention_gqa_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                    int64_t heads, int64_t kv_heads, int causal,
                                    const dt_tensor *dy, dt_tensor **dq_out,
                                    dt_tensor **dk_out, dt_tensor **dv_out)
{
    dt_attention_opts o = {.heads = heads, .kv_heads = kv_heads, .causal = causal};
    return attention_backward("dt_attention_gqa_backward", ATT_GQA, q, k, v, &o, dy, dq_out,
                              dk_out, dv_out);
}

/* Recorded as DT_OP_ATTENTION_GQA with the dropout in the attributes (rules_llama.c). */
dt_status dt_attention_ex(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                          const dt_attention_opts *opts, dt_tensor **out)
{
    static const char op[] = "dt_attention_ex";
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_attention_opts o = {0};
    att_kind kind = ATT_GQA;
    dt_status st = resolve(op, opts, &o, &kind);
    if (st == DT_OK)
        st = attention_run(op, kind, q, k, v, &o, out ? &t : NULL);
    dt__op_record rec = {.kind = DT_OP_ATTENTION_GQA, .nin = 3, .in = {q, k, v},
                         .iattr = {o.heads, o.kv_heads, o.causal, (int64_t)o.seed,
                                   (int64_t)o.stream},
                         .fattr = {o.dropout}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_attention_ex_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                   const dt_attention_opts *opts, const dt_tensor *dy,
                                   dt_tensor **dq_out, dt_tensor **dk_out, dt_tensor **dv_out)
{
    static const char op[] = "dt_attention_ex_backward";
    dt_attention_opts o = {0};
    att_kind kind = ATT_GQA;
    dt_status st = resolve(op, opts, &o, &kind);
    if (st != DT_OK)
        return st;
    return attention_backward(op, kind, q, k, v, &o, dy, dq_out, dk_out, dv_out);
}
