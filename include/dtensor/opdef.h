/* libdtensor op definitions: one definition per op (built-in or user-defined) that every
 * consumer reads (the generic call path, the propagator, the tape, the docs' table and the
 * validator), its factor sharding rule, and the propagator's explanations (docs/ops.md,
 * "Definitions"). */
#ifndef DTENSOR_OPDEF_H
#define DTENSOR_OPDEF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtensor/dtype.h"
#include "dtensor/export.h"
#include "dtensor/layout.h"
#include "dtensor/runtime.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_OP_MAX_IN 8     /* inputs of one op (variadic public calls compose) */
#define DT_OP_MAX_IATTR 32 /* integer attributes */
#define DT_OP_MAX_FATTR 4  /* floating-point attributes */
#define DT_OP_MAX_SATTR 64 /* one string attribute (an einsum equation), NUL included */

/* A call's attributes, by value (copied into the tape's record and the decision cache's key).
 * Their meaning is the op's own (each built-in op's comment in ops_general.h says which slot
 * holds what). Initialise with DT_OP_ATTRS_INIT: unused slots must be zero (they are part of
 * the cache key). */
typedef struct dt_op_attrs {
    int64_t i[DT_OP_MAX_IATTR];
    double f[DT_OP_MAX_FATTR];
    char s[DT_OP_MAX_SATTR];
} dt_op_attrs;
#define DT_OP_ATTRS_INIT {{0}, {0}, {0}}

/* A tensor's type and global shape as the shape and rule functions see it. */
typedef struct dt_op_shape {
    dt_dtype dtype;
    int rank;
    int64_t dim[DT_MAX_RANK];
} dt_op_shape;

typedef struct dt_op dt_op; /* a registered definition; lives until the process ends */

/* What an op's rule and shape functions see of one call. */
typedef struct dt_op_sig {
    const dt_op *op;
    int nin;
    dt_op_shape in[DT_OP_MAX_IN];
    const dt_op_attrs *attrs;
    void *user; /* the definition's user pointer */
} dt_op_sig;

/* One local block as a kernel sees it: contiguous row-major memory of the device kind the
 * kernel is for, its local shape, the block's offset in the global tensor and the global
 * shape (random and index-producing ops need them). An input dim that is broadcast against
 * the output keeps its size 1. */
typedef struct dt_op_buf {
    void *data;
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK];
    int64_t offset[DT_MAX_RANK];
    int64_t global[DT_MAX_RANK];
} dt_op_buf;

/* A kernel's arguments for one local device. The kernel writes every element of out.
 * `partial` is 1 when a contracting factor of the rule is sharded on this call (the kernel
 * then reduces over its local slice only; the sum, max or min over the devices is left
 * pending in the output's layout), `ordinal` the device's ordinal of its kind. */
typedef struct dt_op_kernel_args {
    dt_op_attrs attrs;
    int nin;
    dt_op_buf in[DT_OP_MAX_IN];
    dt_op_buf out;
    int partial;
    int ordinal;
    void *user;
} dt_op_kernel_args;

typedef dt_status (*dt_op_kernel_fn)(const dt_op_kernel_args *args);

/* What a backward function sees: the forward call's inputs and (with save_out) its output,
 * attributes, the output's gradient dy (a tensor, never NULL) and which inputs need a
 * gradient. It writes dx[i] (a new owned tensor of input i's shape, in any layout on its mesh;
 * NULL: zero) for the inputs with needs[i], by calling public ops (they are not recorded). */
typedef struct dt_op_grad {
    const dt_op *op;
    const dt_op_attrs *attrs;
    int nin;
    const dt_tensor *const *in;
    const dt_tensor *out; /* NULL unless the definition has save_out */
    const dt_tensor *dy;
    const int *needs;
    dt_tensor **dx;
    void *user;
} dt_op_grad;

/* How sum-partial inputs go through an op without being reduced first (PyTorch's Partial,
 * TF DTensor's reduction pending): NONE (every partial input is reduced first), MULTILINEAR
 * (the op is linear in each input of `linear_in`: one of them may be partial over a mesh dim
 * if every other input is replicated there, e.g. mul, einsum, reshape, sum, gather's data),
 * ADDITIVE (linear in all inputs of `linear_in` jointly: they pass through when all are partial
 * over the same mesh dims, e.g. add, sub, concat). */
typedef enum dt_op_linearity {
    DT_OP_LINEAR_NONE = 0,
    DT_OP_LINEAR_MULTI = 1,
    DT_OP_LINEAR_ADDITIVE = 2,
} dt_op_linearity;

