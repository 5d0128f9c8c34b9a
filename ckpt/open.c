/* Opening a checkpoint for reading (resolving a crash-interrupted commit, reading the index)
 * and the local getters of dt_ckpt. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"

dt_status dt_ckpt_open(const char *dir, dt_ckpt **ckpt_out)
{
    if (!ckpt_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_open: NULL output");
    char path[CK_PATH_MAX], ipath[CK_PATH_MAX];
    dt_status st = dt__ckpt_resolve(dir, path, sizeof path);
    if (st != DT_OK)
        return st;
    if ((st = dt__ckpt_join(ipath, sizeof ipath, path, "/", DT_CKPT_INDEX_NAME)) != DT_OK)
        return st;
    int fd = open(ipath, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dt__error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "%s: %s", ipath,
                         strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return dt__error(DT_ERR_IO, "%s: %s", ipath, strerror(e));
    }
    if (sb.st_size > ((off_t)1 << 32)) {
        close(fd);
        return dt__error(DT_ERR_CORRUPT, "%s: index of %lld bytes is too large", ipath,
                         (long long)sb.st_size);
    }
    size_t len = (size_t)sb.st_size;
    char *text = malloc(len + 1);
    if (!text) {
        close(fd);
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory for %zu bytes", ipath, len);
    }
    int64_t got = dt__ckpt_pread(fd, text, len, 0);
    int e = errno;
    close(fd);
    if (got < 0 || (size_t)got != len) {
        free(text);
        return dt__error(DT_ERR_IO, "%s: read: %s", ipath, got < 0 ? strerror(e) : "short read");
    }
    st = dt__ckpt_parse_index(path, ipath, text, len, ckpt_out);
    free(text);
    return st;
}

const char *dt_ckpt_path(const dt_ckpt *ck) { return ck ? ck->path : ""; }
int dt_ckpt_format_version(const dt_ckpt *ck) { return ck ? ck->version : 0; }
const char *dt_ckpt_mesh(const dt_ckpt *ck) { return ck ? ck->mesh : ""; }
int64_t dt_ckpt_num_files(const dt_ckpt *ck) { return ck ? ck->nfiles : 0; }
int64_t dt_ckpt_num_tensors(const dt_ckpt *ck) { return ck ? ck->ntensors : 0; }
int64_t dt_ckpt_num_values(const dt_ckpt *ck) { return ck ? ck->nvalues : 0; }

dt_status dt_ckpt_file(const dt_ckpt *ck, int64_t i, dt_ckpt_file_info *info_out)
{
    if (!ck || !info_out || i < 0 || i >= ck->nfiles)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_file: bad handle or index %lld",
                         (long long)i);
    const ck_file *f = &ck->files[i];
    info_out->name = f->name;
    info_out->bytes = f->bytes;
    info_out->header_bytes = f->header_bytes;
    info_out->header_crc32c = f->header_crc;
    info_out->device_id = f->device_id;
    return DT_OK;
}

dt_status dt_ckpt_tensor(const dt_ckpt *ck, int64_t i, dt_ckpt_tensor_info *info_out)
{
    if (!ck || !info_out || i < 0 || i >= ck->ntensors)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_tensor: bad handle or index %lld",
                         (long long)i);
    const ck_tensor *t = &ck->tensors[i];
    memset(info_out, 0, sizeof *info_out);
    info_out->name = t->name;
    info_out->dtype = t->dtype;
    info_out->rank = t->rank;
    memcpy(info_out->shape, t->shape, sizeof t->shape);
    info_out->layout = t->layout;
    info_out->mesh = t->mesh;
    info_out->num_slices = t->nslices;
    return DT_OK;
}

dt_status dt_ckpt_find(const dt_ckpt *ck, const char *name, int64_t *index_out)
{
    if (!ck || !name || !index_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_find: NULL argument");
    int64_t lo = 0, hi = ck->ntensors;   /* by_name is sorted by name */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->tensors[ck->by_name[mid]].name, name);
        if (c == 0) {
            *index_out = ck->by_name[mid];
            return DT_OK;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return dt__error(DT_ERR_NOT_FOUND, "%s: no tensor '%s' in the checkpoint", ck->path, name);
}

dt_status dt_ckpt_slice(const dt_ckpt *ck, int64_t tensor, int64_t slice,
                        dt_ckpt_slice_info *info_out)
{
    if (!ck || !info_out || tensor < 0 || tensor >= ck->ntensors || slice < 0 ||
        slice >= ck->tensors[tensor].nslices)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_slice: bad handle or index %lld/%lld",
                         (long long)tensor, (long long)slice);
    const ck_tensor *t = &ck->tensors[tensor];
    const ck_slice *s = &t->slices[slice];
    memset(info_out, 0, sizeof *info_out);
    info_out->file = ck->files[s->file].name;
    info_out->key = s->key ? s->key : t->name;
    info_out->rank = t->rank;
    memcpy(info_out->offsets, s->off, sizeof s->off);
    memcpy(info_out->sizes, s->size, sizeof s->size);
    info_out->file_offset = s->file_offset;
    info_out->bytes = s->bytes;
    info_out->crc32c = s->crc;
    info_out->chunk_bytes = ck->chunk_bytes;
    info_out->num_chunks = s->nchunks;
    return DT_OK;
}

dt_status dt_ckpt_value_info(const dt_ckpt *ck, int64_t i, const char **name_out,
                             dt_ckpt_value_type *type_out)
{
    if (!ck || i < 0 || i >= ck->nvalues)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_value_info: bad handle or index %lld",
                         (long long)i);
    if (name_out)
        *name_out = ck->values[i].name;
    if (type_out)
        *type_out = ck->values[i].type;
    return DT_OK;
}

static const char *const type_names[] = {"i64", "f64", "bytes"};

static dt_status find_value(const dt_ckpt *ck, const char *name, dt_ckpt_value_type type,
                            const ck_value **out)
{
    if (!ck || !name)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_value: NULL argument");
    for (int64_t i = 0; i < ck->nvalues; i++)
        if (strcmp(ck->values[i].name, name) == 0) {
            if (ck->values[i].type != type)
                return dt__error(DT_ERR_SHAPE, "%s: value '%s' is of type %s, not %s", ck->path,
                                 name, type_names[ck->values[i].type], type_names[type]);
            *out = &ck->values[i];
            return DT_OK;
        }
    return dt__error(DT_ERR_NOT_FOUND, "%s: no value '%s' in the checkpoint", ck->path, name);
}

dt_status dt_ckpt_value_i64(const dt_ckpt *ck, const char *name, int64_t *value_out)
{
    const ck_value *v;
    dt_status st = find_value(ck, name, DT_CKPT_VALUE_I64, &v);
    if (st == DT_OK && value_out)
        *value_out = v->i64;
    return st;
}

dt_status dt_ckpt_value_f64(const dt_ckpt *ck, const char *name, double *value_out)
{
    const ck_value *v;
    dt_status st = find_value(ck, name, DT_CKPT_VALUE_F64, &v);
    if (st == DT_OK && value_out)
        *value_out = v->f64;
    return st;
}

dt_status dt_ckpt_value_bytes(const dt_ckpt *ck, const char *name, const void **data_out,
                              size_t *nbytes_out)
{
    const ck_value *v;
    dt_status st = find_value(ck, name, DT_CKPT_VALUE_BYTES, &v);
    if (st == DT_OK) {
        if (data_out)
            *data_out = v->bytes;
        if (nbytes_out)
            *nbytes_out = v->nbytes;
    }
    return st;
}
