/* Safetensors headers and Hugging Face's sharded index, as other programs write them: every
 * length, offset and shape is checked against the file before anything is trusted (the
 * fuzz target of tests/foreign drives this file). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

typedef struct st_span {
    uint64_t begin, end;
    const char *name;
} st_span;

static int cmp_span(const void *pa, const void *pb)
{
    const st_span *a = pa, *b = pb;
    if (a->begin != b->begin)
        return a->begin < b->begin ? -1 : 1;
    return a->end < b->end ? -1 : a->end > b->end;
}

/* numel * esize without overflow past 2^62; -1 when it does. */
static int64_t shape_bytes(int rank, const int64_t *shape, size_t esize)
{
    uint64_t n = esize;
    for (int d = 0; d < rank; d++) {
        if (shape[d] != 0 && n > ((uint64_t)1 << 62) / (uint64_t)shape[d])
            return -1;
        n *= (uint64_t)shape[d];
    }
    return (int64_t)n;
}

/* One header entry: dtype, shape, data_offsets, checked against the buffer length. */
static dt_status parse_entry(const char *file, const char *name, json_t *e, uint64_t buflen,
                             dt_dtype *dtype, int *rank, int64_t *shape, uint64_t *begin,
                             uint64_t *end)
{
    if (!json_is_object(e))
        return dt__error(DT_ERR_CORRUPT, "%s: tensor '%s': header entry is not an object",
                         file, name);
    const char *ds = json_string_value(json_object_get(e, "dtype"));
    if (!ds)
        return dt__error(DT_ERR_CORRUPT, "%s: tensor '%s': no dtype", file, name);
    if (dt__ckpt_dtype_from_str(ds, dtype) != 0)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: tensor '%s': dtype '%s' is not supported",
                         file, name, ds);
    json_t *sh = json_object_get(e, "shape");
    if (!json_is_array(sh) || json_array_size(sh) > DT_MAX_RANK)
        return dt__error(DT_ERR_CORRUPT, "%s: tensor '%s': shape is not an array of at most "
                         "%d sizes", file, name, DT_MAX_RANK);
    *rank = (int)json_array_size(sh);
    for (int d = 0; d < *rank; d++) {
        json_t *x = json_array_get(sh, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return dt__error(DT_ERR_CORRUPT, "%s: tensor '%s': shape[%d] is not a size", file,
                             name, d);
        shape[d] = (int64_t)json_integer_value(x);
    }
    json_t *of = json_object_get(e, "data_offsets");
    json_t *b = json_array_get(of, 0), *en = json_array_get(of, 1);
    if (!json_is_array(of) || json_array_size(of) != 2 || !json_is_integer(b) ||
        !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b))
        return dt__error(DT_ERR_CORRUPT, "%s: tensor '%s': data_offsets is not [begin, end] "
                         "with 0 <= begin <= end", file, name);
    *begin = (uint64_t)json_integer_value(b);
    *end = (uint64_t)json_integer_value(en);
    if (*end > buflen)
        return dt__error(DT_ERR_CORRUPT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                         ") lie past the end of the data (%" PRIu64 " bytes: truncated file?)",
                         file, name, *begin, *end, buflen);
    int64_t want = shape_bytes(*rank, shape, dt_dtype_size(*dtype));
    if (want < 0 || (uint64_t)want != *end - *begin) {
        char sbuf[160];
        return dt__error(DT_ERR_CORRUPT, "%s: tensor '%s': data_offsets span %" PRIu64
                         " bytes, %s %s needs %" PRId64, file, name, *end - *begin, ds,
                         dt__shape_str(*rank, shape, sbuf, sizeof sbuf), want);
    }
    return DT_OK;
}

