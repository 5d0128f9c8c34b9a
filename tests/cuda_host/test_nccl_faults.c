/* The NCCL transport (runtime/transport_nccl.c) between the GPUs of 2 processes on the host
 * build (-Dcuda=host), driven directly: its collectives on every dtype and reduction it maps
 * against the values worked by hand, and its failures, each injected on both clients by the
 * NCCL stand-in (cuda_host/fault.h): a line communicator that cannot be made, clients asking
 * for different transfers or collectives (DT_ERR_STATE before any NCCL call), a send or a
 * collective refused inside a group (an error naming the call that aborts the communicator;
 * the transport, started again, then works), host memory refused, and last an asynchronous
 * error, which aborts the
 * communicator (an error naming it; the transport then says it does not apply).
 * DT_TEST_NCCL_LAST=exchange|collective picks which path gets the asynchronous error (the
 * collective run also has the staged transport wait on a late peer that answers its pings,
 * and drain the chunks of an exchange whose clients listed other boxes);
 * DT_TEST_NCCL_LAST=shared checks only that clients sharing a GPU get no NCCL transport. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda_host/fault.h"
#include "harness.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/transport.h"

static const int line[2] = {0, 1};

static const dt__device *gpu0(void)
{
    const dt__device *d = dt__device_local(DT_DEVICE_GPU, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    return d;
}

static void *dev_copy(const void *host, size_t bytes)
{
    const dt__device *d = gpu0();
    void *p = NULL;
    DT_ASSERT_OK(dt__device_alloc(d, bytes, &p));
    DT_ASSERT_OK(d->kind->copy(d, DT__COPY_H2D, p, host, bytes));
    return p;
}

static void dev_free(void *p, size_t bytes)
{
    dt__device_free(gpu0(), p, bytes);
}

/* An all-reduce of 3 elements of `dtype` from mine through t; got: the result. */
static dt_status allreduce_on(const dt__transport *t, dt_dtype dtype, dt_reduce_op op,
                              const void *mine, void *got)
{
    size_t bytes = 3 * dt_dtype_size(dtype);
    void *s = dev_copy(mine, bytes), *r = dev_copy(mine, bytes);
    dt__coll c = {.kind = DT__COLL_ALLREDUCE, .nmembers = 2, .clients = line,
                  .rank = dt_client_id(), .send = s, .recv = r, .bytes = bytes,
                  .dtype = dtype, .op = op, .dev = gpu0()};
    dt_status st = t->collective(&c, 1);
    if (st == DT_OK)
        DT_ASSERT_OK(gpu0()->kind->copy(gpu0(), DT__COPY_D2H, got, r, bytes));
    dev_free(s, bytes);
    dev_free(r, bytes);
    return st;
}

static dt_status allreduce(dt_dtype dtype, dt_reduce_op op, const void *mine, void *got)
{
    const dt__transport *t = dt__transport_nccl();
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    return allreduce_on(t, dtype, op, mine, got);
}

static void test_a_line_communicator_that_cannot_be_made_is_an_error_then_made(void)
{
    int32_t a[3] = {1, 2, 3}, got[3];
    dt__cuh_fail("ncclinit", 1);
    DT_ASSERT_FAILS(allreduce(DT_DTYPE_I32, DT_REDUCE_SUM, a, got), DT_ERR_COMM);
    DT_ASSERT_ERROR_MENTIONS("ncclCommInitRank");
    DT_ASSERT_ERROR_MENTIONS("line communicator of clients 0..1");
    CU_ASSERT(dt__cuh_fail_fired("ncclinit"));
    DT_ASSERT_OK(allreduce(DT_DTYPE_I32, DT_REDUCE_SUM, a, got));
    CU_ASSERT(got[0] == 2 && got[1] == 4 && got[2] == 6);
}

/* Client c contributes c + 1 times the base values (and, for min/max, a sign flip on
 * client 1): results worked by hand. */
