/* The CPU workers: persistent threads that take the per-device shares of an op's work as they
 * come free (a fork-join in which the caller takes shares too and returns when all are done),
 * and carry a failing share's status and message back to the caller's thread. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/util.h"
#include "runtime/workers.h"

/* How long a waiting side polls (poll_on) before it sleeps on its condition variable: an
 * op's jobs come back to back (the kernels of one op, then the next op's after a little host
 * work), and a futex wake costs tens of microseconds, as much as a small kernel. Only when
 * every lane has a core of its own. */
#define SPIN_NS 20000

#define TICKET_CLOSED UINT64_MAX /* between two jobs: nothing to claim */

typedef struct lane {
    pthread_t thread;
    int index;
    int started;
    uint64_t gen0;     /* the pool's gen when the thread was made: its first job comes after */
    uint64_t fail_gen; /* the job of the failure below (0: none yet) */
    int fail_i;        /* its first failing component on this lane */
    dt_status st;
    char msg[1024];
} lane;

static struct {
    pthread_mutex_t run_lock; /* one job at a time; a second caller runs its job alone */
    pthread_mutex_t lock;
    pthread_cond_t go;   /* gen advanced, or stop */
    pthread_cond_t done; /* remaining reached 0 */
    lane *lanes;
    int nlanes;
    int ndevices;   /* as given to start, for configure */
    int auto_lanes; /* what start chose */
    int spin;
    int fixed; /* test hook: component i only on lane i % nlanes, the lanes starting together */
    _Atomic int arrived;  /* fixed: lanes that have started the current job */
    _Atomic uint64_t gen; /* the current job (from 1) */
    _Atomic int stop;
    /* The next component to claim: (gen << 32) | index, TICKET_CLOSED between jobs. Claims go
     * in index order, so when component i fails every lower one has been claimed. */
    _Atomic uint64_t ticket;
    _Atomic int n;         /* components of the current job */
    _Atomic int remaining; /* components of the current job not done yet */
    _Atomic unsigned long long jobs;
    dt__work_fn fn;
    void *arg;
} pool = {
    .run_lock = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .go = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
    .nlanes = 1,
    .ticket = TICKET_CLOSED,
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One turn of a poll: a pause, and every 64th turn a yield of the core (to whatever else is
 * runnable: the lane being waited for, another process) and a look at the clock. 0 once
 * `until` has passed. */
static int poll_on(unsigned k, int64_t until)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (k % 64)
        return 1;
    sched_yield();
    return now_ns() <= until;
}

/* The next unclaimed component of job g, or -1. A lane that arrives late, or finds the job
 * done and the next one being set up, claims nothing: the ticket no longer says g. */
