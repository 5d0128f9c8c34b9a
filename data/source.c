/* Sources of examples: the common handle (fields, reference count, queries), the callback
 * source, and the full pread the file readers share. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

dt_status dd_source_new(const char *what, int64_t n, int nfields, const dt_data_field *fields,
                        const dd_source_ops *ops, void *impl, dt_data_source **out)
{
    if (!out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL source_out", what);
    if (n < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %lld examples", what, (long long)n);
    if (nfields < 1 || nfields > DT_DATA_MAX_FIELDS || !fields)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %d fields (1..%d, not NULL)", what,
                         nfields, DT_DATA_MAX_FIELDS);
    dt_data_source *s = calloc(1, sizeof *s);
    if (!s)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", what);
    for (int k = 0; k < nfields; k++) {
        const dt_data_field *f = &fields[k];
        size_t bytes = dt_dtype_size(f->dtype);
        if (bytes == 0 || f->rank < 0 || f->rank > DT_MAX_RANK - 1) {
            free(s);
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: field %d: bad dtype %d or rank %d",
                             what, k, (int)f->dtype, f->rank);
        }
        for (int i = 0; i < f->rank; i++)
            if (f->shape[i] < 1 || dt__mul_size(bytes, (size_t)f->shape[i], &bytes) != 0) {
                free(s);
                return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: field %d: bad size %lld of dim %d",
                                 what, k, (long long)f->shape[i], i);
            }
        s->fields[k] = *f;
        s->field_bytes[k] = bytes;
    }
    atomic_init(&s->refs, 1);
    s->n = n;
    s->nfields = nfields;
    s->ops = ops;
    s->impl = impl;
    *out = s;
    return DT_OK;
}

dt_data_source *dd_source_retain(dt_data_source *s)
{
    atomic_fetch_add(&s->refs, 1);
    return s;
}

void dt_data_source_destroy(dt_data_source *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    if (s->ops->release)
        s->ops->release(s->impl);
    free(s);
}

int64_t dt_data_source_num_examples(const dt_data_source *s)
{
    return s ? s->n : 0;
}

int dt_data_source_num_fields(const dt_data_source *s)
{
    return s ? s->nfields : 0;
}

dt_status dt_data_source_field(const dt_data_source *s, int k, dt_data_field *out)
{
    if (!s || !out || k < 0 || k >= s->nfields)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_data_source_field: no field %d", k);
    *out = s->fields[k];
    return DT_OK;
}

dt_status dt_data_source_read(dt_data_source *s, int64_t index, void *const *fields)
{
    if (!s || !fields)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_data_source_read: NULL argument");
    if (index < 0 || index >= s->n)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_data_source_read: example %lld outside 0..%lld", (long long)index,
                         (long long)s->n - 1);
    return s->ops->read(s, &index, 1, fields);
}

dt_status dd_pread_all(int fd, void *buf, size_t len, uint64_t off, const char *path,
                       const char *what)
{
    char *p = buf;
    while (len > 0) {
        ssize_t got = pread(fd, p, len, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return dt__error(DT_ERR_IO, "%s: reading %s: %s", path, what, strerror(errno));
        if (got == 0)
            return dt__error(DT_ERR_CORRUPT, "%s: %s: the file ends early (truncated since it "
                             "was opened?)", path, what);
        p += got;
        len -= (size_t)got;
        off += (uint64_t)got;
    }
    return DT_OK;
}

/* ---- the callback source ------------------------------------------------------------------- */

typedef struct cb_impl {
    dt_data_fill_fn fn;
    void *arg;
} cb_impl;

static dt_status cb_read(dt_data_source *s, const int64_t *idx, int64_t count, void *const *dst)
{
    const cb_impl *c = s->impl;
    void *at[DT_DATA_MAX_FIELDS];
    for (int64_t j = 0; j < count; j++) {
        for (int k = 0; k < s->nfields; k++)
            at[k] = dst[k] ? (char *)dst[k] + (size_t)j * s->field_bytes[k] : NULL;
        dt_clear_error();
        dt_status st = c->fn(c->arg, idx[j], at);
        if (st != DT_OK) {
            if (dt_last_error()[0])
                return st;
            return dt__error(st, "example %lld: the source's callback returned %s",
                             (long long)idx[j], dt_status_name(st));
        }
    }
    return DT_OK;
}

static const dd_source_ops cb_ops = {cb_read, free};

dt_status dt_data_source_callback(int64_t num_examples, int nfields, const dt_data_field *fields,
                                  dt_data_fill_fn fn, void *arg, dt_data_source **source_out)
{
    static const char what[] = "dt_data_source_callback";
    if (!fn)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL fn", what);
    cb_impl *c = malloc(sizeof *c);
    if (!c)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", what);
    c->fn = fn;
    c->arg = arg;
    dt_status st = dd_source_new(what, num_examples, nfields, fields, &cb_ops, c, source_out);
    if (st != DT_OK)
        free(c);
    return st;
}
