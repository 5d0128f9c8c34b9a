/* The generic path of op definitions with ops a user defines here: registration and rule
 * errors, results on every layout against a naive single-device product, partial outputs
 * from a sharded contracting factor, a requested output layout, the propagator's
 * explanations and cache, and the tape (backward, activation checkpointing) through the
 * definitions' own backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../../ops/ops_test_util.h"

#define M 5
#define K 7
#define N 3

/* ---- a user-defined matmul: "ij,jk->ik", a naive kernel, backward by dt_matmul ---------- */

static dt_status mm_cpu(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *y = &a->in[1];
    int64_t m = x->shape[0], k = x->shape[1], n = y->shape[1];
    if (x->dtype != DT_DTYPE_F32)
        return DT_ERR_UNSUPPORTED;
    const float *xa = x->data, *ya = y->data;
    float *o = a->out.data;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float s = 0.0f;
            for (int64_t p = 0; p < k; p++)
                s += xa[i * k + p] * ya[p * n + j];
            o[i * n + j] = s;
        }
    return DT_OK;
}

static dt_status mm_backward(const dt_op_grad *g)
{
    dt_status st = DT_OK;
    if (g->needs[0])
        st = dt_matmul(g->dy, g->in[1], 0, 1, NULL, &g->dx[0]);
    if (st == DT_OK && g->needs[1])
        st = dt_matmul(g->in[0], g->dy, 1, 0, NULL, &g->dx[1]);
    return st;
}

static const dt_op_def mm_def = {
    .name = "test.matmul", .nin = 2, .rule = "ij,jk->ik", .cpu = mm_cpu,
    .backward = mm_backward, .linearity = DT_OP_LINEAR_MULTI, .linear_in = 3,
    .reduce = DT_REDUCE_SUM, .doc = "a naive matmul", .family = "test"};

/* ---- a user-defined elementwise op whose rule asks for a whole last dim ----------------- */

static dt_status rownorm_cpu(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0];
    int64_t cols = x->shape[x->rank - 1], rows = cols ? (int64_t)1 : 0;
    for (int d = 0; d < x->rank - 1; d++)
        rows *= x->shape[d];
    const float *xa = x->data;
    float *o = a->out.data;
    for (int64_t r = 0; r < rows; r++) {
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++)
            s += xa[r * cols + c];
        for (int64_t c = 0; c < cols; c++)
            o[r * cols + c] = (float)(xa[r * cols + c] - s / (double)cols);
    }
    return DT_OK;
}

static const dt_op_def rownorm_def = {
    .name = "test.center_rows", .nin = 1, .rule = "...C->...C", .cpu = rownorm_cpu,
    .reduce = DT_REDUCE_SUM, .family = "test"};

static const dt_op *mm, *rownorm;

static void register_once(void)
{
    if (mm)
        return;
    DT_ASSERT_OK(dt_op_register(&mm_def, &mm));
    DT_ASSERT_OK(dt_op_register(&rownorm_def, &rownorm));
}

static void naive(const float *a, const float *b, float *c)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0.0f;
            for (int p = 0; p < K; p++)
                s += a[i * K + p] * b[p * N + j];
            c[i * N + j] = s;
        }
}

static void test_register_rejects_bad_definitions(void)
{
    register_once();
    dt_op_def d = mm_def;
    d.name = "test.bad_rule";
    d.rule = "ij,jk->i?";
    const dt_op *op = NULL;
    CU_ASSERT_EQUAL(dt_op_register(&d, &op), DT_ERR_PARSE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "column 9"));
    d.rule = "ij,jk->ik";
    d.name = "test.matmul";
    CU_ASSERT_EQUAL(dt_op_register(&d, &op), DT_ERR_INVALID_ARGUMENT); /* taken */
    d.name = "Upper";
    CU_ASSERT_EQUAL(dt_op_register(&d, &op), DT_ERR_INVALID_ARGUMENT);
    d.name = "test.no_kernel";
    d.cpu = NULL;
    CU_ASSERT_EQUAL(dt_op_register(&d, &op), DT_ERR_INVALID_ARGUMENT);
    d.cpu = mm_cpu;
    d.rule = "ij->j";
    CU_ASSERT_EQUAL(dt_op_register(&d, &op), DT_ERR_INVALID_ARGUMENT); /* 1 input, nin 2 */
    CU_ASSERT_PTR_EQUAL(dt_op_find("test.matmul"), mm);
    CU_ASSERT_PTR_NULL(dt_op_find("test.none"));
    CU_ASSERT_STRING_EQUAL(dt_op_definition(mm)->doc, "a naive matmul");
}

