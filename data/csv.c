/* The CSV and text-line readers over an indexed text file: each read fetches the lines asked
 * for (one pread per run of consecutive lines) and parses them into the fields. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"
#include "runtime/error.h"
#include "runtime/half.h"
#include "runtime/util.h"

typedef struct csv_impl {
    dd_text text;
    char delim;
    int64_t max_bytes; /* lines: the field's length */
} csv_impl;

static void csv_release(void *p)
{
    csv_impl *c = p;
    if (!c)
        return;
    dd_text_close(&c->text);
    free(c);
}

/* Stores the number in tok[0..len) as element i of dst (dtype). 0, or -1 when it is not a
 * number of that dtype. */
static int store_number(const char *tok, size_t len, dt_dtype dtype, void *dst, int64_t i)
{
    char s[128];
    while (len > 0 && (*tok == ' ' || *tok == '\t')) {
        tok++;
        len--;
    }
    while (len > 0 && (tok[len - 1] == ' ' || tok[len - 1] == '\t'))
        len--;
    if (len == 0 || len >= sizeof s)
        return -1;
    memcpy(s, tok, len);
    s[len] = '\0';
    char *end = NULL;
    errno = 0;
    if (dtype == DT_DTYPE_F32 || dtype == DT_DTYPE_F64 || dtype == DT_DTYPE_F16 ||
        dtype == DT_DTYPE_BF16) {
        double d = strtod(s, &end);
        if (*end != '\0')
            return -1;
        float f = (float)d;
        switch (dtype) {
        case DT_DTYPE_F32: memcpy((float *)dst + i, &f, sizeof f); break;
        case DT_DTYPE_F64: memcpy((double *)dst + i, &d, sizeof d); break;
        case DT_DTYPE_F16: ((uint16_t *)dst)[i] = dt__f32_to_f16(f); break;
        default: ((uint16_t *)dst)[i] = dt__f32_to_bf16(f); break;
        }
        return 0;
    }
    long long v = strtoll(s, &end, 10);
    if (*end != '\0' || errno == ERANGE)
        return -1;
    if (dtype == DT_DTYPE_I64) {
        int64_t w = v;
        memcpy((int64_t *)dst + i, &w, sizeof w);
    } else if (dtype == DT_DTYPE_I32) {
        if (v < INT32_MIN || v > INT32_MAX)
            return -1;
        int32_t w = (int32_t)v;
        memcpy((int32_t *)dst + i, &w, sizeof w);
    } else {
        if (v < 0 || v > 255)
            return -1;
        ((uint8_t *)dst)[i] = (uint8_t)v;
    }
    return 0;
}

/* Parses one line (without its newline) into dst[k] + j * field_bytes[k]. */
static dt_status parse_line(const dt_data_source *s, const csv_impl *c, int64_t line,
                            const char *p, size_t len, void *const *dst, int64_t j)
{
    int64_t want = 0;
    for (int k = 0; k < s->nfields; k++)
        want += dt__numel(s->fields[k].rank, s->fields[k].shape);
    int64_t have = 1;
    for (size_t i = 0; i < len; i++)
        have += p[i] == c->delim;
    if (have != want)
        return dt__error(DT_ERR_PARSE, "%s:%lld: %lld columns, expected %lld", c->text.path,
                         (long long)line, (long long)have, (long long)want);
    const char *tok = p, *end = p + len;
    int64_t col = 0;
    for (int k = 0; k < s->nfields; k++) {
        int64_t numel = dt__numel(s->fields[k].rank, s->fields[k].shape);
        void *out = dst[k] ? (char *)dst[k] + (size_t)j * s->field_bytes[k] : NULL;
        for (int64_t i = 0; i < numel; i++, col++) {
            const char *stop = memchr(tok, c->delim, (size_t)(end - tok));
            if (!stop)
                stop = end;
            if (out && store_number(tok, (size_t)(stop - tok), s->fields[k].dtype, out, i) != 0)
                return dt__error(DT_ERR_PARSE, "%s:%lld: column %lld ('%.*s') is not a %s number",
                                 c->text.path, (long long)line, (long long)col + 1,
                                 (int)(stop - tok < 40 ? stop - tok : 40), tok,
                                 dt_dtype_name(s->fields[k].dtype));
            tok = stop + 1;
        }
    }
    return DT_OK;
}

