/* dt_barrier: succeeds on every client; mismatched names are reported; with one client
 * withheld the others time out and the message names it. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static dt_mesh *all_devices(void)
{
    const char *names[1] = {"x"};
    int64_t sizes[1] = {dt_test_num_devices()};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("everyone", 1, names, sizes, dt_test_device_type(), &m));
    return m;
}

static void test_barrier_succeeds_on_every_client(void)
{
    dt_mesh *m = all_devices();
    for (int i = 0; i < 20; i++)
        DT_ASSERT_OK(dt_barrier(m, "step", 30.0));
    DT_ASSERT_OK(dt_barrier(m, NULL, 0));
    dt_mesh_destroy(m);
}

static void test_barrier_reports_mismatched_names(void)
{
    if (dt_num_clients() < 2)
        return;
    dt_mesh *m = all_devices();
    dt_status st = dt_barrier(m, dt_client_id() == 1 ? "other" : "step", 30.0);
    /* Every client sees a name different from its own (client 1 sees "step", the others see
     * "other") and names the culprit. */
    CU_ASSERT_EQUAL(st, DT_ERR_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "instead"));
    MPI_Barrier(MPI_COMM_WORLD);
    dt_mesh_destroy(m);
}

/* Last: after a timeout the communicator is not to be trusted for further barriers. */
static void test_barrier_times_out_naming_the_missing_client(void)
{
    if (dt_num_clients() < 2)
        return;
    dt_mesh *m = all_devices();
    int last = dt_num_clients() - 1;
    if (dt_client_id() != last) {
        dt_status st = dt_barrier(m, "withheld", 0.5);
        CU_ASSERT_EQUAL(st, DT_ERR_TIMEOUT);
        char want[64];
        snprintf(want, sizeof want, "client(s) %d never arrived", last);
        DT_ASSERT_ERROR_MENTIONS(want);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_barrier_succeeds_on_every_client),
        DT_TEST(test_barrier_reports_mismatched_names),
        DT_TEST(test_barrier_times_out_naming_the_missing_client),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "barrier", cases);
}
