/* The NCCL transport (CUDA builds): device memory moves GPU to GPU with ncclSend/ncclRecv in
 * one group on the device's stream, when every client owns its own GPU (NCCL refuses two
 * ranks on one GPU). One communicator over all clients, bootstrapped over MPI at dt_init (the
 * unique id broadcast from client 0). Boxes are packed into a compact device buffer and out
 * of one (device copies); the wait polls the stream and ncclCommGetAsyncError, under the
 * watchdog's DT_COMM_TIMEOUT. The relayout's regular patterns run as NCCL collectives on a
 * communicator per mesh-dim line (its clients in coordinate order), bootstrapped over that
 * line's MPI group and cached until dt_finalize. Before any NCCL call the clients agree over
 * MPI on what they move (an exchange's tallies with each peer, a collective's card on its
 * line): clients that asked for different relayouts get DT_ERR_STATE and the communicators
 * stay usable. A failure once NCCL work may be pending on a peer aborts the communicators.
 * docs/transports.md, docs/cuda_host.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "runtime/cuda.h"
#include "runtime/device.h"
#include "runtime/group.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/tally.h"
#include "runtime/transport.h"
#include "runtime/util.h"

enum { NCCL_TALLY_TAG = 7105 }; /* an exchange's tally with each peer (runtime/group.c) */

static struct {
    int applies;          /* every client owns its own GPU and the communicator is up */
    ncclComm_t comm;
    int nranks;
    char absence[256];    /* why it does not apply */
} nc;

const char *dt__nccl_absence(void)
{
    return nc.absence[0] ? nc.absence : "NCCL was not set up (dt_init)";
}

static dt_status nccl_status(ncclResult_t r, const char *what, const char *peers)
{
    return dt__error(DT_ERR_COMM, "NCCL %s on communicator 'all clients' (%d ranks)%s%s: %s",
                     what, nc.nranks, peers && *peers ? ", peer(s) " : "", peers ? peers : "",
                     ncclGetErrorString(r));
}

/* Whether every client has exactly one GPU device of the cuda kind, none sharing a GPU. */
static dt_status decide(int *ok_out)
{
    int n = dt_num_clients(), me = dt_client_id();
    const int *counts = dt__client_device_counts(DT_DEVICE_GPU);
    const dt__device *dev = dt__device_local(DT_DEVICE_GPU, 0);
    int mine[2] = {dt__client_host(me), dev ? dev->ordinal : -1};
    *ok_out = 0;
    if (dt__gpu_kind() != dt__device_kind_cuda()) {
        snprintf(nc.absence, sizeof nc.absence, "GPU meshes do not run on CUDA here (DT_GPU)");
        return DT_OK;
    }
    int *all = malloc((size_t)n * 2 * sizeof *all);
    if (!all)
        return dt__error(DT_ERR_NO_MEMORY, "NCCL setup: no memory");
    int rc = MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, dt__comm());
    if (rc != MPI_SUCCESS) {
        free(all);
        return dt__mpi_error(rc, "NCCL setup: MPI_Allgather");
    }
    int ok = 1;
    for (int a = 0; a < n && ok; a++) {
        if (!counts || counts[a] != 1) {
            snprintf(nc.absence, sizeof nc.absence,
                     "client %d has %d GPU devices (NCCL needs exactly one per client)", a,
                     counts ? counts[a] : 0);
            ok = 0;
        }
        for (int b = 0; b < a && ok; b++)
            if (all[2 * a] == all[2 * b] && all[2 * a + 1] == all[2 * b + 1]) {
                snprintf(nc.absence, sizeof nc.absence,
                         "clients %d and %d share CUDA device %d on host %s (NCCL needs a GPU "
                         "per client)", b, a, all[2 * a + 1], dt__client_hostname(a));
                ok = 0;
            }
    }
    free(all);
    *ok_out = ok;
    return DT_OK;
}

