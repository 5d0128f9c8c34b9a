/* llama/lm_pipe: pipeline-parallel training of the Llama-family model through the pipeline
 * executor (lm_pipe.h). */
#include "lm_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_impl.h"

#define MAX_STAGES 64
#define TIED_TAG   31000 /* the tied table's gradient (last -> first) and values (first -> last) */

struct lm_pipe {
    dt_pipe *pipe;
    lm *m;
    lm_pipe_opts o;
    int P, stage, embed; /* embed: the table's parameter index */
    int64_t lo, hi, mb;  /* this stage's blocks; a micro-batch's rows */
    dt_pipe_schedule *sched;
    dt_zero *zero;
    int nopt;
    int *opt;           /* optimizer position -> parameter */
    dt_tensor **acc;    /* [n] the step's gradients, summed over the micro-batches */
    lm_stage_run **run; /* [micro] */
    const int32_t *x, *y;
    double loss;
    char act_batch[DT_NAME_MAX];
};

/* Stage of parameter `name`: the block's, the embeddings the first's, the rest the last's. */
static int stage_of(const lm_pipe *lp, const char *name)
{
    long long l;
    if (sscanf(name, "layers.%lld.", &l) == 1) {
        for (int s = 0; s < lp->P; s++)
            if (l < (long long)((s + 1) * lp->m->cfg.layers / lp->P))
                return s;
    }
    return strcmp(name, "embed") == 0 ? 0 : lp->P - 1;
}

static dt_status combine(void *arg, double *sq, int *overflow)
{
    lm_pipe *lp = arg;
    double v[2 * MAX_STAGES];
    int who[2 * MAX_STAGES];
    for (int s = 0; s < lp->P; s++) {
        v[2 * s] = v[2 * s + 1] = 0.0;
        who[2 * s] = who[2 * s + 1] = s;
    }
    v[2 * lp->stage] = *sq;
    v[2 * lp->stage + 1] = *overflow ? 1.0 : 0.0;
    dt_status st = dt_pipe_share_values(lp->pipe, 2 * lp->P, who, v);
    if (st != DT_OK)
        return st;
    double total = 0.0;
    int any = 0;
    for (int s = 0; s < lp->P; s++) { /* added in stage order on every client */
        total += v[2 * s];
        any |= v[2 * s + 1] != 0.0;
    }
    *sq = total;
    *overflow = any;
    return DT_OK;
}

void lm_pipe_destroy(lm_pipe *lp)
{
    if (!lp)
        return;
    for (int i = 0; lp->acc && i < lp->m->n; i++)
        dt_tensor_destroy(lp->acc[i]);
    for (int k = 0; lp->run && k < lp->o.micro; k++)
        lm_stage_run_free(lp->run[k]);
    free(lp->acc);
    free(lp->run);
    free(lp->opt);
    dt_zero_destroy(lp->zero);
    dt_pipe_schedule_destroy(lp->sched);
    free(lp);
}

