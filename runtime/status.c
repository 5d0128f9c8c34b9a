/* Status codes: names and descriptions from DT_STATUS_MAP, per-thread error text, and MPI
 * failures turned into statuses. */
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "runtime/error.h"

static _Thread_local char last_error[1024];

const char *dt_status_name(dt_status st)
{
    switch (st) {
#define DT_STATUS_NAME_(name, value, text) \
    case DT_##name:                        \
        return "DT_" #name;
        DT_STATUS_MAP(DT_STATUS_NAME_)
#undef DT_STATUS_NAME_
    }
    return "DT_UNKNOWN_STATUS";
}

const char *dt_status_str(dt_status st)
{
    switch (st) {
#define DT_STATUS_STR_(name, value, text) \
    case DT_##name:                       \
        return text;
        DT_STATUS_MAP(DT_STATUS_STR_)
#undef DT_STATUS_STR_
    }
    return "unknown status";
}

const char *dt_last_error(void)
{
    return last_error;
}

void dt_clear_error(void)
{
    last_error[0] = '\0';
}

dt_status dt__error(dt_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

dt_status dt__mpi_error(int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error code %d", rc);
    return dt__error(DT_ERR_COMM, "%s: %s", what, text);
}

/* Open MPI 4.1 reports the failure of a nonblocking collective (MPI_ERR_TRUNCATE when the
 * members made different calls) on MPI_COMM_WORLD, whatever its communicator's handler: while
 * the runtime waits on one, MPI_COMM_WORLD returns errors too, then gets its handler back. */
static pthread_mutex_t world_lock = PTHREAD_MUTEX_INITIALIZER;
static int world_depth;
static MPI_Errhandler world_saved = MPI_ERRHANDLER_NULL;

void dt__world_errors_return(int on)
{
    pthread_mutex_lock(&world_lock);
    if (on && world_depth++ == 0) {
        if (MPI_Comm_get_errhandler(MPI_COMM_WORLD, &world_saved) == MPI_SUCCESS)
            MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        else
            world_saved = MPI_ERRHANDLER_NULL;
    } else if (!on && world_depth > 0 && --world_depth == 0 &&
               world_saved != MPI_ERRHANDLER_NULL) {
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, world_saved);
        MPI_Errhandler_free(&world_saved);
    }
    pthread_mutex_unlock(&world_lock);
}
