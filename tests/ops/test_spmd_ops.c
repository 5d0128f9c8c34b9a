/* Distributed elementwise ops, bias, activations, softmax cross-entropy, reductions, casts,
 * inf/NaN detection and optimizer steps against single-device results on the whole tensors;
 * natural output layouts; backward passes by central finite differences. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ops_test_util.h"

#define R 9
#define C 6

static int partial_dim(const dt_tensor *t, dt_reduce_op *op)
{
    if (dt_layout_num_partial(dt_tensor_layout(t)) != 1)
        return -1;
    int d = -1;
    DT_ASSERT_OK(dt_layout_partial(dt_tensor_layout(t), 0, &d, op));
    return d;
}

typedef dt_status (*binop)(const dt_tensor *, const dt_tensor *, const dt_layout *,
                           dt_tensor **);
typedef dt_status (*kbinop)(int64_t, const float *, const float *, float *);

static void test_binary_ops_match_local_kernels_in_any_layouts(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C};
    float a[R * C], b[R * C], ref[R * C], got[R * C];
    ot_fill_int(a, R * C, -5, 5, 1);
    ot_fill_int(b, R * C, -5, 5, 2);
    dt_layout *ls[5] = {dt_test_layout(m, 2, "b", NULL, NULL), dt_test_layout(m, 2, NULL, NULL, NULL),
                        dt_test_layout(m, 2, "m", "b", NULL), dt_test_layout(m, 2, "b", NULL, "m"),
                        dt_test_layout(m, 2, NULL, "m", "b")};
    binop ops[3] = {dt_add, dt_sub, dt_mul};
    kbinop kops[3] = {dt_kernel_add, dt_kernel_sub, dt_kernel_mul};
    for (int o = 0; o < 3; o++) {
        DT_ASSERT_OK(kops[o](R * C, a, b, ref));
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 5; j++) {
                /* Every pair for add; for sub and mul, equal and neighbouring layouts. */
                if (o > 0 && j != i && j != (i + 1) % 5)
                    continue;
                dt_tensor *ta = ot_tensor(ls[i], DT_DTYPE_F32, shape, a);
                dt_tensor *tb = ot_tensor(ls[j], DT_DTYPE_F32, shape, b);
                dt_tensor *c = NULL;
                DT_ASSERT_OK(ops[o](ta, tb, NULL, &c));
                ot_fetch(c, got);
                CU_ASSERT_EQUAL(ot_mismatches("binary", got, ref, R * C, 0, 0), 0);
                if (i == j && o < 2)    /* equal layouts: no relayout, same layout out */
                    CU_ASSERT(dt_layout_equal(dt_tensor_layout(c), ls[i]));
                if (o == 2)
                    CU_ASSERT(!ot_is_partial(c));
                dt_tensor_destroy(c);
                if (o > 0) {
                    dt_tensor_destroy(ta);
                    dt_tensor_destroy(tb);
                    continue;
                }
                /* Requested layout. */
                DT_ASSERT_OK(ops[o](ta, tb, ls[(i + j) % 5], &c));
                CU_ASSERT(dt_layout_equal(dt_tensor_layout(c), ls[(i + j) % 5]));
                ot_fetch(c, got);
                CU_ASSERT_EQUAL(ot_mismatches("binary requested", got, ref, R * C, 0, 0), 0);
                dt_tensor_destroy(c);
                dt_tensor_destroy(ta);
                dt_tensor_destroy(tb);
            }
    }
    /* Sharded a, replicated b: the output keeps a's sharding (slicing b is free). */
    dt_tensor *ta = ot_tensor(ls[0], DT_DTYPE_F32, shape, a);
    dt_tensor *tb = ot_tensor(ls[1], DT_DTYPE_F32, shape, b);
    dt_tensor *c = NULL;
    DT_ASSERT_OK(dt_add(tb, ta, NULL, &c));
    CU_ASSERT(dt_layout_equal(dt_tensor_layout(c), ls[0]));
    dt_tensor_destroy(c);
    dt_tensor_destroy(ta);
    dt_tensor_destroy(tb);
    for (int i = 0; i < 5; i++)
        dt_layout_destroy(ls[i]);
    dt_mesh_destroy(m);
}

