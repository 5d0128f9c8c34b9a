/* dt_foreign_open: tells a safetensors file, an HF index, a directory and an llm.c GPT-2
 * checkpoint apart and parses their headers (foreign_st.c, foreign_llmc.c); the handle's
 * tensor table, name lookup and getters. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"

dt_status dt__foreign_add(dt_foreign *src, const char *name, dt_dtype dtype, int rank,
                          const int64_t *shape, int64_t file, uint64_t offset, uint64_t bytes)
{
    if (src->ntensors == src->cap) {
        int64_t cap = src->cap ? 2 * src->cap : 16;
        ck_ftensor *t = realloc(src->tensors, (size_t)cap * sizeof *t);
        if (!t)
            return dt__error(DT_ERR_NO_MEMORY, "dt_foreign_open: no memory");
        src->tensors = t;
        src->cap = cap;
    }
    ck_ftensor *t = &src->tensors[src->ntensors];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)))
        return dt__error(DT_ERR_NO_MEMORY, "dt_foreign_open: no memory");
    t->dtype = dtype;
    t->rank = rank;
    for (int d = 0; d < rank; d++)
        t->shape[d] = shape[d];
    t->file = file;
    t->offset = offset;
    t->bytes = bytes;
    src->ntensors++;
    return DT_OK;
}

dt_status dt__foreign_add_file(dt_foreign *src, const char *path, uint64_t size,
                               int64_t *index_out)
{
    ck_ffile *f = realloc(src->files, (size_t)(src->nfiles + 1) * sizeof *f);
    if (!f)
        return dt__error(DT_ERR_NO_MEMORY, "dt_foreign_open: no memory");
    src->files = f;
    if (!(f[src->nfiles].path = strdup(path)))
        return dt__error(DT_ERR_NO_MEMORY, "dt_foreign_open: no memory");
    f[src->nfiles].size = size;
    *index_out = src->nfiles++;
    return DT_OK;
}

static int cmp_name(const void *pa, const void *pb, void *arg)
{
    const dt_foreign *src = arg;
    return strcmp(src->tensors[*(const int64_t *)pa].name,
                  src->tensors[*(const int64_t *)pb].name);
}

dt_status dt__foreign_index_names(dt_foreign *src)
{
    free(src->by_name);
    src->by_name = malloc((size_t)src->ntensors * sizeof *src->by_name + 1);
    if (!src->by_name)
        return dt__error(DT_ERR_NO_MEMORY, "dt_foreign_open: no memory");
    for (int64_t i = 0; i < src->ntensors; i++)
        src->by_name[i] = i;
    qsort_r(src->by_name, (size_t)src->ntensors, sizeof *src->by_name, cmp_name, src);
    for (int64_t i = 1; i < src->ntensors; i++) {
        const ck_ftensor *a = &src->tensors[src->by_name[i - 1]];
        const ck_ftensor *b = &src->tensors[src->by_name[i]];
        if (strcmp(a->name, b->name) == 0)
            return dt__error(DT_ERR_CORRUPT, "%s: tensor '%s' is stored twice (in %s and %s)",
                             src->shown, a->name, src->files[a->file].path,
                             src->files[b->file].path);
    }
    return DT_OK;
}

int64_t dt__foreign_lookup(const dt_foreign *src, const char *name)
{
    int64_t lo = 0, hi = src->ntensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(src->tensors[src->by_name[mid]].name, name);
        if (c == 0)
            return src->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* Reads a whole small text file (an index) into an owned NUL-terminated buffer. */
static dt_status read_text(const char *path, char **text_out, size_t *len_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dt__error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "%s: %s", path,
                         strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size > (off_t)CK_FOREIGN_HEADER_MAX) {
        close(fd);
        return dt__error(DT_ERR_CORRUPT, "%s: index larger than %llu bytes or unreadable",
                         path, (unsigned long long)CK_FOREIGN_HEADER_MAX);
    }
    char *text = malloc((size_t)sb.st_size + 1);
    if (!text) {
        close(fd);
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", path);
    }
    int64_t got = dt__ckpt_pread(fd, text, (size_t)sb.st_size, 0);
    close(fd);
    if (got != (int64_t)sb.st_size) {
        free(text);
        return dt__error(DT_ERR_IO, "%s: short read", path);
    }
    text[got] = '\0';
    *text_out = text;
    *len_out = (size_t)got;
    return DT_OK;
}

static int ends_with(const char *s, const char *tail)
{
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

static dt_status set_dir_of(dt_foreign *src, const char *file)
{
    const char *slash = strrchr(file, '/');
    src->dir = slash ? strndup(file, (size_t)(slash - file) + (slash == file)) : strdup(".");
    return src->dir ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "dt_foreign_open: no memory");
}

/* One data file: llm.c by its magic, else safetensors. */
static dt_status open_data_file(dt_foreign *src, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dt__error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "%s: %s", path,
                         strerror(errno));
    struct stat sb;
    dt_status st = DT_OK;
    if (fstat(fd, &sb) != 0) {
        st = dt__error(DT_ERR_IO, "%s: %s", path, strerror(errno));
        goto out;
    }
    int64_t f = 0;
    if ((st = dt__foreign_add_file(src, path, (uint64_t)sb.st_size, &f)) != DT_OK)
        goto out;
    unsigned char head[4] = {0};
    int32_t magic = 0;
    if (dt__ckpt_pread(fd, head, 4, 0) == 4)
        magic = (int32_t)((uint32_t)head[0] | (uint32_t)head[1] << 8 |
                          (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24);
    if (magic == DT_FOREIGN_LLMC_MAGIC) {
        src->format = DT_FOREIGN_LLMC_GPT2;
        st = dt__foreign_parse_llmc(src, f, fd);
    } else {
        src->format = DT_FOREIGN_SAFETENSORS;
        st = dt__foreign_parse_st(src, f, fd);
    }
out:
    close(fd);
    return st;
}

