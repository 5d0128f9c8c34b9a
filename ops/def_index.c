/* ops/def_index: the definitions of the index ops (gather, scatter_add, index_select,
 * index_add, one_hot: rules, shape inference, backward, validator samples and index values)
 * and their public wrappers (ops_general.h). Attribute slots: ops/shape_impl.h. */
#include <string.h>

#include "mesh/mesh_group.h"
#include "ops/shape_impl.h"
#include "runtime/error.h"

static int rand_in(uint64_t *s, int lo, int hi) /* lo..hi */
{
    return lo + (int)(dt__shape_rng(s) % (uint64_t)(hi - lo + 1));
}

static void rand_shape(uint64_t *s, int max_dim, int rank, dt_dtype dtype, dt_op_shape *x)
{
    x->dtype = dtype;
    x->rank = rank;
    for (int d = 0; d < rank; d++)
        x->dim[d] = rand_in(s, 1, max_dim);
}

static void fill_index(dt_dtype dtype, void *host, int64_t n, int64_t hi, uint64_t seed)
{
    uint64_t s = seed;
    for (int64_t k = 0; k < n; k++) {
        int64_t v = hi > 0 ? (int64_t)(dt__shape_rng(&s) % (uint64_t)hi) : 0;
        if (dtype == DT_DTYPE_I64)
            ((int64_t *)host)[k] = v;
        else
            ((int32_t *)host)[k] = (int32_t)v;
    }
}

static dt_status check_axis(const char *op, const dt_op_sig *sig, int *axis)
{
    const dt_op_shape *x = &sig->in[0];
    *axis = dt__op_axis((int)sig->attrs->i[0], x->rank);
    if (*axis >= 0)
        return DT_OK;
    char s[128];
    return dt__error(DT_ERR_INVALID_ARGUMENT,
                     "%s: axis %lld out of range for a tensor of "
                     "shape %s",
                     op, (long long)sig->attrs->i[0], dt__shape_str(x->rank, x->dim, s, sizeof s));
}

static dt_status check_index_dtype(const char *op, const dt_op_shape *idx)
{
    if (dt__is_index_dtype(idx->dtype))
        return DT_OK;
    return dt__error(DT_ERR_SHAPE, "%s: index of dtype %s (i32 or i64 wanted)", op,
                     dt_dtype_name(idx->dtype));
}

static dt_status misfit(const char *op, const char *what, const dt_op_shape *a, const char *other,
                        const dt_op_shape *b)
{
    char s1[128], s2[128];
    return dt__error(DT_ERR_SHAPE, "%s: %s %s does not fit %s %s", op, what,
                     dt__shape_str(a->rank, a->dim, s1, sizeof s1), other,
                     dt__shape_str(b->rank, b->dim, s2, sizeof s2));
}

static void arrow(dt__rule_text *r)
{
    dt__rule_putc(r, '-');
    dt__rule_putc(r, '>');
}

/* ---- gather ----------------------------------------------------------------------------- */

static dt_status gather_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0], *idx = &sig->in[1];
    int axis;
    dt_status st = check_axis("gather", sig, &axis);
    if (st == DT_OK)
        st = check_index_dtype("gather", idx);
    if (st != DT_OK)
        return st;
    int fits = idx->rank == x->rank;
    for (int d = 0; fits && d < x->rank; d++)
        fits = d == axis || idx->dim[d] <= x->dim[d];
    if (!fits)
        return misfit("gather", "index", idx, "x", x);
    *out = *idx;
    out->dtype = x->dtype;
    return DT_OK;
}

/* x's axis is whole; the index (and the output, of its shape) shares x's factor on every
 * other dim of the same size; a smaller index dim has its own factor (x's whole there). */
static dt_status gather_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = gather_shape(sig, &o);
    if (st != DT_OK)
        return st;
    const dt_op_shape *x = &sig->in[0], *idx = &sig->in[1];
    int axis = dt__op_axis((int)sig->attrs->i[0], x->rank);
    dt__rule_text r = {buf, len, 0};
    for (int d = 0; d < x->rank; d++)
        dt__rule_putc(&r,
                      d != axis && idx->dim[d] == x->dim[d] ? dt__op_letter(d) : (char)('A' + d));
    dt__rule_putc(&r, ',');
    dt__rule_plain(&r, x->rank, -1, 0, 0);
    arrow(&r);
    dt__rule_plain(&r, x->rank, -1, 0, 0);
    return dt__rule_done(&r, "gather");
}

