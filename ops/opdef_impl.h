/* ops/ private header of the op definitions: the built-in definition tables of each family
 * file, the generic call path's entry for them, and helpers shared by the definition files.
 * Not installed. */
#ifndef DTENSOR_OPDEF_IMPL_H
#define DTENSOR_OPDEF_IMPL_H

#include <stdint.h>

#include "dtensor/dtensor.h"
#include "dtensor/opdef.h"
#include "dtensor/ops_general.h"

/* The built-in definitions, one NULL-terminated table per family file (ops/def_*.c); the
 * registry (ops/opdef_registry.c) registers them, in this order, before any other op. */
extern const dt_op_def *const dt__defs_elem[];   /* ops/def_elem.c: unary, binary, random */
extern const dt_op_def *const dt__defs_reduce[]; /* ops/def_reduce.c: reductions, linear */
extern const dt_op_def *const dt__defs_shape[];  /* ops/def_shape.c: shape, index, host */
extern const dt_op_def *const dt__defs_core[];   /* ops/def_core.c: the transformer ops */
extern const dt_op_def *const dt__defs_decode[]; /* ops/def_decode.c: rope_half, cached attn */
extern const dt_op_def *const dt__defs_moe[];    /* ops/def_moe.c: grouped GEMM of the experts */

/* The handle of a built-in definition (registers the built-ins on first use; NULL for a
 * definition that is not one of them). Thread-safe. */
const dt_op *dt__op_builtin(const dt_op_def *def);

/* dt_op_call on a built-in definition: what every public wrapper calls. */
dt_status dt__op_run(const dt_op_def *def, const dt_tensor *const *in, int nin,
                     const dt_op_attrs *attrs, const dt_layout *layout, dt_tensor **out);
/* One- and two-input shorthands with attributes (attrs may be NULL: all zero). */
dt_status dt__op_run1(const dt_op_def *def, const dt_tensor *x, const dt_op_attrs *attrs,
                      dt_tensor **out);
dt_status dt__op_run2(const dt_op_def *def, const dt_tensor *a, const dt_tensor *b,
                      const dt_op_attrs *attrs, dt_tensor **out);

/* An axis in -rank..rank-1 made 0..rank-1; -1 when out of range. */
static inline int dt__op_axis(int axis, int rank)
{
    if (axis < 0)
        axis += rank;
    return axis >= 0 && axis < rank ? axis : -1;
}

/* Elements of a buffer, and of a shape. */
static inline int64_t dt__op_numel(const dt_op_buf *b)
{
    int64_t n = 1;
    for (int i = 0; i < b->rank; i++)
        n *= b->shape[i];
    return n;
}

/* The factor letters for dims 0..rank-1 of a rule written by a rule_fn: 'a' + i. */
static inline char dt__op_letter(int i)
{
    return (char)('a' + i);
}

/* ==== the generic path's internals (ops/opdef_*.c) ===================================== */

#include "runtime/record.h"
#include "ops/ops_impl.h"

/* Factor ids: 'a'..'z' are 0..25, 'A'..'Z' 26..51 (whole: never sharded), and the dims of
 * "..." 52..59, counted from the right (52 is the last dim of the ellipsis). */
#define DT__F_MAX 60
#define DT__F_ELL 52

typedef struct dt__rdim {
    int nf;                 /* factors of the dim, major first (more than 1: compound) */
    uint8_t f[DT_MAX_RANK];
} dt__rdim;

typedef struct dt__roperand {
    int ndims;              /* named dims (the ellipsis excluded) */
    int ell;                /* index in dim[] before which "..." stands, -1 when none */
    dt__rdim dim[DT_MAX_RANK];
} dt__roperand;

/* A parsed rule: nin input operands, then the output (op[nin]). */
typedef struct dt__rule {
    int nin;
    dt__roperand op[DT_OP_MAX_IN + 1];
} dt__rule;

/* DT_ERR_PARSE naming `who`, the rule and the column on a malformed rule; nin (the op's
 * inputs) tells a rank-0 input from none in a rule starting with "->". */
dt_status dt__rule_parse(const char *who, const char *text, int nin, dt__rule *out);

