/* Reading the library's DT_* environment variables: one parser per shape, so an unparsable
 * value is always an error naming the variable (docs/env.md lists every variable). Not
 * installed. */
#ifndef DTENSOR_RUNTIME_ENV_H
#define DTENSOR_RUNTIME_ENV_H

#include <stdint.h>

#include "dtensor/status.h"

/* The variable `name` as a whole number of MiB in lo..hi (decimal digits only), in bytes into
 * *bytes_out; unset or empty gives def_mib. `what` says what the MiB are for, in the message.
 * DT_ERR_INVALID_ARGUMENT "NAME='value' is not a number of MiB in lo..hi (what)", with
 * *bytes_out untouched. */
dt_status dt__env_mib(const char *name, uint64_t def_mib, uint64_t lo, uint64_t hi,
                      const char *what, uint64_t *bytes_out);

/* The variable `name` as 0 or 1 into *on_out; unset or empty gives def. `what` says what 1
 * means, in the message. DT_ERR_INVALID_ARGUMENT "NAME='value' is neither 0 nor 1 (what)". */
dt_status dt__env_flag(const char *name, int def, const char *what, int *on_out);

#endif
