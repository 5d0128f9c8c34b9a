/* Distributed Llama-style ops: RMS normalisation (the last dim gathered, the gain's gradient
 * partial over the row dims), rotary embeddings and SwiGLU in their input's layout, and
 * (grouped-query attention is in ops/spmd_attention.c). */
#include <string.h>

#include "runtime/record.h"
#include "layout/tensor_dev.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* The local kernels of component i (dt__ops_each_local): inputs in, outputs out. */
typedef struct ll_local {
    const dt__ops_backend *be;
    const dt_tensor *in[4];
    const dt_tensor *out[3];
    int64_t cols, hd, pos;
    float eps;
    int flag; /* rope: inverse */
} ll_local;

static dt_status rms_one(int i, void *arg)
{
    const ll_local *a = arg;
    int64_t n = dt__local_numel(a->out[0], i);
    if (n == 0 || a->cols == 0)
        return DT_OK;
    return a->be->rms_norm(n / a->cols, a->cols, dt__local_data(a->in[0], i),
                           dt__local_data(a->in[1], i), a->eps, dt__local_data(a->out[0], i));
}

/* Also for empty rows: the partial gain gradient is still written (zeros). */
static dt_status rms_grad_one(int i, void *arg)
{
    const ll_local *a = arg;
    int64_t n = dt__local_numel(a->out[0], i);
    if (a->cols == 0)
        return DT_OK;
    return a->be->rms_norm_grad(n / a->cols, a->cols, dt__local_data(a->in[0], i),
                                dt__local_data(a->in[1], i), dt__local_data(a->in[2], i),
                                a->eps, dt__local_data(a->out[0], i),
                                dt__local_data(a->out[1], i));
}

/* Each block at its own global positions along T. */
static dt_status rope_one(int i, void *arg)
{
    const ll_local *a = arg;
    const DLTensor *l = dt_tensor_local(a->out[0], i);
    if (dt__numel(3, l->shape) == 0)
        return DT_OK;
    int64_t t0 = dt_tensor_local_offset(a->out[0], i)[1];
    return a->be->rope(l->shape[0], l->shape[1], l->shape[2] / a->hd, a->hd, a->pos + t0,
                       a->flag, dt__local_data(a->in[0], i), dt__local_data(a->out[0], i));
}

static dt_status swiglu_one(int i, void *arg)
{
    const ll_local *a = arg;
    int64_t n = dt__local_numel(a->out[0], i);
    if (n == 0)
        return DT_OK;
    return a->be->swiglu(n, dt__local_data(a->in[0], i), dt__local_data(a->in[1], i),
                         dt__local_data(a->out[0], i));
}

static dt_status swiglu_grad_one(int i, void *arg)
{
    const ll_local *a = arg;
    int64_t n = dt__local_numel(a->in[0], i);
    if (n == 0)
        return DT_OK;
    return a->be->swiglu_grad(n, dt__local_data(a->in[0], i), dt__local_data(a->in[1], i),
                              dt__local_data(a->in[2], i), dt__local_data(a->out[0], i),
                              dt__local_data(a->out[1], i));
}

static dt_status check_x(const char *op, const dt_tensor *x, const void *out)
{
    dt_status st = dt__check_f32(op, "x", x);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: output pointer is NULL", op);
    if (st == DT_OK && dt_tensor_rank(x) < 1)
        st = dt__error(DT_ERR_SHAPE, "%s: x must have rank 1 or more", op);
    return st;
}

/* The gain: 1-D of x's last dim, f32, on x's mesh. */
static dt_status check_gain(const char *op, const dt_tensor *g, const dt_tensor *x)
{
    dt_status st = dt__check_f32(op, "gain", g);
    if (st == DT_OK)
        st = dt__check_tensor(op, "gain", g, x);
    if (st == DT_OK && (dt_tensor_rank(g) != 1 ||
                        dt_tensor_shape(g)[0] != dt_tensor_shape(x)[dt_tensor_rank(x) - 1]))
        st = dt__error(DT_ERR_SHAPE, "%s: gain must be 1-D of x's last dim (%lld)", op,
                       (long long)dt_tensor_shape(x)[dt_tensor_rank(x) - 1]);
    return st;
}

static dt_status replicated(const dt_tensor *p, dt_tensor **out)
{
    dt__lspec ls;
    dt__lspec_gathered(p, 0, &ls);
    return dt__ensure_layout(p, &ls, out);
}

static dt_status rms_norm_run(const dt_tensor *x, const dt_tensor *gain, float eps,
                              dt_tensor **out)
{
    static const char op[] = "dt_rms_norm";
    dt_status st = check_x(op, x, out);
    if (st == DT_OK)
        st = check_gain(op, gain, x);
    const dt__ops_backend *be = NULL;
    st = dt__ops_begin(op, st, 1, NULL, x, NULL, &be);
    if (st != DT_OK)
        return st;
    int r = dt_tensor_rank(x);
    int64_t cols = dt_tensor_shape(x)[r - 1];
    dt__lspec ls;
    dt__lspec_gathered(x, r - 1, &ls);
    dt_tensor *rx = NULL, *rg = NULL, *y = NULL;
    st = dt__ensure_layout(x, &ls, &rx);
    if (st == DT_OK)
        st = replicated(gain, &rg);
    if (st == DT_OK)
        st = dt__tensor_empty(dt_tensor_layout(rx), DT_DTYPE_F32, dt_tensor_shape(x), &y);
    ll_local a = {.be = be, .in = {rx, rg}, .out = {y}, .cols = cols, .eps = eps};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, rms_one, &a);
    st = dt__ops_finish(be, op, NULL, st, &y, out);
    dt_tensor_destroy(rg);
    dt_tensor_destroy(rx);
    return st;
}

