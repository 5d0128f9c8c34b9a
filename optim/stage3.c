/* ZeRO stage 3: parameters kept as dp shards (the fp32 master for f32 parameters, a shard in
 * the parameters' dtype otherwise) and made whole per group on demand. dt_zero_prefetch posts
 * the all-gather of a group's chunks as non-blocking messages (each rank's shard, staged in
 * host memory, to every dp peer) and returns; dt_zero_gather waits for them, makes the
 * parameter tensors and scatters the gathered flat chunks into them; dt_zero_release frees
 * the tensors. Gradients take stage 2's path (reduce-scatter into the owner's partition).
 * docs/optim.md, "Stage 3". */
#include <stdlib.h>
#include <string.h>

#include "layout/tensor_dev.h"
#include "optim/optim_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/util.h"

enum { S3_RELEASED = 0, S3_FLYING = 1, S3_LIVE = 2 };

/* A group's gather: its state, and while in flight its requests and each (chunk, local
 * device)'s host buffer of the whole chunk (NULL entries: gathered by relayout instead). */
struct dt__zs3 {
    int state;
    int nreq;
    MPI_Request *reqs;
    int *peers;
    void **host; /* nchunks * nlocal */
};

/* Message tags of the gather: a third phase after the reduction's two (bucket.c), one tag per
 * (sending device, receiving dp coordinate); same-tag messages pair up in posting order,
 * which is the order of the collective calls on every client. */
static int tag_of(const dt_zero *z, int64_t src, int64_t dst_q)
{
    return (int)((2 * dt_mesh_size(z->mesh) + src) * z->dp_size + dst_q);
}

static int messages_ok(const dt_zero *z)
{
    if (z->comm == MPI_COMM_NULL)
        return 0;
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(z->comm, MPI_TAG_UB, &ub, &flag);
    return flag && ub && 3 * dt_mesh_size(z->mesh) * z->dp_size <= (int64_t)*ub;
}

/* The shard a gather reads: the master (f32) or the 16-bit shard. */
static dt_tensor *shard_of(const dt__zgroup *g, const dt__zchunk *ch)
{
    return g->dtype == DT_DTYPE_F32 ? ch->master : ch->psh;
}

dt_status dt__zero_s3_refresh(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch)
{
    return ch->psh ? dt__zero_cast_master(z, g, ch, ch->psh) : DT_OK;
}

dt_status dt__zero_s3_adopt(dt_zero *z, dt__zgroup *g)
{
    g->s3 = calloc(1, sizeof *g->s3);
    if (!g->s3)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_add_group: no memory");
    dt_status st = DT_OK;
    for (int c = 0; st == DT_OK && g->dtype != DT_DTYPE_F32 && c < g->nchunks; c++) {
        dt__zchunk *ch = &g->chunks[c];
        st = dt__zero_chunk_tensor(z, z->state_layout, g->dtype, ch->len, 0, &ch->psh);
        if (st == DT_OK)
            st = dt__zero_s3_refresh(z, g, ch);
    }
    dt_status done = dt__zero_sync(z);
    if (st == DT_OK)
        st = done;
    /* The values are in the shards now: the caller's tensors are let go. */
    for (int j = 0; st == DT_OK && j < g->nparams; j++) {
        dt_tensor_destroy(g->params[j].tensor);
        g->params[j].tensor = NULL;
    }
    return st;
}

/* Frees the host buffers and requests of a gather (waited for or never posted). */
static void drop_flight(const dt_zero *z, dt__zgroup *g)
{
    struct dt__zs3 *s = g->s3;
    for (int k = 0; s->host && k < g->nchunks * z->nlocal; k++)
        if (s->host[k])
            z->devs[k % z->nlocal]->kind->host_free(s->host[k]);
    free(s->host);
    free(s->reqs);
    free(s->peers);
    s->host = NULL;
    s->reqs = NULL;
    s->peers = NULL;
    s->nreq = 0;
}

static void free_params(dt__zgroup *g)
{
    for (int j = 0; j < g->nparams; j++) {
        dt_tensor_destroy(g->params[j].tensor);
        g->params[j].tensor = NULL;
    }
}

