/* Distributed matmul and its backward on 1-D and 2-D meshes: natural output layouts of the
 * data, column and row parallel cases, every operand layout pair against the single-device
 * GEMM on the whole tensors (exact: small integers), half inputs, finite-difference grads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ops_test_util.h"

/* Reference C = op(A) op(B) with the local kernel on the whole arrays. */
static void ref_matmul(const float *a, const float *b, int ta, int tb, int64_t m, int64_t n,
                       int64_t k, float *c)
{
    DT_ASSERT_OK(dt_kernel_gemm(ta, tb, m, n, k, 1.0f, a, DT_DTYPE_F32, ta ? m : k, b,
                                DT_DTYPE_F32, tb ? k : n, 0.0f, c, n));
}

/* Runs one distributed matmul with the given operand layouts and checks the value. Returns
 * the output (caller destroys). */
static dt_tensor *check_matmul(const dt_layout *la, const dt_layout *lb, int ta, int tb,
                               int64_t m, int64_t n, int64_t k, const dt_layout *want)
{
    int64_t ashape[2] = {ta ? k : m, ta ? m : k}, bshape[2] = {tb ? n : k, tb ? k : n};
    float *a = malloc(sizeof(float) * (size_t)(m * k));
    float *b = malloc(sizeof(float) * (size_t)(k * n));
    float *ref = malloc(sizeof(float) * (size_t)(m * n));
    float *got = malloc(sizeof(float) * (size_t)(m * n));
    ot_fill_int(a, m * k, -3, 3, 11);
    ot_fill_int(b, k * n, -3, 3, 12);
    ref_matmul(a, b, ta, tb, m, n, k, ref);
    dt_tensor *ta_t = ot_tensor(la, DT_DTYPE_F32, ashape, a);
    dt_tensor *tb_t = ot_tensor(lb, DT_DTYPE_F32, bshape, b);
    dt_tensor *c = NULL;
    DT_ASSERT_OK(dt_matmul(ta_t, tb_t, ta, tb, want, &c));
    CU_ASSERT_EQUAL(dt_tensor_dtype(c), DT_DTYPE_F32);
    CU_ASSERT_EQUAL(dt_tensor_shape(c)[0], m);
    CU_ASSERT_EQUAL(dt_tensor_shape(c)[1], n);
    if (want)
        CU_ASSERT(dt_layout_equal(dt_tensor_layout(c), want));
    ot_fetch(c, got);
    CU_ASSERT_EQUAL(ot_mismatches("matmul", got, ref, m * n, 0.0f, 0.0f), 0);
    dt_tensor_destroy(ta_t);
    dt_tensor_destroy(tb_t);
    free(a);
    free(b);
    free(ref);
    free(got);
    return c;
}

static void test_matmul_data_parallel_output_batch_sharded(void)
{
    dt_mesh *m = ot_mesh_1d();
    dt_layout *la = dt_test_layout(m, 2, "x", NULL, NULL), *lb = dt_test_layout(m, 2, NULL, NULL, NULL);
    dt_tensor *c = check_matmul(la, lb, 0, 0, 13, 5, 6, NULL);
    CU_ASSERT_EQUAL(ot_spec(c, 0), 0);
    CU_ASSERT_EQUAL(ot_spec(c, 1), -1);
    CU_ASSERT(!ot_is_partial(c));
    dt_tensor_destroy(c);
    dt_layout_destroy(la);
    dt_layout_destroy(lb);
    dt_mesh_destroy(m);
}

static void test_matmul_column_parallel_output_sharded(void)
{
    dt_mesh *m = ot_mesh_1d();
    dt_layout *la = dt_test_layout(m, 2, NULL, NULL, NULL), *lb = dt_test_layout(m, 2, NULL, "x", NULL);
    dt_tensor *c = check_matmul(la, lb, 0, 0, 4, 11, 6, NULL);
    CU_ASSERT_EQUAL(ot_spec(c, 0), -1);
    CU_ASSERT_EQUAL(ot_spec(c, 1), 0);
    CU_ASSERT(!ot_is_partial(c));
    dt_tensor_destroy(c);
    dt_layout_destroy(la);
    dt_layout_destroy(lb);
    dt_mesh_destroy(m);
}

