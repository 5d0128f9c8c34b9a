/* Distributed causal self-attention on q, k, v [batch, seq, heads * head_dim]: the sequence is
 * gathered, batch keeps q's sharding and the heads stay sharded over q's model dim when whole
 * heads fall on each device (Megatron's head-parallel attention: no communication). With the
 * tiled kernel on a CPU mesh, a sequence-sharded q keeps its sharding (ops/attention_cp.c). */
#include <string.h>

#include "layout/tensor_dev.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"
#include "autograd/record.h"

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

/* The local kernels of attention and its backward on component i (dt__ops_each_local): in
 * q, k, v (and dy), out y (or dq, dk, dv). */
typedef struct att_local {
    const dt__ops_backend *be;
    const dt_tensor *in[4];
    const dt_tensor *out[3];
    int64_t hd;
    int causal;
} att_local;

static dt_status att_one(int i, void *arg)
{
    const att_local *a = arg;
    const DLTensor *l = dt_tensor_local(a->out[0], i);
    if (dt__numel(3, l->shape) == 0)
        return DT_OK;
    return a->be->attention(l->shape[0], l->shape[1], l->shape[2] / a->hd, a->hd, a->causal,
                            dt__local_data(a->in[0], i), dt__local_data(a->in[1], i),
                            dt__local_data(a->in[2], i), dt__local_data(a->out[0], i));
}

static dt_status att_grad_one(int i, void *arg)
{
    const att_local *a = arg;
    const DLTensor *l = dt_tensor_local(a->in[0], i);
    if (dt__numel(3, l->shape) == 0)
        return DT_OK;
    return a->be->attention_grad(l->shape[0], l->shape[1], l->shape[2] / a->hd, a->hd,
                                 a->causal, dt__local_data(a->in[0], i),
                                 dt__local_data(a->in[1], i), dt__local_data(a->in[2], i),
                                 dt__local_data(a->in[3], i), dt__local_data(a->out[0], i),
                                 dt__local_data(a->out[1], i), dt__local_data(a->out[2], i));
}

/* The layout attention runs in: q's batch sharding, the sequence gathered, the width sharded
 * as q's when its mesh dim splits the heads evenly. */
static void attn_spec(const dt_tensor *q, int64_t heads, dt__lspec *ls)
{
    dt__lspec_gathered(q, 1, ls);
    int m = ls->spec[2];
    if (m >= 0 && heads % dt_mesh_dim_size(dt_layout_mesh(dt_tensor_layout(q)), m) != 0)
        ls->spec[2] = -1;
}

static dt_status attention_run(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                       int64_t heads, int causal, dt_tensor **out)
{
    static const char op[] = "dt_attention";
    const dt__ops_backend *be = NULL;
    dt_status st = dt__ops_begin(op, check_qkv(op, q, k, v, heads), out != NULL, "out", q, NULL,
                                 &be);
    if (st != DT_OK)
        return st;
    const int64_t *s = dt_tensor_shape(q);
    int64_t hd = s[2] / heads;
    dt__lspec ls;
    attn_spec(q, heads, &ls);
    int sdim = dt__attention_cp_dim(q, &ls);
    if (sdim >= 0) { /* the sequence stays sharded (ops/attention_cp.c) */
        dt_tensor *t = NULL;
        st = dt__attention_cp_forward(q, k, v, heads, heads, causal, &ls, sdim, &t);
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
    att_local al = {be, {rq, rk, rv, NULL}, {y, NULL, NULL}, hd, causal};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, att_one, &al);
    st = dt__ops_finish(be, op, NULL, st, &y, out);
    dt_tensor_destroy(rv);
    dt_tensor_destroy(rk);
    dt_tensor_destroy(rq);
    return st;
}

/* The public entry: records the call on this thread's tape (autograd/record.h). */
dt_status dt_attention(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                       int64_t heads, int causal, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = attention_run(q, k, v, heads, causal, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_ATTENTION, .nin = 3, .in = {q, k, v}, .iattr = {heads, causal}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_attention_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                int64_t heads, int causal, const dt_tensor *dy,
                                dt_tensor **dq_out, dt_tensor **dk_out, dt_tensor **dv_out)
{
    static const char op[] = "dt_attention_backward";
    dt_status st = check_qkv(op, q, k, v, heads);
    if (st == DT_OK)
        st = dt__check_like(op, "dy", dy, q);
    const dt__ops_backend *be = NULL;
    st = dt__ops_begin(op, st, dq_out && dk_out && dv_out, "output pointer", q, NULL, &be);
    if (st != DT_OK)
        return st;
    const int64_t *s = dt_tensor_shape(q);
    int64_t hd = s[2] / heads;
    dt__lspec ls;
    attn_spec(q, heads, &ls);
    int sdim = dt__attention_cp_dim(q, &ls);
    if (sdim >= 0) /* the sequence stays sharded (ops/attention_cp.c) */
        return dt__attention_cp_backward(q, k, v, dy, heads, heads, causal, &ls, sdim, dq_out,
                                         dk_out, dv_out);
    dt_tensor *in[4] = {NULL, NULL, NULL, NULL}, *g[3] = {NULL, NULL, NULL};
    const dt_tensor *src[4] = {q, k, v, dy};
    for (int j = 0; j < 4 && st == DT_OK; j++)
        st = dt__ensure_layout(src[j], &ls, &in[j]);
    for (int j = 0; j < 3 && st == DT_OK; j++)
        st = dt__tensor_empty(dt_tensor_layout(in[0]), DT_DTYPE_F32, s, &g[j]);
    att_local al = {be, {in[0], in[1], in[2], in[3]}, {g[0], g[1], g[2]}, hd, causal};
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
