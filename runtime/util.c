/* Small helpers shared by the modules: checked arithmetic, strings, shape text, device type
 * names. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "runtime/error.h"
#include "runtime/util.h"

int dt__mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return -1;
    *out = a * b;
    return 0;
}

int64_t dt__numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= shape[i];
    return n;
}

size_t dt__strlcpy(char *dst, const char *src, size_t len)
{
    size_t n = strlen(src);
    if (len) {
        size_t c = n < len - 1 ? n : len - 1;
        memcpy(dst, src, c);
        dst[c] = '\0';
    }
    return n;
}

static const char *const device_type_names[] = {"CPU", "GPU", "TPU", "OTHER"};
#define NUM_DEVICE_TYPES ((int)(sizeof device_type_names / sizeof device_type_names[0]))

const char *dt_device_type_name(dt_device_type type)
{
    if ((int)type < 0 || (int)type >= NUM_DEVICE_TYPES)
        return "OTHER";
    return device_type_names[type];
}

dt_status dt_device_type_parse(const char *text, dt_device_type *type_out)
{
    /* OTHER is not a name one can ask for: it stands for types the library has no name for. */
    for (int t = 0; text && t < NUM_DEVICE_TYPES; t++) {
        if (t != DT_DEVICE_OTHER && strcasecmp(text, device_type_names[t]) == 0) {
            *type_out = (dt_device_type)t;
            return DT_OK;
        }
    }
    return dt__error(DT_ERR_PARSE, "device type '%s' is not CPU, GPU or TPU",
                     text ? text : "(null)");
}

const char *dt__shape_str(int rank, const int64_t *shape, char *buf, size_t len)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < rank && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
    return buf;
}
