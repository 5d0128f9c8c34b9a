/* A streaming JSON writer for the index and the safetensors headers: text appended to one
 * growing buffer, with no tree of nodes, no per-value allocation and no printf for integers.
 * Building the index of 16384 devices through jansson's tree (one node per number, then
 * json_dumps and json_decref) cost most of its time in malloc, free and page faults (issue 22).
 * The output is byte for byte jansson's for the same document (JSON_INDENT(n) or
 * JSON_COMPACT, JSON_PRESERVE_ORDER); the checkpoint tests compare the two. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"

void dt__jw_init(ck_jw *w, int indent)
{
    memset(w, 0, sizeof *w);
    w->indent = indent;
}

void dt__jw_free(ck_jw *w)
{
    free(w->buf);
    memset(w, 0, sizeof *w);
}

char *dt__jw_take(ck_jw *w)
{
    char *s = w->bad ? NULL : w->buf;
    if (w->bad)
        free(w->buf);
    w->buf = NULL;
    w->len = w->cap = 0;
    return s;
}

/* Room for n more bytes and the terminating NUL; sets bad when out of memory. */
static int room(ck_jw *w, size_t n)
{
    if (w->bad)
        return 0;
    if (w->len + n + 1 <= w->cap)
        return 1;
    size_t cap = w->cap ? w->cap : 4096;
    while (cap < w->len + n + 1)
        cap *= 2;
    char *b = realloc(w->buf, cap);
    if (!b) {
        w->bad = 1;
        return 0;
    }
    w->buf = b;
    w->cap = cap;
    return 1;
}

void dt__jw_reserve(ck_jw *w, size_t n)
{
    room(w, n);
}

void dt__jw_raw(ck_jw *w, const char *s, size_t n)
{
    if (!room(w, n))
        return;
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

/* Before a member or element: "," after the first, then a new line indented to the depth. */
static void separate(ck_jw *w)
{
    if (!w->first[w->depth])
        dt__jw_raw(w, ",", 1);
    w->first[w->depth] = 0;
    if (w->indent > 0 && room(w, 1 + (size_t)(w->indent * w->depth))) {
        w->buf[w->len++] = '\n';
        memset(w->buf + w->len, ' ', (size_t)(w->indent * w->depth));
        w->len += (size_t)(w->indent * w->depth);
        w->buf[w->len] = '\0';
    }
}

void dt__jw_open(ck_jw *w, char bracket)
{
    if (w->depth + 1 >= CK_JW_DEPTH) {
        w->bad = 1;
        return;
    }
    dt__jw_raw(w, &bracket, 1);
    w->first[++w->depth] = 1;
}

void dt__jw_close(ck_jw *w, char bracket)
{
    if (w->depth < 1) {
        w->bad = 1;
        return;
    }
    int empty = w->first[w->depth];
    w->depth--;
    if (!empty && w->indent > 0 && room(w, 1 + (size_t)(w->indent * w->depth))) {
        w->buf[w->len++] = '\n';
        memset(w->buf + w->len, ' ', (size_t)(w->indent * w->depth));
        w->len += (size_t)(w->indent * w->depth);
    }
    dt__jw_raw(w, &bracket, 1);
}

/* jansson's escapes: \" \\ \b \f \n \r \t, other bytes below 0x20 as \u00XX; UTF-8 as is. */
static void escaped(ck_jw *w, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *p = (const unsigned char *)s;
    dt__jw_raw(w, "\"", 1);
    while (*p) {
        const unsigned char *run = p;
        while (*p >= 0x20 && *p != '"' && *p != '\\')
            p++;
        dt__jw_raw(w, (const char *)run, (size_t)(p - run));
        if (!*p)
            break;
        char e[6] = {'\\', 0, '0', '0', 0, 0};
        size_t n = 2;
        switch (*p) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\b': e[1] = 'b'; break;
        case '\f': e[1] = 'f'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        default:
            e[1] = 'u';
            e[4] = hex[*p >> 4];
            e[5] = hex[*p & 15];
            n = 6;
        }
        dt__jw_raw(w, e, n);
        p++;
    }
    dt__jw_raw(w, "\"", 1);
}

void dt__jw_key(ck_jw *w, const char *key)
{
    separate(w);
    escaped(w, key);
    if (w->indent > 0)
        dt__jw_raw(w, ": ", 2);
    else
        dt__jw_raw(w, ":", 1);
}

void dt__jw_elem(ck_jw *w)
{
    separate(w);
}

void dt__jw_str(ck_jw *w, const char *s)
{
    if (!s) {
        w->bad = 1;
        return;
    }
    escaped(w, s);
}

void dt__jw_int(ck_jw *w, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do
        tmp[sizeof tmp - 1 - n++] = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    if (v < 0)
        tmp[sizeof tmp - 1 - n++] = '-';
    dt__jw_raw(w, tmp + sizeof tmp - n, (size_t)n);
}

void dt__jw_real(ck_jw *w, double v)
{
    /* jansson's jsonp_dtostr: %.17g, ".0" when neither '.' nor 'e', and the exponent without
     * '+' and leading zeros. */
    char b[40];
    int n = snprintf(b, sizeof b - 3, "%.17g", v);
    if (n < 0 || n >= (int)sizeof b - 3) {
        w->bad = 1;
        return;
    }
    if (!strchr(b, '.') && !strchr(b, 'e')) {
        memcpy(b + n, ".0", 3);
        n += 2;
    }
    char *e = strchr(b, 'e');
    if (e) {
        char *start = e + 1, *end = e + 2;
        if (*start == '-')
            start++;
        while (*end == '0')
            end++;
        if (end != start) {
            memmove(start, end, strlen(end) + 1);
            n = (int)strlen(b);
        }
    }
    dt__jw_raw(w, b, (size_t)n);
}

void dt__jw_int_array(ck_jw *w, int n, const int64_t *v)
{
    dt__jw_open(w, '[');
    for (int i = 0; i < n; i++) {
        dt__jw_elem(w);
        dt__jw_int(w, v[i]);
    }
    dt__jw_close(w, ']');
}
