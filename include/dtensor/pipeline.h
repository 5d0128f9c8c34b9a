/* libdtensor pipeline parallelism: micro-batch schedules (GPipe, 1F1B, interleaved 1F1B) as
 * printable tables of steps, stage meshes along a pipeline mesh dimension, point-to-point
 * transfers of dt_tensors between stages, and an executor that runs a schedule through
 * per-stage callbacks (docs/pipeline.md). */
#ifndef DTENSOR_PIPELINE_H
#define DTENSOR_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/ckpt.h"
#include "dtensor/dtype.h"
#include "dtensor/export.h"
#include "dtensor/layout.h"
#include "dtensor/mesh.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================================
 * Schedules. P stages (devices of the pipeline dim), M micro-batches, V virtual stages
 * (model chunks) per stage: stage s runs chunks c = 0..V-1, virtual stage c*P + s, so the
 * model's layers are cut into V*P consecutive pieces (V = 1 except for interleaved).
 * A step is one forward (F) or backward (B) of one micro-batch on one virtual stage. Its
 * dependencies: F(v, m) after F(v-1, m); B(v, m) after F(v, m) and B(v+1, m).
 * Each stage runs its own list of steps in order; the schedule also gives every step a start
 * slot on a timeline where every step takes one unit and starts as soon as its stage is free
 * and its dependencies are done, and one global order of all steps (by slot, then stage)
 * that respects the dependencies: the order the executor runs them in.
 * ====================================================================================== */

typedef enum dt_pipe_schedule_kind {
    DT_PIPE_GPIPE = 0,       /* all forwards, then all backwards (micro order) */
    DT_PIPE_1F1B = 1,        /* P-s-1 warm-up forwards, then one forward one backward */
    DT_PIPE_INTERLEAVED = 2, /* 1F1B over V chunks per stage (Megatron; M % P == 0) */
} dt_pipe_schedule_kind;

typedef enum dt_pipe_phase { DT_PIPE_F = 0, DT_PIPE_B = 1 } dt_pipe_phase;

typedef struct dt_pipe_step {
    int stage;     /* 0..P-1 */
    int micro;     /* 0..M-1 */
    int phase;     /* DT_PIPE_F or DT_PIPE_B */
    int chunk;     /* 0..V-1; the virtual stage is chunk * P + stage */
    int64_t slot;  /* start on the unit-time timeline (0-based) */
} dt_pipe_step;

typedef struct dt_pipe_schedule dt_pipe_schedule;

/* The name of a kind ("gpipe", "1f1b", "interleaved"), "unknown" for others; and the reverse
 * (DT_ERR_INVALID_ARGUMENT naming the text and the choices). Local. */
DT_API const char *dt_pipe_schedule_kind_name(dt_pipe_schedule_kind kind);
DT_API dt_status dt_pipe_schedule_kind_parse(const char *text, dt_pipe_schedule_kind *kind_out);

/* Builds the schedule of `kind` for `stages` >= 1, `micro` >= 1 micro-batches and `chunks`
 * virtual stages per stage (1 for GPipe and 1F1B; >= 1 for interleaved, where micro must be
 * a multiple of stages when chunks > 1). Owned handle (dt_pipe_schedule_destroy).
 * DT_ERR_INVALID_ARGUMENT names the bad count; DT_ERR_NO_MEMORY. Local. */
DT_API dt_status dt_pipe_schedule_create(dt_pipe_schedule_kind kind, int stages, int micro,
                                         int chunks, dt_pipe_schedule **sched_out);
/* Frees it; NULL is ignored. */
DT_API void dt_pipe_schedule_destroy(dt_pipe_schedule *sched);

/* Queries (never fail on a valid handle). Local. */
DT_API dt_pipe_schedule_kind dt_pipe_schedule_kind_of(const dt_pipe_schedule *sched);
DT_API int dt_pipe_schedule_stages(const dt_pipe_schedule *sched);
DT_API int dt_pipe_schedule_micro(const dt_pipe_schedule *sched);
DT_API int dt_pipe_schedule_chunks(const dt_pipe_schedule *sched);
/* Steps of one stage (2 * M * V) and all steps (2 * M * V * P). */
DT_API int64_t dt_pipe_schedule_num_steps(const dt_pipe_schedule *sched, int stage);
DT_API int64_t dt_pipe_schedule_total_steps(const dt_pipe_schedule *sched);
/* Step i of `stage` in that stage's order (borrowed, NULL when out of range). */
DT_API const dt_pipe_step *dt_pipe_schedule_step(const dt_pipe_schedule *sched, int stage,
                                                 int64_t i);
