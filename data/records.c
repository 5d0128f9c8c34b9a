/* The fixed-size binary record reader: one example per record after an optional header; runs
 * of consecutive records are read with one pread, straight into the batch when a record is
 * exactly its one field. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_impl.h"
#include "runtime/error.h"

/* Most bytes one pread brings into the scratch buffer. */
enum { SCRATCH_BYTES = 1 << 20 };

typedef struct rec_impl {
    char *path;
    int fd;
    uint64_t header, record;
    uint64_t offset[DT_DATA_MAX_FIELDS];
    int whole; /* one field filling the whole record: read in place */
} rec_impl;

static void rec_release(void *p)
{
    rec_impl *r = p;
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    free(r->path);
    free(r);
}

/* Length of the run of consecutive indices starting at idx[0], at most max. */
static int64_t run_length(const int64_t *idx, int64_t count, int64_t max)
{
    int64_t len = 1;
    while (len < count && len < max && idx[len] == idx[0] + len)
        len++;
    return len;
}

static dt_status rec_read(dt_data_source *s, const int64_t *idx, int64_t count, void *const *dst)
{
    const rec_impl *r = s->impl;
    char what[64];
    if (r->whole) {
        for (int64_t j = 0; dst[0] && j < count;) {
            int64_t len = run_length(idx + j, count - j, count);
            snprintf(what, sizeof what, "records %lld..%lld", (long long)idx[j],
                     (long long)(idx[j] + len - 1));
            dt_status st = dd_pread_all(r->fd, (char *)dst[0] + (size_t)j * r->record,
                                        (size_t)len * r->record,
                                        r->header + (uint64_t)idx[j] * r->record, r->path, what);
            if (st != DT_OK)
                return st;
            j += len;
        }
        return DT_OK;
    }
    int64_t per = SCRATCH_BYTES / (int64_t)r->record;
    if (per < 1)
        per = 1;
    char *scratch = malloc((size_t)per * r->record);
    if (!scratch)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory for reading", r->path);
    dt_status st = DT_OK;
    for (int64_t j = 0; j < count;) {
        int64_t len = run_length(idx + j, count - j, per);
        snprintf(what, sizeof what, "records %lld..%lld", (long long)idx[j],
                 (long long)(idx[j] + len - 1));
        st = dd_pread_all(r->fd, scratch, (size_t)len * r->record,
                          r->header + (uint64_t)idx[j] * r->record, r->path, what);
        if (st != DT_OK)
            break;
        for (int k = 0; k < s->nfields; k++) {
            if (!dst[k])
                continue;
            size_t fb = s->field_bytes[k];
            for (int64_t i = 0; i < len; i++)
                memcpy((char *)dst[k] + (size_t)(j + i) * fb,
                       scratch + (size_t)i * r->record + r->offset[k], fb);
        }
        j += len;
    }
    free(scratch);
    return st;
}

static const dd_source_ops rec_ops = {rec_read, rec_release};

dt_status dt_data_source_records(const char *path, int nfields, const dt_data_field *fields,
                                 const dt_data_records_opts *opts, dt_data_source **source_out)
{
    static const char fn[] = "dt_data_source_records";
    dt_data_records_opts o = DT_DATA_RECORDS_OPTS_INIT;
    if (opts)
        o = *opts;
    if (!path || !fields || nfields < 1 || nfields > DT_DATA_MAX_FIELDS)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL path or fields, or %d fields", fn,
                         nfields);
    /* Field sizes are checked by dd_source_new; compute them here for the record bounds. */
    dt_data_source *probe = NULL;
    dt_status st = dd_source_new(fn, 0, nfields, fields, &rec_ops, NULL, &probe);
    if (st != DT_OK)
        return st;
    rec_impl *r = calloc(1, sizeof *r);
    if (!r) {
        free(probe);
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    }
    r->fd = -1;
    uint64_t packed = 0;
    for (int k = 0; k < nfields; k++) {
        r->offset[k] = o.field_offsets ? o.field_offsets[k] : packed;
        packed += probe->field_bytes[k];
    }
    r->record = o.record_bytes ? o.record_bytes : packed;
    r->header = o.header_bytes;
    for (int k = 0; k < nfields; k++)
        if (r->offset[k] > r->record || probe->field_bytes[k] > r->record - r->offset[k]) {
            st = dt__error(DT_ERR_INVALID_ARGUMENT,
                           "%s: %s: field %d (%zu bytes at offset %llu) does not fit a %llu-byte "
                           "record", fn, path, k, probe->field_bytes[k],
                           (unsigned long long)r->offset[k], (unsigned long long)r->record);
            goto err;
        }
    r->whole = nfields == 1 && r->offset[0] == 0 && probe->field_bytes[0] == r->record;
    r->path = strdup(path);
    if (!r->path) {
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
        goto err;
    }
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (r->fd < 0 || fstat(r->fd, &sb) != 0) {
        st = dt__error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto err;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < r->header) {
        st = dt__error(DT_ERR_CORRUPT, "%s: %llu bytes, shorter than its %llu-byte header", path,
                       (unsigned long long)size, (unsigned long long)r->header);
        goto err;
    }
    uint64_t body = size - r->header, n = body / r->record;
    if (body % r->record != 0) {
        st = dt__error(DT_ERR_CORRUPT,
                       "%s: record %llu is truncated (%llu of %llu bytes): the file does not "
                       "hold a whole number of records", path, (unsigned long long)n,
                       (unsigned long long)(body % r->record), (unsigned long long)r->record);
        goto err;
    }
    free(probe);
    st = dd_source_new(fn, (int64_t)n, nfields, fields, &rec_ops, r, source_out);
    if (st != DT_OK)
        rec_release(r);
    return st;

err:
    free(probe);
    rec_release(r);
    return st;
}
