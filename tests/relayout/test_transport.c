/* Transports (runtime/transport*.c) on the simulated accelerator (DT_GPU=sim): the choice per
 * plan's memory, DT_TRANSPORT forcing one (and refusing what it cannot move before sending,
 * or an unknown name at dt_init), and the staged transport's pipeline cutting a transfer into
 * many chunks between real processes, checked against values computed here. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/shm.h"
#include "rl_test_util.h"
#include "runtime/device.h"
#include "runtime/transport.h"

static const dt__device *gpu0(void)
{
    const dt__device *d = dt__device_local(DT_DEVICE_GPU, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    return d;
}

/* Sets DT_TRANSPORT (NULL: unset) and reads it as dt_init does. */
static dt_status force(const char *name)
{
    if (name)
        setenv("DT_TRANSPORT", name, 1);
    else
        unsetenv("DT_TRANSPORT");
    dt_relayout_cache_clear(); /* plans keep the transport they were built for */
    return dt__transport_configure();
}

static int all_clients(int *clients)
{
    for (int c = 0; c < dt_num_clients(); c++)
        clients[c] = c;
    return dt_num_clients();
}

static void test_auto_picks_mpi_for_host_memory_and_staged_for_device_memory(void)
{
    int clients[64], n = all_clients(clients);
    const dt__device_kind *host[1] = {NULL}, *dev[1] = {gpu0()->kind},
                          *mixed[2] = {NULL, gpu0()->kind};
    const dt__transport *t = NULL;
    DT_ASSERT_OK(force(NULL));
    DT_ASSERT_OK(dt__transport_select(host, 1, clients, n, 1, &t));
    /* Host memory: the same-host shared-memory transport while its pool is up. */
    CU_ASSERT_STRING_EQUAL(t->name, dt__transport_shm() ? "shm" : "mpi");
    /* Device memory: NCCL where it applies (a CUDA GPU per client), else staged. */
    DT_ASSERT_OK(dt__transport_select(dev, 1, clients, n, 1, &t));
    CU_ASSERT_STRING_EQUAL(t->name, dt__transport_nccl() ? "nccl" : "staged");
    DT_ASSERT_OK(dt__transport_select(mixed, 2, clients, n, 1, &t));
    CU_ASSERT_STRING_EQUAL(t->name, "staged");
    /* Forced staged also moves host memory. */
    DT_ASSERT_OK(force("staged"));
    DT_ASSERT_OK(dt__transport_select(host, 1, clients, n, 1, &t));
    CU_ASSERT_STRING_EQUAL(t->name, "staged");
    DT_ASSERT_OK(force(NULL));
}

static void test_forced_transport_that_cannot_move_the_memory_is_refused_naming_why(void)
{
    int clients[64], n = all_clients(clients);
    const dt__device_kind *host[1] = {NULL}, *dev[1] = {gpu0()->kind};
    const dt__transport *t = NULL;
    DT_ASSERT_OK(force("mpi"));
    DT_ASSERT_FAILS(dt__transport_select(dev, 1, clients, n, 1, &t), DT_ERR_UNSUPPORTED);
    DT_ASSERT_ERROR_MENTIONS("DT_TRANSPORT=mpi");
    DT_ASSERT_ERROR_MENTIONS("sim device memory");
    /* Nothing crossing processes: any transport will do. */
    DT_ASSERT_OK(dt__transport_select(dev, 1, clients, 1, 0, &t));
    DT_ASSERT_OK(force("shm"));
    if (dt__transport_shm()) { /* host memory it moves; device memory it refuses */
        DT_ASSERT_OK(dt__transport_select(host, 1, clients, n, 1, &t));
        CU_ASSERT_STRING_EQUAL(t->name, "shm");
        DT_ASSERT_FAILS(dt__transport_select(dev, 1, clients, n, 1, &t), DT_ERR_UNSUPPORTED);
        DT_ASSERT_ERROR_MENTIONS("sim device memory");
    } else {
        DT_ASSERT_FAILS(dt__transport_select(host, 1, clients, n, 1, &t), DT_ERR_UNSUPPORTED);
        DT_ASSERT_ERROR_MENTIONS(dt__shm_absence());
    }
    DT_ASSERT_ERROR_MENTIONS("DT_TRANSPORT=shm");
    DT_ASSERT_OK(force("nccl"));
    DT_ASSERT_FAILS(dt__transport_select(host, 1, clients, n, 1, &t), DT_ERR_UNSUPPORTED);
    DT_ASSERT_ERROR_MENTIONS("DT_TRANSPORT=nccl");
    if (!dt__transport_nccl()) {
        DT_ASSERT_FAILS(dt__transport_select(dev, 1, clients, n, 1, &t), DT_ERR_UNSUPPORTED);
        DT_ASSERT_ERROR_MENTIONS(dt__nccl_absence());
    }
    DT_ASSERT_OK(force(NULL));
}