static void test_collectives_reduce_every_dtype_the_transport_maps(void)
{
    int me = dt_client_id();
    int64_t i64[3] = {me ? -7 : 5, 1000000000000ll * (me + 1), me}, g64[3];
    DT_ASSERT_OK(allreduce(DT_DTYPE_I64, DT_REDUCE_MAX, i64, g64));
    CU_ASSERT(g64[0] == 5 && g64[1] == 2000000000000ll && g64[2] == 1);
    DT_ASSERT_OK(allreduce(DT_DTYPE_I64, DT_REDUCE_MIN, i64, g64));
    CU_ASSERT(g64[0] == -7 && g64[1] == 1000000000000ll && g64[2] == 0);
    uint8_t u8[3] = {(uint8_t)(10 + me), 200, (uint8_t)me}, g8[3];
    DT_ASSERT_OK(allreduce(DT_DTYPE_U8, DT_REDUCE_SUM, u8, g8));
    CU_ASSERT(g8[0] == 21 && g8[1] == (uint8_t)400 && g8[2] == 1);
    double f64[3] = {0.5 * (me + 1), -1.25, 3.0}, gd[3];
    DT_ASSERT_OK(allreduce(DT_DTYPE_F64, DT_REDUCE_SUM, f64, gd));
    CU_ASSERT(gd[0] == 1.5 && gd[1] == -2.5 && gd[2] == 6.0);
    /* f16 1.5 and 2.5 (0x3e00, 0x4100): sum 4.0 (0x4400); bf16 1.0 + 2.0 = 3.0 (0x4040). */
    uint16_t h[3] = {me ? 0x4100 : 0x3e00, 0x3c00, 0}, gh[3];
    DT_ASSERT_OK(allreduce(DT_DTYPE_F16, DT_REDUCE_SUM, h, gh));
    CU_ASSERT(gh[0] == 0x4400 && gh[1] == 0x4000 && gh[2] == 0);
    uint16_t b[3] = {me ? 0x4000 : 0x3f80, 0x3f80, 0}, gb[3];
    DT_ASSERT_OK(allreduce(DT_DTYPE_BF16, DT_REDUCE_SUM, b, gb));
    CU_ASSERT(gb[0] == 0x4040 && gb[1] == 0x4000 && gb[2] == 0);
}

/* One 4 x 6 f32 box each way between the two clients (itself when alone) through t. */
static dt_status exchange_on(const dt__transport *t, int device_memory, float *got)
{
    int me = dt_client_id(), peer = 1 - me;
    float src[24];
    for (int i = 0; i < 24; i++)
        src[i] = (float)(100 * me + i);
    void *ds = dev_copy(src, sizeof src), *dr = dev_copy(src, sizeof src);
    float host_dst[24] = {0};
    dt__xfer send = {.peer = peer, .region = {.base = ds, .dev = gpu0(), .rank = 2,
                                              .elem = sizeof(float), .shape = {4, 6},
                                              .start = {0, 0}, .count = {4, 6}}};
    dt__xfer recv = send;
    recv.region.base = device_memory ? dr : host_dst;
    recv.region.dev = device_memory ? gpu0() : NULL;
    dt_status st = t->exchange(&send, 1, &recv, 1, NULL, NULL);
    if (st == DT_OK)
        DT_ASSERT_OK(gpu0()->kind->copy(gpu0(), DT__COPY_D2H, got, dr, sizeof src));
    dev_free(ds, sizeof src);
    dev_free(dr, sizeof src);
    return st;
}

static dt_status exchange(int device_memory, float *got)
{
    return exchange_on(dt__transport_nccl(), device_memory, got);
}

static void check_from_peer(const float *got)
{
    int peer = 1 - dt_client_id(), bad = 0;
    for (int i = 0; i < 24; i++)
        bad += got[i] != (float)(100 * peer + i);
    CU_ASSERT_EQUAL(bad, 0);
}

/* The transport refused (held from before the abort) says why, naming the abort; then the
 * transport is started again as dt_init would (collective), and works. */
static void check_aborted_then_restart(const dt__transport *t, const char *after)
{
    CU_ASSERT_PTR_NULL(dt__transport_nccl());
    CU_ASSERT_PTR_NOT_NULL(strstr(dt__nccl_absence(), after));
    float src[24] = {0};
    void *ds = dev_copy(src, sizeof src);
    dt__xfer x = {.peer = 1 - dt_client_id(),
                  .region = {.base = ds, .dev = gpu0(), .rank = 1, .elem = sizeof(float),
                             .shape = {24}, .start = {0}, .count = {24}}};
    DT_ASSERT_FAILS(t->exchange(&x, 1, &x, 1, NULL, NULL), DT_ERR_UNSUPPORTED);
    DT_ASSERT_ERROR_MENTIONS("the nccl transport does not apply: ");
    DT_ASSERT_ERROR_MENTIONS(after);
    dev_free(ds, sizeof src);
    dt__transport_nccl_stop();
    DT_ASSERT_OK(dt__transport_nccl_start("nccl"));
    CU_ASSERT_PTR_NOT_NULL_FATAL(dt__transport_nccl());
}

