/* Local tools over an opened checkpoint: verify every file and slice, read a whole tensor or
 * any box of one, and export to standard (Hugging Face style) safetensors files. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

dt_status dt_ckpt_verify(const dt_ckpt *ck, dt_ckpt_problem_fn fn, void *arg, int64_t *bad_out)
{
    if (!ck)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_verify: NULL checkpoint");
    ck_reader rd;
    dt_status st = dt__ckpt_reader_init(&rd, ck);
    if (st != DT_OK)
        return st;
    int64_t bad = 0;
    char first[1024] = "";
    dt_status first_st = DT_OK;
    for (int64_t f = 0; f < ck->nfiles; f++) {
        if (ck->files[f].nslices > 0)
            continue;
        int fd;
        if ((st = dt__ckpt_reader_file(&rd, f, "", &fd)) != DT_OK) {
            dt_ckpt_problem p = {ck->files[f].name, "", -1, -1, st, dt_last_error()};
            if (!bad++) {
                first_st = st;
                dt__strlcpy(first, dt_last_error(), sizeof first);
            }
            if (fn)
                fn(arg, &p);
        }
    }
    for (int64_t t = 0; t < ck->ntensors; t++)
        for (int64_t s = 0; s < ck->tensors[t].nslices; s++) {
            if ((st = dt__ckpt_check_slice(&rd, t, s)) == DT_OK)
                continue;
            if (st != DT_ERR_CORRUPT && st != DT_ERR_IO) {
                dt__ckpt_reader_free(&rd);
                return st;
            }
            dt_ckpt_problem p = {ck->files[ck->tensors[t].slices[s].file].name,
                                 ck->tensors[t].name, t, s, st, dt_last_error()};
            if (!bad++) {
                first_st = st;
                dt__strlcpy(first, dt_last_error(), sizeof first);
            }
            if (fn)
                fn(arg, &p);
        }
    dt__ckpt_reader_free(&rd);
    if (bad_out)
        *bad_out = bad;
    if (bad)
        return dt__error(first_st == DT_ERR_IO ? DT_ERR_IO : DT_ERR_CORRUPT, "%s", first);
    return DT_OK;
}

static dt_status read_whole(ck_reader *rd, int64_t ti, void *buf)
{
    const ck_tensor *t = &rd->ck->tensors[ti];
    int64_t zero[DT_MAX_RANK] = {0};
    for (int64_t s = 0; s < t->nslices; s++) {
        dt_status st = dt__ckpt_read_box(rd, ti, s, zero, t->shape, buf);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

static uint64_t tensor_bytes(const ck_tensor *t)
{
    return (uint64_t)dt__numel(t->rank, t->shape) * dt_dtype_size(t->dtype);
}

dt_status dt_ckpt_read_tensor(const dt_ckpt *ck, int64_t tensor, void *buf, size_t len)
{
    if (!ck || tensor < 0 || tensor >= ck->ntensors || (!buf && len))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_read_tensor: bad arguments");
    const ck_tensor *t = &ck->tensors[tensor];
    if (len < tensor_bytes(t))
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_ckpt_read_tensor: tensor '%s' needs %" PRIu64 " bytes, got %zu",
                         t->name, tensor_bytes(t), len);
    ck_reader rd;
    dt_status st = dt__ckpt_reader_init(&rd, ck);
    if (st != DT_OK)
        return st;
    st = read_whole(&rd, tensor, buf);
    dt__ckpt_reader_free(&rd);
    return st;
}

dt_status dt_ckpt_read_box(const dt_ckpt *ck, int64_t tensor, const int64_t *offsets,
                           const int64_t *sizes, void *buf, size_t len)
{
    if (!ck || tensor < 0 || tensor >= ck->ntensors)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_read_box: bad handle or tensor %lld",
                         (long long)tensor);
    const ck_tensor *t = &ck->tensors[tensor];
    if (t->rank > 0 && (!offsets || !sizes))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_read_box: tensor '%s': NULL offsets "
                         "or sizes", t->name);
    uint64_t numel = 1;
    for (int d = 0; d < t->rank; d++) {
        if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] > t->shape[d] ||
            sizes[d] > t->shape[d] - offsets[d]) {
            char sh[160] = "";
            for (int k = 0; k < t->rank; k++)
                snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%" PRId64, k ? "," : "",
                         t->shape[k]);
            return dt__error(DT_ERR_SHAPE, "dt_ckpt_read_box: tensor '%s' [%s]: dim %d: box "
                             "[%" PRId64 ", %" PRId64 " + %" PRId64 ") is outside the tensor",
                             t->name, sh, d, offsets[d], offsets[d], sizes[d]);
        }
        numel *= (uint64_t)sizes[d];   /* <= the tensor's numel <= 2^50 */
    }
    uint64_t bytes = numel * dt_dtype_size(t->dtype);
    if (len < bytes)
        return dt__error(DT_ERR_SHAPE, "dt_ckpt_read_box: tensor '%s': the box needs %" PRIu64
                         " bytes, the buffer has %zu", t->name, bytes, len);
    if (bytes == 0)
        return DT_OK;
    if (!buf)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_read_box: NULL buffer");
    ck_reader rd;
    dt_status st = dt__ckpt_reader_init(&rd, ck);
    if (st != DT_OK)
        return st;
    rd.reuse_checks = 1;
    int64_t zero[1] = {0}, first, end;
    dt__ckpt_slices_near(t, offsets, sizes, &first, &end);
    for (int64_t k = first; st == DT_OK && k < end; k++)
        st = dt__ckpt_read_box(&rd, tensor, t->order[k], t->rank ? offsets : zero,
                               t->rank ? sizes : zero, buf);
    dt__ckpt_reader_free(&rd);
    return st;
}

