/* The simulated accelerator (docs/devices-sim.md): one arena of "device" memory per process
 * that host code cannot touch (runtime/sim_arena.c), and one stream thread per simulated GPU,
 * the only place where that memory is read or written (runtime/sim_stream.c). The device kind
 * (runtime/device_sim.c) and the kernels (ops/sim/) are built on these calls. Not installed. */
#ifndef DTENSOR_RUNTIME_SIM_H
#define DTENSOR_RUNTIME_SIM_H

#include <stddef.h>

#include "dtensor/status.h"

/* ---- streams (runtime/sim_stream.c) ---- */

/* Queues fn(arg) on the stream of simulated GPU `ordinal`, after everything submitted before;
 * `arg` (argsize bytes, at most DT__SIM_ARG_MAX) is copied, so it may live on the caller's
 * stack. fn runs on the stream thread; a failing status (with the dt_last_error text it set
 * there) is kept and returned by the next dt__sim_submit or dt__sim_sync on that stream, from
 * whichever thread calls it, with that text; the work queued behind the failure is skipped
 * until then, as after a CUDA stream's sticky error, and the submit that returns the error
 * queues nothing. DT_ERR_INVALID_ARGUMENT for an ordinal that is not this process's. Any
 * thread may submit; items of one stream run in submission order. */
#define DT__SIM_ARG_MAX 256
dt_status dt__sim_submit(int ordinal, dt_status (*fn)(void *arg), const void *arg,
                         size_t argsize);

/* The same for a closure that owns resources (heap arguments): drop(arg) runs on the stream
 * instead of fn when the item is skipped behind a failure, so they are released either way. */
dt_status dt__sim_submit_owned(int ordinal, dt_status (*fn)(void *arg), void (*drop)(void *arg),
                               const void *arg, size_t argsize);

/* Waits until the stream of `ordinal` has run everything submitted; returns the first
 * failure since the last sync (and clears it). */
dt_status dt__sim_sync(int ordinal);

/* Waits until every stream has run everything submitted, keeping their failures for the
 * next submit or sync (device memory is freed after this). */
void dt__sim_drain_all(void);

/* Number of simulated GPUs (ordinals 0..n-1) of this process, 0 when not started. */
int dt__sim_num_ordinals(void);

/* dt_init / dt_finalize through the device kind (after the arena is mapped, before it goes):
 * start starts `nordinals` stream threads (at most 64); stop runs what is queued, then ends
 * them. */
dt_status dt__sim_streams_start(int nordinals);
void dt__sim_streams_stop(void);

/* ---- device memory (runtime/sim_arena.c) ---- */

/* Maps the arena: `bytes` of sparse memory (pages exist once written) seen at two addresses,
 * the device view handed out by dt__sim_alloc (no access: a host load or store there is a
 * SIGSEGV) and a read/write shadow that only the stream threads use. DT_ERR_NO_MEMORY when
 * the mapping fails. */
dt_status dt__sim_arena_open(size_t bytes);
/* Unmaps it; blocks still allocated become invalid. */
void dt__sim_arena_close(void);

/* A block of `bytes` (256-byte aligned, at least 1 byte) of the arena, or DT_ERR_NO_MEMORY
 * naming simulated GPU device `device_id` and the bytes (the other blocks are untouched).
 * Thread-safe. */
dt_status dt__sim_alloc(int device_id, size_t bytes, void **ptr_out);
/* Returns a block to the arena (NULL and pointers that are not a live block are ignored).
 * The caller makes sure no queued work still uses it. Thread-safe. */
void dt__sim_free(void *ptr);

/* 1 when [p, p + bytes) lies inside the arena's device view. */
int dt__sim_owns(const void *p, size_t bytes);

/* On a stream thread: the address where host code may access simulated device address p
 * (p unchanged when it is not simulated device memory, e.g. a host pointer or NULL). */
void *dt__sim_xlate(const void *p);

/* Bytes the arena holds, and those not allocated (for tests and messages). */
size_t dt__sim_capacity(void);
size_t dt__sim_free_bytes(void);

#endif
