/* libdtensor optim: a ZeRO optimizer (stages 0, 1, 2) whose state is dt_tensors sharded along
 * the data-parallel mesh dimension, with mixed precision, loss scaling and clipping.
 * Model: DeepSpeed's FP16_DeepSpeedZeroOptimizer and the ZeRO paper (Rajbhandari et al.,
 * 2019). docs/optim.md has the design, the memory model and the checkpoint names. */
#ifndef DTENSOR_OPTIM_H
#define DTENSOR_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/ckpt.h"
#include "dtensor/export.h"
#include "dtensor/layout.h"
#include "dtensor/mesh.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the inner optimizer of a parameter group ------------------------------------------- */

typedef enum dt_optim_kind {
    DT_OPTIM_SGD = 0,   /* dt_kernel_sgd semantics (momentum, dampening, nesterov, L2 decay) */
    DT_OPTIM_ADAM = 1,  /* dt_kernel_adam, decoupled = 0 (L2 weight decay) */
    DT_OPTIM_ADAMW = 2, /* dt_kernel_adam, decoupled = 1 (decoupled weight decay) */
} dt_optim_kind;

/* Hyper-parameters of one group (fields a kind does not use are ignored). */
typedef struct dt_optim_hparams {
    dt_optim_kind kind;
    float lr;
    float weight_decay;
    float momentum;      /* SGD */
    float dampening;     /* SGD */
    int nesterov;        /* SGD */
    float beta1;         /* Adam, AdamW */
    float beta2;         /* Adam, AdamW */
    float eps;           /* Adam, AdamW */
} dt_optim_hparams;

#define DT_OPTIM_SGD_INIT {DT_OPTIM_SGD, 0.01f, 0.0f, 0.0f, 0.0f, 0, 0.9f, 0.999f, 1e-8f}
#define DT_OPTIM_ADAM_INIT {DT_OPTIM_ADAM, 1e-3f, 0.0f, 0.0f, 0.0f, 0, 0.9f, 0.999f, 1e-8f}
#define DT_OPTIM_ADAMW_INIT {DT_OPTIM_ADAMW, 1e-3f, 0.01f, 0.0f, 0.0f, 0, 0.9f, 0.999f, 1e-8f}

/* ---- loss scaling -------------------------------------------------------------------------- */

typedef enum dt_loss_scale_mode {
    DT_LOSS_SCALE_NONE = 0,    /* scale 1, overflow still detected and the step skipped */
    DT_LOSS_SCALE_STATIC = 1,  /* init_scale forever */
    DT_LOSS_SCALE_DYNAMIC = 2, /* DeepSpeed's DynamicLossScaler, below */
} dt_loss_scale_mode;

/* Dynamic scaling, DeepSpeed's semantics (consecutive_hysteresis = False), per step call:
 *   overflow:  if hysteresis_left == 1 (or hysteresis == 1): scale = max(scale / factor,
 *              min_scale); else hysteresis_left -= 1. last_overflow = iteration.
 *   no overflow: if (iteration - last_overflow) % window == 0: hysteresis_left = hysteresis;
 *              scale *= factor.
 *   then iteration += 1. Starts with iteration 0, last_overflow -1, hysteresis_left =
 *   hysteresis. (With consecutive_hysteresis != 0, hysteresis_left is reset on every step
 *   without overflow.) */
typedef struct dt_loss_scaler_opts {
    dt_loss_scale_mode mode;
    double init_scale;        /* 65536 (2^16) */
    int64_t window;           /* 1000 */
    int hysteresis;           /* 2 (DeepSpeed's delayed_shift) */
    double min_scale;         /* 1 */
    double factor;            /* 2 */
    int consecutive_hysteresis; /* 0 */
} dt_loss_scaler_opts;

#define DT_LOSS_SCALER_OPTS_INIT {DT_LOSS_SCALE_NONE, 65536.0, 1000, 2, 1.0, 2.0, 0}

