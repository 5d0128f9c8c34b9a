/* N-d matmul: a [..., k] x b [k, n] projections run as 2-D dt_matmul on zero-copy views that
 * flatten a's leading dims (so every 2-D layout rule applies to the rows), and batched products
 * a [..., m, k] x b [..., k, n] whose batch dims follow a's sharding with one GEMM per matrix. */
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/record.h"

/* The flattened 2-D view of x [d0, ..., n] (rank >= 2): x is first relaid out so that dims
 * 1..r-2 are unsharded and dim 0's blocks are whole rows of the flattened view. */
static dt_status flatten(const dt_tensor *x, dt_tensor **out)
{
    int r = dt_tensor_rank(x);
    const int64_t *s = dt_tensor_shape(x);
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(x));
    if (r == 2) {
        *out = dt_tensor_retain(x);
        return DT_OK;
    }
    dt__lspec ls;
    dt__lspec_of(dt_tensor_layout(x), &ls);
    int64_t inner = 1;
    for (int d = 1; d < r - 1; d++) {
        ls.spec[d] = -1;
        inner *= s[d];
    }
    if (!dt__rows_aligned(mesh, ls.spec[0], s[0], inner))
        ls.spec[0] = -1;
    dt_tensor *rx = NULL;
    dt_status st = dt__ensure_layout(x, &ls, &rx);
    if (st != DT_OK)
        return st;
    dt__lspec l2 = ls;
    l2.rank = 2;
    l2.spec[1] = ls.spec[r - 1];
    int64_t shape2[2] = {s[0] * inner, s[r - 1]};
    st = dt__tensor_view(rx, &l2, shape2, out);
    dt_tensor_destroy(rx);
    return st;
}

/* The inverse: a 2-D c [rows, n] back to [lead..., n] (lead from `like`, rank r). */
static dt_status unflatten(dt_tensor *c, const int64_t *lead, int r, dt_tensor **out)
{
    if (r == 2) {
        *out = dt_tensor_retain(c);
        return DT_OK;
    }
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(c));
    dt__lspec l2;
    dt__lspec_of(dt_tensor_layout(c), &l2);
    int64_t inner = 1, shape[DT_MAX_RANK];
    for (int d = 1; d < r - 1; d++)
        inner *= lead[d];
    dt_tensor *rc = NULL;
    if (!dt__rows_aligned(mesh, l2.spec[0], lead[0], inner)) {
        l2.spec[0] = -1;
        dt_status st = dt__ensure_layout(c, &l2, &rc);
        if (st != DT_OK)
            return st;
    } else {
        rc = dt_tensor_retain(c);
    }
    dt__lspec ls = l2;
    ls.rank = r;
    ls.spec[r - 1] = l2.spec[1];
    for (int d = 1; d < r - 1; d++)
        ls.spec[d] = -1;
    for (int d = 0; d < r - 1; d++)
        shape[d] = lead[d];
    shape[r - 1] = dt_tensor_shape(c)[1];
    dt_status st = dt__tensor_view(rc, &ls, shape, out);
    dt_tensor_destroy(rc);
    return st;
}

/* ---- projections whose rows are sharded inside (the sequence of context parallelism) ----
 * A sharded dim 1..r-2 of a (say T of [B, T, C] over `seq`) cannot be a block of the flattened
 * rows, so flatten() would gather it: every device of that mesh dim would compute all the
 * rows. Instead each device multiplies the rows it holds: one GEMM per local block, the rows
 * keeping a's sharding, the output's last dim b's n sharding (where no row dim uses that
 * mesh dim), partial (sum) over the mesh dim sharding k. */

/* 1 when a (rank >= 3, its partial dims aside) shards one of its dims 1..r-2. */
static int rows_sharded_inside(const dt_tensor *a)
{
    int r = dt_tensor_rank(a);
    dt__lspec ls;
    dt__lspec_of(dt_tensor_layout(a), &ls);
    for (int d = 1; d < r - 1; d++)
        if (ls.spec[d] >= 0)
            return 1;
    return 0;
}

/* The working layouts: a's rows as they are (partial reduced), k over km; b [k, n] (or
 * [n, k]) with k over km and n over wn; c [..., n] with n over wn, partial over km. */
