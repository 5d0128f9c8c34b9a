/* Distributed matmul and its backward: picks the cheapest valid pair of operand layouts
 * (data, column, row parallel and their combinations), relays the operands out to it and runs
 * the local GEMM on every device; the output is sharded / partial as the pair implies. */
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/record.h"

/* A candidate: mesh dims of op(A) = [m, k], op(B) = [k, n], and which partial dims each
 * operand keeps. */
typedef struct mm_plan {
    dt__lspec a, b, c;
} mm_plan;

static int dtype_ok(dt_dtype t)
{
    return t == DT_DTYPE_F32 || t == DT_DTYPE_F16 || t == DT_DTYPE_BF16;
}

/* Layout spec of the tensor (not of op(X)) with op-space mesh dims (r, c). */
static void set2(dt__lspec *ls, int trans, int r, int c)
{
    ls->rank = 2;
    ls->spec[trans ? 1 : 0] = r;
    ls->spec[trans ? 0 : 1] = c;
}

static double sum_compute(const dt_mesh *mesh, const int64_t mnk[3], const int dims[3])
{
    double total = 0.0;
    int64_t size = dt_mesh_size(mesh);
    for (int64_t p = 0; p < size; p++) {
        int64_t coords[DT_MESH_MAX_DIMS] = {0};
        dt_mesh_coords(mesh, p, coords);
        double f = 1.0;
        for (int i = 0; i < 3; i++) {
            int64_t len = mnk[i];
            if (dims[i] >= 0)
                dt_shard_range(mnk[i], dt_mesh_dim_size(mesh, dims[i]), coords[dims[i]], NULL,
                               &len);
            f *= (double)len;
        }
        total += f;
    }
    return total;
}

/* What a plan depends on: the mesh's shape (not its device ids), operand layouts, the
 * requested output, transposes, sizes and element sizes. */
typedef struct mm_key {
    int mesh_rank;
    int64_t mesh_dims[DT_MESH_MAX_DIMS];
    dt__lspec a, b, want;
    int have_want, transa, transb;
    int64_t mnk[3];
    size_t asz, bsz;
} mm_key;

/* Plans are searched once per key and kept per thread (training repeats the same shapes);
 * the search grows with the mesh size. */
#define PLAN_CACHE 32
static _Thread_local struct {
    mm_key key;
    mm_plan plan;
    int used;
} plan_cache[PLAN_CACHE];
static _Thread_local int plan_cache_next;

/* Searches every valid plan over the mesh dims in use and keeps the one with the least
 * traffic (bytes), then the least compute. */
static void search_plan(const dt_mesh *mesh, const dt_tensor *a, const dt_tensor *b, int transa,
                        int transb, const dt_layout *want, const int64_t mnk[3], mm_plan *best)
{
    dt__lspec la, lb, lw;
    dt__lspec_of(dt_tensor_layout(a), &la);
    dt__lspec_of(dt_tensor_layout(b), &lb);
    if (want)
        dt__lspec_of(want, &lw);
    int used[DT_MESH_MAX_DIMS] = {0}, nd = dt_mesh_rank(mesh);
    for (int i = 0; i < 2; i++) {
        if (la.spec[i] >= 0)
            used[la.spec[i]] = 1;
        if (lb.spec[i] >= 0)
            used[lb.spec[i]] = 1;
        if (want && lw.spec[i] >= 0)
            used[lw.spec[i]] = 1;
    }
    for (int d = 0; d < nd; d++)
        if (la.partial[d] || lb.partial[d] || (want && lw.partial[d]))
            used[d] = 1;
    int cand[DT_MESH_MAX_DIMS + 1], nc = 0;
    cand[nc++] = -1;
    for (int d = 0; d < nd; d++)
        if (used[d])
            cand[nc++] = d;
    const int64_t ashape[2] = {dt_tensor_shape(a)[0], dt_tensor_shape(a)[1]};
    const int64_t bshape[2] = {dt_tensor_shape(b)[0], dt_tensor_shape(b)[1]};
    const int64_t cshape[2] = {mnk[0], mnk[1]};
    const double asz = (double)dt_dtype_size(dt_tensor_dtype(a));
    const double bsz = (double)dt_dtype_size(dt_tensor_dtype(b));
    double best_traffic = -1.0, best_compute = 0.0;
    for (int im = 0; im < nc; im++)
        for (int ik = 0; ik < nc; ik++)
            for (int in = 0; in < nc; in++) {
                int m = cand[im], k = cand[ik], n = cand[in];
                if ((m >= 0 && (m == k || m == n)) || (k >= 0 && k == n))
                    continue;
                for (int keep = 0; keep < 4; keep++) {
                    mm_plan pl;
                    memset(&pl, 0, sizeof pl);
                    set2(&pl.a, transa, m, k);
                    set2(&pl.b, transb, k, n);
                    int ok = 1;
                    for (int d = 0; d < nd && ok; d++) {
                        int pa = (keep & 1) ? la.partial[d] : 0;
                        int pb = (keep & 2) ? lb.partial[d] : 0;
                        if (!pa && !pb)
                            continue;
                        /* Kept partials must be sums, on mesh dims no one else uses. */
                        if ((pa && pa != 1) || (pb && pb != 1) || (pa && pb) || d == m ||
                            d == k || d == n)
                            ok = 0;
                        pl.a.partial[d] = pa;
                        pl.b.partial[d] = pb;
                        pl.c.partial[d] = 1;
                    }
                    if (!ok || ((keep & 1) && !dt__lspec_has_partial(&la)) ||
                        ((keep & 2) && !dt__lspec_has_partial(&lb)))
                        continue;
                    pl.c.rank = 2;
                    pl.c.spec[0] = m;
                    pl.c.spec[1] = n;
                    if (k >= 0)
                        pl.c.partial[k] = 1;
                    double traffic = asz * dt__relayout_cost(mesh, ashape, &la, &pl.a) +
                                     bsz * dt__relayout_cost(mesh, bshape, &lb, &pl.b);
                    if (want)
                        traffic += 4.0 * dt__relayout_cost(mesh, cshape, &pl.c, &lw);
                    int dims[3] = {m, n, k};
                    double compute = sum_compute(mesh, mnk, dims);
                    if (best_traffic < 0.0 || traffic < best_traffic ||
                        (traffic == best_traffic && compute < best_compute)) {
                        best_traffic = traffic;
                        best_compute = compute;
                        *best = pl;
                    }
                }
            }
}

