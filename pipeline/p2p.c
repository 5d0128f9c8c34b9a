/* Point-to-point transfers of a dt_tensor's local shards between two stages: shard at stage
 * position q goes from stage `from`'s device q to stage `to`'s device q: between clients of one
 * host through the sender's shm segment (MPI carries a descriptor; the receiver copies the
 * shard out), else through host buffers and MPI on the pipe's own communicator, and a local
 * copy when one client holds both; every wait under the watchdog (docs/pipeline.md). */
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/runtime.h"
#include "pipeline/pipe_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/shm.h"

enum { MAX_TAG = 32767 };

static size_t shard_bytes(const dt_tensor *t, int i)
{
    const DLTensor *dl = dt_tensor_local(t, i);
    size_t n = 1;
    for (int d = 0; d < dl->ndim; d++)
        n *= (size_t)dl->shape[d];
    return n * dt_dtype_size(dt_tensor_dtype(t));
}

/* Local component indices of t by ascending stage position (both sides post in this order,
 * so that several shards between one pair of clients match by MPI's ordering). */
static int *by_position(const dt_tensor *t)
{
    int n = dt_tensor_num_local(t);
    int *idx = malloc((size_t)(n > 0 ? n : 1) * sizeof *idx);
    if (!idx)
        return NULL;
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j > 0 && dt_tensor_local_position(t, idx[j - 1]) > dt_tensor_local_position(t, i)) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
    return idx;
}

static dt_status check_stages(const dt_pipe *pipe, int from, int to, int tag, const char *what)
{
    if (from < 0 || from >= pipe->stages || to < 0 || to >= pipe->stages || from == to)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: stages %d -> %d (the pipe has %d)", what,
                         from, to, pipe->stages);
    if (tag < 0 || tag > MAX_TAG)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: tag %d outside 0..%d", what, tag, MAX_TAG);
    return DT_OK;
}

static int peer_client(const dt_pipe *pipe, int stage, int64_t position)
{
    const dt_mesh *m = pipe->stage_mesh[stage];
    return dt_device_client(dt_mesh_device_type(m), dt_mesh_device_id(m, position));
}

static void count(dt_pipe *pipe, int peer, size_t bytes, int sent)
{
    int me = dt_client_id();
    int remote = peer != me, cross = remote && dt__client_host(peer) != dt__client_host(me);
    if (sent) {
        pipe->stats.bytes_sent += bytes;
        pipe->stats.bytes_sent_remote += remote ? bytes : 0;
        pipe->stats.bytes_sent_cross_host += cross ? bytes : 0;
    } else {
        pipe->stats.bytes_received += bytes;
        pipe->stats.bytes_received_remote += remote ? bytes : 0;
        pipe->stats.bytes_received_cross_host += cross ? bytes : 0;
    }
}

static int grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 0;
    int c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *p = realloc(*arr, (size_t)c * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = c;
    return 0;
}

/* The flag in a shm block's head that its receiver raises once the shard is copied out. */
static _Atomic uint32_t *shm_flag(void *block) { return (_Atomic uint32_t *)block; }

/* Frees the shm blocks whose receivers are done with them. */
static void reclaim(dt_pipe *pipe)
{
    int kept = 0;
    for (int i = 0; i < pipe->nshm; i++) {
        if (atomic_load_explicit(shm_flag(pipe->shm_blocks[i]), memory_order_acquire))
            dt__shm_free(pipe->shm_blocks[i]);
        else
            pipe->shm_blocks[kept++] = pipe->shm_blocks[i];
    }
    pipe->nshm = kept;
}

void dt__pipe_release_shm(dt_pipe *pipe)
{
    /* The receivers of the last sends may still be copying: wait a little for them; a block
     * still unread after that stays allocated (the segment goes at dt_finalize). */
    double until = dt__now_seconds() + 2.0;
    while (pipe->nshm > 0 && dt__now_seconds() < until) {
        reclaim(pipe);
        if (pipe->nshm > 0)
            sched_yield();
    }
    free(pipe->shm_blocks);
    pipe->shm_blocks = NULL;
    pipe->nshm = pipe->cap_shm = 0;
}

/* The MPI message for shard i of x to `peer`, in *buf_out (*len_out bytes): the shard's bytes,
 * or to a client of this host a descriptor, with the shard in a new shm block (kept in
 * pipe->shm_blocks) or, when the pool is full, following the descriptor. */
