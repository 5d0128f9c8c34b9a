/* autograd/backward: dt_tape_backward: the reverse sweep over the records, summing each
 * value's gradients in forward-use order, handing out watched gradients, and re-running the
 * forward of checkpoint segments before their backward. */
#include <stdlib.h>
#include <string.h>

#include "autograd/tape_impl.h"
#include "dtensor/ops.h"
#include "ops/ops_impl.h"
#include "runtime/error.h"

/* A contribution for use `slot` of value v (owned: taken). */
static dt_status contribute(dt_tape *tape, int64_t v, int slot, dt_tensor *g)
{
    ag_value *val = &tape->values[v];
    if (!val->contrib) {
        val->ncontrib_cap = val->nuses + 1;
        val->contrib = calloc((size_t)val->ncontrib_cap, sizeof *val->contrib);
        if (!val->contrib) {
            dt_tensor_destroy(g);
            return dt__error(DT_ERR_NO_MEMORY, "dt_tape_backward: out of memory");
        }
    }
    if (slot >= val->ncontrib_cap || val->contrib[slot]) {
        dt_tensor_destroy(g);
        return dt__error(DT_ERR_STATE, "dt_tape_backward: internal: use %d of a value twice", slot);
    }
    val->contrib[slot] = g;
    return DT_OK;
}

/* Sums v's contributions in forward-use order ((g0 + g1) + g2 ...) into *sum_out (owned,
 * NULL when there are none). */
static dt_status sum_contribs(ag_value *val, dt_tensor **sum_out)
{
    dt_tensor *acc = NULL;
    dt_status st = DT_OK;
    for (int k = 0; val->contrib && k < val->ncontrib_cap; k++) {
        dt_tensor *c = val->contrib[k];
        if (!c)
            continue;
        val->contrib[k] = NULL;
        if (!acc) {
            acc = c;
            continue;
        }
        if (dt__add_in_place(acc, c, &st)) { /* no new tensor: same bits as dt_add */
            dt_tensor_destroy(c);
            if (st != DT_OK)
                break;
            continue;
        }
        dt_tensor *s = NULL;
        st = dt_add(acc, c, NULL, &s);
        dt_tensor_destroy(acc);
        dt_tensor_destroy(c);
        acc = s;
        if (st != DT_OK)
            break;
    }
    if (st != DT_OK) {
        dt_tensor_destroy(acc);
        return st;
    }
    free(val->contrib);
    val->contrib = NULL;
    val->ncontrib_cap = 0;
    *sum_out = acc;
    return DT_OK;
}

typedef struct pass {
    dt_tape *tape;
    const dt_backward_opts *opts;
    char *reported; /* per watched index */
} pass;

/* Value v's gradient is final: sum it; a watched value's goes to its watch slot (added to the
 * accumulated one) and to the callback. */
static dt_status finalize(pass *p, int64_t v)
{
    dt_tape *tape = p->tape;
    ag_value *val = &tape->values[v];
    dt_tensor *g = NULL;
    dt_status st = sum_contribs(val, &g);
    if (st != DT_OK)
        return st;
    if (!g)
        return DT_OK;
    if (val->watch >= 0 && val->watch < tape->nwatch && tape->watch[val->watch].value == v) {
        ag_watch *w = &tape->watch[val->watch];
        dt_tensor *acc = g;
        if (w->grad && tape->opts.accumulate) {
            acc = NULL;
            st = dt_add(w->grad, g, NULL, &acc);
            if (st != DT_OK) {
                dt_tensor_destroy(g);
                return st;
            }
        }
        if (acc != g) {
            dt_tensor_destroy(g);
            g = NULL;
        }
        dt_tensor_destroy(w->grad);
        w->grad = acc;
        if (val->producer >= 0)
            val->grad = dt_tensor_retain(acc);
        p->reported[val->watch] = 1;
        if (p->opts->grad_fn)
            return p->opts->grad_fn(p->opts->grad_arg, val->watch, w->t, acc);
        return DT_OK;
    }
    val->grad = g;
    return DT_OK;
}

/* The tensor of value v for a replay: recomputed inside the segment, else the segment's
 * retained input (or, borrowed, the watched tensor now). */
static const dt_tensor *replay_input(dt_tape *tape, const ag_segment *seg, int64_t v)
{
    ag_value *val = &tape->values[v];
    if (val->recomp)
        return val->recomp;
    for (int i = 0; i < seg->ninputs; i++)
        if (seg->inputs[i] == v)
            return seg->input_t[i] ? seg->input_t[i] : val->t;
    return val->t;
}

/* Re-runs segment s's live forward calls (no recording: the backward flag is set) and gives
 * each record the tensors its rule saves, as if recorded without checkpointing. */
