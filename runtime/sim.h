/* The simulated accelerator's stream, for the kernels that run inside it (ops/sim/): work
 * submitted to a simulated device runs on its stream thread, the only place where the
 * device's memory can be touched (docs/devices.md). Not installed. */
#ifndef DTENSOR_RUNTIME_SIM_H
#define DTENSOR_RUNTIME_SIM_H

#include <stddef.h>

#include "dtensor/status.h"

/* Queues fn(arg) on the stream of simulated GPU `ordinal`, after everything submitted before;
 * `arg` (argsize bytes, at most DT__SIM_ARG_MAX) is copied, so it may live on the caller's
 * stack. fn runs on the stream thread; a failing status (with the dt_last_error text it set
 * there) is kept and returned by the next dt__sim_submit or dt__sim_sync on that stream, and
 * the work queued behind it is skipped until then, as a CUDA stream's sticky error. */
#define DT__SIM_ARG_MAX 256
dt_status dt__sim_submit(int ordinal, dt_status (*fn)(void *arg), const void *arg,
                         size_t argsize);

/* Waits until the stream of `ordinal` has run everything submitted; returns the first
 * failure since the last sync (and clears it). */
dt_status dt__sim_sync(int ordinal);

/* On a stream thread: the address where host code may access simulated device address p
 * (p unchanged when it is not simulated device memory, e.g. a host pointer or NULL). */
void *dt__sim_xlate(const void *p);

/* Number of simulated GPUs (ordinals 0..n-1) of this process. */
int dt__sim_num_ordinals(void);

#endif
