/* CUDA transformer kernels: layer norm, softmax along a dim, causal self-attention (one
 * thread per query row, weights recomputed in passes; gradients of keys and values by atomic
 * adds), vocabulary-sliced embedding and the vocab-parallel cross-entropy pieces. Simple
 * thread-per-row kernels: the model sizes of examples/train_gpt, not a tuned library. */
#include <math.h>

#include "runtime/cuda/cu_lang.h"
#include "ops/cuda/cuda_ops.h"

__device__ static void row_moments(int64_t cols, const float *x, float eps, float *mean,
                                   float *rstd)
{
    double s = 0.0, s2 = 0.0;
    for (int64_t j = 0; j < cols; j++)
        s += x[j];
    double mu = s / (double)cols;
    for (int64_t j = 0; j < cols; j++)
        s2 += (x[j] - mu) * (x[j] - mu);
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(s2 / (double)cols + (double)eps));
}

__global__ static void layer_norm_kernel(int64_t rows, int64_t cols, const float *x,
                                         const float *g, const float *b, float eps, float *y)
{
    DT__CU_FOR(i, rows) {
        float mean, rstd;
        row_moments(cols, x + i * cols, eps, &mean, &rstd);
        for (int64_t j = 0; j < cols; j++)
            y[i * cols + j] = (x[i * cols + j] - mean) * rstd * g[j] + b[j];
    }
}

/* dx per row; the row statistics go to stats [rows, 2] for the column sums. */
__global__ static void layer_norm_dx_kernel(int64_t rows, int64_t cols, const float *x,
                                            const float *g, const float *dy, float eps,
                                            float *dx, float *stats)
{
    DT__CU_FOR(i, rows) {
        const float *xr = x + i * cols, *dyr = dy + i * cols;
        float mean, rstd;
        row_moments(cols, xr, eps, &mean, &rstd);
        double sg = 0.0, sgx = 0.0;
        for (int64_t j = 0; j < cols; j++) {
            float xh = (xr[j] - mean) * rstd, gg = dyr[j] * g[j];
            sg += gg;
            sgx += (double)gg * xh;
        }
        float mg = (float)(sg / (double)cols), mgx = (float)(sgx / (double)cols);
        for (int64_t j = 0; j < cols; j++) {
            float xh = (xr[j] - mean) * rstd;
            dx[i * cols + j] = rstd * (dyr[j] * g[j] - mg - xh * mgx);
        }
        stats[2 * i] = mean;
        stats[2 * i + 1] = rstd;
    }
}

__global__ static void layer_norm_dparam_kernel(int64_t rows, int64_t cols, const float *x,
                                                const float *dy, const float *stats,
                                                float *dg, float *db)
{
    DT__CU_FOR(j, cols) {
        float sg = 0.0f, sb = 0.0f;
        for (int64_t i = 0; i < rows; i++) {
            float xh = (x[i * cols + j] - stats[2 * i]) * stats[2 * i + 1];
            sg += dy[i * cols + j] * xh;
            sb += dy[i * cols + j];
        }
        dg[j] = sg;
        db[j] = sb;
    }
}

cudaError_t dt__cuda_layer_norm(int64_t rows, int64_t cols, const float *x, const float *g,
                                const float *b, float eps, float *y, cudaStream_t s)
{
    DT__CU_LAUNCH(layer_norm_kernel, dt__cu_blocks(rows), DT__CU_THREADS, 0, s)(rows, cols, x, g, b, eps,
                                                                      y);
    return cudaGetLastError();
}

cudaError_t dt__cuda_layer_norm_grad(int64_t rows, int64_t cols, const float *x, const float *g,
                                     const float *dy, float eps, float *dx, float *dg,
                                     float *db, float *stats, cudaStream_t s)
{
    if (rows > 0)
        DT__CU_LAUNCH(layer_norm_dx_kernel, dt__cu_blocks(rows), DT__CU_THREADS, 0, s)(rows, cols, x, g, dy,
                                                                             eps, dx, stats);
    DT__CU_LAUNCH(layer_norm_dparam_kernel, dt__cu_blocks(cols), DT__CU_THREADS, 0, s)(rows, cols, x, dy,
                                                                             stats, dg, db);
    return cudaGetLastError();
}

