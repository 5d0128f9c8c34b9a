/* Sequence-sharded (context-parallel) attention on CPU meshes, causal load balanced: q, k, v
 * (and dy) are gathered along the sequence's mesh dim (all-gathers: O(T) per device); of the
 * sequence cut into 2 cp chunks, device c of cp computes the query rows of chunks c and
 * 2 cp - 1 - c (zig-zag: every device the same causal work) with the tiled kernel at their
 * global offsets, into a partial-sum tensor that is zero elsewhere; one reduce-scatter then
 * leaves y (dq, dk, dv) sharded along the sequence as q was. Shared by dt_attention and
 * dt_attention_gqa (docs/attention.md, "Sequence-sharded attention"). */
#include <string.h>

#include "layout/tensor_dev.h"
#include "ops/ops_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

int dt__attention_cp_dim(const dt_tensor *q, const dt__lspec *ls)
{
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(q));
    int64_t T = dt_tensor_shape(q)[1];
    if (dt_mesh_device_type(mesh) != DT_DEVICE_CPU || !dt__attention_use_tiled(T))
        return -1;
    dt__lspec qs;
    dt__lspec_of(dt_tensor_layout(q), &qs);
    int s = qs.spec[1];
    if (s < 0 || ls->spec[0] == s || ls->spec[2] == s)
        return -1;
    return s;
}

/* The position along mesh dim sdim of the device holding local component i of t. */
static int64_t coord_of(const dt_tensor *t, int i, int sdim)
{
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(t));
    int64_t pos = dt_tensor_local_position(t, i), stride = 1;
    for (int d = dt_mesh_rank(mesh) - 1; d > sdim; d--)
        stride *= dt_mesh_dim_size(mesh, d);
    return (pos / stride) % dt_mesh_dim_size(mesh, sdim);
}

/* Chunk j of the 2 cp chunks of the sequence: offset and length. */
static void chunk(int64_t T, int64_t cp, int64_t j, int64_t *off, int64_t *len)
{
    dt_shard_range(T, 2 * cp, j, off, len);
}

/* The working layouts: ls (sequence gathered) and qls (sharded along it over sdim) and pls (ls,
 * partial sum over sdim). */
static void specs(const dt__lspec *ls, int sdim, dt__lspec *qls, dt__lspec *pls)
{
    *qls = *ls;
    qls->spec[1] = sdim;
    *pls = *ls;
    pls->partial[sdim] = 1 + DT_REDUCE_SUM;
}

static dt_status zeroed(const dt_mesh *mesh, const dt__lspec *pls, const int64_t *shape,
                        dt_tensor **out)
{
    dt_status st = dt__tensor_new(mesh, pls, DT_DTYPE_F32, shape, out);
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(*out); i++) {
        void *p = dt__local_data(*out, i);
        if (p)
            memset(p, 0, (size_t)dt__local_numel(*out, i) * sizeof(float));
    }
    return st;
}

