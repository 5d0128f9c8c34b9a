/* llama/gen: text from an HF model directory on a mesh, the whole of a generation run:
 * options, prompts tokenised (BOS for Llama), a batched prefill, then incremental decoding
 * against the key/value cache with the sampler, and client 0 printing each row. Shared by
 * examples/generate.c and `dtensor generate` (tools/cmd_generate.c), which differ only in
 * how they start the runtime and find the mesh (docs/generate.md). */
#ifndef LLAMA_GEN_H
#define LLAMA_GEN_H

#include <stdint.h>
#include <stdio.h>

#include <dtensor/dtensor.h>

#define GEN_MAX_ROWS 64

typedef struct gen_opts {
    const char *model, *mesh, *logits_out; /* mesh NULL: the caller's default */
    const char *prompt[GEN_MAX_ROWS];
    const char *ids[GEN_MAX_ROWS];
    int nprompt, nids;
    int64_t tokens, top_k;
    double temperature, top_p;
    uint64_t seed;
    int ignore_eos, print_ids, quiet, no_bos;
} gen_opts;

/* The options' help text (each line indented by two spaces; --mesh's default `mesh_default`). */
void gen_usage(FILE *f, const char *mesh_default);

/* Parses argv[first..argc) into *o (defaults: 32 tokens, greedy, top-p 1, seed 1);
 * `--max-tokens` is `--tokens`. Returns 0, 2 for --help, or 1 with a message on stderr
 * starting "prog: ". Local. */
int gen_parse(int argc, char **argv, int first, const char *prog, gen_opts *o);

/* A failed step `what` with its status and message; the caller prints it as it prints
 * failures. */
typedef void (*gen_fail_fn)(void *arg, const char *what, dt_status st, const char *msg);

/* Runs o on `mesh` (a `batch` dim, optionally `model`; the runtime started with its devices):
 * loads the model and the tokenizer, prefills, decodes; client `me` 0 writes each row's text
 * (and the timings unless o->quiet) to `out`. Returns 0, or 1 after fail(arg, ...). Collective. */
int gen_run(const dt_mesh *mesh, int me, const gen_opts *o, FILE *out, gen_fail_fn fail, void *arg);

#endif
