/* The same-host shared-memory pool (runtime/shm_pool.c) and what the shm transport
 * (runtime/transport_shm.c) reads of it: one segment per process, mapped by every process of
 * its host at dt_init, its first pages the channels its owner sends through (docs/transports.md,
 * "shm"). Not installed. */
#ifndef DTENSOR_RUNTIME_SHM_H
#define DTENSOR_RUNTIME_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dtensor/dtype.h"
#include "dtensor/runtime.h"

enum { DT__SHM_RING = 64 }; /* descriptors in flight from one process to one host peer */

/* One transfer offered by the segment's owner: the array holding the box, in its segment
 * (offset of the array's base from the segment's start; -1: the box comes by MPI instead).
 * Each also carries the owner's tally with the reader for the exchange, so that a reader
 * that finds another box or another number of them than it expected knows how many
 * descriptors to drain (clients in different calls; docs/trace.md). */
typedef struct dt__shm_desc {
    int64_t offset;
    int64_t shape[DT_MAX_RANK];
    int64_t start[DT_MAX_RANK];
    int64_t count[DT_MAX_RANK];  /* the box, and its bytes: the receiver checks that it */
    uint64_t bytes;              /* expected the same (else both are in different calls) */
    uint32_t nbox;               /* descriptors the owner posts the reader in this exchange;
                                  * 0: a marker, no box (the owner sends none, the reader
                                  * expected some) */
    uint32_t nrecv;              /* boxes the owner expects from the reader in it */
} dt__shm_desc;

/* The channel from a segment's owner to one host peer (in the owner's segment). posted:
 * descriptors written; taken: descriptors the reader has read (their ring slots free again);
 * consumed: transfers the reader is done with (the owner may change the memory again). Each
 * counter only grows; both sides count alike since dt_init. broken: set (never cleared until
 * dt_init) when the counts no longer match, descriptors being left that the reader will not
 * take: every later exchange between the two fails with DT_ERR_COMM. */
typedef struct dt__shm_chan {
    _Alignas(64) _Atomic uint64_t posted;
    _Alignas(64) _Atomic uint64_t taken;
    _Alignas(64) _Atomic uint64_t consumed;
    _Alignas(64) _Atomic uint64_t broken;
    _Alignas(64) dt__shm_desc ring[DT__SHM_RING];
} dt__shm_chan;

/* dt_init (through dt__transport_start, after the devices): sets the pool up on every host,
 * collectively over dt__comm. mode: DT_TRANSPORT's value ("mpi": not at all; "shm": a failure
 * is an error naming why; else a failure leaves the pool down, dt__shm_absence saying why).
 * Up on every client or on none. */
dt_status dt__shm_start(const char *mode);
/* dt_finalize: unmaps the peers' segments, and its own unless memory of it is still held. */
void dt__shm_stop(void);
int dt__shm_up(void);
const char *dt__shm_absence(void);

/* CPU tensor memory (runtime/device_cpu.c): a block of the own segment, 64-byte aligned;
 * 0 when the pool is down or full (the caller uses the host pool), 1 with *ptr_out set.
 * Counted in dt_host_pool_stats like the host pool's blocks. */
int dt__shm_alloc(size_t bytes, void **ptr_out);
/* 1 if ptr is a block of the own segment (now free), 0 if it is not the pool's. */
int dt__shm_free(void *ptr);

/* Offset of [p, p+bytes) in the own segment's blocks, -1 when it is not inside one. */
int64_t dt__shm_offset(const void *p, size_t bytes);
/* The host peer index of a client (its rank on this host), -1 when on another host. */
int dt__shm_local(int client);
/* Host peer `local`'s segment as mapped here, its process id; the own index. */
unsigned char *dt__shm_segment(int local);
pid_t dt__shm_pid(int local);
int dt__shm_self(void);
/* The channel from host peer `from` to host peer `to` (in from's segment). */
dt__shm_chan *dt__shm_chan_of(int from, int to);

#endif
