/* Relayout execution: zero fills, local copies overlapped with the exchange of the plan's
 * transport (chosen on the first run: runtime/transport.c), then reductions applied in
 * summand order so every replica computes the same bits. Memory is moved and reduced only
 * through the device layer (runtime/device.h) and the transport, which moves device memory
 * between processes itself (the staged transport through host staging, NCCL directly). */
#include <stdlib.h>
#include <string.h>

#include "layout/layout_impl.h"
#include "layout/tensor_dev.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/transport.h"
#include "runtime/util.h"

typedef struct exec_ctx {
    rl_plan *plan;
    const dt_tensor *src;
    dt_tensor *dst;
    size_t elem;
    void **tmp;                      /* per piece: a received summand's box, or NULL */
    const dt__device **tmp_dev;      /* whose memory tmp[i] is (the destination's device) */
    const dt__region **view;         /* per piece: where the transport lets its summand be
                                      * read in place (exchange_view), or NULL */
    int64_t (*view_off)[DT_MAX_RANK]; /* per piece: the view's array origin, global */
    dt_status st;                    /* first failure of the local copies */
} exec_ctx;

/* A side of a piece: a component (data, global offset, shape, device), or a compact buffer
 * holding exactly the box (offset = the box's, shape = its lengths). */
typedef struct side {
    void *data;
    const int64_t *off, *shape;
    const dt__device *dev;           /* NULL: host memory that is not a component's */
} side;

static side component_side(const dt_tensor *t, int local)
{
    const DLTensor *dl = dt_tensor_local(t, local);
    return (side){dl->data, dt_tensor_local_offset(t, local), dl->shape,
                  dt__tensor_device(t, local)};
}

static int host_side(const side *s)
{
    return !s->dev || s->dev->kind->host_visible;
}

/* Copies the box of piece i from `from` to `to`, through whichever device holds device
 * memory (the destination's when both do). */
static dt_status copy_box(const exec_ctx *x, const rl_piece *p, const side *to,
                          const side *from)
{
    const dt__device *dev = to->dev;
    dt__copy_dir dir = DT__COPY_D2D;
    if (host_side(to) && host_side(from)) {
        dev = dt__device_local(DT_DEVICE_CPU, 0);
        if (!dev)
            return dt__error(DT_ERR_STATE, "relayout: no CPU device");
        dir = DT__COPY_H2D; /* plain memcpy on the CPU kind */
    } else if (host_side(to)) {
        dev = from->dev;
        dir = DT__COPY_D2H;
    } else if (host_side(from)) {
        dir = DT__COPY_H2D;
    }
    return dt__device_copy_box(dev, dir, x->plan->rank, x->elem, p->box.off, p->box.len,
                               to->data, to->off, to->shape, from->data, from->off,
                               from->shape);
}

/* The source side of piece i as it is here: its received buffer or its component. */
static side source_side(const exec_ctx *x, size_t i)
{
    const rl_piece *p = &x->plan->pieces[i];
    if (x->view && x->view[i]) {
        const dt__region *v = x->view[i];
        for (int d = 0; d < v->rank; d++)
            x->view_off[i][d] = p->box.off[d] - v->start[d];
        return (side){v->base, x->view_off[i], v->shape, NULL};
    }
    if (x->tmp[i])
        return (side){x->tmp[i], p->box.off, p->box.len, x->tmp_dev[i]};
    return component_side(x->src, p->src_local);
}

typedef struct reduce_arg {
    const dt__device *dev;
    const rl_plan *plan;
    dt_status st;
} reduce_arg;

static void reduce_run(void *dst, const void *src, int64_t n, void *arg)
{
    reduce_arg *a = arg;
    if (a->st == DT_OK)
        a->st = a->dev->kind->reduce_into(a->dev, a->plan->op, a->plan->dtype, dst, src, n);
}

/* Accumulates piece i into its destination on the destination's device. A source that
 * device cannot read directly (another device's memory, or host memory for a device
 * destination) is first copied into a buffer on it. */
static dt_status reduce_piece(exec_ctx *x, size_t i)
{
    const rl_piece *p = &x->plan->pieces[i];
    side to = component_side(x->dst, p->dst_local), from = source_side(x, i);
    const dt__device *dev = to.dev;
    void *buf = NULL;
    dt_status st = DT_OK;
    int direct = from.dev == dev || (host_side(&to) && host_side(&from));
    if (!direct) {
        st = dt__device_alloc(dev, p->bytes, &buf);
        side staged = {buf, p->box.off, p->box.len, dev};
        if (st == DT_OK)
            st = copy_box(x, p, &staged, &from);
        from = staged;
    }
    reduce_arg ra = {dev, x->plan, DT_OK};
    if (st == DT_OK)
        dt__box_apply(x->plan->rank, x->elem, p->box.off, p->box.len, to.data, to.off,
                      to.shape, from.data, from.off, from.shape, reduce_run, &ra);
    if (st == DT_OK)
        st = ra.st;
    if (buf)
        dt__device_free(dev, buf, p->bytes); /* reused on the same stream only */
    return st;
}

