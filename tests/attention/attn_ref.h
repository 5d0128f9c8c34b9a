/* The f64 reference of the attention tests: plain (grouped-query) causal or full attention,
 * its log-sum-exp and its gradient, one query row at a time, written from the definition. */
#ifndef DT_TEST_ATTN_REF_H
#define DT_TEST_ATTN_REF_H

#include <stdint.h>

/* q, dy [B, T, H * D], k, v [B, T, KV * D] (f32 in, f64 out); y like q, lse [B, H, T]; any of
 * the outputs may be NULL. */
void attn_ref(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int causal,
              const float *q, const float *k, const float *v, const float *dy, double *y,
              double *lse, double *dq, double *dk, double *dv);
/* The same with the probabilities P [B, H, T, T] multiplied by z (same shape; NULL: none):
 * y_t = sum_j P_tj z_tj v_j, the dropout of the attention probabilities. */
void attn_ref_masked(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int causal,
                     const float *z, const float *q, const float *k, const float *v,
                     const float *dy, double *y, double *lse, double *dq, double *dk, double *dv);
/* max |got - want| / max(1, max |want|) over n elements. */
double attn_rel_err(const float *got, const double *want, int64_t n);

#endif
