/* The reduce family's public ops through the generic path: every op against a naive
 * single-device reference computed here, on a 1-device mesh and on meshes of 2 and 2x2
 * devices with the inputs replicated, sharded on each dim and partial, the same bits on every
 * layout where the arithmetic is the same; and the errors (bad axes, shapes, labels). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "reduce_test_util.h"

/* ---- naive references (f64) ------------------------------------------------------------- */

/* The reduction of x [s0, s1, s2] over mask: kind 0 sum, 1 mean, 2 max, 3 min, 4 logsumexp,
 * 5 var (correction 1), 6 argmax, 7 argmin. Output in kept-dims order. */
static void naive_reduce3(const double *x, const int64_t *sh, unsigned mask, int kind, double *out)
{
    int64_t o = 0, k[3];
    for (k[0] = 0; k[0] < (mask & 1 ? 1 : sh[0]); k[0]++)
        for (k[1] = 0; k[1] < (mask & 2 ? 1 : sh[1]); k[1]++)
            for (k[2] = 0; k[2] < (mask & 4 ? 1 : sh[2]); k[2]++, o++) {
                double v[256];
                int n = 0;
                int64_t i[3];
                for (i[0] = 0; i[0] < sh[0]; i[0]++)
                    for (i[1] = 0; i[1] < sh[1]; i[1]++)
                        for (i[2] = 0; i[2] < sh[2]; i[2]++) {
                            int in = 1;
                            for (int d = 0; d < 3; d++)
                                in &= (mask >> d & 1) || i[d] == k[d];
                            if (in)
                                v[n++] = x[(i[0] * sh[1] + i[1]) * sh[2] + i[2]];
                        }
                double s = 0, m = v[0], mn = v[0];
                int am = 0, an = 0;
                for (int j = 0; j < n; j++) {
                    s += v[j];
                    if (v[j] > m) {
                        m = v[j];
                        am = j;
                    }
                    if (v[j] < mn) {
                        mn = v[j];
                        an = j;
                    }
                }
                double r = s;
                if (kind == 1)
                    r = s / n;
                else if (kind == 2)
                    r = m;
                else if (kind == 3)
                    r = mn;
                else if (kind == 4) {
                    double e = 0;
                    for (int j = 0; j < n; j++)
                        e += exp(v[j] - m);
                    r = m + log(e);
                } else if (kind == 5) {
                    double q = 0;
                    for (int j = 0; j < n; j++)
                        q += (v[j] - s / n) * (v[j] - s / n);
                    r = q / (n - 1);
                } else if (kind == 6 || kind == 7) {
                    r = kind == 6 ? am : an; /* one reduced axis: j is its index */
                }
                out[o] = r;
            }
}

#define S0 4
#define S1 6
#define S2 4
#define NX (S0 * S1 * S2)
static const int64_t xshape[3] = {S0, S1, S2};

static double xi[NX]; /* small integers in -4..4 */
static double xr[NX]; /* reals in -2..2 */
static double xt[NX]; /* integers in -2..2: many ties */

static void make_inputs(void)
{
    static int done;
    if (done)
        return;
    uint64_t s = 77;
    for (int e = 0; e < NX; e++) {
        xi[e] = (double)dt__rd_randint(&s, -4, 4);
        xr[e] = (double)dt__rd_randint(&s, -2000, 2000) / 1000.0;
        xt[e] = (double)dt__rd_randint(&s, -2, 2);
    }
    done = 1;
}

/* ---- the reductions ------------------------------------------------------------------- */

typedef struct rcase {
    const char *what;
    int kind; /* as naive_reduce3 */
    unsigned mask;
    int keepdim;
    const double *x;
    double tol;  /* 0: exact */
    int bitwise; /* the same bits on every layout */
} rcase;

static const rcase *cur_r;

static dt_status run_reduction(const dt_tensor *const *in, dt_tensor **out)
{
    int axes[3], n = 0;
    for (int d = 0; d < 3; d++)
        if (cur_r->mask >> d & 1)
            axes[n++] = d - (d == 2 ? 3 : 0); /* a negative axis too */
    switch (cur_r->kind) {
    case 0:
        return dt_sum(in[0], axes, cur_r->mask == 7 ? 0 : n, cur_r->keepdim, out);
    case 1:
        return dt_mean(in[0], axes, n, cur_r->keepdim, out);
    case 2:
        return dt_max(in[0], axes, n, cur_r->keepdim, out);
    case 3:
        return dt_min(in[0], axes, n, cur_r->keepdim, out);
    case 4:
        return dt_logsumexp(in[0], axes, n, cur_r->keepdim, out);
    case 5:
        return dt_var(in[0], axes, n, 1, cur_r->keepdim, out);
    case 6:
        return dt_argmax(in[0], axes[0], cur_r->keepdim, out);
    default:
        return dt_argmin(in[0], axes[0], cur_r->keepdim, out);
    }
}

