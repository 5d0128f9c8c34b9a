/* Core binding, turned on (the program calls dt_init itself with DT_BIND unset): each client
 * is bound to its share of its host's cores, inside the allowed set, and dt_finalize restores
 * the binding it found. The expected share is worked out here from hwloc's core list. */
#include <hwloc.h>
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static cpu_set_t before_init; /* this process's CPUs before dt_init */

/* Parses a list such as "0-3,8,10-11" into a cpu_set_t; 0 on success. */
static int parse_list(const char *s, cpu_set_t *set)
{
    CPU_ZERO(set);
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s || a < 0)
            return -1;
        s = end;
        if (*s == '-') {
            b = strtol(s + 1, &end, 10);
            if (end == s + 1 || b < a)
                return -1;
            s = end;
        }
        for (long i = a; i <= b && i < CPU_SETSIZE; i++)
            CPU_SET((int)i, set);
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return 0;
}

/* Independent reference: the PUs of cores [first, first + count) in hwloc's logical order,
 * where the share is an equal contiguous split, or core host_rank % ncores when there are
 * more clients than cores. */
static void expected_share(int clients, int rank, cpu_set_t *set)
{
    hwloc_topology_t topo;
    CPU_ZERO(set);
    hwloc_topology_init(&topo);
    hwloc_topology_load(topo);
    int ncores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE), first, count;
    if (ncores >= clients) {
        /* Client r gets cores [r*ncores/clients ...) with the remainder spread from the front:
         * walk the clients and hand them out. */
        first = 0;
        count = 0;
        for (int r = 0; r <= rank; r++) {
            first += count;
            count = ncores / clients + (r < ncores % clients ? 1 : 0);
        }
    } else {
        first = rank % ncores;
        count = 1;
    }
    for (int i = first; i < first + count; i++) {
        hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, (unsigned)i);
        for (int pu = (int)hwloc_bitmap_first(core->cpuset); pu >= 0;
             pu = hwloc_bitmap_next(core->cpuset, (unsigned)pu))
            CPU_SET(pu, set);
    }
    hwloc_topology_destroy(topo);
}

static void test_bind_puts_each_client_on_its_share_of_cores(void)
{
    dt_init_opts o = DT_INIT_OPTS_INIT; /* bind_cores = 1 */
    dt_topology_info t;
    cpu_set_t bound, now, want;
    DT_ASSERT_OK(dt_init(NULL, NULL, &o));
    DT_ASSERT_OK(dt_topology(&t));
    CU_ASSERT_EQUAL_FATAL(sched_getaffinity(0, sizeof now, &now), 0);
    /* Binding may fail without being an error only where this process cannot set it. */
    if (sched_setaffinity(0, sizeof now, &now) != 0) {
        CU_ASSERT_EQUAL(t.bound, 0);
        return;
    }
    CU_ASSERT_EQUAL_FATAL(t.bound, 1);
    CU_ASSERT_EQUAL_FATAL(parse_list(t.cpuset, &bound), 0);
    CU_ASSERT(CPU_COUNT(&bound) > 0);
    /* Inside what the process was allowed before. */
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &bound))
            CU_ASSERT(CPU_ISSET(c, &before_init));
    /* The OS agrees: the process runs where dt_topology says. */
    CU_ASSERT(CPU_EQUAL(&now, &bound));
    expected_share(t.host_clients, t.host_rank, &want);
    if (!CPU_EQUAL(&want, &bound))
        fprintf(stderr, "[rank %d] bound to %s, expected another set\n", dt_client_id(),
                t.cpuset);
    CU_ASSERT(CPU_EQUAL(&want, &bound));
}

static void test_bind_shares_of_one_host_are_disjoint_and_cover_the_cores(void)
{
    dt_topology_info t;
    int n = dt_num_clients();
    DT_ASSERT_OK(dt_topology(&t));
    cpu_set_t mine, *all = calloc((size_t)n, sizeof *all);
    char *hosts = calloc((size_t)n, sizeof t.hostname);
    CU_ASSERT_FATAL(all && hosts);
    CPU_ZERO(&mine);
    if (t.bound) /* else the previous case said why; still take part in the gathers */
        parse_list(t.cpuset, &mine);
    MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                  MPI_COMM_WORLD);
    MPI_Allgather(t.hostname, (int)sizeof t.hostname, MPI_CHAR, hosts, (int)sizeof t.hostname,
                  MPI_CHAR, MPI_COMM_WORLD);
    cpu_set_t cover;
    CPU_ZERO(&cover);
    for (int r = 0; r < n; r++) {
        if (strcmp(hosts + r * sizeof t.hostname, t.hostname) != 0)
            continue;
        CPU_OR(&cover, &cover, &all[r]);
        if (r != dt_client_id() && t.host_clients <= t.cores) {
            cpu_set_t both;
            CPU_AND(&both, &all[r], &mine);
            CU_ASSERT_EQUAL(CPU_COUNT(&both), 0);
        }
    }
    /* Every core of the host is someone's (with more clients than cores, several share). */
    if (t.bound)
        CU_ASSERT_EQUAL(CPU_COUNT(&cover), t.pus);
    free(hosts);
    free(all);
}

static void test_finalize_restores_the_binding_found_at_init(void)
{
    cpu_set_t now;
    dt_finalize();
    CU_ASSERT_EQUAL(sched_getaffinity(0, sizeof now, &now), 0);
    CU_ASSERT(CPU_EQUAL(&now, &before_init));
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_bind_puts_each_client_on_its_share_of_cores),
        DT_TEST(test_bind_shares_of_one_host_are_disjoint_and_cover_the_cores),
        DT_TEST(test_finalize_restores_the_binding_found_at_init),
        DT_TEST_END,
    };
    unsetenv("DT_BIND"); /* the test environment turns binding off; this program wants it */
    sched_getaffinity(0, sizeof before_init, &before_init);
    return dt_test_main(argc, argv, "runtime_bind", cases, 0);
}