static dt_status message(dt_pipe *pipe, const dt_tensor *x, int i, size_t bytes, int peer,
                         void **buf_out, size_t *len_out)
{
    int shm = dt__shm_local(peer) >= 0;
    void *block = NULL;
    if (shm && grow((void **)&pipe->shm_blocks, &pipe->cap_shm, pipe->nshm + 1,
                    sizeof *pipe->shm_blocks) != 0)
        return dt__error(DT_ERR_NO_MEMORY, "dt_pipe_send: no memory");
    if (shm && !dt__shm_alloc(DT__PIPE_SHM_HEAD + bytes, &block))
        block = NULL;
    dt__pipe_desc d = {-1, bytes};
    size_t head = shm ? sizeof d : 0, len = head + (block ? 0 : bytes);
    unsigned char *buf = malloc(len ? len : 1);
    dt_status st = buf ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "dt_pipe_send: no memory for %zu "
                                           "bytes", len);
    if (st == DT_OK)
        st = dt_tensor_local_read(x, i, block ? (unsigned char *)block + DT__PIPE_SHM_HEAD
                                              : buf + head, bytes);
    if (st == DT_OK && block) {
        atomic_store_explicit(shm_flag(block), 0u, memory_order_relaxed);
        d.offset = dt__shm_offset(block, DT__PIPE_SHM_HEAD + bytes);
        pipe->shm_blocks[pipe->nshm++] = block;
    } else if (block) {
        dt__shm_free(block);
    }
    if (st != DT_OK) {
        free(buf);
        return st;
    }
    if (shm)
        memcpy(buf, &d, sizeof d);
    *buf_out = buf;
    *len_out = len;
    return DT_OK;
}

dt_status dt_pipe_send(dt_pipe *pipe, int from, int to, const dt_tensor *x, int tag)
{
    if (!pipe || !x)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_send: NULL argument");
    dt_status st = check_stages(pipe, from, to, tag, "dt_pipe_send");
    if (st != DT_OK)
        return st;
    if (!pipe->holds[from])
        return DT_OK;
    if (!dt_mesh_equal(dt_layout_mesh(dt_tensor_layout(x)), pipe->stage_mesh[from]))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_send: the tensor is not on stage "
                         "%d's mesh", from);
    int n = dt_tensor_num_local(x), me = dt_client_id();
    int *idx = by_position(x);
    if (!idx || grow((void **)&pipe->sends, &pipe->cap_sends, pipe->nsends + n,
                     sizeof *pipe->sends) != 0 ||
        grow((void **)&pipe->locals, &pipe->cap_locals, pipe->nlocals + n,
             sizeof *pipe->locals) != 0) {
        free(idx);
        return dt__error(DT_ERR_NO_MEMORY, "dt_pipe_send: no memory");
    }
    reclaim(pipe);
    for (int k = 0; k < n; k++) {
        int i = idx[k];
        int64_t q = dt_tensor_local_position(x, i);
        size_t bytes = shard_bytes(x, i);
        if (bytes > INT_MAX) {
            st = dt__error(DT_ERR_UNSUPPORTED, "dt_pipe_send: a shard of %zu bytes (at most %d "
                           "per shard)", bytes, INT_MAX);
            break;
        }
        int peer = peer_client(pipe, to, q);
        void *buf = NULL;
        size_t len = bytes;
        if (peer == me && !(buf = malloc(bytes ? bytes : 1))) {
            st = dt__error(DT_ERR_NO_MEMORY, "dt_pipe_send: no memory for %zu bytes", bytes);
            break;
        }
        st = peer == me ? dt_tensor_local_read(x, i, buf, bytes)
                        : message(pipe, x, i, bytes, peer, &buf, &len);
        if (st != DT_OK) {
            free(buf);
            break;
        }
        count(pipe, peer, bytes, 1);
        if (peer == me) {
            pipe->locals[pipe->nlocals++] = (dt__pipe_local){.from = from, .to = to, .tag = tag,
                                                             .position = q, .buf = buf,
                                                             .bytes = bytes};
            continue;
        }
        dt__pipe_send *s = &pipe->sends[pipe->nsends];
        int rc = MPI_Isend(buf, (int)len, MPI_BYTE, pipe->client_rank[peer], tag,
                           pipe->comm.comm, &s->req);
        if (rc != MPI_SUCCESS) {
            free(buf);
            st = dt__mpi_error(rc, "dt_pipe_send: MPI_Isend");
            break;
        }
        s->peer_client = peer;
        s->buf = buf;
        pipe->nsends++;
    }
    if (st == DT_OK && n > 0)
        pipe->stats.messages_sent++;
    free(idx);
    return st;
}