static void choose_plan(const dt_mesh *mesh, const dt_tensor *a, const dt_tensor *b, int transa,
                        int transb, const dt_layout *want, const int64_t mnk[3], mm_plan *best)
{
    mm_key key;
    memset(&key, 0, sizeof key);    /* padding too: keys compare with memcmp */
    key.mesh_rank = dt_mesh_rank(mesh);
    for (int d = 0; d < key.mesh_rank; d++)
        key.mesh_dims[d] = dt_mesh_dim_size(mesh, d);
    dt__lspec_of(dt_tensor_layout(a), &key.a);
    dt__lspec_of(dt_tensor_layout(b), &key.b);
    if (want)
        dt__lspec_of(want, &key.want);
    key.have_want = want != NULL;
    key.transa = transa;
    key.transb = transb;
    memcpy(key.mnk, mnk, sizeof key.mnk);
    key.asz = dt_dtype_size(dt_tensor_dtype(a));
    key.bsz = dt_dtype_size(dt_tensor_dtype(b));
    for (int i = 0; i < PLAN_CACHE; i++)
        if (plan_cache[i].used && memcmp(&plan_cache[i].key, &key, sizeof key) == 0) {
            *best = plan_cache[i].plan;
            return;
        }
    search_plan(mesh, a, b, transa, transb, want, mnk, best);
    int slot = plan_cache_next;
    plan_cache_next = (plan_cache_next + 1) % PLAN_CACHE;
    memcpy(&plan_cache[slot].key, &key, sizeof key);
    plan_cache[slot].plan = *best;
    plan_cache[slot].used = 1;
}

/* One local GEMM of matmul_run, component i (dt__ops_each_local). */
typedef struct mm_local {
    const dt__ops_backend *be;
    const dt_tensor *a, *b, *c;
    int transa, transb;
} mm_local;

static dt_status mm_one(int i, void *arg)
{
    const mm_local *x = arg;
    const DLTensor *la = dt_tensor_local(x->a, i), *lb = dt_tensor_local(x->b, i);
    const DLTensor *lc = dt_tensor_local(x->c, i);
    int64_t m = lc->shape[0], n = lc->shape[1], k = la->shape[1 - x->transa];
    if (m == 0 || n == 0)
        return DT_OK;
    return x->be->gemm(x->transa, x->transb, m, n, k, 1.0f, dt__local_data(x->a, i),
                       dt_tensor_dtype(x->a), la->shape[1] > 1 ? la->shape[1] : 1,
                       dt__local_data(x->b, i), dt_tensor_dtype(x->b),
                       lb->shape[1] > 1 ? lb->shape[1] : 1, 0.0f, dt__local_data(x->c, i), n);
}