dt_status lm_pipe_create(dt_pipe *pipe, lm *m, const lm_pipe_opts *o, lm_pipe **out)
{
    lm__set_error("%s", "");
    int P = dt_pipe_num_stages(pipe), stage = -1, held = 0;
    for (int s = 0; s < P; s++)
        if (dt_pipe_holds_stage(pipe, s)) {
            stage = s;
            held++;
        }
    if (m->cfg.arch != DT_HF_LLAMA || held != 1 || o->micro < 1 || o->rows % o->micro != 0 ||
        P > m->cfg.layers || P > MAX_STAGES || o->zero_stage > 2) {
        lm__set_error("pipeline: the Llama family only, one stage per client, --micro dividing "
                      "the batch, at most one stage per block, ZeRO stage 0-2 (got %s, %d "
                      "stages held, micro %d of %lld rows, %d stages of %lld blocks, stage %d)",
                      m->cfg.model_type, held, o->micro, (long long)o->rows, P,
                      (long long)m->cfg.layers, o->zero_stage);
        return DT_ERR_INVALID_ARGUMENT;
    }
    lm_pipe *lp = calloc(1, sizeof *lp);
    if (!lp)
        return DT_ERR_NO_MEMORY;
    lp->pipe = pipe;
    lp->m = m;
    lp->o = *o;
    lp->P = P;
    lp->stage = stage;
    lp->lo = stage * m->cfg.layers / P;
    lp->hi = (stage + 1) * m->cfg.layers / P;
    lp->mb = o->rows / o->micro;
    lp->embed = -1;
    const dt_mesh *sm = dt_pipe_stage_mesh(pipe, stage);
    int bd = dt_mesh_dim_index(sm, "batch");
    snprintf(lp->act_batch, sizeof lp->act_batch, "%s",
             bd >= 0 && lp->mb % dt_mesh_dim_size(sm, bd) == 0 ? "batch" : DT_UNSHARDED);
    lp->acc = calloc((size_t)m->n, sizeof *lp->acc);
    lp->run = calloc((size_t)o->micro, sizeof *lp->run);
    lp->opt = calloc((size_t)m->n, sizeof *lp->opt);
    dt_tensor **pt = calloc((size_t)m->n, sizeof *pt);
    const char **nm = calloc((size_t)m->n, sizeof *nm);
    dt_status st = lp->acc && lp->run && lp->opt && pt && nm ? DT_OK : DT_ERR_NO_MEMORY;
    if (st == DT_OK)
        st = dt_pipe_schedule_create(o->kind, P, o->micro, 1, &lp->sched);
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = o->zero_stage;
    zo.clip_norm = o->clip;
    zo.combine = combine;
    zo.combine_arg = lp;
    if (st == DT_OK)
        st = dt_zero_create(sm, &zo, &lp->zero);
    dt_optim_hparams plain = o->hp;
    plain.weight_decay = 0.0f;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->names[i], "embed"))
            lp->embed = i;
    /* Two groups as lm_attach: the decayed (2-D) parameters of this stage, then the others. */
    for (int g = 0; st == DT_OK && g < 2; g++) {
        int first = lp->nopt;
        for (int i = 0; i < m->n; i++)
            if (stage_of(lp, m->names[i]) == stage && lm_param_decays(m, i) == (g == 0)) {
                lp->opt[lp->nopt] = i;
                pt[lp->nopt] = m->p[i];
                nm[lp->nopt++] = m->names[i];
            }
        if (lp->nopt > first)
            st = dt_zero_add_group(lp->zero, lp->nopt - first, nm + first, pt + first,
                                   g == 0 ? &o->hp : &plain, NULL);
    }
    free(pt);
    free(nm);
    /* The other stages' parameters go: this stage keeps its own, and the last stage the tied
     * table it uses as its head. */
    for (int i = 0; st == DT_OK && i < m->n; i++) {
        int head = i == lp->embed && m->cfg.tie_word_embeddings && stage == P - 1;
        if (stage_of(lp, m->names[i]) != stage && !head) {
            dt_tensor_destroy(m->p[i]);
            m->p[i] = NULL;
        }
    }
    lm__rebind(m);
    if (st != DT_OK) {
        lm_pipe_destroy(lp);
        return st;
    }
    *out = lp;
    return DT_OK;
}

/* Micro-batch k's rows of a host array [rows, T] as ids on the stage mesh. */
static dt_status micro_ids(const lm_pipe *lp, const int32_t *all, int k, dt_tensor **out)
{
    lm_layouts l;
    dt_status st = lm__layouts(lp->m, lp->mb, &l);
    int64_t shape[2] = {lp->mb, lp->o.T};
    if (st == DT_OK)
        st = lm__from_host(l.ids, DT_DTYPE_I32, shape, all + k * lp->mb * lp->o.T, out);
    lm__layouts_free(&l);
    return st;
}

static dt_status fwd(void *arg, int stage, int chunk, int micro, const dt_tensor *input,
                     dt_tensor **output_out)
{
    (void)chunk;
    lm_pipe *lp = arg;
    int first = stage == 0, last = stage == lp->P - 1;
    dt_tensor *x = NULL, *y = NULL;
    dt_status st = first ? micro_ids(lp, lp->x, micro, &x) : DT_OK;
    if (st == DT_OK && last)
        st = micro_ids(lp, lp->y, micro, &y);
    if (st == DT_OK)
        st = lm_stage_forward(lp->m, lp->lo, lp->hi, x, first ? NULL : input, y, &lp->run[micro],
                              output_out);
    double v = 0.0;
    if (st == DT_OK && last && (st = dt_item(lm_stage_output(lp->run[micro]), &v)) == DT_OK)
        lp->loss += v;
    if (last)
        *output_out = NULL;
    dt_tensor_destroy(x);
    dt_tensor_destroy(y);
    return st;
}

