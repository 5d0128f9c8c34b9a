/* The staged transport: device memory crosses processes through the device kind's host
 * staging (page-locked for CUDA) and MPI, cut in chunks and pipelined: a sender copies chunk
 * k+1 to the host while chunk k is on the wire, a receiver copies chunk k to the device while
 * k+1 arrives, with at most STAGED_IN_FLIGHT chunks of a transfer in flight. Works with any
 * number of clients per GPU and with the simulated accelerator; host memory (a CPU mesh's
 * side of dt_copy_to_mesh) goes through the same chunks. docs/transports.md. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/staging.h"
#include "runtime/transport.h"

enum {
    STAGED_IN_FLIGHT = 4,
    /* + the transfer's ordinal with its peer: above every other tag on the runtime's
     * communicator, the group creations' 8192-24575 included (runtime/group.c) */
    STAGED_TAG = 24576,
};
#define STAGED_CHUNK_DEFAULT ((size_t)4 << 20)

static _Atomic uint64_t chunks_moved;

uint64_t dt__transport_staged_chunks(void)
{
    return chunks_moved;
}

/* Chunk bytes: DT_STAGED_CHUNK_KB (tests cut small pieces into several chunks), else 4 MiB.
 * Every client must use the same value. */
static dt_status chunk_bytes(size_t *out)
{
    const char *v = getenv("DT_STAGED_CHUNK_KB");
    *out = STAGED_CHUNK_DEFAULT;
    if (!v || !*v)
        return DT_OK;
    char *end = NULL;
    errno = 0;
    long kb = strtol(v, &end, 10);
    if (errno || end == v || *end || kb < 1 || kb > (1L << 20))
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "DT_STAGED_CHUNK_KB='%s' is not a number of KiB in 1..1048576", v);
    *out = (size_t)kb << 10;
    return DT_OK;
}

/* How a transfer is cut: whole `rows` of the box's first dim longer than 1 (d0) per chunk.
 * Both sides hold the same box, so they cut it alike. */
typedef struct cut {
    int d0;
    int64_t rows, nrows, nchunks;
    size_t row_bytes;
} cut;

static cut cut_of(const dt__region *r, size_t chunk)
{
    cut c = {.d0 = 0, .rows = 1, .nrows = 1, .nchunks = 1, .row_bytes = r->elem};
    for (int d = 0; d < r->rank; d++)
        if (r->count[d] == 0) {
            c.nchunks = 0;
            return c;
        }
    int d = 0;
    while (d < r->rank && r->count[d] == 1)
        d++;
    if (d == r->rank)
        return c;
    c.d0 = d;
    c.nrows = r->count[d];
    for (int e = d + 1; e < r->rank; e++)
        c.row_bytes *= (size_t)r->count[e];
    c.rows = (int64_t)(chunk / c.row_bytes);
    if (c.rows < 1)
        c.rows = 1;
    if (c.rows > c.nrows)
        c.rows = c.nrows;
    c.nchunks = (c.nrows + c.rows - 1) / c.rows;
    return c;
}

/* The staging slots of one transfer, for one call. The blocks come from the staging pool
 * (runtime/staging_pool.c) and go back to it at the end of the call, so the next exchange,
 * of this plan or another, reuses them instead of allocating page-locked memory again; a
 * cached plan holds no staging between calls. */
typedef struct staging {
    const dt__device_kind *kind; /* whose host staging the slots are */
    size_t slot_bytes;
    int nslots;
    void *slot[STAGED_IN_FLIGHT];
} staging;

static void staging_free(staging *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->nslots; i++)
        dt__staging_put(s->kind, s->slot[i], s->slot_bytes);
    free(s);
}

/* Nothing is kept across calls (staging above); frees what a cache might hold. */
static void staged_release(dt__xfer_cache *cache)
{
    if (!cache)
        return;
    staging_free(cache->state);
    cache->state = NULL;
}

/* The device a region's copies go through, and the kind whose host memory stages them. */
static const dt__device *copier(const dt__region *r)
{
    if (r->dev && !r->dev->kind->host_visible)
        return r->dev;
    return dt__device_local(DT_DEVICE_CPU, 0);
}

