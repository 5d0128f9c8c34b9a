/* A stand-in for the cuBLAS calls of ops/cuda/gemm_cublas.c in the host build: handles, math
 * mode, stream, and SGEMM (column-major) with the arguments checked as cuBLAS checks them
 * (sizes, leading dimensions against the transposes, device pointers), run on the handle's
 * stream in f32 with the products accumulated in order of k. Never installed. */
#include <stdlib.h>

#include <cublas_v2.h>

#include "cuda_host/fault.h"
#include "cuda_host/stand_in.h"

struct cublasContext {
    cudaStream_t stream;
    cublasMath_t mode;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (dt__cuh_fault_now("cublascreate"))
        return CUBLAS_STATUS_ALLOC_FAILED;
    *handle = new cublasContext{0, CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    cudaStreamSynchronize(handle->stream);
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = streamId;
    return CUBLAS_STATUS_SUCCESS;
}

namespace {

struct sgemm_args {
    bool ta, tb;
    int m, n, k;
    float alpha, beta;
    const float *a, *b;
    float *c;
    int lda, ldb, ldc;
};

void sgemm_run(void *p)
{
    const sgemm_args *g = (const sgemm_args *)p;
    for (int j = 0; j < g->n; j++)
        for (int i = 0; i < g->m; i++) {
            float acc = 0.0f;
            for (int l = 0; l < g->k; l++) {
                float av = g->ta ? g->a[l + (size_t)i * g->lda] : g->a[i + (size_t)l * g->lda];
                float bv = g->tb ? g->b[j + (size_t)l * g->ldb] : g->b[l + (size_t)j * g->ldb];
                acc += av * bv;
            }
            float *cij = g->c + i + (size_t)j * g->ldc;
            /* beta == 0: C is not read (it may hold NaN), as BLAS specifies */
            *cij = g->beta == 0.0f ? g->alpha * acc : g->alpha * acc + g->beta * *cij;
        }
    delete g;
}

/* The bytes a column-major rows x cols matrix of leading dimension ld spans. */
size_t span(int rows, int cols, int ld)
{
    return rows == 0 || cols == 0 ? 0 : ((size_t)(cols - 1) * ld + rows) * sizeof(float);
}

} // namespace

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float *alpha,
                              const float *A, int lda, const float *B, int ldb,
                              const float *beta, float *C, int ldc)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
        (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T) || m < 0 || n < 0 || k < 0 || !alpha ||
        !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
    int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    if ((k > 0 && (!dt__cuh_is_device(A, span(arows, acols, lda)) ||
                   !dt__cuh_is_device(B, span(brows, bcols, ldb)))) ||
        !dt__cuh_is_device(C, span(m, n, ldc)))
        return CUBLAS_STATUS_INVALID_VALUE; /* a real GPU faults later: fail at the call */
    if (dt__cuh_fault_now("cublas"))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    sgemm_args *g = new sgemm_args{ta, tb, m, n, k, *alpha, *beta, A, B, C, lda, ldb, ldc};
    dt__cuh_enqueue(handle->stream, sgemm_run, g);
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
    }
}

const char *cublasGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_ALLOC_FAILED: return "resource allocation failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "an internal operation failed";
    }
}
