/* TensorFlow device names ("/job:w/replica:0/task:1/device:GPU:0", the local "GPU:0", the legacy
 * "/gpu:0"): the grammar of TensorFlow's DeviceNameUtils, the device type a name spells, and the
 * same name with another type (for the host mesh). */
#include <stdlib.h>
#include <string.h>

#include "mesh/mesh_impl.h"

static int is_alpha(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* 1 if [s, s+n) is a letter followed by letters, digits and '_' (job names, device types). */
static int is_ident(const char *s, size_t n)
{
    if (n == 0 || !is_alpha(s[0]))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!is_alpha(s[i]) && !is_digit(s[i]) && s[i] != '_')
            return 0;
    return 1;
}

/* 1 if [s, s+n) is one or more digits. TensorFlow reads leading zeros ("task:01") too. */
static int is_number(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_digit(s[i]))
            return 0;
    return 1;
}

static int is_star(const char *s, size_t n)
{
    return n == 1 && s[0] == '*';
}

/* If component [c, c+n) starts with key (like "task:"), the length of the key, else 0. */
static size_t key(const char *c, size_t n, const char *k)
{
    size_t kl = strlen(k);
    return n >= kl && memcmp(c, k, kl) == 0 ? kl : 0;
}

/* One '/'-separated component of a full name. 0 on success, -1 if it is none of the forms. */
static int component(const char *s, size_t at, size_t n, dt__device_name *dn)
{
    const char *c = s + at;
    size_t k;
    if ((k = key(c, n, "job:"))) {
        if (is_star(c + k, n - k))
            return 0; /* "job:*" names no job */
        if (!is_ident(c + k, n - k))
            return -1;
        dn->has_job = 1;
        return 0;
    }
    if ((k = key(c, n, "replica:")) || (k = key(c, n, "task:"))) {
        if (is_star(c + k, n - k))
            return 0;
        if (!is_number(c + k, n - k))
            return -1;
        if (c[0] == 't')
            dn->has_task = 1;
        return 0;
    }
    if ((k = key(c, n, "device:"))) {
        /* device:TYPE, device:TYPE:ID, device:TYPE:*, device:*, device:*:ID */
        size_t t = k;
        while (t < n && c[t] != ':')
            t++;
        if (t < n && !is_star(c + t + 1, n - t - 1) && !is_number(c + t + 1, n - t - 1))
            return -1;
        if (is_star(c + k, t - k)) {
            dn->has_type = 0;
            return 0;
        }
        if (!is_ident(c + k, t - k))
            return -1;
        dn->has_type = 1;
        dn->type_off = at + k;
        dn->type_len = t - k;
        dn->legacy_type = NULL;
        return 0;
    }
    /* The legacy "/cpu:0" and "/gpu:0" (either case), which name types CPU and GPU. */
    static const char *const legacy[][2] = {
        {"cpu:", "CPU"}, {"CPU:", "CPU"}, {"gpu:", "GPU"}, {"GPU:", "GPU"}};
    for (size_t i = 0; i < sizeof legacy / sizeof legacy[0]; i++) {
        if ((k = key(c, n, legacy[i][0]))) {
            if (!is_star(c + k, n - k) && !is_number(c + k, n - k))
                return -1;
            dn->has_type = 1;
            dn->type_off = at;
            dn->type_len = 3;
            dn->legacy_type = legacy[i][1];
            return 0;
        }
    }
    return -1;
}

int dt__device_name_parse(const char *s, dt__device_name *out)
{
    dt__device_name dn = {0};
    size_t n = strlen(s);
    if (n == 0)
        return -1;
    if (s[0] != '/') {
        /* The local form TYPE:ID. */
        const char *colon = strchr(s, ':');
        if (!colon || !is_ident(s, (size_t)(colon - s)) ||
            !is_number(colon + 1, n - (size_t)(colon - s) - 1))
            return -1;
        dn.has_type = 1;
        dn.type_off = 0;
        dn.type_len = (size_t)(colon - s);
        *out = dn;
        return 0;
    }
    /* "/" alone is a valid name that names nothing; otherwise components in any order (a
     * later one of the same kind overrides, as in TensorFlow). */
    for (size_t p = 1; p < n;) {
        size_t e = p;
        while (e < n && s[e] != '/')
            e++;
        if (e == p || component(s, p, e - p, &dn) != 0)
            return -1;
        p = e + 1;
        if (e + 1 == n) /* a trailing '/' */
            return -1;
    }
    *out = dn;
    return 0;
}

size_t dt__device_name_type(const char *name, const dt__device_name *dn, char *buf, size_t len)
{
    const char *t = dn->legacy_type ? dn->legacy_type : name + dn->type_off;
    size_t n = dn->has_type ? dn->type_len : 0;
    if (len) {
        size_t c = n < len - 1 ? n : len - 1;
        memcpy(buf, t, c);
        buf[c] = '\0';
    }
    return n;
}

int dt__device_type_name_ok(const char *type_name)
{
    size_t n = strlen(type_name);
    return n < DT_NAME_MAX && is_ident(type_name, n);
}

dt_device_type dt__device_type_of(const char *type_name)
{
    static const dt_device_type known[] = {DT_DEVICE_CPU, DT_DEVICE_GPU, DT_DEVICE_TPU};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(type_name, dt_device_type_name(known[i])) == 0)
            return known[i];
    return DT_DEVICE_OTHER;
}

char *dt__device_name_with_type(const char *name, const char *type)
{
    dt__device_name dn;
    if (dt__device_name_parse(name, &dn) != 0 || !dn.has_type)
        return NULL;
    size_t n = strlen(name), tl = strlen(type);
    char *out = malloc(n - dn.type_len + tl + 1);
    if (!out)
        return NULL;
    memcpy(out, name, dn.type_off);
    memcpy(out + dn.type_off, type, tl);
    memcpy(out + dn.type_off + tl, name + dn.type_off + dn.type_len,
           n - dn.type_off - dn.type_len + 1);
    return out;
}