static void test_matmul_row_parallel_output_partial_or_reduced(void)
{
    dt_mesh *m = ot_mesh_1d();
    dt_layout *la = dt_test_layout(m, 2, NULL, "x", NULL), *lb = dt_test_layout(m, 2, "x", NULL, NULL);
    /* k = 7 over up to 8 devices: one device has an empty contraction shard. */
    dt_tensor *c = check_matmul(la, lb, 0, 0, 5, 4, 7, NULL);
    CU_ASSERT_EQUAL(ot_spec(c, 0), -1);
    CU_ASSERT_EQUAL(ot_spec(c, 1), -1);
    CU_ASSERT(ot_is_partial(c));
    dt_tensor_destroy(c);
    dt_layout *rep = dt_test_layout(m, 2, NULL, NULL, NULL);
    c = check_matmul(la, lb, 0, 0, 5, 4, 7, rep);
    CU_ASSERT(!ot_is_partial(c));
    dt_tensor_destroy(c);
    /* Reduce-scattered on request. */
    dt_layout *rows = dt_test_layout(m, 2, "x", NULL, NULL);
    c = check_matmul(la, lb, 0, 0, 9, 4, 7, rows);
    dt_tensor_destroy(c);
    dt_layout_destroy(rows);
    dt_layout_destroy(rep);
    dt_layout_destroy(la);
    dt_layout_destroy(lb);
    dt_mesh_destroy(m);
}

static void test_matmul_2d_mesh_combines_batch_and_model(void)
{
    dt_mesh *m = ot_mesh_2d();
    /* Megatron MLP on a 2-D mesh: column parallel then row parallel, batch on b. */
    dt_layout *x = dt_test_layout(m, 2, "b", NULL, NULL), *w1 = dt_test_layout(m, 2, NULL, "m", NULL);
    dt_tensor *h = check_matmul(x, w1, 0, 0, 6, 9, 5, NULL);
    CU_ASSERT_EQUAL(ot_spec(h, 0), 0);
    CU_ASSERT_EQUAL(ot_spec(h, 1), 1);
    CU_ASSERT(!ot_is_partial(h));
    dt_tensor_destroy(h);
    dt_layout *hl = dt_test_layout(m, 2, "b", "m", NULL), *w2 = dt_test_layout(m, 2, "m", NULL, NULL);
    dt_tensor *y = check_matmul(hl, w2, 0, 0, 6, 3, 9, NULL);
    CU_ASSERT_EQUAL(ot_spec(y, 0), 0);
    CU_ASSERT_EQUAL(ot_spec(y, 1), -1);
    int md = -1;
    dt_reduce_op rop;
    CU_ASSERT_EQUAL(dt_layout_num_partial(dt_tensor_layout(y)), 1);
    DT_ASSERT_OK(dt_layout_partial(dt_tensor_layout(y), 0, &md, &rop));
    CU_ASSERT_EQUAL(md, 1);
    CU_ASSERT_EQUAL(rop, DT_REDUCE_SUM);
    dt_tensor_destroy(y);
    dt_layout_destroy(x);
    dt_layout_destroy(w1);
    dt_layout_destroy(hl);
    dt_layout_destroy(w2);
    dt_mesh_destroy(m);
}

/* Every pair of operand layouts on the 2-D mesh (specs from {-, b, m}, optionally partial),
 * all four transpose combinations in turn: the value always matches. */
static void test_matmul_every_layout_pair_matches_single_device(void)
{
    dt_mesh *m = ot_mesh_2d();
    const char *opts[3] = {NULL, "b", "m"};
    dt_layout *ls[16];
    int nl = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            if (i == 0 || i != j)
                ls[nl++] = dt_test_layout(m, 2, opts[i], opts[j], NULL);
    ls[nl++] = dt_test_layout(m, 2, "b", NULL, "m");    /* partial operands */
    ls[nl++] = dt_test_layout(m, 2, NULL, NULL, "b");
    int count = 0;
    for (int i = 0; i < nl; i++)
        for (int j = 0; j < nl; j++) {
            int ta = count & 1, tb = (count >> 1) & 1;
            dt_tensor *c = check_matmul(ls[i], ls[j], ta, tb, 7, 5, 6, NULL);
            dt_tensor_destroy(c);
            count++;
        }
    for (int i = 0; i < nl; i++)
        dt_layout_destroy(ls[i]);
    dt_mesh_destroy(m);
}

