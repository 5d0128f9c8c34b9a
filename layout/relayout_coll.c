/* Runs a regular pattern's plan (relayout_pattern.c) as one collective per local device on its
 * line's group, through the plan's transport: blocks packed in member order, the collective,
 * blocks unpacked into the destination. Reductions move the summands (all-to-all, all-gather)
 * and add them in member order 0..k-1, as the piece path does, unless the transport only has
 * native reductions (NCCL: its own order). docs/relayout.md, "Regular patterns". */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "layout/relayout_plan_impl.h"
#include "layout/tensor_dev.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* One line's buffers: packed send blocks and received blocks (NULL: the component's data). */
typedef struct line_bufs {
    void *send, *recv;
    size_t send_bytes, recv_bytes;
} line_bufs;

typedef struct coll_run {
    rl_plan *plan;
    const rl_coll *c;
    const dt_tensor *src;
    dt_tensor *dst;
    size_t elem;
    int native; /* the transport reduces (RS, AR) itself */
} coll_run;

/* The collective kind run for the pattern on transport t; -1 when t has none that fits. */
static int coll_kind_for(const rl_coll *c, const dt__transport *t, int *native_out)
{
    unsigned have = t->collective ? t->coll_kinds : 0;
    *native_out = 0;
    switch (c->kind) {
    case RL_COLL_ALLGATHER:
        return have & DT__COLL_BIT(DT__COLL_ALLGATHER) ? DT__COLL_ALLGATHER : -1;
    case RL_COLL_ALLTOALL:
        return have & DT__COLL_BIT(DT__COLL_ALLTOALL) ? DT__COLL_ALLTOALL : -1;
    case RL_COLL_REDUCE_SCATTER:
        if (have & DT__COLL_BIT(DT__COLL_REDUCE_SCATTER)) {
            *native_out = 1;
            return DT__COLL_REDUCE_SCATTER;
        }
        return have & DT__COLL_BIT(DT__COLL_ALLTOALL) ? DT__COLL_ALLTOALL : -1;
    case RL_COLL_ALLREDUCE:
        if (have & DT__COLL_BIT(DT__COLL_ALLREDUCE)) {
            *native_out = 1;
            return DT__COLL_ALLREDUCE;
        }
        return have & DT__COLL_BIT(DT__COLL_ALLGATHER) ? DT__COLL_ALLGATHER : -1;
    }
    return -1;
}

/* A shard box of layout l at pos with tensor dim d replaced by shard j of k (d < 0: as is). */
static void box_of(const rl_plan *plan, const dt_layout *l, int64_t pos, int d, int64_t k,
                   int64_t j, rl_box *box)
{
    dt_layout_shard(l, plan->shape, pos, box->off, box->len);
    if (d >= 0)
        dt_shard_range(plan->shape[d], k, j, &box->off[d], &box->len[d]);
}

/* Copies `box` between a component (data at global offset coff, shape cshape) and a compact
 * buffer holding exactly the box; to_buf picks the direction. On the device's own memory. */
static dt_status move_box(const coll_run *r, const dt__device *dev, const rl_box *box, void *buf,
                          void *cdata, const int64_t *coff, const int64_t *cshape, int to_buf)
{
    dt__copy_dir dir = dev->kind->host_visible ? DT__COPY_H2D : DT__COPY_D2D;
    if (to_buf)
        return dt__device_copy_box(dev, dir, r->plan->rank, r->elem, box->off, box->len, buf,
                                   box->off, box->len, cdata, coff, cshape);
    return dt__device_copy_box(dev, dir, r->plan->rank, r->elem, box->off, box->len, cdata, coff,
                               cshape, buf, box->off, box->len);
}

/* 1 if the blocks along tensor dim d of a compact array of shape `len` are contiguous runs
 * (every dim before d has length 1), so member blocks can go straight in or out of it. */
static int blocks_contiguous(const int64_t *len, int d)
{
    for (int e = 0; e < d; e++)
        if (len[e] != 1)
            return 0;
    return 1;
}