static dt_status matmul_run(const dt_tensor *a, const dt_tensor *b, int transa, int transb,
                    const dt_layout *layout, dt_tensor **out)
{
    static const char op[] = "dt_matmul";
    dt_status st = dt__check_tensor(op, "a", a, NULL);
    if (st == DT_OK)
        st = dt__check_tensor(op, "b", b, a);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: out is NULL", op);
    if (st != DT_OK)
        return st;
    if (dt_tensor_rank(a) != 2 || dt_tensor_rank(b) != 2)
        return dt__error(DT_ERR_SHAPE, "%s: operands must be 2-D (ranks %d and %d)", op,
                         dt_tensor_rank(a), dt_tensor_rank(b));
    if (!dtype_ok(dt_tensor_dtype(a)) || !dtype_ok(dt_tensor_dtype(b)))
        return dt__error(DT_ERR_SHAPE, "%s: operand dtypes %s x %s (f32, f16 or bf16 expected)",
                         op, dt_dtype_name(dt_tensor_dtype(a)),
                         dt_dtype_name(dt_tensor_dtype(b)));
    transa = transa ? 1 : 0;
    transb = transb ? 1 : 0;
    const int64_t *as = dt_tensor_shape(a), *bs = dt_tensor_shape(b);
    int64_t mnk[3] = {as[transa], bs[1 - transb], as[1 - transa]};
    if (bs[transb] != mnk[2])
        return dt__error(DT_ERR_SHAPE, "%s: inner dims differ: op(a) is [%lld,%lld], op(b) is "
                         "[%lld,%lld] (transa=%d, transb=%d)", op, (long long)mnk[0],
                         (long long)mnk[2], (long long)bs[transb], (long long)mnk[1], transa,
                         transb);
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(a));
    if (layout && (!dt_mesh_equal(dt_layout_mesh(layout), mesh) || dt_layout_rank(layout) != 2))
        return dt__error(DT_ERR_SHAPE, "%s: the requested output layout must be 2-D on the "
                         "operands' mesh", op);
    const dt__ops_backend *be = NULL;
    st = dt__ops_backend_for(mesh, op, &be);
    if (st != DT_OK)
        return st;

    mm_plan pl;
    choose_plan(mesh, a, b, transa, transb, layout, mnk, &pl);
    dt_tensor *ra = NULL, *rb = NULL, *c = NULL;
    st = dt__ensure_layout(a, &pl.a, &ra);
    if (st != DT_OK)
        goto done;
    st = dt__ensure_layout(b, &pl.b, &rb);
    if (st != DT_OK)
        goto done;
    int64_t cshape[2] = {mnk[0], mnk[1]};
    st = dt__tensor_new(mesh, &pl.c, DT_DTYPE_F32, cshape, &c);
    if (st != DT_OK)
        goto done;
    mm_local ml = {be, ra, rb, c, transa, transb};
    st = dt__ops_each_local(be, c, mm_one, &ml);
    st = dt__ops_finish(be, op, layout, st, &c, out);
done:
    dt_tensor_destroy(c);
    dt_tensor_destroy(rb);
    dt_tensor_destroy(ra);
    return st;
}

/* The public entry: records the call on this thread's tape (runtime/record.h). */
dt_status dt_matmul(const dt_tensor *a, const dt_tensor *b, int transa, int transb,
                    const dt_layout *layout, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = matmul_run(a, b, transa, transb, layout, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_MATMUL, .nin = 2, .in = {a, b}, .layout = layout, .iattr = {transa, transb}};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_matmul_backward(const dt_tensor *a, const dt_tensor *b, int transa, int transb,
                             const dt_tensor *dc, const dt_layout *da_layout,
                             const dt_layout *db_layout, dt_tensor **da_out,
                             dt_tensor **db_out)
{
    static const char op[] = "dt_matmul_backward";
    dt_status st = dt__check_tensor(op, "a", a, NULL);
    if (st == DT_OK)
        st = dt__check_tensor(op, "b", b, a);
    if (st == DT_OK)
        st = dt__check_tensor(op, "dc", dc, a);
    if (st != DT_OK)
        return st;
    if (dt_tensor_rank(a) != 2 || dt_tensor_rank(b) != 2 || dt_tensor_rank(dc) != 2)
        return dt__error(DT_ERR_SHAPE, "%s: a, b and dc must be 2-D", op);
    transa = transa ? 1 : 0;
    transb = transb ? 1 : 0;
    const int64_t *as = dt_tensor_shape(a), *bs = dt_tensor_shape(b), *cs = dt_tensor_shape(dc);
    if (cs[0] != as[transa] || cs[1] != bs[1 - transb])
        return dt__error(DT_ERR_SHAPE, "%s: dc is [%lld,%lld], the product is [%lld,%lld]", op,
                         (long long)cs[0], (long long)cs[1], (long long)as[transa],
                         (long long)bs[1 - transb]);
    dt_tensor *da = NULL, *db = NULL;
    /* C = op(A) op(B):  dA = dC op(B)^T  (or op(B) dC^T for transposed A);
     *                   dB = op(A)^T dC  (or dC^T op(A) for transposed B). */
    if (da_out) {
        st = transa ? dt_matmul(b, dc, transb, 1, da_layout, &da)
                    : dt_matmul(dc, b, 0, !transb, da_layout, &da);
        if (st != DT_OK)
            return st;
    }
    if (db_out) {
        st = transb ? dt_matmul(dc, a, 1, transa, db_layout, &db)
                    : dt_matmul(a, dc, !transa, 0, db_layout, &db);
        if (st != DT_OK) {
            dt_tensor_destroy(da);
            return st;
        }
    }
    if (da_out)
        *da_out = da;
    if (db_out)
        *db_out = db;
    return DT_OK;
}
