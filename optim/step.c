/* One ZeRO step: gradients flattened and reduced over the dp dim per chunk (stage 0 all-reduce,
 * stages 1 and 2 reduce-scatter), inf/NaN check and global norm agreed over the mesh, the
 * inner optimizer on each device's fp32 partition with unscaling and clipping fused into its
 * grad_scale, and the all-gather of the updated parameters chunk by chunk. The data stays in
 * the devices' memory: the kernels of each device's table do the work, and the host reads
 * only each device's per-piece norms. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/tensor_dev.h"
#include "optim/optim_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

dt_status dt__zero_check_grad(const dt_zero *z, const char *fn, const dt__zparam *p,
                             const dt_tensor *t)
{
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
    int rank = p->rank;
    int same = dt_tensor_rank(t) == rank;
    for (int d = 0; same && d < rank; d++)
        same = dt_tensor_shape(t)[d] == p->shape[d];
    if (!same) {
        char a[96], b[96];
        return dt__error(DT_ERR_SHAPE,
                         "%s: gradient %d ('%s') has shape %s, the "
                         "parameter %s",
                         fn, p->index, p->name,
                         dt__shape_str(dt_tensor_rank(t), dt_tensor_shape(t), a, sizeof a),
                         dt__shape_str(rank, p->shape, b, sizeof b));
    }
    return DT_OK;
}

static dt_status check_grads(const dt_zero *z, dt_tensor *const *grads)
{
    for (int g = 0; g < z->ngroups; g++)
        for (int j = 0; j < z->groups[g].nparams; j++) {
            const dt__zparam *p = &z->groups[g].params[j];
            dt_status st = dt__zero_check_grad(z, "dt_zero_step", p, grads[p->index]);
            if (st != DT_OK)
                return st;
        }
    return DT_OK;
}

/* The gradient partition of local device i in chunk ch after the reduction: its data (the
 * group's dtype) and its range [*off, *off + *len) of the chunk. */
static void *partition(const dt_zero *z, const dt__zgroup *g, const dt__zchunk *ch, int i,
                       int64_t *off, int64_t *len)
{
    dt__zero_part(z, ch, i, off, len);
    if (z->stage == 2)
        return dt_tensor_local(ch->gpart, i)->data;
    return (char *)dt_tensor_local(ch->flat, i)->data + (size_t)*off * dt_dtype_size(g->gdtype);
}

dt_status dt__zero_flat_for(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch,
                            dt_tensor **flat_out)
{
    *flat_out = ch->flat;
    /* One dp rank: the sum is the summand, so stage 2 fills its partition directly. */
    if (z->stage == 2 && z->dp_size == 1)
        *flat_out = ch->gpart;
    else if (z->stage == 2)
        return dt__zero_chunk_tensor(z, z->flat_layout, g->gdtype, ch->len, 0, flat_out);
    return DT_OK;
}

dt_status dt__zero_reduce_filled(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch,
                                 dt_tensor *flat)
{
    dt_status st = DT_OK, done;
    /* One dp rank: nothing to sum, and the partition is the whole chunk, already in place
     * (the relayouts below would only copy it). */
    if (z->dp_size == 1 && (flat == ch->flat || flat == ch->gpart))
        return DT_OK;
    if (z->stage == 2) {
        st = dt_relayout_into(flat, ch->gpart);
        dt_tensor_destroy(flat);
        return st;
    }
    /* Stages 0 and 1: reduce into a transient chunk, then keep the partition in place in the
     * persistent flat buffer. */
    dt_tensor *red = NULL;
    st = dt_relayout(flat, z->state_layout, &red);
    size_t dsz = dt_dtype_size(g->gdtype);
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        int64_t off, len;
        dt__zero_local_range(red, i, &off, &len);
        const dt__device *dev = z->devs[i];
        if (len > 0)
            st = dev->kind->copy(dev, DT__COPY_D2D,
                                 (char *)dt_tensor_local(flat, i)->data + (size_t)off * dsz,
                                 dt_tensor_local(red, i)->data, (size_t)len * dsz);
    }
    done = red ? dt__zero_sync(z) : DT_OK;
    dt_tensor_destroy(red);
    return st != DT_OK ? st : done;
}