dt_status dt__transport_nccl_start(const char *mode)
{
    int ok = 0;
    memset(&nc, 0, sizeof nc);
    if (strcmp(mode, "auto") != 0 && strcmp(mode, "nccl") != 0) {
        snprintf(nc.absence, sizeof nc.absence, "DT_TRANSPORT=%s", mode);
        return DT_OK;
    }
    dt_status st = decide(&ok);
    if (st != DT_OK || !ok)
        return st;
    ncclUniqueId id;
    ncclResult_t r = ncclSuccess;
    if (dt_client_id() == 0)
        r = ncclGetUniqueId(&id);
    int good = r == ncclSuccess, all_good = 0;
    int rc = MPI_Allreduce(&good, &all_good, 1, MPI_INT, MPI_MIN, dt__comm());
    if (rc == MPI_SUCCESS && all_good)
        rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, dt__comm());
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, "NCCL setup: the unique id's broadcast");
    if (!all_good)
        return nccl_status(r, "ncclGetUniqueId on client 0", NULL);
    const dt__device *dev = dt__device_local(DT_DEVICE_GPU, 0);
    st = dt__cuda_status(cudaSetDevice(dev->ordinal), "NCCL setup: cudaSetDevice");
    if (st != DT_OK)
        return st;
    nc.nranks = dt_num_clients();
    r = ncclCommInitRank(&nc.comm, nc.nranks, id, dt_client_id());
    if (r != ncclSuccess) {
        nc.comm = NULL;
        return nccl_status(r, "ncclCommInitRank", NULL);
    }
    nc.applies = 1;
    return DT_OK;
}

/* ---- communicators per line (the relayout's collectives) ---- */

typedef struct line_comm {
    struct line_comm *next;
    int n;
    int *clients;          /* in rank order */
    ncclComm_t comm;
} line_comm;

static line_comm *line_comms;

static void line_comms_free(int abort_them)
{
    while (line_comms) {
        line_comm *l = line_comms;
        line_comms = l->next;
        if (l->comm)
            (void)(abort_them ? ncclCommAbort(l->comm) : ncclCommDestroy(l->comm));
        free(l->clients);
        free(l);
    }
}

void dt__transport_nccl_stop(void)
{
    line_comms_free(0);
    if (nc.comm)
        ncclCommDestroy(nc.comm);
    nc.comm = NULL;
    nc.applies = 0;
}


/* After a failure that may leave NCCL work pending here or on a peer (an asynchronous error,
 * a timeout, a call refused inside a group whose peers issued their halves): every
 * communicator is aborted, so that no later call matches the stale work, and the transport
 * no longer applies, saying why. A peer still waiting on its half times out (DT_COMM_TIMEOUT)
 * and aborts its own. */
static void abort_all(const char *why)
{
    line_comms_free(1);
    if (nc.comm)
        ncclCommAbort(nc.comm);
    nc.comm = NULL;
    nc.applies = 0;
    snprintf(nc.absence, sizeof nc.absence, "its communicator was aborted after %s", why);
}

/* The tally's view of a box: one message, its size as the digest, so that boxes listed in
 * another order or cut otherwise are found out too. */
static void tally_box(const dt__region *r, const void *arg, int64_t *msgs_out,
                      uint64_t *digest_out)
{
    (void)arg;
    *msgs_out = 1;
    *digest_out = (uint64_t)dt__region_bytes(r);
}

/* Before any NCCL call of an exchange: each client sends each peer its tally (runtime/tally.h)
 * over MPI and compares the peer's with its own, so that clients that asked for different
 * relayouts get DT_ERR_STATE alike (NCCL would hang on a receive never sent, or, on a real GPU,
 * not even check the sizes), and nothing was issued to NCCL. */
