/* The checkpoint manager's directory: steps in ROOT/step-NNNNNNNNNN, the atomically replaced
 * pointer ROOT/latest naming the last published step, finding the latest complete step (and
 * the damaged ones passed over), pruning the steps a keep policy does not keep and setting
 * damaged ones aside (docs/ckpt.md, "Checkpoint manager"). */
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
#include "runtime/util.h"

#define STEP_PREFIX "step-"
#define LATEST_NAME "latest"
#define DAMAGED_SUFFIX ".damaged"

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

/* The step of a directory entry "step-<digits>" with an optional suffix: a checkpoint's
 * (".dtensor-tmp", ".dtensor-old": *kind_out ENTRY_LEFTOVER) or a damaged step set aside
 * (".damaged", ".damaged.<digits>": ENTRY_ASIDE); none: ENTRY_PLAIN. 0 and *step_out, else -1. */
enum { ENTRY_PLAIN, ENTRY_LEFTOVER, ENTRY_ASIDE };
static int entry_step(const char *name, int64_t *step_out, int *kind_out)
{
    size_t pl = strlen(STEP_PREFIX), dl = strlen(DAMAGED_SUFFIX);
    if (strncmp(name, STEP_PREFIX, pl) != 0)
        return -1;
    const char *p = name + pl, *q = p;
    int64_t v = 0;
    while (*q >= '0' && *q <= '9' && q - p < 18)
        v = v * 10 + (*q++ - '0');
    if (q == p)
        return -1;
    int kind = ENTRY_PLAIN;
    if (strcmp(q, CK_SUFFIX_TMP) == 0 || strcmp(q, CK_SUFFIX_OLD) == 0) {
        kind = ENTRY_LEFTOVER;
    } else if (strncmp(q, DAMAGED_SUFFIX, dl) == 0) {
        const char *k = q + dl;
        if (*k == '.' && k[1])
            for (k++; *k >= '0' && *k <= '9'; k++)
                ;
        if (*k)
            return -1;
        kind = ENTRY_ASIDE;
    } else if (*q) {
        return -1;
    }
    *step_out = v;
    *kind_out = kind;
    return 0;
}

static int cmp_step(const void *pa, const void *pb)
{
    const dt_ckpt_step *a = pa, *b = pb;
    if (a->step != b->step)
        return a->step < b->step ? -1 : 1;
    if (a->set_aside != b->set_aside)
        return a->set_aside - b->set_aside;
    return strcmp(a->name, b->name);
}

/* 1 when the checkpoint of step directory `dir` opens (sealed, valid index) and every data file
 * it lists is there with its recorded size: what a restore needs before it reads data. Else 0
 * and, in why (len bytes), what is wrong. */
static int step_complete(const char *dir, char *why, size_t len)
{
    dt_ckpt *ck = NULL;
    dt_status st = dt_ckpt_open(dir, &ck);
    if (st != DT_OK) {
        snprintf(why, len, "%s", dt_last_error());
        return 0;
    }
    int ok = 1;
    char msg[CK_PATH_MAX + 160] = "";
    for (int64_t f = 0; ok && f < dt_ckpt_num_files(ck); f++) {
        dt_ckpt_file_info fi;
        char p[CK_PATH_MAX];
        struct stat sb;
        if (dt_ckpt_file(ck, f, &fi) != DT_OK ||
            dt__ckpt_join(p, sizeof p, dt_ckpt_path(ck), "/", fi.name) != DT_OK) {
            snprintf(msg, sizeof msg, "%s", dt_last_error());
            ok = 0;
        } else if (stat(p, &sb) != 0) {
            snprintf(msg, sizeof msg, "%s: %s", p, strerror(errno));
            ok = 0;
        } else if ((uint64_t)sb.st_size != fi.bytes) {
            snprintf(msg, sizeof msg, "%s: %" PRIu64 " bytes, the index records %" PRIu64
                     " (%s)", p, (uint64_t)sb.st_size, fi.bytes,
                     (uint64_t)sb.st_size < fi.bytes ? "truncated" : "longer");
            ok = 0;
        }
    }
    dt__strlcpy(why, msg, len);
    dt_ckpt_close(ck);
    return ok;
}

