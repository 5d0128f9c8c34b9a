/* Relayout planning: intersect every destination shard's box with the source blocks' boxes;
 * each needed piece is taken once, from the holder nearest the receiver (same device, then
 * same client, then same host, then another host), with reductions for partial sources.
 * dt__rl_host_mid picks the middle layout of the two-level route across hosts. */
#include <stdlib.h>
#include <string.h>

#include "layout/layout_impl.h"

/* What the planner knows of one source position. */
typedef struct src_info {
    int64_t pos;
    int64_t key;      /* group: (block, summand, kept-partial coordinates) */
    int64_t summand;
    int device_id;
    int client;
    rl_box box;
} src_info;

static int cmp_src(const void *a, const void *b)
{
    const src_info *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Mesh dims of the source that stay partial in the destination (same name, size and op),
 * those that are reduced, and the destination's new partial dims. */
typedef struct partial_map {
    int nkeep;
    int keep_src[DT_MESH_MAX_DIMS], keep_dst[DT_MESH_MAX_DIMS];
    int nreduce;
    int reduce_src[DT_MESH_MAX_DIMS];
    dt_reduce_op reduce_op;
    int nnew;
    int new_dst[DT_MESH_MAX_DIMS];
    dt_reduce_op new_op[DT_MESH_MAX_DIMS];
} partial_map;

static int find_partial(const dt_layout *l, int mesh_dim, dt_reduce_op *op_out)
{
    for (int i = 0; i < dt_layout_num_partial(l); i++) {
        int d;
        dt_reduce_op op;
        dt_layout_partial(l, i, &d, &op);
        if (d == mesh_dim) {
            *op_out = op;
            return 1;
        }
    }
    return 0;
}

static dt_status map_partials(const dt_layout *src, const dt_layout *dst, partial_map *pm)
{
    const dt_mesh *sm = dt_layout_mesh(src), *dm = dt_layout_mesh(dst);
    memset(pm, 0, sizeof *pm);
    for (int i = 0; i < dt_layout_num_partial(src); i++) {
        int sd, dd;
        dt_reduce_op sop, dop;
        dt_layout_partial(src, i, &sd, &sop);
        dd = dt_mesh_dim_index(dm, dt_mesh_dim_name(sm, sd));
        if (dd >= 0 && dt_mesh_dim_size(dm, dd) == dt_mesh_dim_size(sm, sd) &&
            find_partial(dst, dd, &dop) && dop == sop) {
            pm->keep_src[pm->nkeep] = sd;
            pm->keep_dst[pm->nkeep++] = dd;
            continue;
        }
        if (pm->nreduce && sop != pm->reduce_op)
            return dt__error(DT_ERR_UNSUPPORTED,
                             "the source is partial with different reductions (%s and %s) "
                             "over the mesh dims to reduce; relayout them one at a time",
                             dt_reduce_op_name(pm->reduce_op), dt_reduce_op_name(sop));
        pm->reduce_op = sop;
        pm->reduce_src[pm->nreduce++] = sd;
    }
    for (int i = 0; i < dt_layout_num_partial(dst); i++) {
        int dd, kept = 0;
        dt_reduce_op dop;
        dt_layout_partial(dst, i, &dd, &dop);
        for (int k = 0; k < pm->nkeep; k++)
            kept |= pm->keep_dst[k] == dd;
        if (!kept) {
            pm->new_dst[pm->nnew] = dd;
            pm->new_op[pm->nnew++] = dop;
        }
    }
    return DT_OK;
}

static int box_intersect(int rank, const rl_box *a, const rl_box *b, rl_box *out)
{
    for (int d = 0; d < rank; d++) {
        int64_t lo = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
        int64_t hi_a = a->off[d] + a->len[d], hi_b = b->off[d] + b->len[d];
        int64_t hi = hi_a < hi_b ? hi_a : hi_b;
        if (hi <= lo)
            return 0;
        out->off[d] = lo;
        out->len[d] = hi - lo;
    }
    return 1;
}

/* Index of the component of `mesh` position `pos` on this client, or -1. */
static int local_index(const dt_mesh *mesh, int64_t pos)
{
    int id = dt_mesh_device_id(mesh, pos);
    for (int i = 0; i < dt_mesh_num_local_devices(mesh); i++)
        if (dt_mesh_local_device_id(mesh, i) == id)
            return i;
    return -1;
}

/* The holder of a group nearest to the receiver: the same device, else a device of the same
 * client, else one on the same host, else one of the others, spread over them by destination
 * position. */
static const src_info *nearest(const src_info *g, size_t n, dt_device_type stype, int dst_id,
                               dt_device_type dtype, int dst_client, int64_t dst_pos)
{
    const src_info *same_client = NULL;
    int host = dt__client_host(dst_client);
    size_t nhost = 0;
    for (size_t i = 0; i < n; i++) {
        if (stype == dtype && g[i].device_id == dst_id)
            return &g[i];
        if (!same_client && g[i].client == dst_client)
            same_client = &g[i];
        nhost += dt__client_host(g[i].client) == host;
    }
    if (same_client)
        return same_client;
    if (nhost) {
        size_t want = (size_t)dst_pos % nhost;
        for (size_t i = 0; i < n; i++)
            if (dt__client_host(g[i].client) == host && want-- == 0)
                return &g[i];
    }
    return &g[(size_t)dst_pos % n];
}

typedef struct piece_list {
    rl_piece *v;
    size_t n, cap;
} piece_list;

static dt_status push_piece(piece_list *l, const rl_piece *p)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        rl_piece *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return dt__error(DT_ERR_NO_MEMORY, "no memory for a relayout plan of %zu pieces",
                             cap);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *p;
    return DT_OK;
}