static void test_scale_and_axpy_keep_partial_sums(void)
{
    dt_mesh *m = ot_mesh_1d();
    int64_t shape[2] = {R, C};
    float x[R * C], y[R * C], ref[R * C], got[R * C];
    ot_fill_int(x, R * C, -5, 5, 3);
    ot_fill_int(y, R * C, -5, 5, 4);
    dt_layout *lp = dt_test_layout(m, 2, NULL, NULL, "x"), *ls = dt_test_layout(m, 2, "x", NULL, NULL);
    dt_tensor *tx = ot_tensor(lp, DT_DTYPE_F32, shape, x), *out = NULL;
    DT_ASSERT_OK(dt_scale(tx, -2.0f, &out));
    CU_ASSERT(dt_layout_equal(dt_tensor_layout(out), lp));
    DT_ASSERT_OK(dt_kernel_scale(R * C, -2.0f, x, ref));
    ot_fetch(out, got);
    CU_ASSERT_EQUAL(ot_mismatches("scale", got, ref, R * C, 0, 0), 0);
    dt_tensor_destroy(out);
    /* y (sharded) += 3 x (partial): x is reduce-scattered into y's layout. */
    dt_tensor *ty = ot_tensor(ls, DT_DTYPE_F32, shape, y);
    DT_ASSERT_OK(dt_axpy(3.0f, tx, ty));
    CU_ASSERT(dt_layout_equal(dt_tensor_layout(ty), ls));
    memcpy(ref, y, sizeof ref);
    DT_ASSERT_OK(dt_kernel_axpy(R * C, 3.0f, x, ref));
    ot_fetch(ty, got);
    CU_ASSERT_EQUAL(ot_mismatches("axpy", got, ref, R * C, 0, 0), 0);
    dt_tensor_destroy(ty);
    dt_tensor_destroy(tx);
    dt_layout_destroy(lp);
    dt_layout_destroy(ls);
    dt_mesh_destroy(m);
}

static void test_bias_add_and_grad_follow_the_last_dim(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C}, bshape[1] = {C};
    float x[R * C], bias[C], ref[R * C], got[R * C], dbref[C], db[C];
    ot_fill_int(x, R * C, -5, 5, 5);
    ot_fill_int(bias, C, -5, 5, 6);
    dt_layout *lx = dt_test_layout(m, 2, "b", "m", NULL), *lb = dt_test_layout(m, 1, NULL, NULL, NULL);
    dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, shape, x);
    dt_tensor *tb = ot_tensor(lb, DT_DTYPE_F32, bshape, bias);
    dt_tensor *y = NULL;
    DT_ASSERT_OK(dt_bias_add(tx, tb, &y));
    CU_ASSERT(dt_layout_equal(dt_tensor_layout(y), lx));
    memcpy(ref, x, sizeof ref);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++)
            ref[i * C + j] += bias[j];
    ot_fetch(y, got);
    CU_ASSERT_EQUAL(ot_mismatches("bias_add", got, ref, R * C, 0, 0), 0);
    /* db = column sums of dy: sharded on m like dy's last dim, partial over b. */
    dt_tensor *g = NULL;
    DT_ASSERT_OK(dt_bias_grad(tx, NULL, &g));
    dt_reduce_op op;
    CU_ASSERT_EQUAL(ot_spec(g, 0), 1);
    CU_ASSERT_EQUAL(partial_dim(g, &op), 0);
    for (int j = 0; j < C; j++) {
        dbref[j] = 0;
        for (int i = 0; i < R; i++)
            dbref[j] += x[i * C + j];
    }
    ot_fetch(g, db);
    CU_ASSERT_EQUAL(ot_mismatches("bias_grad", db, dbref, C, 0, 0), 0);
    dt_tensor_destroy(g);
    DT_ASSERT_OK(dt_bias_grad(tx, lb, &g));
    CU_ASSERT(dt_layout_is_replicated(dt_tensor_layout(g)));
    dt_tensor_destroy(g);
    /* A partial x stays partial: the bias is added on one member of each group only. */
    dt_layout *lxp = dt_test_layout(m, 2, NULL, "m", "b");
    dt_tensor *txp = ot_tensor(lxp, DT_DTYPE_F32, shape, x), *yp = NULL;
    DT_ASSERT_OK(dt_bias_add(txp, tb, &yp));
    CU_ASSERT(dt_layout_equal(dt_tensor_layout(yp), lxp));
    ot_fetch(yp, got);
    CU_ASSERT_EQUAL(ot_mismatches("bias_add partial", got, ref, R * C, 0, 0), 0);
    dt_tensor_destroy(yp);
    dt_tensor_destroy(txp);
    dt_layout_destroy(lxp);
    dt_tensor_destroy(y);
    dt_tensor_destroy(tx);
    dt_tensor_destroy(tb);
    dt_layout_destroy(lx);
    dt_layout_destroy(lb);
    dt_mesh_destroy(m);
}

