/* The optimizer's passes over the parameters (the norm's sums of squares, the update, the
 * copy of the master into the parameters) split among this process's share of the host's
 * cores, as many threads as OpenBLAS runs: on one process of a 2-core host the second core
 * otherwise waits in OpenBLAS while one thread streams 124M parameters. Threads are started for the pass and joined (a few
 * per step, microseconds each against passes of milliseconds; small passes run here). The
 * threads claim blocks of independent items in turn (a thread the machine does not schedule
 * leaves its blocks to the others), so the results are bit for bit those of one thread. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "optim/optim_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"

#define MAX_THREADS 16
#define BLOCK ((int64_t)1 << 16) /* items per claim when they are elements (cost NULL) */

/* One pass: blocks claimed in order by every thread until none is left, so a thread that the
 * machine does not schedule leaves its blocks to the others (the caller does them all when
 * no other thread runs). */
typedef struct pass {
    dt__zpar_fn fn;
    void *arg;
    int64_t n, block; /* items, items per block */
    _Atomic int64_t next;
    pthread_mutex_t lock;
    int64_t failed_at; /* lowest failing block, or -1 */
    dt_status st;
    char msg[200];
} pass;

static void *work(void *p)
{
    pass *w = p;
    int64_t nb = (w->n + w->block - 1) / w->block;
    for (;;) {
        int64_t b = atomic_fetch_add(&w->next, 1);
        if (b >= nb)
            break;
        int64_t lo = b * w->block, hi = lo + w->block < w->n ? lo + w->block : w->n;
        dt_status st = w->fn(lo, hi, w->arg);
        if (st != DT_OK) {
            pthread_mutex_lock(&w->lock);
            if (w->failed_at < 0 || b < w->failed_at) {
                w->failed_at = b;
                w->st = st;
                snprintf(w->msg, sizeof w->msg, "%s", dt_last_error());
            }
            pthread_mutex_unlock(&w->lock);
        }
    }
    return NULL;
}

/* As many as OpenBLAS gets (ops/blas_threads.c): the process's share of the host's cores,
 * or fewer where the user holds OpenBLAS to fewer (OPENBLAS_NUM_THREADS, else
 * OMP_NUM_THREADS). */
int dt__zero_par_threads(void)
{
    int clients = 1, cores = 1;
    dt__host_clients_and_cores(&clients, &cores);
    int t = cores / (clients > 0 ? clients : 1);
    const char *env = getenv("OPENBLAS_NUM_THREADS");
    if (!env || !*env)
        env = getenv("OMP_NUM_THREADS");
    if (env && *env) {
        long u = strtol(env, NULL, 10);
        if (u >= 1 && u < t)
            t = (int)u;
    }
    return t < 1 ? 1 : t > MAX_THREADS ? MAX_THREADS : t;
}

dt_status dt__zero_par(int64_t n, int64_t grain, const int64_t *cost, dt__zpar_fn fn, void *arg)
{
    int nt = dt__zero_par_threads();
    int64_t total = cost ? cost[n] : n;
    if (grain < 1)
        grain = 1;
    if (nt > total / grain)
        nt = (int)(total / grain);
    if (nt > n)
        nt = (int)n;
    if (nt <= 1)
        return n > 0 ? fn(0, n, arg) : DT_OK;
    pass w = {fn, arg, n, cost ? 1 : BLOCK, 0, PTHREAD_MUTEX_INITIALIZER, -1, DT_OK, ""};
    pthread_t th[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 1; t < nt; t++)
        started[t] = pthread_create(&th[t], NULL, work, &w) == 0;
    work(&w); /* the caller claims blocks too (all of them when no thread started) */
    for (int t = 1; t < nt; t++)
        if (started[t])
            pthread_join(th[t], NULL);
    pthread_mutex_destroy(&w.lock);
    return w.failed_at >= 0 ? dt__error(w.st, "%s", w.msg) : DT_OK;
}
