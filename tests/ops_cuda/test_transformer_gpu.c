/* The transformer ops on a 2 x 2 GPU mesh (the simulator in every build; a CUDA GPU where one
 * is present) against the CPU kernels on the whole host arrays: projection, layer norm,
 * softmax, head-parallel attention, vocabulary-sharded embedding and cross-entropy, forward and
 * backward. Exits 77 (skip) without GPU devices. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "../ops/ops_test_util.h"

#define B 4
#define T 5
#define C 8
#define H 4
#define V 12
#define N (B * T * C)

static dt_mesh *gpu, *cpu;

static dt_layout *lay(const dt_mesh *m, int rank, const char *s0, const char *s1,
                      const char *s2)
{
    const char *s[3] = {s0 ? s0 : DT_UNSHARDED, s1 ? s1 : DT_UNSHARDED, s2 ? s2 : DT_UNSHARDED};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(m, rank, s, &l));
    return l;
}

/* A GPU tensor of `layout` holding the host array. */
static dt_tensor *up(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                     const void *data)
{
    dt_layout *lc = lay(cpu, dt_layout_rank(layout), NULL, NULL, NULL);
    dt_tensor *c = ot_tensor(lc, dtype, shape, data), *g = NULL;
    DT_ASSERT_OK(dt_copy_to_mesh(c, layout, &g));
    dt_tensor_destroy(c);
    dt_layout_destroy(lc);
    return g;
}

/* The whole value of a GPU tensor (partial ones reduced) on the host. */
static void down(const dt_tensor *t, void *out)
{
    dt_layout *lc = lay(cpu, dt_tensor_rank(t), NULL, NULL, NULL);
    dt_tensor *c = NULL;
    DT_ASSERT_OK(dt_copy_to_mesh(t, lc, &c));
    ot_fetch(c, out);
    dt_tensor_destroy(c);
    dt_layout_destroy(lc);
}

static void check(const char *what, const dt_tensor *t, const float *want, int64_t n)
{
    float got[N * 2];
    CU_ASSERT_FATAL(n <= N * 2);
    down(t, got);
    CU_ASSERT_EQUAL(ot_mismatches(what, got, want, n, 1e-6f, 1e-5f), 0);
}

