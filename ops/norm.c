/* Local normalisation kernels: layer normalisation over the last dim and a numerically stable
 * softmax along the middle dim of [outer, len, inner], with their gradients. */
#include <math.h>
#include <stdlib.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

/* Mean and 1/sqrt(var + eps) of one row, accumulated in f64 in four lanes (element j in lane
 * j % 4, the lanes added (l0 + l1) + (l2 + l3)): independent chains the compiler vectorises,
 * and the same order on every path. */
static void row_moments(int64_t cols, const float *x, float eps, float *mean_out,
                        float *rstd_out)
{
    double s[4] = {0, 0, 0, 0}, s2[4] = {0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 4 <= cols; j += 4)
        for (int l = 0; l < 4; l++)
            s[l] += x[j + l];
    for (int l = 0; j + l < cols; l++)
        s[l] += x[j + l];
    double mean = ((s[0] + s[1]) + (s[2] + s[3])) / (double)cols;
    for (j = 0; j + 4 <= cols; j += 4)
        for (int l = 0; l < 4; l++) {
            double d = x[j + l] - mean;
            s2[l] += d * d;
        }
    for (int l = 0; j + l < cols; l++) {
        double d = x[j + l] - mean;
        s2[l] += d * d;
    }
    double var = ((s2[0] + s2[1]) + (s2[2] + s2[3])) / (double)cols;
    *mean_out = (float)mean;
    *rstd_out = (float)(1.0 / sqrt(var + (double)eps));
}

static dt_status check_ln(const char *op, int64_t rows, int64_t cols, float eps, int nptrs,
                          const void *const *ptrs)
{
    if (cols < 1 || !(eps >= 0.0f))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: cols=%lld eps=%g (cols >= 1, eps >= 0)",
                         op, (long long)cols, (double)eps);
    return dt__kcheck(op, rows, nptrs, ptrs);
}

dt_status dt_kernel_layer_norm(int64_t rows, int64_t cols, const float *x, const float *gamma,
                               const float *beta, float eps, float *y)
{
    const void *p[] = {x, gamma, beta, y};
    dt_status st = check_ln("dt_kernel_layer_norm", rows, cols, eps, 4, p);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * cols;
        float *yr = y + i * cols;
        float mean, rstd;
        row_moments(cols, xr, eps, &mean, &rstd);
        for (int64_t j = 0; j < cols; j++)
            yr[j] = (xr[j] - mean) * rstd * gamma[j] + beta[j];
    }
    return DT_OK;
}

dt_status dt_kernel_layer_norm_grad(int64_t rows, int64_t cols, const float *x,
                                    const float *gamma, const float *dy, float eps, float *dx,
                                    float *dgamma, float *dbeta)
{
    const void *p[] = {x, gamma, dy, dx};
    dt_status st = check_ln("dt_kernel_layer_norm_grad", rows, cols, eps, 4, p);
    if (st == DT_OK && (!dgamma || !dbeta))
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_layer_norm_grad: dgamma or dbeta "
                       "is NULL");
    if (st != DT_OK)
        return st;
    for (int64_t j = 0; j < cols; j++)
        dgamma[j] = dbeta[j] = 0.0f;
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * cols, *dyr = dy + i * cols;
        float *dxr = dx + i * cols;
        float mean, rstd;
        row_moments(cols, xr, eps, &mean, &rstd);
        /* With xh = (x - mean) rstd and g = dy gamma:
         * dx = rstd (g - mean(g) - xh mean(g xh)). */
        double sg = 0.0, sgx = 0.0;
        for (int64_t j = 0; j < cols; j++) {
            float xh = (xr[j] - mean) * rstd;
            float g = dyr[j] * gamma[j];
            sg += g;
            sgx += (double)g * xh;
            dgamma[j] += dyr[j] * xh;
            dbeta[j] += dyr[j];
        }
        float mg = (float)(sg / (double)cols), mgx = (float)(sgx / (double)cols);
        for (int64_t j = 0; j < cols; j++) {
            float xh = (xr[j] - mean) * rstd;
            dxr[j] = rstd * (dyr[j] * gamma[j] - mg - xh * mgx);
        }
    }
    return DT_OK;
}

static dt_status check_sm(const char *op, int64_t outer, int64_t len, int64_t inner,
                          int nptrs, const void *const *ptrs)
{
    if (outer < 0 || len < 0 || inner < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: negative size %lld x %lld x %lld", op,
                         (long long)outer, (long long)len, (long long)inner);
    return dt__kcheck(op, outer * len * inner, nptrs, ptrs);
}

dt_status dt_kernel_softmax(int64_t outer, int64_t len, int64_t inner, const float *x, float *y)
{
    const void *p[] = {x, y};
    dt_status st = check_sm("dt_kernel_softmax", outer, len, inner, 2, p);
    if (st != DT_OK)
        return st;
    /* A strided column goes through a contiguous copy, so every path runs the same loop. */
    float *col = NULL;
    if (inner > 1 && outer * len > 0 && !(col = malloc((size_t)len * sizeof *col)))
        return dt__error(DT_ERR_NO_MEMORY, "dt_kernel_softmax: out of memory");
    for (int64_t o = 0; o < outer; o++)
        for (int64_t c = 0; c < inner; c++) {
            const float *xs = x + o * len * inner + c;
            float *ys = y + o * len * inner + c;
            float *e = inner > 1 ? col : ys;
            float mx = -INFINITY;
            for (int64_t j = 0; j < len; j++)
                mx = xs[j * inner] > mx ? xs[j * inner] : mx;
            if (inner > 1)
                for (int64_t j = 0; j < len; j++)
                    col[j] = xs[j * inner];
            float inv = (float)(1.0 / dt__vexp_sum(len, inner > 1 ? col : xs, mx, e));
            for (int64_t j = 0; j < len; j++)
                ys[j * inner] = e[j] * inv;
        }
    free(col);
    return DT_OK;
}

dt_status dt_kernel_softmax_grad(int64_t outer, int64_t len, int64_t inner, const float *y,
                                 const float *dy, float *dx)
{
    const void *p[] = {y, dy, dx};
    dt_status st = check_sm("dt_kernel_softmax_grad", outer, len, inner, 3, p);
    if (st != DT_OK)
        return st;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t c = 0; c < inner; c++) {
            int64_t base = o * len * inner + c;
            double dot = 0.0;
            for (int64_t j = 0; j < len; j++)
                dot += (double)y[base + j * inner] * dy[base + j * inner];
            for (int64_t j = 0; j < len; j++)
                dx[base + j * inner] = y[base + j * inner] * (dy[base + j * inner] - (float)dot);
        }
    return DT_OK;
}
