/* moe/routed: the routed mixture-of-experts layer (router, capacity, dispatch by the ragged
 * all-to-all, grouped GEMM over the local experts, combine) and the bias update. */
#include "routed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXE 64

/* Wall time of the forward's phases since the last moe_routed_timers reset (bench). */
static double t_route, t_dispatch, t_experts, t_combine;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void moe_routed_timers(double *route, double *dispatch, double *experts_s, double *combine,
                       int reset)
{
    *route = t_route, *dispatch = t_dispatch, *experts_s = t_experts, *combine = t_combine;
    if (reset)
        t_route = t_dispatch = t_experts = t_combine = 0;
}

/* The host plan of one call: every index array the gathers need, per member. */
typedef struct plan {
    int64_t P, G, n, K, E, C, S, Rr; /* members, local experts, tokens per member, ... */
    int64_t *send_idx;     /* [P, S]: member-local token of each send row (0 past the count) */
    int64_t *send_counts;  /* [P, P] */
    int64_t *recv_perm;    /* [P, Rr]: received row of each expert-major row */
    int64_t *recv_inv;     /* [P, Rr]: expert-major row of each received row */
    int64_t *group_counts; /* [P, G] */
    int64_t *comb_idx;     /* [P, n*K]: returned row of each (token, choice) (0: dropped) */
    float *keep;           /* [N, K] 1 kept, 0 dropped */
} plan;

static void plan_free(plan *pl)
{
    free(pl->send_idx);
    free(pl->send_counts);
    free(pl->recv_perm);
    free(pl->recv_inv);
    free(pl->group_counts);
    free(pl->comb_idx);
    free(pl->keep);
}

