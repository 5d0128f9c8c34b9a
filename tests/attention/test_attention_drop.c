/* Dropout of the attention probabilities (dt_kernel_attention_dropout, dt_attention_ex): the
 * f64 reference with the mask of dt_kernel_dropout_mask over the [B, H, T, T] probabilities
 * against its own finite differences; the untiled and tiled kernels against that reference
 * (causal and not, grouped-query, odd lengths); dt_attention_ex on batch-, head- and
 * sequence-sharded layouts (the ring on CPU meshes) against the kernel on the whole tensors;
 * the tape's gradient; bad options. np 1, 2, 4, CPU and the simulated GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref.h"
#include "harness.h"
#include "../ops/ops_test_util.h"

#define B    2
#define H    4
#define D    8
#define C    (H * D)
#define P    0.25f
#define SEED 1234u
#define STRM 56u

/* The mask of the [B, H, T, T] probabilities, from the public generator. */
static float *mask_of(int64_t T, float p)
{
    int64_t n = (int64_t)B * H * T * T;
    float *z = malloc((size_t)n * sizeof *z);
    DT_ASSERT_OK(dt_kernel_dropout_mask(0, n, p, SEED, STRM, z));
    return z;
}

/* sum y . w of the reference's output. */
static double ref_loss(int64_t T, int64_t kv, const float *z, const float *q, const float *k,
                       const float *v, const float *w)
{
    int64_t nq = B * T * C;
    double *y = malloc((size_t)nq * sizeof *y), l = 0;
    attn_ref_masked(B, T, H, kv, D, 1, z, q, k, v, NULL, y, NULL, NULL, NULL, NULL);
    for (int64_t i = 0; i < nq; i++)
        l += y[i] * w[i];
    free(y);
    return l;
}

/* The reference's gradient is its forward's: central differences on every input element. */
static void test_the_reference_gradient_matches_finite_differences(void)
{
    enum { T = 6, KV = 2 };
    int64_t nq = B * T * C, nk = B * T * KV * D;
    float *f = malloc((size_t)(2 * nq + 2 * nk) * sizeof *f);
    float *q = f, *w = q + nq, *k = w + nq, *v = k + nk;
    ot_fill_real(q, nq, -1, 1, 1);
    ot_fill_real(w, nq, -1, 1, 2);
    ot_fill_real(k, nk, -1, 1, 3);
    ot_fill_real(v, nk, -1, 1, 4);
    float *z = mask_of(T, 0.3f);
    double *g = malloc((size_t)(nq + 2 * nk) * sizeof *g);
    attn_ref_masked(B, T, H, KV, D, 1, z, q, k, v, w, NULL, NULL, g, g + nq, g + nq + nk);
    float *in[3] = {q, k, v};
    int64_t n[3] = {nq, nk, nk}, off[3] = {0, nq, nq + nk};
    double worst = 0;
    for (int a = 0; a < 3; a++)
        for (int64_t i = 0; i < n[a]; i++) {
            float x = in[a][i], hi = x + 1e-3f, lo = x - 1e-3f;
            in[a][i] = hi;
            double lp = ref_loss(T, KV, z, q, k, v, w);
            in[a][i] = lo;
            double lm = ref_loss(T, KV, z, q, k, v, w);
            in[a][i] = x;
            double fd = (lp - lm) / ((double)hi - (double)lo), e = fabs(fd - g[off[a] + i]);
            worst = e > worst ? e : worst;
        }
    CU_ASSERT(worst < 1e-4);
    free(g);
    free(z);
    free(f);
}

/* The kernel (untiled or tiled) against the reference; p = 0 gives dt_kernel_attention_gqa's
 * bits; the dropout changes the output. */