void dt__zero_s3_free_group(const dt_zero *z, dt__zgroup *g)
{
    if (!g->s3)
        return;
    if (g->s3->state == S3_FLYING && g->s3->nreq > 0)
        (void)dt__wait_watched(g->s3->reqs, g->s3->peers, g->s3->nreq, 0,
                               "dt_zero parameter gather (dropped)");
    drop_flight(z, g);
    if (g->s3->state != S3_RELEASED)
        free_params(g);
    free(g->s3);
    g->s3 = NULL;
}

dt_status dt__zero_s3_idle(const dt_zero *z, const char *fn)
{
    for (int g = 0; g < z->ngroups; g++)
        if (z->groups[g].s3 && z->groups[g].s3->state != S3_RELEASED)
            return dt__error(DT_ERR_STATE,
                             "%s: stage 3 group %d is still %s (dt_zero_release "
                             "it first: the update writes the shards)",
                             fn, g, z->groups[g].s3->state == S3_LIVE ? "gathered" : "prefetched");
    return DT_OK;
}

/* Dp coordinate q's part [*off, *off + *len) of a chunk of n elements (the state layout's
 * split: the first n % N parts one longer). */
static void part_of(const dt_zero *z, int64_t n, int64_t q, int64_t *off, int64_t *len)
{
    int64_t N = z->dp_size, base = n / N, rem = n % N;
    *off = q * base + (q < rem ? q : rem);
    *len = base + (q < rem);
}

static dt_status mpi_fail(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return dt__error(DT_ERR_COMM, "dt_zero_prefetch: %s: %s", what, msg);
}

/* Posts the messages of chunk c on local device i: its shard into its slot of the chunk's
 * host buffer, sent to every dp peer; every peer's slot received. */
static dt_status post_chunk(dt_zero *z, dt__zgroup *g, int c, int i)
{
    struct dt__zs3 *s = g->s3;
    const dt__zchunk *ch = &g->chunks[c];
    const dt__device *dev = z->devs[i];
    size_t dsz = dt_dtype_size(g->dtype), e = (size_t)i * (size_t)z->dp_size;
    int64_t me = z->coords[i][z->dp], moff, mlen;
    part_of(z, ch->len, me, &moff, &mlen);
    void **buf = &s->host[(size_t)c * (size_t)z->nlocal + (size_t)i];
    dt_status st = dev->kind->host_alloc((size_t)ch->len * dsz, buf);
    if (st == DT_OK && mlen > 0)
        st = dev->kind->copy(dev, DT__COPY_D2H, (char *)*buf + (size_t)moff * dsz,
                             dt_tensor_local(shard_of(g, ch), i)->data, (size_t)mlen * dsz);
    for (int64_t q = 0; st == DT_OK && q < z->dp_size; q++) {
        int64_t off, len;
        part_of(z, ch->len, q, &off, &len);
        if (q == me)
            continue;
        int rc = MPI_SUCCESS;
        if (len > 0) {
            rc = MPI_Irecv((char *)*buf + (size_t)off * dsz, (int)((size_t)len * dsz), MPI_BYTE,
                           z->dp_rank[e + (size_t)q], tag_of(z, z->dp_pos[e + (size_t)q], me),
                           z->comm, &s->reqs[s->nreq]);
            if (rc != MPI_SUCCESS)
                return mpi_fail(rc, "MPI_Irecv");
            s->peers[s->nreq++] = z->dp_client[e + (size_t)q];
        }
        if (mlen > 0) {
            rc = MPI_Isend((char *)*buf + (size_t)moff * dsz, (int)((size_t)mlen * dsz), MPI_BYTE,
                           z->dp_rank[e + (size_t)q], tag_of(z, z->dp_pos[e + (size_t)me], q),
                           z->comm, &s->reqs[s->nreq]);
            if (rc != MPI_SUCCESS)
                return mpi_fail(rc, "MPI_Isend");
            s->peers[s->nreq++] = z->dp_client[e + (size_t)q];
        }
    }
    return st;
}

