/* See rl_plan_cmp.h. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "rl_plan_cmp.h"

static void report(int64_t *bad, const char *what, const char *field, long long a, long long b)
{
    if ((*bad)++ < 5)
        fprintf(stderr, "  plan mismatch (%s): %s %lld, reference %lld\n", what, field, a, b);
}

#define SAME(field, a, b)                                                                   \
    do {                                                                                    \
        if ((a) != (b))                                                                     \
            report(&bad, what, field, (long long)(a), (long long)(b));                      \
    } while (0)

/* An integer member (4 or 8 bytes) of a piece or a stats entry, compared by name. */
typedef struct field {
    const char *name;
    size_t off, size;
} field;

#define FIELD(type, member, name) {name, offsetof(type, member), sizeof(((type *)0)->member)}

static const field piece_fields[] = {
    FIELD(rl_piece, src_pos, "src_pos"),       FIELD(rl_piece, dst_pos, "dst_pos"),
    FIELD(rl_piece, src_client, "src_client"), FIELD(rl_piece, dst_client, "dst_client"),
    FIELD(rl_piece, src_local, "src_local"),   FIELD(rl_piece, dst_local, "dst_local"),
    FIELD(rl_piece, summand, "summand"),       FIELD(rl_piece, bytes, "bytes"),
};

static const field stats_fields[] = {
    FIELD(dt_relayout_stats, device_id, "stats device"),
    FIELD(dt_relayout_stats, device_type, "stats type"),
    FIELD(dt_relayout_stats, bytes_sent, "bytes sent"),
    FIELD(dt_relayout_stats, bytes_received, "bytes received"),
    FIELD(dt_relayout_stats, bytes_sent_remote, "bytes sent remote"),
    FIELD(dt_relayout_stats, bytes_received_remote, "bytes received remote"),
    FIELD(dt_relayout_stats, bytes_self, "bytes self"),
    FIELD(dt_relayout_stats, bytes_sent_cross_host, "bytes sent across hosts"),
    FIELD(dt_relayout_stats, bytes_received_cross_host, "bytes received across hosts"),
};

static long long field_value(const void *rec, const field *f)
{
    const char *p = (const char *)rec + f->off;
    if (f->size == 4) {
        int32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Reports each of the n fields in which a and b differ. */
static void same_fields(const void *a, const void *b, const field *f, size_t n, const char *what,
                        int64_t *bad)
{
    for (size_t i = 0; i < n; i++) {
        long long x = field_value(a, &f[i]), y = field_value(b, &f[i]);
        if (x != y)
            report(bad, what, f[i].name, x, y);
    }
}

int64_t rl_plan_compare(const dt_layout *src, const dt_layout *dst, int rank,
                        const int64_t *shape, dt_dtype dtype, const dt__rl_sim *sim,
                        const char *what, uint64_t *work_out, size_t *pieces_out,
                        uint64_t *ref_work_out)
{
    rl_plan *p = NULL, *r = NULL;
    int64_t bad = 0;
    dt_status sp = dt__rl_plan_build_general(src, dst, rank, shape, dtype, sim, &p);
    dt_status sr = dt__rl_plan_build_ref(src, dst, rank, shape, dtype, sim, &r);
    SAME("status", sp, sr);
    if (sp == DT_OK && sr == DT_OK) {
        SAME("pieces", p->npieces, r->npieces);
        SAME("summands", p->nsummands, r->nsummands);
        SAME("op", p->op, r->op);
        SAME("local destinations", p->ndst_local, r->ndst_local);
        for (int i = 0; i < p->ndst_local && i < r->ndst_local; i++)
            SAME("zero fill", p->zero_dst[i], r->zero_dst[i]);
        for (size_t i = 0; i < p->npieces && i < r->npieces; i++) {
            const rl_piece *a = &p->pieces[i], *b = &r->pieces[i];
            same_fields(a, b, piece_fields, sizeof piece_fields / sizeof *piece_fields, what,
                        &bad);
            for (int d = 0; d < rank; d++) {
                SAME("box offset", a->box.off[d], b->box.off[d]);
                SAME("box length", a->box.len[d], b->box.len[d]);
            }
        }
        SAME("stats entries", p->nstats, r->nstats);
        for (int i = 0; i < p->nstats && i < r->nstats; i++)
            same_fields(&p->stats[i], &r->stats[i], stats_fields,
                        sizeof stats_fields / sizeof *stats_fields, what, &bad);
        if (work_out)
            *work_out = p->work;
        if (pieces_out)
            *pieces_out = p->npieces;
        if (ref_work_out)
            *ref_work_out = r->work;
    }
    dt__rl_plan_free(p);
    dt__rl_plan_free(r);
    return bad;
}
