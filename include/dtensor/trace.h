/* libdtensor flight recorder of collectives: each client keeps its last collective operations
 * and writes them out for `dtensor trace DIR` (docs/trace.md). */
#ifndef DTENSOR_TRACE_H
#define DTENSOR_TRACE_H

#include "dtensor/export.h"
#include "dtensor/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every client records its last DT_TRACE_OPS collective operations (default 2000, 0 turns
 * recording off): per communication group a sequence number, the call (relayout, barrier,
 * checkpoint phase, ZeRO bucket, dataset agreement), its path (transport), shapes, dtypes,
 * layouts or byte counts, the times it entered and left and its status. The record is written
 * to DT_TRACE_DIR/rank-R.json (R: dt_client_id) on a timeout, a lost client or a failed
 * collective check, on a fatal signal, on SIGUSR1, and by dt_trace_dump.
 *
 * With DT_CHECK_COLLECTIVES=1 every recorded collective first agrees over its group on the
 * call and its arguments: a mismatch is DT_ERR_STATE naming both calls and their clients.
 * Both variables are read at the first collective of the process. */

/* Writes this client's record now to DIR/rank-R.json, DIR = dir, or DT_TRACE_DIR when dir is
 * NULL. `reason` (may be NULL) is stored in the file. DT_ERR_INVALID_ARGUMENT when neither
 * gives a directory, DT_ERR_IO when the file cannot be written. Local; thread-safe. */
DT_API dt_status dt_trace_dump(const char *dir, const char *reason);

/* Operations recorded by this client since it started (kept or not). Local. */
DT_API long long dt_trace_count(void);

#ifdef __cplusplus
}
#endif

#endif
