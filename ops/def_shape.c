/* ops/def_shape: the definitions of the shape ops (reshape, permute, slice, slice_backward,
 * concat, expand, squeeze, unsqueeze: rules, shape inference, backward, validator samples),
 * the family's table, and the public wrappers (dt_reshape ... dt_unsqueeze, ops_general.h).
 * Attribute slots: ops/shape_impl.h. */
#include <stdlib.h>
#include <string.h>

#include "ops/shape_impl.h"
#include "runtime/error.h"

const dt_op_def *const dt__defs_shape[] = {
    &dt__def_reshape,         &dt__def_permute,     &dt__def_slice,
    &dt__def_slice_backward,  &dt__def_concat,      &dt__def_expand,
    &dt__def_expand_backward, &dt__def_squeeze,     &dt__def_unsqueeze,
    &dt__def_gather,          &dt__def_scatter_add, &dt__def_index_select,
    &dt__def_index_add,       &dt__def_one_hot,     NULL};

static dt_status bad_axis(const char *op, int64_t axis, const dt_op_shape *x)
{
    char s[128];
    return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: axis %lld out of range for a tensor of shape %s",
                     op, (long long)axis, dt__shape_str(x->rank, x->dim, s, sizeof s));
}

static int64_t shape_numel(int rank, const int64_t *dim)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= dim[d];
    return n;
}

static int rand_in(uint64_t *s, int lo, int hi) /* lo..hi */
{
    return lo + (int)(dt__shape_rng(s) % (uint64_t)(hi - lo + 1));
}

static void rand_shape(uint64_t *s, int max_dim, int rank, dt_op_shape *x)
{
    x->dtype = DT_DTYPE_F64;
    x->rank = rank;
    for (int d = 0; d < rank; d++)
        x->dim[d] = rand_in(s, 1, max_dim);
}

/* ---- reshape ---------------------------------------------------------------------------- */

static dt_status reshape_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0];
    const int64_t *a = sig->attrs->i;
    char s1[128], s2[128];
    if (a[0] < 0 || a[0] > DT_MAX_RANK)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "reshape: rank %lld outside 0..%d",
                         (long long)a[0], DT_MAX_RANK);
    int rank = (int)a[0], infer = -1;
    int64_t known = 1, n = shape_numel(x->rank, x->dim);
    for (int d = 0; d < rank; d++) {
        if (a[1 + d] == -1 && infer < 0)
            infer = d;
        else if (a[1 + d] < 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "reshape: bad shape %s (one -1 at most, "
                             "others >= 0)",
                             dt__shape_str(rank, a + 1, s2, sizeof s2));
        else
            known *= a[1 + d];
    }
    out->dtype = x->dtype;
    out->rank = rank;
    for (int d = 0; d < rank; d++)
        out->dim[d] = a[1 + d];
    if (infer >= 0) {
        if (known == 0 || n % known)
            return dt__error(DT_ERR_SHAPE, "reshape: cannot reshape %s into %s",
                             dt__shape_str(x->rank, x->dim, s1, sizeof s1),
                             dt__shape_str(rank, a + 1, s2, sizeof s2));
        out->dim[infer] = n / known;
        known = n;
    }
    if (known != n)
        return dt__error(DT_ERR_SHAPE, "reshape: cannot reshape %s (%lld elements) into %s",
                         dt__shape_str(x->rank, x->dim, s1, sizeof s1), (long long)n,
                         dt__shape_str(rank, a + 1, s2, sizeof s2));
    return DT_OK;
}

static void add_letter(char *dim, char c)
{
    size_t n = strlen(dim);
    if (n + 1 < DT__RULE_DIM) {
        dim[n] = c;
        dim[n + 1] = '\0';
    }
}

/* The factors of a reshape: size-1 dims get factors of their own (uppercase: never sharded);
 * the other dims group into the minimal runs of equal products, and each run into the common
 * refinement of its input and output sizes ([6, 4] -> [2, 3, 4]: "(ab)c->abc"); a run without
 * one ([2, 3] -> [3, 2]) gets whole factors of its own on each side ("AB->CD"). */
