/* Hand-worked relayout cases: the bytes every device moves equal the minimum the two layouts
 * allow, pieces come from the nearest holder, copies to other meshes, relayout_into, errors. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "rl_test_util.h"

static int ndev(void)
{
    return dt_test_num_devices();
}

static dt_mesh *mesh_1d(void)
{
    const char *names[1] = {"x"};
    int64_t sizes[1] = {ndev()};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("line", 1, names, sizes, dt_test_device_type(), &m));
    return m;
}

static dt_layout *layout2(const dt_mesh *m, const char *a, const char *b, const char *partial)
{
    const char *specs[2] = {a, b};
    dt_reduce_op op = DT_REDUCE_SUM;
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(m, 2, specs, partial ? 1 : 0, &partial, &op, &l));
    return l;
}

/* Runs src_l -> dst_l on a [rows, cols] f32 tensor, checks the values, and checks every local
 * device's traffic: `recv` bytes received from other devices, `self` bytes kept in place. */
static void expect_traffic(const dt_layout *src_l, const dt_layout *dst_l, int64_t rows,
                           int64_t cols, uint64_t recv, uint64_t self)
{
    int64_t shape[2] = {rows, cols};
    dt_tensor *src = NULL, *dst = NULL;
    DT_ASSERT_OK(rl_make_tensor(src_l, shape, DT_DTYPE_F32, 7, &src));
    DT_ASSERT_OK(dt_relayout(src, dst_l, &dst));
    CU_ASSERT_EQUAL(rl_check_tensor(dst, src_l, 7), 0);
    dt_relayout_stats s[64];
    int n = 0;
    DT_ASSERT_OK(dt_relayout_last_stats(64, s, &n, NULL));
    CU_ASSERT_EQUAL(n, dt_test_num_local_devices());
    uint64_t total_sent = 0, total_recv = 0;
    for (int i = 0; i < n && i < 64; i++) {
        if (s[i].bytes_received != recv || s[i].bytes_self != self)
            fprintf(stderr, "device %d: received %llu self %llu, want %llu %llu\n",
                    s[i].device_id, (unsigned long long)s[i].bytes_received,
                    (unsigned long long)s[i].bytes_self, (unsigned long long)recv,
                    (unsigned long long)self);
        CU_ASSERT_EQUAL(s[i].bytes_received, recv);
        CU_ASSERT_EQUAL(s[i].bytes_self, self);
        total_sent += s[i].bytes_sent;
        total_recv += s[i].bytes_received;
    }
    /* Every byte received was sent by exactly one device: totals agree across the job. */
    long long sums[2] = {(long long)total_sent, (long long)total_recv}, all[2];
    MPI_Allreduce(sums, all, 2, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    CU_ASSERT_EQUAL(all[0], all[1]);
    dt_tensor_destroy(dst);
    dt_tensor_destroy(src);
}

static void test_relayout_volume_shard_moves_nothing(void)
{
    dt_mesh *m = mesh_1d();
    int64_t n = ndev();
    dt_layout *rep = layout2(m, DT_UNSHARDED, DT_UNSHARDED, NULL);
    dt_layout *sh = layout2(m, "x", DT_UNSHARDED, NULL);
    /* Rows 4n over n devices: each keeps its 4x3 block, nothing moves. */
    expect_traffic(rep, sh, 4 * n, 3, 0, 4 * 3 * 4);
    dt_layout_destroy(sh);
    dt_layout_destroy(rep);
    dt_mesh_destroy(m);
}

static void test_relayout_volume_unshard_is_allgather(void)
{
    dt_mesh *m = mesh_1d();
    int64_t n = ndev();
    dt_layout *rep = layout2(m, DT_UNSHARDED, DT_UNSHARDED, NULL);
    dt_layout *sh = layout2(m, "x", DT_UNSHARDED, NULL);
    /* Each device receives the n-1 blocks it lacks (4x3 f32 each) and keeps its own. */
    expect_traffic(sh, rep, 4 * n, 3, (uint64_t)(n - 1) * 48, 48);
    dt_layout_destroy(sh);
    dt_layout_destroy(rep);
    dt_mesh_destroy(m);
}

static void test_relayout_volume_shard_move_is_alltoall(void)
{
    dt_mesh *m = mesh_1d();
    int64_t n = ndev();
    dt_layout *rows = layout2(m, "x", DT_UNSHARDED, NULL);
    dt_layout *cols = layout2(m, DT_UNSHARDED, "x", NULL);
    /* [2n, 3n]: device q keeps the 2x3 corner it shares and receives one 2x3 piece from each
     * of the other n-1 devices. */
    expect_traffic(rows, cols, 2 * n, 3 * n, (uint64_t)(n - 1) * 24, 24);
    dt_layout_destroy(cols);
    dt_layout_destroy(rows);
    dt_mesh_destroy(m);
}

static void test_relayout_volume_partial_to_sharded_is_reduce_scatter(void)
{
    dt_mesh *m = mesh_1d();
    int64_t n = ndev();
    dt_layout *part = layout2(m, DT_UNSHARDED, DT_UNSHARDED, "x");
    dt_layout *sh = layout2(m, "x", DT_UNSHARDED, NULL);
    /* Device q receives the other n-1 summands of its 3x5 block. */
    expect_traffic(part, sh, 3 * n, 5, (uint64_t)(n - 1) * 60, 60);
    dt_layout_destroy(sh);
    dt_layout_destroy(part);
    dt_mesh_destroy(m);
}

static void test_relayout_volume_partial_to_replicated_is_allreduce(void)
{
    dt_mesh *m = mesh_1d();
    int64_t n = ndev();
    dt_layout *part = layout2(m, DT_UNSHARDED, DT_UNSHARDED, "x");
    dt_layout *rep = layout2(m, DT_UNSHARDED, DT_UNSHARDED, NULL);
    /* [3n, 5] f32: a reduce-scatter (n-1 summands of a 3x5 block in, own block kept) then an
     * all-gather (n-1 reduced blocks in, own kept): 2(n-1)/n of the tensor per device, the
     * minimum, not the (n-1) whole summands of fetching them all. */
    expect_traffic(part, rep, 3 * n, 5, (uint64_t)(2 * (n - 1)) * 60, 2 * 60);
    dt_layout_destroy(rep);
    dt_layout_destroy(part);
    dt_mesh_destroy(m);
}

/* Mesh (c = clients, d = devices per client): the d devices of a client differ only in d, so
 * data sharded over d and replicated over c is complete inside every client. Unsharding it
 * must take every piece from the same client: no byte crosses processes. */
static void test_relayout_takes_pieces_from_nearest_holder(void)
{
    int nc = dt_num_clients(), nd = dt_test_num_local_devices();
    const char *names[2] = {"c", "d"};
    int64_t sizes[2] = {nc, nd};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("hosts", 2, names, sizes, dt_test_device_type(), &m));
    dt_layout *sh = layout2(m, "d", DT_UNSHARDED, NULL);
    dt_layout *rep = layout2(m, DT_UNSHARDED, DT_UNSHARDED, NULL);
    expect_traffic(sh, rep, 2 * nd, 4, (uint64_t)(nd - 1) * 32, 32);
    dt_relayout_stats s[64];
    int n = 0;
    DT_ASSERT_OK(dt_relayout_last_stats(64, s, &n, NULL));
    for (int i = 0; i < n; i++) {
        CU_ASSERT_EQUAL(s[i].bytes_received_remote, 0);
        CU_ASSERT_EQUAL(s[i].bytes_sent_remote, 0);
    }
    dt_layout_destroy(rep);
    dt_layout_destroy(sh);
    dt_mesh_destroy(m);
}