/* Takes the local message (from, to, tag, position): the first one sent. */
static dt__pipe_local *take_local(dt_pipe *pipe, int from, int to, int tag, int64_t q)
{
    for (int i = 0; i < pipe->nlocals; i++) {
        dt__pipe_local *l = &pipe->locals[i];
        if (l->from == from && l->to == to && l->tag == tag && l->position == q)
            return l;
    }
    return NULL;
}

static void drop_local(dt_pipe *pipe, dt__pipe_local *l)
{
    free(l->buf);
    int i = (int)(l - pipe->locals);
    memmove(l, l + 1, (size_t)(pipe->nlocals - i - 1) * sizeof *l);
    pipe->nlocals--;
}

dt_status dt_pipe_recv(dt_pipe *pipe, int from, int to, const dt_layout *layout,
                       dt_dtype dtype, const int64_t *shape, int tag, dt_tensor **out)
{
    if (!pipe || !layout || !out || (!shape && dt_layout_rank(layout) > 0))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_recv: NULL argument");
    dt_status st = check_stages(pipe, from, to, tag, "dt_pipe_recv");
    if (st != DT_OK)
        return st;
    if (!pipe->holds[to]) {
        *out = NULL;
        return DT_OK;
    }
    if (!dt_mesh_equal(dt_layout_mesh(layout), pipe->stage_mesh[to]))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_recv: the layout is not on stage "
                         "%d's mesh", to);
    dt_tensor *t = NULL;
    if ((st = dt_tensor_zeros(layout, dtype, shape, &t)) != DT_OK)
        return st;
    int n = dt_tensor_num_local(t), me = dt_client_id();
    int *idx = by_position(t);
    MPI_Request *reqs = malloc((size_t)(n > 0 ? n : 1) * sizeof *reqs);
    MPI_Status *stat = malloc((size_t)(n > 0 ? n : 1) * sizeof *stat);
    int *peers = malloc((size_t)(n > 0 ? n : 1) * sizeof *peers);
    void **bufs = calloc((size_t)(n > 0 ? n : 1), sizeof *bufs);
    size_t *sizes = malloc((size_t)(n > 0 ? n : 1) * sizeof *sizes);
    if (!idx || !reqs || !stat || !peers || !bufs || !sizes) {
        st = dt__error(DT_ERR_NO_MEMORY, "dt_pipe_recv: no memory");
        goto out;
    }
    for (int k = 0; k < n; k++)
        reqs[k] = MPI_REQUEST_NULL;
    for (int k = 0; k < n && st == DT_OK; k++) {
        int i = idx[k];
        int64_t q = dt_tensor_local_position(t, i);
        sizes[k] = shard_bytes(t, i);
        peers[k] = peer_client(pipe, from, q);
        if (peers[k] == me) {
            dt__pipe_local *l = take_local(pipe, from, to, tag, q);
            if (!l)
                st = dt__error(DT_ERR_STATE, "dt_pipe_recv: stage %d sent nothing with tag %d to "
                               "stage %d's position %lld (the send runs first on one client)",
                               from, tag, to, (long long)q);
            else if (l->bytes != sizes[k])
                st = dt__error(DT_ERR_SHAPE, "dt_pipe_recv: stage %d sent %zu bytes for stage "
                               "%d's position %lld, which takes %zu", from, l->bytes, to,
                               (long long)q, sizes[k]);
            else
                st = dt_tensor_local_write(t, i, l->buf, l->bytes);
            if (l)
                drop_local(pipe, l);
            if (st == DT_OK)
                count(pipe, me, sizes[k], 0);
            continue;
        }
        /* One byte more than expected: a longer message shows as a count, not a truncation.
         * From this host: a descriptor, and the shard only when the sender's pool was full. */
        size_t head = dt__shm_local(peers[k]) >= 0 ? sizeof(dt__pipe_desc) : 0;
        if (sizes[k] >= INT_MAX - head || !(bufs[k] = malloc(head + sizes[k] + 1))) {
            st = dt__error(sizes[k] >= INT_MAX - head ? DT_ERR_UNSUPPORTED : DT_ERR_NO_MEMORY,
                           "dt_pipe_recv: a shard of %zu bytes", sizes[k]);
            break;
        }
        int rc = MPI_Irecv(bufs[k], (int)(head + sizes[k]) + 1, MPI_BYTE,
                           pipe->client_rank[peers[k]], tag, pipe->comm.comm, &reqs[k]);
        if (rc != MPI_SUCCESS)
            st = dt__mpi_error(rc, "dt_pipe_recv: MPI_Irecv");
    }
    if (st != DT_OK) {
        for (int k = 0; k < n; k++)
            if (reqs[k] != MPI_REQUEST_NULL) {
                MPI_Cancel(&reqs[k]);
                MPI_Request_free(&reqs[k]);
            }
        goto out;
    }
    char what[96];
    snprintf(what, sizeof what, "dt_pipe_recv: stage %d waiting for stage %d (tag %d)", to, from,
             tag);
    if ((st = dt__wait_watched_status(reqs, peers, n, 0.0, what, stat)) != DT_OK)
        goto out;
    for (int k = 0; k < n && st == DT_OK; k++) {
        if (!bufs[k])
            continue;
        int got = 0, local = dt__shm_local(peers[k]);
        MPI_Get_count(&stat[k], MPI_BYTE, &got);
        dt__pipe_desc d = {-1, (uint64_t)got};
        size_t head = local >= 0 ? sizeof d : 0;
        if (local >= 0 && (size_t)got >= sizeof d)
            memcpy(&d, bufs[k], sizeof d);
        unsigned char *block = d.offset >= 0 ? dt__shm_segment(local) + d.offset : NULL;
        size_t want = block ? sizeof d : head + sizes[k];
        if ((size_t)got != want || d.bytes != sizes[k]) {
            st = dt__error(DT_ERR_SHAPE, "dt_pipe_recv: stage %d (client %d) sent %llu bytes for "
                           "stage %d's position %lld, which takes %zu", from, peers[k],
                           (unsigned long long)(got < (int)head ? (uint64_t)got : d.bytes), to,
                           (long long)dt_tensor_local_position(t, idx[k]), sizes[k]);
        } else {
            st = dt_tensor_local_write(t, idx[k], block ? block + DT__PIPE_SHM_HEAD
                                                        : (unsigned char *)bufs[k] + head,
                                       sizes[k]);
        }
        if (block) /* read (or refused): the sender may free it */
            atomic_store_explicit(shm_flag(block), 1u, memory_order_release);
        if (st != DT_OK)
            break;
        count(pipe, peers[k], sizes[k], 0);
        if (block)
            pipe->stats.bytes_received_shm += sizes[k];
    }