static dt_status reshape_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = reshape_shape(sig, &o);
    if (st != DT_OK)
        return st;
    const dt_op_shape *x = &sig->in[0];
    char din[DT_MAX_RANK][DT__RULE_DIM] = {{0}}, dout[DT_MAX_RANK][DT__RULE_DIM] = {{0}};
    int ia[DT_MAX_RANK], ib[DT_MAX_RANK], na = 0, nb = 0;
    char lower = 'a', upper = 'A';
    int zero = shape_numel(x->rank, x->dim) == 0;
    for (int d = 0; d < x->rank; d++) {
        if (x->dim[d] == 1 || zero)
            add_letter(din[d], upper++);
        else
            ia[na++] = d;
    }
    for (int d = 0; d < o.rank; d++) {
        if (o.dim[d] == 1 || zero)
            add_letter(dout[d], upper++);
        else
            ib[nb++] = d;
    }
    int i = 0, j = 0;
    while (i < na && j < nb) {
        int gi = i, gj = j;
        int64_t pi = x->dim[ia[i]], pj = o.dim[ib[j]];
        while (pi != pj) {
            if (pi < pj)
                pi *= x->dim[ia[++i]];
            else
                pj *= o.dim[ib[++j]];
        }
        /* The run is ia[gi..i] -> ib[gj..j]; refine it. */
        int ii = gi, jj = gj, ok = 1;
        int64_t ri = x->dim[ia[ii]], rj = o.dim[ib[jj]];
        while (ii <= i && jj <= j) {
            char f = lower++;
            add_letter(din[ia[ii]], f);
            add_letter(dout[ib[jj]], f);
            if (ri == rj) {
                if (++ii <= i)
                    ri = x->dim[ia[ii]];
                if (++jj <= j)
                    rj = o.dim[ib[jj]];
            } else if (ri % rj == 0) {
                ri /= rj;
                if (++jj <= j)
                    rj = o.dim[ib[jj]];
            } else if (rj % ri == 0) {
                rj /= ri;
                if (++ii <= i)
                    ri = x->dim[ia[ii]];
            } else {
                ok = 0;
                break;
            }
        }
        if (!ok) {
            for (int k = gi; k <= i; k++) {
                din[ia[k]][0] = '\0';
                add_letter(din[ia[k]], upper++);
            }
            for (int k = gj; k <= j; k++) {
                dout[ib[k]][0] = '\0';
                add_letter(dout[ib[k]], upper++);
            }
        }
        i++;
        j++;
    }
    dt__rule_text r = {buf, len, 0};
    dt__rule_operand(&r, x->rank, din, 0);
    dt__rule_putc(&r, '-');
    dt__rule_putc(&r, '>');
    dt__rule_operand(&r, o.rank, dout, 0);
    return dt__rule_done(&r, "reshape");
}

static dt_status reshape_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    const dt_tensor *x = g->in[0];
    dt_tensor *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK)
        st = dt_reshape(dy, dt_tensor_rank(x), dt_tensor_shape(x), &g->dx[0]);
    dt_tensor_destroy(dy);
    return st;
}

static dt_status reshape_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = 1;
    rand_shape(&s, max_dim, rand_in(&s, 1, 3), &sig->in[0]);
    const dt_op_shape *x = &sig->in[0];
    int mode = rand_in(&s, 0, 3);
    if (mode == 0) { /* flatten */
        attrs->i[0] = 1;
        attrs->i[1] = -1;
    } else if (mode == 1 || x->rank == 1) { /* split the first dim as [1, d0, ...] or [d0, -1] */
        attrs->i[0] = 2;
        attrs->i[1] = x->dim[0];
        attrs->i[2] = -1;
    } else if (mode == 2) { /* merge the first two */
        attrs->i[0] = x->rank - 1;
        attrs->i[1] = x->dim[0] * x->dim[1];
        for (int d = 2; d < x->rank; d++)
            attrs->i[d] = x->dim[d];
    } else { /* [.., a*b] -> [.., a, b] where the last dim factors, else unsqueeze-like */
        attrs->i[0] = x->rank + 1;
        for (int d = 0; d < x->rank; d++)
            attrs->i[1 + d] = x->dim[d];
        int64_t last = x->dim[x->rank - 1], f = last % 2 == 0 ? 2 : 1;
        attrs->i[x->rank] = f;
        attrs->i[x->rank + 1] = last / f;
    }
    return DT_OK;
}

const dt_op_def dt__def_reshape = {.name = "reshape",
                                   .nin = 1,
                                   .rule_fn = reshape_rule,
                                   .infer = reshape_shape,
                                   .cpu = dt__k_reshape,
                                   .backward = reshape_backward,
                                   .linearity = DT_OP_LINEAR_MULTI,
                                   .linear_in = 1,
                                   .doc = "the same elements in another shape (one -1 inferred)",
                                   .family = "shape",
                                   .sample = reshape_sample};

/* ---- permute ---------------------------------------------------------------------------- */

static dt_status permute_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0];
    int seen[DT_MAX_RANK] = {0};
    char s[128], t[128];
    for (int d = 0; d < x->rank; d++) {
        int p = dt__op_axis((int)sig->attrs->i[d], x->rank);
        if (p < 0 || seen[p]++)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "permute: %s is not a permutation of "
                             "the %d dims of %s",
                             dt__shape_str(x->rank, sig->attrs->i, s, sizeof s), x->rank,
                             dt__shape_str(x->rank, x->dim, t, sizeof t));
        out->dim[d] = x->dim[p];
    }
    out->dtype = x->dtype;
    out->rank = x->rank;
    return DT_OK;
}

static dt_status permute_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = permute_shape(sig, &o);
    if (st != DT_OK)
        return st;
    int rank = sig->in[0].rank;
    dt__rule_text r = {buf, len, 0};
    dt__rule_plain(&r, rank, -1, 0, 0);
    dt__rule_putc(&r, '-');
    dt__rule_putc(&r, '>');
    for (int d = 0; d < rank; d++)
        dt__rule_putc(&r, dt__op_letter(dt__op_axis((int)sig->attrs->i[d], rank)));
    return dt__rule_done(&r, "permute");
}

