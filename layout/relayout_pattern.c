/* Relayout's regular patterns (issue 22): a relayout that changes how one mesh dim m is used,
 * as an all-gather, reduce-scatter, all-reduce or all-to-all along m, is recognised from the
 * two layouts and planned per mesh dim (one line of devices per local device, no pieces), on
 * meshes where every client's devices share one coordinate along m and each line lies on one
 * host (read once per mesh and world, then cached on the mesh). docs/relayout.md, "Regular patterns"; execution: relayout_coll.c. */
#include <stdlib.h>
#include <string.h>

#include "layout/relayout_plan_impl.h"
#include "mesh/mesh_facts.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* How a layout uses mesh dim m: the tensor dim it shards (>= 0), USE_PARTIAL, or USE_NONE. */
enum { USE_NONE = -1, USE_PARTIAL = -2 };

static int dim_use(const dt_layout *l, int m, dt_reduce_op *op_out)
{
    for (int d = 0; d < l->rank; d++)
        if (l->spec_dim[d] == m)
            return d;
    for (int i = 0; i < l->npartial; i++)
        if (l->partial_dim[i] == m) {
            *op_out = l->partial_op[i];
            return USE_PARTIAL;
        }
    return USE_NONE;
}

/* The pattern of src -> dst, or -1: exactly one mesh dim m changes, in one of the four ways,
 * and every tensor dim it splits divides evenly (equal blocks for the collectives). */
static int classify(const dt_layout *src, const dt_layout *dst, const int64_t *shape, int *m_out,
                    int *a_out, int *b_out)
{
    int m = -1, a = -1, b = -1;
    for (int j = 0; j < src->mesh_rank; j++) {
        dt_reduce_op so = DT_REDUCE_SUM, dop = DT_REDUCE_SUM;
        int su = dim_use(src, j, &so), du = dim_use(dst, j, &dop);
        if (su == du && (su != USE_PARTIAL || so == dop))
            continue;
        if (m >= 0)
            return -1;
        m = j;
        a = su;
        b = du;
    }
    if (m < 0 || src->mesh_dim_size[m] < 2)
        return -1;
    int64_t k = src->mesh_dim_size[m];
    if ((a >= 0 && shape[a] % k) || (b >= 0 && shape[b] % k))
        return -1;
    *m_out = m;
    *a_out = a;
    *b_out = b;
    if (a >= 0 && b == USE_NONE)
        return RL_COLL_ALLGATHER;
    if (a >= 0 && b >= 0)
        return RL_COLL_ALLTOALL;
    if (a == USE_PARTIAL && b >= 0)
        return RL_COLL_REDUCE_SCATTER;
    if (a == USE_PARTIAL && b == USE_NONE)
        return RL_COLL_ALLREDUCE;
    return -1;
}

/* 1 if every client's devices of the mesh share one coordinate along m (so each holds at most
 * one device of every line along m) and every line lies on one host; -1 without memory.
 * O(mesh size + clients): the same answer on every client, so all take the same path. */
static int lines_apply(const rl_world *w, const dt_mesh *mesh, int64_t stride, int64_t k)
{
    dt_device_type type = dt_mesh_device_type(mesh);
    int64_t *coord_of = malloc(((size_t)w->nclients + 1) * sizeof *coord_of);
    int64_t outer = dt_mesh_size(mesh) / (k * stride);
    int ok = coord_of != NULL;
    if (!coord_of)
        return -1;
    for (int c = 0; ok && c < w->nclients; c++)
        coord_of[c] = -1;
    /* Positions (o * k + i) * stride + r: line (o, r), coordinate i; no divisions. */
    for (int64_t o = 0; ok && o < outer; o++)
        for (int64_t i = 0; ok && i < k; i++)
            for (int64_t r = 0, p = (o * k + i) * stride; ok && r < stride; r++, p++) {
                int c = dt__rl_client(w, type, dt_mesh_device_id(mesh, p));
                ok = c >= 0 && c < w->nclients && (coord_of[c] < 0 || coord_of[c] == i);
                if (!ok)
                    break;
                coord_of[c] = i;
                if (!w->one_host && i > 0) {
                    int c0 = dt__rl_client(w, type, dt_mesh_device_id(mesh, p - i * stride));
                    ok = dt__rl_host(w, c0) == dt__rl_host(w, c);
                }
            }
    free(coord_of);
    return ok;
}

/* The world's key for the mesh's fact cache: a simulated table by its shape, the runtime's
 * by its client count and topology (fixed from dt_init to dt_finalize). */
