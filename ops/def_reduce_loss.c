/* ops/def_reduce_loss: cross_entropy (PyTorch's reduction='mean' with ignore_index) as two
 * definitions: label_count (the positions not ignored: a partial sum when the rows are
 * sharded) and cross_entropy (logits, labels, that count: each device sums its rows' losses
 * divided by the global count, a partial sum over sharded rows), with its gradient op. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "mesh/mesh_group.h"
#include "ops/def_reduce.h"
#include "runtime/error.h"

static int is_index(dt_dtype t)
{
    return t == DT_DTYPE_I32 || t == DT_DTYPE_I64;
}

/* "ab->" (label_count), "abC,ab,->" (cross_entropy), "abC,ab,,->abC" (its gradient): the
 * rows shardable (contracted: a partial sum), the classes whole. */
static dt_status xent_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    char x[DT_MAX_RANK + 1], r[64];
    int rank = sig->in[0].rank;
    if (sig->nin > 1 && rank < 1)
        return dt__error(DT_ERR_SHAPE, "cross_entropy: logits of rank 0");
    for (int d = 0; d < rank; d++)
        x[d] = dt__op_letter(d);
    x[rank] = 0;
    if (sig->nin == 1) {
        snprintf(r, sizeof(r), "%s->", x);
    } else {
        x[rank - 1] = (char)toupper(x[rank - 1]);
        if (sig->nin == 3)
            snprintf(r, sizeof(r), "%s,%.*s,->", x, rank - 1, x);
        else
            snprintf(r, sizeof(r), "%s,%.*s,,->%s", x, rank - 1, x, x);
    }
    if (strlen(r) >= len)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "cross_entropy: rule buffer too small");
    strcpy(buf, r);
    dt__rd_rule_fixup(buf, len);
    return DT_OK;
}

static dt_status count_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    if (!is_index(sig->in[0].dtype))
        return dt__error(DT_ERR_SHAPE, "label_count: labels are %s, not i32 or i64",
                         dt_dtype_name(sig->in[0].dtype));
    out->dtype = DT_DTYPE_I64;
    out->rank = 0;
    return DT_OK;
}

static dt_status xent_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0], *lb = &sig->in[1];
    char s[96], t[96];
    const char *name = sig->nin == 3 ? "cross_entropy" : "cross_entropy_grad";
    if (!dt__rd_float(x->dtype) || x->rank < 1)
        return dt__error(DT_ERR_SHAPE, "%s: logits %s (%s): f32 or f64 of rank >= 1", name,
                         dt__rd_shape_str(x, s, sizeof(s)), dt_dtype_name(x->dtype));
    int ok = is_index(lb->dtype) && lb->rank == x->rank - 1;
    for (int d = 0; ok && d < lb->rank; d++)
        ok = lb->dim[d] == x->dim[d];
    if (!ok)
        return dt__error(DT_ERR_SHAPE,
                         "%s: labels %s (%s) do not fit logits %s (i32 or i64 of "
                         "the logits' shape without the class dim)",
                         name, dt__rd_shape_str(lb, s, sizeof(s)), dt_dtype_name(lb->dtype),
                         dt__rd_shape_str(x, t, sizeof(t)));
    if (sig->in[2].rank != 0 || sig->in[2].dtype != DT_DTYPE_I64)
        return dt__error(DT_ERR_SHAPE, "%s: the count (input 2) must be a rank-0 i64", name);
    if (sig->nin == 4 && (sig->in[3].rank != 0 || sig->in[3].dtype != x->dtype))
        return dt__error(DT_ERR_SHAPE, "%s: dy must be a rank-0 %s", name, dt_dtype_name(x->dtype));
    if (sig->nin == 4) {
        *out = *x;
    } else {
        out->dtype = x->dtype;
        out->rank = 0;
    }
    return DT_OK;
}

