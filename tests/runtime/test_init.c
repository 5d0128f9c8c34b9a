/* Clients and devices after dt_init (through the harness): counts from MPI and
 * DT_CPU_DEVICES, global ids dense and client-major, checked against every rank's view. */
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

static void test_init_clients_are_the_mpi_ranks(void)
{
    CU_ASSERT_EQUAL(dt_is_initialized(), 1);
    CU_ASSERT_EQUAL(dt_num_clients(), world_size());
    CU_ASSERT_EQUAL(dt_client_id(), world_rank());
}

static void test_init_cpu_devices_follow_the_environment(void)
{
    const char *env = getenv("DT_CPU_DEVICES");
    int want = env ? atoi(env) : 1;
    CU_ASSERT_EQUAL(dt_num_local_devices(DT_DEVICE_CPU), want);
    /* Every client got the same variable here, so the total is a product. */
    CU_ASSERT_EQUAL(dt_num_global_devices(DT_DEVICE_CPU), want * world_size());
}

/* Gathers every rank's dt_local_device_id list and checks it against ids counted out by hand:
 * client 0's devices first, then client 1's, and so on. */
static void check_ids(dt_device_type type)
{
    int n = world_size(), me = world_rank();
    int nlocal = dt_num_local_devices(type), total = 0;
    int *counts = calloc((size_t)n, sizeof *counts);
    int *displs = calloc((size_t)n, sizeof *displs);
    CU_ASSERT_FATAL(counts && displs);
    MPI_Allgather(&nlocal, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD);
    for (int c = 0; c < n; c++) {
        displs[c] = total;
        total += counts[c];
    }
    CU_ASSERT_EQUAL(dt_num_global_devices(type), total);
    int *mine = calloc((size_t)nlocal + 1, sizeof *mine);
    int *all = calloc((size_t)total + 1, sizeof *all);
    CU_ASSERT_FATAL(mine && all);
    for (int i = 0; i < nlocal; i++)
        mine[i] = dt_local_device_id(type, i);
    MPI_Allgatherv(mine, nlocal, MPI_INT, all, counts, displs, MPI_INT, MPI_COMM_WORLD);
    int expect = 0;
    for (int c = 0; c < n; c++) {
        for (int i = 0; i < counts[c]; i++, expect++) {
            CU_ASSERT_EQUAL(all[displs[c] + i], expect);
            CU_ASSERT_EQUAL(dt_device_client(type, expect), c);
        }
    }
    CU_ASSERT_EQUAL(dt_local_device_id(type, -1), -1);
    CU_ASSERT_EQUAL(dt_local_device_id(type, nlocal), -1);
    CU_ASSERT_EQUAL(dt_device_client(type, -1), -1);
    CU_ASSERT_EQUAL(dt_device_client(type, total), -1);
    for (int i = 0; i < nlocal; i++)
        CU_ASSERT_EQUAL(dt_device_client(type, dt_local_device_id(type, i)), me);
    free(all);
    free(mine);
    free(displs);
    free(counts);
}

static void test_init_cpu_ids_are_dense_and_client_major(void)
{
    check_ids(DT_DEVICE_CPU);
}

static void test_init_gpu_ids_are_dense_and_client_major(void)
{
    /* Whatever GPUs there are (none without a driver), the same rules hold. */
    check_ids(DT_DEVICE_GPU);
    if (!DT_HAVE_CUDA)
        CU_ASSERT_EQUAL(dt_num_global_devices(DT_DEVICE_GPU), 0);
}

static void test_init_rejects_a_second_init(void)
{
    DT_ASSERT_FAILS(dt_init(NULL, NULL, NULL), DT_ERR_STATE);
    DT_ASSERT_ERROR_MENTIONS("already initialized");
    CU_ASSERT_EQUAL(dt_is_initialized(), 1); /* the running runtime is untouched */
    CU_ASSERT_EQUAL(dt_num_clients(), world_size());
}

static void test_init_bad_device_type_has_no_devices(void)
{
    CU_ASSERT_EQUAL(dt_num_local_devices((dt_device_type)7), 0);
    CU_ASSERT_EQUAL(dt_num_global_devices((dt_device_type)7), 0);
    CU_ASSERT_EQUAL(dt_local_device_id((dt_device_type)7, 0), -1);
    CU_ASSERT_EQUAL(dt_device_client((dt_device_type)7, 0), -1);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_init_clients_are_the_mpi_ranks),
        DT_TEST(test_init_cpu_devices_follow_the_environment),
        DT_TEST(test_init_cpu_ids_are_dense_and_client_major),
        DT_TEST(test_init_gpu_ids_are_dense_and_client_major),
        DT_TEST(test_init_rejects_a_second_init),
        DT_TEST(test_init_bad_device_type_has_no_devices),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "runtime_init", cases, 1);
}
