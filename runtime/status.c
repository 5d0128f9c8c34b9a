/* Status codes: names and descriptions from DT_STATUS_MAP, per-thread error text, and MPI
 * failures turned into statuses. */
#include <mpi.h>
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