/* The definition of an op. Registered by dt_op_register (copied; the strings and functions
 * must stay valid). Fields:
 *  name      unique, [a-z0-9_.]; user ops should use a prefix ("myproj.gate").
 *  nin       inputs (1..DT_OP_MAX_IN); nin_max > nin allows nin..nin_max (0: exactly nin).
 *  rule      the factor sharding rule (docs/ops.md, "Factor rules"), or NULL and rule_fn
 *            writes it per call (into buf, len bytes).
 *            Grammar: operands '->' operand; operands separated by ','; an operand is a list
 *            of dims: a factor letter, '...' (the leading dims, NumPy-broadcast between the
 *            operands), or a compound dim '(' letters ')' (major first, as a reshape merges
 *            them). Lowercase factors may be sharded; uppercase ones must be whole on every
 *            device (softmax's axis). A factor of an input missing from the output contracts:
 *            sharded, it makes the output partial with `reduce`. A factor only in the output
 *            is new (unsharded). An input dim of size 1 whose factor is larger broadcasts.
 *            Examples: "ij,jk->ik" (matmul), "...,...->..." (add), "...K->...K" (softmax on
 *            the last axis), "...i->..." (sum on the last axis), "(ij)k->ijk" (reshape).
 *  infer     the output's dtype and shape from the inputs' (and checks them: DT_ERR_SHAPE or
 *            DT_ERR_INVALID_ARGUMENT naming the op and the operands); NULL: input 0's dtype
 *            and every output factor's size.
 *  cpu       the kernel on host memory (required).
 *  cuda      the kernel on CUDA device memory; NULL: on CUDA meshes the inputs are copied to
 *            host memory, the CPU kernel runs, and the output is copied back (correct, slow;
 *            the simulated GPU always runs the CPU kernel on its stream).
 *  backward  NULL: not differentiable (a gradient reaching it is DT_ERR_UNSUPPORTED).
 *  linearity, linear_in (bit i: input i), reduce (DT_REDUCE_SUM, _MAX or _MIN: what a
 *            sharded contracting factor leaves pending).
 *  save_out  1: the tape keeps the output for backward (exp, softmax); inputs are always kept.
 *  user      handed to every function above.
 *  doc       one line for the docs' table and the validator's messages (may be NULL).
 *  family    the docs' op family ("unary", "binary", "reduction", "shape", "index", ...).
 *  spmd      an op with its own distributed implementation (the transformer ops, whose fused
 *            collectives a factor rule does not express: the vocabulary-parallel loss, ring
 *            attention): dt_op_call calls it instead of the generic path (cpu may then be
 *            NULL; it records itself on a tape, and backward only marks it differentiable); its
 *            rule documents the layouts it keeps.
 *  sample    the validator's random cases (docs/ops.md, "Validator"): for case `seed`, fills
 *            sig->nin and sig->in[] (dtypes, ranks and shapes; every dim in 1..max_dim) and
 *            *attrs with a valid call; NULL: the validator skips the op (random ops, host
 *            transfers).
 *  fill      the validator's values of input i (n elements of its dtype into host) when they
 *            are not plain reals (indices in range, masks, positive bases); NULL, or
 *            DT_ERR_UNSUPPORTED for an input it leaves alone: uniform reals in [-1, 1].
 *            sample may return DT_ERR_UNSUPPORTED for a seed it does not cover (the case is
 *            skipped). The validator widens f32 inputs to f64 when infer accepts that. */
typedef struct dt_op_def {
    const char *name;
    int nin, nin_max;
    const char *rule;
    dt_status (*rule_fn)(const dt_op_sig *sig, char *buf, size_t len);
    dt_status (*infer)(const dt_op_sig *sig, dt_op_shape *out);
    dt_op_kernel_fn cpu;
    dt_op_kernel_fn cuda;
    dt_status (*backward)(const dt_op_grad *grad);
    dt_op_linearity linearity;
    unsigned linear_in;
    dt_reduce_op reduce;
    int save_out;
    void *user;
    const char *doc;
    const char *family;
    dt_status (*spmd)(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                      const dt_layout *layout, dt_tensor **out);
    dt_status (*sample)(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs);
    dt_status (*fill)(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n);
} dt_op_def;

/* For an op's own functions (infer, rule_fn, kernels, backward): returns st after setting
 * this thread's dt_last_error text (printf format), as the library's own errors do, so that
 * the caller of dt_op_call reads why: return dt_op_error(DT_ERR_SHAPE, "myop: x has rank
 * %d, 2 expected", r). Local; thread-safe. */