/* A call refused inside the group (the send, after the receive was accepted: nccl:2) ends the
 * exchange with an error naming it and aborts the communicator, since a peer's half may be
 * issued and would match the next exchange's calls; the same for a refused collective. */
static void test_calls_refused_inside_a_group_are_errors_that_abort_the_communicator(void)
{
    float got[24];
    const dt__transport *t = dt__transport_nccl();
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    dt__cuh_fail("nccl", 2);
    DT_ASSERT_FAILS(exchange(1, got), DT_ERR_COMM);
    DT_ASSERT_ERROR_MENTIONS("ncclSend/ncclRecv group");
    DT_ASSERT_ERROR_MENTIONS("unhandled cuda error");
    CU_ASSERT(dt__cuh_fail_fired("nccl"));
    check_aborted_then_restart(t, "aborted after a refused ncclSend/ncclRecv");
    DT_ASSERT_OK(exchange(1, got));
    check_from_peer(got);
    int32_t a[3] = {1, 2, 3}, g[3];
    t = dt__transport_nccl();
    dt__cuh_fail("nccl", 1);
    DT_ASSERT_FAILS(allreduce(DT_DTYPE_I32, DT_REDUCE_MAX, a, g), DT_ERR_COMM);
    DT_ASSERT_ERROR_MENTIONS("NCCL collective on the line communicator");
    check_aborted_then_restart(t, "aborted after a refused collective");
    DT_ASSERT_OK(allreduce(DT_DTYPE_I32, DT_REDUCE_MAX, a, g));
    CU_ASSERT(g[0] == 1 && g[1] == 2 && g[2] == 3);
}

/* A call refused on client 1 only (nccl:1 there): client 1 gets the refusal, client 0, whose
 * half was issued, waits DT_COMM_TIMEOUT (0.5 s here) and gets DT_ERR_TIMEOUT naming the
 * peer; both abort, and started again the transport works. The exchange, or in the collective
 * run an all-reduce. */
static void test_a_call_refused_on_one_client_times_out_the_other_and_both_abort(void)
{
    const char *last = getenv("DT_TEST_NCCL_LAST");
    int coll = last && strcmp(last, "collective") == 0, me = dt_client_id();
    const dt__transport *t = dt__transport_nccl();
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    char keep[32];
    snprintf(keep, sizeof keep, "%s", getenv("DT_COMM_TIMEOUT") ? getenv("DT_COMM_TIMEOUT") : "");
    setenv("DT_COMM_TIMEOUT", "0.5", 1);
    if (me == 1)
        dt__cuh_fail("nccl", 1);
    float got[24];
    int32_t a[3] = {1, 2, 3}, g[3];
    dt_status st = coll ? allreduce(DT_DTYPE_I32, DT_REDUCE_SUM, a, g) : exchange(1, got);
    CU_ASSERT_EQUAL(st, me == 1 ? DT_ERR_COMM : DT_ERR_TIMEOUT);
    fprintf(stderr, "[client %d] refused on client 1: %s\n", me, dt_last_error());
    if (me == 0)
        DT_ASSERT_ERROR_MENTIONS("nothing completed for 0.5 s (DT_COMM_TIMEOUT)");
    check_aborted_then_restart(t, me == 1 ? "aborted after a refused" : "aborted after an error");
    if (keep[0])
        setenv("DT_COMM_TIMEOUT", keep, 1);
    else
        unsetenv("DT_COMM_TIMEOUT");
    if (coll) {
        DT_ASSERT_OK(allreduce(DT_DTYPE_I32, DT_REDUCE_SUM, a, g));
        CU_ASSERT(g[0] == 2 && g[1] == 4 && g[2] == 6);
    } else {
        DT_ASSERT_OK(exchange(1, got));
        check_from_peer(got);
    }
}

/* Clients that list other boxes (client 1 expects 3 of the 4 rows) or other collectives (an
 * all-reduce of 3 elements against one of 2, a max against a sum) get DT_ERR_STATE alike
 * before any NCCL call, and the communicators stay usable. */
