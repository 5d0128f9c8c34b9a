/* Stage meshes and stage-to-stage transfers: the stage meshes of a pipe=P mesh, a tensor sent
 * from stage 0 to stage 1 and back arriving intact shard by shard (checked against the values
 * computed from the global index), messages told apart by tag, the byte counts, a shard of
 * the wrong size, values shared across stages, and bad arguments. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "dtensor/pipeline.h"
#include "runtime/shm.h"

static dt_mesh *pipe_mesh(int P)
{
    const char *names[2] = {"pipe", "batch"};
    int64_t sizes[2] = {P, dt_test_num_devices() / P};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("pm", 2, names, sizes, dt_test_device_type(), &m));
    return m;
}

/* Element (i, j) of the test tensor: exact in f32. */
static float value(int64_t i, int64_t j, int salt) { return (float)(i * 100 + j + salt * 7); }

static dt_tensor *make_tensor(const dt_mesh *m, int64_t rows, int64_t cols, int salt)
{
    const char *specs[2] = {"batch", "unsharded"};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(m, 2, specs, &l));
    int64_t shape[2] = {rows, cols};
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_F32, shape, &t));
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *dl = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        int64_t r = dl->shape[0], c = dl->shape[1];
        float *h = malloc((size_t)(r * c > 0 ? r * c : 1) * sizeof *h);
        for (int64_t a = 0; a < r; a++)
            for (int64_t b = 0; b < c; b++)
                h[a * c + b] = value(off[0] + a, off[1] + b, salt);
        dt_test_local_set(t, i, h);
        free(h);
    }
    dt_layout_destroy(l);
    return t;
}

/* Every element of every local shard of t is value(i, j, salt). */
static int holds_values(const dt_tensor *t, int salt)
{
    int ok = 1;
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *dl = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        float *h = dt_test_local_get(t, i);
        for (int64_t a = 0; a < dl->shape[0]; a++)
            for (int64_t b = 0; b < dl->shape[1]; b++)
                ok &= h[a * dl->shape[1] + b] == value(off[0] + a, off[1] + b, salt);
        free(h);
    }
    return ok;
}

static void test_stage_meshes_hold_the_devices_of_each_pipe_coordinate(void)
{
    for (int P = 1; P <= 2; P++) {
        dt_mesh *m = pipe_mesh(P);
        dt_pipe *p = NULL;
        DT_ASSERT_OK(dt_pipe_create(m, "pipe", &p));
        CU_ASSERT_EQUAL(dt_pipe_num_stages(p), P);
        int64_t per = dt_test_num_devices() / P;
        for (int s = 0; s < P; s++) {
            const dt_mesh *sm = dt_pipe_stage_mesh(p, s);
            CU_ASSERT_EQUAL_FATAL(dt_mesh_rank(sm), 1);
            CU_ASSERT_STRING_EQUAL(dt_mesh_dim_name(sm, 0), "batch");
            CU_ASSERT_EQUAL(dt_mesh_dim_size(sm, 0), per);
            CU_ASSERT_EQUAL(dt_mesh_device_type(sm), dt_test_device_type());
            for (int64_t q = 0; q < per; q++)
                CU_ASSERT_EQUAL(dt_mesh_device_id(sm, q), dt_mesh_device_id(m, s * per + q));
            int holds = 0;
            for (int64_t q = 0; q < per; q++)
                holds |= dt_device_client(dt_test_device_type(), dt_mesh_device_id(sm, q)) ==
                         dt_client_id();
            CU_ASSERT_EQUAL(dt_pipe_holds_stage(p, s), holds);
        }
        char want[16];
        snprintf(want, sizeof want, "pm.stage%d", P - 1);
        CU_ASSERT_STRING_EQUAL(dt_mesh_name(dt_pipe_stage_mesh(p, P - 1)), want);
        CU_ASSERT_PTR_NULL(dt_pipe_stage_mesh(p, P));
        dt_pipe_destroy(p);
        dt_mesh_destroy(m);
    }
}

/* Stage 0 sends two tensors (tags 1 and 2); stage 1 receives them in the other order, then
 * sends the first back to stage 0. */