/* ---- the optimizer ------------------------------------------------------------------------- */

/* What one dt_zero_step did, on every client alike. */
typedef struct dt_zero_step_info {
    int64_t iteration;        /* step calls before this one (0-based index of this call) */
    int64_t step;             /* updates applied so far, this one included (Adam's t) */
    int skipped;              /* 1: an inf/NaN was found in some gradient, nothing updated */
    double loss_scale;        /* the scale this call's gradients carried */
    double next_loss_scale;   /* the scale for the next backward pass */
    double grad_norm;         /* global L2 norm of the unscaled gradients (before clipping;
                               * +inf when skipped) */
    double clip_coef;         /* factor applied to the unscaled gradients (1: none) */
    /* Seconds this call spent on the gradients' reduction: with grads, the whole reduction;
     * after dt_zero_grad_ready, the wait for the buckets still in flight (the reduction's
     * exposed part; what the backward pass hid is not in it). This client's own time. */
    double reduce_wait_s;
    /* After dt_zero_grad_ready (0 otherwise): CPU seconds of this step's reduction spent
     * copying gradients into the flat buffer, to and from host staging (reduce_copy_s) and
     * summing the peers' parts (reduce_sum_s), by the calls, this one, and the background
     * progress thread; the rest of the reduction is MPI, which moves the bytes and waits for
     * peers. This client's own work (its threads' CPU time, not wall time). */
    double reduce_copy_s;
    double reduce_sum_s;
} dt_zero_step_info;

/* Called on every client, after the decision, when a step is skipped. */
typedef void (*dt_zero_overflow_fn)(void *arg, const dt_zero_step_info *info);

/* Combines the step's clipping and overflow inputs with other optimizers' (pipeline stages:
 * each stage has a dt_zero on its own stage mesh). Called on every client of the optimizer's
 * mesh, in dt_zero_step, after the values were agreed over that mesh and before the overflow
 * decision and the clip factor: *sq_sum is this optimizer's sum of squares of its (still
 * loss-scaled) gradients, *overflow 1 if one of them has an inf/NaN, else 0. The callback
 * replaces them with the combined values (e.g. sums over all stages, dt_pipe_share_values),
 * the same on every client of every stage, or returns a status, which dt_zero_step returns
 * (nothing updated). */
typedef dt_status (*dt_zero_combine_fn)(void *arg, double *sq_sum, int *overflow);

