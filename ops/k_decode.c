/* ops/k_decode: CPU kernels of the decoding ops (ops/def_decode.c): rotate-half rotary
 * embeddings at global positions, and causal attention of new queries against a cache. */
#include <math.h>
#include <stdlib.h>

#include "dtensor/ops.h"
#include "ops/def_decode.h"
#include "runtime/error.h"

void dt__rope_freqs(int64_t head_dim, double theta, int llama3, double factor, double low_ff,
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

dt_status dt__k_rope_half(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *y = &a->out;
    int r = x->rank;
    int64_t lead = 1, T = x->shape[r - 3], H = x->shape[r - 2], D = x->shape[r - 1];
    int64_t half = D / 2, t0 = x->offset[r - 3];
    for (int d = 0; d < r - 3; d++)
        lead *= x->shape[d];
    double *f = malloc((size_t)(half > 0 ? half : 1) * sizeof *f);
    if (!f)
        return dt__error(DT_ERR_NO_MEMORY, "rope_half: out of memory");
    dt__rope_freqs(D, a->attrs.f[0], (int)a->attrs.i[2], a->attrs.f[1], a->attrs.f[2],
                   a->attrs.f[3], (double)a->attrs.i[3], f);
    double sign = a->attrs.i[1] ? -1.0 : 1.0;
    int f64 = x->dtype == DT_DTYPE_F64;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            double ang = (double)(a->attrs.i[0] + t0 + t) * f[i];
            double c = cos(ang), s = sign * sin(ang);
            float cf = (float)c, sf = (float)s;
            for (int64_t l = 0; l < lead; l++)
                for (int64_t h = 0; h < H; h++) {
                    int64_t at = ((l * T + t) * H + h) * D + i;
                    if (f64) {
                        const double *px = (const double *)x->data + at;
                        double *py = (double *)y->data + at, x0 = px[0], x1 = px[half];
                        py[0] = x0 * c - x1 * s;
                        py[half] = x1 * c + x0 * s;
                    } else {
                        const float *px = (const float *)x->data + at;
                        float *py = (float *)y->data + at, x0 = px[0], x1 = px[half];
                        py[0] = x0 * cf - x1 * sf;
                        py[half] = x1 * cf + x0 * sf;
                    }
                }
        }
    free(f);
    return DT_OK;
}

/* Softmax in place of each of `nrows` rows of `ld` floats over its first upto[r] entries
 * (the rest zeroed): f32 exponentials, an f64 sum. */
static void softmax_rows(float *s, int64_t nrows, int64_t ld, const int64_t *upto)
{
    for (int64_t t = 0; t < nrows; t++) {
        float *row = s + t * ld, mx = -INFINITY;
        for (int64_t j = 0; j < upto[t]; j++)
            mx = row[j] > mx ? row[j] : mx;
        double sum = 0.0;
        for (int64_t j = 0; j < upto[t]; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < upto[t]; j++)
            row[j] *= inv;
        for (int64_t j = upto[t]; j < ld; j++)
            row[j] = 0.0f;
    }
}

/* f32: per (row, kv head) and, with one query position, all G query heads as one GEMM of G
 * rows; with several, per query head one GEMM over the positions with the causal mask. */
static dt_status cached_f32(const dt_op_kernel_args *a, int64_t B, int64_t T, int64_t K, int64_t G,
                            int64_t D, int64_t S, int64_t p0)
{
    const float *q = a->in[0].data, *kc = a->in[1].data, *vc = a->in[2].data;
    float *y = a->out.data;
    int64_t len = p0 + T, rowsq = T == 1 ? G : T;
    float *s = malloc((size_t)(rowsq * len) * sizeof *s);
    int64_t *upto = malloc((size_t)rowsq * sizeof *upto);
    dt_status st = s && upto ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "attention_cached: memory");
    float scale = (float)(1.0 / sqrt((double)D));
    int64_t ldq = T == 1 ? D : K * G * D; /* stride between the GEMM's query rows */
    for (int64_t i = 0; i < rowsq && st == DT_OK; i++)
        upto[i] = T == 1 ? len : p0 + i + 1;
    for (int64_t b = 0; b < B && st == DT_OK; b++)
        for (int64_t k = 0; k < K && st == DT_OK; k++)
            for (int64_t g = 0; g < (T == 1 ? 1 : G) && st == DT_OK; g++) {
                const float *qh = q + ((b * T * K + k) * G + g) * D;
                float *yh = y + ((b * T * K + k) * G + g) * D;
                const float *kh = kc + (b * S * K + k) * D, *vh = vc + (b * S * K + k) * D;
                st = dt_kernel_gemm(0, 1, rowsq, len, D, scale, qh, DT_DTYPE_F32, ldq, kh,
                                    DT_DTYPE_F32, K * D, 0.0f, s, len);
                if (st != DT_OK)
                    break;
                softmax_rows(s, rowsq, len, upto);
                st = dt_kernel_gemm(0, 0, rowsq, D, len, 1.0f, s, DT_DTYPE_F32, len, vh,
                                    DT_DTYPE_F32, K * D, 0.0f, yh, ldq);
            }
    free(s);
    free(upto);
    return st;
}

static dt_status cached_f64(const dt_op_kernel_args *a, int64_t B, int64_t T, int64_t K, int64_t G,
                            int64_t D, int64_t S, int64_t p0)
{
    const double *q = a->in[0].data, *kc = a->in[1].data, *vc = a->in[2].data;
    double *y = a->out.data;
    double *p = malloc((size_t)(p0 + T) * sizeof *p);
    if (!p)
        return dt__error(DT_ERR_NO_MEMORY, "attention_cached: out of memory");
    double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < K; k++)
                for (int64_t g = 0; g < G; g++) {
                    const double *qh = q + (((b * T + t) * K + k) * G + g) * D;
                    double *yh = y + (((b * T + t) * K + k) * G + g) * D, mx = -INFINITY;
                    int64_t upto = p0 + t + 1;
                    for (int64_t j = 0; j < upto; j++) {
                        const double *kj = kc + ((b * S + j) * K + k) * D;
                        double dot = 0.0;
                        for (int64_t e = 0; e < D; e++)
                            dot += qh[e] * kj[e];
                        p[j] = dot * scale;
                        mx = p[j] > mx ? p[j] : mx;
                    }
                    double sum = 0.0;
                    for (int64_t j = 0; j < upto; j++)
                        sum += (p[j] = exp(p[j] - mx));
                    for (int64_t e = 0; e < D; e++)
                        yh[e] = 0.0;
                    for (int64_t j = 0; j < upto; j++) {
                        const double *vj = vc + ((b * S + j) * K + k) * D;
                        double w = p[j] / sum;
                        for (int64_t e = 0; e < D; e++)
                            yh[e] += w * vj[e];
                    }
                }
    free(p);
    return DT_OK;
}

dt_status dt__k_attention_cached(const dt_op_kernel_args *a)
{
    const dt_op_buf *q = &a->in[0], *k = &a->in[1];
    int64_t B = q->shape[0], T = q->shape[1], K = q->shape[2], G = q->shape[3], D = q->shape[4];
    int64_t S = k->shape[1], p0 = a->attrs.i[0] + q->offset[1];
    if (B * T * K * G * D == 0)
        return DT_OK;
    return q->dtype == DT_DTYPE_F64 ? cached_f64(a, B, T, K, G, D, S, p0)
                                    : cached_f32(a, B, T, K, G, D, S, p0);
}
