/* Relayout planning in time proportional to this client's own pieces. A destination shard's
 * box meets, along each tensor dim, a run of the source's sorted shard intervals (found by
 * binary search), so the source groups it needs are enumerated directly instead of scanned;
 * likewise the destination shards a source group of ours feeds. Each needed piece is taken
 * once, from the holder nearest the receiver (same device, then same client, then same host,
 * then another host), with reductions for partial sources. The plan is exactly the one the
 * former all-pairs planner (relayout_plan_ref.c) makes. dt__rl_host_mid picks the middle
 * layout of the two-level route across hosts. Regular patterns (one mesh dim gathered,
 * reduced or moved) are planned per mesh dim instead (relayout_pattern.c). */
#include <stdlib.h>
#include <string.h>

#include "layout/relayout_plan_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/transport.h"
#include "runtime/util.h"

/* The geometry of one plan: both layouts' shard grids over their meshes. */
typedef struct geo {
    const rl_world *w;
    const dt_layout *src, *dst;
    const dt_mesh *sm, *dm;
    dt_device_type stype, dtype;
    int rank;
    const int64_t *shape;
    rl_partial_map pm;
    int64_t nsum, nblocks;
    int64_t sk[DT_MAX_RANK], dk[DT_MAX_RANK]; /* shards per tensor dim */
    int smd[DT_MAX_RANK], dmd[DT_MAX_RANK];   /* mesh dim sharding it, or -1 */
    int smr, dmr;
    int64_t ssize[DT_MESH_MAX_DIMS], sstride[DT_MESH_MAX_DIMS];
    int64_t dsize[DT_MESH_MAX_DIMS];
    int nfree;                                /* source mesh dims free inside a group */
    int free_dim[DT_MESH_MAX_DIMS];
    int64_t gsize;                            /* members of a group */
    /* Component index on this client of each of its device ids, per mesh: ids
     * first .. first + count - 1 (-1: not a component of the mesh). */
    int sfirst, scount, dfirst, dcount;
    int *sloc, *dloc;
} geo;

/* A source group: the positions holding one (kept coordinates, summand, block), in position
 * order: base plus any combination of the free dims. */
typedef struct group {
    int64_t key, summand, base;
    int64_t coord[DT_MESH_MAX_DIMS]; /* fixed dims' coordinates (free dims 0) */
    int fixed[DT_MESH_MAX_DIMS];
    rl_box box;
} group;

/* One piece before ordering: the plan's order is (destination position, group key). */
typedef struct entry {
    int64_t q, key;
    size_t idx;
} entry;

typedef struct piece_list {
    rl_piece *v;
    entry *e;
    size_t n, cap;
} piece_list;

static void geo_init(geo *g, const rl_world *w, const dt_layout *src, const dt_layout *dst,
                     int rank, const int64_t *shape)
{
    memset(g, 0, sizeof *g);
    g->w = w;
    g->src = src;
    g->dst = dst;
    g->sm = dt_layout_mesh(src);
    g->dm = dt_layout_mesh(dst);
    g->stype = dt_mesh_device_type(g->sm);
    g->dtype = dt_mesh_device_type(g->dm);
    g->rank = rank;
    g->shape = shape;
    g->smr = dt_mesh_rank(g->sm);
    g->dmr = dt_mesh_rank(g->dm);
    int64_t st = 1;
    for (int m = g->smr - 1; m >= 0; m--) {
        g->ssize[m] = dt_mesh_dim_size(g->sm, m);
        g->sstride[m] = st;
        st *= g->ssize[m];
    }
    for (int m = 0; m < g->dmr; m++)
        g->dsize[m] = dt_mesh_dim_size(g->dm, m);
    g->nblocks = 1;
    for (int d = 0; d < rank; d++) {
        g->sk[d] = dt_layout_num_shards(src, d);
        g->dk[d] = dt_layout_num_shards(dst, d);
        g->smd[d] = dt_layout_spec_mesh_dim(src, d) >= 0 ? dt_layout_spec_mesh_dim(src, d) : -1;
        g->dmd[d] = dt_layout_spec_mesh_dim(dst, d) >= 0 ? dt_layout_spec_mesh_dim(dst, d) : -1;
        g->nblocks *= g->sk[d];
    }
}

