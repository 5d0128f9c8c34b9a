/* ops/opdef_call: the one generic path of every defined op: check the inputs, take the
 * propagator's decision (cached), relay the inputs out, run the kernel of the mesh's device
 * kind on every local block, record the call; and the tape's backward and replay of such
 * calls. */
#include <string.h>

#include "ops/opdef_impl.h"
#include "runtime/error.h"

static const dt_op_attrs zero_attrs;

/* Checks a call and fills its signature and the propagator's view of it. */
static dt_status begin(const dt_op *op, const dt_tensor *const *in, int nin,
                       const dt_op_attrs *attrs, const dt_layout *layout, dt_op_sig *sig,
                       dt__prop_call *call, dt__lspec *forced)
{
    if (!op)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_call: op is NULL");
    const dt_op_def *def = dt_op_definition(op);
    int nmax = def->nin_max > def->nin ? def->nin_max : def->nin;
    if (nin < def->nin || nin > nmax || (nin > 0 && !in))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: takes %d%s%d inputs, %d given",
                         def->name, def->nin, nmax > def->nin ? ".." : "",
                         nmax > def->nin ? nmax : def->nin, nin);
    const dt_mesh *mesh = NULL;
    for (int i = 0; i < nin; i++) {
        if (!in[i])
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: input %d is NULL", def->name, i);
        const dt_mesh *m = dt_layout_mesh(dt_tensor_layout(in[i]));
        if (!mesh)
            mesh = m;
        else if (m != mesh && !dt_mesh_equal(m, mesh))
            return dt__error(DT_ERR_SHAPE, "%s: input %d is on another mesh than input 0",
                             def->name, i);
    }
    if (layout) {
        const dt_mesh *m = dt_layout_mesh(layout);
        if (mesh && m != mesh && !dt_mesh_equal(m, mesh))
            return dt__error(DT_ERR_SHAPE, "%s: the requested layout is on another mesh than "
                             "the inputs", def->name);
        if (!mesh)
            mesh = m;
    }
    if (!mesh)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: an op without inputs needs the output "
                         "layout", def->name);
    memset(sig, 0, sizeof *sig);
    sig->op = op;
    sig->nin = nin;
    sig->attrs = attrs;
    sig->user = def->user;
    memset(call, 0, sizeof *call);
    for (int i = 0; i < nin; i++) {
        sig->in[i].dtype = dt_tensor_dtype(in[i]);
        sig->in[i].rank = dt_tensor_rank(in[i]);
        memcpy(sig->in[i].dim, dt_tensor_shape(in[i]),
               sizeof(int64_t) * (size_t)sig->in[i].rank);
        dt__lspec_of(dt_tensor_layout(in[i]), &call->in[i]);
    }
    call->op = op;
    call->def = def;
    call->mesh = mesh;
    call->sig = sig;
    if (layout) {
        dt__lspec_of(layout, forced);
        call->forced = forced;
    }
    return DT_OK;
}

/* The decision for a call: from the cache, else made and kept. */
static dt_status decide(const dt__prop_call *call, dt__decision *d)
{
    const dt_op_def *def = call->def;
    int explain = dt__explain_on();
    if (explain) {
        char text[1024];
        size_t n = 0;
        for (int i = 0; i < call->sig->nin && n < sizeof text; i++) {
            char ls[160];
            dt__lspec_text(call->mesh, &call->in[i], ls, sizeof ls);
            n += (size_t)snprintf(text + n, sizeof text - n, "%s%s", i ? ", " : "", ls);
        }
        dt__explain("%s: inputs %s", def->name, call->sig->nin ? text : "(none)");
    }
    if (dt__prop_cache_get(call, d)) {
        if (explain) {
            char ol[160];
            dt__lspec_text(call->mesh, &d->out, ol, sizeof ol);
            dt__explain("  taken: %s (cached), cost %.2f us", ol, d->cost);
        }
        return DT_OK;
    }
    const dt__rule *rule = dt__op_fixed_rule(call->op);
    dt__rule r;
    if (!rule) {
        char text[512];
        text[0] = 0;
        dt_status st = def->rule_fn(call->sig, text, sizeof text);
        if (st != DT_OK)
            return st;
        st = dt__rule_parse(def->name, text, call->sig->nin, &r);
        if (st != DT_OK)
            return st;
        rule = &r;
        if (explain)
            dt__explain("  rule %s", text);
    } else if (explain) {
        dt__explain("  rule %s", def->rule);
    }
    dt_status st = dt__prop_decide(call, rule, d);
    if (st != DT_OK)
        return st;
    if (call->forced && call->forced->rank != d->out_shape.rank)
        return dt__error(DT_ERR_SHAPE, "%s: the requested layout has rank %d, the output %d",
                         def->name, call->forced->rank, d->out_shape.rank);
    dt__prop_cache_put(call, d);
    return DT_OK;
}