static dt_status gather_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    int axis = dt__op_axis((int)g->attrs->i[0], dt_tensor_rank(g->in[0]));
    dt_tensor *z = NULL, *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK)
        st = dt__zeros_for(g->in[0], axis, &z);
    if (st == DT_OK)
        st = dt_scatter_add(z, axis, g->in[1], dy, &g->dx[0]);
    dt_tensor_destroy(z);
    dt_tensor_destroy(dy);
    return st;
}

static dt_status gather_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = 2;
    rand_shape(&s, max_dim, rand_in(&s, 1, 3), DT_DTYPE_F64, &sig->in[0]);
    sig->in[1] = sig->in[0];
    sig->in[1].dtype = rand_in(&s, 0, 1) ? DT_DTYPE_I64 : DT_DTYPE_I32;
    int axis = rand_in(&s, 0, sig->in[0].rank - 1);
    attrs->i[0] = axis;
    for (int d = 0; d < sig->in[0].rank; d++)
        sig->in[1].dim[d] =
            d == axis ? rand_in(&s, 1, max_dim) : rand_in(&s, 1, (int)sig->in[0].dim[d]);
    return DT_OK;
}

/* The index input of gather and scatter_add (input 1): values along x's axis. */
static dt_status index_fill(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    if (i != 1)
        return DT_OK;
    int axis = dt__op_axis((int)sig->attrs->i[0], sig->in[0].rank);
    fill_index(sig->in[1].dtype, host, n, sig->in[0].dim[axis], seed);
    return DT_OK;
}

const dt_op_def dt__def_gather = {.name = "gather",
                                  .nin = 2,
                                  .rule_fn = gather_rule,
                                  .infer = gather_shape,
                                  .cpu = dt__k_gather,
                                  .backward = gather_backward,
                                  .linearity = DT_OP_LINEAR_MULTI,
                                  .linear_in = 1,
                                  .doc = "torch.gather: x's elements at index along one axis",
                                  .family = "index",
                                  .sample = gather_sample,
                                  .fill = index_fill};

/* ---- scatter_add ------------------------------------------------------------------------ */

static dt_status scatter_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0], *idx = &sig->in[1], *src = &sig->in[2];
    int axis;
    dt_status st = check_axis("scatter_add", sig, &axis);
    if (st == DT_OK)
        st = check_index_dtype("scatter_add", idx);
    if (st != DT_OK)
        return st;
    if (!dt__is_addable_dtype(x->dtype) || src->dtype != x->dtype)
        return dt__error(DT_ERR_SHAPE,
                         "scatter_add: x of %s and src of %s (both f32, f64, "
                         "i32 or i64, alike)",
                         dt_dtype_name(x->dtype), dt_dtype_name(src->dtype));
    int fits = idx->rank == x->rank;
    for (int d = 0; fits && d < x->rank; d++)
        fits = d == axis || idx->dim[d] <= x->dim[d];
    if (!fits)
        return misfit("scatter_add", "index", idx, "x", x);
    int same = src->rank == idx->rank;
    for (int d = 0; same && d < idx->rank; d++)
        same = src->dim[d] == idx->dim[d];
    if (!same)
        return misfit("scatter_add", "src", src, "index (src must have its shape)", idx);
    *out = *x;
    return DT_OK;
}

/* x and the output: the axis whole, other dims lowercase; the index and src share x's
 * factor where their size is x's, else (and on the axis) whole factors of their own, so each
 * device adds every index element that lands in its block, once. */
