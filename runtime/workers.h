/* The CPU workers: a fork-join pool of persistent threads that runs one op's per-device work
 * on the local CPU devices at once, so a 1x2 or 2x2 mesh in one process uses its cores
 * (docs/devices.md, "CPU workers"). Not installed. */
#ifndef DTENSOR_RUNTIME_WORKERS_H
#define DTENSOR_RUNTIME_WORKERS_H

#include "dtensor/status.h"

/* One share of a job: the work of local component i. Returns its status and sets this
 * thread's dt_last_error text on failure, as any library call. */
typedef dt_status (*dt__work_fn)(int i, void *arg);

/* Starts the pool for `ndevices` local CPU devices (the CPU kind's start, at dt_init): reads
 * DT_CPU_WORKERS (0 off, 1 on, the default) and runs min(ndevices, cores this process may
 * use) lanes: the calling thread of each job and one thread per other lane; fewer than 2
 * lanes start nothing. DT_ERR_INVALID_ARGUMENT for a bad DT_CPU_WORKERS, DT_ERR_NO_MEMORY
 * when a thread cannot start. */
dt_status dt__workers_start(int ndevices);
/* Stops and joins the threads (dt_finalize). No job may be running. */
void dt__workers_stop(void);

/* Test hook: restarts the pool with `lanes` lanes whatever the cores (0 or 1: off; negative:
 * as dt__workers_start decides), for the devices dt_init opened; fixed: component i runs on
 * lane i % lanes (the caller's is lane 0), so that a test knows which thread runs what. Not
 * while a job runs. */
dt_status dt__workers_configure(int lanes, int fixed);

/* The lanes computing at once (1 when the pool is off), and how many jobs ran on the lanes
 * (not alone on the caller) since the process started: for tests. */
int dt__workers_lanes(void);
unsigned long long dt__workers_jobs(void);

/* Runs fn(i, arg) for i in 0..n-1 at once on the lanes: each lane, the caller's included,
 * claims the next component in index order until none is left, so a lane that is not
 * scheduled (a loaded machine) leaves its shares to the others. Returns when all are done:
 * DT_OK, or the status of the lowest failing i (the first failure of a plain loop) with that
 * call's message as this thread's dt_last_error text; the components after it may have run.
 * With the pool off, or busy with another thread's job, it runs them all here in order,
 * stopping at the first failure. */
dt_status dt__workers_run(int n, dt__work_fn fn, void *arg);

#endif
