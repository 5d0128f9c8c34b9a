/* libdtensor autograd: a tape that records the forward calls of the distributed ops (ops.h,
 * dt_relayout) and runs their explicit *_backward functions automatically (docs/autograd.md). */
#ifndef DTENSOR_AUTOGRAD_H
#define DTENSOR_AUTOGRAD_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/export.h"
#include "dtensor/layout.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================================
 * Model. A tape records, on the thread that called dt_tape_begin, every call of a recorded op
 * (dt_op_kind below) one of whose inputs requires grad: a watched tensor (dt_tape_watch) or
 * the output of an op recorded on the same tape since dt_tape_begin. Each record keeps the
 * op's kind, its attributes and the tensors its backward needs (saved tensors, retained with
 * dt_tensor_retain); calls whose inputs need no gradient, calls inside a no-grad region and
 * calls made by an op's own implementation are not recorded. dt_tape_backward then runs the
 * explicit backward functions of ops.h over the records in reverse order and hands out each
 * watched tensor's gradient (f32, in the layout the explicit function gives: typically
 * partial over the batch mesh dim, never reduced by the tape).
 *
 * Gradients reaching one tensor along several paths are summed with dt_add (natural layout,
 * so partial stays partial) in the order of the uses in the forward pass: first use first,
 * ((g0 + g1) + g2) + ... , as the hand-written backward of examples/gpt does.
 *
 * Collectives: recording adds no communication. dt_tape_backward is collective: every client
 * must have recorded the same ops in the same order and calls it with the same arguments;
 * it then runs the same backward functions in the same order everywhere.
 *
 * Threads: a tape belongs to the thread that records it; several tapes may record on
 * several threads at once. One tape records at a time per thread (begin on a second tape
 * while one records: DT_ERR_STATE).
 * ====================================================================================== */

typedef struct dt_tape dt_tape;

/* The ops a tape records (their forward calls are the ops.h / relayout.h functions named).
 * New ops append their kind here (docs/autograd.md, "Adding an op"); values never change. */
typedef enum dt_op_kind {
    DT_OP_MATMUL = 0,     /* dt_matmul */
    DT_OP_MATMUL_ND,      /* dt_matmul_nd */
    DT_OP_ADD,            /* dt_add */
    DT_OP_SUB,            /* dt_sub */
    DT_OP_MUL,            /* dt_mul */
    DT_OP_SCALE,          /* dt_scale */
    DT_OP_BIAS_ADD,       /* dt_bias_add */
    DT_OP_LAYER_NORM,     /* dt_layer_norm */
    DT_OP_SOFTMAX,        /* dt_softmax */
    DT_OP_ATTENTION,      /* dt_attention */
    DT_OP_EMBEDDING,      /* dt_embedding */
    DT_OP_VOCAB_XENT,     /* dt_vocab_xent */
    DT_OP_SOFTMAX_XENT,   /* dt_softmax_xent */
    DT_OP_GELU,           /* dt_gelu */
    DT_OP_RELU,           /* dt_relu */
    DT_OP_CAST,           /* dt_cast */
    DT_OP_RELAYOUT,       /* dt_relayout */
    DT_OP_REDUCE,         /* dt_reduce */
    DT_OP_RMS_NORM,       /* dt_rms_norm */
    DT_OP_ROPE,           /* dt_rope */
    DT_OP_SWIGLU,         /* dt_swiglu */
    DT_OP_ATTENTION_GQA,  /* dt_attention_gqa */
    DT_OP_DEFINED,        /* dt_op_call: an op definition's call (opdef.h), any of them */
    DT_OP_RESERVED_ = 32, /* kinds 22..63 are left for new ops */
    DT_OP_KIND_MAX_ = 64
} dt_op_kind;

/* A bit mask of op kinds (dt_checkpoint_opts.keep_ops). */
#define DT_OP_BIT(kind) (UINT64_C(1) << (kind))

/* The name of an op kind ("matmul_nd", ...), "unknown" for others. */
DT_API const char *dt_op_kind_name(dt_op_kind kind);

/* ---- tapes -------------------------------------------------------------------------- */

typedef struct dt_tape_opts {
    /* 0 (default): each backward pass replaces the watched gradients, so a plain loop
     * (forward, backward, step, repeat) is right as written (JAX's fresh gradients; a watched
     * tensor the pass does not reach has none afterwards). 1: gradient accumulation over
     * micro-batches: the gradients of successive backward passes add up (old + new, dt_add)
     * until dt_tape_zero_grad, which the loop calls before each step's first micro-batch
     * (PyTorch's optimizer.zero_grad()). */
    int accumulate;
} dt_tape_opts;
#define DT_TAPE_OPTS_INIT {0}

/* Creates an empty tape (no recording, no watched tensors). opts may be NULL (defaults).
 * DT_ERR_INVALID_ARGUMENT for a NULL tape_out; DT_ERR_NO_MEMORY. Local. */
DT_API dt_status dt_tape_create(const dt_tape_opts *opts, dt_tape **tape_out);
/* Frees the tape, its recording, its saved tensors and its gradients (releasing the
 * references it holds). Ends its recording if it records on this thread. NULL is ignored.
 * Must not be called from another thread while the tape records there. Local. */
