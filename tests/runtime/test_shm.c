/* The same-host shared-memory pool and transport (runtime/shm_pool.c, transport_shm.c):
 * tensor memory lies in the segment the host peers map (a peer reads the values written here
 * through its own mapping), no shared-memory name is left behind, relayouts take the direct
 * path (one copy from the peer's segment, summands read in place) and give the values of the
 * independent reference (rl_check_tensor), memory outside a full pool goes by MPI inside the
 * same exchange, and a peer that stops answering is named in a DT_ERR_TIMEOUT. */
#include <dirent.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../relayout/rl_test_util.h"
#include "harness.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/shm.h"
#include "runtime/transport.h"

static dt_mesh *line_mesh(void)
{
    const char *dims[1] = {"x"};
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("shm_line", 1, dims, &n, DT_DEVICE_CPU, &m));
    return m;
}

static void test_pool_is_up_and_chosen_for_host_memory(void)
{
    CU_ASSERT_TRUE_FATAL(dt__shm_up());
    int clients[64], n = dt_num_clients();
    for (int c = 0; c < n; c++)
        clients[c] = c;
    const dt__device_kind *host[1] = {NULL};
    const dt__transport *t = NULL;
    DT_ASSERT_OK(dt__transport_select(host, 1, clients, n, n > 1, &t));
    CU_ASSERT_STRING_EQUAL(t->name, "shm");
    CU_ASSERT_EQUAL(dt__shm_local(dt_client_id()), dt__shm_self());
}

/* Each client fills its tensor's first component with its id; every host peer reads it
 * through its own mapping of this client's segment, at the offset this client reports. */
static void test_tensor_memory_lies_in_the_mapping_peers_read(void)
{
    dt_mesh *m = line_mesh();
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_batch_sharded(m, "x", 1, 0, &l));
    int64_t shape[1] = {dt_num_global_devices(DT_DEVICE_CPU) * 1000};
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_I32, shape, &t));
    const DLTensor *dl = dt_tensor_local(t, 0);
    int32_t *v = dl->data;
    for (int i = 0; i < 1000; i++)
        v[i] = dt_client_id() * 100000 + i;
    int64_t off = dt__shm_offset(v, 1000 * sizeof *v);
    CU_ASSERT_FATAL(off >= 0);
    MPI_Comm host = dt__host_comm();
    int hn = 0;
    MPI_Comm_size(host, &hn);
    int64_t offs[64];
    int ids[64], me = dt_client_id();
    MPI_Allgather(&off, 1, MPI_INT64_T, offs, 1, MPI_INT64_T, host);
    MPI_Allgather(&me, 1, MPI_INT, ids, 1, MPI_INT, host);
    for (int p = 0; p < hn; p++) {
        const int32_t *w = (const int32_t *)(void *)(dt__shm_segment(dt__shm_local(ids[p])) +
                                                     offs[p]);
        int bad = 0;
        for (int i = 0; i < 1000; i++)
            bad += w[i] != ids[p] * 100000 + i;
        CU_ASSERT_EQUAL(bad, 0);
    }
    MPI_Barrier(host); /* nobody frees before every peer read */
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

static void test_no_shared_memory_name_is_left_behind(void)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "dtshm.%u.%ld.", (unsigned)getuid(), (long)getpid());
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    int found = 0;
    for (struct dirent *e; (e = readdir(d));)
        found += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    CU_ASSERT_EQUAL(found, 0);
}

/* src -> dst of a [rows, 96] f32 tensor against the reference; returns the shm transport's
 * byte counts moved (direct, viewed, mpi), summed over the job. */
static void relayout_checked(const dt_layout *src_l, const dt_layout *dst_l, uint64_t moved[3])
{
    int64_t shape[2] = {dt_num_global_devices(DT_DEVICE_CPU) * 8, 96};
    uint64_t before[3], after[3];
    dt__transport_shm_bytes(&before[0], &before[1], &before[2]);
    dt_tensor *src = NULL, *dst = NULL;
    DT_ASSERT_OK(rl_make_tensor(src_l, shape, DT_DTYPE_F32, 5, &src));
    DT_ASSERT_OK(dt_relayout(src, dst_l, &dst));
    CU_ASSERT_EQUAL(rl_check_tensor(dst, src_l, 5), 0);
    dt__transport_shm_bytes(&after[0], &after[1], &after[2]);
    for (int k = 0; k < 3; k++)
        after[k] -= before[k];
    MPI_Allreduce(after, moved, 3, MPI_UINT64_T, MPI_SUM, dt__comm());
    dt_tensor_destroy(src);
    dt_tensor_destroy(dst);
}

/* All-gather, all-to-all (strided boxes) and all-reduce over every client: on one host the
 * boxes are copied straight from the peers' segments and the summands read in place. */
