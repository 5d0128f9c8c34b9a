/* The all-reduce of a pattern plan through a transport that shows summands in place (the shm
 * transport's exchange_view, issue 20): each member of a line reduces its own slice of the
 * flattened component, reading every member's summand where it lies and writing the result
 * once into its destination; then an all-gather copies the other members' reduced slices
 * straight out of their destinations. About two passes over the data per process, against
 * five for the reduce-scatter into a middle tensor then the all-gather out of it. Summands are
 * added in member order 0..k-1 with the device kind's own kernels, block by block, so the
 * bits are those of the piece and collective paths. docs/transports.md, "shm". */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "layout/relayout_plan_impl.h"
#include "layout/tensor_dev.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* Elements reduced per block: the destination block stays in cache while k summands are
 * added into it, so the destination is written to memory once. */
enum { BLOCK_BYTES = 32 << 10 };

static atomic_ulong fused_runs;

unsigned long dt__rl_fused_runs(void)
{
    return atomic_load(&fused_runs);
}

int dt__rl_fused_applies(rl_plan *plan)
{
    const rl_coll *c = plan->coll;
    if (!c || c->kind != RL_COLL_ALLREDUCE || dt__rl_plan_transport(plan) != DT_OK ||
        !plan->transport->exchange_view || !plan->nsummands)
        return 0;
    if (dt_mesh_device_type(dt_layout_mesh(plan->src)) != DT_DEVICE_CPU)
        return 0;
    for (int i = 0; i < c->nlines; i++)
        for (int64_t j = 0; j < c->k; j++)
            if (j != c->lines[i].coord && c->lines[i].clients[j] == dt_client_id())
                return 0; /* two members in one client: the collective path's case */
    return 1;
}

/* Member j's slice of n elements split k ways: [*lo, *lo + *len). */
static void slice(int64_t n, int64_t k, int64_t j, int64_t *lo, int64_t *len)
{
    *lo = n / k * j + (j < n % k ? j : n % k);
    *len = n / k + (j < n % k);
}

/* A 1-D region over the component data of n elements: the box [lo, lo + len). */
static dt__region flat(void *data, const dt__device *dev, size_t elem, int64_t n, int64_t lo,
                       int64_t len)
{
    dt__region r = {.base = data, .dev = dev, .rank = 1, .elem = elem};
    r.shape[0] = n;
    r.start[0] = lo;
    r.count[0] = len;
    return r;
}

/* The statistics the fused run moves per line: (k-1) summand slices in, the other members'
 * reduced slices in, as much out; the own summand read in place. */
static void fused_stats(rl_plan *plan, const dt_tensor *dst)
{
    const rl_coll *c = plan->coll;
    const dt_mesh *mesh = dt_layout_mesh(plan->dst);
    size_t elem = dt_dtype_size(plan->dtype);
    for (int i = 0; i < c->nlines; i++) {
        const rl_line *ln = &c->lines[i];
        const DLTensor *d = dt_tensor_local(dst, ln->local);
        int64_t n = dt__numel(d->ndim, d->shape), lo, len;
        slice(n, c->k, ln->coord, &lo, &len);
        uint64_t moved = (uint64_t)((c->k - 1) * len + (n - len)) * elem;
        int id = dt_mesh_device_id(mesh, ln->pos);
        for (int s = 0; s < plan->nstats; s++) {
            dt_relayout_stats *x = &plan->stats[s];
            if (x->device_type != DT_DEVICE_CPU || x->device_id != id)
                continue;
            x->bytes_sent = x->bytes_received = moved;
            x->bytes_sent_remote = x->bytes_received_remote = moved;
            x->bytes_sent_cross_host = x->bytes_received_cross_host = 0;
            x->bytes_self = (uint64_t)len * elem;
        }
    }
}

typedef struct fused_run {
    rl_plan *plan;
    const dt_tensor *src;
    dt_tensor *dst;
    size_t elem;
    dt__xfer *sends, *recvs;
    size_t nsends, nrecvs;
    dt__region *views;
    const void **summand;      /* per line and member: where its slice of my range starts */
} fused_run;

/* Reduces line i's own slice into its destination: summand 0 copied, 1..k-1 added, AVG
 * divided, one cache-sized block at a time. */
static dt_status reduce_line(const fused_run *r, int i, const void *const *summand)
{
    const rl_plan *plan = r->plan;
    const rl_line *ln = &plan->coll->lines[i];
    const DLTensor *d = dt_tensor_local(r->dst, ln->local);
    const dt__device *dev = dt__tensor_device(r->dst, ln->local);
    int64_t n = dt__numel(d->ndim, d->shape), lo, len;
    slice(n, plan->coll->k, ln->coord, &lo, &len);
    int64_t block = BLOCK_BYTES / (int64_t)r->elem;
    char *out = (char *)d->data + (size_t)lo * r->elem;
    dt_status st = DT_OK;
    for (int64_t b = 0; b < len && st == DT_OK; b += block) {
        int64_t nb = len - b < block ? len - b : block;
        size_t off = (size_t)b * r->elem;
        st = dev->kind->copy(dev, DT__COPY_H2D, out + off, (const char *)summand[0] + off,
                             (size_t)nb * r->elem);
        for (int64_t j = 1; j < plan->coll->k && st == DT_OK; j++)
            st = dev->kind->reduce_into(dev, plan->op, plan->dtype, out + off,
                                        (const char *)summand[j] + off, nb);
        if (st == DT_OK && plan->op == DT_REDUCE_AVG)
            st = dev->kind->divide(dev, plan->dtype, out + off, nb, plan->nsummands);
    }
    return st;
}

