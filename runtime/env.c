/* The parsers of the library's DT_* environment variables: MiB counts and 0/1 flags, each an
 * error naming the variable and its value when unparsable (docs/env.md). */
#include <errno.h>
#include <stdlib.h>

#include "runtime/env.h"
#include "runtime/error.h"

/* A decimal integer of digits only (no sign, no spaces) in lo..hi; 0 on success. */
static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (s[0] < '0' || s[0] > '9')
        return -1;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || errno != 0 || v < lo || v > hi)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

dt_status dt__env_mib(const char *name, uint64_t def_mib, uint64_t lo, uint64_t hi,
                      const char *what, uint64_t *bytes_out)
{
    const char *s = getenv(name);
    uint64_t mib = def_mib;
    if (s && *s && parse_u64(s, lo, hi, &mib) != 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s='%s' is not a number of MiB in %llu..%llu "
                         "(%s)", name, s, (unsigned long long)lo, (unsigned long long)hi, what);
    *bytes_out = mib << 20;
    return DT_OK;
}

dt_status dt__env_flag(const char *name, int def, const char *what, int *on_out)
{
    const char *s = getenv(name);
    uint64_t v = (uint64_t)(def != 0);
    if (s && *s && parse_u64(s, 0, 1, &v) != 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s='%s' is neither 0 nor 1 (%s)", name, s,
                         what);
    *on_out = (int)v;
    return DT_OK;
}