static void world_key(const rl_world *w, int key[DT__MESH_FACT_KEY_INTS])
{
    if (w->sim) {
        key[0] = 1;
        key[1] = w->sim->nclients;
        key[2] = w->sim->devices_per_client;
        key[3] = w->sim->clients_per_host;
    } else {
        key[0] = 2;
        key[1] = w->nclients;
        key[2] = w->one_host;
        key[3] = 0;
    }
}

/* lines_apply for mesh dim m, read from the mesh's fact cache (mesh/mesh_facts.c): the first
 * plan on a mesh under a world reads the device table once for every mesh dim (bit j of the
 * fact: dim j's lines apply), later plans take O(1) whatever the mesh size (issue 22). */
static int lines_apply_cached(const rl_world *w, const dt_mesh *mesh, int m)
{
    int key[DT__MESH_FACT_KEY_INTS];
    uint64_t mask = 0;
    world_key(w, key);
    if (dt__mesh_fact_get(mesh, key, &mask))
        return (int)(mask >> m & 1);
    int rank = dt_mesh_rank(mesh);
    for (int j = 0; j < rank; j++) {
        int64_t k = dt_mesh_dim_size(mesh, j), stride = 1;
        for (int i = rank - 1; i > j; i--)
            stride *= dt_mesh_dim_size(mesh, i);
        int ok = k > 0 ? lines_apply(w, mesh, stride, k) : 0;
        if (ok < 0)
            return 0;   /* no memory: no pattern this time, nothing cached */
        mask |= (uint64_t)ok << j;
    }
    dt__mesh_fact_put(mesh, key, mask);
    return (int)(mask >> m & 1);
}

/* Bytes of a box: the layout's shard of position pos with tensor dim d's extent replaced by
 * shard j of k (d < 0: unchanged). */
static void line_box(const dt_layout *l, const int64_t *shape, int64_t pos, int d, int64_t k,
                     int64_t j, rl_box *box)
{
    dt_layout_shard(l, shape, pos, box->off, box->len);
    if (d >= 0)
        dt_shard_range(shape[d], k, j, &box->off[d], &box->len[d]);
}

/* The block a member sends to each other member (and receives from each). */
static uint64_t block_bytes(const rl_coll *c, const rl_plan *plan, int64_t pos)
{
    rl_box box;
    switch (c->kind) {
    case RL_COLL_ALLTOALL: /* my source shard cut along the destination's dim */
        line_box(plan->src, plan->shape, pos, c->b, c->k, 0, &box);
        break;
    case RL_COLL_REDUCE_SCATTER: /* a destination shard's summand */
        line_box(plan->dst, plan->shape, pos, -1, c->k, 0, &box);
        break;
    default: /* all-gather, all-reduce: the whole source shard */
        line_box(plan->src, plan->shape, pos, -1, c->k, 0, &box);
        break;
    }
    return (uint64_t)dt__numel(plan->rank, box.len) * dt_dtype_size(plan->dtype);
}

/* Counts line i's traffic into the statistics as three pieces: the own block (self), and
 * k-1 blocks sent to and received from the other members (on this host: lines_apply). */
static dt_status count_line(rl_plan *plan, const rl_world *w, const rl_line *ln, int i_peer)
{
    const rl_coll *c = plan->coll;
    const dt_mesh *mesh = dt_layout_mesh(plan->src);
    dt_device_type type = dt_mesh_device_type(mesh);
    int me_id = dt_mesh_device_id(mesh, ln->pos);
    int peer_id = dt_mesh_device_id(mesh, ln->base + i_peer * c->stride);
    uint64_t b = block_bytes(c, plan, ln->pos);
    rl_piece self = {.src_pos = ln->pos,
                     .dst_pos = ln->pos,
                     .src_client = w->me,
                     .dst_client = w->me,
                     .bytes = b};
    rl_piece send = {.src_pos = ln->pos,
                     .src_client = w->me,
                     .dst_client = ln->clients[i_peer],
                     .bytes = b * (uint64_t)(c->k - 1)};
    rl_piece recv = {.dst_pos = ln->pos,
                     .src_client = ln->clients[i_peer],
                     .dst_client = w->me,
                     .bytes = b * (uint64_t)(c->k - 1)};
    dt_status st = dt__rl_count_piece(plan, w, &self, type, me_id, type, me_id);
    if (st == DT_OK)
        st = dt__rl_count_piece(plan, w, &send, type, me_id, type, peer_id);
    if (st == DT_OK)
        st = dt__rl_count_piece(plan, w, &recv, type, peer_id, type, me_id);
    return st;
}