static dt_status reduce_chunk(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch,
                              dt_tensor *const *grads)
{
    dt_tensor *flat = NULL;
    dt_status st = dt__zero_flat_for(z, g, ch, &flat);
    for (int i = 0; st == DT_OK && i < z->nlocal; i++)
        st = dt__zero_gather_in(z, g, i, ch->start, ch->len, grads,
                                dt_tensor_local(flat, i)->data, g->gdtype);
    dt_status done = dt__zero_sync(z);
    if (st == DT_OK)
        st = done;
    if (st == DT_OK)
        return dt__zero_reduce_filled(z, g, ch, flat);
    if (flat != ch->flat)
        dt_tensor_destroy(flat);
    return st;
}

/* One dp rank, gradients given, state in device memory, parameters whole (stages 0-2): the
 * reduction has nothing to sum, so the norm and the update read each gradient where it lies
 * (gl, in its gradient layout) instead of a copy in the flat buffer. Only where the copy would
 * be a plain one: every gradient of its group's gradient dtype, and every local piece filling
 * its run of the flat buffer (no zero padding). Elementwise kernels over the same elements
 * and per-piece norms, so the same bits as through the flat buffer. */
static int direct_grads(const dt_zero *z, dt_tensor *const *gl)
{
    if (!gl || z->dp_size != 1 || z->offload || z->sharded_params || z->stage > 2)
        return 0;
    for (int gi = 0; gi < z->ngroups; gi++) {
        const dt__zgroup *g = &z->groups[gi];
        for (int j = 0; j < g->nparams; j++) {
            const dt__zparam *p = &g->params[j];
            const dt_tensor *t = gl[p->index];
            if (!t || dt_tensor_dtype(t) != g->gdtype || dt_tensor_num_local(t) != z->nlocal)
                return 0;
            for (int i = 0; i < z->nlocal; i++) {
                const DLTensor *d = dt_tensor_local(t, i);
                if (dt__numel(d->ndim, d->shape) != p->n)
                    return 0;
            }
        }
    }
    return 1;
}

/* Where element `flat` of group g's gradient lies for device i: in gl (direct_grads), else
 * at `data`, the partition that starts at flat index lo. */
static const char *grad_at(const dt__zgroup *g, dt_tensor *const *gl, int i, const dt__zseg *sg,
                           const char *data, int64_t lo)
{
    size_t dsz = dt_dtype_size(g->gdtype);
    if (gl)
        return (const char *)dt_tensor_local(gl[sg->param->index], i)->data +
               (size_t)sg->pos * dsz;
    return data + (size_t)(sg->flat - lo) * dsz;
}

/* One device's pieces of the gradient norm: for each parameter piece in its gradient
 * partitions (in group, chunk, piece order) either its f64 sum of squares, when the device
 * counts the parameter, or its inf/NaN flag. The results are in device memory. */
typedef struct norm_parts {
    int64_t count;
    unsigned char *counted;   /* host: 1 if piece k has a sum, 0 if a flag */
    void *mem;                /* device: count doubles (sums), then count int32 (flags) */
} norm_parts;

/* A piece of the norm on the CPU: its elements, and whether it is counted. */
typedef struct norm_item {
    const char *x;
    int64_t len;
    dt_dtype dtype;
    int counted;
} norm_item;

typedef struct norm_job {
    const dt__ops_backend *be;
    const norm_item *items;
    double *sums;
    int32_t *flags;
} norm_job;

/* Pieces [lo, hi): each its own sum (or flag), so any split gives the same bits. */
static dt_status norm_range(int64_t lo, int64_t hi, void *arg)
{
    const norm_job *j = arg;
    dt_status st = DT_OK;
    for (int64_t k = lo; st == DT_OK && k < hi; k++) {
        const norm_item *it = &j->items[k];
        st = it->counted ? j->be->sq_sum_f64(it->len, it->x, it->dtype, j->sums + k)
                         : j->be->nonfinite(it->len, it->x, it->dtype, j->flags + k);
    }
    return st;
}