__global__ static void softmax_kernel(int64_t outer, int64_t len, int64_t inner, const float *x,
                                      float *y)
{
    DT__CU_FOR(p, outer * inner) {
        int64_t base = (p / inner) * len * inner + p % inner;
        float mx = -INFINITY;
        for (int64_t j = 0; j < len; j++)
            mx = fmaxf(mx, x[base + j * inner]);
        double s = 0.0;
        for (int64_t j = 0; j < len; j++)
            s += exp((double)(x[base + j * inner] - mx));
        float inv = (float)(1.0 / s);
        for (int64_t j = 0; j < len; j++)
            y[base + j * inner] = expf(x[base + j * inner] - mx) * inv;
    }
}

__global__ static void softmax_grad_kernel(int64_t outer, int64_t len, int64_t inner,
                                           const float *y, const float *dy, float *dx)
{
    DT__CU_FOR(p, outer * inner) {
        int64_t base = (p / inner) * len * inner + p % inner;
        double dot = 0.0;
        for (int64_t j = 0; j < len; j++)
            dot += (double)y[base + j * inner] * dy[base + j * inner];
        for (int64_t j = 0; j < len; j++)
            dx[base + j * inner] = y[base + j * inner] * (dy[base + j * inner] - (float)dot);
    }
}

cudaError_t dt__cuda_softmax(int64_t outer, int64_t len, int64_t inner, const float *x,
                             float *y, cudaStream_t s)
{
    DT__CU_LAUNCH(softmax_kernel, dt__cu_blocks(outer * inner), DT__CU_THREADS, 0, s)(outer, len, inner, x,
                                                                            y);
    return cudaGetLastError();
}

cudaError_t dt__cuda_softmax_grad(int64_t outer, int64_t len, int64_t inner, const float *y,
                                  const float *dy, float *dx, cudaStream_t s)
{
    DT__CU_LAUNCH(softmax_grad_kernel, dt__cu_blocks(outer * inner), DT__CU_THREADS, 0, s)(outer, len,
                                                                                 inner, y, dy,
                                                                                 dx);
    return cudaGetLastError();
}

/* Score of query row q against key row k. */
__device__ static float score(int64_t hd, const float *q, const float *k, float scale)
{
    float s = 0.0f;
    for (int64_t d = 0; d < hd; d++)
        s += q[d] * k[d];
    return s * scale;
}

/* One thread per (batch, head, query): max and sum of the exponentials over the keys. */
__device__ static void attn_norm(int64_t n, int64_t hd, int64_t ld, float scale,
                                 const float *q, const float *k, float *mx_out, float *sum_out)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        mx = fmaxf(mx, score(hd, q, k + j * ld, scale));
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++)
        sum += expf(score(hd, q, k + j * ld, scale) - mx);
    *mx_out = mx;
    *sum_out = (float)sum;
}

__global__ static void attention_kernel(int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                                        int causal, const float *q, const float *k,
                                        const float *v, float *y)
{
    int64_t ld = heads * hd;
    float scale = rsqrtf((float)hd);
    DT__CU_FOR(p, batch * heads * seq) {
        int64_t t = p % seq, h = (p / seq) % heads, b = p / (seq * heads);
        int64_t base = b * seq * ld + h * hd, n = causal ? t + 1 : seq;
        const float *qt = q + base + t * ld;
        float mx, sum;
        attn_norm(n, hd, ld, scale, qt, k + base, &mx, &sum);
        float *yt = y + base + t * ld;
        for (int64_t d = 0; d < hd; d++)
            yt[d] = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            float pj = expf(score(hd, qt, k + base + j * ld, scale) - mx) / sum;
            for (int64_t d = 0; d < hd; d++)
                yt[d] += pj * v[base + j * ld + d];
        }
    }
}

