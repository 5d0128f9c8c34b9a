/* The record hook below the ops (ops/, layout/relayout.c) and the tape (autograd/): the ops
 * hand each call and its backward rule to whatever records on this thread, so that ops/ and
 * layout/ never depend on autograd/ (which sits above them and calls the ops). The thread's
 * recorder is runtime/record.c's. Not installed. */
#ifndef DT_RUNTIME_RECORD_H
#define DT_RUNTIME_RECORD_H

#include <stdint.h>

#include "dtensor/autograd.h"
#include "dtensor/layout.h"
#include "dtensor/opdef.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#define DT__REC_MAX_IN   8
#define DT__REC_MAX_ATTR 5

/* ---- backward rules ---------------------------------------------------------------------
 * The rule of a recorded call: how its backward runs and how it is replayed. The ops hand
 * their rule with each record (dt__op_record.rule) or, for the kinds of dt_op_kind, the tape
 * finds it in its table (ops/rules.c). */

typedef struct ag_node ag_node;

/* What a backward rule sees: the record's attributes, its saved tensors, the output's
 * gradient and which inputs need one. It writes dx[i] (owned, NULL for none) for the inputs
 * with needs[i]; a gradient for an input without needs[i] is dropped. */
typedef struct dt__ag_ctx {
    const ag_node *node;
    const dt_tensor *in[DT__REC_MAX_IN]; /* saved inputs (NULL where the rule saves none) */
    const dt_tensor *out;                /* saved output (NULL unless the rule saves it) */
    const dt_layout *layout;             /* the forward call's layout argument */
    const dt_layout *in0_layout;         /* input 0's layout, shape and dtype (always kept) */
    const int64_t *in0_shape;
    dt_dtype in0_dtype;
    const int64_t *iattr;
    const float *fattr;
    const void *def;              /* a defined op's handle (dt_op), else NULL */
    const dt_op_attrs *attrs;     /* a defined op's attributes, else NULL */
    int nin;                      /* the record's inputs */
    int needs[DT__REC_MAX_IN];
    /* The output's gradient: dy, or (dy NULL) the scalar seed of a rank-0 root. */
    const dt_tensor *dy;
    int dy_is_seed;
    float seed;
    dt_tensor *dx[DT__REC_MAX_IN];
} dt__ag_ctx;

typedef struct dt__ag_rule {
    const char *name; /* the forward function, for messages */
    unsigned save_in; /* bit i: input i is saved for backward */
    int save_out;     /* 1: the output is saved */
    /* NULL: the op has no backward (DT_ERR_UNSUPPORTED if a gradient reaches it). May
     * return DT_ERR_UNSUPPORTED for an attribute it cannot differentiate. */
    dt_status (*backward)(dt__ag_ctx *c);
    /* Re-runs the forward call on `in` (checkpointing): the public op with the record's
     * attributes. */
    dt_status (*replay)(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out);
    /* 1: the rule takes a rank-0 output's gradient as a float (dt__ag_dy_scalar), so a root's
     * seed is passed as it is; 0: the seed is made a tensor (ctx.dy) before the rule runs. */
    int scalar_dy;
} dt__ag_rule;

/* The built-in kinds' rules (ops/rules*.c; their table, ops/rules.c): the rule of `kind`,
 * NULL when none is registered. */
const dt__ag_rule *dt__ag_rule_of(dt_op_kind kind);

/* For rules (ops/rules.c): the scalar value of the output gradient (the seed, or dt_item of a
 * rank-0 dy), for the loss rules whose explicit backward takes a float (collective when dy is
 * a tensor); and the output gradient as a tensor: dy, or the seed as a new rank-0 replicated
 * f32 tensor on the mesh of `like` (*owned_out set to it then, destroyed by the caller). */
dt_status dt__ag_dy_scalar(const dt__ag_ctx *c, float *value_out);
dt_status dt__ag_dy_tensor(const dt__ag_ctx *c, const dt_tensor *like, const dt_tensor **dy_out,
                           dt_tensor **owned_out);

/* One forward call, as an op hands it to the recording tape: kind, inputs (in the op's
 * argument order; tensors only), the output, and the attributes the backward rule and the
 * replay (checkpointing) need. The attribute slots' meaning is per kind (ops/rules_*.c
 * says which; docs/autograd.md lists them). Everything is borrowed for the call. */
typedef struct dt__op_record {
    dt_op_kind kind;
    int nin;
    const dt_tensor *in[DT__REC_MAX_IN];
    const dt_tensor *out;
    const dt_layout *layout;         /* the op's `layout` argument (may be NULL) */
    int64_t iattr[DT__REC_MAX_ATTR]; /* transa, transb, axis, heads, causal, dtype, op, seed */
    float fattr[DT__REC_MAX_ATTR];   /* eps, alpha */
    const dt__ag_rule *rule;         /* NULL: the table's rule of `kind` */
    const void *def;                 /* a defined op (kind DT_OP_DEFINED): its dt_op handle */
    const dt_op_attrs *attrs;        /* and its attributes (copied by the tape) */
} dt__op_record;

/* The recording tape as the ops see it: one function. It returns DT_OK when nothing needs
 * recording (no input requires grad), and an error (DT_ERR_INVALID_ARGUMENT, DT_ERR_NO_MEMORY,
 * DT_ERR_UNSUPPORTED) that the op returns instead of its output. */
typedef struct dt__recorder dt__recorder;
struct dt__recorder {
    dt_status (*record)(dt__recorder *self, const dt__op_record *rec);
};

/* This thread's active recorder, NULL when nothing records (no tape, a no-grad region, a
 * backward pass running, or an op's own implementation running). Defined in
 * runtime/record.c, set only by autograd/. */
extern _Thread_local dt__recorder *dt__rec_tls;

/* A tensor's serial number, unique in the process for its lifetime and never reused (0 for
 * NULL): the tape's key for a value. Defined in layout/tensor.c. */
uint64_t dt__tensor_serial(const dt_tensor *tensor);

/* An op's public entry point brackets its implementation:
 *     dt__recorder *r = dt__rec_suspend();          (one thread-local load when idle)
 *     dt_tensor *t = NULL;
 *     dt_status st = impl(..., &t);
 *     dt__op_record rec = {...};                    (only built when r != NULL)
 *     return dt__rec_finish(r, st, &rec, t, out);
 * so that the ops its implementation calls are not recorded, and the call is recorded once. */
static inline dt__recorder *dt__rec_suspend(void)
{
    dt__recorder *r = dt__rec_tls;
    if (r)
        dt__rec_tls = NULL;
    return r;
}

/* Restores r, records rec (rec->out = t) when st is DT_OK, and writes *out = t on success;
 * on any failure t is destroyed and *out is left alone. */
static inline dt_status dt__rec_finish(dt__recorder *r, dt_status st, dt__op_record *rec,
                                       dt_tensor *t, dt_tensor **out)
{
    if (r) {
        dt__rec_tls = r;
        if (st == DT_OK) {
            rec->out = t;
            st = r->record(r, rec);
        }
    }
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

#endif