/* The blocks this line sends, packed in member order (or the component itself). */
static dt_status pack_sends(const coll_run *r, const rl_line *ln, const dt__device *dev, int kind,
                            dt__coll *out, line_bufs *lb)
{
    const rl_coll *c = r->c;
    const DLTensor *s = dt_tensor_local(r->src, ln->local);
    const int64_t *soff = dt_tensor_local_offset(r->src, ln->local);
    size_t sbytes = (size_t)dt__numel(s->ndim, s->shape) * r->elem;
    if (kind == DT__COLL_ALLGATHER || kind == DT__COLL_ALLREDUCE) {
        out->send = s->data;
        out->bytes = sbytes;
        return DT_OK;
    }
    /* All-to-all or reduce-scatter: block j is the source shard cut to member j's
     * destination shard along b. */
    out->bytes = sbytes / (size_t)c->k;
    if (blocks_contiguous(s->shape, c->b)) {
        out->send = s->data;
        return DT_OK;
    }
    lb->send_bytes = sbytes;
    dt_status st = dt__device_alloc(dev, sbytes ? sbytes : 1, &lb->send);
    for (int64_t j = 0; st == DT_OK && j < c->k; j++) {
        rl_box box;
        box_of(r->plan, r->plan->src, ln->pos, c->b, c->k, j, &box);
        st = move_box(r, dev, &box, (char *)lb->send + (size_t)j * out->bytes, s->data, soff,
                      s->shape, 1);
    }
    out->send = lb->send;
    return st;
}

/* Where the line's blocks arrive: the destination component when they land there in order,
 * else a buffer of k blocks. */
static dt_status recv_buffer(const coll_run *r, const rl_line *ln, const dt__device *dev,
                             dt__coll *out, line_bufs *lb)
{
    const rl_coll *c = r->c;
    const DLTensor *d = dt_tensor_local(r->dst, ln->local);
    int direct = r->native || ((c->kind == RL_COLL_ALLGATHER || c->kind == RL_COLL_ALLTOALL) &&
                               blocks_contiguous(d->shape, c->a));
    if (direct) {
        out->recv = d->data;
        return DT_OK;
    }
    /* k blocks: member shards, member rows of my shard, or k summands of it. */
    lb->recv_bytes = (size_t)c->k * out->bytes;
    dt_status st = dt__device_alloc(dev, lb->recv_bytes ? lb->recv_bytes : 1, &lb->recv);
    out->recv = lb->recv;
    return st;
}

/* After the collective: the received blocks into the destination component, summed in
 * member order for reductions. */
static dt_status finish_line(const coll_run *r, const rl_line *ln, const dt__device *dev,
                             const line_bufs *lb)
{
    const rl_coll *c = r->c;
    const rl_plan *plan = r->plan;
    if (!lb->recv)
        return DT_OK;
    const DLTensor *d = dt_tensor_local(r->dst, ln->local);
    const int64_t *doff = dt_tensor_local_offset(r->dst, ln->local);
    int64_t n = dt__numel(d->ndim, d->shape);
    size_t dbytes = (size_t)n * r->elem;
    dt_status st = DT_OK;
    if (c->kind == RL_COLL_ALLGATHER || c->kind == RL_COLL_ALLTOALL) {
        size_t blk = lb->recv_bytes / (size_t)c->k;
        for (int64_t j = 0; st == DT_OK && j < c->k; j++) {
            rl_box box; /* my destination shard cut to member j's source shard along a */
            box_of(plan, plan->dst, ln->pos, c->a, c->k, j, &box);
            st = move_box(r, dev, &box, (char *)lb->recv + (size_t)j * blk, d->data, doff, d->shape,
                          0);
        }
        return st;
    }
    /* Reductions: summand 0 copied, 1..k-1 accumulated in order, AVG divided. */
    dt__copy_dir dir = dev->kind->host_visible ? DT__COPY_H2D : DT__COPY_D2D;
    st = dev->kind->copy(dev, dir, d->data, lb->recv, dbytes);
    for (int64_t j = 1; st == DT_OK && j < c->k; j++)
        st = dev->kind->reduce_into(dev, plan->op, plan->dtype, d->data,
                                    (const char *)lb->recv + (size_t)j * dbytes, n);
    if (st == DT_OK && plan->op == DT_REDUCE_AVG)
        st = dev->kind->divide(dev, plan->dtype, d->data, n, plan->nsummands);
    return st;
}

