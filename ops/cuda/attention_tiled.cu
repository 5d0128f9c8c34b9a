/* CUDA tiled (flash-style) attention, grouped-query form: a thread block per (batch, head,
 * block of TQ queries), one thread per query row; key/value tiles of TK rows staged in shared
 * memory and shared by the block's rows; online softmax (running max and sum) in registers;
 * causal tiles past the block's last query skipped. The gradient recomputes each row's max,
 * sum and output, then the probabilities tile by tile; dk, dv by atomic adds. Opt-in
 * (dt_attention_kernel_set(DT_ATTENTION_KERNEL_TILED)); head_dim at most DT__CU_TILED_MAXD.
 * docs/attention.md. */
#include <math.h>

#include "runtime/cuda/cu_lang.h"
#include "ops/cuda/cuda_ops.h"

#define TQ 64
#define TK 32

/* Stages keys (and values) j0 .. j0+nk-1 of one head into shared ks, vs [TK, hd]. */
__device__ static void stage(int64_t hd, int64_t kld, int64_t j0, int64_t nk, const float *k,
                             const float *v, float *ks, float *vs)
{
    __syncthreads();
    for (int64_t i = threadIdx.x; i < nk * hd; i += blockDim.x) {
        int64_t j = i / hd, d = i % hd;
        ks[i] = k[(j0 + j) * kld + d];
        vs[i] = v[(j0 + j) * kld + d];
    }
    __syncthreads();
}

/* One row's forward over the key tiles: its max m, sum l and unnormalised output acc. */
__device__ static void row_forward(int64_t seq, int64_t hd, int64_t kld, int causal, float scale,
                                   int64_t t, int active, int64_t kend, const float *qt,
                                   const float *k, const float *v, float *ks, float *vs, float *acc,
                                   float *m_out, float *l_out)
{
    float m = -INFINITY, l = 0.0f, sc[TK];
    for (int64_t d = 0; d < hd; d++)
        acc[d] = 0.0f;
    for (int64_t j0 = 0; j0 < kend; j0 += TK) {
        int64_t nk = kend - j0 < TK ? kend - j0 : TK;
        stage(hd, kld, j0, nk, k, v, ks, vs);
        if (!active)
            continue;
        int64_t n = causal ? (t - j0 + 1 < nk ? t - j0 + 1 : nk) : nk;
        if (n <= 0)
            continue;
        float mx = m;
        for (int64_t j = 0; j < n; j++) {
            float s = 0.0f;
            for (int64_t d = 0; d < hd; d++)
                s += qt[d] * ks[j * hd + d];
            sc[j] = s * scale;
            mx = fmaxf(mx, sc[j]);
        }
        float corr = l > 0.0f ? expf(m - mx) : 0.0f;
        l *= corr;
        for (int64_t d = 0; d < hd; d++)
            acc[d] *= corr;
        for (int64_t j = 0; j < n; j++) {
            float p = expf(sc[j] - mx);
            l += p;
            for (int64_t d = 0; d < hd; d++)
                acc[d] += p * vs[j * hd + d];
        }
        m = mx;
    }
    *m_out = m;
    *l_out = l;
}

__global__ static void tiled_kernel(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    int64_t hd, int causal, const float *q, const float *k,
                                    const float *v, float *y)
{
    DT__CU_DYNAMIC_SHARED(float, sh);
    float *ks = sh, *vs = sh + TK * hd;
    int64_t nqb = (seq + TQ - 1) / TQ, blk = blockIdx.x;
    int64_t qb = blk % nqb, h = (blk / nqb) % heads, b = blk / (nqb * heads);
    int64_t t = qb * TQ + threadIdx.x, ld = heads * hd, kld = kv_heads * hd;
    int active = t < seq;
    int64_t base = b * seq * ld + h * hd, kbase = b * seq * kld + (h / (heads / kv_heads)) * hd;
    int64_t kend = causal ? ((qb + 1) * TQ < seq ? (qb + 1) * TQ : seq) : seq;
    float acc[DT__CU_TILED_MAXD], qt[DT__CU_TILED_MAXD], m, l;
    for (int64_t d = 0; active && d < hd; d++)
        qt[d] = q[base + t * ld + d];
    row_forward(seq, hd, kld, causal, rsqrtf((float)hd), t, active, kend, qt, k + kbase, v + kbase,
                ks, vs, acc, &m, &l);
    if (!active)
        return;
    for (int64_t d = 0; d < hd; d++)
        y[base + t * ld + d] = acc[d] / l;
}

