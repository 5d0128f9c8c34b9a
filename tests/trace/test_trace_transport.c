/* Every transport says so when a receive gets another amount than it expected (two clients in
 * different calls): client 0 sends a box of one size, client 1 expects another, and client 1's
 * exchange is DT_ERR_STATE naming client 0 with both sizes, under the mpi, shm and staged
 * transports (2 processes; docs/trace.md). The shm transport also drains an exchange whose
 * peers post other numbers of boxes, so that the next one works, or says DT_ERR_COMM at once
 * where descriptors are left behind. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/comm.h"
#include "runtime/shm.h"
#include "runtime/transport.h"

enum { ROWS = 32, COLS = 64 };

/* A ROWS x COLS f32 array and the box of its first `cols` columns, in the shm pool when it is
 * up (the shm transport reads boxes there). */
static dt__region box(void *base, int64_t cols)
{
    dt__region r;
    memset(&r, 0, sizeof r);
    r.base = base;
    r.rank = 2;
    r.elem = sizeof(float);
    r.shape[0] = ROWS;
    r.shape[1] = COLS;
    r.count[0] = ROWS;
    r.count[1] = cols;
    return r;
}

static void *array(void)
{
    void *p = NULL;
    size_t bytes = ROWS * COLS * sizeof(float);
    if (!dt__shm_up() || dt__shm_alloc(bytes, &p) != 1)
        p = malloc(bytes);
    CU_ASSERT_FATAL(p != NULL);
    memset(p, 0, bytes);
    return p;
}

static void release(void *p)
{
    if (!dt__shm_up() || dt__shm_free(p) != 1)
        free(p);
}

/* Client 0 sends the box of send_cols columns, client 1 receives one of recv_cols columns; on
 * client 1 the status must be DT_ERR_STATE and its message contain `want`. */
static void mismatched(const dt__transport *t, int64_t send_cols, int64_t recv_cols,
                       const char *want)
{
    if (dt_num_clients() != 2 || !t)
        return;
    void *a = array();
    dt__xfer x = {.peer = 1 - dt_client_id(), .region = box(a, dt_client_id() == 0 ? send_cols
                                                                                 : recv_cols)};
    dt_status st = dt_client_id() == 0 ? t->exchange(&x, 1, NULL, 0, NULL, NULL)
                                       : t->exchange(NULL, 0, &x, 1, NULL, NULL);
    /* The mpi transport's sender learns it too (its receiver's tally, issue 45). */
    if (dt_client_id() == 0 && t == dt__transport_mpi()) {
        CU_ASSERT_EQUAL(st, DT_ERR_STATE);
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "where client 1 expects"));
    }
    if (dt_client_id() == 1) {
        CU_ASSERT_EQUAL(st, DT_ERR_STATE);
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), want));
        if (!strstr(dt_last_error(), want))
            fprintf(stderr, "%s transport: '%s' lacks '%s'\n", t->name, dt_last_error(), want);
    }
    MPI_Barrier(dt__comm());
    release(a);
}

static void test_mpi_transport_names_a_peer_that_sent_fewer_bytes(void)
{
    mismatched(dt__transport_mpi(), 32, 64, "client 0 sends 4096 bytes in 1 box(es) where this "
                                            "client expects 8192 in 1");
}

static void test_mpi_transport_names_a_peer_that_sent_more_bytes(void)
{
    mismatched(dt__transport_mpi(), 64, 32, "client 0 sends 8192 bytes in 1 box(es) where this "
                                            "client expects 4096 in 1");
}

static void test_shm_transport_names_a_peer_that_offered_another_box(void)
{
    if (!dt__shm_up())
        return;
    mismatched(dt__transport_shm(), 32, 64, "client 0 offered a box [32,32] of 4096 bytes where "
                                            "this client expected [32,64] of 8192");
    mismatched(dt__transport_shm(), 64, 32, "client 0 offered a box [32,64] of 8192 bytes where "
                                            "this client expected [32,32] of 4096");
}

static void test_staged_transport_names_a_peer_that_sent_another_chunk(void)
{
    mismatched(dt__transport_staged(), 32, 64, "client 0 sent a chunk of 4096 bytes where this "
                                               "client expected 8192");
    mismatched(dt__transport_staged(), 64, 32, "client 0 sent a larger chunk than this client "
                                               "expected (MPI_ERR_TRUNCATE)");
}

/* Client 0 sends client 1 a whole array through t; client 1 must get it. */
static void one_box_arrives(const dt__transport *t)
{
    float *a = array();
    for (int i = 0; dt_client_id() == 0 && i < ROWS * COLS; i++)
        a[i] = (float)i;
    dt__xfer x = {.peer = 1 - dt_client_id(), .region = box(a, COLS)};
    dt_status st = dt_client_id() == 0 ? t->exchange(&x, 1, NULL, 0, NULL, NULL)
                                       : t->exchange(NULL, 0, &x, 1, NULL, NULL);
    CU_ASSERT_EQUAL(st, DT_OK);
    if (st != DT_OK)
        fprintf(stderr, "[client %d] %s transport: %s\n", dt_client_id(), t->name,
                dt_last_error());
    for (int i = 0; dt_client_id() == 1 && i < ROWS * COLS; i++)
        if (a[i] != (float)i) {
            CU_FAIL("wrong element received");
            break;
        }
    MPI_Barrier(dt__comm());
    release(a);
}

static void test_transports_pass_boxes_of_the_expected_size(void)
{
    const dt__transport *ts[3] = {dt__transport_mpi(), dt__transport_shm(),
                                  dt__transport_staged()};
    if (dt_num_clients() != 2)
        return;
    for (int k = 0; k < 3; k++)
        if (ts[k])
            one_box_arrives(ts[k]);
}