dt_status dt__foreign_parse_st(dt_foreign *src, int64_t f, int fd)
{
    const char *file = src->files[f].path;
    uint64_t size = src->files[f].size;
    unsigned char lb[8];
    if (size < 8 || dt__ckpt_pread(fd, lb, 8, 0) != 8)
        return dt__error(DT_ERR_CORRUPT, "%s: shorter than a safetensors header (%" PRIu64
                         " bytes)", file, size);
    uint64_t hlen = 0;
    for (int b = 0; b < 8; b++)
        hlen |= (uint64_t)lb[b] << (8 * b);
    if (hlen > CK_FOREIGN_HEADER_MAX || hlen > size - 8)
        return dt__error(DT_ERR_CORRUPT, "%s: header length %" PRIu64 " exceeds the file (%"
                         PRIu64 " bytes) or the limit of %" PRIu64, file, hlen, size,
                         CK_FOREIGN_HEADER_MAX);
    char *text = malloc((size_t)hlen + 1);
    if (!text)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory for the header", file);
    if (dt__ckpt_pread(fd, text, (size_t)hlen, 8) != (int64_t)hlen) {
        free(text);
        return dt__error(DT_ERR_IO, "%s: cannot read the header: %s", file, strerror(errno));
    }
    json_error_t jerr;
    json_t *root = json_loadb(text, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!json_is_object(root)) {
        json_decref(root);
        return dt__error(DT_ERR_CORRUPT, "%s: header is not a JSON object (%s, at byte %d)",
                         file, root ? "not an object" : jerr.text, root ? 0 : jerr.position);
    }
    uint64_t data = 8 + hlen, buflen = size - data;
    size_t n = json_object_size(root);
    st_span *spans = calloc(n + 1, sizeof *spans);
    dt_status st = spans ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "%s: no memory", file);
    size_t ns = 0;
    int64_t first = src->ntensors;
    const char *key;
    json_t *e;
    json_object_foreach(root, key, e) {
        if (st != DT_OK)
            break;
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(e)) {
                st = dt__error(DT_ERR_CORRUPT, "%s: __metadata__ is not an object", file);
                break;
            }
            json_object_foreach(e, mk, mv) {
                if (!json_is_string(mv)) {
                    st = dt__error(DT_ERR_CORRUPT, "%s: __metadata__ value '%s' is not a "
                                   "string", file, mk);
                    break;
                }
            }
            if (st == DT_OK && !src->metadata)
                src->metadata = json_incref(e);
            continue;
        }
        if (!key[0] || strlen(key) > DT_CKPT_NAME_MAX) {
            st = dt__error(DT_ERR_CORRUPT, "%s: a tensor name is empty or longer than %d bytes",
                           file, DT_CKPT_NAME_MAX);
            break;
        }
        dt_dtype dt = DT_DTYPE_F32;
        int rank = 0;
        int64_t shape[DT_MAX_RANK] = {0};
        uint64_t b = 0, en = 0;
        st = parse_entry(file, key, e, buflen, &dt, &rank, shape, &b, &en);
        if (st == DT_OK)
            st = dt__foreign_add(src, key, dt, rank, shape, f, data + b, en - b);
        if (st == DT_OK)
            spans[ns++] = (st_span){b, en, src->tensors[src->ntensors - 1].name};
    }
    /* No two tensors share a byte (empty ones take none). */
    if (st == DT_OK) {
        qsort(spans, ns, sizeof *spans, cmp_span);
        uint64_t reach = 0;
        const char *prev = NULL;
        for (size_t i = 0; i < ns; i++) {
            if (spans[i].begin == spans[i].end)
                continue;
            if (prev && spans[i].begin < reach) {
                st = dt__error(DT_ERR_CORRUPT, "%s: tensors '%s' and '%s' overlap in the data",
                               file, prev, spans[i].name);
                break;
            }
            reach = spans[i].end;
            prev = spans[i].name;
        }
    }
    /* Tensors in data order. */
    if (st == DT_OK && src->ntensors - first > 1) {
        int64_t k = src->ntensors - first;
        ck_ftensor *t = src->tensors + first;
        for (int64_t i = 1; i < k; i++)
            for (int64_t j = i; j > 0 && t[j - 1].offset > t[j].offset; j--) {
                ck_ftensor x = t[j];
                t[j] = t[j - 1];
                t[j - 1] = x;
            }
    }
    free(spans);
    json_decref(root);
    return st;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A file name an index may name: relative, no ".." part, no control characters. */
static int safe_file_name(const char *s)
{
    if (!s[0] || s[0] == '/' || strlen(s) > 1024)
        return 0;
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20)
            return 0;
    for (const char *p = s; p; p = strchr(p, '/')) {
        if (*p == '/')
            p++;
        if (strncmp(p, "..", 2) == 0 && (p[2] == '/' || p[2] == '\0'))
            return 0;
    }
    return 1;
}

dt_status dt__foreign_parse_index(dt_foreign *src, const char *index_path, const char *text,
                                  size_t len)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        dt_status st = dt__error(DT_ERR_CORRUPT, "%s: not an index: %s", index_path,
                                 !root ? jerr.text : "no \"weight_map\" object");
        json_decref(root);
        return st;
    }
    json_t *meta = json_object_get(root, "metadata");
    if (json_is_object(meta))
        src->index_metadata = json_incref(meta);
    size_t n = json_object_size(wm), nf = 0;
    const char **files = calloc(n + 1, sizeof *files);
    dt_status st = files ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "%s: no memory", index_path);
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        if (st != DT_OK)
            break;
        const char *fn = json_string_value(v);
        if (!fn || !safe_file_name(fn)) {
            st = dt__error(DT_ERR_CORRUPT, "%s: tensor '%s': weight_map value is not a file "
                           "name inside the index's directory", index_path, key);
            break;
        }
        files[nf++] = fn;
    }
    if (st == DT_OK && nf == 0)
        st = dt__error(DT_ERR_CORRUPT, "%s: weight_map is empty", index_path);
    if (st == DT_OK)
        qsort(files, nf, sizeof *files, cmp_str);
    for (size_t i = 0; st == DT_OK && i < nf; i++) {
        if (i > 0 && strcmp(files[i], files[i - 1]) == 0)
            continue;
        char p[CK_PATH_MAX];
        if ((st = dt__ckpt_join(p, sizeof p, src->dir, "/", files[i])) != DT_OK)
            break;
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0) {
            st = dt__error(errno == ENOENT ? DT_ERR_CORRUPT : DT_ERR_IO,
                           "%s: file '%s' it names: %s", index_path, files[i], strerror(errno));
            if (fd >= 0)
                close(fd);
            break;
        }
        int64_t f = 0;
        if ((st = dt__foreign_add_file(src, p, (uint64_t)sb.st_size, &f)) == DT_OK)
            st = dt__foreign_parse_st(src, f, fd);
        close(fd);
    }
    if (st == DT_OK)
        st = dt__foreign_index_names(src);
    /* Every mapped tensor is in the file the map names. */
    json_object_foreach(wm, key, v) {
        if (st != DT_OK)
            break;
        int64_t t = dt__foreign_lookup(src, key);
        const char *fn = json_string_value(v);
        const char *path = t >= 0 ? src->files[src->tensors[t].file].path : NULL;
        size_t pl = path ? strlen(path) : 0, fl = strlen(fn);
        if (!path || pl < fl + 1 || strcmp(path + pl - fl, fn) != 0 || path[pl - fl - 1] != '/')
            st = dt__error(DT_ERR_CORRUPT, "%s: tensor '%s' is not in %s, the file its "
                           "weight_map names", index_path, key, fn);
    }
    if (st == DT_OK)
        src->format = DT_FOREIGN_SAFETENSORS;
    free(files);
    json_decref(root);
    return st;
}