static dt_status scatter_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = scatter_shape(sig, &o);
    if (st != DT_OK)
        return st;
    const dt_op_shape *x = &sig->in[0], *idx = &sig->in[1];
    int rank = x->rank, axis = dt__op_axis((int)sig->attrs->i[0], rank);
    char xd[DT_MAX_RANK], id[DT_MAX_RANK];
    for (int d = 0; d < rank; d++) {
        xd[d] = d == axis ? (char)('A' + d) : dt__op_letter(d);
        id[d] = d != axis && idx->dim[d] == x->dim[d] ? dt__op_letter(d)
                                                      : (char)('A' + DT_MAX_RANK + d);
    }
    dt__rule_text r = {buf, len, 0};
    for (int k = 0; k < 4; k++) {
        const char *l = k == 0 || k == 3 ? xd : id;
        for (int d = 0; d < rank; d++)
            dt__rule_putc(&r, l[d]);
        if (k < 2)
            dt__rule_putc(&r, ',');
        else if (k == 2)
            arrow(&r);
    }
    return dt__rule_done(&r, "scatter_add");
}

static dt_status scatter_backward(const dt_op_grad *g)
{
    dt_tensor *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK && g->needs[2])
        st = dt_gather(dy, (int)g->attrs->i[0], g->in[1], &g->dx[2]);
    if (st == DT_OK && g->needs[0])
        g->dx[0] = dy; /* the gradient passes through x unchanged */
    else
        dt_tensor_destroy(dy);
    return st;
}

static dt_status scatter_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    dt_status st = gather_sample(seed, max_dim, sig, attrs);
    sig->nin = 3;
    sig->in[2] = sig->in[1];
    sig->in[2].dtype = sig->in[0].dtype;
    return st;
}

const dt_op_def dt__def_scatter_add = {
    .name = "scatter_add",
    .nin = 3,
    .rule_fn = scatter_rule,
    .infer = scatter_shape,
    .cpu = dt__k_scatter_add,
    .backward = scatter_backward,
    .linearity = DT_OP_LINEAR_ADDITIVE,
    .linear_in = 1u | 4u,
    .doc = "x with src added at index along one axis (src of the index's shape)",
    .family = "index",
    .sample = scatter_sample,
    .fill = index_fill};

/* ---- index_select ----------------------------------------------------------------------- */

static dt_status select_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0], *idx = &sig->in[1];
    int axis;
    dt_status st = check_axis("index_select", sig, &axis);
    if (st == DT_OK)
        st = check_index_dtype("index_select", idx);
    if (st != DT_OK)
        return st;
    if (idx->rank != 1)
        return misfit("index_select", "index", idx, "a 1-D index for x", x);
    *out = *x;
    out->dim[axis] = idx->dim[0];
    return DT_OK;
}

/* x's axis whole; the index's factor is new and becomes the output's axis. */
static dt_status select_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = select_shape(sig, &o);
    if (st != DT_OK)
        return st;
    int rank = o.rank, axis = dt__op_axis((int)sig->attrs->i[0], rank);
    dt__rule_text r = {buf, len, 0};
    dt__rule_plain(&r, rank, axis, 'A', ',');
    dt__rule_putc(&r, dt__op_letter(axis));
    arrow(&r);
    dt__rule_plain(&r, rank, -1, 0, 0);
    return dt__rule_done(&r, "index_select");
}

static dt_status select_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    int axis = dt__op_axis((int)g->attrs->i[0], dt_tensor_rank(g->in[0]));
    dt_tensor *z = NULL, *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK)
        st = dt__zeros_for(g->in[0], axis, &z);
    if (st == DT_OK)
        st = dt_index_add(z, axis, g->in[1], dy, &g->dx[0]);
    dt_tensor_destroy(z);
    dt_tensor_destroy(dy);
    return st;
}

static dt_status select_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = 2;
    rand_shape(&s, max_dim, rand_in(&s, 1, 3), DT_DTYPE_F64, &sig->in[0]);
    rand_shape(&s, max_dim, 1, rand_in(&s, 0, 1) ? DT_DTYPE_I64 : DT_DTYPE_I32, &sig->in[1]);
    attrs->i[0] = rand_in(&s, 0, sig->in[0].rank - 1);
    return DT_OK;
}