typedef struct rw_plan {
    dt__lspec a, b, c;
    int km, wn;
} rw_plan;

static void rw_plan_of(const dt_tensor *a, const dt_tensor *b, int transb, rw_plan *p)
{
    int r = dt_tensor_rank(a);
    dt__lspec_of(dt_tensor_layout(a), &p->a);
    memset(p->a.partial, 0, sizeof p->a.partial);
    p->km = p->a.spec[r - 1];
    dt__lspec lb;
    dt__lspec_of(dt_tensor_layout(b), &lb);
    p->wn = lb.spec[transb ? 0 : 1];
    for (int d = 0; d < r; d++)
        if (p->wn >= 0 && p->a.spec[d] == p->wn)
            p->wn = -1;
    memset(&p->b, 0, sizeof p->b);
    p->b.rank = 2;
    p->b.spec[transb ? 1 : 0] = p->km;
    p->b.spec[transb ? 0 : 1] = p->wn;
    p->c = p->a;
    p->c.spec[r - 1] = p->wn;
    if (p->km >= 0)
        p->c.partial[p->km] = 1 + DT_REDUCE_SUM;
}

/* One local block's GEMM: c = op(x) op(y), x and y row-major with ldx, ldy their row
 * lengths (x's rows ... as the local shapes give them). */
typedef struct rw_local {
    const dt__ops_backend *be;
    const dt_tensor *x, *y, *c;
    int tx, ty;
} rw_local;

static int64_t last_dim(const dt_tensor *t, int i)
{
    const DLTensor *l = dt_tensor_local(t, i);
    return l->shape[l->ndim - 1];
}

static dt_status rw_one(int i, void *arg)
{
    const rw_local *w = arg;
    int64_t cn = last_dim(w->c, i), cm = cn ? dt__local_numel(w->c, i) / cn : 0;
    int64_t xn = last_dim(w->x, i), yn = last_dim(w->y, i);
    /* k: the summed length, from x's layout (its columns, or its rows when transposed) */
    int64_t k = w->tx ? (xn ? dt__local_numel(w->x, i) / xn : 0) : xn;
    if (cm == 0 || cn == 0)
        return DT_OK;
    if (k == 0) /* no rows here (an uneven shard): a zero summand */
        return w->be->fill(cm * cn, 0.0f, dt__local_data(w->c, i));
    return w->be->gemm(w->tx, w->ty, cm, cn, k, 1.0f, dt__local_data(w->x, i),
                       dt_tensor_dtype(w->x), xn > 1 ? xn : 1, dt__local_data(w->y, i),
                       dt_tensor_dtype(w->y), yn > 1 ? yn : 1, 0.0f, dt__local_data(w->c, i),
                       cn);
}

/* c = x op(y) (or op(x) op(y)) per local block into a new tensor of layout ls, shape shape. */
static dt_status rw_gemm(const char *op, const dt_tensor *x, const dt_tensor *y, int tx, int ty,
                         const dt__lspec *ls, const int64_t *shape, dt_tensor **out)
{
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(x));
    const dt__ops_backend *be = NULL;
    dt_status st = dt__ops_backend_for(mesh, op, &be);
    dt_tensor *c = NULL;
    if (st == DT_OK)
        st = dt__tensor_new(mesh, ls, DT_DTYPE_F32, shape, &c);
    rw_local w = {be, x, y, c, tx, ty};
    if (st == DT_OK)
        st = dt__ops_each_local(be, c, rw_one, &w);
    return dt__ops_finish(be, op, NULL, st, &c, out);
}