/* Fills the component table of mesh m (see geo), so that a piece's local index costs O(1). */
static dt_status local_table(const rl_world *w, const dt_mesh *m, int *first, int *count,
                             int **out)
{
    dt__rl_client_devices(w, dt_mesh_device_type(m), w->me, first, count);
    int *t = malloc(((size_t)*count + 1) * sizeof *t);
    if (!t)
        return dt__error(DT_ERR_NO_MEMORY, "no memory to plan for %d local devices", *count);
    for (int i = 0; i < *count; i++)
        t[i] = w->sim ? i : -1;
    /* As dt__rl_local_index: the first component listed with the id. */
    for (int i = w->sim ? -1 : dt_mesh_num_local_devices(m) - 1; i >= 0; i--) {
        int id = dt_mesh_local_device_id(m, i);
        if (id >= *first && id - *first < *count)
            t[id - *first] = i;
    }
    *out = t;
    return DT_OK;
}

static int local_of(const geo *g, int src, int64_t pos)
{
    int id = dt_mesh_device_id(src ? g->sm : g->dm, pos) - (src ? g->sfirst : g->dfirst);
    return id >= 0 && id < (src ? g->scount : g->dcount) ? (src ? g->sloc : g->dloc)[id] : -1;
}

/* Called once the partial map is known: the source dims that are free inside a group. */
static void geo_groups(geo *g)
{
    int fixed[DT_MESH_MAX_DIMS] = {0};
    for (int d = 0; d < g->rank; d++)
        if (g->smd[d] >= 0)
            fixed[g->smd[d]] = 1;
    g->nsum = 1;
    for (int i = 0; i < g->pm.nreduce; i++) {
        fixed[g->pm.reduce_src[i]] = 1;
        g->nsum *= g->ssize[g->pm.reduce_src[i]];
    }
    for (int i = 0; i < g->pm.nkeep; i++)
        fixed[g->pm.keep_src[i]] = 1;
    g->gsize = 1;
    for (int m = 0; m < g->smr; m++)
        if (!fixed[m]) {
            g->free_dim[g->nfree++] = m;
            g->gsize *= g->ssize[m];
        }
}

/* Shards j of n split k ways whose range meets [lo, hi), lo < hi <= n: *first..*last
 * (empty when *first > *last). Shard j starts at j*(n/k) + min(j, n%k). */
static void shard_span(int64_t n, int64_t k, int64_t lo, int64_t hi, int64_t *first,
                       int64_t *last)
{
    int64_t q = n / k, r = n % k, a = 0, b = k;
#define SHARD_OFF(j) ((j) * q + ((j) < r ? (j) : r))
    while (a < b) { /* the first shard ending after lo */
        int64_t m = a + (b - a) / 2;
        if (SHARD_OFF(m + 1) > lo)
            b = m;
        else
            a = m + 1;
    }
    *first = a;
    a = 0;
    b = k;
    while (a < b) { /* the first shard starting at or after hi */
        int64_t m = a + (b - a) / 2;
        if (SHARD_OFF(m) >= hi)
            b = m;
        else
            a = m + 1;
    }
#undef SHARD_OFF
    *last = a - 1;
    if (q == 0 && *last >= r) /* empty shards meet nothing */
        *last = r - 1;
}

/* The group of (summand, block coordinates bc, kept coordinates kc). */
static void make_group(const geo *g, int64_t summand, const int64_t *bc, const int64_t *kc,
                       group *out)
{
    const rl_partial_map *pm = &g->pm;
    memset(out->fixed, 0, sizeof out->fixed);
    memset(out->coord, 0, sizeof out->coord);
    int64_t block = 0, kkey = 0, s = summand;
    for (int d = 0; d < g->rank; d++) {
        block = block * g->sk[d] + bc[d];
        if (g->smd[d] >= 0) {
            out->coord[g->smd[d]] = bc[d];
            out->fixed[g->smd[d]] = 1;
        }
        dt_shard_range(g->shape[d], g->sk[d], bc[d], &out->box.off[d], &out->box.len[d]);
    }
    for (int i = pm->nreduce - 1; i >= 0; i--) {
        int m = pm->reduce_src[i];
        out->coord[m] = s % g->ssize[m];
        out->fixed[m] = 1;
        s /= g->ssize[m];
    }
    for (int i = 0; i < pm->nkeep; i++) {
        int m = pm->keep_src[i];
        out->coord[m] = kc[i];
        out->fixed[m] = 1;
        kkey = kkey * g->ssize[m] + kc[i];
    }
    out->base = 0;
    for (int m = 0; m < g->smr; m++)
        out->base += out->coord[m] * g->sstride[m];
    out->summand = summand;
    out->key = (kkey * g->nsum + summand) * g->nblocks + block;
}

