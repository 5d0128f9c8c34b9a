/* Relayouts across hosts: on a mesh {host: H, local: L} whose `local` lines each lie on one
 * host, an all-reduce, a reduce-scatter and an all-gather over `host` give the right values
 * and move across hosts exactly the minimum the layouts allow, summed over the job's devices:
 * all-reduce 2(H-1)S, reduce-scatter and all-gather (H-1)S for a tensor of S bytes. H is
 * found here from the processes' host names (MPI, not the library); on one host nothing
 * crosses. Under tests/multihost these run on 2 hosts. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "rl_test_util.h"

/* Number of distinct hosts, if the processes fill them in rank order (each host's ranks
 * contiguous, the same count on each); 0 otherwise. */
static int count_hosts(void)
{
    int n = 0, me = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    char mine[256] = "", all[64][256];
    if (n > 64)
        return 0;
    gethostname(mine, sizeof mine - 1);
    MPI_Allgather(mine, 256, MPI_CHAR, all, 256, MPI_CHAR, MPI_COMM_WORLD);
    int hosts = 1;
    for (int r = 1; r < n; r++)
        if (strcmp(all[r], all[r - 1]) != 0)
            hosts++;
    for (int r = 0; r < n; r++)  /* contiguous and even */
        if (n % hosts != 0 || strcmp(all[r], all[(r / (n / hosts)) * (n / hosts)]) != 0)
            return 0;
    return hosts;
}

static dt_mesh *host_mesh(int hosts)
{
    const char *names[2] = {"host", "local"};
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    int64_t sizes[2] = {hosts, n / hosts};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("hosts", 2, names, sizes, DT_DEVICE_CPU, &m));
    return m;
}

/* Runs src_l -> dst_l on a [rows, cols] f32 tensor, checks the values and that the bytes
 * received across hosts, summed over the job, equal `cross`; and that every byte counted as
 * crossing hosts also crossed processes. */
static void expect_cross(const dt_layout *src_l, const dt_layout *dst_l, int64_t rows,
                         int64_t cols, uint64_t cross)
{
    int64_t shape[2] = {rows, cols};
    dt_tensor *src = NULL, *dst = NULL;
    DT_ASSERT_OK(rl_make_tensor(src_l, shape, DT_DTYPE_F32, 11, &src));
    DT_ASSERT_OK(dt_relayout(src, dst_l, &dst));
    CU_ASSERT_EQUAL(rl_check_tensor(dst, src_l, 11), 0);
    dt_relayout_stats s[64];
    int n = 0;
    DT_ASSERT_OK(dt_relayout_last_stats(64, s, &n, NULL));
    long long mine[2] = {0, 0}, all[2];
    for (int i = 0; i < n && i < 64; i++) {
        mine[0] += (long long)s[i].bytes_received_cross_host;
        mine[1] += (long long)s[i].bytes_sent_cross_host;
        CU_ASSERT(s[i].bytes_received_cross_host <= s[i].bytes_received_remote);
        CU_ASSERT(s[i].bytes_sent_cross_host <= s[i].bytes_sent_remote);
    }
    MPI_Allreduce(mine, all, 2, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if ((uint64_t)all[0] != cross && dt_client_id() == 0)
        fprintf(stderr, "received across hosts: %lld bytes, want %llu\n", all[0],
                (unsigned long long)cross);
    CU_ASSERT_EQUAL((uint64_t)all[0], cross);
    CU_ASSERT_EQUAL(all[0], all[1]);
    dt_tensor_destroy(dst);
    dt_tensor_destroy(src);
}

typedef struct hosts_case {
    int hosts;
    dt_mesh *mesh;
    int64_t rows, cols;
    uint64_t bytes;  /* S: the whole tensor */
} hosts_case;

static int setup(hosts_case *c)
{
    c->hosts = count_hosts();
    if (c->hosts == 0 || dt_num_global_devices(DT_DEVICE_CPU) % c->hosts != 0)
        return 0;
    c->mesh = host_mesh(c->hosts);
    int64_t local = dt_num_global_devices(DT_DEVICE_CPU) / c->hosts;
    c->rows = 4 * c->hosts * local;
    c->cols = 3 * c->hosts * local;
    c->bytes = (uint64_t)(c->rows * c->cols) * 4;
    return 1;
}

static void test_allreduce_across_hosts_crosses_the_minimum(void)
{
    hosts_case c;
    if (!setup(&c))
        return;
    dt_layout *part = rl_layout2(c.mesh, DT_UNSHARDED, DT_UNSHARDED, "host");
    dt_layout *rep = rl_layout2(c.mesh, DT_UNSHARDED, DT_UNSHARDED, NULL);
    /* Each host needs the other hosts' sums of its 1/H of the tensor, then the other (H-1)/H
     * reduced: 2(H-1)/H S per host. */
    expect_cross(part, rep, c.rows, c.cols, 2 * (uint64_t)(c.hosts - 1) * c.bytes);
    dt_layout_destroy(rep);
    dt_layout_destroy(part);
    dt_mesh_destroy(c.mesh);
}

static void test_reduce_scatter_across_hosts_crosses_the_minimum(void)
{
    hosts_case c;
    if (!setup(&c))
        return;
    dt_layout *part = rl_layout2(c.mesh, DT_UNSHARDED, DT_UNSHARDED, "host");
    dt_layout *sh = rl_layout2(c.mesh, "host", DT_UNSHARDED, NULL);
    /* Each host needs the other H-1 summands of its own 1/H block. */
    expect_cross(part, sh, c.rows, c.cols, (uint64_t)(c.hosts - 1) * c.bytes);
    dt_layout_destroy(sh);
    dt_layout_destroy(part);
    dt_mesh_destroy(c.mesh);
}

static void test_allgather_across_hosts_sends_each_byte_once_per_host(void)
{
    hosts_case c;
    if (!setup(&c))
        return;
    dt_layout *sh = rl_layout2(c.mesh, "host", DT_UNSHARDED, NULL);
    dt_layout *rep = rl_layout2(c.mesh, DT_UNSHARDED, DT_UNSHARDED, NULL);
    /* Each host receives the (H-1)/H of the tensor it lacks, once. */
    expect_cross(sh, rep, c.rows, c.cols, (uint64_t)(c.hosts - 1) * c.bytes);
    dt_layout_destroy(rep);
    dt_layout_destroy(sh);
    dt_mesh_destroy(c.mesh);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_allreduce_across_hosts_crosses_the_minimum),
        DT_TEST(test_reduce_scatter_across_hosts_crosses_the_minimum),
        DT_TEST(test_allgather_across_hosts_sends_each_byte_once_per_host),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "relayout_hosts", cases, 1);
}
