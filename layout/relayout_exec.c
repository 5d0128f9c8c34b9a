/* Relayout execution: zero fills, local copies overlapped with the transport's exchange,
 * then reductions applied in summand order so every replica computes the same bits. */
#include <stdlib.h>
#include <string.h>

#include "layout/layout_impl.h"

void dt__rl_box_apply(int rank, size_t elem, const rl_box *box, void *dst, const int64_t *doff,
                      const int64_t *dshape, const void *src, const int64_t *soff,
                      const int64_t *sshape, rl_run_fn fn, void *arg)
{
    if (dt__numel(rank, box->len) == 0)
        return;
    /* Merge trailing dims that the box covers fully in both arrays into one run. */
    int inner = rank - 1;
    int64_t run = rank ? box->len[inner] : 1;
    while (inner > 0 && box->len[inner] == dshape[inner] && box->len[inner] == sshape[inner]) {
        inner--;
        run *= box->len[inner];
    }
    int64_t dstride[DT_MAX_RANK], sstride[DT_MAX_RANK], idx[DT_MAX_RANK] = {0};
    int64_t ds = 1, ss = 1;
    for (int d = rank - 1; d >= 0; d--) {
        dstride[d] = ds;
        sstride[d] = ss;
        ds *= dshape[d];
        ss *= sshape[d];
    }
    int64_t dbase = 0, sbase = 0;
    for (int d = 0; d < rank; d++) {
        dbase += (box->off[d] - doff[d]) * dstride[d];
        sbase += (box->off[d] - soff[d]) * sstride[d];
    }
    char *db = (char *)dst;
    const char *sb = (const char *)src;
    for (;;) {
        int64_t di = dbase, si = sbase;
        for (int d = 0; d < inner; d++) {
            di += idx[d] * dstride[d];
            si += idx[d] * sstride[d];
        }
        fn(db + (size_t)di * elem, sb + (size_t)si * elem, run, arg);
        int d = inner - 1;
        while (d >= 0 && ++idx[d] == box->len[d])
            idx[d--] = 0;
        if (d < 0)
            break;
    }
}

typedef struct exec_ctx {
    rl_plan *plan;
    const dt_tensor *src;
    dt_tensor *dst;
    size_t elem;
    void **tmp;               /* per piece: received data of a reduction, or NULL */
    dt_status st;
} exec_ctx;

static void copy_run(void *dst, const void *src, int64_t n, void *arg)
{
    memcpy(dst, src, (size_t)n * *(const size_t *)arg);
}

static void device_copy_run(void *dst, const void *src, int64_t n, void *arg)
{
    exec_ctx *x = arg;
    dt_status st = dt__device_copy(dst, src, (size_t)n * x->elem);
    if (st != DT_OK && x->st == DT_OK)
        x->st = st;
}

typedef struct reduce_arg {
    rl_run_fn kernel;
} reduce_arg;

static void reduce_run(void *dst, const void *src, int64_t n, void *arg)
{
    ((reduce_arg *)arg)->kernel(dst, src, n, NULL);
}

/* The component array (data, global offset, shape) of a piece's side. */
static void side(const dt_tensor *t, int local, void **data, const int64_t **off,
                 const int64_t **shape)
{
    const DLTensor *dl = dt_tensor_local(t, local);
    *data = dl->data;
    *shape = dl->shape;
    *off = dt_tensor_local_offset(t, local);
}

static int is_gpu(const dt_tensor *t)
{
    return dt_mesh_device_type(dt_layout_mesh(dt_tensor_layout(t))) == DT_DEVICE_GPU;
}

/* Applies one piece whose source data is here: from the source component, or from its
 * contiguous receive buffer. `accumulate` reduces instead of copying. */
