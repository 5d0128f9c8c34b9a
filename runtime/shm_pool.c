/* The same-host shared-memory pool: one segment per process (DT_SHM_POOL_MB, capped by the
 * free space of /dev/shm shared among the host's processes), mapped by every process of its
 * host at dt_init. A memfd opened by the peers through /proc/<pid>/fd/<fd> where the kernel
 * allows it (nothing can outlive the processes), else a POSIX shared-memory name unlinked as
 * soon as every peer mapped it (names a killed process left are removed at the next start).
 * The segment starts with the channels its owner sends through (runtime/shm.h); the rest
 * holds CPU tensor memory, handed out first-fit from a sorted list of free extents.
 * MPI is used here only to set the segments up. docs/transports.md, "shm". */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "runtime/comm.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/shm.h"

#define SHM_DEFAULT_MB 1024u
#define SHM_ALIGN ((size_t)64)
#define SHM_MAGIC 0x6474534d424c4b21ull /* a live block */
#define NAME_PREFIX "dtshm."

enum { KIND_MEMFD = 1, KIND_NAME = 2 };

typedef struct block {   /* the 64 bytes before every block handed out */
    uint64_t magic, size, requested;
} block;

typedef struct extent {
    size_t off, len;
} extent;

/* What a process tells its host peers about its segment. */
typedef struct seg_info {
    int pid, fd, kind, ok;
    uint64_t bytes;
    char name[64];
} seg_info;

typedef struct segment {
    unsigned char *base;
    size_t bytes, heap_off;      /* the blocks start at heap_off */
    int fd, kind;
    char name[64];
    extent *free_list;           /* sorted by offset, neighbours merged */
    size_t nfree, cap_free;
    size_t live;                 /* blocks handed out */
} segment;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static segment own = {.fd = -1};
static segment retired = {.fd = -1};  /* a former run's segment, still holding blocks */
static int up;
static int nlocal, self;
static unsigned char **peer_base;
static size_t *peer_bytes;
static pid_t *peer_pid;
static int *client_local;            /* per client of dt__comm: its host index or -1 */
static char absence[256] = "the shared-memory pool is not set up (dt_init starts it)";

int dt__shm_up(void)
{
    return up;
}

const char *dt__shm_absence(void)
{
    return absence;
}

/* ---- the allocator ---- */

static int extents_reserve(segment *s, size_t n)
{
    if (n <= s->cap_free)
        return 1;
    size_t cap = s->cap_free ? 2 * s->cap_free : 64;
    while (cap < n)
        cap *= 2;
    extent *e = realloc(s->free_list, cap * sizeof *e);
    if (!e)
        return 0;
    s->free_list = e;
    s->cap_free = cap;
    return 1;
}

/* Gives [off, off+len) back, merging it with its neighbours. 0 when out of memory for the
 * list (the extent is then lost to the pool, never handed out twice). */
static int extent_put(segment *s, size_t off, size_t len)
{
    size_t i = 0;
    while (i < s->nfree && s->free_list[i].off < off)
        i++;
    int left = i > 0 && s->free_list[i - 1].off + s->free_list[i - 1].len == off;
    int right = i < s->nfree && off + len == s->free_list[i].off;
    if (left && right) {
        s->free_list[i - 1].len += len + s->free_list[i].len;
        memmove(&s->free_list[i], &s->free_list[i + 1], (s->nfree - i - 1) * sizeof(extent));
        s->nfree--;
    } else if (left) {
        s->free_list[i - 1].len += len;
    } else if (right) {
        s->free_list[i].off = off;
        s->free_list[i].len += len;
    } else {
        if (!extents_reserve(s, s->nfree + 1))
            return 0;
        memmove(&s->free_list[i + 1], &s->free_list[i], (s->nfree - i) * sizeof(extent));
        s->free_list[i] = (extent){off, len};
        s->nfree++;
    }
    return 1;
}

