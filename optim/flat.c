/* Flattening: a group's parameters as runs of one flat buffer per model coordinate, the chunk
 * tensors over it, and the copies between the parameters' local components and flat ranges
 * (the devices' cast kernels). */
#include <stdlib.h>
#include <string.h>

#include "layout/tensor_dev.h"
#include "optim/optim_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

int dt__zero_segments(const dt__zgroup *g, int64_t lo, int64_t hi, dt__zseg *segs)
{
    /* Parameters are in offset order: find the first run ending after lo. */
    int a = 0, b = g->nparams;
    while (a < b) {
        int mid = a + (b - a) / 2;
        const dt__zparam *p = &g->params[mid];
        if (p->offset + p->n <= lo)
            a = mid + 1;
        else
            b = mid;
    }
    int count = 0;
    for (int j = a; j < g->nparams && g->params[j].offset < hi; j++) {
        const dt__zparam *p = &g->params[j];
        int64_t s = p->offset > lo ? p->offset : lo;
        int64_t e = p->offset + p->n < hi ? p->offset + p->n : hi;
        if (e <= s)
            continue;
        segs[count].param = p;
        segs[count].pos = s - p->offset;
        segs[count].flat = s;
        segs[count].len = e - s;
        count++;
    }
    return count;
}

dt_status dt__zero_chunk_tensor(const dt_zero *z, const dt_layout *layout, dt_dtype dtype,
                                int64_t len, int zeroed, dt_tensor **out)
{
    int64_t shape[DT_MAX_RANK];
    for (int j = 0; j < z->k; j++)
        shape[j] = dt_mesh_dim_size(z->mesh, z->nondp[j]);
    shape[z->k] = len;
    return zeroed ? dt_tensor_zeros(layout, dtype, shape, out)
                  : dt__tensor_empty(layout, dtype, shape, out);
}

void dt__zero_local_range(const dt_tensor *t, int i, int64_t *off, int64_t *len)
{
    int last = dt_tensor_rank(t) - 1;
    *off = dt_tensor_local_offset(t, i)[last];
    *len = dt_tensor_local(t, i)->shape[last];
}

/* Elements of [pos, pos + len) present in a local form of `numel` elements. */
static int64_t present(int64_t numel, int64_t pos, int64_t len)
{
    int64_t c = numel - pos;
    return c < 0 ? 0 : (c > len ? len : c);
}

dt_status dt__zero_gather_in(const dt_zero *z, const dt__zgroup *g, int i, int64_t lo,
                             int64_t n, dt_tensor *const *src_tensors, void *dst,
                             dt_dtype dst_dtype)
{
    const dt__device *dev = z->devs[i];
    const dt__ops_backend *be = NULL;
    dt_status st = dt__zero_select(z, i, &be);
    if (st != DT_OK)
        return st;
    dt__zseg *segs = malloc((size_t)(g->nparams ? g->nparams : 1) * sizeof *segs);
    if (!segs)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero: no memory for %d segments", g->nparams);
    size_t dsz = dt_dtype_size(dst_dtype);
    int ns = dt__zero_segments(g, lo, lo + n, segs);
    for (int s = 0; st == DT_OK && s < ns; s++) {
        const dt__zparam *p = segs[s].param;
        const dt_tensor *src = src_tensors ? src_tensors[p->index] : p->tensor;
        const DLTensor *d = dt_tensor_local(src, i);
        dt_dtype sd = dt_tensor_dtype(src);
        int64_t c = present(dt__numel(d->ndim, d->shape), segs[s].pos, segs[s].len);
        char *out = (char *)dst + (size_t)(segs[s].flat - lo) * dsz;
        if (c > 0)
            st = be->cast(c, (const char *)d->data + (size_t)segs[s].pos * dt_dtype_size(sd),
                          sd, out, dst_dtype);
        if (st == DT_OK && segs[s].len > c)
            st = dev->kind->memset0(dev, out + (size_t)c * dsz,
                                    (size_t)(segs[s].len - c) * dsz);
    }
    free(segs);
    return st;
}

/* scatter_out on the CPU: the segments' copies split among the cores by element. */
typedef struct copy_job {
    const dt__ops_backend *be;
    int ns;
    const char *const *src;
    char *const *dst;
    const int64_t *start; /* ns + 1 */
    dt_dtype sd, dd;
} copy_job;

