/* One ZeRO step: gradients flattened and reduced over the dp dim per chunk (stage 0 all-reduce,
 * stages 1 and 2 reduce-scatter), inf/NaN check and global norm agreed over the mesh, the
 * inner optimizer on each device's fp32 partition with unscaling and clipping fused into its
 * grad_scale, and the all-gather of the updated parameters chunk by chunk. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_impl.h"

static dt_status check_grads(const dt_zero *z, dt_tensor *const *grads)
{
    static const char fn[] = "dt_zero_step";
    for (int g = 0; g < z->ngroups; g++)
        for (int j = 0; j < z->groups[g].nparams; j++) {
            const dt__zparam *p = &z->groups[g].params[j];
            const dt_tensor *t = grads[p->index];
            if (!t)
                return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: gradient %d ('%s') is NULL", fn,
                                 p->index, p->name);
            if (!dt_mesh_equal(dt_layout_mesh(dt_tensor_layout(t)), z->mesh))
                return dt__error(DT_ERR_SHAPE, "%s: gradient %d ('%s') is on another mesh than "
                                 "the optimizer", fn, p->index, p->name);
            dt_dtype dt = dt_tensor_dtype(t);
            if (dt != DT_DTYPE_F32 && dt != DT_DTYPE_F16 && dt != DT_DTYPE_BF16)
                return dt__error(DT_ERR_SHAPE, "%s: gradient %d ('%s') has dtype %s (f32, f16 "
                                 "or bf16 expected)", fn, p->index, p->name, dt_dtype_name(dt));
            int rank = dt_tensor_rank(p->tensor);
            int same = dt_tensor_rank(t) == rank;
            for (int d = 0; same && d < rank; d++)
                same = dt_tensor_shape(t)[d] == dt_tensor_shape(p->tensor)[d];
            if (!same) {
                char a[96], b[96];
                return dt__error(DT_ERR_SHAPE, "%s: gradient %d ('%s') has shape %s, the "
                                 "parameter %s", fn, p->index, p->name,
                                 dt__shape_str(dt_tensor_rank(t), dt_tensor_shape(t), a, sizeof a),
                                 dt__shape_str(rank, dt_tensor_shape(p->tensor), b, sizeof b));
            }
        }
    return DT_OK;
}

/* The gradient partition of local device i in chunk ch after the reduction: its data (the
 * group's dtype) and its range [*off, *off + *len) of the chunk. */
static void *partition(const dt_zero *z, const dt__zgroup *g, const dt__zchunk *ch, int i,
                       int64_t *off, int64_t *len)
{
    dt__zero_local_range(ch->master, i, off, len);
    if (z->stage == 2)
        return dt_tensor_local(ch->gpart, i)->data;
    return (char *)dt_tensor_local(ch->flat, i)->data + (size_t)*off * dt_dtype_size(g->dtype);
}

static dt_status reduce_chunk(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch,
                              dt_tensor *const *grads)
{
    dt_tensor *flat = ch->flat;
    dt_status st = DT_OK;
    if (z->stage == 2)
        st = dt__zero_chunk_tensor(z, z->flat_layout, g->dtype, ch->len, 0, &flat);
    for (int i = 0; st == DT_OK && i < z->nlocal; i++)
        st = dt__zero_gather_in(g, i, ch->start, ch->len, grads,
                                dt_tensor_local(flat, i)->data, g->dtype);
    if (z->stage == 2) {
        if (st == DT_OK)
            st = dt_relayout_into(flat, ch->gpart);
        dt_tensor_destroy(flat);
        return st;
    }
    /* Stages 0 and 1: reduce into a transient chunk, then keep the partition in place in the
     * persistent flat buffer. */
    dt_tensor *red = NULL;
    if (st == DT_OK)
        st = dt_relayout(flat, z->state_layout, &red);
    size_t dsz = dt_dtype_size(g->dtype);
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        int64_t off, len;
        dt__zero_local_range(red, i, &off, &len);
        if (len > 0)
            memcpy((char *)dt_tensor_local(flat, i)->data + (size_t)off * dsz,
                   dt_tensor_local(red, i)->data, (size_t)len * dsz);
    }
    dt_tensor_destroy(red);
    return st;
}

/* Sum of squares (f64) of n elements of x, and whether any is inf/NaN. */
static dt_status sum_squares(const void *x, dt_dtype dtype, int64_t n, float *scratch,
                             double *sq_out)
{
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int64_t at = 0; at < n; at += DT__ZERO_BLOCK) {
        int64_t b = n - at < DT__ZERO_BLOCK ? n - at : DT__ZERO_BLOCK;
        const float *f = (const float *)x + at;
        if (dtype != DT_DTYPE_F32) {
            dt_status st = dt_kernel_cast(b, (const char *)x + (size_t)at * 2, dtype, scratch,
                                          DT_DTYPE_F32);
            if (st != DT_OK)
                return st;
            f = scratch;
        }
        int64_t e = 0;
        for (; e + 4 <= b; e += 4) {
            s0 += (double)f[e] * f[e];
            s1 += (double)f[e + 1] * f[e + 1];
            s2 += (double)f[e + 2] * f[e + 2];
            s3 += (double)f[e + 3] * f[e + 3];
        }
        for (; e < b; e++)
            s0 += (double)f[e] * f[e];
    }
    *sq_out = (s0 + s1) + (s2 + s3);
    return DT_OK;
}

