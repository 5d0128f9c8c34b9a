/* What dt_topology reports (binding off, as the harness sets it): counts against the OS, host
 * clients against every rank's host name. */
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static void test_topology_counts_are_positive_and_ordered(void)
{
    dt_topology_info t;
    DT_ASSERT_OK(dt_topology(&t));
    CU_ASSERT(t.packages >= 1);
    CU_ASSERT(t.numa_nodes >= 1);
    CU_ASSERT(t.cores >= t.packages);
    CU_ASSERT(t.pus >= t.cores);
    CU_ASSERT(t.numa_nodes <= t.pus);
    CU_ASSERT(t.gpus >= 0);
}

static void test_topology_pus_match_the_os(void)
{
    dt_topology_info t;
    cpu_set_t mask;
    DT_ASSERT_OK(dt_topology(&t));
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int allowed = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : -1;
    /* All online CPUs, or the subset this container may use (hwloc drops the others). */
    if (t.pus != online && t.pus != allowed)
        fprintf(stderr, "pus %d, online %ld, allowed %d\n", t.pus, online, allowed);
    CU_ASSERT(t.pus == online || t.pus == allowed);
}

static void test_topology_unbound_when_binding_is_off(void)
{
    dt_topology_info t;
    DT_ASSERT_OK(dt_topology(&t));
    CU_ASSERT_EQUAL(t.bound, 0);
    CU_ASSERT_STRING_EQUAL(t.cpuset, "");
}

static void test_topology_host_clients_match_the_host_names(void)
{
    dt_topology_info t;
    char host[64] = "";
    int n = 0, me = 0;
    DT_ASSERT_OK(dt_topology(&t));
    gethostname(host, sizeof host - 1);
    CU_ASSERT_STRING_EQUAL(t.hostname, host);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    char *all = calloc((size_t)n, sizeof host);
    CU_ASSERT_FATAL(all != NULL);
    MPI_Allgather(t.hostname, (int)sizeof host, MPI_CHAR, all, (int)sizeof host, MPI_CHAR,
                  MPI_COMM_WORLD);
    /* Clients on my host, and how many of them come before me in rank order. */
    int same = 0, before = 0;
    for (int r = 0; r < n; r++) {
        if (strcmp(all + r * sizeof host, t.hostname) == 0) {
            same++;
            before += r < me;
        }
    }
    CU_ASSERT_EQUAL(t.host_clients, same);
    CU_ASSERT_EQUAL(t.host_rank, before);
    free(all);
}

static void test_topology_rejects_null_output(void)
{
    DT_ASSERT_FAILS(dt_topology(NULL), DT_ERR_INVALID_ARGUMENT);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_topology_counts_are_positive_and_ordered),
        DT_TEST(test_topology_pus_match_the_os),
        DT_TEST(test_topology_unbound_when_binding_is_off),
        DT_TEST(test_topology_host_clients_match_the_host_names),
        DT_TEST(test_topology_rejects_null_output),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "runtime_topology", cases, 1);
}
