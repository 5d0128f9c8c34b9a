/* dt_init called by the program itself: bad options and environment values are refused before
 * MPI starts, a later good call works, a second call is refused, and dt_finalize ends MPI.
 * The cases run in order and depend on it (one MPI start per process). */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int mpi_started(void)
{
    int flag = 0;
    MPI_Initialized(&flag);
    return flag;
}

static void test_before_init_there_is_one_client_and_no_device(void)
{
    dt_topology_info info;
    CU_ASSERT_EQUAL(dt_is_initialized(), 0);
    CU_ASSERT_EQUAL(dt_num_clients(), 1);
    CU_ASSERT_EQUAL(dt_client_id(), 0);
    CU_ASSERT_EQUAL(dt_num_local_devices(DT_DEVICE_CPU), 0);
    CU_ASSERT_EQUAL(dt_num_global_devices(DT_DEVICE_CPU), 0);
    CU_ASSERT_EQUAL(dt_local_device_id(DT_DEVICE_CPU, 0), -1);
    CU_ASSERT_EQUAL(dt_device_client(DT_DEVICE_CPU, 0), -1);
    DT_ASSERT_FAILS(dt_topology(&info), DT_ERR_STATE);
    dt_finalize(); /* harmless when not initialised */
    CU_ASSERT_EQUAL(mpi_started(), 0);
}

static void test_init_rejects_bad_cpu_devices_before_mpi_starts(void)
{
    const char *bad[] = {"0", "-1", "4097", "100000000000000000000", "abc", "", " 2", "2 ",
                         "2x", "1e3", "0x10", "+3"};
    char *saved = getenv("DT_CPU_DEVICES") ? strdup(getenv("DT_CPU_DEVICES")) : NULL;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char quoted[64];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        setenv("DT_CPU_DEVICES", bad[i], 1);
        DT_ASSERT_FAILS(dt_init(NULL, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("DT_CPU_DEVICES");
        DT_ASSERT_ERROR_MENTIONS(quoted);
        CU_ASSERT_EQUAL(dt_is_initialized(), 0);
    }
    CU_ASSERT_EQUAL(mpi_started(), 0);
    if (saved)
        setenv("DT_CPU_DEVICES", saved, 1);
    else
        unsetenv("DT_CPU_DEVICES");
    free(saved);
}

static void test_init_rejects_bad_options_before_mpi_starts(void)
{
    dt_init_opts o = DT_INIT_OPTS_INIT;
    o.cpu_devices = -1;
    DT_ASSERT_FAILS(dt_init(NULL, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("cpu_devices=-1");
    o.cpu_devices = 4097;
    DT_ASSERT_FAILS(dt_init(NULL, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("4097");
    o = (dt_init_opts)DT_INIT_OPTS_INIT;
    o.bind_cores = 2;
    DT_ASSERT_FAILS(dt_init(NULL, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("bind_cores=2");
    o = (dt_init_opts)DT_INIT_OPTS_INIT;
    o.use_gpus = -1;
    DT_ASSERT_FAILS(dt_init(NULL, NULL, &o), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("use_gpus=-1");

    char *saved = getenv("DT_BIND") ? strdup(getenv("DT_BIND")) : NULL;
    setenv("DT_BIND", "yes", 1);
    DT_ASSERT_FAILS(dt_init(NULL, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_BIND='yes'");
    if (saved)
        setenv("DT_BIND", saved, 1);
    else
        unsetenv("DT_BIND");
    free(saved);

    setenv("DT_POOL_MAX_MB", "lots", 1);
    DT_ASSERT_FAILS(dt_init(NULL, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_POOL_MAX_MB='lots'");
    unsetenv("DT_POOL_MAX_MB");

    /* A flag that is neither 0 nor 1 is an error, not silently the default (docs/env.md). */
    setenv("DT_COPY_STREAM", "off", 1);
    DT_ASSERT_FAILS(dt_init(NULL, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_COPY_STREAM='off'");
    unsetenv("DT_COPY_STREAM");

    CU_ASSERT_EQUAL(dt_is_initialized(), 0);
    CU_ASSERT_EQUAL(mpi_started(), 0);
}

static void test_init_option_cpu_devices_overrides_the_environment(void)
{
    dt_init_opts o = DT_INIT_OPTS_INIT;
    o.cpu_devices = 3;
    o.bind_cores = 0;
    DT_ASSERT_OK(dt_init(NULL, NULL, &o));
    CU_ASSERT_EQUAL(dt_is_initialized(), 1);
    CU_ASSERT_EQUAL(mpi_started(), 1);
    int n = 0, rank = -1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    CU_ASSERT_EQUAL(dt_num_clients(), n);
    CU_ASSERT_EQUAL(dt_client_id(), rank);
    CU_ASSERT_EQUAL(dt_num_local_devices(DT_DEVICE_CPU), 3);
    CU_ASSERT_EQUAL(dt_num_global_devices(DT_DEVICE_CPU), 3 * n);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(dt_local_device_id(DT_DEVICE_CPU, i), 3 * rank + i);
}

static void test_init_twice_is_a_state_error(void)
{
    DT_ASSERT_FAILS(dt_init(NULL, NULL, NULL), DT_ERR_STATE);
    CU_ASSERT_EQUAL(dt_is_initialized(), 1);
    CU_ASSERT_EQUAL(dt_num_local_devices(DT_DEVICE_CPU), 3);
}

static void test_finalize_trims_the_pool_and_ends_mpi_it_started(void)
{
    void *p;
    DT_ASSERT_OK(dt_host_alloc(4096, &p));
    dt_host_free(p);
    dt_pool_stats s;
    dt_host_pool_stats(&s);
    CU_ASSERT(s.bytes_cached > 0);

    dt_finalize();
    CU_ASSERT_EQUAL(dt_is_initialized(), 0);
    CU_ASSERT_EQUAL(dt_num_clients(), 1);
    CU_ASSERT_EQUAL(dt_num_global_devices(DT_DEVICE_CPU), 0);
    int finalized = 0;
    MPI_Finalized(&finalized);
    CU_ASSERT_EQUAL(finalized, 1);
    dt_host_pool_stats(&s);
    CU_ASSERT_EQUAL(s.bytes_cached, 0);
    dt_finalize(); /* again: a no-op */

    /* MPI cannot start twice in one process: a clear state error, not a crash. */
    DT_ASSERT_FAILS(dt_init(NULL, NULL, NULL), DT_ERR_STATE);
    DT_ASSERT_ERROR_MENTIONS("finalized");

    /* The pool still works. */
    DT_ASSERT_OK(dt_host_alloc(100, &p));
    dt_host_free(p);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_before_init_there_is_one_client_and_no_device),
        DT_TEST(test_init_rejects_bad_cpu_devices_before_mpi_starts),
        DT_TEST(test_init_rejects_bad_options_before_mpi_starts),
        DT_TEST(test_init_option_cpu_devices_overrides_the_environment),
        DT_TEST(test_init_twice_is_a_state_error),
        DT_TEST(test_finalize_trims_the_pool_and_ends_mpi_it_started),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "runtime_init_env", cases, 0);
}