static void kernel_case(dt_attention_kernel kernel, int64_t T, int64_t kv, int causal)
{
    int64_t nq = B * T * C, nk = B * T * kv * D;
    float *f = malloc((size_t)(5 * nq + 5 * nk) * sizeof *f);
    float *q = f, *dy = q + nq, *y = dy + nq, *y0 = y + nq, *dq = y0 + nq;
    float *k = dq + nq, *v = k + nk, *dk = v + nk, *dv = dk + nk, *scratch = dv + nk;
    double *d = malloc((size_t)(3 * nq + 2 * nk) * sizeof *d);
    double *ry = d, *rdq = ry + nq, *rdk = rdq + nq, *rdv = rdk + nk, *rplain = rdv + nk;
    ot_fill_real(q, nq, -1.5f, 1.5f, 10 + (uint64_t)T);
    ot_fill_real(k, nk, -1.5f, 1.5f, 11);
    ot_fill_real(v, nk, -1, 1, 12);
    ot_fill_real(dy, nq, -1, 1, 13);
    float *z = mask_of(T, P);
    attn_ref_masked(B, T, H, kv, D, causal, z, q, k, v, dy, ry, NULL, rdq, rdk, rdv);
    attn_ref(B, T, H, kv, D, causal, q, k, v, NULL, rplain, NULL, NULL, NULL, NULL);
    dt_attention_kernel was = dt_attention_kernel_set(kernel);
    DT_ASSERT_OK(dt_kernel_attention_dropout(B, T, H, kv, D, causal, P, SEED, STRM, q, k, v, y));
    DT_ASSERT_OK(dt_kernel_attention_dropout_grad(B, T, H, kv, D, causal, P, SEED, STRM, q, k, v,
                                                  dy, dq, dk, dv));
    CU_ASSERT(attn_rel_err(y, ry, nq) < 1e-5);
    CU_ASSERT(attn_rel_err(dq, rdq, nq) < 1e-5);
    CU_ASSERT(attn_rel_err(dk, rdk, nk) < 1e-5);
    CU_ASSERT(attn_rel_err(dv, rdv, nk) < 1e-5);
    CU_ASSERT(attn_rel_err(y, rplain, nq) > 1e-2); /* the dropout did something */
    DT_ASSERT_OK(dt_kernel_attention_dropout(B, T, H, kv, D, causal, 0.0f, SEED, STRM, q, k, v,
                                             y));
    DT_ASSERT_OK(dt_kernel_attention_gqa(B, T, H, kv, D, causal, q, k, v, y0));
    CU_ASSERT_EQUAL(memcmp(y, y0, (size_t)nq * sizeof *y), 0);
    (void)scratch;
    dt_attention_kernel_set(was);
    free(z);
    free(d);
    free(f);
}

static void test_the_kernels_drop_what_the_reference_drops(void)
{
    static const int64_t lengths[] = {7, 203, 261};
    static const dt_attention_kernel kernels[] = {DT_ATTENTION_KERNEL_UNTILED,
                                                  DT_ATTENTION_KERNEL_TILED};
    for (int kn = 0; kn < 2; kn++)
        for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++)
            for (int causal = 0; causal < 2; causal++)
                for (int64_t kv = H; kv >= H / 2; kv /= 2)
                    kernel_case(kernels[kn], lengths[i], kv, causal);
}

/* Mesh dims: "x" over every device, or "b" x "m" (ot_mesh_2d). */
static dt_layout *lay(dt_mesh *m, const char *s0, const char *s1, const char *s2)
{
    const char *s[3] = {s0 ? s0 : DT_UNSHARDED, s1 ? s1 : DT_UNSHARDED,
                        s2 ? s2 : DT_UNSHARDED};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(m, 3, s, &l));
    return l;
}

/* dt_attention_ex and its backward on layout l against the kernel on the whole tensors: the
 * same bits where the sequence is gathered, within 1e-5 on the ring. */