/* Counts device i's pieces (be NULL), or issues their kernels into np (be non-NULL; on the
 * CPU, run at the end split among the cores, dt__zero_par). */
static dt_status norm_pass(const dt_zero *z, int i, const dt__ops_backend *be,
                           dt_tensor *const *gl, norm_parts *np)
{
    dt_status st = DT_OK;
    int64_t k = 0;
    double *sums = np->mem;
    int32_t *flags = be ? (int32_t *)(sums + np->count) : NULL;
    int cpu = be == dt__ops_cpu_backend();
    norm_item *items = NULL;
    int64_t *cost = NULL;
    if (cpu) {
        items = malloc((size_t)(np->count + 1) * sizeof *items);
        cost = malloc((size_t)(np->count + 1) * sizeof *cost);
        if (!items || !cost) {
            free(items);
            free(cost);
            return dt__error(DT_ERR_NO_MEMORY, "dt_zero_step: no memory");
        }
        cost[0] = 0;
    }
    for (int gi = 0; st == DT_OK && gi < z->ngroups; gi++) {
        const dt__zgroup *g = &z->groups[gi];
        dt__zseg *segs = malloc((size_t)g->nparams * sizeof *segs);
        if (!segs)
            return dt__error(DT_ERR_NO_MEMORY, "dt_zero_step: no memory");
        for (int c = 0; st == DT_OK && c < g->nchunks; c++) {
            int64_t off, len;
            const char *data = partition(z, g, &g->chunks[c], i, &off, &len);
            int64_t lo = g->chunks[c].start + off;
            int ns = dt__zero_segments(g, lo, lo + len, segs);
            for (int s = 0; st == DT_OK && s < ns; s++, k++) {
                if (!be)
                    continue;
                const char *x = grad_at(g, gl, i, &segs[s], data, lo);
                np->counted[k] = (unsigned char)dt__zero_counts(z, segs[s].param, i);
                if (cpu && k < np->count) {
                    items[k] = (norm_item){x, segs[s].len, g->gdtype, np->counted[k]};
                    cost[k + 1] = cost[k] + segs[s].len;
                } else if (np->counted[k])
                    st = be->sq_sum_f64(segs[s].len, x, g->gdtype, sums + k);
                else
                    st = be->nonfinite(segs[s].len, x, g->gdtype, flags + k);
            }
        }
        free(segs);
    }
    if (cpu && st == DT_OK && k == np->count) {
        norm_job j = {be, items, sums, flags};
        st = dt__zero_par(k, (int64_t)1 << 20, cost, norm_range, &j);
    } else if (cpu && st == DT_OK)
        st = dt__error(DT_ERR_STATE, "dt_zero_step: %lld norm pieces, %lld counted before",
                       (long long)k, (long long)np->count);
    free(items);
    free(cost);
    np->count = k;
    return st;
}

/* Device i's counted sum of squares (the pieces' sums added in order on the host) and
 * whether it saw an inf/NaN, from its finished pieces. */
static dt_status norm_collect(const dt_zero *z, int i, const norm_parts *np, double *sq_out,
                              int *bad_out)
{
    const dt__device *dev = z->devs[i];
    size_t bytes = (size_t)np->count * (sizeof(double) + sizeof(int32_t));
    double *sums = malloc(bytes ? bytes : 1);
    if (!sums)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_step: no memory");
    dt_status st = bytes ? dev->kind->copy(dev, DT__COPY_D2H, sums, np->mem, bytes) : DT_OK;
    const int32_t *flags = (const int32_t *)(sums + np->count);
    double sq = 0.0;
    int bad = 0;
    for (int64_t k = 0; st == DT_OK && k < np->count; k++) {
        if (np->counted[k]) {
            sq += sums[k];
            bad |= !isfinite(sums[k]);
        } else {
            bad |= flags[k] != 0;
        }
    }
    free(sums);
    *sq_out = sq;
    *bad_out = bad;
    return st;
}

