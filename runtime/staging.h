/* The pool of host staging memory (runtime/staging_pool.c): the blocks a device kind's
 * host_alloc gives (page-locked for CUDA, where each allocation costs milliseconds), kept
 * after use so that the staged transport's next exchange reuses them. docs/transports.md.
 * Not installed. */
#ifndef DTENSOR_RUNTIME_STAGING_H
#define DTENSOR_RUNTIME_STAGING_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/status.h"

typedef struct dt__device_kind dt__device_kind; /* runtime/device.h */

typedef struct dt__staging_stats {
    uint64_t allocs;       /* blocks taken from the kinds' host_alloc */
    uint64_t reuses;       /* dt__staging_get calls served from the pool */
    uint64_t releases;     /* blocks given back to the kinds' host_free (cap, trim) */
    uint64_t bytes_cached; /* in the pool now, in class sizes */
    uint64_t bytes_live;   /* handed out and not yet put back, in class sizes */
    uint64_t bytes_limit;  /* DT_STAGED_POOL_MB in bytes */
} dt__staging_stats;

/* A block of at least `bytes` of kind's host staging: a cached one of the same size class
 * (powers of two from 4 KiB), else a new one from kind->host_alloc (after emptying the pool
 * and trying once more when that runs out of memory). DT_ERR_INVALID_ARGUMENT naming a bad
 * DT_STAGED_POOL_MB. Thread-safe. */
dt_status dt__staging_get(const dt__device_kind *kind, size_t bytes, void **ptr_out);
/* Gives back a block from dt__staging_get with the same kind and bytes: cached unless that
 * would hold more than DT_STAGED_POOL_MB (default 256; 0: cache nothing), then freed.
 * Thread-safe. */
void dt__staging_put(const dt__device_kind *kind, void *ptr, size_t bytes);
/* Frees every cached block and re-reads DT_STAGED_POOL_MB at the next get; dt_finalize calls
 * it (registered at the first get). */
void dt__staging_trim(void);
void dt__staging_stats_get(dt__staging_stats *out);

#endif
