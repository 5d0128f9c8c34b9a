/* gpt/pipe: the GPT through the pipeline executor (see pipe.h and docs/pipeline.md). */
#include "pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CHUNKS 4
#define MAX_STAGES 64
#define IN_INDEX 100000 /* the tape's index of a stage's input activation */
#define EVAL_TAG 30000  /* + virtual stage: gpt_pipe_eval's transfers (the executor's are
                         * all received when a step returns) */

struct gpt_pipe {
    const dt_mesh *mesh;        /* the whole mesh (borrowed) */
    dt_pipe *pipe;              /* NULL without a pipe dim: the whole model on the mesh */
    dt_pipe_schedule *sched;
    const dt_mesh *smesh;       /* this client's stage mesh (borrowed) */
    int P, V, VP, M, stage;
    gpt_config cfg;
    gpt *chunk[MAX_CHUNKS];     /* this stage's virtual stages c * P + stage */
    int nslots;
    dt_tensor **acc;            /* [nslots]: a step's gradients, accumulated in micro order */
    dt_zero *zero;
    int ngroups, nopt;
    int *opt_slot;              /* optimizer order -> slot */
    /* one step's */
    dt_tensor **x, **y;         /* [M] micro-batches on stage 0's / the last stage's mesh */
    dt_tape **tape;             /* [VP * M] */
    gpt_stage_pass **pass;      /* [VP * M] */
    dt_tensor **out;            /* [VP * M] output or loss to run backward from */
    double ratio;               /* a micro-batch's positions / the batch's counted targets */
    float dloss;                /* loss scale * ratio: the seed of each loss's backward */
    double loss;
};

int gpt_pipe_stages(const gpt_pipe *gp) { return gp->P; }
int gpt_pipe_num_slots(const gpt_pipe *gp) { return gp->nslots; }
const char *gpt_pipe_slot_name(const gpt_pipe *gp, int slot)
{
    return slot >= 0 && slot < gp->nslots ? gpt_param_names(gp->chunk[0])[slot] : NULL;
}
const dt_mesh *gpt_pipe_stage_mesh(const gpt_pipe *gp) { return gp->smesh; }
int gpt_pipe_my_stage(const gpt_pipe *gp) { return gp->stage; }
dt_pipe *gpt_pipe_pipe(const gpt_pipe *gp) { return gp->pipe; }
dt_zero *gpt_pipe_zero(const gpt_pipe *gp) { return gp->zero; }
const dt_mesh *gpt_pipe_save_mesh(const gpt_pipe *gp) { return gp->pipe ? gp->mesh : NULL; }

int64_t gpt_pipe_param_count(const gpt_pipe *gp)
{
    int64_t n = 0;
    for (int c = 0; c < gp->V; c++)
        for (int s = 0; s < gp->nslots; s++)
            if (gpt_holds_slot(gp->chunk[c], s))
                n += dt_tensor_numel(gpt_params(gp->chunk[c])[s]);
    return n;
}

/* Virtual stage v's units: blocks [v L / VP, (v + 1) L / VP), the embeddings with the first,
 * the head with the last. */
static void units_of(int v, int VP, int L, int *lo, int *hi)
{
    *lo = v == 0 ? 0 : 1 + (int)((int64_t)L * v / VP);
    *hi = v == VP - 1 ? L + 2 : 1 + (int)((int64_t)L * (v + 1) / VP);
}

/* The stages' sums of squares and overflow flags, shared and added in stage order. */
static dt_status combine(void *arg, double *sq, int *overflow)
{
    gpt_pipe *gp = arg;
    double v[2 * MAX_STAGES];
    int stage_of[2 * MAX_STAGES];
    for (int s = 0; s < gp->P; s++) {
        v[2 * s] = v[2 * s + 1] = 0.0;
        stage_of[2 * s] = stage_of[2 * s + 1] = s;
    }
    v[2 * gp->stage] = *sq;
    v[2 * gp->stage + 1] = *overflow ? 1.0 : 0.0;
    dt_status st = dt_pipe_share_values(gp->pipe, 2 * gp->P, stage_of, v);
    if (st != DT_OK)
        return st;
    double total = 0.0;
    int any = 0;
    for (int s = 0; s < gp->P; s++) {
        total += v[2 * s];
        any |= v[2 * s + 1] != 0.0;
    }
    *sq = total;
    *overflow = any;
    return DT_OK;
}

static dt_status fail(const char *msg)
{
    fprintf(stderr, "train_gpt: %s\n", msg);
    return DT_ERR_INVALID_ARGUMENT;
}

