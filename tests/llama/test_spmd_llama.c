/* The distributed Llama-style ops on sharded layouts of the 1-D and 2-D meshes against the
 * local kernels on the whole tensors (a single-device result), with the natural output
 * layouts the docs promise: rotary embeddings and GQA with whole heads need no gather. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ops/ops_test_util.h"

#define B 4
#define T 6
#define H 8
#define HKV 4
#define HD 2
#define C (H * HD)
#define CK (HKV * HD)
#define N (B * T * C)
#define NK (B * T * CK)

static dt_layout *lay(const dt_mesh *m, int rank, const char *const *specs)
{
    const char *s[DT_MAX_RANK];
    for (int i = 0; i < rank; i++)
        s[i] = specs && specs[i] ? specs[i] : DT_UNSHARDED;
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(m, rank, s, &l));
    return l;
}

/* Layouts of a [B, T, *] activation on the 2-D mesh (b x m) and on the 1-D mesh (x). */
static const char *const act2d[][3] = {
    {"b", NULL, NULL}, {"b", NULL, "m"}, {NULL, NULL, "m"}, {NULL, "m", NULL}, {"m", "b", NULL},
    {"b", "m", NULL},
};
static const char *const act1d[][3] = {
    {"x", NULL, NULL}, {NULL, NULL, "x"}, {NULL, NULL, NULL}, {NULL, "x", NULL},
};

static dt_mesh *mesh_of(int two, int *nl)
{
    *nl = two ? 6 : 4;
    return two ? ot_mesh_2d() : ot_mesh_1d();
}

static const char *const *act_spec(int two, int i)
{
    return two ? act2d[i] : act1d[i];
}

static void test_rms_norm_gathers_only_the_last_dim(void)
{
    float x[N], g[C], dy[N], y[N], dx[N], dg[C], got[N], gg[C];
    ot_fill_real(x, N, -2, 2, 30);
    ot_fill_real(g, C, 0.5f, 1.5f, 31);
    ot_fill_real(dy, N, -1, 1, 33);
    DT_ASSERT_OK(dt_kernel_rms_norm(B * T, C, x, g, 1e-5f, y));
    DT_ASSERT_OK(dt_kernel_rms_norm_grad(B * T, C, x, g, dy, 1e-5f, dx, dg));
    int64_t s[3] = {B, T, C}, cs[1] = {C};
    for (int two = 0; two < 2; two++) {
        int nl;
        dt_mesh *m = mesh_of(two, &nl);
        dt_layout *lp = lay(m, 1, NULL);
        dt_tensor *tg = ot_tensor(lp, DT_DTYPE_F32, cs, g);
        for (int i = 0; i < nl; i++) {
            dt_layout *lx = lay(m, 3, act_spec(two, i));
            dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, s, x), *tdy = ot_tensor(lx, DT_DTYPE_F32, s, dy);
            dt_tensor *ty = NULL, *tdx = NULL, *tdg = NULL;
            DT_ASSERT_OK(dt_rms_norm(tx, tg, 1e-5f, &ty));
            ot_fetch(ty, got);
            CU_ASSERT_EQUAL(ot_mismatches("rms_norm", got, y, N, 0, 0), 0);
            CU_ASSERT_EQUAL(ot_spec(ty, 2), -1);
            CU_ASSERT_EQUAL(ot_spec(ty, 0), ot_spec(tx, 0));
            CU_ASSERT_EQUAL(ot_spec(ty, 1), ot_spec(tx, 1));
            DT_ASSERT_OK(dt_rms_norm_backward(tx, tg, tdy, 1e-5f, &tdx, &tdg));
            ot_fetch(tdx, got);
            CU_ASSERT_EQUAL(ot_mismatches("rms_norm dx", got, dx, N, 0, 0), 0);
            ot_fetch(tdg, gg);
            CU_ASSERT_EQUAL(ot_mismatches("rms_norm dgain", gg, dg, C, 1e-6f, 1e-5f), 0);
            /* Row-sharded x: the gain's gradient is a partial sum over those dims. */
            CU_ASSERT_EQUAL(ot_is_partial(tdg), ot_spec(tx, 0) >= 0 || ot_spec(tx, 1) >= 0);
            dt_tensor_destroy(ty);
            dt_tensor_destroy(tdx);
            dt_tensor_destroy(tdg);
            dt_tensor_destroy(tx);
            dt_tensor_destroy(tdy);
            dt_layout_destroy(lx);
        }
        dt_tensor_destroy(tg);
        dt_layout_destroy(lp);
        dt_mesh_destroy(m);
    }
}