out:
    if (bufs)
        for (int k = 0; k < n; k++)
            free(bufs[k]);
    free(bufs);
    free(sizes);
    free(peers);
    free(stat);
    free(reqs);
    free(idx);
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    if (n > 0)
        pipe->stats.messages_received++;
    *out = t;
    return DT_OK;
}

dt_status dt_pipe_flush(dt_pipe *pipe)
{
    if (!pipe)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_flush: NULL pipe");
    reclaim(pipe);
    int n = pipe->nsends;
    if (n == 0)
        return DT_OK;
    MPI_Request *reqs = malloc((size_t)n * sizeof *reqs);
    int *peers = malloc((size_t)n * sizeof *peers);
    dt_status st = DT_OK;
    if (!reqs || !peers) {
        st = dt__error(DT_ERR_NO_MEMORY, "dt_pipe_flush: no memory");
    } else {
        for (int i = 0; i < n; i++) {
            reqs[i] = pipe->sends[i].req;
            peers[i] = pipe->sends[i].peer_client;
        }
        st = dt__wait_watched(reqs, peers, n, 0.0, "dt_pipe_flush: sends to the next stages");
    }
    /* After a timeout MPI may still read the buffers: keep them (a leak, but the job can only
     * end then); after success free them. */
    if (st == DT_OK)
        for (int i = 0; i < n; i++)
            free(pipe->sends[i].buf);
    pipe->nsends = 0;
    free(peers);
    free(reqs);
    return st;
}