static void test_user_matmul_matches_naive_product_on_every_layout(void)
{
    register_once();
    dt_mesh *m = ot_mesh_2d();
    int64_t sa[2] = {M, K}, sb[2] = {K, N};
    float a[M * K], b[K * N], ref[M * N], got[M * N];
    ot_fill_int(a, M * K, -3, 3, 11);
    ot_fill_int(b, K * N, -3, 3, 12);
    naive(a, b, ref);
    const char *specs[4][2] = {{NULL, NULL}, {"b", NULL}, {NULL, "m"}, {"b", "m"}};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            dt_layout *la = dt_test_layout(m, 2, specs[i][0], specs[i][1], NULL);
            dt_layout *lb = dt_test_layout(m, 2, specs[j][0], specs[j][1], NULL);
            dt_tensor *ta = ot_tensor(la, DT_DTYPE_F32, sa, a);
            dt_tensor *tb = ot_tensor(lb, DT_DTYPE_F32, sb, b);
            const dt_tensor *in[2] = {ta, tb};
            dt_tensor *c = NULL;
            DT_ASSERT_OK(dt_op_call(mm, in, 2, NULL, NULL, &c));
            CU_ASSERT_EQUAL(dt_tensor_rank(c), 2);
            CU_ASSERT_EQUAL(dt_tensor_shape(c)[0], M);
            CU_ASSERT_EQUAL(dt_tensor_shape(c)[1], N);
            ot_fetch(c, got); /* small integers: every summation order is exact */
            CU_ASSERT_EQUAL(ot_mismatches("user matmul", got, ref, M * N, 0, 0), 0);
            dt_tensor_destroy(c);
            dt_tensor_destroy(ta);
            dt_tensor_destroy(tb);
            dt_layout_destroy(la);
            dt_layout_destroy(lb);
        }
    dt_mesh_destroy(m);
}

static void test_sharded_contracting_factor_gives_partial_output(void)
{
    register_once();
    dt_mesh *m = ot_mesh_2d();
    if (dt_mesh_dim_size(m, 1) < 2) {
        dt_mesh_destroy(m);
        return;
    }
    int64_t sa[2] = {M, K}, sb[2] = {K, N};
    float a[M * K], b[K * N], ref[M * N], got[M * N];
    ot_fill_int(a, M * K, -3, 3, 21);
    ot_fill_int(b, K * N, -3, 3, 22);
    naive(a, b, ref);
    dt_layout *la = dt_test_layout(m, 2, "b", "m", NULL);
    dt_layout *lb = dt_test_layout(m, 2, "m", NULL, NULL);
    dt_tensor *ta = ot_tensor(la, DT_DTYPE_F32, sa, a);
    dt_tensor *tb = ot_tensor(lb, DT_DTYPE_F32, sb, b);
    const dt_tensor *in[2] = {ta, tb};
    dt_tensor *c = NULL;
    DT_ASSERT_OK(dt_op_call(mm, in, 2, NULL, NULL, &c));
    CU_ASSERT(ot_is_partial(c));   /* k sharded over m: row parallel, no gather */
    CU_ASSERT_EQUAL(ot_spec(c, 0), 0);
    ot_fetch(c, got);
    CU_ASSERT_EQUAL(ot_mismatches("partial matmul", got, ref, M * N, 0, 0), 0);
    dt_tensor_destroy(c);
    /* A requested output layout is honoured. */
    dt_layout *lc = dt_test_layout(m, 2, NULL, "m", NULL);
    DT_ASSERT_OK(dt_op_call(mm, in, 2, NULL, lc, &c));
    CU_ASSERT(dt_layout_equal(dt_tensor_layout(c), lc));
    ot_fetch(c, got);
    CU_ASSERT_EQUAL(ot_mismatches("requested layout", got, ref, M * N, 0, 0), 0);
    dt_tensor_destroy(c);
    /* dt_op_plan says the same without running. */
    dt_layout *pin[2] = {NULL, NULL}, *pout = NULL;
    DT_ASSERT_OK(dt_op_plan(mm, in, 2, NULL, NULL, pin, &pout));
    CU_ASSERT_EQUAL(dt_layout_num_partial(pout), 1);
    CU_ASSERT(dt_layout_equal(pin[0], la));
    CU_ASSERT(dt_layout_equal(pin[1], lb));
    dt_layout_destroy(pin[0]);
    dt_layout_destroy(pin[1]);
    dt_layout_destroy(pout);
    dt_layout_destroy(lc);
    dt_tensor_destroy(ta);
    dt_tensor_destroy(tb);
    dt_layout_destroy(la);
    dt_layout_destroy(lb);
    dt_mesh_destroy(m);
}