static void test_unknown_transport_name_is_an_error_naming_the_accepted_values(void)
{
    DT_ASSERT_FAILS(force("carrier-pigeon"), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("carrier-pigeon");
    DT_ASSERT_ERROR_MENTIONS("auto, mpi, staged, nccl, shm");
    DT_ASSERT_OK(force(NULL));
}

/* A relayout of a GPU mesh over every client with DT_TRANSPORT=mpi: refused on every client
 * before anything is sent when the mesh spans processes (the destination stays unmade), and
 * done in one process; then the same relayout under auto gives the right values. */
static void test_forced_mpi_refuses_device_pieces_crossing_processes_before_sending(void)
{
    const char *names[1] = {"x"};
    int64_t sizes[1] = {dt_test_num_devices()}, shape[2] = {2 * sizes[0] + 1, 5};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("line", 1, names, sizes, DT_DEVICE_GPU, &m));
    dt_layout *rows = rl_layout2(m, "x", DT_UNSHARDED, NULL);
    dt_layout *rep = rl_layout2(m, DT_UNSHARDED, DT_UNSHARDED, NULL);
    dt_tensor *src = NULL, *dst = NULL;
    DT_ASSERT_OK(rl_make_tensor(rows, shape, DT_DTYPE_F32, 5, &src));
    DT_ASSERT_OK(force("mpi"));
    if (dt_num_clients() > 1) {
        DT_ASSERT_FAILS(dt_relayout(src, rep, &dst), DT_ERR_UNSUPPORTED);
        DT_ASSERT_ERROR_MENTIONS("DT_TRANSPORT=mpi");
        DT_ASSERT_ERROR_MENTIONS("nothing was sent");
        CU_ASSERT_PTR_NULL(dst);
    } else {
        DT_ASSERT_OK(dt_relayout(src, rep, &dst));
        CU_ASSERT_EQUAL(rl_check_tensor(dst, rows, 5), 0);
        dt_tensor_destroy(dst);
        dst = NULL;
    }
    DT_ASSERT_OK(force(NULL));
    DT_ASSERT_OK(dt_relayout(src, rep, &dst));
    CU_ASSERT_EQUAL(rl_check_tensor(dst, rows, 5), 0);
    dt_tensor_destroy(dst);
    dt_tensor_destroy(src);
    dt_layout_destroy(rows);
    dt_layout_destroy(rep);
    dt_mesh_destroy(m);
}

/* Element (i, j) of client c's array. */
static float value_of(int c, int64_t i, int64_t j)
{
    return (float)(c * 100000 + i * 1000 + j);
}

/* Each client sends a 50 x 90 box of a 64 x 100 f32 array in device memory to the next
 * client (itself when alone), which receives it into a box of a 70 x 95 device array (and,
 * with host_too, of a host array), twice through the same caches; the values received are the
 * sender's. Returns the chunks the staged transport counted. */
