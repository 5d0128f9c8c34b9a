/* train/options: parses and checks train_mlp's options ("--name value" or "--name=value"). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "resume.h"

void options_usage(FILE *f, const char *prog)
{
    fprintf(
        f,
        "usage: %s [options]\n"
        "Trains a 64-H-10 MLP on the UCI handwritten digits over a device mesh: data parallel\n"
        "along `batch`, the hidden layer tensor parallel along `model`, a ZeRO optimizer.\n"
        "  --mesh FILE         YAML mesh file (default: examples/meshes/2x2.yaml)\n"
        "  --mesh-name NAME    mesh to use from the file (default: its first)\n"
        "  --device cpu|gpu    run the mesh on CPU or GPU devices, whatever the file's\n"
        "                      device_type (default: the file's; CPU in the shipped meshes);\n"
        "                      DT_GPU=sim simulates the GPUs where there are none\n"
        "  --data FILE         digits CSV, gzip or plain (default: examples/data/digits.csv.gz)\n"
        "  --steps N           optimizer steps (default 300)\n"
        "  --batch N           global batch, split over the batch dim (default 64)\n"
        "  --hidden N          hidden units, split over the model dim (default 128)\n"
        "  --lr X              learning rate (default 0.003 adam/adamw, 0.05 sgd)\n"
        "  --weight-decay X    (default 0.01 for adamw, else 0)\n"
        "  --clip X            clip the global gradient norm to X (default 0: off)\n"
        "  --stage 0|1|2       ZeRO stage (default 1)\n"
        "  --offload           keep the optimizer's state and update on the host (GPU meshes)\n"
        "  --optimizer adam|adamw|sgd   (default adam; sgd uses momentum 0.9)\n"
        "  --precision f32|bf16|f16     parameters' dtype; bf16/f16 keep f32 master weights,\n"
        "                      f16 uses dynamic loss scaling (default f32)\n"
        "  --out DIR           where curves.csv and curves.png go (default train_mlp_out)\n"
        "  --ckpt-dir DIR      checkpoint directory (default OUT/checkpoint)\n"
        "  --ckpt-every K      also save every K steps (default 100; 0: only at the end)\n"
        "  --ckpt-root ROOT    save steps as ROOT/step-N through the checkpoint manager\n"
        "                      (ROOT/latest names the newest; instead of --ckpt-dir)\n"
        "  --keep-last N       with --ckpt-root: keep the newest N steps (default 3)\n"
        "  --resume DIR|latest continue from the checkpoint in DIR (a manager root: its\n"
        "                      newest complete step), or from --ckpt-root's newest\n"
        "  --stop-after K      save a checkpoint at step K and stop (to test resuming)\n"
        "  --seed N            initialisation and data order (default 1)\n"
        "  --eval-every N      held-out evaluation and a progress line every N steps (default 25)\n"
        "  --quiet             print only the final `result` line\n"
        "  --help              this text\n"
        "Runs alone (DT_CPU_DEVICES, or DT_GPU_DEVICES with --device gpu, defaults to the\n"
        "mesh's size) or under mpirun.\n",
        prog);
}

const char *precision_name(precision p)
{
    return p == PRECISION_BF16 ? "bf16" : p == PRECISION_F16 ? "f16" : "f32";
}

const char *optimizer_name(dt_optim_kind k)
{
    return k == DT_OPTIM_SGD ? "sgd" : k == DT_OPTIM_ADAMW ? "adamw" : "adam";
}

static int parse_i64(const char *opt, const char *v, int64_t lo, int64_t hi, int64_t *out,
                     char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi) {
        snprintf(err, errlen, "%s: '%s' is not an integer in %lld..%lld", opt, v, (long long)lo,
                 (long long)hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_f64(const char *opt, const char *v, double lo, double hi, double *out, char *err,
                     size_t errlen)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x) || x < lo || x > hi) {
        snprintf(err, errlen, "%s: '%s' is not a number in %g..%g", opt, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* Options that take a value. */
static const char *const valued[] = {
    "--mesh",      "--mesh-name",  "--data",         "--steps",      "--batch",
    "--hidden",    "--lr",         "--weight-decay", "--clip",       "--stage",
    "--optimizer", "--precision",  "--out",          "--ckpt-dir",   "--ckpt-every",
    "--resume",    "--stop-after", "--seed",         "--eval-every", "--device",
    "--ckpt-root", "--keep-last",
};