static dt_status permute_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    int rank = dt_tensor_rank(g->in[0]), inv[DT_MAX_RANK];
    for (int d = 0; d < rank; d++)
        inv[dt__op_axis((int)g->attrs->i[d], rank)] = d;
    dt_tensor *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK)
        st = dt_permute(dy, inv, &g->dx[0]);
    dt_tensor_destroy(dy);
    return st;
}

static dt_status permute_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = 1;
    rand_shape(&s, max_dim, rand_in(&s, 1, 4), &sig->in[0]);
    int rank = sig->in[0].rank;
    for (int d = 0; d < rank; d++)
        attrs->i[d] = d;
    for (int d = rank - 1; d > 0; d--) {
        int k = rand_in(&s, 0, d);
        int64_t t = attrs->i[d];
        attrs->i[d] = attrs->i[k];
        attrs->i[k] = t;
    }
    return DT_OK;
}

const dt_op_def dt__def_permute = {.name = "permute",
                                   .nin = 1,
                                   .rule_fn = permute_rule,
                                   .infer = permute_shape,
                                   .cpu = dt__k_permute,
                                   .backward = permute_backward,
                                   .linearity = DT_OP_LINEAR_MULTI,
                                   .linear_in = 1,
                                   .doc = "the dims reordered (output dim d is input dim perm[d])",
                                   .family = "shape",
                                   .sample = permute_sample};

/* ---- slice and its backward ------------------------------------------------------------- */

static dt_status slice_check(const char *op, const dt_op_shape *x, const int64_t *a, int *axis)
{
    *axis = dt__op_axis((int)a[0], x->rank);
    if (*axis < 0)
        return bad_axis(op, a[0], x);
    if (a[3] < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: step %lld (must be >= 1)", op,
                         (long long)a[3]);
    return DT_OK;
}

static dt_status slice_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0];
    const int64_t *a = sig->attrs->i;
    int axis;
    dt_status st = slice_check("slice", x, a, &axis);
    if (st != DT_OK)
        return st;
    int64_t first, count;
    dt__slice_range(x->dim[axis], a[1], a[2], a[3], &first, &count);
    *out = *x;
    out->dim[axis] = count;
    return DT_OK;
}

/* The sliced axis is whole on both sides (a factor of its own on each: sizes differ); the
 * others are shared, so slicing a sharded dim other than the axis needs no communication. */
static dt_status slice_rule_common(const dt_op_sig *sig, char *buf, size_t len, const char *op,
                                   int axis)
{
    int rank = sig->in[0].rank;
    dt__rule_text r = {buf, len, 0};
    dt__rule_plain(&r, rank, axis, 'A', 0);
    dt__rule_putc(&r, '-');
    dt__rule_putc(&r, '>');
    dt__rule_plain(&r, rank, axis, 'B', 0);
    return dt__rule_done(&r, op);
}

static dt_status slice_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    int axis;
    dt_status st = slice_check("slice", &sig->in[0], sig->attrs->i, &axis);
    return st != DT_OK ? st : slice_rule_common(sig, buf, len, "slice", axis);
}

static dt_status slice_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    dt_op_attrs a = *g->attrs;
    int rank = dt_tensor_rank(g->in[0]);
    a.i[4] = dt_tensor_shape(g->in[0])[dt__op_axis((int)a.i[0], rank)];
    dt_tensor *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK)
        st = dt__op_run1(&dt__def_slice_backward, dy, &a, &g->dx[0]);
    dt_tensor_destroy(dy);
    return st;
}

static dt_status slice_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = 1;
    rand_shape(&s, max_dim, rand_in(&s, 1, 3), &sig->in[0]);
    int axis = rand_in(&s, 0, sig->in[0].rank - 1);
    int64_t n = sig->in[0].dim[axis];
    attrs->i[0] = rand_in(&s, 0, 1) ? axis : axis - sig->in[0].rank;
    attrs->i[1] = rand_in(&s, -(int)n, (int)n - 1);
    attrs->i[2] = rand_in(&s, 0, 1) ? INT64_MAX : rand_in(&s, -(int)n, (int)n);
    attrs->i[3] = rand_in(&s, 1, 3);
    int64_t first, count;
    dt__slice_range(n, attrs->i[1], attrs->i[2], attrs->i[3], &first, &count);
    return count > 0 ? DT_OK : DT_ERR_UNSUPPORTED;
}

const dt_op_def dt__def_slice = {.name = "slice",
                                 .nin = 1,
                                 .rule_fn = slice_rule,
                                 .infer = slice_shape,
                                 .cpu = dt__k_slice,
                                 .backward = slice_backward,
                                 .linearity = DT_OP_LINEAR_MULTI,
                                 .linear_in = 1,
                                 .doc =
                                     "start:stop:step of one axis (Python's clamping, step >= 1)",
                                 .family = "shape",
                                 .sample = slice_sample};