static dt_status agree_exchange(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs,
                                size_t nrecvs, double timeout)
{
    size_t n = nsends + nrecvs;
    int *peer = malloc(n * 3 * sizeof *peer);
    dt__tally *mine = calloc(2 * n, sizeof *mine);
    MPI_Request *reqs = malloc(2 * n * sizeof *reqs);
    if (!peer || !mine || !reqs) {
        free(peer);
        free(mine);
        free(reqs);
        return dt__error(DT_ERR_NO_MEMORY, "NCCL exchange: no memory");
    }
    dt__tally *theirs = mine + n;
    int *req_peer = peer + n;
    size_t np = dt__tally_peers(sends, nsends, recvs, nrecvs, tally_box, NULL, peer, mine);
    dt_status st = DT_OK;
    size_t nreq = 0;
    for (size_t k = 0; k < np; k++) {
        int rc = MPI_Irecv(&theirs[k], (int)sizeof *theirs, MPI_BYTE, peer[k], NCCL_TALLY_TAG,
                           dt__comm(), &reqs[nreq]);
        if (rc == MPI_SUCCESS) {
            req_peer[nreq++] = peer[k];
            rc = MPI_Isend(&mine[k], (int)sizeof *mine, MPI_BYTE, peer[k], NCCL_TALLY_TAG,
                           dt__comm(), &reqs[nreq]);
        }
        if (rc == MPI_SUCCESS) {
            req_peer[nreq++] = peer[k];
        } else {
            st = dt__mpi_error(rc, "NCCL exchange: the tallies' Isend/Irecv");
            break;
        }
    }
    if (nreq) {
        dt_status wst = dt__wait_watched(reqs, req_peer, (int)nreq, timeout,
                                         "NCCL exchange (the tallies)");
        if (st == DT_OK)
            st = wst;
    }
    if (st == DT_OK)
        st = dt__tally_check(peer, mine, theirs, np);
    free(peer);
    free(mine);
    free(reqs);
    return st;
}

/* Packs the region's box into buf (compact) or unpacks it, on the region's device. */
static dt_status pack(const dt__region *r, void *buf, int into_buf)
{
    int64_t zero[DT_MAX_RANK] = {0};
    if (into_buf)
        return dt__device_copy_box(r->dev, DT__COPY_D2D, r->rank, r->elem, r->start, r->count,
                                   buf, r->start, r->count, r->base, zero, r->shape);
    return dt__device_copy_box(r->dev, DT__COPY_D2D, r->rank, r->elem, r->start, r->count,
                               r->base, zero, r->shape, buf, r->start, r->count);
}

/* Waits for the group's work on the stream, polling NCCL's asynchronous error, for at most
 * DT_COMM_TIMEOUT seconds without completion; aborts the communicator on failure. */
static dt_status wait_group(double timeout, const char *peers)
{
    double start = dt__now_seconds();
    for (unsigned spins = 1;; spins++) {
        cudaError_t e = cudaStreamQuery(0);
        if (e == cudaSuccess)
            return DT_OK;
        if (e != cudaErrorNotReady)
            return dt__cuda_status(e, "NCCL exchange: the device's stream");
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(nc.comm, &async);
        if (r == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
            r = async;
        dt_status st = DT_OK;
        if (r != ncclSuccess)
            st = nccl_status(r, "exchange (asynchronous error)", peers);
        else if (dt__now_seconds() - start > timeout)
            st = dt__error(DT_ERR_TIMEOUT,
                           "NCCL exchange on communicator 'all clients' (%d ranks): nothing "
                           "completed for %.3g s (DT_COMM_TIMEOUT), peer(s) %s", nc.nranks,
                           timeout, peers);
        if (st != DT_OK) {
            abort_all("an error");
            return st;
        }
        if (spins % 256 == 0)
            dt__watchdog_answer();
    }
}

/* Whether the transport applies, and the watchdog's timeout (DT_COMM_TIMEOUT), for an
 * exchange or a set of collectives about to start. */
static dt_status nccl_ready(double *timeout)
{
    if (!nc.applies)
        return dt__error(DT_ERR_UNSUPPORTED, "the nccl transport does not apply: %s",
                         dt__nccl_absence());
    const char *bad = NULL;
    *timeout = dt__comm_timeout(&bad);
    if (bad)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "relayout: DT_COMM_TIMEOUT='%s' is not a number of seconds > 0", bad);
    return DT_OK;
}

