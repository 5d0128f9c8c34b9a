/* The checkpoint manager's directory: steps in ROOT/step-NNNNNNNNNN, the atomically replaced
 * pointer ROOT/latest naming the last published step, finding the latest complete step, and
 * pruning the steps a keep policy does not keep (docs/ckpt.md, "Checkpoint manager"). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"

#define STEP_PREFIX "step-"
#define LATEST_NAME "latest"

dt_status dt_ckpt_step_dir(const char *root, int64_t step, char *buf, size_t len)
{
    char r[CK_PATH_MAX];
    dt_status st = dt__ckpt_norm_dir("dt_ckpt_step_dir", root, r, sizeof r);
    if (st != DT_OK)
        return st;
    if (step < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_step_dir: step %" PRId64 " < 0",
                         step);
    if (!buf || (size_t)snprintf(buf, len, "%s/" STEP_PREFIX "%010" PRId64, r, step) >= len)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_step_dir: buffer too small");
    return DT_OK;
}

/* The step of a directory entry "step-<digits>" with an optional checkpoint suffix (".dtensor-
 * tmp", ".dtensor-old"): 0 and *step_out, else -1. *plain_out: 1 without a suffix. */
static int entry_step(const char *name, int64_t *step_out, int *plain_out)
{
    size_t pl = strlen(STEP_PREFIX);
    if (strncmp(name, STEP_PREFIX, pl) != 0)
        return -1;
    const char *p = name + pl, *q = p;
    int64_t v = 0;
    while (*q >= '0' && *q <= '9' && q - p < 18)
        v = v * 10 + (*q++ - '0');
    if (q == p)
        return -1;
    if (*q && strcmp(q, CK_SUFFIX_TMP) != 0 && strcmp(q, CK_SUFFIX_OLD) != 0)
        return -1;
    *step_out = v;
    *plain_out = *q == '\0';
    return 0;
}

static int cmp_step(const void *pa, const void *pb)
{
    const dt_ckpt_step *a = pa, *b = pb;
    return a->step < b->step ? -1 : a->step > b->step;
}

/* 1 when the checkpoint of step directory `dir` opens (sealed, valid index) and every data file
 * it lists is there with its recorded size: what a restore needs before it reads data. */
static int step_complete(const char *dir)
{
    dt_ckpt *ck = NULL;
    int ok = dt_ckpt_open(dir, &ck) == DT_OK;
    for (int64_t f = 0; ok && f < dt_ckpt_num_files(ck); f++) {
        dt_ckpt_file_info fi;
        char p[CK_PATH_MAX];
        struct stat sb;
        ok = dt_ckpt_file(ck, f, &fi) == DT_OK &&
             dt__ckpt_join(p, sizeof p, dt_ckpt_path(ck), "/", fi.name) == DT_OK &&
             stat(p, &sb) == 0 && (uint64_t)sb.st_size == fi.bytes;
    }
    dt_ckpt_close(ck);
    return ok;
}

dt_status dt_ckpt_list_steps(const char *root, dt_ckpt_step **steps_out, int64_t *count_out)
{
    char r[CK_PATH_MAX];
    if (!steps_out || !count_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_list_steps: NULL output");
    dt_status st = dt__ckpt_norm_dir("dt_ckpt_list_steps", root, r, sizeof r);
    if (st != DT_OK)
        return st;
    DIR *d = opendir(r);
    if (!d)
        return dt__error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "%s: %s", r,
                         strerror(errno));
    dt_ckpt_step *v = NULL;
    int64_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step;
        int plain;
        if (entry_step(e->d_name, &step, &plain) != 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            dt_ckpt_step *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) {
                free(v);
                closedir(d);
                return dt__error(DT_ERR_NO_MEMORY, "dt_ckpt_list_steps: no memory");
            }
            v = nv;
        }
        v[n++] = (dt_ckpt_step){.step = step, .complete = 0};
    }
    closedir(d);
    if (n > 0)
        qsort(v, (size_t)n, sizeof *v, cmp_step);
    int64_t u = 0;   /* one entry per step (a step and its leftovers are seen apart) */
    for (int64_t i = 0; i < n; i++)
        if (u == 0 || v[u - 1].step != v[i].step)
            v[u++] = v[i];
    n = u;
    for (int64_t i = 0; i < n; i++) {
        char sd[CK_PATH_MAX];
        if (dt_ckpt_step_dir(r, v[i].step, sd, sizeof sd) == DT_OK)
            v[i].complete = step_complete(sd);
    }
    *steps_out = v;
    *count_out = n;
    return DT_OK;
}

/* The step ROOT/latest names, or -1 (missing or not "step-<digits>\n"). */
static int64_t pointer_step(const char *root)
{
    char p[CK_PATH_MAX], text[64] = "";
    if (dt__ckpt_join(p, sizeof p, root, "/", LATEST_NAME) != DT_OK)
        return -1;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int64_t got = dt__ckpt_pread(fd, text, sizeof text - 1, 0);
    close(fd);
    if (got <= 1 || text[got - 1] != '\n')
        return -1;
    text[got - 1] = '\0';
    int64_t step;
    int plain;
    return entry_step(text, &step, &plain) == 0 && plain ? step : -1;
}

