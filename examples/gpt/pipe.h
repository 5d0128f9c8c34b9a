/* gpt/pipe: the GPT trained through a pipeline (dtensor/pipeline.h): its blocks cut into
 * stages over the mesh's `pipe` dim, M micro-batches per step on a schedule, each stage's
 * parameters on its stage mesh under a ZeRO optimizer over `batch`, clipping and the
 * overflow check agreed across the stages (dt_zero_opts.combine). docs/pipeline.md. */
#ifndef GPT_PIPE_H
#define GPT_PIPE_H

#include <dtensor/dtensor.h>
#include <dtensor/pipeline.h>

#include "model.h"

typedef struct gpt_pipe gpt_pipe;

typedef struct gpt_pipe_opts {
    dt_pipe_schedule_kind schedule;
    int micro;    /* micro-batches per step (divides the rows of a batch) */
    int chunks;   /* virtual stages per stage (interleaved: 2; else 1) */
    dt_zero_opts zero;      /* the optimizer of every stage (combine is set here) */
    dt_optim_hparams hp;    /* the decayed parameters'; the norms get no decay */
} gpt_pipe_opts;

/* The model on `mesh`: with a `pipe` dim of size P, stage s holds the virtual stages
 * c * P + s (c < chunks), each a contiguous range of blocks (the embeddings with the first,
 * the final norm, head and loss with the last); without one, the whole model on the mesh
 * (micro-batches accumulated in order: the reference run). Every process must hold the
 * devices of one stage only. Collective. */
dt_status gpt_pipe_create(const dt_mesh *mesh, const gpt_config *cfg, dt_dtype dtype,
                          uint64_t seed, const gpt_pipe_opts *opts, gpt_pipe **out);
void gpt_pipe_destroy(gpt_pipe *gp);

/* One training step over a host batch (x, y: [rows, context] int32, the same on every
 * client; y = -1 ignored): the schedule's forwards and backwards over the micro-batches, the
 * gradients accumulated in micro order, then every stage's dt_zero_step at learning rate lr.
 * *loss_out the batch's mean loss per counted target (every client), *info_out this
 * client's stage's step info (may be NULL). Collective. */
dt_status gpt_pipe_step(gpt_pipe *gp, int64_t rows, const int32_t *x, const int32_t *y,
                        float lr, double *loss_out, dt_zero_step_info *info_out);

/* The model's forward pass over host rows (x, y as gpt_pipe_step's; y may be NULL) without
 * gradients, the stages one after the other: *loss_out (may be NULL) the mean cross-entropy
 * per counted target (`targets`), logits (may be NULL) the logits [rows, context, vocab], on
 * every client, the values of the unpipelined model's gpt_loss and gpt_logits. Collective. */
dt_status gpt_pipe_eval(gpt_pipe *gp, int64_t rows, const int32_t *x, const int32_t *y,
                        int64_t targets, double *loss_out, float *logits);
/* Parameter `name` (a model name, "block1/attn/q") gathered to host f32 `out` (its global
 * shape's elements) on every client of the stage holding it: returns 1 when this client
 * holds it, 0 when not, -1 on an error. Collective over that stage's clients. */
int gpt_pipe_param(gpt_pipe *gp, const char *name, float *out, int64_t count);

/* The stages, the stage this client holds, its parameter count, the pipe (NULL without). */
int gpt_pipe_stages(const gpt_pipe *gp);
int gpt_pipe_my_stage(const gpt_pipe *gp);
int64_t gpt_pipe_param_count(const gpt_pipe *gp);
dt_pipe *gpt_pipe_pipe(const gpt_pipe *gp);
/* This client's stage's optimizer; the mesh a checkpoint is saved from with
 * dt_zero_save_joint (the whole mesh; NULL without a pipe: dt_zero_save's own). */
dt_zero *gpt_pipe_zero(const gpt_pipe *gp);
const dt_mesh *gpt_pipe_save_mesh(const gpt_pipe *gp);
/* The model's parameter slots (all stages') and their names; this client's stage mesh. */
int gpt_pipe_num_slots(const gpt_pipe *gp);
const char *gpt_pipe_slot_name(const gpt_pipe *gp, int slot);
const dt_mesh *gpt_pipe_stage_mesh(const gpt_pipe *gp);

#endif
