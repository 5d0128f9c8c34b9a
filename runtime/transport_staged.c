/* The staged transport: device memory crosses processes through the device kind's host
 * staging (page-locked for CUDA) and MPI, cut in chunks and pipelined: a sender copies chunk
 * k+1 to the host while chunk k is on the wire, a receiver copies chunk k to the device while
 * k+1 arrives, with at most STAGED_IN_FLIGHT chunks of a transfer in flight. Works with any
 * number of clients per GPU and with the simulated accelerator; host memory (a CPU mesh's
 * side of dt_copy_to_mesh) goes through the same chunks. Tallies go beside the chunks
 * (runtime/tally.h): clients that asked for different relayouts fail alike, and each takes
 * every chunk its peers sent it in the exchange before returning, so the next one starts in
 * step. docs/transports.md, docs/trace.md. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/staging.h"
#include "runtime/tally.h"
#include "runtime/transport.h"

enum {
    STAGED_IN_FLIGHT = 4,
    STAGED_TALLY_TAG = 7103,   /* its tally with each peer, beside the chunks (runtime/tally.h) */
    STAGED_DRAINED_TAG = 7104, /* after a mismatch: this client took every chunk of the peer's */
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
    size_t pair; /* its peer's entry in the exchange's pairs */
    const dt__device *dev;
    cut c;
    staging *s;
    int64_t next;                      /* the next chunk to post */
    int64_t chunk_in[STAGED_IN_FLIGHT]; /* the chunk each slot holds */
} live;

/* One peer of the exchange: its tally (runtime/tally.h), and after a mismatch the drain of
 * every chunk it sends here, so that the next exchange finds none of them left behind. */
typedef struct pair {
    int peer;
    int tally_in;  /* its tally arrived */
    int bad;       /* the tallies differ, or a chunk of another size came: no more receives */
    int drained;   /* every chunk it sent here taken, and the peer told so */
    int64_t taken; /* its chunks taken here: by the receives posted, then by the drain */
} pair;

/* An exchange in progress. Requests: the data's (STAGED_IN_FLIGHT per transfer, receives
 * first), then per pair its tally received and sent, and after a mismatch its "drained"
 * notes received and sent (REQ_* below). */
typedef struct xchg {
    live *ls;
    size_t n, nrecvs, np, ndata, nreq;
    MPI_Request *reqs;
    int *peers; /* the other client of each request */
    pair *pairs;
    dt__tally *mine, *theirs;
    int tag_span;
    void *scratch; /* drained chunks land here */
    size_t scratch_bytes;
} xchg;

enum { REQ_TALLY_IN, REQ_TALLY_OUT, REQ_DRAINED_IN, REQ_DRAINED_OUT };

static size_t req_of(const xchg *e, int what, size_t k)
{
    return e->ndata + (size_t)what * e->np + k;
}

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

static size_t chunk_bytes_of(const live *l, int64_t k)
{
    dt__region box = l->x->region;
    chunk_box(l, k, box.start, box.count);
    return dt__region_bytes(&box);
}

/* The tally's view of a box: how many chunks and a digest of their sizes, so that a peer
 * that cuts its box otherwise is found out by the tallies, whatever arrives first. */
static void tally_cut(const dt__region *r, const void *arg, int64_t *msgs_out, uint64_t *digest_out)
{
    cut c = cut_of(r, *(const size_t *)arg);
    uint64_t h = (uint64_t)c.nchunks;
    if (c.nchunks > 0) {
        h = h * 0x100000001b3ull ^ (uint64_t)c.rows * c.row_bytes;
        h = h * 0x100000001b3ull ^ (uint64_t)(c.nrows - (c.nchunks - 1) * c.rows) * c.row_bytes;
    }
    *msgs_out = c.nchunks;
    *digest_out = h;
}

