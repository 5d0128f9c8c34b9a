/* Transports: move boxes of compact row-major arrays between clients, and the choice of one
 * per relayout plan (runtime/transport.c, docs/transports.md). Not installed. */
#ifndef DTENSOR_RUNTIME_TRANSPORT_H
#define DTENSOR_RUNTIME_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/dtype.h"
#include "dtensor/runtime.h"

typedef struct dt__device dt__device;           /* runtime/device.h */
typedef struct dt__device_kind dt__device_kind; /* runtime/device.h */

/* A box inside a compact row-major array of `rank` dims. */
typedef struct dt__region {
    void *base;                  /* start of the array (host or device memory) */
    const dt__device *dev;       /* whose memory base is; NULL: host memory of no device */
    int rank;
    size_t elem;                 /* bytes per element */
    int64_t shape[DT_MAX_RANK];  /* the array's shape */
    int64_t start[DT_MAX_RANK];  /* the box inside it */
    int64_t count[DT_MAX_RANK];
} dt__region;

/* Bytes of the region's box. */
static inline size_t dt__region_bytes(const dt__region *r)
{
    size_t b = r->elem;
    for (int d = 0; d < r->rank; d++)
        b *= (size_t)r->count[d];
    return b;
}

/* Transport-private state of one transfer (e.g. an MPI datatype, staging buffers), built on
 * first use and kept by the caller (a cached relayout plan) across calls. Zero-initialise;
 * release it through the transport that built it. */
typedef struct dt__xfer_cache {
    void *state;
} dt__xfer_cache;

typedef struct dt__xfer {
    int peer;                    /* the other client */
    dt__region region;
    dt__xfer_cache *cache;       /* NULL: state built and dropped within the call */
} dt__xfer;

/* One collective over the clients of a mesh dim's line of devices (issue 22; the relayout's
 * regular patterns, layout/relayout_pattern.c). Members are listed in the line's coordinate
 * order; this client is member `rank`. Blocks are `bytes` long and stored in member order:
 *   ALLGATHER       send: one block; recv: nmembers blocks.
 *   ALLTOALL        send and recv: nmembers blocks (block j goes to / came from member j).
 *   REDUCE_SCATTER  send: nmembers blocks; recv: one, the reduction of every member's block
 *                   `rank` (count elements of dtype, op).
 *   ALLREDUCE       send and recv: one block, the reduction of every member's.
 *   ALLTOALLV       ragged all-to-all (dt_alltoallv, ops/alltoallv.c): send_bytes[j] bytes at
 *                   send + send_displs[j] go to member j, recv_bytes[j] bytes from member j
 *                   land at recv + recv_displs[j]; `bytes` unused. The caller agreed the
 *                   sizes beforehand (every member knows every count), so a transport need
 *                   not check them against each other.
 * Native reductions (NCCL's) need not sum in member order; the relayout asks the MPI
 * transport only for ALLGATHER and ALLTOALL and sums in member order itself (bit-identical
 * to the piece path). */
typedef enum dt__coll_kind {
    DT__COLL_ALLGATHER = 0,
    DT__COLL_ALLTOALL = 1,
    DT__COLL_REDUCE_SCATTER = 2,
    DT__COLL_ALLREDUCE = 3,
    DT__COLL_ALLTOALLV = 4,
} dt__coll_kind;

typedef struct dt__coll {
    dt__coll_kind kind;
    int nmembers;
    const int *clients;          /* member -> client id */
    int rank;
    const void *send;
    void *recv;
    size_t bytes;                /* one block */
    dt_dtype dtype;              /* the elements (reductions) */
    dt_reduce_op op;
    const dt__device *dev;       /* whose memory send and recv are; NULL: host memory */
    /* ALLTOALLV only: nmembers entries each, in bytes */
    const size_t *send_bytes, *send_displs, *recv_bytes, *recv_displs;
    /* Optional, read from colls[0] only and only by a transport whose coll_kinds has
     * DT__COLL_LOCAL_WORK: run once, after every transfer is posted and before the wait (work
     * of the caller's on memory no transfer touches: dt_alltoallv zeroes its output's tails). */
    void (*local_work)(void *);
    void *arg;
} dt__coll;

#define DT__COLL_BIT(kind) (1u << (kind))
/* In coll_kinds: collective() runs colls[0].local_work (above). */
#define DT__COLL_LOCAL_WORK (1u << 31)

/* A mover. The planner decides what goes where; a transport only moves it, so every
 * transport takes the same plan. Both clients of a transfer use the same transport (the
 * choice below depends only on what every client of the plan knows alike).
 *
 * exchange() keeps the signature it had before transports were chosen per plan (issue 12),
 * so a transport written against it (runtime/transport_shm.c, issue 20) only adds `moves`
 * and `can_connect`; regions now also say their device (dt__region.dev, NULL for host
 * memory), which a host-memory transport may ignore. */
