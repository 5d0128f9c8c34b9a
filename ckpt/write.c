/* Writing this client's data files of a save into the temporary directory, one thread per
 * file (or in order, from an asynchronous save's staging queue): each slice CRC'd piece by
 * piece and written from cache, with early writeback, while another thread drops the replaced
 * checkpoint's cache (the counterpart of read.c). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/group.h"

typedef struct file_job {
    const ck_plan *plan;
    ck_source *src;
    int64_t file;
    const char *tmp;
    int do_fsync;
    uint32_t *crcs;               /* per plan slice */
    uint32_t **chunk_crcs;
    int answer;                   /* run by the calling thread: answers the watchdog's pings */
    atomic_int done;
    dt_status st;
    char msg[CK_PATH_MAX + 256];
} file_job;

static const void *direct_get(ck_source *src, int64_t si, uint64_t at, uint64_t len)
{
    (void)len;
    if (!src->slices[si].data) {
        src->status = dt__error(DT_ERR_STATE, "dt_save: no local data for slice %lld",
                                (long long)si);
        return NULL;
    }
    return (const char *)src->slices[si].data + at;
}

static void direct_put(ck_source *src, const void *bytes, uint64_t len)
{
    (void)src;
    (void)bytes;
    (void)len;
}

ck_source dt__ckpt_direct_source(const ck_slice_src *slices)
{
    return (ck_source){.get = direct_get, .put = direct_put, .parallel = 1, .slices = slices};
}

/* Data are written in pieces of WRITE_PIECE bytes (each CRC'd just before, so that the write
 * copies it from cache), and the kernel is asked to start writing back every WRITEBACK_BYTES
 * (when fsyncing), so that the device works while we copy and the final fsync waits only for
 * the tail. */
enum { WRITE_PIECE = 1 << 20, WRITEBACK_BYTES = 8 << 20 };

uint64_t dt__ckpt_piece_len(uint64_t chunk_bytes, uint64_t bytes, uint64_t at)
{
    uint64_t C = chunk_bytes, cend = (at / C + 1) * C < bytes ? (at / C + 1) * C : bytes;
    return cend - at < WRITE_PIECE ? cend - at : WRITE_PIECE;
}

/* A hint: errors are the final fsync's to report. */
static void start_writeback(int fd, uint64_t off, uint64_t len)
{
#ifdef SYNC_FILE_RANGE_WRITE
    (void)sync_file_range(fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE);
#else
    (void)fd;
    (void)off;
    (void)len;
#endif
}

/* Contiguous pieces written by one pwritev (a quick save's many small slices: one call per
 * file instead of one per slice). Only for data that stay where they are (direct sources). */
enum { BATCH_MAX = 64 };
typedef struct write_batch {
    struct iovec v[BATCH_MAX];
    int n;
    uint64_t off, end;
} write_batch;

static int batch_flush(int fd, write_batch *b)
{
    size_t want = (size_t)(b->end - b->off);
    int n = b->n;
    b->n = 0;
    if (n == 0)
        return 0;
    ssize_t w = pwritev(fd, b->v, n, (off_t)b->off);
    if (w == (ssize_t)want)
        return 0;
    /* Short or failed: the rest one piece at a time (dt__ckpt_pwrite retries). */
    uint64_t at = b->off;
    for (int i = 0; i < n; i++) {
        if (dt__ckpt_pwrite(fd, b->v[i].iov_base, b->v[i].iov_len, at) != 0)
            return -1;
        at += b->v[i].iov_len;
    }
    return 0;
}

static int batch_add(int fd, write_batch *b, const void *data, uint64_t len, uint64_t off)
{
    if (b->n > 0 && (b->n == BATCH_MAX || off != b->end) && batch_flush(fd, b) != 0)
        return -1;
    if (b->n == 0)
        b->off = b->end = off;
    b->v[b->n].iov_base = (void *)data;
    b->v[b->n++].iov_len = (size_t)len;
    b->end += len;
    return 0;
}