static dt_status rowwise(const char *op, const dt_tensor *a, const dt_tensor *b, int transb,
                         const dt_layout *layout, dt_tensor **out)
{
    int r = dt_tensor_rank(a);
    const int64_t *as = dt_tensor_shape(a), *bs = dt_tensor_shape(b);
    if (bs[transb] != as[r - 1])
        return dt__error(DT_ERR_SHAPE, "%s: inner dims differ (%lld and %lld)", op,
                         (long long)as[r - 1], (long long)bs[transb]);
    rw_plan p;
    rw_plan_of(a, b, transb, &p);
    int64_t cs[DT_MAX_RANK];
    memcpy(cs, as, sizeof(int64_t) * (size_t)r);
    cs[r - 1] = bs[1 - transb];
    dt_tensor *ra = NULL, *rb = NULL, *c = NULL;
    dt_status st = dt__ensure_layout(a, &p.a, &ra);
    if (st == DT_OK)
        st = dt__ensure_layout(b, &p.b, &rb);
    if (st == DT_OK)
        st = rw_gemm(op, ra, rb, 0, transb, &p.c, cs, &c);
    if (st == DT_OK)
        st = dt__finish_layout(op, layout, &c);
    dt_tensor_destroy(ra);
    dt_tensor_destroy(rb);
    if (st != DT_OK) {
        dt_tensor_destroy(c);
        return st;
    }
    *out = c;
    return DT_OK;
}

/* dA = dC op(b)^T in a's rows (partial over wn), dB = a^T dC (b [k, n]) or dC^T a ([n, k]),
 * partial over the mesh dims sharding a's rows; want_da / want_db say which. *da_out and
 * *db_out get what was made, also on failure (the caller destroys them then). */
static dt_status rowwise_backward(const char *op, const dt_tensor *a, const dt_tensor *b,
                                  int transb, const dt_tensor *dc, const dt_layout *da_layout,
                                  const dt_layout *db_layout, int want_da, int want_db,
                                  dt_tensor **da_out, dt_tensor **db_out)
{
    int r = dt_tensor_rank(a);
    rw_plan p;
    rw_plan_of(a, b, transb, &p);
    dt__lspec lc = p.c, la = p.a, lb = p.b;
    memset(lc.partial, 0, sizeof lc.partial);
    if (p.wn >= 0)
        la.partial[p.wn] = 1 + DT_REDUCE_SUM;
    for (int d = 0; d < r - 1; d++)
        if (p.a.spec[d] >= 0)
            lb.partial[p.a.spec[d]] = 1 + DT_REDUCE_SUM;
    dt_tensor *ra = NULL, *rb = NULL, *rdc = NULL, *da = NULL, *db = NULL;
    dt_status st = dt__ensure_layout(a, &p.a, &ra);
    if (st == DT_OK)
        st = dt__ensure_layout(b, &p.b, &rb);
    if (st == DT_OK)
        st = dt__ensure_layout(dc, &lc, &rdc);
    if (st == DT_OK && want_da)
        st = rw_gemm(op, rdc, rb, 0, !transb, &la, dt_tensor_shape(a), &da);
    if (st == DT_OK && want_da)
        st = dt__finish_layout(op, da_layout, &da);
    if (st == DT_OK && want_db)
        st = transb ? rw_gemm(op, rdc, ra, 1, 0, &lb, dt_tensor_shape(b), &db)
                    : rw_gemm(op, ra, rdc, 1, 0, &lb, dt_tensor_shape(b), &db);
    if (st == DT_OK && want_db)
        st = dt__finish_layout(op, db_layout, &db);
    dt_tensor_destroy(ra);
    dt_tensor_destroy(rb);
    dt_tensor_destroy(rdc);
    *da_out = da; /* the caller's, destroyed there on failure */
    *db_out = db;
    return st;
}

static dt_status check_proj(const char *op, const dt_tensor *a, const dt_tensor *b)
{
    dt_status st = dt__check_tensor(op, "a", a, NULL);
    if (st == DT_OK)
        st = dt__check_tensor(op, "b", b, a);
    if (st != DT_OK)
        return st;
    if (dt_tensor_rank(a) < 2 || dt_tensor_rank(b) < 2)
        return dt__error(DT_ERR_SHAPE, "%s: operands must have rank 2 or more (ranks %d and %d)",
                         op, dt_tensor_rank(a), dt_tensor_rank(b));
    return DT_OK;
}

/* The GEMMs of one local component of batched (dt__ops_each_local). */
typedef struct bmm_local {
    const dt__ops_backend *be;
    const dt_tensor *a, *b, *c;
    int transa, transb;
    int64_t m, n, k;
} bmm_local;