/* Builds the plan from the choices idx [N, K] (every client the same). */
static dt_status plan_make(const moe_config *cfg, int64_t P, int64_t N, int64_t C,
                           const int64_t *idx, plan *pl, moe_route_stats *st)
{
    int64_t E = cfg->experts, K = cfg->topk, n = N / P, G = E / P;
    int64_t grp = cfg->group > 0 ? cfg->group : n;
    *pl = (plan){.P = P, .G = G, .n = n, .K = K, .E = E, .C = C, .S = n * K};
    memset(st, 0, sizeof *st);
    st->assigned = N * K;
    int64_t cap = INT64_MAX;
    if (cfg->capacity_factor > 0)
        cap = (int64_t)ceil((double)grp * (double)K * cfg->capacity_factor / (double)E);
    pl->keep = calloc((size_t)(N * K), sizeof *pl->keep);
    pl->send_idx = calloc((size_t)(P * pl->S), sizeof(int64_t));
    pl->send_counts = calloc((size_t)(P * P), sizeof(int64_t));
    pl->group_counts = calloc((size_t)(P * G), sizeof(int64_t));
    pl->comb_idx = calloc((size_t)(P * n * K), sizeof(int64_t));
    int64_t *cnt_pe = calloc((size_t)(P * E), sizeof(int64_t));
    if (!pl->keep || !pl->send_idx || !pl->send_counts || !pl->group_counts || !pl->comb_idx ||
        !cnt_pe) {
        free(cnt_pe);
        return DT_ERR_NO_MEMORY;
    }
    /* capacity: per group, first choices first, in token order */
    for (int64_t g0 = 0; g0 < N; g0 += grp) {
        int64_t used[MAXE] = {0};
        for (int64_t k = 0; k < K; k++)
            for (int64_t t = g0; t < g0 + grp && t < N; t++) {
                int64_t e = idx[t * K + k];
                st->chosen[e]++;
                if (used[e] < cap) {
                    used[e]++;
                    pl->keep[t * K + k] = 1.0f;
                    st->load[e]++;
                } else {
                    st->dropped++;
                }
            }
    }
    /* send order of member p: its kept pairs by expert, then token, then choice */
    for (int64_t p = 0; p < P; p++) {
        int64_t r = 0;
        for (int64_t e = 0; e < E; e++)
            for (int64_t t = p * n; t < (p + 1) * n; t++)
                for (int64_t k = 0; k < K; k++)
                    if (idx[t * K + k] == e && pl->keep[t * K + k] != 0.0f) {
                        pl->send_idx[p * pl->S + r] = t - p * n;
                        pl->comb_idx[p * n * K + (t - p * n) * K + k] = r;
                        cnt_pe[p * E + e]++;
                        r++;
                    }
        for (int64_t e = 0; e < E; e++)
            pl->send_counts[p * P + e / G] += cnt_pe[p * E + e];
    }
    /* receive side: rows from member 0, 1, ...; within a source, its experts in order */
    int64_t Rr = 1;
    for (int64_t q = 0; q < P; q++) {
        int64_t tot = 0;
        for (int64_t s = 0; s < P; s++)
            tot += pl->send_counts[s * P + q];
        Rr = tot > Rr ? tot : Rr;
    }
    if (P == 1)
        Rr = pl->S; /* no exchange: the send buffer itself */
    pl->Rr = Rr;
    st->max_recv = Rr;
    pl->recv_perm = calloc((size_t)(P * Rr), sizeof(int64_t));
    pl->recv_inv = calloc((size_t)(P * Rr), sizeof(int64_t));
    if (!pl->recv_perm || !pl->recv_inv) {
        free(cnt_pe);
        return DT_ERR_NO_MEMORY;
    }
    for (int64_t q = 0; q < P; q++) {
        int64_t o = 0;
        for (int64_t g = 0; g < G; g++) {
            int64_t e = q * G + g;
            for (int64_t s = 0; s < P; s++) {
                int64_t base = 0; /* start of source s's block, then of expert e in it */
                for (int64_t s2 = 0; s2 < s; s2++)
                    base += pl->send_counts[s2 * P + q];
                for (int64_t g2 = 0; g2 < g; g2++)
                    base += cnt_pe[s * E + q * G + g2];
                for (int64_t i = 0; i < cnt_pe[s * E + e]; i++, o++) {
                    pl->recv_perm[q * Rr + o] = base + i;
                    pl->recv_inv[q * Rr + base + i] = o;
                }
            }
            pl->group_counts[q * G + g] = 0;
            for (int64_t s = 0; s < P; s++)
                pl->group_counts[q * G + g] += cnt_pe[s * E + e];
        }
        for (int64_t r = o; r < Rr; r++) /* padding: a padding row (output 0) when any */
            pl->recv_inv[q * Rr + r] = o < Rr ? o : 0;
    }
    free(cnt_pe);
    return DT_OK;
}

/* A tensor [P, rows] (cols == 0) or [P, rows, cols] of i64 with every element of a row's
 * entry repeated along cols, dim 0 sharded over the ep dim. */
static dt_status index_tensor(const dt_mesh *mesh, const char *ep, int64_t P, int64_t rows,
                              int64_t cols, const int64_t *src, dt_tensor **out)
{
    int rank = cols > 0 ? 3 : 2;
    const char *spec[3] = {ep ? ep : DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED};
    dt_layout *l = NULL;
    dt_status st = dt_layout_create(mesh, rank, spec, &l);
    if (st != DT_OK)
        return st;
    int64_t c = cols > 0 ? cols : 1;
    int64_t *buf = malloc((size_t)(P * rows * c) * sizeof *buf);
    if (!buf) {
        dt_layout_destroy(l);
        return DT_ERR_NO_MEMORY;
    }
    for (int64_t i = 0; i < P * rows; i++)
        for (int64_t j = 0; j < c; j++)
            buf[i * c + j] = src[i];
    int64_t shape[3] = {P, rows, cols};
    st = dt_tensor_from_host(l, DT_DTYPE_I64, shape, buf, out);
    free(buf);
    dt_layout_destroy(l);
    return st;
}

static dt_status host_tensor(const dt_layout *l, int rank, const int64_t *shape, const float *v,
                             dt_tensor **out)
{
    return dt_tensor_from_host(l, DT_DTYPE_F32, shape, v, out);
}