static void test_tensors_cross_between_stages_intact_and_by_tag(void)
{
    dt_mesh *m = pipe_mesh(2);
    dt_pipe *p = NULL;
    DT_ASSERT_OK(dt_pipe_create(m, "pipe", &p));
    const dt_mesh *m0 = dt_pipe_stage_mesh(p, 0), *m1 = dt_pipe_stage_mesh(p, 1);
    int64_t rows = 2 * dt_mesh_size(m0) + 1, cols = 5; /* uneven shards */
    if (dt_pipe_holds_stage(p, 0)) {
        dt_tensor *a = make_tensor(m0, rows, cols, 1), *b = make_tensor(m0, rows, cols, 2);
        DT_ASSERT_OK(dt_pipe_send(p, 0, 1, a, 1));
        DT_ASSERT_OK(dt_pipe_send(p, 0, 1, b, 2));
        dt_tensor_destroy(a); /* the data were copied out */
        dt_tensor_destroy(b);
    }
    const char *specs[2] = {"batch", "unsharded"};
    dt_layout *l1 = NULL, *l0 = NULL;
    DT_ASSERT_OK(dt_layout_create(m1, 2, specs, &l1));
    DT_ASSERT_OK(dt_layout_create(m0, 2, specs, &l0));
    int64_t shape[2] = {rows, cols};
    dt_tensor *got2 = NULL, *got1 = NULL, *back = NULL;
    DT_ASSERT_OK(dt_pipe_recv(p, 0, 1, l1, DT_DTYPE_F32, shape, 2, &got2));
    DT_ASSERT_OK(dt_pipe_recv(p, 0, 1, l1, DT_DTYPE_F32, shape, 1, &got1));
    CU_ASSERT_EQUAL(got1 != NULL, dt_pipe_holds_stage(p, 1));
    if (got1) {
        CU_ASSERT(holds_values(got1, 1));
        CU_ASSERT(holds_values(got2, 2));
        DT_ASSERT_OK(dt_pipe_send(p, 1, 0, got1, 9));
    }
    DT_ASSERT_OK(dt_pipe_recv(p, 1, 0, l0, DT_DTYPE_F32, shape, 9, &back));
    if (back)
        CU_ASSERT(holds_values(back, 1));
    DT_ASSERT_OK(dt_pipe_flush(p));

    /* The counts: what this client's devices sent and received. */
    dt_pipe_stats ps;
    DT_ASSERT_OK(dt_pipe_get_stats(p, &ps));
    uint64_t mine0 = 0, mine1 = 0;
    for (int i = 0; back && i < dt_tensor_num_local(back); i++)
        mine0 += dt_test_local_bytes(back, i);
    for (int i = 0; got1 && i < dt_tensor_num_local(got1); i++)
        mine1 += dt_test_local_bytes(got1, i);
    CU_ASSERT_EQUAL(ps.bytes_sent, 2 * mine0 + mine1);
    CU_ASSERT_EQUAL(ps.bytes_received, 2 * mine1 + mine0);
    if (!(dt_pipe_holds_stage(p, 0) && dt_pipe_holds_stage(p, 1)))
        CU_ASSERT_EQUAL(ps.bytes_sent_remote, ps.bytes_sent); /* each stage on its own clients */
    if (dt_num_clients() == 1)
        CU_ASSERT_EQUAL(ps.bytes_sent_remote, 0);
    /* One host: with the shm pool up every remote shard was copied out of its sender's
     * segment (DT_TRANSPORT=mpi keeps the pool down: all by MPI). */
    CU_ASSERT_EQUAL(ps.bytes_received_shm, dt__shm_up() ? ps.bytes_received_remote : 0);
    CU_ASSERT_EQUAL(ps.messages_received, (got1 ? 2 : 0) + (back ? 1 : 0));
    dt_pipe_reset_stats(p);
    DT_ASSERT_OK(dt_pipe_get_stats(p, &ps));
    CU_ASSERT_EQUAL(ps.bytes_sent, 0);

    dt_tensor_destroy(got1);
    dt_tensor_destroy(got2);
    dt_tensor_destroy(back);
    dt_layout_destroy(l0);
    dt_layout_destroy(l1);
    dt_pipe_destroy(p);
    dt_mesh_destroy(m);
}

