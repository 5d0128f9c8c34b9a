/* Every transport says so when a receive gets another amount than it expected (two clients in
 * different calls): client 0 sends a box of one size, client 1 expects another, and client 1's
 * exchange is DT_ERR_STATE naming client 0 with both sizes, under the mpi, shm and staged
 * transports (2 processes; docs/trace.md). The mpi and staged transports fail the sender too
 * (their tallies). The shm and staged transports also drain an exchange whose peers post other
 * numbers of boxes, so that the next one works (staged: in chunks of 4 MiB and of 1 KiB, more
 * than it keeps in flight), or shm says DT_ERR_COMM at once where descriptors are left
 * behind. */
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

/* 1: exchange_cols sends arrays outside the shm pool (by MPI, packed, under shm). */
static int sends_by_mpi;

enum { MAXBOX = 3 };

/* One exchange through t where client 0 sends client 1 boxes of the columns listed in s0 and
 * expects boxes of r0's columns from it, and client 1 sends s1 and expects r1 (at most MAXBOX
 * each, lists ended by 0). */
static dt_status exchange_cols(const dt__transport *t, const int64_t *s0, const int64_t *r0,
                               const int64_t *s1, const int64_t *r1)
{
    void *a[2 * MAXBOX];
    dt__xfer sends[MAXBOX], recvs[MAXBOX];
    int me = dt_client_id(), ns = 0, nr = 0;
    const int64_t *sc = me == 0 ? s0 : s1, *rc = me == 0 ? r0 : r1;
    for (; ns < MAXBOX && sc[ns]; ns++) {
        a[ns] = sends_by_mpi ? calloc(ROWS * COLS, sizeof(float)) : array();
        CU_ASSERT_FATAL(a[ns] != NULL);
        sends[ns] = (dt__xfer){.peer = 1 - me, .region = box(a[ns], sc[ns])};
    }
    for (; nr < MAXBOX && rc[nr]; nr++) {
        a[MAXBOX + nr] = array();
        recvs[nr] = (dt__xfer){.peer = 1 - me, .region = box(a[MAXBOX + nr], rc[nr])};
    }
    dt_status st = t->exchange(sends, (size_t)ns, recvs, (size_t)nr, NULL, NULL);
    if (st != DT_OK)
        fprintf(stderr, "[client %d] %s transport: %s\n", dt_client_id(), t->name, dt_last_error());
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

/* exchange_cols with whole arrays: client 0 sends s0 and expects r0, client 1 sends s1 and
 * expects r1 (at most MAXBOX each). */
static dt_status exchange_counts(const dt__transport *t, int s0, int r0, int s1, int r1)
{
    int64_t cols[4][MAXBOX + 1] = {{0}};
    int n[4] = {s0, r0, s1, r1};
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < n[k] && i < MAXBOX; i++)
            cols[k][i] = COLS;
    return exchange_cols(t, cols[0], cols[1], cols[2], cols[3]);
}

static dt_status shm_exchange_counts(int s0, int r0, int s1, int r1)
{
    return exchange_counts(dt__transport_shm(), s0, r0, s1, r1);
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

/* The staged transport in 1 KiB chunks: a box of ROWS x COLS floats takes 8, more than the 4
 * a transfer keeps in flight, so a drain takes chunks that were not sent yet when the clients
 * found the mismatch. */
static const char *staged_small_chunks(void)
{
    const char *old = getenv("DT_STAGED_CHUNK_KB");
    setenv("DT_STAGED_CHUNK_KB", "1", 1);
    return old;
}

static void staged_chunks_back(const char *old)
{
    if (old)
        setenv("DT_STAGED_CHUNK_KB", old, 1);
    else
        unsetenv("DT_STAGED_CHUNK_KB");
}

/* Both clients get DT_ERR_STATE with `want0` and `want1` in their messages (their tallies),
 * every chunk of the exchange taken on both, so that the next two exchanges work; in chunks
 * of 4 MiB (one a box) and of 1 KiB (8 a box). */
static void staged_fails_then_passes(const int64_t *s0, const int64_t *r0, const int64_t *s1,
                                     const int64_t *r1, const char *want0, const char *want1)
{
    if (dt_num_clients() != 2)
        return;
    for (int small = 0; small < 2; small++) {
        const char *old = small ? staged_small_chunks() : NULL;
        dt_status st = exchange_cols(dt__transport_staged(), s0, r0, s1, r1);
        CU_ASSERT_EQUAL(st, DT_ERR_STATE);
        const char *want = dt_client_id() == 0 ? want0 : want1;
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), want));
        if (!strstr(dt_last_error(), want))
            fprintf(stderr, "[client %d] '%s' lacks '%s'\n", dt_client_id(), dt_last_error(), want);
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "different relayouts"));
        one_box_arrives(dt__transport_staged());
        one_box_arrives(dt__transport_staged());
        if (small)
            staged_chunks_back(old);
    }
}