static void run_ops(void)
{
    float x[N], g[C], b[C], dy[N], w[C * C], y[N], dx[N], dg[C], db[C], dw[C * C];
    float q[N], k[N], v[N], dq[N], dk[N], dv[N], table[V * C], emb[N], dtab[V * C];
    float logits[B * T * V], dlog[B * T * V], loss;
    int32_t ids[B * T], labels[B * T];
    ot_fill_real(x, N, -2, 2, 1);
    ot_fill_real(g, C, 0.5f, 1.5f, 2);
    ot_fill_real(b, C, -1, 1, 3);
    ot_fill_real(dy, N, -1, 1, 4);
    ot_fill_real(w, C * C, -1, 1, 5);
    ot_fill_real(q, N, -1, 1, 6);
    ot_fill_real(k, N, -1, 1, 7);
    ot_fill_real(v, N, -1, 1, 8);
    ot_fill_real(table, V * C, -1, 1, 9);
    ot_fill_real(logits, B * T * V, -3, 3, 10);
    for (int i = 0; i < B * T; i++) {
        ids[i] = (i * 5 + 2) % V;
        labels[i] = i % 7 == 3 ? -1 : (i * 7 + 1) % V;
    }
    int64_t s3[3] = {B, T, C}, s1[1] = {C}, sw[2] = {C, C}, si[2] = {B, T}, st[2] = {V, C};
    int64_t sl[3] = {B, T, V};
    dt_layout *lact = lay(gpu, 3, "b", NULL, NULL), *lhead = lay(gpu, 3, "b", NULL, "m");
    dt_layout *lrep1 = lay(gpu, 1, NULL, NULL, NULL), *lcol = lay(gpu, 2, NULL, "m", NULL);
    dt_layout *lids = lay(gpu, 2, "b", NULL, NULL), *lvoc = lay(gpu, 2, "m", NULL, NULL);
    dt_tensor *tx = up(lact, DT_DTYPE_F32, s3, x), *tdy = up(lact, DT_DTYPE_F32, s3, dy);
    dt_tensor *tg = up(lrep1, DT_DTYPE_F32, s1, g), *tb = up(lrep1, DT_DTYPE_F32, s1, b);
    dt_tensor *out = NULL, *o2 = NULL, *o3 = NULL;

    /* Column-parallel projection and its gradients. */
    dt_tensor *tw = up(lcol, DT_DTYPE_F32, sw, w);
    DT_ASSERT_OK(dt_kernel_gemm(0, 0, B * T, C, C, 1, x, DT_DTYPE_F32, C, w, DT_DTYPE_F32, C, 0,
                                y, C));
    DT_ASSERT_OK(dt_matmul_nd(tx, tw, 0, 0, NULL, &out));
    check("projection", out, y, N);
    dt_tensor_destroy(out);
    DT_ASSERT_OK(dt_kernel_gemm(0, 1, B * T, C, C, 1, dy, DT_DTYPE_F32, C, w, DT_DTYPE_F32, C, 0,
                                dx, C));
    DT_ASSERT_OK(dt_kernel_gemm(1, 0, C, C, B * T, 1, x, DT_DTYPE_F32, C, dy, DT_DTYPE_F32, C, 0,
                                dw, C));
    DT_ASSERT_OK(dt_matmul_nd_backward(tx, tw, 0, 0, tdy, NULL, NULL, &out, &o2));
    check("projection dx", out, dx, N);
    check("projection dw", o2, dw, C * C);
    dt_tensor_destroy(out);
    dt_tensor_destroy(o2);

    /* Layer norm and softmax. */
    DT_ASSERT_OK(dt_kernel_layer_norm(B * T, C, x, g, b, 1e-5f, y));
    DT_ASSERT_OK(dt_layer_norm(tx, tg, tb, 1e-5f, &out));
    check("layer_norm", out, y, N);
    dt_tensor_destroy(out);
    DT_ASSERT_OK(dt_kernel_layer_norm_grad(B * T, C, x, g, dy, 1e-5f, dx, dg, db));
    DT_ASSERT_OK(dt_layer_norm_backward(tx, tg, tdy, 1e-5f, &out, &o2, &o3));
    check("layer_norm dx", out, dx, N);
    check("layer_norm dgamma", o2, dg, C);
    check("layer_norm dbeta", o3, db, C);
    dt_tensor_destroy(out);
    dt_tensor_destroy(o2);
    dt_tensor_destroy(o3);
    DT_ASSERT_OK(dt_kernel_softmax(B, T, C, x, y));
    DT_ASSERT_OK(dt_softmax(tx, 1, &out));
    check("softmax", out, y, N);
    DT_ASSERT_OK(dt_kernel_softmax_grad(B, T, C, y, dy, dx));
    DT_ASSERT_OK(dt_softmax_backward(out, tdy, 1, &o2));
    check("softmax dx", o2, dx, N);
    dt_tensor_destroy(out);
    dt_tensor_destroy(o2);

    /* Attention with the heads over m. */
    dt_tensor *tq = up(lhead, DT_DTYPE_F32, s3, q), *tk = up(lhead, DT_DTYPE_F32, s3, k);
    dt_tensor *tv = up(lhead, DT_DTYPE_F32, s3, v), *tdyh = up(lhead, DT_DTYPE_F32, s3, dy);
    DT_ASSERT_OK(dt_kernel_attention(B, T, H, C / H, 1, q, k, v, y));
    DT_ASSERT_OK(dt_attention(tq, tk, tv, H, 1, &out));
    check("attention", out, y, N);
    dt_tensor_destroy(out);
    dt_tensor *gq = NULL, *gk = NULL, *gv = NULL;
    DT_ASSERT_OK(dt_kernel_attention_grad(B, T, H, C / H, 1, q, k, v, dy, dq, dk, dv));
    DT_ASSERT_OK(dt_attention_backward(tq, tk, tv, H, 1, tdyh, &gq, &gk, &gv));
    check("attention dq", gq, dq, N);
    check("attention dk", gk, dk, N);
    check("attention dv", gv, dv, N);
    dt_tensor_destroy(gq);
    dt_tensor_destroy(gk);
    dt_tensor_destroy(gv);

    /* Vocabulary-sharded embedding and cross-entropy (with ignored rows). */
    dt_tensor *tt = up(lvoc, DT_DTYPE_F32, st, table), *ti = up(lids, DT_DTYPE_I32, si, ids);
    DT_ASSERT_OK(dt_kernel_embedding(B * T, ids, 0, V, V, C, table, emb));
    DT_ASSERT_OK(dt_embedding(tt, ti, NULL, &out));
    check("embedding", out, emb, N);
    dt_tensor_destroy(out);
    DT_ASSERT_OK(dt_kernel_embedding_grad(B * T, ids, 0, V, V, C, dy, dtab));
    DT_ASSERT_OK(dt_embedding_backward(tt, ti, tdy, NULL, &out));
    check("embedding grad", out, dtab, V * C);
    dt_tensor_destroy(out);
    /* Ids outside the table fail (found on the device, reported at the op's sync), forward
     * and backward; the next lookup is exact again (nothing stale is left behind). */
    const int32_t bad[2] = {V, -1};
    for (int j = 0; j < 2; j++) {
        int32_t wrong[B * T];
        memcpy(wrong, ids, sizeof wrong);
        wrong[7] = bad[j];
        char want[48];
        snprintf(want, sizeof want, "id %d (position", (int)bad[j]);
        dt_tensor *tbad = up(lids, DT_DTYPE_I32, si, wrong);
        out = NULL;
        DT_ASSERT_FAILS(dt_embedding(tt, tbad, NULL, &out), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS(want);
        DT_ASSERT_ERROR_MENTIONS("table of 12 rows");
        CU_ASSERT_PTR_NULL(out);
        DT_ASSERT_FAILS(dt_embedding_backward(tt, tbad, tdy, NULL, &out), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS(want);
        dt_tensor_destroy(tbad);
        DT_ASSERT_OK(dt_embedding(tt, ti, NULL, &out));
        check("embedding after a refused one", out, emb, N);
        dt_tensor_destroy(out);
    }
    float mx[B * T], se[B * T], tg2[B * T];
    DT_ASSERT_OK(dt_kernel_reduce_axis(DT_REDUCE_MAX, B * T, V, 1, logits, mx));
    DT_ASSERT_OK(dt_kernel_vocab_xent_stats(B * T, V, logits, mx, 0, V, labels, se, tg2));
    DT_ASSERT_OK(dt_kernel_vocab_xent_loss(B * T, mx, se, tg2, labels, 1.0f / (B * T), &loss));
    DT_ASSERT_OK(dt_kernel_vocab_xent_grad(B * T, V, logits, mx, se, 0, labels, 1.0f / (B * T),
                                           dlog));
    dt_layout *llog = lay(gpu, 3, "b", NULL, "m");
    dt_tensor *tl = up(llog, DT_DTYPE_F32, sl, logits), *tlab = up(lids, DT_DTYPE_I32, si, labels);
    double got = 0;
    DT_ASSERT_OK(dt_vocab_xent(tl, tlab, NULL, &out));
    DT_ASSERT_OK(dt_item(out, &got));
    CU_ASSERT(fabs(got - loss) < 1e-5);
    dt_tensor_destroy(out);
    DT_ASSERT_OK(dt_vocab_xent_backward(tl, tlab, 1.0f, &out));
    check("vocab xent grad", out, dlog, B * T * V);
    dt_tensor_destroy(out);

    dt_tensor *all[] = {tx, tdy, tg, tb, tw, tq, tk, tv, tdyh, tt, ti, tl, tlab};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dt_tensor_destroy(all[i]);
    dt_layout *ls[] = {lact, lhead, lrep1, lcol, lids, lvoc, llog};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
        dt_layout_destroy(ls[i]);
}

static void test_transformer_ops_on_a_gpu_mesh_match_the_cpu_kernels(void)
{
    const char *gn[2] = {"b", "m"}, *cn[1] = {"x"};
    int64_t gs[2] = {2, 2}, cs[1] = {dt_num_global_devices(DT_DEVICE_CPU)};
    DT_ASSERT_OK(dt_mesh_create("gpu", 2, gn, gs, DT_DEVICE_GPU, &gpu));
    DT_ASSERT_OK(dt_mesh_create("cpu", 1, cn, cs, DT_DEVICE_CPU, &cpu));
    run_ops();
    dt_mesh_destroy(gpu);
    dt_mesh_destroy(cpu);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_transformer_ops_on_a_gpu_mesh_match_the_cpu_kernels),
        DT_TEST_END,
    };
    return dt_test_main_gpu(argc, argv, "transformer_gpu", cases);
}