static uint64_t exchange_boxes(const dt__transport *t, int host_too)
{
    const dt__device *d = gpu0();
    int me = dt_client_id(), n = dt_num_clients();
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    enum { SR = 64, SC = 100, DR = 70, DC = 95, BR = 50, BC = 90 };
    float *host_src = malloc(SR * SC * sizeof *host_src);
    float *host_dst = calloc(DR * DC, sizeof *host_dst), *got = malloc(DR * DC * sizeof *got);
    CU_ASSERT_PTR_NOT_NULL_FATAL(host_src);
    CU_ASSERT_PTR_NOT_NULL_FATAL(host_dst);
    CU_ASSERT_PTR_NOT_NULL_FATAL(got);
    for (int64_t i = 0; i < SR; i++)
        for (int64_t j = 0; j < SC; j++)
            host_src[i * SC + j] = value_of(me, i, j);
    void *dsrc = NULL, *ddst = NULL;
    DT_ASSERT_OK(dt__device_alloc(d, SR * SC * sizeof(float), &dsrc));
    DT_ASSERT_OK(dt__device_alloc(d, DR * DC * sizeof(float), &ddst));
    DT_ASSERT_OK(d->kind->copy(d, DT__COPY_H2D, dsrc, host_src, SR * SC * sizeof(float)));
    DT_ASSERT_OK(d->kind->memset0(d, ddst, DR * DC * sizeof(float)));
    dt__xfer_cache caches[3] = {{NULL}, {NULL}, {NULL}};
    dt__xfer send = {.peer = next, .cache = &caches[0],
                     .region = {.base = dsrc, .dev = d, .rank = 2, .elem = sizeof(float),
                                .shape = {SR, SC}, .start = {3, 5}, .count = {BR, BC}}};
    dt__xfer sends[2] = {send, send};
    sends[1].cache = &caches[1];
    dt__xfer recvs[2] = {
        {.peer = prev, .cache = &caches[2],
         .region = {.base = ddst, .dev = d, .rank = 2, .elem = sizeof(float),
                    .shape = {DR, DC}, .start = {11, 2}, .count = {BR, BC}}},
        {.peer = prev, .cache = NULL,
         .region = {.base = host_dst, .dev = NULL, .rank = 2, .elem = sizeof(float),
                    .shape = {DR, DC}, .start = {0, 4}, .count = {BR, BC}}},
    };
    uint64_t before = dt__transport_staged_chunks();
    for (int round = 0; round < 2; round++)
        DT_ASSERT_OK(t->exchange(sends, host_too ? 2 : 1, recvs, host_too ? 2 : 1, NULL, NULL));
    uint64_t chunks = dt__transport_staged_chunks() - before;
    DT_ASSERT_OK(d->kind->copy(d, DT__COPY_D2H, got, ddst, DR * DC * sizeof(float)));
    int64_t bad = 0;
    for (int64_t i = 0; i < DR; i++)
        for (int64_t j = 0; j < DC; j++) {
            int in_dev = i >= 11 && i < 11 + BR && j >= 2 && j < 2 + BC;
            float want_dev = in_dev ? value_of(prev, i - 11 + 3, j - 2 + 5) : 0.0f;
            int in_host = host_too && i < BR && j >= 4 && j < 4 + BC;
            float want_host = in_host ? value_of(prev, i + 3, j - 4 + 5) : 0.0f;
            bad += got[i * DC + j] != want_dev;
            bad += host_dst[i * DC + j] != want_host;
        }
    CU_ASSERT_EQUAL(bad, 0);
    for (int i = 0; i < 3; i++)
        t->release(&caches[i]);
    CU_ASSERT_PTR_NULL(caches[0].state);
    dt__device_free(d, dsrc, SR * SC * sizeof(float));
    dt__device_free(d, ddst, DR * DC * sizeof(float));
    free(host_src);
    free(host_dst);
    free(got);
    return chunks;
}

/* In 1 KiB chunks (2 rows of 90 floats each: 25 chunks a transfer) the staged transport
 * moves each of the 4 transfers (device and host receivers) in 25 chunks, twice. */
static void test_staged_transport_pipelines_chunks_between_processes(void)
{
    setenv("DT_STAGED_CHUNK_KB", "1", 1);
    CU_ASSERT_EQUAL(exchange_boxes(dt__transport_staged(), 1), 2 * 4 * 25);
    unsetenv("DT_STAGED_CHUNK_KB");
    /* The default chunk holds a whole box. */
    CU_ASSERT_EQUAL(exchange_boxes(dt__transport_staged(), 1), 2 * 4);
}

/* Where NCCL applies (CUDA builds, a GPU per client: scripts/gpu_check.sh runs it as a
 * one-rank communicator on the device machine), it moves the same boxes device to device.
 * Elsewhere it says why it does not apply and refuses an exchange. */
static void test_nccl_transport_moves_boxes_where_it_applies(void)
{
    const dt__transport *t = dt__transport_nccl();
    if (!t) {
        CU_ASSERT(dt__nccl_absence()[0] != '\0');
        printf("\n  (nccl does not apply here: %s)\n", dt__nccl_absence());
        return;
    }
    CU_ASSERT_EQUAL(exchange_boxes(t, 0), 0);
}

/* A chunk size that is not a number is refused before anything is posted. */
static void test_bad_chunk_size_is_refused(void)
{
    const dt__device *d = gpu0();
    float buf[4] = {0};
    dt__xfer x = {.peer = dt_client_id(),
                  .region = {.base = buf, .dev = NULL, .rank = 1, .elem = sizeof(float),
                             .shape = {4}, .start = {0}, .count = {4}}};
    (void)d;
    setenv("DT_STAGED_CHUNK_KB", "lots", 1);
    DT_ASSERT_FAILS(dt__transport_staged()->exchange(&x, 1, &x, 1, NULL, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_STAGED_CHUNK_KB='lots'");
    unsetenv("DT_STAGED_CHUNK_KB");
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_auto_picks_mpi_for_host_memory_and_staged_for_device_memory),
        DT_TEST(test_forced_transport_that_cannot_move_the_memory_is_refused_naming_why),
        DT_TEST(test_unknown_transport_name_is_an_error_naming_the_accepted_values),
        DT_TEST(test_forced_mpi_refuses_device_pieces_crossing_processes_before_sending),
        DT_TEST(test_staged_transport_pipelines_chunks_between_processes),
        DT_TEST(test_nccl_transport_moves_boxes_where_it_applies),
        DT_TEST(test_bad_chunk_size_is_refused),
        DT_TEST_END,
    };
    return dt_test_main_gpu(argc, argv, "transport", cases);
}
