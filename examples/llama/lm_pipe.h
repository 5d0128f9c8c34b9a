/* llama/lm_pipe: a Llama-family model trained with pipeline parallelism (docs/generate.md,
 * "Pipeline parallelism"): the mesh's `pipe` dim cuts the blocks into consecutive stages
 * (stage s: blocks [s L / P, (s+1) L / P), the embeddings with the first, the final norm and
 * the head with the last), each micro-batch's pass of a stage recorded on its own tape and
 * run by the pipeline executor (dt_pipe_run: GPipe or 1F1B), the gradients summed over the
 * micro-batches in micro order, each stage's parameters updated by its own ZeRO optimizer
 * (stages 0-2) with the global gradient norm combined over the stages. Tied embeddings: the
 * first stage owns them; the last stage's head gradient is added to it there, and the
 * updated table is sent back to the last stage after each step. Each stage loads the model
 * on its stage mesh as without pipeline, then keeps only its own parameters (and the last
 * stage the tied table). */
#ifndef LLAMA_LM_PIPE_H
#define LLAMA_LM_PIPE_H

#include <stdint.h>

#include <dtensor/dtensor.h>
#include <dtensor/pipeline.h>

#include "lm.h"

typedef struct lm_pipe lm_pipe;

typedef struct lm_pipe_opts {
    int micro;                  /* micro-batches per step (dividing rows) */
    dt_pipe_schedule_kind kind; /* DT_PIPE_GPIPE or DT_PIPE_1F1B */
    int64_t rows, T;            /* the batch */
    int zero_stage;             /* 0-2 */
    double clip;                /* global gradient norm clipping (0: none) */
    dt_optim_hparams hp;        /* the decayed group's (the others: no weight decay) */
} lm_pipe_opts;

/* The model m (on `pipe`'s stage mesh of this client) set up for training on `pipe`: its
 * stage's parameters in a new optimizer. DT_ERR_INVALID_ARGUMENT naming what is not
 * supported (GPT-2, a client holding several stages, micro not dividing rows, more stages than
 * blocks). Collective over the pipe's clients. */
dt_status lm_pipe_create(dt_pipe *pipe, lm *m, const lm_pipe_opts *o, lm_pipe **out);
void lm_pipe_destroy(lm_pipe *lp);

/* One training step on the batch x, y [rows, T] (host ids, the same on every client): *loss
 * the batch's mean loss (on every client), *info the optimizer's. Collective. */
dt_status lm_pipe_step(lm_pipe *lp, const int32_t *x, const int32_t *y, double *loss,
                       dt_zero_step_info *info);

#endif