static void test_copy_to_mesh_of_other_shape_and_subset(void)
{
    int64_t n = ndev();
    if (n < 4)
        return;
    dt_mesh *line = mesh_1d(), *grid = NULL, *half = NULL;
    const char *g_names[2] = {"a", "b"};
    int64_t g_sizes[2] = {2, n / 2};
    DT_ASSERT_OK(dt_mesh_create("grid", 2, g_names, g_sizes, dt_test_device_type(), &grid));
    const char *h_names[1] = {"h"};
    int64_t h_sizes[1] = {n / 2};
    DT_ASSERT_OK(dt_mesh_create("half", 1, h_names, h_sizes, dt_test_device_type(), &half));
    int64_t shape[2] = {7, 5};
    dt_layout *src_l = layout2(line, "x", DT_UNSHARDED, NULL);
    dt_layout *grid_l = layout2(grid, "b", "a", NULL);
    dt_layout *half_l = layout2(half, DT_UNSHARDED, "h", NULL);
    dt_tensor *src = NULL, *on_grid = NULL, *on_half = NULL, *back = NULL;
    DT_ASSERT_OK(rl_make_tensor(src_l, shape, DT_DTYPE_I64, 11, &src));
    DT_ASSERT_OK(dt_copy_to_mesh(src, grid_l, &on_grid));
    CU_ASSERT_EQUAL(rl_check_tensor(on_grid, src_l, 11), 0);
    /* Onto half of the devices, and back onto all of them. */
    DT_ASSERT_OK(dt_copy_to_mesh(on_grid, half_l, &on_half));
    CU_ASSERT_EQUAL(rl_check_tensor(on_half, src_l, 11), 0);
    DT_ASSERT_OK(dt_copy_to_mesh(on_half, src_l, &back));
    CU_ASSERT_EQUAL(rl_check_tensor(back, src_l, 11), 0);
    dt_tensor_destroy(back);
    dt_tensor_destroy(on_half);
    dt_tensor_destroy(on_grid);
    dt_tensor_destroy(src);
    dt_layout_destroy(half_l);
    dt_layout_destroy(grid_l);
    dt_layout_destroy(src_l);
    dt_mesh_destroy(half);
    dt_mesh_destroy(grid);
    dt_mesh_destroy(line);
}

