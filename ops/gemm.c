/* Local GEMM: f32 straight through cblas_sgemm; f16/bf16 operands widened to f32 one block
 * of the contraction dim at a time into a pool buffer, accumulating in f32. */
#include <limits.h>
#include <cblas.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

/* Floats of the conversion buffer per block (4 MiB), so a block stays in cache. */
#define GEMM_BLOCK_FLOATS ((int64_t)1 << 20)

static int is_gemm_dtype(dt_dtype t)
{
    return t == DT_DTYPE_F32 || t == DT_DTYPE_F16 || t == DT_DTYPE_BF16;
}

/* Widens rows [r0, r0+nr) x cols [c0, c0+nc) of a row-major half matrix (leading dim ld)
 * into dst (leading dim nc). */
static void widen_block(const uint16_t *src, dt_dtype dtype, int64_t ld, int64_t r0, int64_t nr,
                        int64_t c0, int64_t nc, float *dst)
{
    for (int64_t r = 0; r < nr; r++)
        dt_kernel_cast(nc, src + (r0 + r) * ld + c0, dtype, dst + r * nc, DT_DTYPE_F32);
}

dt_status dt_kernel_gemm(int transa, int transb, int64_t m, int64_t n, int64_t k,
                         float alpha, const void *a, dt_dtype a_dtype, int64_t lda,
                         const void *b, dt_dtype b_dtype, int64_t ldb, float beta,
                         float *c, int64_t ldc)
{
    if (m < 0 || n < 0 || k < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_gemm: negative size m=%lld n=%lld "
                         "k=%lld", (long long)m, (long long)n, (long long)k);
    if (!is_gemm_dtype(a_dtype) || !is_gemm_dtype(b_dtype))
        return dt__error(DT_ERR_UNSUPPORTED, "dt_kernel_gemm: operand dtypes %s x %s (f32, f16 "
                         "or bf16 expected)", dt_dtype_name(a_dtype), dt_dtype_name(b_dtype));
    int64_t a_cols = transa ? m : k, b_cols = transb ? k : n;
    if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) ||
        ldc < (n > 1 ? n : 1))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_gemm: leading dims lda=%lld "
                         "ldb=%lld ldc=%lld too small for m=%lld n=%lld k=%lld", (long long)lda,
                         (long long)ldb, (long long)ldc, (long long)m, (long long)n,
                         (long long)k);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX)
        return dt__error(DT_ERR_UNSUPPORTED, "dt_kernel_gemm: sizes beyond the BLAS int range");
    if (m == 0 || n == 0)
        return DT_OK;
    if ((k > 0 && (!a || !b)) || !c)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_gemm: NULL matrix pointer");
    CBLAS_TRANSPOSE ta = transa ? CblasTrans : CblasNoTrans;
    CBLAS_TRANSPOSE tb = transb ? CblasTrans : CblasNoTrans;
    if (k == 0) {
        /* C = beta C; BLAS implementations disagree on k == 0, so do it here. */
        for (int64_t i = 0; i < m; i++) {
            float *row = c + i * ldc;
            for (int64_t j = 0; j < n; j++)
                row[j] = beta == 0.0f ? 0.0f : beta * row[j];
        }
        return DT_OK;
    }
    dt__blas_threads_once(); /* BLAS threads shared among the host's clients */
    if (a_dtype == DT_DTYPE_F32 && b_dtype == DT_DTYPE_F32) {
        cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, alpha, a, (int)lda, b,
                    (int)ldb, beta, c, (int)ldc);
        return DT_OK;
    }

    /* Block the contraction dim: C = alpha sum_blocks opA[:, blk] opB[blk, :] + beta C. */
    int64_t per_k = (a_dtype != DT_DTYPE_F32 ? m : 0) + (b_dtype != DT_DTYPE_F32 ? n : 0);
    int64_t kb = GEMM_BLOCK_FLOATS / per_k;
    if (kb < 64)
        kb = 64;
    if (kb > k)
        kb = k;
    float *buf = NULL;
    dt_status st = dt_host_alloc((size_t)(kb * per_k) * sizeof(float), (void **)&buf);
    if (st != DT_OK)
        return st;
    float *abuf = buf, *bbuf = buf + (a_dtype != DT_DTYPE_F32 ? m * kb : 0);
    for (int64_t k0 = 0; k0 < k; k0 += kb) {
        int64_t nk = k - k0 < kb ? k - k0 : kb;
        const float *ap, *bp;
        int64_t lda_blk, ldb_blk;
        /* opA[:, k0:k0+nk]: A rows (no trans) or A^T, i.e. rows k0.. of A (trans). */
        if (a_dtype == DT_DTYPE_F32) {
            ap = transa ? (const float *)a + k0 * lda : (const float *)a + k0;
            lda_blk = lda;
        } else if (transa) {
            widen_block(a, a_dtype, lda, k0, nk, 0, m, abuf);
            ap = abuf;
            lda_blk = m;
        } else {
            widen_block(a, a_dtype, lda, 0, m, k0, nk, abuf);
            ap = abuf;
            lda_blk = nk;
        }
        if (b_dtype == DT_DTYPE_F32) {
            bp = transb ? (const float *)b + k0 : (const float *)b + k0 * ldb;
            ldb_blk = ldb;
        } else if (transb) {
            widen_block(b, b_dtype, ldb, 0, n, k0, nk, bbuf);
            bp = bbuf;
            ldb_blk = nk;
        } else {
            widen_block(b, b_dtype, ldb, k0, nk, 0, n, bbuf);
            bp = bbuf;
            ldb_blk = n;
        }
        cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)nk, alpha, ap, (int)lda_blk, bp,
                    (int)ldb_blk, k0 == 0 ? beta : 1.0f, c, (int)ldc);
    }
    dt_host_free(buf);
    return DT_OK;
}
