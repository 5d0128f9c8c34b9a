/* Tiled (flash-attention style) attention on the CPU: blocks of BQ queries against blocks of BK
 * keys with an online softmax (running max and sum per query), causal blocks skipped, so the
 * memory is O(BQ x head_dim + BK) whatever the sequence; the gradient recomputes each block's
 * probabilities from the per-row log-sum-exp (kept as the max and the sum). docs/attention.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

/* BQ query rows share each key/value block while it sits in L1 (64 x 64 floats: 16 KiB). */
#define BQ 32
#define BK 64

typedef struct work {
    float *acc;  /* [BQ, hd] the unnormalised output rows, then the output */
    float *m;    /* [BQ] running max of the scaled scores */
    double *l;   /* [BQ] running sum of exp(score - m) */
    float *s;    /* [BK] one row's scores, then its probabilities */
} work;

static int work_new(int64_t hd, work *w)
{
    size_t nf = (size_t)BQ * (size_t)hd + BQ + BK;
    float *f = malloc(nf * sizeof *f);
    double *d = malloc(BQ * sizeof *d);
    if (!f || !d) {
        free(f);
        free(d);
        return 0;
    }
    w->acc = f;
    w->m = f + (size_t)BQ * (size_t)hd;
    w->s = w->m + BQ;
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

/* The forward of query rows i0 .. i0+nq-1 of one (batch, head): q, k, v point at the head's
 * first element (row strides ld for q, kld for k and v). Leaves w->acc normalised (the output
 * rows), w->m and w->l the row max and sum (log-sum-exp = m + log l). */
static void forward_block(int64_t seq, int64_t hd, int64_t ld, int64_t kld, int causal,
                          float scale, const float *q, const float *k, const float *v,
                          int64_t i0, int64_t nq, work *w)
{
    memset(w->acc, 0, (size_t)nq * (size_t)hd * sizeof *w->acc);
    for (int64_t r = 0; r < nq; r++) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0;
    }
    int64_t kend = causal ? i0 + nq : seq; /* causal: later key blocks are all masked */
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        int64_t nk = kend - j0 < BK ? kend - j0 : BK;
        for (int64_t r = 0; r < nq; r++) {
            int64_t n = row_keys(causal, i0 + r, j0, nk);
            if (n == 0)
                continue;
            const float *qt = q + (i0 + r) * ld;
            float mx = w->m[r];
            for (int64_t j = 0; j < n; j++) {
                w->s[j] = dt__vdot(hd, qt, k + (j0 + j) * kld) * scale;
                mx = w->s[j] > mx ? w->s[j] : mx;
            }
            float *ar = w->acc + r * hd;
            if (mx > w->m[r] && w->l[r] > 0.0) {
                /* A new max: rescale what the earlier blocks summed. */
                float d = w->m[r] - mx, alpha;
                dt__vexp(1, &d, &alpha);
                w->l[r] *= alpha;
                for (int64_t c = 0; c < hd; c++)
                    ar[c] *= alpha;
            }
            w->m[r] = mx;
            w->l[r] += dt__vexp_sum(n, w->s, mx, w->s);
            for (int64_t j = 0; j < n; j++)
                dt__vaxpy(hd, w->s[j], v + (j0 + j) * kld, ar);
        }
    }
    for (int64_t r = 0; r < nq; r++) {
        float inv = (float)(1.0 / w->l[r]);
        float *ar = w->acc + r * hd;
        for (int64_t c = 0; c < hd; c++)
            ar[c] *= inv;
    }
}

dt_status dt__attention_tiled_run(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim, int causal, const float *q, const float *k,
                                  const float *v, float *y, float *lse)
{
    work w;
    if (!work_new(head_dim, &w))
        return dt__error(DT_ERR_NO_MEMORY, "attention (tiled): out of memory");
    int64_t ld = heads * head_dim, kld = kv_heads * head_dim, group = heads / kv_heads;
    float scale = 1.0f / sqrtf((float)head_dim);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t base = b * seq * ld + h * head_dim;
            int64_t kbase = b * seq * kld + (h / group) * head_dim;
            for (int64_t i0 = 0; i0 < seq; i0 += BQ) {
                int64_t nq = seq - i0 < BQ ? seq - i0 : BQ;
                forward_block(seq, head_dim, ld, kld, causal, scale, q + base, k + kbase,
                              v + kbase, i0, nq, &w);
                for (int64_t r = 0; r < nq; r++) {
                    memcpy(y + base + (i0 + r) * ld, w.acc + r * head_dim,
                           (size_t)head_dim * sizeof *y);
                    if (lse)
                        lse[(b * heads + h) * seq + i0 + r] =
                            (float)((double)w.m[r] + log(w.l[r]));
                }
            }
        }
    work_free(&w);
    return DT_OK;
}

