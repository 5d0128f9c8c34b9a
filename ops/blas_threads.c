/* How many threads OpenBLAS runs: the cores this process may use shared among the clients of
 * its host (at least one each), so that processes and BLAS threads do not fight for cores;
 * left to the user when OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set. */
#include <cblas.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "dtensor/runtime.h"
#include "ops/ops_impl.h"
#include "runtime/comm.h"

static _Atomic int done; /* 1 once set for an initialised runtime */

int dt__blas_threads_for(int cores, int clients_on_host)
{
    if (clients_on_host < 1)
        clients_on_host = 1;
    int t = cores / clients_on_host;
    return t < 1 ? 1 : t;
}

void dt__blas_threads_once(void)
{
    if (atomic_load_explicit(&done, memory_order_acquire) || !dt_is_initialized())
        return;
    int expect = 0;
    if (!atomic_compare_exchange_strong(&done, &expect, 1))
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
    openblas_set_num_threads(dt__blas_threads_for(cores, mine));
}