/* A rule bound to one call's ranks and shapes: every dim of every operand (inputs, then the
 * output at index nin) as factor ids, the broadcast dims, and the factors' sizes. */
typedef struct dt__bound {
    int nops;
    int rank[DT_OP_MAX_IN + 1];
    dt__rdim dim[DT_OP_MAX_IN + 1][DT_MAX_RANK];
    uint8_t bcast[DT_OP_MAX_IN + 1][DT_MAX_RANK];
    int64_t fsize[DT__F_MAX];
    uint64_t in_inputs, in_output; /* bit f: the factor appears in an input / the output */
} dt__bound;

/* Binds `rule` to the inputs' shapes and (out != NULL) the output's; with out == NULL the
 * output's rank and shape come from the factors (*out_shape filled). DT_ERR_SHAPE naming the
 * op and the operands on a mismatch. */
dt_status dt__rule_bind(const char *who, const dt__rule *rule, const dt_op_sig *sig,
                        const dt_op_shape *out, dt__bound *b, dt_op_shape *out_shape);

/* The propagator's decision for one call. */
typedef struct dt__decision {
    dt__lspec in[DT_OP_MAX_IN];
    dt__lspec out;
    dt_op_shape out_shape;
    int partial_kernel; /* a contracting factor is sharded */
    double cost;
} dt__decision;

/* A call's inputs as the propagator sees them. */
typedef struct dt__prop_call {
    const dt_op *op;
    const dt_op_def *def;
    const dt_mesh *mesh;
    const dt_op_sig *sig;
    dt__lspec in[DT_OP_MAX_IN];
    const dt__lspec *forced; /* the caller's output layout, or NULL */
} dt__prop_call;

/* Decides (no cache): binds the rule, enumerates the candidates, costs them (explaining
 * them when explanations are on) and writes the cheapest. */
dt_status dt__prop_decide(const dt__prop_call *call, const dt__rule *rule, dt__decision *out);

/* The decision cache (ops/opdef_prop.c): looks up / inserts by the call's key. */
int dt__prop_cache_get(const dt__prop_call *call, dt__decision *out);
void dt__prop_cache_put(const dt__prop_call *call, const dt__decision *d);

/* The registry's view of a handle: its definition, its parsed fixed rule (NULL when per
 * call), its index, and the tape's rule for its calls. */
const dt__rule *dt__op_fixed_rule(const dt_op *op);
const char *dt__op_name(const dt_op *op);
const dt__ag_rule *dt__op_tape_rule(const dt_op *op);
/* The status (and message) of a built-in that did not register. */
dt_status dt__op_builtin_error(const dt_op_def *def);
/* The tape's generic rule functions for defined ops (ops/opdef_call.c). */
dt_status dt__opdef_backward(dt__ag_ctx *c);
dt_status dt__opdef_replay(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out);

/* Explanations (ops/opdef_explain.c): whether they are on, and one formatted line. */
int dt__explain_on(void);
void dt__explain(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A layout spec in the text form the explanations print ("[x,-] partial y"). */
void dt__lspec_text(const dt_mesh *mesh, const dt__lspec *ls, char *buf, size_t len);

/* The cost model's current constants. */
void dt__cost_model_get(dt_op_cost_model *out);

/* The backward rules of the built-in kinds (dt_op_kind), by family (ops/rules_*.c). */
extern const dt__ag_rule dt__ag_rule_matmul, dt__ag_rule_matmul_nd, dt__ag_rule_add,
    dt__ag_rule_sub, dt__ag_rule_mul, dt__ag_rule_scale, dt__ag_rule_bias_add;
extern const dt__ag_rule dt__ag_rule_layer_norm, dt__ag_rule_softmax, dt__ag_rule_attention,
    dt__ag_rule_embedding, dt__ag_rule_vocab_xent, dt__ag_rule_softmax_xent, dt__ag_rule_gelu,
    dt__ag_rule_relu;
extern const dt__ag_rule dt__ag_rule_cast, dt__ag_rule_relayout, dt__ag_rule_reduce;
extern const dt__ag_rule dt__ag_rule_rms_norm, dt__ag_rule_rope, dt__ag_rule_swiglu,
    dt__ag_rule_attention_gqa;

#endif
