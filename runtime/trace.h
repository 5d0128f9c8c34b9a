/* The flight recorder of collectives and the collective check (runtime/trace.c,
 * runtime/trace_check.c, docs/trace.md). Callers pass already-formatted text, or a payload
 * and its formatter (dt__coll_begin_lazy): the runtime never reads meshes or layouts. Not
 * installed. */
#ifndef DTENSOR_RUNTIME_TRACE_H
#define DTENSOR_RUNTIME_TRACE_H

#include <stddef.h>

#include "dtensor/status.h"
#include "dtensor/trace.h"

/* What a recorded operation may hold (longer text is cut; the check compares a hash of the
 * whole text). */
enum { DT__TRACE_GROUP = 48, DT__TRACE_CALL = 40, DT__TRACE_PATH = 16, DT__TRACE_DETAIL = 240 };

/* 1 when recording (DT_TRACE_OPS != 0), 1 when DT_CHECK_COLLECTIVES=1. Local, one load after
 * the first call. */
int dt__trace_on(void);
int dt__check_on(void);

/* The group key of clients[0..n) (client ids of dt__comm): "0-3", "0,2,5", or for a long list
 * its count and a hash. Local. */
void dt__trace_group_key(const int *clients, int n, char *buf, size_t len);

/* A collective starts on this client: records it (next sequence number of the group whose
 * members are clients[0..n), this client among them) and, with DT_CHECK_COLLECTIVES=1, agrees
 * over that group that every member makes the same call with the same detail (collective over
 * the group). *token_out: what dt__coll_end takes (-1 when not recorded). DT_ERR_STATE naming
 * both calls and clients on a mismatch, DT_ERR_TIMEOUT / DT_ERR_COMM from the agreement; the
 * operation is then recorded as left with that status and the record written (DT_TRACE_DIR).
 * With neither recording nor checking: one branch, DT_OK. */
dt_status dt__coll_begin(const int *clients, int n, const char *call, const char *detail,
                         long *token_out);
/* Detail text formatted only when the record is written: `format` writes the text of
 * `payload` (a copy the ring keeps) into buf; `release` (may be NULL) frees what the payload
 * holds (references), when the slot is reused or at dt_finalize (after formatting it once
 * into the slot's text). So a recorded call costs a copy, not a formatting (docs/trace.md). */
enum { DT__TRACE_PAYLOAD = 96 };
typedef struct dt__trace_lazy {
    void (*format)(const void *payload, char *buf, size_t len);
    void (*release)(void *payload);
    _Alignas(8) unsigned char payload[DT__TRACE_PAYLOAD];
} dt__trace_lazy;
/* dt__coll_begin with the detail as *lazy: the ring takes the payload over, or releases it at
 * once when nothing is recorded (with the check on, the text is formatted now for it). */
dt_status dt__coll_begin_lazy(const int *clients, int n, const char *call,
                              const dt__trace_lazy *lazy, long *token_out);

/* Records a collective without the check (a group agreement whose members may be busy
 * for long, outside any watched wait: a checkpoint's, the optimizer's, a dataset's; or one
 * noted when it starts, as a ZeRO bucket). The token for dt__coll_end, -1 when not
 * recording. Local. */
long dt__coll_record(const int *clients, int n, const char *call, const char *detail);
/* The operation of token (-1: nothing) ended with st by `path` (a transport's name, may be
 * NULL). A timeout or an MPI failure writes the record (DT_TRACE_DIR). Local. */
void dt__coll_end(long token, const char *path, dt_status st);

/* trace_check.c: the agreement of dt__coll_begin over the clients' group (seq: the
 * operation's sequence number, group: its key, for messages). */
dt_status dt__trace_check(const int *clients, int n, const char *group, unsigned long long seq,
                          const char *call, const char *detail);

/* Benchmarks' A/B in one run (bench/trace.c): recording on/off (when DT_TRACE_OPS kept a
 * ring) and the check on/off from now on. Local; every client must set the check alike. */
void dt__trace_set(int record, int check);

#endif