static dt_status bmm_one(int i, void *arg)
{
    const bmm_local *x = arg;
    int64_t m = x->m, n = x->n, k = x->k;
    int64_t count = dt__local_numel(x->c, i) / (m * n > 0 ? m * n : 1);
    if (m * n == 0 || count == 0)
        return DT_OK;
    size_t asz = dt_dtype_size(dt_tensor_dtype(x->a)), bsz = dt_dtype_size(dt_tensor_dtype(x->b));
    const char *pa = dt__local_data(x->a, i), *pb = dt__local_data(x->b, i);
    float *pc = dt__local_data(x->c, i);
    dt_status st = DT_OK;
    for (int64_t j = 0; st == DT_OK && j < count; j++)
        st = x->be->gemm(x->transa, x->transb, m, n, k, 1.0f, pa + (size_t)(j * m * k) * asz,
                         dt_tensor_dtype(x->a), x->transa ? m : k,
                         pb + (size_t)(j * k * n) * bsz, dt_tensor_dtype(x->b),
                         x->transb ? k : n, 0.0f, pc + j * m * n, n);
    return st;
}

/* Batched: leading dims of a and b equal; b is relaid out to a's batch sharding, the matrix
 * dims of both are gathered; one GEMM per local matrix. */
static dt_status batched(const char *op, const dt_tensor *a, const dt_tensor *b, int transa,
                         int transb, const dt_layout *layout, dt_tensor **out)
{
    int r = dt_tensor_rank(a);
    const int64_t *as = dt_tensor_shape(a), *bs = dt_tensor_shape(b);
    for (int d = 0; d < r - 2; d++)
        if (as[d] != bs[d])
            return dt__error(DT_ERR_SHAPE, "%s: batch dim %d differs (%lld and %lld)", op, d,
                             (long long)as[d], (long long)bs[d]);
    int64_t m = as[r - 2 + transa], k = as[r - 1 - transa], n = bs[r - 1 - transb];
    if (bs[r - 2 + transb] != k)
        return dt__error(DT_ERR_SHAPE, "%s: inner dims differ (%lld and %lld)", op, (long long)k,
                         (long long)bs[r - 2 + transb]);
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(a));
    const dt__ops_backend *be = NULL;
    dt_status st = dt__ops_backend_for(mesh, op, &be);
    if (st != DT_OK)
        return st;
    dt__lspec ls;
    dt__lspec_of(dt_tensor_layout(a), &ls);
    memset(ls.partial, 0, sizeof ls.partial);
    ls.spec[r - 2] = ls.spec[r - 1] = -1;
    dt_tensor *ra = NULL, *rb = NULL, *c = NULL;
    int64_t cshape[DT_MAX_RANK];
    memcpy(cshape, as, sizeof(int64_t) * (size_t)r);
    cshape[r - 2] = m;
    cshape[r - 1] = n;
    st = dt__ensure_layout(a, &ls, &ra);
    if (st == DT_OK)
        st = dt__ensure_layout(b, &ls, &rb);
    if (st == DT_OK)
        st = dt__tensor_new(mesh, &ls, DT_DTYPE_F32, cshape, &c);
    bmm_local bl = {be, ra, rb, c, transa, transb, m, n, k};
    if (st == DT_OK)
        st = dt__ops_each_local(be, c, bmm_one, &bl);
    st = dt__ops_finish(be, op, layout, st, &c, out);
    dt_tensor_destroy(rb);
    dt_tensor_destroy(ra);
    return st;
}

static dt_status matmul_nd_run(const dt_tensor *a, const dt_tensor *b, int transa, int transb,
                       const dt_layout *layout, dt_tensor **out)
{
    static const char op[] = "dt_matmul_nd";
    dt_status st = check_proj(op, a, b);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: out is NULL", op);
    if (st != DT_OK)
        return st;
    int r = dt_tensor_rank(a);
    if (layout && dt_layout_rank(layout) != (dt_tensor_rank(b) == 2 ? r : dt_tensor_rank(b)))
        return dt__error(DT_ERR_SHAPE, "%s: the requested output layout has rank %d", op,
                         dt_layout_rank(layout));
    if (dt_tensor_rank(b) > 2 || (r == 2 && transa)) {
        if (dt_tensor_rank(b) != r)
            return dt__error(DT_ERR_SHAPE, "%s: batched operands must have equal ranks (%d and "
                             "%d)", op, r, dt_tensor_rank(b));
        if (r == 2)
            return dt_matmul(a, b, transa, transb, layout, out);
        return batched(op, a, b, transa ? 1 : 0, transb ? 1 : 0, layout, out);
    }
    if (transa)
        return dt__error(DT_ERR_SHAPE, "%s: a projection [..., k] x [k, n] takes no transa", op);
    if (rows_sharded_inside(a))
        return rowwise(op, a, b, transb ? 1 : 0, layout, out);
    dt_tensor *a2 = NULL, *c2 = NULL, *c = NULL;
    st = flatten(a, &a2);
    if (st == DT_OK)
        st = dt_matmul(a2, b, 0, transb, NULL, &c2);
    if (st == DT_OK)
        st = unflatten(c2, dt_tensor_shape(a), r, &c);
    if (st == DT_OK)
        st = dt__finish_layout(op, layout, &c);
    if (st == DT_OK) {
        *out = c;
        c = NULL;
    }
    dt_tensor_destroy(c);
    dt_tensor_destroy(c2);
    dt_tensor_destroy(a2);
    return st;
}

