/* Host memory pool: size-classed, 64-byte aligned blocks with a small header, kept on
 * per-class free lists for reuse (fresh pages cost ~10 us to touch), capped by
 * DT_POOL_MAX_MB. Thread-safe; works before dt_init and after dt_finalize. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/env.h"
#include "runtime/error.h"

#define HDR_BYTES 64u
#define MIN_SHIFT 8                  /* smallest class: 256 B */
#define SMALL_MAX_SHIFT 20           /* powers of two up to 1 MiB */
#define LARGE_STEP ((size_t)2 << 20) /* larger blocks: multiples of 2 MiB */
#define MID_MAX_SHIFT 23             /* 2, 4, 6, 8 MiB; above: four classes per doubling */
#define MAX_SHIFT 47                 /* largest class: 2^48 bytes */
#define N_SMALL (SMALL_MAX_SHIFT - MIN_SHIFT + 1)
#define N_MID 4
#define N_CLASSES (N_SMALL + N_MID + 4 * (MAX_SHIFT - MID_MAX_SHIFT + 1))
#define DEFAULT_MAX_MB 2048u
#define MAX_MAX_MB (1u << 20)        /* 1 TiB */

#define MAGIC_LIVE 0x64744c495645626bull /* handed out */
#define MAGIC_FREE 0x647446524545626bull /* on a free list */
#define MAGIC_DEAD 0x6474444541446262ull /* about to go back to the system */

typedef struct block_hdr {
    _Atomic uint64_t magic;
    uint64_t size; /* usable bytes (the class size) */
    uint64_t requested; /* bytes asked for by the live holder */
    struct block_hdr *next;
    uint32_t cls;
} block_hdr;

_Static_assert(sizeof(block_hdr) <= HDR_BYTES, "block header must fit in 64 bytes");

typedef struct size_class {
    pthread_mutex_t lock;
    block_hdr *head;
} size_class;

static size_class classes[N_CLASSES];
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t limit_bytes;
static _Atomic uint64_t n_allocs, n_reuses, n_bad_frees, bytes_cached, bytes_in_use,
    bytes_requested, peak_requested;

/* Adds bytes to bytes_requested and raises peak_requested to the new total. */
static void add_requested(uint64_t bytes)
{
    uint64_t now = atomic_fetch_add(&bytes_requested, bytes) + bytes;
    uint64_t peak = atomic_load(&peak_requested);
    while (now > peak && !atomic_compare_exchange_weak(&peak_requested, &peak, now))
        ;
}

/* Parses DT_POOL_MAX_MB: unset -> default; else a decimal integer 0..MAX_MAX_MB. */
static dt_status parse_limit(uint64_t *bytes_out)
{
    return dt__env_mib("DT_POOL_MAX_MB", DEFAULT_MAX_MB, 0, MAX_MAX_MB,
                       "MiB of host memory the pool may cache", bytes_out);
}

static void pool_init(void)
{
    uint64_t lim;
    for (int i = 0; i < N_CLASSES; i++) {
        pthread_mutex_init(&classes[i].lock, NULL);
        classes[i].head = NULL;
    }
    /* Before dt_init a bad value cannot be reported: use the default until dt_init says so. */
    if (parse_limit(&lim) != DT_OK)
        lim = (uint64_t)DEFAULT_MAX_MB << 20;
    atomic_store(&limit_bytes, lim);
}

dt_status dt__pool_configure(void)
{
    uint64_t lim;
    pthread_once(&pool_once, pool_init);
    dt_status st = parse_limit(&lim);
    if (st != DT_OK)
        return st;
    atomic_store(&limit_bytes, lim);
    return DT_OK;
}

/* Size class of a request: index and usable size. -1 if larger than the largest class. */
static int class_of(size_t bytes, size_t *size_out)
{
    if (bytes <= ((size_t)1 << MIN_SHIFT)) {
        *size_out = (size_t)1 << MIN_SHIFT;
        return 0;
    }
    if (bytes <= ((size_t)1 << SMALL_MAX_SHIFT)) {
        int shift = MIN_SHIFT;
        while (((size_t)1 << shift) < bytes)
            shift++;
        *size_out = (size_t)1 << shift;
        return shift - MIN_SHIFT;
    }
    if (bytes <= ((size_t)1 << MID_MAX_SHIFT)) {
        size_t k = (bytes + LARGE_STEP - 1) / LARGE_STEP; /* 1..4 */
        *size_out = k * LARGE_STEP;
        return N_SMALL + (int)k - 1;
    }
    /* 2^k < bytes <= 2^(k+1): classes 2^k * (1 + j/4), j = 1..4. */
    int k = MID_MAX_SHIFT;
    while (k < MAX_SHIFT && ((size_t)2 << k) < bytes)
        k++;
    if (((size_t)2 << k) < bytes)
        return -1;
    size_t base = (size_t)1 << k, step = base >> 2;
    size_t j = (bytes - base + step - 1) / step; /* 1..4 */
    *size_out = base + j * step;
    return N_SMALL + N_MID + 4 * (k - MID_MAX_SHIFT) + (int)j - 1;
}