static int claim(uint64_t g)
{
    uint64_t t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    for (;;) {
        if (t == TICKET_CLOSED || (t >> 32) != (g & 0xffffffffu) ||
            (int64_t)(t & 0xffffffffu) >= atomic_load_explicit(&pool.n, memory_order_relaxed))
            return -1;
        if (atomic_compare_exchange_weak_explicit(&pool.ticket, &t, t + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return (int)(t & 0xffffffffu);
    }
}

/* Runs components of job g as long as some are unclaimed (or, fixed, this lane's own);
 * keeps this lane's first failure. */
static void run_claims(lane *l, uint64_t g, int clear)
{
    /* Fixed: the lanes with a share start at once, so that the shares overlap (races show).
     * One without a share skips this: it might still be here when the next job begins. */
    int with_share = atomic_load(&pool.n) < pool.nlanes ? atomic_load(&pool.n) : pool.nlanes;
    if (pool.fixed && l->index < with_share) {
        atomic_fetch_add(&pool.arrived, 1);
        for (int64_t t0 = now_ns();
             atomic_load(&pool.arrived) < with_share && now_ns() - t0 < 1000000000;)
            sched_yield();
    }
    int i = pool.fixed ? l->index : claim(g);
    for (; i >= 0 && i < atomic_load(&pool.n); i = pool.fixed ? i + pool.nlanes : claim(g)) {
        if (clear)
            dt_clear_error();
        dt_status st = pool.fn(i, pool.arg);
        if (st != DT_OK && (l->fail_gen != g || i < l->fail_i)) {
            l->fail_gen = g;
            l->fail_i = i;
            l->st = st;
            const char *text = dt_last_error();
            dt__strlcpy(l->msg, text[0] ? text : dt_status_str(st), sizeof l->msg);
        }
        if (atomic_fetch_sub_explicit(&pool.remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_broadcast(&pool.done);
            pthread_mutex_unlock(&pool.lock);
        }
    }
}

/* Waits until gen moves past seen (returns the new gen) or stop (returns seen). */
static uint64_t wait_job(uint64_t seen)
{
    if (pool.spin) {
        int64_t until = now_ns() + SPIN_NS;
        for (unsigned k = 1;; k++) {
            uint64_t g = atomic_load_explicit(&pool.gen, memory_order_acquire);
            if (g != seen || atomic_load_explicit(&pool.stop, memory_order_relaxed))
                return atomic_load(&pool.stop) ? seen : g;
            if (!poll_on(k, until))
                break;
        }
    }
    pthread_mutex_lock(&pool.lock);
    uint64_t g;
    while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen &&
           !atomic_load_explicit(&pool.stop, memory_order_relaxed))
        pthread_cond_wait(&pool.go, &pool.lock);
    int stopping = atomic_load(&pool.stop);
    pthread_mutex_unlock(&pool.lock);
    return stopping ? seen : g;
}

static void *lane_main(void *p)
{
    lane *l = p;
    uint64_t seen = l->gen0;
    for (;;) {
        uint64_t g = wait_job(seen);
        if (g == seen)
            break; /* stop */
        seen = g;
        run_claims(l, g, 1);
    }
    return NULL;
}

static void wait_done(void)
{
    if (pool.spin) {
        int64_t until = now_ns() + SPIN_NS;
        for (unsigned k = 1;; k++) {
            if (atomic_load_explicit(&pool.remaining, memory_order_acquire) == 0)
                return;
            if (!poll_on(k, until))
                break;
        }
    }
    pthread_mutex_lock(&pool.lock);
    while (atomic_load_explicit(&pool.remaining, memory_order_acquire) != 0)
        pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
}

static dt_status run_serial(int n, dt__work_fn fn, void *arg)
{
    for (int i = 0; i < n; i++) {
        dt_status st = fn(i, arg);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

dt_status dt__workers_run(int n, dt__work_fn fn, void *arg)
{
    if (pool.nlanes < 2 || n < 2 || pthread_mutex_trylock(&pool.run_lock) != 0)
        return run_serial(n, fn, arg);
    atomic_fetch_add_explicit(&pool.jobs, 1, memory_order_relaxed);
    /* Closed first, so that a lane still looking at the last job cannot claim into this one
     * while its fields change. */
    atomic_store_explicit(&pool.ticket, TICKET_CLOSED, memory_order_relaxed);
    uint64_t g = atomic_load_explicit(&pool.gen, memory_order_relaxed) + 1;
    pool.fn = fn;
    pool.arg = arg;
    atomic_store_explicit(&pool.n, n, memory_order_relaxed);
    atomic_store_explicit(&pool.remaining, n, memory_order_relaxed);
    atomic_store_explicit(&pool.arrived, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.ticket, (g & 0xffffffffu) << 32, memory_order_release);
    pthread_mutex_lock(&pool.lock);
    atomic_store_explicit(&pool.gen, g, memory_order_release);
    pthread_cond_broadcast(&pool.go);
    pthread_mutex_unlock(&pool.lock);
    /* The caller claims too: when no worker is free (a loaded machine) it does every share,
     * at the cost of one job's set-up over a plain loop. */
    run_claims(&pool.lanes[0], g, 0);
    wait_done();
    const lane *first = NULL;
    for (int k = 0; k < pool.nlanes; k++) {
        const lane *l = &pool.lanes[k];
        if (l->fail_gen == g && (!first || l->fail_i < first->fail_i))
            first = l;
    }
    dt_status st = DT_OK;
    if (first)
        st = dt__error(first->st, "%s", first->msg); /* a later failure may have overwritten it */
    pthread_mutex_unlock(&pool.run_lock);
    return st;
}

static void stop_lanes(void)
{
    if (!pool.lanes)
        return;
    pthread_mutex_lock(&pool.lock);
    atomic_store(&pool.stop, 1);
    pthread_cond_broadcast(&pool.go);
    pthread_mutex_unlock(&pool.lock);
    for (int k = 1; k < pool.nlanes; k++)
        if (pool.lanes[k].started)
            pthread_join(pool.lanes[k].thread, NULL);
    free(pool.lanes);
    pool.lanes = NULL;
    pool.nlanes = 1;
    pool.spin = 0;
    atomic_store(&pool.stop, 0);
}

static int process_cores(void)
{
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cores <= 0)
        cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 ? cores : 1;
}

/* A child of fork() has none of the threads: it runs its jobs alone (the lanes' memory is
 * left to it, as the rest of the parent's state). */
static void forget_lanes_in_child(void)
{
    pool.lanes = NULL;
    pool.nlanes = 1;
    pool.spin = 0;
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void register_atfork(void)
{
    pthread_atfork(NULL, NULL, forget_lanes_in_child);
}

static dt_status start_lanes(int nlanes)
{
    if (nlanes < 2)
        return DT_OK;
    pthread_once(&atfork_once, register_atfork);
    pool.lanes = calloc((size_t)nlanes, sizeof *pool.lanes);
    if (!pool.lanes)
        return dt__error(DT_ERR_NO_MEMORY, "dt_init: no memory for %d CPU workers", nlanes);
    pool.nlanes = nlanes;
    pool.spin = nlanes <= process_cores();
    for (int k = 0; k < nlanes; k++) {
        pool.lanes[k].index = k;
        pool.lanes[k].gen0 = atomic_load(&pool.gen);
    }
    for (int k = 1; k < nlanes; k++) {
        int rc = pthread_create(&pool.lanes[k].thread, NULL, lane_main, &pool.lanes[k]);
        if (rc != 0) {
            stop_lanes();
            return dt__error(DT_ERR_NO_MEMORY, "dt_init: cannot start CPU worker %d of %d: %s", k,
                             nlanes - 1, strerror(rc));
        }
        pool.lanes[k].started = 1;
    }
    return DT_OK;
}

dt_status dt__workers_start(int ndevices)
{
    int on = 1;
    dt_status st =
        dt__env_flag("DT_CPU_WORKERS", 1, "run the local CPU devices' work at once", &on);
    if (st != DT_OK)
        return st;
    int cores = process_cores();
    pool.ndevices = ndevices;
    pool.auto_lanes = on ? (ndevices < cores ? ndevices : cores) : 1;
    return start_lanes(pool.auto_lanes);
}

void dt__workers_stop(void)
{
    stop_lanes();
    pool.fixed = 0;
    pool.ndevices = 0;
    pool.auto_lanes = 1;
}

dt_status dt__workers_configure(int lanes, int fixed)
{
    stop_lanes();
    pool.fixed = fixed && lanes >= 0;
    return start_lanes(lanes < 0 ? pool.auto_lanes : lanes);
}

int dt__workers_lanes(void)
{
    return pool.nlanes;
}

unsigned long long dt__workers_jobs(void)
{
    return atomic_load_explicit(&pool.jobs, memory_order_relaxed);
}