static atomic_ulong coll_runs;

unsigned long dt__rl_coll_runs(void)
{
    return atomic_load(&coll_runs);
}

/* Swaps the piece planner's plan into `plan` (a transport without the collective). */
static dt_status fall_back(rl_plan *plan)
{
    rl_plan *g = NULL;
    dt_status st = dt__rl_plan_build_general(plan->src, plan->dst, plan->rank, plan->shape,
                                             plan->dtype, NULL, &g);
    if (st != DT_OK)
        return st;
    rl_piece *pieces = plan->pieces;
    dt_relayout_stats *stats = plan->stats;
    unsigned char *zero = plan->zero_dst;
    plan->pieces = g->pieces;
    plan->npieces = g->npieces;
    plan->stats = g->stats;
    plan->nstats = g->nstats;
    plan->zero_dst = g->zero_dst;
    plan->work += g->work;
    g->pieces = pieces;
    g->npieces = 0;
    g->stats = stats;
    g->zero_dst = zero;
    dt__rl_plan_free(g);
    dt__rl_coll_free(plan->coll);
    plan->coll = NULL;
    return DT_OK;
}

dt_status dt__rl_coll_execute(rl_plan *plan, const dt_tensor *src, dt_tensor *dst, int *done_out)
{
    coll_run r = {
        .plan = plan, .c = plan->coll, .src = src, .dst = dst, .elem = dt_dtype_size(plan->dtype)};
    int kind = coll_kind_for(r.c, plan->transport, &r.native);
    *done_out = 0;
    if (kind < 0)
        return fall_back(plan);
    *done_out = 1;
    int n = r.c->nlines;
    dt__coll *colls = calloc((size_t)n + 1, sizeof *colls);
    line_bufs *lbs = calloc((size_t)n + 1, sizeof *lbs);
    dt_status st =
        colls && lbs ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "no memory for %d collectives", n);
    for (int i = 0; st == DT_OK && i < n; i++) {
        const rl_line *ln = &r.c->lines[i];
        const dt__device *dev = dt__tensor_device(dst, ln->local);
        colls[i] = (dt__coll){.kind = (dt__coll_kind)kind,
                              .nmembers = (int)r.c->k,
                              .clients = ln->clients,
                              .rank = (int)ln->coord,
                              .dtype = plan->dtype,
                              .op = plan->op,
                              .dev = dev->kind->host_visible ? NULL : dev};
        st = pack_sends(&r, ln, dev, kind, &colls[i], &lbs[i]);
        if (st == DT_OK)
            st = recv_buffer(&r, ln, dev, &colls[i], &lbs[i]);
    }
    if (st == DT_OK)
        st = plan->transport->collective(colls, (size_t)n);
    if (st == DT_OK)
        atomic_fetch_add(&coll_runs, 1);
    for (int i = 0; st == DT_OK && i < n; i++)
        st = finish_line(&r, &r.c->lines[i], dt__tensor_device(dst, r.c->lines[i].local), &lbs[i]);
    for (int i = 0; lbs && i < n; i++) {
        const dt__device *dev = dt__tensor_device(dst, r.c->lines[i].local);
        if (lbs[i].send)
            dt__device_free(dev, lbs[i].send, lbs[i].send_bytes ? lbs[i].send_bytes : 1);
        if (lbs[i].recv)
            dt__device_free(dev, lbs[i].recv, lbs[i].recv_bytes ? lbs[i].recv_bytes : 1);
    }
    for (int i = 0; st == DT_OK && i < n; i++) {
        const dt__device *dev = dt__tensor_device(dst, r.c->lines[i].local);
        if (!dev->kind->host_visible)
            st = dev->kind->sync(dev);
    }
    free(colls);
    free(lbs);
    return st;
}