static dt_status check_group(const dt_zero *z, const char *fn, int group)
{
    if (!z)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: zero is NULL", fn);
    if (group < 0 || group >= z->ngroups)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: group %d (the optimizer has %d)", fn, group,
                         z->ngroups);
    return DT_OK;
}

/* Posts group g's gather (no messages without a dp peer or enough tags: dt_zero_gather then
 * gathers by relayout). */
static dt_status start(dt_zero *z, dt__zgroup *g)
{
    struct dt__zs3 *s = g->s3;
    s->state = S3_FLYING;
    if (!messages_ok(z))
        return DT_OK;
    size_t nl = (size_t)z->nlocal, nc = (size_t)g->nchunks;
    s->host = calloc(nc * nl + 1, sizeof *s->host);
    s->reqs = malloc((nc * nl * 2 * (size_t)z->dp_size + 1) * sizeof *s->reqs);
    s->peers = malloc((nc * nl * 2 * (size_t)z->dp_size + 1) * sizeof *s->peers);
    if (!s->host || !s->reqs || !s->peers)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_prefetch: no memory");
    dt_status st = DT_OK;
    for (int c = 0; st == DT_OK && c < g->nchunks; c++)
        for (int i = 0; st == DT_OK && i < z->nlocal; i++)
            st = post_chunk(z, g, c, i);
    return st;
}

dt_status dt_zero_prefetch(dt_zero *zero, int group)
{
    static const char fn[] = "dt_zero_prefetch";
    dt_status st = check_group(zero, fn, group);
    if (st != DT_OK || !zero->sharded_params)
        return st;
    dt__zgroup *g = &zero->groups[group];
    if (g->s3->state != S3_RELEASED)
        return dt__error(DT_ERR_STATE, "%s: group %d is already %s", fn, group,
                         g->s3->state == S3_LIVE ? "gathered" : "prefetched");
    st = start(zero, g);
    if (st != DT_OK) {
        /* Whatever was posted is waited for before the buffers go. */
        if (g->s3->nreq > 0)
            (void)dt__wait_watched(g->s3->reqs, g->s3->peers, g->s3->nreq, 0,
                                   "dt_zero parameter gather (failed)");
        drop_flight(zero, g);
        g->s3->state = S3_RELEASED;
    }
    return st;
}

/* Chunk c's gathered values for local device i into the parameters: from its host buffer
 * through a device temporary, or (no messages) from `full` (the chunk on gather_layout). */
static dt_status scatter_chunk(dt_zero *z, dt__zgroup *g, int c, int i, const dt_tensor *full)
{
    const dt__zchunk *ch = &g->chunks[c];
    if (full)
        return dt__zero_scatter_out(z, g, i, ch->start, ch->len, dt_tensor_local(full, i)->data,
                                    g->dtype);
    const dt__device *dev = z->devs[i];
    size_t bytes = (size_t)ch->len * dt_dtype_size(g->dtype);
    void *tmp = NULL;
    dt_status st = dev->kind->alloc(dev, bytes ? bytes : 1, &tmp);
    if (st == DT_OK && bytes)
        st = dev->kind->copy(dev, DT__COPY_H2D, tmp,
                             g->s3->host[(size_t)c * (size_t)z->nlocal + (size_t)i], bytes);
    if (st == DT_OK)
        st = dt__zero_scatter_out(z, g, i, ch->start, ch->len, tmp, g->dtype);
    dt_status done = dt__zero_sync(z);
    if (tmp)
        dev->kind->free(dev, tmp);
    return st != DT_OK ? st : done;
}