/* Activations: forward and backward against the local kernels; backward also against
 * central differences of the distributed forward of L = sum(g * act(x)). */
static double act_loss(int gelu, const dt_tensor *x, const float *g)
{
    dt_tensor *y = NULL;
    DT_ASSERT_OK(gelu ? dt_gelu(x, &y) : dt_relu(x, &y));
    float v[R * C];
    ot_fetch(y, v);
    dt_tensor_destroy(y);
    double s = 0;
    for (int i = 0; i < R * C; i++)
        s += (double)g[i] * v[i];
    return s;
}

static void test_activations_and_backward_match_finite_differences(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C};
    float x[R * C], g[R * C], ref[R * C], got[R * C];
    ot_fill_real(x, R * C, -3, 3, 7);
    ot_fill_real(g, R * C, -1, 1, 8);
    for (int i = 0; i < R * C; i++)   /* keep ReLU probes away from the kink */
        if (fabsf(x[i]) < 0.1f)
            x[i] = 0.5f;
    dt_layout *lx = dt_test_layout(m, 2, "m", "b", NULL), *lg = dt_test_layout(m, 2, "b", NULL, NULL);
    for (int gelu = 0; gelu < 2; gelu++) {
        dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, shape, x);
        dt_tensor *tg = ot_tensor(lg, DT_DTYPE_F32, shape, g);
        dt_tensor *y = NULL, *dx = NULL;
        DT_ASSERT_OK(gelu ? dt_gelu(tx, &y) : dt_relu(tx, &y));
        CU_ASSERT(dt_layout_equal(dt_tensor_layout(y), lx));
        DT_ASSERT_OK(gelu ? dt_kernel_gelu(R * C, x, ref) : dt_kernel_relu(R * C, x, ref));
        ot_fetch(y, got);
        CU_ASSERT_EQUAL(ot_mismatches("act", got, ref, R * C, 0, 0), 0);
        DT_ASSERT_OK(gelu ? dt_gelu_backward(tx, tg, &dx) : dt_relu_backward(tx, tg, &dx));
        CU_ASSERT(dt_layout_equal(dt_tensor_layout(dx), lx));
        ot_fetch(dx, got);
        DT_ASSERT_OK(gelu ? dt_kernel_gelu_grad(R * C, x, g, ref)
                          : dt_kernel_relu_grad(R * C, x, g, ref));
        CU_ASSERT_EQUAL(ot_mismatches("act grad", got, ref, R * C, 0, 0), 0);
        const float eps = 1e-2f;
        for (int p = 0; p < 6; p++) {
            int i = (p * 11 + 3) % (R * C);
            float save = x[i];
            x[i] = save + eps;
            dt_tensor *xp = ot_tensor(lx, DT_DTYPE_F32, shape, x);
            x[i] = save - eps;
            dt_tensor *xm = ot_tensor(lx, DT_DTYPE_F32, shape, x);
            x[i] = save;
            double fd = (act_loss(gelu, xp, g) - act_loss(gelu, xm, g)) / (2.0 * eps);
            if (fabs(fd - got[i]) > 2e-3 * (1 + fabs(fd)))
                fprintf(stderr, "act %d element %d: fd %g analytic %g\n", gelu, i, fd,
                        (double)got[i]);
            CU_ASSERT(fabs(fd - got[i]) <= 2e-3 * (1 + fabs(fd)));
            dt_tensor_destroy(xp);
            dt_tensor_destroy(xm);
        }
        dt_tensor_destroy(dx);
        dt_tensor_destroy(y);
        dt_tensor_destroy(tx);
        dt_tensor_destroy(tg);
    }
    dt_layout_destroy(lx);
    dt_layout_destroy(lg);
    dt_mesh_destroy(m);
}