/* Writes one file of this client (job->st and msg say how it went). */
static void write_one(file_job *job)
{
    const ck_plan *plan = job->plan;
    const ck_plan_file *pf = &plan->files[job->file];
    char name[64], path[CK_PATH_MAX];
    dt__ckpt_file_name(name, sizeof name, job->file, plan->nfiles);
    snprintf(path, sizeof path, "%s/%s", job->tmp, name);
    job->st = DT_OK;
    int fd = open(path, O_WRONLY | O_CREAT | (plan->overwrite ? 0 : O_TRUNC) | O_CLOEXEC, 0644);
    if (fd < 0)
        goto io_err;
    struct stat sb;
    if (plan->overwrite && fstat(fd, &sb) == 0 &&
        (uint64_t)sb.st_size != pf->header_bytes + pf->data_bytes &&
        ftruncate(fd, (off_t)(pf->header_bytes + pf->data_bytes)) != 0)
        goto io_err_close;
    if (dt__ckpt_pwrite(fd, pf->header, (size_t)pf->header_bytes, 0) != 0)
        goto io_err_close;
    uint64_t C = plan->chunk_bytes;
    uint64_t flushed = 0, dirty_end = pf->header_bytes;   /* writeback started below this */
    write_batch batch;
    batch.n = 0;
    int batched = plan->overwrite && job->src->get == direct_get && !job->do_fsync;
    for (int64_t i = 0; i < pf->nslices; i++) {
        int64_t si = pf->slices[i];
        const ck_plan_slice *s = &plan->slices[si];
        uint32_t whole = 0, crc = 0;
        /* CRC a piece small enough to stay in the core's cache, then write it from there. */
        for (uint64_t at = 0; at < s->bytes;) {
            uint64_t len = dt__ckpt_piece_len(C, s->bytes, at);
            uint64_t cend = (at / C + 1) * C < s->bytes ? (at / C + 1) * C : s->bytes;
            const char *data = job->src->get(job->src, si, at, len);
            if (!data) {
                job->st = job->src->status != DT_OK ? job->src->status : DT_ERR_STATE;
                snprintf(job->msg, sizeof job->msg, "%s", dt_last_error());
                close(fd);
                return;
            }
            crc = dt_crc32c(crc, data, (size_t)len);
            if (at + len == cend) {
                uint64_t c = at / C;
                job->chunk_crcs[si][c] = crc;
                whole = c ? dt__crc32c_combine(whole, crc, cend - c * C) : crc;
                crc = 0;
            }
            uint64_t off = pf->header_bytes + s->begin + at;
            int rc = batched ? batch_add(fd, &batch, data, len, off)
                             : dt__ckpt_pwrite(fd, data, (size_t)len, off);
            job->src->put(job->src, data, len);
            /* (a quick save's files are small and in memory: answered once per file) */
            if (job->answer && !batched)
                dt__watchdog_answer();
            if (rc != 0)
                goto io_err_close;
            at += len;
            dirty_end = off + len;
            if (job->do_fsync && dirty_end - flushed >= WRITEBACK_BYTES) {
                start_writeback(fd, flushed, dirty_end - flushed);
                flushed = dirty_end;
            }
        }
        job->crcs[si] = whole;
    }
    if (batched && batch_flush(fd, &batch) != 0)
        goto io_err_close;
    if (batched && job->answer)
        dt__watchdog_answer();
    if (job->do_fsync && fsync(fd) != 0)
        goto io_err_close;
    if (close(fd) != 0)
        goto io_err;
    return;
io_err_close: {
    int e = errno;
    close(fd);
    errno = e;
}
io_err:
    job->st = DT_ERR_IO;
    snprintf(job->msg, sizeof job->msg, "dt_save: %s: %s", path, strerror(errno));
}

/* A writing thread's body. */
static void *write_file(void *arg)
{
    file_job *job = arg;
    write_one(job);
    atomic_store(&job->done, 1);
    return NULL;
}

