/* train/options: train_mlp's command line. */
#ifndef TRAIN_OPTIONS_H
#define TRAIN_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include <dtensor/dtensor.h>

typedef enum precision {
    PRECISION_F32 = 0,
    PRECISION_BF16 = 1,
    PRECISION_F16 = 2,
} precision;

typedef struct train_opts {
    const char *mesh_file;
    const char *mesh_name; /* NULL: the file's only (or first) mesh */
    int device;            /* DT_DEVICE_CPU / DT_DEVICE_GPU (--device), -1: the mesh file's */
    const char *data_file;
    int64_t steps;
    int64_t batch; /* global batch */
    int64_t hidden;
    double lr;           /* < 0: the optimizer's default below */
    double weight_decay; /* < 0: 0.01 for adamw, 0 otherwise */
    double clip;         /* global-norm clipping, 0: off */
    int stage;
    int offload;          /* --offload: the optimizer's state and update on the host */
    dt_optim_kind optimizer;
    precision precision;
    const char *out_dir;
    const char *ckpt_dir; /* NULL: <out>/checkpoint */
    int64_t ckpt_every;   /* 0: only at the end */
    const char *ckpt_root; /* not NULL: manager steps under it (instead of ckpt_dir) */
    int64_t keep_last;     /* with ckpt_root: the newest steps kept */
    const char *resume;    /* a directory, a manager root, or "latest" (of ckpt_root) */
    int64_t stop_after; /* 0: run to the end */
    uint64_t seed;
    int64_t eval_every;
    int quiet;
    int help;
} train_opts;

/* Parses argv into *o (defaults first; `default_mesh` and `default_data` are the paths used
 * when --mesh / --data are not given). Returns 0, or -1 with a one-line message in err
 * (a usage error: exit status 2). */
int options_parse(int argc, char **argv, const char *default_mesh, const char *default_data,
                  train_opts *o, char *err, size_t errlen);

/* Writes the usage text. */
void options_usage(FILE *f, const char *prog);

const char *precision_name(precision p);
const char *optimizer_name(dt_optim_kind k);

#endif
