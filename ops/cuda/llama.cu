/* CUDA kernels of the Llama-style ops (ops/llama.c): RMS norm (a thread per row, the gain's
 * gradient a thread per column over the saved row statistics), rotary embeddings and SwiGLU
 * (a thread per element or pair) and grouped-query attention (a thread per query row, key and
 * value gradients by atomic adds). Simple and correct, not tuned. */
#include <math.h>

#include "runtime/cuda/cu_lang.h"
#include "ops/cuda/cuda_ops.h"

__device__ static float rms_rstd(int64_t cols, const float *x, float eps)
{
    double s2 = 0.0;
    for (int64_t j = 0; j < cols; j++)
        s2 += (double)x[j] * x[j];
    return (float)(1.0 / sqrt(s2 / (double)cols + (double)eps));
}

__global__ static void rms_norm_kernel(int64_t rows, int64_t cols, const float *x,
                                       const float *g, float eps, float *y)
{
    DT__CU_FOR(i, rows) {
        float r = rms_rstd(cols, x + i * cols, eps);
        for (int64_t j = 0; j < cols; j++)
            y[i * cols + j] = x[i * cols + j] * r * g[j];
    }
}

/* Each row's 1/rms into stats[i]. */
__global__ static void rms_stats_kernel(int64_t rows, int64_t cols, const float *x, float eps,
                                        float *stats)
{
    DT__CU_FOR(i, rows)
        stats[i] = rms_rstd(cols, x + i * cols, eps);
}

__global__ static void rms_norm_dx_kernel(int64_t rows, int64_t cols, const float *x,
                                          const float *g, const float *dy, const float *stats,
                                          float *dx)
{
    DT__CU_FOR(i, rows) {
        const float *xr = x + i * cols, *dyr = dy + i * cols;
        float r = stats[i];
        double sgx = 0.0;
        for (int64_t j = 0; j < cols; j++)
            sgx += (double)(dyr[j] * g[j]) * (xr[j] * r);
        float mgx = (float)(sgx / (double)cols);
        for (int64_t j = 0; j < cols; j++) {
            float xh = xr[j] * r;
            dx[i * cols + j] = r * (dyr[j] * g[j] - xh * mgx);
        }
    }
}

__global__ static void rms_norm_dg_kernel(int64_t rows, int64_t cols, const float *x,
                                          const float *dy, const float *stats, float *dg)
{
    DT__CU_FOR(j, cols) {
        float s = 0.0f;
        for (int64_t i = 0; i < rows; i++)
            s += dy[i * cols + j] * (x[i * cols + j] * stats[i]);
        dg[j] = s;
    }
}

cudaError_t dt__cuda_rms_norm(int64_t rows, int64_t cols, const float *x, const float *g,
                              float eps, float *y, cudaStream_t s)
{
    DT__CU_LAUNCH(rms_norm_kernel, dt__cu_blocks(rows), DT__CU_THREADS, 0, s)(rows, cols, x, g, eps, y);
    return cudaGetLastError();
}

cudaError_t dt__cuda_rms_norm_grad(int64_t rows, int64_t cols, const float *x, const float *g,
                                   const float *dy, float eps, float *dx, float *dg,
                                   float *stats, cudaStream_t s)
{
    /* The statistics, then the gain's sums (they read dy, which dx may alias), then dx. */
    DT__CU_LAUNCH(rms_stats_kernel, dt__cu_blocks(rows), DT__CU_THREADS, 0, s)(rows, cols, x, eps, stats);
    DT__CU_LAUNCH(rms_norm_dg_kernel, dt__cu_blocks(cols), DT__CU_THREADS, 0, s)(rows, cols, x, dy, stats,
                                                                      dg);
    DT__CU_LAUNCH(rms_norm_dx_kernel, dt__cu_blocks(rows), DT__CU_THREADS, 0, s)(rows, cols, x, g, dy,
                                                                      stats, dx);
    return cudaGetLastError();
}

__global__ static void rope_kernel(int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                                   int64_t pos_offset, int inverse, const float *x, float *y)
{
    int64_t half = hd / 2;
    DT__CU_FOR(p, batch * seq * heads * half) {
        int64_t i = p % half, t = (p / (half * heads)) % seq;
        int64_t o = (p / half) * hd + 2 * i; /* (b, t, h) rows of hd elements */
        double ang = (double)(pos_offset + t) * pow(10000.0, -2.0 * (double)i / (double)hd);
        float c = (float)cos(ang), sn = (float)sin(ang);
        if (inverse)
            sn = -sn;
        float x0 = x[o], x1 = x[o + 1];
        y[o] = x0 * c - x1 * sn;
        y[o + 1] = x0 * sn + x1 * c;
    }
}

cudaError_t dt__cuda_rope(int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                          int64_t pos_offset, int inverse, const float *x, float *y,
                          cudaStream_t s)
{
    DT__CU_LAUNCH(rope_kernel, dt__cu_blocks(batch * seq * heads * (hd / 2)), DT__CU_THREADS, 0, s)(
        batch, seq, heads, hd, pos_offset, inverse, x, y);
    return cudaGetLastError();
}