/* Waits for group g's messages and fills new parameter tensors. */
static dt_status finish(dt_zero *z, dt__zgroup *g)
{
    struct dt__zs3 *s = g->s3;
    dt_status st = DT_OK;
    if (s->nreq > 0)
        st = dt__wait_watched(s->reqs, s->peers, s->nreq, 0, "dt_zero parameter gather");
    s->nreq = 0;
    for (int j = 0; st == DT_OK && j < g->nparams; j++) {
        dt__zparam *p = &g->params[j];
        st = dt__tensor_empty(p->layout, g->dtype, p->shape, &p->tensor);
    }
    for (int c = 0; st == DT_OK && c < g->nchunks; c++) {
        dt_tensor *full = NULL;
        if (!s->host)
            st = dt_relayout(shard_of(g, &g->chunks[c]), z->gather_layout, &full);
        for (int i = 0; st == DT_OK && i < z->nlocal; i++)
            st = scatter_chunk(z, g, c, i, full);
        dt_status done = dt__zero_sync(z);
        if (st == DT_OK)
            st = done;
        dt_tensor_destroy(full);
    }
    drop_flight(z, g);
    if (st != DT_OK) {
        free_params(g);
        s->state = S3_RELEASED;
        return st;
    }
    s->state = S3_LIVE;
    return DT_OK;
}

dt_status dt_zero_gather(dt_zero *zero, int group)
{
    static const char fn[] = "dt_zero_gather";
    dt_status st = check_group(zero, fn, group);
    if (st != DT_OK || !zero->sharded_params)
        return st;
    dt__zgroup *g = &zero->groups[group];
    if (g->s3->state == S3_LIVE)
        return dt__error(DT_ERR_STATE,
                         "%s: group %d is already gathered (gathered twice; "
                         "dt_zero_release it first)",
                         fn, group);
    if (g->s3->state == S3_RELEASED)
        st = dt_zero_prefetch(zero, group);
    return st == DT_OK ? finish(zero, g) : st;
}

dt_status dt_zero_release(dt_zero *zero, int group)
{
    static const char fn[] = "dt_zero_release";
    dt_status st = check_group(zero, fn, group);
    if (st != DT_OK || !zero->sharded_params)
        return st;
    dt__zgroup *g = &zero->groups[group];
    if (g->s3->state == S3_RELEASED)
        return dt__error(DT_ERR_STATE, "%s: group %d is not gathered (released already)", fn,
                         group);
    if (g->s3->state == S3_FLYING)
        return dt__error(DT_ERR_STATE,
                         "%s: group %d is only prefetched (dt_zero_gather it "
                         "before releasing)",
                         fn, group);
    free_params(g);
    g->s3->state = S3_RELEASED;
    return DT_OK;
}

dt_status dt_zero_param(const dt_zero *zero, int index, dt_tensor **param_out)
{
    static const char fn[] = "dt_zero_param";
    if (!zero || !param_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: zero and param_out are required", fn);
    dt__zgroup *g = NULL;
    dt__zparam *p = dt__zero_param(zero, index, &g);
    if (!p)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: parameter %d (the optimizer has %d)", fn,
                         index, zero->nparams);
    if (!p->tensor)
        return dt__error(DT_ERR_STATE,
                         "%s: parameter %d ('%s') is released (dt_zero_gather "
                         "its group %d first)",
                         fn, index, p->name, (int)(g - zero->groups));
    *param_out = p->tensor;
    return DT_OK;
}

int dt_zero_param_group(const dt_zero *zero, int index)
{
    dt__zgroup *g = NULL;
    if (!zero || !dt__zero_param(zero, index, &g))
        return -1;
    return (int)(g - zero->groups);
}

dt_status dt__zero_s3_hold_all(dt_zero *z, unsigned char **held_out)
{
    *held_out = NULL;
    if (!z->sharded_params)
        return DT_OK;
    dt_status idle = dt__zero_s3_idle(z, "dt_zero_save/dt_zero_load");
    if (idle != DT_OK)
        return idle;
    unsigned char *held = calloc((size_t)z->ngroups + 1, 1);
    if (!held)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero: no memory");
    dt_status st = DT_OK;
    for (int g = 0; st == DT_OK && g < z->ngroups; g++) {
        st = dt_zero_gather(z, g);
        held[g] = st == DT_OK;
    }
    *held_out = held;
    return st;
}

void dt__zero_s3_drop(dt_zero *z, unsigned char *held)
{
    for (int g = 0; held && g < z->ngroups; g++)
        if (held[g])
            (void)dt_zero_release(z, g);
    free(held);
}