static dt_status attach(gpt_pipe *gp, const gpt_pipe_opts *o)
{
    dt_optim_hparams plain = o->hp;
    plain.weight_decay = 0.0f;
    gp->opt_slot = calloc((size_t)gp->nslots * (size_t)gp->V, sizeof *gp->opt_slot);
    const char **names = calloc((size_t)gp->nslots * (size_t)gp->V, sizeof *names);
    dt_tensor **params = calloc((size_t)gp->nslots * (size_t)gp->V, sizeof *params);
    dt_status st = gp->opt_slot && names && params ? DT_OK : DT_ERR_NO_MEMORY;
    /* Two groups as gpt_attach: the decayed (weights, embeddings), then the norms. */
    for (int decay = 1; st == DT_OK && decay >= 0; decay--) {
        int n = 0;
        for (int c = 0; c < gp->V; c++) {
            gpt *m = gp->chunk[c];
            for (int s = 0; s < gp->nslots; s++) {
                if (!gpt_holds_slot(m, s) || (s < gpt_num_decay(m)) != decay)
                    continue;
                gp->opt_slot[gp->nopt + n] = s;
                names[n] = gpt_param_names(m)[s];
                params[n] = gpt_params(m)[s];
                n++;
            }
        }
        if (n > 0) {
            st = dt_zero_add_group(gp->zero, n, names, params, decay ? &o->hp : &plain, NULL);
            gp->nopt += n;
            gp->ngroups++;
        }
    }
    free(names);
    free(params);
    return st;
}

dt_status gpt_pipe_create(const dt_mesh *mesh, const gpt_config *cfg, dt_dtype dtype,
                          uint64_t seed, const gpt_pipe_opts *o, gpt_pipe **out)
{
    gpt_pipe *gp = calloc(1, sizeof *gp);
    if (!gp)
        return DT_ERR_NO_MEMORY;
    dt_status st = DT_OK;
    gp->cfg = *cfg;
    gp->mesh = mesh;
    gp->M = o->micro;
    gp->V = o->chunks < 1 ? 1 : o->chunks;
    gp->P = 1;
    gp->smesh = mesh;
    int L = (int)cfg->layers;
    if (dt_mesh_dim_index(mesh, "pipe") >= 0) {
        st = dt_pipe_create(mesh, "pipe", &gp->pipe);
        if (st == DT_OK) {
            gp->P = dt_pipe_num_stages(gp->pipe);
            int held = 0;
            for (int s = 0; s < gp->P; s++)
                if (dt_pipe_holds_stage(gp->pipe, s)) {
                    held++;
                    gp->stage = s;
                }
            if (held != 1)
                st = fail("--pipe: every process must hold the devices of one stage only "
                          "(run with a process count that is a multiple of the stages)");
            else
                gp->smesh = dt_pipe_stage_mesh(gp->pipe, gp->stage);
        }
        if (st == DT_OK)
            st = dt_pipe_schedule_create(o->schedule, gp->P, gp->M, gp->V, &gp->sched);
    } else if (gp->V != 1) {
        st = fail("--schedule interleaved needs a mesh with a pipe dim");
    }
    gp->VP = gp->P * gp->V;
    if (st == DT_OK && (gp->P > MAX_STAGES || gp->V > MAX_CHUNKS || L < gp->VP))
        st = fail("--pipe: at most 64 stages of at most 4 chunks, and a block per virtual stage");
    for (int c = 0; st == DT_OK && c < gp->V; c++) {
        int lo, hi;
        units_of(c * gp->P + gp->stage, gp->VP, L, &lo, &hi);
        st = gpt_create(gp->smesh, cfg, dtype, seed, &gp->chunk[c]);
        if (st == DT_OK)
            st = gpt_set_units(gp->chunk[c], lo, hi);
    }
    if (st == DT_OK) {
        gp->nslots = gpt_num_params(gp->chunk[0]);
        gp->acc = calloc((size_t)gp->nslots, sizeof *gp->acc);
        gp->x = calloc((size_t)gp->M, sizeof *gp->x);
        gp->y = calloc((size_t)gp->M, sizeof *gp->y);
        size_t k = (size_t)gp->VP * (size_t)gp->M;
        gp->tape = calloc(k, sizeof *gp->tape);
        gp->pass = calloc(k, sizeof *gp->pass);
        gp->out = calloc(k, sizeof *gp->out);
        if (!gp->acc || !gp->x || !gp->y || !gp->tape || !gp->pass || !gp->out)
            st = DT_ERR_NO_MEMORY;
    }
    dt_zero_opts zo = o->zero;
    if (gp->pipe && gp->P > 1) {
        zo.combine = combine;
        zo.combine_arg = gp;
    }
    if (st == DT_OK && zo.stage == 3)
        st = fail("--pipe: ZeRO stages 0 to 2");
    if (st == DT_OK)
        st = dt_zero_create(gp->smesh, &zo, &gp->zero);
    if (st == DT_OK)
        st = attach(gp, o);
    if (st != DT_OK) {
        gpt_pipe_destroy(gp);
        return st;
    }
    *out = gp;
    return DT_OK;
}

