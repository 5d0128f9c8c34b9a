/* Sequence-sharded (context-parallel) attention on CPU meshes: q keeps its sharding along the
 * sequence over a mesh dim, k and v are gathered along it (an all-gather: O(T) per device),
 * each device runs the tiled kernel on its query slice at its global offset, and the key and
 * value gradients, partial sums over that mesh dim, are reduce-scattered back to q's sharding.
 * Shared by dt_attention and dt_attention_gqa (docs/attention.md, "Sequence-sharded"). */
#include "layout/tensor_dev.h"
#include "ops/ops_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

int dt__attention_cp_dim(const dt_tensor *q, const dt__lspec *ls)
{
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(q));
    if (dt_mesh_device_type(mesh) != DT_DEVICE_CPU ||
        !dt__attention_use_tiled(dt_tensor_shape(q)[1]))
        return -1;
    dt__lspec qs;
    dt__lspec_of(dt_tensor_layout(q), &qs);
    int s = qs.spec[1];
    if (s < 0 || ls->spec[0] == s || ls->spec[2] == s)
        return -1;
    return s;
}

/* Local component i: its batch rows, query rows, offset along the sequence and heads. */
static void comp(const dt_tensor *t, int i, int64_t hd, int64_t *b, int64_t *n, int64_t *off,
                 int64_t *h)
{
    const DLTensor *l = dt_tensor_local(t, i);
    *b = l->shape[0];
    *n = l->shape[1];
    *h = l->shape[2] / hd;
    *off = dt_tensor_local_offset(t, i)[1];
}

dt_status dt__attention_cp_forward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                   int64_t heads, int64_t kv_heads, int causal,
                                   const dt__lspec *ls, int sdim, dt_tensor **out)
{
    const int64_t *s = dt_tensor_shape(q);
    int64_t T = s[1], hd = s[2] / heads, group = heads / kv_heads;
    dt__lspec qls = *ls;
    qls.spec[1] = sdim;
    dt_tensor *rq = NULL, *rk = NULL, *rv = NULL, *y = NULL;
    dt_status st = dt__ensure_layout(q, &qls, &rq);
    if (st == DT_OK)
        st = dt__ensure_layout(k, ls, &rk);
    if (st == DT_OK)
        st = dt__ensure_layout(v, ls, &rv);
    if (st == DT_OK)
        st = dt__tensor_empty(dt_tensor_layout(rq), DT_DTYPE_F32, s, &y);
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(y); i++) {
        int64_t b, n, off, lh;
        comp(y, i, hd, &b, &n, &off, &lh);
        if (b * n * lh == 0)
            continue;
        st = dt__attention_tiled_part(b, n, off, T, lh, lh / group, hd, causal,
                                      dt__local_data(rq, i), dt__local_data(rk, i),
                                      dt__local_data(rv, i), dt__local_data(y, i), NULL);
    }
    dt_tensor_destroy(rv);
    dt_tensor_destroy(rk);
    dt_tensor_destroy(rq);
    if (st != DT_OK) {
        dt_tensor_destroy(y);
        return st;
    }
    *out = y;
    return DT_OK;
}

dt_status dt__attention_cp_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                    const dt_tensor *dy, int64_t heads, int64_t kv_heads,
                                    int causal, const dt__lspec *ls, int sdim,
                                    dt_tensor **dq_out, dt_tensor **dk_out, dt_tensor **dv_out)
{
    const int64_t *s = dt_tensor_shape(q), *sk = dt_tensor_shape(k);
    int64_t T = s[1], hd = s[2] / heads, group = heads / kv_heads;
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(q));
    dt__lspec qls = *ls, pls = *ls;
    qls.spec[1] = sdim;
    pls.partial[sdim] = 1 + DT_REDUCE_SUM; /* each slice's share of dk, dv */
    dt_tensor *rq = NULL, *rdy = NULL, *rk = NULL, *rv = NULL, *dq = NULL, *pk = NULL,
              *pv = NULL, *dk = NULL, *dv = NULL;
    dt_status st = dt__ensure_layout(q, &qls, &rq);
    if (st == DT_OK)
        st = dt__ensure_layout(dy, &qls, &rdy);
    if (st == DT_OK)
        st = dt__ensure_layout(k, ls, &rk);
    if (st == DT_OK)
        st = dt__ensure_layout(v, ls, &rv);
    if (st == DT_OK)
        st = dt__tensor_empty(dt_tensor_layout(rq), DT_DTYPE_F32, s, &dq);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &pls, DT_DTYPE_F32, sk, &pk);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &pls, DT_DTYPE_F32, sk, &pv);
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(dq); i++) {
        int64_t b, n, off, lh;
        comp(dq, i, hd, &b, &n, &off, &lh);
        if (b * lh == 0)
            continue;
        /* Runs with n == 0 too: it zeroes this device's share of dk, dv. */
        st = dt__attention_tiled_grad_part(b, n, off, T, lh, lh / group, hd, causal,
                                           dt__local_data(rq, i), dt__local_data(rk, i),
                                           dt__local_data(rv, i), dt__local_data(rdy, i),
                                           dt__local_data(dq, i), dt__local_data(pk, i),
                                           dt__local_data(pv, i));
    }
    /* The shares summed and scattered along the sequence: dk, dv in q's layout. */
    dt__lspec kls = qls;
    if (st == DT_OK)
        st = dt__ensure_layout(pk, &kls, &dk);
    if (st == DT_OK)
        st = dt__ensure_layout(pv, &kls, &dv);
    dt_tensor *tmp[] = {rq, rdy, rk, rv, pk, pv};
    for (int j = 0; j < 6; j++)
        dt_tensor_destroy(tmp[j]);
    if (st != DT_OK) {
        dt_tensor_destroy(dq);
        dt_tensor_destroy(dk);
        dt_tensor_destroy(dv);
        return st;
    }
    *dq_out = dq;
    *dk_out = dk;
    *dv_out = dv;
    return DT_OK;
}
