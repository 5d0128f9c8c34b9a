/* ops/rules_layout: backward rules of the ops that move or re-type a tensor (cast,
 * relayout) and of the reductions (a broadcast of the output gradient). */
#include <stdlib.h>
#include <string.h>

#include "ops/opdef_impl.h"
#include "runtime/error.h"
#include "dtensor/mesh.h"
#include "dtensor/ops.h"
#include "dtensor/relayout.h"
#include "runtime/error.h"

/* ---- cast: in {x}; iattr {dtype}: the gradient passes as it is, in f32 ------------------- */

static dt_status cast_bw(dt__ag_ctx *c)
{
    if (dt_tensor_dtype(c->dy) == DT_DTYPE_F32) {
        c->dx[0] = dt_tensor_retain(c->dy);
        return DT_OK;
    }
    return dt_cast(c->dy, DT_DTYPE_F32, &c->dx[0]);
}

static dt_status cast_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_cast(in[0], (dt_dtype)c->iattr[0], out);
}

const dt__ag_rule dt__ag_rule_cast = {"dt_cast", 0, 0, cast_bw, cast_re, 0};

/* ---- relayout: in {x}; layout ------------------------------------------------------------- */

/* x's sharding, not partial, plus those of dy's partial (sum) mesh dims that x's sharding
 * leaves free: the gradient goes back to x's layout and stays partial where it can. */
static dt_status grad_layout(const dt_layout *lx, const dt_layout *ldy, int keep_partial,
                             dt_layout **out)
{
    const dt_mesh *mesh = dt_layout_mesh(lx);
    int r = dt_layout_rank(lx);
    const char *specs[DT_MAX_RANK];
    for (int d = 0; d < r; d++)
        specs[d] = dt_layout_spec(lx, d);
    const char *pdims[DT_MAX_RANK];
    dt_reduce_op pops[DT_MAX_RANK];
    int np = 0;
    for (int i = 0; keep_partial && ldy && i < dt_layout_num_partial(ldy); i++) {
        int md = -1;
        dt_reduce_op op;
        if (dt_layout_partial(ldy, i, &md, &op) != DT_OK || op != DT_REDUCE_SUM)
            continue;
        int used = 0;
        for (int d = 0; d < r; d++)
            used |= dt_layout_spec_mesh_dim(lx, d) == md;
        if (!used && np < DT_MAX_RANK) {
            pdims[np] = dt_mesh_dim_name(mesh, md);
            pops[np++] = DT_REDUCE_SUM;
        }
    }
    return dt_layout_create_partial(mesh, r, specs, np, pdims, pops, out);
}

static dt_status relayout_bw(dt__ag_ctx *c)
{
    dt_layout *l = NULL;
    dt_status st = grad_layout(c->in0_layout, dt_tensor_layout(c->dy), 1, &l);
    if (st != DT_OK)
        return st;
    if (dt_layout_equal(l, dt_tensor_layout(c->dy)))
        c->dx[0] = dt_tensor_retain(c->dy);
    else
        st = dt_relayout(c->dy, l, &c->dx[0]);
    dt_layout_destroy(l);
    return st;
}

static dt_status relayout_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_relayout(in[0], c->layout, out);
}

const dt__ag_rule dt__ag_rule_relayout = {"dt_relayout", 0, 0, relayout_bw, relayout_re, 0};

/* ---- reduce: in {x}; iattr {op, axis}; layout ---------------------------------------------
 * Sum and mean: dx = dy broadcast along the reduced dims (times 1/count for the mean), in x's
 * sharding (not partial); max and min have no rule (DT_ERR_UNSUPPORTED when a gradient
 * reaches them). dy is first relaid out to x's sharding of the kept dims, so that each device
 * broadcasts its own block. */