static void buf_of(const dt_tensor *t, int i, dt_op_buf *b)
{
    const DLTensor *dl = dt_tensor_local(t, i);
    const int64_t *off = dt_tensor_local_offset(t, i);
    const int64_t *g = dt_tensor_shape(t);
    b->data = dt__local_data(t, i);
    b->dtype = dt_tensor_dtype(t);
    b->rank = dt_tensor_rank(t);
    for (int d = 0; d < b->rank; d++) {
        b->shape[d] = dl ? dl->shape[d] : 0;
        b->offset[d] = off ? off[d] : 0;
        b->global[d] = g[d];
    }
}

typedef struct run_ctx {
    const dt__ops_backend *be;
    const dt_op_def *def;
    const dt_op_attrs *attrs;
    int nin;
    dt_tensor *const *in;
    dt_tensor *out;
    int partial;
} run_ctx;

static dt_status run_local(int i, void *arg)
{
    const run_ctx *c = arg;
    if (dt__local_numel(c->out, i) == 0)
        return DT_OK;
    dt_op_kernel_args a;
    memset(&a, 0, sizeof a);
    a.attrs = *c->attrs;
    a.nin = c->nin;
    for (int k = 0; k < c->nin; k++)
        buf_of(c->in[k], i, &a.in[k]);
    buf_of(c->out, i, &a.out);
    a.partial = c->partial;
    const DLTensor *dl = dt_tensor_local(c->out, i);
    a.ordinal = dl ? dl->device.device_id : 0;
    a.user = c->def->user;
    return c->be->run_def(c->def, &a);
}

static dt_status call_impl(const dt_op *op, const dt_tensor *const *in, int nin,
                           const dt_op_attrs *attrs, const dt_layout *layout, dt_tensor **out)
{
    dt_op_sig sig;
    dt__prop_call call;
    dt__lspec forced;
    dt_status st = begin(op, in, nin, attrs, layout, &sig, &call, &forced);
    if (st != DT_OK)
        return st;
    const dt_op_def *def = call.def;
    dt__decision d;
    if ((st = decide(&call, &d)) != DT_OK)
        return st;
    const dt__ops_backend *be = NULL;
    if ((st = dt__ops_backend_for(call.mesh, def->name, &be)) != DT_OK)
        return st;
    dt_tensor *tin[DT_OP_MAX_IN] = {0};
    dt_tensor *t = NULL;
    for (int i = 0; i < nin && st == DT_OK; i++)
        st = dt__ensure_layout(in[i], &d.in[i], &tin[i]);
    if (st == DT_OK)
        st = dt__tensor_new(call.mesh, &d.out, d.out_shape.dtype, d.out_shape.dim, &t);
    if (st == DT_OK) {
        run_ctx c = {be, def, attrs, nin, tin, t, d.partial_kernel};
        st = dt__ops_each_local(be, t, run_local, &c);
    }
    for (int i = 0; i < nin; i++)
        dt_tensor_destroy(tin[i]);
    return dt__ops_finish(be, def->name, layout, st, &t, out);
}