static dt_status open_index(dt_foreign *src, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    dt_status st = read_text(path, &text, &len);
    if (st == DT_OK)
        st = set_dir_of(src, path);
    if (st == DT_OK)
        st = dt__foreign_parse_index(src, path, text, len);
    free(text);
    return st;
}

void dt_foreign_close(dt_foreign *src)
{
    if (!src)
        return;
    for (int64_t i = 0; i < src->ntensors; i++)
        free(src->tensors[i].name);
    for (int64_t i = 0; i < src->nfiles; i++)
        free(src->files[i].path);
    free(src->tensors);
    free(src->files);
    free(src->by_name);
    json_decref(src->metadata);
    json_decref(src->index_metadata);
    if (src->stats)
        free(src->stats->by_device);
    free(src->stats);
    free(src->dir);
    free(src->path);
    free(src);
}

dt_status dt_foreign_open(const char *path, dt_foreign **src_out)
{
    if (!path || !path[0] || !src_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_foreign_open: NULL or empty path");
    if (strlen(path) >= CK_PATH_MAX - 64)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_foreign_open: path too long");
    dt_foreign *src = calloc(1, sizeof *src);
    if (!src || !(src->path = strdup(path)) || !(src->stats = calloc(1, sizeof *src->stats))) {
        dt_foreign_close(src);
        return dt__error(DT_ERR_NO_MEMORY, "dt_foreign_open: no memory");
    }
    src->shown = src->path;
    dt_status st = DT_OK;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        st = dt__error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "dt_foreign_open: %s: %s",
                       path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        char p[CK_PATH_MAX];
        struct stat s2;
        if ((st = dt__ckpt_join(p, sizeof p, path, "/", "model.safetensors.index.json")) ==
                DT_OK &&
            stat(p, &s2) == 0) {
            st = open_index(src, p);
        } else if (st == DT_OK &&
                   (st = dt__ckpt_join(p, sizeof p, path, "/", "model.safetensors")) == DT_OK &&
                   stat(p, &s2) == 0) {
            if ((st = set_dir_of(src, p)) == DT_OK)
                st = open_data_file(src, p);
        } else if (st == DT_OK) {
            st = dt__error(DT_ERR_NOT_FOUND, "dt_foreign_open: %s holds neither "
                           "model.safetensors.index.json nor model.safetensors", path);
        }
    } else if (ends_with(path, ".index.json")) {
        st = open_index(src, path);
    } else if ((st = set_dir_of(src, path)) == DT_OK) {
        st = open_data_file(src, path);
    }
    if (st == DT_OK)
        st = dt__foreign_index_names(src);
    if (st != DT_OK) {
        dt_foreign_close(src);
        return st;
    }
    *src_out = src;
    return DT_OK;
}

dt_foreign_format dt_foreign_format_of(const dt_foreign *src)
{
    return src ? src->format : DT_FOREIGN_SAFETENSORS;
}

const char *dt_foreign_path(const dt_foreign *src)
{
    return src ? src->path : NULL;
}

int64_t dt_foreign_num_tensors(const dt_foreign *src)
{
    return src ? src->ntensors : 0;
}

dt_status dt_foreign_tensor(const dt_foreign *src, int64_t i, dt_foreign_tensor_info *info_out)
{
    if (!src || !info_out || i < 0 || i >= src->ntensors)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_foreign_tensor: bad handle or index");
    const ck_ftensor *t = &src->tensors[i];
    memset(info_out, 0, sizeof *info_out);
    info_out->name = t->name;
    info_out->dtype = t->dtype;
    info_out->rank = t->rank;
    for (int d = 0; d < t->rank; d++)
        info_out->shape[d] = t->shape[d];
    info_out->file = src->files[t->file].path;
    info_out->file_offset = t->offset;
    info_out->bytes = t->bytes;
    return DT_OK;
}

dt_status dt_foreign_find(const dt_foreign *src, const char *name, int64_t *index_out)
{
    if (!src || !name || !index_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_foreign_find: NULL argument");
    int64_t i = dt__foreign_lookup(src, name);
    if (i < 0)
        return dt__error(DT_ERR_NOT_FOUND, "%s: no tensor '%s'", src->shown, name);
    *index_out = i;
    return DT_OK;
}

const char *dt_foreign_metadata(const dt_foreign *src, const char *key)
{
    if (!src || !key)
        return NULL;
    const char *v = json_string_value(json_object_get(src->metadata, key));
    return v ? v : json_string_value(json_object_get(src->index_metadata, key));
}

uint64_t dt_foreign_bytes_read(const dt_foreign *src, int device_id)
{
    if (!src || !src->stats)
        return 0;
    if (device_id < 0)
        return src->stats->total;
    return device_id < src->stats->n ? src->stats->by_device[device_id] : 0;
}
