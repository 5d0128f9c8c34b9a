/* The executor: runs a schedule's steps of this client's stages in the schedule's global
 * order, calling the forward and backward callbacks and moving the boundary activations and
 * their gradients between stages (docs/pipeline.md). */
#include <stdlib.h>
#include <string.h>

#include "dtensor/relayout.h"
#include "pipeline/pipe_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"

enum { TAG_SPAN = 32768 };

typedef struct run_ctx {
    dt_pipe *pipe;
    const dt_pipe_schedule *s;
    const dt_pipe_run_opts *o;
    dt_layout **act;      /* [stages]: the boundary layout on each stage mesh */
    dt_tensor **held;     /* [2 * VP * M]: handoffs between chunks of one stage */
    int VP;
    dt_pipe_run_stats stats;
} run_ctx;

/* Tag of the message that virtual stage v receives for (micro, phase). */
static int tag_of(const run_ctx *c, int v, int micro, int phase)
{
    return (int)((((int64_t)phase * c->VP + v) * c->s->micro + micro) % TAG_SPAN);
}

static dt_tensor **held_slot(run_ctx *c, int v, int micro, int phase)
{
    return &c->held[((int64_t)phase * c->VP + v) * c->s->micro + micro];
}

/* t in the boundary layout of `stage` (f32 for gradients): itself, retained, or relayout. */
static dt_status to_boundary(run_ctx *c, int stage, dt_tensor *t, int phase, dt_tensor **out)
{
    const dt_layout *want = c->act[stage];
    dt_dtype dtype = phase == DT_PIPE_F ? c->o->act_dtype : DT_DTYPE_F32;
    if (dt_tensor_dtype(t) != dtype || dt_tensor_rank(t) != c->o->act_rank ||
        memcmp(dt_tensor_shape(t), c->o->act_shape,
               (size_t)c->o->act_rank * sizeof(int64_t)) != 0)
        return dt__error(DT_ERR_SHAPE, "dt_pipe_run: stage %d's %s has another dtype or shape "
                         "than the boundary's (%s)", stage,
                         phase == DT_PIPE_F ? "output" : "input gradient", dt_dtype_name(dtype));
    if (dt_layout_equal(dt_tensor_layout(t), want)) {
        *out = dt_tensor_retain(t);
        return DT_OK;
    }
    return dt_relayout(t, want, out);
}

/* Passes t (owned by the caller, left so) from virtual stage v to virtual stage w. */
static dt_status pass_on(run_ctx *c, int v, int w, int micro, int phase, dt_tensor *t)
{
    int P = c->s->stages, from = v % P, to = w % P;
    dt_tensor *b = NULL;
    dt_status st = to_boundary(c, from, t, phase, &b);
    if (st != DT_OK)
        return st;
    if (from == to) {
        *held_slot(c, w, micro, phase) = b;
        return DT_OK;
    }
    double t0 = dt__now_seconds();
    st = dt_pipe_send(c->pipe, from, to, b, tag_of(c, w, micro, phase));
    c->stats.comm_seconds += dt__now_seconds() - t0;
    dt_tensor_destroy(b);
    return st;
}

/* What virtual stage v gets from w for (micro, phase): received, or handed over locally. */
static dt_status take_in(run_ctx *c, int v, int w, int micro, int phase, dt_tensor **out)
{
    int P = c->s->stages, to = v % P, from = w % P;
    if (from == to) {
        dt_tensor **slot = held_slot(c, v, micro, phase);
        *out = *slot;
        *slot = NULL;
        return *out ? DT_OK : dt__error(DT_ERR_STATE, "dt_pipe_run: nothing handed to virtual "
                                        "stage %d for micro-batch %d", v, micro);
    }
    double t0 = dt__now_seconds();
    dt_status st = dt_pipe_recv(c->pipe, from, to, c->act[to],
                                phase == DT_PIPE_F ? c->o->act_dtype : DT_DTYPE_F32,
                                c->o->act_shape, tag_of(c, v, micro, phase), out);
    c->stats.comm_seconds += dt__now_seconds() - t0;
    return st;
}