static dt_status slice_bw_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *dy = &sig->in[0];
    const int64_t *a = sig->attrs->i;
    int axis;
    dt_status st = slice_check("slice_backward", dy, a, &axis);
    if (st != DT_OK)
        return st;
    if (a[4] < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "slice_backward: input size %lld",
                         (long long)a[4]);
    int64_t first, count;
    dt__slice_range(a[4], a[1], a[2], a[3], &first, &count);
    if (count != dy->dim[axis]) {
        char s[128];
        return dt__error(DT_ERR_SHAPE,
                         "slice_backward: gradient %s has %lld along axis %d, "
                         "the slice has %lld",
                         dt__shape_str(dy->rank, dy->dim, s, sizeof s), (long long)dy->dim[axis],
                         axis, (long long)count);
    }
    *out = *dy;
    out->dim[axis] = a[4];
    return DT_OK;
}

static dt_status slice_bw_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    int axis;
    dt_status st = slice_check("slice_backward", &sig->in[0], sig->attrs->i, &axis);
    return st != DT_OK ? st : slice_rule_common(sig, buf, len, "slice_backward", axis);
}

static dt_status slice_bw_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    const int64_t *a = g->attrs->i;
    dt_tensor *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK)
        st = dt_slice(dy, (int)a[0], a[1], a[2], a[3], &g->dx[0]);
    dt_tensor_destroy(dy);
    return st;
}

static dt_status slice_bw_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    dt_status st = slice_sample(seed, max_dim, sig, attrs);
    if (st != DT_OK)
        return st;
    int axis = dt__op_axis((int)attrs->i[0], sig->in[0].rank);
    int64_t first, count;
    attrs->i[4] = sig->in[0].dim[axis];
    dt__slice_range(attrs->i[4], attrs->i[1], attrs->i[2], attrs->i[3], &first, &count);
    sig->in[0].dim[axis] = count;
    return DT_OK;
}

const dt_op_def dt__def_slice_backward = {
    .name = "slice_backward",
    .nin = 1,
    .rule_fn = slice_bw_rule,
    .infer = slice_bw_shape,
    .cpu = dt__k_slice_backward,
    .backward = slice_bw_backward,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 1,
    .doc = "a slice's gradient: dy placed at start:stop:step of zeros of the input's size",
    .family = "shape",
    .sample = slice_bw_sample};

/* ---- concat ----------------------------------------------------------------------------- */

static dt_status concat_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0];
    int axis = dt__op_axis((int)sig->attrs->i[0], x->rank);
    if (axis < 0)
        return bad_axis("concat", sig->attrs->i[0], x);
    *out = *x;
    for (int k = 1; k < sig->nin; k++) {
        const dt_op_shape *y = &sig->in[k];
        int same = y->rank == x->rank && y->dtype == x->dtype;
        for (int d = 0; same && d < x->rank; d++)
            same = d == axis || y->dim[d] == x->dim[d];
        if (!same) {
            char s1[128], s2[128];
            return dt__error(DT_ERR_SHAPE,
                             "concat: input %d (%s %s) does not fit input 0 (%s "
                             "%s) along axis %d",
                             k, dt_dtype_name(y->dtype),
                             dt__shape_str(y->rank, y->dim, s2, sizeof s2), dt_dtype_name(x->dtype),
                             dt__shape_str(x->rank, x->dim, s1, sizeof s1), axis);
        }
        out->dim[axis] += y->dim[axis];
    }
    return DT_OK;
}

/* The axis is whole: a factor of its own for each input and for the output; the other dims
 * are shared by all. */
static dt_status concat_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = concat_shape(sig, &o);
    if (st != DT_OK)
        return st;
    int axis = dt__op_axis((int)sig->attrs->i[0], o.rank);
    dt__rule_text r = {buf, len, 0};
    for (int k = 0; k < sig->nin; k++)
        dt__rule_plain(&r, o.rank, axis, (char)('A' + k), k + 1 < sig->nin ? ',' : 0);
    dt__rule_putc(&r, '-');
    dt__rule_putc(&r, '>');
    dt__rule_plain(&r, o.rank, axis, (char)('A' + sig->nin), 0);
    return dt__rule_done(&r, "concat");
}

static dt_status concat_backward(const dt_op_grad *g)
{
    int rank = dt_tensor_rank(g->dy); /* the output is not saved */
    int axis = dt__op_axis((int)g->attrs->i[0], rank);
    int64_t off = 0;
    dt_tensor *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    for (int k = 0; k < g->nin && st == DT_OK; k++) {
        int64_t n = dt_tensor_shape(g->in[k])[axis];
        if (g->needs[k])
            st = dt_slice(dy, axis, off, off + n, 1, &g->dx[k]);
        off += n;
    }
    dt_tensor_destroy(dy);
    return st;
}