static void step_free(gpt_pipe *gp)
{
    for (int i = 0; gp->tape && i < gp->VP * gp->M; i++) {
        dt_tape_destroy(gp->tape[i]);
        gpt_stage_pass_free(gp->pass[i]);
        dt_tensor_destroy(gp->out[i]);
        gp->tape[i] = NULL;
        gp->pass[i] = NULL;
        gp->out[i] = NULL;
    }
    for (int i = 0; gp->x && i < gp->M; i++) {
        dt_tensor_destroy(gp->x[i]);
        dt_tensor_destroy(gp->y[i]);
        gp->x[i] = gp->y[i] = NULL;
    }
    for (int s = 0; gp->acc && s < gp->nslots; s++) {
        dt_tensor_destroy(gp->acc[s]);
        gp->acc[s] = NULL;
    }
}

void gpt_pipe_destroy(gpt_pipe *gp)
{
    if (!gp)
        return;
    step_free(gp);
    dt_zero_destroy(gp->zero);
    for (int c = 0; c < MAX_CHUNKS; c++)
        gpt_destroy(gp->chunk[c]);
    free(gp->acc);
    free(gp->x);
    free(gp->y);
    free(gp->tape);
    free(gp->pass);
    free(gp->out);
    free(gp->opt_slot);
    dt_pipe_schedule_destroy(gp->sched);
    dt_pipe_destroy(gp->pipe);
    free(gp);
}

static dt_status fwd(void *arg, int stage, int chunk, int micro, const dt_tensor *in,
                     dt_tensor **out)
{
    gpt_pipe *gp = arg;
    int v = chunk * gp->P + stage, k = v * gp->M + micro;
    gpt *m = gp->chunk[chunk];
    dt_tape_opts to = DT_TAPE_OPTS_INIT;
    to.accumulate = 0;
    dt_tensor *o = NULL;
    *out = NULL;
    dt_status st = dt_tape_create(&to, &gp->tape[k]);
    for (int s = 0; st == DT_OK && s < gp->nslots; s++)
        if (gpt_holds_slot(m, s))
            st = dt_tape_watch(gp->tape[k], gpt_params(m)[s], s);
    if (st == DT_OK && in)
        st = dt_tape_watch(gp->tape[k], in, IN_INDEX);
    if (st == DT_OK)
        st = dt_tape_begin(gp->tape[k]);
    if (st == DT_OK)
        st = gpt_stage_forward(m, gp->tape[k], in ? in : gp->x[micro], gp->y[micro],
                               &gp->pass[k], &o);
    if (dt_tape_current() == gp->tape[k]) {
        dt_status e = dt_tape_end(gp->tape[k]);
        st = st == DT_OK ? e : st;
    }
    if (st != DT_OK) {
        dt_tensor_destroy(o);
        return st;
    }
    gp->out[k] = o;
    if (v == gp->VP - 1) {
        double val = 0.0;
        st = dt_item(o, &val);
        gp->loss += val * gp->ratio;
    } else {
        *out = dt_tensor_retain(o);
    }
    return st;
}

static void accumulate(dt_tensor **acc, dt_tensor *g, dt_status *st)
{
    if (!*acc) {
        *acc = g;
        return;
    }
    dt_tensor *s = NULL;
    if (*st == DT_OK)
        *st = dt_add(*acc, g, NULL, &s);
    dt_tensor_destroy(g);
    if (*st == DT_OK) {
        dt_tensor_destroy(*acc);
        *acc = s;
    }
}

