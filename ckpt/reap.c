/* Retiring a replaced checkpoint without making the save wait for the disk to free it.
 *
 * After a commit the previous checkpoint (D.dtensor-old) is no longer needed. Unlinking a
 * large file can take long (on a file system mounted with `discard`, freeing the blocks waits
 * for the device: about 70 ms per 512 MiB on the development VM), and it is pure clean-up: the
 * new checkpoint is already durable. So its files are opened, unlinked and the directory
 * removed at once (names gone, nothing left for a reader or a crash to find), and the last
 * close, where the blocks are actually freed, happens in a background thread. dt_finalize and
 * dt__ckpt_reap_wait wait for it and join it (a thread still ending when the process exits is
 * what LeakSanitizer reports); a process that exits without finalizing has its descriptors
 * closed by the kernel, which frees the blocks just the same. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int *queue;             /* descriptors waiting to be closed */
static int nqueue, capqueue;
static int busy;               /* the worker is closing a batch */
static int running;            /* a worker thread is closing or about to */
static int joinable;           /* worker was started and not yet joined */
static pthread_t worker;

/* Joins a worker that has finished its queue. Called with mu held: the worker needs mu no
 * more once it has cleared `running`. */
static void join_finished(void)
{
    if (joinable && !running) {
        pthread_join(worker, NULL);
        joinable = 0;
    }
}

static void *reap_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    while (nqueue > 0) {
        int *batch = queue, n = nqueue;
        queue = NULL;
        nqueue = capqueue = 0;
        busy = 1;
        pthread_mutex_unlock(&mu);
        for (int i = 0; i < n; i++)
            close(batch[i]);
        free(batch);
        pthread_mutex_lock(&mu);
        busy = 0;
    }
    running = 0;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return NULL;
}

void dt__ckpt_reap_wait(void)
{
    pthread_mutex_lock(&mu);
    while (running || nqueue > 0 || busy)
        pthread_cond_wait(&cv, &mu);
    join_finished();
    pthread_mutex_unlock(&mu);
}

static void at_finalize(void)
{
    dt__ckpt_reap_wait();
}

dt_status dt__ckpt_reap_register(void)
{
    return dt__at_finalize(at_finalize);
}

/* Hands fd to the worker (starting one if none runs); closes it here when that fails. */
static void reap_fd(int fd)
{
    pthread_mutex_lock(&mu);
    if (nqueue == capqueue) {
        int cap = capqueue ? 2 * capqueue : 16;
        int *q = realloc(queue, (size_t)cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&mu);
            close(fd);
            return;
        }
        queue = q;
        capqueue = cap;
    }
    queue[nqueue++] = fd;
    if (!running) {
        join_finished();
        running = joinable = pthread_create(&worker, NULL, reap_main, NULL) == 0;
        if (!running) {
            /* No thread: close everything queued now. */
            for (int i = 0; i < nqueue; i++)
                close(queue[i]);
            nqueue = 0;
        }
    }
    pthread_mutex_unlock(&mu);
}

dt_status dt__ckpt_retire_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT)
            return DT_OK;
        return dt__error(DT_ERR_IO, "%s: open directory: %s", path, strerror(errno));
    }
    dt__at_finalize(at_finalize);
    int dfd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        /* Keep the file open across the unlink, so the unlink only drops the name. */
        int fd = openat(dfd, e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (unlinkat(dfd, e->d_name, 0) != 0 && errno != ENOENT) {
            int err = errno;
            if (fd >= 0)
                close(fd);
            closedir(d);
            return dt__error(DT_ERR_IO, "%s/%s: remove: %s", path, e->d_name, strerror(err));
        }
        if (fd >= 0)
            reap_fd(fd);
    }
    closedir(d);
    if (rmdir(path) != 0 && errno != ENOENT)
        return dt__error(DT_ERR_IO, "%s: remove directory: %s", path, strerror(errno));
    return DT_OK;
}