static void test_reductions_match_a_naive_reference_on_every_layout(void)
{
    make_inputs();
    static const rcase cases[] = {
        {"sum over axis 1", 0, 2, 0, xi, 0, 1},
        {"sum over axes 0, 2 keepdim", 0, 5, 1, xi, 0, 1},
        {"sum over every axis", 0, 7, 0, xi, 0, 1},
        {"mean over axis 1", 1, 2, 0, xr, 1e-6, 0},
        {"mean over axes 0, 1 keepdim", 1, 3, 1, xr, 1e-6, 0},
        {"max over axes 0, 2", 2, 5, 0, xr, 0, 1},
        {"min over axis 1 keepdim", 3, 2, 1, xr, 0, 1},
        {"logsumexp over axis 2", 4, 4, 0, xr, 1e-6, 1},
        {"var over axis 1", 5, 2, 0, xr, 1e-6, 1},
        {"argmax along axis 1", 6, 2, 0, xt, 0, 1},
        {"argmin along axis 0 keepdim", 7, 1, 1, xt, 0, 1},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
        cur_r = &cases[c];
        double ref[NX];
        naive_reduce3(cur_r->x, xshape, cur_r->mask, cur_r->kind, ref);
        int64_t no = 1;
        for (int d = 0; d < 3; d++)
            no *= cur_r->mask >> d & 1 ? 1 : xshape[d];
        rt_case rc = {cur_r->what,
                      run_reduction,
                      1,
                      {cur_r->x},
                      {DT_DTYPE_F32},
                      {3},
                      {xshape},
                      ref,
                      no,
                      cur_r->kind >= 6 ? DT_DTYPE_I64 : DT_DTYPE_F32,
                      cur_r->tol,
                      cur_r->bitwise};
        rt_check_layouts(&rc);
    }
}

/* ---- log_softmax, cumsum, topk, sort ----------------------------------------------------- */

static int cur_axis, cur_k, cur_largest, cur_want; /* cur_want: 0 values, 1 indices */

static dt_status run_log_softmax(const dt_tensor *const *in, dt_tensor **out)
{
    return dt_log_softmax(in[0], cur_axis, out);
}

static dt_status run_cumsum(const dt_tensor *const *in, dt_tensor **out)
{
    return dt_cumsum(in[0], cur_axis, out);
}

static dt_status run_topk(const dt_tensor *const *in, dt_tensor **out)
{
    if (cur_k < 0)
        return dt_sort(in[0], cur_axis, cur_largest, cur_want ? NULL : out, cur_want ? out : NULL);
    return dt_topk(in[0], cur_k, cur_axis, cur_largest, cur_want ? NULL : out,
                   cur_want ? out : NULL);
}

/* Naive along-axis helpers on x [4, 6, 4]: index of (o, j, i) for axis a. */
static int64_t at3(int axis, int64_t o, int64_t j, int64_t i, int64_t len)
{
    int64_t outer_sz = axis == 0 ? 1 : axis == 1 ? S0 : S0 * S1;
    int64_t inner = axis == 0 ? S1 * S2 : axis == 1 ? S2 : 1;
    (void)outer_sz;
    return (o * len + j) * inner + i;
}