static dt_status bwd(void *arg, int stage, int chunk, int micro, const dt_tensor *gout,
                     dt_tensor **gin)
{
    gpt_pipe *gp = arg;
    int v = chunk * gp->P + stage, k = v * gp->M + micro;
    gpt *m = gp->chunk[chunk];
    *gin = NULL;
    dt_status st = dt_tape_backward(gp->tape[k], gp->out[k], gout, gout ? 1.0f : gp->dloss, NULL);
    /* Every chunk's parameters are its own slots: one accumulator per slot, in micro order
     * (every schedule runs a chunk's backwards in micro order). */
    for (int s = 0; st == DT_OK && s < gp->nslots; s++) {
        if (!gpt_holds_slot(m, s))
            continue;
        dt_tensor *g = NULL;
        st = dt_tape_take_grad(gp->tape[k], s, &g);
        if (st == DT_OK)
            accumulate(&gp->acc[s], g, &st);
    }
    if (st == DT_OK && v > 0)
        st = dt_tape_take_grad(gp->tape[k], IN_INDEX, gin);
    dt_tape_destroy(gp->tape[k]);
    gpt_stage_pass_free(gp->pass[k]);
    dt_tensor_destroy(gp->out[k]);
    gp->tape[k] = NULL;
    gp->pass[k] = NULL;
    gp->out[k] = NULL;
    return st;
}

dt_status gpt_pipe_step(gpt_pipe *gp, int64_t rows, const int32_t *x, const int32_t *y,
                        float lr, double *loss_out, dt_zero_step_info *info_out)
{
    int64_t T = gp->cfg.context, rm = rows / gp->M, targets = 0;
    if (rows % gp->M != 0)
        return fail("--microbatches must divide --batch");
    for (int64_t i = 0; i < rows * T; i++)
        targets += y[i] >= 0;
    gp->ratio = targets > 0 ? (double)(rm * T) / (double)targets : 0.0;
    gp->dloss = (float)(dt_zero_loss_scale(gp->zero) * gp->ratio);
    gp->loss = 0.0;
    dt_status st = DT_OK;
    for (int g = 0; st == DT_OK && g < gp->ngroups; g++)
        st = dt_zero_set_lr(gp->zero, g, lr);
    /* The micro-batches where they are read: the ids on stage 0, the targets on the last. */
    gpt *first = gp->stage == 0 ? gp->chunk[0] : NULL;
    gpt *last = gp->stage == gp->P - 1 ? gp->chunk[gp->V - 1] : NULL;
    for (int i = 0; st == DT_OK && i < gp->M; i++) {
        if (first)
            st = gpt_inputs(first, rm, x + i * rm * T, NULL, &gp->x[i], NULL);
        if (st == DT_OK && last)
            st = gpt_inputs(last, rm, y + i * rm * T, NULL, &gp->y[i], NULL);
    }
    if (st == DT_OK && gp->pipe) {
        static const char *const specs[3] = {"batch", DT_UNSHARDED, DT_UNSHARDED};
        int64_t shape[3] = {rm, T, gp->cfg.width};
        dt_pipe_run_opts ro = DT_PIPE_RUN_OPTS_INIT;
        ro.forward = fwd;
        ro.backward = bwd;
        ro.arg = gp;
        ro.act_rank = 3;
        ro.act_specs = specs;
        ro.act_shape = shape;
        ro.act_dtype = DT_DTYPE_F32;
        st = dt_pipe_run(gp->pipe, gp->sched, &ro, NULL);
    } else {
        /* No pipeline: each micro-batch's forward and backward in order. */
        for (int i = 0; st == DT_OK && i < gp->M; i++) {
            dt_tensor *o = NULL, *gi = NULL;
            st = fwd(gp, 0, 0, i, NULL, &o);
            if (st == DT_OK)
                st = bwd(gp, 0, 0, i, NULL, &gi);
            dt_tensor_destroy(o);
            dt_tensor_destroy(gi);
        }
    }
    /* The loss lives on the last stage: every client gets it. */
    if (st == DT_OK && gp->pipe) {
        int owner = gp->P - 1;
        st = dt_pipe_share_values(gp->pipe, 1, &owner, &gp->loss);
    }
    dt_tensor **g = calloc((size_t)gp->nopt + 1, sizeof *g);
    if (st == DT_OK && !g)
        st = DT_ERR_NO_MEMORY;
    for (int i = 0; st == DT_OK && i < gp->nopt; i++)
        g[i] = gp->acc[gp->opt_slot[i]];
    dt_zero_step_info info;
    if (st == DT_OK)
        st = dt_zero_step(gp->zero, g, &info);
    free(g);
    step_free(gp);
    if (st == DT_OK) {
        *loss_out = gp->loss;
        if (info_out)
            *info_out = info;
    }
    return st;
}

