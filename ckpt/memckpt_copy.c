/* In-memory checkpoints (docs/recovery.md): the copy of a step's files to the buddy client,
 * nonblocking MPI from and into mapped memory files, and its completion. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"

void dt__memckpt_maps_free(dt_memckpt *mc)
{
    for (int i = 0; i < mc->nmaps; i++)
        munmap(mc->maps[i].addr, mc->maps[i].len);
    free(mc->maps);
    mc->maps = NULL;
    mc->nmaps = 0;
}

/* The kept mapping of the file `sb` describes, or NULL. */
static void *find_map(dt_memckpt *mc, const struct stat *sb, uint64_t len)
{
    for (int i = 0; i < mc->nmaps; i++) {
        memckpt_map *m = &mc->maps[i];
        if (m->dev == (unsigned long long)sb->st_dev &&
            m->ino == (unsigned long long)sb->st_ino && m->len == len) {
            m->used = ++mc->map_clock;
            return m->addr;
        }
    }
    return NULL;
}

/* The kept mapping of fd (file `name`, len bytes), made if there is none. */
static void *kept_map(dt_memckpt *mc, int fd, const char *name, uint64_t len)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return MAP_FAILED;
    int same = 0, lru = -1;
    for (int i = 0; i < mc->nmaps; i++) {
        memckpt_map *m = &mc->maps[i];
        if (m->dev == (unsigned long long)sb.st_dev && m->ino == (unsigned long long)sb.st_ino &&
            m->len == len) {
            m->used = ++mc->map_clock;
            return m->addr;
        }
        if (strcmp(m->name, name) == 0) {
            same++;
            if (lru < 0 || m->used < mc->maps[lru].used)
                lru = i;
        }
    }
    void *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (a == MAP_FAILED)
        return a;
    if (same >= 2) { /* the oldest of this name goes (its step is gone or going) */
        munmap(mc->maps[lru].addr, mc->maps[lru].len);
        mc->maps[lru] = mc->maps[--mc->nmaps];
    }
    memckpt_map *v = realloc(mc->maps, (size_t)(mc->nmaps + 1) * sizeof *v);
    if (!v) {
        munmap(a, len);
        return MAP_FAILED;
    }
    mc->maps = v;
    memckpt_map *m = &mc->maps[mc->nmaps++];
    snprintf(m->name, sizeof m->name, "%s", name);
    m->dev = (unsigned long long)sb.st_dev;
    m->ino = (unsigned long long)sb.st_ino;
    m->len = len;
    m->addr = a;
    m->used = ++mc->map_clock;
    return a;
}

void dt__memckpt_xfers_free(dt_memckpt *mc)
{
    for (int i = 0; i < mc->nx; i++) {
        if (mc->x[i].recv && !mc->x[i].done && mc->copy_dir >= 0)
            unlinkat(mc->copy_dir, mc->x[i].part, 0); /* never passes for a file */
    }
    if (mc->copy_dir >= 0)
        close(mc->copy_dir);
    mc->copy_dir = -1;
    free(mc->x);
    free(mc->reqs);
    free(mc->peers);
    mc->x = NULL;
    mc->reqs = NULL;
    mc->peers = NULL;
    mc->nx = mc->nreq = 0;
}

/* Maps file `name` of the copy's directory (size len) for sending, or "<name>.part" (made
 * if missing, else an old step's recycled file written over) for receiving; the mappings
 * are kept (kept_map). */