static void apply_piece(exec_ctx *x, size_t i, int accumulate)
{
    const rl_piece *p = &x->plan->pieces[i];
    void *dd, *sd;
    const int64_t *doff, *dshape, *soff, *sshape;
    side(x->dst, p->dst_local, &dd, &doff, &dshape);
    if (x->tmp && x->tmp[i]) {
        sd = x->tmp[i];
        soff = p->box.off;
        sshape = p->box.len;
    } else {
        side(x->src, p->src_local, &sd, &soff, &sshape);
    }
    int rank = x->plan->rank;
    if (accumulate) {
        reduce_arg ra = {dt__rl_reduce_kernel(x->plan->op, x->plan->dtype)};
        dt__rl_box_apply(rank, x->elem, &p->box, dd, doff, dshape, sd, soff, sshape, reduce_run,
                         &ra);
    } else if (is_gpu(x->dst) || (!x->tmp[i] && is_gpu(x->src))) {
        dt__rl_box_apply(rank, x->elem, &p->box, dd, doff, dshape, sd, soff, sshape,
                         device_copy_run, x);
    } else {
        dt__rl_box_apply(rank, x->elem, &p->box, dd, doff, dshape, sd, soff, sshape, copy_run,
                         &x->elem);
    }
}

/* Runs while the exchange progresses: the in-process copies of a plan without reduction. */
static void local_copies(void *arg)
{
    exec_ctx *x = arg;
    if (x->plan->nsummands)
        return;
    for (size_t i = 0; i < x->plan->npieces; i++) {
        const rl_piece *p = &x->plan->pieces[i];
        if (p->src_local >= 0 && p->dst_local >= 0)
            apply_piece(x, i, 0);
    }
}

enum { STAGE_RUN_BYTES = 64 << 10 };

/* 1 if the region is strided with contiguous runs shorter than STAGE_RUN_BYTES. */
static int needs_staging(const dt__region *r)
{
    int d = r->rank - 1;
    int64_t run = (int64_t)r->elem;
    while (d >= 0 && r->count[d] == r->shape[d])
        run *= r->count[d--];
    if (d < 0)
        return 0;                         /* the whole array */
    run *= r->count[d];
    for (int e = d - 1; e >= 0; e--)
        if (r->count[e] != 1)
            return run < STAGE_RUN_BYTES; /* several runs */
    return 0;                             /* one run */
}

/* Copies staged receives of a plan without reduction into their destination components. */
static void unstage_received(exec_ctx *x)
{
    for (size_t i = 0; i < x->plan->npieces; i++) {
        const rl_piece *p = &x->plan->pieces[i];
        if (p->dst_local >= 0 && p->src_local < 0 && x->tmp[i])
            apply_piece(x, i, 0);
    }
}

static dt_status zero_fill(const rl_plan *plan, dt_tensor *dst, size_t elem)
{
    for (int i = 0; i < plan->ndst_local; i++) {
        if (!plan->zero_dst[i])
            continue;
        const DLTensor *dl = dt_tensor_local(dst, i);
        size_t bytes = (size_t)dt__numel(dl->ndim, dl->shape) * elem;
        if (dl->device.device_type == kDLCUDA) {
            dt_status st =
                dt__device_memset0(dt__cuda_local_index(dl->device.device_id), dl->data, bytes);
            if (st != DT_OK)
                return st;
        } else if (bytes) {
            memset(dl->data, 0, bytes);
        }
    }
    return DT_OK;
}

static dt_status reduce_all(exec_ctx *x)
{
    rl_plan *plan = x->plan;
    for (int s = 0; s < plan->nsummands; s++)
        for (size_t i = 0; i < plan->npieces; i++) {
            const rl_piece *p = &plan->pieces[i];
            if (p->dst_local >= 0 && p->summand == s)
                apply_piece(x, i, s > 0);
        }
    if (plan->op == DT_REDUCE_AVG) {
        for (int i = 0; i < plan->ndst_local; i++) {
            const DLTensor *dl = dt_tensor_local(x->dst, i);
            if (!plan->zero_dst[i])
                dt__rl_divide(dl->data, dt__numel(dl->ndim, dl->shape), plan->dtype,
                              plan->nsummands);
        }
    }
    return DT_OK;
}