static void layout_case(const dt_layout *l, int64_t T, int64_t kv, int ring)
{
    int64_t nq = B * T * C, nk = B * T * kv * D;
    float *f = malloc((size_t)(5 * nq + 5 * nk) * sizeof *f);
    float *q = f, *dy = q + nq, *y = dy + nq, *dq = y + nq, *got = dq + nq;
    float *k = got + nq, *v = k + nk, *dk = v + nk, *dv = dk + nk, *gk = dv + nk;
    ot_fill_real(q, nq, -1.5f, 1.5f, 20 + (uint64_t)T);
    ot_fill_real(k, nk, -1.5f, 1.5f, 21);
    ot_fill_real(v, nk, -1, 1, 22);
    ot_fill_real(dy, nq, -1, 1, 23);
    DT_ASSERT_OK(dt_kernel_attention_dropout(B, T, H, kv, D, 1, P, SEED, STRM, q, k, v, y));
    DT_ASSERT_OK(dt_kernel_attention_dropout_grad(B, T, H, kv, D, 1, P, SEED, STRM, q, k, v, dy,
                                                  dq, dk, dv));
    int64_t sq[3] = {B, T, C}, sk[3] = {B, T, kv * D};
    dt_tensor *tq = ot_tensor(l, DT_DTYPE_F32, sq, q), *tk = ot_tensor(l, DT_DTYPE_F32, sk, k);
    dt_tensor *tv = ot_tensor(l, DT_DTYPE_F32, sk, v), *tdy = ot_tensor(l, DT_DTYPE_F32, sq, dy);
    dt_attention_opts o = {.heads = H, .kv_heads = kv, .causal = 1, .dropout = P, .seed = SEED,
                           .stream = STRM};
    dt_tensor *ty = NULL, *g[3] = {NULL, NULL, NULL};
    DT_ASSERT_OK(dt_attention_ex(tq, tk, tv, &o, &ty));
    float tol = ring ? 1e-5f : 0.0f;
    if (ring)
        CU_ASSERT(ot_spec(ty, 1) >= 0); /* the ring keeps the sequence sharded */
    ot_fetch(ty, got);
    CU_ASSERT_EQUAL(ot_mismatches("dropout y", got, y, nq, tol, tol), 0);
    DT_ASSERT_OK(dt_attention_ex_backward(tq, tk, tv, &o, tdy, &g[0], &g[1], &g[2]));
    ot_fetch(g[0], got);
    CU_ASSERT_EQUAL(ot_mismatches("dropout dq", got, dq, nq, tol, tol), 0);
    ot_fetch(g[1], gk);
    CU_ASSERT_EQUAL(ot_mismatches("dropout dk", gk, dk, nk, tol, tol), 0);
    ot_fetch(g[2], gk);
    CU_ASSERT_EQUAL(ot_mismatches("dropout dv", gk, dv, nk, tol, tol), 0);
    for (int j = 0; j < 3; j++)
        dt_tensor_destroy(g[j]);
    dt_tensor_destroy(ty);
    dt_tensor_destroy(tq);
    dt_tensor_destroy(tk);
    dt_tensor_destroy(tv);
    dt_tensor_destroy(tdy);
    free(f);
}

static void test_every_layout_drops_what_one_device_drops(void)
{
    int cpu = dt_test_device_type() == DT_DEVICE_CPU;
    dt_mesh *m1 = ot_mesh_1d(), *m2 = dt_test_num_devices() >= 2 ? ot_mesh_2d() : NULL;
    dt_layout *ls[6] = {lay(m1, "x", NULL, NULL),
                        lay(m1, NULL, NULL, "x"),
                        lay(m1, NULL, "x", NULL),
                        m2 ? lay(m2, "b", NULL, "m") : NULL,
                        m2 ? lay(m2, "b", "m", NULL) : NULL,
                        m2 ? lay(m2, NULL, "m", "b") : NULL};
    /* T 64: the untiled kernel, every layout gathers the sequence; T 256: the tiled kernel,
     * and the sequence-sharded layouts (2, 4, 5: heads sharded too) run the ring on CPU
     * meshes. */
    static const int64_t lengths[2] = {64, 256};
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 6; i++)
            for (int64_t kv = H; ls[i] && kv >= H / 2; kv /= 2)
                layout_case(ls[i], lengths[t], kv,
                            cpu && t == 1 && (i == 2 || i >= 4) && dt_test_num_devices() > 1);
    for (int i = 0; i < 6; i++)
        dt_layout_destroy(ls[i]);
    dt_mesh_destroy(m2);
    dt_mesh_destroy(m1);
}

