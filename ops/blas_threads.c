/* How many threads OpenBLAS runs: the cores this process may use shared among the clients of
 * its host and the CPU workers computing at once in each (at least one each), so that
 * processes, workers and BLAS threads do not fight for cores; left to the user when
 * OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set. */
#include <cblas.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "dtensor/runtime.h"
#include "ops/ops_impl.h"
#include "runtime/comm.h"
#include "runtime/workers.h"

/* The worker lanes the count was set for (0: not set since the runtime came up). Set again
 * when the lanes change (dt__workers_configure), never while BLAS runs on a worker: ops call
 * this before they fork (dt__ops_each_local). */
static _Atomic int set_for;

int dt__blas_threads_for(int cores, int clients_on_host, int workers)
{
    if (clients_on_host < 1)
        clients_on_host = 1;
    if (workers < 1)
        workers = 1;
    int t = cores / (clients_on_host * workers);
    return t < 1 ? 1 : t;
}

void dt__blas_threads_once(void)
{
    int lanes = dt__workers_lanes();
    int have = atomic_load_explicit(&set_for, memory_order_acquire);
    if (have == lanes || !dt_is_initialized())
        return;
    if (!atomic_compare_exchange_strong(&set_for, &have, lanes))
        return;
    const char *env = getenv("OPENBLAS_NUM_THREADS");
    const char *omp = getenv("OMP_NUM_THREADS");
    if ((env && *env) || (omp && *omp))
        return;
    int mine = 0, me = dt__client_host(dt_client_id());
    for (int c = 0; c < dt_num_clients(); c++)
        mine += dt__client_host(c) == me;
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cores <= 0)
        cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    openblas_set_num_threads(dt__blas_threads_for(cores, mine, lanes));
}
