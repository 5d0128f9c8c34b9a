/* LD_PRELOAD shim for the full-disk tests: once a process has written DT_ENOSPC_AFTER bytes to
 * files under DT_ENOSPC_DIR, its further writes there fail with ENOSPC (a short write first, as
 * a real full disk does). With DT_ENOSPC_RANK set, only the MPI process of that rank
 * (OMPI_COMM_WORLD_RANK, PMIX_RANK or PMI_RANK) is limited. With DT_ENOSPC_KILL=write the
 * process kills itself (SIGKILL) instead of writing beyond the budget; with DT_ENOSPC_KILL=read
 * it does so once it has read DT_ENOSPC_AFTER bytes of files there (pread). Lets a test fail a
 * save or a restore at a chosen point, on a chosen client. Not part of the library. */
/* Both pwrite and pwrite64 are defined here, so no redirection of one to the other. */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* Bytes written under the limited directory by this process. */
static atomic_llong used;

/* 1 when DT_ENOSPC_RANK names another process than this one. */
static int other_rank(void)
{
    const char *want = getenv("DT_ENOSPC_RANK");
    if (!want || !*want)
        return 0;
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *r = getenv(vars[i]);
        if (r && *r)
            return atoi(r) != atoi(want);
    }
    return atoi(want) != 0;   /* not under MPI: one process, rank 0 */
}

/* Bytes that may still be written to fd (LLONG_MAX when fd is not under the limited dir). */
static long long budget(int fd)
{
    const char *dir = getenv("DT_ENOSPC_DIR");
    const char *after = getenv("DT_ENOSPC_AFTER");
    if (!dir || !after || !*dir || other_rank())
        return LLONG_MAX;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0)
        return LLONG_MAX;
    path[n] = '\0';
    size_t dl = strlen(dir);
    if (strncmp(path, dir, dl) != 0 || (path[dl] != '/' && path[dl] != '\0'))
        return LLONG_MAX;
    long long left = atoll(after) - atomic_load(&used);
    return left < 0 ? 0 : left;
}

/* 1 when DT_ENOSPC_KILL is `mode`. */
static int kill_on(const char *mode)
{
    const char *k = getenv("DT_ENOSPC_KILL");
    return k && strcmp(k, mode) == 0;
}

/* How many of `want` bytes may go through; -1 with errno ENOSPC when none. */
static ssize_t admit(int fd, size_t want)
{
    long long left = budget(fd);
    if (left == LLONG_MAX)
        return (ssize_t)want;
    if ((long long)want > left && kill_on("write"))
        raise(SIGKILL);
    if (left == 0 && want > 0) {
        errno = ENOSPC;
        return -1;
    }
    return (ssize_t)((long long)want < left ? (long long)want : left);
}

/* The next definition of `name` (libc's); memcpy because ISO C has no object-to-function cast. */
typedef void (*any_fn)(void);
static any_fn real(const char *name)
{
    void *p = dlsym(RTLD_NEXT, name);
    any_fn f;
    memcpy(&f, &p, sizeof f);
    return f;
}
#define REAL(name, type) ((type)real(name))

ssize_t write(int fd, const void *buf, size_t count)
{
    ssize_t n = admit(fd, count);
    if (n < 0)
        return -1;
    ssize_t r = REAL("write", ssize_t(*)(int, const void *, size_t))(fd, buf, (size_t)n);
    if (r > 0 && budget(fd) != LLONG_MAX)
        atomic_fetch_add(&used, r);
    return r;
}

static ssize_t do_pwrite(const char *name, int fd, const void *buf, size_t count, off_t off)
{
    ssize_t n = admit(fd, count);
    if (n < 0)
        return -1;
    ssize_t r = REAL(name, ssize_t(*)(int, const void *, size_t, off_t))(fd, buf, (size_t)n, off);
    if (r > 0 && budget(fd) != LLONG_MAX)
        atomic_fetch_add(&used, r);
    return r;
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t off)
{
    return do_pwrite("pwrite", fd, buf, count, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t off)
{
    return do_pwrite("pwrite64", fd, buf, count, off);
}

/* Vectored writes: admit the first iovecs that fit (a short write, as the kernel may do). */
static ssize_t do_pwritev(const char *name, int fd, const struct iovec *iov, int cnt, off_t off,
                          int positioned)
{
    size_t total = 0;
    for (int i = 0; i < cnt; i++)
        total += iov[i].iov_len;
    ssize_t n = admit(fd, total);
    if (n < 0)
        return -1;
    if ((size_t)n < total) {
        /* Write only the admitted prefix, through plain (p)write. */
        const char *b = iov[0].iov_base;
        size_t len = iov[0].iov_len < (size_t)n ? iov[0].iov_len : (size_t)n;
        return positioned ? do_pwrite("pwrite", fd, b, len, off) : write(fd, b, len);
    }
    ssize_t r;
    if (positioned)
        r = REAL(name, ssize_t(*)(int, const struct iovec *, int, off_t))(fd, iov, cnt, off);
    else
        r = REAL(name, ssize_t(*)(int, const struct iovec *, int))(fd, iov, cnt);
    if (r > 0 && budget(fd) != LLONG_MAX)
        atomic_fetch_add(&used, r);
    return r;
}

ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
    return do_pwritev("writev", fd, iov, cnt, 0, 0);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
    return do_pwritev("pwritev", fd, iov, cnt, off, 1);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off)
{
    return do_pwritev("pwritev64", fd, iov, cnt, off, 1);
}

/* Reads count against the budget only with DT_ENOSPC_KILL=read: the process dies instead of
 * reading beyond it. */
static ssize_t do_pread(const char *name, int fd, void *buf, size_t count, off_t off)
{
    int counted = kill_on("read") && budget(fd) != LLONG_MAX;
    if (counted && (long long)count > budget(fd))
        raise(SIGKILL);
    ssize_t r = REAL(name, ssize_t(*)(int, void *, size_t, off_t))(fd, buf, count, off);
    if (r > 0 && counted)
        atomic_fetch_add(&used, r);
    return r;
}

ssize_t pread(int fd, void *buf, size_t count, off_t off)
{
    return do_pread("pread", fd, buf, count, off);
}

ssize_t pread64(int fd, void *buf, size_t count, off_t off)
{
    return do_pread("pread64", fd, buf, count, off);
}

/* Preallocation reserves space: refuse it once the budget cannot hold it. */
int posix_fallocate(int fd, off_t off, off_t len)
{
    long long left = budget(fd);
    if (left != LLONG_MAX && len > left)
        return ENOSPC;
    return REAL("posix_fallocate", int (*)(int, off_t, off_t))(fd, off, len);
}

int fallocate(int fd, int mode, off_t off, off_t len)
{
    long long left = budget(fd);
    if (left != LLONG_MAX && len > left) {
        errno = ENOSPC;
        return -1;
    }
    return REAL("fallocate", int (*)(int, int, off_t, off_t))(fd, mode, off, len);
}