typedef struct dt__transport {
    const char *name;            /* what DT_TRANSPORT calls it */
    /* Posts every receive and send, runs local_work(arg) (may be NULL) while they progress,
     * then waits for all. Between two clients, sender and receiver list their transfers in
     * the same order. DT_ERR_COMM on failure, DT_ERR_TIMEOUT naming the peer when one is
     * lost (the watchdog, DT_COMM_TIMEOUT). */
    dt_status (*exchange)(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs,
                          size_t nrecvs, void (*local_work)(void *), void *arg);
    /* Frees what exchange cached. */
    void (*release)(dt__xfer_cache *cache);
    /* 1 if it moves memory of `kind` (NULL: host memory of no device); NULL entry: host
     * memory only. */
    int (*moves)(const dt__device_kind *kind);
    /* 1 if it reaches client `peer` from this one; symmetric and the same on every client
     * (decided at dt_init). NULL entry: every client. */
    int (*can_connect)(int peer);
    /* Optional (0 / NULL: the relayout moves pieces with exchange instead). coll_kinds:
     * DT__COLL_BIT of each dt__coll_kind it runs. collective() starts colls[0..n) in order
     * (every member of a line lists that line's collectives in the same relative order) and
     * waits for all; DT_ERR_COMM / DT_ERR_TIMEOUT naming the group and the peer. */
    unsigned coll_kinds;
    dt_status (*collective)(const dt__coll *colls, size_t n);
    /* Optional (NULL: the transport has exchange only). Like exchange, but the receives are
     * not written: views[i] (nrecvs entries) gets where the box of recvs[i] can be read (a
     * region of host memory: the sender's own array, or a buffer of the transport's holding
     * exactly the box); recvs[i].region.base is not used. The views stay valid until
     * views_done(*token), which every client of the exchange calls once it read them (also
     * after a failure elsewhere, while *token is set); it waits for this client's sends to be
     * read by their receivers. A reduction thus reads its summands in place. */
    dt_status (*exchange_view)(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs,
                               size_t nrecvs, dt__region *views, void (*local_work)(void *),
                               void *arg, void **token);
    dt_status (*views_done)(void *token);
} dt__transport;

/* The end of every transport's message for a receive of another size than expected (clients
 * that asked one relayout for different layouts), so that they all read alike. */
#define DT__MISMATCH_HINT                                                                  \
    "the clients asked for different relayouts (other layouts, shapes or calls; "         \
    "DT_CHECK_COLLECTIVES=1 names both calls)"

/* The MPI transport for host memory (runtime/transport_mpi.c). */
const dt__transport *dt__transport_mpi(void);
/* The same-host shared-memory transport (runtime/transport_shm.c), NULL while the shm pool
 * (runtime/shm.h) is down; reset: its channel counts start again (dt_init). */
const dt__transport *dt__transport_shm(void);
void dt__transport_shm_reset(void);
/* Bytes the shm transport received here since dt_init: copied straight from a host peer's
 * segment, read there in place (a reduction's summands), and by MPI (another host, or a box
 * outside the pool). Local; tests check which path a relayout took. */
void dt__transport_shm_bytes(uint64_t *direct, uint64_t *viewed, uint64_t *mpi);
/* Seconds this client's shm exchanges spent since start, by phase: setting up and posting
 * (and freeing), the local copies run meanwhile (local_work), the progress loop until every
 * receive is in (PROGRESS, which includes PEER_COPY: copying boxes out of peers' segments),
 * and the wait after that until the peers consumed what this client sent (HANDOFF). Local;
 * bench/relayout prints them (DT_BENCH_PHASES=1). */
enum {
    DT__SHM_SETUP, DT__SHM_LOCAL, DT__SHM_PROGRESS, DT__SHM_PEER_COPY, DT__SHM_HANDOFF,
    DT__SHM_PHASES
};
void dt__transport_shm_phases(double out[DT__SHM_PHASES]);
/* DT_TRANSPORT's value as configure read it: "auto", or the name of the forced transport. */
const char *dt__transport_mode(void);
/* Device memory through pinned host staging and MPI, pipelined in chunks
 * (runtime/transport_staged.c); also moves host memory, so it pairs with itself only. */
const dt__transport *dt__transport_staged(void);
/* Chunks this client's staged exchanges have sent plus received since dt_init (tests check
 * that the pipeline cut a transfer). Local. */
uint64_t dt__transport_staged_chunks(void);
/* NCCL between clients that each own their GPU (runtime/transport_nccl.c); NULL when the
 * build has no NCCL or dt_init found it does not apply (transport.c says why). */
const dt__transport *dt__transport_nccl(void);
/* dt_init/dt_finalize through start/stop below: decides whether NCCL applies (every client
 * owns its own GPU of the cuda kind; mode: DT_TRANSPORT's value, "nccl" makes a failure to
 * set it up an error) and builds its communicator (collective). absence: why it does not
 * apply, for messages. Without NCCL in the build: transport.c's stand-ins. */
dt_status dt__transport_nccl_start(const char *mode);
void dt__transport_nccl_stop(void);
const char *dt__nccl_absence(void);

/* ---- the choice (runtime/transport.c) ----
 * DT_TRANSPORT = auto (default) | mpi | staged | nccl | shm, read by dt_init through
 * configure (DT_ERR_INVALID_ARGUMENT naming the accepted values otherwise). start runs at
 * dt_init after the devices (collective: NCCL's communicator), stop at dt_finalize. */
dt_status dt__transport_configure(void);
dt_status dt__transport_start(void);
void dt__transport_stop(void);

/* The transport for moving memory of the `nkinds` kinds (NULL: host memory) between the
 * `nclients` clients listed (crossing: 1 if some piece moves between two of them). Auto:
 * the first in priority order (nccl, shm, mpi, staged) that moves every kind and connects
 * every pair. Forced (DT_TRANSPORT): that one, or DT_ERR_UNSUPPORTED naming it and why when
 * crossing and it cannot. Local; the same answer on every client of the plan. */
dt_status dt__transport_select(const dt__device_kind *const *kinds, int nkinds,
                               const int *clients, int nclients, int crossing,
                               const dt__transport **out);

#endif