dt_status dt__rl_execute(rl_plan *plan, const dt_tensor *src, dt_tensor *dst)
{
    exec_ctx x = {.plan = plan, .src = src, .dst = dst, .elem = dt_dtype_size(plan->dtype)};
    size_t nsend = 0, nrecv = 0;
    dt_status st;
    if ((st = zero_fill(plan, dst, x.elem)) != DT_OK)
        return st;
    for (size_t i = 0; i < plan->npieces; i++) {
        const rl_piece *p = &plan->pieces[i];
        nsend += p->src_local >= 0 && p->dst_local < 0;
        nrecv += p->dst_local >= 0 && p->src_local < 0;
    }
    if ((nsend || nrecv) && (is_gpu(src) || is_gpu(dst)))
        return dt__error(DT_ERR_UNSUPPORTED,
                         "moving GPU memory between processes needs the NCCL transport, "
                         "which this build does not have yet; copy to the host mesh first");
    dt__xfer *sends = calloc(nsend + 1, sizeof *sends), *recvs = calloc(nrecv + 1, sizeof *recvs);
    x.tmp = calloc(plan->npieces + 1, sizeof *x.tmp);
    if (!sends || !recvs || !x.tmp) {
        st = dt__error(DT_ERR_NO_MEMORY, "no memory to run a relayout of %zu pieces",
                       plan->npieces);
        goto out;
    }
    nsend = nrecv = 0;
    for (size_t i = 0; i < plan->npieces && st == DT_OK; i++) {
        rl_piece *p = &plan->pieces[i];
        int sending = p->src_local >= 0 && p->dst_local < 0;
        int receiving = p->dst_local >= 0 && p->src_local < 0;
        if (!sending && !receiving)
            continue;
        dt__xfer *xf = sending ? &sends[nsend++] : &recvs[nrecv++];
        const dt_tensor *t = sending ? src : dst;
        int local = sending ? p->src_local : p->dst_local;
        const DLTensor *dl = dt_tensor_local(t, local);
        const int64_t *off = dt_tensor_local_offset(t, local);
        xf->peer = sending ? p->dst_client : p->src_client;
        xf->cache = &p->cache;
        xf->region.rank = plan->rank;
        xf->region.elem = x.elem;
        xf->region.base = dl->data;
        for (int d = 0; d < plan->rank; d++) {
            xf->region.shape[d] = dl->shape[d];
            xf->region.start[d] = p->box.off[d] - off[d];
            xf->region.count[d] = p->box.len[d];
        }
        /* Reductions receive into a buffer holding exactly the box; so do pieces made of
         * short strided runs, packed by us on the way out and unpacked on the way in (MPI's
         * datatype engine moves short runs at a fraction of its contiguous speed). */
        int staged = (receiving && plan->nsummands) || needs_staging(&xf->region);
        if (staged && !is_gpu(t)) {
            st = dt_host_alloc(p->bytes ? p->bytes : 1, &x.tmp[i]);
            if (st != DT_OK)
                break;
            if (sending)
                dt__rl_box_apply(plan->rank, x.elem, &p->box, x.tmp[i], p->box.off, p->box.len,
                                 dl->data, off, dl->shape, copy_run, &x.elem);
            xf->region.base = x.tmp[i];
            for (int d = 0; d < plan->rank; d++) {
                xf->region.shape[d] = p->box.len[d];
                xf->region.start[d] = 0;
            }
        }
    }
    if (st == DT_OK)
        st = dt__transport_mpi()->exchange(sends, nsend, recvs, nrecv, local_copies, &x);
    if (st == DT_OK && plan->nsummands)
        st = reduce_all(&x);
    else if (st == DT_OK)
        unstage_received(&x);
    if (st == DT_OK)
        st = x.st;
out:
    if (x.tmp)
        for (size_t i = 0; i < plan->npieces; i++)
            dt_host_free(x.tmp[i]);
    free(x.tmp);
    free(sends);
    free(recvs);
    return st;
}
