/* dt_attention and dt_attention_gqa on the tiled kernel across meshes and layouts (heads and
 * batch sharded, the sequence sharded, replicated) against the tiled kernel on the whole
 * tensors (same bits where each device runs whole query rows; a sequence-sharded q on a CPU
 * mesh takes the ring, ops/attention_ring.c, whose y, dq, dk, dv agree within 1e-5) and the
 * f64 reference. GPU meshes gather the sequence. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref.h"
#include "harness.h"
#include "../ops/ops_test_util.h"

/* T: odd, a query/key block of 128 and a tail; 8 heads split over 2, 4 or 8 devices. */
#define B 2
#define T 203
#define H 8
#define D 4
#define C (H * D)
#define N (B * T * C)

static dt_layout *lay3(const dt_mesh *m, const char *s0, const char *s1, const char *s2)
{
    const char *s[3] = {s0 ? s0 : DT_UNSHARDED, s1 ? s1 : DT_UNSHARDED, s2 ? s2 : DT_UNSHARDED};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(m, 3, s, &l));
    return l;
}

/* kv: the key/value heads (H: dt_attention; fewer: dt_attention_gqa). */
static void check_layouts(int64_t kv)
{
    int64_t nk = B * T * kv * D;
    float *f = malloc((size_t)(6 * N + 6 * nk) * sizeof *f);
    float *q = f, *dy = q + N, *y = dy + N, *dq = y + N, *got = dq + N, *got2 = got + N;
    float *k = got2 + N, *v = k + nk, *dk = v + nk, *dv = dk + nk, *gk = dv + nk, *gv = gk + nk;
    double *d = malloc((size_t)(2 * N + 2 * nk) * sizeof *d);
    double *ry = d, *rdq = ry + N, *rdk = rdq + N, *rdv = rdk + nk;
    ot_fill_real(q, N, -1.5f, 1.5f, 60);
    ot_fill_real(k, nk, -1.5f, 1.5f, 61);
    ot_fill_real(v, nk, -1, 1, 62);
    ot_fill_real(dy, N, -1, 1, 63);
    attn_ref(B, T, H, kv, D, 1, q, k, v, dy, ry, NULL, rdq, rdk, rdv);
    DT_ASSERT_OK(dt_kernel_attention_tiled(B, T, H, kv, D, 1, q, k, v, y, NULL));
    DT_ASSERT_OK(dt_kernel_attention_tiled_grad(B, T, H, kv, D, 1, q, k, v, dy, dq, dk, dv));
    CU_ASSERT(attn_rel_err(y, ry, N) < 1e-5);
    CU_ASSERT(attn_rel_err(dq, rdq, N) < 1e-5);
    CU_ASSERT(attn_rel_err(dk, rdk, nk) < 1e-5);
    CU_ASSERT(attn_rel_err(dv, rdv, nk) < 1e-5);

    int64_t sq[3] = {B, T, C}, sk[3] = {B, T, kv * D};
    for (int two = 0; two < 2; two++) {
        dt_mesh *m = two ? ot_mesh_2d() : ot_mesh_1d();
        const char *w = two ? "m" : "x", *bd = two ? "b" : NULL;
        /* heads sharded (with the batch on b), the sequence sharded, replicated */
        const char *specs[3][3] = {{bd, NULL, w}, {NULL, w, NULL}, {NULL, NULL, NULL}};
        for (int i = 0; i < 3; i++) {
            dt_layout *l = lay3(m, specs[i][0], specs[i][1], specs[i][2]);
            dt_tensor *tq = ot_tensor(l, DT_DTYPE_F32, sq, q),
                      *tk = ot_tensor(l, DT_DTYPE_F32, sk, k);
            dt_tensor *tv = ot_tensor(l, DT_DTYPE_F32, sk, v),
                      *tdy = ot_tensor(l, DT_DTYPE_F32, sq, dy);
            dt_tensor *ty = NULL, *g[3] = {NULL, NULL, NULL};
            if (kv == H)
                DT_ASSERT_OK(dt_attention(tq, tk, tv, H, 1, &ty));
            else
                DT_ASSERT_OK(dt_attention_gqa(tq, tk, tv, H, kv, 1, &ty));
            /* The sequence-sharded path (the ring): within rounding of the whole kernel. */
            int wd = dt_mesh_dim_index(m, w);
            int cp = i == 1 && dt_test_device_type() == DT_DEVICE_CPU;
            float tol = cp ? 1e-5f : 0.0f;
            ot_fetch(ty, got);
            CU_ASSERT_EQUAL(ot_mismatches("attention", got, y, N, tol, tol), 0);
            CU_ASSERT(attn_rel_err(got, ry, N) < 1e-5);
            /* Whole heads per device: the width stays sharded (no communication). */
            if (i == 0 && kv % dt_mesh_dim_size(m, wd) == 0)
                CU_ASSERT_EQUAL(ot_spec(ty, 2), wd);
            /* The sequence-sharded path: the output stays sharded along the sequence. */
            CU_ASSERT_EQUAL(ot_spec(ty, 1), cp ? wd : -1);
            if (kv == H)
                DT_ASSERT_OK(dt_attention_backward(tq, tk, tv, H, 1, tdy, &g[0], &g[1], &g[2]));
            else
                DT_ASSERT_OK(
                    dt_attention_gqa_backward(tq, tk, tv, H, kv, 1, tdy, &g[0], &g[1], &g[2]));
            ot_fetch(g[0], got);
            CU_ASSERT_EQUAL(ot_mismatches("attention dq", got, dq, N, tol, tol), 0);
            CU_ASSERT(attn_rel_err(got, rdq, N) < 1e-5);
            ot_fetch(g[1], gk);
            CU_ASSERT_EQUAL(ot_mismatches("attention dk", gk, dk, nk, tol, tol), 0);
            CU_ASSERT(attn_rel_err(gk, rdk, nk) < 1e-5);
            ot_fetch(g[2], gv);
            CU_ASSERT_EQUAL(ot_mismatches("attention dv", gv, dv, nk, tol, tol), 0);
            CU_ASSERT(attn_rel_err(gv, rdv, nk) < 1e-5);
            if (cp) /* dk, dv reduce-scattered back along the sequence */
                CU_ASSERT_EQUAL(ot_spec(g[1], 1), wd);
            for (int j = 0; j < 3; j++)
                dt_tensor_destroy(g[j]);
            dt_tensor_destroy(ty);
            dt_tensor_destroy(tq);
            dt_tensor_destroy(tk);
            dt_tensor_destroy(tv);
            dt_tensor_destroy(tdy);
            dt_layout_destroy(l);
        }
        dt_mesh_destroy(m);
    }
    (void)got2;
    free(d);
    free(f);
}