/* Step i of the global order (borrowed, NULL when out of range). */
DT_API const dt_pipe_step *dt_pipe_schedule_global_step(const dt_pipe_schedule *sched,
                                                        int64_t i);
/* Length of the unit-time timeline (slots until the last step ends). */
DT_API int64_t dt_pipe_schedule_length(const dt_pipe_schedule *sched);
/* The timeline's bubble: idle slots of all stages / (stages * length). */
DT_API double dt_pipe_schedule_bubble(const dt_pipe_schedule *sched);
/* The most micro-batches stage `stage` holds forwarded but not yet backwarded at once (its
 * live activations, counted per chunk-step): M*V for GPipe, P-s for 1F1B. -1 when out of
 * range. */
DT_API int dt_pipe_schedule_peak_live(const dt_pipe_schedule *sched, int stage);
/* (P-1) / (V*M + P-1): the bubble fraction of these schedules with unit-time steps. */
DT_API double dt_pipe_bubble_theory(int stages, int micro, int chunks);

/* Writes the table as text (NUL-terminated), one line per stage, one column per slot:
 *     stage 0: F0 F1 F2 F3 .  .  .  B3 B2 B1 B0
 * cells "F<m>" / "B<m>" (with chunks > 1, "F<m>.<c>"), "." for an idle slot. Returns the
 * length the full text needs (without NUL), as snprintf; complete iff < len. Local. */
DT_API size_t dt_pipe_schedule_format(const dt_pipe_schedule *sched, char *buf, size_t len);

/* ======================================================================================
 * Stages. A dt_pipe is a mesh with one dimension given to the pipeline: stage s is the mesh
 * of the devices whose coordinate on that dimension is s, with the other dimensions (same
 * names, sizes, order). Tensors of stage s live on its stage mesh; the other dims (batch,
 * model) work inside each stage as on any mesh (collectives over the stage's clients only).
 * ====================================================================================== */

typedef struct dt_pipe dt_pipe;

/* Creates the pipeline of `mesh` along `dim_name` (a dimension of mesh; size 1 is allowed).
 * The pipe retains the mesh. The stage meshes are named "<mesh name>.stage<s>" ("stage<s>"
 * when the mesh has none); a mesh with the pipeline dimension only gives stage meshes of one
 * dimension "pipe_local" of size 1. Collective over the clients holding devices of `mesh`
 * (it sets up a communicator over them). DT_ERR_INVALID_ARGUMENT (NULL arguments, no such
 * dimension), DT_ERR_STATE before dt_init, DT_ERR_NO_MEMORY, DT_ERR_COMM, DT_ERR_TIMEOUT. */
DT_API dt_status dt_pipe_create(const dt_mesh *mesh, const char *dim_name, dt_pipe **pipe_out);
/* Waits for the sends still pending (errors are dropped: call dt_pipe_flush first to see
 * them) and frees the pipe. NULL is ignored. Collective as dt_pipe_create. */
DT_API void dt_pipe_destroy(dt_pipe *pipe);

/* Queries. Local. */
DT_API int dt_pipe_num_stages(const dt_pipe *pipe);
/* The mesh of stage s (borrowed, lives as long as the pipe), NULL when out of range. */
DT_API const dt_mesh *dt_pipe_stage_mesh(const dt_pipe *pipe, int stage);
/* 1 when this client holds devices of stage s, else 0. */
DT_API int dt_pipe_holds_stage(const dt_pipe *pipe, int stage);

/* Bytes moved by dt_pipe_send / dt_pipe_recv on this client since dt_pipe_create or the
 * last reset: sent and received by this client's devices, the part that crossed to or from
 * another process, and the part that crossed hosts. Only the stage boundaries' tensors
 * cross between stages, so these are the pipeline's whole inter-stage traffic. */
typedef struct dt_pipe_stats {
    uint64_t bytes_sent;
    uint64_t bytes_received;
    uint64_t bytes_sent_remote;
    uint64_t bytes_received_remote;
    uint64_t bytes_sent_cross_host;
    uint64_t bytes_received_cross_host;
    int64_t messages_sent;     /* dt_pipe_send calls that sent at least one shard */
    int64_t messages_received;
    /* The part of bytes_received_remote copied straight out of the sender's shared-memory
     * segment (same host, the shm pool up: docs/pipeline.md, "Transfers between stages"); the
     * rest came by MPI. */
    uint64_t bytes_received_shm;
} dt_pipe_stats;

