/* Distributed softmax cross-entropy and its gradient: rows keep their sharding, classes are
 * gathered, the mean loss is partial over the mesh dims sharding the rows. */
#include <string.h>

#include "layout/tensor_dev.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"
#include "runtime/record.h"

/* The local kernels of component i (dt__ops_each_local): logits, labels -> out. */
typedef struct xent_local {
    const dt__ops_backend *be;
    const dt_tensor *logits, *labels, *out;
    int64_t classes;
    float scale;
} xent_local;

/* Every component writes its partial loss, also one without rows (zero). */
static dt_status xent_one(int i, void *arg)
{
    const xent_local *x = arg;
    return x->be->softmax_xent(dt_tensor_local(x->logits, i)->shape[0], x->classes,
                               dt__local_data(x->logits, i), dt__local_data(x->labels, i),
                               x->scale, dt__local_data(x->out, i));
}

static dt_status xent_grad_one(int i, void *arg)
{
    const xent_local *x = arg;
    int64_t rows = dt_tensor_local(x->logits, i)->shape[0];
    if (rows == 0)
        return DT_OK;
    return x->be->softmax_xent_grad(rows, x->classes, dt__local_data(x->logits, i),
                                    dt__local_data(x->labels, i), x->scale,
                                    dt__local_data(x->out, i));
}

static dt_status prepare(const char *op, const dt_tensor *logits, const dt_tensor *labels,
                         const void *out, const dt__ops_backend **be, dt_tensor **rl,
                         dt_tensor **rt)
{
    dt_status st = dt__check_f32(op, "logits", logits);
    if (st == DT_OK)
        st = dt__check_tensor(op, "labels", labels, logits);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: output pointer is NULL", op);
    if (st != DT_OK)
        return st;
    if (dt_tensor_dtype(labels) != DT_DTYPE_I32)
        return dt__error(DT_ERR_SHAPE, "%s: labels have dtype %s, i32 expected", op,
                         dt_dtype_name(dt_tensor_dtype(labels)));
    if (dt_tensor_rank(logits) != 2 || dt_tensor_rank(labels) != 1 ||
        dt_tensor_shape(labels)[0] != dt_tensor_shape(logits)[0])
        return dt__error(DT_ERR_SHAPE, "%s: logits must be [rows, classes] and labels [rows] "
                         "(ranks %d and %d)", op, dt_tensor_rank(logits),
                         dt_tensor_rank(labels));
    if (dt_tensor_shape(logits)[1] < 1)
        return dt__error(DT_ERR_SHAPE, "%s: logits have no classes", op);
    st = dt__ops_backend_for(dt_layout_mesh(dt_tensor_layout(logits)), op, be);
    if (st != DT_OK)
        return st;
    dt__lspec ll, lt;
    dt__lspec_of(dt_tensor_layout(logits), &ll);
    memset(ll.partial, 0, sizeof ll.partial);
    ll.spec[1] = -1;
    memset(&lt, 0, sizeof lt);
    lt.rank = 1;
    lt.spec[0] = ll.spec[0];
    st = dt__ensure_layout(logits, &ll, rl);
    if (st != DT_OK)
        return st;
    st = dt__ensure_layout(labels, &lt, rt);
    if (st != DT_OK) {
        dt_tensor_destroy(*rl);
        *rl = NULL;
    }
    return st;
}

static dt_status softmax_xent_run(const dt_tensor *logits, const dt_tensor *labels,
                          const dt_layout *layout, dt_tensor **loss_out)
{
    static const char op[] = "dt_softmax_xent";
    const dt__ops_backend *be = NULL;
    dt_tensor *rl = NULL, *rt = NULL, *loss = NULL;
    dt_status st = prepare(op, logits, labels, loss_out, &be, &rl, &rt);
    if (st != DT_OK)
        return st;
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(rl));
    int64_t rows = dt_tensor_shape(rl)[0], classes = dt_tensor_shape(rl)[1];
    dt__lspec ly;
    memset(&ly, 0, sizeof ly);
    int row_dim = dt_layout_spec_mesh_dim(dt_tensor_layout(rl), 0);
    if (row_dim >= 0)
        ly.partial[row_dim] = 1 + (int)DT_REDUCE_SUM;
    int64_t none[1] = {0};
    st = dt__tensor_new(mesh, &ly, DT_DTYPE_F32, none, &loss);
    float scale = rows > 0 ? 1.0f / (float)rows : 0.0f;
    xent_local xl = {be, rl, rt, loss, classes, scale};
    if (st == DT_OK)
        st = dt__ops_each_local(be, rl, xent_one, &xl);
    st = dt__ops_finish(be, op, layout, st, &loss, loss_out);
    dt_tensor_destroy(rt);
    dt_tensor_destroy(rl);
    return st;
}

/* The public entry: records the call on this thread's tape (runtime/record.h). */
dt_status dt_softmax_xent(const dt_tensor *logits, const dt_tensor *labels,
                          const dt_layout *layout, dt_tensor **loss_out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = softmax_xent_run(logits, labels, layout, loss_out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*loss_out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_SOFTMAX_XENT, .nin = 2, .in = {logits, labels}, .layout = layout};
    return dt__rec_finish(r, st, &rec, t, loss_out);
}

dt_status dt_softmax_xent_backward(const dt_tensor *logits, const dt_tensor *labels,
                                   float dloss, dt_tensor **dlogits_out)
{
    static const char op[] = "dt_softmax_xent_backward";
    const dt__ops_backend *be = NULL;
    dt_tensor *rl = NULL, *rt = NULL, *d = NULL;
    dt_status st = prepare(op, logits, labels, dlogits_out, &be, &rl, &rt);
    if (st != DT_OK)
        return st;
    int64_t rows = dt_tensor_shape(rl)[0], classes = dt_tensor_shape(rl)[1];
    st = dt__tensor_empty(dt_tensor_layout(rl), DT_DTYPE_F32, dt_tensor_shape(rl), &d);
    float scale = rows > 0 ? dloss / (float)rows : 0.0f;
    xent_local xl = {be, rl, rt, d, classes, scale};
    if (st == DT_OK)
        st = dt__ops_each_local(be, d, xent_grad_one, &xl);
    st = dt__ops_finish(be, op, NULL, st, &d, dlogits_out);
    dt_tensor_destroy(rt);
    dt_tensor_destroy(rl);
    return st;
}
