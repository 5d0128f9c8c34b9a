/* train/resume: where the training examples save (a checkpoint directory, or steps under a
 * checkpoint manager's root) and which checkpoint --resume names (docs/examples.md,
 * "Checkpoint manager"). Shared by train_mlp and train_gpt. */
#ifndef TRAIN_RESUME_H
#define TRAIN_RESUME_H

#include <stddef.h>
#include <stdint.h>

#include <dtensor/dtensor.h>

/* The options' rules: --ckpt-dir and --ckpt-root exclude each other, and --resume latest
 * needs --ckpt-root. 0, or -1 with a one-line message in err (a usage error). */
int ckpt_place_check(const char *ckpt_dir, const char *ckpt_root, const char *resume, char *err,
                     size_t errlen);

/* The checkpoint directory --resume `arg` names: "latest" is the newest complete step under
 * `root` (dt_ckpt_latest: the pointer's step, or the newest complete one when the pointer's
 * is damaged); a directory holding manager steps is its newest complete step; any other
 * directory is itself. Local (every client reads the same shared files). 0 with the
 * directory in dir, or -1 with a message in err. */
int resume_dir(const char *arg, const char *root, char *dir, size_t len, char *err,
               size_t errlen);

/* When --resume `arg` (as resume_dir takes it) passed over damaged manager steps: 1 and a
 * one-line note in `note` saying which and why (for the user), else 0. Local. */
int resume_note(const char *arg, const char *root, char *note, size_t len);

/* Saves the optimizer (and its parameters) with opts: as step `step` under `root` keeping
 * the newest keep_last steps when root is not NULL (dir then gets the step's directory),
 * else into `dir`; from `joint` together with the other stages' optimizers when it is not
 * NULL (dt_zero_save_joint). Collective; dt_zero_save(_step)'s or _joint(_step)'s status. */
dt_status save_train_state(dt_zero *zero, const dt_mesh *joint, const char *root,
                           int64_t keep_last, int64_t step, char *dir, size_t len,
                           const dt_save_opts *opts);

#endif