/* Marks the records of segment s whose outputs the backward needs (live[n - first] = 1): an
 * output a record saves, or an input of a live record. The rest (say the last projection of a
 * block, whose output only a residual add reads) is not re-run: same gradients, less work.
 * `need` is scratch, one flag per value. */
static void mark_live(dt_tape *tape, const ag_segment *seg, unsigned char *live,
                      unsigned char *need)
{
    for (int64_t n = seg->last; n >= seg->first; n--) {
        const ag_node *node = &tape->nodes[n];
        int kept = node->saved_out != NULL;
        int l = !kept && (need[node->out] || (node->rule && node->rule->save_out));
        live[n - seg->first] = (unsigned char)l;
        for (int i = 0; i < node->nin; i++)
            if (l || (node->rule && (node->rule->save_in >> i & 1)))
                need[node->in[i]] = 1;
    }
}

static dt_status recompute(dt_tape *tape, int s)
{
    ag_segment *seg = &tape->segs[s];
    int64_t len = seg->last - seg->first + 1;
    unsigned char *live = calloc((size_t)(len > 0 ? len : 1), 1);
    unsigned char *need = calloc((size_t)(tape->nvalues > 0 ? tape->nvalues : 1), 1);
    if (!live || !need) {
        free(live);
        free(need);
        return dt__error(DT_ERR_NO_MEMORY, "dt_tape_backward: out of memory");
    }
    mark_live(tape, seg, live, need);
    free(need);
    dt_status st = DT_OK;
    for (int64_t n = seg->first; n <= seg->last && st == DT_OK; n++) {
        ag_node *node = &tape->nodes[n];
        const dt_tensor *in[DT__REC_MAX_IN] = {0};
        for (int i = 0; i < node->nin; i++)
            in[i] = replay_input(tape, seg, node->in[i]);
        ag_value *ov = &tape->values[node->out];
        if (node->saved_out) {
            ov->recomp = dt_tensor_retain(node->saved_out); /* kept (selective) */
        } else if (live[n - seg->first]) {
            if (!node->rule || !node->rule->replay) {
                st = dt__error(DT_ERR_UNSUPPORTED,
                               "dt_tape_backward: %s cannot be re-run for checkpointing",
                               node->rule ? node->rule->name : dt_op_kind_name(node->kind));
                break;
            }
            dt__ag_ctx c = {.node = node,
                            .layout = node->layout,
                            .iattr = node->iattr,
                            .fattr = node->fattr,
                            .def = node->def,
                            .attrs = node->attrs,
                            .nin = node->nin,
                            .in0_layout = node->in0_layout,
                            .in0_shape = node->in0_shape,
                            .in0_dtype = node->in0_dtype};
            dt_tensor *o = NULL;
            st = node->rule->replay(&c, in, &o);
            if (st != DT_OK)
                break;
            ov->recomp = o;
            tape->recomputed++;
        }
        if (!node->rule)
            continue;
        for (int i = 0; i < node->nin; i++)
            if ((node->rule->save_in >> i & 1) && !node->saved[i]) {
                node->saved[i] = dt_tensor_retain(in[i]);
                dt__ag_hold(tape, node->in[i], in[i]);
            }
        if (node->rule->save_out && !node->saved_out && ov->recomp) {
            node->saved_out = dt_tensor_retain(ov->recomp);
            dt__ag_hold(tape, node->out, ov->recomp);
        }
    }
    free(live);
    /* The recomputed tensors live on only where a record saved them. */
    for (int64_t n = seg->first; n <= seg->last; n++) {
        ag_value *ov = &tape->values[tape->nodes[n].out];
        dt_tensor_destroy(ov->recomp);
        ov->recomp = NULL;
    }
    for (int i = 0; i < seg->ninputs; i++) {
        if (seg->input_t[i]) {
            dt__ag_unhold(tape, seg->inputs[i]);
            dt_tensor_destroy(seg->input_t[i]);
            seg->input_t[i] = NULL;
        }
    }
    return st;
}

static void release_node(dt_tape *tape, ag_node *node)
{
    for (int i = 0; i < node->nin; i++)
        if (node->saved[i]) {
            dt__ag_unhold(tape, node->in[i]);
            dt_tensor_destroy(node->saved[i]);
            node->saved[i] = NULL;
        }
    if (node->saved_out) {
        dt__ag_unhold(tape, node->out);
        dt_tensor_destroy(node->saved_out);
        node->saved_out = NULL;
    }
}