int options_parse(int argc, char **argv, const char *default_mesh, const char *default_data,
                  train_opts *o, char *err, size_t errlen)
{
    *o = (train_opts){
        .mesh_file = default_mesh,
        .device = -1,
        .data_file = default_data,
        .steps = 300,
        .batch = 64,
        .hidden = 128,
        .lr = -1,
        .weight_decay = -1,
        .stage = 1,
        .optimizer = DT_OPTIM_ADAM,
        .precision = PRECISION_F32,
        .out_dir = "train_mlp_out",
        .ckpt_every = 100,
        .keep_last = 3,
        .seed = 1,
        .eval_every = 25,
    };
    static char keybuf[64];
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            o->help = 1;
            return 0;
        }
        if (strcmp(arg, "--quiet") == 0 || strcmp(arg, "-q") == 0) {
            o->quiet = 1;
            continue;
        }
        if (strcmp(arg, "--offload") == 0) {
            o->offload = 1;
            continue;
        }
        const char *eq = strchr(arg, '=');
        const char *key = arg;
        if (strncmp(arg, "--", 2) == 0 && eq) {
            size_t kl = (size_t)(eq - arg);
            if (kl >= sizeof keybuf) {
                snprintf(err, errlen, "unknown option '%.40s...'", arg);
                return -1;
            }
            memcpy(keybuf, arg, kl);
            keybuf[kl] = '\0';
            key = keybuf;
            val = eq + 1;
        }
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known |= strcmp(key, valued[k]) == 0;
        if (!known) {
            snprintf(err, errlen, "unknown %s '%s' (see --help)",
                     arg[0] == '-' ? "option" : "argument", arg);
            return -1;
        }
        if (!val) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "%s needs a value", key);
                return -1;
            }
            val = argv[++i];
        }
        int64_t iv = 0;
        int rc = 0;
        if (!*val) {
            snprintf(err, errlen, "%s: empty value", key);
            return -1;
        }
        if (strcmp(key, "--mesh") == 0)
            o->mesh_file = val;
        else if (strcmp(key, "--mesh-name") == 0)
            o->mesh_name = val;
        else if (strcmp(key, "--device") == 0) {
            if (strcmp(val, "cpu") == 0)
                o->device = DT_DEVICE_CPU;
            else if (strcmp(val, "gpu") == 0)
                o->device = DT_DEVICE_GPU;
            else {
                snprintf(err, errlen, "--device: '%s' is not cpu or gpu", val);
                rc = -1;
            }
        } else if (strcmp(key, "--data") == 0)
            o->data_file = val;
        else if (strcmp(key, "--steps") == 0)
            rc = parse_i64(key, val, 1, 200000, &o->steps, err, errlen);
        else if (strcmp(key, "--batch") == 0)
            rc = parse_i64(key, val, 1, 1000000, &o->batch, err, errlen);
        else if (strcmp(key, "--hidden") == 0)
            rc = parse_i64(key, val, 1, 65536, &o->hidden, err, errlen);
        else if (strcmp(key, "--lr") == 0)
            rc = parse_f64(key, val, 0, 100, &o->lr, err, errlen);
        else if (strcmp(key, "--weight-decay") == 0)
            rc = parse_f64(key, val, 0, 10, &o->weight_decay, err, errlen);
        else if (strcmp(key, "--clip") == 0)
            rc = parse_f64(key, val, 0, 1e30, &o->clip, err, errlen);
        else if (strcmp(key, "--stage") == 0) {
            rc = parse_i64(key, val, 0, 2, &iv, err, errlen);
            o->stage = (int)iv;
        } else if (strcmp(key, "--optimizer") == 0) {
            if (strcmp(val, "adam") == 0)
                o->optimizer = DT_OPTIM_ADAM;
            else if (strcmp(val, "adamw") == 0)
                o->optimizer = DT_OPTIM_ADAMW;
            else if (strcmp(val, "sgd") == 0)
                o->optimizer = DT_OPTIM_SGD;
            else {
                snprintf(err, errlen, "--optimizer: '%s' is not adam, adamw or sgd", val);
                rc = -1;
            }
        } else if (strcmp(key, "--precision") == 0) {
            if (strcmp(val, "f32") == 0)
                o->precision = PRECISION_F32;
            else if (strcmp(val, "bf16") == 0)
                o->precision = PRECISION_BF16;
            else if (strcmp(val, "f16") == 0)
                o->precision = PRECISION_F16;
            else {
                snprintf(err, errlen, "--precision: '%s' is not f32, bf16 or f16", val);
                rc = -1;
            }
        } else if (strcmp(key, "--out") == 0)
            o->out_dir = val;
        else if (strcmp(key, "--ckpt-dir") == 0)
            o->ckpt_dir = val;
        else if (strcmp(key, "--ckpt-every") == 0)
            rc = parse_i64(key, val, 0, 1000000, &o->ckpt_every, err, errlen);
        else if (strcmp(key, "--ckpt-root") == 0)
            o->ckpt_root = val;
        else if (strcmp(key, "--keep-last") == 0)
            rc = parse_i64(key, val, 1, 1000000, &o->keep_last, err, errlen);
        else if (strcmp(key, "--resume") == 0)
            o->resume = val;
        else if (strcmp(key, "--stop-after") == 0)
            rc = parse_i64(key, val, 1, 1000000, &o->stop_after, err, errlen);
        else if (strcmp(key, "--seed") == 0) {
            rc = parse_i64(key, val, 0, INT64_MAX, &iv, err, errlen);
            o->seed = (uint64_t)iv;
        } else if (strcmp(key, "--eval-every") == 0)
            rc = parse_i64(key, val, 1, 1000000, &o->eval_every, err, errlen);
        if (rc != 0)
            return -1;
    }
    if (o->stop_after > o->steps) {
        snprintf(err, errlen, "--stop-after %lld is beyond --steps %lld", (long long)o->stop_after,
                 (long long)o->steps);
        return -1;
    }
    if (ckpt_place_check(o->ckpt_dir, o->ckpt_root, o->resume, err, errlen) != 0)
        return -1;
    if (o->lr < 0)
        o->lr = o->optimizer == DT_OPTIM_SGD ? 0.05 : 0.003;
    if (o->weight_decay < 0)
        o->weight_decay = o->optimizer == DT_OPTIM_ADAMW ? 0.01 : 0.0;
    return 0;
}
