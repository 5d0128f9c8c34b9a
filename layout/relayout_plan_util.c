/* What both relayout planners use: the world a plan is made for (the runtime's device table
 * or a simulated one), the map of partial mesh dims, and filling a plan's header and
 * statistics. */
#include <stdlib.h>
#include <string.h>

#include "layout/relayout_plan_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"

static dt_status stat_tables(rl_world *w)
{
    for (int t = 0; t < 2; t++) {
        dt__rl_client_devices(w, t == 0 ? DT_DEVICE_CPU : DT_DEVICE_GPU, w->me,
                              &w->mine_first[t], &w->mine_count[t]);
        w->stat_of[t] = malloc(((size_t)w->mine_count[t] + 1) * sizeof *w->stat_of[t]);
        if (!w->stat_of[t]) {
            dt__rl_world_free(w);
            return dt__error(DT_ERR_NO_MEMORY, "no memory to plan for %d local devices",
                             w->mine_count[t]);
        }
        for (int i = 0; i < w->mine_count[t]; i++)
            w->stat_of[t][i] = -1;
    }
    return DT_OK;
}

dt_status dt__rl_world_init(rl_world *w, const dt__rl_sim *sim)
{
    memset(w, 0, sizeof *w);
    w->sim = sim;
    if (sim) {
        if (sim->nclients < 1 || sim->devices_per_client < 1 || sim->clients_per_host < 1 ||
            sim->me < 0 || sim->me >= sim->nclients)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "relayout simulation: bad table (%d clients, %d devices each, "
                             "%d per host, as client %d)", sim->nclients,
                             sim->devices_per_client, sim->clients_per_host, sim->me);
        w->me = sim->me;
        w->nclients = sim->nclients;
        w->one_host = sim->nclients <= sim->clients_per_host;
        return stat_tables(w);
    }
    w->me = dt_client_id();
    w->nclients = dt_num_clients();
    w->one_host = dt__num_hosts() <= 1;
    for (int t = 0; t < 2; t++) {
        const int *counts = dt__client_device_counts(t == 0 ? DT_DEVICE_CPU : DT_DEVICE_GPU);
        w->first[t] = calloc((size_t)w->nclients + 1, sizeof *w->first[t]);
        if (!w->first[t]) {
            dt__rl_world_free(w);
            return dt__error(DT_ERR_NO_MEMORY, "no memory to plan over %d clients",
                             w->nclients);
        }
        for (int c = 0; counts && c < w->nclients; c++)
            w->first[t][c + 1] = w->first[t][c] + counts[c];
    }
    return stat_tables(w);
}

void dt__rl_world_free(rl_world *w)
{
    for (int t = 0; t < 2; t++) {
        free(w->first[t]);
        free(w->stat_of[t]);
        w->first[t] = NULL;
        w->stat_of[t] = NULL;
    }
}

int dt__rl_client(const rl_world *w, dt_device_type type, int device_id)
{
    if (!w->sim)
        return dt_device_client(type, device_id);
    return device_id >= 0 && device_id / w->sim->devices_per_client < w->sim->nclients
               ? device_id / w->sim->devices_per_client
               : -1;
}

int dt__rl_host(const rl_world *w, int client)
{
    if (!w->sim)
        return dt__client_host(client);
    return client >= 0 ? client / w->sim->clients_per_host : -1;
}

void dt__rl_client_devices(const rl_world *w, dt_device_type type, int client, int *first,
                           int *count)
{
    *first = *count = 0;
    if (client < 0 || client >= w->nclients)
        return;
    if (w->sim) {
        *first = client * w->sim->devices_per_client;
        *count = w->sim->devices_per_client;
    } else if (type == DT_DEVICE_CPU || type == DT_DEVICE_GPU) {
        const int *f = w->first[type == DT_DEVICE_CPU ? 0 : 1];
        *first = f[client];
        *count = f[client + 1] - f[client];
    }
}

int dt__rl_local_index(const rl_world *w, const dt_mesh *mesh, int64_t pos)
{
    int id = dt_mesh_device_id(mesh, pos);
    if (w->sim) {
        int first = w->me * w->sim->devices_per_client;
        return id >= first && id - first < w->sim->devices_per_client ? id - first : -1;
    }
    for (int i = 0; i < dt_mesh_num_local_devices(mesh); i++)
        if (dt_mesh_local_device_id(mesh, i) == id)
            return i;
    return -1;
}