static void test_matmul_half_inputs_accumulate_in_f32(void)
{
    dt_mesh *m = ot_mesh_1d();
    dt_layout *la = dt_test_layout(m, 2, "x", NULL, NULL), *lb = dt_test_layout(m, 2, NULL, NULL, NULL);
    const int64_t M = 9, N = 4, K = 300;
    int64_t ashape[2] = {M, K}, bshape[2] = {K, N};
    float a[9 * 300], b[300 * 4], ref[36], got[36];
    uint16_t ah[9 * 300], bh[300 * 4];
    ot_fill_int(a, M * K, -8, 8, 3);
    ot_fill_int(b, K * N, -8, 8, 4);
    ref_matmul(a, b, 0, 0, M, N, K, ref);
    DT_ASSERT_OK(dt_kernel_cast(M * K, a, DT_DTYPE_F32, ah, DT_DTYPE_F16));
    DT_ASSERT_OK(dt_kernel_cast(K * N, b, DT_DTYPE_F32, bh, DT_DTYPE_BF16));
    dt_tensor *ta = ot_tensor(la, DT_DTYPE_F16, ashape, ah);
    dt_tensor *tb = ot_tensor(lb, DT_DTYPE_BF16, bshape, bh);
    dt_tensor *c = NULL;
    DT_ASSERT_OK(dt_matmul(ta, tb, 0, 0, NULL, &c));
    CU_ASSERT_EQUAL(dt_tensor_dtype(c), DT_DTYPE_F32);
    ot_fetch(c, got);
    CU_ASSERT_EQUAL(ot_mismatches("half matmul", got, ref, M * N, 0.0f, 0.0f), 0);
    dt_tensor_destroy(c);
    dt_tensor_destroy(ta);
    dt_tensor_destroy(tb);
    dt_layout_destroy(la);
    dt_layout_destroy(lb);
    dt_mesh_destroy(m);
}

/* Backward of every transpose combination in the data parallel and Megatron layouts: values
 * against the reference GEMMs, and the natural gradient layouts. */
static void check_backward(const dt_layout *la, const dt_layout *lb, int ta, int tb,
                           int expect_db_partial)
{
    const int64_t M = 6, N = 5, K = 7;
    int64_t ashape[2] = {ta ? K : M, ta ? M : K}, bshape[2] = {tb ? N : K, tb ? K : N};
    int64_t cshape[2] = {M, N};
    float a[42], b[35], g[30], da_ref[42], db_ref[35], da[42], db[35];
    ot_fill_int(a, M * K, -3, 3, 21);
    ot_fill_int(b, K * N, -3, 3, 22);
    ot_fill_int(g, M * N, -3, 3, 23);
    /* dA = g op(B)^T (stored as A), dB = op(A)^T g (stored as B), by brute force. */
    for (int64_t i = 0; i < M; i++)
        for (int64_t p = 0; p < K; p++) {
            float s = 0;
            for (int64_t j = 0; j < N; j++)
                s += g[i * N + j] * (tb ? b[j * K + p] : b[p * N + j]);
            da_ref[ta ? p * M + i : i * K + p] = s;
        }
    for (int64_t p = 0; p < K; p++)
        for (int64_t j = 0; j < N; j++) {
            float s = 0;
            for (int64_t i = 0; i < M; i++)
                s += (ta ? a[p * M + i] : a[i * K + p]) * g[i * N + j];
            db_ref[tb ? j * K + p : p * N + j] = s;
        }
    const dt_mesh *mesh = dt_layout_mesh(la);
    dt_layout *lg = NULL;
    DT_ASSERT_OK(dt_layout_replicated(mesh, 2, &lg));
    dt_tensor *A = ot_tensor(la, DT_DTYPE_F32, ashape, a);
    dt_tensor *B = ot_tensor(lb, DT_DTYPE_F32, bshape, b);
    dt_tensor *C = NULL;
    DT_ASSERT_OK(dt_matmul(A, B, ta, tb, NULL, &C));
    /* dC in the forward output's natural layout (reduced if partial). */
    dt_layout *lc = NULL;
    const char *specs[2] = {dt_layout_spec(dt_tensor_layout(C), 0),
                            dt_layout_spec(dt_tensor_layout(C), 1)};
    DT_ASSERT_OK(dt_layout_create(mesh, 2, specs, &lc));
    dt_tensor *G = ot_tensor(lc, DT_DTYPE_F32, cshape, g);
    dt_tensor *dA = NULL, *dB = NULL;
    DT_ASSERT_OK(dt_matmul_backward(A, B, ta, tb, G, NULL, NULL, &dA, &dB));
    CU_ASSERT_EQUAL(dt_tensor_shape(dA)[0], ashape[0]);
    CU_ASSERT_EQUAL(dt_tensor_shape(dB)[1], bshape[1]);
    CU_ASSERT_EQUAL(ot_is_partial(dB), expect_db_partial);
    ot_fetch(dA, da);
    ot_fetch(dB, db);
    CU_ASSERT_EQUAL(ot_mismatches("dA", da, da_ref, M * K, 0.0f, 0.0f), 0);
    CU_ASSERT_EQUAL(ot_mismatches("dB", db, db_ref, K * N, 0.0f, 0.0f), 0);
    /* Requested layouts: both replicated. */
    dt_tensor *dA2 = NULL, *dB2 = NULL;
    DT_ASSERT_OK(dt_matmul_backward(A, B, ta, tb, G, lg, lg, &dA2, &dB2));
    CU_ASSERT(dt_layout_is_replicated(dt_tensor_layout(dB2)));
    ot_fetch(dB2, db);
    CU_ASSERT_EQUAL(ot_mismatches("dB replicated", db, db_ref, K * N, 0.0f, 0.0f), 0);
    dt_tensor *only = NULL;
    DT_ASSERT_OK(dt_matmul_backward(A, B, ta, tb, G, NULL, NULL, NULL, &only));
    dt_tensor_destroy(only);
    dt_tensor_destroy(dA2);
    dt_tensor_destroy(dB2);
    dt_tensor_destroy(dA);
    dt_tensor_destroy(dB);
    dt_tensor_destroy(G);
    dt_tensor_destroy(C);
    dt_tensor_destroy(A);
    dt_tensor_destroy(B);
    dt_layout_destroy(lc);
    dt_layout_destroy(lg);
}