int gpt_pipe_param(gpt_pipe *gp, const char *name, float *out, int64_t count)
{
    for (int c = 0; c < gp->V; c++) {
        gpt *m = gp->chunk[c];
        for (int s = 0; s < gp->nslots; s++) {
            if (!gpt_holds_slot(m, s) || strcmp(gpt_param_names(m)[s], name) != 0)
                continue;
            dt_tensor *p = gpt_params(m)[s], *f = NULL, *r = NULL;
            dt_layout *rep = NULL;
            if (dt_tensor_numel(p) != count)
                return -1;
            dt_status st = dt_cast(p, DT_DTYPE_F32, &f);
            if (st == DT_OK)
                st = dt_layout_replicated(gp->smesh, dt_tensor_rank(p), &rep);
            if (st == DT_OK)
                st = dt_relayout(f, rep, &r);
            if (st == DT_OK)
                st = dt_tensor_local_read(r, 0, out, (size_t)count * sizeof *out);
            dt_tensor_destroy(r);
            dt_tensor_destroy(f);
            dt_layout_destroy(rep);
            return st == DT_OK ? 1 : -1;
        }
    }
    return 0;
}

/* Forward only, one virtual stage after the other: each stage's activation goes to the next
 * (kept in memory when the next is this client's own), the last stage's loss and logits to
 * every client. */
dt_status gpt_pipe_eval(gpt_pipe *gp, int64_t rows, const int32_t *x, const int32_t *y,
                        int64_t targets, double *loss_out, float *logits)
{
    static const char *const specs[3] = {"batch", DT_UNSHARDED, DT_UNSHARDED};
    int64_t T = gp->cfg.context, shape[3] = {rows, T, gp->cfg.width};
    int last = gp->stage == gp->P - 1;
    dt_tensor *tx = NULL, *ty = NULL, *act = NULL;
    dt_layout *l = NULL;
    double loss = 0.0;
    dt_status st = DT_OK;
    if (gp->stage == 0)
        st = gpt_inputs(gp->chunk[0], rows, x, NULL, &tx, NULL);
    if (st == DT_OK && last && y)
        st = gpt_inputs(gp->chunk[gp->V - 1], rows, y, NULL, &ty, NULL);
    if (st == DT_OK && gp->pipe)
        st = dt_layout_create(gp->smesh, 3, specs, &l);
    for (int v = 0; st == DT_OK && v < gp->VP; v++) {
        int s = v % gp->P, prev = (v + gp->P - 1) % gp->P, next = (v + 1) % gp->P;
        if (s != gp->stage)
            continue;
        if (v > 0 && prev != s)
            st = dt_pipe_recv(gp->pipe, prev, s, l, DT_DTYPE_F32, shape, EVAL_TAG + v, &act);
        dt_tensor *out = NULL;
        if (st == DT_OK)
            st = gpt_stage_eval(gp->chunk[v / gp->P], v == 0 ? tx : act, ty, targets, &loss,
                                logits, &out);
        dt_tensor_destroy(act);
        act = NULL;
        if (st == DT_OK && out && next != s)
            st = dt_pipe_send(gp->pipe, s, next, out, EVAL_TAG + v + 1);
        if (out && next != s)
            dt_tensor_destroy(out);
        else
            act = out;
    }
    if (st == DT_OK && gp->pipe)
        st = dt_pipe_flush(gp->pipe);
    /* The last stage's results to every client (as doubles: exact for f32). */
    int64_t n = logits ? rows * T * gp->cfg.vocab : 0;
    double *vals = calloc((size_t)n + 1, sizeof *vals);
    int *owner = calloc((size_t)n + 1, sizeof *owner);
    if (st == DT_OK && (!vals || !owner))
        st = DT_ERR_NO_MEMORY;
    if (st == DT_OK && gp->pipe && gp->P > 1) {
        for (int64_t i = 0; i < n + 1; i++)
            owner[i] = gp->P - 1;
        vals[0] = loss;
        for (int64_t i = 0; last && i < n; i++)
            vals[1 + i] = logits[i];
        st = dt_pipe_share_values(gp->pipe, (int)(n + 1), owner, vals);
        loss = vals[0];
        for (int64_t i = 0; st == DT_OK && i < n; i++)
            logits[i] = (float)vals[1 + i];
    }
    if (st == DT_OK && loss_out)
        *loss_out = loss;
    free(vals);
    free(owner);
    dt_tensor_destroy(act);
    dt_tensor_destroy(tx);
    dt_tensor_destroy(ty);
    dt_layout_destroy(l);
    return st;
}
