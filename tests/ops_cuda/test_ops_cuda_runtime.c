/* The CUDA backend under the runtime: set_device selects each local GPU by its CUDA ordinal
 * (as the distributed ops do with a component's DLPack device_id before its kernels), kernels
 * run there, sync waits for all of them; ordinals of GPUs this client does not own fail.
 * Exits 77 (skip) without a GPU. */
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "harness.h"
#include "ops/ops_impl.h"

static void test_cuda_backend_runs_kernels_on_every_local_gpu(void)
{
    const dt__ops_backend *gpu = dt__ops_cuda_backend();
    int ngpu = dt_num_local_devices(DT_DEVICE_GPU);
    CU_ASSERT_FATAL(ngpu > 0);
    enum { N = 4097 };
    float *x[64] = {0}, *sum[64] = {0};
    int used = ngpu < 64 ? ngpu : 64;
    for (int i = 0; i < used; i++) {
        DT_ASSERT_OK(dt__device_alloc(i, N * sizeof(float), (void **)&x[i]));
        DT_ASSERT_OK(dt__device_alloc(i, sizeof(float), (void **)&sum[i]));
    }
    /* Enqueue on every GPU first, then one sync: sum of (i + 1) over N elements. */
    for (int i = 0; i < used; i++) {
        DT_ASSERT_OK(gpu->set_device(dt__cuda_ordinal(i)));
        DT_ASSERT_OK(gpu->fill(N, (float)(i + 1), x[i]));
        DT_ASSERT_OK(gpu->sum(N, x[i], sum[i]));
    }
    DT_ASSERT_OK(gpu->sync());
    for (int i = 0; i < used; i++) {
        float s = 0.0f;
        CU_ASSERT_FATAL(cudaMemcpy(&s, sum[i], sizeof s, cudaMemcpyDeviceToHost) ==
                        cudaSuccess);
        CU_ASSERT_EQUAL(s, (float)N * (float)(i + 1));
    }
    for (int i = 0; i < used; i++) {
        dt__device_free(i, x[i]);
        dt__device_free(i, sum[i]);
    }
    DT_ASSERT_FAILS(gpu->set_device(-1), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->set_device(dt__cuda_ordinal(ngpu - 1) + 1), DT_ERR_INVALID_ARGUMENT);
}

int main(int argc, char **argv)
{
    if (dt__cuda_device_count() == 0) {
        fprintf(stderr, "test_ops_cuda_runtime: no CUDA device, skipped\n");
        return 77;
    }
    static const dt_test_case cases[] = {
        DT_TEST(test_cuda_backend_runs_kernels_on_every_local_gpu),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ops_cuda_runtime", cases, 1);
}