DT_API void dt_tape_destroy(dt_tape *tape);

/* Makes `tape` the recording tape of the calling thread and starts a new recording: the
 * records of a previous recording not yet run backward are discarded (their saved tensors
 * released); watched tensors and accumulated gradients are kept. DT_ERR_STATE when a tape
 * (this or another) already records on this thread, or inside a checkpoint segment. Local. */
DT_API dt_status dt_tape_begin(dt_tape *tape);
/* Stops recording on this thread (the records are kept for dt_tape_backward).
 * DT_ERR_STATE when `tape` is not this thread's recording tape, or a checkpoint segment is
 * still open. Local. */
DT_API dt_status dt_tape_end(dt_tape *tape);
/* This thread's recording tape (borrowed), NULL when none. Local. */
DT_API dt_tape *dt_tape_current(void);

/* Marks `param` as requiring grad on this tape under `index` (>= 0; the index the gradient
 * callback, dt_tape_grad and dt_tape_take_grad use): its uses by recorded ops are recorded and
 * its gradient is kept. Any tensor may be watched (a parameter, or a pipeline stage's input
 * activation to get its gradient). Watching an index again with another tensor rebinds it
 * (ZeRO stage 3 hands out new tensors at each dt_zero_gather: re-watch them before the next
 * recording, or in a segment's pre hook, below); the tape retains the watched tensor until it
 * is rebound, unwatched (param NULL) or the tape is destroyed. Watch before the forward calls
 * that use it. DT_ERR_INVALID_ARGUMENT for a NULL tape or a negative index, or a tensor
 * already watched under another index; DT_ERR_NO_MEMORY. Local. */
DT_API dt_status dt_tape_watch(dt_tape *tape, const dt_tensor *param, int index);

/* 1 if x requires grad on `tape` (watched, or the output of an op recorded in the current
 * recording), else 0. Local. */
DT_API int dt_tape_requires_grad(const dt_tape *tape, const dt_tensor *x);

/* No-grad regions (PyTorch's torch.no_grad): between begin and end nothing is recorded on
 * this thread. Nestable; end without begin is ignored. Local. */
DT_API void dt_no_grad_begin(void);
DT_API void dt_no_grad_end(void);
/* 1 when ops called now on this thread would be recorded (a tape records, no no-grad
 * region). Local. */
DT_API int dt_grad_enabled(void);

/* A copy of x (same layout, dtype, values bit for bit) that does not require grad on any
 * tape: the gradient stops there. Owned by the caller. An integer x (which never carries a
 * gradient: the tape does not record integer outputs) comes back as a new reference to x.
 * DT_ERR_INVALID_ARGUMENT for NULL arguments; as dt_cast otherwise. Local. */
DT_API dt_status dt_detach(const dt_tensor *x, dt_tensor **out);

/* ---- backward ------------------------------------------------------------------------- */

/* Called the moment watched tensor `index`'s gradient is final for this backward pass (all
 * its uses have run backward): `grad` is the tape's gradient (borrowed, f32; with
 * accumulation, the sum so far over the backward passes since dt_tape_zero_grad), param the
 * watched tensor (borrowed). A training loop calls dt_zero_grad_ready(zero, index, grad) from
 * here (on the last micro-batch). A failing status stops the backward pass and is returned
 * by dt_tape_backward. Each watched index that got a gradient is reported exactly once per
 * backward pass, in the order its gradient became final (reverse forward order of the
 * first use). */
typedef dt_status (*dt_tape_grad_fn)(void *arg, int index, const dt_tensor *param,
                                     const dt_tensor *grad);

/* Called after each record's backward function has run (for tests and tracing: stats,
 * memory): `node` counts the recording's records from 0 in forward order. */
typedef void (*dt_tape_node_fn)(void *arg, int64_t node, dt_op_kind kind);

typedef struct dt_backward_opts {
    dt_tape_grad_fn grad_fn; /* may be NULL */
    void *grad_arg;
    /* 1: every watched index must get a gradient in this pass, else DT_ERR_STATE names the
     * first that did not (after the pass: the others' gradients are kept). */
    int require_all;
    dt_tape_node_fn node_fn; /* may be NULL */
    void *node_arg;
} dt_backward_opts;
#define DT_BACKWARD_OPTS_INIT {NULL, NULL, 0, NULL, NULL}

/* Runs the current recording backward from `root`, which must be a watched tensor or the
 * output of a recorded op of this recording:
 *   grad NULL: root is rank 0 (a loss) and its gradient is `seed` (1, or the loss scale);
 *   grad given: root's gradient (same shape, any layout on root's mesh; a pipeline stage's
 *   output gradient); seed is ignored.
 * Ends the recording first if it still records on this thread. Records run in reverse order;
 * a record's saved tensors are released as soon as its backward has run, and an
 * intermediate gradient as soon as its last consumer has run. Records whose output got no
 * gradient are skipped. Afterwards the recording is consumed (a second backward on it:
 * DT_ERR_STATE); the gradients stay on the tape. opts may be NULL.
 * Collective (every client, same recording, same order).
 * DT_ERR_INVALID_ARGUMENT: NULL tape or root, root recorded on another tape or not requiring
 * grad, grad of another shape or mesh; DT_ERR_SHAPE: non-scalar root without grad;
 * DT_ERR_STATE: no recording, recording already run backward, an open checkpoint segment,
 * require_all with a watched index left without gradient; DT_ERR_UNSUPPORTED: a record
 * whose op has no backward rule for this case (the message names the op and why); and any
 * error of the backward functions or of the callbacks (the pass stops; the recording is then
 * consumed and its saved tensors released). */