/* A sender whose shm pool is full sends the shard after its descriptor by MPI: the same
 * values arrive, none of them through the segment. */
static void test_a_full_shm_pool_sends_the_shard_by_mpi(void)
{
    dt_mesh *m = pipe_mesh(2);
    dt_pipe *p = NULL;
    DT_ASSERT_OK(dt_pipe_create(m, "pipe", &p));
    int both = dt_pipe_holds_stage(p, 0) && dt_pipe_holds_stage(p, 1);
    const dt_mesh *m0 = dt_pipe_stage_mesh(p, 0), *m1 = dt_pipe_stage_mesh(p, 1);
    int64_t rows = 2 * dt_mesh_size(m0) + 1, cols = 64;
    void **held = NULL;
    int nheld = 0, cap = 0;
    if (dt_pipe_holds_stage(p, 0)) {
        dt_tensor *a = make_tensor(m0, rows, cols, 3);
        /* Fill the own segment: blocks of 1 MiB, 4 KiB, then 64 bytes, until none fits. */
        for (size_t size = 1u << 20; !both && size >= 64;
             size = size > 4096 ? 4096 : size > 64 ? 64 : 0) {
            void *b = NULL;
            while (dt__shm_alloc(size, &b)) {
                if (nheld == cap) {
                    cap = cap ? 2 * cap : 1024;
                    held = realloc(held, (size_t)cap * sizeof *held);
                    CU_ASSERT_PTR_NOT_NULL_FATAL(held);
                }
                held[nheld++] = b;
            }
        }
        DT_ASSERT_OK(dt_pipe_send(p, 0, 1, a, 4));
        dt_tensor_destroy(a);
        for (int i = 0; i < nheld; i++)
            dt__shm_free(held[i]);
        free(held);
    }
    const char *specs[2] = {"batch", "unsharded"};
    dt_layout *l1 = NULL;
    DT_ASSERT_OK(dt_layout_create(m1, 2, specs, &l1));
    int64_t shape[2] = {rows, cols};
    dt_tensor *got = NULL;
    DT_ASSERT_OK(dt_pipe_recv(p, 0, 1, l1, DT_DTYPE_F32, shape, 4, &got));
    if (got)
        CU_ASSERT(holds_values(got, 3));
    DT_ASSERT_OK(dt_pipe_flush(p));
    dt_pipe_stats ps;
    DT_ASSERT_OK(dt_pipe_get_stats(p, &ps));
    CU_ASSERT_EQUAL(ps.bytes_received_shm, 0);
    dt_tensor_destroy(got);
    dt_layout_destroy(l1);
    dt_pipe_destroy(p);
    dt_mesh_destroy(m);
}

/* A receiver expecting larger shards than were sent gets DT_ERR_SHAPE, not garbage. */
static void test_a_shard_of_the_wrong_size_is_a_shape_error(void)
{
    dt_mesh *m = pipe_mesh(2);
    dt_pipe *p = NULL;
    DT_ASSERT_OK(dt_pipe_create(m, "pipe", &p));
    const dt_mesh *m0 = dt_pipe_stage_mesh(p, 0), *m1 = dt_pipe_stage_mesh(p, 1);
    int64_t rows = 2 * dt_mesh_size(m0);
    if (dt_pipe_holds_stage(p, 0)) {
        dt_tensor *a = make_tensor(m0, rows, 3, 0);
        DT_ASSERT_OK(dt_pipe_send(p, 0, 1, a, 5));
        dt_tensor_destroy(a);
    }
    const char *specs[2] = {"batch", "unsharded"};
    dt_layout *l1 = NULL;
    DT_ASSERT_OK(dt_layout_create(m1, 2, specs, &l1));
    int64_t shape[2] = {rows, 4};
    dt_tensor *got = NULL;
    if (dt_pipe_holds_stage(p, 1))
        DT_ASSERT_FAILS(dt_pipe_recv(p, 0, 1, l1, DT_DTYPE_F32, shape, 5, &got), DT_ERR_SHAPE);
    CU_ASSERT_PTR_NULL(got);
    DT_ASSERT_OK(dt_pipe_flush(p));
    dt_layout_destroy(l1);
    dt_pipe_destroy(p);
    dt_mesh_destroy(m);
}

