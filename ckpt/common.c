/* Small shared parts of the ckpt module: name rules (names are keys, never paths), the
 * safetensors dtype strings, data file names, path joining, slice keys, the box overlap
 * sweep and integer arrays in JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"

static const char *const dtype_strs[DT_DTYPE_COUNT_] = {
    [DT_DTYPE_F32] = "F32", [DT_DTYPE_F64] = "F64", [DT_DTYPE_F16] = "F16",
    [DT_DTYPE_BF16] = "BF16", [DT_DTYPE_I32] = "I32", [DT_DTYPE_I64] = "I64",
    [DT_DTYPE_U8] = "U8",
};

const char *dt__ckpt_dtype_str(dt_dtype dtype)
{
    return (unsigned)dtype < DT_DTYPE_COUNT_ ? dtype_strs[dtype] : "?";
}

int dt__ckpt_dtype_from_str(const char *s, dt_dtype *dtype_out)
{
    for (int i = 0; i < DT_DTYPE_COUNT_; i++)
        if (s && strcmp(s, dtype_strs[i]) == 0) {
            *dtype_out = (dt_dtype)i;
            return 0;
        }
    return -1;
}

/* Length of the UTF-8 sequence at p (1..4), or 0 if it is not well formed. */
static int utf8_len(const unsigned char *p)
{
    if (p[0] < 0x80)
        return 1;
    int n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    if (n == 0 || p[0] > 0xf4)
        return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if (n == 3 && p[0] == 0xe0 && p[1] < 0xa0)
        return 0;
    if (n == 3 && p[0] == 0xed && p[1] >= 0xa0)      /* surrogates */
        return 0;
    if (n == 4 && p[0] == 0xf0 && p[1] < 0x90)
        return 0;
    if (n == 4 && p[0] == 0xf4 && p[1] >= 0x90)
        return 0;
    return n;
}

dt_status dt__ckpt_check_name(const char *fn, const char *what, const char *name)
{
    if (!name)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL %s name", fn, what);
    size_t len = strlen(name);
    if (len == 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: empty %s name", fn, what);
    if (len > DT_CKPT_NAME_MAX)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s name of %zu bytes (at most %d)", fn,
                         what, len, DT_CKPT_NAME_MAX);
    if (strcmp(name, "__metadata__") == 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "%s: %s name '__metadata__' is reserved by safetensors", fn, what);
    const unsigned char *p = (const unsigned char *)name;
    for (size_t i = 0; i < len;) {
        if (p[i] < 0x20 || p[i] == 0x7f)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "%s: %s name has control character 0x%02x at byte %zu", fn, what,
                             p[i], i);
        int n = utf8_len(p + i);
        if (n == 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "%s: %s name is not valid UTF-8 at byte %zu", fn, what, i);
        i += (size_t)n;
    }
    return DT_OK;
}

/* Zero-padded to width 5 (wider numbers in full) at p; the end. */
static char *put_num5(char *p, int64_t v)
{
    char t[24];
    int len = 0;
    uint64_t u = v < 0 ? 0 : (uint64_t)v;
    do
        t[len++] = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    while (len < 5)
        t[len++] = '0';
    while (len > 0)
        *p++ = t[--len];
    return p;
}

/* data-%05lld-of-%05lld.safetensors, by hand: the index names a file per slice and per file,
 * and snprintf was a tenth of its time at 16384 devices (issue 22). */
void dt__ckpt_file_name(char *buf, size_t len, int64_t k, int64_t n)
{
    char t[80], *p = t;
    memcpy(p, "data-", 5);
    p = put_num5(p + 5, k);
    memcpy(p, "-of-", 4);
    p = put_num5(p + 4, n);
    memcpy(p, ".safetensors", sizeof ".safetensors");
    p += sizeof ".safetensors" - 1;
    if (len == 0)
        return;
    size_t m = (size_t)(p - t) < len ? (size_t)(p - t) : len - 1;
    memcpy(buf, t, m);
    buf[m] = '\0';
}

dt_status dt__ckpt_join(char *buf, size_t len, const char *dir, const char *sep,
                        const char *name)
{
    int w = snprintf(buf, len, "%s%s%s", dir, sep, name);
    if (w < 0 || (size_t)w >= len)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "path too long: %s%s%s", dir, sep, name);
    return DT_OK;
}

dt_status dt__ckpt_norm_dir(const char *fn, const char *dir, char *buf, size_t len)
{
    if (!dir || !dir[0])
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: empty checkpoint directory", fn);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    if (n + 32 >= len)  /* room for the suffixes and file names */
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: directory path too long: %s", fn, dir);
    if (n == 1 && dir[0] == '/')
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: cannot use '/' as a checkpoint", fn);
    memcpy(buf, dir, n);
    buf[n] = '\0';
    return DT_OK;
}

static int cmp_box_start(const void *pa, const void *pb, void *arg)
{
    const ck_box *a = pa, *b = pb;
    int d = *(const int *)arg;
    if (a->off[d] != b->off[d])
        return a->off[d] < b->off[d] ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int cmp_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return a < b ? -1 : a > b;
}

/* The dimension with the most distinct box starts: the one the boxes are cut along, where a
 * sweep compares each box with few others (ZeRO's [coords..., flat] boxes: the last). */
int dt__ckpt_sweep_dim(int rank, const ck_box *boxes, int64_t n)
{
    int64_t *v = malloc((size_t)n * sizeof *v), best = -1;
    int dim = 0;
    for (int d = 0; v && d < rank; d++) {
        for (int64_t i = 0; i < n; i++)
            v[i] = boxes[i].off[d];
        qsort(v, (size_t)n, sizeof *v, cmp_i64);
        int64_t distinct = 1;
        for (int64_t i = 1; i < n; i++)
            distinct += v[i] != v[i - 1];
        if (distinct > best) {
            best = distinct;
            dim = d;
        }
    }
    free(v);   /* without memory: dim 0, still correct */
    return dim;
}

int dt__ckpt_find_overlap(int rank, ck_box *boxes, int64_t n, int64_t *a_out, int64_t *b_out)
{
    if (n < 2)
        return 0;
    if (rank == 0) {   /* every non-empty scalar box is the whole tensor */
        *a_out = boxes[0].id < boxes[1].id ? boxes[0].id : boxes[1].id;
        *b_out = boxes[0].id < boxes[1].id ? boxes[1].id : boxes[0].id;
        return 1;
    }
    int s = dt__ckpt_sweep_dim(rank, boxes, n);
    qsort_r(boxes, (size_t)n, sizeof *boxes, cmp_box_start, &s);
    for (int64_t i = 0; i < n; i++) {
        const ck_box *a = &boxes[i];
        for (int64_t j = i + 1; j < n && boxes[j].off[s] < a->off[s] + a->size[s]; j++) {
            const ck_box *b = &boxes[j];
            int meet = 1;
            for (int d = 0; d < rank && meet; d++)
                meet = a->off[d] < b->off[d] + b->size[d] && b->off[d] < a->off[d] + a->size[d];
            if (meet) {
                *a_out = a->id;
                *b_out = b->id;
                return 1;
            }
        }
    }
    return 0;
}

int dt__ckpt_key_of(const char *key, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(key, name, n) != 0)
        return 0;
    if (key[n] == '\0')
        return 1;
    if (key[n] != '#' || key[n + 1] == '\0' || strlen(key + n + 1) > 19)
        return 0;
    for (const char *p = key + n + 1; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}