/* ---- export ---------------------------------------------------------------------------------- */

static json_t *dims_json(int rank, const int64_t *v)
{
    json_t *a = json_array();
    for (int d = 0; a && d < rank; d++)
        json_array_append_new(a, json_integer(v[d]));
    return a;
}

static json_t *values_metadata(const dt_ckpt *ck)
{
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    for (int64_t i = 0; meta && i < ck->nvalues; i++) {
        const ck_value *v = &ck->values[i];
        size_t klen = strlen(v->name) + 32;
        char *key = malloc(klen), *text = malloc(v->nbytes * 2 + 32);
        if (!key || !text) {
            free(key);
            free(text);
            json_decref(meta);
            return NULL;
        }
        snprintf(key, klen, "dtensor.value.%s", v->name);
        if (v->type == DT_CKPT_VALUE_I64)
            snprintf(text, 32, "%" PRId64, v->i64);
        else if (v->type == DT_CKPT_VALUE_F64)
            snprintf(text, 32, "%.17g", v->f64);
        else {
            for (size_t k = 0; k < v->nbytes; k++)
                snprintf(text + 2 * k, 3, "%02x", v->bytes[k]);
            text[2 * v->nbytes] = '\0';
        }
        json_object_set_new(meta, key, json_string(text));
        free(key);
        free(text);
    }
    return meta;
}