dt_status dt_op_call(const dt_op *op, const dt_tensor *const *in, int nin,
                     const dt_op_attrs *attrs, const dt_layout *layout, dt_tensor **out)
{
    if (!out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_call: out is NULL");
    const dt_op_attrs *a = attrs ? attrs : &zero_attrs;
    const dt_op_def *def = op ? dt_op_definition(op) : NULL;
    if (def && def->spmd) { /* its own path, which records itself */
        dt_op_sig sig;
        dt__prop_call call;
        dt__lspec forced;
        dt_status st = begin(op, in, nin, a, layout, &sig, &call, &forced);
        if (st != DT_OK)
            return st;
        if (dt__explain_on())
            dt__explain("%s: its own distributed implementation (rule %s)", def->name,
                        def->rule ? def->rule : "per call");
        return def->spmd(in, nin, a, layout, out);
    }
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = call_impl(op, in, nin, a, layout, &t);
    if (!r) {
        if (st == DT_OK)
            *out = t;
        return st;
    }
    dt__op_record rec;
    memset(&rec, 0, sizeof rec);
    rec.kind = DT_OP_DEFINED;
    rec.nin = nin;
    for (int i = 0; i < nin; i++)
        rec.in[i] = in[i];
    rec.layout = layout;
    rec.rule = op ? dt__op_tape_rule(op) : NULL;
    rec.def = op;
    rec.attrs = a;
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt_op_plan(const dt_op *op, const dt_tensor *const *in, int nin,
                     const dt_op_attrs *attrs, const dt_layout *layout,
                     dt_layout **in_layouts_out, dt_layout **out_layout_out)
{
    if (!out_layout_out || (nin > 0 && !in_layouts_out))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_plan: an output pointer is NULL");
    dt_op_sig sig;
    dt__prop_call call;
    dt__lspec forced;
    const dt_op_attrs *a = attrs ? attrs : &zero_attrs;
    dt_status st = begin(op, in, nin, a, layout, &sig, &call, &forced);
    if (st == DT_OK && call.def->spmd)
        return dt__error(DT_ERR_UNSUPPORTED, "dt_op_plan: %s decides its layouts itself (its "
                         "own distributed implementation)", call.def->name);
    dt__decision d;
    if (st == DT_OK)
        st = decide(&call, &d);
    if (st != DT_OK)
        return st;
    dt_layout *ls[DT_OP_MAX_IN + 1] = {0};
    for (int i = 0; i <= nin && st == DT_OK; i++)
        st = dt__lspec_layout(call.mesh, i < nin ? &d.in[i] : &d.out, &ls[i]);
    if (st != DT_OK) {
        for (int i = 0; i <= nin; i++)
            dt_layout_destroy(ls[i]);
        return st;
    }
    for (int i = 0; i < nin; i++)
        in_layouts_out[i] = ls[i];
    *out_layout_out = ls[nin];
    return DT_OK;
}

/* ---- built-in wrappers -------------------------------------------------------------------- */

dt_status dt__op_run(const dt_op_def *def, const dt_tensor *const *in, int nin,
                     const dt_op_attrs *attrs, const dt_layout *layout, dt_tensor **out)
{
    const dt_op *op = dt__op_builtin(def);
    if (!op)
        return dt__op_builtin_error(def);
    return dt_op_call(op, in, nin, attrs, layout, out);
}

dt_status dt__op_run1(const dt_op_def *def, const dt_tensor *x, const dt_op_attrs *attrs,
                      dt_tensor **out)
{
    const dt_tensor *in[1] = {x};
    return dt__op_run(def, in, 1, attrs, NULL, out);
}

dt_status dt__op_run2(const dt_op_def *def, const dt_tensor *a, const dt_tensor *b,
                      const dt_op_attrs *attrs, dt_tensor **out)
{
    const dt_tensor *in[2] = {a, b};
    return dt__op_run(def, in, 2, attrs, NULL, out);
}

/* ---- the tape's rule for defined ops ------------------------------------------------------ */

dt_status dt__opdef_backward(dt__ag_ctx *c)
{
    const dt_op *op = c->def;
    const dt_op_def *def = dt_op_definition(op);
    dt_op_grad g = {op, c->attrs, c->nin, c->in, c->out, c->dy, c->needs, c->dx, def->user};
    dt_status st = def->backward(&g);
    if (st != DT_OK)
        return st;
    for (int i = 0; i < c->nin; i++) {
        if (!c->dx[i])
            continue;
        const dt_tensor *x = c->in[i];
        int same = x && dt_tensor_rank(c->dx[i]) == dt_tensor_rank(x);
        for (int d = 0; same && d < dt_tensor_rank(x); d++)
            same = dt_tensor_shape(c->dx[i])[d] == dt_tensor_shape(x)[d];
        if (!same)
            return dt__error(DT_ERR_SHAPE, "%s: its backward gave input %d a gradient of "
                             "another shape than the input's", def->name, i);
    }
    return DT_OK;
}

dt_status dt__opdef_replay(const dt__ag_ctx *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_op_call(c->def, in, c->nin, c->attrs, c->layout, out);
}