static void test_copy_to_mesh_reduces_partial_source(void)
{
    int64_t n = ndev();
    dt_mesh *line = mesh_1d(), *other = NULL;
    const char *names[1] = {"y"};
    int64_t sizes[1] = {n};
    DT_ASSERT_OK(dt_mesh_create("other", 1, names, sizes, dt_test_device_type(), &other));
    int64_t shape[2] = {5, 3};
    dt_layout *part = layout2(line, DT_UNSHARDED, DT_UNSHARDED, "x");
    dt_layout *dst_l = layout2(other, DT_UNSHARDED, "y", NULL);
    dt_tensor *src = NULL, *dst = NULL;
    DT_ASSERT_OK(rl_make_tensor(part, shape, DT_DTYPE_F64, 3, &src));
    DT_ASSERT_OK(dt_copy_to_mesh(src, dst_l, &dst));
    CU_ASSERT_EQUAL(rl_check_tensor(dst, part, 3), 0);
    dt_tensor_destroy(dst);
    dt_tensor_destroy(src);
    dt_layout_destroy(dst_l);
    dt_layout_destroy(part);
    dt_mesh_destroy(other);
    dt_mesh_destroy(line);
}

static void test_relayout_into_reuses_destination(void)
{
    dt_mesh *m = mesh_1d();
    int64_t shape[2] = {9, 4};
    dt_layout *a = layout2(m, "x", DT_UNSHARDED, NULL), *b = layout2(m, DT_UNSHARDED, "x", NULL);
    dt_tensor *src = NULL, *dst = NULL;
    DT_ASSERT_OK(rl_make_tensor(a, shape, DT_DTYPE_BF16, 5, &src));
    DT_ASSERT_OK(dt_tensor_zeros(b, DT_DTYPE_BF16, shape, &dst));
    const void *before = dt_tensor_local(dst, 0)->data;
    DT_ASSERT_OK(dt_relayout_into(src, dst));
    CU_ASSERT_PTR_EQUAL(dt_tensor_local(dst, 0)->data, before);
    CU_ASSERT_EQUAL(rl_check_tensor(dst, a, 5), 0);
    DT_ASSERT_FAILS(dt_relayout_into(src, src), DT_ERR_INVALID_ARGUMENT);
    dt_tensor_destroy(dst);
    dt_tensor_destroy(src);
    dt_layout_destroy(b);
    dt_layout_destroy(a);
    dt_mesh_destroy(m);
}