/* vals[i*2]: this device's counted sum of squares; vals[i*2+1]: 1 if it saw an inf/NaN. */
static dt_status local_norms(const dt_zero *z, dt_tensor *const *gl, double *vals)
{
    norm_parts *np = calloc((size_t)z->nlocal, sizeof *np);
    if (!np)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_step: no memory");
    dt_status st = DT_OK;
    /* Every device's kernels first, then one wait, then the host sums. */
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        const dt__device *dev = z->devs[i];
        const dt__ops_backend *be = NULL;
        st = norm_pass(z, i, NULL, gl, &np[i]);
        size_t bytes = (size_t)np[i].count * (sizeof(double) + sizeof(int32_t));
        np[i].counted = malloc((size_t)np[i].count + 1);
        if (st == DT_OK && !np[i].counted)
            st = dt__error(DT_ERR_NO_MEMORY, "dt_zero_step: no memory");
        if (st == DT_OK)
            st = dev->kind->alloc(dev, bytes ? bytes : 1, &np[i].mem);
        if (st == DT_OK)
            st = dt__zero_select(z, i, &be);
        if (st == DT_OK)
            st = norm_pass(z, i, be, gl, &np[i]);
    }
    dt_status done = dt__zero_sync(z);
    if (st == DT_OK)
        st = done;
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        double sq = 0.0;
        int bad = 0;
        st = norm_collect(z, i, &np[i], &sq, &bad);
        vals[2 * i] = isfinite(sq) ? sq : 0.0;
        vals[2 * i + 1] = bad ? 1.0 : 0.0;
    }
    for (int i = 0; i < z->nlocal; i++) {
        if (np[i].mem)
            z->devs[i]->kind->free(z->devs[i], np[i].mem);
        free(np[i].counted);
    }
    free(np);
    return st;
}

/* The inner optimizer on elements [at0, at0 + n) of device i's partition (master p, moments
 * m, v at those offsets) with their gradients at gp; 16-bit gradients are widened block by
 * block into `scratch` (DT__ZERO_BLOCK floats). */
static dt_status update_run(const dt__ops_backend *be, const dt__zgroup *g,
                            const dt_sgd_opts *so, const dt_adam_opts *ao, int64_t t, int64_t n,
                            const char *gp, float *p, float *m, float *v, void *scratch)
{
    dt_status st = DT_OK;
    int64_t block = g->gdtype == DT_DTYPE_F32 ? (n > 0 ? n : 1) : DT__ZERO_BLOCK;
    for (int64_t at = 0; st == DT_OK && at < n; at += block) {
        int64_t b = n - at < block ? n - at : block;
        const float *gf = (const float *)gp + at;
        if (g->gdtype != DT_DTYPE_F32) {
            st = be->cast(b, gp + (size_t)at * 2, g->gdtype, scratch, DT_DTYPE_F32);
            gf = scratch;
        }
        if (st != DT_OK)
            break;
        if (g->hp.kind == DT_OPTIM_SGD)
            st = be->sgd(b, so, p + at, gf, m ? m + at : NULL);
        else
            st = be->adam(b, ao, t, p + at, gf, m + at, v + at);
    }
    return st;
}

/* f32 gradients on the CPU: the chunk's runs of elements (one, or one per piece with
 * direct_grads), updated split among the cores by element (dt__zero_par; the update is
 * elementwise, so the bits are one thread's). */
typedef struct upd_run {
    const char *gp;
    float *p, *m, *v;
    float *dst; /* fused_copy: the parameter's elements, written from p as they are updated */
} upd_run;

/* Group g's updated master is copied into its parameters inside the update, block by block
 * while in cache (update_range), instead of by a second pass (gather_chunk): gradients read
 * where they lie (one dp rank, parameters whole, direct_grads), f32 gradients and
 * parameters, CPU devices. */
static int fused_copy(const dt_zero *z, const dt__zgroup *g, dt_tensor *const *gl)
{
    if (!gl || g->gdtype != DT_DTYPE_F32 || g->dtype != DT_DTYPE_F32 || z->sharded_params ||
        z->offload || z->dp_size != 1)
        return 0;
    for (int i = 0; i < z->nlocal; i++)
        if (z->devs[i]->kind->ops() != dt__ops_cpu_backend())
            return 0;
    return 1;
}

/* Elements updated, then copied, at a time (64 KiB of each array: in L2). */
#define FUSED_BLOCK 16384