static void test_whole_factor_is_gathered_and_shapes_are_checked(void)
{
    register_once();
    dt_mesh *m = ot_mesh_2d();
    int64_t s[2] = {M, K};
    float x[M * K], ref[M * K], got[M * K];
    ot_fill_int(x, M * K, -4, 4, 31);
    for (int r = 0; r < M; r++) {
        double sum = 0.0;
        for (int c = 0; c < K; c++)
            sum += x[r * K + c];
        for (int c = 0; c < K; c++)
            ref[r * K + c] = (float)(x[r * K + c] - sum / K);
    }
    dt_layout *l = dt_test_layout(m, 2, "b", "m", NULL);
    dt_tensor *t = ot_tensor(l, DT_DTYPE_F32, s, x);
    dt_tensor *y = NULL;
    DT_ASSERT_OK(dt_op_call(rownorm, (const dt_tensor *const[]){t}, 1, NULL, NULL, &y));
    CU_ASSERT_EQUAL(ot_spec(y, 0), 0);  /* rows keep their sharding */
    CU_ASSERT_EQUAL(ot_spec(y, 1), -1); /* C is whole */
    ot_fetch(y, got);
    CU_ASSERT_EQUAL(ot_mismatches("center rows", got, ref, M * K, 0, 0), 0);
    dt_tensor_destroy(y);
    /* matmul of [M, K] by [M, K]: the inner sizes differ. */
    const dt_tensor *in[2] = {t, t};
    CU_ASSERT_EQUAL(dt_op_call(mm, in, 2, NULL, NULL, &y), DT_ERR_SHAPE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "test.matmul"));
    CU_ASSERT_EQUAL(dt_op_call(mm, in, 1, NULL, NULL, &y), DT_ERR_INVALID_ARGUMENT);
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

static int nlines, ncached, ncand;
static void on_line(void *arg, const char *line)
{
    (void)arg;
    nlines++;
    ncached += strstr(line, "(cached)") != NULL;
    ncand += strstr(line, "candidate") != NULL;
}

static void test_explanations_list_candidates_then_the_cache(void)
{
    register_once();
    dt_mesh *m = ot_mesh_2d();
    int64_t sa[2] = {M, K}, sb[2] = {K, N};
    float a[M * K], b[K * N];
    ot_fill_int(a, M * K, -3, 3, 41);
    ot_fill_int(b, K * N, -3, 3, 42);
    dt_layout *la = dt_test_layout(m, 2, "b", NULL, NULL), *lb = dt_test_layout(m, 2, NULL, NULL, NULL);
    dt_tensor *ta = ot_tensor(la, DT_DTYPE_F32, sa, a), *tb = ot_tensor(lb, DT_DTYPE_F32, sb, b);
    const dt_tensor *in[2] = {ta, tb};
    dt_op_cache_clear();
    dt_explain_set(1, NULL, on_line, NULL);
    dt_tensor *c = NULL;
    DT_ASSERT_OK(dt_op_call(mm, in, 2, NULL, NULL, &c));
    dt_tensor_destroy(c);
    CU_ASSERT(ncand >= 2);
    CU_ASSERT_EQUAL(ncached, 0);
    CU_ASSERT(dt_op_cache_size() >= 1);
    DT_ASSERT_OK(dt_op_call(mm, in, 2, NULL, NULL, &c));
    CU_ASSERT_EQUAL(ncached, 1);
    CU_ASSERT_EQUAL(ot_spec(c, 0), 0); /* data parallel: rows stay on b, b is replicated */
    CU_ASSERT(!ot_is_partial(c));
    dt_explain_set(0, NULL, NULL, NULL);
    dt_tensor_destroy(c);
    dt_tensor_destroy(ta);
    dt_tensor_destroy(tb);
    dt_layout_destroy(la);
    dt_layout_destroy(lb);
    dt_mesh_destroy(m);
}

/* Gradients of L = sum(mm(mm(a, b), ones[N, 1])) = sum(a b) through the tape: dA = 1 b^T,
 * dB = a^T 1; with and without activation checkpointing of both products (the inner one is
 * re-run: the outer one's backward needs its output). */
