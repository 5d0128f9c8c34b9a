/* Tiled (flash-attention style) attention on the CPU: blocks of BQ queries against blocks of BK
 * keys with an online softmax (running max and sum per query), causal blocks skipped, so the
 * memory is O(BQ x BK + BQ x head_dim) whatever the sequence; the gradient recomputes each
 * block's probabilities from the per-row log-sum-exp (kept as the max and the sum). The block
 * products are GEMMs, the exponentials ops/vmath.c's. docs/attention.md. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

/* A BQ x BK block of scores, its probabilities and their gradients: 64 KiB each, L2-resident;
 * the products are cblas_sgemm on the blocks (as dt_kernel_gemm's f32 path). */
#define BQ 128
#define BK 128

typedef struct work {
    float *acc;  /* [BQ, hd] the unnormalised output rows, then the output */
    float *s;    /* [BQ, BK] scores, then probabilities, then (backward) their gradient */
    float *dp;   /* [BQ, BK] dy v^T (backward) */
    float *m;    /* [BQ] running max of the scaled scores */
    float *inv;  /* [BQ] 1 / l */
    float *dsum; /* [BQ] dy . y (backward) */
    float *z;    /* [BK] one row's dropout keep factors */
    double *l;   /* [BQ] running sum of exp(score - m) */
} work;

static int work_new(int64_t hd, work *w)
{
    size_t nf = (size_t)BQ * (size_t)hd + 2 * (size_t)BQ * BK + 3 * BQ + BK;
    float *f = malloc(nf * sizeof *f);
    double *d = malloc(BQ * sizeof *d);
    if (!f || !d) {
        free(f);
        free(d);
        return 0;
    }
    w->acc = f;
    w->s = w->acc + (size_t)BQ * (size_t)hd;
    w->dp = w->s + (size_t)BQ * BK;
    w->m = w->dp + (size_t)BQ * BK;
    w->inv = w->m + BQ;
    w->dsum = w->inv + BQ;
    w->z = w->dsum + BQ;
    w->l = d;
    return 1;
}

static void work_free(work *w)
{
    free(w->acc);
    free(w->l);
}

/* Keys a query row t sees in the key block starting at j0 of nk keys. */
static int64_t row_keys(int causal, int64_t t, int64_t j0, int64_t nk)
{
    if (!causal)
        return nk;
    int64_t n = t - j0 + 1;
    return n < nk ? (n > 0 ? n : 0) : nk;
}

/* Keys a block of queries ending before position qend can see. */
static int64_t key_end(int causal, int64_t kv_seq, int64_t qend)
{
    return causal && qend < kv_seq ? qend : kv_seq;
}

/* c [m, n] (ldc) = alpha op(a) op(b) + beta c, row-major. */
static void sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* The scores of query rows i0.. (nq) against keys j0.. (nk) into w->s [nq, BK]. */
static void scores(int64_t hd, int64_t ld, int64_t kld, float scale, const float *q, const float *k,
                   int64_t i0, int64_t nq, int64_t j0, int64_t nk, work *w)
{
    sgemm(0, 1, nq, nk, hd, scale, q + i0 * ld, ld, k + j0 * kld, kld, 0.0f, w->s, BK);
}

/* The forward of query rows i0 .. i0+nq-1 of one (batch b, head h) of a query slice whose
 * row 0 sits at position qoff of the kv_seq keys: q, k, v point at the head's first element
 * (row strides ld for q, kld for k and v). Leaves w->acc normalised (the output rows), w->m,
 * w->l and w->inv the rows' max, sum and 1 / sum (log-sum-exp = m + log l). With drop, the
 * dropped probabilities add nothing to the output (the sums keep them). */
static void forward_block(int64_t kv_seq, int64_t qoff, int64_t hd, int64_t ld, int64_t kld,
                          int causal, float scale, const dt__attn_drop *drop, int64_t b,
                          int64_t h, const float *q, const float *k, const float *v, int64_t i0,
                          int64_t nq, work *w)
{
    memset(w->acc, 0, (size_t)nq * (size_t)hd * sizeof *w->acc);
    for (int64_t r = 0; r < nq; r++) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0;
    }
    int64_t kend = key_end(causal, kv_seq, qoff + i0 + nq); /* later key blocks all masked */
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        int64_t nk = kend - j0 < BK ? kend - j0 : BK;
        scores(hd, ld, kld, scale, q, k, i0, nq, j0, nk, w);
        for (int64_t r = 0; r < nq; r++) {
            float *sr = w->s + r * BK;
            int64_t n = row_keys(causal, qoff + i0 + r, j0, nk);
            float mx = w->m[r];
            for (int64_t j = 0; j < n; j++)
                mx = sr[j] > mx ? sr[j] : mx;
            float *ar = w->acc + r * hd;
            if (n > 0 && mx > w->m[r] && w->l[r] > 0.0) {
                /* A new max: rescale what the earlier blocks summed. */
                float d = w->m[r] - mx, alpha;
                dt__vexp(1, &d, &alpha);
                w->l[r] *= alpha;
                for (int64_t c = 0; c < hd; c++)
                    ar[c] *= alpha;
            }
            if (n > 0) {
                w->m[r] = mx;
                w->l[r] += dt__vexp_sum(n, sr, mx, sr);
            }
            for (int64_t j = n; j < nk; j++)
                sr[j] = 0.0f; /* masked */
            if (drop && n > 0) {
                dt__attn_drop_row(drop, b, h, i0 + r, j0, n, w->z);
                for (int64_t j = 0; j < n; j++)
                    sr[j] *= w->z[j];
            }
        }
        sgemm(0, 0, nq, hd, nk, 1.0f, w->s, BK, v + j0 * kld, kld, 1.0f, w->acc, hd);
    }
    for (int64_t r = 0; r < nq; r++) {
        w->inv[r] = (float)(1.0 / w->l[r]);
        float *ar = w->acc + r * hd;
        for (int64_t c = 0; c < hd; c++)
            ar[c] *= w->inv[r];
    }
}