static const int64_t none[1] = {0};

static void test_staged_transport_fails_both_clients_of_a_pair_whose_amounts_differ(void)
{
    static const int64_t half[2] = {COLS / 2, 0}, whole[2] = {COLS, 0};
    staged_fails_then_passes(half, none, none, whole,
                             "this client sends 4096 bytes in 1 box(es) where client 1 expects "
                             "8192 in 1",
                             "client 0 sends 4096 bytes in 1 box(es) where this client expects "
                             "8192 in 1");
    staged_fails_then_passes(whole, none, none, half,
                             "this client sends 8192 bytes in 1 box(es) where client 1 expects "
                             "4096 in 1",
                             "client 0 sends 8192 bytes in 1 box(es) where this client expects "
                             "4096 in 1");
}

static void test_staged_transport_drains_other_numbers_of_boxes_both_ways(void)
{
    static const int64_t three[4] = {COLS, COLS, COLS, 0}, one[2] = {COLS, 0};
    staged_fails_then_passes(three, one, one, one,
                             "this client sends 24576 bytes in 3 box(es) where client 1 "
                             "expects 8192 in 1",
                             "client 0 sends 24576 bytes in 3 box(es) where this client "
                             "expects 8192 in 1");
    staged_fails_then_passes(one, one, one, three,
                             "this client sends 8192 bytes in 1 box(es) where client 1 expects "
                             "24576 in 3",
                             "client 0 sends 8192 bytes in 1 box(es) where this client expects "
                             "24576 in 3");
    /* Client 0 sends a box that client 1 does not expect; each still hears from the other. */
    staged_fails_then_passes(one, one, one, none,
                             "this client sends 8192 bytes in 1 box(es) where client 1 expects "
                             "0 in 0",
                             "client 0 sends 8192 bytes in 1 box(es) where this client expects "
                             "0 in 0");
}

static void test_staged_transport_tells_boxes_of_the_same_bytes_in_other_sizes(void)
{
    static const int64_t a[3] = {COLS / 4, COLS / 2, 0}, b[3] = {COLS / 2, COLS / 4, 0};
    staged_fails_then_passes(a, none, none, b,
                             "this client sends 6144 bytes in 2 box(es) of other sizes where "
                             "client 1 expects 6144 in 2",
                             "client 0 sends 6144 bytes in 2 box(es) of other sizes where this "
                             "client expects 6144 in 2");
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_transports_pass_boxes_of_the_expected_size),
        DT_TEST(test_mpi_transport_names_a_peer_that_sent_fewer_bytes),
        DT_TEST(test_mpi_transport_names_a_peer_that_sent_more_bytes),
        DT_TEST(test_shm_transport_names_a_peer_that_offered_another_box),
        DT_TEST(test_staged_transport_fails_both_clients_of_a_pair_whose_amounts_differ),
        DT_TEST(test_staged_transport_drains_other_numbers_of_boxes_both_ways),
        DT_TEST(test_staged_transport_tells_boxes_of_the_same_bytes_in_other_sizes),
        DT_TEST(test_shm_transport_drains_more_boxes_than_expected),
        DT_TEST(test_shm_transport_drains_fewer_boxes_than_expected),
        DT_TEST(test_shm_transport_drains_boxes_sent_by_mpi),
        DT_TEST(test_shm_transport_tells_a_peer_that_expects_boxes_it_sends_none),
        DT_TEST(test_shm_transport_says_comm_when_a_peer_takes_none_of_its_boxes),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "trace_transport", cases, 1);
}