/* Mean cross-entropy in f64, written independently of the kernels. */
static double ref_xent(const float *x, const int32_t *lab, int rows, int classes)
{
    double total = 0;
    for (int i = 0; i < rows; i++) {
        double mx = x[i * classes], s = 0;
        for (int j = 1; j < classes; j++)
            mx = fmax(mx, x[i * classes + j]);
        for (int j = 0; j < classes; j++)
            s += exp(x[i * classes + j] - mx);
        total += mx + log(s) - x[i * classes + lab[i]];
    }
    return total / rows;
}

static void test_softmax_xent_loss_and_grad_in_any_layout(void)
{
    dt_mesh *m = ot_mesh_2d();
    enum { ROWS = 11, CL = 7 };
    int64_t shape[2] = {ROWS, CL}, lshape[1] = {ROWS};
    float x[ROWS * CL], d[ROWS * CL];
    int32_t lab[ROWS];
    ot_fill_real(x, ROWS * CL, -4, 4, 9);
    x[0] = 80.0f;    /* a large logit: stability */
    for (int i = 0; i < ROWS; i++)
        lab[i] = (i * 5 + 2) % CL;
    double want = ref_xent(x, lab, ROWS, CL);
    dt_layout *lls[3] = {dt_test_layout(m, 2, "b", NULL, NULL), dt_test_layout(m, 2, "b", "m", NULL),
                         dt_test_layout(m, 2, NULL, "m", NULL)};
    dt_layout *llab = dt_test_layout(m, 1, "m", NULL, NULL);
    dt_tensor *tl = ot_tensor(llab, DT_DTYPE_I32, lshape, lab);
    for (int k = 0; k < 3; k++) {
        dt_tensor *tx = ot_tensor(lls[k], DT_DTYPE_F32, shape, x), *loss = NULL, *dx = NULL;
        DT_ASSERT_OK(dt_softmax_xent(tx, tl, NULL, &loss));
        CU_ASSERT_EQUAL(dt_tensor_rank(loss), 0);
        dt_reduce_op op;
        CU_ASSERT_EQUAL(partial_dim(loss, &op), k < 2 ? 0 : -1);
        double v = 0;
        DT_ASSERT_OK(dt_item(loss, &v));
        CU_ASSERT(fabs(v - want) < 1e-5 * (1 + fabs(want)));
        DT_ASSERT_OK(dt_softmax_xent_backward(tx, tl, 2.0f, &dx));
        CU_ASSERT_EQUAL(ot_spec(dx, 0), k < 2 ? 0 : -1);
        CU_ASSERT_EQUAL(ot_spec(dx, 1), -1);
        ot_fetch(dx, d);
        /* Rows of the gradient: 2/rows * (softmax - onehot); each row sums to 0. */
        for (int i = 0; i < ROWS; i++) {
            double s = 0;
            for (int j = 0; j < CL; j++)
                s += d[i * CL + j];
            CU_ASSERT(fabs(s) < 1e-6);
        }
        const float eps = 1e-2f;
        for (int p = 0; p < 5; p++) {
            int i = (p * 13 + 4) % (ROWS * CL);
            float save = x[i];
            x[i] = save + eps;
            double lp = ref_xent(x, lab, ROWS, CL);
            x[i] = save - eps;
            double lm = ref_xent(x, lab, ROWS, CL);
            x[i] = save;
            double fd = 2.0 * (lp - lm) / (2.0 * eps);
            CU_ASSERT(fabs(fd - d[i]) < 1e-4);
        }
        dt_tensor_destroy(dx);
        dt_tensor_destroy(loss);
        dt_tensor_destroy(tx);
    }
    /* Labels out of range are an error on the client that holds them... everywhere here
     * since the labels are replicated over m's peers: skip in multi-process runs. */
    dt_tensor_destroy(tl);
    for (int k = 0; k < 3; k++)
        dt_layout_destroy(lls[k]);
    dt_layout_destroy(llab);
    dt_mesh_destroy(m);
}