static void test_log_softmax_and_cumsum_match_naive_on_every_layout(void)
{
    make_inputs();
    for (int axis = 0; axis < 3; axis += 1) {
        int64_t len = xshape[axis], outer = 1, inner = 1;
        for (int d = 0; d < axis; d++)
            outer *= xshape[d];
        for (int d = axis + 1; d < 3; d++)
            inner *= xshape[d];
        double lsm[NX], cs[NX];
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < inner; i++) {
                double m = -INFINITY, s = 0, c = 0;
                for (int64_t j = 0; j < len; j++)
                    m = fmax(m, xr[at3(axis, o, j, i, len)]);
                for (int64_t j = 0; j < len; j++)
                    s += exp(xr[at3(axis, o, j, i, len)] - m);
                for (int64_t j = 0; j < len; j++) {
                    int64_t e = at3(axis, o, j, i, len);
                    lsm[e] = xr[e] - m - log(s);
                    c += xi[e];
                    cs[e] = c;
                }
            }
        cur_axis = axis == 2 ? -1 : axis;
        rt_case a = {"log_softmax",
                     run_log_softmax,
                     1,
                     {xr},
                     {DT_DTYPE_F32},
                     {3},
                     {xshape},
                     lsm,
                     NX,
                     DT_DTYPE_F32,
                     1e-6,
                     1};
        rt_check_layouts(&a);
        rt_case b = {"cumsum", run_cumsum,   1, {xi}, {DT_DTYPE_F32}, {3}, {xshape}, cs,
                     NX,       DT_DTYPE_F32, 0, 1};
        rt_check_layouts(&b);
    }
}

static void test_topk_and_sort_match_naive_with_ties_on_every_layout(void)
{
    make_inputs();
    /* topk(k = 3) largest along axis 1, and the full sort along axis 2 ascending. */
    for (int t = 0; t < 2; t++) {
        int axis = t == 0 ? 1 : 2;
        int64_t len = xshape[axis], k = t == 0 ? 3 : len, outer = axis == 1 ? S0 : S0 * S1;
        int64_t inner = axis == 1 ? S2 : 1;
        int largest = t == 0;
        double vals[NX], idx[NX];
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < inner; i++) {
                int taken[8] = {0};
                for (int64_t j = 0; j < k; j++) { /* selection: the first best not taken */
                    int64_t best = -1;
                    for (int64_t q = 0; q < len; q++) {
                        if (taken[q])
                            continue;
                        double v = xt[at3(axis, o, q, i, len)];
                        if (best < 0 || (largest ? v > xt[at3(axis, o, best, i, len)]
                                                 : v < xt[at3(axis, o, best, i, len)]))
                            best = q;
                    }
                    taken[best] = 1;
                    vals[(o * k + j) * inner + i] = xt[at3(axis, o, best, i, len)];
                    idx[(o * k + j) * inner + i] = (double)best;
                }
            }
        int64_t osh[3] = {S0, S1, S2};
        osh[axis] = k;
        cur_axis = axis;
        cur_k = t == 0 ? 3 : -1;
        cur_largest = largest;
        int64_t no = NX / len * k;
        cur_want = 0;
        rt_case a = {t ? "sort values" : "topk values",
                     run_topk,
                     1,
                     {xt},
                     {DT_DTYPE_F32},
                     {3},
                     {xshape},
                     vals,
                     no,
                     DT_DTYPE_F32,
                     0,
                     1};
        rt_check_layouts(&a);
        cur_want = 1;
        rt_case b = {t ? "sort indices" : "topk indices",
                     run_topk,
                     1,
                     {xt},
                     {DT_DTYPE_F32},
                     {3},
                     {xshape},
                     idx,
                     no,
                     DT_DTYPE_I64,
                     0,
                     1};
        rt_check_layouts(&b);
        (void)osh;
    }
}

/* ---- einsum and matmul_broadcast ------------------------------------------------------------ */

static const char *cur_eq;

static dt_status run_einsum(const dt_tensor *const *in, dt_tensor **out)
{
    if (!cur_eq)
        return dt_matmul_broadcast(in[0], in[1], out);
    return dt_einsum(cur_eq, in, cur_eq && !strchr(cur_eq, ',') ? 1 : 2, out);
}

