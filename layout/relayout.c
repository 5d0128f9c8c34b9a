/* Public relayout entry points: validation, the plan cache, and the last plan's statistics. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "layout/layout_impl.h"
#include "layout/tensor_dev.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/shm.h"
#include "runtime/util.h"
#include "runtime/record.h"

enum { CACHE_SLOTS = 32 };

typedef struct cache_slot {
    rl_plan *plan;
    uint64_t used;
} cache_slot;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cache_slot cache[CACHE_SLOTS];
static uint64_t cache_clock;
static int cache_hooked;
static dt_relayout_stats *last_stats;
static int last_nstats = -1, last_cached;

void dt_relayout_cache_clear(void)
{
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < CACHE_SLOTS; i++) {
        dt__rl_plan_free(cache[i].plan);
        cache[i].plan = NULL;
    }
    free(last_stats);
    last_stats = NULL;
    last_nstats = -1;
    pthread_mutex_unlock(&cache_lock);
}

static int plan_matches(const rl_plan *p, const dt_layout *src, const dt_layout *dst, int rank,
                        const int64_t *shape, dt_dtype dtype)
{
    return p && p->dtype == dtype && p->rank == rank &&
           memcmp(p->shape, shape, (size_t)rank * sizeof *shape) == 0 &&
           dt_layout_equal(p->src, src) && dt_layout_equal(p->dst, dst) &&
           dt_mesh_equal(dt_layout_mesh(p->src), dt_layout_mesh(src)) &&
           dt_mesh_equal(dt_layout_mesh(p->dst), dt_layout_mesh(dst));
}

/* Finds or builds the plan. The cache owns it; callers use it under no lock because
 * relayouts are collective and so issued by one thread per client at a time. */
static dt_status get_plan(const dt_layout *src, const dt_layout *dst, int rank,
                          const int64_t *shape, dt_dtype dtype, rl_plan **plan_out, int *hit_out)
{
    dt_status st = DT_OK;
    rl_plan *plan = NULL;
    pthread_mutex_lock(&cache_lock);
    if (!cache_hooked && dt__at_finalize(dt_relayout_cache_clear) == DT_OK)
        cache_hooked = 1;
    *hit_out = 0;
    cache_slot *victim = &cache[0];
    for (int i = 0; i < CACHE_SLOTS; i++) {
        if (plan_matches(cache[i].plan, src, dst, rank, shape, dtype)) {
            plan = cache[i].plan;
            cache[i].used = ++cache_clock;
            *hit_out = 1;
            break;
        }
        if (!cache[i].plan || (victim->plan && cache[i].used < victim->used))
            victim = &cache[i];
    }
    if (!plan) {
        st = dt__rl_plan_build(src, dst, rank, shape, dtype, &plan);
        if (st == DT_OK) {
            dt__rl_plan_free(victim->plan);
            victim->plan = plan;
            victim->used = ++cache_clock;
        }
    }
    if (st == DT_OK)
        *plan_out = plan;
    pthread_mutex_unlock(&cache_lock);
    return st;
}

/* Records the traffic of the plans just executed (summed per device) as the last stats. */
static void record_stats(rl_plan *const *plans, int nplans, int cached)
{
    int cap = 0;
    for (int i = 0; i < nplans; i++)
        cap += plans[i]->nstats;
    dt_relayout_stats *s = calloc((size_t)cap + 1, sizeof *s);
    if (!s)
        return;
    int n = 0;
    for (int i = 0; i < nplans; i++)
        for (int j = 0; j < plans[i]->nstats; j++) {
            const dt_relayout_stats *x = &plans[i]->stats[j];
            int k = 0;
            while (k < n && (s[k].device_type != x->device_type || s[k].device_id != x->device_id))
                k++;
            if (k == n) {
                s[n].device_type = x->device_type;
                s[n++].device_id = x->device_id;
            }
            s[k].bytes_sent += x->bytes_sent;
            s[k].bytes_received += x->bytes_received;
            s[k].bytes_sent_remote += x->bytes_sent_remote;
            s[k].bytes_received_remote += x->bytes_received_remote;
            s[k].bytes_self += x->bytes_self;
            s[k].bytes_sent_cross_host += x->bytes_sent_cross_host;
            s[k].bytes_received_cross_host += x->bytes_received_cross_host;
        }
    pthread_mutex_lock(&cache_lock);
    free(last_stats);
    last_stats = s;
    last_nstats = n;
    last_cached = cached;
    pthread_mutex_unlock(&cache_lock);
}

