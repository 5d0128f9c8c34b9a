/* Sequence-sharded (context-parallel) attention on CPU meshes: q, k, v (and dy) are put in
 * the working layout with the sequence sharded over its mesh dim (contiguous shards) and the
 * ring (ops/attention_ring.c) passes the key/value shards around that dim: no device holds
 * the whole sequence. Shared by dt_attention and dt_attention_gqa (docs/attention.md,
 * "Sequence-sharded attention: the ring"). */
#include "layout/tensor_dev.h"
#include "ops/attention_ring.h"
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

/* q's working layout: ls with the sequence sharded over sdim (contiguous shards). */
static void seq_spec(const dt__lspec *ls, int sdim, dt__lspec *qls)
{
    *qls = *ls;
    qls->spec[1] = sdim;
}

/* The inputs in the sequence-sharded layout, the outputs made there (n of each). */
static dt_status prepare(const dt_tensor *const *src, int n, const dt__lspec *qls, dt_tensor **in,
                         const int64_t *const *shapes, int nout, dt_tensor **out)
{
    dt_status st = DT_OK;
    for (int j = 0; j < n && st == DT_OK; j++)
        st = dt__ensure_layout(src[j], qls, &in[j]);
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(src[0]));
    for (int j = 0; j < nout && st == DT_OK; j++)
        st = dt__tensor_new(mesh, qls, DT_DTYPE_F32, shapes[j], &out[j]);
    return st;
}

dt_status dt__attention_cp_forward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                   const dt_attention_opts *o, const dt__lspec *ls, int sdim,
                                   dt_tensor **out)
{
    dt__lspec qls;
    seq_spec(ls, sdim, &qls);
    const dt_tensor *src[3] = {q, k, v};
    const int64_t *shapes[1] = {dt_tensor_shape(q)};
    dt_tensor *in[3] = {NULL, NULL, NULL}, *y = NULL;
    dt_status st = prepare(src, 3, &qls, in, shapes, 1, &y);
    if (st == DT_OK)
        st = dt__attention_ring(in[0], in[1], in[2], NULL, o, sdim, y, NULL, NULL, NULL);
    for (int j = 0; j < 3; j++)
        dt_tensor_destroy(in[j]);
    if (st != DT_OK) {
        dt_tensor_destroy(y);
        return st;
    }
    *out = y;
    return DT_OK;
}

dt_status dt__attention_cp_backward(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                    const dt_tensor *dy, const dt_attention_opts *o,
                                    const dt__lspec *ls, int sdim, dt_tensor **dq_out,
                                    dt_tensor **dk_out, dt_tensor **dv_out)
{
    dt__lspec qls;
    seq_spec(ls, sdim, &qls);
    const dt_tensor *src[4] = {q, k, v, dy};
    const int64_t *shapes[3] = {dt_tensor_shape(q), dt_tensor_shape(k), dt_tensor_shape(k)};
    dt_tensor *in[4] = {NULL, NULL, NULL, NULL}, *g[3] = {NULL, NULL, NULL};
    dt_status st = prepare(src, 4, &qls, in, shapes, 3, g);
    if (st == DT_OK)
        st = dt__attention_ring(in[0], in[1], in[2], in[3], o, sdim, NULL, g[0], g[1], g[2]);
    for (int j = 0; j < 4; j++)
        dt_tensor_destroy(in[j]);
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