__device__ static float sigm(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

__global__ static void swiglu_kernel(int64_t n, const float *gate, const float *up, float *y)
{
    DT__CU_FOR(i, n) {
        float g = gate[i];
        y[i] = g * sigm(g) * up[i];
    }
}

__global__ static void swiglu_grad_kernel(int64_t n, const float *gate, const float *up,
                                          const float *dy, float *dgate, float *dup)
{
    DT__CU_FOR(i, n) {
        float g = gate[i], u = up[i], d = dy[i], sg = sigm(g);
        dgate[i] = d * u * (sg * (1.0f + g * (1.0f - sg)));
        dup[i] = d * (g * sg);
    }
}

cudaError_t dt__cuda_swiglu(int64_t n, const float *gate, const float *up, float *y,
                            cudaStream_t s)
{
    DT__CU_LAUNCH(swiglu_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, gate, up, y);
    return cudaGetLastError();
}

cudaError_t dt__cuda_swiglu_grad(int64_t n, const float *gate, const float *up,
                                 const float *dy, float *dgate, float *dup, cudaStream_t s)
{
    DT__CU_LAUNCH(swiglu_grad_kernel, dt__cu_blocks(n), DT__CU_THREADS, 0, s)(n, gate, up, dy, dgate, dup);
    return cudaGetLastError();
}

__device__ static float gqa_score(int64_t hd, const float *q, const float *k, float scale)
{
    float s = 0.0f;
    for (int64_t d = 0; d < hd; d++)
        s += q[d] * k[d];
    return s * scale;
}

/* Max and sum of the exponentials of query q's scores over n key rows (stride kld). */
__device__ static void gqa_norm(int64_t n, int64_t hd, int64_t kld, float scale,
                                const float *q, const float *k, float *mx_out, float *sum_out)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        mx = fmaxf(mx, gqa_score(hd, q, k + j * kld, scale));
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++)
        sum += expf(gqa_score(hd, q, k + j * kld, scale) - mx);
    *mx_out = mx;
    *sum_out = (float)sum;
}

__global__ static void gqa_kernel(int64_t batch, int64_t seq, int64_t heads, int64_t kvh,
                                  int64_t hd, int causal, const float *q, const float *k,
                                  const float *v, float *y)
{
    int64_t ld = heads * hd, kld = kvh * hd, group = heads / kvh;
    float scale = rsqrtf((float)hd);
    DT__CU_FOR(p, batch * heads * seq) {
        int64_t t = p % seq, h = (p / seq) % heads, b = p / (seq * heads);
        int64_t base = b * seq * ld + h * hd, kbase = b * seq * kld + (h / group) * hd;
        int64_t n = causal ? t + 1 : seq;
        const float *qt = q + base + t * ld;
        float mx, sum;
        gqa_norm(n, hd, kld, scale, qt, k + kbase, &mx, &sum);
        float *yt = y + base + t * ld;
        for (int64_t d = 0; d < hd; d++)
            yt[d] = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            float pj = expf(gqa_score(hd, qt, k + kbase + j * kld, scale) - mx) / sum;
            for (int64_t d = 0; d < hd; d++)
                yt[d] += pj * v[kbase + j * kld + d];
        }
    }
}

__global__ static void gqa_grad_kernel(int64_t batch, int64_t seq, int64_t heads, int64_t kvh,
                                       int64_t hd, int causal, const float *q, const float *k,
                                       const float *v, const float *dy, float *dq, float *dk,
                                       float *dv)
{
    int64_t ld = heads * hd, kld = kvh * hd, group = heads / kvh;
    float scale = rsqrtf((float)hd);
    DT__CU_FOR(p, batch * heads * seq) {
        int64_t t = p % seq, h = (p / seq) % heads, b = p / (seq * heads);
        int64_t base = b * seq * ld + h * hd, kbase = b * seq * kld + (h / group) * hd;
        int64_t n = causal ? t + 1 : seq;
        const float *qt = q + base + t * ld, *dyt = dy + base + t * ld;
        float mx, sum;
        gqa_norm(n, hd, kld, scale, qt, k + kbase, &mx, &sum);
        double dot = 0.0;
        for (int64_t j = 0; j < n; j++) {
            float pj = expf(gqa_score(hd, qt, k + kbase + j * kld, scale) - mx) / sum;
            dot += (double)pj * gqa_score(hd, dyt, v + kbase + j * kld, 1.0f);
        }
        float *dqt = dq + base + t * ld;
        for (int64_t d = 0; d < hd; d++)
            dqt[d] = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            const float *kj = k + kbase + j * kld;
            float pj = expf(gqa_score(hd, qt, kj, scale) - mx) / sum;
            float ds = pj * (gqa_score(hd, dyt, v + kbase + j * kld, 1.0f) - (float)dot) * scale;
            for (int64_t d = 0; d < hd; d++) {
                dqt[d] += ds * kj[d];
                atomicAdd(dk + kbase + j * kld + d, ds * qt[d]);
                atomicAdd(dv + kbase + j * kld + d, pj * dyt[d]);
            }
        }
    }
}

cudaError_t dt__cuda_attention_gqa(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                   int64_t hd, int causal, const float *q, const float *k,
                                   const float *v, float *y, cudaStream_t s)
{
    DT__CU_LAUNCH(gqa_kernel, dt__cu_blocks(batch * heads * seq), DT__CU_THREADS, 0, s)(
        batch, seq, heads, kv_heads, hd, causal, q, k, v, y);
    return cudaGetLastError();
}

cudaError_t dt__cuda_attention_gqa_grad(int64_t batch, int64_t seq, int64_t heads,
                                        int64_t kv_heads, int64_t hd, int causal,
                                        const float *q, const float *k, const float *v,
                                        const float *dy, float *dq, float *dk, float *dv,
                                        cudaStream_t s)
{
    size_t kbytes = (size_t)(batch * seq * kv_heads * hd) * sizeof(float);
    cudaMemsetAsync(dk, 0, kbytes, s);
    cudaMemsetAsync(dv, 0, kbytes, s);
    DT__CU_LAUNCH(gqa_grad_kernel, dt__cu_blocks(batch * heads * seq), DT__CU_THREADS, 0, s)(
        batch, seq, heads, kv_heads, hd, causal, q, k, v, dy, dq, dk, dv);
    return cudaGetLastError();
}
