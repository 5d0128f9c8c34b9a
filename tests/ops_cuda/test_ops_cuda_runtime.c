/* The GPU kernel table under the runtime, on whichever kind runs this client's GPU devices
 * (CUDA, or the simulator with DT_GPU=sim): set_device selects each device by its ordinal (as
 * the distributed ops do with a component's DLPack device_id), kernels run there, sync waits
 * for all of them; ordinals this client does not hold fail. Exits 77 (skip) without GPU
 * devices. */
#include <stdlib.h>

#include <string.h>

#include "harness.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"

static void test_gpu_backend_runs_kernels_on_every_local_gpu(void)
{
    int ngpu = dt_num_local_devices(DT_DEVICE_GPU);
    CU_ASSERT_FATAL(ngpu > 0);
    const dt__device *d0 = dt__device_local(DT_DEVICE_GPU, 0);
    const dt__ops_backend *gpu = d0->kind->ops();
    CU_ASSERT_PTR_NOT_NULL_FATAL(gpu);
    enum { N = 4097 };
    float *x[64] = {0}, *sum[64] = {0};
    int used = ngpu < 64 ? ngpu : 64, top = 0;
    for (int i = 0; i < used; i++) {
        const dt__device *d = dt__device_local(DT_DEVICE_GPU, i);
        DT_ASSERT_OK(d->kind->alloc(d, N * sizeof(float), (void **)&x[i]));
        DT_ASSERT_OK(d->kind->alloc(d, sizeof(float), (void **)&sum[i]));
        top = d->ordinal > top ? d->ordinal : top;
    }
    /* Enqueue on every device first, then one sync: sum of (i + 1) over N elements. */
    for (int i = 0; i < used; i++) {
        DT_ASSERT_OK(gpu->set_device(dt__device_local(DT_DEVICE_GPU, i)->ordinal));
        DT_ASSERT_OK(gpu->fill(N, (float)(i + 1), x[i]));
        DT_ASSERT_OK(gpu->sum(N, x[i], sum[i]));
    }
    DT_ASSERT_OK(gpu->sync());
    for (int i = 0; i < used; i++) {
        const dt__device *d = dt__device_local(DT_DEVICE_GPU, i);
        float s = 0.0f;
        DT_ASSERT_OK(d->kind->copy(d, DT__COPY_D2H, &s, sum[i], sizeof s));
        CU_ASSERT_EQUAL(s, (float)N * (float)(i + 1));
    }
    for (int i = 0; i < used; i++) {
        const dt__device *d = dt__device_local(DT_DEVICE_GPU, i);
        d->kind->free(d, x[i]);
        d->kind->free(d, sum[i]);
    }
    DT_ASSERT_FAILS(gpu->set_device(-1), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(gpu->set_device(top + 1), DT_ERR_INVALID_ARGUMENT);
}

/* The device kind's own fill (1-, 2-, 4- and 8-byte patterns), and an allocation that cannot fit
 * fails as DT_ERR_NO_MEMORY naming the device. */
static void test_gpu_device_kind_fills_patterns_and_refuses_what_cannot_fit(void)
{
    const dt__device *d = dt__device_local(DT_DEVICE_GPU, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    enum { N = 1003 };
    const uint64_t pattern = 0x0123456789abcdefull;
    for (size_t elem = 1; elem <= 8; elem *= 2) {
        void *x = NULL;
        unsigned char got[N * 8], want[N * 8];
        DT_ASSERT_OK(d->kind->alloc(d, N * elem, &x));
        DT_ASSERT_OK(d->kind->fill(d, x, N, &pattern, elem));
        DT_ASSERT_OK(d->kind->copy(d, DT__COPY_D2H, got, x, N * elem));
        for (size_t i = 0; i < N; i++)
            memcpy(want + i * elem, &pattern, elem);
        CU_ASSERT(memcmp(got, want, N * elem) == 0);
        d->kind->free(d, x);
    }
    void *huge = NULL;
    DT_ASSERT_FAILS(d->kind->alloc(d, (size_t)1 << 50, &huge), DT_ERR_NO_MEMORY);
    CU_ASSERT_PTR_NULL(huge);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_gpu_backend_runs_kernels_on_every_local_gpu),
        DT_TEST(test_gpu_device_kind_fills_patterns_and_refuses_what_cannot_fit),
        DT_TEST_END,
    };
    return dt_test_main_gpu(argc, argv, "ops_gpu_runtime", cases);
}
