/* Distributed vocabulary-sharded layers (Megatron): the embedding lookup, where each device
 * holds a slice of the table's rows and the outputs are summed over the vocabulary's mesh
 * dim, and the vocab-parallel cross-entropy, which never gathers the logits: the row max, the
 * sum of exponentials and the target logit are reduced over that mesh dim instead. */
#include <string.h>

#include "layout/tensor_dev.h"
#include "mesh/mesh_group.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"
#include "runtime/record.h"

/* ---- embedding ------------------------------------------------------------------------- */

typedef struct emb_plan {
    dt__lspec table, ids, out; /* out without its partial dim */
    int vocab_dim;             /* mesh dim sharding the vocabulary, or -1 */
} emb_plan;

static dt_status check_emb(const char *op, const dt_tensor *table, const dt_tensor *ids)
{
    dt_status st = dt__check_f32(op, "table", table);
    if (st == DT_OK)
        st = dt__check_tensor(op, "ids", ids, table);
    if (st != DT_OK)
        return st;
    if (dt_tensor_dtype(ids) != DT_DTYPE_I32)
        return dt__error(DT_ERR_SHAPE, "%s: ids have dtype %s, i32 expected", op,
                         dt_dtype_name(dt_tensor_dtype(ids)));
    if (dt_tensor_rank(table) != 2 || dt_tensor_rank(ids) + 1 > DT_MAX_RANK)
        return dt__error(DT_ERR_SHAPE, "%s: the table must be [vocab, dim] (rank %d) and ids of "
                         "rank < %d", op, dt_tensor_rank(table), DT_MAX_RANK);
    return DT_OK;
}

static void emb_plan_of(const dt_tensor *table, const dt_tensor *ids, emb_plan *p)
{
    dt__lspec_gathered(table, 1, &p->table);
    p->vocab_dim = p->table.spec[0];
    dt__lspec_gathered(ids, -1, &p->ids);
    for (int d = 0; d < p->ids.rank; d++)
        if (p->ids.spec[d] == p->vocab_dim)
            p->ids.spec[d] = -1;
    p->out = p->ids;
    p->out.rank = p->ids.rank + 1;
    p->out.spec[p->ids.rank] = -1;
}

/* The local kernels of component i (dt__ops_each_local). */
typedef struct emb_local {
    const dt__ops_backend *be;
    const dt_tensor *table, *ids, *dout, *out;
    int64_t vocab, dim; /* the whole table's rows, against which every id is checked */
} emb_local;

static dt_status emb_one(int i, void *arg)
{
    const emb_local *e = arg;
    int64_t n = dt__local_numel(e->ids, i);
    if (n == 0 || e->dim == 0)
        return DT_OK;
    return e->be->embedding(n, dt__local_data(e->ids, i), dt_tensor_local_offset(e->table, i)[0],
                            dt_tensor_local(e->table, i)->shape[0], e->vocab, e->dim,
                            dt__local_data(e->table, i), dt__local_data(e->out, i));
}

/* out is the table's gradient: rows of the local slice, from the local ids and dout. */
static dt_status emb_grad_one(int i, void *arg)
{
    const emb_local *e = arg;
    int64_t rows = dt_tensor_local(e->out, i)->shape[0];
    if (rows * e->dim == 0)
        return DT_OK;
    return e->be->embedding_grad(dt__local_numel(e->ids, i), dt__local_data(e->ids, i),
                                 dt_tensor_local_offset(e->out, i)[0], rows, e->vocab,
                                 e->dim, dt__local_data(e->dout, i), dt__local_data(e->out, i));
}

/* The local kernels, synced, then one outcome over the clients: a bad id held by one client
 * (ids sharded over clients) fails the op on all of them, before any of them goes on to the
 * op's relayouts. */
static dt_status run_checked(const dt__ops_backend *be, const dt_mesh *mesh, const char *op,
                             const dt_tensor *t, dt__work_fn fn, void *arg)
{
    dt_status st = dt__ops_each_local(be, t, fn, arg);
    if (st == DT_OK && be->sync)
        st = be->sync();
    return dt__mesh_agree(mesh, st, op);
}