static dt_status copy_range(int64_t lo, int64_t hi, void *arg)
{
    const copy_job *j = arg;
    size_t ss = dt_dtype_size(j->sd), ds = dt_dtype_size(j->dd);
    dt_status st = DT_OK;
    for (int s = 0; st == DT_OK && s < j->ns; s++) {
        int64_t a = lo > j->start[s] ? lo : j->start[s];
        int64_t b = hi < j->start[s + 1] ? hi : j->start[s + 1];
        int64_t o = a - j->start[s];
        if (a < b)
            st = j->be->cast(b - a, j->src[s] + (size_t)o * ss, j->sd,
                             j->dst[s] + (size_t)o * ds, j->dd);
    }
    return st;
}

static dt_status scatter_out_cpu(const dt_zero *z, const dt__zgroup *g, int i, int64_t lo,
                                 const dt__ops_backend *be, const dt__zseg *segs, int ns,
                                 const void *src, dt_dtype src_dtype)
{
    const char **from = malloc((size_t)(ns ? ns : 1) * sizeof *from);
    char **to = malloc((size_t)(ns ? ns : 1) * sizeof *to);
    int64_t *start = malloc((size_t)(ns + 1) * sizeof *start);
    dt_status st = from && to && start ? DT_OK
                   : dt__error(DT_ERR_NO_MEMORY, "dt_zero: no memory for %d segments", ns);
    size_t ssz = dt_dtype_size(src_dtype);
    int n = 0;
    if (st == DT_OK)
        start[0] = 0;
    for (int s = 0; st == DT_OK && s < ns; s++) {
        const dt__zparam *p = segs[s].param;
        const DLTensor *d = dt_tensor_local(p->tensor, i);
        int64_t c = present(dt__numel(d->ndim, d->shape), segs[s].pos, segs[s].len);
        if (c <= 0)
            continue;
        from[n] = (const char *)src + (size_t)(segs[s].flat - lo) * ssz;
        to[n] = (char *)d->data + (size_t)segs[s].pos * dt_dtype_size(g->dtype);
        start[n + 1] = start[n] + c;
        n++;
    }
    (void)z;
    if (st == DT_OK) {
        copy_job j = {be, n, from, to, start, src_dtype, g->dtype};
        st = dt__zero_par(start[n], (int64_t)1 << 20, NULL, copy_range, &j);
    }
    free(from);
    free(to);
    free(start);
    return st;
}

dt_status dt__zero_scatter_out(const dt_zero *z, const dt__zgroup *g, int i, int64_t lo,
                               int64_t n, const void *src, dt_dtype src_dtype)
{
    const dt__ops_backend *be = NULL;
    dt_status st = dt__zero_select(z, i, &be);
    if (st != DT_OK)
        return st;
    dt__zseg *segs = malloc((size_t)(g->nparams ? g->nparams : 1) * sizeof *segs);
    if (!segs)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero: no memory for %d segments", g->nparams);
    size_t ssz = dt_dtype_size(src_dtype);
    int ns = dt__zero_segments(g, lo, lo + n, segs);
    if (be == dt__ops_cpu_backend()) {
        st = scatter_out_cpu(z, g, i, lo, be, segs, ns, src, src_dtype);
        free(segs);
        return st;
    }
    for (int s = 0; st == DT_OK && s < ns; s++) {
        const dt__zparam *p = segs[s].param;
        const DLTensor *d = dt_tensor_local(p->tensor, i);
        int64_t c = present(dt__numel(d->ndim, d->shape), segs[s].pos, segs[s].len);
        if (c > 0)
            st = be->cast(c, (const char *)src + (size_t)(segs[s].flat - lo) * ssz, src_dtype,
                          (char *)d->data + (size_t)segs[s].pos * dt_dtype_size(g->dtype),
                          g->dtype);
    }
    free(segs);
    return st;
}

int dt__zero_counts(const dt_zero *z, const dt__zparam *p, int i)
{
    for (int d = 0; d < dt_mesh_rank(z->mesh); d++)
        if ((p->rep_mask >> d & 1u) && z->coords[i][d] != 0)
            return 0;
    return z->stage != 0 || z->coords[i][z->dp] == 0;
}

static int needs_s1(const dt_optim_hparams *hp)
{
    return hp->kind != DT_OPTIM_SGD || hp->momentum != 0.0f;
}