static void test_relayouts_take_the_direct_path_and_give_the_reference_values(void)
{
    dt_mesh *m = line_mesh();
    dt_layout *rows = rl_layout2(m, "x", DT_UNSHARDED, NULL);
    dt_layout *cols = rl_layout2(m, DT_UNSHARDED, "x", NULL);
    dt_layout *rep = rl_layout2(m, DT_UNSHARDED, DT_UNSHARDED, NULL);
    dt_layout *part = rl_layout2(m, DT_UNSHARDED, DT_UNSHARDED, "x");
    uint64_t moved[3];
    int one_host = dt__num_hosts() == 1, many = dt_num_clients() > 1;
    relayout_checked(rows, rep, moved); /* all-gather */
    if (many && one_host)
        CU_ASSERT(moved[0] > 0 && moved[2] == 0);
    relayout_checked(rows, cols, moved); /* all-to-all */
    if (many && one_host)
        CU_ASSERT(moved[0] > 0 && moved[2] == 0);
    relayout_checked(part, rep, moved); /* all-reduce */
    if (many && one_host)
        CU_ASSERT(moved[1] > 0 && moved[2] == 0);
    relayout_checked(part, rows, moved); /* reduce-scatter */
    if (many && one_host)
        CU_ASSERT(moved[1] > 0 && moved[2] == 0);
    dt_layout_destroy(rows);
    dt_layout_destroy(cols);
    dt_layout_destroy(rep);
    dt_layout_destroy(part);
    dt_mesh_destroy(m);
}

/* With the pool filled up, tensors come from the host pool; their boxes then go by MPI inside
 * the shm exchange, with the same values. */
static void test_memory_outside_a_full_pool_goes_by_mpi(void)
{
    void *held[4096];
    int nheld = 0;
    size_t chunk = (size_t)64 << 20;
    while (nheld < 4096) {
        if (dt__shm_alloc(chunk, &held[nheld])) {
            nheld++;
        } else if (chunk > 1) {
            chunk /= 2;
        } else {
            break;
        }
    }
    void *p = NULL;
    CU_ASSERT_FALSE(dt__shm_alloc(4096, &p));
    dt_mesh *m = line_mesh();
    dt_layout *rows = rl_layout2(m, "x", DT_UNSHARDED, NULL);
    dt_layout *rep = rl_layout2(m, DT_UNSHARDED, DT_UNSHARDED, NULL);
    dt_layout *part = rl_layout2(m, DT_UNSHARDED, DT_UNSHARDED, "x");
    uint64_t moved[3];
    relayout_checked(rows, rep, moved);
    if (dt_num_clients() > 1)
        CU_ASSERT(moved[2] > 0 && moved[0] == 0);
    relayout_checked(part, rows, moved);
    if (dt_num_clients() > 1)
        CU_ASSERT(moved[2] > 0 && moved[1] == 0);
    for (int i = 0; i < nheld; i++)
        CU_ASSERT_TRUE(dt__shm_free(held[i]));
    CU_ASSERT_TRUE(dt__shm_alloc(4096, &p));
    CU_ASSERT_TRUE(dt__shm_free(p));
    dt_layout_destroy(rows);
    dt_layout_destroy(rep);
    dt_layout_destroy(part);
    dt_mesh_destroy(m);
}

/* Client 1 stops (sleeps, answering nothing) while the others run an all-gather with a short
 * DT_COMM_TIMEOUT: they get DT_ERR_TIMEOUT naming client 1 as running but silent (its process
 * is there, so not "lost": a killed one is runtime_shm_kill's case). Last: the channels are
 * out of step afterwards. */
static void test_a_stopped_peer_gives_a_timeout_naming_it(void)
{
    if (dt_num_clients() < 2)
        return;
    dt_mesh *m = line_mesh();
    dt_layout *rows = rl_layout2(m, "x", DT_UNSHARDED, NULL);
    dt_layout *rep = rl_layout2(m, DT_UNSHARDED, DT_UNSHARDED, NULL);
    int64_t shape[2] = {dt_num_global_devices(DT_DEVICE_CPU) * 8, 96};
    dt_tensor *src = NULL, *dst = NULL;
    DT_ASSERT_OK(rl_make_tensor(rows, shape, DT_DTYPE_F32, 5, &src));
    setenv("DT_COMM_TIMEOUT", "0.5", 1);
    MPI_Barrier(dt__comm());
    if (dt_client_id() == 1) {
        sleep(5);
    } else {
        double t0 = dt__now_seconds();
        DT_ASSERT_FAILS(dt_relayout(src, rep, &dst), DT_ERR_TIMEOUT);
        /* Alive on this host but silent: 3 stalls of 0.5 s and their pings, then named. */
        DT_ASSERT_ERROR_MENTIONS("client(s) 1 (");
        DT_ASSERT_ERROR_MENTIONS("answer no ping");
        CU_ASSERT(dt__now_seconds() - t0 < 4.5);
    }
    unsetenv("DT_COMM_TIMEOUT");
    dt__watchdog_answer();
    MPI_Barrier(dt__comm());
    dt__watchdog_answer();
    dt_tensor_destroy(src);
    dt_layout_destroy(rows);
    dt_layout_destroy(rep);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_pool_is_up_and_chosen_for_host_memory),
        DT_TEST(test_tensor_memory_lies_in_the_mapping_peers_read),
        DT_TEST(test_no_shared_memory_name_is_left_behind),
        DT_TEST(test_relayouts_take_the_direct_path_and_give_the_reference_values),
        DT_TEST(test_memory_outside_a_full_pool_goes_by_mpi),
        DT_TEST(test_a_stopped_peer_gives_a_timeout_naming_it),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "runtime_shm", cases, 1);
}