static void test_matmul_backward_data_parallel_weight_grad_is_partial(void)
{
    dt_mesh *m = ot_mesh_1d();
    for (int t = 0; t < 4; t++) {
        int ta = t & 1, tb = t >> 1;
        /* Batch (the m dim of op(A)) sharded, weights replicated. */
        dt_layout *la = ta ? dt_test_layout(m, 2, NULL, "x", NULL) : dt_test_layout(m, 2, "x", NULL, NULL);
        dt_layout *lb = dt_test_layout(m, 2, NULL, NULL, NULL);
        check_backward(la, lb, ta, tb, 1);
        dt_layout_destroy(la);
        dt_layout_destroy(lb);
    }
    dt_mesh_destroy(m);
}

static void test_matmul_backward_megatron_layouts(void)
{
    dt_mesh *m = ot_mesh_2d();
    dt_layout *la = dt_test_layout(m, 2, "b", NULL, NULL), *lb = dt_test_layout(m, 2, NULL, "m", NULL);
    check_backward(la, lb, 0, 0, 1);       /* column parallel: dW partial over b */
    dt_layout *la2 = dt_test_layout(m, 2, "b", "m", NULL), *lb2 = dt_test_layout(m, 2, "m", NULL, NULL);
    check_backward(la2, lb2, 0, 0, 1);     /* row parallel */
    dt_layout_destroy(la);
    dt_layout_destroy(lb);
    dt_layout_destroy(la2);
    dt_layout_destroy(lb2);
    dt_mesh_destroy(m);
}

/* L(A, B) = sum(G . (A B)); dL/dA and dL/dB by central differences of the distributed
 * forward at a few elements, in f64 sums of the fetched outputs. */
static double loss_of(const dt_tensor *A, const dt_tensor *B, const float *g, int64_t mn)
{
    dt_tensor *C = NULL;
    DT_ASSERT_OK(dt_matmul(A, B, 0, 0, NULL, &C));
    float c[64];
    ot_fetch(C, c);
    dt_tensor_destroy(C);
    double s = 0;
    for (int64_t i = 0; i < mn; i++)
        s += (double)g[i] * c[i];
    return s;
}