const dt_op_def dt__def_index_select = {.name = "index_select",
                                        .nin = 2,
                                        .rule_fn = select_rule,
                                        .infer = select_shape,
                                        .cpu = dt__k_index_select,
                                        .backward = select_backward,
                                        .linearity = DT_OP_LINEAR_MULTI,
                                        .linear_in = 1,
                                        .doc = "x's slices along one axis at a 1-D index",
                                        .family = "index",
                                        .sample = select_sample,
                                        .fill = index_fill};

/* ---- index_add -------------------------------------------------------------------------- */

static dt_status iadd_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0], *idx = &sig->in[1], *src = &sig->in[2];
    int axis;
    dt_status st = check_axis("index_add", sig, &axis);
    if (st == DT_OK)
        st = check_index_dtype("index_add", idx);
    if (st != DT_OK)
        return st;
    if (!dt__is_addable_dtype(x->dtype) || src->dtype != x->dtype)
        return dt__error(DT_ERR_SHAPE,
                         "index_add: x of %s and src of %s (both f32, f64, "
                         "i32 or i64, alike)",
                         dt_dtype_name(x->dtype), dt_dtype_name(src->dtype));
    if (idx->rank != 1)
        return misfit("index_add", "index", idx, "a 1-D index for x", x);
    int same = src->rank == x->rank;
    for (int d = 0; same && d < x->rank; d++)
        same = src->dim[d] == (d == axis ? idx->dim[0] : x->dim[d]);
    if (!same)
        return misfit("index_add", "src", src, "x (with the index's length on the axis)", x);
    *out = *x;
    return DT_OK;
}

static dt_status iadd_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = iadd_shape(sig, &o);
    if (st != DT_OK)
        return st;
    int rank = o.rank, axis = dt__op_axis((int)sig->attrs->i[0], rank);
    dt__rule_text r = {buf, len, 0};
    dt__rule_plain(&r, rank, axis, 'A', ',');
    dt__rule_putc(&r, 'B');
    dt__rule_putc(&r, ',');
    dt__rule_plain(&r, rank, axis, 'B', 0);
    arrow(&r);
    dt__rule_plain(&r, rank, axis, 'A', 0);
    return dt__rule_done(&r, "index_add");
}

static dt_status iadd_backward(const dt_op_grad *g)
{
    dt_tensor *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK && g->needs[2])
        st = dt_index_select(dy, (int)g->attrs->i[0], g->in[1], &g->dx[2]);
    if (st == DT_OK && g->needs[0])
        g->dx[0] = dy; /* the gradient passes through x unchanged */
    else
        dt_tensor_destroy(dy);
    return st;
}

static dt_status iadd_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    dt_status st = select_sample(seed, max_dim, sig, attrs);
    int axis = (int)attrs->i[0];
    sig->nin = 3;
    sig->in[2] = sig->in[0];
    sig->in[2].dim[axis] = sig->in[1].dim[0];
    return st;
}

const dt_op_def dt__def_index_add = {.name = "index_add",
                                     .nin = 3,
                                     .rule_fn = iadd_rule,
                                     .infer = iadd_shape,
                                     .cpu = dt__k_index_add,
                                     .backward = iadd_backward,
                                     .linearity = DT_OP_LINEAR_ADDITIVE,
                                     .linear_in = 1u | 4u,
                                     .doc =
                                         "x with src's slices added at a 1-D index along one axis",
                                     .family = "index",
                                     .sample = iadd_sample,
                                     .fill = index_fill};

/* ---- one_hot ---------------------------------------------------------------------------- */

static dt_status onehot_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *idx = &sig->in[0];
    int64_t classes = sig->attrs->i[0];
    dt_dtype dtype = (dt_dtype)sig->attrs->i[1];
    dt_status st = check_index_dtype("one_hot", idx);
    if (st != DT_OK)
        return st;
    if (classes < 1 || idx->rank >= DT_MAX_RANK)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "one_hot: %lld classes for an index of "
                         "rank %d",
                         (long long)classes, idx->rank);
    if (dtype != DT_DTYPE_F32 && dtype != DT_DTYPE_F64)
        return dt__error(DT_ERR_SHAPE, "one_hot: output dtype %s (f32 or f64 wanted)",
                         dt_dtype_name(dtype));
    *out = *idx;
    out->dtype = dtype;
    out->dim[out->rank++] = classes;
    return DT_OK;
}

