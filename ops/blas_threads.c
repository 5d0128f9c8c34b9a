/* How many threads OpenBLAS runs: the cores this process may use shared among the clients of
 * its host, and among the CPU worker lanes while an op's devices compute at once (at least one
 * each), so that processes, workers and BLAS threads do not fight for cores; left to the user
 * when OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set. */
#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "dtensor/runtime.h"
#include "ops/ops_impl.h"
#include "runtime/comm.h"
#include "runtime/workers.h"

/* The count set last (0: none since the process started; -1: the user's, never touched), and
 * the cores and host clients it was worked out from. Changed only by the thread that calls
 * the ops, between jobs, never while a worker may be in BLAS. */
static _Atomic int current;
static int base_cores, base_clients;

int dt__blas_threads_for(int cores, int clients_on_host, int workers)
{
    if (clients_on_host < 1)
        clients_on_host = 1;
    if (workers < 1)
        workers = 1;
    int t = cores / (clients_on_host * workers);
    return t < 1 ? 1 : t;
}

/* Sets the count for `lanes` lanes computing at once; the first call looks at the machine. */
static void set_for(int lanes)
{
    int have = atomic_load_explicit(&current, memory_order_acquire);
    if (have < 0 || !dt_is_initialized())
        return;
    if (have == 0) {
        const char *env = getenv("OPENBLAS_NUM_THREADS");
        const char *omp = getenv("OMP_NUM_THREADS");
        if ((env && *env) || (omp && *omp)) {
            atomic_store(&current, -1);
            return;
        }
        dt__host_clients_and_cores(&base_clients, &base_cores);
    }
    int want = dt__blas_threads_for(base_cores, base_clients, lanes);
    if (want != have && atomic_compare_exchange_strong(&current, &have, want))
        openblas_set_num_threads(want);
}

void dt__blas_threads_once(void)
{
    if (atomic_load_explicit(&current, memory_order_acquire) == 0)
        set_for(1);
}

void dt__blas_threads_job(int lanes)
{
    set_for(lanes);
}