static dt_status nccl_exchange(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs,
                               size_t nrecvs, void (*local_work)(void *), void *arg)
{
    size_t n = nsends + nrecvs;
    if (n == 0) {
        if (local_work)
            local_work(arg);
        return DT_OK;
    }
    double timeout;
    dt_status ready = nccl_ready(&timeout);
    if (ready != DT_OK)
        return ready;
    ready = agree_exchange(sends, nsends, recvs, nrecvs, timeout);
    if (ready != DT_OK)
        return ready;
    void **bufs = calloc(n, sizeof *bufs);
    char peers[256] = ""; /* each peer once, for messages */
    int listed[32], nlisted = 0;
    dt_status st = bufs ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "NCCL exchange: no memory");
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        const dt__xfer *x = i < nrecvs ? &recvs[i] : &sends[i - nrecvs];
        size_t len = strlen(peers);
        int seen = 0;
        for (int k = 0; k < nlisted && !seen; k++)
            seen = listed[k] == x->peer;
        if (!seen && nlisted < 32 && len + 16 < sizeof peers) {
            listed[nlisted++] = x->peer;
            snprintf(peers + len, sizeof peers - len, "%s%d", len ? "," : "", x->peer);
        }
        if (!x->region.dev || x->region.dev->kind != dt__device_kind_cuda())
            st = dt__error(DT_ERR_UNSUPPORTED, "the nccl transport moves CUDA device memory "
                           "only (transfer with client %d)", x->peer);
        if (st == DT_OK)
            st = dt__device_alloc(x->region.dev, dt__region_bytes(&x->region), &bufs[i]);
        if (st == DT_OK && i >= nrecvs)
            st = pack(&x->region, bufs[i], 1);
    }
    if (st == DT_OK) {
        ncclResult_t r = ncclGroupStart();
        for (size_t i = 0; i < n && r == ncclSuccess; i++) {
            const dt__xfer *x = i < nrecvs ? &recvs[i] : &sends[i - nrecvs];
            size_t bytes = dt__region_bytes(&x->region);
            r = i < nrecvs ? ncclRecv(bufs[i], bytes, ncclChar, x->peer, nc.comm, 0)
                           : ncclSend(bufs[i], bytes, ncclChar, x->peer, nc.comm, 0);
        }
        /* A call refused inside the group ends the group (NCCL then issues none of it) but the
         * peers issued their halves, which the next exchange would match: abort. */
        ncclResult_t r2 = ncclGroupEnd();
        if (r == ncclSuccess)
            r = r2;
        if (r != ncclSuccess && r != ncclInProgress) {
            st = nccl_status(r, "ncclSend/ncclRecv group", peers);
            abort_all("a refused ncclSend/ncclRecv");
        }
    }
    if (st == DT_OK && local_work)
        local_work(arg);
    if (st == DT_OK)
        st = wait_group(timeout, peers);
    for (size_t i = 0; i < nrecvs && st == DT_OK; i++)
        st = pack(&recvs[i].region, bufs[i], 0);
    for (size_t i = 0; bufs && i < n; i++)
        if (bufs[i]) {
            const dt__xfer *x = i < nrecvs ? &recvs[i] : &sends[i - nrecvs];
            dt__device_free(x->region.dev, bufs[i], dt__region_bytes(&x->region));
        }
    free(bufs);
    return st;
}

static dt_status line_status(ncclResult_t r, const char *what, const dt__coll *c)
{
    return dt__error(DT_ERR_COMM, "NCCL %s on the line communicator of clients %d..%d (%d "
                     "ranks, this client rank %d): %s", what, c->clients[0],
                     c->clients[c->nmembers - 1], c->nmembers, c->rank, ncclGetErrorString(r));
}

/* The NCCL communicator of c's line: cached, or made now (member 0's unique id broadcast over
 * the line's MPI group; collective over the line's clients). */
static dt_status line_comm_get(const dt__coll *c, ncclComm_t *out)
{
    line_comm *l = line_comms;
    while (l && (l->n != c->nmembers ||
                 memcmp(l->clients, c->clients, (size_t)c->nmembers * sizeof *c->clients)))
        l = l->next;
    if (l) {
        *out = l->comm;
        return DT_OK;
    }
    const dt__group *g = NULL;
    dt_status st = dt__clients_group(c->nmembers, c->clients, &g);
    if (st != DT_OK)
        return st;
    ncclUniqueId id;
    ncclResult_t r = ncclSuccess;
    if (g->rank == 0)
        r = ncclGetUniqueId(&id);
    int good = r == ncclSuccess, all_good = 0;
    int rc = MPI_Allreduce(&good, &all_good, 1, MPI_INT, MPI_MIN, g->comm);
    if (rc == MPI_SUCCESS && all_good)
        rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, g->comm);
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, "NCCL line communicator: the unique id's broadcast");
    if (!all_good)
        return line_status(r, "ncclGetUniqueId on the line's first client", c);
    l = calloc(1, sizeof *l);
    int *clients = malloc((size_t)c->nmembers * sizeof *clients);
    if (!l || !clients) {
        free(l);
        free(clients);
        return dt__error(DT_ERR_NO_MEMORY, "NCCL line communicator: no memory");
    }
    memcpy(clients, c->clients, (size_t)c->nmembers * sizeof *clients);
    r = ncclCommInitRank(&l->comm, c->nmembers, id, c->rank);
    if (r != ncclSuccess) {
        free(l);
        free(clients);
        return line_status(r, "ncclCommInitRank", c);
    }
    l->n = c->nmembers;
    l->clients = clients;
    l->next = line_comms;
    line_comms = l;
    *out = l->comm;
    return DT_OK;
}