int dt__shm_alloc(size_t bytes, void **ptr_out)
{
    size_t need = (sizeof(block) > SHM_ALIGN ? sizeof(block) : SHM_ALIGN) +
                  ((bytes ? bytes : 1) + SHM_ALIGN - 1) / SHM_ALIGN * SHM_ALIGN;
    if (!up || bytes > own.bytes)
        return 0;
    pthread_mutex_lock(&lock);
    size_t i = 0;
    while (i < own.nfree && own.free_list[i].len < need)
        i++;
    if (i == own.nfree) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    size_t off = own.free_list[i].off;
    own.free_list[i].off += need;
    own.free_list[i].len -= need;
    if (own.free_list[i].len == 0) {
        memmove(&own.free_list[i], &own.free_list[i + 1], (own.nfree - i - 1) * sizeof(extent));
        own.nfree--;
    }
    own.live++;
    pthread_mutex_unlock(&lock);
    block *b = (block *)(void *)(own.base + off);
    b->magic = SHM_MAGIC;
    b->size = need;
    b->requested = bytes;
    dt__pool_count(need, bytes, 1);
    *ptr_out = own.base + off + SHM_ALIGN;
    return 1;
}

static int in_heap(const segment *s, const void *p)
{
    const unsigned char *c = p;
    return s->base && c >= s->base + s->heap_off + SHM_ALIGN && c < s->base + s->bytes;
}

static void unmap_segment(segment *s)
{
    if (s->base)
        munmap(s->base, s->bytes);
    if (s->fd >= 0)
        close(s->fd);
    free(s->free_list);
    *s = (segment){.fd = -1};
}

int dt__shm_free(void *ptr)
{
    if (!ptr)
        return 0;
    pthread_mutex_lock(&lock);
    segment *s = in_heap(&own, ptr) ? &own : in_heap(&retired, ptr) ? &retired : NULL;
    if (!s) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    block *b = (block *)(void *)((unsigned char *)ptr - SHM_ALIGN);
    if (b->magic != SHM_MAGIC) {     /* a double free: ignored, as the host pool does */
        pthread_mutex_unlock(&lock);
        return 1;
    }
    b->magic = 0;
    size_t size = b->size, requested = b->requested;
    extent_put(s, (size_t)((unsigned char *)b - s->base), size);
    s->live--;
    if (s == &retired && !s->live)
        unmap_segment(s);
    pthread_mutex_unlock(&lock);
    dt__pool_count(size, requested, 0);
    return 1;
}

int64_t dt__shm_offset(const void *p, size_t bytes)
{
    if (!up || !in_heap(&own, p))
        return -1;
    size_t off = (size_t)((const unsigned char *)p - own.base);
    return off + bytes <= own.bytes ? (int64_t)off : -1;
}

int dt__shm_local(int client)
{
    return up && client >= 0 && client < dt_num_clients() ? client_local[client] : -1;
}

unsigned char *dt__shm_segment(int local)
{
    return peer_base[local];
}

pid_t dt__shm_pid(int local)
{
    return peer_pid[local];
}

int dt__shm_self(void)
{
    return self;
}

dt__shm_chan *dt__shm_chan_of(int from, int to)
{
    return (dt__shm_chan *)(void *)peer_base[from] + to;
}

/* ---- setting up ---- */

/* DT_SHM_POOL_MB (default SHM_DEFAULT_MB), capped by /dev/shm's free space / nlocal. */
static dt_status pool_bytes(int n, size_t *out)
{
    uint64_t want = 0;
    dt_status st = dt__env_mib("DT_SHM_POOL_MB", SHM_DEFAULT_MB, 1, 1u << 20,
                               "MiB of shared memory per process", &want);
    if (st != DT_OK)
        return st;
    size_t bytes = (size_t)want;
    struct statvfs fs;
    if (statvfs("/dev/shm", &fs) == 0) {
        size_t avail = (size_t)fs.f_bavail * fs.f_frsize / (size_t)(n > 0 ? n : 1);
        if (avail < bytes)
            bytes = avail & ~(((size_t)1 << 20) - 1);
    }
    *out = bytes;
    return DT_OK;
}

/* Removes the names of processes of this user that no longer run (killed before unlinking). */
static void clean_stale_names(void)
{
    DIR *d = opendir("/dev/shm");
    char prefix[64];
    snprintf(prefix, sizeof prefix, NAME_PREFIX "%u.", (unsigned)getuid());
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        long pid = strtol(e->d_name + strlen(prefix), NULL, 10);
        if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
            char name[300];
            snprintf(name, sizeof name, "/%s", e->d_name);
            shm_unlink(name);
        }
    }
    closedir(d);
}