/* Dropping the previous checkpoint's cached pages while the new one is written. */
typedef struct drop_job {
    const char *dir;
    unsigned char *mine;          /* per file of the new plan: written by this client */
    int64_t nfiles;
    int part, nparts;
} drop_job;

static void *drop_old(void *arg)
{
    const drop_job *j = arg;
    dt__ckpt_drop_cache(j->dir, j->mine, j->nfiles, j->part, j->nparts);
    return NULL;
}

/* With fsync, a thread first drops the page cache of the files of the previous checkpoint in
 * `dir` that this client wrote last time (the same file numbers; those beyond the new count
 * are shared out by group rank): their data stay on disk until the commit, but their pages
 * are useless (the files are deleted after the commit), and freeing them early gives the new
 * files' pages back the memory they used. It starts once the source is ready (an
 * asynchronous save's copy done), so it does not compete with the copy the caller waits for. */
dt_status dt__ckpt_write_local_files(const ck_plan *plan, ck_source *src, const char *dir,
                                     const dt__group *g, const char *tmp, int do_fsync,
                                     uint32_t *crcs, uint32_t **chunk_crcs)
{
    int me = dt_client_id(), nj = 0;
    file_job *jobs = calloc((size_t)plan->nfiles + 1, sizeof *jobs);
    pthread_t *th = calloc((size_t)plan->nfiles + 1, sizeof *th);
    char *started = calloc((size_t)plan->nfiles + 1, 1);
    if (!jobs || !th || !started) {
        free(jobs);
        free(th);
        free(started);
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory");
    }
    drop_job dj = {.dir = dir, .mine = calloc((size_t)plan->nfiles + 1, 1),
                   .nfiles = plan->nfiles, .part = g->rank, .nparts = g->size};
    for (int64_t f = 0; f < plan->nfiles; f++)
        if (dt_device_client(DT_DEVICE_CPU, plan->files[f].device_id) == me) {
            jobs[nj++] = (file_job){.plan = plan, .src = src, .file = f, .tmp = tmp,
                                    .do_fsync = do_fsync, .crcs = crcs,
                                    .chunk_crcs = chunk_crcs};
            if (dj.mine)
                dj.mine[f] = 1;
        }
    if (src->ready)
        src->ready(src);
    pthread_t drop_th;
    int drop_started = do_fsync && dj.mine && pthread_create(&drop_th, NULL, drop_old, &dj) == 0;
    for (int j = 1; src->parallel && j < nj; j++)
        started[j] = pthread_create(&th[j], NULL, write_file, &jobs[j]) == 0;
    /* The other clients may already wait for this one (under their watchdog): answer their
     * pings between pieces and while the writing threads finish, where this thread may call
     * MPI. */
    int is_main = 0;
    MPI_Is_thread_main(&is_main);
    int answer = is_main || dt__mpi_thread_level() >= MPI_THREAD_MULTIPLE;
    /* Here: the first, any a thread could not take, and all of a sequential source's (in
     * order, stopping at a failure: its later pieces would be another file's). */
    for (int j = 0; j < nj && (src->parallel || j == 0 || jobs[j - 1].st == DT_OK); j++)
        if (j == 0 || !started[j]) {
            jobs[j].answer = answer;
            write_one(&jobs[j]);
        }
    for (int j = 1; answer && j < nj; j++)
        while (started[j] && !atomic_load(&jobs[j].done)) {
            dt__watchdog_answer();
            nanosleep(&(struct timespec){0, 2000000}, NULL);
        }
    for (int j = 1; j < nj; j++)
        if (started[j])
            pthread_join(th[j], NULL);
    if (drop_started)
        pthread_join(drop_th, NULL);
    free(dj.mine);
    dt_status st = DT_OK;
    for (int j = 0; j < nj && st == DT_OK; j++)
        if (jobs[j].st != DT_OK)
            st = dt__error(jobs[j].st, "%s", jobs[j].msg);
    free(jobs);
    free(th);
    free(started);
    return st;
}