static void test_reductions_are_partial_over_sharded_dims(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C};
    float x[R * C], got[R * C];
    ot_fill_int(x, R * C, -9, 9, 10);
    dt_layout *lx = dt_test_layout(m, 2, "b", "m", NULL);
    dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, shape, x);
    dt_reduce_op ops[4] = {DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_MIN, DT_REDUCE_AVG};
    for (int o = 0; o < 4; o++)
        for (int axis = -1; axis < 3; axis++) {
            int ax = axis == 2 ? DT_ALL_AXES : axis;
            dt_tensor *y = NULL;
            DT_ASSERT_OK(dt_reduce(tx, ops[o], ax, NULL, &y));
            /* Brute force: axis 0 -> C values, axis 1 (== -1) -> R values, all -> 1. */
            int red0 = axis == 0 || axis == 2, red1 = axis != 0;
            int n = (red0 ? 1 : R) * (red1 ? 1 : C);
            float ref[R * C];
            for (int i = 0; i < n; i++) {
                double acc = ops[o] == DT_REDUCE_MAX ? -INFINITY
                           : ops[o] == DT_REDUCE_MIN ? INFINITY : 0;
                int cnt = 0;
                for (int r = 0; r < R; r++)
                    for (int c = 0; c < C; c++) {
                        int idx = red0 ? (red1 ? 0 : c) : r;
                        if (idx != i)
                            continue;
                        double v = x[r * C + c];
                        acc = ops[o] == DT_REDUCE_MAX ? fmax(acc, v)
                            : ops[o] == DT_REDUCE_MIN ? fmin(acc, v) : acc + v;
                        cnt++;
                    }
                ref[i] = (float)(ops[o] == DT_REDUCE_AVG ? acc / cnt : acc);
            }
            CU_ASSERT_EQUAL(dt_tensor_numel(y), n);
            ot_fetch(y, got);
            CU_ASSERT_EQUAL(ot_mismatches("reduce", got, ref, n, 1e-6f, 1e-6f), 0);
            if (axis == 0) {    /* dim 0 was sharded on b: partial over b */
                dt_reduce_op pop;
                CU_ASSERT_EQUAL(partial_dim(y, &pop), 0);
                CU_ASSERT_EQUAL(pop, ops[o] == DT_REDUCE_AVG ? DT_REDUCE_SUM : ops[o]);
                CU_ASSERT_EQUAL(ot_spec(y, 0), 1);
            }
            dt_tensor_destroy(y);
        }
    /* A sum-partial input stays partial through a sum: partial over b and m. */
    dt_layout *lpx = dt_test_layout(m, 2, "m", NULL, "b");
    dt_tensor *tpx = ot_tensor(lpx, DT_DTYPE_F32, shape, x), *yp = NULL;
    DT_ASSERT_OK(dt_reduce(tpx, DT_REDUCE_SUM, 0, NULL, &yp));
    CU_ASSERT_EQUAL(dt_layout_num_partial(dt_tensor_layout(yp)), 2);
    float colsum[C];
    for (int c = 0; c < C; c++) {
        colsum[c] = 0;
        for (int r = 0; r < R; r++)
            colsum[c] += x[r * C + c];
    }
    ot_fetch(yp, got);
    CU_ASSERT_EQUAL(ot_mismatches("reduce partial", got, colsum, C, 0, 0), 0);
    dt_tensor_destroy(yp);
    dt_tensor_destroy(tpx);
    dt_layout_destroy(lpx);
    /* Requested replicated output, and the squared norm. */
    dt_layout *rep = dt_test_layout(m, 1, NULL, NULL, NULL);
    dt_tensor *y = NULL;
    DT_ASSERT_OK(dt_reduce(tx, DT_REDUCE_SUM, 0, rep, &y));
    CU_ASSERT(dt_layout_is_replicated(dt_tensor_layout(y)));
    dt_tensor_destroy(y);
    double sq = 0, v = 0;
    for (int i = 0; i < R * C; i++)
        sq += (double)x[i] * x[i];
    DT_ASSERT_OK(dt_sq_norm(tx, NULL, &y));
    CU_ASSERT_EQUAL(dt_layout_num_partial(dt_tensor_layout(y)), 2);
    DT_ASSERT_OK(dt_item(y, &v));
    CU_ASSERT_EQUAL(v, sq);
    dt_tensor_destroy(y);
    DT_ASSERT_FAILS(dt_reduce(tx, DT_REDUCE_SUM, 2, NULL, &y), DT_ERR_INVALID_ARGUMENT);
    dt_layout_destroy(rep);
    dt_tensor_destroy(tx);
    dt_layout_destroy(lx);
    dt_mesh_destroy(m);
}