/* Position of the k-th member of a group (position order). */
static int64_t member(const geo *g, const group *gr, int64_t k)
{
    int64_t pos = gr->base;
    for (int i = g->nfree - 1; i >= 0; i--) {
        int m = g->free_dim[i];
        pos += (k % g->ssize[m]) * g->sstride[m];
        k /= g->ssize[m];
    }
    return pos;
}

static int in_group(const geo *g, const group *gr, int64_t pos)
{
    for (int m = 0; m < g->smr; m++)
        if (gr->fixed[m] && (pos / g->sstride[m]) % g->ssize[m] != gr->coord[m])
            return 0;
    return 1;
}

static int src_client(const geo *g, int64_t pos)
{
    return dt__rl_client(g->w, g->stype, dt_mesh_device_id(g->sm, pos));
}

/* The member of group gr nearest to destination position q (device did of client dclient):
 * the same device, else the first member on the same client, else one on the same host,
 * else any, spread by q. *work counts the members and devices looked at. */
static int64_t nearest(const geo *g, const group *gr, int did, int dclient, int64_t q,
                       uint64_t *work)
{
    const rl_world *w = g->w;
    if (g->stype == g->dtype) {
        int64_t p = dt_mesh_position(g->sm, did);
        ++*work;
        if (p >= 0 && in_group(g, gr, p))
            return p;
    }
    int first, count;
    int64_t best = -1;
    dt__rl_client_devices(w, g->stype, dclient, &first, &count);
    if (g->gsize <= count) {
        for (int64_t k = 0; k < g->gsize && best < 0; k++) {
            ++*work;
            if (src_client(g, member(g, gr, k)) == dclient)
                best = member(g, gr, k);
        }
    } else {
        for (int id = first; id < first + count; id++) {
            int64_t p = dt_mesh_position(g->sm, id);
            ++*work;
            if (p >= 0 && (best < 0 || p < best) && in_group(g, gr, p))
                best = p;
        }
    }
    if (best >= 0)
        return best;
    if (w->one_host)
        return member(g, gr, q % g->gsize);
    int host = dt__rl_host(w, dclient);
    int64_t nhost = 0;
    for (int64_t k = 0; k < g->gsize; k++)
        nhost += dt__rl_host(w, src_client(g, member(g, gr, k))) == host;
    *work += (uint64_t)g->gsize;
    if (nhost) {
        int64_t want = q % nhost;
        for (int64_t k = 0; k < g->gsize; k++)
            if (dt__rl_host(w, src_client(g, member(g, gr, k))) == host && want-- == 0)
                return member(g, gr, k);
    }
    return member(g, gr, q % g->gsize);
}

static dt_status push_piece(piece_list *l, const rl_piece *p, int64_t key)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        rl_piece *v = realloc(l->v, cap * sizeof *v);
        if (v)
            l->v = v;
        entry *e = v ? realloc(l->e, cap * sizeof *e) : NULL;
        if (!e)
            return dt__error(DT_ERR_NO_MEMORY, "no memory for a relayout plan of %zu pieces",
                             cap);
        l->e = e;
        l->cap = cap;
    }
    l->v[l->n] = *p;
    l->e[l->n] = (entry){p->dst_pos, key, l->n};
    l->n++;
    return DT_OK;
}