dt_status dt_rms_norm_backward(const dt_tensor *x, const dt_tensor *gain, const dt_tensor *dy,
                               float eps, dt_tensor **dx_out, dt_tensor **dgain_out)
{
    static const char op[] = "dt_rms_norm_backward";
    dt_status st = check_x(op, x, dx_out);
    if (st == DT_OK)
        st = check_gain(op, gain, x);
    if (st == DT_OK)
        st = dt__check_like(op, "dy", dy, x);
    const dt_mesh *mesh = NULL;
    const dt__ops_backend *be = NULL;
    st = dt__ops_begin(op, st, dgain_out != NULL, "dgain_out", x, &mesh, &be);
    if (st != DT_OK)
        return st;
    int r = dt_tensor_rank(x);
    int64_t cols = dt_tensor_shape(x)[r - 1];
    dt__lspec ls, lp;
    dt__lspec_gathered(x, r - 1, &ls);
    memset(&lp, 0, sizeof lp);
    lp.rank = 1;
    lp.spec[0] = -1;
    for (int d = 0; d < r - 1; d++)
        if (ls.spec[d] >= 0)
            lp.partial[ls.spec[d]] = 1 + (int)DT_REDUCE_SUM;
    dt_tensor *rx = NULL, *rg = NULL, *rdy = NULL, *dx = NULL, *dg = NULL;
    st = dt__ensure_layout(x, &ls, &rx);
    if (st == DT_OK)
        st = replicated(gain, &rg);
    if (st == DT_OK)
        st = dt__ensure_layout(dy, &ls, &rdy);
    if (st == DT_OK)
        st = dt__tensor_empty(dt_tensor_layout(rx), DT_DTYPE_F32, dt_tensor_shape(x), &dx);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &lp, DT_DTYPE_F32, &cols, &dg);
    ll_local a = {.be = be, .in = {rx, rg, rdy}, .out = {dx, dg}, .cols = cols, .eps = eps};
    if (st == DT_OK)
        st = dt__ops_each_local(be, dx, rms_grad_one, &a);
    if (st == DT_OK && be->sync)
        st = be->sync();
    if (st == DT_OK) {
        *dx_out = dx;
        *dgain_out = dg;
        dx = dg = NULL;
    }
    dt_tensor_destroy(dg);
    dt_tensor_destroy(dx);
    dt_tensor_destroy(rdy);
    dt_tensor_destroy(rg);
    dt_tensor_destroy(rx);
    return st;
}

/* x [B, T, heads * head_dim] with head_dim even. */
static dt_status check_heads(const char *op, const dt_tensor *x, int64_t heads, int even)
{
    if (dt_tensor_rank(x) != 3)
        return dt__error(DT_ERR_SHAPE, "%s: x must be [batch, seq, heads * head_dim] (rank %d)",
                         op, dt_tensor_rank(x));
    int64_t w = dt_tensor_shape(x)[2];
    if (heads < 1 || w % heads != 0 || (even && (w / heads) % 2 != 0))
        return dt__error(DT_ERR_SHAPE, "%s: %lld heads do not divide the width %lld into %s "
                         "heads", op, (long long)heads, (long long)w,
                         even ? "even-sized" : "whole");
    return DT_OK;
}

/* x's layout, partial dropped, the width kept sharded only over whole units (heads or
 * key/value groups: `units` of them). */
static void unit_spec(const dt_tensor *x, int gather_dim, int64_t units, dt__lspec *ls)
{
    dt__lspec_gathered(x, gather_dim, ls);
    int m = ls->spec[2];
    if (m >= 0 && units % dt_mesh_dim_size(dt_layout_mesh(dt_tensor_layout(x)), m) != 0)
        ls->spec[2] = -1;
}

static dt_status rope_common(const char *op, const dt_tensor *x, int64_t heads,
                             int64_t pos_offset, int inverse, dt_tensor **out)
{
    dt_status st = check_x(op, x, out);
    if (st == DT_OK)
        st = check_heads(op, x, heads, 1);
    if (st == DT_OK && pos_offset < 0)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: pos_offset %lld < 0", op,
                       (long long)pos_offset);
    const dt__ops_backend *be = NULL;
    st = dt__ops_begin(op, st, 1, NULL, x, NULL, &be);
    if (st != DT_OK)
        return st;
    int64_t hd = dt_tensor_shape(x)[2] / heads;
    dt__lspec ls;
    unit_spec(x, -1, heads, &ls);
    dt_tensor *rx = NULL, *y = NULL;
    st = dt__ensure_layout(x, &ls, &rx);
    if (st == DT_OK)
        st = dt__tensor_empty(dt_tensor_layout(rx), DT_DTYPE_F32, dt_tensor_shape(x), &y);
    ll_local a = {.be = be, .in = {rx}, .out = {y}, .hd = hd, .pos = pos_offset,
                  .flag = inverse};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, rope_one, &a);
    st = dt__ops_finish(be, op, NULL, st, &y, out);
    dt_tensor_destroy(rx);
    return st;
}