dt_status dt__attention_tiled_run(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim, int causal, const dt__attn_drop *drop,
                                  const float *q, const float *k, const float *v, float *y,
                                  float *lse)
{
    return dt__attention_tiled_part(batch, seq, 0, seq, heads, kv_heads, head_dim, causal, drop, q,
                                    k, v, y, lse);
}

dt_status dt__attention_tiled_part(int64_t batch, int64_t seq, int64_t qoff, int64_t kv_seq,
                                   int64_t heads, int64_t kv_heads, int64_t head_dim, int causal,
                                   const dt__attn_drop *drop, const float *q, const float *k,
                                   const float *v, float *y, float *lse)
{
    dt__blas_threads_once(); /* as dt_kernel_gemm: OpenBLAS threads = cores / clients */
    work w;
    if (!work_new(head_dim, &w))
        return dt__error(DT_ERR_NO_MEMORY, "attention (tiled): out of memory");
    int64_t ld = heads * head_dim, kld = kv_heads * head_dim, group = heads / kv_heads;
    float scale = 1.0f / sqrtf((float)head_dim);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t base = b * seq * ld + h * head_dim;
            int64_t kbase = b * kv_seq * kld + (h / group) * head_dim;
            for (int64_t i0 = 0; i0 < seq; i0 += BQ) {
                int64_t nq = seq - i0 < BQ ? seq - i0 : BQ;
                forward_block(kv_seq, qoff, head_dim, ld, kld, causal, scale, drop, b, h, q + base,
                              k + kbase, v + kbase, i0, nq, &w);
                for (int64_t r = 0; r < nq; r++) {
                    memcpy(y + base + (i0 + r) * ld, w.acc + r * head_dim,
                           (size_t)head_dim * sizeof *y);
                    if (lse)
                        lse[(b * heads + h) * seq + i0 + r] = (float)((double)w.m[r] + log(w.l[r]));
                }
            }
        }
    work_free(&w);
    return DT_OK;
}

dt_status dt__attention_tiled_grad_run(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                       int64_t head_dim, int causal, const dt__attn_drop *drop,
                                       const float *q, const float *k, const float *v,
                                       const float *dy, float *dq, float *dk, float *dv)
{
    return dt__attention_tiled_grad_part(batch, seq, 0, seq, heads, kv_heads, head_dim, causal,
                                         drop, q, k, v, dy, dq, dk, dv, 0);
}

