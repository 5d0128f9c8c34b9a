/* The block executor of the host build: runs a kernel launch block by block, each thread of a
 * block as an OS thread, with checked barriers (__syncthreads: every thread, from one line),
 * checked warp operations (32-lane warps by linear thread id, the exact mask of the calling
 * lanes), per-block shared memory at its exact size filled with 0xFF, and a time bound. Any
 * misuse or deadlock aborts the process with the lines at fault: a test fails, never hangs. */
#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <set>
#include <string>
#include <vector>

#include "cuda_host/exec.h"

__thread struct dt__cuh_thread *dt__cuh_cur;

namespace {

enum { ST_RUNNING, ST_BARRIER, ST_WARP, ST_EXITED };
const unsigned kQuit = ~0u;

struct where {
    int state;
    const char *file;
    int line;
};

struct warp_state {
    pthread_cond_t cv;
    unsigned arrived, mask, readers, gen;
    int kind, draining, first_lane;
    const char *file;
    int line;
    uint64_t val[32];
    int arg[32], width[32];
};

struct shared_entry {
    const void *key;
    void *ptr;
    size_t bytes;
};

} // namespace

struct dt__cuh_block {
    pthread_mutex_t mu;
    pthread_cond_t done_cv, bar_cv;
    const dt__cuh_launch_desc *d;
    void (*body)(void *);
    void *closure;
    unsigned nthreads, exited, blocked;
    unsigned start_word; /* the block number + 1 the team runs (futex; kQuit: leave) */
    uint3 bid;
    /* the barrier */
    unsigned arrived, bar_gen;
    int bar_kind, bar_acc, bar_result, bar_first;
    const char *bar_file;
    int bar_line;
    std::vector<where> at;
    warp_state warps[32];
    /* The block's __shared__ arrays: published by an atomic count, read without the mutex (a
     * lock there would order the threads' accesses and hide a missing __syncthreads from
     * ThreadSanitizer). */
    shared_entry shared[64];
    unsigned nshared;
    size_t shared_bytes;
    void *dyn;
    int used_sync; /* a thread used shared memory, a barrier or a warp operation */
};

