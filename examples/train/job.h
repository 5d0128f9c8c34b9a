/* train/job: what train_mlp and train_gpt do alike around their models: the MPI start and
 * end, sizing and starting the runtime from the mesh file, the mesh checks, the output
 * places, failures every client learns of, --resume and the checkpoint save
 * (docs/examples.md). Each example keeps its own options, data, model and training loop. */
#ifndef TRAIN_JOB_H
#define TRAIN_JOB_H

#include <stddef.h>
#include <stdint.h>

#include <dtensor/dtensor.h>

#include "history.h"

#define JOB_PATH_MAX 4096
#define JOB_MAX_VALUES 8 /* the example's own checkpoint values (job_save) */

/* One process of a training job. */
typedef struct job {
    const char *prog; /* "train_mlp": the start of every message */
    int me, nprocs;
    int quiet;   /* --quiet: job_say prints nothing */
    int lost;    /* a client was lost (DT_ERR_TIMEOUT): the job is aborted */
    int started; /* dt_init succeeded: job_end finalizes the runtime */
    int allow_pipe; /* job_mesh accepts a `pipe` dim too (train_gpt --pipe) */
} job;

/* MPI_Init, then this process's rank and the process count into *j. */
void job_begin(job *j, const char *prog, int *argc, char ***argv);
/* MPI_Abort when a client was lost: the clients cannot agree on anything any more (not even
 * on freeing) and MPI_Finalize would wait for the lost ones. */
void job_abort_if_lost(const job *j);
/* Ends the process's part: job_abort_if_lost, dt_finalize (when started), MPI_Finalize.
 * Returns rc, the exit status. */
int job_end(job *j, int rc);

/* Client 0 prints (printf), unless quiet. */
void job_say(const job *j, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* A failed library call `what`: client 0 prints "<prog>: <what>: <status>: <msg>"; a lost
 * client (DT_ERR_TIMEOUT) prints on every client, since client 0 may be among the lost, and
 * marks the job lost. Returns 1. */
int job_fail(job *j, const char *what, dt_status st, const char *msg);

/* A failure seen by some clients only (a file, memory): all clients learn of it, the lowest
 * failing one prints "<prog>: <msg>". Returns 1 if any client failed. Collective. */
int job_any_failed(const job *j, int failed, const char *msg);

/* Seconds on the monotonic clock. */
double job_now(void);
/* CPU seconds this process has used (all its threads, user and system). */
double job_cpu_now(void);

/* The mesh `name` of the YAML file (NULL: its first), on the device type `device`
 * (DT_DEVICE_CPU / DT_DEVICE_GPU; -1: the file's own): the same name and dims on that type.
 * Local; the loader's status. */
dt_status job_load_mesh(const char *file, const char *name, int device, dt_mesh **out);

/* Reads the mesh before dt_init to size the devices: unless DT_CPU_DEVICES (DT_GPU_DEVICES
 * for a GPU mesh) is set, each process gets mesh size / processes devices, so the example
 * alone runs a whole mesh. Then dt_init. Returns 0, or 1 (printed). */
int job_start(job *j, const char *file, const char *name, int device);

/* Loads the mesh (as job_load_mesh) and checks it for a training example: a dim `batch`,
 * optionally `model`, no other; as many devices as the job has, and usable ones. Returns 0
 * with the mesh in *out (the caller destroys it, also on failure), or 1 (printed). */
int job_mesh(job *j, const char *file, const char *name, int device, dt_mesh **out);

/* Where a run writes: the checkpoint (`ckpt_root`/ when given, else `ckpt_dir`, else
 * `out_dir`/checkpoint) into ckpt_dir_out, `out_dir`/curves.csv and /curves.png into the
 * other two (each JOB_PATH_MAX bytes). Makes `out_dir` and the checkpoint's parent (the
 * save's temporary directory goes beside it) and refuses a checkpoint path that is not a
 * directory. Returns 0, or 1 (printed). Collective. */
int job_places(job *j, const char *out_dir, const char *ckpt_dir, const char *ckpt_root,
               char *ckpt_dir_out, char *csv_out, char *png_out);

/* What every training example checkpoints besides its own values (borrowed). */
typedef struct job_train {
    dt_zero *zero;    /* the optimizer and its parameters */
    dt_dataset *data; /* its position: train/data/... (NULL: none, the step tells it) */
    history *hist;    /* train/history */
    int64_t *step;    /* train/step: the steps done */
    /* NULL, or the mesh a checkpoint is saved from by several optimizers together (a
     * pipeline's stages, each client passing its own: dt_zero_save_joint) */
    const dt_mesh *joint;
} job_train;

/* Checks the example's own values in the opened checkpoint `ck` of `dir` against this run
 * (local). Returns 0, or -1 with a message in err. */
typedef int (*job_check_fn)(void *arg, const dt_ckpt *ck, const char *dir, char *err,
                            size_t errlen);

/* --resume `arg` (resume_dir: a directory, a manager root, or "latest" of `root`): opens the
 * checkpoint, has check(check_arg) judge the example's own values, reads the step (before
 * --steps `steps`, or at it when `may_be_done`: a finished run, evaluated and written out
 * again; before --stop-after `stop_after` when not 0), the history and the data position
 * into *t, then loads t->zero and says so. Returns 0, or 1 (printed). Collective. */
int job_resume(job *j, const job_train *t, const char *arg, const char *root, int64_t steps,
               int may_be_done, int64_t stop_after, job_check_fn check, void *check_arg);

/* Saves t->zero with the values train/step, train/history, the example's own `values`
 * (nvalues <= JOB_MAX_VALUES) and the data position (train/data/...): as step *t->step under
 * `root` (keeping keep_last steps; dir gets the step's directory) when root is not NULL, else
 * into `dir` (JOB_PATH_MAX bytes). Returns 0, or 1 (printed). Collective. */
int job_save(job *j, const job_train *t, const dt_ckpt_value *values, int nvalues,
             const char *root, int64_t keep_last, char *dir);

/* job_save into the in-memory checkpoint `mc` (dt_memckpt_save, docs/recovery.md): step
 * *t->step in this host's memory, its copy on the buddy client under way. Returns 0, or 1
 * (printed). Collective. */
int job_save_memory(job *j, const job_train *t, const dt_ckpt_value *values, int nvalues,
                    dt_memckpt *mc);

/* Resumes from the newest step complete in the memory of mc's clients (dt_memckpt_find,
 * dt_memckpt_fetch, then job_resume of that directory) when it is at least as new as the disk
 * checkpoint --resume `disk_arg` names (NULL: none), and says so: "resumed from memory at
 * step S: ...". Returns 0 when resumed, 2 when the caller should resume from disk (memory has
 * no complete step, or an older one; said when disk_arg is set), 1 on failure (printed).
 * Collective. */
int job_resume_memory(job *j, const job_train *t, dt_memckpt *mc, const char *disk_arg,
                      const char *root, int64_t steps, int64_t stop_after, job_check_fn check,
                      void *check_arg);

#endif