static dt_status reduce_bw(dt__ag_ctx *c)
{
    static const char fn[] = "dt_tape_backward: dt_reduce";
    dt_reduce_op op = (dt_reduce_op)c->iattr[0];
    int axis = (int)c->iattr[1];
    if (op != DT_REDUCE_SUM && op != DT_REDUCE_AVG)
        return dt__error(DT_ERR_UNSUPPORTED, "%s(%s) has no backward rule (sum and avg have)", fn,
                         dt_reduce_op_name(op));
    const dt_layout *lx = c->in0_layout;
    const dt_mesh *mesh = dt_layout_mesh(lx);
    int r = dt_layout_rank(lx);
    int all = axis == DT_ALL_AXES;
    if (!all && axis < 0)
        axis += r;
    int64_t count = 1;
    for (int d = 0; d < r; d++)
        if (all || d == axis)
            count *= c->in0_shape[d];
    float scale = op == DT_REDUCE_AVG ? (float)(1.0 / (double)count) : 1.0f;
    /* dy's layout: x's specs of the kept dims. */
    const char *specs[DT_MAX_RANK];
    int k = 0;
    for (int d = 0; d < r; d++)
        if (!all && d != axis)
            specs[k++] = dt_layout_spec(lx, d);
    dt_layout *ly = NULL, *ldx = NULL;
    dt_tensor *dy = NULL, *dx = NULL;
    float *hy = NULL, *hx = NULL;
    dt_status st = dt_layout_create(mesh, k, specs, &ly);
    if (st == DT_OK)
        st = dt_layout_equal(ly, dt_tensor_layout(c->dy)) && dt_tensor_dtype(c->dy) == DT_DTYPE_F32
                 ? (dy = dt_tensor_retain(c->dy), DT_OK)
                 : DT_OK;
    if (st == DT_OK && !dy) {
        dt_tensor *tmp = NULL;
        st = dt_tensor_dtype(c->dy) == DT_DTYPE_F32 ? DT_OK : dt_cast(c->dy, DT_DTYPE_F32, &tmp);
        if (st == DT_OK)
            st = dt_relayout(tmp ? tmp : c->dy, ly, &dy);
        dt_tensor_destroy(tmp);
    }
    if (st == DT_OK)
        st = grad_layout(lx, NULL, 0, &ldx);
    if (st == DT_OK)
        st = dt_tensor_zeros(ldx, DT_DTYPE_F32, c->in0_shape, &dx);
    int nl = st == DT_OK ? dt_tensor_num_local(dx) : 0;
    for (int i = 0; i < nl && st == DT_OK; i++) {
        const DLTensor *tx = dt_tensor_local(dx, i);
        int64_t outer = 1, len = 1, inner = 1, ny = 1;
        for (int d = 0; d < r; d++) {
            int64_t n = tx->shape[d];
            if (all)
                len *= n;
            else if (d < axis)
                outer *= n;
            else if (d == axis)
                len = n;
            else
                inner *= n;
        }
        ny = outer * inner;
        int64_t nx = outer * len * inner;
        hy = malloc((size_t)(ny > 0 ? ny : 1) * sizeof *hy);
        hx = malloc((size_t)(nx > 0 ? nx : 1) * sizeof *hx);
        if (!hy || !hx) {
            st = dt__error(DT_ERR_NO_MEMORY, "%s: out of memory", fn);
            break;
        }
        st = dt_tensor_local_read(dy, i, hy, (size_t)ny * sizeof *hy);
        for (int64_t o = 0; st == DT_OK && o < outer; o++)
            for (int64_t l = 0; l < len; l++)
                for (int64_t j = 0; j < inner; j++)
                    hx[(o * len + l) * inner + j] = hy[o * inner + j] * scale;
        if (st == DT_OK)
            st = dt_tensor_local_write(dx, i, hx, (size_t)nx * sizeof *hx);
        free(hy);
        free(hx);
        hy = hx = NULL;
    }
    free(hy);
    free(hx);
    dt_tensor_destroy(dy);
    dt_layout_destroy(ly);
    dt_layout_destroy(ldx);
    if (st != DT_OK) {
        dt_tensor_destroy(dx);
        return st;
    }
    c->dx[0] = dx;
    return DT_OK;
}

static dt_status reduce_re(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_reduce(in[0], (dt_reduce_op)c->iattr[0], (int)c->iattr[1], c->layout, out);
}

const dt__ag_rule dt__ag_rule_reduce = {"dt_reduce", 0, 0, reduce_bw, reduce_re, 0};