DT_API dt_status dt_tape_backward(dt_tape *tape, const dt_tensor *root, const dt_tensor *grad,
                                  float seed, const dt_backward_opts *opts);

/* Watched index `index`'s gradient (borrowed, valid until the next backward, zero_grad, take
 * or destroy), *grad_out = NULL when it has none. DT_ERR_INVALID_ARGUMENT for a NULL
 * argument or an index that is not watched. Local. */
DT_API dt_status dt_tape_grad(const dt_tape *tape, int index, const dt_tensor **grad_out);
/* Takes watched index `index`'s gradient: *grad_out (owned by the caller, NULL when none);
 * the tape no longer holds it. Errors as dt_tape_grad. Local. */
DT_API dt_status dt_tape_take_grad(dt_tape *tape, int index, dt_tensor **grad_out);
/* Drops every gradient held (the start of a new accumulation; a backward pass without
 * accumulation does it itself). Local. */
DT_API void dt_tape_zero_grad(dt_tape *tape);
/* Drops the recording (saved tensors released) and every gradient; watched tensors stay.
 * DT_ERR_STATE while the tape records. Local. */
DT_API dt_status dt_tape_reset(dt_tape *tape);

/* ---- checkpoint segments and units ------------------------------------------------------ */

/* Hook of a segment: phase DT_SEGMENT_PRE runs before the segment's records are recomputed
 * (with recompute) and run backward, DT_SEGMENT_POST after the last of them has run backward.
 * A model gathers a ZeRO stage 3 unit's parameters in PRE (dt_zero_gather, then dt_tape_watch
 * of the new tensors under their indices) and releases them in POST. A failing status stops
 * the backward pass. Called on every client (collective calls inside are fine). */
typedef enum dt_segment_phase { DT_SEGMENT_PRE = 0, DT_SEGMENT_POST = 1 } dt_segment_phase;
typedef dt_status (*dt_tape_segment_fn)(void *arg, int id, dt_segment_phase phase);

typedef struct dt_checkpoint_opts {
    /* 1 (default): activation checkpointing: the records of the segment keep only the
     * segment's inputs (tensors used in the segment and made before it: its input activation,
     * parameters) and, during backward, the segment's forward calls are re-run on them
     * (bit-identical: same calls, same inputs) before its backward. 0: a plain unit (the
     * records keep what they need as usual; only the hooks apply). */
    int recompute;
    /* With recompute: the outputs of these op kinds are kept (not recomputed): selective
     * checkpointing, e.g. DT_OP_BIT(DT_OP_MATMUL_ND). */
    uint64_t keep_ops;
    /* 1: the records do not retain watched tensors; at backward they use the tensor watched
     * under the same index at that time (rebound in the PRE hook): ZeRO stage 3, whose
     * gathered parameters are freed between forward and backward. */
    int borrow_watched;
    dt_tape_segment_fn hook; /* may be NULL */
    void *hook_arg;
    int id; /* passed to the hook */
} dt_checkpoint_opts;
#define DT_CHECKPOINT_OPTS_INIT {1, 0, 0, NULL, NULL, 0}

/* Opens a segment on `tape` (which must be recording on this thread; segments do not nest):
 * the ops recorded until dt_tape_checkpoint_end belong to it. opts may be NULL (defaults).
 * DT_ERR_STATE when the tape does not record here or a segment is open. Local. */
DT_API dt_status dt_tape_checkpoint_begin(dt_tape *tape, const dt_checkpoint_opts *opts);
/* Closes the open segment. DT_ERR_STATE when none is open. Local. */
DT_API dt_status dt_tape_checkpoint_end(dt_tape *tape);

/* ---- statistics ------------------------------------------------------------------------- */

typedef struct dt_tape_stats {
    int64_t nodes;            /* records of the current recording */
    int64_t nodes_pending;    /* of which not yet run backward */
    int64_t saved_tensors;    /* distinct tensors held for backward now */
    uint64_t saved_bytes;     /* their bytes on this client's devices (local components) */
    uint64_t peak_saved_bytes; /* the most saved_bytes since the recording began */
    int64_t grad_tensors;     /* intermediate and watched gradients held now */
    uint64_t grad_bytes;      /* their local bytes */
    int64_t recomputed;       /* forward calls re-run by checkpointing in the last backward */
} dt_tape_stats;

/* The tape's current figures. DT_ERR_INVALID_ARGUMENT for NULL arguments. Local. */
DT_API dt_status dt_tape_get_stats(const dt_tape *tape, dt_tape_stats *stats_out);

#ifdef __cplusplus
}
#endif
#endif