static void test_matmul_backward_matches_finite_differences(void)
{
    dt_mesh *m = ot_mesh_2d();
    const int64_t M = 5, N = 4, K = 6;
    int64_t ashape[2] = {M, K}, bshape[2] = {K, N}, cshape[2] = {M, N};
    float a[30], b[24], g[20], da[30], db[24];
    ot_fill_real(a, M * K, -1, 1, 31);
    ot_fill_real(b, K * N, -1, 1, 32);
    ot_fill_real(g, M * N, -1, 1, 33);
    dt_layout *la = dt_test_layout(m, 2, "b", "m", NULL), *lb = dt_test_layout(m, 2, "m", NULL, NULL);
    dt_layout *lc = dt_test_layout(m, 2, "b", NULL, NULL);
    dt_tensor *A = ot_tensor(la, DT_DTYPE_F32, ashape, a);
    dt_tensor *B = ot_tensor(lb, DT_DTYPE_F32, bshape, b);
    dt_tensor *G = ot_tensor(lc, DT_DTYPE_F32, cshape, g);
    dt_tensor *dA = NULL, *dB = NULL;
    DT_ASSERT_OK(dt_matmul_backward(A, B, 0, 0, G, NULL, NULL, &dA, &dB));
    ot_fetch(dA, da);
    ot_fetch(dB, db);
    const float eps = 1e-2f;
    for (int probe = 0; probe < 4; probe++) {
        int64_t ia = (probe * 7) % (M * K), ib = (probe * 5 + 1) % (K * N);
        float save = a[ia];
        a[ia] = save + eps;
        dt_tensor *Ap = ot_tensor(la, DT_DTYPE_F32, ashape, a);
        a[ia] = save - eps;
        dt_tensor *Am = ot_tensor(la, DT_DTYPE_F32, ashape, a);
        a[ia] = save;
        double fd = (loss_of(Ap, B, g, M * N) - loss_of(Am, B, g, M * N)) / (2.0 * eps);
        CU_ASSERT(fabs(fd - da[ia]) < 1e-3 * (1 + fabs(fd)));
        dt_tensor_destroy(Ap);
        dt_tensor_destroy(Am);
        save = b[ib];
        b[ib] = save + eps;
        dt_tensor *Bp = ot_tensor(lb, DT_DTYPE_F32, bshape, b);
        b[ib] = save - eps;
        dt_tensor *Bm = ot_tensor(lb, DT_DTYPE_F32, bshape, b);
        b[ib] = save;
        fd = (loss_of(A, Bp, g, M * N) - loss_of(A, Bm, g, M * N)) / (2.0 * eps);
        CU_ASSERT(fabs(fd - db[ib]) < 1e-3 * (1 + fabs(fd)));
        dt_tensor_destroy(Bp);
        dt_tensor_destroy(Bm);
    }
    dt_tensor_destroy(dA);
    dt_tensor_destroy(dB);
    dt_tensor_destroy(A);
    dt_tensor_destroy(B);
    dt_tensor_destroy(G);
    dt_layout_destroy(la);
    dt_layout_destroy(lb);
    dt_layout_destroy(lc);
    dt_mesh_destroy(m);
}

static void test_matmul_rejects_mismatched_operands(void)
{
    dt_mesh *m = ot_mesh_1d();
    dt_layout *l = dt_test_layout(m, 2, NULL, NULL, NULL);
    int64_t s1[2] = {3, 4}, s2[2] = {5, 2};
    float z[20] = {0};
    dt_tensor *a = ot_tensor(l, DT_DTYPE_F32, s1, z), *b = ot_tensor(l, DT_DTYPE_F32, s2, z);
    dt_tensor *c = NULL;
    DT_ASSERT_FAILS(dt_matmul(a, b, 0, 0, NULL, &c), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("inner dims");
    DT_ASSERT_FAILS(dt_matmul(a, NULL, 0, 0, NULL, &c), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(c);
    dt_tensor_destroy(a);
    dt_tensor_destroy(b);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_matmul_data_parallel_output_batch_sharded),
        DT_TEST(test_matmul_column_parallel_output_sharded),
        DT_TEST(test_matmul_row_parallel_output_partial_or_reduced),
        DT_TEST(test_matmul_2d_mesh_combines_batch_and_model),
        DT_TEST(test_matmul_every_layout_pair_matches_single_device),
        DT_TEST(test_matmul_half_inputs_accumulate_in_f32),
        DT_TEST(test_matmul_backward_data_parallel_weight_grad_is_partial),
        DT_TEST(test_matmul_backward_megatron_layouts),
        DT_TEST(test_matmul_backward_matches_finite_differences),
        DT_TEST(test_matmul_rejects_mismatched_operands),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "spmd_matmul", cases);
}