dt_status dt__attention_tiled_grad_part(int64_t batch, int64_t seq, int64_t qoff, int64_t kv_seq,
                                        int64_t heads, int64_t kv_heads, int64_t head_dim,
                                        int causal, const dt__attn_drop *drop, const float *q,
                                        const float *k, const float *v, const float *dy, float *dq,
                                        float *dk, float *dv, int accumulate)
{
    dt__blas_threads_once();
    work w;
    if (!work_new(head_dim, &w))
        return dt__error(DT_ERR_NO_MEMORY, "attention gradient (tiled): out of memory");
    int64_t total = batch * seq * heads * head_dim, ktotal = batch * kv_seq * kv_heads * head_dim;
    if (!accumulate) {
        memset(dq, 0, (size_t)total * sizeof *dq);
        memset(dk, 0, (size_t)ktotal * sizeof *dk);
        memset(dv, 0, (size_t)ktotal * sizeof *dv);
    }
    int64_t hd = head_dim, ld = heads * hd, kld = kv_heads * hd, group = heads / kv_heads;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t base = b * seq * ld + h * hd;
            int64_t kbase = b * kv_seq * kld + (h / group) * hd;
            const float *qh = q + base, *dyh = dy + base, *kh = k + kbase, *vh = v + kbase;
            float *dqh = dq + base, *dkh = dk + kbase, *dvh = dv + kbase;
            for (int64_t i0 = 0; i0 < seq; i0 += BQ) {
                int64_t nq = seq - i0 < BQ ? seq - i0 : BQ;
                /* The block's row statistics and output again (nothing was saved). */
                forward_block(kv_seq, qoff, hd, ld, kld, causal, scale, drop, b, h, qh, kh, vh, i0,
                              nq, &w);
                for (int64_t r = 0; r < nq; r++) /* sum_j p_j (dy . v_j) = dy . y */
                    w.dsum[r] = dt__vdot(hd, dyh + (i0 + r) * ld, w.acc + r * hd);
                int64_t kend = key_end(causal, kv_seq, qoff + i0 + nq);
                for (int64_t j0 = 0; j0 < kend; j0 += BK) {
                    int64_t nk = kend - j0 < BK ? kend - j0 : BK;
                    scores(hd, ld, kld, scale, qh, kh, i0, nq, j0, nk, &w);
                    sgemm(0, 1, nq, nk, hd, 1.0f, dyh + i0 * ld, ld, vh + j0 * kld, kld, 0.0f, w.dp,
                          BK);
                    for (int64_t r = 0; r < nq; r++) {
                        float *sr = w.s + r * BK, *dpr = w.dp + r * BK;
                        int64_t n = row_keys(causal, qoff + i0 + r, j0, nk);
                        /* p = exp(s - m) / l: the probabilities from the log-sum-exp. */
                        dt__vexp_scale(n, sr, w.m[r], w.inv[r], 1.0f, sr);
                        for (int64_t j = n; j < nk; j++)
                            sr[j] = 0.0f;
                        if (drop && n > 0) { /* dL/dp = z (dy . v); dv takes p z */
                            dt__attn_drop_row(drop, b, h, i0 + r, j0, n, w.z);
                            for (int64_t j = 0; j < n; j++) {
                                dpr[j] = sr[j] * (w.z[j] * dpr[j] - w.dsum[r]) * scale;
                                sr[j] *= w.z[j];
                            }
                            for (int64_t j = n; j < nk; j++)
                                dpr[j] = 0.0f;
                            continue;
                        }
                        /* dp becomes ds = p (dp - D) / sqrt(hd) */
                        for (int64_t j = 0; j < nk; j++)
                            dpr[j] = sr[j] * (dpr[j] - w.dsum[r]) * scale;
                    }
                    /* dv += p^T dy, dk += ds^T q, dq += ds k */
                    sgemm(1, 0, nk, hd, nq, 1.0f, w.s, BK, dyh + i0 * ld, ld, 1.0f, dvh + j0 * kld,
                          kld);
                    sgemm(1, 0, nk, hd, nq, 1.0f, w.dp, BK, qh + i0 * ld, ld, 1.0f, dkh + j0 * kld,
                          kld);
                    sgemm(0, 0, nq, hd, nk, 1.0f, w.dp, BK, kh + j0 * kld, kld, 1.0f, dqh + i0 * ld,
                          ld);
                }
            }
        }
    work_free(&w);
    return DT_OK;
}

/* ---- the public entries ----------------------------------------------------------------- */

static dt_status check_tiled(const char *op, int64_t batch, int64_t seq, int64_t heads,
                             int64_t kv_heads, int64_t head_dim, int nptrs, const void *const *ptrs)
{
    if (batch < 0 || seq < 0 || heads < 0 || kv_heads < 0 || head_dim < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "%s: negative size (batch %lld, seq %lld, "
                         "heads %lld, kv_heads %lld, head_dim %lld)",
                         op, (long long)batch, (long long)seq, (long long)heads,
                         (long long)kv_heads, (long long)head_dim);
    if (heads > 0 && (kv_heads == 0 || heads % kv_heads != 0))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: kv_heads %lld does not divide heads %lld",
                         op, (long long)kv_heads, (long long)heads);
    return dt__kcheck(op, batch * seq * heads * head_dim, nptrs, ptrs);
}

dt_status dt_kernel_attention_tiled(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, int causal, const float *q, const float *k,
                                    const float *v, float *y, float *lse)
{
    const void *ptrs[] = {q, k, v, y};
    dt_status st =
        check_tiled("dt_kernel_attention_tiled", batch, seq, heads, kv_heads, head_dim, 4, ptrs);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    return dt__attention_tiled_run(batch, seq, heads, kv_heads, head_dim, causal, NULL, q, k, v, y,
                                   lse);
}

dt_status dt_kernel_attention_tiled_grad(int64_t batch, int64_t seq, int64_t heads,
                                         int64_t kv_heads, int64_t head_dim, int causal,
                                         const float *q, const float *k, const float *v,
                                         const float *dy, float *dq, float *dk, float *dv)
{
    const void *ptrs[] = {q, k, v, dy, dq, dk, dv};
    dt_status st = check_tiled("dt_kernel_attention_tiled_grad", batch, seq, heads, kv_heads,
                               head_dim, 7, ptrs);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    return dt__attention_tiled_grad_run(batch, seq, heads, kv_heads, head_dim, causal, NULL, q, k,
                                        v, dy, dq, dk, dv);
}