int dt__rl_num_local(const rl_world *w, const dt_mesh *mesh)
{
    return w->sim ? w->sim->devices_per_client : dt_mesh_num_local_devices(mesh);
}

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

dt_status dt__rl_map_partials(const dt_layout *src, const dt_layout *dst, rl_partial_map *pm)
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

/* Max/min/avg partials hold the value on every member, which reduces to the same value. */
int dt__rl_gets_zeros(const rl_partial_map *pm, const int64_t *qcoords)
{
    for (int i = 0; i < pm->nnew; i++)
        if (pm->new_op[i] == DT_REDUCE_SUM && qcoords[pm->new_dst[i]] != 0)
            return 1;
    return 0;
}

int dt__rl_box_intersect(int rank, const rl_box *a, const rl_box *b, rl_box *out)
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

dt_status dt__rl_plan_new(const rl_world *w, const dt_layout *src, const dt_layout *dst,
                          int rank, const int64_t *shape, dt_dtype dtype,
                          const rl_partial_map *pm, rl_plan **plan_out)
{
    const dt_mesh *sm = dt_layout_mesh(src), *dm = dt_layout_mesh(dst);
    rl_plan *plan = calloc(1, sizeof *plan);
    if (!plan)
        return dt__error(DT_ERR_NO_MEMORY, "no memory for a relayout plan");
    plan->src = dt_layout_retain(src);
    plan->dst = dt_layout_retain(dst);
    plan->dtype = dtype;
    plan->rank = rank;
    memcpy(plan->shape, shape, (size_t)rank * sizeof *shape);
    plan->op = pm->reduce_op;
    plan->nsummands = 0;
    if (pm->nreduce) {
        plan->nsummands = 1;
        for (int i = 0; i < pm->nreduce; i++)
            plan->nsummands *= (int)dt_mesh_dim_size(sm, pm->reduce_src[i]);
    }
    plan->ndst_local = dt__rl_num_local(w, dm);
    plan->zero_dst = calloc((size_t)plan->ndst_local + 1, 1);
    if (!plan->zero_dst) {
        dt__rl_plan_free(plan);
        return dt__error(DT_ERR_NO_MEMORY, "no memory for a relayout plan");
    }
    *plan_out = plan;
    return DT_OK;
}

/* The statistics entry of a device of this client, found through w's table. */
static dt_status add_stats(rl_plan *plan, const rl_world *w, dt_device_type type,
                           int device_id, dt_relayout_stats **out)
{
    int t = type == DT_DEVICE_GPU, k = device_id - w->mine_first[t];
    int *slot = (type == DT_DEVICE_CPU || type == DT_DEVICE_GPU) && k >= 0 &&
                k < w->mine_count[t] ? &w->stat_of[t][k] : NULL;
    if (slot && *slot >= 0) {
        *out = &plan->stats[*slot];
        return DT_OK;
    }
    for (int i = slot ? plan->nstats : 0; i < plan->nstats; i++)
        if (plan->stats[i].device_type == type && plan->stats[i].device_id == device_id) {
            *out = &plan->stats[i];
            return DT_OK;
        }
    if (slot)
        *slot = plan->nstats;
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

dt_status dt__rl_count_piece(rl_plan *plan, const rl_world *w, const rl_piece *p,
                             dt_device_type stype, int sid, dt_device_type dtype, int did)
{
    int me = w->me;
    dt_relayout_stats *s;
    dt_status st;
    int remote = p->src_client != p->dst_client;
    int cross = dt__rl_host(w, p->src_client) != dt__rl_host(w, p->dst_client);
    if (stype == dtype && sid == did) {
        if ((st = add_stats(plan, w, stype, sid, &s)) != DT_OK)
            return st;
        s->bytes_self += p->bytes;
        return DT_OK;
    }
    if (p->src_client == me) {
        if ((st = add_stats(plan, w, stype, sid, &s)) != DT_OK)
            return st;
        s->bytes_sent += p->bytes;
        s->bytes_sent_remote += remote ? p->bytes : 0;
        s->bytes_sent_cross_host += cross ? p->bytes : 0;
    }
    if (p->dst_client == me) {
        if ((st = add_stats(plan, w, dtype, did, &s)) != DT_OK)
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

void dt__rl_plan_sort_stats(rl_plan *plan)
{
    if (plan->nstats)
        qsort(plan->stats, (size_t)plan->nstats, sizeof *plan->stats, cmp_stats);
}
