/* The pool of host staging blocks (runtime/staging.h). The staged transport used to take its
 * slots from the kind's host_alloc and free them at the end of every exchange: for CUDA that
 * is cudaMallocHost/cudaFreeHost per call, each costing milliseconds and cudaFreeHost waiting
 * for the device. Blocks are grouped in power-of-two size classes, so transfers of nearby
 * sizes share them; the pool is bounded (DT_STAGED_POOL_MB) and one mutex guards it (a
 * get or put is a short scan under the lock; host_alloc and host_free run outside it).
 * dt_finalize empties it. docs/transports.md. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/staging.h"

enum {
    MAX_CACHED = 1024,       /* blocks the pool holds at most */
    MIN_CLASS_SHIFT = 12,    /* 4 KiB, the smallest class */
    MAX_CLASS_SHIFT = 40,    /* larger requests are refused */
};
#define DEFAULT_LIMIT_MB 256ull
#define MAX_LIMIT_MB (1ull << 20)

typedef struct block {
    const dt__device_kind *kind;
    void *ptr;
    size_t bytes;            /* the class size */
} block;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static block cached[MAX_CACHED];
static int ncached;
static int configured;       /* DT_STAGED_POOL_MB read since the last trim */
static int hooked;           /* dt__staging_trim registered with dt_finalize */
static uint64_t limit_bytes = DEFAULT_LIMIT_MB << 20;
static dt__staging_stats stats;

/* The class size holding `bytes`: the next power of two, at least 4 KiB; 0 when too large. */
static size_t class_of(size_t bytes)
{
    size_t c = (size_t)1 << MIN_CLASS_SHIFT;
    while (c < bytes) {
        if (c >= (size_t)1 << MAX_CLASS_SHIFT)
            return 0;
        c <<= 1;
    }
    return c;
}

/* Reads DT_STAGED_POOL_MB (MiB the pool may hold, 0..2^20). Under lock. */
static dt_status configure(void)
{
    if (configured)
        return DT_OK;
    dt_status st = dt__env_mib("DT_STAGED_POOL_MB", DEFAULT_LIMIT_MB, 0, MAX_LIMIT_MB,
                               "MiB of host staging kept between exchanges", &limit_bytes);
    if (st != DT_OK)
        return st;
    stats.bytes_limit = limit_bytes;
    configured = 1;
    return DT_OK;
}

/* Takes every cached block out of the pool into out[] (MAX_CACHED entries). Under lock. */
static int take_all(block *out)
{
    int n = ncached;
    for (int i = 0; i < n; i++)
        out[i] = cached[i];
    ncached = 0;
    stats.bytes_cached = 0;
    stats.releases += (uint64_t)n;
    return n;
}

static void free_blocks(block *b, int n)
{
    for (int i = 0; i < n; i++)
        b[i].kind->host_free(b[i].ptr);
}

void dt__staging_trim(void)
{
    static block out[MAX_CACHED]; /* under `drain` so no two trims share it */
    static pthread_mutex_t drain = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&drain);
    pthread_mutex_lock(&lock);
    int n = take_all(out);
    configured = 0;
    pthread_mutex_unlock(&lock);
    free_blocks(out, n);
    pthread_mutex_unlock(&drain);
}

dt_status dt__staging_get(const dt__device_kind *kind, size_t bytes, void **ptr_out)
{
    size_t cls = class_of(bytes);
    if (cls == 0)
        return dt__error(DT_ERR_NO_MEMORY, "host staging of %zu bytes is more than the largest "
                         "block (2^%d bytes)", bytes, MAX_CLASS_SHIFT);
    pthread_mutex_lock(&lock);
    dt_status st = configure();
    if (st == DT_OK && !hooked) {
        st = dt__at_finalize(dt__staging_trim);
        hooked = st == DT_OK;
    }
    if (st != DT_OK) {
        pthread_mutex_unlock(&lock);
        return st;
    }
    /* The most recently cached block of the class (its pages are the likeliest still warm). */
    for (int i = ncached - 1; i >= 0; i--)
        if (cached[i].kind == kind && cached[i].bytes == cls) {
            *ptr_out = cached[i].ptr;
            cached[i] = cached[--ncached];
            stats.bytes_cached -= cls;
            stats.bytes_live += cls;
            stats.reuses++;
            pthread_mutex_unlock(&lock);
            return DT_OK;
        }
    pthread_mutex_unlock(&lock);
    st = kind->host_alloc(cls, ptr_out);
    if (st == DT_ERR_NO_MEMORY) {
        /* What the pool holds may be what is missing: give it back and try once more. */
        dt__staging_trim();
        st = kind->host_alloc(cls, ptr_out);
    }
    if (st != DT_OK)
        return st;
    pthread_mutex_lock(&lock);
    stats.allocs++;
    stats.bytes_live += cls;
    pthread_mutex_unlock(&lock);
    return DT_OK;
}

void dt__staging_put(const dt__device_kind *kind, void *ptr, size_t bytes)
{
    if (!ptr)
        return;
    size_t cls = class_of(bytes);
    pthread_mutex_lock(&lock);
    stats.bytes_live -= cls;
    if (ncached < MAX_CACHED && stats.bytes_cached + cls <= limit_bytes) {
        cached[ncached++] = (block){kind, ptr, cls};
        stats.bytes_cached += cls;
        pthread_mutex_unlock(&lock);
        return;
    }
    stats.releases++;
    pthread_mutex_unlock(&lock);
    kind->host_free(ptr);
}

void dt__staging_stats_get(dt__staging_stats *out)
{
    pthread_mutex_lock(&lock);
    *out = stats;
    out->bytes_limit = limit_bytes;
    pthread_mutex_unlock(&lock);
}