typedef struct upd_job {
    const dt__ops_backend *be;
    const dt__zgroup *g;
    const dt_sgd_opts *so;
    const dt_adam_opts *ao;
    int64_t t;
    int nr;
    const upd_run *r;
    const int64_t *start; /* nr + 1: run r is elements [start[r], start[r + 1]) */
} upd_job;

static dt_status update_range(int64_t lo, int64_t hi, void *arg)
{
    const upd_job *j = arg;
    dt_status st = DT_OK;
    for (int r = 0; st == DT_OK && r < j->nr; r++) {
        int64_t a = lo > j->start[r] ? lo : j->start[r];
        int64_t b = hi < j->start[r + 1] ? hi : j->start[r + 1];
        if (a >= b)
            continue;
        const upd_run *x = &j->r[r];
        for (int64_t e = a; st == DT_OK && e < b; e += x->dst ? FUSED_BLOCK : b - a) {
            int64_t o = e - j->start[r], n = b - e;
            if (x->dst && n > FUSED_BLOCK)
                n = FUSED_BLOCK;
            st = update_run(j->be, j->g, j->so, j->ao, j->t, n, x->gp + (size_t)o * sizeof(float),
                            x->p + o, x->m ? x->m + o : NULL, x->v ? x->v + o : NULL, NULL);
            if (st == DT_OK && x->dst)
                memcpy(x->dst + o, x->p + o, (size_t)n * sizeof(float));
        }
    }
    return st;
}

/* The inner optimizer on local device i's partition of chunk ch, reading the gradients from
 * the partition, or piece by piece from gl (direct_grads). */
static dt_status update_chunk(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch,
                              float grad_scale, int64_t t, dt_tensor *const *gl,
                              void *const *scratch)
{
    const dt_optim_hparams *hp = &g->hp;
    dt_sgd_opts so = {hp->lr, hp->momentum, hp->dampening, hp->weight_decay, hp->nesterov,
                      grad_scale};
    dt_adam_opts ao = {hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay,
                       hp->kind == DT_OPTIM_ADAMW, grad_scale};
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        const dt__ops_backend *be = NULL;
        st = dt__zero_select(z, i, &be);
        if (st != DT_OK)
            break;
        int64_t off, len;
        const char *gp = partition(z, g, ch, i, &off, &len);
        float *p = dt_tensor_local(ch->master, i)->data;
        float *m = ch->s1 ? dt_tensor_local(ch->s1, i)->data : NULL;
        float *v = ch->s2 ? dt_tensor_local(ch->s2, i)->data : NULL;
        if (be == dt__ops_cpu_backend() && g->gdtype == DT_DTYPE_F32) {
            int cap = gl ? (g->nparams ? g->nparams : 1) : 1;
            upd_run *r = malloc((size_t)cap * sizeof *r);
            int64_t *start = malloc((size_t)(cap + 1) * sizeof *start);
            dt__zseg *segs = gl ? malloc((size_t)cap * sizeof *segs) : NULL;
            if (!r || !start || (gl && !segs)) {
                free(r);
                free(start);
                free(segs);
                return dt__error(DT_ERR_NO_MEMORY, "dt_zero_step: no memory");
            }
            int nr = 0;
            start[0] = 0;
            int fuse = fused_copy(z, g, gl);
            if (!gl) {
                r[nr++] = (upd_run){gp, p, m, v, NULL};
                start[1] = len;
            } else {
                int64_t lo = ch->start + off;
                int ns = dt__zero_segments(g, lo, lo + len, segs);
                for (int s = 0; s < ns; s++, nr++) {
                    int64_t k = segs[s].flat - lo;
                    float *dst = fuse ? (float *)dt_tensor_local(segs[s].param->tensor, i)->data +
                                            segs[s].pos
                                      : NULL;
                    r[nr] = (upd_run){grad_at(g, gl, i, &segs[s], gp, lo), p + k,
                                      m ? m + k : NULL, v ? v + k : NULL, dst};
                    start[nr + 1] = start[nr] + segs[s].len;
                }
            }
            upd_job j = {be, g, &so, &ao, t, nr, r, start};
            st = dt__zero_par(start[nr], (int64_t)1 << 18, NULL, update_range, &j);
            free(r);
            free(start);
            free(segs);
            continue;
        }
        if (!gl) {
            st = update_run(be, g, &so, &ao, t, len, gp, p, m, v, scratch[i]);
            continue;
        }
        int64_t lo = ch->start + off;
        dt__zseg *segs = malloc((size_t)(g->nparams ? g->nparams : 1) * sizeof *segs);
        if (!segs)
            return dt__error(DT_ERR_NO_MEMORY, "dt_zero_step: no memory");
        int ns = dt__zero_segments(g, lo, lo + len, segs);
        for (int s = 0; st == DT_OK && s < ns; s++) {
            int64_t k = segs[s].flat - lo;
            st = update_run(be, g, &so, &ao, t, segs[s].len, grad_at(g, gl, i, &segs[s], gp, lo),
                            p + k, m ? m + k : NULL, v ? v + k : NULL, scratch[i]);
        }
        free(segs);
    }
    return st;
}

