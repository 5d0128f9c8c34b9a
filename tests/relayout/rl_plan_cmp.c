/* See rl_plan_cmp.h. */
#include <stdio.h>
#include <string.h>

#include "rl_plan_cmp.h"

static int64_t report(int64_t *bad, const char *what, const char *fmt, long long a, long long b)
{
    if ((*bad)++ < 5) {
        fprintf(stderr, "  plan mismatch (%s): ", what);
        fprintf(stderr, fmt, a, b);
        fprintf(stderr, "\n");
    }
    return *bad;
}

#define SAME(field, a, b)                                                                   \
    do {                                                                                    \
        if ((a) != (b))                                                                     \
            report(&bad, what, field " %lld, reference %lld", (long long)(a),              \
                   (long long)(b));                                                         \
    } while (0)

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
            SAME("src_pos", a->src_pos, b->src_pos);
            SAME("dst_pos", a->dst_pos, b->dst_pos);
            SAME("src_client", a->src_client, b->src_client);
            SAME("dst_client", a->dst_client, b->dst_client);
            SAME("src_local", a->src_local, b->src_local);
            SAME("dst_local", a->dst_local, b->dst_local);
            SAME("summand", a->summand, b->summand);
            SAME("bytes", a->bytes, b->bytes);
            for (int d = 0; d < rank; d++) {
                SAME("box offset", a->box.off[d], b->box.off[d]);
                SAME("box length", a->box.len[d], b->box.len[d]);
            }
        }
        SAME("stats entries", p->nstats, r->nstats);
        for (int i = 0; i < p->nstats && i < r->nstats; i++) {
            const dt_relayout_stats *a = &p->stats[i], *b = &r->stats[i];
            SAME("stats device", a->device_id, b->device_id);
            SAME("stats type", a->device_type, b->device_type);
            SAME("bytes sent", a->bytes_sent, b->bytes_sent);
            SAME("bytes received", a->bytes_received, b->bytes_received);
            SAME("bytes sent remote", a->bytes_sent_remote, b->bytes_sent_remote);
            SAME("bytes received remote", a->bytes_received_remote, b->bytes_received_remote);
            SAME("bytes self", a->bytes_self, b->bytes_self);
            SAME("bytes sent across hosts", a->bytes_sent_cross_host, b->bytes_sent_cross_host);
            SAME("bytes received across hosts", a->bytes_received_cross_host,
                 b->bytes_received_cross_host);
        }
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
