/* The simulated GPU's memory: one memfd arena per process mapped twice, a no-access device
 * view whose addresses are handed out and a read/write shadow for the stream threads, and a
 * first-fit allocator over it (a sorted table of segments, neighbours merged on free). */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime/error.h"
#include "runtime/sim.h"

#define ALIGN ((size_t)256)        /* as cudaMalloc */
#define RELEASE_MIN ((size_t)1 << 16) /* freed blocks this large give their pages back */

typedef struct segment {
    size_t off, size;
    int used;
} segment;

static struct {
    char *dev;    /* the device view (PROT_NONE) */
    char *shadow; /* the same pages, read/write */
    size_t cap;
    pthread_mutex_t lock;
    segment *seg; /* sorted by offset, covering [0, cap) */
    size_t nseg, segcap;
    size_t free_bytes;
} arena = {.lock = PTHREAD_MUTEX_INITIALIZER};

dt_status dt__sim_arena_open(size_t bytes)
{
    bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    int fd = memfd_create("dtensor-sim-gpu", MFD_CLOEXEC);
    if (fd < 0)
        return dt__error(DT_ERR_NO_MEMORY, "simulated GPU: memfd_create: %s", strerror(errno));
    dt_status st = DT_OK;
    void *dev = MAP_FAILED, *shadow = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        st = dt__error(DT_ERR_NO_MEMORY, "simulated GPU: sizing the %zu-byte arena: %s", bytes,
                       strerror(errno));
        goto out_close;
    }
    dev = mmap(NULL, bytes, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (dev != MAP_FAILED)
        shadow = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    arena.seg = malloc(16 * sizeof *arena.seg);
    if (dev == MAP_FAILED || shadow == MAP_FAILED || !arena.seg) {
        st = dt__error(DT_ERR_NO_MEMORY, "simulated GPU: mapping the %zu-byte arena "
                       "(DT_SIM_MEMORY_MB): %s", bytes, arena.seg ? strerror(errno) : "no memory");
        if (dev != MAP_FAILED)
            munmap(dev, bytes);
        if (shadow != MAP_FAILED)
            munmap(shadow, bytes);
        free(arena.seg);
        arena.seg = NULL;
        goto out_close;
    }
    arena.dev = dev;
    arena.shadow = shadow;
    arena.cap = bytes;
    arena.seg[0] = (segment){0, bytes, 0};
    arena.nseg = 1;
    arena.segcap = 16;
    arena.free_bytes = bytes;
out_close:
    close(fd); /* the mappings keep the memory */
    return st;
}

void dt__sim_arena_close(void)
{
    pthread_mutex_lock(&arena.lock);
    if (arena.dev) {
        munmap(arena.dev, arena.cap);
        munmap(arena.shadow, arena.cap);
    }
    free(arena.seg);
    arena.dev = arena.shadow = NULL;
    arena.seg = NULL;
    arena.cap = arena.nseg = arena.segcap = arena.free_bytes = 0;
    pthread_mutex_unlock(&arena.lock);
}

/* Makes room for one more segment at index i (shifting the rest up). Lock held. */
static int insert_at(size_t i)
{
    if (arena.nseg == arena.segcap) {
        segment *s = realloc(arena.seg, 2 * arena.segcap * sizeof *s);
        if (!s)
            return -1;
        arena.seg = s;
        arena.segcap *= 2;
    }
    memmove(&arena.seg[i + 1], &arena.seg[i], (arena.nseg - i) * sizeof *arena.seg);
    arena.nseg++;
    return 0;
}

static void remove_at(size_t i)
{
    memmove(&arena.seg[i], &arena.seg[i + 1], (arena.nseg - i - 1) * sizeof *arena.seg);
    arena.nseg--;
}