/* The figures (DT_ERR_INVALID_ARGUMENT for NULL arguments), and their reset. Local. */
DT_API dt_status dt_pipe_get_stats(const dt_pipe *pipe, dt_pipe_stats *stats_out);
DT_API void dt_pipe_reset_stats(dt_pipe *pipe);

/* ---- point to point ------------------------------------------------------------------- */

/* Sends x, a tensor on the mesh of stage `from`, to stage `to`: each local component goes to
 * the device at the same position of stage `to`'s mesh (the receiver gives the same layout
 * specs on its own stage mesh). Nonblocking: the data are copied out of x before the call
 * returns (x may be freed or changed at once); the transfer completes at the matching
 * dt_pipe_recv and at dt_pipe_flush. `tag` (0..32767) tells apart the messages between two
 * stages that may be in flight at once; sends and receives of one (from, to, tag) match in
 * order. Called by every client holding devices of stage `from` (local otherwise: a client
 * holding none returns DT_OK at once). DT_ERR_INVALID_ARGUMENT (bad stage or tag, x not on
 * stage `from`'s mesh, from == to), DT_ERR_NO_MEMORY, DT_ERR_COMM; the device's copy errors. */
DT_API dt_status dt_pipe_send(dt_pipe *pipe, int from, int to, const dt_tensor *x, int tag);

/* Receives the tensor that stage `from` sends with `tag` to stage `to`, as a new tensor of
 * `shape` and `dtype` in `layout` (on stage `to`'s mesh), owned by the caller. Called by every
 * client holding devices of stage `to` (*out = NULL and DT_OK on the others). Waits under the
 * watchdog: DT_ERR_TIMEOUT naming the lost clients when the sender's clients stop answering
 * (DT_COMM_TIMEOUT, docs/multihost.md), DT_ERR_SHAPE when a shard of another size arrives,
 * DT_ERR_COMM on MPI errors, DT_ERR_INVALID_ARGUMENT (bad stages, tag, layout not on stage
 * `to`'s mesh), DT_ERR_NO_MEMORY. */
DT_API dt_status dt_pipe_recv(dt_pipe *pipe, int from, int to, const dt_layout *layout,
                              dt_dtype dtype, const int64_t *shape, int tag, dt_tensor **out);

/* Waits (watched) for every send of this client still pending and releases their buffers.
 * DT_ERR_TIMEOUT, DT_ERR_COMM. Local to the client (its peers must post their receives). */
DT_API dt_status dt_pipe_flush(dt_pipe *pipe);

/* ---- agreement across stages ------------------------------------------------------------ */

/* Gives every client of the pipe the n values vals[0..n), value i belonging to stage
 * stage_of[i]: on entry the clients holding devices of that stage hold it (the same there:
 * one client of the stage contributes it), on return every client holds all n, bit for bit
 * (inf and NaN included). For what must agree across stages: the per-layer squared gradient
 * norms of global-norm clipping (summed afterwards in one fixed order on every client, so all
 * stages clip by the same factor, the unpipelined run's), overflow flags. Collective over the
 * pipe's clients (watched: DT_ERR_TIMEOUT naming lost clients). DT_ERR_INVALID_ARGUMENT (NULL
 * arrays with n > 0, a bad stage), DT_ERR_NO_MEMORY, DT_ERR_COMM. */
DT_API dt_status dt_pipe_share_values(dt_pipe *pipe, int n, const int *stage_of, double *vals);

/* ---- checkpoints under global names ---------------------------------------------------- */

/* Saves n tensors as one checkpoint at `dir` (dt_save): tensor i lives on stage stage_of[i]'s
 * mesh (tensors[i] NULL on the clients not holding that stage) and is saved under names[i],
 * a global name (the model's own, "block3.fc.weight": the same whatever the stage count), so
 * that dt_pipe_restore on a pipe of another stage count, or dt_restore on a mesh without
 * pipeline, reads it back. Each tensor is reduced to replicated on its stage, copied onto the
 * pipe's whole mesh with dim 0 sharded over the pipeline dim (rank 0: replicated) and saved
 * from there. opts as dt_save's (may be NULL). Collective over the pipe's clients; every
 * client returns the same status. DT_ERR_INVALID_ARGUMENT (NULL arrays, a bad stage, a
 * holder passing NULL or a tensor on another mesh), and dt_save's errors. */