static void test_mismatched_exchanges_and_collectives_fail_alike_before_any_nccl_call(void)
{
    int me = dt_client_id(), peer = 1 - me;
    float src[24] = {0};
    void *ds = dev_copy(src, sizeof src), *dr = dev_copy(src, sizeof src);
    dt__xfer send = {.peer = peer, .region = {.base = ds, .dev = gpu0(), .rank = 2,
                                              .elem = sizeof(float), .shape = {4, 6},
                                              .start = {0, 0}, .count = {4, 6}}};
    dt__xfer recv = send;
    recv.region.base = dr;
    if (me == 1)
        recv.region.count[0] = 3;
    dt__cuh_fail("nccl", 1); /* armed: fires only if a call reaches NCCL */
    DT_ASSERT_FAILS(dt__transport_nccl()->exchange(&send, 1, &recv, 1, NULL, NULL),
                    DT_ERR_STATE);
    DT_ASSERT_ERROR_MENTIONS("different relayouts");
    DT_ASSERT_ERROR_MENTIONS(me == 0 ? "where client 1 expects 72" : "where this client "
                                                                     "expects 72");
    dev_free(ds, sizeof src);
    dev_free(dr, sizeof src);
    int32_t a[3] = {1, 2, 3}, g[3];
    size_t bytes = (me ? 2 : 3) * sizeof(int32_t);
    void *s = dev_copy(a, sizeof a), *r = dev_copy(a, sizeof a);
    dt__coll c = {.kind = DT__COLL_ALLREDUCE, .nmembers = 2, .clients = line, .rank = me,
                  .send = s, .recv = r, .bytes = bytes, .dtype = DT_DTYPE_I32,
                  .op = DT_REDUCE_SUM, .dev = gpu0()};
    DT_ASSERT_FAILS(dt__transport_nccl()->collective(&c, 1), DT_ERR_STATE);
    DT_ASSERT_ERROR_MENTIONS(me ? "client 0 asked for an all-reduce of 12-byte blocks where "
                                  "this client asked for an all-reduce of 8-byte blocks"
                                : "client 1 asked for an all-reduce of 8-byte blocks where "
                                  "this client asked for an all-reduce of 12-byte blocks");
    c.bytes = sizeof a;
    c.op = me ? DT_REDUCE_MAX : DT_REDUCE_SUM;
    DT_ASSERT_FAILS(dt__transport_nccl()->collective(&c, 1), DT_ERR_STATE);
    DT_ASSERT_ERROR_MENTIONS("another dtype or reduction");
    CU_ASSERT(!dt__cuh_fail_fired("nccl"));
    dt__cuh_fail("nccl", 0);
    dev_free(s, sizeof a);
    dev_free(r, sizeof a);
    DT_ASSERT_OK(allreduce(DT_DTYPE_I32, DT_REDUCE_SUM, a, g));
    CU_ASSERT(g[0] == 2 && g[1] == 4 && g[2] == 6);
    float got[24];
    DT_ASSERT_OK(exchange(1, got));
    check_from_peer(got);
}