static void test_relayout_avg_partial_divides_by_group_size(void)
{
    dt_mesh *m = mesh_1d();
    int64_t n = ndev(), shape[1] = {6};
    const char *spec[1] = {DT_UNSHARDED}, *pd[1] = {"x"};
    dt_reduce_op avg = DT_REDUCE_AVG;
    dt_layout *part = NULL, *rep = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(m, 1, spec, 1, pd, &avg, &part));
    DT_ASSERT_OK(dt_layout_replicated(m, 1, &rep));
    /* Summand on device p: element e holds 8*(p+1) + e; the average over n devices is
     * 8*(n+1)/2 + e, worked by hand. */
    int nl = dt_mesh_num_local_devices(m);
    double bufs[64][6];
    const void *comps[64];
    for (int k = 0; k < nl; k++) {
        int64_t p = dt_mesh_position(m, dt_mesh_local_device_id(m, k));
        for (int e = 0; e < 6; e++)
            bufs[k][e] = 8.0 * (double)(p + 1) + e;
        comps[k] = bufs[k];
    }
    dt_tensor *src = NULL, *dst = NULL;
    DT_ASSERT_OK(dt_test_pack_host(part, DT_DTYPE_F64, shape, comps, &src));
    DT_ASSERT_OK(dt_relayout(src, rep, &dst));
    for (int k = 0; k < nl; k++) {
        double *v = dt_test_local_get(dst, k);
        for (int e = 0; e < 6; e++)
            CU_ASSERT_EQUAL(v[e], 4.0 * (double)(n + 1) + e);
        free(v);
    }
    dt_tensor_destroy(dst);
    dt_tensor_destroy(src);
    dt_layout_destroy(rep);
    dt_layout_destroy(part);
    dt_mesh_destroy(m);
}

static void test_relayout_rejects_mismatches(void)
{
    dt_mesh *m = mesh_1d(), *other = NULL;
    const char *names[1] = {"y"};
    int64_t sizes[1] = {ndev()}, shape[2] = {4, 4};
    DT_ASSERT_OK(dt_mesh_create("other", 1, names, sizes, dt_test_device_type(), &other));
    dt_layout *a = layout2(m, "x", DT_UNSHARDED, NULL), *b = NULL, *c = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 1, &b));
    DT_ASSERT_OK(dt_layout_replicated(other, 2, &c));
    dt_tensor *src = NULL, *dst = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(a, DT_DTYPE_F32, shape, &src));
    DT_ASSERT_FAILS(dt_relayout(src, b, &dst), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("rank");
    DT_ASSERT_FAILS(dt_relayout(src, c, &dst), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("dt_copy_to_mesh");
    CU_ASSERT_PTR_NULL(dst);
    dt_tensor_destroy(src);
    dt_layout_destroy(c);
    dt_layout_destroy(b);
    dt_layout_destroy(a);
    dt_mesh_destroy(other);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_relayout_volume_shard_moves_nothing),
        DT_TEST(test_relayout_volume_unshard_is_allgather),
        DT_TEST(test_relayout_volume_shard_move_is_alltoall),
        DT_TEST(test_relayout_volume_partial_to_sharded_is_reduce_scatter),
        DT_TEST(test_relayout_volume_partial_to_replicated_is_allreduce),
        DT_TEST(test_relayout_takes_pieces_from_nearest_holder),
        DT_TEST(test_copy_to_mesh_of_other_shape_and_subset),
        DT_TEST(test_copy_to_mesh_reduces_partial_source),
        DT_TEST(test_relayout_into_reuses_destination),
        DT_TEST(test_relayout_avg_partial_divides_by_group_size),
        DT_TEST(test_relayout_rejects_mismatches),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "relayout_cases", cases);
}
