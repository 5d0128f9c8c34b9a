/* The f64 attention reference of tests/attention (attn_ref.h). */
#include "attn_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void attn_ref(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int causal, const float *q,
              const float *k, const float *v, const float *dy, double *y, double *lse, double *dq,
              double *dk, double *dv)
{
    attn_ref_masked(B, T, H, KV, D, causal, NULL, q, k, v, dy, y, lse, dq, dk, dv);
}

void attn_ref_masked(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int causal,
                     const float *z, const float *q, const float *k, const float *v,
                     const float *dy, double *y, double *lse, double *dq, double *dk, double *dv)
{
    int64_t ld = H * D, kld = KV * D, g = H / KV;
    double *p = malloc((size_t)T * sizeof *p), *yr = malloc((size_t)D * sizeof *yr);
    double scale = 1.0 / sqrt((double)D);
    if (dq)
        memset(dq, 0, (size_t)(B * T * ld) * sizeof *dq);
    if (dk)
        memset(dk, 0, (size_t)(B * T * kld) * sizeof *dk);
    if (dv)
        memset(dv, 0, (size_t)(B * T * kld) * sizeof *dv);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                const float *qt = q + (b * T + t) * ld + h * D;
                int64_t n = causal ? t + 1 : T;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < n; j++) {
                    const float *kj = k + (b * T + j) * kld + (h / g) * D;
                    double s = 0;
                    for (int64_t d = 0; d < D; d++)
                        s += (double)qt[d] * kj[d];
                    p[j] = s * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int64_t j = 0; j < n; j++)
                    sum += exp(p[j] - mx);
                for (int64_t j = 0; j < n; j++)
                    p[j] = exp(p[j] - mx) / sum;
                if (lse)
                    lse[(b * H + h) * T + t] = mx + log(sum);
                /* The probabilities' dropout factors: row t of [B, H, T, T]. */
                const float *zr = z ? z + ((b * H + h) * T + t) * T : NULL;
                for (int64_t d = 0; d < D; d++) {
                    yr[d] = 0;
                    for (int64_t j = 0; j < n; j++)
                        yr[d] += p[j] * (zr ? zr[j] : 1.0) * v[(b * T + j) * kld + (h / g) * D + d];
                    if (y)
                        y[(b * T + t) * ld + h * D + d] = yr[d];
                }
                if (!dy)
                    continue;
                const float *dyt = dy + (b * T + t) * ld + h * D;
                double dot = 0; /* sum_j p_j dL/dp_j = dy . y */
                for (int64_t d = 0; d < D; d++)
                    dot += dyt[d] * yr[d];
                for (int64_t j = 0; j < n; j++) {
                    int64_t o = (b * T + j) * kld + (h / g) * D;
                    double dp = 0, zj = zr ? zr[j] : 1.0; /* dL/dp_j = z_j (dy . v_j) */
                    for (int64_t d = 0; d < D; d++)
                        dp += (double)dyt[d] * v[o + d];
                    double ds = p[j] * (zj * dp - dot) * scale;
                    for (int64_t d = 0; d < D; d++) {
                        if (dq)
                            dq[(b * T + t) * ld + h * D + d] += ds * k[o + d];
                        if (dk)
                            dk[o + d] += ds * qt[d];
                        if (dv)
                            dv[o + d] += p[j] * zj * dyt[d];
                    }
                }
            }
    free(yr);
    free(p);
}

double attn_rel_err(const float *got, const double *want, int64_t n)
{
    double big = 1, err = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = fabs(want[i]), e = fabs((double)got[i] - want[i]);
        big = a > big ? a : big;
        err = e > err || isnan(e) ? e : err;
    }
    return err / big;
}