/* Runs record n's backward when its output has a gradient; hands the input gradients on. */
static dt_status run_node(pass *p, int64_t n)
{
    dt_tape *tape = p->tape;
    ag_node *node = &tape->nodes[n];
    ag_value *ov = &tape->values[node->out];
    if (!ov->grad && !ov->grad_seed)
        return DT_OK;
    const char *name = node->rule ? node->rule->name : dt_op_kind_name(node->kind);
    if (!node->rule || !node->rule->backward)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "dt_tape_backward: %s (record %lld) has no backward rule, and a "
                         "gradient reaches it",
                         name, (long long)n);
    dt__ag_ctx c = {.node = node,
                    .layout = node->layout,
                    .iattr = node->iattr,
                    .fattr = node->fattr,
                    .def = node->def,
                    .attrs = node->attrs,
                    .nin = node->nin,
                    .in0_layout = node->in0_layout,
                    .in0_shape = node->in0_shape,
                    .in0_dtype = node->in0_dtype,
                    .out = node->saved_out,
                    .dy = ov->grad,
                    .dy_is_seed = ov->grad_seed && !ov->grad,
                    .seed = ov->seed};
    dt_tensor *seed_t = NULL;
    if (c.dy_is_seed && !node->rule->scalar_dy) {
        const dt_tensor *dy = NULL;
        dt_status st = dt__ag_dy_tensor(&c, ov->t, &dy, &seed_t);
        if (st != DT_OK)
            return st;
        c.dy = dy;
        c.dy_is_seed = 0;
    }
    for (int i = 0; i < node->nin; i++) {
        const ag_value *iv = &tape->values[node->in[i]];
        c.in[i] = node->saved[i]                   ? node->saved[i]
                  : (node->rule->save_in >> i & 1) ? iv->t /* borrowed watched */
                                                   : NULL;
        c.needs[i] = iv->requires_grad;
    }
    dt_status st = node->rule->backward(&c);
    dt_tensor_destroy(seed_t);
    for (int i = 0; i < node->nin; i++) {
        dt_tensor *g = c.dx[i];
        if (!g)
            continue;
        if (st != DT_OK || !c.needs[i]) {
            dt_tensor_destroy(g);
            continue;
        }
        st = contribute(tape, node->in[i], node->use[i], g);
    }
    return st;
}

/* Checks of dt_tape_backward's arguments; *root_out the root's value. */
static dt_status check_args(dt_tape *tape, const dt_tensor *root, const dt_tensor *grad,
                            int64_t *root_out)
{
    static const char fn[] = "dt_tape_backward";
    if (!tape || !root)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, !tape ? "tape" : "root");
    if (!tape->has_recording)
        return dt__error(DT_ERR_STATE, "%s: the tape has no recording (dt_tape_begin first)", fn);
    if (tape->consumed)
        return dt__error(DT_ERR_STATE,
                         "%s: this recording has already run backward (record "
                         "again with dt_tape_begin)",
                         fn);
    if (tape->open_seg >= 0)
        return dt__error(DT_ERR_STATE, "%s: checkpoint segment %d is still open", fn,
                         tape->open_seg);
    if (tape->recording && dt_tape_current() != tape)
        return dt__error(DT_ERR_STATE, "%s: the tape records on another thread", fn);
    int64_t v = dt__ag_find(tape, root);
    if (v < 0 || !tape->values[v].requires_grad) {
        if (v < 0 && dt__ag_other_tape_has(tape, root))
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: the root was recorded on another tape",
                             fn);
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "%s: the root does not require grad on this tape (not watched, not the "
                         "output of a recorded op)",
                         fn);
    }
    if (!grad && dt_tensor_rank(root) != 0)
        return dt__error(DT_ERR_SHAPE,
                         "%s: a root of rank %d needs its gradient (grad NULL takes a rank-0 "
                         "loss)",
                         fn, dt_tensor_rank(root));
    if (grad) {
        int r = dt_tensor_rank(root);
        int same =
            dt_tensor_rank(grad) == r && dt_mesh_equal(dt_layout_mesh(dt_tensor_layout(grad)),
                                                       dt_layout_mesh(dt_tensor_layout(root)));
        for (int d = 0; same && d < r; d++)
            same = dt_tensor_shape(grad)[d] == dt_tensor_shape(root)[d];
        if (!same)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "%s: the gradient's shape or mesh differs from the root's", fn);
    }
    *root_out = v;
    return DT_OK;
}

/* The segment whose last record is n (the first one found), or -1. */
static int segment_ending_at(const dt_tape *tape, int64_t n)
{
    int s = tape->nodes[n].segment;
    return s >= 0 && tape->segs[s].last == n ? s : -1;
}