static void test_nonfinite_found_on_every_client(void)
{
    dt_mesh *m = ot_mesh_1d();
    int64_t shape[2] = {R, C};
    float x[R * C];
    ot_fill_int(x, R * C, -9, 9, 12);
    dt_layout *lx = dt_test_layout(m, 2, "x", NULL, NULL);
    dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, shape, x);
    int found = -1;
    DT_ASSERT_OK(dt_nonfinite(tx, &found));
    CU_ASSERT_EQUAL(found, 0);
    dt_tensor_destroy(tx);
    x[R * C - 1] = INFINITY;    /* on the last shard only */
    tx = ot_tensor(lx, DT_DTYPE_F32, shape, x);
    DT_ASSERT_OK(dt_nonfinite(tx, &found));
    CU_ASSERT_EQUAL(found, 1);
    /* Through a cast to f16: a NaN survives, so does the inf. */
    dt_tensor *h = NULL;
    DT_ASSERT_OK(dt_cast(tx, DT_DTYPE_F16, &h));
    CU_ASSERT(dt_layout_equal(dt_tensor_layout(h), lx));
    DT_ASSERT_OK(dt_nonfinite(h, &found));
    CU_ASSERT_EQUAL(found, 1);
    dt_tensor_destroy(h);
    dt_tensor_destroy(tx);
    dt_layout_destroy(lx);
    dt_mesh_destroy(m);
}

static void test_cast_round_trips_small_integers(void)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t shape[2] = {R, C};
    float x[R * C], got[R * C];
    ot_fill_int(x, R * C, -200, 200, 13);
    dt_layout *lx = dt_test_layout(m, 2, "m", "b", NULL);
    dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, shape, x);
    dt_dtype ts[3] = {DT_DTYPE_F16, DT_DTYPE_BF16, DT_DTYPE_F64};
    for (int i = 0; i < 3; i++) {
        dt_tensor *h = NULL, *back = NULL;
        DT_ASSERT_OK(dt_cast(tx, ts[i], &h));
        CU_ASSERT_EQUAL(dt_tensor_dtype(h), ts[i]);
        DT_ASSERT_OK(dt_cast(h, DT_DTYPE_F32, &back));
        ot_fetch(back, got);
        CU_ASSERT_EQUAL(ot_mismatches("cast", got, x, R * C, 0, 0), 0);
        dt_tensor_destroy(h);
        dt_tensor_destroy(back);
    }
    dt_tensor *bad = NULL;
    DT_ASSERT_FAILS(dt_cast(tx, DT_DTYPE_I32, &bad), DT_ERR_UNSUPPORTED);
    dt_tensor_destroy(tx);
    dt_layout_destroy(lx);
    dt_mesh_destroy(m);
}