static void test_einsum_and_matmul_broadcast_match_naive_on_every_layout(void)
{
    make_inputs();
    /* a [4, 6, 4] (xi) with b [4, 6] (the first 24 of xt). */
    static const int64_t bsh[2] = {S2, S1}, b3[3] = {S0, S2, 3}, b1[1] = {S2};
    double ref[NX * 6];
    /* "abc,cd->abd": out[a, b, d] = sum_c x[a, b, c] y[c, d], y [4, 6] */
    for (int a = 0; a < S0; a++)
        for (int b = 0; b < S1; b++)
            for (int d = 0; d < S1; d++) {
                double s = 0;
                for (int c = 0; c < S2; c++)
                    s += xi[(a * S1 + b) * S2 + c] * xt[c * S1 + d];
                ref[(a * S1 + b) * S1 + d] = s;
            }
    cur_eq = "abc,cd->abd";
    rt_case e1 = {"einsum abc,cd->abd",
                  run_einsum,
                  2,
                  {xi, xt},
                  {DT_DTYPE_F32, DT_DTYPE_F32},
                  {3, 2},
                  {xshape, bsh},
                  ref,
                  S0 * S1 * S1,
                  DT_DTYPE_F32,
                  0,
                  1};
    rt_check_layouts(&e1);
    /* "abc,acd->dba": a batch letter, an output permutation (packed output). */
    for (int a = 0; a < S0; a++)
        for (int b = 0; b < S1; b++)
            for (int d = 0; d < 3; d++) {
                double s = 0;
                for (int c = 0; c < S2; c++)
                    s += xi[(a * S1 + b) * S2 + c] * xt[(a * S2 + c) * 3 + d];
                ref[(d * S1 + b) * S0 + a] = s;
            }
    cur_eq = "abc,acd->dba";
    rt_case e2 = {"einsum abc,acd->dba",
                  run_einsum,
                  2,
                  {xi, xt},
                  {DT_DTYPE_F32, DT_DTYPE_F32},
                  {3, 3},
                  {xshape, b3},
                  ref,
                  S0 * S1 * 3,
                  DT_DTYPE_F32,
                  0,
                  1};
    rt_check_layouts(&e2);
    /* one operand: "abc->ca" */
    for (int a = 0; a < S0; a++)
        for (int c = 0; c < S2; c++) {
            double s = 0;
            for (int b = 0; b < S1; b++)
                s += xi[(a * S1 + b) * S2 + c];
            ref[c * S0 + a] = s;
        }
    cur_eq = "abc->ca";
    rt_case e3 = {"einsum abc->ca", run_einsum,   1, {xi}, {DT_DTYPE_F32}, {3}, {xshape}, ref,
                  S0 * S2,          DT_DTYPE_F32, 0, 1};
    rt_check_layouts(&e3);
    /* matmul_broadcast [4, 6, 4] x [4] -> [4, 6] */
    for (int a = 0; a < S0 * S1; a++) {
        double s = 0;
        for (int c = 0; c < S2; c++)
            s += xi[a * S2 + c] * xt[c];
        ref[a] = s;
    }
    cur_eq = NULL;
    rt_case e4 = {"matmul_broadcast [4,6,4] x [4]",
                  run_einsum,
                  2,
                  {xi, xt},
                  {DT_DTYPE_F32, DT_DTYPE_F32},
                  {3, 1},
                  {xshape, b1},
                  ref,
                  S0 * S1,
                  DT_DTYPE_F32,
                  0,
                  1};
    rt_check_layouts(&e4);
}

/* ---- cross_entropy ------------------------------------------------------------------------ */

static dt_status run_xent(const dt_tensor *const *in, dt_tensor **out)
{
    return dt_cross_entropy(in[0], in[1], -100, out);
}

static void test_cross_entropy_matches_naive_with_ignored_rows_on_every_layout(void)
{
    make_inputs();
    /* logits [8, 6] = xr's first 48, labels [8] with two ignored. */
    static const int64_t lsh[2] = {8, 6}, bsh[1] = {8};
    static double labels[8] = {0, 5, -100, 2, 3, -100, 1, 4};
    double s = 0;
    int n = 0;
    for (int r = 0; r < 8; r++) {
        if (labels[r] < 0)
            continue;
        double m = -INFINITY, e = 0;
        for (int c = 0; c < 6; c++)
            m = fmax(m, xr[r * 6 + c]);
        for (int c = 0; c < 6; c++)
            e += exp(xr[r * 6 + c] - m);
        s += m + log(e) - xr[r * 6 + (int)labels[r]];
        n++;
    }
    double ref = s / n;
    rt_case c = {"cross_entropy",
                 run_xent,
                 2,
                 {xr, labels},
                 {DT_DTYPE_F32, DT_DTYPE_I64},
                 {2, 1},
                 {lsh, bsh},
                 &ref,
                 1,
                 DT_DTYPE_F32,
                 1e-6,
                 0};
    rt_check_layouts(&c);
}

/* ---- rules: what stays sharded or partial ------------------------------------------------ */