static void test_attention_on_the_tiled_kernel_in_every_layout(void)
{
    dt_attention_kernel was = dt_attention_kernel_set(DT_ATTENTION_KERNEL_TILED);
    check_layouts(H);
    dt_attention_kernel_set(was);
}

static void test_gqa_on_the_tiled_kernel_in_every_layout(void)
{
    dt_attention_kernel was = dt_attention_kernel_set(DT_ATTENTION_KERNEL_TILED);
    check_layouts(H / 2);
    dt_attention_kernel_set(was);
}

/* The tape over the sequence-sharded path: q, k, v sharded along the sequence, y's
 * gradients to them against the kernel's (within rounding: dk, dv are sums of shares). */
static void test_the_tape_through_a_sequence_sharded_attention(void)
{
    dt_attention_kernel was = dt_attention_kernel_set(DT_ATTENTION_KERNEL_TILED);
    float *f = malloc(10 * N * sizeof *f);
    float *q = f, *k = q + N, *v = k + N, *dy = v + N, *y = dy + N,
          *want[3] = {y + N, y + 2 * N, y + 3 * N};
    float *got = y + 4 * N;
    ot_fill_real(q, N, -1.5f, 1.5f, 80);
    ot_fill_real(k, N, -1.5f, 1.5f, 81);
    ot_fill_real(v, N, -1, 1, 82);
    ot_fill_real(dy, N, -1, 1, 83);
    DT_ASSERT_OK(
        dt_kernel_attention_tiled_grad(B, T, H, H, D, 1, q, k, v, dy, want[0], want[1], want[2]));
    dt_mesh *m = ot_mesh_2d();
    dt_layout *l = lay3(m, "b", "m", NULL);
    int64_t sq[3] = {B, T, C};
    dt_tensor *in[3] = {ot_tensor(l, DT_DTYPE_F32, sq, q), ot_tensor(l, DT_DTYPE_F32, sq, k),
                        ot_tensor(l, DT_DTYPE_F32, sq, v)};
    dt_tensor *tdy = ot_tensor(l, DT_DTYPE_F32, sq, dy), *ty = NULL;
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    for (int j = 0; j < 3; j++)
        DT_ASSERT_OK(dt_tape_watch(tape, in[j], j));
    DT_ASSERT_OK(dt_tape_begin(tape));
    DT_ASSERT_OK(dt_attention(in[0], in[1], in[2], H, 1, &ty));
    DT_ASSERT_OK(dt_tape_end(tape));
    DT_ASSERT_OK(dt_tape_backward(tape, ty, tdy, 0, NULL));
    for (int j = 0; j < 3; j++) {
        const dt_tensor *g = NULL;
        DT_ASSERT_OK(dt_tape_grad(tape, j, &g));
        ot_fetch(g, got);
        CU_ASSERT_EQUAL(ot_mismatches("tape grad", got, want[j], N, 1e-5f, 1e-5f), 0);
    }
    dt_tape_destroy(tape);
    dt_tensor_destroy(ty);
    dt_tensor_destroy(tdy);
    for (int j = 0; j < 3; j++)
        dt_tensor_destroy(in[j]);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    free(f);
    dt_attention_kernel_set(was);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_attention_on_the_tiled_kernel_in_every_layout),
        DT_TEST(test_gqa_on_the_tiled_kernel_in_every_layout),
        DT_TEST(test_the_tape_through_a_sequence_sharded_attention),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "attention_spmd", cases);
}