dt_status dt_host_alloc(size_t bytes, void **ptr_out)
{
    size_t size = 0;
    block_hdr *h;
    if (!ptr_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_host_alloc: ptr_out is NULL");
    pthread_once(&pool_once, pool_init);
    int cls = class_of(bytes, &size);
    if (cls < 0)
        return dt__error(DT_ERR_NO_MEMORY,
                         "dt_host_alloc: %zu bytes is more than the largest block (2^48 bytes)",
                         bytes);

    size_class *c = &classes[cls];
    pthread_mutex_lock(&c->lock);
    h = c->head;
    if (h)
        c->head = h->next;
    pthread_mutex_unlock(&c->lock);

    if (h) {
        atomic_fetch_sub(&bytes_cached, size);
        atomic_fetch_add(&n_reuses, 1);
    } else {
        void *base = NULL;
        int rc = posix_memalign(&base, HDR_BYTES, HDR_BYTES + size);
        if (rc != 0)
            return dt__error(DT_ERR_NO_MEMORY,
                             "dt_host_alloc: cannot allocate %zu bytes (block of %zu): %s",
                             bytes, size, strerror(rc));
        h = base;
        h->size = size;
        h->cls = (uint32_t)cls;
    }
    h->next = NULL;
    h->requested = bytes;
    atomic_store(&h->magic, MAGIC_LIVE);
    add_requested(bytes);
    atomic_fetch_add(&n_allocs, 1);
    atomic_fetch_add(&bytes_in_use, size);
    *ptr_out = (unsigned char *)h + HDR_BYTES;
    return DT_OK;
}

void dt_host_free(void *ptr)
{
    if (!ptr)
        return;
    pthread_once(&pool_once, pool_init);
    block_hdr *h = (block_hdr *)(void *)((unsigned char *)ptr - HDR_BYTES);
    uint64_t want = MAGIC_LIVE;
    /* A double free finds MAGIC_FREE, a foreign pointer (most likely) garbage: count and
     * ignore both rather than corrupt the lists. Only blocks still in the pool are caught. */
    if (!atomic_compare_exchange_strong(&h->magic, &want, MAGIC_FREE)) {
        atomic_fetch_add(&n_bad_frees, 1);
        return;
    }
    size_t size = h->size;
    atomic_fetch_sub(&bytes_in_use, size);
    atomic_fetch_sub(&bytes_requested, h->requested);
    uint64_t before = atomic_fetch_add(&bytes_cached, size);
    if (before + size > atomic_load(&limit_bytes)) {
        atomic_fetch_sub(&bytes_cached, size);
        atomic_store(&h->magic, MAGIC_DEAD);
        free(h);
        return;
    }
    size_class *c = &classes[h->cls];
    pthread_mutex_lock(&c->lock);
    h->next = c->head;
    c->head = h;
    pthread_mutex_unlock(&c->lock);
}

void dt__pool_count(size_t size, size_t requested, int live)
{
    pthread_once(&pool_once, pool_init);
    if (live) {
        atomic_fetch_add(&n_allocs, 1);
        atomic_fetch_add(&bytes_in_use, size);
        add_requested(requested);
    } else {
        atomic_fetch_sub(&bytes_in_use, size);
        atomic_fetch_sub(&bytes_requested, requested);
    }
}

void dt_host_pool_stats(dt_pool_stats *stats_out)
{
    if (!stats_out)
        return;
    pthread_once(&pool_once, pool_init);
    dt_pool_stats s;
    s.allocs = atomic_load(&n_allocs);
    s.reuses = atomic_load(&n_reuses);
    s.bytes_cached = atomic_load(&bytes_cached);
    s.bytes_in_use = atomic_load(&bytes_in_use);
    s.bytes_requested = atomic_load(&bytes_requested);
    s.peak_bytes_requested = atomic_load(&peak_requested);
    s.bad_frees = atomic_load(&n_bad_frees);
    s.bytes_limit = atomic_load(&limit_bytes);
    *stats_out = s;
}

void dt_host_pool_reset_peak(void)
{
    pthread_once(&pool_once, pool_init);
    atomic_store(&peak_requested, atomic_load(&bytes_requested));
}

void dt_host_pool_trim(void)
{
    pthread_once(&pool_once, pool_init);
    for (int i = 0; i < N_CLASSES; i++) {
        size_class *c = &classes[i];
        pthread_mutex_lock(&c->lock);
        block_hdr *h = c->head;
        c->head = NULL;
        pthread_mutex_unlock(&c->lock);
        while (h) {
            block_hdr *next = h->next;
            atomic_fetch_sub(&bytes_cached, h->size);
            atomic_store(&h->magic, MAGIC_DEAD);
            free(h);
            h = next;
        }
    }
}
