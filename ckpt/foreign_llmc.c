/* llm.c's GPT-2 checkpoint (train_gpt2.c's gpt2_build_from_checkpoint): an int32[256] header,
 * then the 16 parameter arrays back to back; each layer's part of a grouped array becomes one
 * named virtual tensor ("h.{l}.qkvw", ...), so views and the GPT-2 mapping treat it as any
 * other source. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"

/* The 16 arrays in file order: name, per layer or not, and rank-2 sizes in units of C. */
typedef struct llmc_param {
    const char *name;
    int per_layer;
    int rank;
    int rows, cols;               /* row/col kinds: 0 = 1, 1 = C, 3 = 3C, 4 = 4C, -1 = Vp, -2 = maxT */
} llmc_param;

static const llmc_param params[16] = {
    {"wte", 0, 2, -1, 1},       {"wpe", 0, 2, -2, 1},      {"ln1w", 1, 1, 1, 0},
    {"ln1b", 1, 1, 1, 0},       {"qkvw", 1, 2, 3, 1},      {"qkvb", 1, 1, 3, 0},
    {"attprojw", 1, 2, 1, 1},   {"attprojb", 1, 1, 1, 0},  {"ln2w", 1, 1, 1, 0},
    {"ln2b", 1, 1, 1, 0},       {"fcw", 1, 2, 4, 1},       {"fcb", 1, 1, 4, 0},
    {"fcprojw", 1, 2, 1, 4},    {"fcprojb", 1, 1, 1, 0},   {"lnfw", 0, 1, 1, 0},
    {"lnfb", 0, 1, 1, 0},
};

static int64_t extent(int kind, int64_t C, int64_t Vp, int64_t maxT)
{
    return kind == -1 ? Vp : kind == -2 ? maxT : kind == 0 ? 1 : kind * C;
}

dt_status dt__foreign_parse_llmc(dt_foreign *src, int64_t f, int fd)
{
    const char *file = src->files[f].path;
    uint64_t size = src->files[f].size;
    unsigned char hb[DT_FOREIGN_LLMC_HEADER_INTS * 4];
    if (size < sizeof hb || dt__ckpt_pread(fd, hb, sizeof hb, 0) != (int64_t)sizeof hb)
        return dt__error(DT_ERR_CORRUPT, "%s: shorter than llm.c's 1024-byte header (%" PRIu64
                         " bytes)", file, size);
    int32_t h[8];
    for (int i = 0; i < 8; i++)
        h[i] = (int32_t)((uint32_t)hb[4 * i] | (uint32_t)hb[4 * i + 1] << 8 |
                         (uint32_t)hb[4 * i + 2] << 16 | (uint32_t)hb[4 * i + 3] << 24);
    if (h[1] != 3 && h[1] != 5)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: llm.c checkpoint version %d (3: f32 and 5: "
                         "bf16 are supported)", file, h[1]);
    static const char *const what[8] = {"magic", "version", "maxT", "V", "L", "NH", "C", "Vp"};
    for (int i = 2; i < 8; i++)
        if (h[i] <= 0)
            return dt__error(DT_ERR_CORRUPT, "%s: llm.c header: %s = %d", file, what[i], h[i]);
    if (h[3] > h[7] || h[6] % h[5] != 0)
        return dt__error(DT_ERR_CORRUPT, "%s: llm.c header: V %d > Vp %d, or C %d not a "
                         "multiple of NH %d", file, h[3], h[7], h[6], h[5]);
    memcpy(src->llmc, h, sizeof src->llmc);
    dt_dtype dtype = h[1] == 3 ? DT_DTYPE_F32 : DT_DTYPE_BF16;
    uint64_t es = dt_dtype_size(dtype);
    int64_t maxT = h[2], L = h[4], C = h[6], Vp = h[7];
    /* The whole size first (each factor < 2^31, the sums fit): the file must hold exactly
     * that, before any per-layer tensor is made. */
    uint64_t total = 0;
    for (int p = 0; p < 16; p++) {
        uint64_t e = (uint64_t)extent(params[p].rows, C, Vp, maxT) *
                     (uint64_t)(params[p].rank == 2 ? extent(params[p].cols, C, Vp, maxT) : 1);
        if (params[p].per_layer)
            e *= (uint64_t)L;
        total += e;
        if (total > ((uint64_t)1 << 60))
            break;
    }
    if (total > ((uint64_t)1 << 60) || sizeof hb + total * es != size)
        return dt__error(DT_ERR_CORRUPT, "%s: llm.c header says %" PRIu64 " parameters (%"
                         PRIu64 " bytes with the header), the file has %" PRIu64 " bytes%s",
                         file, total, (uint64_t)sizeof hb + total * es, size,
                         sizeof hb + total * es > size ? " (truncated)" : "");
    uint64_t at = sizeof hb;
    for (int p = 0; p < 16; p++) {
        int64_t shape[2] = {extent(params[p].rows, C, Vp, maxT),
                            params[p].rank == 2 ? extent(params[p].cols, C, Vp, maxT) : 1};
        uint64_t bytes = (uint64_t)shape[0] * (uint64_t)shape[1] * es;
        for (int64_t l = 0; l < (params[p].per_layer ? L : 1); l++) {
            char name[64];
            if (params[p].per_layer)
                snprintf(name, sizeof name, "h.%" PRId64 ".%s", l, params[p].name);
            else
                snprintf(name, sizeof name, "%s", params[p].name);
            dt_status st = dt__foreign_add(src, name, dtype, params[p].rank, shape, f, at, bytes);
            if (st != DT_OK)
                return st;
            at += bytes;
        }
    }
    return DT_OK;
}