/* ZeRO-like steps: parameters sharded, the gradient partial over the same mesh dim. */
static void test_optimizer_steps_reduce_scatter_partial_grads(void)
{
    dt_mesh *m = ot_mesh_1d();
    enum { N = 37 };
    int64_t shape[1] = {N};
    float p[N], g[N], zero[N] = {0}, pr[N], mr[N], vr[N], got[N];
    ot_fill_real(p, N, -1, 1, 14);
    ot_fill_int(g, N, -4, 4, 15);
    dt_layout *lp = dt_test_layout(m, 1, "x", NULL, NULL), *lg = dt_test_layout(m, 1, NULL, NULL, "x");
    for (int adam = 0; adam < 2; adam++) {
        dt_tensor *tp = ot_tensor(lp, DT_DTYPE_F32, shape, p);
        dt_tensor *tg = ot_tensor(lg, DT_DTYPE_F32, shape, g);
        dt_tensor *s1 = ot_tensor(lp, DT_DTYPE_F32, shape, zero);
        dt_tensor *s2 = ot_tensor(lp, DT_DTYPE_F32, shape, zero);
        memcpy(pr, p, sizeof pr);
        memset(mr, 0, sizeof mr);
        memset(vr, 0, sizeof vr);
        for (int step = 1; step <= 3; step++) {
            if (adam) {
                dt_adam_opts o = DT_ADAMW_OPTS_INIT;
                o.lr = 0.1f;
                DT_ASSERT_OK(dt_adam_step(&o, step, tp, tg, s1, s2));
                DT_ASSERT_OK(dt_kernel_adam(N, &o, step, pr, g, mr, vr));
            } else {
                dt_sgd_opts o = DT_SGD_OPTS_INIT;
                o.lr = 0.5f;
                o.momentum = 0.9f;
                o.weight_decay = 0.01f;
                DT_ASSERT_OK(dt_sgd_step(&o, tp, tg, s1));
                DT_ASSERT_OK(dt_kernel_sgd(N, &o, pr, g, mr));
            }
        }
        CU_ASSERT(dt_layout_equal(dt_tensor_layout(tp), lp));
        ot_fetch(tp, got);
        CU_ASSERT_EQUAL(ot_mismatches("optimizer", got, pr, N, 0, 0), 0);
        ot_fetch(s1, got);
        CU_ASSERT_EQUAL(ot_mismatches("moment", got, mr, N, 0, 0), 0);
        dt_sgd_opts bad = DT_SGD_OPTS_INIT;
        bad.momentum = 0.5f;
        DT_ASSERT_FAILS(dt_sgd_step(&bad, tp, tg, NULL), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_FAILS(dt_sgd_step(&bad, tp, tg, tg), DT_ERR_SHAPE);
        dt_tensor_destroy(tp);
        dt_tensor_destroy(tg);
        dt_tensor_destroy(s1);
        dt_tensor_destroy(s2);
    }
    dt_layout_destroy(lp);
    dt_layout_destroy(lg);
    dt_mesh_destroy(m);
}

static void test_ops_reject_bad_operands(void)
{
    dt_mesh *m = ot_mesh_1d();
    int64_t s1[2] = {3, 4}, s2[2] = {4, 3};
    float z[12] = {0};
    dt_layout *l = dt_test_layout(m, 2, NULL, NULL, NULL);
    dt_tensor *a = ot_tensor(l, DT_DTYPE_F32, s1, z), *b = ot_tensor(l, DT_DTYPE_F32, s2, z);
    dt_tensor *c = NULL;
    DT_ASSERT_FAILS(dt_add(a, b, NULL, &c), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("[3,4]");
    DT_ASSERT_FAILS(dt_bias_add(a, b, &c), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_item(a, NULL), DT_ERR_INVALID_ARGUMENT);
    double v;
    DT_ASSERT_FAILS(dt_item(a, &v), DT_ERR_SHAPE);
    CU_ASSERT_PTR_NULL(c);
    dt_tensor_destroy(a);
    dt_tensor_destroy(b);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_binary_ops_match_local_kernels_in_any_layouts),
        DT_TEST(test_scale_and_axpy_keep_partial_sums),
        DT_TEST(test_bias_add_and_grad_follow_the_last_dim),
        DT_TEST(test_activations_and_backward_match_finite_differences),
        DT_TEST(test_softmax_xent_loss_and_grad_in_any_layout),
        DT_TEST(test_reductions_are_partial_over_sharded_dims),
        DT_TEST(test_nonfinite_found_on_every_client),
        DT_TEST(test_cast_round_trips_small_integers),
        DT_TEST(test_optimizer_steps_reduce_scatter_partial_grads),
        DT_TEST(test_ops_reject_bad_operands),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "spmd_ops", cases);
}