/* The pending reduction of t's only partial mesh dim, -1 when it has none. */
static int partial_op(const dt_tensor *t)
{
    const dt_layout *l = dt_tensor_layout(t);
    if (dt_layout_num_partial(l) != 1)
        return -1;
    int md = -1;
    dt_reduce_op op = DT_REDUCE_SUM;
    DT_ASSERT_OK(dt_layout_partial(l, 0, &md, &op));
    return (int)op;
}

static void test_sharded_reduced_axes_leave_partial_outputs_and_whole_axes_are_gathered(void)
{
    make_inputs();
    dt_mesh *m = rt_mesh(1);
    const char *s1[3] = {DT_UNSHARDED, "x", DT_UNSHARDED},
               *s2[3] = {DT_UNSHARDED, DT_UNSHARDED, "x"};
    const char *sy[2] = {"x", DT_UNSHARDED}, *pd[1] = {"x"};
    dt_reduce_op sum = DT_REDUCE_SUM;
    dt_layout *l1 = NULL, *l2 = NULL, *ly = NULL, *lp = NULL;
    DT_ASSERT_OK(dt_layout_create(m, 3, s1, &l1));
    DT_ASSERT_OK(dt_layout_create(m, 3, s2, &l2));
    DT_ASSERT_OK(dt_layout_create(m, 2, sy, &ly));
    const char *rep3[3] = {DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED};
    DT_ASSERT_OK(dt_layout_create_partial(m, 3, rep3, 1, pd, &sum, &lp));
    static const int64_t ysh[2] = {S2, S1};
    dt_tensor *x = rt_tensor(l1, DT_DTYPE_F32, 3, xshape, xr);
    dt_tensor *xc = rt_tensor(l2, DT_DTYPE_F32, 3, xshape, xi);
    dt_tensor *xp = rt_tensor(lp, DT_DTYPE_F32, 3, xshape, xi);
    dt_tensor *y = rt_tensor(ly, DT_DTYPE_F32, 2, ysh, xt);
    dt_tensor *o = NULL;
    int ax1[1] = {1}, ax0[1] = {0};
    int here = rt_here(m);
    DT_ASSERT_OK(dt_sum(x, ax1, 1, 0, &o));
    CU_ASSERT(!here || partial_op(o) == DT_REDUCE_SUM);
    dt_tensor_destroy(o);
    DT_ASSERT_OK(dt_mean(x, ax1, 1, 1, &o));
    CU_ASSERT(!here || partial_op(o) == DT_REDUCE_SUM);
    dt_tensor_destroy(o);
    DT_ASSERT_OK(dt_max(x, ax1, 1, 0, &o));
    CU_ASSERT(!here || partial_op(o) == DT_REDUCE_MAX);
    dt_tensor_destroy(o);
    DT_ASSERT_OK(dt_min(x, ax1, 1, 0, &o));
    CU_ASSERT(!here || partial_op(o) == DT_REDUCE_MIN);
    dt_tensor_destroy(o);
    DT_ASSERT_OK(dt_sum(x, ax0, 1, 0, &o)); /* a kept sharded axis stays sharded */
    CU_ASSERT(!here || (partial_op(o) == -1 && ot_spec(o, 0) == 0));
    dt_tensor_destroy(o);
    DT_ASSERT_OK(dt_sum(xp, ax0, 1, 0, &o)); /* a partial input stays partial */
    CU_ASSERT(!here || partial_op(o) == DT_REDUCE_SUM);
    dt_tensor_destroy(o);
    DT_ASSERT_OK(dt_logsumexp(x, ax1, 1, 0, &o));
    CU_ASSERT(!here || dt_layout_num_partial(dt_tensor_layout(o)) == 0);
    dt_tensor_destroy(o);
    DT_ASSERT_OK(dt_argmax(x, 1, 0, &o));
    CU_ASSERT(!here || dt_layout_num_partial(dt_tensor_layout(o)) == 0);
    dt_tensor_destroy(o);
    DT_ASSERT_OK(dt_log_softmax(x, 0, &o)); /* the other axis keeps its sharding */
    CU_ASSERT(!here || ot_spec(o, 1) == 0);
    dt_tensor_destroy(o);
    const dt_tensor *ab[2] = {xc, y}; /* c sharded in both: a partial product */
    DT_ASSERT_OK(dt_einsum("abc,cd->abd", ab, 2, &o));
    CU_ASSERT(!here || partial_op(o) == DT_REDUCE_SUM);
    dt_tensor_destroy(o);
    dt_tensor_destroy(x);
    dt_tensor_destroy(xc);
    dt_tensor_destroy(xp);
    dt_tensor_destroy(y);
    dt_layout_destroy(l1);
    dt_layout_destroy(l2);
    dt_layout_destroy(ly);
    dt_layout_destroy(lp);
    dt_mesh_destroy(m);
}