dt_status dt__attention_cp_forward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                   int64_t heads, int64_t kv_heads, int causal, const dt__lspec *ls,
                                   int sdim, dt_tensor **out)
{
    const int64_t *s = dt_tensor_shape(q);
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(q));
    int64_t T = s[1], hd = s[2] / heads, group = heads / kv_heads;
    int64_t cp = dt_mesh_dim_size(mesh, sdim);
    dt__lspec qls, pls;
    specs(ls, sdim, &qls, &pls);
    dt_tensor *rq = NULL, *rk = NULL, *rv = NULL, *yp = NULL, *y = NULL;
    dt_status st = dt__ensure_layout(q, ls, &rq);
    if (st == DT_OK)
        st = dt__ensure_layout(k, ls, &rk);
    if (st == DT_OK)
        st = dt__ensure_layout(v, ls, &rv);
    if (st == DT_OK)
        st = zeroed(mesh, &pls, s, &yp);
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(yp); i++) {
        const DLTensor *l = dt_tensor_local(yp, i);
        int64_t B = l->shape[0], lh = l->shape[2] / hd, ld = l->shape[2], kld = ld / group;
        int64_t c = coord_of(yp, i, sdim);
        const float *qd = dt__local_data(rq, i), *kd = dt__local_data(rk, i),
                    *vd = dt__local_data(rv, i);
        float *yd = dt__local_data(yp, i);
        for (int two = 0; two < 2 && st == DT_OK; two++) {
            int64_t off, len;
            chunk(T, cp, two ? 2 * cp - 1 - c : c, &off, &len);
            for (int64_t b = 0; b < B && len > 0 && lh > 0 && st == DT_OK; b++)
                st = dt__attention_tiled_part(1, len, off, T, lh, lh / group, hd, causal,
                                              qd + (b * T + off) * ld, kd + b * T * kld,
                                              vd + b * T * kld, yd + (b * T + off) * ld, NULL);
        }
    }
    if (st == DT_OK) /* the rows to their owners: a reduce-scatter along the sequence */
        st = dt__ensure_layout(yp, &qls, &y);
    dt_tensor_destroy(yp);
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
                                    int causal, const dt__lspec *ls, int sdim, dt_tensor **dq_out,
                                    dt_tensor **dk_out, dt_tensor **dv_out)
{
    const int64_t *s = dt_tensor_shape(q), *sk = dt_tensor_shape(k);
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(q));
    int64_t T = s[1], hd = s[2] / heads, group = heads / kv_heads;
    int64_t cp = dt_mesh_dim_size(mesh, sdim);
    dt__lspec qls, pls;
    specs(ls, sdim, &qls, &pls);
    dt_tensor *in[4] = {NULL, NULL, NULL, NULL}, *part[3] = {NULL, NULL, NULL},
              *g[3] = {NULL, NULL, NULL};
    const dt_tensor *src[4] = {q, k, v, dy};
    dt_status st = DT_OK;
    for (int j = 0; j < 4 && st == DT_OK; j++)
        st = dt__ensure_layout(src[j], ls, &in[j]);
    for (int j = 0; j < 3 && st == DT_OK; j++)
        st = zeroed(mesh, &pls, j ? sk : s, &part[j]);
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(part[0]); i++) {
        const DLTensor *l = dt_tensor_local(part[0], i);
        int64_t B = l->shape[0], lh = l->shape[2] / hd, ld = l->shape[2], kld = ld / group;
        int64_t c = coord_of(part[0], i, sdim);
        const float *qd = dt__local_data(in[0], i), *kd = dt__local_data(in[1], i),
                    *vd = dt__local_data(in[2], i), *dyd = dt__local_data(in[3], i);
        float *dqd = dt__local_data(part[0], i), *dkd = dt__local_data(part[1], i),
              *dvd = dt__local_data(part[2], i);
        for (int two = 0; two < 2 && st == DT_OK; two++) {
            int64_t off, len;
            chunk(T, cp, two ? 2 * cp - 1 - c : c, &off, &len);
            for (int64_t b = 0; b < B && len > 0 && lh > 0 && st == DT_OK; b++)
                st = dt__attention_tiled_grad_part(
                    1, len, off, T, lh, lh / group, hd, causal, qd + (b * T + off) * ld,
                    kd + b * T * kld, vd + b * T * kld, dyd + (b * T + off) * ld,
                    dqd + (b * T + off) * ld, dkd + b * T * kld, dvd + b * T * kld, 1);
        }
    }
    /* The shares summed and scattered along the sequence: dq, dk, dv in q's layout. */
    for (int j = 0; j < 3 && st == DT_OK; j++)
        st = dt__ensure_layout(part[j], &qls, &g[j]);
    for (int j = 0; j < 4; j++)
        dt_tensor_destroy(in[j]);
    for (int j = 0; j < 3; j++)
        dt_tensor_destroy(part[j]);
    if (st != DT_OK) {
        for (int j = 0; j < 3; j++)
            dt_tensor_destroy(g[j]);
        return st;
    }
    *dq_out = g[0];
    *dk_out = g[1];
    *dv_out = g[2];
    return DT_OK;
}
