/* libdtensor: status codes and per-thread error detail. */
#ifndef DTENSOR_STATUS_H
#define DTENSOR_STATUS_H

#include "dtensor/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One list generates the enum, dt_status_name() and dt_status_str().
 * Groups (by what they break):
 *   -1..-19   caller misuse and bad input: fix the call or the input, retry.
 *   -20..-39  local resources: the process may recover.
 *   -40..-59  the communicator: tear the runtime down (dt_finalize). */
#define DT_STATUS_MAP(X)                                                             \
    X(OK, 0, "success")                                                              \
    X(ERR_INVALID_ARGUMENT, -1, "invalid argument")                                  \
    X(ERR_PARSE, -2, "malformed text input")                                         \
    X(ERR_SHAPE, -3, "shape, dtype or layout mismatch")                              \
    X(ERR_NOT_FOUND, -4, "no such object")                                           \
    X(ERR_CORRUPT, -5, "corrupt or truncated data")                                  \
    X(ERR_UNSUPPORTED, -6, "not supported by this build or configuration")           \
    X(ERR_STATE, -7, "call not valid in the current state")                          \
    X(ERR_DEVICE_MISMATCH, -8, "devices named do not match the devices present")     \
    X(ERR_NO_MEMORY, -20, "out of memory")                                           \
    X(ERR_IO, -21, "I/O error")                                                      \
    X(ERR_CUDA, -22, "CUDA error")                                                   \
    X(ERR_SYSTEM, -23, "system call failed")                                         \
    X(ERR_COMM, -40, "communication failure")                                        \
    X(ERR_TIMEOUT, -41, "timed out waiting for other processes")

typedef enum dt_status {
#define DT_STATUS_ENUM_(name, value, text) DT_##name = value,
    DT_STATUS_MAP(DT_STATUS_ENUM_)
#undef DT_STATUS_ENUM_
} dt_status;

/* "DT_ERR_PARSE" for DT_ERR_PARSE; "DT_UNKNOWN_STATUS" for values outside the list. Static string. */
DT_API const char *dt_status_name(dt_status st);

/* One-line English description of a status code. Static string. */
DT_API const char *dt_status_str(dt_status st);

/* Detail text of the calling thread's last failed call, such as
 * "mesh.yaml:7:12: dimension 'model' repeated". Borrowed; valid until this thread's next
 * failing call. "" when nothing has failed. Local. */
DT_API const char *dt_last_error(void);

/* Clears the calling thread's error text. Local. */
DT_API void dt_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