static dt_status embedding_run(const dt_tensor *table, const dt_tensor *ids, const dt_layout *layout,
                       dt_tensor **out)
{
    static const char op[] = "dt_embedding";
    const dt_mesh *mesh = NULL;
    const dt__ops_backend *be = NULL;
    dt_status st = dt__ops_begin(op, check_emb(op, table, ids), out != NULL, "out", table, &mesh,
                                 &be);
    if (st != DT_OK)
        return st;
    emb_plan p;
    emb_plan_of(table, ids, &p);
    dt__lspec lo = p.out;
    if (p.vocab_dim >= 0)
        lo.partial[p.vocab_dim] = 1 + (int)DT_REDUCE_SUM;
    int r = dt_tensor_rank(ids);
    int64_t shape[DT_MAX_RANK], dim = dt_tensor_shape(table)[1];
    memcpy(shape, dt_tensor_shape(ids), sizeof(int64_t) * (size_t)r);
    shape[r] = dim;
    dt_tensor *rt = NULL, *ri = NULL, *y = NULL;
    st = dt__ensure_layout(table, &p.table, &rt);
    if (st == DT_OK)
        st = dt__ensure_layout(ids, &p.ids, &ri);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &lo, DT_DTYPE_F32, shape, &y);
    emb_local el = {be, rt, ri, NULL, y, dt_tensor_shape(table)[0], dim};
    if (st == DT_OK)
        st = run_checked(be, mesh, op, y, emb_one, &el);
    st = dt__ops_finish(be, op, layout, st, &y, out);
    dt_tensor_destroy(ri);
    dt_tensor_destroy(rt);
    return st;
}

/* The public entry: records the call on this thread's tape (runtime/record.h). */
dt_status dt_embedding(const dt_tensor *table, const dt_tensor *ids, const dt_layout *layout,
                       dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = embedding_run(table, ids, layout, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_EMBEDDING, .nin = 2, .in = {table, ids}, .layout = layout};
    return dt__rec_finish(r, st, &rec, t, out);
}

/* dout [ids' shape..., dim]. */
static dt_status check_dout_shape(const char *op, const dt_tensor *table, const dt_tensor *ids,
                                  const dt_tensor *dout)
{
    int r = dt_tensor_rank(ids);
    int same = dt_tensor_rank(dout) == r + 1 &&
               dt_tensor_shape(dout)[r] == dt_tensor_shape(table)[1];
    for (int d = 0; same && d < r; d++)
        same = dt_tensor_shape(dout)[d] == dt_tensor_shape(ids)[d];
    if (!same)
        return dt__error(DT_ERR_SHAPE, "%s: dout must be [ids' shape..., %lld]", op,
                         (long long)dt_tensor_shape(table)[1]);
    return DT_OK;
}

dt_status dt_embedding_backward(const dt_tensor *table, const dt_tensor *ids,
                                const dt_tensor *dout, const dt_layout *layout,
                                dt_tensor **dtable_out)
{
    static const char op[] = "dt_embedding_backward";
    dt_status st = check_emb(op, table, ids);
    if (st == DT_OK)
        st = dt__check_f32(op, "dout", dout);
    if (st == DT_OK)
        st = dt__check_tensor(op, "dout", dout, table);
    if (st == DT_OK && !dtable_out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: dtable_out is NULL", op);
    if (st == DT_OK)
        st = check_dout_shape(op, table, ids, dout);
    const dt_mesh *mesh = NULL;
    const dt__ops_backend *be = NULL;
    st = dt__ops_begin(op, st, 1, NULL, table, &mesh, &be); /* dtable_out checked */
    if (st != DT_OK)
        return st;
    int r = dt_tensor_rank(ids);
    emb_plan p;
    emb_plan_of(table, ids, &p);
    dt__lspec lg = p.table;
    for (int d = 0; d < r; d++)
        if (p.ids.spec[d] >= 0)
            lg.partial[p.ids.spec[d]] = 1 + (int)DT_REDUCE_SUM;
    int64_t dim = dt_tensor_shape(table)[1];
    dt_tensor *rt = NULL, *ri = NULL, *rd = NULL, *g = NULL;
    st = dt__ensure_layout(table, &p.table, &rt);
    if (st == DT_OK)
        st = dt__ensure_layout(ids, &p.ids, &ri);
    if (st == DT_OK)
        st = dt__ensure_layout(dout, &p.out, &rd);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &lg, DT_DTYPE_F32, dt_tensor_shape(table), &g);
    emb_local el = {be, NULL, ri, rd, g, dt_tensor_shape(table)[0], dim};
    if (st == DT_OK)
        st = run_checked(be, mesh, op, g, emb_grad_one, &el);
    st = dt__ops_finish(be, op, layout, st, &g, dtable_out);
    dt_tensor_destroy(rd);
    dt_tensor_destroy(ri);
    dt_tensor_destroy(rt);
    return st;
}