/* Stores one line (without its newline) zero-padded into the lines source's field. */
static dt_status store_line(const csv_impl *c, int64_t line, const char *p, size_t len,
                            void *const *dst, int64_t j)
{
    if ((int64_t)len > c->max_bytes)
        return dt__error(DT_ERR_PARSE, "%s:%lld: %zu bytes, longer than the %lld bytes allowed",
                         c->text.path, (long long)line, len, (long long)c->max_bytes);
    if (dst[0]) {
        char *out = (char *)dst[0] + (size_t)j * (size_t)c->max_bytes;
        memcpy(out, p, len);
        memset(out + len, 0, (size_t)c->max_bytes - len);
    }
    return DT_OK;
}

static dt_status text_read(dt_data_source *s, const int64_t *idx, int64_t count, void *const *dst)
{
    const csv_impl *c = s->impl;
    char *buf = NULL;
    size_t cap = 0;
    dt_status st = DT_OK;
    for (int64_t j = 0; j < count && st == DT_OK;) {
        int64_t len = 1;
        while (j + len < count && idx[j + len] == idx[j] + len)
            len++;
        const char *text = NULL;
        if ((st = dd_text_lines(&c->text, idx[j], len, &buf, &cap, &text)) != DT_OK)
            break;
        int64_t base = c->text.start[idx[j]];
        for (int64_t i = 0; i < len && st == DT_OK; i++) {
            int64_t a = c->text.start[idx[j] + i] - base, b = c->text.start[idx[j] + i + 1] - base;
            if (b > a && text[b - 1] == '\n')
                b--;
            if (b > a && text[b - 1] == '\r')
                b--;
            int64_t line = c->text.first_line + idx[j] + i;
            st = c->delim ? parse_line(s, c, line, text + a, (size_t)(b - a), dst, j + i)
                          : store_line(c, line, text + a, (size_t)(b - a), dst, j + i);
        }
        j += len;
    }
    free(buf);
    return st;
}

static const dd_source_ops text_ops = {text_read, csv_release};

/* Opens `path` as a text source with the fields given (delim 0: the line reader). */
static dt_status open_text(const char *fn, const char *path, int64_t skip, char delim,
                           int64_t max_bytes, int nfields, const dt_data_field *fields,
                           dt_data_source **out)
{
    if (!path || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL path or source_out", fn);
    csv_impl *c = calloc(1, sizeof *c);
    if (!c)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    c->delim = delim;
    c->max_bytes = max_bytes;
    dt_status st = dd_text_open(path, skip, &c->text);
    if (st != DT_OK) {
        free(c);
        return st;
    }
    st = dd_source_new(fn, c->text.nlines, nfields, fields, &text_ops, c, out);
    if (st != DT_OK)
        csv_release(c);
    return st;
}

dt_status dt_data_source_csv(const char *path, int nfields, const dt_data_field *fields,
                             const dt_data_csv_opts *opts, dt_data_source **source_out)
{
    dt_data_csv_opts o = DT_DATA_CSV_OPTS_INIT;
    if (opts)
        o = *opts;
    if (o.delimiter == '\0' || o.delimiter == '\n' || o.delimiter == '\r')
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_data_source_csv: bad delimiter %d",
                         o.delimiter);
    return open_text("dt_data_source_csv", path, o.skip_lines, o.delimiter, 0, nfields, fields,
                     source_out);
}

dt_status dt_data_source_lines(const char *path, int64_t max_bytes, dt_data_source **source_out)
{
    if (max_bytes < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_data_source_lines: max_bytes %lld",
                         (long long)max_bytes);
    dt_data_field f = {DT_DTYPE_U8, 1, {max_bytes}};
    return open_text("dt_data_source_lines", path, 0, '\0', max_bytes, 1, &f, source_out);
}