/* Writes the chunk's fp32 partitions back into the parameters (an all-gather in stages 1
 * and 2). */
static dt_status gather_chunk(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch)
{
    dt_status st = DT_OK, done;
    if (z->stage == 0) {
        /* The state is replicated over dp: every device holds the whole chunk. */
        for (int i = 0; st == DT_OK && i < z->nlocal; i++)
            st = dt__zero_scatter_out(z, g, i, ch->start, ch->len,
                                      dt_tensor_local(ch->master, i)->data, DT_DTYPE_F32);
        done = dt__zero_sync(z);
        return st != DT_OK ? st : done;
    }
    /* The partition in the parameters' dtype: the master itself (f32), the gradient
     * partition's buffer (stage 2, gradients of the parameters' dtype: they are spent), or a
     * transient. */
    dt_tensor *src = ch->master, *tmp = NULL, *full = NULL;
    if (g->dtype != DT_DTYPE_F32) {
        if (z->stage == 2 && g->gdtype == g->dtype)
            src = ch->gpart;
        else
            st = dt__zero_chunk_tensor(z, z->state_layout, g->dtype, ch->len, 0, &tmp);
        if (tmp)
            src = tmp;
        if (st == DT_OK)
            st = dt__zero_cast_master(z, g, ch, src);
        done = dt__zero_sync(z);
        if (st == DT_OK)
            st = done;
    }
    /* One dp rank: the partition is the whole chunk; the all-gather would only copy it. */
    const dt_tensor *from = src;
    if (st == DT_OK && z->dp_size > 1) {
        st = dt_relayout(src, z->gather_layout, &full);
        from = full;
    }
    for (int i = 0; st == DT_OK && i < z->nlocal; i++)
        st = dt__zero_scatter_out(z, g, i, ch->start, ch->len, dt_tensor_local(from, i)->data,
                                  g->dtype);
    done = dt__zero_sync(z);
    dt_tensor_destroy(full);
    dt_tensor_destroy(tmp);
    return st != DT_OK ? st : done;
}

/* Each gradient in its parameter's gradient layout (a new reference where it is placed alike,
 * or a relayout). */
static dt_status grads_in_layout(const dt_zero *z, dt_tensor *const *grads, dt_tensor **out)
{
    dt_status st = DT_OK;
    for (int g = 0; st == DT_OK && g < z->ngroups; g++)
        for (int j = 0; st == DT_OK && j < z->groups[g].nparams; j++) {
            const dt__zparam *p = &z->groups[g].params[j];
            const dt_tensor *t = grads[p->index];
            if (dt__layout_same_placement(dt_tensor_layout(t), p->grad_layout))
                out[p->index] = dt_tensor_retain(t);
            else
                st = dt_relayout(t, p->grad_layout, &out[p->index]);
        }
    return st;
}

/* The gradients of the pending step freed (after its end, or a failure). */
static void pending_close(dt_zero *z)
{
    for (int j = 0; z->pending.gl && j < z->nparams; j++)
        dt_tensor_destroy(z->pending.gl[j]);
    free(z->pending.gl);
    memset(&z->pending, 0, sizeof z->pending);
}