__global__ static void attention_grad_kernel(int64_t batch, int64_t seq, int64_t heads,
                                             int64_t hd, int causal, const float *q,
                                             const float *k, const float *v, const float *dy,
                                             float *dq, float *dk, float *dv)
{
    int64_t ld = heads * hd;
    float scale = rsqrtf((float)hd);
    DT__CU_FOR(p, batch * heads * seq) {
        int64_t t = p % seq, h = (p / seq) % heads, b = p / (seq * heads);
        int64_t base = b * seq * ld + h * hd, n = causal ? t + 1 : seq;
        const float *qt = q + base + t * ld, *dyt = dy + base + t * ld;
        float mx, sum;
        attn_norm(n, hd, ld, scale, qt, k + base, &mx, &sum);
        double dot = 0.0;
        for (int64_t j = 0; j < n; j++) {
            float pj = expf(score(hd, qt, k + base + j * ld, scale) - mx) / sum;
            dot += (double)pj * score(hd, dyt, v + base + j * ld, 1.0f);
        }
        float *dqt = dq + base + t * ld;
        for (int64_t j = 0; j < n; j++) {
            const float *kj = k + base + j * ld;
            float pj = expf(score(hd, qt, kj, scale) - mx) / sum;
            float ds = pj * (score(hd, dyt, v + base + j * ld, 1.0f) - (float)dot) * scale;
            for (int64_t d = 0; d < hd; d++) {
                dqt[d] += ds * kj[d];
                atomicAdd(dk + base + j * ld + d, ds * qt[d]);
                atomicAdd(dv + base + j * ld + d, pj * dyt[d]);
            }
        }
    }
}

cudaError_t dt__cuda_attention(int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                               int causal, const float *q, const float *k, const float *v,
                               float *y, cudaStream_t s)
{
    DT__CU_LAUNCH(attention_kernel, dt__cu_blocks(batch * heads * seq), DT__CU_THREADS, 0, s)(
        batch, seq, heads, hd, causal, q, k, v, y);
    return cudaGetLastError();
}

cudaError_t dt__cuda_attention_grad(int64_t batch, int64_t seq, int64_t heads, int64_t hd,
                                    int causal, const float *q, const float *k, const float *v,
                                    const float *dy, float *dq, float *dk, float *dv,
                                    cudaStream_t s)
{
    size_t bytes = (size_t)(batch * seq * heads * hd) * sizeof(float);
    cudaMemsetAsync(dq, 0, bytes, s);
    cudaMemsetAsync(dk, 0, bytes, s);
    cudaMemsetAsync(dv, 0, bytes, s);
    DT__CU_LAUNCH(attention_grad_kernel, dt__cu_blocks(batch * heads * seq), DT__CU_THREADS, 0, s)(
        batch, seq, heads, hd, causal, q, k, v, dy, dq, dk, dv);
    return cudaGetLastError();
}

__global__ static void embedding_kernel(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                                        int64_t vocab, int64_t dim, const float *table,
                                        float *out, unsigned long long *fault)
{
    DT__CU_FOR(p, n * dim) {
        int64_t i = p / dim, j = p % dim, r = (int64_t)ids[i] - lo;
        if (ids[i] < 0 || ids[i] >= vocab) {
            if (j == 0)
                atomicMin(fault, dt__cuda_fault_word(i, ids[i]));
            out[p] = 0.0f;
            continue;
        }
        out[p] = r >= 0 && r < rows ? table[r * dim + j] : 0.0f;
    }
}

__global__ static void embedding_grad_kernel(int64_t n, const int32_t *ids, int64_t lo,
                                             int64_t rows, int64_t vocab, int64_t dim,
                                             const float *dout, float *dtable,
                                             unsigned long long *fault)
{
    DT__CU_FOR(p, n * dim) {
        int64_t i = p / dim, j = p % dim, r = (int64_t)ids[i] - lo;
        if (ids[i] < 0 || ids[i] >= vocab) {
            if (j == 0)
                atomicMin(fault, dt__cuda_fault_word(i, ids[i]));
            continue;
        }
        if (r >= 0 && r < rows)
            atomicAdd(dtable + r * dim + j, dout[p]);
    }
}

cudaError_t dt__cuda_embedding(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                               int64_t vocab, int64_t dim, const float *table, float *out,
                               unsigned long long *fault, cudaStream_t s)
{
    DT__CU_LAUNCH(embedding_kernel, dt__cu_blocks(n * dim), DT__CU_THREADS, 0, s)(n, ids, lo, rows, vocab,
                                                                        dim, table, out, fault);
    return cudaGetLastError();
}