dt_status dt__zero_alloc_state(dt_zero *z, dt__zgroup *g)
{
    int64_t a = z->allgather_size;
    int64_t nchunks = g->length == 0 ? 0 : (g->length + a - 1) / a;
    if (nchunks > INT32_MAX)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_add_group: allgather_size %lld cuts "
                         "the group's %lld elements into too many chunks", (long long)a,
                         (long long)g->length);
    g->chunks = calloc((size_t)(nchunks ? nchunks : 1), sizeof *g->chunks);
    if (!g->chunks)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_add_group: no memory for %lld chunks",
                         (long long)nchunks);
    g->nchunks = (int)nchunks;
    int adam = g->hp.kind != DT_OPTIM_SGD;
    dt_status st = DT_OK;
    for (int c = 0; st == DT_OK && c < g->nchunks; c++) {
        dt__zchunk *ch = &g->chunks[c];
        ch->start = (int64_t)c * a;
        ch->len = g->length - ch->start < a ? g->length - ch->start : a;
        st = dt__zero_chunk_tensor(z, z->state_layout, DT_DTYPE_F32, ch->len, 0, &ch->master);
        /* Offloaded moments are made in host memory only (offload.c). */
        if (st == DT_OK && needs_s1(&g->hp) && !z->offload)
            st = dt__zero_chunk_tensor(z, z->state_layout, DT_DTYPE_F32, ch->len, 1, &ch->s1);
        if (st == DT_OK && adam && !z->offload)
            st = dt__zero_chunk_tensor(z, z->state_layout, DT_DTYPE_F32, ch->len, 1, &ch->s2);
        if (st == DT_OK && z->stage < 2)
            st = dt__zero_chunk_tensor(z, z->flat_layout, g->gdtype, ch->len, 1, &ch->flat);
        if (st == DT_OK && z->stage == 2)
            st = dt__zero_chunk_tensor(z, z->state_layout, g->gdtype, ch->len, 1, &ch->gpart);
        /* The master partition starts as the parameters' values. */
        for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
            int64_t off, len;
            dt__zero_local_range(ch->master, i, &off, &len);
            st = dt__zero_gather_in(z, g, i, ch->start + off, len, NULL,
                                    dt_tensor_local(ch->master, i)->data, DT_DTYPE_F32);
        }
        if (st == DT_OK && z->offload)
            st = dt__zero_offload_adopt(z, ch, needs_s1(&g->hp), adam);
    }
    dt_status done = dt__zero_sync(z);
    return st != DT_OK ? st : done;
}

void dt__zero_free_group(dt__zgroup *g)
{
    for (int c = 0; g->chunks && c < g->nchunks; c++) {
        dt__zchunk *ch = &g->chunks[c];
        dt_tensor_destroy(ch->master);
        dt_tensor_destroy(ch->s1);
        dt_tensor_destroy(ch->s2);
        dt_tensor_destroy(ch->flat);
        dt_tensor_destroy(ch->gpart);
        dt_tensor_destroy(ch->psh);
        dt__zero_offload_free_chunk(ch);
    }
    free(g->chunks);
    for (int j = 0; g->params && j < g->nparams; j++) {
        free(g->params[j].name);
        dt_tensor_destroy(g->params[j].tensor);
        dt_layout_destroy(g->params[j].grad_layout);
        dt_layout_destroy(g->params[j].layout);
    }
    free(g->params);
    memset(g, 0, sizeof *g);
}

int dt__zero_boxes(int rank, const int64_t *shape, int64_t a, int64_t b, dt__zbox *boxes)
{
    int64_t stride[DT_MAX_RANK + 1];
    stride[rank] = 1;
    for (int d = rank - 1; d >= 0; d--)
        stride[d] = stride[d + 1] * shape[d];
    int count = 0;
    if (rank == 0) {
        if (b > a) {
            boxes[0].start = a;
            boxes[0].len = 1;
            count = 1;
        }
        return count;
    }
    while (a < b) {
        /* The outermost dim d with a on a boundary of its sub-blocks and room for one: the box
         * fixes the dims before d, runs along d, and covers every dim after it. */
        int d = 0;
        while (a % stride[d + 1] != 0 || b - a < stride[d + 1])
            d++;
        int64_t at = a / stride[d + 1] % shape[d];
        int64_t k = (b - a) / stride[d + 1];
        if (k > shape[d] - at)
            k = shape[d] - at;
        dt__zbox *x = &boxes[count++];
        for (int j = 0; j < rank; j++) {
            x->offsets[j] = j < d ? a / stride[j + 1] % shape[j] : j == d ? at : 0;
            x->sizes[j] = j < d ? 1 : j == d ? k : shape[j];
        }
        x->start = a;
        x->len = k * stride[d + 1];
        a += x->len;
    }
    return count;
}
