/* llama/kv_attend: rotate-half rotary embeddings with theta and llama3 scaling, and causal
 * attention of new queries against a key/value cache, on one device's heads (kv_attend.h). */
#include "kv_attend.h"

#include <math.h>
#include <stdlib.h>

#include <dtensor/dtensor.h>

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
    float *s = malloc((size_t)(n * len) * sizeof *s);
    if (!s)
        return -1;
    float scale = (float)(1.0 / sqrt((double)D));
    int rc = 0;
    for (int64_t h = 0; h < hq && rc == 0; h++) {
        int64_t g = (q_head0 + h) / group - kv_head0;
        if (g < 0 || g >= hk) {
            rc = -1;
            break;
        }
        for (int64_t r = 0; r < rows && rc == 0; r++) {
            /* scores [n, len] = q_h [n, D] k_g^T, both strided in their rows (BLAS). */
            const float *qh = q + (r * n * hq + h) * D;
            const float *kg = kc + (r * cap * hk + g) * D, *vg = vc + (r * cap * hk + g) * D;
            float *yh = y + (r * n * hq + h) * D;
            if (dt_kernel_gemm(0, 1, n, len, D, scale, qh, DT_DTYPE_F32, hq * D, kg, DT_DTYPE_F32,
                               hk * D, 0.0f, s, len) != DT_OK) {
                rc = -1;
                break;
            }
            /* Causal softmax of each query row over positions 0..pos0+t. */
            for (int64_t t = 0; t < n; t++) {
                float *row = s + t * len, mx = -INFINITY;
                int64_t upto = pos0 + t + 1;
                for (int64_t j = 0; j < upto; j++)
                    mx = row[j] > mx ? row[j] : mx;
                double sum = 0.0;
                for (int64_t j = 0; j < upto; j++) {
                    row[j] = expf(row[j] - mx);
                    sum += row[j];
                }
                float inv = (float)(1.0 / sum);
                for (int64_t j = 0; j < upto; j++)
                    row[j] *= inv;
                for (int64_t j = upto; j < len; j++)
                    row[j] = 0.0f;
            }
            /* y_h [n, D] = P [n, len] v_g [len, D]. */
            if (dt_kernel_gemm(0, 0, n, D, len, 1.0f, s, DT_DTYPE_F32, len, vg, DT_DTYPE_F32,
                               hk * D, 0.0f, yh, hq * D) != DT_OK)
                rc = -1;
        }
    }
    free(s);
    return rc;
}