typedef struct dt_zero_opts {
    /* 0: plain data parallel (all-reduce of gradients, full optimizer state everywhere);
     * 1: optimizer state (fp32 master weights and moments) partitioned along the dp dim;
     * 2: gradients partitioned too (reduce-scatter; each rank keeps only its partition);
     * 3: parameters partitioned too: between dt_zero_gather and dt_zero_release of its group
     *    a parameter is whole (dt_zero_param), otherwise only each rank's shard exists
     *    (below, "Stage 3"). */
    int stage;
    /* The data-parallel mesh dimension; NULL means "batch". Must be a dim of the mesh. */
    const char *dp_dim;
    /* Most elements one all-gather of updated parameters moves (DeepSpeed's
     * allgather_bucket_size); 0 means 500000000. The temporary memory of the all-gather is
     * about this many parameter-dtype elements. Rounded down to a multiple of the dp size N
     * (and raised to N when smaller), so that every rank owns an equal share of every chunk
     * of the flat buffer but the last. */
    int64_t allgather_size;
    dt_loss_scaler_opts scaler;
    /* Global-norm gradient clipping (PyTorch's clip_grad_norm_): when the norm of the
     * unscaled gradients exceeds clip_norm, they are multiplied by clip_norm / (norm + 1e-6),
     * fused with unscaling. <= 0: off. */
    double clip_norm;
    dt_zero_overflow_fn on_overflow;  /* may be NULL */
    void *on_overflow_arg;
    /* Bytes of gradient one background reduction of dt_zero_grad_ready moves at a time
     * (DeepSpeed's reduce_bucket_size): each allgather_size chunk of the flat gradient buffer
     * is cut into buckets of at most this many bytes, and a bucket's reduction starts as soon
     * as the last parameter in it is given. Must be > 0; DT_ZERO_OPTS_INIT has 500000000
     * (DeepSpeed's default). Smaller buckets start earlier and overlap more of the backward
     * pass; each costs a message per dp peer. */
    int64_t reduce_bucket_size;
    /* 1: offload the optimizer to the host (DeepSpeed's cpu_offload), GPU meshes only, stages
     * 0, 1 and 2. The fp32 master weights and moments live in pinned host memory and the
     * inner optimizer runs there (the CPU kernels, dt_kernel_adam / dt_kernel_sgd); the
     * parameters and gradients stay on the devices. Each step, after the reduction, every
     * device's reduced gradient partition goes down (device to host) and its updated
     * parameters up, offload_block elements at a time, the copies of the neighbouring blocks
     * running while the host updates one; the all-gather follows on the devices. Saves the
     * devices 12 bytes per partition element (Adam; 8 with SGD momentum, 4 without); the
     * checkpoint is the same as without offload. */
    int offload;
    /* Elements per transfer block of the offloaded step; 0 means 1048576. */
    int64_t offload_block;
    /* Most bytes of gradient in background reduction at once (dt_zero_grad_ready; in the
     * spirit of DeepSpeed's max_live_parameters, for the buckets): before starting a bucket
     * that would go over it, the call first completes the oldest buckets in flight (it
     * waits), so the host staging memory (about (2N - 1) / N times these bytes on N dp
     * ranks) stays bounded when the reduction lags the backward pass. A bucket larger than the
     * bound runs alone. 0 means 2 * reduce_bucket_size; must be >= 0. */
    int64_t max_live_bucket_bytes;
    /* The dtype 16-bit (f16, bf16) gradients are reduced in across the dp ranks
     * (torchtitan's / FSDP2's reduce_dtype): DT_ZERO_REDUCE_PARAM (0, the default) sums them
     * in the parameters' dtype, rounding at each addition, as DeepSpeed does; DT_ZERO_REDUCE_F32
     * widens each rank's gradients to f32 when they enter the flat buffer, sums them in f32
     * and keeps the reduced partition, the norm and the update's input in f32 (the flat
     * gradient buffers then take 4 bytes an element instead of 2). f32 parameters: no
     * difference. Not with offload (DT_ERR_UNSUPPORTED). */
    int reduce_dtype;
    /* Combining the gradient norm and overflow flag with other optimizers before the clip
     * factor and the skip decision (dt_zero_combine_fn above); NULL (the default): this
     * optimizer's own values, as before. */
    dt_zero_combine_fn combine;
    void *combine_arg;
} dt_zero_opts;

/* Values of dt_zero_opts.reduce_dtype. */
enum { DT_ZERO_REDUCE_PARAM = 0, DT_ZERO_REDUCE_F32 = 1 };

#define DT_ZERO_OPTS_INIT \
    {1, NULL, 0, DT_LOSS_SCALER_OPTS_INIT, 0.0, NULL, NULL, 500000000, 0, 0, 0, 0, NULL, NULL}

typedef struct dt_zero dt_zero;

/* Creates an optimizer for parameters on `mesh` (CPU or GPU: the fp32 master weights, moments
 * and flat gradients live in the mesh's device memory; with opts->offload the master weights
 * and moments live in host memory). opts may be NULL for DT_ZERO_OPTS_INIT. Collective over
 * the clients of the mesh: they agree on the checks' outcome first, so an option bad on one of
 * them fails the call on all of them (the others' message starts "client C: "). A client
 * outside the mesh does not communicate (docs/mesh.md). DT_ERR_INVALID_ARGUMENT for a bad stage, unknown dp dim, negative
 * allgather_size or offload_block, offload on a mesh of CPU devices, or bad scaler options
 * (message names the field); DT_ERR_STATE if this client holds no device of the mesh; the mesh check's
 * status (dt_mesh_check_devices) when this client lacks its devices. */
