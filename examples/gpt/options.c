/* gpt/options: train_gpt's options, one table of names, kinds, ranges and fields. */
#include "options.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../train/resume.h"

typedef enum { STR, I64, F64 } kind;

typedef struct spec {
    const char *name;
    kind k;
    double lo, hi;
    size_t off;
} spec;

#define S(n, f) {n, STR, 0, 0, offsetof(gpt_opts, f)}
#define I(n, f, lo, hi) {n, I64, lo, hi, offsetof(gpt_opts, f)}
#define F(n, f, lo, hi) {n, F64, lo, hi, offsetof(gpt_opts, f)}
static const spec specs[] = {
    S("--mesh", mesh_file), S("--mesh-name", mesh_name), S("--data", data_file),
    S("--precision", precision), S("--out", out_dir), S("--ckpt-dir", ckpt_dir),
    S("--resume", resume), S("--ckpt-root", ckpt_root), I("--keep-last", keep_last, 1, 1e6),
    I("--steps", steps, 1, 1e6), I("--batch", batch, 1, 1e6),
    I("--layers", layers, 1, 16), I("--width", width, 1, 4096), I("--heads", heads, 1, 256),
    I("--warmup", warmup, 0, 1e6), I("--stage", stage, 0, 3), I("--ckpt-every", ckpt_every, 0, 1e6),
    I("--stop-after", stop_after, 0, 1e6), I("--seed", seed, 0, 1e15),
    I("--eval-every", eval_every, 1, 1e6), I("--samples", samples, 0, 1000),
    F("--lr", lr, 0, 10), F("--min-lr", min_lr, 0, 10), F("--weight-decay", weight_decay, 0, 10),
    F("--clip", clip, 0, 1e30), S("--arch", arch), I("--kv-heads", kv_heads, 0, 256),
    F("--dropout", dropout, 0, 0.95), I("--context", context, 0, 65536),
    I("--pipe", pipe, 0, 64), I("--microbatches", microbatches, 1, 1024),
    S("--schedule", schedule), I("--cp", cp, 0, 4096),
};

void gpt_options_usage(FILE *f)
{
    fputs("usage: train_gpt [options]\n"
          "Trains a character-level GPT on first names over a device mesh: data parallel\n"
          "along `batch` (ZeRO, AdamW, warm-up then cosine learning rate), attention heads, MLP\n"
          "and vocabulary tensor parallel along `model`.\n"
          "  --mesh FILE         YAML mesh file (default: examples/meshes/2x2.yaml)\n"
          "  --mesh-name NAME    mesh to use from the file (default: its first)\n"
          "  --data FILE         one name per line (default: examples/data/names.txt)\n"
          "  --steps N           optimizer steps (default 2000)\n"
          "  --batch N           names per global batch (default 64)\n"
          "  --layers N --width N --heads N   model size (default 2, 64, 4)\n"
          "  --lr X --min-lr X   peak and final learning rate (default 0.004, 0.0002)\n"
          "  --warmup N          linear warm-up steps (default 100), then cosine decay\n"
          "  --weight-decay X    AdamW decay of the weight matrices (default 0.1)\n"
          "  --clip X            clip the global gradient norm (default 1; 0: off)\n"
          "  --stage 0|1|2|3     ZeRO stage (default 1; 3: parameters sharded too)\n"
          "  --precision f32|bf16|f16   parameters' dtype (f16: dynamic loss scaling)\n"
          "  --out DIR           curves.csv and curves.png (default train_gpt_out)\n"
          "  --ckpt-dir DIR      checkpoint directory (default OUT/checkpoint)\n"
          "  --ckpt-every K      also save every K steps (default 0: only at the end)\n"
          "  --ckpt-root ROOT    save steps as ROOT/step-N through the checkpoint manager\n"
          "                      (ROOT/latest names the newest; instead of --ckpt-dir)\n"
          "  --keep-last N       with --ckpt-root: keep the newest N steps (default 3)\n"
          "  --resume DIR|latest continue from the checkpoint in DIR (a manager root: its\n"
          "                      newest complete step), or from --ckpt-root's newest\n"
          "  --stop-after K      save a checkpoint at step K and stop\n"
          "  --seed N            initialisation, split and data order (default 1)\n"
          "  --eval-every N      held-out loss and a progress line every N steps (default 100)\n"
          "  --samples N         names sampled at the end (default 10)\n"
          "  --arch gpt|llama    the model (default gpt; llama: RMS norms, rotary positions,\n"
          "                      SwiGLU MLP, grouped-query attention)\n"
          "  --kv-heads N        llama: key/value heads (default heads / 2)\n"
          "  --dropout P         dropout in training (default 0) of the residual branches\n"
          "                      and the attention probabilities, the same mask on every\n"
          "                      mesh (Philox keyed by the global element index)\n"
          "  --context T         T tokens per row: the names packed one after another\n"
          "                      (default 0: one name per row, context 16)\n"
          "  --checkpoint-blocks recompute each block's activations in the backward pass\n"
          "                      (activation checkpointing; the same results)\n"
          "  --pipe P            pipeline parallel over the mesh's `pipe` dim of size P (one\n"
          "                      stage per process; --pipe 1 without a pipe dim: micro-batches\n"
          "                      accumulated, the reference); docs/pipeline.md\n"
          "  --microbatches M    micro-batches per step with --pipe (default 1)\n"
          "  --schedule S        gpipe, 1f1b (default) or interleaved (2 chunks per stage)\n"
          "  --sequence-parallel outside the tensor-parallel matmuls the activations are\n"
          "                      sharded along the sequence over `model` (docs/attention.md)\n"
          "  --cp K              context parallel over the mesh's `seq` dim, which must have\n"
          "                      size K (the mesh decides; this checks it)\n"
          "  --quiet             print only the final `result` line\n",
          f);
}