static void test_rope_rotates_every_block_at_its_global_positions_without_gathering(void)
{
    float x[N], y[N], dx[N], got[N];
    ot_fill_real(x, N, -1, 1, 40);
    DT_ASSERT_OK(dt_kernel_rope(B, T, H, HD, 7, 0, x, y));
    DT_ASSERT_OK(dt_kernel_rope(B, T, H, HD, 7, 1, x, dx));
    int64_t s[3] = {B, T, C};
    for (int two = 0; two < 2; two++) {
        int nl;
        dt_mesh *m = mesh_of(two, &nl);
        for (int i = 0; i < nl; i++) {
            dt_layout *lx = lay(m, 3, act_spec(two, i));
            dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, s, x), *ty = NULL, *tdx = NULL;
            DT_ASSERT_OK(dt_rope(tx, H, 7, &ty));
            ot_fetch(ty, got);
            CU_ASSERT_EQUAL(ot_mismatches("rope", got, y, N, 0, 0), 0);
            /* Batch, sequence and whole-head sharding are kept (no communication). */
            for (int d = 0; d < 3; d++) {
                int md = ot_spec(tx, d);
                if (d < 2 || md < 0 || H % dt_mesh_dim_size(m, md) == 0)
                    CU_ASSERT_EQUAL(ot_spec(ty, d), md);
            }
            DT_ASSERT_OK(dt_rope_backward(tx, H, 7, &tdx));
            ot_fetch(tdx, got);
            CU_ASSERT_EQUAL(ot_mismatches("rope backward", got, dx, N, 0, 0), 0);
            dt_tensor_destroy(tdx);
            dt_tensor_destroy(ty);
            dt_tensor_destroy(tx);
            dt_layout_destroy(lx);
        }
        dt_mesh_destroy(m);
    }
}

static void test_swiglu_keeps_the_gate_layout(void)
{
    float g[N], u[N], dy[N], y[N], dg[N], du[N], got[N];
    ot_fill_real(g, N, -3, 3, 50);
    ot_fill_real(u, N, -2, 2, 51);
    ot_fill_real(dy, N, -1, 1, 52);
    DT_ASSERT_OK(dt_kernel_swiglu(N, g, u, y));
    DT_ASSERT_OK(dt_kernel_swiglu_grad(N, g, u, dy, dg, du));
    int64_t s[3] = {B, T, C};
    for (int two = 0; two < 2; two++) {
        int nl;
        dt_mesh *m = mesh_of(two, &nl);
        for (int i = 0; i < nl; i++) {
            dt_layout *lg = lay(m, 3, act_spec(two, i)), *lu = lay(m, 3, act_spec(two, (i + 1) % nl));
            dt_tensor *tg = ot_tensor(lg, DT_DTYPE_F32, s, g), *tu = ot_tensor(lu, DT_DTYPE_F32, s, u);
            dt_tensor *tdy = ot_tensor(lu, DT_DTYPE_F32, s, dy), *ty = NULL, *tdg = NULL, *tdu = NULL;
            DT_ASSERT_OK(dt_swiglu(tg, tu, &ty));
            ot_fetch(ty, got);
            CU_ASSERT_EQUAL(ot_mismatches("swiglu", got, y, N, 0, 0), 0);
            for (int d = 0; d < 3; d++)
                CU_ASSERT_EQUAL(ot_spec(ty, d), ot_spec(tg, d));
            DT_ASSERT_OK(dt_swiglu_backward(tg, tu, tdy, &tdg, &tdu));
            ot_fetch(tdg, got);
            CU_ASSERT_EQUAL(ot_mismatches("swiglu dgate", got, dg, N, 0, 0), 0);
            ot_fetch(tdu, got);
            CU_ASSERT_EQUAL(ot_mismatches("swiglu dup", got, du, N, 0, 0), 0);
            dt_tensor_destroy(tdg);
            dt_tensor_destroy(tdu);
            dt_tensor_destroy(ty);
            dt_tensor_destroy(tdy);
            dt_tensor_destroy(tg);
            dt_tensor_destroy(tu);
            dt_layout_destroy(lg);
            dt_layout_destroy(lu);
        }
        dt_mesh_destroy(m);
    }
}

