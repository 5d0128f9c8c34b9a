/* A cache of freed device blocks per local device, in front of the kinds' alloc and free
 * (cudaMalloc and cudaFree cost milliseconds and cudaFree waits for the whole device, so a
 * relayout that allocated its output fresh each call ran at a fraction of the copy speed).
 * A block is reused by the same device only, so work on its stream stays ordered. Host
 * memory (the CPU kind) has its own pool and passes straight through. Capped by
 * DT_DEVICE_POOL_MAX_MB per device (default 1024, 0 turns caching off); emptied when an
 * allocation fails, before trying again, and at dt_finalize. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "runtime/device.h"
#include "runtime/env.h"
#include "runtime/error.h"

enum { MAX_CACHED = 256 };

typedef struct cached {
    void *ptr;
    size_t bytes;
} cached;

typedef struct dev_cache {
    const dt__device *dev;
    cached blocks[MAX_CACHED];
    int n;
    size_t bytes;
} dev_cache;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dev_cache *caches;
static int ncaches;
static size_t cap_bytes = (size_t)1024 << 20;

dt_status dt__device_pool_configure(void)
{
    uint64_t bytes = 0;
    dt_status st = dt__env_mib("DT_DEVICE_POOL_MAX_MB", 1024, 0, 1ull << 24,
                               "MiB cached per device", &bytes);
    if (st == DT_OK)
        cap_bytes = (size_t)bytes;
    return st;
}

/* The cache of dev, created on first use; NULL when out of memory. Under lock. */
static dev_cache *cache_of(const dt__device *dev)
{
    for (int i = 0; i < ncaches; i++)
        if (caches[i].dev == dev)
            return &caches[i];
    dev_cache *c = realloc(caches, sizeof *caches * (size_t)(ncaches + 1));
    if (!c)
        return NULL;
    caches = c;
    c = &caches[ncaches++];
    c->dev = dev;
    c->n = 0;
    c->bytes = 0;
    return c;
}

/* Frees every cached block of c (all of them when c is NULL). Under lock. */
static void drain(dev_cache *c)
{
    for (int i = 0; i < ncaches; i++) {
        dev_cache *d = &caches[i];
        if (c && d != c)
            continue;
        for (int k = 0; k < d->n; k++)
            d->dev->kind->free(d->dev, d->blocks[k].ptr);
        d->n = 0;
        d->bytes = 0;
    }
}

dt_status dt__device_alloc(const dt__device *dev, size_t bytes, void **ptr_out)
{
    if (bytes == 0)
        bytes = 1;
    if (dev->kind->host_visible) /* host memory has its own pool (runtime/memory.c) */
        return dev->kind->alloc(dev, bytes, ptr_out);
    pthread_mutex_lock(&lock);
    dev_cache *c = cache_of(dev);
    /* The smallest cached block that holds bytes without wasting more than half of it. */
    int best = -1;
    for (int k = 0; c && k < c->n; k++) {
        size_t b = c->blocks[k].bytes;
        if (b >= bytes && b / 2 <= bytes && (best < 0 || b < c->blocks[best].bytes))
            best = k;
    }
    if (best >= 0) {
        *ptr_out = c->blocks[best].ptr;
        c->bytes -= c->blocks[best].bytes;
        c->blocks[best] = c->blocks[--c->n];
        pthread_mutex_unlock(&lock);
        return DT_OK;
    }
    pthread_mutex_unlock(&lock);
    dt_status st = dev->kind->alloc(dev, bytes, ptr_out);
    if (st == DT_ERR_NO_MEMORY) {
        /* What the cache holds may be what is missing: give it back and try once more. */
        pthread_mutex_lock(&lock);
        drain(NULL);
        pthread_mutex_unlock(&lock);
        st = dev->kind->alloc(dev, bytes, ptr_out);
    }
    return st;
}

void dt__device_free(const dt__device *dev, void *ptr, size_t bytes)
{
    if (!ptr)
        return;
    if (bytes == 0)
        bytes = 1;
    if (dev->kind->host_visible) {
        dev->kind->free(dev, ptr);
        return;
    }
    pthread_mutex_lock(&lock);
    dev_cache *c = cache_of(dev);
    if (c && bytes <= cap_bytes) {
        /* Make room: the oldest blocks go first. */
        while (c->n > 0 && (c->n == MAX_CACHED || c->bytes + bytes > cap_bytes)) {
            dev->kind->free(dev, c->blocks[0].ptr);
            c->bytes -= c->blocks[0].bytes;
            c->blocks[0] = c->blocks[--c->n];
        }
        c->blocks[c->n++] = (cached){ptr, bytes};
        c->bytes += bytes;
        pthread_mutex_unlock(&lock);
        return;
    }
    pthread_mutex_unlock(&lock);
    dev->kind->free(dev, ptr);
}

void dt__device_pool_trim(void)
{
    pthread_mutex_lock(&lock);
    drain(NULL);
    free(caches);
    caches = NULL;
    ncaches = 0;
    pthread_mutex_unlock(&lock);
}