int gpt_options_parse(int argc, char **argv, const char *default_mesh, const char *default_data,
                      gpt_opts *o, char *err, size_t errlen)
{
    *o = (gpt_opts){.mesh_file = default_mesh, .data_file = default_data, .precision = "f32",
                    .steps = 2000, .batch = 64, .layers = 2, .width = 64, .heads = 4,
                    .warmup = 100, .stage = 1, .seed = 1, .eval_every = 100, .samples = 10,
                    .lr = 0.004, .min_lr = 0.0002, .weight_decay = 0.1, .clip = 1.0,
                    .keep_last = 3, .out_dir = "train_gpt_out",
                    .arch = "gpt", .microbatches = 1, .schedule = "1f1b"};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            o->help = 1;
            return 0;
        }
        if (strcmp(arg, "--quiet") == 0) {
            o->quiet = 1;
            continue;
        }
        if (strcmp(arg, "--checkpoint-blocks") == 0) {
            o->checkpoint_blocks = 1;
            continue;
        }
        if (strcmp(arg, "--sequence-parallel") == 0) {
            o->sequence_parallel = 1;
            continue;
        }
        size_t kl = strcspn(arg, "=");
        const spec *sp = NULL;
        for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++)
            if (strlen(specs[k].name) == kl && strncmp(arg, specs[k].name, kl) == 0)
                sp = &specs[k];
        if (!sp) {
            snprintf(err, errlen, "unknown option '%s' (see --help)", arg);
            return -1;
        }
        if (arg[kl] == '=')
            val = arg + kl + 1;
        else if (i + 1 < argc)
            val = argv[++i];
        if (!val || !*val) {
            snprintf(err, errlen, "%s needs a value", sp->name);
            return -1;
        }
        char *end = NULL, *field = (char *)o + sp->off;
        errno = 0;
        if (sp->k == STR) {
            *(const char **)(void *)field = val;
            continue;
        }
        double x = sp->k == I64 ? (double)strtoll(val, &end, 10) : strtod(val, &end);
        if (end == val || *end || errno || !isfinite(x) || x < sp->lo || x > sp->hi) {
            snprintf(err, errlen, "%s: '%s' is not a%s in %g..%g", sp->name, val,
                     sp->k == I64 ? "n integer" : " number", sp->lo, sp->hi);
            return -1;
        }
        if (sp->k == I64)
            *(int64_t *)(void *)field = (int64_t)x;
        else
            *(double *)(void *)field = x;
    }
    if (strcmp(o->precision, "f32") && strcmp(o->precision, "bf16") && strcmp(o->precision, "f16")) {
        snprintf(err, errlen, "--precision: '%s' is not f32, bf16 or f16", o->precision);
        return -1;
    }
    if (strcmp(o->arch, "gpt") && strcmp(o->arch, "llama")) {
        snprintf(err, errlen, "--arch: '%s' is not gpt or llama", o->arch);
        return -1;
    }
    if (strcmp(o->schedule, "gpipe") && strcmp(o->schedule, "1f1b") &&
        strcmp(o->schedule, "interleaved")) {
        snprintf(err, errlen, "--schedule: '%s' is not gpipe, 1f1b or interleaved", o->schedule);
        return -1;
    }
    if (!o->pipe && o->microbatches != 1) {
        snprintf(err, errlen, "--microbatches needs --pipe (--pipe 1: without pipelining)");
        return -1;
    }
    if (ckpt_place_check(o->ckpt_dir, o->ckpt_root, o->resume, err, errlen) != 0)
        return -1;
    if (o->width % o->heads != 0) {
        snprintf(err, errlen, "--heads %lld must divide --width %lld", (long long)o->heads,
                 (long long)o->width);
        return -1;
    }
    return 0;
}