static dt_status onehot_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = onehot_shape(sig, &o);
    if (st != DT_OK)
        return st;
    dt__rule_text r = {buf, len, 0};
    dt__rule_plain(&r, sig->in[0].rank, -1, 0, 0);
    arrow(&r);
    dt__rule_plain(&r, o.rank, -1, 0, 0);
    return dt__rule_done(&r, "one_hot");
}

static dt_status onehot_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = 1;
    rand_shape(&s, max_dim, rand_in(&s, 1, 2), rand_in(&s, 0, 1) ? DT_DTYPE_I64 : DT_DTYPE_I32,
               &sig->in[0]);
    attrs->i[0] = rand_in(&s, 1, max_dim);
    attrs->i[1] = DT_DTYPE_F64;
    return DT_OK;
}

static dt_status onehot_fill(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    fill_index(sig->in[i].dtype, host, n, sig->attrs->i[0], seed);
    return DT_OK;
}

const dt_op_def dt__def_one_hot = {.name = "one_hot",
                                   .nin = 1,
                                   .rule_fn = onehot_rule,
                                   .infer = onehot_shape,
                                   .cpu = dt__k_one_hot,
                                   .doc = "[index..., classes] with 1 at each index, 0 elsewhere",
                                   .family = "index",
                                   .sample = onehot_sample,
                                   .fill = onehot_fill};

/* ---- public wrappers -------------------------------------------------------------------- */

static dt_status null_arg(const char *fn)
{
    return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
}

/* Runs def and returns one outcome on every client: the core leaves a kernel's failure (an
 * index out of range, seen only by the client whose block holds it) on the clients that saw
 * it, and ops_general.h promises it on every client. */
static dt_status run_agreed(const dt_op_def *def, const char *fn, const dt_tensor *const *in,
                            int nin, const dt_op_attrs *a, dt_tensor **out)
{
    dt_tensor *t = NULL;
    dt_status st = dt__op_run(def, in, nin, a, NULL, &t);
    st = dt__mesh_agree(dt_layout_mesh(dt_tensor_layout(in[0])), st, fn);
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

static dt_status run_axis(const dt_op_def *def, const char *fn, const dt_tensor *x, int axis,
                          const dt_tensor *index, const dt_tensor *src, dt_tensor **out)
{
    if (!x || !index || (def->nin == 3 && !src) || !out)
        return null_arg(fn);
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.i[0] = axis;
    const dt_tensor *in[3] = {x, index, src};
    return run_agreed(def, fn, in, def->nin, &a, out);
}

dt_status dt_gather(const dt_tensor *x, int axis, const dt_tensor *index, dt_tensor **out)
{
    return run_axis(&dt__def_gather, "dt_gather", x, axis, index, NULL, out);
}

dt_status dt_scatter_add(const dt_tensor *x, int axis, const dt_tensor *index, const dt_tensor *src,
                         dt_tensor **out)
{
    return run_axis(&dt__def_scatter_add, "dt_scatter_add", x, axis, index, src, out);
}

dt_status dt_index_select(const dt_tensor *x, int axis, const dt_tensor *index, dt_tensor **out)
{
    return run_axis(&dt__def_index_select, "dt_index_select", x, axis, index, NULL, out);
}

dt_status dt_index_add(const dt_tensor *x, int axis, const dt_tensor *index, const dt_tensor *src,
                       dt_tensor **out)
{
    return run_axis(&dt__def_index_add, "dt_index_add", x, axis, index, src, out);
}

dt_status dt_one_hot(const dt_tensor *index, int64_t classes, dt_dtype dtype, dt_tensor **out)
{
    if (!index || !out)
        return null_arg("dt_one_hot");
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.i[0] = classes;
    a.i[1] = dtype;
    const dt_tensor *in[1] = {index};
    return run_agreed(&dt__def_one_hot, "dt_one_hot", in, 1, &a, out);
}
