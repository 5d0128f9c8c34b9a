/* train/resume: the examples' checkpoint place, --resume's directory, and the save. */
#include "resume.h"

#include <stdio.h>
#include <string.h>

int ckpt_place_check(const char *ckpt_dir, const char *ckpt_root, const char *resume, char *err,
                     size_t errlen)
{
    if (ckpt_dir && ckpt_root) {
        snprintf(err, errlen, "--ckpt-dir and --ckpt-root exclude each other");
        return -1;
    }
    if (resume && strcmp(resume, "latest") == 0 && !ckpt_root) {
        snprintf(err, errlen, "--resume latest needs --ckpt-root");
        return -1;
    }
    return 0;
}

int resume_dir(const char *arg, const char *root, char *dir, size_t len, char *err,
               size_t errlen)
{
    int latest = strcmp(arg, "latest") == 0;
    dt_status st = dt_ckpt_latest(latest ? root : arg, NULL, dir, len);
    if (st == DT_OK)
        return 0;
    if (latest || st != DT_ERR_NOT_FOUND) {
        snprintf(err, errlen, "--resume %s: %s", arg, dt_last_error());
        return -1;
    }
    /* No manager steps in it: a checkpoint directory (dt_ckpt_open then judges it). */
    if ((size_t)snprintf(dir, len, "%s", arg) >= len) {
        snprintf(err, errlen, "--resume: path too long");
        return -1;
    }
    return 0;
}

int resume_note(const char *arg, const char *root, char *note, size_t len)
{
    dt_ckpt_latest_info info;
    const char *r = strcmp(arg, "latest") == 0 ? root : arg;
    if (!r || dt_ckpt_find_latest(r, &info, NULL, 0) != DT_OK || info.skipped == 0)
        return 0;
    snprintf(note, len, "--resume %s: passed over damaged step %lld (%s)%s; resuming from step "
             "%lld (a save at or above it sets the damaged step aside as step-N.damaged)",
             arg, (long long)info.skipped_step, info.skipped_reason,
             info.skipped > 1 ? " and older damaged ones" : "", (long long)info.step);
    return 1;
}

dt_status save_train_state(dt_zero *zero, const dt_mesh *joint, const char *root,
                           int64_t keep_last, int64_t step, char *dir, size_t len,
                           const dt_save_opts *opts)
{
    if (!root)
        return joint ? dt_zero_save_joint(zero, joint, dir, opts)
                     : dt_zero_save(zero, dir, 0, NULL, NULL, opts);
    dt_ckpt_keep keep = {(int)keep_last, 0};
    dt_status st = dt_ckpt_step_dir(root, step, dir, len);
    if (st != DT_OK)
        return st;
    return joint ? dt_zero_save_joint_step(zero, joint, root, step, &keep, opts)
                 : dt_zero_save_step(zero, root, step, &keep, 0, NULL, NULL, opts);
}