/* 1: shm_exchange_counts sends arrays outside the shm pool (by MPI, packed). */
static int sends_by_mpi;

/* One shm exchange where client 0 sends client 1 s0 whole arrays and expects r0 from it, and
 * client 1 sends s1 and expects r1 (at most 3 each). */
static dt_status shm_exchange_counts(int s0, int r0, int s1, int r1)
{
    enum { MAXBOX = 3 };
    void *a[2 * MAXBOX];
    dt__xfer sends[MAXBOX], recvs[MAXBOX];
    int me = dt_client_id(), ns = me == 0 ? s0 : s1, nr = me == 0 ? r0 : r1;
    for (int i = 0; i < ns; i++) {
        a[i] = sends_by_mpi ? calloc(ROWS * COLS, sizeof(float)) : array();
        CU_ASSERT_FATAL(a[i] != NULL);
        sends[i] = (dt__xfer){.peer = 1 - me, .region = box(a[i], COLS)};
    }
    for (int i = 0; i < nr; i++) {
        a[MAXBOX + i] = array();
        recvs[i] = (dt__xfer){.peer = 1 - me, .region = box(a[MAXBOX + i], COLS)};
    }
    dt_status st = dt__transport_shm()->exchange(sends, (size_t)ns, recvs, (size_t)nr, NULL,
                                                 NULL);
    if (st != DT_OK)
        fprintf(stderr, "[client %d] %s\n", dt_client_id(), dt_last_error());
    MPI_Barrier(dt__comm());
    for (int i = 0; i < ns; i++)
        if (sends_by_mpi)
            free(a[i]);
        else
            release(a[i]);
    for (int i = 0; i < nr; i++)
        release(a[MAXBOX + i]);
    return st;
}

/* Both clients get DT_ERR_STATE, with `want0` and `want1` in their messages, and the next
 * exchange works. */
static void shm_counts_fail_then_pass(int s0, int r0, int s1, int r1, const char *want0,
                                      const char *want1)
{
    if (dt_num_clients() != 2 || !dt__shm_up())
        return;
    dt_status st = shm_exchange_counts(s0, r0, s1, r1);
    CU_ASSERT_EQUAL(st, DT_ERR_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), dt_client_id() == 0 ? want0 : want1));
    one_box_arrives(dt__transport_shm());
    one_box_arrives(dt__transport_shm());
}

static void test_shm_transport_drains_more_boxes_than_expected(void)
{
    shm_counts_fail_then_pass(3, 1, 1, 1, "client 1 expects 1 box(es) from this client, which "
                              "sends it 3",
                              "client 0 sends 3 box(es) where this client expected 1");
}

static void test_shm_transport_drains_fewer_boxes_than_expected(void)
{
    shm_counts_fail_then_pass(1, 1, 1, 3, "client 1 expects 3 box(es) from this client, which "
                              "sends it 1",
                              "client 0 sends 1 box(es) where this client expected 3");
}

static void test_shm_transport_drains_boxes_sent_by_mpi(void)
{
    sends_by_mpi = 1;
    shm_counts_fail_then_pass(3, 1, 1, 1, "client 1 expects 1 box(es) from this client, which "
                              "sends it 3",
                              "client 0 sends 3 box(es) where this client expected 1");
    sends_by_mpi = 0;
}

static void test_shm_transport_tells_a_peer_that_expects_boxes_it_sends_none(void)
{
    shm_counts_fail_then_pass(0, 1, 1, 1, "client 1 expects 1 box(es) from this client, which "
                              "sends it none",
                              "client 0 sends no box where this client expected 1");
}

/* Client 0 sends a box to client 1, which expects none from it (but sends it one, so client 0
 * learns it): client 0's box stays in the channel, so client 0 gets DT_ERR_COMM, and every
 * later shm exchange between the two fails with DT_ERR_COMM at once instead of taking it for
 * its own. Last: the channels stay broken until dt_init. */
static void test_shm_transport_says_comm_when_a_peer_takes_none_of_its_boxes(void)
{
    if (dt_num_clients() != 2 || !dt__shm_up())
        return;
    dt_status st = shm_exchange_counts(1, 1, 1, 0);
    if (dt_client_id() == 0) {
        CU_ASSERT_EQUAL(st, DT_ERR_COMM);
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "expects no box from this client"));
    }
    double t0 = dt__now_seconds();
    st = shm_exchange_counts(1, 1, 1, 1);
    CU_ASSERT_EQUAL(st, DT_ERR_COMM);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "left out of step"));
    CU_ASSERT(dt__now_seconds() - t0 < 2.0); /* not the 5 s timeout */
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_transports_pass_boxes_of_the_expected_size),
        DT_TEST(test_mpi_transport_names_a_peer_that_sent_fewer_bytes),
        DT_TEST(test_mpi_transport_names_a_peer_that_sent_more_bytes),
        DT_TEST(test_shm_transport_names_a_peer_that_offered_another_box),
        DT_TEST(test_staged_transport_names_a_peer_that_sent_another_chunk),
        DT_TEST(test_shm_transport_drains_more_boxes_than_expected),
        DT_TEST(test_shm_transport_drains_fewer_boxes_than_expected),
        DT_TEST(test_shm_transport_drains_boxes_sent_by_mpi),
        DT_TEST(test_shm_transport_tells_a_peer_that_expects_boxes_it_sends_none),
        DT_TEST(test_shm_transport_says_comm_when_a_peer_takes_none_of_its_boxes),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "trace_transport", cases, 1);
}
