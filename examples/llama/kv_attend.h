/* llama/kv_attend: the local computations incremental decoding needs that ops/ does not have
 * yet (to move there as ops later): rotary embeddings in Hugging Face's rotate-half form with
 * rope_theta and llama3 frequency scaling, and causal attention of new queries against a
 * key/value cache, on one device's block of heads. Host f32 loops and BLAS. */
#ifndef LLAMA_KV_ATTEND_H
#define LLAMA_KV_ATTEND_H

#include <stdint.h>

/* The rotary inverse frequencies of one head (head_dim / 2 of them) into inv_freq:
 * theta^(-2i / head_dim), then, when llama3 != 0, scaled as Llama 3.1 does (wavelengths above
 * original_max / low_freq_factor divided by factor, below original_max / high_freq_factor
 * kept, smoothly interpolated between). */
void kv_rope_freqs(int64_t head_dim, double theta, int llama3, double factor, double low_ff,
                   double high_ff, double original_max, double *inv_freq);

/* Rotates x [rows, n, heads * head_dim] in place in the rotate-half form: within each head,
 * element i and i + head_dim / 2 form a pair rotated by angle (pos0 + t) * inv_freq[i]:
 *   y[i] = x[i] cos - x[i + D/2] sin;  y[i + D/2] = x[i + D/2] cos + x[i] sin. */
void kv_rope(int64_t rows, int64_t n, int64_t heads, int64_t head_dim, int64_t pos0,
             const double *inv_freq, float *x);

/* Causal attention of n new queries per row at positions pos0..pos0+n-1 against the cache's
 * first pos0 + n positions (the new keys and values already written there):
 *   q, y [rows, n, hq * D]: this device's query heads, global heads q_head0..q_head0+hq-1;
 *   kc, vc [rows, cap, hk * D]: this device's cached key/value heads, global kv_head0.. ;
 * query head h reads kv head h / group (group = heads / kv_heads). Scores and the weighted
 * sum are two GEMMs per (row, head) on the strided cache (dt_kernel_gemm), the softmax in
 * f32 with an f64 sum. Returns 0, or -1 when a query head's kv head is not among this
 * device's (or out of memory). */
int kv_attend(int64_t rows, int64_t n, int64_t pos0, int64_t cap, int64_t hq, int64_t q_head0,
              int64_t hk, int64_t kv_head0, int64_t group, int64_t head_dim, const float *q,
              const float *kc, const float *vc, float *y);

#endif