cudaError_t dt__cuda_embedding_grad(int64_t n, const int32_t *ids, int64_t lo, int64_t rows,
                                    int64_t vocab, int64_t dim, const float *dout,
                                    float *dtable, unsigned long long *fault, cudaStream_t s)
{
    cudaMemsetAsync(dtable, 0, (size_t)(rows * dim) * sizeof(float), s);
    if (n * dim > 0)
        DT__CU_LAUNCH(embedding_grad_kernel, dt__cu_blocks(n * dim), DT__CU_THREADS, 0, s)(
            n, ids, lo, rows, vocab, dim, dout, dtable, fault);
    return cudaGetLastError();
}

__global__ static void vxent_stats_kernel(int64_t rows, int64_t cols, const float *x,
                                          const float *mx, int64_t lo, const int32_t *labels,
                                          float *sumexp, float *target)
{
    DT__CU_FOR(i, rows) {
        double s = 0.0;
        for (int64_t j = 0; j < cols; j++)
            s += exp((double)(x[i * cols + j] - mx[i]));
        int64_t t = (int64_t)labels[i] - lo;
        sumexp[i] = (float)s;
        target[i] = t >= 0 && t < cols ? x[i * cols + t] : 0.0f;
    }
}

__global__ static void vxent_check_kernel(int64_t rows, int64_t vocab, const int32_t *labels,
                                          unsigned long long *bad_row)
{
    DT__CU_FOR(i, rows) {
        if (labels[i] >= vocab)
            atomicMin(bad_row, (unsigned long long)i);
    }
}

cudaError_t dt__cuda_vocab_check_labels(int64_t rows, int64_t vocab, const int32_t *labels,
                                        unsigned long long *bad_row, cudaStream_t s)
{
    DT__CU_LAUNCH(vxent_check_kernel, dt__cu_blocks(rows), DT__CU_THREADS, 0, s)(rows, vocab, labels,
                                                                       bad_row);
    return cudaGetLastError();
}

__global__ static void vxent_loss_kernel(int64_t rows, const float *mx, const float *sumexp,
                                         const float *target, const int32_t *labels,
                                         float scale, float *loss)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    double total = 0.0;
    for (int64_t i = 0; i < rows; i++)
        if (labels[i] >= 0)
            total += log((double)sumexp[i]) + (double)mx[i] - (double)target[i];
    *loss = (float)(scale * total);
}

__global__ static void vxent_grad_kernel(int64_t rows, int64_t cols, const float *x,
                                         const float *mx, const float *sumexp, int64_t lo,
                                         const int32_t *labels, float scale, float *d)
{
    DT__CU_FOR(p, rows * cols) {
        int64_t i = p / cols, j = p % cols;
        float onehot = (int64_t)labels[i] - lo == j ? 1.0f : 0.0f;
        d[p] = labels[i] < 0 ? 0.0f : scale * (expf(x[p] - mx[i]) / sumexp[i] - onehot);
    }
}

cudaError_t dt__cuda_vocab_xent_stats(int64_t rows, int64_t cols, const float *logits,
                                      const float *rowmax, int64_t lo, const int32_t *labels,
                                      float *sumexp, float *target, cudaStream_t s)
{
    DT__CU_LAUNCH(vxent_stats_kernel, dt__cu_blocks(rows), DT__CU_THREADS, 0, s)(rows, cols, logits, rowmax,
                                                                       lo, labels, sumexp,
                                                                       target);
    return cudaGetLastError();
}

cudaError_t dt__cuda_vocab_xent_loss(int64_t rows, const float *rowmax, const float *sumexp,
                                     const float *target, const int32_t *labels, float scale,
                                     float *loss_out, cudaStream_t s)
{
    DT__CU_LAUNCH(vxent_loss_kernel, 1, 1, 0, s)(rows, rowmax, sumexp, target, labels, scale, loss_out);
    return cudaGetLastError();
}

cudaError_t dt__cuda_vocab_xent_grad(int64_t rows, int64_t cols, const float *logits,
                                     const float *rowmax, const float *sumexp, int64_t lo,
                                     const int32_t *labels, float scale, float *dlogits,
                                     cudaStream_t s)
{
    DT__CU_LAUNCH(vxent_grad_kernel, dt__cu_blocks(rows * cols), DT__CU_THREADS, 0, s)(
        rows, cols, logits, rowmax, sumexp, lo, labels, scale, dlogits);
    return cudaGetLastError();
}