static int cmp_line(const void *a, const void *b)
{
    const rl_line *x = a, *y = b;
    return x->base < y->base ? -1 : x->base > y->base;
}

/* One line per local device of the mesh, in line order (the order of the collectives). */
static dt_status make_lines(rl_coll *c, const rl_world *w, const dt_mesh *mesh)
{
    dt_device_type type = dt_mesh_device_type(mesh);
    int first, count;
    dt__rl_client_devices(w, type, w->me, &first, &count);
    c->lines = calloc((size_t)count + 1, sizeof *c->lines);
    if (!c->lines)
        return dt__error(DT_ERR_NO_MEMORY, "no memory to plan for %d local devices", count);
    for (int id = first; id < first + count; id++) {
        int64_t p = dt_mesh_position(mesh, id);
        if (p < 0)
            continue;
        rl_line *ln = &c->lines[c->nlines++];
        ln->pos = p;
        ln->coord = p / c->stride % c->k;
        ln->base = p - ln->coord * c->stride;
        ln->local = dt__rl_local_index(w, mesh, p);
        ln->clients = malloc((size_t)c->k * sizeof *ln->clients);
        if (!ln->clients)
            return dt__error(DT_ERR_NO_MEMORY, "no memory for a line of %lld clients",
                             (long long)c->k);
        for (int64_t j = 0; j < c->k; j++)
            ln->clients[j] =
                dt__rl_client(w, type, dt_mesh_device_id(mesh, ln->base + j * c->stride));
    }
    qsort(c->lines, (size_t)c->nlines, sizeof *c->lines, cmp_line);
    return DT_OK;
}

void dt__rl_coll_free(rl_coll *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nlines; i++)
        free(c->lines[i].clients);
    free(c->lines);
    free(c);
}

dt_status dt__rl_patterns_enabled(int *on_out)
{
    const char *v = getenv("DT_RELAYOUT_PATTERNS");
    *on_out = 1;
    if (!v || !*v || strcmp(v, "1") == 0)
        return DT_OK;
    if (strcmp(v, "0") == 0) {
        *on_out = 0;
        return DT_OK;
    }
    return dt__error(DT_ERR_INVALID_ARGUMENT,
                     "DT_RELAYOUT_PATTERNS='%s': expected 0 (pieces only) or 1 (default)", v);
}

dt_status dt__rl_pattern_plan(const rl_world *w, const dt_layout *src, const dt_layout *dst,
                              int rank, const int64_t *shape, dt_dtype dtype, rl_plan **plan_out)
{
    *plan_out = NULL;
    const dt_mesh *mesh = dt_layout_mesh(src);
    int m, a, b, kind;
    if (!dt_mesh_equal(mesh, dt_layout_mesh(dst)) || dt__numel(rank, shape) == 0 ||
        (kind = classify(src, dst, shape, &m, &a, &b)) < 0)
        return DT_OK;
    int64_t k = src->mesh_dim_size[m], stride = 1;
    for (int j = src->mesh_rank - 1; j > m; j--)
        stride *= src->mesh_dim_size[j];
    if (!lines_apply_cached(w, mesh, m))
        return DT_OK;
    rl_partial_map pm;
    rl_plan *plan = NULL;
    dt_status st = dt__rl_map_partials(src, dst, &pm);
    if (st == DT_OK)
        st = dt__rl_plan_new(w, src, dst, rank, shape, dtype, &pm, &plan);
    if (st != DT_OK)
        return st;
    rl_coll *c = calloc(1, sizeof *c);
    if (!c) {
        dt__rl_plan_free(plan);
        return dt__error(DT_ERR_NO_MEMORY, "no memory for a relayout plan");
    }
    *c = (rl_coll){.kind = kind, .m = m, .k = k, .stride = stride, .a = a, .b = b};
    plan->coll = c;
    st = make_lines(c, w, mesh);
    for (int i = 0; st == DT_OK && i < c->nlines; i++) {
        int peer = (int)((c->lines[i].coord + 1) % k);
        st = count_line(plan, w, &c->lines[i], peer);
        plan->work += (uint64_t)k;
    }
    if (st != DT_OK) {
        dt__rl_plan_free(plan);
        return st;
    }
    dt__rl_plan_sort_stats(plan);
    *plan_out = plan;
    return DT_OK;
}