/* The members' exchange (P > 1) of rows [P * rows, C]. */
static dt_status exchange(const char *ep, const dt_tensor *x3, const dt_tensor *counts,
                          int64_t out_rows, int64_t P, int64_t C, dt_tensor **y3)
{
    int64_t flat[2] = {dt_tensor_shape(x3)[0] * dt_tensor_shape(x3)[1], C};
    int64_t three[3] = {P, out_rows, C};
    dt_tensor *xf = NULL, *yf = NULL;
    dt_status st = dt_reshape(x3, 2, flat, &xf);
    if (st == DT_OK)
        st = dt_alltoallv(xf, counts, ep, out_rows, &yf, NULL);
    if (st == DT_OK)
        st = dt_reshape(yf, 3, three, y3);
    dt_tensor_destroy(yf);
    dt_tensor_destroy(xf);
    return st;
}

/* The SwiGLU experts on expert-major rows xe [P, Rr, C]. */
static dt_status experts(const moe_params *p, const dt_tensor *xe, const dt_tensor *gc,
                         dt_tensor **h_out)
{
    dt_tensor *h1 = NULL, *h3 = NULL, *a = NULL, *u = NULL;
    dt_status st = dt_grouped_matmul(xe, p->w1, gc, 0, &h1);
    if (st == DT_OK)
        st = dt_grouped_matmul(xe, p->w3, gc, 0, &h3);
    if (st == DT_OK)
        st = dt_silu(h1, &a);
    if (st == DT_OK)
        st = dt_mul(a, h3, NULL, &u);
    if (st == DT_OK)
        st = dt_grouped_matmul(u, p->w2, gc, 0, h_out);
    dt_tensor_destroy(u);
    dt_tensor_destroy(a);
    dt_tensor_destroy(h3);
    dt_tensor_destroy(h1);
    return st;
}

dt_status moe_per_shard(const dt_tensor *w, int64_t S, const char *dim, int rank, dt_tensor **out)
{
    int wr = dt_tensor_rank(w);
    if (S < 1 || rank < wr + 1 || rank > 8)
        return DT_ERR_INVALID_ARGUMENT;
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(w));
    int64_t shape[8];
    const char *specs[8];
    shape[0] = S;
    specs[0] = dim && dt_mesh_dim_index(mesh, dim) >= 0 ? dim : DT_UNSHARDED;
    for (int d = 1; d < rank; d++) {
        int wd = d - (rank - wr);
        shape[d] = wd < 0 ? 1 : dt_tensor_shape(w)[wd];
        specs[d] = DT_UNSHARDED;
    }
    dt_tensor *e = NULL;
    dt_layout *l = NULL;
    dt_status st = dt_expand(w, rank, shape, &e);
    if (st == DT_OK)
        st = dt_layout_create(mesh, rank, specs, &l);
    if (st == DT_OK)
        st = dt_relayout(e, l, out);
    dt_layout_destroy(l);
    dt_tensor_destroy(e);
    return st;
}