static void test_host_memory_is_refused_before_anything_is_sent(void)
{
    float got[24];
    DT_ASSERT_FAILS(exchange(0, got), DT_ERR_UNSUPPORTED);
    DT_ASSERT_ERROR_MENTIONS("CUDA device memory only");
    int32_t h[3] = {0};
    dt__coll c = {.kind = DT__COLL_ALLREDUCE, .nmembers = 2, .clients = line,
                  .rank = dt_client_id(), .send = h, .recv = h, .bytes = sizeof h,
                  .dtype = DT_DTYPE_I32, .op = DT_REDUCE_SUM, .dev = NULL};
    DT_ASSERT_FAILS(dt__transport_nccl()->collective(&c, 1), DT_ERR_UNSUPPORTED);
    DT_ASSERT_ERROR_MENTIONS("CUDA device memory only");
    /* A DT_COMM_TIMEOUT that is not a number is refused before anything is posted. */
    char keep[32];
    snprintf(keep, sizeof keep, "%s", getenv("DT_COMM_TIMEOUT") ? getenv("DT_COMM_TIMEOUT") : "");
    setenv("DT_COMM_TIMEOUT", "soon", 1);
    DT_ASSERT_FAILS(exchange(1, got), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_COMM_TIMEOUT='soon'");
    DT_ASSERT_FAILS(dt__transport_nccl()->collective(&c, 1), DT_ERR_INVALID_ARGUMENT);
    if (keep[0])
        setenv("DT_COMM_TIMEOUT", keep, 1);
    else
        unsetenv("DT_COMM_TIMEOUT");
}

/* The staged transport's watchdog (runtime/transport_staged.c, stalled): client 1 comes to an
 * exchange 0.8 s late, answering pings meanwhile as a client in a watched wait elsewhere does;
 * client 0's wait goes DT_COMM_TIMEOUT=0.3 s without progress, pings client 1, hears it alive
 * and waits on (at most 3 times): the exchange completes, right. */
static void test_a_staged_exchange_waits_on_a_late_peer_that_answers_pings(void)
{
    char keep[32];
    snprintf(keep, sizeof keep, "%s", getenv("DT_COMM_TIMEOUT") ? getenv("DT_COMM_TIMEOUT") : "");
    setenv("DT_COMM_TIMEOUT", "0.3", 1);
    if (dt_client_id() == 1)
        for (double end = dt__now_seconds() + 0.8; dt__now_seconds() < end;) {
            dt__watchdog_answer();
            usleep(5000);
        }
    float got[24];
    DT_ASSERT_OK(exchange_on(dt__transport_staged(), 1, got));
    check_from_peer(got);
    if (keep[0])
        setenv("DT_COMM_TIMEOUT", keep, 1);
    else
        unsetenv("DT_COMM_TIMEOUT");
}

/* The staged transport's drain (runtime/transport_staged.c, drain_some): client 0 sends 6 rows
 * of 1 KiB in 1 KiB chunks where client 1 expects 2, so 4 chunks meet no receive; both get
 * DT_ERR_STATE from the tallies, client 1 takes and drops the 4 chunks, and an exchange asked
 * alike then runs right (nothing was left behind). */
static void test_a_staged_exchange_of_other_boxes_fails_alike_and_drains(void)
{
    int me = dt_client_id(), peer = 1 - me;
    enum { ROWS = 6, COLS = 256 };
    static float host[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++)
        host[i] = (float)(1000 * me + i);
    CU_ASSERT_FATAL(setenv("DT_STAGED_CHUNK_KB", "1", 1) == 0);
    void *ds = dev_copy(host, sizeof host), *dr = dev_copy(host, sizeof host);
    dt__xfer send = {.peer = peer, .region = {.base = ds, .dev = gpu0(), .rank = 2,
                                              .elem = sizeof(float), .shape = {ROWS, COLS},
                                              .start = {0, 0}, .count = {ROWS, COLS}}};
    dt__xfer recv = send;
    recv.region.base = dr;
    if (me == 1)
        recv.region.count[0] = 2;
    DT_ASSERT_FAILS(dt__transport_staged()->exchange(&send, 1, &recv, 1, NULL, NULL),
                    DT_ERR_STATE);
    DT_ASSERT_ERROR_MENTIONS("different relayouts");
    recv.region.count[0] = ROWS;
    DT_ASSERT_OK(dt__transport_staged()->exchange(&send, 1, &recv, 1, NULL, NULL));
    DT_ASSERT_OK(gpu0()->kind->copy(gpu0(), DT__COPY_D2H, host, dr, sizeof host));
    int bad = 0;
    for (int i = 0; i < ROWS * COLS; i++)
        bad += host[i] != (float)(1000 * peer + i);
    CU_ASSERT_EQUAL(bad, 0);
    dev_free(ds, sizeof host);
    dev_free(dr, sizeof host);
    unsetenv("DT_STAGED_CHUNK_KB");
}

/* Last: the asynchronous error aborts the communicator. */
static void test_an_asynchronous_nccl_error_aborts_the_communicator(void)
{
    const char *last = getenv("DT_TEST_NCCL_LAST");
    int coll = last && strcmp(last, "collective") == 0;
    const dt__transport *t = dt__transport_nccl();
    dt__cuh_fail("ncclasync", 1);
    if (coll) {
        int32_t a[3] = {1, 2, 3}, g[3];
        DT_ASSERT_FAILS(allreduce(DT_DTYPE_I32, DT_REDUCE_SUM, a, g), DT_ERR_COMM);
        DT_ASSERT_ERROR_MENTIONS("collective (asynchronous error)");
    } else {
        float got[24];
        DT_ASSERT_FAILS(exchange(1, got), DT_ERR_COMM);
        DT_ASSERT_ERROR_MENTIONS("exchange (asynchronous error)");
    }
    DT_ASSERT_ERROR_MENTIONS("unhandled system error");
    CU_ASSERT(dt__cuh_fail_fired("ncclasync"));
    CU_ASSERT_PTR_NULL(dt__transport_nccl());
    CU_ASSERT_PTR_NOT_NULL(strstr(dt__nccl_absence(), "aborted after an error"));
    /* A caller holding the transport from before gets its refusal, naming why. */
    DT_ASSERT_OK(t->exchange(NULL, 0, NULL, 0, NULL, NULL)); /* nothing to move */
    if (coll) {
        int32_t a[3] = {1, 2, 3}, g[3];
        DT_ASSERT_FAILS(allreduce_on(t, DT_DTYPE_I32, DT_REDUCE_SUM, a, g), DT_ERR_UNSUPPORTED);
    } else {
        float src[24] = {0};
        void *ds = dev_copy(src, sizeof src);
        dt__xfer x = {.peer = 1 - dt_client_id(),
                      .region = {.base = ds, .dev = gpu0(), .rank = 1, .elem = sizeof(float),
                                 .shape = {24}, .start = {0}, .count = {24}}};
        DT_ASSERT_FAILS(t->exchange(&x, 1, &x, 1, NULL, NULL), DT_ERR_UNSUPPORTED);
        dev_free(ds, sizeof src);
    }
    DT_ASSERT_ERROR_MENTIONS("the nccl transport does not apply: ");
    DT_ASSERT_ERROR_MENTIONS("aborted after an error");
}

/* DT_CUDA_HOST_FAIL=pcibusid:1@1: client 1 cannot read its GPU's PCI bus id at dt_init, so the
 * two clients' GPU lists differ; each takes the first GPU it sees, both on CUDA device 0, and
 * NCCL (a GPU per client) does not apply, saying so. */
static void test_clients_sharing_a_gpu_get_no_nccl(void)
{
    CU_ASSERT_PTR_NULL(dt__transport_nccl());
    fprintf(stderr, "[client %d] nccl: %s\n", dt_client_id(), dt__nccl_absence());
    CU_ASSERT_PTR_NOT_NULL(strstr(dt__nccl_absence(), "share CUDA device 0"));
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_a_line_communicator_that_cannot_be_made_is_an_error_then_made),
        DT_TEST(test_collectives_reduce_every_dtype_the_transport_maps),
        DT_TEST(test_mismatched_exchanges_and_collectives_fail_alike_before_any_nccl_call),
        DT_TEST(test_calls_refused_inside_a_group_are_errors_that_abort_the_communicator),
        DT_TEST(test_a_call_refused_on_one_client_times_out_the_other_and_both_abort),
        DT_TEST(test_host_memory_is_refused_before_anything_is_sent),
        DT_TEST(test_an_asynchronous_nccl_error_aborts_the_communicator),
        DT_TEST_END,
    };
    static const dt_test_case collective_cases[] = { /* the staged case in one run only */
        DT_TEST(test_a_line_communicator_that_cannot_be_made_is_an_error_then_made),
        DT_TEST(test_collectives_reduce_every_dtype_the_transport_maps),
        DT_TEST(test_mismatched_exchanges_and_collectives_fail_alike_before_any_nccl_call),
        DT_TEST(test_calls_refused_inside_a_group_are_errors_that_abort_the_communicator),
        DT_TEST(test_a_call_refused_on_one_client_times_out_the_other_and_both_abort),
        DT_TEST(test_host_memory_is_refused_before_anything_is_sent),
        DT_TEST(test_a_staged_exchange_waits_on_a_late_peer_that_answers_pings),
        DT_TEST(test_a_staged_exchange_of_other_boxes_fails_alike_and_drains),
        DT_TEST(test_an_asynchronous_nccl_error_aborts_the_communicator),
        DT_TEST_END,
    };
    static const dt_test_case shared_cases[] = {
        DT_TEST(test_clients_sharing_a_gpu_get_no_nccl),
        DT_TEST_END,
    };
    const char *last = getenv("DT_TEST_NCCL_LAST");
    return dt_test_main_gpu(argc, argv, "nccl_faults",
                            last && strcmp(last, "shared") == 0       ? shared_cases
                            : last && strcmp(last, "collective") == 0 ? collective_cases
                                                                      : cases);
}