static dt_status bwd(void *arg, int stage, int chunk, int micro, const dt_tensor *grad_output,
                     dt_tensor **grad_input_out)
{
    (void)chunk;
    lm_pipe *lp = arg;
    int last = stage == lp->P - 1;
    *grad_input_out = NULL;
    /* Each micro-batch's mean loss weighs 1 / micro: the batch's mean. */
    dt_status st = lm_stage_backward(lp->m, lp->run[micro], last ? NULL : grad_output,
                                     last ? 1.0f / (float)lp->o.micro : 1.0f, lp->acc,
                                     stage > 0 ? grad_input_out : NULL);
    lm_stage_run_free(lp->run[micro]);
    lp->run[micro] = NULL;
    return st;
}

/* Tied embeddings: the last stage's head gradient added to the first stage's table
 * gradient (before the step), or the updated table sent back to the last stage (after). */
static dt_status tied_exchange(lm_pipe *lp, int after)
{
    lm *m = lp->m;
    int e = lp->embed, P = lp->P;
    if (!m->cfg.tie_word_embeddings || P == 1 || e < 0 || (lp->stage != 0 && lp->stage != P - 1))
        return DT_OK; /* the stages between hold no table */
    const dt_layout *lay = dt_tensor_layout(m->p[e]);
    const int64_t *shape = dt_tensor_shape(m->p[e]);
    dt_tensor *g = NULL, *r = NULL;
    dt_status st = DT_OK;
    int from = after ? 0 : P - 1, to = after ? P - 1 : 0;
    if (lp->stage == from) {
        if (after)
            st = dt_pipe_send(lp->pipe, from, to, m->p[e], TIED_TAG + 1);
        else if ((st = dt_relayout(lp->acc[e], lay, &g)) == DT_OK)
            st = dt_pipe_send(lp->pipe, from, to, g, TIED_TAG);
        dt_tensor_destroy(g);
        if (st == DT_OK)
            st = dt_pipe_flush(lp->pipe);
    }
    if (st == DT_OK && lp->stage == to)
        st = dt_pipe_recv(lp->pipe, from, to, lay, DT_DTYPE_F32, shape,
                          after ? TIED_TAG + 1 : TIED_TAG, &r);
    if (st == DT_OK && lp->stage == to) {
        if (after) {
            st = lm_set_param(m, e, r);
        } else {
            dt_tensor *sum = NULL;
            st = dt_add(lp->acc[e], r, NULL, &sum);
            if (st == DT_OK) {
                dt_tensor_destroy(lp->acc[e]);
                lp->acc[e] = sum;
            }
        }
    }
    dt_tensor_destroy(r);
    return st;
}

dt_status lm_pipe_step(lm_pipe *lp, const int32_t *x, const int32_t *y, double *loss,
                       dt_zero_step_info *info)
{
    lm__set_error("%s", "");
    lm *m = lp->m;
    lp->x = x;
    lp->y = y;
    lp->loss = 0.0;
    const char *specs[3] = {lp->act_batch, DT_UNSHARDED, DT_UNSHARDED};
    int64_t shape[3] = {lp->mb, lp->o.T, m->cfg.hidden};
    dt_pipe_run_opts ro = DT_PIPE_RUN_OPTS_INIT;
    ro.forward = fwd;
    ro.backward = bwd;
    ro.arg = lp;
    ro.act_rank = 3;
    ro.act_specs = specs;
    ro.act_shape = shape;
    ro.act_dtype = DT_DTYPE_F32;
    dt_status st = dt_pipe_run(lp->pipe, lp->sched, &ro, NULL);
    if (st == DT_OK)
        st = tied_exchange(lp, 0);
    dt_tensor **zg = calloc((size_t)(lp->nopt ? lp->nopt : 1), sizeof *zg);
    if (st == DT_OK && !zg)
        st = DT_ERR_NO_MEMORY;
    for (int k = 0; st == DT_OK && k < lp->nopt; k++)
        if (!(zg[k] = lp->acc[lp->opt[k]])) {
            lm__set_error("pipeline: no gradient for %s", m->names[lp->opt[k]]);
            st = DT_ERR_STATE;
        }
    if (st == DT_OK)
        st = dt_zero_step(lp->zero, zg, info);
    free(zg);
    for (int i = 0; i < m->n; i++) {
        dt_tensor_destroy(lp->acc[i]);
        lp->acc[i] = NULL;
    }
    if (st == DT_OK)
        st = tied_exchange(lp, 1);
    /* The loss: the last stage's mean over the micro-batches, on every client. */
    double v = lp->loss / lp->o.micro;
    int who = lp->P - 1;
    if (st == DT_OK)
        st = dt_pipe_share_values(lp->pipe, 1, &who, &v);
    if (st == DT_OK)
        *loss = v;
    return st;
}
