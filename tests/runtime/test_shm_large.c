/* Copies large enough for streaming stores (dt__copy_large, runtime/copy.c: DT__COPY_LARGE, 8 MiB, and up)
 * inside a relayout: an all-gather of shards just over that, one CPU device per
 * process, so each process copies its own shard (the CPU kind's copy) and, on one host, its
 * peers' shards straight out of their segments (the shm transport), at offsets that are not
 * multiples of 64 bytes. The values are checked against the independent reference, with
 * streaming on and off. */
#include <mpi.h>

#include "../relayout/rl_test_util.h"
#include "harness.h"
#include "runtime/comm.h"
#include "runtime/shm.h"
#include "runtime/transport.h"
#include "runtime/util.h"

enum { COLS = 1031 }; /* odd: a shard's bytes are a multiple of 4, not of 64 */

static void all_gather_checked(int streaming)
{
    dt__copy_set_streaming(streaming);
    const char *dims[1] = {"x"};
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("shm_large", 1, dims, &n, DT_DEVICE_CPU, &m));
    dt_layout *rows = rl_layout2(m, "x", DT_UNSHARDED, NULL);
    dt_layout *rep = rl_layout2(m, DT_UNSHARDED, DT_UNSHARDED, NULL);
    /* Rows per shard: the least over DT__COPY_LARGE bytes, plus 3. */
    int64_t per = (int64_t)(DT__COPY_LARGE / (COLS * sizeof(float))) + 4;
    int64_t shape[2] = {n * per, COLS};
    CU_ASSERT_FATAL((size_t)per * COLS * sizeof(float) > DT__COPY_LARGE);
    uint64_t before[3], after[3];
    dt__transport_shm_bytes(&before[0], &before[1], &before[2]);
    dt_tensor *src = NULL, *dst = NULL;
    DT_ASSERT_OK(rl_make_tensor(rows, shape, DT_DTYPE_F32, 11, &src));
    DT_ASSERT_OK(dt_relayout(src, rep, &dst));
    CU_ASSERT_EQUAL(rl_check_tensor(dst, rows, 11), 0);
    dt__transport_shm_bytes(&after[0], &after[1], &after[2]);
    /* On one host every peer's shard came straight from its segment, none by MPI. */
    if (dt_num_clients() > 1 && dt__num_hosts() == 1 && dt__shm_up()) {
        CU_ASSERT_EQUAL(after[0] - before[0],
                        (uint64_t)(dt_num_clients() - 1) * (uint64_t)per * COLS * sizeof(float));
        CU_ASSERT_EQUAL(after[2] - before[2], 0);
    }
    MPI_Barrier(dt__comm()); /* nobody frees a shard a peer may still read */
    dt_tensor_destroy(src);
    dt_tensor_destroy(dst);
    dt_layout_destroy(rows);
    dt_layout_destroy(rep);
    dt_mesh_destroy(m);
    dt__copy_set_streaming(1);
}

static void test_large_all_gather_gives_the_reference_values_streaming(void)
{
    all_gather_checked(1);
}

static void test_large_all_gather_gives_the_reference_values_plain(void)
{
    all_gather_checked(0);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_large_all_gather_gives_the_reference_values_streaming),
        DT_TEST(test_large_all_gather_gives_the_reference_values_plain),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "runtime_shm_large", cases, 1);
}