static dt_status map_file(dt_memckpt *mc, memckpt_xfer *x, const char *name, uint64_t len,
                          int recv)
{
    snprintf(x->path, sizeof x->path, "%s", name);
    snprintf(x->part, sizeof x->part, "%s.part", name);
    x->len = len;
    x->recv = recv;
    if (len == 0)
        return DT_OK;
    const char *file = recv ? x->part : name;
    /* A file mapped before (recycled, at its size): nothing to open. */
    struct stat sb;
    if (fstatat(mc->copy_dir, file, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
        (uint64_t)sb.st_size == len && (x->addr = find_map(mc, &sb, len)) != NULL)
        return DT_OK;
    int fd = openat(mc->copy_dir, file, O_RDWR | (recv ? O_CREAT : 0) | O_CLOEXEC, 0600);
    if (fd < 0)
        return dt__error(DT_ERR_IO, "dt_memckpt: %s: %s", file, strerror(errno));
    if (recv && (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != len) &&
        ftruncate(fd, (off_t)len) != 0) {
        int e = errno;
        close(fd);
        return dt__error(DT_ERR_IO, "dt_memckpt: %s: %s", x->part, strerror(e));
    }
    void *a = kept_map(mc, fd, name, len);
    int e = errno;
    close(fd);
    if (a == MAP_FAILED)
        return dt__error(DT_ERR_IO, "dt_memckpt: mmap %s: %s", file, strerror(e));
    x->addr = a;
    return DT_OK;
}

#define XFER_PIECE ((uint64_t)1 << 30) /* bytes per MPI message (an int count) */
#define XFER_TAG 7301

static int pieces_of(uint64_t len)
{
    return (int)((len + XFER_PIECE - 1) / XFER_PIECE);
}

/* The copy's requests are complete: received files take their names. */
static dt_status finish_copy(dt_memckpt *mc)
{
    dt_status st = DT_OK;
    for (int i = 0; i < mc->nx; i++) {
        memckpt_xfer *x = &mc->x[i];
        if (!x->recv)
            continue;
        int dfd = mc->copy_dir;
        if (x->len == 0) { /* nothing was mapped: make the empty file */
            int fd = openat(dfd, x->part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (fd >= 0)
                close(fd);
        }
        x->addr = NULL; /* the mapping is kept */
        /* A marker beside it says where the file came from (dt_memckpt_found.from_buddies). */
        char mark[96], old_mark[104];
        snprintf(mark, sizeof mark, "%s" MEMCKPT_BUDDY_SUFFIX, x->path);
        snprintf(old_mark, sizeof old_mark, "%s.part", mark);
        if (renameat(dfd, old_mark, dfd, mark) != 0) { /* none recycled: a new one */
            int fd = openat(dfd, mark, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (fd >= 0)
                close(fd);
        }
        if (renameat(dfd, x->part, dfd, x->path) != 0 && st == DT_OK)
            st = dt__error(DT_ERR_IO, "dt_memckpt: rename %s: %s", x->part, strerror(errno));
        x->done = 1;
    }
    dt__memckpt_xfers_free(mc);
    mc->copy_step = -1;
    return st;
}

/* The step's data files (name, bytes, writing client): those the save just recorded
 * (dt__ckpt_last_local_files, when `serial` is the save's), else read from its index in dir. */
dt_status dt__memckpt_step_files(const char *dir, uint64_t serial, ck_local_file **files_out,
                            int64_t *n_out)
{
    uint64_t got = 0;
    dt_status st = dt__ckpt_last_local_files(files_out, n_out, &got);
    if (st != DT_OK || got == serial)
        return st;
    free(*files_out);
    dt_ckpt *ck = NULL;
    if ((st = dt_ckpt_open(dir, &ck)) != DT_OK)
        return st;
    int64_t n = dt_ckpt_num_files(ck);
    ck_local_file *v = calloc((size_t)n + 1, sizeof *v);
    for (int64_t f = 0; v && f < n; f++) {
        dt_ckpt_file_info fi;
        if ((st = dt_ckpt_file(ck, f, &fi)) != DT_OK)
            break;
        snprintf(v[f].name, sizeof v[f].name, "%s", fi.name);
        v[f].bytes = fi.bytes;
        v[f].client = dt_device_client(DT_DEVICE_CPU, fi.device_id);
    }
    dt_ckpt_close(ck);
    if (!v)
        st = dt__error(DT_ERR_NO_MEMORY, "dt_memckpt_save: no memory");
    if (st != DT_OK) {
        free(v);
        return st;
    }
    *files_out = v;
    *n_out = n;
    return DT_OK;
}

/* Posts the sends of this client's files of the step (in `dir`) to its buddy and the receives
 * of its source's files, unless they share this client's directory. */
dt_status dt__memckpt_start_copy(dt_memckpt *mc, const ck_local_file *files, int64_t nf,
                            const char *dir)
{
    int me = dt_client_id(), bud = mc->g.clients[mc->buddy], src = mc->g.clients[mc->source];
    int send = mc->dir_ids[mc->buddy] != mc->dir_ids[mc->g.rank];
    int recv = mc->dir_ids[mc->source] != mc->dir_ids[mc->g.rank];
    int64_t nx = 0, nr = 0;
    for (int64_t f = 0; f < nf; f++) {
        const ck_local_file *fi = &files[f];
        int owner = fi->client;
        if ((send && owner == me) || (recv && owner == src)) {
            nx++;
            nr += pieces_of(fi->bytes);
        }
    }
    mc->own_bytes = mc->buddy_bytes = 0;
    mc->x = calloc((size_t)nx + 1, sizeof *mc->x);
    mc->reqs = calloc((size_t)nr + 1, sizeof *mc->reqs);
    mc->peers = calloc((size_t)nr + 1, sizeof *mc->peers);
    if (!mc->x || !mc->reqs || !mc->peers)
        return dt__error(DT_ERR_NO_MEMORY, "dt_memckpt_save: no memory");
    if (nx > 0 && (mc->copy_dir = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return dt__error(DT_ERR_IO, "dt_memckpt_save: %s: %s", dir, strerror(errno));
    for (int64_t f = 0; f < nf; f++) {
        const ck_local_file *fi = &files[f];
        int owner = fi->client;
        if (owner == me)
            mc->own_bytes += fi->bytes;
        if (owner == src && src != me)
            mc->buddy_bytes += fi->bytes;
        int is_send = send && owner == me, is_recv = recv && owner == src;
        if (!is_send && !is_recv)
            continue;
        memckpt_xfer *x = &mc->x[mc->nx++];
        if (is_recv && mc->quick.primed && mc->quick.recycle[0]) {
            char from[CK_PATH_MAX + 72], to[CK_PATH_MAX + 80];
            snprintf(from, sizeof from, "%s/%s", mc->quick.recycle, fi->name);
            snprintf(to, sizeof to, "%s/%s.part", dir, fi->name);
            (void)rename(from, to); /* else a new file */
            /* its marker too, renamed into place once the copy is complete */
            snprintf(from, sizeof from, "%s/%s" MEMCKPT_BUDDY_SUFFIX, mc->quick.recycle,
                     fi->name);
            snprintf(to, sizeof to, "%s/%s" MEMCKPT_BUDDY_SUFFIX ".part", dir, fi->name);
            (void)rename(from, to);
        }
        dt_status st = map_file(mc, x, fi->name, fi->bytes, is_recv);
        if (st != DT_OK)
            return st;
        for (uint64_t at = 0; at < fi->bytes; at += XFER_PIECE) {
            uint64_t k = fi->bytes - at < XFER_PIECE ? fi->bytes - at : XFER_PIECE;
            int rc = is_recv ? MPI_Irecv((char *)x->addr + at, (int)k, MPI_BYTE, mc->source,
                                         XFER_TAG, mc->g.comm, &mc->reqs[mc->nreq])
                             : MPI_Isend((char *)x->addr + at, (int)k, MPI_BYTE, mc->buddy,
                                         XFER_TAG, mc->g.comm, &mc->reqs[mc->nreq]);
            if (rc != MPI_SUCCESS)
                return dt__error(DT_ERR_COMM, "dt_memckpt_save: posting the buddy copy failed");
            mc->peers[mc->nreq++] = is_recv ? src : bud;
        }
    }
    /* Nothing to wait for (one host, or only empty files): done now. */
    return mc->nreq == 0 ? finish_copy(mc) : DT_OK;
}

dt_status dt__memckpt_copy_poll(dt_memckpt *mc, int *done_out)
{
    int done = 1;
    dt_status st = DT_OK;
    if (mc->nreq) {
        if (MPI_Testall(mc->nreq, mc->reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            return dt__error(DT_ERR_COMM, "dt_memckpt_poll: the buddy copy failed");
        if (done)
            st = finish_copy(mc);
    }
    if (done_out)
        *done_out = done;
    return st;
}

dt_status dt__memckpt_copy_wait(dt_memckpt *mc)
{
    if (!mc->nreq)
        return DT_OK;
    dt_status st = dt__wait_watched(mc->reqs, mc->peers, mc->nreq, 0.0,
                                    "dt_memckpt: the buddy copy");
    if (st != DT_OK) {
        mc->nreq = 0; /* cancelled or dropped by the watchdog */
        dt__memckpt_xfers_free(mc);
        return st;
    }
    return finish_copy(mc);
}

