/* train/job: the training examples' shared start-up, checks, output places, resume, save and
 * end (see job.h). */
#include "job.h"

#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "resume.h"

void job_begin(job *j, const char *prog, int *argc, char ***argv)
{
    MPI_Init(argc, argv);
    memset(j, 0, sizeof *j);
    j->prog = prog;
    MPI_Comm_rank(MPI_COMM_WORLD, &j->me);
    MPI_Comm_size(MPI_COMM_WORLD, &j->nprocs);
}

void job_abort_if_lost(const job *j)
{
    if (j->lost)
        MPI_Abort(MPI_COMM_WORLD, 3);
}

int job_end(job *j, int rc)
{
    job_abort_if_lost(j);
    if (j->started)
        dt_finalize();
    MPI_Finalize();
    return rc;
}

void job_say(const job *j, const char *fmt, ...)
{
    if (j->me != 0 || j->quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

int job_fail(job *j, const char *what, dt_status st, const char *msg)
{
    if (st == DT_ERR_TIMEOUT)
        j->lost = 1;
    if (j->me == 0 || st == DT_ERR_TIMEOUT)
        fprintf(stderr, "%s: %s: %s: %s\n", j->prog, what, dt_status_name(st),
                msg && *msg ? msg : dt_status_str(st));
    return 1;
}

int job_any_failed(const job *j, int failed, const char *msg)
{
    int mine = failed ? j->me : INT_MAX, first = INT_MAX;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first != INT_MAX && first == j->me)
        fprintf(stderr, "%s: %s\n", j->prog, msg);
    return first != INT_MAX;
}

double job_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double job_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the mesh and the runtime ------------------------------------------------------------- */

dt_status job_load_mesh(const char *file, const char *name, int device, dt_mesh **out)
{
    dt_mesh *m = NULL;
    dt_status st = dt_mesh_from_yaml_file(file, name, &m);
    if (st != DT_OK || device < 0 || (int)dt_mesh_device_type(m) == device) {
        *out = m;
        return st;
    }
    const char *names[DT_MESH_MAX_DIMS];
    int64_t sizes[DT_MESH_MAX_DIMS];
    for (int d = 0; d < dt_mesh_rank(m); d++) {
        names[d] = dt_mesh_dim_name(m, d);
        sizes[d] = dt_mesh_dim_size(m, d);
    }
    st = dt_mesh_create(dt_mesh_name(m), dt_mesh_rank(m), names, sizes, (dt_device_type)device,
                        out);
    dt_mesh_destroy(m);
    return st;
}

int job_start(job *j, const char *file, const char *name, int device)
{
    dt_mesh *probe = NULL;
    dt_status st = job_load_mesh(file, name, device, &probe);
    if (st != DT_OK)
        return job_fail(j, "mesh", st, dt_last_error());
    int64_t size = dt_mesh_size(probe);
    int gpu = dt_mesh_device_type(probe) == DT_DEVICE_GPU;
    dt_mesh_destroy(probe);
    dt_init_opts io = DT_INIT_OPTS_INIT;
    const char *var = gpu ? "DT_GPU_DEVICES" : "DT_CPU_DEVICES";
    const char *env = getenv(var);
    if (!env || !*env) {
        if (size % j->nprocs != 0) {
            if (j->me == 0)
                fprintf(stderr, "%s: mesh: %lld devices do not split evenly over %d processes; "
                        "set %s\n", j->prog, (long long)size, j->nprocs, var);
            return 1;
        }
        if (gpu)
            io.gpu_devices = (int)(size / j->nprocs);
        else
            io.cpu_devices = (int)(size / j->nprocs);
    }
    if ((st = dt_init(NULL, NULL, &io)) != DT_OK)
        return job_fail(j, "dt_init", st, dt_last_error());
    j->started = 1;
    return 0;
}

int job_mesh(job *j, const char *file, const char *name, int device, dt_mesh **out)
{
    dt_status st = job_load_mesh(file, name, device, out);
    if (st != DT_OK)
        return job_fail(j, "mesh", st, dt_last_error());
    const dt_mesh *m = *out;
    char msg[512];
    if (dt_mesh_dim_index(m, "batch") < 0) {
        snprintf(msg, sizeof msg,
                 "%s: mesh '%s' has no dim named 'batch' (%s needs 'batch', and optionally "
                 "'model')", file, dt_mesh_name(m), j->prog);
        return job_fail(j, "mesh", DT_ERR_INVALID_ARGUMENT, msg);
    }
    for (int d = 0; d < dt_mesh_rank(m); d++) {
        const char *n = dt_mesh_dim_name(m, d);
        if (strcmp(n, "batch") != 0 && strcmp(n, "model") != 0 && strcmp(n, "seq") != 0 &&
            !(j->allow_pipe && strcmp(n, "pipe") == 0)) {
            snprintf(msg, sizeof msg,
                     "%s: mesh '%s' has a dim '%s'; %s uses 'batch', 'model', 'seq'%s only",
                     file, dt_mesh_name(m), n, j->prog, j->allow_pipe ? " and 'pipe'" : "");
            return job_fail(j, "mesh", DT_ERR_INVALID_ARGUMENT, msg);
        }
    }
    dt_device_type t = dt_mesh_device_type(m);
    int have = dt_num_global_devices(t);
    long long size = (long long)dt_mesh_size(m);
    if (have != size) {
        snprintf(msg, sizeof msg,
                 "mesh '%s' has %lld devices but this job has %d (%d process%s x %d local "
                 "devices): run %lld devices in all, e.g. %s=%lld with one process",
                 dt_mesh_name(m), size, have, j->nprocs, j->nprocs == 1 ? "" : "es",
                 dt_num_local_devices(t), size,
                 t == DT_DEVICE_GPU ? "DT_GPU_DEVICES" : "DT_CPU_DEVICES", size);
        return job_fail(j, "mesh", DT_ERR_DEVICE_MISMATCH, msg);
    }
    if ((st = dt_mesh_check_devices(m)) != DT_OK)
        return job_fail(j, "mesh", st, dt_last_error());
    return 0;
}

/* ---- output places ------------------------------------------------------------------------ */

/* mkdir -p. Returns 0, or -1 with errno set. */
static int make_dirs(const char *path)
{
    char buf[JOB_PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return -1;
    struct stat sb;
    if (stat(buf, &sb) != 0)
        return -1;
    if (!S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Makes the checkpoint's parent and refuses a checkpoint path that is not a directory.
 * Returns 0, or -1 with errno set. */
static int ckpt_parent(const char *ckpt_dir)
{
    char parent[JOB_PATH_MAX];
    snprintf(parent, sizeof parent, "%s", ckpt_dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        if (make_dirs(parent) != 0)
            return -1;
    }
    struct stat sb;
    if (stat(ckpt_dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int job_places(job *j, const char *out_dir, const char *ckpt_dir, const char *ckpt_root,
               char *ckpt_dir_out, char *csv_out, char *png_out)
{
    if (ckpt_root)
        snprintf(ckpt_dir_out, JOB_PATH_MAX, "%s/", ckpt_root); /* make_dirs(root) */
    else if (ckpt_dir)
        snprintf(ckpt_dir_out, JOB_PATH_MAX, "%s", ckpt_dir);
    else
        snprintf(ckpt_dir_out, JOB_PATH_MAX, "%s/checkpoint", out_dir);
    snprintf(csv_out, JOB_PATH_MAX, "%s/curves.csv", out_dir);
    snprintf(png_out, JOB_PATH_MAX, "%s/curves.png", out_dir);
    char err[JOB_PATH_MAX + 100] = "";
    int bad = make_dirs(out_dir) != 0;
    if (bad)
        snprintf(err, sizeof err, "--out %s: %s", out_dir, strerror(errno));
    if (job_any_failed(j, bad, err))
        return 1;
    bad = ckpt_parent(ckpt_dir_out) != 0;
    if (bad)
        snprintf(err, sizeof err, "--ckpt-dir %s: %s", ckpt_dir_out, strerror(errno));
    return job_any_failed(j, bad, err);
}

/* ---- checkpoints -------------------------------------------------------------------------- */

/* Reads the state *t of the checkpoint in `dir` (see job_resume). 0, or -1 with err. */
static int read_state(const job *j, const job_train *t, const char *dir, int64_t steps,
                      int may_be_done, int64_t stop_after, job_check_fn check,
                      void *check_arg, char *err, size_t errlen)
{
    dt_ckpt *ck = NULL;
    if (dt_ckpt_open(dir, &ck) != DT_OK) {
        snprintf(err, errlen, "--resume: %s", dt_last_error());
        return -1;
    }
    int64_t step = 0;
    const void *hd = NULL;
    size_t hn = 0;
    int rc = -1;
    if (check(check_arg, ck, dir, err, errlen) != 0)
        goto out;
    if (dt_ckpt_value_i64(ck, "train/step", &step) != DT_OK ||
        dt_ckpt_value_bytes(ck, "train/history", &hd, &hn) != DT_OK) {
        snprintf(err, errlen, "--resume %s: not a %s checkpoint: %s", dir, j->prog,
                 dt_last_error());
        goto out;
    }
    if (step < 0 || step > steps || (step == steps && !may_be_done) ||
        (stop_after && stop_after <= step)) {
        snprintf(err, errlen, "--resume %s: the checkpoint is at step %lld; --steps %lld%s must "
                 "be beyond it", dir, (long long)step, (long long)steps,
                 stop_after ? " and --stop-after" : "");
        goto out;
    }
    if (t->data && dt_dataset_load_state(t->data, ck, "train/data/") != DT_OK) {
        snprintf(err, errlen, "--resume %s: %s", dir, dt_last_error());
        goto out;
    }
    if (history_deserialize(t->hist, hd, hn) != 0) {
        snprintf(err, errlen, "--resume %s: bad train/history value", dir);
        goto out;
    }
    history_truncate(t->hist, step);
    *t->step = step;
    rc = 0;
out:
    dt_ckpt_close(ck);
    return rc;
}

int job_resume(job *j, const job_train *t, const char *arg, const char *root, int64_t steps,
               int may_be_done, int64_t stop_after, job_check_fn check, void *check_arg)
{
    char err[4400] = "", dir[JOB_PATH_MAX];
    int bad = resume_dir(arg, root, dir, sizeof dir, err, sizeof err) != 0 ||
              read_state(j, t, dir, steps, may_be_done, stop_after, check, check_arg, err,
                         sizeof err) != 0;
    if (job_any_failed(j, bad, err))
        return 1;
    dt_status st = dt_zero_load(t->zero, dir);
    if (st != DT_OK)
        return job_fail(j, "dt_zero_load", st, dt_last_error());
    char note[1200];
    if (resume_note(arg, root, note, sizeof note))
        job_say(j, "%s\n", note);
    job_say(j, "resumed from %s at step %lld\n", dir, (long long)*t->step);
    return 0;
}

/* The values every save writes (train/step, train/history, the example's, the data
 * position) into v; *hbuf_out (freed by the caller) holds the history. The count, or -1
 * (printed). Collective on failure, unless `local` (an in-memory save agrees on nothing:
 * a failure there fails this client's job). */
static int save_values(job *j, const job_train *t, const dt_ckpt_value *values, int nvalues,
                       dt_ckpt_value *v, uint8_t **hbuf_out, int local)
{
    size_t hb = history_bytes(t->hist);
    uint8_t *hbuf = malloc(hb ? hb : 1);
    *hbuf_out = hbuf;
    if (local && !hbuf) {
        fprintf(stderr, "%s: client %d: in-memory save: out of memory\n", j->prog, j->me);
        return -1;
    }
    if (!local && job_any_failed(j, !hbuf, "out of memory"))
        return -1;
    history_serialize(t->hist, hbuf);
    v[0] = (dt_ckpt_value){"train/step", DT_CKPT_VALUE_I64, *t->step, 0, NULL, 0};
    v[1] = (dt_ckpt_value){"train/history", DT_CKPT_VALUE_BYTES, 0, 0, hbuf, hb};
    memcpy(v + 2, values, (size_t)nvalues * sizeof *values);
    /* The data position: the next batch a resumed run reads. */
    dt_status st = t->data ? dt_dataset_state_values(t->data, "train/data/", v + 2 + nvalues)
                           : DT_OK;
    if (st != DT_OK) {
        job_fail(j, "dataset state", st, dt_last_error());
        return -1;
    }
    return 2 + nvalues + (t->data ? DT_DATASET_STATE_VALUES : 0);
}

int job_save(job *j, const job_train *t, const dt_ckpt_value *values, int nvalues,
             const char *root, int64_t keep_last, char *dir)
{
    dt_ckpt_value v[2 + JOB_MAX_VALUES + DT_DATASET_STATE_VALUES];
    uint8_t *hbuf = NULL;
    int nv = save_values(j, t, values, nvalues, v, &hbuf, 0);
    if (nv < 0) {
        free(hbuf);
        return 1;
    }
    dt_save_opts so = DT_SAVE_OPTS_INIT;
    so.values = v;
    so.nvalues = nv;
    dt_status st = save_train_state(t->zero, t->joint, root, keep_last, *t->step, dir,
                                    JOB_PATH_MAX, &so);
    free(hbuf);
    return st != DT_OK ? job_fail(j, "dt_zero_save", st, dt_last_error()) : 0;
}

/* ---- in-memory checkpoints (docs/recovery.md) ---------------------------------------------- */

static dt_status save_into(void *arg, const char *dir, const dt_save_opts *opts)
{
    const job_train *t = arg;
    char d[JOB_PATH_MAX];
    snprintf(d, sizeof d, "%s", dir);
    return save_train_state(t->zero, t->joint, NULL, 0, *t->step, d, sizeof d, opts);
}

int job_save_memory(job *j, const job_train *t, const dt_ckpt_value *values, int nvalues,
                    dt_memckpt *mc)
{
    dt_ckpt_value v[2 + JOB_MAX_VALUES + DT_DATASET_STATE_VALUES];
    uint8_t *hbuf = NULL;
    int nv = save_values(j, t, values, nvalues, v, &hbuf, 1);
    if (nv < 0) {
        free(hbuf);
        return 1;
    }
    dt_save_opts so = DT_SAVE_OPTS_INIT;
    so.values = v;
    so.nvalues = nv;
    dt_status st = dt_memckpt_save(mc, *t->step, save_into, (void *)t, &so);
    free(hbuf);
    if (st == DT_OK)
        return 0;
    /* Said by the client it failed on (after the first save, the others may not know). */
    fprintf(stderr, "%s: client %d: dt_memckpt_save: %s: %s\n", j->prog, j->me,
            dt_status_name(st), dt_last_error());
    if (st == DT_ERR_TIMEOUT)
        j->lost = 1;
    return 1;
}

/* The step of the disk checkpoint --resume `arg` names, -1 when there is none. Local. */
static int64_t disk_step(const char *arg, const char *root)
{
    char dir[JOB_PATH_MAX], err[256];
    dt_ckpt *ck = NULL;
    int64_t step = -1;
    if (!arg || resume_dir(arg, root, dir, sizeof dir, err, sizeof err) != 0 ||
        dt_ckpt_open(dir, &ck) != DT_OK)
        return -1;
    if (dt_ckpt_value_i64(ck, "train/step", &step) != DT_OK)
        step = -1;
    dt_ckpt_close(ck);
    return step;
}

int job_resume_memory(job *j, const job_train *t, dt_memckpt *mc, const char *disk_arg,
                      const char *root, int64_t steps, int64_t stop_after, job_check_fn check,
                      void *check_arg)
{
    dt_memckpt_found f;
    dt_status st = dt_memckpt_find(mc, &f);
    char why[600];
    snprintf(why, sizeof why, "%s", st != DT_OK ? dt_last_error() : "");
    /* Every client reads the same shared disk: the same answer everywhere. */
    int64_t disk = disk_step(disk_arg, root);
    if (st == DT_ERR_NOT_FOUND) {
        if (disk_arg)
            job_say(j, "memory: %s; resuming from disk\n", why);
        return 2;
    }
    if (st != DT_OK)
        return job_fail(j, "dt_memckpt_find", st, why);
    if (disk > f.step) {
        job_say(j, "memory: step %lld is older than the disk's step %lld; resuming from disk\n",
                (long long)f.step, (long long)disk);
        return 2;
    }
    char dir[JOB_PATH_MAX];
    double t0 = job_now();
    if ((st = dt_memckpt_fetch(mc, f.step, dir, sizeof dir)) != DT_OK)
        return job_fail(j, "dt_memckpt_fetch", st, dt_last_error());
    double fetched = job_now() - t0;
    int quiet = j->quiet;
    j->quiet = 1; /* its own line below says where from */
    int rc = job_resume(j, t, dir, NULL, steps, 0, stop_after, check, check_arg);
    j->quiet = quiet;
    if (rc != 0)
        return rc;
    job_say(j, "resumed from memory at step %lld: %lld files in the memory of %d host(s), "
            "%lld of them buddy copies of lost clients' files; fetched in %.3f s, loaded in "
            "%.3f s%s\n", (long long)f.step, (long long)f.files, f.hosts,
            (long long)f.from_buddies, fetched, job_now() - t0 - fetched,
            f.newer_incomplete >= 0 ? " (a newer step was incomplete)" : "");
    return 0;
}
