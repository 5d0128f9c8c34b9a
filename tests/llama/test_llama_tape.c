/* The Llama-style ops on the autograd tape: each op's recorded backward gives the bits of its
 * explicit *_backward function on sharded layouts, and a chain of them (RMS norm, rotary,
 * GQA, SwiGLU) inside a checkpoint segment (recomputed) gives the bits of the plain tape. */
#include <stdlib.h>
#include <string.h>

#include "dtensor/autograd.h"
#include "harness.h"
#include "ops/ops_test_util.h"

#define B 4
#define T 6
#define H 4
#define HKV 2
#define HD 2
#define C (H * HD)
#define CK (HKV * HD)
#define N (B * T * C)

static dt_layout *lay3(const dt_mesh *m, const char *s0, const char *s2)
{
    const char *s[3] = {s0 ? s0 : DT_UNSHARDED, DT_UNSHARDED, s2 ? s2 : DT_UNSHARDED};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(m, 3, s, &l));
    return l;
}

/* Fetched tensors a and b are equal bit for bit (n floats). */
static void same_bits(const char *what, const dt_tensor *a, const dt_tensor *b, int n)
{
    float *x = calloc((size_t)n, sizeof(float)), *y = calloc((size_t)n, sizeof(float));
    ot_fetch(a, x);
    ot_fetch(b, y);
    CU_ASSERT_EQUAL(ot_mismatches(what, x, y, n, 0, 0), 0);
    free(x);
    free(y);
}

static void test_each_llama_op_on_the_tape_gives_its_explicit_backward(void)
{
    dt_mesh *m = ot_mesh_2d();
    dt_layout *lx = lay3(m, "b", "m"), *lr = lay3(m, "b", NULL), *lg = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 1, &lg));
    float x[N], u[N], dy[N], k[B * T * CK], v[B * T * CK], g[C];
    ot_fill_real(x, N, -1, 1, 1);
    ot_fill_real(u, N, -1, 1, 2);
    ot_fill_real(dy, N, -1, 1, 3);
    ot_fill_real(k, B * T * CK, -1, 1, 4);
    ot_fill_real(v, B * T * CK, -1, 1, 5);
    ot_fill_real(g, C, 0.5f, 1.5f, 6);
    int64_t s[3] = {B, T, C}, sk[3] = {B, T, CK}, sg[1] = {C};
    dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, s, x), *tu = ot_tensor(lx, DT_DTYPE_F32, s, u);
    dt_tensor *tr = ot_tensor(lr, DT_DTYPE_F32, s, x), *tdy = ot_tensor(lr, DT_DTYPE_F32, s, dy);
    dt_tensor *tk = ot_tensor(lx, DT_DTYPE_F32, sk, k), *tv = ot_tensor(lx, DT_DTYPE_F32, sk, v);
    dt_tensor *tg = ot_tensor(lg, DT_DTYPE_F32, sg, g);
    for (int op = 0; op < 4; op++) {
        dt_tape *tape = NULL;
        DT_ASSERT_OK(dt_tape_create(NULL, &tape));
        const dt_tensor *in[3] = {op == 0 ? tr : tx, op == 0 ? tg : (op == 2 ? tu : tk), tv};
        int nin = op == 0 || op == 2 ? 2 : (op == 1 ? 1 : 3);
        for (int i = 0; i < nin; i++)
            DT_ASSERT_OK(dt_tape_watch(tape, in[i], i));
        DT_ASSERT_OK(dt_tape_begin(tape));
        dt_tensor *y = NULL, *ref[3] = {NULL, NULL, NULL};
        if (op == 0)
            DT_ASSERT_OK(dt_rms_norm(tr, tg, 1e-5f, &y));
        else if (op == 1)
            DT_ASSERT_OK(dt_rope(tx, H, 2, &y));
        else if (op == 2)
            DT_ASSERT_OK(dt_swiglu(tx, tu, &y));
        else
            DT_ASSERT_OK(dt_attention_gqa(tx, tk, tv, H, HKV, 1, &y));
        DT_ASSERT_OK(dt_tape_backward(tape, y, tdy, 0, NULL));
        dt_tensor *dyl = NULL;
        DT_ASSERT_OK(dt_relayout(tdy, dt_tensor_layout(y), &dyl));
        if (op == 0)
            DT_ASSERT_OK(dt_rms_norm_backward(tr, tg, dyl, 1e-5f, &ref[0], &ref[1]));
        else if (op == 1)
            DT_ASSERT_OK(dt_rope_backward(dyl, H, 2, &ref[0]));
        else if (op == 2)
            DT_ASSERT_OK(dt_swiglu_backward(tx, tu, dyl, &ref[0], &ref[1]));
        else
            DT_ASSERT_OK(dt_attention_gqa_backward(tx, tk, tv, H, HKV, 1, dyl, &ref[0], &ref[1],
                                                   &ref[2]));
        for (int i = 0; i < nin; i++) {
            const dt_tensor *gi = NULL;
            DT_ASSERT_OK(dt_tape_grad(tape, i, &gi));
            CU_ASSERT_PTR_NOT_NULL_FATAL(gi);
            int64_t n = 1;
            for (int d = 0; d < dt_tensor_rank(gi); d++)
                n *= dt_tensor_shape(gi)[d];
            same_bits(dt_op_kind_name((dt_op_kind)(DT_OP_RMS_NORM + op)), gi, ref[i], (int)n);
            dt_tensor_destroy(ref[i]);
        }
        dt_tensor_destroy(dyl);
        dt_tensor_destroy(y);
        dt_tape_destroy(tape);
    }
    CU_ASSERT_STRING_EQUAL(dt_op_kind_name(DT_OP_ATTENTION_GQA), "attention_gqa");
    dt_tensor *all[] = {tx, tu, tr, tdy, tk, tv, tg};
    for (int i = 0; i < 7; i++)
        dt_tensor_destroy(all[i]);
    dt_layout_destroy(lx);
    dt_layout_destroy(lr);
    dt_layout_destroy(lg);
    dt_mesh_destroy(m);
}