dt_status dt__attention_tiled_grad_run(int64_t batch, int64_t seq, int64_t heads,
                                       int64_t kv_heads, int64_t head_dim, int causal,
                                       const float *q, const float *k, const float *v,
                                       const float *dy, float *dq, float *dk, float *dv)
{
    work w;
    if (!work_new(head_dim, &w))
        return dt__error(DT_ERR_NO_MEMORY, "attention gradient (tiled): out of memory");
    int64_t total = batch * seq * heads * head_dim, ktotal = batch * seq * kv_heads * head_dim;
    memset(dq, 0, (size_t)total * sizeof *dq);
    memset(dk, 0, (size_t)ktotal * sizeof *dk);
    memset(dv, 0, (size_t)ktotal * sizeof *dv);
    int64_t ld = heads * head_dim, kld = kv_heads * head_dim, group = heads / kv_heads;
    float scale = 1.0f / sqrtf((float)head_dim);
    float dsum[BQ], inv[BQ];
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t base = b * seq * ld + h * head_dim;
            int64_t kbase = b * seq * kld + (h / group) * head_dim;
            const float *qh = q + base, *dyh = dy + base, *kh = k + kbase, *vh = v + kbase;
            float *dqh = dq + base, *dkh = dk + kbase, *dvh = dv + kbase;
            for (int64_t i0 = 0; i0 < seq; i0 += BQ) {
                int64_t nq = seq - i0 < BQ ? seq - i0 : BQ;
                /* The block's row statistics and output again (nothing was saved). */
                forward_block(seq, head_dim, ld, kld, causal, scale, qh, kh, vh, i0, nq, &w);
                for (int64_t r = 0; r < nq; r++) {
                    /* sum_j p_j (dy . v_j) = dy . y */
                    dsum[r] = dt__vdot(head_dim, dyh + (i0 + r) * ld, w.acc + r * head_dim);
                    inv[r] = (float)(1.0 / w.l[r]);
                }
                int64_t kend = causal ? i0 + nq : seq;
                for (int64_t j0 = 0; j0 < kend; j0 += BK) {
                    int64_t nk = kend - j0 < BK ? kend - j0 : BK;
                    for (int64_t r = 0; r < nq; r++) {
                        int64_t n = row_keys(causal, i0 + r, j0, nk);
                        if (n == 0)
                            continue;
                        const float *qt = qh + (i0 + r) * ld, *dyt = dyh + (i0 + r) * ld;
                        float *dqt = dqh + (i0 + r) * ld;
                        for (int64_t j = 0; j < n; j++)
                            w.s[j] = dt__vdot(head_dim, qt, kh + (j0 + j) * kld) * scale;
                        /* p = exp(s - m) / l: the probabilities from the log-sum-exp. */
                        dt__vexp_scale(n, w.s, w.m[r], inv[r], 1.0f, w.s);
                        for (int64_t j = 0; j < n; j++) {
                            int64_t o = (j0 + j) * kld;
                            float ds = w.s[j] * (dt__vdot(head_dim, dyt, vh + o) - dsum[r]) *
                                       scale;
                            dt__vaxpy(head_dim, ds, kh + o, dqt);
                            dt__vaxpy(head_dim, ds, qt, dkh + o);
                            dt__vaxpy(head_dim, w.s[j], dyt, dvh + o);
                        }
                    }
                }
            }
        }
    work_free(&w);
    return DT_OK;
}

/* ---- the public entries ----------------------------------------------------------------- */

static dt_status check_tiled(const char *op, int64_t batch, int64_t seq, int64_t heads,
                             int64_t kv_heads, int64_t head_dim, int nptrs,
                             const void *const *ptrs)
{
    if (batch < 0 || seq < 0 || heads < 0 || kv_heads < 0 || head_dim < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: negative size (batch %lld, seq %lld, "
                         "heads %lld, kv_heads %lld, head_dim %lld)", op, (long long)batch,
                         (long long)seq, (long long)heads, (long long)kv_heads,
                         (long long)head_dim);
    if (heads > 0 && (kv_heads == 0 || heads % kv_heads != 0))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: kv_heads %lld does not divide heads %lld",
                         op, (long long)kv_heads, (long long)heads);
    return dt__kcheck(op, batch * seq * heads * head_dim, nptrs, ptrs);
}

dt_status dt_kernel_attention_tiled(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, int causal, const float *q,
                                    const float *k, const float *v, float *y, float *lse)
{
    const void *ptrs[] = {q, k, v, y};
    dt_status st = check_tiled("dt_kernel_attention_tiled", batch, seq, heads, kv_heads,
                               head_dim, 4, ptrs);
    if (st != DT_OK || batch * seq * heads * head_dim == 0)
        return st;
    return dt__attention_tiled_run(batch, seq, heads, kv_heads, head_dim, causal, q, k, v, y,
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
    return dt__attention_tiled_grad_run(batch, seq, heads, kv_heads, head_dim, causal, q, k, v,
                                        dy, dq, dk, dv);
}