static dt_status staging_get(const dt__device *dev, size_t bytes, int n, staging **out)
{
    staging *s = calloc(1, sizeof *s);
    if (!s)
        return dt__error(DT_ERR_NO_MEMORY, "staged transport: no memory");
    s->kind = dev->kind;
    s->slot_bytes = bytes;
    for (; s->nslots < n; s->nslots++) {
        dt_status st = dt__staging_get(dev->kind, bytes, &s->slot[s->nslots]);
        if (st != DT_OK) {
            staging_free(s);
            return st;
        }
    }
    *out = s;
    return DT_OK;
}

/* One transfer in progress. */
typedef struct live {
    const dt__xfer *x;
    int sending;
    int tag;
    const dt__device *dev;
    cut c;
    staging *s;
    int64_t next;                      /* the next chunk to post */
    int64_t chunk_in[STAGED_IN_FLIGHT]; /* the chunk each slot holds */
} live;

/* The box of chunk k, in the region's array coordinates. */
static void chunk_box(const live *l, int64_t k, int64_t *off, int64_t *len)
{
    const dt__region *r = &l->x->region;
    for (int d = 0; d < r->rank; d++) {
        off[d] = r->start[d];
        len[d] = r->count[d];
    }
    if (r->rank == 0)
        return;
    int64_t first = k * l->c.rows, n = l->c.nrows - first;
    off[l->c.d0] += first;
    len[l->c.d0] = n < l->c.rows ? n : l->c.rows;
}

/* Copies chunk k between the region and slot `slot` (to the slot when sending). */
static dt_status chunk_copy(const live *l, int64_t k, int slot, size_t *bytes_out)
{
    const dt__region *r = &l->x->region;
    int64_t off[DT_MAX_RANK], len[DT_MAX_RANK], zero[DT_MAX_RANK] = {0};
    chunk_box(l, k, off, len);
    dt__region box = *r;
    memcpy(box.count, len, sizeof box.count);
    *bytes_out = dt__region_bytes(&box);
    int device = !l->dev->kind->host_visible;
    void *buf = l->s->slot[slot];
    if (l->sending)
        return dt__device_copy_box(l->dev, device ? DT__COPY_D2H : DT__COPY_H2D, r->rank,
                                   r->elem, off, len, buf, off, len, r->base, zero, r->shape);
    return dt__device_copy_box(l->dev, DT__COPY_H2D, r->rank, r->elem, off, len, r->base, zero,
                               r->shape, buf, off, len);
}

static dt_status mpi_fail(int rc, const char *what, int peer)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return dt__error(DT_ERR_COMM, "staged transport: MPI %s with client %d failed: %s", what,
                     peer, text);
}

/* Posts chunk l->next in `slot`: a receive, or the copy to the host and its send. */
static dt_status post(live *l, int slot, MPI_Request *req)
{
    int64_t k = l->next++;
    size_t bytes = 0;
    chunks_moved++;
    dt_status st;
    l->chunk_in[slot] = k;
    if (l->sending) {
        st = chunk_copy(l, k, slot, &bytes);
        if (st != DT_OK)
            return st;
    } else {
        dt__region box = l->x->region;
        chunk_box(l, k, box.start, box.count);
        bytes = dt__region_bytes(&box);
    }
    if (bytes > (size_t)INT32_MAX)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "staged transport: a chunk of %zu bytes exceeds MPI's int counts",
                         bytes);
    MPI_Comm comm = dt__comm();
    int rc = l->sending ? MPI_Isend(l->s->slot[slot], (int)bytes, MPI_BYTE, l->x->peer, l->tag,
                                    comm, req)
                        : MPI_Irecv(l->s->slot[slot], (int)bytes, MPI_BYTE, l->x->peer, l->tag,
                                    comm, req);
    return rc == MPI_SUCCESS ? DT_OK : mpi_fail(rc, l->sending ? "Isend" : "Irecv", l->x->peer);
}

/* A completed request of slot `slot`: a received chunk goes to the device; then the slot
 * takes the transfer's next chunk. */