DT_API dt_status dt_zero_create(const dt_mesh *mesh, const dt_zero_opts *opts,
                                dt_zero **zero_out);
/* Frees the state (not the parameters, which the optimizer only retained). Accepts NULL.
 * Local. */
DT_API void dt_zero_destroy(dt_zero *zero);

/* Adds a group of n parameters with hyper-parameters `hp`; *group_out (may be NULL) gets its
 * index (0, 1, ...). Parameters are dt_tensors on the optimizer's mesh, all of one dtype
 * (f32, f16 or bf16), replicated along the dp dim (sharded along other mesh dims if wanted),
 * not partial; names are unique over all groups and become checkpoint keys. The optimizer
 * retains each tensor and updates it in place at each step. The group's local components are
 * flattened, in order, into one buffer per model coordinate; the fp32 master copy (initialised
 * from the parameters) and the moments are 1-D pieces of it sharded along the dp dim.
 * Collective. DT_ERR_SHAPE for a parameter that is partial, sharded along the dp dim, on
 * another mesh or of another dtype (message names it); DT_ERR_INVALID_ARGUMENT for a
 * duplicate name or tensor, n < 1, or bad hyper-parameters (unknown kind, non-finite lr,
 * betas outside [0, 1), negative momentum, Nesterov without momentum or with dampening).
 * A parameter split unevenly over a model dim takes the length of its largest shard in the
 * flat buffer on every model coordinate (the others are padded with zeros). */
DT_API dt_status dt_zero_add_group(dt_zero *zero, int n, const char *const *names,
                                   dt_tensor *const *params, const dt_optim_hparams *hp,
                                   int *group_out);

/* Number of parameters over all groups, in the order they were added (the order of `grads`
 * in dt_zero_step). Local. */
DT_API int dt_zero_num_params(const dt_zero *zero);

/* The loss scale the next backward pass must multiply the loss gradient by (1 without
 * scaling). Local. */
DT_API double dt_zero_loss_scale(const dt_zero *zero);

/* Sets the learning rate of group `group` for the following steps. Local, but every client
 * must make the same calls. DT_ERR_INVALID_ARGUMENT for a bad group. */
DT_API dt_status dt_zero_set_lr(dt_zero *zero, int group, float lr);

/* One optimizer step. grads[i] is the gradient of parameter i (dt_zero_num_params of them, in
 * order): the parameter's global shape, f32, f16 or bf16, any layout on the mesh (naturally
 * partial (sum) over the dp dim, as dt_matmul_backward gives it), carrying the current loss
 * scale. A gradient in the parameter's sharding, partial (sum) over the dp dim, is read in
 * place; any other layout is first relaid out to that one. Each device's summand is converted
 * to the parameters' dtype and the sum over the dp dim is taken in that dtype (as DeepSpeed
 * reduces fp16 gradients). The gradients are reduced over the dp dim (stage 0: all-reduce; 1
 * and 2: reduce-scatter into each rank's partition), checked for inf/NaN over every rank (an
 * overflow skips the update on every client, updates the scaler, calls on_overflow and
 * returns DT_OK with info->skipped = 1), unscaled and clipped in one factor, applied by the
 * group's inner optimizer to the fp32 master partition (Adam's step count is the number of
 * updates applied, shared by all groups), and the updated parameters are all-gathered back to
 * replicated in chunks of at most allgather_size elements. `grads` are not modified.
 * info_out may be NULL. Collective. DT_ERR_SHAPE names a gradient of the wrong shape, dtype or
 * mesh; DT_ERR_INVALID_ARGUMENT a NULL gradient. */
DT_API dt_status dt_zero_step(dt_zero *zero, dt_tensor *const *grads,
                              dt_zero_step_info *info_out);
/* (grads NULL: every parameter was given by dt_zero_grad_ready, below; DT_ERR_STATE names one
 * that was not, or grads given after some were.) */