static int cmp_export(const void *pa, const void *pb, void *arg)
{
    const dt_ckpt *ck = arg;
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    size_t ea = dt_dtype_size(ck->tensors[a].dtype), eb = dt_dtype_size(ck->tensors[b].dtype);
    if (ea != eb)
        return ea > eb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Writes tensors order[0..n) into one safetensors file at path. */
static dt_status export_file(const dt_ckpt *ck, ck_reader *rd, const char *path,
                             int64_t *order, int64_t n, int with_values, int do_fsync)
{
    qsort_r(order, (size_t)n, sizeof *order, cmp_export, (void *)ck);
    json_t *root = json_object();
    json_t *meta = with_values ? values_metadata(ck) : json_object();
    if (meta && !with_values)
        json_object_set_new(meta, "format", json_string("pt"));
    int bad = !root || !meta;
    bad |= json_object_set_new(root, "__metadata__", meta);
    uint64_t at = 0;
    for (int64_t i = 0; !bad && i < n; i++) {
        const ck_tensor *t = &ck->tensors[order[i]];
        json_t *e = json_object(), *dof = json_array();
        bad |= !e || !dof;
        bad |= json_object_set_new(e, "dtype", json_string(dt__ckpt_dtype_str(t->dtype)));
        bad |= json_object_set_new(e, "shape", dims_json(t->rank, t->shape));
        bad |= json_array_append_new(dof, json_integer((json_int_t)at));
        at += tensor_bytes(t);
        bad |= json_array_append_new(dof, json_integer((json_int_t)at));
        bad |= json_object_set_new(e, "data_offsets", dof);
        bad |= json_object_set_new(root, t->name, e);
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text)
        return dt__error(DT_ERR_NO_MEMORY, "dt_ckpt_export: no memory for a header");
    size_t jlen = strlen(text), hlen = (jlen + 7) & ~(size_t)7;
    char *hdr = malloc(8 + hlen);
    if (!hdr) {
        free(text);
        return dt__error(DT_ERR_NO_MEMORY, "dt_ckpt_export: no memory for a header");
    }
    for (int b = 0; b < 8; b++)
        hdr[b] = (char)((uint64_t)hlen >> (8 * b));
    memcpy(hdr + 8, text, jlen);
    memset(hdr + 8 + jlen, ' ', hlen - jlen);
    free(text);
    dt_status st = DT_OK;
    void *buf = NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dt__ckpt_pwrite(fd, hdr, 8 + hlen, 0) != 0)
        goto io_err;
    uint64_t pos = 8 + hlen;
    for (int64_t i = 0; i < n; i++) {
        const ck_tensor *t = &ck->tensors[order[i]];
        uint64_t bytes = tensor_bytes(t);
        if (bytes == 0)
            continue;
        if (!(buf = malloc((size_t)bytes))) {
            st = dt__error(DT_ERR_NO_MEMORY, "dt_ckpt_export: no memory for tensor '%s'",
                           t->name);
            goto out;
        }
        if ((st = read_whole(rd, order[i], buf)) != DT_OK)
            goto out;
        if (dt__ckpt_pwrite(fd, buf, (size_t)bytes, pos) != 0)
            goto io_err;
        pos += bytes;
        free(buf);
        buf = NULL;
    }
    if (do_fsync && fsync(fd) != 0)
        goto io_err;
    if (close(fd) != 0) {
        fd = -1;
        goto io_err;
    }
    fd = -1;
    goto out;
io_err:
    st = dt__error(DT_ERR_IO, "dt_ckpt_export: %s: %s", path, strerror(errno));
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    free(hdr);
    return st;
}

static void out_name(char *buf, size_t len, int64_t f, int64_t nfiles)
{
    if (nfiles == 1)
        snprintf(buf, len, "model.safetensors");
    else
        snprintf(buf, len, "model-%05lld-of-%05lld.safetensors", (long long)f + 1,
                 (long long)nfiles);
}

/* Where output file `name` is written (partial) and published (final): inside out_dir, or
 * out_dir itself for a one-file target ("x.safetensors"). */
static dt_status out_paths(const char *out_dir, int one_file, const char *name, char *partial,
                           char *final, size_t len)
{
    if (one_file) {
        dt_status st = dt__ckpt_join(partial, len, out_dir, "", ".partial");
        return st == DT_OK ? dt__ckpt_join(final, len, out_dir, "", "") : st;
    }
    char tmp[96];
    snprintf(tmp, sizeof tmp, ".%s.partial", name);
    dt_status st = dt__ckpt_join(partial, len, out_dir, "/", tmp);
    return st == DT_OK ? dt__ckpt_join(final, len, out_dir, "/", name) : st;
}

static dt_status partial_path(char *buf, size_t len, const char *dir, const char *name)
{
    char tmp[96];
    snprintf(tmp, sizeof tmp, ".%s.partial", name);
    return dt__ckpt_join(buf, len, dir, "/", tmp);
}

dt_status dt__ckpt_export_target(const char *fn, const char *out, int one_file)
{
    char parent[CK_PATH_MAX];
    struct stat sb;
    dt__strlcpy(parent, out, sizeof parent);
    char *slash = strrchr(parent, '/');
    if (one_file && !slash)
        dt__strlcpy(parent, ".", sizeof parent);
    else if (one_file)
        slash[slash == parent] = '\0';   /* "/x.safetensors": the parent is "/" */
    if (one_file && stat(out, &sb) == 0 && S_ISDIR(sb.st_mode))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s is a directory; a .safetensors "
                         "target is one file (remove it, or export to another name)", fn, out);
    if (dt__ckpt_is_checkpoint_place(parent))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s is a checkpoint directory or a "
                         "checkpoint manager's root; exporting into it would mix files into "
                         "it: export somewhere else", fn, parent);
    return DT_OK;
}