/* ---- vocab-parallel cross-entropy ------------------------------------------------------ */

/* What forward and backward share: the logits and labels in their working layouts and the
 * reduced per-row statistics. */
typedef struct xent_state {
    const dt__ops_backend *be;
    dt_tensor *logits, *labels, *rowmax, *sumexp, *target;
    int64_t vocab, rows;
    int whole; /* the vocabulary is not sharded and the backend has the whole-row kernels */
} xent_state;

/* The local kernels of component i (dt__ops_each_local) on the state's tensors; out: the
 * loss or the logits' gradient. */
typedef struct vx_local {
    const xent_state *x;
    const dt_tensor *out;
    float scale;
} vx_local;

static int64_t vx_cols(const xent_state *x, int i)
{
    const DLTensor *l = dt_tensor_local(x->logits, i);
    return l->shape[l->ndim - 1];
}

static int64_t vx_col0(const xent_state *x, int i)
{
    return dt_tensor_local_offset(x->logits, i)[dt_tensor_rank(x->logits) - 1];
}

static dt_status rowmax_one(int i, void *arg)
{
    const xent_state *x = ((const vx_local *)arg)->x;
    int64_t rows = dt__local_numel(x->rowmax, i);
    if (rows == 0)
        return DT_OK;
    return x->be->reduce_axis(DT_REDUCE_MAX, rows, vx_cols(x, i), 1, dt__local_data(x->logits, i),
                              dt__local_data(x->rowmax, i));
}

static dt_status stats_one(int i, void *arg)
{
    const xent_state *x = ((const vx_local *)arg)->x;
    int64_t rows = dt__local_numel(x->sumexp, i);
    if (rows == 0)
        return DT_OK;
    return x->be->vocab_xent_stats(rows, vx_cols(x, i), dt__local_data(x->logits, i),
                                   dt__local_data(x->rowmax, i), vx_col0(x, i), x->vocab,
                                   dt__local_data(x->labels, i), dt__local_data(x->sumexp, i),
                                   dt__local_data(x->target, i));
}

static dt_status rows_stats_one(int i, void *arg)
{
    const xent_state *x = ((const vx_local *)arg)->x;
    int64_t rows = dt__local_numel(x->sumexp, i);
    if (rows == 0)
        return DT_OK;
    return x->be->vocab_xent_rows_stats(rows, x->vocab, dt__local_data(x->logits, i),
                                        dt__local_data(x->labels, i),
                                        dt__local_data(x->rowmax, i),
                                        dt__local_data(x->sumexp, i),
                                        dt__local_data(x->target, i));
}

static dt_status rows_grad_one(int i, void *arg)
{
    const vx_local *v = arg;
    const xent_state *x = v->x;
    int64_t rows = dt__local_numel(x->labels, i);
    if (rows == 0)
        return DT_OK;
    return x->be->vocab_xent_rows_grad(rows, x->vocab, dt__local_data(x->logits, i),
                                       dt__local_data(x->labels, i), v->scale,
                                       dt__local_data(v->out, i));
}

/* Every component writes its partial loss, also one without rows (zero). */
static dt_status vloss_one(int i, void *arg)
{
    const vx_local *v = arg;
    const xent_state *x = v->x;
    return x->be->vocab_xent_loss(dt__local_numel(x->rowmax, i), dt__local_data(x->rowmax, i),
                                  dt__local_data(x->sumexp, i), dt__local_data(x->target, i),
                                  dt__local_data(x->labels, i), v->scale,
                                  dt__local_data(v->out, i));
}

static dt_status vgrad_one(int i, void *arg)
{
    const vx_local *v = arg;
    const xent_state *x = v->x;
    int64_t rows = dt__local_numel(x->rowmax, i), cols = vx_cols(x, i);
    if (rows * cols == 0)
        return DT_OK;
    return x->be->vocab_xent_grad(rows, cols, dt__local_data(x->logits, i),
                                  dt__local_data(x->rowmax, i), dt__local_data(x->sumexp, i),
                                  vx_col0(x, i), dt__local_data(x->labels, i), v->scale,
                                  dt__local_data(v->out, i));
}