static dt_status xent_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    const dt_tensor *dy;
    dt_tensor *owned;
    dt_status st = dt__rd_dy(g, dt_tensor_dtype(g->in[0]), &dy, &owned);
    const dt_tensor *in[4] = {g->in[0], g->in[1], g->in[2], dy};
    if (st == DT_OK)
        st = dt__op_run(&dt__def_cross_entropy_grad, in, 4, g->attrs, NULL, &g->dx[0]);
    dt_tensor_destroy(owned);
    return st;
}

static dt_status xent_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    dt_op_shape *x = &sig->in[0];
    sig->nin = 3;
    x->dtype = DT_DTYPE_F64;
    x->rank = (int)dt__rd_randint(&s, 1, 3);
    for (int d = 0; d < x->rank; d++)
        x->dim[d] = dt__rd_randint(&s, 1, max_dim);
    sig->in[1] = *x;
    sig->in[1].rank--;
    sig->in[1].dtype = DT_DTYPE_I64;
    sig->in[2].dtype = DT_DTYPE_I64;
    sig->in[2].rank = 0;
    attrs->i[0] = -100;
    return DT_OK;
}

static dt_status xent_fill(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    uint64_t s = seed;
    const dt_op_shape *x = &sig->in[0];
    if (i == 1) {
        for (int64_t e = 0; e < n; e++) { /* one label in five ignored */
            int64_t v = dt__rd_randint(&s, 0, 4) ? dt__rd_randint(&s, 0, x->dim[x->rank - 1] - 1)
                                                 : sig->attrs->i[0];
            if (sig->in[1].dtype == DT_DTYPE_I32) /* labels of either index dtype */
                ((int32_t *)host)[e] = (int32_t)v;
            else
                ((int64_t *)host)[e] = v;
        }
    } else if (i == 2) {
        ((int64_t *)host)[0] = dt__rd_randint(&s, 1, 8); /* any positive count */
    } else {
        return DT_ERR_UNSUPPORTED; /* logits: plain reals */
    }
    return DT_OK;
}

const dt_op_def dt__def_label_count = {
    .name = "label_count",
    .nin = 1,
    .rule_fn = xent_rule,
    .infer = count_infer,
    .cpu = dt__k_label_count,
    .reduce = DT_REDUCE_SUM,
    .doc = "the number of labels not equal to ignore_index (i64; a partial sum when sharded)",
    .family = "loss",
};

const dt_op_def dt__def_cross_entropy = {
    .name = "cross_entropy",
    .nin = 3,
    .rule_fn = xent_rule,
    .infer = xent_infer,
    .cpu = dt__k_cross_entropy,
    .backward = xent_backward,
    .reduce = DT_REDUCE_SUM,
    .doc = "sum over the rows not ignored of -log softmax(logits)[label], divided by count",
    .family = "loss",
    .sample = xent_sample,
    .fill = xent_fill,
};

const dt_op_def dt__def_cross_entropy_grad = {
    .name = "cross_entropy_grad",
    .nin = 4,
    .rule_fn = xent_rule,
    .infer = xent_infer,
    .cpu = dt__k_cross_entropy_grad,
    .doc = "dy / count (softmax(logits) - onehot(label)), zero on ignored rows",
    .family = "loss",
};

dt_status dt_cross_entropy(const dt_tensor *logits, const dt_tensor *labels, int64_t ignore_index,
                           dt_tensor **out)
{
    if (!logits || !labels || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "cross_entropy: NULL argument");
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = ignore_index;
    dt_tensor *count = NULL;
    dt_status st = dt__op_run1(&dt__def_label_count, labels, &at, &count);
    if (st != DT_OK)
        return st;
    const dt_tensor *in[3] = {logits, labels, count};
    dt_tensor *t = NULL;
    st = dt__op_run(&dt__def_cross_entropy, in, 3, &at, NULL, &t);
    dt_tensor_destroy(count);
    /* A bad label is seen only by the client whose rows hold it; the core leaves the failure
     * there, and ops_general.h promises it on every client. */
    st = dt__mesh_agree(dt_layout_mesh(dt_tensor_layout(logits)), st, "dt_cross_entropy");
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    *out = t;
    return DT_OK;
}