static int nccl_type(dt_dtype t, ncclDataType_t *out)
{
    switch (t) {
    case DT_DTYPE_F32: *out = ncclFloat32; return 1;
    case DT_DTYPE_F64: *out = ncclFloat64; return 1;
    case DT_DTYPE_F16: *out = ncclFloat16; return 1;
    case DT_DTYPE_BF16: *out = ncclBfloat16; return 1;
    case DT_DTYPE_I32: *out = ncclInt32; return 1;
    case DT_DTYPE_I64: *out = ncclInt64; return 1;
    case DT_DTYPE_U8: *out = ncclUint8; return 1;
    default: return 0;
    }
}

static ncclRedOp_t nccl_op(dt_reduce_op op)
{
    switch (op) {
    case DT_REDUCE_MAX: return ncclMax;
    case DT_REDUCE_MIN: return ncclMin;
    case DT_REDUCE_AVG: return ncclAvg;
    default: return ncclSum;
    }
}

/* Issues one collective on comm (inside the caller's ncclGroupStart). */
static ncclResult_t issue(const dt__coll *c, ncclComm_t comm, ncclDataType_t type)
{
    size_t elem = dt_dtype_size(c->dtype), count = c->bytes / (elem ? elem : 1);
    switch (c->kind) {
    case DT__COLL_ALLGATHER:
        return ncclAllGather(c->send, c->recv, c->bytes, ncclChar, comm, 0);
    case DT__COLL_REDUCE_SCATTER:
        return ncclReduceScatter(c->send, c->recv, count, type, nccl_op(c->op), comm, 0);
    case DT__COLL_ALLREDUCE:
        return ncclAllReduce(c->send, c->recv, count, type, nccl_op(c->op), comm, 0);
    case DT__COLL_ALLTOALL: {
        ncclResult_t r = ncclSuccess;
        for (int j = 0; j < c->nmembers && r == ncclSuccess; j++) {
            r = ncclSend((const char *)c->send + (size_t)j * c->bytes, c->bytes, ncclChar, j,
                         comm, 0);
            if (r == ncclSuccess)
                r = ncclRecv((char *)c->recv + (size_t)j * c->bytes, c->bytes, ncclChar, j,
                             comm, 0);
        }
        return r;
    }
    case DT__COLL_ALLTOALLV: { /* point-to-point pairs; members with nothing are skipped */
        ncclResult_t r = ncclSuccess;
        for (int j = 0; j < c->nmembers && r == ncclSuccess; j++) {
            if (c->send_bytes[j])
                r = ncclSend((const char *)c->send + c->send_displs[j], c->send_bytes[j],
                             ncclChar, j, comm, 0);
            if (r == ncclSuccess && c->recv_bytes[j])
                r = ncclRecv((char *)c->recv + c->recv_displs[j], c->recv_bytes[j], ncclChar,
                             j, comm, 0);
        }
        return r;
    }
    }
    return ncclInvalidArgument;
}

/* What a member runs in one collective, agreed over the line's MPI group before any NCCL
 * call: members that asked for different relayouts (an all-gather here, an all-to-all there,
 * other blocks or reductions) would otherwise issue mismatched NCCL collectives, which hang
 * or, on a real GPU, run unchecked. */
typedef struct coll_card {
    int32_t client, kind, dtype, op;
    int64_t bytes;
} coll_card;

/* The collective's name with its article. */
static const char *coll_name(int kind)
{
    switch (kind) {
    case DT__COLL_ALLGATHER: return "an all-gather";
    case DT__COLL_ALLTOALL: return "an all-to-all";
    case DT__COLL_REDUCE_SCATTER: return "a reduce-scatter";
    case DT__COLL_ALLREDUCE: return "an all-reduce";
    default: return "a collective";
    }
}

