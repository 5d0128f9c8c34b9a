/* Ring attention (ops/attention_ring.c): dt_attention / dt_attention_gqa and their backward
 * on q, k, v sharded along the sequence over a mesh dim "seq" (alone, inner or outer beside a
 * batch dim) against the tiled kernel on the whole tensors (what dt_attention gives on
 * unsharded tensors) within 1e-5 (absolute + relative) and the f64 reference within 1e-5
 * (relative to the largest value), causal and not, sequence lengths odd, not divisible by
 * 2 cp, shorter than 2 cp. The outputs stay sharded along the sequence. CPU meshes only (GPU
 * meshes gather the sequence). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref.h"
#include "harness.h"
#include "../ops/ops_test_util.h"

#define B   2
#define H   4
#define D   8
#define C   (H * D)
#define TOL 1e-5f

/* Mesh: 0 "seq" alone; 1 "b" x "seq"; 2 "seq" x "b" (the ring's neighbours 2 positions apart). */
static dt_mesh *ring_mesh(int kind)
{
    int64_t n = dt_test_num_devices();
    const char *n1[1] = {"seq"}, *n2[2] = {"b", "seq"}, *n3[2] = {"seq", "b"};
    int64_t s1[1] = {n}, s2[2] = {2, n / 2}, s3[2] = {n / 2, 2};
    dt_mesh *m = NULL;
    if (kind == 0)
        DT_ASSERT_OK(dt_mesh_create("ring", 1, n1, s1, DT_DEVICE_CPU, &m));
    else
        DT_ASSERT_OK(
            dt_mesh_create("ring", 2, kind == 1 ? n2 : n3, kind == 1 ? s2 : s3, DT_DEVICE_CPU, &m));
    return m;
}

static void check(int64_t T, int64_t kv, int causal, int kind)
{
    int64_t nq = B * T * C, nk = B * T * kv * D;
    float *f = malloc((size_t)(6 * nq + 6 * nk) * sizeof *f);
    float *q = f, *dy = q + nq, *y = dy + nq, *dq = y + nq, *got = dq + nq;
    float *k = got + nq, *v = k + nk, *dk = v + nk, *dv = dk + nk, *gk = dv + nk;
    double *d = malloc((size_t)(2 * nq + 2 * nk) * sizeof *d);
    double *ry = d, *rdq = ry + nq, *rdk = rdq + nq, *rdv = rdk + nk;
    ot_fill_real(q, nq, -1.5f, 1.5f, 90 + (uint64_t)T);
    ot_fill_real(k, nk, -1.5f, 1.5f, 91);
    ot_fill_real(v, nk, -1, 1, 92);
    ot_fill_real(dy, nq, -1, 1, 93);
    attn_ref(B, T, H, kv, D, causal, q, k, v, dy, ry, NULL, rdq, rdk, rdv);
    DT_ASSERT_OK(dt_kernel_attention_tiled(B, T, H, kv, D, causal, q, k, v, y, NULL));
    DT_ASSERT_OK(dt_kernel_attention_tiled_grad(B, T, H, kv, D, causal, q, k, v, dy, dq, dk, dv));

    dt_mesh *m = ring_mesh(kind);
    const char *s[3] = {kind ? "b" : DT_UNSHARDED, "seq", DT_UNSHARDED};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(m, 3, s, &l));
    int64_t sq[3] = {B, T, C}, sk[3] = {B, T, kv * D};
    dt_tensor *tq = ot_tensor(l, DT_DTYPE_F32, sq, q), *tk = ot_tensor(l, DT_DTYPE_F32, sk, k);
    dt_tensor *tv = ot_tensor(l, DT_DTYPE_F32, sk, v), *tdy = ot_tensor(l, DT_DTYPE_F32, sq, dy);
    dt_tensor *ty = NULL, *g[3] = {NULL, NULL, NULL};
    if (kv == H)
        DT_ASSERT_OK(dt_attention(tq, tk, tv, H, causal, &ty));
    else
        DT_ASSERT_OK(dt_attention_gqa(tq, tk, tv, H, kv, causal, &ty));
    int sd = dt_mesh_dim_index(m, "seq");
    CU_ASSERT_EQUAL(ot_spec(ty, 1), sd); /* the ring keeps the sequence sharded */
    ot_fetch(ty, got);
    CU_ASSERT_EQUAL(ot_mismatches("ring y", got, y, nq, TOL, TOL), 0);
    CU_ASSERT(attn_rel_err(got, ry, nq) < 1e-5);
    if (kv == H)
        DT_ASSERT_OK(dt_attention_backward(tq, tk, tv, H, causal, tdy, &g[0], &g[1], &g[2]));
    else
        DT_ASSERT_OK(
            dt_attention_gqa_backward(tq, tk, tv, H, kv, causal, tdy, &g[0], &g[1], &g[2]));
    ot_fetch(g[0], got);
    CU_ASSERT_EQUAL(ot_mismatches("ring dq", got, dq, nq, TOL, TOL), 0);
    CU_ASSERT(attn_rel_err(got, rdq, nq) < 1e-5);
    ot_fetch(g[1], gk);
    CU_ASSERT_EQUAL(ot_mismatches("ring dk", gk, dk, nk, TOL, TOL), 0);
    CU_ASSERT(attn_rel_err(gk, rdk, nk) < 1e-5);
    ot_fetch(g[2], gk);
    CU_ASSERT_EQUAL(ot_mismatches("ring dv", gk, dv, nk, TOL, TOL), 0);
    CU_ASSERT(attn_rel_err(gk, rdv, nk) < 1e-5);
    for (int j = 0; j < 3; j++) {
        CU_ASSERT_EQUAL(ot_spec(g[j], 1), sd);
        dt_tensor_destroy(g[j]);
    }
    dt_tensor_destroy(ty);
    dt_tensor_destroy(tq);
    dt_tensor_destroy(tk);
    dt_tensor_destroy(tv);
    dt_tensor_destroy(tdy);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    free(d);
    free(f);
}

/* Odd, not divisible by 2 cp, shorter than 2 cp, two key blocks of 128 and a tail (own
 * contiguous shards); divisible by 2 cp for every cp here (causal: zig-zag chunks). */
static const int64_t lengths[] = {7, 203, 261, 256};

static void run(int64_t kv)
{
    dt_attention_kernel was = dt_attention_kernel_set(DT_ATTENTION_KERNEL_TILED);
    int kinds = dt_test_num_devices() >= 2 && dt_test_num_devices() % 2 == 0 ? 3 : 1;
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++)
        for (int causal = 0; causal < 2; causal++)
            for (int kind = 0; kind < kinds; kind++)
                check(lengths[i], kv, causal, kind);
    dt_attention_kernel_set(was);
}

static void test_ring_attention_equals_the_unsharded_kernel(void)
{
    run(H);
}

static void test_ring_gqa_equals_the_unsharded_kernel(void)
{
    run(H / 2);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_ring_attention_equals_the_unsharded_kernel),
        DT_TEST(test_ring_gqa_equals_the_unsharded_kernel),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "attention_ring", cases);
}