dt_status dt_relayout_last_stats(int cap, dt_relayout_stats *stats_out, int *count_out,
                                 int *cached_out)
{
    if (cap < 0 || (cap > 0 && !stats_out) || !count_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_relayout_last_stats: bad arguments");
    pthread_mutex_lock(&cache_lock);
    if (last_nstats < 0) {
        pthread_mutex_unlock(&cache_lock);
        return dt__error(DT_ERR_STATE, "no relayout has run on this client yet");
    }
    int n = last_nstats < cap ? last_nstats : cap;
    if (n)
        memcpy(stats_out, last_stats, (size_t)n * sizeof *stats_out);
    *count_out = last_nstats;
    if (cached_out)
        *cached_out = last_cached;
    pthread_mutex_unlock(&cache_lock);
    return DT_OK;
}

static dt_status check_target(const dt_tensor *src, const dt_layout *layout, int same_mesh)
{
    if (!src || !layout)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "relayout: NULL tensor or layout");
    const dt_layout *sl = dt_tensor_layout(src);
    if (dt_layout_rank(layout) != dt_tensor_rank(src))
        return dt__error(DT_ERR_SHAPE, "relayout: the layout has rank %d but the tensor %d",
                         dt_layout_rank(layout), dt_tensor_rank(src));
    if (same_mesh && !dt_mesh_equal(dt_layout_mesh(sl), dt_layout_mesh(layout)))
        return dt__error(DT_ERR_SHAPE, "relayout: the layout is on another mesh than the "
                                       "tensor; use dt_copy_to_mesh");
    return dt_mesh_check_devices(dt_layout_mesh(layout));
}

/* A partial source whose destination is not sharded over a reduced mesh dim would have every
 * device receive k-1 whole summands. Going through a middle layout that also shards a free
 * tensor dim over that mesh dim makes it a reduce-scatter then an all-gather: 2(k-1)/k of
 * the data per device, the minimum. *mid_out stays NULL when no such step helps. */
static dt_status two_phase_mid(const dt_layout *src, const dt_layout *dst, const int64_t *shape,
                               dt_layout **mid_out)
{
    *mid_out = NULL;
    const dt_mesh *mesh = dt_layout_mesh(dst);
    if (!dt_mesh_equal(dt_layout_mesh(src), mesh))
        return DT_OK;
    int rank = dt_layout_rank(dst), changed = 0, used[DT_MESH_MAX_DIMS] = {0};
    const char *specs[DT_MAX_RANK], *pnames[DT_MESH_MAX_DIMS];
    dt_reduce_op pops[DT_MESH_MAX_DIMS];
    for (int d = 0; d < rank; d++) {
        specs[d] = dt_layout_spec(dst, d);
        if (dt_layout_spec_mesh_dim(dst, d) >= 0)
            used[dt_layout_spec_mesh_dim(dst, d)] = 1;
    }
    int np = dt_layout_num_partial(dst);
    for (int i = 0; i < np; i++) {
        int md;
        dt_layout_partial(dst, i, &md, &pops[i]);
        pnames[i] = dt_mesh_dim_name(mesh, md);
        used[md] = 1;
    }
    for (int i = 0; i < dt_layout_num_partial(src); i++) {
        int md, best = -1;
        dt_reduce_op op;
        dt_layout_partial(src, i, &md, &op);
        if (used[md])
            continue; /* kept partial, or already reduce-scattered by the destination */
        for (int d = 0; d < rank; d++)
            if (strcmp(specs[d], DT_UNSHARDED) == 0 && shape[d] >= dt_mesh_dim_size(mesh, md) &&
                (best < 0 || shape[d] > shape[best]))
                best = d;
        if (best < 0)
            continue;
        specs[best] = dt_mesh_dim_name(mesh, md);
        used[md] = 1;
        changed = 1;
    }
    if (!changed)
        return DT_OK;
    return dt_layout_create_partial(mesh, rank, specs, np, pnames, pops, mid_out);
}

