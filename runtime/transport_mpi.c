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
#include "runtime/tally.h"
#include "runtime/transport.h"
#include "runtime/util.h"

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

/* Beside the data each client sends each peer its tally (runtime/tally.h) under TALLY_TAG,
 * so that both clients of every pair come to the same verdict in the same round: a receiver
 * that got fewer or more bytes than it expected fails, and so does its sender, whose own
 * receives may all have looked right (issue 45). */
enum { RELAYOUT_TAG = 7101, TALLY_TAG = 7102 };

static const char different[] = DT__MISMATCH_HINT;

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
                                 "%s", recvs[i].peer, want, different);
            continue;
        }
        int got = 0;
        if (MPI_Get_count(&stats[i], MPI_BYTE, &got) != MPI_SUCCESS || got == MPI_UNDEFINED ||
            (size_t)got != want)
            return dt__error(DT_ERR_STATE, "relayout exchange: client %d sent %d bytes where "
                             "this client expected %zu: %s", recvs[i].peer, got, want,
                             different);
    }
    return st;
}

/* After a tally mismatch with equal box counts every message still meets a posted receive
 * (of another size: short, or MPI_ERR_TRUNCATE): each request is waited on alone, so that a
 * failed one does not drop the others and the next exchange finds nothing left behind. With
 * other counts messages are left behind: DT_ERR_COMM (tear the runtime down). */
static dt_status drain_mismatched(MPI_Request *reqs, const int *peers, size_t nreq, size_t nrecvs,
                                  const dt__tally *mine, const dt__tally *theirs, size_t np)
{
    char verdict[512];
    dt__strlcpy(verdict, dt_last_error(), sizeof verdict);
    for (size_t k = 0; k < np; k++)
        if (theirs[k].nrecv != mine[k].nsend || theirs[k].nsend != mine[k].nrecv) {
            for (size_t i = 0; i < nreq; i++) {
                if (i < nrecvs)
                    MPI_Cancel(&reqs[i]);
                MPI_Request_free(&reqs[i]); /* a send goes on, or stays, in MPI's hands */
            }
            return dt__error(DT_ERR_COMM, "%s; the numbers of boxes differ too, so messages "
                             "are left behind: tear the runtime down", verdict);
        }
    for (size_t i = 0; i < nreq; i++) {
        MPI_Status s;
        dt_status st = dt__wait_watched_status(&reqs[i], &peers[i], 1, 0, "relayout exchange",
                                               &s);
        if (st == DT_ERR_TIMEOUT)
            return st;
    }
    return dt__error(DT_ERR_STATE, "%s", verdict);
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
    /* Requests: the tallies' 2 * np first (receives, then sends), then the data's n. */
    MPI_Request *reqs = malloc((3 * n) * sizeof *reqs);
    MPI_Datatype *temps = malloc(n * sizeof *temps);
    int *peers = malloc((3 * n) * sizeof *peers);
    void **packed = calloc(n, sizeof *packed);
    MPI_Status *stats = calloc(n, sizeof *stats);
    dt__tally *tallies = malloc(2 * n * sizeof *tallies);
    if (!reqs || !temps || !peers || !packed || !stats || !tallies) {
        free(tallies);
        free(stats);
        free(reqs);
        free(temps);
        free(peers);
        free(packed);
        return dt__error(DT_ERR_NO_MEMORY, "no memory for %zu MPI requests", n);
    }
    dt__tally *mine = tallies, *theirs = tallies + n;
    size_t np = dt__tally_peers(sends, nsends, recvs, nrecvs, NULL, NULL, peers, mine);
    size_t ntally = 0, ntemp = 0;
    int rc = MPI_SUCCESS;
    for (size_t k = 0; k < np && rc == MPI_SUCCESS; k++)
        if ((rc = MPI_Irecv(&theirs[k], (int)sizeof *theirs, MPI_BYTE, peers[k], TALLY_TAG,
                            comm, &reqs[ntally])) == MPI_SUCCESS)
            ntally++;
    for (size_t k = 0; k < np && rc == MPI_SUCCESS; k++)
        if ((rc = MPI_Isend(&mine[k], (int)sizeof *mine, MPI_BYTE, peers[k], TALLY_TAG, comm,
                            &reqs[ntally])) == MPI_SUCCESS)
            ntally++;
    for (size_t k = 0; k < np; k++)
        peers[np + k] = peers[k];
    if (rc != MPI_SUCCESS)
        st = mpi_fail(rc, "Isend/Irecv of a tally");
    MPI_Request *dreqs = reqs + 2 * np;
    int *dpeers = peers + 2 * np;
    size_t ndata = 0;
    /* Receives first, so that eager sends find their buffers posted. */
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        const dt__xfer *x = i < nrecvs ? &recvs[i] : &sends[i - nrecvs];
        MPI_Datatype type = MPI_DATATYPE_NULL;
        void *buf = x->region.base;
        int count = 1, owned = 0;
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
            rc = MPI_Irecv(buf, count, type, x->peer, RELAYOUT_TAG, comm, &dreqs[ndata]);
        else
            rc = MPI_Isend(buf, count, type, x->peer, RELAYOUT_TAG, comm, &dreqs[ndata]);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(rc, i < nrecvs ? "Irecv" : "Isend");
        else
            dpeers[ndata++] = x->peer;
    }
    if (st == DT_OK && local_work)
        local_work(arg);
    /* The tallies first: they went out before the data, and a failed data wait would drop
     * them. Then the data, waited alike by both clients of each pair. */
    dt_status tst = ntally ? dt__wait_watched(reqs, peers, (int)ntally, 0,
                                              "relayout exchange (tallies)")
                           : DT_OK;
    if (st == DT_OK)
        st = tst;
    dt_status verdict = st == DT_OK ? dt__tally_check(peers, mine, theirs, np) : DT_OK;
    if (ndata && verdict != DT_OK) {
        st = ndata == n ? drain_mismatched(dreqs, dpeers, ndata, nrecvs, mine, theirs, np)
                        : verdict;
    } else if (ndata) {
        dt_status wst = dt__wait_watched_status(dreqs, dpeers, (int)ndata, 0,
                                                "relayout exchange", stats);
        /* Receives were posted first, so request i < nrecvs is recvs[i]'s when all went. */
        if (wst == DT_OK && st == DT_OK)
            wst = check_received(recvs, nrecvs, stats, DT_OK);
        else if (wst == DT_ERR_COMM && st == DT_OK && ndata == n)
            wst = check_received(recvs, nrecvs, stats, wst);
        if (st == DT_OK)
            st = wst;
    } else if (st == DT_OK) {
        st = verdict;
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
    free(tallies);
    return st;
}

