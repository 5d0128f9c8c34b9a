/* The verifying reader: opens data files (size, header CRC, header agreeing with the index)
 * and copies the part of a saved slice that a box needs, reading only the chunks that hold it
 * and checking each chunk's CRC32C; whole chunks inside a contiguous run go straight into the
 * destination. */
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

dt_status dt__ckpt_reader_init(ck_reader *rd, const dt_ckpt *ck)
{
    memset(rd, 0, sizeof *rd);
    rd->ck = ck;
    rd->fds = malloc((size_t)(ck->nfiles + 1) * sizeof *rd->fds);
    if (!rd->fds)
        return dt__error(DT_ERR_NO_MEMORY, "no memory for a checkpoint reader");
    for (int64_t f = 0; f < ck->nfiles; f++)
        rd->fds[f] = -1;
    rd->bounce_file = -1;
    return DT_OK;
}

void dt__ckpt_reader_free(ck_reader *rd)
{
    for (int64_t f = 0; rd->fds && f < rd->ck->nfiles; f++)
        if (rd->fds[f] >= 0)
            close(rd->fds[f]);
    free(rd->fds);
    free(rd->bounce);
    memset(rd, 0, sizeof *rd);
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static dt_status corrupt(const ck_reader *rd, int64_t f, const char *tensor, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt__error(DT_ERR_CORRUPT, "%s/%s: tensor '%s': %s", rd->ck->path,
                     rd->ck->files[f].name, tensor, msg);
}

static int dims_equal(const json_t *a, int rank, const int64_t *v)
{
    if (!json_is_array(a) || (int)json_array_size(a) != rank)
        return 0;
    for (int d = 0; d < rank; d++) {
        json_t *x = json_array_get(a, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) != v[d])
            return 0;
    }
    return 1;
}

/* The safetensors header of file f agrees with the index: same keys, dtypes, shapes, data
 * offsets and DCP saved_offsets. */
static dt_status check_header(const ck_reader *rd, int64_t f, const char *tensor,
                              const char *json, size_t len)
{
    const dt_ckpt *ck = rd->ck;
    const ck_file *cf = &ck->files[f];
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr), *info = NULL;
    dt_status st = DT_OK;
    if (!json_is_object(root)) {
        st = corrupt(rd, f, tensor, "safetensors header is not JSON (%s)", jerr.text);
        goto out;
    }
    json_t *meta = json_object_get(root, "__metadata__");
    const char *itext = json_string_value(json_object_get(meta, "DCP_SHARDING_INFO"));
    info = itext ? json_loads(itext, 0, &jerr) : NULL;
    if (!json_is_object(info)) {
        st = corrupt(rd, f, tensor, "no DCP_SHARDING_INFO in the header's __metadata__");
        goto out;
    }
    if ((int64_t)json_object_size(root) != cf->nslices + 1) {
        st = corrupt(rd, f, tensor, "header holds %zu tensors, the index %" PRId64,
                     json_object_size(root) - 1, cf->nslices);
        goto out;
    }
    for (int64_t i = 0; i < cf->nslices; i++) {
        const ck_tensor *t = &ck->tensors[cf->slice_tensor[i]];
        const ck_slice *s = &t->slices[cf->slice_index[i]];
        const char *key = s->key ? s->key : t->name;
        json_t *e = json_object_get(root, key);
        json_t *dof = json_object_get(e, "data_offsets");
        int64_t se[2] = {(int64_t)s->begin, (int64_t)(s->begin + s->bytes)};
        const char *dt = json_string_value(json_object_get(e, "dtype"));
        json_t *sinfo = json_object_get(info, key);
        json_t *so = json_object_get(sinfo, "saved_offsets");
        const char *owner = json_string_value(json_object_get(sinfo, "tensor"));
        const char *field = !json_is_object(e) ? "the entry"
                            : !dt || strcmp(dt, dt__ckpt_dtype_str(t->dtype)) != 0 ? "dtype"
                            : !dims_equal(json_object_get(e, "shape"), t->rank, s->size) ? "shape"
                            : !dims_equal(dof, 2, se) ? "data_offsets"
                            : !dims_equal(so, t->rank, s->off) ? "saved_offsets"
                            : s->key && (!owner || strcmp(owner, t->name) != 0) ? "tensor"
                            : NULL;
        if (field) {
            st = corrupt(rd, f, t->name, "the file's header and the index disagree on key "
                         "'%s': field '%s'", key, field);
            goto out;
        }
    }