DT_API dt_status dt_op_error(dt_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Registers a definition (copied) and hands back its handle. DT_ERR_INVALID_ARGUMENT for a
 * missing name, cpu kernel or rule, a bad nin, or a name already taken; DT_ERR_PARSE for a
 * fixed rule that does not parse (message: the rule and the column). Thread-safe; local. */
DT_API dt_status dt_op_register(const dt_op_def *def, const dt_op **op_out);

/* The op named `name` (built-in or registered), or NULL. Local. */
DT_API const dt_op *dt_op_find(const char *name);
/* The definition behind a handle (borrowed). Local. */
DT_API const dt_op_def *dt_op_definition(const dt_op *op);
/* The number of registered ops, and the i-th in registration order (built-ins first). */
DT_API int dt_op_count(void);
DT_API const dt_op *dt_op_at(int i);

/* Calls `op` on nin tensors of one mesh: checks them (infer), picks the output layout and
 * the inputs' relayouts (the propagator: docs/ops.md, "Propagation"), relays the inputs out,
 * runs the kernel of the mesh's device kind on every local block, and records the call on a
 * recording tape (autograd.h). `layout` (may be NULL) forces the output layout; NULL takes
 * the propagator's choice, which may be partial. The output is a new owned tensor, written
 * only on success. Collective over the mesh's clients. DT_ERR_INVALID_ARGUMENT (NULL
 * arguments, wrong input count), DT_ERR_SHAPE (infer, different meshes), the kernel's status,
 * and dt_relayout's (DT_ERR_COMM). */
DT_API dt_status dt_op_call(const dt_op *op, const dt_tensor *const *in, int nin,
                            const dt_op_attrs *attrs, const dt_layout *layout,
                            dt_tensor **out);

/* The propagator's decision for a call, without running it: the inputs' layouts the kernel
 * will see (in_layouts_out[i], owned) and the output's (owned). Local (no communication). */
DT_API dt_status dt_op_plan(const dt_op *op, const dt_tensor *const *in, int nin,
                            const dt_op_attrs *attrs, const dt_layout *layout,
                            dt_layout **in_layouts_out, dt_layout **out_layout_out);

/* Explanations: when on, every dt_op_call writes one block per call to `stream` (or hands
 * each line to fn when fn is set): the op, the input layouts, every candidate the propagator
 * considered with its cost (microseconds: latency + bytes / bandwidth per relayout, plus the
 * compute of the local blocks), the one taken, and whether the decision came from the cache.
 * DT_EXPLAIN=1 at dt_init turns it on to stderr. Process-wide; returns the previous state. */
typedef void (*dt_explain_fn)(void *arg, const char *line);
DT_API int dt_explain_set(int on, FILE *stream, dt_explain_fn fn, void *arg);

/* Cost model constants (docs/ops.md, "Cost model"): per relayout, latency_us for each mesh
 * dim it communicates over plus bytes / (gbps * 1e3) microseconds; per call, the local output
 * elements / (compute_gelem_s * 1e3). Process-wide; a field <= 0 keeps its value. */
typedef struct dt_op_cost_model {
    double latency_us;
    double gbps;
    double compute_gelem_s;
} dt_op_cost_model;
DT_API void dt_op_cost_model_set(const dt_op_cost_model *model, dt_op_cost_model *old_out);

/* The validator (docs/ops.md, "Validator"): runs op's random cases (its definition's sample
 * and fill) on meshes of 1, 2, 2x2 and 2x2x2 devices of `device_type` (those the job's global
 * devices allow; in one process or over several) with random input layouts (sharded,
 * replicated, sum-partial over every mesh dim) and checks the output, and the backward of a
 * random dy through a tape, against the same call on an unsharded single-device layout; and
 * that single-device gradient against central finite differences in f64 (when the op takes
 * f64). Each failure is one line to `report` naming the op, the case, the shapes and the
 * layouts. Tolerances: f64 1e-10 and f32 2e-5 of the largest magnitude (sums are reordered
 * across shards), finite differences 1e-6 relative with a step of 1e-5 (docs/ops.md derives
 * them). Collective over all clients (each calls it with the same arguments); returns DT_OK
 * with failures counted in *result_out, or the first error of the runtime itself. An op
 * without sample is skipped (result->skipped). */
typedef struct dt_validate_opts {
    uint64_t seed;   /* the first case's seed */
    int cases;       /* random cases per op */
    int layouts;     /* random input layouts per mesh and case */
    int max_dim;     /* dims drawn in 1..max_dim */
    int fd_elems;    /* input elements checked by finite differences per input (0: none) */
    dt_device_type device_type;
    dt_explain_fn report; /* failures, one line each (NULL: only counted) */
    void *report_arg;
} dt_validate_opts;
#define DT_VALIDATE_OPTS_INIT {1, 2, 2, 5, 12, DT_DEVICE_CPU, NULL, NULL}

typedef struct dt_validate_result {
    int64_t cases;    /* cases run */
    int64_t checks;   /* comparisons made */
    int64_t failures; /* comparisons (or calls) that failed */
    int64_t skipped;  /* ops or cases skipped (no sample, unsupported dtype) */
} dt_validate_result;

DT_API dt_status dt_op_validate(const dt_op *op, const dt_validate_opts *opts,
                                dt_validate_result *result_out);

/* Decisions cached so far, and a reset (tests, benchmarks). Local. */
DT_API int64_t dt_op_cache_size(void);
DT_API void dt_op_cache_clear(void);

#ifdef __cplusplus
}
#endif
#endif