/* Creates and maps the own segment of `kind`; why (on failure) says what went wrong. */
static int create_segment(int kind, size_t bytes, char *why, size_t len)
{
    static unsigned serial;
    int fd;
    own.name[0] = '\0';
    if (kind == KIND_MEMFD) {
        fd = memfd_create("dtensor-shm", MFD_CLOEXEC);
    } else {
        snprintf(own.name, sizeof own.name, "/" NAME_PREFIX "%u.%ld.%u", (unsigned)getuid(),
                 (long)getpid(), serial++);
        fd = shm_open(own.name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0) {
        snprintf(why, len, "%s: %s", kind == KIND_MEMFD ? "memfd_create" : "shm_open",
                 strerror(errno));
        own.name[0] = '\0';
        return 0;
    }
    void *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0)
        base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        snprintf(why, len, "a segment of %zu MiB: %s", bytes >> 20, strerror(errno));
        close(fd);
        if (own.name[0])
            shm_unlink(own.name);
        own.name[0] = '\0';
        return 0;
    }
    own.base = base;
    own.bytes = bytes;
    own.fd = fd;
    own.kind = kind;
    return 1;
}

/* Maps host peer `i`'s segment as described. */
static int map_peer(int i, const seg_info *in, char *why, size_t len)
{
    char path[128];
    int fd;
    if (in->kind == KIND_MEMFD) {
        snprintf(path, sizeof path, "/proc/%d/fd/%d", in->pid, in->fd);
        fd = open(path, O_RDWR | O_CLOEXEC);
    } else {
        snprintf(path, sizeof path, "%s", in->name);
        fd = shm_open(path, O_RDWR, 0600);
    }
    if (fd < 0) {
        snprintf(why, len, "cannot open host peer %d's segment %s: %s", i, path,
                 strerror(errno));
        return 0;
    }
    void *base = mmap(NULL, in->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        snprintf(why, len, "cannot map host peer %d's segment: %s", i, strerror(errno));
        return 0;
    }
    peer_base[i] = base;
    peer_bytes[i] = in->bytes;
    return 1;
}

static void unmap_peers(void)
{
    for (int i = 0; peer_base && i < nlocal; i++)
        if (peer_base[i] && i != self)
            munmap(peer_base[i], peer_bytes[i]);
    for (int i = 0; peer_base && i < nlocal; i++)
        peer_base[i] = NULL;
}

/* One attempt at the host's segments of `kind` (collective over the host communicator):
 * 1 when every process of the host mapped every segment. */
static int attempt(MPI_Comm host, int kind, size_t bytes, seg_info *all, char *why, size_t len)
{
    seg_info me = {.pid = (int)getpid(), .fd = -1, .kind = kind, .bytes = bytes};
    int reuse = own.base && own.kind == KIND_MEMFD && own.bytes == bytes && !own.name[0];
    me.ok = reuse || create_segment(kind, bytes, why, len);
    if (me.ok) {
        me.fd = own.fd;
        snprintf(me.name, sizeof me.name, "%s", own.name);
    }
    MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, host);
    int ok = 1;
    for (int i = 0; i < nlocal; i++)
        ok = ok && all[i].ok;
    for (int i = 0; i < nlocal && ok; i++) {
        peer_pid[i] = all[i].pid;
        if (i == self) {
            peer_base[i] = own.base;
            peer_bytes[i] = own.bytes;
        } else {
            ok = map_peer(i, &all[i], why, len);
        }
    }
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, host);
    if (own.name[0]) {             /* every peer has mapped it (or given up): no name left */
        shm_unlink(own.name);
        own.name[0] = '\0';
    }
    if (!all_ok) {
        if (ok && !why[0])
            snprintf(why, len, "another process of host %s could not map the segments",
                     dt__client_hostname(dt_client_id()));
        unmap_peers();
        if (own.base && !own.live)
            unmap_segment(&own);
    }
    return all_ok;
}

/* Sets up the heap of a fresh segment: channels zeroed (counters start at 0), one extent. */
static int heap_init(void)
{
    size_t ctl = ((size_t)nlocal * sizeof(dt__shm_chan) + 4095) & ~(size_t)4095;
    if (own.live) { /* reused with blocks held (same job, same host peers): heap carries on */
        memset(own.base, 0, ctl < own.heap_off ? ctl : own.heap_off);
        return 1;
    }
    if (ctl + ((size_t)1 << 20) > own.bytes)
        return 0;
    memset(own.base, 0, ctl);
    own.heap_off = ctl;
    own.nfree = 0;
    return extent_put(&own, ctl, own.bytes - ctl);
}