dt_status dt_rope(const dt_tensor *x, int64_t heads, int64_t pos_offset, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = rope_common("dt_rope", x, heads, pos_offset, 0, out ? &t : NULL);
    dt__op_record rec = {.kind = DT_OP_ROPE, .nin = 1, .in = {x}, .iattr = {heads, pos_offset}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_rope_backward(const dt_tensor *dy, int64_t heads, int64_t pos_offset,
                           dt_tensor **dx_out)
{
    return rope_common("dt_rope_backward", dy, heads, pos_offset, 1, dx_out);
}

static dt_status swiglu_run(const dt_tensor *gate, const dt_tensor *up, dt_tensor **out)
{
    static const char op[] = "dt_swiglu";
    dt_status st = check_x(op, gate, out);
    if (st == DT_OK)
        st = dt__check_like(op, "up", up, gate);
    const dt__ops_backend *be = NULL;
    st = dt__ops_begin(op, st, 1, NULL, gate, NULL, &be);
    if (st != DT_OK)
        return st;
    dt__lspec ls;
    dt__lspec_gathered(gate, -1, &ls);
    dt_tensor *rg = NULL, *ru = NULL, *y = NULL;
    st = dt__ensure_layout(gate, &ls, &rg);
    if (st == DT_OK)
        st = dt__ensure_layout(up, &ls, &ru);
    if (st == DT_OK)
        st = dt__tensor_empty(dt_tensor_layout(rg), DT_DTYPE_F32, dt_tensor_shape(gate), &y);
    ll_local a = {.be = be, .in = {rg, ru}, .out = {y}};
    if (st == DT_OK)
        st = dt__ops_each_local(be, y, swiglu_one, &a);
    st = dt__ops_finish(be, op, NULL, st, &y, out);
    dt_tensor_destroy(ru);
    dt_tensor_destroy(rg);
    return st;
}

dt_status dt_swiglu_backward(const dt_tensor *gate, const dt_tensor *up, const dt_tensor *dy,
                             dt_tensor **dgate_out, dt_tensor **dup_out)
{
    static const char op[] = "dt_swiglu_backward";
    dt_status st = check_x(op, gate, dgate_out);
    if (st == DT_OK)
        st = dt__check_like(op, "up", up, gate);
    if (st == DT_OK)
        st = dt__check_like(op, "dy", dy, gate);
    const dt__ops_backend *be = NULL;
    st = dt__ops_begin(op, st, dup_out != NULL, "dup_out", gate, NULL, &be);
    if (st != DT_OK)
        return st;
    dt__lspec ls;
    dt__lspec_gathered(gate, -1, &ls);
    dt_tensor *in[3] = {NULL, NULL, NULL}, *g[2] = {NULL, NULL};
    const dt_tensor *src[3] = {gate, up, dy};
    for (int j = 0; j < 3 && st == DT_OK; j++)
        st = dt__ensure_layout(src[j], &ls, &in[j]);
    for (int j = 0; j < 2 && st == DT_OK; j++)
        st = dt__tensor_empty(dt_tensor_layout(in[0]), DT_DTYPE_F32, dt_tensor_shape(gate),
                              &g[j]);
    ll_local a = {.be = be, .in = {in[0], in[1], in[2]}, .out = {g[0], g[1]}};
    if (st == DT_OK)
        st = dt__ops_each_local(be, in[0], swiglu_grad_one, &a);
    if (st == DT_OK && be->sync)
        st = be->sync();
    if (st == DT_OK) {
        *dgate_out = g[0];
        *dup_out = g[1];
        g[0] = g[1] = NULL;
    }
    for (int j = 0; j < 3; j++)
        dt_tensor_destroy(in[j]);
    for (int j = 0; j < 2; j++)
        dt_tensor_destroy(g[j]);
    return st;
}

/* ---- the public entries of the forward ops: recorded on a tape (runtime/record.h) ------- */

dt_status dt_rms_norm(const dt_tensor *x, const dt_tensor *gain, float eps, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = rms_norm_run(x, gain, eps, out ? &t : NULL);
    dt__op_record rec = {.kind = DT_OP_RMS_NORM, .nin = 2, .in = {x, gain}, .fattr = {eps}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_swiglu(const dt_tensor *gate, const dt_tensor *up, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = swiglu_run(gate, up, out ? &t : NULL);
    dt__op_record rec = {.kind = DT_OP_SWIGLU, .nin = 2, .in = {gate, up}};
    return dt__rec_finish(r, st, &rec, t, out);
}