DT_API dt_status dt_pipe_save(dt_pipe *pipe, const char *dir, int n, const char *const *names,
                              const int *stage_of, const dt_tensor *const *tensors,
                              const dt_save_opts *opts);

/* Restores n tensors saved under names[i] (by dt_pipe_save at any stage count, or dt_save)
 * onto stage stage_of[i]'s mesh in layouts[i] (a layout on that stage mesh; every client
 * passes it): tensors_out[i] is an owned tensor on the clients holding that stage, NULL on
 * the others. Bit for bit what was saved. Collective over the pipe's clients.
 * DT_ERR_INVALID_ARGUMENT (NULL arrays, a bad stage, a layout on another mesh), and
 * dt_restore's errors (DT_ERR_NOT_FOUND, DT_ERR_CORRUPT, ...). On failure nothing is
 * written. */
DT_API dt_status dt_pipe_restore(dt_pipe *pipe, const char *dir, int n,
                                 const char *const *names, const int *stage_of,
                                 const dt_layout *const *layouts, dt_tensor **tensors_out);

/* ======================================================================================
 * The executor: runs a schedule over a pipe through callbacks, one call per step this
 * client's stages take part in, in the schedule's global order, with the stage boundaries'
 * tensors sent and received in between (tag: derived from the step). All clients of a stage
 * make the same calls in the same order, so the callbacks may use collectives over the stage
 * mesh. A failing callback or transfer stops the run on that client with its status; the
 * stages waiting on it then end with DT_ERR_TIMEOUT from the watchdog, not a hang.
 * ====================================================================================== */

/* Forward of micro-batch `micro` on chunk `chunk` of `stage` (virtual stage chunk*P+stage).
 * `input`: the previous virtual stage's output (borrowed; NULL on virtual stage 0, which
 * reads its own micro-batch). Sets *output_out to an owned tensor on the stage's mesh (the
 * executor sends it on and frees it), or NULL on the last virtual stage (the loss stays
 * with the callback). */
typedef dt_status (*dt_pipe_forward_fn)(void *arg, int stage, int chunk, int micro,
                                        const dt_tensor *input, dt_tensor **output_out);
/* Backward of the same step. `grad_output`: the gradient of that output (borrowed; NULL on
 * the last virtual stage, which starts from its loss). Sets *grad_input_out to an owned
 * gradient of the step's input (same shape, on the stage's mesh; sent to the previous
 * virtual stage), or NULL on virtual stage 0. */
typedef dt_status (*dt_pipe_backward_fn)(void *arg, int stage, int chunk, int micro,
                                         const dt_tensor *grad_output,
                                         dt_tensor **grad_input_out);

typedef struct dt_pipe_run_opts {
    dt_pipe_forward_fn forward;
    dt_pipe_backward_fn backward;
    void *arg;
    /* What the receiving side needs to make the boundary tensors: layout spec strings of
     * the activation (on each stage mesh, e.g. {"batch", "unsharded", "unsharded"}), its
     * rank, global shape and dtype. Gradients take the same shape, f32. */
    int act_rank;
    const char *const *act_specs;
    const int64_t *act_shape;
    dt_dtype act_dtype;
} dt_pipe_run_opts;
#define DT_PIPE_RUN_OPTS_INIT {NULL, NULL, NULL, 0, NULL, NULL, DT_DTYPE_F32}

/* What one run measured on this client (seconds of a monotonic clock). */
typedef struct dt_pipe_run_stats {
    double wall_seconds;    /* the whole run, first step to flush */
    double busy_seconds;    /* inside the callbacks */
    double comm_seconds;    /* inside sends, receives and the final flush */
    int64_t steps;          /* callbacks made */
    int peak_live;          /* most forwards not yet backwarded at once, over this client's
                             * stages (each counted per stage and chunk) */
} dt_pipe_run_stats;

/* Runs `sched` (its stage count must be the pipe's) on this client's stages, flushes the
 * sends, and fills *stats_out (may be NULL). Collective over the pipe's clients. Returns the
 * first failing status of a callback or a transfer (the run stops there), else DT_OK.
 * DT_ERR_INVALID_ARGUMENT for NULL arguments, missing callbacks or boundary facts, a stage
 * count that differs. */
DT_API dt_status dt_pipe_run(dt_pipe *pipe, const dt_pipe_schedule *sched,
                             const dt_pipe_run_opts *opts, dt_pipe_run_stats *stats_out);

#ifdef __cplusplus
}
#endif
#endif