/* A recording tape gives dt_attention_ex_backward's gradients (the same mask). */
static void test_the_tape_uses_the_same_mask(void)
{
    enum { T = 40 };
    int64_t nq = B * T * C;
    float *f = malloc((size_t)(6 * nq) * sizeof *f);
    float *x[4] = {f, f + nq, f + 2 * nq, f + 3 * nq}, *want = f + 4 * nq, *got = f + 5 * nq;
    for (int i = 0; i < 4; i++)
        ot_fill_real(x[i], nq, -1, 1, 30 + (uint64_t)i);
    dt_mesh *m = ot_mesh_1d();
    dt_layout *l = lay(m, NULL, NULL, "x");
    int64_t s[3] = {B, T, C};
    dt_tensor *t[4];
    for (int i = 0; i < 4; i++)
        t[i] = ot_tensor(l, DT_DTYPE_F32, s, x[i]);
    dt_attention_opts o = {.heads = H, .causal = 1, .dropout = 0.5f, .seed = 9, .stream = 8};
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    for (int i = 0; i < 3; i++)
        DT_ASSERT_OK(dt_tape_watch(tape, t[i], i));
    DT_ASSERT_OK(dt_tape_begin(tape));
    dt_tensor *y = NULL, *g[3] = {NULL, NULL, NULL};
    DT_ASSERT_OK(dt_attention_ex(t[0], t[1], t[2], &o, &y));
    DT_ASSERT_OK(dt_tape_end(tape));
    DT_ASSERT_OK(dt_tape_backward(tape, y, t[3], 0, NULL));
    DT_ASSERT_OK(dt_attention_ex_backward(t[0], t[1], t[2], &o, t[3], &g[0], &g[1], &g[2]));
    for (int i = 0; i < 3; i++) {
        const dt_tensor *tg = NULL;
        DT_ASSERT_OK(dt_tape_grad(tape, i, &tg));
        ot_fetch(tg, got);
        ot_fetch(g[i], want);
        CU_ASSERT_EQUAL(ot_mismatches("tape grad", got, want, nq, 0, 0), 0);
        dt_tensor_destroy(g[i]);
    }
    dt_tensor_destroy(y);
    dt_tape_destroy(tape);
    for (int i = 0; i < 4; i++)
        dt_tensor_destroy(t[i]);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    free(f);
}

static void test_bad_options_are_refused(void)
{
    enum { T = 4 };
    float q[B * T * C] = {0}, y[B * T * C];
    CU_ASSERT_EQUAL(dt_kernel_attention_dropout(B, T, H, H, D, 1, 1.0f, 0, 0, q, q, q, y),
                    DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(dt_kernel_attention_dropout(B, T, H, 3, D, 1, 0.1f, 0, 0, q, q, q, y),
                    DT_ERR_INVALID_ARGUMENT);
    dt_mesh *m = ot_mesh_1d();
    dt_layout *l = lay(m, NULL, NULL, NULL);
    int64_t s[3] = {B, T, C};
    dt_tensor *t = ot_tensor(l, DT_DTYPE_F32, s, q), *out = NULL;
    CU_ASSERT_EQUAL(dt_attention_ex(t, t, t, NULL, &out), DT_ERR_INVALID_ARGUMENT);
    const float bad[3] = {1.0f, -0.1f, NAN};
    for (int i = 0; i < 3; i++) {
        dt_attention_opts o = {.heads = H, .dropout = bad[i]};
        CU_ASSERT_EQUAL(dt_attention_ex(t, t, t, &o, &out), DT_ERR_INVALID_ARGUMENT);
        CU_ASSERT(strstr(dt_last_error(), "dropout") != NULL);
    }
    dt_attention_opts o = {.heads = 3, .dropout = 0.1f};
    CU_ASSERT_EQUAL(dt_attention_ex(t, t, t, &o, &out), DT_ERR_SHAPE);
    CU_ASSERT_PTR_NULL(out);
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_the_reference_gradient_matches_finite_differences),
        DT_TEST(test_the_kernels_drop_what_the_reference_drops),
        DT_TEST(test_every_layout_drops_what_one_device_drops),
        DT_TEST(test_the_tape_uses_the_same_mask),
        DT_TEST(test_bad_options_are_refused),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "attention_prob_dropout", cases);
}