static dt_status concat_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = rand_in(&s, 1, 3);
    rand_shape(&s, max_dim, rand_in(&s, 1, 3), &sig->in[0]);
    int axis = rand_in(&s, 0, sig->in[0].rank - 1);
    attrs->i[0] = axis;
    for (int k = 1; k < sig->nin; k++) {
        sig->in[k] = sig->in[0];
        sig->in[k].dim[axis] = rand_in(&s, 1, max_dim);
    }
    return DT_OK;
}

const dt_op_def dt__def_concat = {.name = "concat",
                                  .nin = 1,
                                  .nin_max = DT_OP_MAX_IN,
                                  .rule_fn = concat_rule,
                                  .infer = concat_shape,
                                  .cpu = dt__k_concat,
                                  .backward = concat_backward,
                                  .linearity = DT_OP_LINEAR_ADDITIVE,
                                  .linear_in = (1u << DT_OP_MAX_IN) - 1,
                                  .doc = "the inputs joined along one axis",
                                  .family = "shape",
                                  .sample = concat_sample};

/* ---- expand ----------------------------------------------------------------------------- */

static dt_status expand_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0];
    const int64_t *a = sig->attrs->i;
    char s1[128], s2[128];
    if (a[0] < x->rank || a[0] > DT_MAX_RANK)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "expand: rank %lld for a tensor of shape %s",
                         (long long)a[0], dt__shape_str(x->rank, x->dim, s1, sizeof s1));
    int rank = (int)a[0], lead = rank - x->rank;
    out->dtype = x->dtype;
    out->rank = rank;
    for (int d = 0; d < rank; d++) {
        int64_t want = a[1 + d], have = d < lead ? -2 : x->dim[d - lead];
        if (want == -1 && have >= 0)
            want = have;
        if (want < 0 || (have >= 0 && have != 1 && want != have))
            return dt__error(DT_ERR_SHAPE, "expand: cannot expand %s to %s",
                             dt__shape_str(x->rank, x->dim, s1, sizeof s1),
                             dt__shape_str(rank, a + 1, s2, sizeof s2));
        out->dim[d] = want;
    }
    return DT_OK;
}

/* Output dims 'a' + d; input dim d is output dim d + lead (a size-1 input dim broadcasts). */
static dt_status expand_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = expand_shape(sig, &o);
    if (st != DT_OK)
        return st;
    int lead = o.rank - sig->in[0].rank;
    dt__rule_text r = {buf, len, 0};
    for (int d = 0; d < sig->in[0].rank; d++)
        dt__rule_putc(&r, dt__op_letter(d + lead));
    dt__rule_putc(&r, '-');
    dt__rule_putc(&r, '>');
    dt__rule_plain(&r, o.rank, -1, 0, 0);
    return dt__rule_done(&r, "expand");
}

static dt_status expand_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    const dt_tensor *x = g->in[0];
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.i[0] = dt_tensor_rank(x);
    for (int d = 0; d < a.i[0]; d++)
        a.i[1 + d] = dt_tensor_shape(x)[d];
    dt_tensor *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK)
        st = dt__op_run1(&dt__def_expand_backward, dy, &a, &g->dx[0]);
    dt_tensor_destroy(dy);
    return st;
}

static dt_status expand_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = 1;
    rand_shape(&s, max_dim, rand_in(&s, 1, 3), &sig->in[0]);
    dt_op_shape *x = &sig->in[0];
    int lead = rand_in(&s, 0, 1);
    attrs->i[0] = x->rank + lead;
    if (lead)
        attrs->i[1] = rand_in(&s, 1, max_dim);
    for (int d = 0; d < x->rank; d++) {
        if (rand_in(&s, 0, 1))
            x->dim[d] = 1;
        attrs->i[1 + lead + d] = x->dim[d] == 1 ? rand_in(&s, 1, max_dim) : -1;
    }
    return DT_OK;
}

const dt_op_def dt__def_expand = {
    .name = "expand",
    .nin = 1,
    .rule_fn = expand_rule,
    .infer = expand_shape,
    .cpu = dt__k_expand,
    .backward = expand_backward,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 1,
    .doc = "broadcast to a shape (size-1 dims stretch, new leading dims)",
    .family = "shape",
    .sample = expand_sample};

/* expand's gradient: dy summed over the expanded dims down to the input's shape. */
static dt_status expand_bw_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *dy = &sig->in[0];
    const int64_t *a = sig->attrs->i;
    char s1[64], s2[64];
    if (dy->dtype != DT_DTYPE_F32 && dy->dtype != DT_DTYPE_F64)
        return dt__error(DT_ERR_SHAPE, "expand_backward: dtype %s (f32 or f64 wanted)",
                         dt_dtype_name(dy->dtype));
    int fits = a[0] >= 0 && a[0] <= dy->rank;
    for (int d = 0; fits && d < a[0]; d++)
        fits = a[1 + d] == 1 || a[1 + d] == dy->dim[d + dy->rank - a[0]];
    if (!fits)
        return dt__error(
            DT_ERR_SHAPE, "expand_backward: %s does not sum down to %s",
            dt__shape_str(dy->rank, dy->dim, s1, sizeof s1),
            dt__shape_str(a[0] > 0 && a[0] <= DT_MAX_RANK ? (int)a[0] : 0, a + 1, s2, sizeof s2));
    out->dtype = dy->dtype;
    out->rank = (int)a[0];
    for (int d = 0; d < out->rank; d++)
        out->dim[d] = a[1 + d];
    return DT_OK;
}