dt_status dt_ckpt_latest(const char *root, int64_t *step_out, char *dir_buf, size_t len)
{
    char r[CK_PATH_MAX], sd[CK_PATH_MAX];
    dt_status st = dt__ckpt_norm_dir("dt_ckpt_latest", root, r, sizeof r);
    if (st != DT_OK)
        return st;
    int64_t step = pointer_step(r);
    if (step < 0 || dt_ckpt_step_dir(r, step, sd, sizeof sd) != DT_OK || !step_complete(sd)) {
        /* No usable pointer (none yet, or its step damaged): the newest complete step. */
        dt_ckpt_step *v = NULL;
        int64_t n = 0;
        if ((st = dt_ckpt_list_steps(r, &v, &n)) != DT_OK)
            return st;
        step = -1;
        for (int64_t i = n - 1; i >= 0 && step < 0; i--)
            if (v[i].complete)
                step = v[i].step;
        free(v);
        if (step < 0)
            return dt__error(DT_ERR_NOT_FOUND, "%s: no complete checkpoint step", r);
    }
    if (dir_buf && (st = dt_ckpt_step_dir(r, step, dir_buf, len)) != DT_OK)
        return st;
    if (step_out)
        *step_out = step;
    return DT_OK;
}

void dt_ckpt_steps_free(dt_ckpt_step *steps) { free(steps); }

/* Writes ROOT/latest through a temporary file and a rename (atomic), fsyncing when asked. */
static dt_status write_pointer(const char *root, int64_t step, int do_fsync)
{
    char p[CK_PATH_MAX], tmp[CK_PATH_MAX], text[64];
    int n = snprintf(text, sizeof text, STEP_PREFIX "%010" PRId64 "\n", step);
    dt_status st = dt__ckpt_join(p, sizeof p, root, "/", LATEST_NAME);
    if (st == DT_OK)
        st = dt__ckpt_join(tmp, sizeof tmp, p, "", CK_SUFFIX_TMP);
    if (st != DT_OK)
        return st;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dt__ckpt_pwrite(fd, text, (size_t)n, 0) != 0 || (do_fsync && fsync(fd) != 0)) {
        st = dt__error(DT_ERR_IO, "%s: %s", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        unlink(tmp);
        return st;
    }
    if (close(fd) != 0 || rename(tmp, p) != 0) {
        st = dt__error(DT_ERR_IO, "%s: %s", p, strerror(errno));
        unlink(tmp);
        return st;
    }
    return do_fsync ? dt__ckpt_fsync_dir(root) : DT_OK;
}

/* Removes step `step` under root: its index first (an interrupted removal leaves an
 * incomplete step, never chosen), then its files and the leftovers beside it. */
static dt_status remove_step(const char *root, int64_t step)
{
    char sd[CK_PATH_MAX], p[CK_PATH_MAX];
    dt_status st = dt_ckpt_step_dir(root, step, sd, sizeof sd);
    if (st != DT_OK)
        return st;
    static const char *const suffixes[] = {"", CK_SUFFIX_OLD, CK_SUFFIX_TMP};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        char d[CK_PATH_MAX];
        if ((st = dt__ckpt_join(d, sizeof d, sd, "", suffixes[i])) != DT_OK ||
            (st = dt__ckpt_join(p, sizeof p, d, "/", DT_CKPT_INDEX_NAME)) != DT_OK)
            return st;
        if (unlink(p) != 0 && errno != ENOENT && errno != ENOTDIR)
            return dt__error(DT_ERR_IO, "%s: remove: %s", p, strerror(errno));
        if ((st = dt__ckpt_retire_dir(d)) != DT_OK)
            return st;
    }
    return DT_OK;
}

dt_status dt__ckpt_step_publish(const char *root, int64_t step, const dt_ckpt_keep *keep,
                                int do_fsync)
{
    dt_status st = write_pointer(root, step, do_fsync);
    if (st != DT_OK)
        return st;
    dt_ckpt_step *v = NULL;
    int64_t n = 0;
    if ((st = dt_ckpt_list_steps(root, &v, &n)) != DT_OK)
        return st;
    /* Below the new step: the newest keep->last - 1 complete ones and the multiples of
     * keep->every stay; incomplete ones (crashed saves) and the rest go. Newer steps (left by
     * a run resumed from an earlier one) are not touched. */
    int64_t kept = 1;
    for (int64_t i = n - 1; st == DT_OK && i >= 0; i--) {
        if (v[i].step >= step)
            continue;
        int keep_it = v[i].complete && (kept < keep->last ||
                                        (keep->every > 0 && v[i].step % keep->every == 0));
        kept += keep_it && kept < keep->last;
        if (!keep_it)
            st = remove_step(root, v[i].step);
    }
    free(v);
    if (st == DT_OK && do_fsync)
        st = dt__ckpt_fsync_dir(root);
    return st;
}

dt_status dt__ckpt_check_keep(const char *fn, const dt_ckpt_keep *keep)
{
    if (!keep || keep->last < 1 || keep->every < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: keep.last must be >= 1 and keep.every "
                         ">= 0 (%d, %" PRId64 ")", fn, keep ? keep->last : 0,
                         keep ? keep->every : (int64_t)0);
    return DT_OK;
}