static dt_status run_plan(const dt_tensor *src, dt_tensor *dst, rl_plan **plan_out, int *hit)
{
    dt_status st = get_plan(dt_tensor_layout(src), dt_tensor_layout(dst), dt_tensor_rank(src),
                            dt_tensor_shape(src), dt_tensor_dtype(src), plan_out, hit);
    if (st != DT_OK)
        return st;
    return dt__rl_execute(*plan_out, src, dst);
}

/* An all-reduce that the shm transport runs fused as one plan (relayout_fused.c) rather
 * than through a middle tensor: *plan_out set, else NULL. Asked only while the shm pool is up
 * (the same on every client), so other transports build no plan they would not use. */
static dt_status fused_plan(const dt_tensor *src, const dt_tensor *dst, rl_plan **plan_out,
                            int *hit)
{
    rl_plan *plan = NULL;
    *plan_out = NULL;
    if (!dt__shm_up())
        return DT_OK;
    dt_status st = get_plan(dt_tensor_layout(src), dt_tensor_layout(dst), dt_tensor_rank(src),
                            dt_tensor_shape(src), dt_tensor_dtype(src), &plan, hit);
    if (st == DT_OK && dt__rl_fused_applies(plan))
        *plan_out = plan;
    return st;
}

/* src -> dst as one plan, or two through two_phase_mid's middle layout; appends the plans
 * run to plans[*nplans]. */
static dt_status run_steps(const dt_tensor *src, dt_tensor *dst, rl_plan **plans, int *hits,
                           int *nplans)
{
    dt_layout *mid_l = NULL;
    dt_tensor *mid = NULL;
    rl_plan *fused = NULL;
    dt_status st = two_phase_mid(dt_tensor_layout(src), dt_tensor_layout(dst),
                                 dt_tensor_shape(src), &mid_l);
    if (st == DT_OK && mid_l)
        st = fused_plan(src, dst, &fused, &hits[*nplans]);
    if (st == DT_OK && fused) {
        plans[*nplans] = fused;
        st = dt__rl_execute(fused, src, dst);
        ++*nplans;
        dt_layout_destroy(mid_l);
        return st;
    }
    if (st == DT_OK && mid_l)
        st = dt__tensor_empty(mid_l, dt_tensor_dtype(src), dt_tensor_shape(src), &mid);
    if (st == DT_OK && mid) {
        st = run_plan(src, mid, &plans[*nplans], &hits[*nplans]);
        ++*nplans;
        if (st == DT_OK)
            st = run_plan(mid, dst, &plans[*nplans], &hits[*nplans]);
        ++*nplans;
    } else if (st == DT_OK) {
        st = run_plan(src, dst, &plans[*nplans], &hits[*nplans]);
        ++*nplans;
    }
    dt_tensor_destroy(mid);
    dt_layout_destroy(mid_l);
    return st;
}

/* Across hosts, first the steps to dt__rl_host_mid's layout (what crosses hosts, spread over
 * each host's devices), then the all-gather inside each host. */