/* What a member runs in one of the relayout's collectives, agreed over the line's group
 * before any data moves: members that asked for different relayouts (an all-gather here, an
 * all-to-all there, or other blocks) would otherwise run mismatched collectives, which MPI
 * does not check (a smaller block fits, and the client getting it returns wrong data). */
typedef struct coll_card {
    int32_t client, kind;
    int64_t bytes;
} coll_card;

static const char *coll_name(int kind)
{
    return kind == DT__COLL_ALLGATHER   ? "all-gather"
           : kind == DT__COLL_ALLTOALL  ? "all-to-all"
           : kind == DT__COLL_ALLTOALLV ? "ragged all-to-all"
                                        : "collective";
}

/* DT_ERR_STATE naming the first member of c whose card differs from this client's. */
static dt_status check_cards(const dt__coll *c, const coll_card *cards, const char *what)
{
    const coll_card *mine = &cards[c->rank];
    for (int j = 0; j < c->nmembers; j++) {
        const coll_card *o = &cards[j];
        if (o->kind == mine->kind && o->bytes == mine->bytes)
            continue;
        return dt__error(DT_ERR_STATE, "%s: client %d asked for an %s of %lld-byte blocks where "
                         "this client asked for an %s of %lld-byte blocks: %s", what, o->client,
                         coll_name(o->kind), (long long)o->bytes, coll_name(mine->kind),
                         (long long)mine->bytes, different);
    }
    return DT_OK;
}

static void coll_what(const dt__coll *c, char *buf, size_t len)
{
    snprintf(buf, len, "relayout %s over %d clients (group of client %d)", coll_name(c->kind),
             c->nmembers, c->clients[0]);
}

/* A ragged all-to-all's sizes and displacements as MPI's ints (one block of 4 arrays). */
typedef struct av_ints {
    int *sc, *sd, *rc, *rd;
} av_ints;

/* Checks that c's sizes fit MPI's int counts and, with out, converts them (out->sc owns the
 * block). DT_ERR_UNSUPPORTED past INT32_MAX. */
