/* The MPI transport for host memory: each transfer is one message described by an MPI
 * subarray datatype, so strided boxes go straight from the source array to the destination
 * array, except boxes of short strided runs, packed into a buffer holding exactly the box
 * (MPI's datatype engine moves short runs at a fraction of its contiguous speed). Also the
 * relayout's all-gather and all-to-all over a mesh dim's line (nonblocking collectives). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/transport.h"

enum { PACK_RUN_BYTES = 64 << 10 };

/* 1 if the region is strided with contiguous runs shorter than PACK_RUN_BYTES. */
static int needs_packing(const dt__region *r)
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
            return run < PACK_RUN_BYTES;  /* several runs */
    return 0;                             /* one run */
}

static void copy_run(void *dst, const void *src, int64_t n, void *arg)
{
    memcpy(dst, src, (size_t)n * *(const size_t *)arg);
}

/* Copies the region's box into (pack) or out of a buffer holding exactly the box. */
static void pack_box(const dt__region *r, void *buf, int pack)
{
    int64_t zero[DT_MAX_RANK] = {0};
    if (pack)
        dt__box_apply(r->rank, r->elem, r->start, r->count, buf, r->start, r->count, r->base,
                      zero, r->shape, copy_run, (void *)&r->elem);
    else
        dt__box_apply(r->rank, r->elem, r->start, r->count, r->base, zero, r->shape, buf,
                      r->start, r->count, copy_run, (void *)&r->elem);
}


static dt_status mpi_fail(int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return dt__error(DT_ERR_COMM, "MPI %s failed: %s", what, text);
}

/* A datatype covering the region's box, relative to the array's base. */
static dt_status region_type(const dt__region *r, MPI_Datatype *type_out)
{
    MPI_Datatype elem, type = MPI_DATATYPE_NULL;
    int rc = MPI_Type_contiguous((int)r->elem, MPI_BYTE, &elem);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "Type_contiguous");
    if (r->rank == 0) {
        type = elem;
    } else {
        int sizes[DT_MAX_RANK], subs[DT_MAX_RANK], starts[DT_MAX_RANK];
        for (int d = 0; d < r->rank; d++) {
            if (r->shape[d] > INT32_MAX) {
                MPI_Type_free(&elem);
                return dt__error(DT_ERR_UNSUPPORTED,
                                 "array dim of %lld elements exceeds MPI's int counts",
                                 (long long)r->shape[d]);
            }
            sizes[d] = (int)r->shape[d];
            subs[d] = (int)r->count[d];
            starts[d] = (int)r->start[d];
        }
        rc = MPI_Type_create_subarray(r->rank, sizes, subs, starts, MPI_ORDER_C, elem, &type);
        MPI_Type_free(&elem);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "Type_create_subarray");
    }
    rc = MPI_Type_commit(&type);
    if (rc != MPI_SUCCESS) {
        MPI_Type_free(&type);
        return mpi_fail(rc, "Type_commit");
    }
    *type_out = type;
    return DT_OK;
}

/* The transfer's datatype: from its cache, built there on first use, or built for this call
 * only (*owned set so the caller frees it). */
static dt_status xfer_type(const dt__xfer *x, MPI_Datatype *type_out, int *owned)
{
    *owned = 0;
    if (x->cache && x->cache->state) {
        *type_out = *(MPI_Datatype *)x->cache->state;
        return DT_OK;
    }
    MPI_Datatype type = MPI_DATATYPE_NULL;
    dt_status st = region_type(&x->region, &type);
    if (st != DT_OK)
        return st;
    if (x->cache) {
        MPI_Datatype *slot = malloc(sizeof *slot);
        if (slot) {
            *slot = type;
            x->cache->state = slot;
            *type_out = type;
            return DT_OK;
        }
    }
    *owned = 1;
    *type_out = type;
    return DT_OK;
}

static void mpi_release(dt__xfer_cache *cache)
{
    if (!cache || !cache->state)
        return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Type_free((MPI_Datatype *)cache->state);
    free(cache->state);
    cache->state = NULL;
}

enum { RELAYOUT_TAG = 7101 };

/* After the wait (st: its outcome, DT_OK or DT_ERR_COMM): each receive got exactly the bytes
 * of its box, else DT_ERR_STATE naming the peer (a sender in another call, or with another
 * layout, sends another amount: MPI_ERR_TRUNCATE when more). */