out:
    json_decref(info);
    json_decref(root);
    return st;
}

dt_status dt__ckpt_reader_file(ck_reader *rd, int64_t f, const char *tensor, int *fd_out)
{
    if (rd->fds[f] >= 0) {
        *fd_out = rd->fds[f];
        return DT_OK;
    }
    const ck_file *cf = &rd->ck->files[f];
    char path[CK_PATH_MAX];
    dt_status st = dt__ckpt_join(path, sizeof path, rd->ck->path, "/", cf->name);
    if (st != DT_OK)
        return st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return corrupt(rd, f, tensor, "file missing");
        return dt__error(DT_ERR_IO, "%s: tensor '%s': open: %s", path, tensor, strerror(errno));
    }
    struct stat sb;
    char *hdr = NULL;
    if (fstat(fd, &sb) != 0) {
        st = dt__error(DT_ERR_IO, "%s: tensor '%s': stat: %s", path, tensor, strerror(errno));
        goto err;
    }
    if ((uint64_t)sb.st_size != cf->bytes) {
        st = corrupt(rd, f, tensor, "file is %lld bytes, the index says %" PRIu64 " (field "
                     "'bytes')%s", (long long)sb.st_size, cf->bytes,
                     (uint64_t)sb.st_size < cf->bytes ? " (truncated)" : "");
        goto err;
    }
    /* Header already checked through this handle (dt_ckpt_read_box, called per box). */
    if (rd->reuse_checks && __atomic_load_n(&cf->header_ok, __ATOMIC_ACQUIRE)) {
        rd->fds[f] = fd;
        *fd_out = fd;
        return DT_OK;
    }
    hdr = malloc((size_t)cf->header_bytes);
    if (!hdr) {
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory for the header", path);
        goto err;
    }
    int64_t got = dt__ckpt_pread(fd, hdr, (size_t)cf->header_bytes, 0);
    if (got < 0) {
        st = dt__error(DT_ERR_IO, "%s: tensor '%s': read: %s", path, tensor, strerror(errno));
        goto err;
    }
    if ((uint64_t)got != cf->header_bytes) {
        st = corrupt(rd, f, tensor, "file truncated inside its header");
        goto err;
    }
    uint64_t hlen = 0;
    for (int b = 7; b >= 0; b--)
        hlen = hlen << 8 | (unsigned char)hdr[b];
    if (hlen != cf->header_bytes - 8) {
        st = corrupt(rd, f, tensor, "header length %" PRIu64 " != %" PRIu64 " (field "
                     "'header_bytes')", hlen, cf->header_bytes - 8);
        goto err;
    }
    /* An altered header names the entry and field that disagree with the index when one
     * does; the CRC catches the rest (__metadata__, padding, layout of the text). */
    if ((st = check_header(rd, f, tensor, hdr + 8, (size_t)hlen)) != DT_OK)
        goto err;
    if (dt_crc32c(0, hdr, (size_t)cf->header_bytes) != cf->header_crc) {
        st = corrupt(rd, f, tensor, "safetensors header CRC32C mismatch (field "
                     "'header_crc32c'; header altered)");
        goto err;
    }
    /* The handle is logically const; the flag only caches a check (written once, atomic). */
    __atomic_store_n(&((ck_file *)cf)->header_ok, 1, __ATOMIC_RELEASE);
    free(hdr);
    rd->fds[f] = fd;
    *fd_out = fd;
    return DT_OK;
err:
    free(hdr);
    close(fd);
    return st;
}

/* A chunk's CRC mismatch, naming the bytes and the slice. */
static dt_status crc_mismatch(const ck_reader *rd, const ck_tensor *t, const ck_slice *s,
                              uint64_t cs, uint64_t ce)
{
    char box[160] = "";
    for (int d = 0; d < t->rank; d++)
        snprintf(box + strlen(box), sizeof box - strlen(box), "%s%" PRId64, d ? "," : "",
                 s->off[d]);
    return corrupt(rd, s->file, t->name,
                   "CRC32C mismatch in bytes [%" PRIu64 ", %" PRIu64 ") of the slice at "
                   "offsets [%s] (field 'chunk_crc32c'; data altered)", cs, ce, box);
}