static dt_status run_step(run_ctx *c, const dt_pipe_step *x, int *live)
{
    int P = c->s->stages, v = x->chunk * P + x->stage;
    int first = v == 0, last = v == c->VP - 1;
    dt_tensor *in = NULL, *out = NULL;
    dt_status st = DT_OK;
    if (x->phase == DT_PIPE_F) {
        if (!first && (st = take_in(c, v, v - 1, x->micro, DT_PIPE_F, &in)) != DT_OK)
            return st;
        double t0 = dt__now_seconds();
        st = c->o->forward(c->o->arg, x->stage, x->chunk, x->micro, in, &out);
        c->stats.busy_seconds += dt__now_seconds() - t0;
        live[x->stage]++;
        if (live[x->stage] > c->stats.peak_live)
            c->stats.peak_live = live[x->stage];
        if (st == DT_OK && !last && !out)
            st = dt__error(DT_ERR_STATE, "dt_pipe_run: the forward of virtual stage %d gave no "
                           "output for micro-batch %d", v, x->micro);
        if (st == DT_OK && !last)
            st = pass_on(c, v, v + 1, x->micro, DT_PIPE_F, out);
    } else {
        if (!last && (st = take_in(c, v, v + 1, x->micro, DT_PIPE_B, &in)) != DT_OK)
            return st;
        double t0 = dt__now_seconds();
        st = c->o->backward(c->o->arg, x->stage, x->chunk, x->micro, in, &out);
        c->stats.busy_seconds += dt__now_seconds() - t0;
        live[x->stage]--;
        if (st == DT_OK && !first && !out)
            st = dt__error(DT_ERR_STATE, "dt_pipe_run: the backward of virtual stage %d gave no "
                           "input gradient for micro-batch %d", v, x->micro);
        if (st == DT_OK && !first)
            st = pass_on(c, v, v - 1, x->micro, DT_PIPE_B, out);
    }
    c->stats.steps++;
    dt_tensor_destroy(in);
    dt_tensor_destroy(out);
    return st;
}

dt_status dt_pipe_run(dt_pipe *pipe, const dt_pipe_schedule *sched, const dt_pipe_run_opts *opts,
                      dt_pipe_run_stats *stats_out)
{
    if (!pipe || !sched || !opts)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_run: NULL argument");
    if (!opts->forward || !opts->backward || opts->act_rank < 0 ||
        (opts->act_rank > 0 && (!opts->act_specs || !opts->act_shape)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_run: the options need forward, "
                         "backward and the boundary's rank, specs and shape");
    if (sched->stages != pipe->stages)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_run: a schedule of %d stages on a "
                         "pipe of %d", sched->stages, pipe->stages);
    run_ctx c = {.pipe = pipe, .s = sched, .o = opts, .VP = sched->chunks * sched->stages};
    int P = pipe->stages;
    c.act = calloc((size_t)P, sizeof *c.act);
    c.held = calloc((size_t)2 * c.VP * sched->micro, sizeof *c.held);
    int *live = calloc((size_t)P, sizeof *live);
    dt_status st = DT_OK;
    if (!c.act || !c.held || !live) {
        st = dt__error(DT_ERR_NO_MEMORY, "dt_pipe_run: no memory");
        goto out;
    }
    for (int s = 0; s < P && st == DT_OK; s++)
        if (pipe->holds[s])
            st = dt_layout_create(pipe->stage_mesh[s], opts->act_rank, opts->act_specs, &c.act[s]);
    double start = dt__now_seconds();
    int64_t total = dt_pipe_schedule_total_steps(sched);
    for (int64_t i = 0; i < total && st == DT_OK; i++) {
        const dt_pipe_step *x = &sched->order[i];
        if (pipe->holds[x->stage])
            st = run_step(&c, x, live);
    }
    double t0 = dt__now_seconds();
    dt_status fst = dt_pipe_flush(pipe);
    c.stats.comm_seconds += dt__now_seconds() - t0;
    if (st == DT_OK)
        st = fst;
    c.stats.wall_seconds = dt__now_seconds() - start;
out:
    if (c.held)
        for (int64_t i = 0; i < (int64_t)2 * c.VP * sched->micro; i++)
            dt_tensor_destroy(c.held[i]);
    if (c.act)
        for (int s = 0; s < P; s++)
            dt_layout_destroy(c.act[s]);
    free(c.held);
    free(c.act);
    free(live);
    if (st == DT_OK && stats_out)
        *stats_out = c.stats;
    return st;
}