static dt_status add_stats(rl_plan *plan, dt_device_type type, int device_id,
                           dt_relayout_stats **out)
{
    for (int i = 0; i < plan->nstats; i++)
        if (plan->stats[i].device_type == type && plan->stats[i].device_id == device_id) {
            *out = &plan->stats[i];
            return DT_OK;
        }
    dt_relayout_stats *s = realloc(plan->stats, (size_t)(plan->nstats + 1) * sizeof *s);
    if (!s)
        return dt__error(DT_ERR_NO_MEMORY, "no memory for relayout statistics");
    plan->stats = s;
    *out = &s[plan->nstats++];
    memset(*out, 0, sizeof **out);
    (*out)->device_type = type;
    (*out)->device_id = device_id;
    return DT_OK;
}

static dt_status count_piece(rl_plan *plan, const rl_piece *p, dt_device_type stype, int sid,
                             dt_device_type dtype, int did, int me)
{
    dt_relayout_stats *s;
    dt_status st;
    int remote = p->src_client != p->dst_client;
    int cross = dt__client_host(p->src_client) != dt__client_host(p->dst_client);
    if (stype == dtype && sid == did) {
        if ((st = add_stats(plan, stype, sid, &s)) != DT_OK)
            return st;
        s->bytes_self += p->bytes;
        return DT_OK;
    }
    if (p->src_client == me) {
        if ((st = add_stats(plan, stype, sid, &s)) != DT_OK)
            return st;
        s->bytes_sent += p->bytes;
        s->bytes_sent_remote += remote ? p->bytes : 0;
        s->bytes_sent_cross_host += cross ? p->bytes : 0;
    }
    if (p->dst_client == me) {
        if ((st = add_stats(plan, dtype, did, &s)) != DT_OK)
            return st;
        s->bytes_received += p->bytes;
        s->bytes_received_remote += remote ? p->bytes : 0;
        s->bytes_received_cross_host += cross ? p->bytes : 0;
    }
    return DT_OK;
}