/* dt_zero_step in two halves, for a client that steps several optimizers whose clipping and
 * overflow check must agree and that cannot combine them inside one call: a client holding
 * several pipeline stages, each with its own optimizer (dt_zero_opts.combine would wait in the
 * first stage's step for the second's). dt_zero_step_begin checks, reduces the gradients and
 * gives the sum of squares of the (loss-scaled) gradients and the overflow flag agreed over
 * this optimizer's mesh: what a combine callback receives. The caller combines them with the
 * other optimizers' (dt_pipe_share_values over the stages, the sums added in a fixed order)
 * and passes the combined values to dt_zero_step_end, which decides, clips and updates as
 * dt_zero_step (begin, then combine, then end) does; combine is not called. Between the two,
 * grads must stay valid and no other call may use this optimizer; dt_zero_step_end ends the
 * step whatever it returns, and a failing begin leaves none pending. Collective as
 * dt_zero_step. DT_ERR_STATE: begin while a step is pending, end without one. */
DT_API dt_status dt_zero_step_begin(dt_zero *zero, dt_tensor *const *grads, double *sq_sum_out,
                                    int *overflow_out);
DT_API dt_status dt_zero_step_end(dt_zero *zero, double sq_sum, int overflow,
                                  dt_zero_step_info *info_out);

/* Early, overlapped reduction (DeepSpeed's contiguous gradients with overlap_comm): hands the
 * optimizer parameter `index`'s gradient (as dt_zero_step's grads[index]) as soon as the
 * backward pass has made it final. It is copied at once into the parameter's runs of the flat
 * gradient chunks (the caller may then free or reuse it). Each chunk is cut into buckets of
 * at most reduce_bucket_size bytes; the call starts the reduction over the dp dim of every
 * bucket whose parameters are now all in (stage 0 all-reduce, 1 and 2 reduce-scatter) with
 * non-blocking messages on the optimizer's own communicator, and returns without waiting for
 * it: later calls progress the buckets in flight (MPI_Test), and dt_zero_step(zero, NULL,
 * info) waits for the rest, then does the rest of the step. The reduction sums in the same
 * order as dt_zero_step with grads (dp coordinate order), so the results are equal bit for
 * bit. With a dp dim of size 1 there is nothing to reduce in the background (and on an MPI
 * whose tags are too few for the mesh, each chunk is reduced in the call, blocking, when its
 * last parameter is in). Call in any order, once per parameter per step. Collective (every
 * client calls it for the same parameters in the same order). DT_ERR_INVALID_ARGUMENT for a
 * bad index or NULL grad, DT_ERR_SHAPE as dt_zero_step's, DT_ERR_STATE for a parameter
 * already given in this step (these refusals change nothing); on a failure of the copy or
 * reduction, or when dt_zero_step refuses the step, the step's early gradients are dropped
 * (the messages in flight are waited for first; give every gradient again, or call
 * dt_zero_step with grads). Host staging: each bucket in flight holds about 3x its bytes of
 * host memory per local device until it is reduced. */
DT_API dt_status dt_zero_grad_ready(dt_zero *zero, int index, const dt_tensor *grad);

/* Bytes this client holds for the optimizer's purposes, over its local devices. */
typedef struct dt_zero_memory {
    uint64_t param_bytes;     /* the parameters (model dtype, replicated along dp; stage 3:
                               * the 16-bit shards plus the groups gathered now) */
    uint64_t grad_bytes;      /* gradient buffers held between steps (stages 2, 3: the
                               * partition) */
    uint64_t state_bytes;     /* fp32 master partition and moments */
    uint64_t gather_bytes;    /* the largest per-chunk temporary of a step: the all-gather's
                               * destination chunk (stage 1 with 16-bit parameters: plus its
                               * cast source), or the reduction's chunk (stage 2: the partial
                               * flat chunk; stages 0, 1: the reduced partition), whichever is
                               * larger; relayout's own staging is not counted */
    /* Offload: pinned host memory of the fp32 master partition and moments (state_bytes is
     * then 0: nothing of the state is on the devices) plus the transfer blocks; 0 without
     * offload. */
    uint64_t host_bytes;
} dt_zero_memory;
DT_API dt_status dt_zero_memory_usage(const dt_zero *zero, dt_zero_memory *memory_out);

