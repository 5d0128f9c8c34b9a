/* Meshes that leave clients out (issue 45, docs/mesh.md "Clients outside a mesh"): every client
 * gets the same answer from dt_mesh_num_clients and dt_mesh_check_clients; a client outside a
 * mesh gets DT_OK and no component from the calls on it, and a clear message from the local
 * calls that name a component; and a collective whose argument is bad on one client only
 * (dt_restore, dt_zero_create) fails on every client with that client's message. Run with 1
 * process of 8 CPU devices and 2 and 4 processes of 2 each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "harness.h"

/* Devices per client (the harness gives every client the same number). */
static int per_client(void)
{
    return dt_num_global_devices(DT_DEVICE_CPU) / dt_num_clients();
}

/* A 1-D CPU mesh "x" of `size` devices (ids 0..size-1: the first clients' devices). */
static dt_mesh *line_mesh(const char *name, int64_t size)
{
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(name, 1, (const char *const[]){"x"}, &size, DT_DEVICE_CPU, &m));
    return m;
}

/* The quickstart's mistake: a mesh of one client's worth of devices under several clients. */
static void test_a_mesh_on_client_0_alone_is_refused_alike_on_every_client(void)
{
    int n = dt_num_clients();
    dt_mesh *m = line_mesh("train", per_client());
    CU_ASSERT_EQUAL(dt_mesh_num_clients(m), 1);
    CU_ASSERT_EQUAL(dt_mesh_num_local_devices(m), dt_client_id() == 0 ? per_client() : 0);
    if (n == 1) {
        DT_ASSERT_OK(dt_mesh_check_clients(m));
    } else {
        DT_ASSERT_FAILS(dt_mesh_check_clients(m), DT_ERR_DEVICE_MISMATCH);
        char want[256];
        snprintf(want, sizeof want,
                 "mesh 'train' has %d CPU devices, held by 1 of the %d "
                 "clients: client%s 1",
                 per_client(), n, n == 2 ? "" : "s");
        DT_ASSERT_ERROR_MENTIONS(want);
        /* The same text on every client: compare with client 0's. */
        char mine[1024] = {0}, first[1024] = {0};
        snprintf(mine, sizeof mine, "%s", dt_last_error());
        memcpy(first, mine, sizeof first);
        MPI_Bcast(first, (int)sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
        CU_ASSERT_STRING_EQUAL(mine, first);
    }
    dt_mesh_destroy(m);

    /* Every device, so every client: accepted everywhere. */
    m = line_mesh("all", dt_num_global_devices(DT_DEVICE_CPU));
    CU_ASSERT_EQUAL(dt_mesh_num_clients(m), n);
    DT_ASSERT_OK(dt_mesh_check_clients(m));
    dt_mesh_destroy(m);
}

/* A mesh on the first half of the clients (all of them when there is one): the others get
 * DT_OK and no component from every call on it, and the mesh's clients get the right values. */
static void test_a_client_outside_the_mesh_gets_ok_and_no_components(void)
{
    int n = dt_num_clients(), me = dt_client_id();
    int k = n > 1 ? n / 2 : 1, inside = me < k;
    int64_t size = (int64_t)k * per_client(), shape[1] = {size * 3};
    dt_mesh *m = line_mesh("half", size);
    CU_ASSERT_EQUAL(dt_mesh_num_clients(m), k);
    CU_ASSERT_EQUAL(dt_mesh_num_local_devices(m), inside ? per_client() : 0);
    DT_ASSERT_OK(dt_mesh_check_devices(m));
    dt_layout *rows = NULL, *all = NULL;
    DT_ASSERT_OK(dt_layout_create(m, 1, (const char *const[]){"x"}, &rows));
    DT_ASSERT_OK(dt_layout_replicated(m, 1, &all));

    dt_tensor *t = NULL, *whole = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(rows, DT_DTYPE_F32, shape, &t));
    CU_ASSERT_EQUAL(dt_tensor_num_local(t), inside ? per_client() : 0);
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        float v[3];
        for (int e = 0; e < 3; e++)
            v[e] = (float)(dt_tensor_local_offset(t, i)[0] + e);
        DT_ASSERT_OK(dt_tensor_local_write(t, i, v, sizeof v));
    }
    DT_ASSERT_OK(dt_relayout(t, all, &whole)); /* collective over the mesh's clients only */
    DT_ASSERT_OK(dt_barrier(m, "half", 0.0));
    CU_ASSERT_EQUAL(dt_tensor_num_local(whole), inside ? per_client() : 0);
    dt_tensor *twice = NULL; /* an op: t + t, sharded as t */
    DT_ASSERT_OK(dt_add(t, t, NULL, &twice));
    CU_ASSERT_EQUAL(dt_tensor_num_local(twice), inside ? per_client() : 0);
    for (int i = 0; i < dt_tensor_num_local(twice); i++) {
        float v[3];
        DT_ASSERT_OK(dt_tensor_local_read(twice, i, v, sizeof v));
        for (int e = 0; e < 3; e++)
            CU_ASSERT_EQUAL(v[e], 2.0f * (float)(dt_tensor_local_offset(twice, i)[0] + e));
    }
    dt_tensor_destroy(twice);
    float *buf = calloc((size_t)shape[0], sizeof *buf);
    CU_ASSERT_FATAL(buf != NULL);
    if (inside) {
        DT_ASSERT_OK(
            dt_tensor_local_read(whole, per_client() - 1, buf, (size_t)shape[0] * sizeof *buf));
        for (int64_t e = 0; e < shape[0]; e++)
            CU_ASSERT_EQUAL(buf[e], (float)e);
    } else {
        DT_ASSERT_FAILS(dt_tensor_local_read(whole, 0, buf, (size_t)shape[0] * sizeof *buf),
                        DT_ERR_INVALID_ARGUMENT);
        char want[160];
        snprintf(want, sizeof want,
                 "component 0: this client (%d) holds no device of the "
                 "tensor's mesh 'half' (its %lld devices are on %d of the %d clients)",
                 me, (long long)size, k, n);
        DT_ASSERT_ERROR_MENTIONS(want);
        DT_ASSERT_FAILS(dt_tensor_local_write(t, 0, buf, 12), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("holds no device of the tensor's mesh 'half'");
    }

    /* Save and restore: DT_OK everywhere, the values back on the mesh's clients. */
    char dir[512], ck[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    const char *names[1] = {"w"};
    DT_ASSERT_OK(dt_save(m, ck, 1, names, (const dt_tensor *const[]){t}, NULL));
    /* An outside client's restore reads the index for the shapes and dtypes, without
     * waiting for the mesh's clients: the checkpoint must be there first. */
    MPI_Barrier(MPI_COMM_WORLD);
    dt_tensor *back = NULL;
    DT_ASSERT_OK(dt_restore(m, ck, 1, names, (const dt_layout *const[]){all}, &back));
    CU_ASSERT_EQUAL(dt_tensor_num_local(back), inside ? per_client() : 0);
    if (inside) {
        memset(buf, 0, (size_t)shape[0] * sizeof *buf);
        DT_ASSERT_OK(dt_tensor_local_read(back, 0, buf, (size_t)shape[0] * sizeof *buf));
        for (int64_t e = 0; e < shape[0]; e++)
            CU_ASSERT_EQUAL(buf[e], (float)e);
    }
    dt_tensor_destroy(back);
    dt_test_scratch_remove(dir);

    free(buf);
    dt_tensor_destroy(whole);
    dt_tensor_destroy(t);
    dt_layout_destroy(all);
    dt_layout_destroy(rows);
    dt_mesh_destroy(m);
}

/* The last client passes a bad name to dt_save and dt_save_async, a bad step to dt_save_step,
 * then to dt_restore a layout on another mesh, a NULL name and a directory without a
 * checkpoint, and to dt_restore_into a NULL target: each time every client fails with its
 * message (before, it alone returned and the others waited for it in the call's agreement). */
static void test_save_and_restore_with_a_bad_argument_on_one_client_fail_on_every_client(void)
{
    int n = dt_num_clients(), me = dt_client_id(), last = n - 1;
    dt_mesh *m = line_mesh("all", dt_num_global_devices(DT_DEVICE_CPU));
    dt_mesh *other = line_mesh("other", 1);
    dt_layout *rep = NULL, *elsewhere = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 1, &rep));
    DT_ASSERT_OK(dt_layout_replicated(other, 1, &elsewhere));
    dt_tensor *t = NULL, *back = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(rep, DT_DTYPE_F32, (const int64_t[]){4}, &t));
    char dir[512], ck[600], want[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    const char *names[1] = {"w"}, *null_name[1] = {NULL};
    DT_ASSERT_OK(dt_save(m, ck, 1, names, (const dt_tensor *const[]){t}, NULL));
    char who[32];
    snprintf(who, sizeof who, "client %d: ", last);

    /* dt_save alike: a name bad on the last client alone, then a step below 0 there. */
    char other_dir[600];
    snprintf(other_dir, sizeof other_dir, "%s/ck2", dir);
    const char *bad_name[1] = {""};
    DT_ASSERT_FAILS(dt_save(m, other_dir, 1, me == last ? bad_name : names,
                            (const dt_tensor *const[]){t}, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    if (me != last) {
        DT_ASSERT_ERROR_MENTIONS(who);
    }
    dt_save_request *req = NULL;
    DT_ASSERT_FAILS(dt_save_async(m, other_dir, 1, me == last ? bad_name : names,
                                  (const dt_tensor *const[]){t}, NULL, &req),
                    DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(req);
    if (me != last) {
        DT_ASSERT_ERROR_MENTIONS(who);
    }
    DT_ASSERT_FAILS(dt_save_step(m, other_dir, me == last ? -1 : 1, NULL, 1, names,
                                 (const dt_tensor *const[]){t}, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    if (me != last) {
        DT_ASSERT_ERROR_MENTIONS(who);
    }

    const dt_layout *mine = me == last ? elsewhere : rep;
    DT_ASSERT_FAILS(dt_restore(m, ck, 1, names, &mine, &back), DT_ERR_INVALID_ARGUMENT);
    snprintf(want, sizeof want, "%sdt_restore: tensor 'w' is not on the mesh",
             me == last ? "" : who);
    DT_ASSERT_ERROR_MENTIONS(want);
    CU_ASSERT_PTR_NULL(back);

    DT_ASSERT_FAILS(dt_restore(m, ck, 1, me == last ? null_name : names,
                               (const dt_layout *const[]){rep}, &back),
                    DT_ERR_INVALID_ARGUMENT);
    snprintf(want, sizeof want, "%sdt_restore: NULL name or layout 0", me == last ? "" : who);
    DT_ASSERT_ERROR_MENTIONS(want);

    char nowhere[600];
    snprintf(nowhere, sizeof nowhere, "%s/not-a-checkpoint", dir);
    DT_ASSERT_FAILS(
        dt_restore(m, me == last ? nowhere : ck, 1, names, (const dt_layout *const[]){rep}, &back),
        DT_ERR_NOT_FOUND);
    if (me != last) {
        DT_ASSERT_ERROR_MENTIONS(who);
    }
    CU_ASSERT_PTR_NULL(back);

    /* dt_restore_into with a NULL target on the last client alone. */
    dt_tensor *target = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(rep, DT_DTYPE_F32, (const int64_t[]){4}, &target));
    dt_tensor *const targets[2] = {target, me == last ? NULL : target};
    DT_ASSERT_FAILS(dt_restore_into(ck, 2, (const char *const[]){"w", "w"}, targets),
                    DT_ERR_INVALID_ARGUMENT);
    snprintf(want, sizeof want, "%sdt_restore_into: NULL name or layout 1", me == last ? "" : who);
    DT_ASSERT_ERROR_MENTIONS(want);
    dt_tensor_destroy(target);

    /* The clients are still in step: a good restore works on all of them. */
    DT_ASSERT_OK(dt_restore(m, ck, 1, names, (const dt_layout *const[]){rep}, &back));
    dt_tensor_destroy(back);
    dt_test_scratch_remove(dir);
    dt_tensor_destroy(t);
    dt_layout_destroy(elsewhere);
    dt_layout_destroy(rep);
    dt_mesh_destroy(other);
    dt_mesh_destroy(m);
}

/* The last client asks for stage 7, then for a dp dim the mesh lacks: every client fails with
 * its message (before, it alone returned and the others waited in the creation's collective). */
static void test_zero_create_with_bad_options_on_one_client_fails_on_every_client(void)
{
    int n = dt_num_clients(), me = dt_client_id(), last = n - 1;
    dt_mesh *m = NULL;
    int64_t size = dt_num_global_devices(DT_DEVICE_CPU);
    DT_ASSERT_OK(dt_mesh_create("dp", 1, (const char *const[]){"batch"}, &size, DT_DEVICE_CPU, &m));
    char who[32], want[256];
    snprintf(who, sizeof who, "client %d: ", last);
    dt_zero_opts opts = DT_ZERO_OPTS_INIT;
    dt_zero *z = NULL;
    if (me == last)
        opts.stage = 7;
    DT_ASSERT_FAILS(dt_zero_create(m, &opts, &z), DT_ERR_INVALID_ARGUMENT);
    snprintf(want, sizeof want, "%sdt_zero_create: stage 7 (0, 1, 2 or 3 expected)",
             me == last ? "" : who);
    DT_ASSERT_ERROR_MENTIONS(want);
    CU_ASSERT_PTR_NULL(z);

    dt_zero_opts opts2 = DT_ZERO_OPTS_INIT;
    if (me == last)
        opts2.dp_dim = "data";
    DT_ASSERT_FAILS(dt_zero_create(m, &opts2, &z), DT_ERR_INVALID_ARGUMENT);
    snprintf(want, sizeof want, "%sdt_zero_create: dp_dim 'data' is not a dimension of the mesh",
             me == last ? "" : who);
    DT_ASSERT_ERROR_MENTIONS(want);
    CU_ASSERT_PTR_NULL(z);

    /* Still in step: good options make an optimizer on every client. */
    dt_zero_opts good = DT_ZERO_OPTS_INIT;
    DT_ASSERT_OK(dt_zero_create(m, &good, &z));
    dt_zero_destroy(z);
    dt_mesh_destroy(m);
}

static dt_status fill_index(void *arg, int64_t index, void *const *fields)
{
    (void)arg;
    if (fields[0])
        *(float *)fields[0] = (float)index;
    return DT_OK;
}

/* The last client asks for global_batch 0: every client fails with its message (before, it
 * alone returned and the others waited in the creation's agreement). */
static void test_dataset_create_with_bad_options_on_one_client_fails_on_every_client(void)
{
    int n = dt_num_clients(), me = dt_client_id(), last = n - 1;
    dt_mesh *m = line_mesh("all", dt_num_global_devices(DT_DEVICE_CPU));
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(m, 1, (const char *const[]){"x"}, &l));
    const dt_data_field field = {DT_DTYPE_F32, 0, {0}};
    dt_data_source *src = NULL;
    DT_ASSERT_OK(dt_data_source_callback(64, 1, &field, fill_index, NULL, &src));
    dt_dataset_opts opts = DT_DATASET_OPTS_INIT;
    opts.global_batch = me == last ? 0 : dt_num_global_devices(DT_DEVICE_CPU);
    dt_dataset *ds = NULL;
    DT_ASSERT_FAILS(dt_dataset_create(src, 1, (const dt_layout *const[]){l}, &opts, &ds),
                    DT_ERR_INVALID_ARGUMENT);
    char who[32], want[128];
    snprintf(who, sizeof who, "client %d: ", last);
    snprintf(want, sizeof want, "%sdt_dataset_create: bad options (global_batch 0 >= 1",
             me == last ? "" : who);
    DT_ASSERT_ERROR_MENTIONS(want);
    CU_ASSERT_PTR_NULL(ds);

    /* Still in step: good options make the dataset on every client. */
    opts.global_batch = dt_num_global_devices(DT_DEVICE_CPU);
    DT_ASSERT_OK(dt_dataset_create(src, 1, (const dt_layout *const[]){l}, &opts, &ds));
    dt_dataset_destroy(ds);
    dt_data_source_destroy(src);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

/* An optimizer on a mesh of the first half of the clients: made there, refused with a clear
 * message on the others (it keeps state per device), without their waiting for anyone. */
static void test_zero_create_outside_its_mesh_says_the_client_holds_no_device(void)
{
    int n = dt_num_clients(), me = dt_client_id(), k = n > 1 ? n / 2 : 1;
    dt_mesh *m = NULL;
    int64_t size = (int64_t)k * per_client();
    DT_ASSERT_OK(
        dt_mesh_create("half", 1, (const char *const[]){"batch"}, &size, DT_DEVICE_CPU, &m));
    dt_zero *z = NULL;
    if (me < k) {
        DT_ASSERT_OK(dt_zero_create(m, NULL, &z));
    } else {
        DT_ASSERT_FAILS(dt_zero_create(m, NULL, &z), DT_ERR_STATE);
        char want[128];
        snprintf(want, sizeof want, "this client (%d) holds no device of mesh 'half'", me);
        DT_ASSERT_ERROR_MENTIONS(want);
    }
    dt_zero_destroy(z);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_a_mesh_on_client_0_alone_is_refused_alike_on_every_client),
        DT_TEST(test_a_client_outside_the_mesh_gets_ok_and_no_components),
        DT_TEST(test_save_and_restore_with_a_bad_argument_on_one_client_fail_on_every_client),
        DT_TEST(test_zero_create_with_bad_options_on_one_client_fails_on_every_client),
        DT_TEST(test_dataset_create_with_bad_options_on_one_client_fails_on_every_client),
        DT_TEST(test_zero_create_outside_its_mesh_says_the_client_holds_no_device),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "mesh_clients", cases, 1);
}