static dt_status check_received(const dt__xfer *recvs, size_t nrecvs, MPI_Status *stats,
                                dt_status st)
{
    for (size_t i = 0; i < nrecvs; i++) {
        size_t want = dt__region_bytes(&recvs[i].region);
        if (st != DT_OK) {
            int cls = MPI_SUCCESS;
            if (stats[i].MPI_ERROR != MPI_SUCCESS)
                MPI_Error_class(stats[i].MPI_ERROR, &cls);
            if (cls == MPI_ERR_TRUNCATE)
                return dt__error(DT_ERR_STATE, "relayout exchange: client %d sent more than "
                                 "the %zu bytes this client expected from it (MPI_ERR_TRUNCATE): "
                                 "the clients are not in the same relayout (DT_CHECK_COLLECTIVES=1 "
                                 "names both calls)", recvs[i].peer, want);
            continue;
        }
        int got = 0;
        if (MPI_Get_count(&stats[i], MPI_BYTE, &got) != MPI_SUCCESS || got == MPI_UNDEFINED ||
            (size_t)got != want)
            return dt__error(DT_ERR_STATE, "relayout exchange: client %d sent %d bytes where "
                             "this client expected %zu: the clients are not in the same relayout "
                             "(DT_CHECK_COLLECTIVES=1 names both calls)", recvs[i].peer, got,
                             want);
    }
    return st;
}

static dt_status mpi_exchange(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs,
                              size_t nrecvs, void (*local_work)(void *), void *arg)
{
    MPI_Comm comm = dt__comm();
    size_t n = nsends + nrecvs;
    dt_status st = DT_OK;
    if (n == 0) {
        if (local_work)
            local_work(arg);
        return DT_OK;
    }
    if (comm == MPI_COMM_NULL)
        return dt__error(DT_ERR_STATE, "transfers between clients need dt_init first");
    const char *bad = NULL;
    dt__comm_timeout(&bad);
    if (bad)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "relayout: DT_COMM_TIMEOUT='%s' is not a number of seconds > 0", bad);
    for (size_t i = 0; i < n; i++) {
        const dt__region *r = i < nrecvs ? &recvs[i].region : &sends[i - nrecvs].region;
        if (r->dev && !r->dev->kind->host_visible)
            return dt__error(DT_ERR_UNSUPPORTED,
                             "the mpi transport moves host memory only, not %s device memory "
                             "(client %d)", r->dev->kind->name,
                             i < nrecvs ? recvs[i].peer : sends[i - nrecvs].peer);
    }
    MPI_Request *reqs = malloc(n * sizeof *reqs);
    MPI_Datatype *temps = malloc(n * sizeof *temps);
    int *peers = malloc(n * sizeof *peers);
    void **packed = calloc(n, sizeof *packed);
    MPI_Status *stats = calloc(n, sizeof *stats);
    if (!reqs || !temps || !peers || !packed || !stats) {
        free(stats);
        free(reqs);
        free(temps);
        free(peers);
        free(packed);
        return dt__error(DT_ERR_NO_MEMORY, "no memory for %zu MPI requests", n);
    }
    size_t nreq = 0, ntemp = 0;
    /* Receives first, so that eager sends find their buffers posted. */
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        const dt__xfer *x = i < nrecvs ? &recvs[i] : &sends[i - nrecvs];
        MPI_Datatype type = MPI_DATATYPE_NULL;
        void *buf = x->region.base;
        int count = 1, owned = 0, rc;
        if (needs_packing(&x->region) && dt__region_bytes(&x->region) > 0 &&
            dt__region_bytes(&x->region) <= (size_t)INT32_MAX) {
            packed[i] = malloc(dt__region_bytes(&x->region));
            if (!packed[i]) {
                st = dt__error(DT_ERR_NO_MEMORY, "no memory to pack %zu bytes",
                               dt__region_bytes(&x->region));
                break;
            }
            if (i >= nrecvs)
                pack_box(&x->region, packed[i], 1);
            buf = packed[i];
            type = MPI_BYTE;
            count = (int)dt__region_bytes(&x->region);
        } else {
            st = xfer_type(x, &type, &owned);
            if (st != DT_OK)
                break;
            if (owned)
                temps[ntemp++] = type;
        }
        if (i < nrecvs)
            rc = MPI_Irecv(buf, count, type, x->peer, RELAYOUT_TAG, comm, &reqs[nreq]);
        else
            rc = MPI_Isend(buf, count, type, x->peer, RELAYOUT_TAG, comm, &reqs[nreq]);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(rc, i < nrecvs ? "Irecv" : "Isend");
        else
            peers[nreq++] = x->peer;
    }
    if (st == DT_OK && local_work)
        local_work(arg);
    if (nreq) {
        dt_status wst = dt__wait_watched_status(reqs, peers, (int)nreq, 0, "relayout exchange",
                                                stats);
        /* Receives were posted first, so request i < nrecvs is recvs[i]'s when all went. */
        if (wst == DT_OK && st == DT_OK)
            wst = check_received(recvs, nrecvs, stats, DT_OK);
        else if (wst == DT_ERR_COMM && st == DT_OK && nreq == n)
            wst = check_received(recvs, nrecvs, stats, wst);
        if (st == DT_OK)
            st = wst;
    }
    for (size_t i = 0; i < nrecvs && st == DT_OK; i++)
        if (packed[i])
            pack_box(&recvs[i].region, packed[i], 0);
    for (size_t i = 0; i < ntemp; i++)
        MPI_Type_free(&temps[i]);
    for (size_t i = 0; i < n; i++)
        free(packed[i]);
    free(packed);
    free(temps);
    free(peers);
    free(reqs);
    free(stats);
    return st;
}