/* Saves the parameters (under their names), the optimizer state under per-parameter names
 * (docs/optim.md: "<name>/master", "<name>/exp_avg", "<name>/exp_avg_sq",
 * "<name>/momentum", each f32 in the parameter's global shape, written as the boxes of it
 * each device's partition holds, so that any mesh reads its own), the scaler and step
 * counters and the groups' learning rates as named values ("zero/step", "zero/iteration",
 * "zero/loss_scale", "zero/hysteresis_left", "zero/last_overflow", "zero/group<g>/lr", and
 * "zero/state_format" = 2), plus the caller's extra tensors and opts->values and
 * opts->pieces, in one atomic dt_save to `dir`. opts may be NULL; opts->save_dtypes, if not
 * NULL, has n_extra entries, the dtypes of the extra tensors (the parameters and the state
 * are saved in their own dtypes). Collective. */
DT_API dt_status dt_zero_save(dt_zero *zero, const char *dir, int n_extra,
                              const char *const *extra_names,
                              const dt_tensor *const *extra_tensors, const dt_save_opts *opts);

/* dt_zero_save as a checkpoint manager's step: dt_save_step into
 * dt_ckpt_step_dir(root, step) (the pointer "<root>/latest" moved to it, the steps `keep`
 * (NULL: DT_CKPT_KEEP_INIT) does not keep removed); dt_ckpt_latest(root) finds it again for
 * dt_zero_load. Statuses as dt_save_step's. Collective. */
DT_API dt_status dt_zero_save_step(dt_zero *zero, const char *root, int64_t step,
                                   const dt_ckpt_keep *keep, int n_extra,
                                   const char *const *extra_names,
                                   const dt_tensor *const *extra_tensors,
                                   const dt_save_opts *opts);

/* dt_zero_save for optimizers on disjoint sub-meshes of `mesh` that save one checkpoint
 * together: a pipeline's stages, one optimizer per stage (docs/pipeline.md). Every client
 * holding devices of `mesh` calls it with the optimizer whose mesh holds its devices. Each
 * optimizer's parameters and state are written under their names as dt_zero_save writes
 * them, the parameters as explicitly placed slices (so they carry no layout and any mesh
 * reads any box); the counters, the scaler and the learning rates are client 0's (the
 * optimizers must step together, as a pipeline's do). Parameter names must differ between
 * the optimizers. dt_zero_load of an optimizer whose parameters are among the saved ones, on
 * any mesh, restores from it: a pipelined run resumes with another stage count, or without
 * pipeline. opts as dt_zero_save's (no save_dtypes). dt_zero_save_joint_step saves as
 * dt_zero_save_step does. Statuses as dt_zero_save's; DT_ERR_INVALID_ARGUMENT when a device
 * of zero's mesh is not in `mesh`. Collective over mesh's clients. */
DT_API dt_status dt_zero_save_joint(dt_zero *zero, const dt_mesh *mesh, const char *dir,
                                    const dt_save_opts *opts);
DT_API dt_status dt_zero_save_joint_step(dt_zero *zero, const dt_mesh *mesh, const char *root,
                                         int64_t step, const dt_ckpt_keep *keep,
                                         const dt_save_opts *opts);

/* dt_zero_save through dt_save_async: returns once the state, parameters and extra tensors
 * are copied to staging memory (the next dt_zero_step may run at once); *req_out is the
 * request whose outcome dt_save_wait gives. Errors of the start are returned here and no
 * request is made. Collective. */