/* dy's dims 'a' + d; the output keeps the letters of the dims it keeps, and a size-1 dim
 * summed from a larger one gets a new uppercase letter: the summed dims contract (sharded,
 * they leave the output sum-partial). */
static dt_status expand_bw_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = expand_bw_shape(sig, &o);
    if (st != DT_OK)
        return st;
    const dt_op_shape *dy = &sig->in[0];
    int lead = dy->rank - o.rank;
    dt__rule_text r = {buf, len, 0};
    dt__rule_plain(&r, dy->rank, -1, 0, 0);
    dt__rule_putc(&r, '-');
    dt__rule_putc(&r, '>');
    for (int d = 0; d < o.rank; d++)
        dt__rule_putc(&r,
                      o.dim[d] == dy->dim[d + lead] ? dt__op_letter(d + lead) : (char)('A' + d));
    return dt__rule_done(&r, "expand_backward");
}

static dt_status expand_bw_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    const dt_tensor *x = g->in[0]; /* the forward's input: expand's gradient */
    dt_tensor *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK)
        st = dt_expand(dy, dt_tensor_rank(x), dt_tensor_shape(x), &g->dx[0]);
    dt_tensor_destroy(dy);
    return st;
}

static dt_status expand_bw_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    dt_op_attrs e = DT_OP_ATTRS_INIT;
    dt_op_sig x = *sig;
    dt_status st = expand_sample(seed, max_dim, &x, &e);
    dt_op_shape o;
    x.attrs = &e;
    if (st == DT_OK)
        st = expand_shape(&x, &o);
    if (st != DT_OK)
        return st;
    sig->nin = 1;
    sig->in[0] = o;
    attrs->i[0] = x.in[0].rank;
    for (int d = 0; d < x.in[0].rank; d++)
        attrs->i[1 + d] = x.in[0].dim[d];
    return DT_OK;
}

const dt_op_def dt__def_expand_backward = {
    .name = "expand_backward",
    .nin = 1,
    .rule_fn = expand_bw_rule,
    .infer = expand_bw_shape,
    .cpu = dt__k_expand_backward,
    .backward = expand_bw_backward,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 1,
    .reduce = DT_REDUCE_SUM,
    .doc = "expand's gradient: dy summed over the expanded dims to the input's shape",
    .family = "shape",
    .sample = expand_bw_sample};

/* ---- squeeze, unsqueeze ----------------------------------------------------------------- */

static dt_status squeeze_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0];
    int axis = dt__op_axis((int)sig->attrs->i[0], x->rank);
    if (axis < 0)
        return bad_axis("squeeze", sig->attrs->i[0], x);
    if (x->dim[axis] != 1) {
        char s[128];
        return dt__error(DT_ERR_SHAPE, "squeeze: axis %d of %s has size %lld, not 1", axis,
                         dt__shape_str(x->rank, x->dim, s, sizeof s), (long long)x->dim[axis]);
    }
    out->dtype = x->dtype;
    out->rank = x->rank - 1;
    for (int d = 0, k = 0; d < x->rank; d++)
        if (d != axis)
            out->dim[k++] = x->dim[d];
    return DT_OK;
}

static dt_status squeeze_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = squeeze_shape(sig, &o);
    if (st != DT_OK)
        return st;
    int rank = sig->in[0].rank, axis = dt__op_axis((int)sig->attrs->i[0], rank);
    dt__rule_text r = {buf, len, 0};
    dt__rule_plain(&r, rank, axis, 'A', 0);
    dt__rule_putc(&r, '-');
    dt__rule_putc(&r, '>');
    for (int d = 0; d < rank; d++)
        if (d != axis)
            dt__rule_putc(&r, dt__op_letter(d));
    return dt__rule_done(&r, "squeeze");
}

static dt_status squeeze_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    int axis = dt__op_axis((int)g->attrs->i[0], dt_tensor_rank(g->in[0]));
    dt_tensor *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK)
        st = dt_unsqueeze(dy, axis, &g->dx[0]);
    dt_tensor_destroy(dy);
    return st;
}

static dt_status squeeze_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = 1;
    rand_shape(&s, max_dim, rand_in(&s, 1, 3), &sig->in[0]);
    int axis = rand_in(&s, 0, sig->in[0].rank - 1);
    sig->in[0].dim[axis] = 1;
    attrs->i[0] = axis;
    return DT_OK;
}