static coll_card card_of(const dt__coll *c)
{
    int reduces = c->kind == DT__COLL_REDUCE_SCATTER || c->kind == DT__COLL_ALLREDUCE;
    return (coll_card){dt_client_id(), (int32_t)c->kind, reduces ? (int32_t)c->dtype : -1,
                       reduces ? (int32_t)c->op : -1, (int64_t)c->bytes};
}

/* Every line's members exchange their cards (one small all-gather per collective, all
 * started at once; a ragged all-to-all's sizes were agreed by its caller) and compare them:
 * DT_ERR_STATE naming the first member that differs, the same verdict on every member. */
static dt_status agree_colls(const dt__coll *colls, size_t n, double timeout)
{
    size_t ncards = 0;
    for (size_t i = 0; i < n; i++)
        ncards += (size_t)colls[i].nmembers;
    coll_card *cards = calloc(ncards + n + 1, sizeof *cards);
    MPI_Request *reqs = malloc((n + 1) * sizeof *reqs);
    if (!cards || !reqs) {
        free(cards);
        free(reqs);
        return dt__error(DT_ERR_NO_MEMORY, "NCCL collectives: no memory");
    }
    coll_card *mine = cards + ncards;
    dt_status st = DT_OK;
    size_t started = 0;
    for (size_t i = 0, off = 0; i < n; off += (size_t)colls[i].nmembers, i++, started++) {
        const dt__coll *c = &colls[i];
        const dt__group *g = NULL;
        reqs[i] = MPI_REQUEST_NULL;
        if (c->kind == DT__COLL_ALLTOALLV)
            continue;
        st = dt__clients_group(c->nmembers, c->clients, &g);
        if (st != DT_OK)
            break;
        mine[i] = card_of(c);
        int rc = MPI_Iallgather(&mine[i], (int)sizeof *mine, MPI_BYTE, &cards[off],
                                (int)sizeof *mine, MPI_BYTE, g->comm, &reqs[i]);
        if (rc != MPI_SUCCESS) {
            reqs[i] = MPI_REQUEST_NULL;
            st = dt__mpi_error(rc, "NCCL collectives: the agreement's MPI_Iallgather");
            break;
        }
    }
    dt_status verdict = DT_OK;
    for (size_t i = 0, off = 0; i < started; off += (size_t)colls[i].nmembers, i++) {
        const dt__coll *c = &colls[i];
        if (reqs[i] == MPI_REQUEST_NULL)
            continue;
        char what[96];
        snprintf(what, sizeof what, "NCCL: %s over clients %d..%d (the agreement)",
                 coll_name(c->kind), c->clients[0], c->clients[c->nmembers - 1]);
        dt_status wst = dt__wait_watched_group(&reqs[i], c->clients, c->nmembers, timeout, what);
        if (wst != DT_OK) {
            if (st == DT_OK)
                st = wst;
            continue;
        }
        for (int j = 0; j < c->nmembers && verdict == DT_OK; j++) {
            const coll_card *o = &cards[off + (size_t)j], *m = &mine[i];
            if (o->kind == m->kind && o->bytes == m->bytes && o->dtype == m->dtype &&
                o->op == m->op)
                continue;
            verdict = dt__error(DT_ERR_STATE, "relayout over NCCL, clients %d..%d: client %d "
                                "asked for %s of %lld-byte blocks where this client asked "
                                "for %s of %lld-byte blocks%s: %s", c->clients[0],
                                c->clients[c->nmembers - 1], o->client, coll_name(o->kind),
                                (long long)o->bytes, coll_name(m->kind), (long long)m->bytes,
                                o->kind == m->kind && o->bytes == m->bytes
                                    ? " (another dtype or reduction)" : "",
                                DT__MISMATCH_HINT);
        }
    }
    free(cards);
    free(reqs);
    return st != DT_OK ? st : verdict;
}

/* The collectives of one relayout in one NCCL group on the default stream; the wait polls
 * every communicator's asynchronous error under DT_COMM_TIMEOUT and aborts them on failure. */