dt_status dt_ckpt_export(const dt_ckpt *ck, const char *out_dir, const dt_ckpt_export_opts *opts,
                         int *files_out)
{
    if (!ck || !out_dir || !out_dir[0])
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_export: NULL checkpoint or output");
    dt_ckpt_export_opts o = DT_CKPT_EXPORT_OPTS_INIT;
    if (opts)
        o = *opts;
    size_t ol = strlen(out_dir), sl = strlen(".safetensors");
    int one_file = ol > sl && strcmp(out_dir + ol - sl, ".safetensors") == 0;
    dt_status st = dt__ckpt_export_target("dt_ckpt_export", out_dir, one_file);
    if (st != DT_OK)
        return st;
    if (!one_file && mkdir(out_dir, 0755) != 0 && errno != EEXIST)
        return dt__error(DT_ERR_IO, "dt_ckpt_export: mkdir %s: %s", out_dir, strerror(errno));
    /* Group tensors into files in index order; never split a tensor. */
    int64_t n = ck->ntensors, nfiles = 1;
    int64_t *file_of = calloc((size_t)n + 1, sizeof *file_of);
    int64_t *order = calloc((size_t)n + 1, sizeof *order);
    if (!file_of || !order) {
        free(file_of);
        free(order);
        return dt__error(DT_ERR_NO_MEMORY, "dt_ckpt_export: no memory");
    }
    uint64_t used = 0, total = 0;
    for (int64_t t = 0; t < n; t++) {
        uint64_t b = tensor_bytes(&ck->tensors[t]);
        if (o.max_file_bytes && used > 0 && used + b > o.max_file_bytes) {
            nfiles++;
            used = 0;
        }
        used += b;
        total += b;
        file_of[t] = nfiles - 1;
    }
    if (one_file && nfiles > 1) {
        free(file_of);
        free(order);
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_ckpt_export: %s names one file, but "
                         "max_file_bytes %" PRIu64 " splits the tensors into %" PRId64
                         " files: give a directory", out_dir, o.max_file_bytes, nfiles);
    }
    ck_reader rd;
    st = dt__ckpt_reader_init(&rd, ck);
    json_t *wmap = json_object();
    char name[64], path[CK_PATH_MAX];
    if (!wmap && st == DT_OK)
        st = dt__error(DT_ERR_NO_MEMORY, "dt_ckpt_export: no memory");
    int64_t written = 0;
    for (int64_t f = 0; st == DT_OK && f < nfiles; f++) {
        out_name(name, sizeof name, f, nfiles);
        char final[CK_PATH_MAX];
        if ((st = out_paths(out_dir, one_file, name, path, final, sizeof path)) != DT_OK)
            break;
        written = f + 1;
        int64_t k = 0;
        for (int64_t t = 0; t < n; t++)
            if (file_of[t] == f) {
                order[k++] = t;
                json_object_set_new(wmap, ck->tensors[t].name, json_string(name));
            }
        st = export_file(ck, &rd, path, order, k, f == 0, o.fsync);
    }
    if (rd.fds)
        dt__ckpt_reader_free(&rd);
    /* Publish only complete output: every file was written under a partial name. */
    for (int64_t f = 0; f < written; f++) {
        char final[CK_PATH_MAX];
        out_name(name, sizeof name, f, nfiles);
        if (out_paths(out_dir, one_file, name, path, final, sizeof path) != DT_OK)
            continue;
        if (st != DT_OK)
            unlink(path);
        else if (rename(path, final) != 0)
            st = dt__error(DT_ERR_IO, "dt_ckpt_export: rename %s: %s", path, strerror(errno));
    }
    if (st == DT_OK && nfiles > 1) {
        json_t *root = json_object(), *meta = json_object();
        json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
        json_object_set_new(root, "metadata", meta);
        json_object_set(root, "weight_map", wmap);
        char final[CK_PATH_MAX];
        if ((st = partial_path(path, sizeof path, out_dir, "model.safetensors.index.json")) ==
                DT_OK &&
            (st = dt__ckpt_join(final, sizeof final, out_dir, "/",
                                "model.safetensors.index.json")) == DT_OK &&
            (json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0 ||
             rename(path, final) != 0)) {
            unlink(path);
            st = dt__error(DT_ERR_IO, "dt_ckpt_export: cannot write %s", final);
        }
        json_decref(root);
    }
    json_decref(wmap);
    free(file_of);
    free(order);
    if (st == DT_OK && files_out)
        *files_out = (int)nfiles;
    return st;
}
