/* Small helpers shared by the modules: checked arithmetic, strings, shape text, device type
 * names. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "runtime/internal.h"

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

const char *dt_device_type_name(dt_device_type type)
{
    return type == DT_DEVICE_GPU ? "GPU" : "CPU";
}

dt_status dt_device_type_parse(const char *text, dt_device_type *type_out)
{
    if (text && strcasecmp(text, "CPU") == 0) {
        *type_out = DT_DEVICE_CPU;
        return DT_OK;
    }
    if (text && strcasecmp(text, "GPU") == 0) {
        *type_out = DT_DEVICE_GPU;
        return DT_OK;
    }
    return dt__error(DT_ERR_PARSE, "device type '%s' is neither CPU nor GPU",
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