/* Bytes per pread: small enough that the CRC reads them back from the core's cache. */
enum { READ_PIECE = 256 << 10 };

/* Reads `len` bytes of slice s at slice offset `at` into dst and checks the CRCs of the chunks
 * they cover exactly (at and at + len are chunk boundaries, or the slice's end): piece by
 * piece, each CRC'd right after it lands, while it is still in the core's cache. */
static dt_status read_checked(ck_reader *rd, int fd, const ck_tensor *t, const ck_slice *s,
                              uint64_t at, uint64_t len, void *dst)
{
    uint64_t C = rd->ck->chunk_bytes, pos = at, end = at + len;
    int64_t c = (int64_t)(at / C);
    uint32_t crc = 0;
    while (pos < end) {
        uint64_t ce = (uint64_t)(c + 1) * C < s->bytes ? (uint64_t)(c + 1) * C : s->bytes;
        uint64_t n = ce - pos < READ_PIECE ? ce - pos : READ_PIECE;
        char *p = (char *)dst + (pos - at);
        int64_t got = dt__ckpt_pread(fd, p, (size_t)n, s->file_offset + pos);
        if (got < 0)
            return dt__error(DT_ERR_IO, "%s/%s: tensor '%s': read: %s", rd->ck->path,
                             rd->ck->files[s->file].name, t->name, strerror(errno));
        if ((uint64_t)got != n)
            return corrupt(rd, s->file, t->name, "file truncated (short read at %" PRIu64 ")",
                           s->file_offset + pos + (uint64_t)got);
        crc = dt_crc32c(crc, p, (size_t)n);
        pos += n;
        if (pos == ce) {
            if (crc != s->chunk_crc[c])
                return crc_mismatch(rd, t, s, (uint64_t)c * C, ce);
            crc = 0;
            c++;
        }
    }
    return DT_OK;
}

/* Grows the bounce buffer to `len` bytes (at most one chunk); allocated on first use, so
 * reading small slices never costs a whole chunk of memory. */
static dt_status bounce_room(ck_reader *rd, uint64_t len)
{
    if (len <= rd->bounce_cap)
        return DT_OK;
    unsigned char *b = realloc(rd->bounce, (size_t)len);
    if (!b)
        return dt__error(DT_ERR_NO_MEMORY, "no memory for a checkpoint chunk of %llu bytes",
                         (unsigned long long)len);
    rd->bounce = b;
    rd->bounce_cap = len;
    return DT_OK;
}

/* Makes chunk c of slice (t, s) the bounce buffer's content. */
static dt_status load_bounce(ck_reader *rd, int fd, int64_t ti, int64_t si, int64_t c)
{
    const ck_tensor *t = &rd->ck->tensors[ti];
    const ck_slice *s = &t->slices[si];
    if (rd->bounce_file == s->file && rd->bounce_slice_tensor == ti && rd->bounce_slice == si &&
        rd->bounce_chunk == c)
        return DT_OK;
    rd->bounce_file = -1;
    uint64_t C = rd->ck->chunk_bytes, cs = (uint64_t)c * C;
    uint64_t ce = cs + C < s->bytes ? cs + C : s->bytes;
    dt_status st = bounce_room(rd, ce - cs);
    if (st == DT_OK)
        st = read_checked(rd, fd, t, s, cs, ce - cs, rd->bounce);
    if (st != DT_OK)
        return st;
    rd->bounce_file = s->file;
    rd->bounce_slice_tensor = ti;
    rd->bounce_slice = si;
    rd->bounce_chunk = c;
    return DT_OK;
}