namespace {

struct team_thread {
    dt__cuh_block *blk;
    dt__cuh_thread ctx;
    pthread_t th;
};

std::string thread_states(const dt__cuh_block *b)
{
    static const char *names[] = {"running", "waiting at a barrier", "in a warp operation",
                                  "exited"};
    std::string s;
    unsigned i = 0;
    while (i < b->nthreads) {
        unsigned j = i;
        while (j + 1 < b->nthreads && b->at[j + 1].state == b->at[i].state &&
               b->at[j + 1].file == b->at[i].file && b->at[j + 1].line == b->at[i].line)
            j++;
        char line[256];
        if (b->at[i].state == ST_BARRIER || b->at[i].state == ST_WARP)
            snprintf(line, sizeof line, "  threads %u-%u %s at %s:%d\n", i, j,
                     names[b->at[i].state], b->at[i].file, b->at[i].line);
        else
            snprintf(line, sizeof line, "  threads %u-%u %s\n", i, j, names[b->at[i].state]);
        s += line;
        i = j + 1;
    }
    return s;
}

[[noreturn]] void fail(const dt__cuh_block *b, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    std::string states = thread_states(b);
    fprintf(stderr,
            "cuda-host: kernel %s (launched at %s:%d), block (%u,%u,%u) of (%u,%u,%u), %u "
            "threads:\n  %s\n%s",
            b->d->name, b->d->file, b->d->line, b->bid.x, b->bid.y, b->bid.z, b->d->grid.x,
            b->d->grid.y, b->d->grid.z, b->nthreads, msg, states.c_str());
    fflush(stderr);
    abort();
}

/* Every live thread waits on a barrier or a warp operation that cannot complete. */
void check_stuck(dt__cuh_block *b)
{
    if (b->blocked > 0 && b->blocked == b->nthreads - b->exited)
        fail(b, "deadlock: every live thread waits and none can go on");
}

void *shared_alloc(size_t bytes)
{
    void *p = malloc(bytes); /* exactly: AddressSanitizer sees an overrun at its line */
    if (!p && bytes) {
        fprintf(stderr, "cuda-host: no memory for %zu bytes of shared memory\n", bytes);
        abort();
    }
    memset(p, 0xff, bytes); /* an uninitialised float reads as NaN */
    return p;
}

void *team_main(void *arg)
{
    team_thread *t = (team_thread *)arg;
    dt__cuh_block *b = t->blk;
    dt__cuh_cur = &t->ctx;
    unsigned seen = 0;
    for (;;) {
        /* No mutex here: 1024 threads waking on one would queue behind it. */
        unsigned word;
        while ((word = __atomic_load_n(&b->start_word, __ATOMIC_ACQUIRE)) == seen)
            syscall(SYS_futex, &b->start_word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
        if (word == kQuit)
            return NULL;
        seen = word;
        t->ctx.bid = b->bid;

        b->body(b->closure);

        pthread_mutex_lock(&b->mu);
        unsigned me = t->ctx.linear;
        b->at[me].state = ST_EXITED;
        b->exited++;
        if (b->arrived > 0)
            fail(b, "thread %u returned while threads wait at the barrier at %s:%d", me,
                 b->bar_file, b->bar_line);
        warp_state *w = &b->warps[me / 32];
        if (w->arrived && !w->draining && (w->mask >> (me % 32) & 1))
            fail(b, "thread %u (lane %u) returned while its warp waits for it at %s:%d (mask "
                 "0x%08x)", me, me % 32, w->file, w->line, w->mask);
        if (b->exited == b->nthreads)
            pthread_cond_signal(&b->done_cv);
        else
            check_stuck(b);
        pthread_mutex_unlock(&b->mu);
    }
}

/* A kernel whose first block used no shared memory, barrier or warp operation runs its other
 * blocks thread after thread on the worker (DT_CUDA_HOST_THREADS=all: never; ThreadSanitizer
 * builds: never, so that races between a block's threads show). Such a kernel must not start
 * using them in a later block. */
[[noreturn]] void sequential_misuse(const char *what, const char *file, int line)
{
    fprintf(stderr, "cuda-host: %s at %s:%d in a block run thread after thread (the kernel's "
            "first block used no shared memory, barrier or warp operation): run with "
            "DT_CUDA_HOST_THREADS=all\n", what, file, line);
    fflush(stderr);
    abort();
}

bool always_threads()
{
#if defined(__SANITIZE_THREAD__)
    return true;
#else
    const char *e = getenv("DT_CUDA_HOST_THREADS");
    return e && strcmp(e, "all") == 0;
#endif
}

double timeout_s()
{
    const char *e = getenv("DT_CUDA_HOST_TIMEOUT");
    double t = e ? atof(e) : 0.0;
    return t > 0 ? t : 60.0;
}

} // namespace

extern "C" void *dt__cuh_shared(const void *key, size_t bytes, size_t align, const char *file,
                                int line)
{
    dt__cuh_block *b = dt__cuh_cur->blk;
    if (!b)
        sequential_misuse("shared memory", file, line);
    __atomic_store_n(&b->used_sync, 1, __ATOMIC_RELAXED);
    (void)align; /* malloc's alignment covers every type the kernels share */
    unsigned n = __atomic_load_n(&b->nshared, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < n; i++)
        if (b->shared[i].key == key)
            return b->shared[i].ptr;
    pthread_mutex_lock(&b->mu);
    void *p = NULL;
    n = b->nshared;
    for (unsigned i = 0; i < n; i++)
        if (b->shared[i].key == key)
            p = b->shared[i].ptr;
    if (!p) {
        if (b->shared_bytes + bytes > 48 * 1024)
            fail(b, "static shared memory past 48 KiB at %s:%d", file, line);
        if (n == sizeof b->shared / sizeof b->shared[0])
            fail(b, "more than 64 __shared__ arrays at %s:%d", file, line);
        p = shared_alloc(bytes);
        b->shared[n] = {key, p, bytes};
        b->shared_bytes += bytes;
        __atomic_store_n(&b->nshared, n + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&b->mu);
    return p;
}

extern "C" void *dt__cuh_dynamic_shared(void)
{
    dt__cuh_block *b = dt__cuh_cur->blk;
    if (!b)
        sequential_misuse("dynamic shared memory", "?", 0);
    __atomic_store_n(&b->used_sync, 1, __ATOMIC_RELAXED);
    return b->dyn;
}

extern "C" int dt__cuh_syncthreads(int kind, int pred, const char *file, int line)
{
    dt__cuh_block *b = dt__cuh_cur->blk;
    if (!b)
        sequential_misuse("a barrier", file, line);
    unsigned me = dt__cuh_cur->linear;
    pthread_mutex_lock(&b->mu);
    __atomic_store_n(&b->used_sync, 1, __ATOMIC_RELAXED);
    if (b->exited > 0)
        fail(b, "thread %u reached the barrier at %s:%d, which threads that returned never "
             "reach", me, file, line);
    if (b->arrived == 0) {
        b->bar_file = file;
        b->bar_line = line;
        b->bar_kind = kind;
        b->bar_first = (int)me;
        b->bar_acc = kind == DT__CUH_BAR_AND ? 1 : 0;
    } else if (b->bar_line != line || strcmp(b->bar_file, file) != 0 || b->bar_kind != kind) {
        fail(b, "threads reach different barriers: thread %d at %s:%d, thread %u at %s:%d",
             b->bar_first, b->bar_file, b->bar_line, me, file, line);
    }
    if (kind == DT__CUH_BAR_OR)
        b->bar_acc |= pred;
    else if (kind == DT__CUH_BAR_AND)
        b->bar_acc &= pred;
    else if (kind == DT__CUH_BAR_COUNT)
        b->bar_acc += pred;
    b->at[me] = {ST_BARRIER, file, line};
    int result;
    if (++b->arrived == b->nthreads) {
        b->bar_result = b->bar_acc;
        b->blocked -= b->nthreads - 1;
        b->arrived = 0;
        b->bar_gen++;
        pthread_cond_broadcast(&b->bar_cv);
    } else {
        unsigned gen = b->bar_gen;
        b->blocked++;
        check_stuck(b);
        while (b->bar_gen == gen)
            pthread_cond_wait(&b->bar_cv, &b->mu);
    }
    result = b->bar_result;
    b->at[me].state = ST_RUNNING;
    pthread_mutex_unlock(&b->mu);
    return result;
}

extern "C" void dt__cuh_warp(int kind, unsigned mask, const uint64_t *in, uint64_t *out,
                             int arg, int width, const char *file, int line)
{
    static const char *names[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync",
                                  "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync",
                                  "__any_sync", "__all_sync"};
    dt__cuh_block *b = dt__cuh_cur->blk;
    if (!b)
        sequential_misuse(names[kind], file, line);
    unsigned me = dt__cuh_cur->linear, lane = me % 32, wi = me / 32;
    warp_state *w = &b->warps[wi];
    unsigned nlanes = b->nthreads - wi * 32 < 32 ? b->nthreads - wi * 32 : 32;
    unsigned exist = nlanes == 32 ? ~0u : (1u << nlanes) - 1;
    pthread_mutex_lock(&b->mu);
    __atomic_store_n(&b->used_sync, 1, __ATOMIC_RELAXED);
    if (!(mask >> lane & 1))
        fail(b, "%s at %s:%d: lane %u calls it with mask 0x%08x, which does not name it",
             names[kind], file, line, lane, mask);
    if (mask & ~exist)
        fail(b, "%s at %s:%d: mask 0x%08x names lanes past the %u of warp %u", names[kind],
             file, line, mask, nlanes, wi);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail(b, "%s at %s:%d: width %d is not a power of two up to 32", names[kind], file,
             line, width);
    while (w->draining)
        pthread_cond_wait(&w->cv, &b->mu);
    if (w->arrived == 0) {
        w->mask = mask;
        w->kind = kind;
        w->file = file;
        w->line = line;
        w->first_lane = (int)lane;
    } else if (w->mask != mask || w->kind != kind || w->line != line ||
               strcmp(w->file, file) != 0) {
        fail(b, "warp %u: lane %d at %s %s:%d (mask 0x%08x), lane %u at %s %s:%d (mask "
             "0x%08x)", wi, w->first_lane, names[w->kind], w->file, w->line, w->mask, lane,
             names[kind], file, line, mask);
    }
    for (unsigned l = 0; l < 32; l++)
        if ((mask >> l & 1) && b->at[wi * 32 + l].state == ST_EXITED)
            fail(b, "%s at %s:%d: mask 0x%08x names lane %u, which returned", names[kind], file,
                 line, mask, l);
    w->val[lane] = *in;
    w->arg[lane] = arg;
    w->width[lane] = width;
    w->arrived |= 1u << lane;
    b->at[me] = {ST_WARP, file, line};
    if (w->arrived == mask) {
        w->draining = 1;
        w->readers = (unsigned)__builtin_popcount(mask);
        b->blocked -= w->readers - 1;
        w->gen++;
        pthread_cond_broadcast(&w->cv);
    } else {
        unsigned gen = w->gen;
        b->blocked++;
        check_stuck(b);
        while (w->gen == gen)
            pthread_cond_wait(&w->cv, &b->mu);
    }
    uint64_t r = 0;
    unsigned seg = lane & ~(unsigned)(width - 1), pos = lane & (unsigned)(width - 1), src = lane;
    switch (kind) {
    case DT__CUH_WARP_IDX: src = seg + ((unsigned)arg & (unsigned)(width - 1)); break;
    case DT__CUH_WARP_UP: src = pos >= (unsigned)arg ? lane - (unsigned)arg : lane; break;
    case DT__CUH_WARP_DOWN: src = pos + (unsigned)arg < (unsigned)width ? lane + (unsigned)arg : lane; break;
    case DT__CUH_WARP_XOR: src = ((lane ^ (unsigned)arg) & ~(unsigned)(width - 1)) == seg ? lane ^ (unsigned)arg : lane; break;
    default: break;
    }
    if (kind >= DT__CUH_WARP_IDX && kind <= DT__CUH_WARP_XOR) {
        if (!(mask >> src & 1))
            fail(b, "%s at %s:%d: lane %u reads lane %u, which is not in the mask 0x%08x",
                 names[kind], file, line, lane, src, mask);
        r = w->val[src];
    } else if (kind != DT__CUH_WARP_SYNC) {
        unsigned ballot = 0;
        for (unsigned l = 0; l < 32; l++)
            if ((mask >> l & 1) && w->val[l])
                ballot |= 1u << l;
        r = kind == DT__CUH_WARP_BALLOT ? ballot
            : kind == DT__CUH_WARP_ANY  ? ballot != 0
                                        : ballot == mask;
    }
    *out = r;
    b->at[me].state = ST_RUNNING;
    if (--w->readers == 0) {
        w->draining = 0;
        w->arrived = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&b->mu);
}

namespace {

/* A block's worth of threads, kept by a stream worker for its launches of that many threads per
 * block (thread creation and exit cost more than most blocks of a test). */
struct team {
    dt__cuh_block *b;
    std::vector<team_thread> threads;

    explicit team(unsigned n) : b(new dt__cuh_block()), threads(n)
    {
        pthread_mutex_init(&b->mu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&b->done_cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_cond_init(&b->bar_cv, NULL);
        for (warp_state &w : b->warps)
            pthread_cond_init(&w.cv, NULL);
        b->nthreads = n;
        b->at.assign(n, where{ST_RUNNING, "", 0});
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 1 << 20);
        for (unsigned i = 0; i < n; i++) {
            team_thread &t = threads[i];
            t.blk = b;
            t.ctx.linear = i;
            t.ctx.blk = b;
            int rc = pthread_create(&t.th, &attr, team_main, &t);
            if (rc != 0) {
                fprintf(stderr, "cuda-host: pthread_create for thread %u of a block: %s\n", i,
                        strerror(rc));
                abort();
            }
        }
        pthread_attr_destroy(&attr);
    }

    ~team()
    {
        __atomic_store_n(&b->start_word, kQuit, __ATOMIC_RELEASE);
        syscall(SYS_futex, &b->start_word, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
        for (team_thread &t : threads)
            pthread_join(t.th, NULL);
        for (warp_state &w : b->warps)
            pthread_cond_destroy(&w.cv);
        pthread_cond_destroy(&b->done_cv);
        pthread_cond_destroy(&b->bar_cv);
        pthread_mutex_destroy(&b->mu);
        delete b;
    }
};

/* The calling worker's teams by threads per block; they leave with the worker. */
struct teams {
    std::vector<team *> list;
    ~teams()
    {
        for (team *t : list)
            delete t;
    }
    team *get(unsigned n)
    {
        for (team *t : list)
            if (t->b->nthreads == n)
                return t;
        list.push_back(new team(n));
        return list.back();
    }
};
thread_local teams my_teams;

/* The kernels (by name and launch site) that used shared memory, a barrier or a warp
 * operation: always run on threads. Per worker, as the teams. */
thread_local std::set<std::string> sync_users;

std::string kernel_key(const dt__cuh_launch_desc *d)
{
    return std::string(d->name) + "@" + d->file + ":" + std::to_string(d->line);
}

/* Blocks first .. n-1 (linear), thread after thread on the calling worker. */
void run_sequential(const dt__cuh_launch_desc *d, void (*body)(void *), void *closure,
                    unsigned long long first, unsigned long long n)
{
    dt__cuh_thread *saved = dt__cuh_cur, ctx;
    unsigned nthreads = d->block.x * d->block.y * d->block.z;
    ctx.bdim = d->block;
    ctx.gdim = d->grid;
    ctx.blk = NULL;
    for (unsigned long long blk = first; blk < n; blk++) {
        ctx.bid = {(unsigned)(blk % d->grid.x), (unsigned)(blk / d->grid.x % d->grid.y),
                   (unsigned)(blk / ((unsigned long long)d->grid.x * d->grid.y))};
        for (unsigned i = 0; i < nthreads; i++) {
            ctx.linear = i;
            ctx.tid = {i % d->block.x, i / d->block.x % d->block.y,
                       i / (d->block.x * d->block.y)};
            dt__cuh_cur = &ctx;
            body(closure);
        }
    }
    dt__cuh_cur = saved;
}

} // namespace

extern "C" void dt__cuh_run_kernel(const dt__cuh_launch_desc *d, void (*body)(void *),
                                   void *closure)
{
    team *tm = my_teams.get(d->block.x * d->block.y * d->block.z);
    dt__cuh_block *b = tm->b;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    double limit = timeout_s();
    deadline.tv_sec += (time_t)limit;

    pthread_mutex_lock(&b->mu);
    b->d = d;
    b->body = body;
    b->closure = closure;
    b->used_sync = 0;
    for (unsigned i = 0; i < b->nthreads; i++) {
        dt__cuh_thread &c = tm->threads[i].ctx;
        c.tid = {i % d->block.x, i / d->block.x % d->block.y, i / (d->block.x * d->block.y)};
        c.bdim = d->block;
        c.gdim = d->grid;
    }
    bool threads = always_threads() || sync_users.count(kernel_key(d));
    unsigned long long nblocks = (unsigned long long)d->grid.x * d->grid.y * d->grid.z, at = 0;
    for (unsigned z = 0; z < d->grid.z; z++)
        for (unsigned y = 0; y < d->grid.y; y++)
            for (unsigned x = 0; x < d->grid.x; x++, at++) {
                if (at == 1 && !threads) {
                    if (b->used_sync) {
                        threads = true;
                        sync_users.insert(kernel_key(d));
                    } else {
                        pthread_mutex_unlock(&b->mu);
                        run_sequential(d, body, closure, at, nblocks);
                        pthread_mutex_lock(&b->mu);
                        goto done;
                    }
                }
                b->bid = {x, y, z};
                for (unsigned i = 0; i < b->nshared; i++)
                    free(b->shared[i].ptr);
                b->nshared = 0;
                b->shared_bytes = 0;
                b->dyn = shared_alloc(d->smem);
                b->exited = 0;
                b->blocked = 0;
                for (where &w : b->at)
                    w = {ST_RUNNING, "", 0};
                __atomic_store_n(&b->start_word, b->start_word + 1 == kQuit ? 1 : b->start_word + 1,
                                 __ATOMIC_RELEASE);
                syscall(SYS_futex, &b->start_word, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
                while (b->exited < b->nthreads) {
                    int rc = pthread_cond_timedwait(&b->done_cv, &b->mu, &deadline);
                    if (rc == ETIMEDOUT && b->exited < b->nthreads)
                        fail(b, "the kernel did not finish within %.0f s (DT_CUDA_HOST_TIMEOUT)",
                             limit);
                }
                free(b->dyn);
                b->dyn = NULL;
            }
    if (b->used_sync)
        sync_users.insert(kernel_key(d));
done:
    for (unsigned i = 0; i < b->nshared; i++)
        free(b->shared[i].ptr);
    b->nshared = 0;
    pthread_mutex_unlock(&b->mu);
}