__global__ static void tiled_grad_kernel(int64_t batch, int64_t seq, int64_t heads,
                                         int64_t kv_heads, int64_t hd, int causal, const float *q,
                                         const float *k, const float *v, const float *dy, float *dq,
                                         float *dk, float *dv)
{
    DT__CU_DYNAMIC_SHARED(float, sh);
    float *ks = sh, *vs = sh + TK * hd;
    int64_t nqb = (seq + TQ - 1) / TQ, blk = blockIdx.x;
    int64_t qb = blk % nqb, h = (blk / nqb) % heads, b = blk / (nqb * heads);
    int64_t t = qb * TQ + threadIdx.x, ld = heads * hd, kld = kv_heads * hd;
    int active = t < seq;
    int64_t base = b * seq * ld + h * hd, kbase = b * seq * kld + (h / (heads / kv_heads)) * hd;
    int64_t kend = causal ? ((qb + 1) * TQ < seq ? (qb + 1) * TQ : seq) : seq;
    float scale = rsqrtf((float)hd);
    float acc[DT__CU_TILED_MAXD], qt[DT__CU_TILED_MAXD], dyt[DT__CU_TILED_MAXD], m, l;
    for (int64_t d = 0; active && d < hd; d++) {
        qt[d] = q[base + t * ld + d];
        dyt[d] = dy[base + t * ld + d];
    }
    row_forward(seq, hd, kld, causal, scale, t, active, kend, qt, k + kbase, v + kbase, ks, vs, acc,
                &m, &l);
    float dsum = 0.0f; /* dy . y = sum_j p_j dp_j */
    for (int64_t d = 0; active && d < hd; d++) {
        dsum += dyt[d] * (acc[d] / l);
        acc[d] = 0.0f; /* now dq's row */
    }
    for (int64_t j0 = 0; j0 < kend; j0 += TK) {
        int64_t nk = kend - j0 < TK ? kend - j0 : TK;
        stage(hd, kld, j0, nk, k + kbase, v + kbase, ks, vs);
        if (!active)
            continue;
        int64_t n = causal ? (t - j0 + 1 < nk ? t - j0 + 1 : nk) : nk;
        for (int64_t j = 0; j < n; j++) {
            float s = 0.0f, dp = 0.0f;
            for (int64_t d = 0; d < hd; d++) {
                s += qt[d] * ks[j * hd + d];
                dp += dyt[d] * vs[j * hd + d];
            }
            float p = expf(s * scale - m) / l, ds = p * (dp - dsum) * scale;
            float *dkj = dk + kbase + (j0 + j) * kld, *dvj = dv + kbase + (j0 + j) * kld;
            for (int64_t d = 0; d < hd; d++) {
                acc[d] += ds * ks[j * hd + d];
                atomicAdd(dkj + d, ds * qt[d]);
                atomicAdd(dvj + d, p * dyt[d]);
            }
        }
    }
    for (int64_t d = 0; active && d < hd; d++)
        dq[base + t * ld + d] = acc[d];
}

static unsigned grid_of(int64_t batch, int64_t seq, int64_t heads)
{
    return (unsigned)(batch * heads * ((seq + TQ - 1) / TQ));
}

cudaError_t dt__cuda_attention_tiled(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                     int64_t hd, int causal, const float *q, const float *k,
                                     const float *v, float *y, cudaStream_t s)
{
    size_t shm = 2 * TK * (size_t)hd * sizeof(float);
    DT__CU_LAUNCH(tiled_kernel, grid_of(batch, seq, heads), TQ, shm, s)(batch, seq, heads, kv_heads, hd,
                                                             causal, q, k, v, y);
    return cudaGetLastError();
}

cudaError_t dt__cuda_attention_tiled_grad(int64_t batch, int64_t seq, int64_t heads,
                                          int64_t kv_heads, int64_t hd, int causal, const float *q,
                                          const float *k, const float *v, const float *dy,
                                          float *dq, float *dk, float *dv, cudaStream_t s)
{
    size_t kbytes = (size_t)(batch * seq * kv_heads * hd) * sizeof(float);
    cudaMemsetAsync(dk, 0, kbytes, s);
    cudaMemsetAsync(dv, 0, kbytes, s);
    size_t shm = 2 * TK * (size_t)hd * sizeof(float);
    DT__CU_LAUNCH(tiled_grad_kernel, grid_of(batch, seq, heads), TQ, shm, s)(batch, seq, heads, kv_heads, hd,
                                                                  causal, q, k, v, dy, dq, dk, dv);
    return cudaGetLastError();
}