static dt_status setup(MPI_Comm host, char *why, size_t len)
{
    int hn = 0;
    MPI_Comm_size(host, &hn);
    MPI_Comm_rank(host, &self);
    nlocal = hn;
    int n = dt_num_clients(), me = dt_client_id();
    size_t bytes = 0;
    dt_status st = pool_bytes(nlocal, &bytes);
    if (st != DT_OK)
        return st;
    peer_base = calloc((size_t)nlocal, sizeof *peer_base);
    peer_bytes = calloc((size_t)nlocal, sizeof *peer_bytes);
    peer_pid = calloc((size_t)nlocal, sizeof *peer_pid);
    client_local = malloc((size_t)n * sizeof *client_local);
    int *host_clients = malloc((size_t)nlocal * sizeof *host_clients);
    seg_info *all = malloc((size_t)nlocal * sizeof *all);
    if (!peer_base || !peer_bytes || !peer_pid || !client_local || !host_clients || !all) {
        free(host_clients);
        free(all);
        return dt__error(DT_ERR_NO_MEMORY, "shm pool: no memory");
    }
    MPI_Allgather(&me, 1, MPI_INT, host_clients, 1, MPI_INT, host);
    for (int c = 0; c < n; c++)
        client_local[c] = -1;
    for (int i = 0; i < nlocal; i++)
        client_local[host_clients[i]] = i;
    free(host_clients);
    if (self == 0)
        clean_stale_names();
    MPI_Barrier(host);
    int ok = 0;
    if (bytes < ((size_t)2 << 20))
        snprintf(why, len, "DT_SHM_POOL_MB leaves %zu MiB per process (free space in /dev/shm)",
                 bytes >> 20);
    else
        ok = attempt(host, KIND_MEMFD, bytes, all, why, len) ||
             (why[0] = '\0', attempt(host, KIND_NAME, bytes, all, why, len));
    if (ok && !heap_init()) {
        snprintf(why, len, "a segment of %zu MiB is too small", bytes >> 20);
        ok = 0;
    }
    free(all);
    return ok ? DT_OK : DT_ERR_UNSUPPORTED;
}

static void drop_tables(void)
{
    unmap_peers();
    free(peer_base);
    free(peer_bytes);
    free(peer_pid);
    free(client_local);
    peer_base = NULL;
    peer_bytes = NULL;
    peer_pid = NULL;
    client_local = NULL;
}

dt_status dt__shm_start(const char *mode)
{
    int forced = mode && strcmp(mode, "shm") == 0;
    char why[200] = "";
    up = 0;
    if (mode && strcmp(mode, "mpi") == 0) {
        snprintf(absence, sizeof absence, "DT_TRANSPORT=mpi forbids it");
        return DT_OK;
    }
    MPI_Comm host = dt__host_comm();
    if (host == MPI_COMM_NULL)
        return dt__error(DT_ERR_STATE, "shm pool: no host communicator (dt_init first)");
    if (own.base && own.kind == KIND_NAME && own.live) {
        /* A named segment cannot be shared again: keep it for the frees of its blocks. */
        if (retired.base)
            own = (segment){.fd = -1}; /* a third generation: the oldest stays mapped */
        else
            retired = own;
        own = (segment){.fd = -1};
    }
    dt_status st = setup(host, why, sizeof why);
    if (st == DT_ERR_INVALID_ARGUMENT || st == DT_ERR_NO_MEMORY) {
        drop_tables();
        return st;
    }
    /* Up everywhere or nowhere: the transport choice is the same on every client. */
    int ok = st == DT_OK, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, dt__comm());
    if (all_ok) {
        up = 1;
        return DT_OK;
    }
    if (ok)
        snprintf(why, sizeof why, "it could not be set up on another host");
    snprintf(absence, sizeof absence, "the shared-memory pool is down: %s", why);
    unmap_peers();
    if (own.base && !own.live)
        unmap_segment(&own);
    drop_tables();
    if (forced)
        return dt__error(DT_ERR_UNSUPPORTED, "DT_TRANSPORT=shm: %s", absence);
    return DT_OK;
}

void dt__shm_stop(void)
{
    if (!peer_base)
        return;
    up = 0;
    snprintf(absence, sizeof absence, "the shared-memory pool is not set up (dt_init starts it)");
    pthread_mutex_lock(&lock);
    drop_tables();
    if (own.base && !own.live)
        unmap_segment(&own);
    pthread_mutex_unlock(&lock);
}
