/* The former relayout planner, kept as the reference of tests/relayout and bench/run scale:
 * every client walks every destination position against every source group, O(N^2) work
 * per plan, and keeps the pieces it sends, receives or copies. relayout_plan.c must produce
 * exactly its plans. */
#include <stdlib.h>
#include <string.h>

#include "layout/relayout_plan_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* What the planner knows of one source position. */
typedef struct src_info {
    int64_t pos;
    int64_t key;      /* group: (kept-partial coordinates, summand, block) */
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

/* The holder of a group nearest to the receiver: the same device, else a device of the same
 * client, else one on the same host, else one of the others, spread over them by destination
 * position. */
static const src_info *nearest(const rl_world *w, const src_info *g, size_t n,
                               dt_device_type stype, int dst_id, dt_device_type dtype,
                               int dst_client, int64_t dst_pos)
{
    const src_info *same_client = NULL;
    int host = dt__rl_host(w, dst_client);
    size_t nhost = 0;
    for (size_t i = 0; i < n; i++) {
        if (stype == dtype && g[i].device_id == dst_id)
            return &g[i];
        if (!same_client && g[i].client == dst_client)
            same_client = &g[i];
        nhost += dt__rl_host(w, g[i].client) == host;
    }
    if (same_client)
        return same_client;
    if (nhost) {
        size_t want = (size_t)dst_pos % nhost;
        for (size_t i = 0; i < n; i++)
            if (dt__rl_host(w, g[i].client) == host && want-- == 0)
                return &g[i];
    }
    return &g[(size_t)dst_pos % n];
}

/* Fills src_info for every source position, sorted by group key. */
static dt_status describe_sources(const rl_world *w, const dt_layout *src,
                                  const rl_partial_map *pm, const int64_t *shape,
                                  src_info **out)
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
        s->client = dt__rl_client(w, type, s->device_id);
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

static dt_status push_piece(rl_plan *plan, size_t *cap, const rl_piece *p)
{
    if (plan->npieces == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        rl_piece *v = realloc(plan->pieces, c * sizeof *v);
        if (!v)
            return dt__error(DT_ERR_NO_MEMORY, "no memory for a relayout plan of %zu pieces",
                             c);
        plan->pieces = v;
        *cap = c;
    }
    plan->pieces[plan->npieces++] = *p;
    return DT_OK;
}

static dt_status build(const rl_world *w, const dt_layout *src, const dt_layout *dst, int rank,
                       const int64_t *shape, dt_dtype dtype, rl_plan **plan_out)
{
    const dt_mesh *sm = dt_layout_mesh(src), *dm = dt_layout_mesh(dst);
    dt_device_type stype = dt_mesh_device_type(sm), dtype_dev = dt_mesh_device_type(dm);
    int me = w->me;
    size_t elem = dt_dtype_size(dtype), cap = 0;
    rl_partial_map pm;
    rl_plan *plan = NULL;
    src_info *srcs = NULL;
    dt_status st = dt__rl_map_partials(src, dst, &pm);
    if (st == DT_OK)
        st = dt__rl_plan_new(w, src, dst, rank, shape, dtype, &pm, &plan);
    if (st == DT_OK)
        st = describe_sources(w, src, &pm, shape, &srcs);
    if (st != DT_OK)
        goto fail;

    int64_t nsrc = dt_mesh_size(sm), ndst = dt_mesh_size(dm);
    int64_t qcoords[DT_MESH_MAX_DIMS], scoords[DT_MESH_MAX_DIMS];
    for (int64_t q = 0; q < ndst; q++) {
        rl_box qbox;
        int did = dt_mesh_device_id(dm, q);
        int dclient = dt__rl_client(w, dtype_dev, did);
        dt_layout_shard(dst, shape, q, qbox.off, qbox.len);
        if (dt__numel(rank, qbox.len) == 0)
            continue;
        dt_mesh_coords(dm, q, qcoords);
        if (dt__rl_gets_zeros(&pm, qcoords)) {
            int li = dclient == me ? dt__rl_local_index(w, dm, q) : -1;
            if (li >= 0)
                plan->zero_dst[li] = 1;
            continue;
        }
        /* Walk the source groups; a group is a run of equal keys. */
        for (int64_t g0 = 0; g0 < nsrc;) {
            int64_t g1 = g0 + 1;
            while (g1 < nsrc && srcs[g1].key == srcs[g0].key)
                g1++;
            const src_info *first = &srcs[g0];
            rl_box box = {{0}, {0}};
            int match = dt__rl_box_intersect(rank, &qbox, &first->box, &box);
            plan->work++;
            if (match && pm.nkeep) {
                dt_mesh_coords(sm, first->pos, scoords);
                for (int i = 0; i < pm.nkeep; i++)
                    match &= scoords[pm.keep_src[i]] == qcoords[pm.keep_dst[i]];
            }
            if (match) {
                const src_info *h = nearest(w, first, (size_t)(g1 - g0), stype, did, dtype_dev,
                                            dclient, q);
                plan->work += (uint64_t)(g1 - g0);
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
                        p.src_local = dt__rl_local_index(w, sm, p.src_pos);
                    if (p.dst_client == me)
                        p.dst_local = dt__rl_local_index(w, dm, q);
                    st = dt__rl_count_piece(plan, w, &p, stype, h->device_id, dtype_dev, did);
                    if (st == DT_OK)
                        st = push_piece(plan, &cap, &p);
                    if (st != DT_OK)
                        goto fail;
                }
            }
            g0 = g1;
        }
    }
    free(srcs);
    dt__rl_plan_sort_stats(plan);
    *plan_out = plan;
    return DT_OK;

fail:
    free(srcs);
    dt__rl_plan_free(plan);
    return st;
}

dt_status dt__rl_plan_build_ref(const dt_layout *src, const dt_layout *dst, int rank,
                                const int64_t *shape, dt_dtype dtype, const dt__rl_sim *sim,
                                rl_plan **plan_out)
{
    rl_world w;
    dt_status st = dt__rl_world_init(&w, sim);
    if (st != DT_OK)
        return st;
    st = build(&w, src, dst, rank, shape, dtype, plan_out);
    dt__rl_world_free(&w);
    return st;
}
