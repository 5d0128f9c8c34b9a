/* autograd/: the tape's private structures (values, records, segments) and the rule table's
 * interface (docs/autograd.md). Not installed. */
#ifndef DT_AUTOGRAD_TAPE_IMPL_H
#define DT_AUTOGRAD_TAPE_IMPL_H

#include <stdint.h>

#include "runtime/record.h"
#include "dtensor/autograd.h"

/* The rule types and the built-in kinds' table are in runtime/record.h (rules: ops/rules*.c). */

/* ---- the tape ------------------------------------------------------------------------- */

/* One tensor the recording has seen (an input or output of a record, or a watched tensor). */
typedef struct ag_value {
    uint64_t serial;
    const dt_tensor *t; /* borrowed: valid while the caller or a record holds it */
    int requires_grad;
    int watch;         /* watched index, or -1 */
    int64_t producer;  /* record making it, or -1 */
    int64_t first_use; /* first record using it, or -1 */
    int nuses;         /* uses by records (one per input slot), in forward order */
    int ncontrib_cap;
    dt_tensor **contrib; /* backward: the gradient of each use (+1 slot for the root) */
    dt_tensor *grad;     /* backward: the summed gradient, until its producer has run */
    int grad_seed;       /* backward: the root's gradient is the seed */
    float seed;
    int held; /* records (and segments) holding it saved */
    uint64_t held_bytes;
    dt_tensor *recomp; /* backward with checkpointing: the recomputed tensor */
} ag_value;

struct ag_node {
    dt_op_kind kind;
    const dt__ag_rule *rule;
    int nin;
    int64_t in[DT__REC_MAX_IN]; /* value ids */
    int use[DT__REC_MAX_IN];    /* which use of the value this slot is */
    int64_t out;                /* value id */
    dt_layout *layout;          /* retained */
    dt_layout *in0_layout;      /* retained: input 0's layout */
    int64_t in0_shape[DT_MAX_RANK];
    dt_dtype in0_dtype;
    int64_t iattr[DT__REC_MAX_ATTR];
    float fattr[DT__REC_MAX_ATTR];
    const void *def;                  /* a defined op's handle (DT_OP_DEFINED) */
    dt_op_attrs *attrs;               /* owned copy of its attributes, else NULL */
    dt_tensor *saved[DT__REC_MAX_IN]; /* retained */
    dt_tensor *saved_out;             /* retained (save_out, or kept by selective ckpt) */
    int segment;                      /* index into the segments, or -1 */
    int done;
};

typedef struct ag_segment {
    dt_checkpoint_opts opts;
    int64_t first, last; /* records, inclusive; last < first when empty */
    int64_t *inputs;     /* values made before the segment and used in it */
    dt_tensor **input_t; /* retained (recompute), parallel to inputs */
    int ninputs, cap;
} ag_segment;

typedef struct ag_watch {
    dt_tensor *t;  /* retained; NULL when the index is not watched */
    int64_t value; /* its value in the current recording, or -1 */
    dt_tensor *grad;
} ag_watch;

struct dt_tape {
    dt__recorder rec; /* first: the ops' view */
    dt_tape_opts opts;
    ag_value *values;
    int64_t nvalues, values_cap;
    int64_t *map; /* open addressing, serial -> value id (-1 empty) */
    int64_t map_cap;
    int64_t map_used; /* slots taken */
    ag_node *nodes;
    int64_t nnodes, nodes_cap;
    ag_segment *segs;
    int nsegs, segs_cap;
    int open_seg; /* -1 when none */
    ag_watch *watch;
    int nwatch;
    int recording;     /* records on its thread now */
    int has_recording; /* a recording exists (begun and not discarded) */
    int consumed;      /* the recording has run backward */
    uint64_t saved_bytes, peak_saved_bytes;
    int64_t saved_tensors;
    int64_t recomputed;
};

/* Value bookkeeping (autograd/record.c). */
int64_t dt__ag_find(const dt_tape *tape, const dt_tensor *t);
/* Maps value v's serial to v (rebinding a watched value). */
dt_status dt__ag_map_insert(dt_tape *tape, int64_t v);
dt_status dt__ag_value_add(dt_tape *tape, const dt_tensor *t, int64_t *id_out);
dt_status dt__ag_record(dt__recorder *self, const dt__op_record *rec);
/* Holding a tensor saved for value v (bytes counted once per value). */
void dt__ag_hold(dt_tape *tape, int64_t v, const dt_tensor *t);
void dt__ag_unhold(dt_tape *tape, int64_t v);
/* Drops the recording (records, values, segments, their references). */
void dt__ag_drop_recording(dt_tape *tape);
/* Local bytes of t's components. */
uint64_t dt__ag_local_bytes(const dt_tensor *t);

/* Thread state (autograd/tape.c): the recording tape and whether backward runs here. */
void dt__ag_set_backward(int on);

/* The lock of the live tapes' registry, held while a value map changes (tape.c). */
void dt__ag_map_lock(void);
void dt__ag_map_unlock(void);

/* Another live tape holding this tensor, for the "from another tape" message (tape.c). */
int dt__ag_other_tape_has(const dt_tape *self, const dt_tensor *t);

#endif