/* The relayout's collectives over a mesh dim's line (docs/transports.md, "Collectives"):
 * all started as nonblocking collectives on the line's cached communicator (the caller orders
 * them alike on every member, so lines sharing a communicator match), then each waited under
 * the watchdog. Data only: reductions are summed by the caller in member order. */
static dt_status mpi_collective(const dt__coll *colls, size_t n)
{
    dt_status st = DT_OK;
    MPI_Request *reqs = calloc(n + 1, sizeof *reqs);
    const dt__group **groups = calloc(n + 1, sizeof *groups);
    size_t started = 0;
    if (!reqs || !groups) {
        free(reqs);
        free(groups);
        return dt__error(DT_ERR_NO_MEMORY, "no memory for %zu collectives", n);
    }
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        const dt__coll *c = &colls[i];
        int rc;
        if (c->dev && !c->dev->kind->host_visible)
            st = dt__error(DT_ERR_UNSUPPORTED, "the mpi transport moves host memory only, "
                           "not %s device memory", c->dev->kind->name);
        else if (c->kind != DT__COLL_ALLGATHER && c->kind != DT__COLL_ALLTOALL)
            st = dt__error(DT_ERR_UNSUPPORTED, "the mpi transport runs all-gather and "
                           "all-to-all only (collective kind %d)", (int)c->kind);
        else if (c->bytes > (size_t)INT32_MAX)
            st = dt__error(DT_ERR_UNSUPPORTED, "a collective block of %zu bytes exceeds MPI's "
                           "int counts", c->bytes);
        if (st == DT_OK)
            st = dt__clients_group(c->nmembers, c->clients, &groups[i]);
        if (st != DT_OK)
            break;
        MPI_Comm comm = groups[i]->comm;
        if (c->kind == DT__COLL_ALLGATHER)
            rc = MPI_Iallgather(c->send, (int)c->bytes, MPI_BYTE, c->recv, (int)c->bytes,
                                MPI_BYTE, comm, &reqs[i]);
        else
            rc = MPI_Ialltoall(c->send, (int)c->bytes, MPI_BYTE, c->recv, (int)c->bytes,
                               MPI_BYTE, comm, &reqs[i]);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(rc, c->kind == DT__COLL_ALLGATHER ? "Iallgather" : "Ialltoall");
        else
            started++;
    }
    /* Started collectives are waited for even after a failure: their buffers are in use. */
    for (size_t i = 0; i < started; i++) {
        char what[96];
        snprintf(what, sizeof what, "relayout %s over %d clients (group of client %d)",
                 colls[i].kind == DT__COLL_ALLGATHER ? "all-gather" : "all-to-all",
                 colls[i].nmembers, colls[i].clients[0]);
        dt_status wst = dt__wait_watched_group(&reqs[i], colls[i].clients, colls[i].nmembers,
                                               0, what);
        if (st == DT_OK)
            st = wst;
    }
    free(reqs);
    free(groups);
    return st;
}

static const dt__transport mpi_transport = {
    .name = "mpi",
    .exchange = mpi_exchange,
    .release = mpi_release,
    .moves = NULL,       /* host memory only */
    .can_connect = NULL, /* every client */
    .coll_kinds = DT__COLL_BIT(DT__COLL_ALLGATHER) | DT__COLL_BIT(DT__COLL_ALLTOALL),
    .collective = mpi_collective,
};

const dt__transport *dt__transport_mpi(void)
{
    return &mpi_transport;
}