static void xent_free(xent_state *x)
{
    dt_tensor_destroy(x->logits);
    dt_tensor_destroy(x->labels);
    dt_tensor_destroy(x->rowmax);
    dt_tensor_destroy(x->sumexp);
    dt_tensor_destroy(x->target);
}

/* A per-row tensor [leading dims] in the labels' layout, partial over `pdim` with `op`. */
static dt_status row_tensor(const dt_tensor *labels, int pdim, dt_reduce_op op, dt_tensor **out)
{
    dt__lspec ls;
    dt__lspec_of(dt_tensor_layout(labels), &ls);
    if (pdim >= 0)
        ls.partial[pdim] = 1 + (int)op;
    return dt__tensor_new(dt_layout_mesh(dt_tensor_layout(labels)), &ls, DT_DTYPE_F32,
                          dt_tensor_shape(labels), out);
}

/* Relays a partial per-row tensor out to its reduced layout, in place. */
static dt_status reduce_rows(dt_tensor **t)
{
    dt__lspec ls;
    dt__lspec_gathered(*t, -1, &ls);
    dt_tensor *r = NULL;
    dt_status st = dt__ensure_layout(*t, &ls, &r);
    if (st == DT_OK) {
        dt_tensor_destroy(*t);
        *t = r;
    }
    return st;
}

/* The logits and labels in their working layouts and, when `stats` is set or the vocabulary
 * is sharded, the reduced row statistics. */
static dt_status xent_prepare(const char *op, const dt_tensor *logits, const dt_tensor *labels,
                              const void *out, int stats, xent_state *x)
{
    memset(x, 0, sizeof *x);
    dt_status st = dt__check_f32(op, "logits", logits);
    if (st == DT_OK)
        st = dt__check_tensor(op, "labels", labels, logits);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: output pointer is NULL", op);
    if (st != DT_OK)
        return st;
    int r = dt_tensor_rank(logits);
    int same = r >= 1 && dt_tensor_rank(labels) == r - 1;
    for (int d = 0; same && d < r - 1; d++)
        same = dt_tensor_shape(labels)[d] == dt_tensor_shape(logits)[d];
    if (!same || dt_tensor_dtype(labels) != DT_DTYPE_I32)
        return dt__error(DT_ERR_SHAPE, "%s: logits must be [..., vocab] and labels i32 [...] "
                         "of the same leading dims", op);
    x->vocab = dt_tensor_shape(logits)[r - 1];
    x->rows = dt__numel(r - 1, dt_tensor_shape(logits));
    if (x->vocab < 1)
        return dt__error(DT_ERR_SHAPE, "%s: logits have no classes", op);
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(logits));
    st = dt__ops_backend_for(mesh, op, &x->be);
    if (st != DT_OK)
        return st;
    const dt__ops_backend *be = x->be;
    dt__lspec ll, lt;
    dt__lspec_gathered(logits, -1, &ll);
    int vdim = ll.spec[r - 1];
    lt = ll;
    lt.rank = r - 1;
    st = dt__ensure_layout(logits, &ll, &x->logits);
    if (st == DT_OK)
        st = dt__ensure_layout(labels, &lt, &x->labels);
    x->whole = vdim < 0 && be->vocab_xent_rows_stats && be->vocab_xent_rows_grad;
    if (st == DT_OK && x->whole && !stats)
        return DT_OK;
    if (st == DT_OK)
        st = row_tensor(x->labels, vdim, DT_REDUCE_MAX, &x->rowmax);
    vx_local vl = {x, NULL, 0.0f};
    if (st == DT_OK && x->whole) {
        /* One pass per row: max, sum of exponentials, target (no reduction to follow). */
        st = row_tensor(x->labels, -1, DT_REDUCE_SUM, &x->sumexp);
        if (st == DT_OK)
            st = row_tensor(x->labels, -1, DT_REDUCE_SUM, &x->target);
        if (st == DT_OK)
            st = dt__ops_each_local(be, x->sumexp, rows_stats_one, &vl);
        if (st == DT_OK && be->sync)
            st = be->sync();
        st = dt__mesh_agree(mesh, st, op);
        if (st != DT_OK)
            xent_free(x);
        return st;
    }
    if (st == DT_OK)
        st = dt__ops_each_local(be, x->rowmax, rowmax_one, &vl);
    if (st == DT_OK && be->sync)
        st = be->sync();
    if (st == DT_OK)
        st = reduce_rows(&x->rowmax);
    if (st == DT_OK)
        st = row_tensor(x->labels, vdim, DT_REDUCE_SUM, &x->sumexp);
    if (st == DT_OK)
        st = row_tensor(x->labels, vdim, DT_REDUCE_SUM, &x->target);
    if (st == DT_OK) {
        /* Labels are checked here: one outcome over the clients (see run_checked). */
        st = dt__ops_each_local(be, x->sumexp, stats_one, &vl);
        if (st == DT_OK && be->sync)
            st = be->sync();
        st = dt__mesh_agree(mesh, st, op);
    }
    if (st == DT_OK)
        st = reduce_rows(&x->sumexp);
    if (st == DT_OK)
        st = reduce_rows(&x->target);
    if (st != DT_OK)
        xent_free(x);
    return st;
}