static dt_status alltoallv_counts(const dt__coll *c, av_ints *out)
{
    int k = c->nmembers;
    for (int j = 0; j < k; j++)
        if (c->send_bytes[j] + c->send_displs[j] > (size_t)INT32_MAX ||
            c->recv_bytes[j] + c->recv_displs[j] > (size_t)INT32_MAX)
            return dt__error(DT_ERR_UNSUPPORTED, "a ragged all-to-all of more than %d bytes "
                             "per process exceeds MPI's int counts", INT32_MAX);
    if (!out)
        return DT_OK;
    int *b = malloc(4 * (size_t)(k > 0 ? k : 1) * sizeof *b);
    if (!b)
        return dt__error(DT_ERR_NO_MEMORY, "no memory for a ragged all-to-all's counts");
    *out = (av_ints){b, b + k, b + 2 * k, b + 3 * k};
    for (int j = 0; j < k; j++) {
        out->sc[j] = (int)c->send_bytes[j];
        out->sd[j] = (int)c->send_displs[j];
        out->rc[j] = (int)c->recv_bytes[j];
        out->rd[j] = (int)c->recv_displs[j];
    }
    return DT_OK;
}

/* Seconds a ragged all-to-all's wait spins on MPI_Test before the watched wait: 1 ms plus
 * its bytes at 1 GB/s. The watched wait yields the core after a few tests that complete
 * nothing, and a nonblocking collective is one request that completes only at its end while
 * it needs MPI's progress all along (each fragment of a large message): on a busy host every
 * yield costs a time slice, so the exchange crawls where a blocking MPI_Alltoallv, which
 * spins, does not. The spin is bounded, so a lost peer is still caught by the watchdog. */
static double spin_budget(const dt__coll *c)
{
    size_t b = 0;
    for (int j = 0; j < c->nmembers; j++)
        b += c->send_bytes[j] + c->recv_bytes[j];
    return 1e-3 + (double)b * 1e-9;
}

/* MPI_Test on *req until it completes or `seconds` pass (the request stays pending then).
 * MPI's code: an error completes the request. */
static int spin_test(MPI_Request *req, double seconds)
{
    double end = dt__now_seconds() + seconds;
    for (unsigned k = 1;; k++) {
        int flag = 0, rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || flag)
            return rc;
        if (k % 64 == 0 && dt__now_seconds() > end)
            return MPI_SUCCESS;
    }
}

enum { A2AV_TAG = 7421 }; /* the ragged all-to-all's messages on a line's communicator */

/* Ragged all-to-alls only (the caller agreed every size): each as point-to-point messages on
 * the line's communicator, receives first, one per member with bytes for this client and none
 * for the empty ones, this member's own block copied meanwhile. Open MPI's nonblocking
 * MPI_Ialltoallv (libnbc) runs a schedule of its own and progresses large messages several
 * times slower than these plain messages (and than the blocking MPI_Alltoallv the reference
 * calls); the matching needs no agreement beyond the caller's: members list a line's
 * collectives in the same order, and messages between two ranks with one tag match in
 * order. The wait spins first (spin_budget), then waits under the watchdog. */
static dt_status mpi_alltoallv_p2p(const dt__coll *colls, size_t n)
{
    size_t nreq = 0;
    for (size_t i = 0; i < n; i++)
        nreq += 2 * (size_t)colls[i].nmembers;
    MPI_Request *reqs = malloc((nreq + 1) * sizeof *reqs);
    int *peers = malloc((nreq + 1) * sizeof *peers);
    if (!reqs || !peers) {
        free(reqs);
        free(peers);
        return dt__error(DT_ERR_NO_MEMORY, "no memory for %zu ragged all-to-alls", n);
    }
    dt_status st = DT_OK;
    size_t k = 0;
    double budget = 0;
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        const dt__coll *c = &colls[i];
        const dt__group *g = NULL;
        if (c->dev && !c->dev->kind->host_visible)
            st = dt__error(DT_ERR_UNSUPPORTED, "the mpi transport moves host memory only, "
                           "not %s device memory", c->dev->kind->name);
        if (st == DT_OK)
            st = alltoallv_counts(c, NULL);
        if (st == DT_OK)
            st = dt__clients_group(c->nmembers, c->clients, &g);
        if (st != DT_OK)
            break;
        budget += spin_budget(c);
        for (int pass = 0; pass < 2 && st == DT_OK; pass++)
            for (int j = 0; j < c->nmembers; j++) {
                int rc;
                if (j == c->rank)
                    continue;
                if (pass == 0 && c->recv_bytes[j])
                    rc = MPI_Irecv((char *)c->recv + c->recv_displs[j], (int)c->recv_bytes[j],
                                   MPI_BYTE, j, A2AV_TAG, g->comm, &reqs[k]);
                else if (pass == 1 && c->send_bytes[j])
                    rc = MPI_Isend((const char *)c->send + c->send_displs[j],
                                   (int)c->send_bytes[j], MPI_BYTE, j, A2AV_TAG, g->comm,
                                   &reqs[k]);
                else
                    continue;
                if (rc != MPI_SUCCESS) {
                    st = mpi_fail(rc, pass ? "Isend (ragged all-to-all)"
                                           : "Irecv (ragged all-to-all)");
                    break;
                }
                peers[k++] = c->clients[j];
            }
        if (st == DT_OK && c->send_bytes[c->rank])
            memcpy((char *)c->recv + c->recv_displs[c->rank],
                   (const char *)c->send + c->send_displs[c->rank], c->send_bytes[c->rank]);
    }
    if (st == DT_OK && n > 0 && colls[0].local_work)
        colls[0].local_work(colls[0].arg);
    /* A bounded busy spin, then the watched wait (posted requests are waited for even after
     * a failure: their buffers are in use). */
    if (k > 0 && st == DT_OK) {
        double end = dt__now_seconds() + budget;
        for (unsigned s = 1;; s++) {
            int flag = 0, rc = MPI_Testall((int)k, reqs, &flag, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS) {
                st = mpi_fail(rc, "Testall (ragged all-to-all)");
                break;
            }
            if (flag || (s % 64 == 0 && dt__now_seconds() > end))
                break;
        }
    }
    if (k > 0) {
        dt_status wst = dt__wait_watched(reqs, peers, (int)k, 0, "ragged all-to-all over MPI");
        if (st == DT_OK)
            st = wst;
    }
    free(reqs);
    free(peers);
    return st;
}