static int cmp_stats(const void *a, const void *b)
{
    const dt_relayout_stats *x = a, *y = b;
    if (x->device_type != y->device_type)
        return (int)x->device_type - (int)y->device_type;
    return x->device_id - y->device_id;
}

/* Fills src_info for every source position, sorted by group key. */
static dt_status describe_sources(const dt_layout *src, const partial_map *pm,
                                  const int64_t *shape, src_info **out)
{
    const dt_mesh *sm = dt_layout_mesh(src);
    int64_t n = dt_mesh_size(sm), nblocks = 1, nsum = 1, coords[DT_MESH_MAX_DIMS];
    int rank = dt_layout_rank(src);
    dt_device_type type = dt_mesh_device_type(sm);
    for (int d = 0; d < rank; d++)
        nblocks *= dt_layout_num_shards(src, d);
    for (int i = 0; i < pm->nreduce; i++)
        nsum *= dt_mesh_dim_size(sm, pm->reduce_src[i]);
    src_info *v = calloc((size_t)n, sizeof *v);
    if (!v)
        return dt__error(DT_ERR_NO_MEMORY, "no memory to plan over %lld devices", (long long)n);
    for (int64_t p = 0; p < n; p++) {
        src_info *s = &v[p];
        dt_mesh_coords(sm, p, coords);
        s->pos = p;
        s->device_id = dt_mesh_device_id(sm, p);
        s->client = dt_device_client(type, s->device_id);
        dt_layout_shard(src, shape, p, s->box.off, s->box.len);
        s->summand = 0;
        for (int i = 0; i < pm->nreduce; i++)
            s->summand = s->summand * dt_mesh_dim_size(sm, pm->reduce_src[i]) +
                         coords[pm->reduce_src[i]];
        int64_t kkey = 0;
        for (int i = 0; i < pm->nkeep; i++)
            kkey = kkey * dt_mesh_dim_size(sm, pm->keep_src[i]) + coords[pm->keep_src[i]];
        s->key = (kkey * nsum + s->summand) * nblocks + dt_layout_block_index(src, p);
    }
    qsort(v, (size_t)n, sizeof *v, cmp_src);
    *out = v;
    return DT_OK;
}

/* 1 if destination position q gets the reduction's identity (zeros) rather than data: it is
 * not the first member along a new sum-partial dim. Max/min/avg partials hold the value on
 * every member, which reduces to the same value. */
static int gets_zeros(const partial_map *pm, const int64_t *qcoords)
{
    for (int i = 0; i < pm->nnew; i++)
        if (pm->new_op[i] == DT_REDUCE_SUM && qcoords[pm->new_dst[i]] != 0)
            return 1;
    return 0;
}