/* Copies slice bytes [a, a+len) into dst. */
static dt_status copy_run(ck_reader *rd, int fd, int64_t ti, int64_t si, uint64_t a,
                          uint64_t len, char *dst)
{
    const ck_tensor *t = &rd->ck->tensors[ti];
    const ck_slice *s = &t->slices[si];
    uint64_t C = rd->ck->chunk_bytes, end = a + len;
    dt_status st;
    uint64_t pos = a;
    while (pos < end) {
        int64_t c = (int64_t)(pos / C);
        uint64_t cs = (uint64_t)c * C, ce = cs + C < s->bytes ? cs + C : s->bytes;
        if (cs == pos && ce <= end) {
            /* Whole chunks inside the run: read straight into the destination. */
            int64_t c1 = c;
            while (c1 + 1 < s->nchunks) {
                uint64_t ne = (uint64_t)(c1 + 2) * C < s->bytes ? (uint64_t)(c1 + 2) * C : s->bytes;
                if (ne > end || ne - cs > ((uint64_t)1 << 30))
                    break;
                c1++;
                ce = ne;
            }
            if ((st = read_checked(rd, fd, t, s, cs, ce - cs, dst + (cs - a))) != DT_OK)
                return st;
            pos = ce;
            continue;
        }
        if ((st = load_bounce(rd, fd, ti, si, c)) != DT_OK)
            return st;
        uint64_t stop = ce < end ? ce : end;
        memcpy(dst + (pos - a), rd->bounce + (pos - cs), (size_t)(stop - pos));
        pos = stop;
    }
    return DT_OK;
}

dt_status dt__ckpt_read_box(ck_reader *rd, int64_t ti, int64_t si, const int64_t *doff,
                            const int64_t *dsize, void *dst)
{
    const ck_tensor *t = &rd->ck->tensors[ti];
    const ck_slice *s = &t->slices[si];
    int rank = t->rank;
    int64_t lo[DT_MAX_RANK], n[DT_MAX_RANK];
    for (int d = 0; d < rank; d++) {
        lo[d] = s->off[d] > doff[d] ? s->off[d] : doff[d];
        int64_t hi = s->off[d] + s->size[d] < doff[d] + dsize[d] ? s->off[d] + s->size[d]
                                                                 : doff[d] + dsize[d];
        if (hi <= lo[d])
            return DT_OK;
        n[d] = hi - lo[d];
    }
    int fd;
    dt_status st = dt__ckpt_reader_file(rd, s->file, t->name, &fd);
    if (st != DT_OK)
        return st;
    uint64_t elem = dt_dtype_size(t->dtype);
    /* Byte strides of the slice and of the destination. */
    uint64_t ss[DT_MAX_RANK], ds[DT_MAX_RANK];
    for (int d = rank - 1; d >= 0; d--) {
        ss[d] = d == rank - 1 ? elem : ss[d + 1] * (uint64_t)s->size[d + 1];
        ds[d] = d == rank - 1 ? elem : ds[d + 1] * (uint64_t)dsize[d + 1];
    }
    /* Inner dims covered fully in both arrays merge into one contiguous run. */
    int j = rank - 1;
    uint64_t run = elem;
    if (rank > 0) {
        run = elem * (uint64_t)n[j];
        while (j > 0 && n[j] == s->size[j] && n[j] == dsize[j]) {
            j--;
            run *= (uint64_t)n[j];
        }
    }
    int64_t idx[DT_MAX_RANK] = {0};
    for (;;) {
        uint64_t so = 0, dof = 0;
        for (int d = 0; d < rank; d++) {
            int64_t k = lo[d] + (d < j ? idx[d] : 0);
            so += (uint64_t)(k - s->off[d]) * ss[d];
            dof += (uint64_t)(k - doff[d]) * ds[d];
        }
        if ((st = copy_run(rd, fd, ti, si, so, run, (char *)dst + dof)) != DT_OK)
            return st;
        int d = j - 1;
        while (d >= 0 && ++idx[d] == n[d])
            idx[d--] = 0;
        if (d < 0)
            break;
    }
    return DT_OK;
}

dt_status dt__ckpt_check_slice(ck_reader *rd, int64_t ti, int64_t si)
{
    const ck_tensor *t = &rd->ck->tensors[ti];
    const ck_slice *s = &t->slices[si];
    int fd;
    dt_status st = dt__ckpt_reader_file(rd, s->file, t->name, &fd);
    if (st != DT_OK)
        return st;
    uint64_t C = rd->ck->chunk_bytes;
    for (int64_t c = 0; c < s->nchunks; c++) {
        uint64_t cs = (uint64_t)c * C, ce = cs + C < s->bytes ? cs + C : s->bytes;
        rd->bounce_file = -1;
        if ((st = bounce_room(rd, ce - cs)) != DT_OK ||
            (st = read_checked(rd, fd, t, s, cs, ce - cs, rd->bounce)) != DT_OK)
            return st;
    }
    return DT_OK;
}