static dt_status complete(live *l, int slot, MPI_Request *req, MPI_Status *status)
{
    if (!l->sending) {
        dt__region box = l->x->region;
        chunk_box(l, l->chunk_in[slot], box.start, box.count);
        int got = 0;
        if (MPI_Get_count(status, MPI_BYTE, &got) != MPI_SUCCESS || got == MPI_UNDEFINED ||
            (size_t)got != dt__region_bytes(&box))
            return dt__error(DT_ERR_STATE, "staged transport: client %d sent a chunk of %d "
                             "bytes where this client expected %zu: " DT__MISMATCH_HINT,
                             l->x->peer, got, dt__region_bytes(&box));
        size_t bytes;
        dt_status st = chunk_copy(l, l->chunk_in[slot], slot, &bytes);
        if (st != DT_OK)
            return st;
    }
    if (l->next < l->c.nchunks)
        return post(l, slot, req);
    return DT_OK;
}

/* Tags: STAGED_TAG + the transfer's ordinal among this list's transfers with its peer, so
 * sender and receiver (listing them in the same order) pair transfers whatever order their
 * chunks are posted in; chunks of one transfer are posted in order on both sides. */
static dt_status assign(live *ls, const dt__xfer *xs, size_t n, int sending, int *seen,
                        int tag_span, size_t chunk)
{
    for (size_t i = 0; i < n; i++) {
        live *l = &ls[i];
        l->x = &xs[i];
        l->sending = sending;
        l->dev = copier(&xs[i].region);
        if (!l->dev)
            return dt__error(DT_ERR_STATE, "staged transport: no CPU device");
        if (xs[i].peer < 0 || xs[i].peer >= dt_num_clients())
            return dt__error(DT_ERR_INVALID_ARGUMENT, "staged transport: no client %d",
                             xs[i].peer);
        l->tag = STAGED_TAG + seen[xs[i].peer]++ % tag_span;
        l->c = cut_of(&xs[i].region, chunk);
        if (l->c.nchunks == 0)
            continue;
        int nslots = l->c.nchunks < STAGED_IN_FLIGHT ? (int)l->c.nchunks : STAGED_IN_FLIGHT;
        dt_status st = staging_get(l->dev, (size_t)l->c.rows * l->c.row_bytes, nslots, &l->s);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

static dt_status staged_exchange(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs,
                                 size_t nrecvs, void (*local_work)(void *), void *arg)
{
    size_t n = nsends + nrecvs, chunk;
    if (n == 0) {
        if (local_work)
            local_work(arg);
        return DT_OK;
    }
    MPI_Comm comm = dt__comm();
    if (comm == MPI_COMM_NULL)
        return dt__error(DT_ERR_STATE, "transfers between clients need dt_init first");
    const char *bad = NULL;
    double timeout = dt__comm_timeout(&bad);
    if (bad)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "relayout: DT_COMM_TIMEOUT='%s' is not a number of seconds > 0", bad);
    dt_status st = chunk_bytes(&chunk);
    if (st != DT_OK)
        return st;
    int *tag_ub = NULL, flag = 0;
    MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &flag);
    /* Every MPI allows tags up to 32767, so the span is at least 8191. */
    int tag_span = flag && tag_ub && *tag_ub > STAGED_TAG ? *tag_ub - STAGED_TAG : 32767 - STAGED_TAG;

    size_t nreq = n * STAGED_IN_FLIGHT;
    live *ls = calloc(n, sizeof *ls);
    MPI_Request *reqs = malloc(nreq * sizeof *reqs);
    int *peers = malloc(nreq * sizeof *peers), *done = malloc(nreq * sizeof *done);
    int *seen = calloc((size_t)dt_num_clients() * 2, sizeof *seen);
    MPI_Status *stats = calloc(nreq, sizeof *stats);  /* of the requests just completed */
    if (!ls || !reqs || !peers || !done || !seen || !stats) {
        st = dt__error(DT_ERR_NO_MEMORY, "staged transport: no memory for %zu transfers", n);
        goto out;
    }
    for (size_t i = 0; i < nreq; i++) {
        reqs[i] = MPI_REQUEST_NULL;
        peers[i] = -1;
    }
    /* Receives first (ls[0..nrecvs)), so that the first chunks find their buffers posted. */
    st = assign(ls, recvs, nrecvs, 0, seen, tag_span, chunk);
    if (st == DT_OK)
        st = assign(ls + nrecvs, sends, nsends, 1, seen + dt_num_clients(), tag_span, chunk);
    for (size_t i = 0; i < n && st == DT_OK; i++)
        for (int s = 0; ls[i].next < ls[i].c.nchunks && s < STAGED_IN_FLIGHT && st == DT_OK;
             s++) {
            st = post(&ls[i], s, &reqs[i * STAGED_IN_FLIGHT + (size_t)s]);
            peers[i * STAGED_IN_FLIGHT + (size_t)s] = ls[i].x->peer;
        }
    if (st == DT_OK && local_work)
        local_work(arg);
    double last = dt__now_seconds();
    dt__world_errors_return(1);  /* MPICH reports a truncated receive there (watchdog.c) */
    for (unsigned spins = 1; st == DT_OK; spins++) {
        int outcount = 0;
        int rc = MPI_Testsome((int)nreq, reqs, &outcount, done, stats);
        if (rc != MPI_SUCCESS) {
            st = dt__error(DT_ERR_COMM, "staged transport: MPI_Testsome failed");
            for (int j = 0; rc == MPI_ERR_IN_STATUS && j < outcount; j++) {
                int cls = MPI_SUCCESS;
                if (stats[j].MPI_ERROR != MPI_SUCCESS)
                    MPI_Error_class(stats[j].MPI_ERROR, &cls);
                if (cls == MPI_ERR_TRUNCATE)
                    st = dt__error(DT_ERR_STATE, "staged transport: client %d sent a larger "
                                   "chunk than this client expected (MPI_ERR_TRUNCATE): "
                                   DT__MISMATCH_HINT, peers[done[j]]);
            }
            break;
        }
        if (outcount == MPI_UNDEFINED)
            break;
        if (outcount == 0) {
            if (spins % 256 == 0)
                dt__watchdog_answer();
            if (dt__now_seconds() - last <= timeout)
                continue;
            /* Stalled: every request in flight completes without more posts of ours (a
             * chunk is posted only after the one its slot held completed), so the
             * watchdog waits for them all, or names the peer that is lost. */
            int k = 0;
            for (size_t i = 0; i < nreq; i++)
                if (reqs[i] != MPI_REQUEST_NULL)
                    done[k++] = (int)i;
            MPI_Request *sub = malloc((size_t)k * sizeof *sub);
            int *subp = malloc((size_t)k * sizeof *subp);
            if (!sub || !subp) {
                free(sub);
                free(subp);
                st = dt__error(DT_ERR_NO_MEMORY, "staged transport: no memory");
                break;
            }
            for (int j = 0; j < k; j++) {
                sub[j] = reqs[done[j]];
                subp[j] = peers[done[j]];
            }
            st = dt__wait_watched_status(sub, subp, k, timeout, "staged relayout exchange",
                                         stats);
            free(sub);
            free(subp);
            if (st != DT_OK) {
                for (int j = 0; j < k; j++)
                    reqs[done[j]] = MPI_REQUEST_NULL; /* cancelled and freed there */
                break;
            }
            for (int j = 0; j < k; j++)
                reqs[done[j]] = MPI_REQUEST_NULL;
            outcount = k;
        }
        last = dt__now_seconds();
        for (int j = 0; j < outcount && st == DT_OK; j++) {
            size_t r = (size_t)done[j];
            st = complete(&ls[r / STAGED_IN_FLIGHT], (int)(r % STAGED_IN_FLIGHT), &reqs[r],
                          &stats[j]);
        }
    }
    dt__world_errors_return(0);
    if (st != DT_OK)
        for (size_t i = 0; reqs && i < nreq; i++)
            if (reqs[i] != MPI_REQUEST_NULL) {
                MPI_Cancel(&reqs[i]);
                MPI_Request_free(&reqs[i]);
            }
out:
    for (size_t i = 0; ls && i < n; i++)
        staging_free(ls[i].s);
    free(ls);
    free(reqs);
    free(peers);
    free(done);
    free(seen);
    free(stats);
    return st;
}

static int staged_moves(const dt__device_kind *kind)
{
    (void)kind;
    return 1; /* every kind copies to and from its host staging */
}

static const dt__transport staged_transport = {
    .name = "staged",
    .exchange = staged_exchange,
    .release = staged_release,
    .moves = staged_moves,
    .can_connect = NULL,
};

const dt__transport *dt__transport_staged(void)
{
    return &staged_transport;
}