dt_status dt__rl_plan_build(const dt_layout *src, const dt_layout *dst, int rank,
                            const int64_t *shape, dt_dtype dtype, rl_plan **plan_out)
{
    const dt_mesh *sm = dt_layout_mesh(src), *dm = dt_layout_mesh(dst);
    dt_device_type stype = dt_mesh_device_type(sm), dtype_dev = dt_mesh_device_type(dm);
    int me = dt_client_id();
    size_t elem = dt_dtype_size(dtype);
    partial_map pm;
    src_info *srcs = NULL;
    piece_list pieces = {0};
    dt_status st = map_partials(src, dst, &pm);
    if (st != DT_OK)
        return st;
    rl_plan *plan = calloc(1, sizeof *plan);
    if (!plan)
        return dt__error(DT_ERR_NO_MEMORY, "no memory for a relayout plan");
    plan->src = dt_layout_retain(src);
    plan->dst = dt_layout_retain(dst);
    plan->dtype = dtype;
    plan->rank = rank;
    memcpy(plan->shape, shape, (size_t)rank * sizeof *shape);
    plan->op = pm.reduce_op;
    plan->nsummands = 0;
    if (pm.nreduce) {
        plan->nsummands = 1;
        for (int i = 0; i < pm.nreduce; i++)
            plan->nsummands *= (int)dt_mesh_dim_size(sm, pm.reduce_src[i]);
    }
    plan->ndst_local = dt_mesh_num_local_devices(dm);
    plan->zero_dst = calloc((size_t)plan->ndst_local + 1, 1);
    if (!plan->zero_dst) {
        st = dt__error(DT_ERR_NO_MEMORY, "no memory for a relayout plan");
        goto err_free_plan;
    }
    if ((st = describe_sources(src, &pm, shape, &srcs)) != DT_OK)
        goto err_free_plan;

    int64_t nsrc = dt_mesh_size(sm), ndst = dt_mesh_size(dm);
    int64_t qcoords[DT_MESH_MAX_DIMS], scoords[DT_MESH_MAX_DIMS];
    for (int64_t q = 0; q < ndst; q++) {
        rl_box qbox;
        int did = dt_mesh_device_id(dm, q);
        int dclient = dt_device_client(dtype_dev, did);
        dt_layout_shard(dst, shape, q, qbox.off, qbox.len);
        if (dt__numel(rank, qbox.len) == 0)
            continue;
        dt_mesh_coords(dm, q, qcoords);
        if (gets_zeros(&pm, qcoords)) {
            if (dclient == me)
                plan->zero_dst[local_index(dm, q)] = 1;
            continue;
        }
        /* Walk the source groups; a group is a run of equal keys. */
        for (int64_t g0 = 0; g0 < nsrc;) {
            int64_t g1 = g0 + 1;
            while (g1 < nsrc && srcs[g1].key == srcs[g0].key)
                g1++;
            const src_info *first = &srcs[g0];
            rl_box box = {{0}, {0}};
            int match = box_intersect(rank, &qbox, &first->box, &box); /* rank 0: always */
            if (match && pm.nkeep) {
                dt_mesh_coords(sm, first->pos, scoords);
                for (int i = 0; i < pm.nkeep; i++)
                    match &= scoords[pm.keep_src[i]] == qcoords[pm.keep_dst[i]];
            }
            if (match) {
                const src_info *h = nearest(first, (size_t)(g1 - g0), stype, did, dtype_dev,
                                            dclient, q);
                rl_piece p = {
                    .src_pos = h->pos, .dst_pos = q,
                    .src_client = h->client, .dst_client = dclient,
                    .src_local = -1, .dst_local = -1,
                    .summand = plan->nsummands ? (int)h->summand : -1,
                };
                p.box = box;
                p.bytes = (uint64_t)dt__numel(rank, box.len) * elem;
                if (p.src_client == me || p.dst_client == me) {
                    if (p.src_client == me)
                        p.src_local = local_index(sm, p.src_pos);
                    if (p.dst_client == me)
                        p.dst_local = local_index(dm, q);
                    st = count_piece(plan, &p, stype, h->device_id, dtype_dev, did, me);
                    if (st == DT_OK)
                        st = push_piece(&pieces, &p);
                    if (st != DT_OK)
                        goto err_free_pieces;
                }
            }
            g0 = g1;
        }
    }
    free(srcs);
    plan->pieces = pieces.v;
    plan->npieces = pieces.n;
    if (plan->nstats)
        qsort(plan->stats, (size_t)plan->nstats, sizeof *plan->stats, cmp_stats);
    *plan_out = plan;
    return DT_OK;

err_free_pieces:
    free(pieces.v);
    free(srcs);
err_free_plan:
    dt__rl_plan_free(plan);
    return st;
}

void dt__rl_plan_free(rl_plan *plan)
{
    if (!plan)
        return;
    const dt__transport *t = plan->transport ? plan->transport : dt__transport_mpi();
    for (size_t i = 0; i < plan->npieces; i++)
        t->release(&plan->pieces[i].cache);
    free(plan->pieces);
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
    dt_reduce_op op;
    return find_partial(l, m, &op) ? -2 : -1;
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