/* Adds the piece of group gr for destination position q (box: their intersection). */
static dt_status add_piece(const geo *g, rl_plan *plan, piece_list *l, const group *gr,
                           int64_t q, int did, int dclient, const rl_box *box)
{
    const rl_world *w = g->w;
    int64_t h = nearest(g, gr, did, dclient, q, &plan->work);
    rl_piece p = {
        .src_pos = h, .dst_pos = q,
        .src_client = src_client(g, h), .dst_client = dclient,
        .src_local = -1, .dst_local = -1,
        .summand = plan->nsummands ? (int)gr->summand : -1,
    };
    if (p.src_client != w->me && p.dst_client != w->me)
        return DT_OK;
    p.box = *box;
    p.bytes = (uint64_t)dt__numel(g->rank, box->len) * dt_dtype_size(plan->dtype);
    if (p.src_client == w->me)
        p.src_local = local_of(g, 1, h);
    if (p.dst_client == w->me)
        p.dst_local = local_of(g, 0, q);
    return push_piece(l, &p, gr->key);
}

/* This client's positions of `mesh` (of device type `type`), increasing. */
static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static dt_status my_positions(const rl_world *w, const dt_mesh *mesh, int64_t **out, int *n_out)
{
    int first, count, n = 0;
    dt__rl_client_devices(w, dt_mesh_device_type(mesh), w->me, &first, &count);
    int64_t *v = malloc(((size_t)count + 1) * sizeof *v);
    if (!v)
        return dt__error(DT_ERR_NO_MEMORY, "no memory to plan for %d local devices", count);
    for (int id = first; id < first + count; id++) {
        int64_t p = dt_mesh_position(mesh, id);
        if (p >= 0)
            v[n++] = p;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    *out = v;
    *n_out = n;
    return DT_OK;
}

/* The pieces this client receives: for each of its destination positions, the source groups
 * whose block meets its box, per tensor dim a run of source shards. */
static dt_status plan_receives(const geo *g, rl_plan *plan, piece_list *l)
{
    int64_t *mine = NULL, qc[DT_MESH_MAX_DIMS], lo[DT_MAX_RANK], hi[DT_MAX_RANK];
    int64_t bc[DT_MAX_RANK], kc[DT_MESH_MAX_DIMS];
    int n;
    dt_status st = my_positions(g->w, g->dm, &mine, &n);
    for (int i = 0; st == DT_OK && i < n; i++) {
        int64_t q = mine[i];
        rl_box qbox;
        int did = dt_mesh_device_id(g->dm, q), empty = 0;
        dt_layout_shard(g->dst, g->shape, q, qbox.off, qbox.len);
        if (dt__numel(g->rank, qbox.len) == 0)
            continue;
        dt_mesh_coords(g->dm, q, qc);
        if (dt__rl_gets_zeros(&g->pm, qc)) {
            int li = local_of(g, 0, q);
            if (li >= 0)
                plan->zero_dst[li] = 1;
            continue;
        }
        for (int d = 0; d < g->rank; d++) {
            shard_span(g->shape[d], g->sk[d], qbox.off[d], qbox.off[d] + qbox.len[d], &lo[d],
                       &hi[d]);
            empty |= lo[d] > hi[d];
        }
        if (empty)
            continue;
        for (int k = 0; k < g->pm.nkeep; k++)
            kc[k] = qc[g->pm.keep_dst[k]];
        for (int64_t s = 0; st == DT_OK && s < g->nsum; s++) {
            memcpy(bc, lo, sizeof bc);
            for (int done = 0; st == DT_OK && !done;) {
                group gr;
                rl_box box = {{0}, {0}};
                make_group(g, s, bc, kc, &gr);
                plan->work++;
                if (dt__rl_box_intersect(g->rank, &qbox, &gr.box, &box))
                    st = add_piece(g, plan, l, &gr, q, did, g->w->me, &box);
                done = 1; /* next block coordinates, last dim fastest */
                for (int d = g->rank - 1; d >= 0 && done; d--) {
                    if (++bc[d] <= hi[d])
                        done = 0;
                    else
                        bc[d] = lo[d];
                }
            }
        }
    }
    free(mine);
    return st;
}

static int cmp_group_key(const void *a, const void *b)
{
    const group *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* The pieces this client sends to others: for each source group it holds, the destination
 * positions whose box meets the group's block (per tensor dim a run of destination shards,
 * any coordinate on the destination's other mesh dims), where this client is the nearest
 * holder. */
static dt_status plan_sends(const geo *g, rl_plan *plan, piece_list *l)
{
    int64_t *mine = NULL, sc[DT_MESH_MAX_DIMS], bc[DT_MAX_RANK], kc[DT_MESH_MAX_DIMS];
    int n, ngroups = 0;
    group *groups = NULL;
    dt_status st = my_positions(g->w, g->sm, &mine, &n);
    if (st == DT_OK && !(groups = malloc(((size_t)n + 1) * sizeof *groups)))
        st = dt__error(DT_ERR_NO_MEMORY, "no memory to plan for %d local devices", n);
    for (int i = 0; st == DT_OK && i < n; i++) {
        int64_t s = 0;
        dt_mesh_coords(g->sm, mine[i], sc);
        for (int d = 0; d < g->rank; d++)
            bc[d] = g->smd[d] >= 0 ? sc[g->smd[d]] : 0;
        for (int k = 0; k < g->pm.nreduce; k++)
            s = s * g->ssize[g->pm.reduce_src[k]] + sc[g->pm.reduce_src[k]];
        for (int k = 0; k < g->pm.nkeep; k++)
            kc[k] = sc[g->pm.keep_src[k]];
        make_group(g, s, bc, kc, &groups[ngroups]);
        if (dt__numel(g->rank, groups[ngroups].box.len) > 0)
            ngroups++;
    }
    qsort(groups, (size_t)ngroups, sizeof *groups, cmp_group_key);
    for (int i = 0; st == DT_OK && i < ngroups; i++) {
        const group *gr = &groups[i];
        int64_t lo[DT_MESH_MAX_DIMS], hi[DT_MESH_MAX_DIMS], qc[DT_MESH_MAX_DIMS];
        int empty = 0;
        if (i > 0 && gr->key == groups[i - 1].key)
            continue;
        for (int m = 0; m < g->dmr; m++) {
            lo[m] = 0;
            hi[m] = g->dsize[m] - 1;
        }
        for (int k = 0; k < g->pm.nkeep; k++)
            lo[g->pm.keep_dst[k]] = hi[g->pm.keep_dst[k]] = gr->coord[g->pm.keep_src[k]];
        for (int d = 0; d < g->rank; d++)
            if (g->dmd[d] >= 0) {
                int m = g->dmd[d];
                shard_span(g->shape[d], g->dk[d], gr->box.off[d],
                           gr->box.off[d] + gr->box.len[d], &lo[m], &hi[m]);
                empty |= lo[m] > hi[m];
            }
        if (empty)
            continue;
        memcpy(qc, lo, sizeof qc);
        for (int done = 0; st == DT_OK && !done;) {
            int64_t q;
            rl_box qbox, box = {{0}, {0}};
            dt_mesh_position_of(g->dm, qc, &q);
            int did = dt_mesh_device_id(g->dm, q);
            int dclient = dt__rl_client(g->w, g->dtype, did);
            plan->work++;
            if (dclient != g->w->me && !dt__rl_gets_zeros(&g->pm, qc)) {
                dt_layout_shard(g->dst, g->shape, q, qbox.off, qbox.len);
                if (dt__numel(g->rank, qbox.len) > 0 &&
                    dt__rl_box_intersect(g->rank, &qbox, &gr->box, &box))
                    st = add_piece(g, plan, l, gr, q, did, dclient, &box);
            }
            done = 1; /* next destination coordinates, last dim fastest */
            for (int m = g->dmr - 1; m >= 0 && done; m--) {
                if (++qc[m] <= hi[m])
                    done = 0;
                else
                    qc[m] = lo[m];
            }
        }
    }
    free(groups);
    free(mine);
    return st;
}

static int cmp_entry(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    if (x->q != y->q)
        return x->q < y->q ? -1 : 1;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* Puts the pieces in the global plan order (destination position, then group key) and
 * counts them into the statistics. */
static dt_status finish(const geo *g, rl_plan *plan, piece_list *l)
{
    int sorted = 1;
    for (size_t i = 1; i < l->n && sorted; i++)
        sorted = cmp_entry(&l->e[i - 1], &l->e[i]) < 0;
    if (!sorted)
        qsort(l->e, l->n, sizeof *l->e, cmp_entry);
    plan->pieces = malloc((l->n + 1) * sizeof *plan->pieces);
    if (!plan->pieces)
        return dt__error(DT_ERR_NO_MEMORY, "no memory for a relayout plan of %zu pieces", l->n);
    for (size_t i = 0; i < l->n; i++) {
        const rl_piece *p = &l->v[l->e[i].idx];
        plan->pieces[plan->npieces++] = *p;
        dt_status st = dt__rl_count_piece(plan, g->w, p, g->stype,
                                          dt_mesh_device_id(g->sm, p->src_pos), g->dtype,
                                          dt_mesh_device_id(g->dm, p->dst_pos));
        if (st != DT_OK)
            return st;
    }
    dt__rl_plan_sort_stats(plan);
    return DT_OK;
}

/* The piece plan, or with patterns on, the pattern plan when src -> dst is one. */
static dt_status build(const dt_layout *src, const dt_layout *dst, int rank,
                       const int64_t *shape, dt_dtype dtype, const dt__rl_sim *sim,
                       int patterns, rl_plan **plan_out)
{
    rl_world w;
    geo g;
    rl_plan *plan = NULL;
    piece_list l = {0};
    dt_status st = dt__rl_world_init(&w, sim);
    if (st != DT_OK)
        return st;
    if (patterns) { /* regular patterns: relayout_pattern.c */
        st = dt__rl_pattern_plan(&w, src, dst, rank, shape, dtype, &plan);
        if (st != DT_OK || plan) {
            dt__rl_world_free(&w);
            if (st == DT_OK)
                *plan_out = plan;
            return st;
        }
    }
    geo_init(&g, &w, src, dst, rank, shape);
    st = dt__rl_map_partials(src, dst, &g.pm);
    if (st == DT_OK) {
        geo_groups(&g);
        st = dt__rl_plan_new(&w, src, dst, rank, shape, dtype, &g.pm, &plan);
    }
    if (st == DT_OK)
        st = local_table(&w, g.sm, &g.sfirst, &g.scount, &g.sloc);
    if (st == DT_OK)
        st = local_table(&w, g.dm, &g.dfirst, &g.dcount, &g.dloc);
    if (st == DT_OK)
        st = plan_receives(&g, plan, &l);
    /* With one client every piece is a receive of its own. */
    if (st == DT_OK && w.nclients > 1)
        st = plan_sends(&g, plan, &l);
    if (st == DT_OK)
        st = finish(&g, plan, &l);
    free(l.v);
    free(l.e);
    free(g.sloc);
    free(g.dloc);
    dt__rl_world_free(&w);
    if (st != DT_OK) {
        dt__rl_plan_free(plan);
        return st;
    }
    *plan_out = plan;
    return DT_OK;
}

dt_status dt__rl_plan_build_as(const dt_layout *src, const dt_layout *dst, int rank,
                               const int64_t *shape, dt_dtype dtype, const dt__rl_sim *sim,
                               rl_plan **plan_out)
{
    int patterns;
    dt_status st = dt__rl_patterns_enabled(&patterns);
    if (st != DT_OK)
        return st;
    return build(src, dst, rank, shape, dtype, sim, patterns, plan_out);
}

dt_status dt__rl_plan_build_general(const dt_layout *src, const dt_layout *dst, int rank,
                                    const int64_t *shape, dt_dtype dtype, const dt__rl_sim *sim,
                                    rl_plan **plan_out)
{
    return build(src, dst, rank, shape, dtype, sim, 0, plan_out);
}

dt_status dt__rl_plan_build(const dt_layout *src, const dt_layout *dst, int rank,
                            const int64_t *shape, dt_dtype dtype, rl_plan **plan_out)
{
    return dt__rl_plan_build_as(src, dst, rank, shape, dtype, NULL, plan_out);
}

void dt__rl_plan_free(rl_plan *plan)
{
    if (!plan)
        return;
    const dt__transport *t = plan->transport ? plan->transport : dt__transport_mpi();
    for (size_t i = 0; i < plan->npieces; i++)
        t->release(&plan->pieces[i].cache);
    free(plan->pieces);
    dt__rl_coll_free(plan->coll);
    free(plan->zero_dst);
    free(plan->stats);
    dt_layout_destroy(plan->src);
    dt_layout_destroy(plan->dst);
    free(plan);
}

/* ---- the two-level route across hosts --------------------------------------------------- */

/* 1 if every line of the mesh along dim m lies on one host. */
static int dim_inside_hosts(const dt_mesh *mesh, int m)
{
    dt_device_type type = dt_mesh_device_type(mesh);
    int64_t coords[DT_MESH_MAX_DIMS], stride = 1;
    for (int d = dt_mesh_rank(mesh) - 1; d > m; d--)
        stride *= dt_mesh_dim_size(mesh, d);
    for (int64_t p = 0; p < dt_mesh_size(mesh); p++) {
        dt_mesh_coords(mesh, p, coords);
        int64_t first = p - coords[m] * stride;
        int a = dt_device_client(type, dt_mesh_device_id(mesh, p));
        int b = dt_device_client(type, dt_mesh_device_id(mesh, first));
        if (dt__client_host(a) != dt__client_host(b))
            return 0;
    }
    return 1;
}

/* How a layout uses mesh dim m: the tensor dim sharded over it, -2 if partial, else -1. */
static int dim_use(const dt_layout *l, int m)
{
    for (int d = 0; d < dt_layout_rank(l); d++)
        if (dt_layout_spec_mesh_dim(l, d) == m)
            return d;
    for (int i = 0; i < dt_layout_num_partial(l); i++) {
        int d;
        dt_reduce_op op;
        dt_layout_partial(l, i, &d, &op);
        if (d == m)
            return -2;
    }
    return -1;
}

dt_status dt__rl_host_mid(const dt_layout *src, const dt_layout *dst, const int64_t *shape,
                          dt_layout **mid_out)
{
    *mid_out = NULL;
    const dt_mesh *mesh = dt_layout_mesh(dst);
    if (dt__num_hosts() < 2 || !dt_mesh_equal(dt_layout_mesh(src), mesh))
        return DT_OK;
    int nd = dt_mesh_rank(mesh), inside[DT_MESH_MAX_DIMS], m = -1, crosses = 0;
    for (int d = 0; d < nd; d++) {
        inside[d] = dim_inside_hosts(mesh, d);
        if (m < 0 && inside[d] && dt_mesh_dim_size(mesh, d) > 1 && dim_use(src, d) == -1 &&
            dim_use(dst, d) == -1)
            m = d;
        crosses |= !inside[d] && dim_use(src, d) != dim_use(dst, d);
    }
    if (m < 0 || !crosses)
        return DT_OK;
    /* The free tensor dim to spread over the host's devices: the longest one neither layout
     * shards. */
    int rank = dt_layout_rank(dst), t = -1;
    for (int d = 0; d < rank; d++)
        if (dt_layout_spec_mesh_dim(dst, d) < 0 && dt_layout_spec_mesh_dim(src, d) < 0 &&
            shape[d] >= dt_mesh_dim_size(mesh, m) && (t < 0 || shape[d] > shape[t]))
            t = d;
    if (t < 0)
        return DT_OK;
    const char *specs[DT_MAX_RANK], *pnames[DT_MESH_MAX_DIMS];
    dt_reduce_op pops[DT_MESH_MAX_DIMS];
    for (int d = 0; d < rank; d++)
        specs[d] = d == t ? dt_mesh_dim_name(mesh, m) : dt_layout_spec(dst, d);
    int np = dt_layout_num_partial(dst);
    for (int i = 0; i < np; i++) {
        int md;
        dt_layout_partial(dst, i, &md, &pops[i]);
        pnames[i] = dt_mesh_dim_name(mesh, md);
    }
    return dt_layout_create_partial(mesh, rank, specs, np, pnames, pops, mid_out);
}
