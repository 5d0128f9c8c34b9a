/* The CUDA kernel table's argument checks: bad sizes, slices and NULL outputs fail with
 * DT_ERR_INVALID_ARGUMENT before any launch, as the CPU kernels do, and a label past the
 * vocabulary names the label and its row. Exits 77 (skip) without a GPU. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "harness.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"

static const dt__ops_backend *gpu;
static float *f;    /* 4096 zero floats of device memory */
static int32_t *ids; /* 64 zero ints */

static void test_cuda_llama_entries_reject_bad_sizes_and_null_outputs(void)
{
    DT_ASSERT_FAILS(gpu->rms_norm(2, 0, f, f, 1e-5f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->rms_norm(2, 4, f, f, -1.0f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->rms_norm(2, 4, NULL, f, 1e-5f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(gpu->rms_norm(0, 4, f, f, 1e-5f, f));
    DT_ASSERT_FAILS(gpu->rms_norm_grad(2, 4, f, f, f, 1e-5f, f, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->rms_norm_grad(2, 4, f, f, NULL, 1e-5f, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->rope(1, 2, 2, 5, 0, 0, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("even");
    DT_ASSERT_FAILS(gpu->rope(1, 2, 2, 4, -1, 0, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->rope(1, 2, 2, 4, 0, 0, NULL, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->swiglu(4, NULL, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->swiglu_grad(4, f, f, f, NULL, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->attention_gqa(1, 2, 3, 2, 4, 0, f, f, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("kv_heads");
    DT_ASSERT_FAILS(gpu->attention_gqa(1, 2, 4, 2, 4, 0, f, NULL, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->attention_gqa_grad(1, 2, 4, 0, 4, 1, f, f, f, f, f, f, f),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->attention_gqa_grad(1, 2, 4, 2, 4, 1, f, f, f, f, f, NULL, f),
                    DT_ERR_INVALID_ARGUMENT);
}

static void test_cuda_transformer_entries_reject_bad_sizes_slices_and_null_outputs(void)
{
    DT_ASSERT_FAILS(gpu->layer_norm(2, 0, f, f, f, 1e-5f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->layer_norm(2, 4, f, f, NULL, 1e-5f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(gpu->layer_norm(0, 4, f, f, f, 1e-5f, f));
    DT_ASSERT_FAILS(gpu->layer_norm_grad(2, 4, f, f, f, 1e-5f, f, f, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->layer_norm_grad(2, 4, NULL, f, f, 1e-5f, f, f, f),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->softmax(-1, 4, 1, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->softmax_grad(1, 4, 1, f, NULL, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->attention(1, -2, 2, 4, 0, f, f, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->attention_grad(1, 2, 2, 4, 0, f, f, f, f, NULL, f, f),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->embedding(4, ids, 8, 4, 10, 3, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("bad slice");
    DT_ASSERT_FAILS(gpu->embedding(4, ids, -1, 4, 10, 3, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->embedding(4, NULL, 0, 4, 10, 3, f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->embedding_grad(4, ids, 0, 4, 10, 3, f, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(gpu->embedding_grad(4, ids, 0, 0, 10, 3, f, NULL)); /* no rows here */
    DT_ASSERT_FAILS(gpu->vocab_xent_stats(2, 4, f, f, 8, 10, ids, f, f),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->vocab_xent_stats(2, 4, NULL, f, 0, 10, ids, f, f),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->vocab_xent_loss(2, f, f, f, ids, 1.0f, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->vocab_xent_loss(2, NULL, f, f, ids, 1.0f, f), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->vocab_xent_grad(2, 4, f, f, f, -1, ids, 1.0f, f),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->vocab_xent_grad(2, 4, f, f, f, 0, ids, 1.0f, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(gpu->vocab_xent_grad(0, 4, f, f, f, 0, ids, 1.0f, f));
}

static void test_cuda_vocab_xent_names_a_label_past_the_vocabulary(void)
{
    int32_t labels[5] = {1, 2, 3, 11, 4};
    CU_ASSERT_FATAL(cudaMemcpy(ids, labels, sizeof labels, cudaMemcpyHostToDevice) ==
                    cudaSuccess);
    DT_ASSERT_FAILS(gpu->vocab_xent_stats(5, 4, f, f, 0, 11, ids, f, f),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("label 11 of row 3");
    CU_ASSERT_FATAL(cudaMemset(ids, 0, 64 * sizeof *ids) == cudaSuccess);
}

static void test_cuda_gemm_rejects_bad_sizes_and_null_matrices(void)
{
    DT_ASSERT_FAILS(gpu->gemm(0, 0, -1, 2, 2, 1.0f, f, DT_DTYPE_F32, 2, f, DT_DTYPE_F32, 2, 0.0f,
                              f, 2), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->gemm(0, 0, 2, 2, 2, 1.0f, NULL, DT_DTYPE_F32, 2, f, DT_DTYPE_F32, 2,
                              0.0f, f, 2), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->gemm(0, 0, 2, 2, (int64_t)1 << 33, 1.0f, f, DT_DTYPE_F32,
                              (int64_t)1 << 33, f, DT_DTYPE_F32, 2, 0.0f, f, 2),
                    DT_ERR_UNSUPPORTED);
    DT_ASSERT_OK(gpu->gemm(0, 0, 0, 2, 2, 1.0f, NULL, DT_DTYPE_F32, 2, NULL, DT_DTYPE_F32, 2,
                           0.0f, NULL, 2)); /* an empty C: nothing to do */
}

int main(int argc, char **argv)
{
    if (dt__gpu_physical_count() == 0) {
        fprintf(stderr, "test_cuda_arguments: no CUDA device, skipped\n");
        return 77;
    }
    if (cudaSetDevice(0) != cudaSuccess)
        return 77;
    gpu = dt__ops_cuda_backend();
    if (cudaMalloc((void **)&f, 4096 * sizeof *f) != cudaSuccess ||
        cudaMemset(f, 0, 4096 * sizeof *f) != cudaSuccess ||
        cudaMalloc((void **)&ids, 64 * sizeof *ids) != cudaSuccess ||
        cudaMemset(ids, 0, 64 * sizeof *ids) != cudaSuccess)
        return 1;
    static const dt_test_case cases[] = {
        DT_TEST(test_cuda_llama_entries_reject_bad_sizes_and_null_outputs),
        DT_TEST(test_cuda_transformer_entries_reject_bad_sizes_slices_and_null_outputs),
        DT_TEST(test_cuda_vocab_xent_names_a_label_past_the_vocabulary),
        DT_TEST(test_cuda_gemm_rejects_bad_sizes_and_null_matrices),
        DT_TEST_END,
    };
    int rc = dt_test_main(argc, argv, "cuda_arguments", cases, 0);
    cudaFree(f);
    cudaFree(ids);
    return rc;
}