/* Copies chunk k between the region and slot `slot` (to the slot when sending). */
static dt_status chunk_copy(const live *l, int64_t k, int slot)
{
    const dt__region *r = &l->x->region;
    int64_t off[DT_MAX_RANK], len[DT_MAX_RANK], zero[DT_MAX_RANK] = {0};
    chunk_box(l, k, off, len);
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
    size_t bytes = chunk_bytes_of(l, k);
    chunks_moved++;
    l->chunk_in[slot] = k;
    if (l->sending) {
        dt_status st = chunk_copy(l, k, slot);
        if (st != DT_OK)
            return st;
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

/* Pair k disagrees (its tally, or a chunk of another size): no receive from its peer is
 * posted any more, and those pending are cancelled; one that had already matched a chunk
 * counts it taken. */
static dt_status stop_receives(xchg *e, size_t k)
{
    pair *p = &e->pairs[k];
    p->bad = 1;
    for (size_t r = 0; r < e->nrecvs * STAGED_IN_FLIGHT; r++) {
        if (e->reqs[r] == MPI_REQUEST_NULL || e->ls[r / STAGED_IN_FLIGHT].pair != k)
            continue;
        MPI_Status s;
        s.MPI_ERROR = MPI_SUCCESS;
        MPI_Cancel(&e->reqs[r]);
        dt_status st = dt__wait_watched_status(&e->reqs[r], &e->peers[r], 1, 0,
                                               "staged relayout exchange (drain)", &s);
        int cls = MPI_SUCCESS, cancelled = 0;
        if (st != DT_OK && s.MPI_ERROR != MPI_SUCCESS)
            MPI_Error_class(s.MPI_ERROR, &cls);
        if (st != DT_OK && cls != MPI_ERR_TRUNCATE)
            return st;
        if (st == DT_OK)
            MPI_Test_cancelled(&s, &cancelled);
        p->taken += !cancelled;
    }
    return DT_OK;
}

/* The tally of pair k came. A pair that disagrees drains (drain_some) and expects the peer's
 * note that it drained too; one that agrees though a chunk of another size came leaves
 * chunks behind. */
static dt_status tally_came(xchg *e, size_t k, const MPI_Status *s)
{
    pair *p = &e->pairs[k];
    int got = 0;
    p->tally_in = 1;
    if (MPI_Get_count(s, MPI_BYTE, &got) != MPI_SUCCESS || got != (int)sizeof *e->theirs)
        return dt__error(DT_ERR_COMM, "staged transport: client %d sent a tally of %d bytes",
                         p->peer, got);
    if (dt__tally_agree(&e->mine[k], &e->theirs[k])) {
        if (p->bad)
            return dt__error(DT_ERR_COMM,
                             "staged transport: client %d sent a chunk of another "
                             "size than this client expected, though their tallies agree: "
                             "chunks are left behind, tear the runtime down",
                             p->peer);
        return DT_OK;
    }
    dt_status st = p->bad ? DT_OK : stop_receives(e, k);
    if (st != DT_OK)
        return st;
    size_t q = req_of(e, REQ_DRAINED_IN, k);
    int rc = MPI_Irecv(NULL, 0, MPI_BYTE, p->peer, STAGED_DRAINED_TAG, dt__comm(), &e->reqs[q]);
    return rc == MPI_SUCCESS ? DT_OK : mpi_fail(rc, "Irecv", p->peer);
}

/* Request r completed (err: its error, MPI_SUCCESS or MPI_ERR_TRUNCATE on a receive). A
 * received chunk goes to the device and its slot takes the transfer's next chunk; a send's
 * slot too. A chunk of another size than expected marks its pair bad (the tallies say how). */
static dt_status request_done(xchg *e, size_t r, const MPI_Status *s, int err)
{
    if (r >= e->ndata)
        return r < req_of(e, REQ_TALLY_OUT, 0) ? tally_came(e, r - e->ndata, s) : DT_OK;
    live *l = &e->ls[r / STAGED_IN_FLIGHT];
    int slot = (int)(r % STAGED_IN_FLIGHT);
    if (!l->sending) {
        pair *p = &e->pairs[l->pair];
        int got = -1;
        p->taken++;
        if (err == MPI_SUCCESS && MPI_Get_count(s, MPI_BYTE, &got) != MPI_SUCCESS)
            got = -1;
        if (got < 0 || (size_t)got != chunk_bytes_of(l, l->chunk_in[slot])) {
            if (p->bad)
                return DT_OK;
            dt_status st = stop_receives(e, l->pair);
            if (st == DT_OK && p->tally_in &&
                dt__tally_agree(&e->mine[l->pair], &e->theirs[l->pair]))
                st = dt__error(DT_ERR_COMM,
                               "staged transport: client %d sent a chunk of %d "
                               "bytes where this client expected %zu, though their tallies "
                               "agree: chunks are left behind, tear the runtime down",
                               l->x->peer, got, chunk_bytes_of(l, l->chunk_in[slot]));
            return st;
        }
        if (p->bad)
            return DT_OK; /* taken and dropped */
        dt_status st = chunk_copy(l, l->chunk_in[slot], slot);
        if (st != DT_OK)
            return st;
    }
    if (l->next < l->c.nchunks)
        return post(l, slot, &e->reqs[r]);
    return DT_OK;
}

/* Takes and drops the chunks of a bad pair's peer that arrived (no receive of ours is posted
 * for them any more; *moved set if some came) until the peer's tally's count is reached, then
 * tells the peer so. Only this exchange's chunks can be there: each client of a bad pair
 * waits for the other's note before it returns. */
static dt_status drain_some(xchg *e, size_t k, int *moved)
{
    pair *p = &e->pairs[k];
    const dt__tally *t = &e->theirs[k];
    MPI_Comm comm = dt__comm();
    int64_t ntags = t->nsend < e->tag_span ? t->nsend : e->tag_span;
    for (int found = 1; found && p->taken < t->send_msgs;) {
        found = 0;
        for (int64_t g = 0; g < ntags && p->taken < t->send_msgs; g++) {
            int flag = 0, bytes = 0;
            MPI_Message msg;
            MPI_Status s;
            int rc = MPI_Improbe(p->peer, STAGED_TAG + (int)g, comm, &flag, &msg, &s);
            if (rc != MPI_SUCCESS)
                return mpi_fail(rc, "Improbe", p->peer);
            if (!flag)
                continue;
            MPI_Get_count(&s, MPI_BYTE, &bytes);
            if ((size_t)bytes > e->scratch_bytes) {
                void *grown = realloc(e->scratch, (size_t)bytes);
                if (!grown)
                    return dt__error(DT_ERR_NO_MEMORY,
                                     "staged transport: no memory to "
                                     "drain a chunk of %d bytes",
                                     bytes);
                e->scratch = grown;
                e->scratch_bytes = (size_t)bytes;
            }
            rc = MPI_Mrecv(e->scratch, bytes, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS)
                return mpi_fail(rc, "Mrecv", p->peer);
            p->taken++;
            found = *moved = 1;
        }
    }
    if (p->taken > t->send_msgs)
        return dt__error(DT_ERR_COMM,
                         "staged transport: took %lld chunks from client %d, "
                         "which sent %lld: tear the runtime down",
                         (long long)p->taken, p->peer, (long long)t->send_msgs);
    if (p->taken < t->send_msgs)
        return DT_OK;
    p->drained = 1;
    int rc = MPI_Isend(NULL, 0, MPI_BYTE, p->peer, STAGED_DRAINED_TAG, comm,
                       &e->reqs[req_of(e, REQ_DRAINED_OUT, k)]);
    return rc == MPI_SUCCESS ? DT_OK : mpi_fail(rc, "Isend", p->peer);
}

/* Tags: STAGED_TAG + the transfer's ordinal among this list's transfers with its peer, so
 * sender and receiver (listing them in the same order) pair transfers whatever order their
 * chunks are posted in; chunks of one transfer are posted in order on both sides. */
static dt_status assign(xchg *e, live *ls, const dt__xfer *xs, size_t n, int sending, int *seen,
                        size_t chunk)
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
        l->tag = STAGED_TAG + seen[xs[i].peer]++ % e->tag_span;
        while (l->pair < e->np && e->pairs[l->pair].peer != xs[i].peer)
            l->pair++;
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

/* Posts the tallies (beside the data: no round trip before it), then every transfer's first
 * chunks, receives first so that the first chunks find their buffers posted. */
static dt_status post_all(xchg *e)
{
    MPI_Comm comm = dt__comm();
    for (size_t k = 0; k < e->np; k++) {
        size_t in = req_of(e, REQ_TALLY_IN, k), out = req_of(e, REQ_TALLY_OUT, k);
        int rc = MPI_Irecv(&e->theirs[k], (int)sizeof *e->theirs, MPI_BYTE, e->pairs[k].peer,
                           STAGED_TALLY_TAG, comm, &e->reqs[in]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(&e->mine[k], (int)sizeof *e->mine, MPI_BYTE, e->pairs[k].peer,
                           STAGED_TALLY_TAG, comm, &e->reqs[out]);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "Isend/Irecv of a tally", e->pairs[k].peer);
        for (int w = REQ_TALLY_IN; w <= REQ_DRAINED_OUT; w++)
            e->peers[req_of(e, w, k)] = e->pairs[k].peer;
    }
    for (size_t i = 0; i < e->n; i++)
        for (int s = 0; e->ls[i].next < e->ls[i].c.nchunks && s < STAGED_IN_FLIGHT; s++) {
            size_t r = i * STAGED_IN_FLIGHT + (size_t)s;
            e->peers[r] = e->ls[i].x->peer;
            dt_status st = post(&e->ls[i], s, &e->reqs[r]);
            if (st != DT_OK)
                return st;
        }
    return DT_OK;
}

/* Nothing completed for `timeout` seconds: the watchdog pings the clients still waited for
 * (pending requests, pairs still draining) and names the lost ones. */
static dt_status stalled(const xchg *e, double timeout, int *rounds)
{
    int *who = malloc((e->nreq + e->np + 1) * sizeof *who), k = 0;
    if (!who)
        return dt__error(DT_ERR_NO_MEMORY, "staged transport: no memory");
    for (size_t i = 0; i < e->nreq + e->np; i++) {
        int peer = i < e->nreq ? e->peers[i] : e->pairs[i - e->nreq].peer;
        if (i < e->nreq ? e->reqs[i] == MPI_REQUEST_NULL
                        : !e->pairs[i - e->nreq].bad || e->pairs[i - e->nreq].drained)
            continue;
        int seen = 0;
        for (int j = 0; j < k && !seen; j++)
            seen = who[j] == peer;
        if (!seen)
            who[k++] = peer;
    }
    dt_status st = dt__watchdog_stalled(who, NULL, k, timeout, rounds, "staged relayout exchange");
    free(who);
    return st;
}

/* Tests every request until all completed and every bad pair drained. The matched path costs
 * the tallies' two small messages per peer, posted beside the data. */
static dt_status progress(xchg *e, double timeout)
{
    size_t nreq = e->nreq;
    int *done = malloc(nreq * sizeof *done);
    MPI_Status *stats = malloc(nreq * sizeof *stats); /* of the requests just completed */
    if (!done || !stats) {
        free(done);
        free(stats);
        return dt__error(DT_ERR_NO_MEMORY, "staged transport: no memory");
    }
    dt_status st = DT_OK;
    double last = dt__now_seconds();
    int rounds = 0;
    for (unsigned spins = 1; st == DT_OK; spins++) {
        int outcount = 0;
        int rc = MPI_Testsome((int)nreq, e->reqs, &outcount, done, stats);
        int errs = rc == MPI_ERR_IN_STATUS;
        if (rc != MPI_SUCCESS && !errs) {
            st = dt__mpi_error(rc, "staged transport: MPI_Testsome");
            break;
        }
        int all_done = outcount == MPI_UNDEFINED;
        if (all_done)
            outcount = 0;
        /* Failed requests first: Open MPI keeps them allocated, and stop_receives must not
         * take one of them again. A truncated chunk was taken all the same (a mismatch, which
         * the tallies tell); any other failure is a broken communicator. */
        for (int j = 0; errs && j < outcount && st == DT_OK; j++) {
            size_t r = (size_t)done[j];
            int cls = MPI_SUCCESS;
            if (stats[j].MPI_ERROR == MPI_SUCCESS)
                continue;
            if (e->reqs[r] != MPI_REQUEST_NULL)
                MPI_Request_free(&e->reqs[r]);
            MPI_Error_class(stats[j].MPI_ERROR, &cls);
            if (cls != MPI_ERR_TRUNCATE || r >= e->nrecvs * STAGED_IN_FLIGHT)
                st = mpi_fail(stats[j].MPI_ERROR, "request", e->peers[r]);
        }
        for (int j = 0; j < outcount && st == DT_OK; j++)
            st = request_done(e, (size_t)done[j], &stats[j],
                              errs ? stats[j].MPI_ERROR : MPI_SUCCESS);
        int moved = outcount > 0, draining = 0;
        for (size_t k = 0; k < e->np && st == DT_OK; k++) {
            pair *p = &e->pairs[k];
            if (!p->bad || !p->tally_in || p->drained)
                continue;
            st = drain_some(e, k, &moved);
            draining |= !p->drained;
            all_done &= !p->drained; /* else its note to the peer was just posted */
        }
        if (st != DT_OK || (all_done && !draining))
            break;
        if (moved) {
            last = dt__now_seconds();
            continue;
        }
        if (spins % 256 == 0)
            dt__watchdog_answer();
        if (dt__now_seconds() - last <= timeout)
            continue;
        st = stalled(e, timeout, &rounds);
        last = dt__now_seconds();
    }
    free(done);
    free(stats);
    return st;
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
    xchg e = {.n = n, .nrecvs = nrecvs, .ndata = n * STAGED_IN_FLIGHT};
    /* Every MPI allows tags up to 32767, so the span is at least 8191. */
    e.tag_span = flag && tag_ub && *tag_ub > STAGED_TAG ? *tag_ub - STAGED_TAG : 32767 - STAGED_TAG;
    e.nreq = e.ndata + 4 * n; /* room for 4 per peer, at most n peers */
    e.ls = calloc(n, sizeof *e.ls);
    e.reqs = malloc(e.nreq * sizeof *e.reqs);
    e.peers = malloc(e.nreq * sizeof *e.peers);
    e.pairs = calloc(n, sizeof *e.pairs);
    e.mine = calloc(2 * n, sizeof *e.mine);
    int *seen = calloc((size_t)dt_num_clients() * 2, sizeof *seen);
    int *peer = malloc(n * sizeof *peer);
    if (!e.ls || !e.reqs || !e.peers || !e.pairs || !e.mine || !seen || !peer) {
        st = dt__error(DT_ERR_NO_MEMORY, "staged transport: no memory for %zu transfers", n);
        goto out;
    }
    e.theirs = e.mine + n;
    e.np = dt__tally_peers(sends, nsends, recvs, nrecvs, tally_cut, &chunk, peer, e.mine);
    e.nreq = e.ndata + 4 * e.np;
    for (size_t i = 0; i < e.nreq; i++) {
        e.reqs[i] = MPI_REQUEST_NULL;
        e.peers[i] = -1;
    }
    for (size_t k = 0; k < e.np; k++)
        e.pairs[k].peer = peer[k];
    st = assign(&e, e.ls, recvs, nrecvs, 0, seen, chunk);
    if (st == DT_OK)
        st = assign(&e, e.ls + nrecvs, sends, nsends, 1, seen + dt_num_clients(), chunk);
    if (st == DT_OK)
        st = post_all(&e);
    if (st == DT_OK && local_work)
        local_work(arg);
    dt__world_errors_return(1); /* MPICH reports a truncated receive there (watchdog.c) */
    if (st == DT_OK)
        st = progress(&e, timeout);
    dt__world_errors_return(0);
    /* Every bad pair drained: the verdict, the same on both clients of each such pair. */
    for (size_t k = 0; k < e.np && st == DT_OK; k++)
        if (e.pairs[k].bad)
            st = dt__tally_check(peer, e.mine, e.theirs, e.np);
    if (st != DT_OK)
        for (size_t i = 0; e.reqs && i < e.nreq; i++)
            if (e.reqs[i] != MPI_REQUEST_NULL) {
                MPI_Cancel(&e.reqs[i]);
                MPI_Request_free(&e.reqs[i]);
            }
out:
    for (size_t i = 0; e.ls && i < n; i++)
        staging_free(e.ls[i].s);
    free(e.ls);
    free(e.reqs);
    free(e.peers);
    free(e.pairs);
    free(e.mine);
    free(e.scratch);
    free(seen);
    free(peer);
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