static void test_gqa_keeps_whole_kv_groups_on_each_device(void)
{
    float q[N], k[NK], v[NK], dy[N], y[N], dq[N], dk[NK], dv[NK], got[N];
    ot_fill_real(q, N, -1, 1, 60);
    ot_fill_real(k, NK, -1, 1, 61);
    ot_fill_real(v, NK, -1, 1, 62);
    ot_fill_real(dy, N, -1, 1, 63);
    DT_ASSERT_OK(dt_kernel_attention_gqa(B, T, H, HKV, HD, 1, q, k, v, y));
    DT_ASSERT_OK(dt_kernel_attention_gqa_grad(B, T, H, HKV, HD, 1, q, k, v, dy, dq, dk, dv));
    int64_t s[3] = {B, T, C}, sk[3] = {B, T, CK};
    for (int two = 0; two < 2; two++) {
        int nl;
        dt_mesh *m = mesh_of(two, &nl);
        for (int i = 0; i < nl; i++) {
            dt_layout *lq = lay(m, 3, act_spec(two, i)), *lk = lay(m, 3, act_spec(two, (i + 1) % nl));
            dt_tensor *tq = ot_tensor(lq, DT_DTYPE_F32, s, q), *tk = ot_tensor(lk, DT_DTYPE_F32, sk, k);
            dt_tensor *tv = ot_tensor(lq, DT_DTYPE_F32, sk, v), *tdy = ot_tensor(lk, DT_DTYPE_F32, s, dy);
            dt_tensor *ty = NULL, *g[3] = {NULL, NULL, NULL};
            DT_ASSERT_OK(dt_attention_gqa(tq, tk, tv, H, HKV, 1, &ty));
            ot_fetch(ty, got);
            CU_ASSERT_EQUAL(ot_mismatches("gqa", got, y, N, 0, 0), 0);
            int wdim = ot_spec(tq, 2);
            if (wdim >= 0)
                CU_ASSERT_EQUAL(ot_spec(ty, 2), HKV % dt_mesh_dim_size(m, wdim) == 0 ? wdim : -1);
            CU_ASSERT_EQUAL(ot_spec(ty, 1), -1);
            CU_ASSERT_EQUAL(ot_spec(ty, 0), ot_spec(tq, 0));
            DT_ASSERT_OK(dt_attention_gqa_backward(tq, tk, tv, H, HKV, 1, tdy, &g[0], &g[1], &g[2]));
            ot_fetch(g[0], got);
            CU_ASSERT_EQUAL(ot_mismatches("gqa dq", got, dq, N, 0, 0), 0);
            ot_fetch(g[1], got);
            CU_ASSERT_EQUAL(ot_mismatches("gqa dk", got, dk, NK, 0, 0), 0);
            ot_fetch(g[2], got);
            CU_ASSERT_EQUAL(ot_mismatches("gqa dv", got, dv, NK, 0, 0), 0);
            CU_ASSERT_EQUAL(ot_spec(g[1], 2), ot_spec(ty, 2));
            for (int j = 0; j < 3; j++)
                dt_tensor_destroy(g[j]);
            dt_tensor_destroy(ty);
            dt_tensor_destroy(tq);
            dt_tensor_destroy(tk);
            dt_tensor_destroy(tv);
            dt_tensor_destroy(tdy);
            dt_layout_destroy(lq);
            dt_layout_destroy(lk);
        }
        dt_mesh_destroy(m);
    }
}