/* The transfers of both phases: phase 0 offers each member its slice of my summand and
 * takes mine of theirs (read in place); phase 1 offers my reduced slice and copies theirs. */
static void fill_xfers(fused_run *r, int phase)
{
    const rl_coll *c = r->plan->coll;
    r->nsends = r->nrecvs = 0;
    for (int i = 0; i < c->nlines; i++) {
        const rl_line *ln = &c->lines[i];
        const DLTensor *s = dt_tensor_local(r->src, ln->local);
        const DLTensor *d = dt_tensor_local(r->dst, ln->local);
        const dt__device *sdev = dt__tensor_device(r->src, ln->local);
        const dt__device *ddev = dt__tensor_device(r->dst, ln->local);
        int64_t n = dt__numel(d->ndim, d->shape), mlo, mlen;
        slice(n, c->k, ln->coord, &mlo, &mlen);
        for (int64_t j = 0; j < c->k; j++) {
            if (j == ln->coord)
                continue;
            int64_t lo, len;
            slice(n, c->k, j, &lo, &len);
            dt__xfer *snd = &r->sends[r->nsends++], *rcv = &r->recvs[r->nrecvs++];
            snd->peer = rcv->peer = ln->clients[j];
            snd->cache = rcv->cache = NULL;
            if (phase == 0) {
                snd->region = flat(s->data, sdev, r->elem, n, lo, len);
                rcv->region = flat(NULL, ddev, r->elem, mlen, 0, mlen);
            } else {
                snd->region = flat(d->data, ddev, r->elem, n, mlo, mlen);
                rcv->region = flat(d->data, ddev, r->elem, n, lo, len);
            }
        }
    }
}

/* Phase 0 and the reductions: the views, each line's slice reduced, the views given back. */
static dt_status reduce_phase(fused_run *r)
{
    const rl_coll *c = r->plan->coll;
    const dt__transport *t = r->plan->transport;
    void *token = NULL;
    fill_xfers(r, 0);
    dt_status st = t->exchange_view(r->sends, r->nsends, r->recvs, r->nrecvs, r->views, NULL,
                                    NULL, &token);
    size_t v = 0;
    for (int i = 0; i < c->nlines && st == DT_OK; i++) {
        const rl_line *ln = &c->lines[i];
        const void **sum = r->summand + (size_t)i * (size_t)c->k;
        const DLTensor *s = dt_tensor_local(r->src, ln->local);
        int64_t n = dt__numel(s->ndim, s->shape), lo, len;
        slice(n, c->k, ln->coord, &lo, &len);
        for (int64_t j = 0; j < c->k; j++) {
            if (j == ln->coord) {
                sum[j] = (const char *)s->data + (size_t)lo * r->elem;
                continue;
            }
            const dt__region *w = &r->views[v++];
            sum[j] = (const char *)w->base + (size_t)w->start[0] * r->elem;
        }
        st = reduce_line(r, i, sum);
    }
    if (token) { /* the summands are read: the members' sources may change again */
        dt_status vst = t->views_done(token);
        if (st == DT_OK)
            st = vst;
    }
    return st;
}

dt_status dt__rl_fused_allreduce(rl_plan *plan, const dt_tensor *src, dt_tensor *dst)
{
    const rl_coll *c = plan->coll;
    fused_run r = {.plan = plan, .src = src, .dst = dst, .elem = dt_dtype_size(plan->dtype)};
    size_t nx = (size_t)c->nlines * (size_t)c->k;
    r.sends = calloc(nx + 1, sizeof *r.sends);
    r.recvs = calloc(nx + 1, sizeof *r.recvs);
    r.views = calloc(nx + 1, sizeof *r.views);
    r.summand = calloc(nx + 1, sizeof *r.summand);
    dt_status st = DT_OK;
    if (!r.sends || !r.recvs || !r.views || !r.summand)
        st = dt__error(DT_ERR_NO_MEMORY, "no memory for an all-reduce of %d lines", c->nlines);
    if (st == DT_OK)
        st = reduce_phase(&r);
    if (st == DT_OK) {
        fill_xfers(&r, 1);
        st = plan->transport->exchange(r.sends, r.nsends, r.recvs, r.nrecvs, NULL, NULL);
    }
    if (st == DT_OK)
        atomic_fetch_add(&fused_runs, 1);
    if (st == DT_OK && !plan->fused) {
        fused_stats(plan, dst);
        plan->fused = 1;
    }
    free(r.sends);
    free(r.recvs);
    free(r.views);
    free(r.summand);
    return st;
}
