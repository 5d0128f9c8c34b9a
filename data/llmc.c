/* The llm.c token-shard reader: a 256-int32 header (magic 20240520, version 1, the token count
 * at index 2) then uint16 tokens; example i is the T+1 tokens from token i*T, split into the
 * inputs (the first T) and the targets (the last T), both as int32. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_impl.h"
#include "runtime/error.h"

enum { LLMC_HEADER_INTS = 256, LLMC_MAGIC = 20240520, LLMC_VERSION = 1 };

/* Most tokens one pread brings into the scratch buffer. */
enum { SCRATCH_TOKENS = 1 << 19 };

typedef struct llmc_impl {
    char *path;
    int fd;
    int64_t context; /* T */
    int64_t ntok;
} llmc_impl;

static void llmc_release(void *p)
{
    llmc_impl *r = p;
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    free(r->path);
    free(r);
}

static uint16_t le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static int32_t le32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                     ((uint32_t)p[3] << 24));
}

/* Reads examples idx[j..j+len) (consecutive) into the outputs at row j. */
static dt_status llmc_read_run(const llmc_impl *r, int64_t first, int64_t len, int64_t j,
                               unsigned char *scratch, void *const *dst)
{
    const int64_t T = r->context;
    size_t ntok = (size_t)(len * T + 1);
    char what[64];
    snprintf(what, sizeof what, "examples %lld..%lld", (long long)first,
             (long long)(first + len - 1));
    dt_status st = dd_pread_all(r->fd, scratch, ntok * 2,
                                (uint64_t)LLMC_HEADER_INTS * 4 + (uint64_t)(first * T) * 2,
                                r->path, what);
    if (st != DT_OK)
        return st;
    int32_t *in = dst[0] ? (int32_t *)dst[0] + j * T : NULL;
    int32_t *tg = dst[1] ? (int32_t *)dst[1] + j * T : NULL;
    for (int64_t e = 0; e < len; e++) {
        const unsigned char *tok = scratch + (size_t)(e * T) * 2;
        for (int64_t t = 0; t < T; t++) {
            if (in)
                in[e * T + t] = le16(tok + 2 * t);
            if (tg)
                tg[e * T + t] = le16(tok + 2 * (t + 1));
        }
    }
    return DT_OK;
}

static dt_status llmc_read(dt_data_source *s, const int64_t *idx, int64_t count,
                           void *const *dst)
{
    const llmc_impl *r = s->impl;
    int64_t per = SCRATCH_TOKENS / r->context;
    if (per < 1)
        per = 1;
    unsigned char *scratch = malloc((size_t)(per * r->context + 1) * 2);
    if (!scratch)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory for reading", r->path);
    dt_status st = DT_OK;
    for (int64_t j = 0; j < count && st == DT_OK;) {
        int64_t len = 1;
        while (j + len < count && len < per && idx[j + len] == idx[j] + len)
            len++;
        st = llmc_read_run(r, idx[j], len, j, scratch, dst);
        j += len;
    }
    free(scratch);
    return st;
}

static const dd_source_ops llmc_ops = {llmc_read, llmc_release};

/* Opens path and checks its header against its size; fills r->fd and r->ntok. */
static dt_status llmc_open(llmc_impl *r, const char *path)
{
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (r->fd < 0 || fstat(r->fd, &sb) != 0)
        return dt__error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char head[LLMC_HEADER_INTS * 4];
    if ((uint64_t)sb.st_size < sizeof head)
        return dt__error(DT_ERR_CORRUPT,
                         "%s: %lld bytes, shorter than the llm.c token header (%zu bytes)",
                         path, (long long)sb.st_size, sizeof head);
    dt_status st = dd_pread_all(r->fd, head, sizeof head, 0, path, "the header");
    if (st != DT_OK)
        return st;
    int32_t magic = le32(head), version = le32(head + 4), ntok = le32(head + 8);
    if (magic != LLMC_MAGIC)
        return dt__error(DT_ERR_CORRUPT,
                         "%s: magic %d, not an llm.c token file (magic %d)", path, (int)magic,
                         LLMC_MAGIC);
    if (version != LLMC_VERSION)
        return dt__error(DT_ERR_CORRUPT, "%s: token file version %d (only %d is read)", path,
                         (int)version, LLMC_VERSION);
    uint64_t want = sizeof head + 2 * (uint64_t)(ntok < 0 ? 0 : ntok);
    if (ntok <= 0 || (uint64_t)sb.st_size != want)
        return dt__error(DT_ERR_CORRUPT,
                         "%s: the header says %d tokens (%llu bytes with the header), the file "
                         "has %lld bytes", path, (int)ntok, (unsigned long long)want,
                         (long long)sb.st_size);
    r->ntok = ntok;
    return DT_OK;
}

dt_status dt_data_source_llmc(const char *path, int64_t context, dt_data_source **source_out)
{
    static const char fn[] = "dt_data_source_llmc";
    if (!path || !source_out || context < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL path or source_out, or context %lld",
                         fn, (long long)context);
    llmc_impl *r = calloc(1, sizeof *r);
    if (!r)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    r->fd = -1;
    r->context = context;
    dt_status st = DT_OK;
    r->path = strdup(path);
    if (!r->path) {
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
        goto err;
    }
    st = llmc_open(r, path);
    if (st != DT_OK)
        goto err;
    if (r->ntok < context + 1) {
        st = dt__error(DT_ERR_INVALID_ARGUMENT,
                       "%s: %lld tokens, fewer than one example of context %lld needs (%lld)",
                       path, (long long)r->ntok, (long long)context, (long long)context + 1);
        goto err;
    }
    dt_data_field f[2] = {{DT_DTYPE_I32, 1, {context}}, {DT_DTYPE_I32, 1, {context}}};
    st = dd_source_new(fn, (r->ntok - 1) / context, 2, f, &llmc_ops, r, source_out);
    if (st != DT_OK)
        goto err;
    return DT_OK;

err:
    llmc_release(r);
    return st;
}

dt_status dt_data_llmc_tokens(const char *path, int64_t *ntokens_out)
{
    if (!path || !ntokens_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_data_llmc_tokens: NULL argument");
    llmc_impl r = {NULL, -1, 1, 0};
    dt_status st = llmc_open(&r, path);
    if (r.fd >= 0)
        close(r.fd);
    if (st == DT_OK)
        *ntokens_out = r.ntok;
    return st;
}
