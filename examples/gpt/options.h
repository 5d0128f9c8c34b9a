/* gpt/options: train_gpt's command line. */
#ifndef GPT_OPTIONS_H
#define GPT_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct gpt_opts {
    const char *mesh_file, *mesh_name, *data_file, *precision; /* f32, bf16, f16 */
    int64_t steps, batch, layers, width, heads, warmup, stage, ckpt_every, stop_after, seed;
    int64_t eval_every, samples, keep_last; /* keep_last: with ckpt_root, the steps kept */
    double lr, min_lr, weight_decay, clip;
    const char *out_dir, *ckpt_dir, *resume; /* resume: a directory, a root or "latest" */
    const char *ckpt_root;                    /* not NULL: manager steps (not ckpt_dir) */
    int quiet, help;
    int checkpoint_blocks;                  /* gpt_set_backward */
    const char *arch;                       /* gpt or llama */
    int64_t kv_heads;                       /* llama: 0 for heads / 2 */
    double dropout;                         /* --dropout: residual and attention dropout */
    int64_t context;                        /* --context: 0 one name per row, else packed */
    int64_t pipe, microbatches;             /* --pipe P (0: off) --microbatches M */
    const char *schedule;                   /* --schedule gpipe|1f1b|interleaved */
    int sequence_parallel;                  /* --sequence-parallel: activations over model */
    int64_t cp;                             /* --cp K: the mesh's seq dim must be K (0: off) */
} gpt_opts;

/* Parses argv ("--name value" or "--name=value") into *o, defaults first. Returns 0, or -1
 * with a one-line message in err (a usage error: exit status 2). */
int gpt_options_parse(int argc, char **argv, const char *default_mesh, const char *default_data,
                      gpt_opts *o, char *err, size_t errlen);
void gpt_options_usage(FILE *f);

#endif
