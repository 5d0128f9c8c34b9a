/* GPU devices at dt_init: DT_GPU and DT_GPU_DEVICES are checked before MPI starts, a demand
 * for CUDA where there is none fails naming what is missing, the kernel tables of the kinds
 * are linked in, and (DT_GPU=sim) logical devices with CPU devices raised beside them. The
 * cases run in order (one MPI start per process). */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/version.h"
#include "harness.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"

static int mpi_started(void)
{
    int flag = 0;
    MPI_Initialized(&flag);
    return flag;
}

static void test_init_rejects_bad_gpu_settings_before_mpi_starts(void)
{
    setenv("DT_GPU", "tpu", 1);
    DT_ASSERT_FAILS(dt_init(NULL, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_GPU='tpu'");
    unsetenv("DT_GPU");
    const char *bad[] = {"0", "-2", "4097", "two", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("DT_GPU_DEVICES", bad[i], 1);
        DT_ASSERT_FAILS(dt_init(NULL, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("DT_GPU_DEVICES");
    }
    unsetenv("DT_GPU_DEVICES");
    dt_init_opts o = DT_INIT_OPTS_INIT;
    o.gpu_devices = -1;
    DT_ASSERT_FAILS(dt_init(NULL, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("gpu_devices=-1");
    CU_ASSERT_EQUAL(mpi_started(), 0);
}

/* Every entry of a kernel table is set. */
static int table_complete(const dt__ops_backend *be)
{
    return be && be->gemm && be->add && be->sub && be->mul && be->scale && be->axpy &&
           be->fill && be->copy && be->bias_add && be->bias_grad && be->relu && be->relu_grad &&
           be->gelu && be->gelu_grad && be->softmax_xent && be->softmax_xent_grad && be->sum &&
           be->max && be->mean && be->sq_norm && be->reduce_axis && be->nonfinite && be->cast &&
           be->sgd && be->adam;
}

static void test_every_kind_in_the_build_has_its_kernel_table(void)
{
    CU_ASSERT(dt__device_kind_cpu()->ops() == dt__ops_cpu_backend());
    CU_ASSERT(table_complete(dt__device_kind_cpu()->ops()));
#if DT_HAVE_CUDA
    /* Needs no GPU: the table is static data, linked in or not. */
    CU_ASSERT(table_complete(dt__device_kind_cuda()->ops()));
#endif
}

static void test_demanding_cuda_without_a_gpu_names_what_is_missing(void)
{
    if (dt__gpu_physical_count() > 0)
        return; /* a machine with a GPU: nothing is missing */
    setenv("DT_GPU", "cuda", 1);
    DT_ASSERT_FAILS(dt_init(NULL, NULL, NULL), DT_ERR_UNSUPPORTED);
    DT_ASSERT_ERROR_MENTIONS("DT_GPU=cuda");
    DT_ASSERT_ERROR_MENTIONS("DT_GPU=sim");
    CU_ASSERT_EQUAL(dt_is_initialized(), 0);
    unsetenv("DT_GPU");
}

static void test_sim_gives_logical_gpus_with_cpu_devices_beside_them(void)
{
    setenv("DT_GPU", "sim", 1);
    dt_init_opts o = DT_INIT_OPTS_INIT;
    o.cpu_devices = 1;
    o.gpu_devices = 3;
    o.bind_cores = 0;
    DT_ASSERT_OK(dt_init(NULL, NULL, &o));
    int n = dt_num_clients(), me = dt_client_id();
    CU_ASSERT_EQUAL(dt_num_local_devices(DT_DEVICE_GPU), 3);
    CU_ASSERT_EQUAL(dt_num_global_devices(DT_DEVICE_GPU), 3 * n);
    CU_ASSERT_EQUAL(dt_num_local_devices(DT_DEVICE_CPU), 3);
    CU_ASSERT_STRING_EQUAL(dt_device_kind_name(DT_DEVICE_GPU), "sim");
    CU_ASSERT_STRING_EQUAL(dt_device_kind_name(DT_DEVICE_CPU), "cpu");
    for (int j = 0; j < 3; j++) {
        const dt__device *d = dt__device_local(DT_DEVICE_GPU, j);
        CU_ASSERT_PTR_NOT_NULL_FATAL(d);
        CU_ASSERT_EQUAL(d->global_id, 3 * me + j);
        CU_ASSERT_PTR_EQUAL(dt__device_by_id(DT_DEVICE_GPU, 3 * me + j), d);
        CU_ASSERT_EQUAL(d->ordinal, 0); /* one simulated GPU holds them all */
    }
    CU_ASSERT_PTR_NULL(dt__device_by_id(DT_DEVICE_GPU, n > 1 ? (3 * me + 3) % (3 * n) : 99));
    dt_finalize();
    unsetenv("DT_GPU");
    CU_ASSERT_STRING_EQUAL(dt_device_kind_name(DT_DEVICE_GPU), "none");
}

static void test_finalize_ends_the_mpi_a_failed_init_started(void)
{
    dt_finalize();
    int finalized = 0;
    MPI_Finalized(&finalized);
    CU_ASSERT_EQUAL(finalized, mpi_started());
}

int main(int argc, char **argv)
{
    unsetenv("DT_GPU");
    unsetenv("DT_GPU_DEVICES");
    static const dt_test_case cases[] = {
        DT_TEST(test_init_rejects_bad_gpu_settings_before_mpi_starts),
        DT_TEST(test_every_kind_in_the_build_has_its_kernel_table),
        DT_TEST(test_demanding_cuda_without_a_gpu_names_what_is_missing),
        DT_TEST(test_sim_gives_logical_gpus_with_cpu_devices_beside_them),
        DT_TEST(test_finalize_ends_the_mpi_a_failed_init_started),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "runtime_init_gpu", cases, 0);
}