static void tape_grads(int checkpoint, float *da, float *db)
{
    dt_mesh *m = ot_mesh_2d();
    int64_t sa[2] = {M, K}, sb[2] = {K, N};
    float a[M * K], b[K * N];
    ot_fill_int(a, M * K, -3, 3, 51);
    ot_fill_int(b, K * N, -3, 3, 52);
    dt_layout *la = dt_test_layout(m, 2, "b", NULL, NULL), *lb = dt_test_layout(m, 2, NULL, "m", NULL);
    dt_tensor *ta = ot_tensor(la, DT_DTYPE_F32, sa, a), *tb = ot_tensor(lb, DT_DTYPE_F32, sb, b);
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    DT_ASSERT_OK(dt_tape_watch(tape, ta, 0));
    DT_ASSERT_OK(dt_tape_watch(tape, tb, 1));
    DT_ASSERT_OK(dt_tape_begin(tape));
    if (checkpoint) {
        dt_checkpoint_opts co = DT_CHECKPOINT_OPTS_INIT;
        DT_ASSERT_OK(dt_tape_checkpoint_begin(tape, &co));
    }
    const dt_tensor *in[2] = {ta, tb};
    dt_tensor *c0 = NULL, *c = NULL, *loss = NULL;
    DT_ASSERT_OK(dt_op_call(mm, in, 2, NULL, NULL, &c0));
    int64_t sw[2] = {N, 1};
    float ones[N] = {1, 1, 1};
    dt_layout *lw = dt_test_layout(m, 2, NULL, NULL, NULL);
    dt_tensor *tw = ot_tensor(lw, DT_DTYPE_F32, sw, ones);
    DT_ASSERT_OK(dt_op_call(mm, (const dt_tensor *const[]){c0, tw}, 2, NULL, NULL, &c));
    if (checkpoint)
        DT_ASSERT_OK(dt_tape_checkpoint_end(tape));
    DT_ASSERT_OK(dt_reduce(c, DT_REDUCE_SUM, DT_ALL_AXES, NULL, &loss));
    DT_ASSERT_OK(dt_tape_end(tape));
    DT_ASSERT_OK(dt_tape_backward(tape, loss, NULL, 1.0f, NULL));
    const dt_tensor *ga = NULL, *gb = NULL;
    DT_ASSERT_OK(dt_tape_grad(tape, 0, &ga));
    DT_ASSERT_OK(dt_tape_grad(tape, 1, &gb));
    ot_fetch(ga, da);
    ot_fetch(gb, db);
    if (checkpoint) {
        dt_tape_stats s;
        DT_ASSERT_OK(dt_tape_get_stats(tape, &s));
        CU_ASSERT(s.recomputed >= 1);
    }
    dt_tensor_destroy(c);
    dt_tensor_destroy(c0);
    dt_tensor_destroy(tw);
    dt_layout_destroy(lw);
    dt_tensor_destroy(loss);
    dt_tape_destroy(tape);
    dt_tensor_destroy(ta);
    dt_tensor_destroy(tb);
    dt_layout_destroy(la);
    dt_layout_destroy(lb);
    dt_mesh_destroy(m);
    /* The reference: dA[i,p] = sum_j b[p,j]; dB[p,j] = sum_i a[i,p]. */
    float ra[M * K], rb[K * N];
    for (int i = 0; i < M; i++)
        for (int p = 0; p < K; p++) {
            float s = 0.0f;
            for (int j = 0; j < N; j++)
                s += b[p * N + j];
            ra[i * K + p] = s;
        }
    for (int p = 0; p < K; p++)
        for (int j = 0; j < N; j++) {
            float s = 0.0f;
            for (int i = 0; i < M; i++)
                s += a[i * K + p];
            rb[p * N + j] = s;
        }
    CU_ASSERT_EQUAL(ot_mismatches("dA", da, ra, M * K, 0, 0), 0);
    CU_ASSERT_EQUAL(ot_mismatches("dB", db, rb, K * N, 0, 0), 0);
}

static void test_tape_runs_a_user_ops_backward_and_recomputes_it(void)
{
    register_once();
    float da0[M * K], db0[K * N], da1[M * K], db1[K * N];
    tape_grads(0, da0, db0);
    tape_grads(1, da1, db1);
    CU_ASSERT_EQUAL(memcmp(da0, da1, sizeof da0), 0);
    CU_ASSERT_EQUAL(memcmp(db0, db1, sizeof db0), 0);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        {"register_rejects_bad_definitions", test_register_rejects_bad_definitions},
        {"user_matmul_matches_naive_product_on_every_layout",
         test_user_matmul_matches_naive_product_on_every_layout},
        {"sharded_contracting_factor_gives_partial_output",
         test_sharded_contracting_factor_gives_partial_output},
        {"whole_factor_is_gathered_and_shapes_are_checked",
         test_whole_factor_is_gathered_and_shapes_are_checked},
        {"explanations_list_candidates_then_the_cache",
         test_explanations_list_candidates_then_the_cache},
        {"tape_runs_a_user_ops_backward_and_recomputes_it",
         test_tape_runs_a_user_ops_backward_and_recomputes_it},
        {NULL, NULL},
    };
    return dt_test_main_device(argc, argv, "opdef_core", cases);
}