/* vals[i*2]: this device's counted sum of squares; vals[i*2+1]: 1 if it saw an inf/NaN. */
static dt_status local_norms(const dt_zero *z, float *scratch, double *vals)
{
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        double sq = 0.0;
        int bad = 0;
        for (int gi = 0; st == DT_OK && gi < z->ngroups; gi++) {
            const dt__zgroup *g = &z->groups[gi];
            size_t dsz = dt_dtype_size(g->dtype);
            dt__zseg *segs = malloc((size_t)g->nparams * sizeof *segs);
            if (!segs)
                return dt__error(DT_ERR_NO_MEMORY, "dt_zero_step: no memory");
            for (int c = 0; st == DT_OK && c < g->nchunks; c++) {
                int64_t off, len;
                const char *data = partition(z, g, &g->chunks[c], i, &off, &len);
                int64_t lo = g->chunks[c].start + off;
                int ns = dt__zero_segments(g, lo, lo + len, segs);
                for (int s = 0; st == DT_OK && s < ns; s++) {
                    const char *x = data + (size_t)(segs[s].flat - lo) * dsz;
                    if (dt__zero_counts(z, segs[s].param, i)) {
                        double part = 0.0;
                        st = sum_squares(x, g->dtype, segs[s].len, scratch, &part);
                        sq += part;
                        bad |= !isfinite(part);
                    } else if (!bad) {
                        int32_t found = 0;
                        st = dt_kernel_nonfinite(segs[s].len, x, g->dtype, &found);
                        bad |= found != 0;
                    }
                }
            }
            free(segs);
        }
        vals[2 * i] = isfinite(sq) ? sq : 0.0;
        vals[2 * i + 1] = bad ? 1.0 : 0.0;
    }
    return st;
}

static dt_status update_chunk(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch,
                              float grad_scale, int64_t t, float *scratch)
{
    const dt_optim_hparams *hp = &g->hp;
    dt_sgd_opts so = {hp->lr, hp->momentum, hp->dampening, hp->weight_decay, hp->nesterov,
                      grad_scale};
    dt_adam_opts ao = {hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay,
                       hp->kind == DT_OPTIM_ADAMW, grad_scale};
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        int64_t off, len;
        const char *gp = partition(z, g, ch, i, &off, &len);
        float *p = dt_tensor_local(ch->master, i)->data;
        float *m = ch->s1 ? dt_tensor_local(ch->s1, i)->data : NULL;
        float *v = ch->s2 ? dt_tensor_local(ch->s2, i)->data : NULL;
        int64_t block = g->dtype == DT_DTYPE_F32 ? (len > 0 ? len : 1) : DT__ZERO_BLOCK;
        for (int64_t at = 0; st == DT_OK && at < len; at += block) {
            int64_t b = len - at < block ? len - at : block;
            const float *gf = (const float *)gp + at;
            if (g->dtype != DT_DTYPE_F32) {
                st = dt_kernel_cast(b, gp + (size_t)at * 2, g->dtype, scratch, DT_DTYPE_F32);
                gf = scratch;
            }
            if (st != DT_OK)
                break;
            if (hp->kind == DT_OPTIM_SGD)
                st = dt_kernel_sgd(b, &so, p + at, gf, m ? m + at : NULL);
            else
                st = dt_kernel_adam(b, &ao, t, p + at, gf, m + at, v + at);
        }
    }
    return st;
}

static dt_status gather_chunk(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch)
{
    dt_status st = DT_OK;
    if (z->stage == 0) {
        /* The state is replicated over dp: every device holds the whole chunk. */
        for (int i = 0; st == DT_OK && i < z->nlocal; i++)
            st = dt__zero_scatter_out(g, i, ch->start, ch->len,
                                      dt_tensor_local(ch->master, i)->data, DT_DTYPE_F32);
        return st;
    }
    /* The partition in the parameters' dtype: the master itself (f32), the gradient
     * partition's buffer (stage 2: its gradients are spent), or a transient. */
    dt_tensor *src = ch->master, *tmp = NULL, *full = NULL;
    if (g->dtype != DT_DTYPE_F32) {
        if (z->stage == 2)
            src = ch->gpart;
        else
            st = dt__zero_chunk_tensor(z, z->state_layout, g->dtype, ch->len, 0, &tmp);
        if (tmp)
            src = tmp;
        for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
            int64_t off, len;
            dt__zero_local_range(ch->master, i, &off, &len);
            if (len > 0)
                st = dt_kernel_cast(len, dt_tensor_local(ch->master, i)->data, DT_DTYPE_F32,
                                    dt_tensor_local(src, i)->data, g->dtype);
        }
    }
    if (st == DT_OK)
        st = dt_relayout(src, z->gather_layout, &full);
    dt_tensor_destroy(tmp);
    for (int i = 0; st == DT_OK && i < z->nlocal; i++)
        st = dt__zero_scatter_out(g, i, ch->start, ch->len, dt_tensor_local(full, i)->data,
                                  g->dtype);
    dt_tensor_destroy(full);
    return st;
}