dt_status dt__sim_alloc(int device_id, size_t bytes, void **ptr_out)
{
    size_t need = bytes ? bytes : 1;
    if (need > SIZE_MAX - ALIGN)
        need = SIZE_MAX - ALIGN; /* fails below: no arena is that large */
    need = (need + ALIGN - 1) / ALIGN * ALIGN;
    pthread_mutex_lock(&arena.lock);
    size_t largest = 0, i = 0;
    for (; i < arena.nseg; i++) {
        if (arena.seg[i].used)
            continue;
        if (arena.seg[i].size >= need)
            break;
        largest = arena.seg[i].size > largest ? arena.seg[i].size : largest;
    }
    if (i < arena.nseg && arena.seg[i].size > need) {
        if (insert_at(i + 1) != 0) {
            pthread_mutex_unlock(&arena.lock);
            return dt__error(DT_ERR_NO_MEMORY, "simulated GPU device %d: no host memory for "
                             "the block table (allocating %zu bytes)", device_id, bytes);
        }
        arena.seg[i + 1] = (segment){arena.seg[i].off + need, arena.seg[i].size - need, 0};
        arena.seg[i].size = need;
    }
    if (i == arena.nseg) {
        size_t free_b = arena.free_bytes, cap = arena.cap;
        pthread_mutex_unlock(&arena.lock);
        if (cap == 0)
            return dt__error(DT_ERR_UNSUPPORTED, "simulated GPU device %d: allocating %zu "
                             "bytes before dt_init or after dt_finalize", device_id, bytes);
        return dt__error(DT_ERR_NO_MEMORY, "simulated GPU device %d: out of device memory "
                         "allocating %zu bytes (%zu of %zu bytes free, largest free block %zu; "
                         "DT_SIM_MEMORY_MB sets the size)", device_id, bytes, free_b, cap,
                         largest);
    }
    arena.seg[i].used = 1;
    arena.free_bytes -= need;
    *ptr_out = arena.dev + arena.seg[i].off;
    pthread_mutex_unlock(&arena.lock);
    return DT_OK;
}

/* Gives the pages inside [off, off + size) back to the system (they read as zeros after). */
static void release_pages(size_t off, size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t lo = (off + page - 1) / page * page, hi = (off + size) / page * page;
    if (size >= RELEASE_MIN && hi > lo)
        madvise(arena.shadow + lo, hi - lo, MADV_REMOVE);
}

void dt__sim_free(void *ptr)
{
    if (!ptr || !dt__sim_owns(ptr, 0))
        return;
    size_t off = (size_t)((char *)ptr - arena.dev);
    pthread_mutex_lock(&arena.lock);
    size_t lo = 0, hi = arena.nseg;
    while (hi - lo > 1) { /* the last segment starting at or before off */
        size_t mid = lo + (hi - lo) / 2;
        if (arena.seg[mid].off <= off)
            lo = mid;
        else
            hi = mid;
    }
    segment *s = arena.nseg ? &arena.seg[lo] : NULL;
    if (s && s->off == off && s->used) {
        s->used = 0;
        arena.free_bytes += s->size;
        release_pages(s->off, s->size);
        if (lo + 1 < arena.nseg && !arena.seg[lo + 1].used) {
            s->size += arena.seg[lo + 1].size;
            remove_at(lo + 1);
        }
        if (lo > 0 && !arena.seg[lo - 1].used) {
            arena.seg[lo - 1].size += s->size;
            remove_at(lo);
        }
    }
    pthread_mutex_unlock(&arena.lock);
}

int dt__sim_owns(const void *p, size_t bytes)
{
    const char *c = p;
    return arena.dev && c >= arena.dev && bytes <= arena.cap &&
           (size_t)(c - arena.dev) <= arena.cap - bytes;
}

void *dt__sim_xlate(const void *p)
{
    const char *c = p;
    if (arena.dev && c >= arena.dev && c < arena.dev + arena.cap)
        return arena.shadow + (c - arena.dev);
    return (void *)(uintptr_t)p;
}

size_t dt__sim_capacity(void)
{
    return arena.cap;
}

size_t dt__sim_free_bytes(void)
{
    pthread_mutex_lock(&arena.lock);
    size_t f = arena.free_bytes;
    pthread_mutex_unlock(&arena.lock);
    return f;
}