/* The step's first half: the checks, the reduction over the dp dim and the sum of squares and
 * overflow flag agreed over the mesh. Leaves the step pending on success. */
static dt_status step_begin(const char *fn, dt_zero *z, dt_tensor *const *grads, double *sq_out,
                            int *overflow_out)
{
    if (!z || (!grads && z->nparams > 0 && z->nready == 0))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: zero and grads are required (or every "
                         "parameter's dt_zero_grad_ready first)", fn);
    dt_status st = DT_OK;
    if (z->pending.open)
        st = dt__error(DT_ERR_STATE, "%s: a step begun by dt_zero_step_begin is not ended "
                       "(dt_zero_step_end)", fn);
    if (st == DT_OK && grads && z->nready > 0)
        st = dt__error(DT_ERR_STATE, "%s: grads given after %d parameters were made ready by "
                       "dt_zero_grad_ready (pass NULL)", fn, z->nready);
    for (int j = 0; st == DT_OK && !grads && j < z->nparams; j++)
        if (!z->ready[j])
            st = dt__error(DT_ERR_STATE, "%s: parameter %d ('%s') was not made ready by "
                           "dt_zero_grad_ready", fn, j, dt__zero_param(z, j, NULL)->name);
    if (st == DT_OK && grads)
        st = check_grads(z, grads);
    if (st == DT_OK && z->sharded_params)
        st = dt__zero_s3_idle(z, fn);
    if (st != DT_OK) {
        if (!z->pending.open)
            dt__zero_ready_reset(z);
        return st;
    }
    double *vals = calloc((size_t)z->nlocal * 2, sizeof *vals);
    dt_tensor **gl = calloc((size_t)(z->nparams ? z->nparams : 1), sizeof *gl);
    if (!vals || !gl) {
        free(vals);
        free(gl);
        dt__zero_ready_reset(z);
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    }
    z->pending.open = 1;
    z->pending.gl = gl;

    /* Reduction over the dp dim, chunk by chunk (done already after dt_zero_grad_ready, or in
     * flight). */
    double t_reduce = MPI_Wtime();
    if (grads)
        st = grads_in_layout(z, grads, gl);
    int direct = st == DT_OK && direct_grads(z, grads ? gl : NULL);
    for (int g = 0; st == DT_OK && grads && !direct && g < z->ngroups; g++)
        for (int c = 0; st == DT_OK && c < z->groups[g].nchunks; c++)
            st = reduce_chunk(z, &z->groups[g], &z->groups[g].chunks[c], gl);
    if (st == DT_OK && !grads && z->overlap)
        st = dt__zero_buckets_wait(z);
    t_reduce = MPI_Wtime() - t_reduce;
    dt__zero_ready_reset(z);
    for (int j = 0; !direct && j < z->nparams; j++) {
        dt_tensor_destroy(gl[j]);
        gl[j] = NULL;
    }
    z->pending.direct = direct;

    /* Overflow and global norm, agreed over the whole mesh. */
    double agreed[2] = {0.0, 0.0};
    if (st == DT_OK)
        st = local_norms(z, direct ? gl : NULL, vals);
    if (st == DT_OK)
        st = dt__zero_allreduce(z, DT_REDUCE_SUM, 2, vals, agreed);
    free(vals);
    if (st != DT_OK) {
        pending_close(z);
        return st;
    }
    dt_zero_step_info *info = &z->pending.info;
    info->iteration = z->scaler.iteration;
    info->loss_scale = dt__scaler_scale(&z->scaler);
    info->clip_coef = 1.0;
    info->reduce_wait_s = t_reduce;
    if (!grads && z->overlap) {
        info->reduce_copy_s = z->t_copy_in + z->t_copy;
        info->reduce_sum_s = z->t_sum;
    }
    z->t_copy_in = z->t_copy = z->t_sum = 0;
    *sq_out = agreed[0];
    *overflow_out = agreed[1] > 0.0;
    return DT_OK;
}

/* The second half: the overflow decision and clip factor from (sq, overflow), the update and
 * the all-gather. Ends the pending step whatever happens. */