/* 1 when step directory `dir` (or its ".dtensor-old", left by a commit that stopped between
 * its renames) holds an index: a committed step, damaged rather than incomplete when it does
 * not check out. A crashed save leaves its index only in ".dtensor-tmp". */
static int step_committed(const char *dir)
{
    char old[CK_PATH_MAX];
    return dt__ckpt_has_index(dir) ||
           (dt__ckpt_join(old, sizeof old, dir, "", CK_SUFFIX_OLD) == DT_OK &&
            dt__ckpt_has_index(old));
}

/* Fills v's complete, damaged and reason from its directory under root r. */
static void judge_step(const char *r, dt_ckpt_step *v)
{
    char sd[CK_PATH_MAX];
    if (v->set_aside) {
        if (dt__ckpt_join(sd, sizeof sd, r, "/", v->name) == DT_OK &&
            step_complete(sd, v->reason, sizeof v->reason))
            snprintf(v->reason, sizeof v->reason, "set aside as damaged; it checks out now");
        v->damaged = 1;
        return;
    }
    if (dt_ckpt_step_dir(r, v->step, sd, sizeof sd) != DT_OK)
        return;
    v->complete = step_complete(sd, v->reason, sizeof v->reason);
    v->damaged = !v->complete && step_committed(sd);
    if (!v->damaged)
        v->reason[0] = '\0';
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
        int kind;
        if (entry_step(e->d_name, &step, &kind) != 0 ||
            strlen(e->d_name) >= sizeof v->name)
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
        v[n] = (dt_ckpt_step){.step = step, .set_aside = kind == ENTRY_ASIDE};
        snprintf(v[n].name, sizeof v[n].name, "%s", e->d_name);
        if (kind != ENTRY_ASIDE)   /* a step and its leftovers are one entry, named plain */
            snprintf(v[n].name, sizeof v[n].name, STEP_PREFIX "%010" PRId64, step);
        n++;
    }
    closedir(d);
    if (n > 0)
        qsort(v, (size_t)n, sizeof *v, cmp_step);
    int64_t u = 0;   /* one entry per step (a step and its leftovers are seen apart) */
    for (int64_t i = 0; i < n; i++)
        if (u == 0 || v[i].set_aside || v[u - 1].set_aside || v[u - 1].step != v[i].step)
            v[u++] = v[i];
    n = u;
    for (int64_t i = 0; i < n; i++)
        judge_step(r, &v[i]);
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
    int kind;
    return entry_step(text, &step, &kind) == 0 && kind == ENTRY_PLAIN ? step : -1;
}

dt_status dt_ckpt_find_latest(const char *root, dt_ckpt_latest_info *info_out, char *dir_buf,
                              size_t len)
{
    char r[CK_PATH_MAX], sd[CK_PATH_MAX];
    dt_status st = dt__ckpt_norm_dir("dt_ckpt_latest", root, r, sizeof r);
    if (st != DT_OK)
        return st;
    dt_ckpt_latest_info info = {.step = pointer_step(r), .skipped_step = -1};
    if (info.step < 0 || dt_ckpt_step_dir(r, info.step, sd, sizeof sd) != DT_OK ||
        !step_complete(sd, info.skipped_reason, sizeof info.skipped_reason)) {
        /* No usable pointer (none yet, or its step damaged): the newest complete step; the
         * damaged ones passed over on the way are reported. */
        int64_t pointed = info.step;
        dt_ckpt_step *v = NULL;
        int64_t n = 0;
        if ((st = dt_ckpt_list_steps(r, &v, &n)) != DT_OK)
            return st;
        info.step = -1;
        info.skipped_reason[0] = '\0';
        for (int64_t i = n - 1; i >= 0 && info.step < 0; i--) {
            if (v[i].complete) {
                info.step = v[i].step;
            } else if (v[i].damaged && !v[i].set_aside && (pointed < 0 || v[i].step <= pointed)) {
                if (info.skipped++ == 0) {
                    info.skipped_step = v[i].step;
                    memcpy(info.skipped_reason, v[i].reason, sizeof info.skipped_reason);
                }
            }
        }
        free(v);
        if (info.step < 0 && info.skipped > 0)
            return dt__error(DT_ERR_NOT_FOUND, "%s: no complete checkpoint step (step %" PRId64
                             " is damaged: %s)", r, info.skipped_step, info.skipped_reason);
        if (info.step < 0)
            return dt__error(DT_ERR_NOT_FOUND, "%s: no complete checkpoint step", r);
    }
    if (dir_buf && (st = dt_ckpt_step_dir(r, info.step, dir_buf, len)) != DT_OK)
        return st;
    if (info_out)
        *info_out = info;
    return DT_OK;
}