/* Values held by the stages' clients reach every client, inf and NaN included (an overflow
 * seen on one stage is seen by all). */
static void test_shared_values_reach_every_stage(void)
{
    dt_mesh *m = pipe_mesh(2);
    dt_pipe *p = NULL;
    DT_ASSERT_OK(dt_pipe_create(m, "pipe", &p));
    int stage_of[4] = {0, 1, 1, 0};
    double want[4] = {1.5, -2.25, INFINITY, NAN}, v[4];
    for (int i = 0; i < 4; i++)
        v[i] = dt_pipe_holds_stage(p, stage_of[i]) ? want[i] : 12345.0; /* garbage elsewhere */
    DT_ASSERT_OK(dt_pipe_share_values(p, 4, stage_of, v));
    CU_ASSERT_EQUAL(v[0], 1.5);
    CU_ASSERT_EQUAL(v[1], -2.25);
    CU_ASSERT(isinf(v[2]) && v[2] > 0);
    CU_ASSERT(isnan(v[3]));
    int bad[1] = {2};
    DT_ASSERT_FAILS(dt_pipe_share_values(p, 1, bad, v), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(dt_pipe_share_values(p, 0, NULL, NULL));
    dt_pipe_destroy(p);
    dt_mesh_destroy(m);
}

static void test_bad_arguments_give_statuses(void)
{
    dt_mesh *m = pipe_mesh(2);
    dt_pipe *p = NULL;
    DT_ASSERT_FAILS(dt_pipe_create(m, "model", &p), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "model"));
    DT_ASSERT_FAILS(dt_pipe_create(NULL, "pipe", &p), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(p);
    DT_ASSERT_OK(dt_pipe_create(m, "pipe", &p));
    const dt_mesh *m0 = dt_pipe_stage_mesh(p, 0);
    const char *specs[2] = {"batch", "unsharded"};
    dt_layout *l0 = NULL;
    DT_ASSERT_OK(dt_layout_create(m0, 2, specs, &l0));
    int64_t shape[2] = {4, 4};
    dt_tensor *out = NULL;
    DT_ASSERT_FAILS(dt_pipe_recv(p, 0, 0, l0, DT_DTYPE_F32, shape, 1, &out),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_pipe_recv(p, 1, 2, l0, DT_DTYPE_F32, shape, 1, &out),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_pipe_recv(p, 1, 0, l0, DT_DTYPE_F32, shape, 40000, &out),
                    DT_ERR_INVALID_ARGUMENT);
    if (dt_pipe_holds_stage(p, 1)) /* a layout of stage 0 for stage 1 */
        DT_ASSERT_FAILS(dt_pipe_recv(p, 0, 1, l0, DT_DTYPE_F32, shape, 1, &out),
                        DT_ERR_INVALID_ARGUMENT);
    if (dt_pipe_holds_stage(p, 0)) {
        dt_tensor *a = make_tensor(m0, 4, 4, 0);
        DT_ASSERT_FAILS(dt_pipe_send(p, 1, 0, a, 1), dt_pipe_holds_stage(p, 1)
                                                         ? DT_ERR_INVALID_ARGUMENT
                                                         : DT_OK);
        DT_ASSERT_FAILS(dt_pipe_send(p, 0, 0, a, 1), DT_ERR_INVALID_ARGUMENT);
        dt_tensor_destroy(a);
    }
    CU_ASSERT_PTR_NULL(out);
    DT_ASSERT_FAILS(dt_pipe_get_stats(p, NULL), DT_ERR_INVALID_ARGUMENT);
    dt_layout_destroy(l0);
    dt_pipe_destroy(p);
    dt_pipe_destroy(NULL);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_stage_meshes_hold_the_devices_of_each_pipe_coordinate),
        DT_TEST(test_tensors_cross_between_stages_intact_and_by_tag),
        DT_TEST(test_a_full_shm_pool_sends_the_shard_by_mpi),
        DT_TEST(test_a_shard_of_the_wrong_size_is_a_shape_error),
        DT_TEST(test_shared_values_reach_every_stage),
        DT_TEST(test_bad_arguments_give_statuses),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "pipe_p2p", cases);
}
