/* The atomic commit protocol (docs/ckpt-format.md): where a reader finds the checkpoint,
 * the cleanup and temporary directory before a save, and the renames that publish it. */
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

dt_status dt__ckpt_resolve(const char *dir, char *buf, size_t len)
{
    dt_status st = dt__ckpt_norm_dir("checkpoint", dir, buf, len);
    if (st != DT_OK)
        return st;
    if (dt__ckpt_has_index(buf))
        return DT_OK;
    char old[CK_PATH_MAX];
    if ((st = dt__ckpt_join(old, sizeof old, buf, "", CK_SUFFIX_OLD)) != DT_OK)
        return st;
    if (dt__ckpt_has_index(old))
        return dt__ckpt_join(buf, len, old, "", "");
    return dt__error(DT_ERR_NOT_FOUND, "%s: no checkpoint (no %s)", buf, DT_CKPT_INDEX_NAME);
}

/* 1 if the directory holds nothing but "." and "..". */
static int dir_is_empty(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return 0;
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)) != NULL)
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty;
}

/* The parent directory of path (for fsync after renames). */
static void parent_of(const char *path, char *buf, size_t len)
{
    char tmp[CK_PATH_MAX];
    dt__strlcpy(tmp, path, sizeof tmp);
    dt__strlcpy(buf, dirname(tmp), len);
}

/* mkdir -p of the directory that will hold the checkpoint. */
static dt_status make_parents(const char *dir)
{
    char p[CK_PATH_MAX];
    parent_of(dir, p, sizeof p);
    for (char *s = p + 1;; s++) {
        char c = *s;
        if (c != '/' && c != '\0')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return dt__error(DT_ERR_IO, "dt_save: mkdir %s: %s", p, strerror(errno));
        *s = c;
        if (c == '\0')
            break;
    }
    return DT_OK;
}

dt_status dt__ckpt_prepare(const char *dir, char *tmp_out, size_t len)
{
    char old[CK_PATH_MAX];
    dt_status st = dt__ckpt_join(tmp_out, len, dir, "", CK_SUFFIX_TMP);
    if (st == DT_OK)
        st = dt__ckpt_join(old, sizeof old, dir, "", CK_SUFFIX_OLD);
    if (st != DT_OK)
        return st;
    if ((st = dt__ckpt_remove_dir(tmp_out)) != DT_OK)
        return st;
    struct stat sb;
    int exists = stat(dir, &sb) == 0;
    if (exists && !S_ISDIR(sb.st_mode))
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_save: %s exists and is not a directory", dir);
    if (exists && dt__ckpt_has_index(dir)) {
        /* A finished commit's leftover: the new checkpoint is in place. */
        if ((st = dt__ckpt_remove_dir(old)) != DT_OK)
            return st;
    } else if (exists && !dir_is_empty(dir)) {
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_save: %s exists and is not a checkpoint (no %s); not overwriting",
                         dir, DT_CKPT_INDEX_NAME);
    }
    if ((st = make_parents(dir)) != DT_OK)
        return st;
    if (mkdir(tmp_out, 0755) != 0)
        return dt__error(DT_ERR_IO, "%s: mkdir: %s", tmp_out, strerror(errno));
    return DT_OK;
}

dt_status dt__ckpt_commit(const char *dir, const char *tmp, int do_fsync)
{
    char old[CK_PATH_MAX], parent[CK_PATH_MAX];
    dt_status st = dt__ckpt_join(old, sizeof old, dir, "", CK_SUFFIX_OLD);
    if (st != DT_OK)
        return st;
    parent_of(dir, parent, sizeof parent);
    struct stat sb;
    int exists = stat(dir, &sb) == 0;
    if (exists) {
        /* An older .dtensor-old can only remain when `dir` is missing; never here. */
        if ((st = dt__ckpt_remove_dir(old)) != DT_OK)
            return st;
        if (rename(dir, old) != 0)
            return dt__error(DT_ERR_IO, "rename %s -> %s: %s", dir, old, strerror(errno));
    }
    if (rename(tmp, dir) != 0) {
        int e = errno;
        if (exists && rename(old, dir) != 0) {
            /* Readers still find the previous checkpoint in .dtensor-old. */
        }
        return dt__error(DT_ERR_IO, "rename %s -> %s: %s", tmp, dir, strerror(e));
    }
    if (do_fsync && (st = dt__ckpt_fsync_dir(parent)) != DT_OK)
        return st;
    /* The new checkpoint is durable: the old one's blocks are freed in the background. */
    if ((st = dt__ckpt_retire_dir(old)) != DT_OK)
        return st;
    if (do_fsync && (st = dt__ckpt_fsync_dir(parent)) != DT_OK)
        return st;
    return DT_OK;
}
