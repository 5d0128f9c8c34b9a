/* Early reduction: dt_zero_grad_ready copies one parameter's gradient into its runs of the flat
 * gradient chunks as soon as the backward pass has it (the caller's gradient can be freed at
 * once) and starts the background reduction of every bucket it completes (bucket.c); without
 * the background path (a dp dim of size 1, too few MPI tags) it reduces each chunk in the call
 * once all of its parameters are in. dt_zero_step then starts from the reduced chunks
 * (docs/optim.md, "Overlapped reduction"). */
#include <stdlib.h>
#include <string.h>

#include "layout/tensor_dev.h"
#include "optim/optim_impl.h"
#include "runtime/error.h"

dt__zparam *dt__zero_param(const dt_zero *z, int index, dt__zgroup **group_out)
{
    for (int g = 0; g < z->ngroups; g++) {
        dt__zgroup *gr = &z->groups[g];
        if (gr->nparams > 0 && index >= gr->params[0].index &&
            index < gr->params[0].index + gr->nparams) {
            if (group_out)
                *group_out = gr;
            return &gr->params[index - gr->params[0].index];
        }
    }
    return NULL;
}

void dt__zero_ready_reset(dt_zero *z)
{
    dt__zero_buckets_free(z);  /* waits for the messages in flight first */
    for (int g = 0; g < z->ngroups; g++)
        for (int c = 0; c < z->groups[g].nchunks; c++) {
            dt__zchunk *ch = &z->groups[g].chunks[c];
            if (ch->filling != ch->flat && ch->filling != ch->gpart)
                dt_tensor_destroy(ch->filling);
            ch->filling = NULL;
            ch->waiting = 0;
            ch->reduced = 0;
        }
    free(z->ready);
    z->ready = NULL;
    z->nready = 0;
}

/* First call of a step: how many parameters each chunk waits for. */
static dt_status ready_begin(dt_zero *z)
{
    z->ready = calloc((size_t)z->nparams + 1, 1);
    z->t_copy_in = z->t_copy = z->t_sum = 0;
    if (!z->ready)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_grad_ready: no memory");
    for (int g = 0; g < z->ngroups; g++) {
        dt__zgroup *gr = &z->groups[g];
        for (int c = 0; c < gr->nchunks; c++) {
            dt__zchunk *ch = &gr->chunks[c];
            for (int j = 0; j < gr->nparams; j++) {
                const dt__zparam *p = &gr->params[j];
                ch->waiting += p->offset < ch->start + ch->len && p->offset + p->n > ch->start;
            }
        }
    }
    return z->overlap ? dt__zero_buckets_begin(z) : DT_OK;
}

/* Copies gradient `gl` (in p's gradient layout) into its runs of every chunk it meets, and
 * reduces each chunk that it completes. */
static dt_status take(dt_zero *z, dt__zgroup *g, const dt__zparam *p, dt_tensor *gl)
{
    dt_tensor **src = calloc((size_t)z->nparams + 1, sizeof *src);
    if (!src)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_grad_ready: no memory");
    src[p->index] = gl;
    dt_status st = DT_OK;
    double t0 = dt__zero_cpu_seconds();
    for (int c = 0; st == DT_OK && c < g->nchunks; c++) {
        dt__zchunk *ch = &g->chunks[c];
        int64_t lo = p->offset > ch->start ? p->offset : ch->start;
        int64_t hi = p->offset + p->n < ch->start + ch->len ? p->offset + p->n
                                                            : ch->start + ch->len;
        if (hi <= lo)
            continue;
        if (!ch->filling)
            st = dt__zero_flat_for(z, g, ch, &ch->filling);
        for (int i = 0; st == DT_OK && i < z->nlocal; i++)
            st = dt__zero_gather_in(z, g, i, lo, hi - lo, src,
                                    (char *)dt_tensor_local(ch->filling, i)->data +
                                        (size_t)(lo - ch->start) * dt_dtype_size(g->gdtype),
                                    g->gdtype);
        if (st == DT_OK && !z->overlap && --ch->waiting == 0) {
            dt_status done = dt__zero_sync(z);
            st = done;
            if (st == DT_OK) {
                dt_tensor *flat = ch->filling;
                ch->filling = NULL;
                st = dt__zero_reduce_filled(z, g, ch, flat);
                ch->reduced = 1;
            }
        }
    }
    /* The copies read gl: they are complete before it can go (and before a bucket's values
     * are sent). */
    dt_status done = dt__zero_sync(z);
    z->t_copy_in += dt__zero_cpu_seconds() - t0;
    free(src);
    if (st == DT_OK)
        st = done;
    if (st == DT_OK && z->overlap)
        st = dt__zero_buckets_take(z, g, p);
    /* A transient chunk (stages 2, 3) whose parameters are all in has had its buckets started,
     * their values copied to host staging: it can go now rather than at the step, so that the
     * backward pass holds one chunk at a time. */
    for (int c = 0; st == DT_OK && z->overlap && c < g->nchunks; c++) {
        dt__zchunk *ch = &g->chunks[c];
        if (p->offset < ch->start + ch->len && p->offset + p->n > ch->start && --ch->waiting == 0 &&
            ch->filling && ch->filling != ch->flat && ch->filling != ch->gpart) {
            dt_tensor_destroy(ch->filling);
            ch->filling = NULL;
        }
    }
    return st;
}

dt_status dt_zero_grad_ready(dt_zero *zero, int index, const dt_tensor *grad)
{
    static const char fn[] = "dt_zero_grad_ready";
    if (!zero || !grad)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: zero and grad are required", fn);
    dt__zgroup *g = NULL;
    dt__zparam *p = index >= 0 ? dt__zero_param(zero, index, &g) : NULL;
    if (!p)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: parameter %d (the optimizer has %d)", fn,
                         index, zero->nparams);
    if (zero->ready && zero->ready[index])
        return dt__error(DT_ERR_STATE, "%s: parameter %d ('%s') was already made ready in this "
                         "step", fn, index, p->name);
    dt_status st = dt__zero_check_grad(zero, fn, p, grad);
    if (st != DT_OK)
        return st;
    if (!zero->ready)
        st = ready_begin(zero);
    dt_tensor *gl = NULL;
    if (st == DT_OK) {
        if (dt__layout_same_placement(dt_tensor_layout(grad), p->grad_layout))
            gl = dt_tensor_retain(grad);
        else
            st = dt_relayout(grad, p->grad_layout, &gl);
    }
    if (st == DT_OK)
        st = take(zero, g, p, gl);
    dt_tensor_destroy(gl);
    if (st != DT_OK) {
        dt__zero_ready_reset(zero);
        return st;
    }
    zero->ready[index] = 1;
    zero->nready++;
    return DT_OK;
}