static dt_status nccl_collective(const dt__coll *colls, size_t n)
{
    double timeout;
    dt_status ready = nccl_ready(&timeout);
    if (ready != DT_OK)
        return ready;
    ncclComm_t *comms = calloc(n + 1, sizeof *comms);
    ncclDataType_t *types = calloc(n + 1, sizeof *types);
    dt_status st = comms && types ? DT_OK
                                  : dt__error(DT_ERR_NO_MEMORY, "NCCL collectives: no memory");
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        const dt__coll *c = &colls[i];
        if (!c->dev || c->dev->kind != dt__device_kind_cuda())
            st = dt__error(DT_ERR_UNSUPPORTED, "the nccl transport moves CUDA device memory "
                           "only (collective of clients %d..%d)", c->clients[0],
                           c->clients[c->nmembers - 1]);
        else if (c->kind != DT__COLL_ALLGATHER && c->kind != DT__COLL_ALLTOALL &&
                 c->kind != DT__COLL_ALLTOALLV && !nccl_type(c->dtype, &types[i]))
            st = dt__error(DT_ERR_UNSUPPORTED, "NCCL reduces no %s", dt_dtype_name(c->dtype));
    }
    if (st == DT_OK)
        st = agree_colls(colls, n, timeout);
    for (size_t i = 0; i < n && st == DT_OK; i++)
        st = line_comm_get(&colls[i], &comms[i]);
    if (st == DT_OK) {
        ncclResult_t r = ncclGroupStart();
        size_t failed = 0;
        for (size_t i = 0; i < n && r == ncclSuccess; i++)
            if ((r = issue(&colls[i], comms[i], types[i])) != ncclSuccess)
                failed = i;
        ncclResult_t r2 = ncclGroupEnd();
        if (r == ncclSuccess)
            r = r2;
        if (r != ncclSuccess && r != ncclInProgress) {
            st = line_status(r, "collective", &colls[failed]);
            abort_all("a refused collective"); /* the peers issued theirs (see nccl_exchange) */
        }
    }
    /* The wait: the stream, and each line communicator's asynchronous error. */
    double start = dt__now_seconds();
    for (unsigned spins = 1; st == DT_OK; spins++) {
        cudaError_t e = cudaStreamQuery(0);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady) {
            st = dt__cuda_status(e, "NCCL collective: the device's stream");
            break;
        }
        for (size_t i = 0; i < n && st == DT_OK; i++) {
            ncclResult_t async = ncclSuccess;
            ncclResult_t r = ncclCommGetAsyncError(comms[i], &async);
            if (r == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
                r = async;
            if (r != ncclSuccess)
                st = line_status(r, "collective (asynchronous error)", &colls[i]);
        }
        if (st == DT_OK && dt__now_seconds() - start > timeout)
            st = dt__error(DT_ERR_TIMEOUT, "NCCL collective over clients %d..%d (%d ranks): "
                           "nothing completed for %.3g s (DT_COMM_TIMEOUT)",
                           colls[0].clients[0], colls[0].clients[colls[0].nmembers - 1],
                           colls[0].nmembers, timeout);
        if (st != DT_OK)
            abort_all("an error in a collective");
        if (spins % 256 == 0)
            dt__watchdog_answer();
    }
    free(comms);
    free(types);
    return st;
}

static void nccl_release(dt__xfer_cache *cache)
{
    (void)cache; /* nothing cached: buffers come from the device pool per call */
}

static int nccl_moves(const dt__device_kind *kind)
{
    return kind && kind == dt__device_kind_cuda();
}

static int nccl_can_connect(int peer)
{
    (void)peer;
    return nc.applies; /* one communicator over all clients */
}

static const dt__transport nccl_transport = {
    .name = "nccl",
    .exchange = nccl_exchange,
    .release = nccl_release,
    .moves = nccl_moves,
    .can_connect = nccl_can_connect,
    .coll_kinds = DT__COLL_BIT(DT__COLL_ALLGATHER) | DT__COLL_BIT(DT__COLL_ALLTOALL) |
                  DT__COLL_BIT(DT__COLL_REDUCE_SCATTER) | DT__COLL_BIT(DT__COLL_ALLREDUCE) |
                  DT__COLL_BIT(DT__COLL_ALLTOALLV),
    .collective = nccl_collective,
};

const dt__transport *dt__transport_nccl(void)
{
    return nc.applies ? &nccl_transport : NULL;
}