/* Runs while the exchange progresses: the in-process copies of a plan without reduction. */
static void local_copies(void *arg)
{
    exec_ctx *x = arg;
    if (x->plan->nsummands)
        return;
    for (size_t i = 0; i < x->plan->npieces && x->st == DT_OK; i++) {
        const rl_piece *p = &x->plan->pieces[i];
        if (p->src_local < 0 || p->dst_local < 0)
            continue;
        side to = component_side(x->dst, p->dst_local);
        side from = component_side(x->src, p->src_local);
        x->st = copy_box(x, p, &to, &from);
    }
}

static dt_status zero_fill(const rl_plan *plan, dt_tensor *dst, size_t elem)
{
    dt_status st = DT_OK;
    for (int i = 0; i < plan->ndst_local && st == DT_OK; i++) {
        if (!plan->zero_dst[i])
            continue;
        const DLTensor *dl = dt_tensor_local(dst, i);
        const dt__device *dev = dt__tensor_device(dst, i);
        st = dev->kind->memset0(dev, dl->data, (size_t)dt__numel(dl->ndim, dl->shape) * elem);
    }
    return st;
}

static dt_status reduce_all(exec_ctx *x)
{
    rl_plan *plan = x->plan;
    dt_status st = DT_OK;
    for (int s = 0; s < plan->nsummands && st == DT_OK; s++)
        for (size_t i = 0; i < plan->npieces && st == DT_OK; i++) {
            const rl_piece *p = &plan->pieces[i];
            if (p->dst_local < 0 || p->summand != s)
                continue;
            if (s == 0) {
                side to = component_side(x->dst, p->dst_local), from = source_side(x, i);
                st = copy_box(x, p, &to, &from);
            } else {
                st = reduce_piece(x, i);
            }
        }
    if (plan->op == DT_REDUCE_AVG) {
        for (int i = 0; i < plan->ndst_local && st == DT_OK; i++) {
            const DLTensor *dl = dt_tensor_local(x->dst, i);
            const dt__device *dev = dt__tensor_device(x->dst, i);
            if (!plan->zero_dst[i])
                st = dev->kind->divide(dev, plan->dtype, dl->data,
                                       dt__numel(dl->ndim, dl->shape), plan->nsummands);
        }
    }
    return st;
}

/* Fills one transfer of piece i: the box in its component, or for a reduction's receive a
 * buffer on the destination's device holding exactly the box (summands are applied in
 * order after the exchange); no buffer when the transport gives views (read in place). */
static dt_status prepare_xfer(exec_ctx *x, size_t i, int sending, dt__xfer *xf)
{
    rl_piece *p = &x->plan->pieces[i];
    const rl_plan *plan = x->plan;
    const dt_tensor *t = sending ? x->src : x->dst;
    int local = sending ? p->src_local : p->dst_local;
    side comp = component_side(t, local);
    xf->peer = sending ? p->dst_client : p->src_client;
    xf->cache = &p->cache;
    xf->region.rank = plan->rank;
    xf->region.elem = x->elem;
    xf->region.base = comp.data;
    xf->region.dev = comp.dev;
    for (int d = 0; d < plan->rank; d++) {
        xf->region.shape[d] = comp.shape[d];
        xf->region.start[d] = p->box.off[d] - comp.off[d];
        xf->region.count[d] = p->box.len[d];
    }
    if (sending || !plan->nsummands)
        return DT_OK;
    for (int d = 0; d < plan->rank; d++) {
        xf->region.shape[d] = p->box.len[d];
        xf->region.start[d] = 0;
    }
    if (x->view) {
        xf->region.base = NULL; /* the transport says where to read it */
        return DT_OK;
    }
    dt_status st = dt__device_alloc(comp.dev, p->bytes ? p->bytes : 1, &x->tmp[i]);
    if (st != DT_OK)
        return st;
    x->tmp_dev[i] = comp.dev;
    xf->region.base = x->tmp[i];
    return DT_OK;
}

/* Chooses the plan's transport on its first run: by the memory of both meshes and the
 * clients holding their devices, which every client of the plan knows alike. */
dt_status dt__rl_plan_transport(rl_plan *plan)
{
    if (plan->transport)
        return DT_OK;
    const dt_mesh *meshes[2] = {dt_layout_mesh(plan->src), dt_layout_mesh(plan->dst)};
    const dt__device_kind *kinds[2];
    int nkinds = 0, nclients = 0, n = dt_num_clients();
    int *mark = calloc((size_t)n, sizeof *mark), *clients = calloc((size_t)n, sizeof *clients);
    if (!mark || !clients) {
        free(mark);
        free(clients);
        return dt__error(DT_ERR_NO_MEMORY, "relayout: no memory");
    }
    for (int m = 0; m < 2; m++) {
        dt_device_type type = dt_mesh_device_type(meshes[m]);
        const dt__device_kind *kind = type == DT_DEVICE_GPU ? dt__gpu_kind() : NULL;
        if (nkinds == 0 || kinds[0] != kind)
            kinds[nkinds++] = kind;
        for (int64_t p = 0; p < dt_mesh_size(meshes[m]); p++) {
            int c = dt_device_client(type, dt_mesh_device_id(meshes[m], p));
            if (c >= 0 && c < n && !mark[c]) {
                mark[c] = 1;
                clients[nclients++] = c;
            }
        }
    }
    dt_status st = dt__transport_select(kinds, nkinds, clients, nclients, nclients > 1,
                                        &plan->transport);
    free(mark);
    free(clients);
    return st;
}

