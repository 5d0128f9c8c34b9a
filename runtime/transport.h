/* Transports: move boxes of compact row-major arrays between clients. Not installed. */
#ifndef DTENSOR_RUNTIME_TRANSPORT_H
#define DTENSOR_RUNTIME_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/dtensor.h"

/* A box inside a compact row-major array of `rank` dims. */
typedef struct dt__region {
    void *base;                  /* start of the array (host or device memory) */
    int rank;
    size_t elem;                 /* bytes per element */
    int64_t shape[DT_MAX_RANK];  /* the array's shape */
    int64_t start[DT_MAX_RANK];  /* the box inside it */
    int64_t count[DT_MAX_RANK];
} dt__region;

/* Transport-private state of one transfer (e.g. an MPI datatype), built on first use and
 * kept by the caller (a cached relayout plan) across calls. Zero-initialise. */
typedef struct dt__xfer_cache {
    void *state;
} dt__xfer_cache;

typedef struct dt__xfer {
    int peer;                    /* the other client */
    dt__region region;
    dt__xfer_cache *cache;       /* NULL: state built and dropped within the call */
} dt__xfer;

/* A mover. The planner decides what goes where; a transport only moves it, so a NCCL mover
 * for device memory takes the same plan. */
typedef struct dt__transport {
    const char *name;
    /* Posts every receive and send, runs local_work(arg) (may be NULL) while they progress,
     * then waits for all. Between two clients, sender and receiver list their transfers in
     * the same order. DT_ERR_COMM on failure. */
    dt_status (*exchange)(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs,
                          size_t nrecvs, void (*local_work)(void *), void *arg);
    /* Frees what exchange cached. */
    void (*release)(dt__xfer_cache *cache);
} dt__transport;

/* The MPI transport for host memory (runtime/transport_mpi.c). */
const dt__transport *dt__transport_mpi(void);

#endif