/* The public entry: records the call on this thread's tape (runtime/record.h). */
dt_status dt_matmul_nd(const dt_tensor *a, const dt_tensor *b, int transa, int transb,
                       const dt_layout *layout, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = matmul_nd_run(a, b, transa, transb, layout, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_MATMUL_ND, .nin = 2, .in = {a, b}, .layout = layout, .iattr = {transa, transb}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_matmul_nd_backward(const dt_tensor *a, const dt_tensor *b, int transa, int transb,
                                const dt_tensor *dc, const dt_layout *da_layout,
                                const dt_layout *db_layout, dt_tensor **da_out,
                                dt_tensor **db_out)
{
    static const char op[] = "dt_matmul_nd_backward";
    dt_status st = check_proj(op, a, b);
    if (st == DT_OK)
        st = dt__check_tensor(op, "dc", dc, a);
    if (st != DT_OK)
        return st;
    int r = dt_tensor_rank(a);
    if (dt_tensor_rank(dc) != (dt_tensor_rank(b) == 2 ? r : dt_tensor_rank(b)))
        return dt__error(DT_ERR_SHAPE, "%s: dc has rank %d", op, dt_tensor_rank(dc));
    dt_tensor *da = NULL, *db = NULL;
    if (dt_tensor_rank(b) > 2 || (r == 2 && transa)) {
        /* C = op(A) op(B): dA = dC op(B)^T (or op(B) dC^T), dB = op(A)^T dC (or dC^T op(A)). */
        if (da_out)
            st = transa ? dt_matmul_nd(b, dc, transb, 1, da_layout, &da)
                        : dt_matmul_nd(dc, b, 0, !transb, da_layout, &da);
        if (st == DT_OK && db_out)
            st = transb ? dt_matmul_nd(dc, a, 1, transa, db_layout, &db)
                        : dt_matmul_nd(a, dc, !transa, 0, db_layout, &db);
    } else if (transa) {
        return dt__error(DT_ERR_SHAPE, "%s: a projection takes no transa", op);
    } else if (rows_sharded_inside(a)) {
        st = rowwise_backward(op, a, b, transb ? 1 : 0, dc, da_layout, db_layout, da_out != NULL,
                              db_out != NULL, &da, &db);
    } else {
        dt_tensor *a2 = NULL, *dc2 = NULL, *da2 = NULL;
        st = flatten(a, &a2);
        if (st == DT_OK)
            st = flatten(dc, &dc2);
        if (st == DT_OK)
            st = dt_matmul_backward(a2, b, 0, transb, dc2, NULL, db_layout, da_out ? &da2 : NULL,
                                    db_out ? &db : NULL);
        if (st == DT_OK && da_out)
            st = unflatten(da2, dt_tensor_shape(a), r, &da);
        if (st == DT_OK && da_out)
            st = dt__finish_layout(op, da_layout, &da);
        dt_tensor_destroy(da2);
        dt_tensor_destroy(dc2);
        dt_tensor_destroy(a2);
    }
    if (st != DT_OK) {
        dt_tensor_destroy(da);
        dt_tensor_destroy(db);
        return st;
    }
    if (da_out)
        *da_out = da;
    if (db_out)
        *db_out = db;
    return DT_OK;
}
