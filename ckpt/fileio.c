/* File and directory primitives of the ckpt module: full pread/pwrite loops, directory fsync,
 * removing a checkpoint directory, probing for an index, dropping a checkpoint's page cache. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"

/* Linux moves at most about 2 GiB per call. */
enum { MAX_IO = 1 << 30 };

int64_t dt__ckpt_pread(int fd, void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        size_t want = len - done > MAX_IO ? MAX_IO : len - done;
        ssize_t r = pread(fd, (char *)buf + done, want, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (int64_t)done;
}

int dt__ckpt_pwrite(int fd, const void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        size_t want = len - done > MAX_IO ? MAX_IO : len - done;
        ssize_t r = pwrite(fd, (const char *)buf + done, want, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0) {
            errno = EIO;
            return -1;
        }
        done += (size_t)r;
    }
    return 0;
}

dt_status dt__ckpt_fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dt__error(DT_ERR_IO, "%s: open directory: %s", path, strerror(errno));
    if (fsync(fd) != 0 && errno != EINVAL) {
        int e = errno;
        close(fd);
        return dt__error(DT_ERR_IO, "%s: fsync directory: %s", path, strerror(e));
    }
    close(fd);
    return DT_OK;
}

dt_status dt__ckpt_remove_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT)
            return DT_OK;
        return dt__error(DT_ERR_IO, "%s: open directory: %s", path, strerror(errno));
    }
    int dfd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (unlinkat(dfd, e->d_name, 0) != 0 && errno != ENOENT) {
            int err = errno;
            closedir(d);
            return dt__error(DT_ERR_IO, "%s/%s: remove: %s", path, e->d_name, strerror(err));
        }
    }
    closedir(d);
    if (rmdir(path) != 0 && errno != ENOENT)
        return dt__error(DT_ERR_IO, "%s: remove directory: %s", path, strerror(errno));
    return DT_OK;
}

int dt__ckpt_has_index(const char *dir)
{
    char p[CK_PATH_MAX];
    struct stat sb;
    if (dt__ckpt_join(p, sizeof p, dir, "/", DT_CKPT_INDEX_NAME) != DT_OK)
        return 0;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

void dt__ckpt_drop_cache(const char *dir, const unsigned char *mine, int64_t nmine, int part,
                         int nparts)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    int dfd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long k;
        if (sscanf(e->d_name, "data-%lld-of-", &k) != 1 || k < 0 ||
            (k < nmine ? !mine[k] : k % nparts != part))
            continue;
        int fd = openat(dfd, e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            continue;
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    closedir(d);
}
