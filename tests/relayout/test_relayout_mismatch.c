/* Clients that ask one relayout for different target layouts (a mistake of the caller's SPMD
 * code) get DT_ERR_STATE on every client, with no check on (DT_CHECK_COLLECTIVES unset), under
 * every transport: client 0 asks for the rows gathered (replicated), the others for the
 * columns sharded instead, or the other way round. No client returns DT_OK with wrong data,
 * and a relayout every client then asks alike runs and is right (docs/transports.md,
 * "Mismatched relayouts"). Registered by hand in tests/relayout/meson.build: 1 and 2 devices
 * per process (the collective path and the piece path), mpi, shm and staged transports. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "rl_test_util.h"

static dt_mesh *mesh_1d(void)
{
    const char *names[1] = {"x"};
    int64_t sizes[1] = {dt_test_num_devices()};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("line", 1, names, sizes, dt_test_device_type(), &m));
    return m;
}

/* Every client's status and detail, one line each, for the log. */
static void show(const char *what, dt_status st)
{
    fprintf(stderr, "[client %d] %s: %s %s\n", dt_client_id(), what, dt_status_name(st),
            st == DT_OK ? "" : dt_last_error());
}

/* The source is row-sharded; client 0 asks for `first`, every other client for `others`.
 * Every client must fail with DT_ERR_STATE saying the clients asked for different relayouts,
 * leave *out alone, and then run a relayout asked alike (to `others`) correctly. */
static void mismatch(const char *first0, const char *first1, const char *others0,
                     const char *others1)
{
    if (dt_num_clients() < 2)
        return;
    dt_mesh *m = mesh_1d();
    int64_t n = dt_test_num_devices(), shape[2] = {4 * n, 6 * n};
    dt_layout *rows = rl_layout2(m, "x", DT_UNSHARDED, NULL);
    dt_layout *first = rl_layout2(m, first0, first1, NULL);
    dt_layout *others = rl_layout2(m, others0, others1, NULL);
    dt_tensor *src = NULL, *dst = NULL, *sentinel = NULL;
    DT_ASSERT_OK(rl_make_tensor(rows, shape, DT_DTYPE_F32, 11, &src));
    dst = sentinel = (dt_tensor *)&dst; /* any non-NULL value: must be left as it is */
    dt_status st = dt_relayout(src, dt_client_id() == 0 ? first : others, &dst);
    show("mismatched relayout", st);
    CU_ASSERT_EQUAL(st, DT_ERR_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "different"));
    CU_ASSERT_PTR_EQUAL(dst, sentinel);
    if (st == DT_OK) {
        fprintf(stderr, "[client %d] %lld wrong elements returned as DT_OK\n", dt_client_id(),
                (long long)rl_check_tensor(dst, rows, 11));
        dt_tensor_destroy(dst);
    }
    dst = NULL;
    /* Asked alike: runs, and is right (the refused call left nothing behind). */
    st = dt_relayout(src, others, &dst);
    show("relayout asked alike", st);
    CU_ASSERT_EQUAL(st, DT_OK);
    if (st == DT_OK)
        CU_ASSERT_EQUAL(rl_check_tensor(dst, rows, 11), 0);
    dt_tensor_destroy(dst);
    dt_tensor_destroy(src);
    dt_layout_destroy(others);
    dt_layout_destroy(first);
    dt_layout_destroy(rows);
    dt_mesh_destroy(m);
}

static void test_relayout_to_rows_gathered_on_one_client_and_columns_on_the_others_fails_on_all(
    void)
{
    mismatch(DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED, "x");
}

static void test_relayout_to_columns_on_one_client_and_rows_gathered_on_the_others_fails_on_all(
    void)
{
    mismatch(DT_UNSHARDED, "x", DT_UNSHARDED, DT_UNSHARDED);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_relayout_to_rows_gathered_on_one_client_and_columns_on_the_others_fails_on_all),
        DT_TEST(test_relayout_to_columns_on_one_client_and_rows_gathered_on_the_others_fails_on_all),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "relayout_mismatch", cases);
}