static dt_status vocab_xent_run(const dt_tensor *logits, const dt_tensor *labels,
                        const dt_layout *layout, dt_tensor **loss_out)
{
    static const char op[] = "dt_vocab_xent";
    xent_state x;
    dt_status st = xent_prepare(op, logits, labels, loss_out, 1, &x);
    if (st != DT_OK)
        return st;
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(logits));
    dt__lspec ls, lr;
    memset(&ls, 0, sizeof ls);
    dt__lspec_of(dt_tensor_layout(x.labels), &lr);
    for (int d = 0; d < lr.rank; d++)
        if (lr.spec[d] >= 0)
            ls.partial[lr.spec[d]] = 1 + (int)DT_REDUCE_SUM;
    int64_t none[1] = {0};
    dt_tensor *loss = NULL;
    st = dt__tensor_new(mesh, &ls, DT_DTYPE_F32, none, &loss);
    float scale = x.rows > 0 ? 1.0f / (float)x.rows : 0.0f;
    vx_local vl = {&x, loss, scale};
    if (st == DT_OK)
        st = dt__ops_each_local(x.be, x.rowmax, vloss_one, &vl);
    st = dt__ops_finish(x.be, op, layout, st, &loss, loss_out);
    xent_free(&x);
    return st;
}

/* The public entry: records the call on this thread's tape (runtime/record.h). */
dt_status dt_vocab_xent(const dt_tensor *logits, const dt_tensor *labels,
                        const dt_layout *layout, dt_tensor **loss_out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = vocab_xent_run(logits, labels, layout, loss_out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*loss_out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_VOCAB_XENT, .nin = 2, .in = {logits, labels}, .layout = layout};
    return dt__rec_finish(r, st, &rec, t, loss_out);
}

dt_status dt_vocab_xent_backward(const dt_tensor *logits, const dt_tensor *labels, float dloss,
                                 dt_tensor **dlogits_out)
{
    static const char op[] = "dt_vocab_xent_backward";
    xent_state x;
    dt_status st = xent_prepare(op, logits, labels, dlogits_out, 0, &x);
    if (st != DT_OK)
        return st;
    dt_tensor *d = NULL;
    st = dt__tensor_empty(dt_tensor_layout(x.logits), DT_DTYPE_F32, dt_tensor_shape(logits), &d);
    float scale = x.rows > 0 ? dloss / (float)x.rows : 0.0f;
    vx_local vl = {&x, d, scale};
    if (st == DT_OK && x.whole) {
        /* Labels are checked by the kernel: one outcome over the clients. */
        st = dt__ops_each_local(x.be, d, rows_grad_one, &vl);
        if (st == DT_OK && x.be->sync)
            st = x.be->sync();
        st = dt__mesh_agree(dt_layout_mesh(dt_tensor_layout(x.logits)), st, op);
    } else if (st == DT_OK) {
        st = dt__ops_each_local(x.be, d, vgrad_one, &vl);
    }
    st = dt__ops_finish(x.be, op, NULL, st, &d, dlogits_out);
    xent_free(&x);
    return st;
}
