/* dt_init in a program that started MPI itself: the runtime uses that MPI, leaves
 * MPI_COMM_WORLD's error handler alone, does not finalise MPI, and can start again. Clients
 * here own different numbers of CPU devices (rank % 3 + 1). Cases run in order. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int world_size(void)
{
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

static int world_rank(void)
{
    int r = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

static int devices_of(int client)
{
    return client % 3 + 1;
}

static void test_init_uses_the_programs_mpi_with_uneven_device_counts(void)
{
    dt_init_opts o = DT_INIT_OPTS_INIT;
    o.cpu_devices = devices_of(world_rank());
    o.bind_cores = 0;
    DT_ASSERT_OK(dt_init(NULL, NULL, &o));
    int n = world_size(), me = world_rank();
    CU_ASSERT_EQUAL(dt_num_clients(), n);
    CU_ASSERT_EQUAL(dt_client_id(), me);
    CU_ASSERT_EQUAL(dt_num_local_devices(DT_DEVICE_CPU), devices_of(me));
    /* Ids counted out by hand, client by client. */
    int id = 0;
    for (int c = 0; c < n; c++) {
        for (int i = 0; i < devices_of(c); i++, id++) {
            CU_ASSERT_EQUAL(dt_device_client(DT_DEVICE_CPU, id), c);
            if (c == me)
                CU_ASSERT_EQUAL(dt_local_device_id(DT_DEVICE_CPU, i), id);
        }
    }
    CU_ASSERT_EQUAL(dt_num_global_devices(DT_DEVICE_CPU), id);
    CU_ASSERT_EQUAL(dt_device_client(DT_DEVICE_CPU, id), -1);
}

static void test_init_leaves_the_world_error_handler_alone(void)
{
    MPI_Errhandler h;
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &h);
    CU_ASSERT(h == MPI_ERRORS_ARE_FATAL);
    MPI_Errhandler_free(&h);
}

static void test_finalize_leaves_the_programs_mpi_running(void)
{
    dt_finalize();
    CU_ASSERT_EQUAL(dt_is_initialized(), 0);
    int finalized = 1;
    MPI_Finalized(&finalized);
    CU_ASSERT_EQUAL(finalized, 0);
    int one = 1, sum = 0;
    CU_ASSERT_EQUAL(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
    CU_ASSERT_EQUAL(sum, world_size());
}

static void test_init_starts_again_after_finalize(void)
{
    dt_init_opts o = DT_INIT_OPTS_INIT;
    o.cpu_devices = 2;
    o.bind_cores = 0;
    DT_ASSERT_OK(dt_init(NULL, NULL, &o));
    CU_ASSERT_EQUAL(dt_num_global_devices(DT_DEVICE_CPU), 2 * world_size());
    CU_ASSERT_EQUAL(dt_local_device_id(DT_DEVICE_CPU, 1), 2 * world_rank() + 1);
    dt_finalize();
    int finalized = 1;
    MPI_Finalized(&finalized);
    CU_ASSERT_EQUAL(finalized, 0);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_init_uses_the_programs_mpi_with_uneven_device_counts),
        DT_TEST(test_init_leaves_the_world_error_handler_alone),
        DT_TEST(test_finalize_leaves_the_programs_mpi_running),
        DT_TEST(test_init_starts_again_after_finalize),
        DT_TEST_END,
    };
    MPI_Init(&argc, &argv);
    int failed = dt_test_main(argc, argv, "runtime_init_user_mpi", cases, 0), any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}