/* The relayout's collectives over a mesh dim's line (docs/transports.md, "Collectives"):
 * each line's members first agree on what they run (coll_card, one small all-gather per
 * collective, all started at once), then the data collectives whose line agreed are started
 * as nonblocking collectives on the line's cached communicator (the caller orders them alike
 * on every member, so lines sharing a communicator match) and each waited under the
 * watchdog. Data only: reductions are summed by the caller in member order. */
static dt_status mpi_collective(const dt__coll *colls, size_t n)
{
    dt_status st = DT_OK, agreed = DT_OK;
    size_t ncards = 0, nv = 0;
    for (size_t i = 0; i < n; i++)
        nv += colls[i].kind == DT__COLL_ALLTOALLV;
    if (n > 0 && nv == n)
        return mpi_alltoallv_p2p(colls, n);
    if (n > 0 && colls[0].local_work)
        colls[0].local_work(colls[0].arg);
    for (size_t i = 0; i < n; i++)
        ncards += colls[i].nmembers > 0 ? (size_t)colls[i].nmembers : 0;
    MPI_Request *reqs = calloc(n + 1, sizeof *reqs);
    const dt__group **groups = calloc(n + 1, sizeof *groups);
    coll_card *cards = calloc(ncards + n + 1, sizeof *cards), *mine = cards + ncards;
    int *ok = calloc(n + 1, sizeof *ok);
    av_ints *av = calloc(n + 1, sizeof *av);
    size_t started = 0;
    if (!reqs || !groups || !cards || !ok || !av) {
        free(av);
        free(ok);
        free(cards);
        free(reqs);
        free(groups);
        return dt__error(DT_ERR_NO_MEMORY, "no memory for %zu collectives", n);
    }
    size_t off = 0;
    for (size_t i = 0; i < n && st == DT_OK; i++, started++) {
        const dt__coll *c = &colls[i];
        int rc;
        if (c->dev && !c->dev->kind->host_visible)
            st = dt__error(DT_ERR_UNSUPPORTED, "the mpi transport moves host memory only, "
                           "not %s device memory", c->dev->kind->name);
        else if (c->kind != DT__COLL_ALLGATHER && c->kind != DT__COLL_ALLTOALL &&
                 c->kind != DT__COLL_ALLTOALLV)
            st = dt__error(DT_ERR_UNSUPPORTED, "the mpi transport runs all-gather and "
                           "all-to-all only (collective kind %d)", (int)c->kind);
        else if (c->kind == DT__COLL_ALLTOALLV)
            st = alltoallv_counts(c, NULL);
        else if (c->bytes > (size_t)INT32_MAX)
            st = dt__error(DT_ERR_UNSUPPORTED, "a collective block of %zu bytes exceeds MPI's "
                           "int counts", c->bytes);
        if (st == DT_OK)
            st = dt__clients_group(c->nmembers, c->clients, &groups[i]);
        if (st != DT_OK)
            break;
        if (c->kind == DT__COLL_ALLTOALLV) {
            /* sizes agreed by the caller: no cards */
            reqs[i] = MPI_REQUEST_NULL;
            off += (size_t)c->nmembers;
            continue;
        }
        mine[i] = (coll_card){dt_client_id(), (int32_t)c->kind, (int64_t)c->bytes};
        rc = MPI_Iallgather(&mine[i], (int)sizeof *mine, MPI_BYTE, &cards[off],
                            (int)sizeof *mine, MPI_BYTE, groups[i]->comm, &reqs[i]);
        off += (size_t)c->nmembers;
        if (rc != MPI_SUCCESS) {
            reqs[i] = MPI_REQUEST_NULL;
            st = mpi_fail(rc, "Iallgather (the relayout's agreement)");
        }
    }
    /* Agreements first, each on its line: members of one line come to the same verdict. */
    off = 0;
    for (size_t i = 0; i < started; i++) {
        char what[96];
        coll_what(&colls[i], what, sizeof what);
        if (reqs[i] == MPI_REQUEST_NULL) {
            ok[i] = colls[i].kind == DT__COLL_ALLTOALLV;
            off += (size_t)colls[i].nmembers;
            continue;
        }
        dt_status wst = dt__wait_watched_group(&reqs[i], colls[i].clients, colls[i].nmembers,
                                               0, what);
        if (wst == DT_OK) {
            wst = check_cards(&colls[i], &cards[off], what);
            ok[i] = wst == DT_OK;
            if (agreed == DT_OK && wst != DT_OK)
                agreed = wst;
        } else if (st == DT_OK) {
            st = wst;
        }
        off += (size_t)colls[i].nmembers;
    }
    int failed = st != DT_OK; /* not only a disagreement: nothing more is started */
    if (st == DT_OK && agreed != DT_OK)
        st = agreed;
    /* The data of every line that agreed: its other members run it too. */
    for (size_t i = 0; i < started; i++) {
        const dt__coll *c = &colls[i];
        int rc;
        reqs[i] = MPI_REQUEST_NULL;
        if (!ok[i] || failed)
            continue;
        MPI_Comm comm = groups[i]->comm;
        if (c->kind == DT__COLL_ALLGATHER)
            rc = MPI_Iallgather(c->send, (int)c->bytes, MPI_BYTE, c->recv, (int)c->bytes,
                                MPI_BYTE, comm, &reqs[i]);
        else if (c->kind == DT__COLL_ALLTOALLV)
            rc = alltoallv_counts(c, &av[i]) == DT_OK
                     ? MPI_Ialltoallv(c->send, av[i].sc, av[i].sd, MPI_BYTE, c->recv, av[i].rc,
                                      av[i].rd, MPI_BYTE, comm, &reqs[i])
                     : MPI_ERR_COUNT;
        else
            rc = MPI_Ialltoall(c->send, (int)c->bytes, MPI_BYTE, c->recv, (int)c->bytes,
                               MPI_BYTE, comm, &reqs[i]);
        if (rc != MPI_SUCCESS) {
            reqs[i] = MPI_REQUEST_NULL;
            if (st == DT_OK)
                st = mpi_fail(rc, c->kind == DT__COLL_ALLGATHER    ? "Iallgather"
                                  : c->kind == DT__COLL_ALLTOALLV ? "Ialltoallv"
                                                                  : "Ialltoall");
        }
    }
    /* A ragged all-to-all first gets a bounded busy spin (see spin_budget). */
    if (!failed)
        for (size_t i = 0; i < started; i++)
            if (reqs[i] != MPI_REQUEST_NULL && colls[i].kind == DT__COLL_ALLTOALLV) {
                int rc = spin_test(&reqs[i], spin_budget(&colls[i]));
                if (rc != MPI_SUCCESS && st == DT_OK)
                    st = mpi_fail(rc, "Ialltoallv");
            }
    /* Started collectives are waited for even after a failure: their buffers are in use. */
    for (size_t i = 0; i < started; i++) {
        if (reqs[i] == MPI_REQUEST_NULL)
            continue;
        char what[96];
        coll_what(&colls[i], what, sizeof what);
        dt_status wst = dt__wait_watched_group(&reqs[i], colls[i].clients, colls[i].nmembers,
                                               0, what);
        if (st == DT_OK)
            st = wst;
    }
    for (size_t i = 0; i < n; i++)
        free(av[i].sc);
    free(av);
    free(ok);
    free(cards);
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
    .coll_kinds = DT__COLL_BIT(DT__COLL_ALLGATHER) | DT__COLL_BIT(DT__COLL_ALLTOALL) |
                  DT__COLL_BIT(DT__COLL_ALLTOALLV) | DT__COLL_LOCAL_WORK,
    .collective = mpi_collective,
};

const dt__transport *dt__transport_mpi(void)
{
    return &mpi_transport;
}