dt_status dt_ckpt_latest(const char *root, int64_t *step_out, char *dir_buf, size_t len)
{
    dt_ckpt_latest_info info;
    dt_status st = dt_ckpt_find_latest(root, &info, dir_buf, len);
    if (st == DT_OK && step_out)
        *step_out = info.step;
    return st;
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

dt_status dt__ckpt_step_set_aside(const char *dir, int do_fsync)
{
    char from[CK_PATH_MAX], to[CK_PATH_MAX], parent[CK_PATH_MAX], why[8];
    dt_status st = DT_OK;
    if (!step_committed(dir) || step_complete(dir, why, sizeof why))
        return DT_OK;
    if (dt__ckpt_has_index(dir))
        st = dt__ckpt_join(from, sizeof from, dir, "", "");
    else
        st = dt__ckpt_join(from, sizeof from, dir, "", CK_SUFFIX_OLD);
    struct stat sb;
    int k = 1;
    for (; st == DT_OK && k <= 1000; k++) {
        char suffix[32];
        snprintf(suffix, sizeof suffix, k == 1 ? DAMAGED_SUFFIX : DAMAGED_SUFFIX ".%d", k);
        if ((st = dt__ckpt_join(to, sizeof to, dir, "", suffix)) == DT_OK &&
            lstat(to, &sb) != 0 && errno == ENOENT)
            break;
    }
    if (st != DT_OK)
        return st;
    if (k > 1000)
        return dt__error(DT_ERR_IO, "%s: damaged, and %s.damaged.2 to .1000 are all taken",
                         dir, dir);
    if (rename(from, to) != 0)
        return dt__error(DT_ERR_IO, "%s: damaged, setting it aside: rename to %s: %s", from,
                         to, strerror(errno));
    /* A crashed save's partial directory of the same step is no data worth keeping. */
    char tmp[CK_PATH_MAX];
    if ((st = dt__ckpt_join(tmp, sizeof tmp, dir, "", CK_SUFFIX_TMP)) == DT_OK)
        st = dt__ckpt_remove_dir(tmp);
    dt__strlcpy(parent, dir, sizeof parent);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent)
        *slash = '\0';
    if (st == DT_OK && do_fsync)
        st = dt__ckpt_fsync_dir(parent);
    return st;
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
     * keep->every stay; damaged ones are set aside, never removed; incomplete ones (crashed
     * saves) and the rest go. Newer steps (left by a run resumed from an earlier one) are not
     * touched. */
    int64_t kept = 1;
    for (int64_t i = n - 1; st == DT_OK && i >= 0; i--) {
        if (v[i].step >= step || v[i].set_aside)
            continue;
        if (v[i].damaged) {
            char sd[CK_PATH_MAX];
            if ((st = dt_ckpt_step_dir(root, v[i].step, sd, sizeof sd)) == DT_OK)
                st = dt__ckpt_step_set_aside(sd, do_fsync);
            continue;
        }
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

int dt__ckpt_is_checkpoint_place(const char *dir)
{
    char old[CK_PATH_MAX];
    return dt__ckpt_has_index(dir) ||
           (dt__ckpt_join(old, sizeof old, dir, "", CK_SUFFIX_OLD) == DT_OK &&
            dt__ckpt_has_index(old)) ||
           pointer_step(dir) >= 0;
}

dt_status dt__ckpt_check_keep(const char *fn, const dt_ckpt_keep *keep)
{
    if (!keep || keep->last < 1 || keep->every < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: keep.last must be >= 1 and keep.every "
                         ">= 0 (%d, %" PRId64 ")", fn, keep ? keep->last : 0,
                         keep ? keep->every : (int64_t)0);
    return DT_OK;
}