DT_API dt_status dt_zero_save_async(dt_zero *zero, const char *dir, int n_extra,
                                    const char *const *extra_names,
                                    const dt_tensor *const *extra_tensors,
                                    const dt_save_opts *opts, dt_save_request **req_out);

/* Restores parameters, optimizer state, scaler and counters saved by dt_zero_save into this
 * optimizer, whose groups must have the same parameters (names, global shapes) and inner
 * optimizer kinds; the mesh (its shape, the number of dp ranks, the model dims and how they
 * shard each parameter), the stage and allgather_size may differ. A checkpoint of the older
 * per-model-row format (no "zero/state_format") still restores when the model dims shard
 * every parameter as when it was saved; otherwise DT_ERR_SHAPE says so. Each device reads only the slices of its own partition. The groups' learning
 * rates are restored; the loss scale and hysteresis only when this optimizer's scaler is
 * dynamic (a static or absent scaler keeps its configured scale). Everything is checked
 * against the index before any data is read; on a failure during the reads the parameters
 * and state are unspecified (partly overwritten) and the counters unchanged. Every client
 * returns the same status. Collective. DT_ERR_NOT_FOUND names a missing tensor or value;
 * DT_ERR_SHAPE a mismatch; DT_ERR_CORRUPT as dt_restore. */
DT_API dt_status dt_zero_load(dt_zero *zero, const char *dir);

/* ---- stage 3: sharded parameters (docs/optim.md, "Stage 3") --------------------------------
 * In stage 3 dt_zero_add_group reads the caller's parameter tensors once (their values become
 * the shards) and does not keep them: the caller may destroy them. A group is the unit of
 * gathering (add one group per layer): its parameters are released (only the shards exist)
 * until dt_zero_gather makes them whole again as new tensors, which dt_zero_param hands out,
 * until dt_zero_release frees them. A training loop gathers a layer's group before its
 * forward, releases it after, gathers it again before its backward and releases it after; it
 * calls dt_zero_prefetch for the next layer's group before computing the current one, so that
 * gather's messages move while it computes. dt_zero_step (and dt_zero_add_group) refuse to run
 * while a group is gathered or prefetched (DT_ERR_STATE names it): the update writes the
 * shards. dt_zero_save and dt_zero_load gather every released group for their duration.
 * In stages 0-2 the parameters are always whole: dt_zero_prefetch, dt_zero_gather and
 * dt_zero_release only check their arguments, and dt_zero_param gives the caller's tensor, so
 * one loop serves every stage.
 * All four: DT_ERR_INVALID_ARGUMENT for a NULL zero or an out-of-range group or index. */

/* Starts the all-gather of group `group`'s parameters in the background (non-blocking messages
 * on the optimizer's communicator, each rank's shard to every dp peer through host staging
 * memory) and returns. Collective (every client, same groups, same order).
 * DT_ERR_STATE if the group is already gathered or prefetched. */
DT_API dt_status dt_zero_prefetch(dt_zero *zero, int group);
/* Makes group `group`'s parameters whole: completes its prefetch (or does the whole gather when
 * none was started) into new tensors in the parameters' layouts and dtype. Collective.
 * DT_ERR_STATE if the group is already gathered ("gathered twice"). */
DT_API dt_status dt_zero_gather(dt_zero *zero, int group);
/* Frees group `group`'s gathered parameters (tensors from dt_zero_param become invalid).
 * Local. DT_ERR_STATE if the group is not gathered (released already, or only prefetched:
 * dt_zero_gather it first). */
DT_API dt_status dt_zero_release(dt_zero *zero, int group);
/* The whole parameter `index` (dt_zero_step's order), borrowed: valid until its group's
 * release. Local. DT_ERR_STATE naming it when its group is released (or only prefetched). */
DT_API dt_status dt_zero_param(const dt_zero *zero, int index, dt_tensor **param_out);
/* The group of parameter `index`, or -1 when out of range. Local. */
DT_API int dt_zero_param_group(const dt_zero *zero, int index);

#ifdef __cplusplus
}
#endif
#endif
