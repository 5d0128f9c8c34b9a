/* The relayout planner at scale, through the simulation entry point (dt__rl_plan_build_as:
 * the plan as one client of a simulated device table; nothing moves). Its plans must equal
 * the former all-pairs planner's (dt__rl_plan_build_ref) piece by piece, for every client of
 * random tables (devices per client, clients per host) and random layouts on the same and on
 * different meshes; and at 1024 devices its work (pairs and holders examined) must stay
 * proportional to the client's own pieces, where the reference's grows as N^2. The regular
 * pattern check, read from facts cached on the mesh per table, must take the collective path
 * exactly where a brute-force check of the table says so. */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "rl_plan_cmp.h"
#include "rl_test_util.h"

static dt_layout *random_layout(rl_rng *r, const dt_mesh *m, int rank, int partial,
                                dt_reduce_op op)
{
    dt_layout *l = NULL;
    DT_ASSERT_OK(rl_random_layout(r, m, rank, partial, op, &l));
    return l;
}

static dt_mesh *make_mesh(int rank, const int64_t *sizes, dt_device_type type)
{
    static const char *names[3] = {"x", "y", "z"};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("sim", rank, names, sizes, type, &m));
    return m;
}

static void test_plans_equal_the_reference_for_every_client_of_random_tables(void)
{
    static const int64_t shapes[][3] = {{12}, {3, 4}, {2, 6}, {2, 3, 2}, {2, 3, 4}, {6},
                                        {4, 2}, {24}};
    static const int ranks[] = {1, 2, 2, 3, 3, 1, 2, 1};
    static const dt_reduce_op ops[] = {DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_AVG};
    enum { NMESH = 8 };
    dt_mesh *meshes[NMESH], *gpu = make_mesh(2, shapes[1], DT_DEVICE_GPU);
    for (int i = 0; i < NMESH; i++)
        meshes[i] = make_mesh(ranks[i], shapes[i], DT_DEVICE_CPU);
    rl_rng rng = {7};
    int64_t bad = 0, plans = 0;
    for (int t = 0; t < 240; t++) {
        /* Mostly one mesh (relayout), else two (copy_to_mesh, kept partials by name). */
        int a = (int)rl_below(&rng, NMESH), b = rl_below(&rng, 3) ? a : (int)rl_below(&rng, NMESH);
        dt_mesh *sm = meshes[a], *dm = t % 17 == 0 ? gpu : meshes[b];
        int rank = (int)rl_below(&rng, 4);
        int64_t shape[DT_MAX_RANK];
        for (int d = 0; d < rank; d++)
            shape[d] = rl_below(&rng, 14); /* uneven, smaller than the mesh, empty */
        dt_reduce_op op = ops[rl_below(&rng, 3)];
        dt_layout *src = random_layout(&rng, sm, rank, 1, op);
        dt_layout *dst = random_layout(&rng, dm, rank, (int)rl_below(&rng, 2), op);
        int64_t ndev = dt_mesh_size(sm) > dt_mesh_size(dm) ? dt_mesh_size(sm) : dt_mesh_size(dm);
        dt__rl_sim sim = {0};
        sim.devices_per_client = 1 + (int)rl_below(&rng, 3);
        sim.nclients = (int)((ndev + sim.devices_per_client - 1) / sim.devices_per_client);
        sim.clients_per_host = rl_below(&rng, 2) ? sim.nclients : 1 + (int)rl_below(&rng, 3);
        for (sim.me = 0; sim.me < sim.nclients; sim.me++) {
            char what[160], sa[512], da[512];
            dt_layout_format(src, sa, sizeof sa);
            dt_layout_format(dst, da, sizeof da);
            snprintf(what, sizeof what, "trial %d, client %d of %d (%d devices, %d per host)",
                     t, sim.me, sim.nclients, sim.devices_per_client, sim.clients_per_host);
            int64_t n = rl_plan_compare(src, dst, rank, shape, DT_DTYPE_F32, &sim, what, NULL,
                                        NULL, NULL);
            if (n)
                fprintf(stderr, "  from %s\n  to   %s\n", sa, da);
            bad += n;
            plans++;
        }
        dt_layout_destroy(src);
        dt_layout_destroy(dst);
    }
    printf("\n  %lld plans compared\n", (long long)plans);
    CU_ASSERT_EQUAL(bad, 0);
    for (int i = 0; i < NMESH; i++)
        dt_mesh_destroy(meshes[i]);
    dt_mesh_destroy(gpu);
}

/* One 1024-device case: the plan of client `me` equals the reference's, and the planner's
 * work stays within a small multiple of its pieces while the reference's is about N^2. */
static void check_1024(const char *name, const dt_layout *src, const dt_layout *dst,
                       const int64_t *shape, int clients_per_host)
{
    dt__rl_sim sim = {1024, 1, clients_per_host, 517};
    uint64_t work = 0, ref_work = 0;
    size_t pieces = 0;
    int64_t bad = rl_plan_compare(src, dst, 2, shape, DT_DTYPE_F32, &sim, name, &work, &pieces,
                                  &ref_work);
    printf("\n  %s: %zu pieces, work %llu (reference %llu)", name, pieces,
           (unsigned long long)work, (unsigned long long)ref_work);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(pieces > 0);
    CU_ASSERT(work <= 8 * (uint64_t)(pieces + 1));
    CU_ASSERT(ref_work >= 1024 * 1024 / 8);
}