dt_status dt_tape_backward(dt_tape *tape, const dt_tensor *root, const dt_tensor *grad, float seed,
                           const dt_backward_opts *opts)
{
    int64_t rv = -1;
    dt_status st = check_args(tape, root, grad, &rv);
    if (st != DT_OK)
        return st;
    if (tape->recording) {
        tape->recording = 0;
        (void)dt_tape_end(tape);
    }
    dt_backward_opts def = DT_BACKWARD_OPTS_INIT;
    pass p = {tape, opts ? opts : &def, calloc((size_t)tape->nwatch + 1, 1)};
    if (!p.reported)
        return dt__error(DT_ERR_NO_MEMORY, "dt_tape_backward: out of memory");
    tape->consumed = 1;
    tape->recomputed = 0;
    /* Without accumulation every pass starts from no gradients (JAX's fresh gradients): a
     * watched tensor this pass does not reach keeps none, not the last pass's. */
    if (!tape->opts.accumulate)
        dt_tape_zero_grad(tape);
    dt__ag_set_backward(1);

    /* The root's gradient: one more contribution after its uses. */
    ag_value *root_v = &tape->values[rv];
    if (grad) {
        st = contribute(tape, rv, root_v->nuses, dt_tensor_retain(grad));
    } else if (root_v->nuses == 0 && root_v->watch < 0) {
        root_v->grad_seed = 1;
        root_v->seed = seed;
    } else {
        /* A seeded root that is watched or used later: materialise the seed. */
        dt__ag_ctx c = {.dy_is_seed = 1, .seed = seed};
        const dt_tensor *dy = NULL;
        dt_tensor *owned = NULL;
        st = dt__ag_dy_tensor(&c, root, &dy, &owned);
        if (st == DT_OK)
            st = contribute(tape, rv, root_v->nuses, owned);
    }
    if (st == DT_OK && root_v->first_use < 0)
        st = finalize(&p, rv);

    for (int64_t n = tape->nnodes - 1; n >= 0 && st == DT_OK; n--) {
        ag_node *node = &tape->nodes[n];
        int s = segment_ending_at(tape, n);
        if (s >= 0) {
            ag_segment *seg = &tape->segs[s];
            if (seg->opts.hook)
                st = seg->opts.hook(seg->opts.hook_arg, seg->opts.id, DT_SEGMENT_PRE);
            if (st == DT_OK && seg->opts.recompute)
                st = recompute(tape, s);
            if (st != DT_OK)
                break;
        }
        st = run_node(&p, n);
        release_node(tape, node);
        node->done = 1;
        ag_value *ov = &tape->values[node->out];
        dt_tensor_destroy(ov->grad);
        ov->grad = NULL;
        ov->grad_seed = 0;
        /* Inputs whose first use this was: their gradient is complete. */
        for (int i = 0; i < node->nin && st == DT_OK; i++) {
            int dup = 0;
            for (int j = 0; j < i; j++)
                dup |= node->in[j] == node->in[i];
            if (!dup && tape->values[node->in[i]].first_use == n)
                st = finalize(&p, node->in[i]);
        }
        if (st == DT_OK && p.opts->node_fn)
            p.opts->node_fn(p.opts->node_arg, n, node->kind);
        if (st == DT_OK && node->segment >= 0 && tape->segs[node->segment].first == n) {
            ag_segment *seg = &tape->segs[node->segment];
            if (seg->opts.hook)
                st = seg->opts.hook(seg->opts.hook_arg, seg->opts.id, DT_SEGMENT_POST);
        }
    }
    dt__ag_set_backward(0);

    if (st == DT_OK && p.opts->require_all) {
        for (int i = 0; i < tape->nwatch; i++)
            if (tape->watch[i].t && !p.reported[i]) {
                st = dt__error(DT_ERR_STATE,
                               "dt_tape_backward: watched index %d got no gradient in this "
                               "pass (require_all)",
                               i);
                break;
            }
    }
    free(p.reported);
    /* Everything of the recording is released now (also after a failure). */
    for (int64_t n = 0; n < tape->nnodes; n++) {
        release_node(tape, &tape->nodes[n]);
        tape->nodes[n].done = 1;
    }
    for (int64_t v = 0; v < tape->nvalues; v++) {
        ag_value *val = &tape->values[v];
        if (val->contrib) {
            for (int k = 0; k < val->ncontrib_cap; k++)
                dt_tensor_destroy(val->contrib[k]);
            free(val->contrib);
            val->contrib = NULL;
            val->ncontrib_cap = 0;
        }
        dt_tensor_destroy(val->grad);
        val->grad = NULL;
        dt_tensor_destroy(val->recomp);
        val->recomp = NULL;
    }
    for (int s = 0; s < tape->nsegs; s++) {
        ag_segment *seg = &tape->segs[s];
        for (int i = 0; i < seg->ninputs; i++) {
            if (seg->input_t[i]) {
                dt__ag_unhold(tape, seg->inputs[i]);
                dt_tensor_destroy(seg->input_t[i]);
                seg->input_t[i] = NULL;
            }
        }
    }
    return st;
}
