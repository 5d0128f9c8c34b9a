/* Setting this thread's error text where a failure is first seen, and MPI failures as statuses. Not installed. */
#ifndef DTENSOR_RUNTIME_ERROR_H
#define DTENSOR_RUNTIME_ERROR_H

#include "dtensor/status.h"

/* Records `fmt` as this thread's error text and returns st, so a failure site reads
 *     return dt__error(DT_ERR_PARSE, "%s:%d:%d: dimension '%s' repeated", ...);  */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
dt_status dt__error(dt_status st, const char *fmt, ...);

/* Records an MPI failure: DT_ERR_COMM with "<what>: <MPI_Error_string text>". */
dt_status dt__mpi_error(int rc, const char *what);

/* 1: MPI_COMM_WORLD returns errors from now on (nested calls count), 0: undoes one such call
 * (its handler back after the last). For waits on nonblocking collectives (status.c). */
void dt__world_errors_return(int on);

#endif