/* Each gradient in its parameter's gradient layout (a new reference, or a relayout). */
static dt_status grads_in_layout(const dt_zero *z, dt_tensor *const *grads, dt_tensor **out)
{
    dt_status st = DT_OK;
    for (int g = 0; st == DT_OK && g < z->ngroups; g++)
        for (int j = 0; st == DT_OK && j < z->groups[g].nparams; j++) {
            const dt__zparam *p = &z->groups[g].params[j];
            const dt_tensor *t = grads[p->index];
            if (dt_layout_equal(dt_tensor_layout(t), p->grad_layout))
                out[p->index] = dt_tensor_retain(t);
            else
                st = dt_relayout(t, p->grad_layout, &out[p->index]);
        }
    return st;
}

dt_status dt_zero_step(dt_zero *z, dt_tensor *const *grads, dt_zero_step_info *info_out)
{
    static const char fn[] = "dt_zero_step";
    if (!z || (!grads && z->nparams > 0))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: zero and grads are required", fn);
    dt_status st = check_grads(z, grads);
    if (st != DT_OK)
        return st;
    float *scratch = NULL;
    double *vals = calloc((size_t)z->nlocal * 2, sizeof *vals);
    dt_tensor **gl = calloc((size_t)(z->nparams ? z->nparams : 1), sizeof *gl);
    if (!vals || !gl) {
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
        goto out;
    }
    st = dt_host_alloc(DT__ZERO_BLOCK * sizeof(float), (void **)&scratch);
    if (st != DT_OK)
        goto out;

    /* Reduction over the dp dim, chunk by chunk. */
    st = grads_in_layout(z, grads, gl);
    for (int g = 0; st == DT_OK && g < z->ngroups; g++)
        for (int c = 0; st == DT_OK && c < z->groups[g].nchunks; c++)
            st = reduce_chunk(z, &z->groups[g], &z->groups[g].chunks[c], gl);
    for (int j = 0; j < z->nparams; j++) {
        dt_tensor_destroy(gl[j]);
        gl[j] = NULL;
    }
    if (st != DT_OK)
        goto out;

    /* Overflow and global norm, agreed over the whole mesh. */
    double agreed[2] = {0.0, 0.0};
    st = local_norms(z, scratch, vals);
    if (st == DT_OK)
        st = dt__zero_allreduce(z, DT_REDUCE_SUM, 2, vals, agreed);
    if (st != DT_OK)
        goto out;
    dt_zero_step_info info;
    memset(&info, 0, sizeof info);
    info.iteration = z->scaler.iteration;
    info.loss_scale = dt__scaler_scale(&z->scaler);
    info.clip_coef = 1.0;
    int overflow = agreed[1] > 0.0;
    double norm = sqrt(agreed[0]) / info.loss_scale;
    if (overflow) {
        dt__scaler_update(&z->scaler, 1);
        info.step = z->step;
        info.skipped = 1;
        info.grad_norm = INFINITY;
        info.next_loss_scale = dt__scaler_scale(&z->scaler);
        if (z->on_overflow)
            z->on_overflow(z->on_overflow_arg, &info);
        if (info_out)
            *info_out = info;
        goto out;
    }
    if (z->clip_norm > 0.0 && norm > z->clip_norm)
        info.clip_coef = z->clip_norm / (norm + 1e-6);
    float grad_scale = (float)(info.clip_coef / info.loss_scale);

    /* The inner optimizer on every fp32 partition, then the all-gather. */
    for (int g = 0; st == DT_OK && g < z->ngroups; g++)
        for (int c = 0; st == DT_OK && c < z->groups[g].nchunks; c++)
            st = update_chunk(z, &z->groups[g], &z->groups[g].chunks[c], grad_scale,
                              z->step + 1, scratch);
    for (int g = 0; st == DT_OK && g < z->ngroups; g++)
        for (int c = 0; st == DT_OK && c < z->groups[g].nchunks; c++)
            st = gather_chunk(z, &z->groups[g], &z->groups[g].chunks[c]);
    if (st != DT_OK)
        goto out;
    z->step++;
    dt__scaler_update(&z->scaler, 0);
    info.step = z->step;
    info.grad_norm = norm;
    info.next_loss_scale = dt__scaler_scale(&z->scaler);
    if (info_out)
        *info_out = info;

out:
    for (int j = 0; gl && j < z->nparams; j++)
        dt_tensor_destroy(gl[j]);
    free(gl);
    free(vals);
    dt_host_free(scratch);
    return st;
}