/* ---- rank-0 operands (an empty operand last before "->" in the rule) -------------------- */

static void test_rank0_operands_reduce_and_broadcast(void)
{
    dt_mesh *m = rt_mesh(2);
    dt_layout *r0 = NULL, *r2 = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 0, &r0));
    const char *sp[2] = {"b", "m"};
    DT_ASSERT_OK(dt_layout_create(m, 2, sp, &r2));
    double three = 3, mat[4] = {1, 2, 3, 4}, got[4];
    int64_t sh[2] = {2, 2};
    dt_tensor *s = rt_tensor(r0, DT_DTYPE_F64, 0, NULL, &three);
    dt_tensor *a = rt_tensor(r2, DT_DTYPE_F64, 2, sh, mat), *o = NULL;
    DT_ASSERT_OK(dt_sum(s, NULL, 0, 0, &o)); /* rule "->" */
    if (rt_here(m)) {
        rt_fetch(o, got, 1);
        CU_ASSERT_DOUBLE_EQUAL(got[0], 3, 0);
    }
    dt_tensor_destroy(o);
    const dt_tensor *as[2] = {a, s}, *ss[2] = {s, s};
    DT_ASSERT_OK(dt_einsum("ij,->ji", as, 2, &o));
    if (rt_here(m)) {
        rt_fetch(o, got, 4);
        CU_ASSERT(got[0] == 3 && got[1] == 9 && got[2] == 6 && got[3] == 12);
    }
    dt_tensor_destroy(o);
    DT_ASSERT_OK(dt_einsum(",->", ss, 2, &o));
    if (rt_here(m)) {
        rt_fetch(o, got, 1);
        CU_ASSERT_DOUBLE_EQUAL(got[0], 9, 0);
    }
    dt_tensor_destroy(o);
    dt_tensor_destroy(a);
    dt_tensor_destroy(s);
    dt_layout_destroy(r0);
    dt_layout_destroy(r2);
    dt_mesh_destroy(m);
}

/* ---- errors -------------------------------------------------------------------------------- */

