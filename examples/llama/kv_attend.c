/* llama/kv_attend: rotate-half rotary embeddings with theta and llama3 scaling, and causal
 * attention of new queries against a key/value cache, on one device's heads (kv_attend.h). */
#include "kv_attend.h"

#include <math.h>
#include <stdlib.h>

void kv_rope_freqs(int64_t head_dim, double theta, int llama3, double factor, double low_ff,
                   double high_ff, double original_max, double *inv_freq)
{
    for (int64_t i = 0; i < head_dim / 2; i++) {
        double f = pow(theta, -(double)(2 * i) / (double)head_dim);
        if (llama3) {
            double low_wl = original_max / low_ff, high_wl = original_max / high_ff;
            double wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                f = f / factor;
            } else if (wl >= high_wl) {
                double s = (original_max / wl - low_ff) / (high_ff - low_ff);
                f = (1.0 - s) * f / factor + s * f;
            }
        }
        inv_freq[i] = f;
    }
}

void kv_rope(int64_t rows, int64_t n, int64_t heads, int64_t head_dim, int64_t pos0,
             const double *inv_freq, float *x)
{
    int64_t half = head_dim / 2, width = heads * head_dim;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < half; i++) {
            /* The angle, its cos and sin in f64, rounded to f32. */
            double a = (double)(pos0 + t) * inv_freq[i];
            float c = (float)cos(a), s = (float)sin(a);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t h = 0; h < heads; h++) {
                    float *p = x + (r * n + t) * width + h * head_dim;
                    float x0 = p[i], x1 = p[i + half];
                    p[i] = x0 * c - x1 * s;
                    p[i + half] = x1 * c + x0 * s;
                }
        }
}

int kv_attend(int64_t rows, int64_t n, int64_t pos0, int64_t cap, int64_t hq, int64_t q_head0,
              int64_t hk, int64_t kv_head0, int64_t group, int64_t head_dim, const float *q,
              const float *kc, const float *vc, float *y)
{
    int64_t D = head_dim, len = pos0 + n;
    double *w = malloc((size_t)(len > 0 ? len : 1) * sizeof *w);
    double *acc = malloc((size_t)D * sizeof *acc);
    if (!w || !acc) {
        free(w);
        free(acc);
        return -1;
    }
    double scale = 1.0 / sqrt((double)D);
    int rc = 0;
    for (int64_t h = 0; h < hq && rc == 0; h++) {
        int64_t g = (q_head0 + h) / group - kv_head0;
        if (g < 0 || g >= hk) {
            rc = -1;
            break;
        }
        for (int64_t r = 0; r < rows; r++)
            for (int64_t t = 0; t < n; t++) {
                const float *qv = q + ((r * n + t) * hq + h) * D;
                int64_t upto = pos0 + t + 1;
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < upto; j++) {
                    const float *kv = kc + ((r * cap + j) * hk + g) * D;
                    double d = 0.0;
                    for (int64_t e = 0; e < D; e++)
                        d += (double)qv[e] * (double)kv[e];
                    w[j] = d * scale;
                    if (w[j] > mx)
                        mx = w[j];
                }
                for (int64_t j = 0; j < upto; j++) {
                    w[j] = exp(w[j] - mx);
                    sum += w[j];
                }
                for (int64_t e = 0; e < D; e++)
                    acc[e] = 0.0;
                for (int64_t j = 0; j < upto; j++) {
                    const float *vv = vc + ((r * cap + j) * hk + g) * D;
                    double p = w[j] / sum;
                    for (int64_t e = 0; e < D; e++)
                        acc[e] += p * (double)vv[e];
                }
                float *yv = y + ((r * n + t) * hq + h) * D;
                for (int64_t e = 0; e < D; e++)
                    yv[e] = (float)acc[e];
            }
    }
    free(w);
    free(acc);
    return rc;
}