const dt_op_def dt__def_squeeze = {.name = "squeeze",
                                   .nin = 1,
                                   .rule_fn = squeeze_rule,
                                   .infer = squeeze_shape,
                                   .cpu = dt__k_copy,
                                   .backward = squeeze_backward,
                                   .linearity = DT_OP_LINEAR_MULTI,
                                   .linear_in = 1,
                                   .doc = "a size-1 axis dropped",
                                   .family = "shape",
                                   .sample = squeeze_sample};

static dt_status unsqueeze_shape(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0];
    int axis = dt__op_axis((int)sig->attrs->i[0], x->rank + 1);
    if (axis < 0 || x->rank >= DT_MAX_RANK)
        return bad_axis("unsqueeze", sig->attrs->i[0], x);
    out->dtype = x->dtype;
    out->rank = x->rank + 1;
    for (int d = 0, k = 0; d < out->rank; d++)
        out->dim[d] = d == axis ? 1 : x->dim[k++];
    return DT_OK;
}

static dt_status unsqueeze_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    dt_op_shape o;
    dt_status st = unsqueeze_shape(sig, &o);
    if (st != DT_OK)
        return st;
    int axis = dt__op_axis((int)sig->attrs->i[0], o.rank);
    dt__rule_text r = {buf, len, 0};
    dt__rule_plain(&r, sig->in[0].rank, -1, 0, 0);
    dt__rule_putc(&r, '-');
    dt__rule_putc(&r, '>');
    for (int d = 0, k = 0; d < o.rank; d++)
        dt__rule_putc(&r, d == axis ? 'A' : dt__op_letter(k++));
    return dt__rule_done(&r, "unsqueeze");
}

static dt_status unsqueeze_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    int axis = dt__op_axis((int)g->attrs->i[0], dt_tensor_rank(g->in[0]) + 1);
    dt_tensor *dy = NULL;
    dt_status st = dt__grad_dy(g, &dy);
    if (st == DT_OK)
        st = dt_squeeze(dy, axis, &g->dx[0]);
    dt_tensor_destroy(dy);
    return st;
}

static dt_status unsqueeze_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    sig->nin = 1;
    rand_shape(&s, max_dim, rand_in(&s, 0, 3), &sig->in[0]);
    attrs->i[0] = rand_in(&s, -(sig->in[0].rank + 1), sig->in[0].rank);
    return DT_OK;
}

const dt_op_def dt__def_unsqueeze = {.name = "unsqueeze",
                                     .nin = 1,
                                     .rule_fn = unsqueeze_rule,
                                     .infer = unsqueeze_shape,
                                     .cpu = dt__k_copy,
                                     .backward = unsqueeze_backward,
                                     .linearity = DT_OP_LINEAR_MULTI,
                                     .linear_in = 1,
                                     .doc = "a size-1 axis inserted",
                                     .family = "shape",
                                     .sample = unsqueeze_sample};

/* ---- public wrappers -------------------------------------------------------------------- */

static dt_status null_arg(const char *fn)
{
    return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
}

dt_status dt_reshape(const dt_tensor *x, int rank, const int64_t *shape, dt_tensor **out)
{
    if (!x || !out || (rank > 0 && !shape))
        return null_arg("dt_reshape");
    if (rank < 0 || rank > DT_MAX_RANK)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_reshape: rank %d outside 0..%d", rank,
                         DT_MAX_RANK);
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.i[0] = rank;
    for (int d = 0; d < rank; d++)
        a.i[1 + d] = shape[d];
    return dt__op_run1(&dt__def_reshape, x, &a, out);
}

dt_status dt_permute(const dt_tensor *x, const int *perm, dt_tensor **out)
{
    int rank = x ? dt_tensor_rank(x) : 0;
    if (!x || !out || (rank > 0 && !perm))
        return null_arg("dt_permute");
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    for (int d = 0; d < rank; d++)
        a.i[d] = perm[d] < 0 ? perm[d] + rank : perm[d]; /* one cache entry per permutation */
    return dt__op_run1(&dt__def_permute, x, &a, out);
}

dt_status dt_transpose(const dt_tensor *x, int axis0, int axis1, dt_tensor **out)
{
    if (!x || !out)
        return null_arg("dt_transpose");
    int rank = dt_tensor_rank(x), perm[DT_MAX_RANK];
    int a0 = dt__op_axis(axis0, rank), a1 = dt__op_axis(axis1, rank);
    if (a0 < 0 || a1 < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "transpose: axes %d, %d out of range for "
                         "rank %d",
                         axis0, axis1, rank);
    for (int d = 0; d < rank; d++)
        perm[d] = d == a0 ? a1 : d == a1 ? a0 : d;
    return dt_permute(x, perm, out);
}

dt_status dt_slice(const dt_tensor *x, int axis, int64_t start, int64_t stop, int64_t step,
                   dt_tensor **out)
{
    if (!x || !out)
        return null_arg("dt_slice");
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.i[0] = axis;
    a.i[1] = start;
    a.i[2] = stop;
    a.i[3] = step;
    return dt__op_run1(&dt__def_slice, x, &a, out);
}