/* rms_norm -> rope (as q and as k) -> gqa -> swiglu(out, x), optionally in a recomputed
 * segment; the gradients of x and the gain. */
static void chain_grads(int segment, float *dx_out, float *dg_out)
{
    dt_mesh *m = ot_mesh_2d();
    dt_layout *lx = lay3(m, "b", NULL), *lg = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 1, &lg));
    float x[N], dy[N], g[C];
    ot_fill_real(x, N, -1, 1, 10);
    ot_fill_real(dy, N, -1, 1, 11);
    ot_fill_real(g, C, 0.5f, 1.5f, 12);
    int64_t s[3] = {B, T, C}, sg[1] = {C};
    dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, s, x), *tdy = ot_tensor(lx, DT_DTYPE_F32, s, dy);
    dt_tensor *tg = ot_tensor(lg, DT_DTYPE_F32, sg, g);
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    DT_ASSERT_OK(dt_tape_watch(tape, tx, 0));
    DT_ASSERT_OK(dt_tape_watch(tape, tg, 1));
    DT_ASSERT_OK(dt_tape_begin(tape));
    dt_checkpoint_opts co = DT_CHECKPOINT_OPTS_INIT;
    if (segment)
        DT_ASSERT_OK(dt_tape_checkpoint_begin(tape, &co));
    dt_tensor *h = NULL, *q = NULL, *kv = NULL, *a = NULL, *y = NULL;
    DT_ASSERT_OK(dt_rms_norm(tx, tg, 1e-5f, &h));
    DT_ASSERT_OK(dt_rope(h, H, 0, &q));
    DT_ASSERT_OK(dt_rope(h, 2 * HKV, 0, &kv)); /* [B, T, C] seen as 2*HKV heads of HD */
    /* k = v = the first CK columns would need a slice; use GQA with kv heads = H here and
     * the grouped form in the explicit test above. */
    DT_ASSERT_OK(dt_attention_gqa(q, kv, h, H, H, 1, &a));
    DT_ASSERT_OK(dt_swiglu(a, tx, &y));
    if (segment)
        DT_ASSERT_OK(dt_tape_checkpoint_end(tape));
    DT_ASSERT_OK(dt_tape_backward(tape, y, tdy, 0, NULL));
    const dt_tensor *gx = NULL, *gg = NULL;
    DT_ASSERT_OK(dt_tape_grad(tape, 0, &gx));
    DT_ASSERT_OK(dt_tape_grad(tape, 1, &gg));
    ot_fetch(gx, dx_out);
    ot_fetch(gg, dg_out);
    if (segment) {
        dt_tape_stats st;
        DT_ASSERT_OK(dt_tape_get_stats(tape, &st));
        /* All but swiglu, whose output nothing in the segment reads. */
        CU_ASSERT_EQUAL(st.recomputed, 4);
    }
    dt_tensor *all[] = {h, q, kv, a, y, tx, tdy, tg};
    for (int i = 0; i < 8; i++)
        dt_tensor_destroy(all[i]);
    dt_tape_destroy(tape);
    dt_layout_destroy(lx);
    dt_layout_destroy(lg);
    dt_mesh_destroy(m);
}

static void test_a_recomputed_llama_chain_gives_the_bits_of_the_plain_tape(void)
{
    float dx0[N], dx1[N], dg0[C], dg1[C];
    chain_grads(0, dx0, dg0);
    chain_grads(1, dx1, dg1);
    CU_ASSERT_EQUAL(memcmp(dx0, dx1, sizeof dx0), 0);
    CU_ASSERT_EQUAL(memcmp(dg0, dg1, sizeof dg0), 0);
    /* Not trivially zero. */
    int nz = 0;
    for (int i = 0; i < C; i++)
        nz += dg0[i] != 0.0f;
    CU_ASSERT(nz > 0);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_each_llama_op_on_the_tape_gives_its_explicit_backward),
        DT_TEST(test_a_recomputed_llama_chain_gives_the_bits_of_the_plain_tape),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "llama_tape", cases, 1);
}
