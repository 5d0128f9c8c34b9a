/* Text files for the CSV and line readers: plain (indexed by one scan, lines read back with
 * pread) or gzip (inflated once into memory with zlib, indexed there). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "data/data_impl.h"
#include "runtime/error.h"

enum { CHUNK = 1 << 20 };

typedef struct line_index {
    int64_t *start;
    int64_t n, cap; /* entries used / allocated */
} line_index;

static int index_push(line_index *ix, int64_t off)
{
    if (ix->n == ix->cap) {
        int64_t cap = ix->cap ? 2 * ix->cap : 1024;
        int64_t *p = realloc(ix->start, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        ix->start = p;
        ix->cap = cap;
    }
    ix->start[ix->n++] = off;
    return 0;
}

/* Records the line starts after each newline of buf[0..len), which sits at offset `base`. */
static int index_scan(line_index *ix, const char *buf, size_t len, int64_t base)
{
    const char *p = buf, *end = buf + len;
    while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        p++;
        if (index_push(ix, base + (p - buf)) != 0)
            return -1;
    }
    return 0;
}

/* Inflates the whole gzip file into t->mem; *len_out its length. */
static dt_status inflate_all(const char *path, char **mem_out, int64_t *len_out)
{
    gzFile gz = gzopen(path, "rb");
    if (!gz)
        return dt__error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno ? errno : ENOMEM));
    gzbuffer(gz, CHUNK);
    size_t cap = CHUNK, len = 0;
    char *mem = malloc(cap);
    dt_status st = DT_OK;
    if (!mem) {
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory to inflate", path);
        goto out;
    }
    for (;;) {
        if (cap - len < CHUNK) {
            char *p = realloc(mem, cap * 2);
            if (!p) {
                st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory to inflate", path);
                goto out;
            }
            mem = p;
            cap *= 2;
        }
        int got = gzread(gz, mem + len, CHUNK);
        if (got < 0) {
            int code = 0;
            const char *msg = gzerror(gz, &code);
            st = code == Z_ERRNO ? dt__error(DT_ERR_IO, "%s: reading: %s", path, strerror(errno))
                                 : dt__error(DT_ERR_CORRUPT, "%s: gzip: %s", path, msg);
            goto out;
        }
        if (got == 0)
            break;
        len += (size_t)got;
    }
    /* A truncated stream ends without an error from gzread on some zlib versions; ask. */
    int code = 0;
    const char *msg = gzerror(gz, &code);
    if (code != Z_OK) {
        st = dt__error(DT_ERR_CORRUPT, "%s: gzip: %s", path, msg);
        goto out;
    }
    *mem_out = mem;
    *len_out = (int64_t)len;
    mem = NULL;
out:
    free(mem);
    gzclose(gz);
    return st;
}

dt_status dd_text_open(const char *path, int64_t skip, dd_text *t)
{
    memset(t, 0, sizeof *t);
    t->fd = -1;
    line_index ix = {0};
    char *buf = NULL;
    dt_status st = DT_OK;
    t->path = strdup(path);
    if (!t->path || index_push(&ix, 0) != 0) {
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", path);
        goto err;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = dt__error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto err;
    }
    unsigned char magic[2] = {0, 0};
    ssize_t m = pread(fd, magic, 2, 0);
    int64_t total = 0;
    if (m == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        close(fd);
        if ((st = inflate_all(path, &t->mem, &total)) != DT_OK)
            goto err;
        if (index_scan(&ix, t->mem, (size_t)total, 0) != 0) {
            st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory for the line index", path);
            goto err;
        }
    } else {
        t->fd = fd;
        buf = malloc(CHUNK);
        if (!buf) {
            st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", path);
            goto err;
        }
        for (;;) {
            ssize_t got = read(fd, buf, CHUNK);
            if (got < 0 && errno == EINTR)
                continue;
            if (got < 0) {
                st = dt__error(DT_ERR_IO, "%s: reading: %s", path, strerror(errno));
                goto err;
            }
            if (got == 0)
                break;
            if (index_scan(&ix, buf, (size_t)got, total) != 0) {
                st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory for the line index", path);
                goto err;
            }
            total += got;
        }
    }
    /* A last line without a newline is a line; the empty rest after a final newline is not. */
    if (ix.start[ix.n - 1] != total && index_push(&ix, total) != 0) {
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory for the line index", path);
        goto err;
    }
    int64_t lines = ix.n - 1;
    if (skip < 0 || skip > lines) {
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: cannot skip %lld lines of %lld", path,
                       (long long)skip, (long long)lines);
        goto err;
    }
    memmove(ix.start, ix.start + skip, (size_t)(ix.n - skip) * sizeof *ix.start);
    t->start = ix.start;
    t->nlines = lines - skip;
    t->first_line = skip + 1;
    free(buf);
    return DT_OK;

err:
    free(buf);
    free(ix.start);
    dd_text_close(t);
    return st;
}

void dd_text_close(dd_text *t)
{
    if (t->fd >= 0)
        close(t->fd);
    free(t->mem);
    free(t->start);
    free(t->path);
    memset(t, 0, sizeof *t);
    t->fd = -1;
}

dt_status dd_text_lines(const dd_text *t, int64_t first, int64_t count, char **buf, size_t *cap,
                        const char **text_out)
{
    int64_t a = t->start[first], b = t->start[first + count];
    if (t->mem) {
        *text_out = t->mem + a;
        return DT_OK;
    }
    size_t len = (size_t)(b - a);
    if (*cap < len + 1) {
        char *p = realloc(*buf, len + 1);
        if (!p)
            return dt__error(DT_ERR_NO_MEMORY, "%s: no memory for reading lines", t->path);
        *buf = p;
        *cap = len + 1;
    }
    char what[64];
    snprintf(what, sizeof what, "line %lld", (long long)(t->first_line + first));
    dt_status st = dd_pread_all(t->fd, *buf, len, (uint64_t)a, t->path, what);
    if (st == DT_OK)
        *text_out = *buf;
    return st;
}