static void test_gqa_with_as_many_kv_heads_gives_the_bits_of_attention(void)
{
    float q[N], k[N], v[N], dy[N], a[N], b[N];
    ot_fill_real(q, N, -1, 1, 70);
    ot_fill_real(k, N, -1, 1, 71);
    ot_fill_real(v, N, -1, 1, 72);
    ot_fill_real(dy, N, -1, 1, 73);
    int64_t s[3] = {B, T, C};
    int nl;
    dt_mesh *m = mesh_of(1, &nl);
    for (int i = 0; i < nl; i++) {
        dt_layout *l = lay(m, 3, act_spec(1, i));
        dt_tensor *tq = ot_tensor(l, DT_DTYPE_F32, s, q), *tk = ot_tensor(l, DT_DTYPE_F32, s, k);
        dt_tensor *tv = ot_tensor(l, DT_DTYPE_F32, s, v), *tdy = ot_tensor(l, DT_DTYPE_F32, s, dy);
        dt_tensor *y1 = NULL, *y2 = NULL, *g1[3], *g2[3];
        DT_ASSERT_OK(dt_attention(tq, tk, tv, H, 1, &y1));
        DT_ASSERT_OK(dt_attention_gqa(tq, tk, tv, H, H, 1, &y2));
        CU_ASSERT_TRUE(dt_layout_equal(dt_tensor_layout(y1), dt_tensor_layout(y2)));
        ot_fetch(y1, a);
        ot_fetch(y2, b);
        CU_ASSERT_EQUAL(memcmp(a, b, sizeof a), 0);
        DT_ASSERT_OK(dt_attention_backward(tq, tk, tv, H, 1, tdy, &g1[0], &g1[1], &g1[2]));
        DT_ASSERT_OK(dt_attention_gqa_backward(tq, tk, tv, H, H, 1, tdy, &g2[0], &g2[1], &g2[2]));
        for (int j = 0; j < 3; j++) {
            ot_fetch(g1[j], a);
            ot_fetch(g2[j], b);
            CU_ASSERT_EQUAL(memcmp(a, b, sizeof a), 0);
            dt_tensor_destroy(g1[j]);
            dt_tensor_destroy(g2[j]);
        }
        dt_tensor_destroy(y1);
        dt_tensor_destroy(y2);
        dt_tensor_destroy(tq);
        dt_tensor_destroy(tk);
        dt_tensor_destroy(tv);
        dt_tensor_destroy(tdy);
        dt_layout_destroy(l);
    }
    dt_mesh_destroy(m);
}

static void test_llama_ops_reject_bad_operands(void)
{
    dt_mesh *m = ot_mesh_1d();
    dt_layout *l3 = lay(m, 3, NULL), *l1 = lay(m, 1, NULL);
    int64_t s[3] = {B, T, C}, sk[3] = {B, T, CK + 2}, s1[1] = {C + 1};
    float *z = calloc(N, sizeof(float));
    dt_tensor *x = ot_tensor(l3, DT_DTYPE_F32, s, z), *kbad = ot_tensor(l3, DT_DTYPE_F32, sk, z);
    dt_tensor *gbad = ot_tensor(l1, DT_DTYPE_F32, s1, z), *out = NULL;
    DT_ASSERT_FAILS(dt_rms_norm(x, gbad, 1e-5f, &out), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_rope(x, 3, 0, &out), DT_ERR_SHAPE);     /* 3 does not divide 16 */
    DT_ASSERT_FAILS(dt_rope(x, C, 0, &out), DT_ERR_SHAPE);     /* head_dim 1 is odd */
    DT_ASSERT_FAILS(dt_rope(x, H, -1, &out), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_swiglu(x, kbad, &out), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_attention_gqa(x, kbad, kbad, H, HKV, 1, &out), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_attention_gqa(x, x, x, H, 3, 1, &out), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("kv_heads");
    CU_ASSERT_PTR_NULL(out);
    free(z);
    dt_tensor_destroy(x);
    dt_tensor_destroy(kbad);
    dt_tensor_destroy(gbad);
    dt_layout_destroy(l3);
    dt_layout_destroy(l1);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_rms_norm_gathers_only_the_last_dim),
        DT_TEST(test_rope_rotates_every_block_at_its_global_positions_without_gathering),
        DT_TEST(test_swiglu_keeps_the_gate_layout),
        DT_TEST(test_gqa_keeps_whole_kv_groups_on_each_device),
        DT_TEST(test_gqa_with_as_many_kv_heads_gives_the_bits_of_attention),
        DT_TEST(test_llama_ops_reject_bad_operands),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "spmd_llama", cases, 1);
}
