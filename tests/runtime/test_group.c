/* The runtime's communication groups (runtime/group.h): one cached group per set of a mesh's
 * clients, and agreement on one outcome that carries the failing client's status and message
 * to every client, checked against the text each client expects from the failing one. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "mesh/mesh_group.h"
#include "runtime/error.h"

/* A 1-D CPU mesh over the first `clients` clients' devices (ids are client-ordered). */
static dt_mesh *mesh_over(int clients, const char *name)
{
    int64_t n = 0;
    for (int d = 0; d < dt_num_global_devices(DT_DEVICE_CPU); d++)
        n += dt_device_client(DT_DEVICE_CPU, d) < clients;
    const char *dims[1] = {"x"};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(name, 1, dims, &n, DT_DEVICE_CPU, &m));
    return m;
}

static const dt__group *group_of(const dt_mesh *m)
{
    const dt__group *g = NULL;
    DT_ASSERT_OK(dt__mesh_group(m, &g));
    CU_ASSERT_PTR_NOT_NULL_FATAL(g);
    return g;
}

/* Every client learns f's failure: f keeps its own text, the others get it after "client f: ". */
static void check_failure_of(const dt__group *g, int f)
{
    char text[128], want[160];
    snprintf(text, sizeof text, "disk %d full at /ckpt/step_%d", f, 10 + f);
    dt_status st = DT_OK;
    if (dt_client_id() == f)
        st = dt__error(DT_ERR_IO, "%s", text);
    dt_status got = dt__group_agree(g, st, "test agree");
    CU_ASSERT_EQUAL(got, DT_ERR_IO);
    if (dt_client_id() == f)
        snprintf(want, sizeof want, "%s", text);
    else
        snprintf(want, sizeof want, "client %d: %s", f, text);
    if (strcmp(dt_last_error(), want) != 0)
        fprintf(stderr, "[client %d] got '%s', want '%s'\n", dt_client_id(), dt_last_error(),
                want);
    CU_ASSERT_STRING_EQUAL(dt_last_error(), want);
}

static void test_group_failure_on_one_client_reaches_every_client_with_its_message(void)
{
    dt_mesh *m = mesh_over(dt_num_clients(), "all");
    const dt__group *g = group_of(m);
    for (int f = 0; f < dt_num_clients(); f++)
        check_failure_of(g, f);
    dt_mesh_destroy(m);
}

static void test_group_lowest_failing_client_wins_on_every_client(void)
{
    int n = dt_num_clients(), me = dt_client_id();
    dt_mesh *m = mesh_over(n, "all");
    const dt__group *g = group_of(m);
    /* Every client but 0 fails, each with its own status and text: client 1's (the lowest
     * failing) reaches all of them, client 0 included. */
    dt_status st = DT_OK;
    if (me > 0)
        st = dt__error(me % 2 ? DT_ERR_PARSE : DT_ERR_SHAPE, "bad line %d", me);
    dt_status got = dt__group_agree(g, st, "test agree");
    if (n == 1) {
        CU_ASSERT_EQUAL(got, DT_OK);
    } else {
        CU_ASSERT_EQUAL(got, DT_ERR_PARSE);
        CU_ASSERT_STRING_EQUAL(dt_last_error(), me == 1 ? "bad line 1" : "client 1: bad line 1");
    }
    dt_mesh_destroy(m);
}

static void test_group_success_everywhere_agrees_on_ok(void)
{
    dt_mesh *m = mesh_over(dt_num_clients(), "all");
    CU_ASSERT_EQUAL(dt__group_agree(group_of(m), DT_OK, "test agree"), DT_OK);
    dt_mesh_destroy(m);
}

static void test_group_is_cached_and_shared_by_meshes_over_the_same_clients(void)
{
    int n = dt_num_clients();
    dt_mesh *a = mesh_over(n, "a");
    int64_t sizes[2] = {1, dt_num_global_devices(DT_DEVICE_CPU)};
    const char *dims[2] = {"p", "q"};
    dt_mesh *b = NULL;
    DT_ASSERT_OK(dt_mesh_create("b", 2, dims, sizes, DT_DEVICE_CPU, &b));
    const dt__group *ga = group_of(a), *gb = group_of(b);
    CU_ASSERT_PTR_EQUAL(ga, gb);
    CU_ASSERT_PTR_EQUAL(group_of(a), ga);
    CU_ASSERT_EQUAL(ga->size, n);
    CU_ASSERT_EQUAL(ga->rank, dt_client_id());
    int size = 0, cmp = MPI_UNEQUAL;
    MPI_Comm_size(ga->comm, &size);
    CU_ASSERT_EQUAL(size, n);
    for (int r = 0; r < ga->size; r++)
        CU_ASSERT_EQUAL(ga->clients[r], r);
    MPI_Comm_compare(ga->comm, MPI_COMM_WORLD, &cmp);
    CU_ASSERT(cmp == MPI_CONGRUENT); /* all clients in world order, a communicator of its own */
    dt_mesh_destroy(a);
    dt_mesh_destroy(b);
}

static void test_group_of_a_mesh_on_some_clients_leaves_the_others_out(void)
{
    int n = dt_num_clients(), me = dt_client_id();
    if (n < 2)
        return; /* needs a client outside the mesh */
    int k = n / 2; /* the mesh's clients: 0..k-1 */
    dt_mesh *m = mesh_over(k, "half");
    const dt__group *g = group_of(m);
    if (me >= k) {
        CU_ASSERT(g->comm == MPI_COMM_NULL);
        CU_ASSERT_EQUAL(g->size, 0);
        /* Outside: the status is returned as it is, without communicating. */
        CU_ASSERT_EQUAL(dt__group_agree(g, DT_ERR_IO, "test agree"), DT_ERR_IO);
    } else {
        CU_ASSERT_EQUAL(g->size, k);
        CU_ASSERT_EQUAL(g->rank, me);
        for (int f = 0; f < k; f++)
            check_failure_of(g, f);
    }
    dt_mesh_destroy(m);
}

static void test_group_duplicate_has_its_own_communicator_and_agrees_alike(void)
{
    dt_mesh *m = mesh_over(dt_num_clients(), "all");
    const dt__group *g = group_of(m);
    dt__group d;
    DT_ASSERT_OK(dt__group_dup(g, &d));
    int cmp = MPI_IDENT;
    MPI_Comm_compare(d.comm, g->comm, &cmp);
    CU_ASSERT(cmp == MPI_CONGRUENT);
    CU_ASSERT_EQUAL(d.size, g->size);
    CU_ASSERT_EQUAL(d.rank, g->rank);
    for (int r = 0; r < d.size; r++)
        CU_ASSERT_EQUAL(d.clients[r], g->clients[r]);
    check_failure_of(&d, dt_num_clients() - 1);
    dt__group_free(&d);
    CU_ASSERT(d.comm == MPI_COMM_NULL);
    /* The cached group is untouched. */
    check_failure_of(g, 0);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_group_failure_on_one_client_reaches_every_client_with_its_message),
        DT_TEST(test_group_lowest_failing_client_wins_on_every_client),
        DT_TEST(test_group_success_everywhere_agrees_on_ok),
        DT_TEST(test_group_is_cached_and_shared_by_meshes_over_the_same_clients),
        DT_TEST(test_group_of_a_mesh_on_some_clients_leaves_the_others_out),
        DT_TEST(test_group_duplicate_has_its_own_communicator_and_agrees_alike),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "runtime_group", cases, 1);
}