static dt_status run(const dt_tensor *src, dt_tensor *dst)
{
    rl_plan *plans[3] = {NULL, NULL, NULL};
    int hits[3] = {1, 1, 1}, nplans = 0;
    dt_layout *host_l = NULL;
    dt_tensor *host_mid = NULL;
    long token = -1;
    dt_status st = dt__rl_trace_begin(src, dt_tensor_layout(dst), &token);
    if (st != DT_OK)
        return st;
    st = dt__rl_host_mid(dt_tensor_layout(src), dt_tensor_layout(dst), dt_tensor_shape(src),
                         &host_l);
    if (st == DT_OK && host_l)
        st = dt__tensor_empty(host_l, dt_tensor_dtype(src), dt_tensor_shape(src), &host_mid);
    if (st == DT_OK && host_mid) {
        st = run_steps(src, host_mid, plans, hits, &nplans);
        if (st == DT_OK)
            st = run_plan(host_mid, dst, &plans[nplans], &hits[nplans]);
        nplans++;
    } else if (st == DT_OK) {
        st = run_steps(src, dst, plans, hits, &nplans);
    }
    if (st == DT_OK)
        record_stats(plans, nplans, hits[0] && hits[1] && hits[2]);
    dt__rl_trace_end(token, plans, nplans, st);
    dt_tensor_destroy(host_mid);
    dt_layout_destroy(host_l);
    return st;
}

static dt_status relayout_new(const dt_tensor *src, const dt_layout *layout, int same_mesh,
                              dt_tensor **out)
{
    dt_tensor *dst = NULL;
    dt_status st = check_target(src, layout, same_mesh);
    if (st != DT_OK)
        return st;
    if (!out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "relayout: NULL output");
    st = dt__tensor_empty(layout, dt_tensor_dtype(src), dt_tensor_shape(src), &dst);
    if (st != DT_OK)
        return st;
    st = run(src, dst);
    if (st != DT_OK) {
        dt_tensor_destroy(dst);
        return st;
    }
    *out = dst;
    return DT_OK;
}

static dt_status relayout_run(const dt_tensor *src, const dt_layout *layout, dt_tensor **out)
{
    return relayout_new(src, layout, 1, out);
}

/* The public entry: records the call on this thread's tape (runtime/record.h). */
dt_status dt_relayout(const dt_tensor *src, const dt_layout *layout, dt_tensor **out)
{
    dt__recorder *r = dt__rec_suspend();
    dt_tensor *t = NULL;
    dt_status st = relayout_run(src, layout, out ? &t : NULL);
    if (!r)
        return st == DT_OK ? (*out = t, DT_OK) : st;
    dt__op_record rec = {.kind = DT_OP_RELAYOUT, .nin = 1, .in = {src}, .layout = layout};
    return dt__rec_finish(r, st, &rec, t, out);
}

dt_status dt__relayout_shared(const dt_tensor *src, const dt_layout *layout, dt_tensor **out)
{
    if (!src || !layout || !out || !dt__layout_same_placement(dt_tensor_layout(src), layout))
        return dt_relayout(src, layout, out);
    if (dt_layout_equal(dt_tensor_layout(src), layout)) {
        *out = dt_tensor_retain(src);
        return DT_OK;
    }
    return dt__tensor_share(src, layout, out);
}

dt_status dt_copy_to_mesh(const dt_tensor *src, const dt_layout *layout, dt_tensor **out)
{
    return relayout_new(src, layout, 0, out);
}

dt_status dt_relayout_into(const dt_tensor *src, dt_tensor *dst)
{
    if (!dst)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "relayout: NULL destination");
    dt_status st = check_target(src, dt_tensor_layout(dst), 0);
    if (st != DT_OK)
        return st;
    if (src == dst)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "relayout: source and destination are the "
                                                  "same tensor");
    if (dt_tensor_dtype(src) != dt_tensor_dtype(dst) ||
        memcmp(dt_tensor_shape(src), dt_tensor_shape(dst),
               (size_t)dt_tensor_rank(src) * sizeof(int64_t)) != 0)
        return dt__error(DT_ERR_SHAPE, "relayout: destination has another shape or dtype "
                                       "(%s vs %s)", dt_dtype_name(dt_tensor_dtype(dst)),
                         dt_dtype_name(dt_tensor_dtype(src)));
    return run(src, dst);
}