/* Waits for the devices of the destination's components (the result is complete on
 * return, as every producer of a tensor guarantees). */
static dt_status sync_dst(const dt_tensor *dst)
{
    dt_status st = DT_OK;
    for (int i = 0; i < dt_tensor_num_local(dst) && st == DT_OK; i++) {
        const dt__device *dev = dt__tensor_device(dst, i);
        if (!dev->kind->host_visible)
            st = dev->kind->sync(dev);
    }
    return st;
}

dt_status dt__rl_execute(rl_plan *plan, const dt_tensor *src, dt_tensor *dst)
{
    exec_ctx x = {.plan = plan, .src = src, .dst = dst, .elem = dt_dtype_size(plan->dtype)};
    size_t nsend = 0, nrecv = 0;
    dt_status st;
    if ((st = dt__rl_plan_transport(plan)) != DT_OK)
        return st;
    if (dt__rl_fused_applies(plan))
        return dt__rl_fused_allreduce(plan, src, dst);
    if (plan->coll) { /* a regular pattern: collectives, or its pieces (relayout_coll.c) */
        int done = 0;
        if ((st = dt__rl_coll_execute(plan, src, dst, &done)) != DT_OK || done)
            return st;
    }
    if ((st = zero_fill(plan, dst, x.elem)) != DT_OK)
        return st;
    for (size_t i = 0; i < plan->npieces; i++) {
        const rl_piece *p = &plan->pieces[i];
        nsend += p->src_local >= 0 && p->dst_local < 0;
        nrecv += p->dst_local >= 0 && p->src_local < 0;
    }
    dt__xfer *sends = calloc(nsend + 1, sizeof *sends), *recvs = calloc(nrecv + 1, sizeof *recvs);
    x.tmp = calloc(plan->npieces + 1, sizeof *x.tmp);
    x.tmp_dev = calloc(plan->npieces + 1, sizeof *x.tmp_dev);
    /* Summands read in place where the transport can show them (the shm transport). */
    int viewing = plan->nsummands && nrecv && plan->transport->exchange_view;
    dt__region *views = viewing ? calloc(nrecv, sizeof *views) : NULL;
    size_t *recv_piece = viewing ? calloc(nrecv, sizeof *recv_piece) : NULL;
    void *token = NULL;
    if (viewing) {
        x.view = calloc(plan->npieces, sizeof *x.view);
        x.view_off = calloc(plan->npieces, sizeof *x.view_off);
    }
    if (!sends || !recvs || !x.tmp || !x.tmp_dev ||
        (viewing && (!views || !recv_piece || !x.view || !x.view_off))) {
        st = dt__error(DT_ERR_NO_MEMORY, "no memory to run a relayout of %zu pieces",
                       plan->npieces);
        goto out;
    }
    nsend = nrecv = 0;
    for (size_t i = 0; i < plan->npieces && st == DT_OK; i++) {
        const rl_piece *p = &plan->pieces[i];
        int sending = p->src_local >= 0 && p->dst_local < 0;
        int receiving = p->dst_local >= 0 && p->src_local < 0;
        if (receiving && viewing)
            recv_piece[nrecv] = i;
        if (sending || receiving)
            st = prepare_xfer(&x, i, sending, sending ? &sends[nsend++] : &recvs[nrecv++]);
    }
    if (st == DT_OK && viewing) {
        st = plan->transport->exchange_view(sends, nsend, recvs, nrecv, views, local_copies, &x,
                                            &token);
        for (size_t r = 0; r < nrecv && st == DT_OK; r++)
            x.view[recv_piece[r]] = &views[r];
    } else if (st == DT_OK) {
        st = plan->transport->exchange(sends, nsend, recvs, nrecv, local_copies, &x);
    }
    if (st == DT_OK)
        st = x.st;
    if (st == DT_OK && plan->nsummands)
        st = reduce_all(&x);
    if (token) { /* the summands are read: the senders' memory may change again */
        dt_status vst = plan->transport->views_done(token);
        if (st == DT_OK)
            st = vst;
    }
    if (st == DT_OK)
        st = sync_dst(dst);
out:
    if (x.tmp)
        for (size_t i = 0; i < plan->npieces; i++)
            if (x.tmp[i]) {
                uint64_t bytes = plan->pieces[i].bytes;
                dt__device_free(x.tmp_dev[i], x.tmp[i], bytes ? bytes : 1);
            }
    free(x.tmp);
    free(x.tmp_dev);
    free(x.view);
    free(x.view_off);
    free(views);
    free(recv_piece);
    free(sends);
    free(recvs);
    return st;
}