static void test_a_1024_device_plan_examines_a_few_pairs_per_own_piece(void)
{
    int64_t one[1] = {1024}, two[2] = {8, 128}, shape[2] = {4096, 4096};
    dt_mesh *m1 = make_mesh(1, one, DT_DEVICE_CPU), *m2 = make_mesh(2, two, DT_DEVICE_CPU);
    dt_layout *rows = rl_layout2(m1, "x", DT_UNSHARDED, NULL);
    dt_layout *cols = rl_layout2(m1, DT_UNSHARDED, "x", NULL);
    dt_layout *xy = rl_layout2(m2, "x", "y", NULL);
    dt_layout *y = rl_layout2(m2, DT_UNSHARDED, "y", NULL);
    dt_layout *py = rl_layout2(m2, DT_UNSHARDED, "y", "x");
    check_1024("all-to-all", rows, cols, shape, 1024);
    check_1024("all-to-all, 8 clients per host", rows, cols, shape, 8);
    check_1024("all-gather over x", xy, y, shape, 1024);
    check_1024("reduce-scatter over x", py, xy, shape, 16);
    printf("\n");
    dt_layout_destroy(rows);
    dt_layout_destroy(cols);
    dt_layout_destroy(xy);
    dt_layout_destroy(y);
    dt_layout_destroy(py);
    dt_mesh_destroy(m1);
    dt_mesh_destroy(m2);
}

/* Whether an all-gather along mesh dim m may run as collectives in a simulated table, worked
 * out here by brute force: position p is device p, client p / dpc, host client / cph; every
 * client's devices share one coordinate along m, and every line along m lies on one host. */
static int lines_apply_brute(const dt_mesh *mesh, int m, const dt__rl_sim *sim)
{
    int64_t size = dt_mesh_size(mesh);
    int rank = dt_mesh_rank(mesh);
    for (int64_t p = 0; p < size; p++)
        for (int64_t q = 0; q < size; q++) {
            int64_t cp[3], cq[3];
            dt_mesh_coords(mesh, p, cp);
            dt_mesh_coords(mesh, q, cq);
            int same_line = 1;
            for (int j = 0; j < rank; j++)
                same_line &= j == m || cp[j] == cq[j];
            int64_t clp = p / sim->devices_per_client, clq = q / sim->devices_per_client;
            if (clp == clq && cp[m] != cq[m])
                return 0;
            if (same_line && clp / sim->clients_per_host != clq / sim->clients_per_host)
                return 0;
        }
    return 1;
}

/* The pattern check reads facts cached on the mesh per simulated table (mesh/mesh_facts.c):
 * long-lived meshes planned under tables in random order (more tables than cache slots) take
 * the collective path exactly where the brute-force answer says so, for every dim. */
static void test_cached_mesh_facts_give_the_brute_force_answer_under_every_table(void)
{
    static const int64_t shapes[][3] = {{12}, {3, 4}, {2, 6}, {2, 3, 2}, {4, 2}, {6, 4}};
    static const int ranks[] = {1, 2, 2, 3, 2, 2};
    enum { NMESH = 6 };
    static const char *dim_names[3] = {"x", "y", "z"};
    dt_mesh *meshes[NMESH];
    for (int i = 0; i < NMESH; i++)
        meshes[i] = make_mesh(ranks[i], shapes[i], DT_DEVICE_CPU);
    rl_rng rng = {11};
    int coll = 0, pieces = 0, wrong = 0;
    for (int t = 0; t < 400; t++) {
        int i = (int)rl_below(&rng, NMESH), m = (int)rl_below(&rng, ranks[i]);
        dt_mesh *mesh = meshes[i];
        dt__rl_sim sim = {0};
        static const int dpcs[] = {1, 1, 2, 3, 4, 6};
        sim.devices_per_client = dpcs[rl_below(&rng, 6)];
        sim.nclients = (int)((dt_mesh_size(mesh) + sim.devices_per_client - 1) /
                             sim.devices_per_client);
        sim.clients_per_host = rl_below(&rng, 2) ? sim.nclients : 1 + (int)rl_below(&rng, 4);
        sim.me = (int)rl_below(&rng, sim.nclients);
        const char *src_spec[1] = {dim_names[m]}, *dst_spec[1] = {DT_UNSHARDED};
        dt_layout *src = NULL, *dst = NULL;
        DT_ASSERT_OK(dt_layout_create(mesh, 1, src_spec, &src));
        DT_ASSERT_OK(dt_layout_create(mesh, 1, dst_spec, &dst));
        int64_t shape[1] = {24 * dt_mesh_dim_size(mesh, m)};
        rl_plan *p = NULL;
        DT_ASSERT_OK(dt__rl_plan_build_as(src, dst, 1, shape, DT_DTYPE_F32, &sim, &p));
        int want = lines_apply_brute(mesh, m, &sim), got = p && p->coll != NULL;
        if (got != want) {
            fprintf(stderr, "  mesh %d dim %d, %d per client, %d per host: %s, expected %s\n",
                    i, m, sim.devices_per_client, sim.clients_per_host,
                    got ? "collective" : "pieces", want ? "collective" : "pieces");
            wrong++;
        }
        coll += got;
        pieces += !got;
        dt__rl_plan_free(p);
        dt_layout_destroy(src);
        dt_layout_destroy(dst);
    }
    printf("\n  %d collective, %d pieces\n", coll, pieces);
    CU_ASSERT_EQUAL(wrong, 0);
    CU_ASSERT(coll > 40 && pieces > 40);   /* both answers were exercised */
    for (int i = 0; i < NMESH; i++)
        dt_mesh_destroy(meshes[i]);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_plans_equal_the_reference_for_every_client_of_random_tables),
        DT_TEST(test_a_1024_device_plan_examines_a_few_pairs_per_own_piece),
        DT_TEST(test_cached_mesh_facts_give_the_brute_force_answer_under_every_table),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "relayout_plan_scale", cases, 0);
}
