/* dt_kernel_gemm on device pointers through cuBLAS: row-major C = alpha op(A) op(B) + beta C
 * as the column-major product C^T = op(B)^T op(A)^T; f16/bf16 operands widened to f32 in
 * device scratch first, so the arithmetic is that of the CPU kernel (f32 in, f32 sums). */
#include <limits.h>
#include <pthread.h>

#include <cublas_v2.h>

#include "ops/cuda/cuda_ops.h"
#include "ops/ops_impl.h"
#include "runtime/error.h"

static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;
static cublasHandle_t handles[DT__CU_MAX_DEVICES];

static dt_status cublas_error(cublasStatus_t s, const char *what)
{
    return dt__error(s == CUBLAS_STATUS_ALLOC_FAILED ? DT_ERR_NO_MEMORY : DT_ERR_CUDA,
                     "dt_kernel_gemm (CUDA): %s: %s (%s)", what, cublasGetStatusString(s),
                     cublasGetStatusName(s));
}

/* The cuBLAS handle of the current device, created on first use (plain f32 math: no TF32). */
static dt_status get_handle(cublasHandle_t *h_out)
{
    int ord = 0;
    dt_status st = dt__cuda_check(cudaGetDevice(&ord), "dt_kernel_gemm (CUDA): cudaGetDevice");
    if (st != DT_OK)
        return st;
    if (ord < 0 || ord >= DT__CU_MAX_DEVICES)
        return dt__error(DT_ERR_UNSUPPORTED, "dt_kernel_gemm (CUDA): CUDA device %d beyond the "
                         "%d the ops keep state for", ord, DT__CU_MAX_DEVICES);
    pthread_mutex_lock(&handle_lock);
    if (!handles[ord]) {
        cublasHandle_t h = NULL;
        cublasStatus_t s = cublasCreate(&h);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
        if (s != CUBLAS_STATUS_SUCCESS) {
            if (h)
                cublasDestroy(h);
            pthread_mutex_unlock(&handle_lock);
            return cublas_error(s, "cublasCreate");
        }
        handles[ord] = h;
    }
    *h_out = handles[ord];
    pthread_mutex_unlock(&handle_lock);
    return DT_OK;
}

void dt__cuda_gemm_release(void)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess)
        cudaGetLastError();
    pthread_mutex_lock(&handle_lock);
    for (int d = 0; d < DT__CU_MAX_DEVICES; d++) {
        if (handles[d] && cudaSetDevice(d) == cudaSuccess)
            cublasDestroy(handles[d]);
        handles[d] = NULL;
    }
    pthread_mutex_unlock(&handle_lock);
    if (cur >= 0)
        cudaSetDevice(cur);
    cudaGetLastError();
}

static int is_gemm_dtype(dt_dtype t)
{
    return t == DT_DTYPE_F32 || t == DT_DTYPE_F16 || t == DT_DTYPE_BF16;
}

/* Elements spanned by a row-major rows x cols matrix of leading dim ld. */
static int64_t span(int64_t rows, int64_t cols, int64_t ld)
{
    return rows > 0 && cols > 0 ? (rows - 1) * ld + cols : 0;
}

dt_status dt__cuda_gemm(int transa, int transb, int64_t m, int64_t n, int64_t k, float alpha,
                        const void *a, dt_dtype a_dtype, int64_t lda, const void *b,
                        dt_dtype b_dtype, int64_t ldb, float beta, float *c, int64_t ldc)
{
    const char *op = "dt_kernel_gemm (CUDA)";
    if (m < 0 || n < 0 || k < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: negative size m=%lld n=%lld k=%lld", op,
                         (long long)m, (long long)n, (long long)k);
    if (!is_gemm_dtype(a_dtype) || !is_gemm_dtype(b_dtype))
        return dt__error(DT_ERR_UNSUPPORTED, "%s: operand dtypes %s x %s (f32, f16 or bf16 "
                         "expected)", op, dt_dtype_name(a_dtype), dt_dtype_name(b_dtype));
    int64_t a_rows = transa ? k : m, a_cols = transa ? m : k;
    int64_t b_rows = transb ? n : k, b_cols = transb ? k : n;
    if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) ||
        ldc < (n > 1 ? n : 1))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: leading dims lda=%lld ldb=%lld ldc=%lld "
                         "too small for m=%lld n=%lld k=%lld", op, (long long)lda,
                         (long long)ldb, (long long)ldc, (long long)m, (long long)n,
                         (long long)k);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: sizes beyond the BLAS int range", op);
    if (m == 0 || n == 0)
        return DT_OK;
    if ((k > 0 && (!a || !b)) || !c)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL matrix pointer", op);
    if (k == 0) /* C = beta C, zeros for beta == 0 (as the CPU kernel) */
        return dt__cuda_check(dt__cuda_scale_matrix(m, n, beta, c, ldc, 0), op);

    cublasHandle_t h = NULL;
    dt_status st = get_handle(&h);
    if (st != DT_OK)
        return st;
    int64_t a_span = a_dtype == DT_DTYPE_F32 ? 0 : span(a_rows, a_cols, lda);
    int64_t b_span = b_dtype == DT_DTYPE_F32 ? 0 : span(b_rows, b_cols, ldb);
    const float *af = a, *bf = b;
    int locked = 0;
    if (a_span + b_span > 0) {
        /* Widen the spans (with whatever lies between rows: harmless, never used). */
        void *scratch = NULL;
        dt__cuda_lock();
        locked = 1;
        st = dt__cuda_scratch((size_t)(a_span + b_span) * sizeof(float), &scratch);
        if (st != DT_OK)
            goto out;
        float *wa = scratch, *wb = (float *)scratch + a_span;
        if (a_span) {
            st = dt__cuda_check(dt__cuda_cast(a_span, a, a_dtype == DT_DTYPE_F16 ? DT__CU_F16
                                              : DT__CU_BF16, wa, DT__CU_F32, 0), op);
            af = wa;
        }
        if (st == DT_OK && b_span) {
            st = dt__cuda_check(dt__cuda_cast(b_span, b, b_dtype == DT_DTYPE_F16 ? DT__CU_F16
                                              : DT__CU_BF16, wb, DT__CU_F32, 0), op);
            bf = wb;
        }
        if (st != DT_OK)
            goto out;
    }
    cublasOperation_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s = cublasSgemm(h, tb, ta,
                                   (int)n, (int)m, (int)k, &alpha, bf, (int)ldb, af, (int)lda,
                                   &beta, c, (int)ldc);
    if (s != CUBLAS_STATUS_SUCCESS)
        st = cublas_error(s, "cublasSgemm");
out:
    if (locked)
        dt__cuda_unlock();
    return st;
}