static dt_status step_end(dt_zero *z, double sq, int overflow, dt_zero_step_info *info_out)
{
    dt_zero_step_info info = z->pending.info;
    dt_tensor **gl = z->pending.direct ? z->pending.gl : NULL;
    dt_status st = DT_OK;
    void **scratch = calloc((size_t)z->nlocal, sizeof *scratch);
    if (!scratch) {
        pending_close(z);
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_step: no memory");
    }
    overflow = overflow != 0 || !isfinite(sq);
    double norm = sqrt(sq) / info.loss_scale;
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
    int widen = 0;
    for (int g = 0; g < z->ngroups; g++)
        widen |= z->groups[g].gdtype != DT_DTYPE_F32;
    for (int i = 0; st == DT_OK && widen && !z->offload && i < z->nlocal; i++)
        st = z->devs[i]->kind->alloc(z->devs[i], DT__ZERO_BLOCK * sizeof(float), &scratch[i]);
    for (int g = 0; st == DT_OK && !z->offload && g < z->ngroups; g++)
        for (int c = 0; st == DT_OK && c < z->groups[g].nchunks; c++)
            st = update_chunk(z, &z->groups[g], &z->groups[g].chunks[c], grad_scale,
                              z->step + 1, gl, scratch);
    dt_status done = dt__zero_sync(z);
    if (st == DT_OK)
        st = done;
    for (int g = 0; st == DT_OK && !z->offload && g < z->ngroups; g++)
        for (int c = 0; st == DT_OK && c < z->groups[g].nchunks; c++)
            st = z->sharded_params ? dt__zero_s3_refresh(z, &z->groups[g], &z->groups[g].chunks[c])
                 : fused_copy(z, &z->groups[g], gl) ? DT_OK /* copied in the update */
                                                    : gather_chunk(z, &z->groups[g], &z->groups[g].chunks[c]);
    done = dt__zero_sync(z);
    if (st == DT_OK)
        st = done;
    /* Offload: the update on the host, the transfers overlapped with it (offload.c). */
    if (st == DT_OK && z->offload)
        st = dt__zero_offload_update(z, grad_scale, z->step + 1);
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
    pending_close(z);
    for (int i = 0; i < z->nlocal; i++)
        if (scratch[i])
            z->devs[i]->kind->free(z->devs[i], scratch[i]);
    free(scratch);
    return st;
}

dt_status dt_zero_step(dt_zero *z, dt_tensor *const *grads, dt_zero_step_info *info_out)
{
    double sq = 0.0;
    int overflow = 0;
    dt_status st = step_begin("dt_zero_step", z, grads, &sq, &overflow);
    if (st == DT_OK && z->combine) {
        /* Other optimizers' values (pipeline stages), before the decision. */
        st = z->combine(z->combine_arg, &sq, &overflow);
        if (st != DT_OK)
            pending_close(z);
    }
    if (st != DT_OK)
        return st;
    return step_end(z, sq, overflow, info_out);
}

dt_status dt_zero_step_begin(dt_zero *z, dt_tensor *const *grads, double *sq_sum_out,
                             int *overflow_out)
{
    if (!sq_sum_out || !overflow_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_step_begin: NULL output");
    return step_begin("dt_zero_step_begin", z, grads, sq_sum_out, overflow_out);
}

dt_status dt_zero_step_end(dt_zero *z, double sq_sum, int overflow, dt_zero_step_info *info_out)
{
    if (!z)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_step_end: NULL zero");
    if (!z->pending.open)
        return dt__error(DT_ERR_STATE, "dt_zero_step_end: no step begun (dt_zero_step_begin)");
    return step_end(z, sq_sum, overflow, info_out);
}

dt_status dt__zero_cast_master(const dt_zero *z, const dt__zgroup *g, const dt__zchunk *ch,
                               dt_tensor *dst)
{
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        int64_t off, len;
        const dt__ops_backend *be = NULL;
        dt__zero_local_range(ch->master, i, &off, &len);
        st = dt__zero_select(z, i, &be);
        if (st == DT_OK && len > 0)
            st = be->cast(len, dt_tensor_local(ch->master, i)->data, DT_DTYPE_F32,
                          dt_tensor_local(dst, i)->data, g->dtype);
    }
    return st;
}