static void test_bad_axes_shapes_and_labels_fail_with_a_message(void)
{
    make_inputs();
    dt_mesh *m = ot_mesh_1d();
    dt_layout *rep = NULL, *rep1 = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 3, &rep));
    DT_ASSERT_OK(dt_layout_replicated(m, 1, &rep1));
    float xf[NX];
    for (int e = 0; e < NX; e++)
        xf[e] = (float)xi[e];
    dt_tensor *x = ot_tensor(rep, DT_DTYPE_F32, xshape, xf), *y = NULL;
    int bad[2] = {3, 1}, twice[2] = {1, -2};
    DT_ASSERT_FAILS(dt_sum(x, bad, 1, 0, &y), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("axis 3 out of range");
    DT_ASSERT_FAILS(dt_mean(x, twice, 2, 0, &y), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("twice");
    DT_ASSERT_FAILS(dt_argmax(x, -4, 0, &y), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_log_softmax(x, 5, &y), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_topk(x, 7, 1, 1, &y, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("k 7");
    DT_ASSERT_FAILS(dt_var(x, NULL, 0, -1, 0, &y), DT_ERR_INVALID_ARGUMENT);
    const dt_tensor *xx[2] = {x, x};
    DT_ASSERT_FAILS(dt_einsum("abc,bcd->ad", xx, 2, &y), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("letter 'b'");
    DT_ASSERT_FAILS(dt_einsum("abc,abc", xx, 2, &y), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("'->'");
    DT_ASSERT_FAILS(dt_einsum("aBc,abc->a", xx, 2, &y), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_einsum("aac,abc->a", xx, 2, &y), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_einsum("abc,abc->z", xx, 2, &y), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("'z'");
    int64_t ish[1] = {S0};
    int64_t iv[S0] = {0, 1, 2, 3};
    dt_tensor *ix = ot_tensor(rep1, DT_DTYPE_I64, ish, iv);
    DT_ASSERT_FAILS(dt_sum(ix, NULL, 0, 0, &y), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("i64");
    DT_ASSERT_FAILS(dt_matmul_broadcast(x, ix, &y), DT_ERR_SHAPE);
    /* labels: [4, 6, 4] logits want [4, 6] labels; a label past the classes. */
    DT_ASSERT_FAILS(dt_cross_entropy(x, ix, -100, &y), DT_ERR_SHAPE);
    dt_layout *rep2 = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 2, &rep2));
    int64_t lsh[2] = {S0, S1};
    int64_t lv[S0 * S1];
    for (int e = 0; e < S0 * S1; e++)
        lv[e] = e % S2;
    lv[9] = 7;
    dt_tensor *lb = ot_tensor(rep2, DT_DTYPE_I64, lsh, lv);
    DT_ASSERT_FAILS(dt_cross_entropy(x, lb, -100, &y), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("label 7 out of range 0..3");
    CU_ASSERT_PTR_NULL(y);
    /* The same with the rows sharded: one device holds the bad label, every client fails. */
    const char *rows[2] = {"x", DT_UNSHARDED};
    dt_layout *lrows = NULL;
    DT_ASSERT_OK(dt_layout_create(m, 2, rows, &lrows));
    dt_tensor *lbs = ot_tensor(lrows, DT_DTYPE_I64, lsh, lv);
    DT_ASSERT_FAILS(dt_cross_entropy(x, lbs, -100, &y), DT_ERR_INVALID_ARGUMENT);
    dt_tensor_destroy(lbs);
    dt_layout_destroy(lrows);
    /* topk_values through dt_op_call with an index past the axis. */
    int64_t bi[S0 * 2 * S2];
    int64_t bish[3] = {S0, 2, S2};
    for (int e = 0; e < S0 * 2 * S2; e++)
        bi[e] = e % S1;
    bi[5] = 9;
    dt_tensor *tbi = ot_tensor(rep, DT_DTYPE_I64, bish, bi);
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = 1;
    const dt_tensor *tv[2] = {x, tbi};
    DT_ASSERT_FAILS(dt_op_call(dt_op_find("topk_values"), tv, 2, &at, NULL, &y),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("index 9 out of range 0..5");
    dt_tensor_destroy(tbi);
    /* An empty axis: sum gives zeros, max has no value. */
    int64_t esh[2] = {0, 3};
    double none[1] = {0}, got[3] = {1, 1, 1};
    dt_tensor *ex = rt_tensor(rep2, DT_DTYPE_F32, 2, esh, none);
    int ax0[1] = {0};
    DT_ASSERT_FAILS(dt_max(ex, ax0, 1, 0, &y), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("empty along axis 0");
    DT_ASSERT_OK(dt_sum(ex, ax0, 1, 0, &y));
    if (rt_here(m)) {
        rt_fetch(y, got, 3);
        CU_ASSERT(got[0] == 0 && got[1] == 0 && got[2] == 0);
    }
    dt_tensor_destroy(y);
    dt_tensor_destroy(ex);
    dt_tensor_destroy(lb);
    dt_tensor_destroy(ix);
    dt_tensor_destroy(x);
    dt_layout_destroy(rep2);
    dt_layout_destroy(rep);
    dt_layout_destroy(rep1);
    dt_mesh_destroy(m);
}

static const dt_test_case cases[] = {
    DT_TEST(test_reductions_match_a_naive_reference_on_every_layout),
    DT_TEST(test_log_softmax_and_cumsum_match_naive_on_every_layout),
    DT_TEST(test_topk_and_sort_match_naive_with_ties_on_every_layout),
    DT_TEST(test_einsum_and_matmul_broadcast_match_naive_on_every_layout),
    DT_TEST(test_cross_entropy_matches_naive_with_ignored_rows_on_every_layout),
    DT_TEST(test_sharded_reduced_axes_leave_partial_outputs_and_whole_axes_are_gathered),
    DT_TEST(test_rank0_operands_reduce_and_broadcast),
    DT_TEST(test_bad_axes_shapes_and_labels_fail_with_a_message),
    DT_TEST_END,
};

int main(int argc, char **argv)
{
    return dt_test_main_device(argc, argv, "opdef_reduce_ops", cases);
}
