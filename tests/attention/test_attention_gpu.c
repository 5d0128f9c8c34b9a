/* dt_attention and dt_attention_gqa with the tiled kernel chosen, on a GPU mesh (heads sharded
 * over every GPU device of the process), against the f64 reference: on the simulated
 * accelerator (the CPU tiled kernel) in every build, and on a CUDA GPU where one is present
 * (ops/cuda/attention_tiled.cu; exit 77, skipped, without one). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref.h"
#include "harness.h"
#include "../ops/ops_test_util.h"

static void check(dt_mesh *m, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int causal)
{
    int64_t nq = B * T * H * D, nk = B * T * KV * D;
    float *f = malloc((size_t)(3 * nq + 4 * nk) * sizeof *f);
    float *q = f, *dy = q + nq, *got = dy + nq, *k = got + nq, *v = k + nk, *gk = v + nk;
    float *gv = gk + nk;
    double *d = malloc((size_t)(2 * nq + 2 * nk) * sizeof *d);
    double *ry = d, *rdq = ry + nq, *rdk = rdq + nq, *rdv = rdk + nk;
    ot_fill_real(q, nq, -1.5f, 1.5f, 70);
    ot_fill_real(k, nk, -1.5f, 1.5f, 71);
    ot_fill_real(v, nk, -1, 1, 72);
    ot_fill_real(dy, nq, -1, 1, 73);
    attn_ref(B, T, H, KV, D, causal, q, k, v, dy, ry, NULL, rdq, rdk, rdv);
    const char *s[3] = {DT_UNSHARDED, DT_UNSHARDED, "x"};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(m, 3, s, &l));
    int64_t sq[3] = {B, T, H * D}, sk[3] = {B, T, KV * D};
    dt_tensor *tq = ot_tensor(l, DT_DTYPE_F32, sq, q), *tk = ot_tensor(l, DT_DTYPE_F32, sk, k);
    dt_tensor *tv = ot_tensor(l, DT_DTYPE_F32, sk, v), *tdy = ot_tensor(l, DT_DTYPE_F32, sq, dy);
    dt_tensor *ty = NULL, *g[3] = {NULL, NULL, NULL};
    if (KV == H) {
        DT_ASSERT_OK(dt_attention(tq, tk, tv, H, causal, &ty));
        DT_ASSERT_OK(dt_attention_backward(tq, tk, tv, H, causal, tdy, &g[0], &g[1], &g[2]));
    } else {
        DT_ASSERT_OK(dt_attention_gqa(tq, tk, tv, H, KV, causal, &ty));
        DT_ASSERT_OK(
            dt_attention_gqa_backward(tq, tk, tv, H, KV, causal, tdy, &g[0], &g[1], &g[2]));
    }
    ot_fetch(ty, got);
    double e[4];
    e[0] = attn_rel_err(got, ry, nq);
    ot_fetch(g[0], got);
    e[1] = attn_rel_err(got, rdq, nq);
    ot_fetch(g[1], gk);
    e[2] = attn_rel_err(gk, rdk, nk);
    ot_fetch(g[2], gv);
    e[3] = attn_rel_err(gv, rdv, nk);
    int bad = 0;
    for (int i = 0; i < 4; i++)
        bad |= !(e[i] < 5e-5);
    if (bad)
        printf("T %lld H %lld KV %lld D %lld causal %d: y %.2g dq %.2g dk %.2g dv %.2g\n",
               (long long)T, (long long)H, (long long)KV, (long long)D, causal, e[0], e[1], e[2],
               e[3]);
    CU_ASSERT(!bad);
    for (int j = 0; j < 3; j++)
        dt_tensor_destroy(g[j]);
    dt_tensor_destroy(ty);
    dt_tensor_destroy(tq);
    dt_tensor_destroy(tk);
    dt_tensor_destroy(tv);
    dt_tensor_destroy(tdy);
    dt_layout_destroy(l);
    free(d);
    free(f);
}

static void test_tiled_attention_on_a_gpu_mesh_matches_the_reference(void)
{
    int n = dt_num_global_devices(DT_DEVICE_GPU);
    const char *names[1] = {"x"};
    int64_t sizes[1] = {n};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("gpu", 1, names, sizes, DT_DEVICE_GPU, &m));
    dt_attention_kernel was = dt_attention_kernel_set(DT_ATTENTION_KERNEL_TILED);
    int64_t H = 4 * n;
    check(m, 2, 203, H, H, 16, 1);     /* 4 query blocks on CUDA, odd tail */
    check(m, 1, 70, H, H, 8, 0);       /* not causal */
    check(m, 1, 150, H, H / 2, 64, 1); /* grouped-query, head_dim 64 */
    dt_attention_kernel_set(was);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_tiled_attention_on_a_gpu_mesh_matches_the_reference),
        DT_TEST_END,
    };
    return dt_test_main_gpu(argc, argv, "attention_gpu", cases);
}