dt_status dt_concat(const dt_tensor *const *xs, int n, int axis, dt_tensor **out)
{
    if (!xs || !out || n < 1)
        return n < 1 && xs && out ? dt__error(DT_ERR_INVALID_ARGUMENT, "dt_concat: %d inputs", n)
                                  : null_arg("dt_concat");
    for (int k = 0; k < n; k++)
        if (!xs[k])
            return null_arg("dt_concat");
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.i[0] = axis;
    if (n <= DT_OP_MAX_IN)
        return dt__op_run(&dt__def_concat, xs, n, &a, NULL, out);
    /* More inputs than one call takes: join them in runs, each run after the previous
     * result (the tape records every step). */
    dt_tensor *acc = NULL;
    dt_status st = dt__op_run(&dt__def_concat, xs, DT_OP_MAX_IN, &a, NULL, &acc);
    for (int k = DT_OP_MAX_IN; k < n && st == DT_OK; k += DT_OP_MAX_IN - 1) {
        const dt_tensor *run[DT_OP_MAX_IN] = {acc};
        int m = n - k < DT_OP_MAX_IN - 1 ? n - k : DT_OP_MAX_IN - 1;
        for (int j = 0; j < m; j++)
            run[1 + j] = xs[k + j];
        dt_tensor *next = NULL;
        st = dt__op_run(&dt__def_concat, run, 1 + m, &a, NULL, &next);
        dt_tensor_destroy(acc);
        acc = next;
    }
    if (st == DT_OK)
        *out = acc;
    return st;
}

dt_status dt_split(const dt_tensor *x, int axis, const int64_t *sizes, int n, dt_tensor **outs)
{
    if (!x || !sizes || !outs)
        return null_arg("dt_split");
    int rank = dt_tensor_rank(x), ax = dt__op_axis(axis, rank);
    if (ax < 0 || n < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "split: axis %d of rank %d into %d parts", axis,
                         rank, n);
    int64_t total = 0, dim = dt_tensor_shape(x)[ax];
    for (int k = 0; k < n; k++) {
        if (sizes[k] < 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "split: size %lld of part %d",
                             (long long)sizes[k], k);
        total += sizes[k];
    }
    if (total != dim)
        return dt__error(DT_ERR_SHAPE, "split: sizes sum to %lld, axis %d has %lld",
                         (long long)total, ax, (long long)dim);
    dt_tensor **tmp = calloc((size_t)n, sizeof *tmp);
    if (!tmp)
        return dt__error(DT_ERR_NO_MEMORY, "split: out of memory");
    dt_status st = DT_OK;
    int64_t off = 0;
    for (int k = 0; k < n && st == DT_OK; k++) {
        st = dt_slice(x, ax, off, off + sizes[k], 1, &tmp[k]);
        off += sizes[k];
    }
    for (int k = 0; k < n; k++) {
        if (st == DT_OK)
            outs[k] = tmp[k];
        else
            dt_tensor_destroy(tmp[k]);
    }
    free(tmp);
    return st;
}

dt_status dt_stack(const dt_tensor *const *xs, int n, int axis, dt_tensor **out)
{
    if (!xs || !out || n < 1)
        return n < 1 && xs && out ? dt__error(DT_ERR_INVALID_ARGUMENT, "dt_stack: %d inputs", n)
                                  : null_arg("dt_stack");
    dt_tensor **u = calloc((size_t)n, sizeof *u);
    if (!u)
        return dt__error(DT_ERR_NO_MEMORY, "stack: out of memory");
    dt_status st = DT_OK;
    for (int k = 0; k < n && st == DT_OK; k++)
        st = xs[k] ? dt_unsqueeze(xs[k], axis, &u[k]) : null_arg("dt_stack");
    if (st == DT_OK)
        st = dt_concat((const dt_tensor *const *)u, n, axis, out);
    for (int k = 0; k < n; k++)
        dt_tensor_destroy(u[k]);
    free(u);
    return st;
}

dt_status dt_expand(const dt_tensor *x, int rank, const int64_t *shape, dt_tensor **out)
{
    if (!x || !out || (rank > 0 && !shape))
        return null_arg("dt_expand");
    if (rank < 0 || rank > DT_MAX_RANK)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "expand: rank %d outside 0..%d", rank,
                         DT_MAX_RANK);
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.i[0] = rank;
    for (int d = 0; d < rank; d++)
        a.i[1 + d] = shape[d];
    return dt__op_run1(&dt__def_expand, x, &a, out);
}

dt_status dt_squeeze(const dt_tensor *x, int axis, dt_tensor **out)
{
    if (!x || !out)
        return null_arg("dt_squeeze");
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.i[0] = axis;
    return dt__op_run1(&dt__def_squeeze, x, &a, out);
}

dt_status dt_unsqueeze(const dt_tensor *x, int axis, dt_tensor **out)
{
    if (!x || !out)
        return null_arg("dt_unsqueeze");
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.i[0] = axis;
    return dt__op_run1(&dt__def_unsqueeze, x, &a, out);
}
