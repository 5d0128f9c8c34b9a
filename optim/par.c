/* The optimizer's passes over the parameters (the norm's sums of squares, the update, the
 * copy of the master into the parameters) split among this process's share of the host's
 * cores, as many threads as OpenBLAS runs: on one process of a 2-core host the second core otherwise waits in OpenBLAS while
 * one thread streams 124M parameters. Threads are started for the pass and joined (a few
 * per step, microseconds each against passes of milliseconds; small passes run here). Each
 * share is a contiguous range of independent items, so the results are bit for bit those
 * of one thread. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "optim/optim_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"

#define MAX_THREADS 16

typedef struct share {
    dt__zpar_fn fn;
    void *arg;
    int64_t lo, hi;
    dt_status st;
    char msg[200];
} share;

static void run_share(share *s)
{
    s->st = s->fn(s->lo, s->hi, s->arg);
    if (s->st != DT_OK)
        snprintf(s->msg, sizeof s->msg, "%s", dt_last_error());
}

static void *thread_main(void *p)
{
    run_share(p);
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
    share sh[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    /* Share t: the items whose cumulative cost starts in [t total / nt, (t+1) total / nt). */
    int64_t at = 0;
    for (int t = 0; t < nt; t++) {
        int64_t end = t + 1 == nt ? n : at;
        if (t + 1 < nt) {
            int64_t goal = total / nt * (t + 1);
            while (end < n && (cost ? cost[end] : end) < goal)
                end++;
        }
        sh[t] = (share){fn, arg, at, end, DT_OK, ""};
        at = end;
    }
    for (int t = 1; t < nt; t++)
        if (sh[t].lo < sh[t].hi)
            started[t] = pthread_create(&th[t], NULL, thread_main, &sh[t]) == 0;
    if (sh[0].lo < sh[0].hi)
        run_share(&sh[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t])
            pthread_join(th[t], NULL);
        else if (sh[t].lo < sh[t].hi)
            run_share(&sh[t]); /* no thread: here */
    }
    for (int t = 0; t < nt; t++)
        if (sh[t].st != DT_OK)
            return dt__error(sh[t].st, "%s", sh[t].msg);
    return DT_OK;
}