dt_status moe_routed_forward(const moe_config *cfg, const moe_params *p, const float *bias,
                             const dt_tensor *x, dt_tensor **y_out, dt_tensor **aux_out,
                             moe_route_stats *stats, int64_t *choices)
{
    const dt_layout *xl = dt_tensor_layout(x);
    const dt_mesh *mesh = dt_layout_mesh(xl);
    int epd = cfg->ep_dim ? dt_mesh_dim_index(mesh, cfg->ep_dim) : -1;
    int64_t P = epd >= 0 ? dt_mesh_dim_size(mesh, epd) : 1;
    const char *ep = epd >= 0 ? cfg->ep_dim : NULL;
    int64_t N = dt_tensor_shape(x)[0], C = dt_tensor_shape(x)[1];
    int64_t E = cfg->experts, K = cfg->topk;
    if (dt_tensor_rank(x) != 2 || E < 1 || E > MAXE || K < 1 || K > E || E % P || N % P ||
        (cfg->group > 0 && (N / P) % cfg->group))
        return DT_ERR_INVALID_ARGUMENT;

    dt_status st = DT_OK;
    dt_tensor *logits = NULL, *scores = NULL, *choice = NULL, *bt = NULL, *idx = NULL;
    dt_tensor *gsel = NULL, *gsum = NULL, *gates = NULL, *keep = NULL, *gk = NULL;
    dt_tensor *x3 = NULL, *si = NULL, *xs = NULL, *sc = NULL, *xr = NULL, *rp = NULL;
    dt_tensor *xe = NULL, *gc = NULL, *he = NULL, *ri = NULL, *hr = NULL, *hb = NULL;
    dt_tensor *ci = NULL, *htk = NULL, *h4 = NULL, *gk3 = NULL, *prod = NULL;
    dt_layout *rep1 = NULL, *rep2 = NULL;
    int64_t *ih = NULL;
    plan pl;
    memset(&pl, 0, sizeof pl);
    moe_route_stats local;

    double t0 = now(), t1 = 0, t2 = 0, t3 = 0;
    /* router */
    if (cfg->shards > 0) { /* [S, N/S, C] x [S, C, E]: per-shard GEMMs, the gradient of Wg
                            * summed over the S shards by moe_per_shard's backward */
        int64_t S = cfg->shards, s3[3] = {S, N / S, C}, s2[2] = {N, E};
        dt_tensor *xs3 = NULL, *gs = NULL, *l3 = NULL;
        st = N % S ? DT_ERR_INVALID_ARGUMENT : DT_OK;
        if (st == DT_OK)
            st = dt_reshape(x, 3, s3, &xs3);
        if (st == DT_OK)
            st = moe_per_shard(p->gate, S, ep, 3, &gs);
        if (st == DT_OK) {
            const dt_tensor *xw[2] = {xs3, gs};
            st = dt_einsum("snc,sce->sne", xw, 2, &l3);
        }
        if (st == DT_OK)
            st = dt_reshape(l3, 2, s2, &logits);
        dt_tensor_destroy(l3);
        dt_tensor_destroy(gs);
        dt_tensor_destroy(xs3);
    } else {
        const dt_tensor *xw[2] = {x, p->gate};
        st = dt_einsum("nc,ce->ne", xw, 2, &logits);
    }
    if (st == DT_OK)
        st = cfg->score == MOE_SCORE_SIGMOID ? dt_sigmoid(logits, &scores)
                                             : dt_softmax(logits, -1, &scores);
    if (st == DT_OK)
        st = dt_layout_replicated(mesh, 1, &rep1);
    if (st == DT_OK)
        st = dt_layout_replicated(mesh, 2, &rep2);
    if (st == DT_OK) { /* the choice: top-k of scores + bias, off the tape */
        float zb[MAXE] = {0};
        int64_t es[1] = {E};
        dt_no_grad_begin();
        st = host_tensor(rep1, 1, es, bias ? bias : zb, &bt);
        if (st == DT_OK)
            st = dt_add(scores, bt, NULL, &choice);
        if (st == DT_OK)
            st = dt_topk(choice, K, -1, 1, NULL, &idx);
        dt_no_grad_end();
    }
    ih = malloc((size_t)(N * K) * sizeof *ih);
    if (st == DT_OK && !ih)
        st = DT_ERR_NO_MEMORY;
    if (st == DT_OK)
        st = dt_tensor_to_host(idx, -1, ih, (size_t)(N * K) * sizeof *ih);
    if (st == DT_OK)
        st = plan_make(cfg, P, N, C, ih, &pl, stats ? stats : &local);
    if (st == DT_OK && choices)
        memcpy(choices, ih, (size_t)(N * K) * sizeof *ih);

    /* gates from the unbiased scores, masked by the capacity */
    if (st == DT_OK)
        st = dt_gather(scores, 1, idx, &gsel);
    if (st == DT_OK && cfg->norm_topk) {
        int ax[1] = {1};
        st = dt_sum(gsel, ax, 1, 1, &gsum);
        if (st == DT_OK)
            st = dt_div(gsel, gsum, &gates);
    } else if (st == DT_OK) {
        gates = dt_tensor_retain(gsel);
    }
    if (st == DT_OK) {
        int64_t ks[2] = {N, K};
        st = host_tensor(rep2, 2, ks, pl.keep, &keep);
    }
    if (st == DT_OK)
        st = dt_mul(gates, keep, NULL, &gk);

    t1 = now();
    /* dispatch: send rows grouped by expert, exchanged, made expert-major */
    if (st == DT_OK) {
        int64_t s3[3] = {P, pl.n, C};
        st = dt_reshape(x, 3, s3, &x3);
    }
    if (st == DT_OK)
        st = index_tensor(mesh, ep, P, pl.S, C, pl.send_idx, &si);
    if (st == DT_OK)
        st = dt_gather(x3, 1, si, &xs);
    if (st == DT_OK && P > 1) {
        st = index_tensor(mesh, ep, P, P, 0, pl.send_counts, &sc);
        if (st == DT_OK)
            st = exchange(ep, xs, sc, pl.Rr, P, C, &xr);
    } else if (st == DT_OK) {
        xr = dt_tensor_retain(xs);
    }
    if (st == DT_OK)
        st = index_tensor(mesh, ep, P, pl.Rr, C, pl.recv_perm, &rp);
    if (st == DT_OK)
        st = dt_gather(xr, 1, rp, &xe);
    if (st == DT_OK)
        st = index_tensor(mesh, ep, P, pl.G, 0, pl.group_counts, &gc);
    t2 = now();
    if (st == DT_OK)
        st = experts(p, xe, gc, &he);
    t3 = now();

    /* combine: back to received order, back to the senders, weighted sum over the choices */
    if (st == DT_OK)
        st = index_tensor(mesh, ep, P, pl.Rr, C, pl.recv_inv, &ri);
    if (st == DT_OK)
        st = dt_gather(he, 1, ri, &hr);
    if (st == DT_OK && P > 1) {
        /* the received counts are the transpose of the sent ones */
        int64_t *rc = malloc((size_t)(P * P) * sizeof *rc);
        dt_tensor *rct = NULL;
        st = rc ? DT_OK : DT_ERR_NO_MEMORY;
        for (int64_t a = 0; st == DT_OK && a < P; a++)
            for (int64_t b = 0; b < P; b++)
                rc[a * P + b] = pl.send_counts[b * P + a];
        if (st == DT_OK)
            st = index_tensor(mesh, ep, P, P, 0, rc, &rct);
        if (st == DT_OK)
            st = exchange(ep, hr, rct, pl.S, P, C, &hb);
        dt_tensor_destroy(rct);
        free(rc);
    } else if (st == DT_OK) {
        hb = dt_tensor_retain(hr);
    }
    if (st == DT_OK)
        st = index_tensor(mesh, ep, P, pl.n * K, C, pl.comb_idx, &ci);
    if (st == DT_OK)
        st = dt_gather(hb, 1, ci, &htk); /* [P, n*K, C] */
    if (st == DT_OK) {
        int64_t s4[3] = {N, K, C};
        st = dt_reshape(htk, 3, s4, &h4);
    }
    if (st == DT_OK) {
        int64_t s3[3] = {N, K, 1};
        st = dt_reshape(gk, 3, s3, &gk3);
    }
    if (st == DT_OK)
        st = dt_mul(h4, gk3, NULL, &prod);
    dt_tensor *y = NULL;
    if (st == DT_OK) {
        int ax[1] = {1};
        st = dt_sum(prod, ax, 1, 0, &y);
    }

    double t4 = now();
    t_route += t1 - t0, t_dispatch += t2 - t1, t_experts += t3 - t2, t_combine += t4 - t3;
    /* auxiliary losses */
    dt_tensor *aux = NULL;
    if (st == DT_OK && aux_out && (cfg->balance == MOE_BALANCE_AUX || cfg->z_coeff > 0)) {
        const moe_route_stats *rs = stats ? stats : &local;
        dt_tensor *pn = NULL, *psum = NULL, *pm = NULL, *fv = NULL, *la = NULL;
        dt_tensor *lse = NULL, *lse2 = NULL, *zm = NULL, *zc = NULL, *lz = NULL;
        if (cfg->balance == MOE_BALANCE_AUX) {
            int ax[1] = {1}, ax0[1] = {0};
            float f[MAXE];
            int64_t es[1] = {E};
            for (int64_t e = 0; e < E; e++)
                f[e] =
                    (float)(cfg->aux_coeff * (double)E * (double)rs->chosen[e] / (double)(N * K));
            st = dt_sum(scores, ax, 1, 1, &psum);
            if (st == DT_OK)
                st = dt_div(scores, psum, &pn);
            if (st == DT_OK && cfg->shards > 0) { /* every token's row on every device, so
                                                   * the mean sums them in token order */
                dt_tensor *pr = NULL;
                st = dt_relayout(pn, rep2, &pr);
                dt_tensor_destroy(pn);
                pn = pr;
            }
            if (st == DT_OK)
                st = dt_mean(pn, ax0, 1, 0, &pm);
            if (st == DT_OK)
                st = host_tensor(rep1, 1, es, f, &fv);
            if (st == DT_OK) {
                const dt_tensor *in[2] = {pm, fv};
                st = dt_einsum("e,e->", in, 2, &la);
            }
        }
        if (st == DT_OK && cfg->z_coeff > 0) {
            int ax[1] = {1};
            float z = (float)cfg->z_coeff;
            int64_t none[1] = {1};
            dt_layout *r0 = NULL;
            st = dt_logsumexp(logits, ax, 1, 0, &lse);
            if (st == DT_OK && cfg->shards > 0) { /* gathered, as the balance loss's rows */
                dt_tensor *lr = NULL;
                st = dt_relayout(lse, rep1, &lr);
                dt_tensor_destroy(lse);
                lse = lr;
            }
            if (st == DT_OK)
                st = dt_square(lse, &lse2);
            if (st == DT_OK)
                st = dt_mean(lse2, NULL, 0, 0, &zm);
            if (st == DT_OK)
                st = dt_layout_replicated(mesh, 0, &r0);
            if (st == DT_OK)
                st = host_tensor(r0, 0, none, &z, &zc);
            if (st == DT_OK)
                st = dt_mul(zm, zc, NULL, &lz);
            dt_layout_destroy(r0);
        }
        if (st == DT_OK) {
            if (la && lz)
                st = dt_add(la, lz, NULL, &aux);
            else
                aux = dt_tensor_retain(la ? la : lz);
        }
        dt_tensor_destroy(lz);
        dt_tensor_destroy(zc);
        dt_tensor_destroy(zm);
        dt_tensor_destroy(lse2);
        dt_tensor_destroy(lse);
        dt_tensor_destroy(la);
        dt_tensor_destroy(fv);
        dt_tensor_destroy(pm);
        dt_tensor_destroy(psum);
        dt_tensor_destroy(pn);
    }
    if (st == DT_OK) {
        *y_out = y;
        if (aux_out)
            *aux_out = aux;
    } else {
        dt_tensor_destroy(y);
        dt_tensor_destroy(aux);
    }

    dt_tensor *all[] = {logits, scores, choice, bt, idx, gsel, gsum, gates, keep,
                        gk,     x3,     si,     xs, sc,  xr,   rp,   xe,    gc,
                        he,     ri,     hr,     hb, ci,  htk,  h4,   gk3,   prod};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dt_tensor_destroy(all[i]);
    dt_layout_destroy(rep1);
    dt_layout_destroy(rep2);
    plan_free(&pl);
    free(ih);
    return st;
}

void moe_bias_update(const moe_config *cfg, const int64_t *load, float *bias)
{
    int64_t E = cfg->experts, tot = 0;
    for (int64_t e = 0; e < E; e++)
        tot += load[e];
    float mean = (float)tot / (float)E, c = (float)cfg->bias_coeff, m = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        float d = mean - (float)load[e];
        bias[e] += d > 0 ? c : d < 0 ? -c : 0.0f;
    }
    for (int64_t e = 0; e < E; e++)
        m += bias[e];
    m /= (float)E;
    for (int64_t e = 0; e < E; e++)
        bias[e] -= m;
}
