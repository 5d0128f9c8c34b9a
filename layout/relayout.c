/* Public relayout entry points: validation, the plan cache, and the last plan's statistics. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "layout/layout_impl.h"

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

/* Finds or builds the plan, and records it as the last one for dt_relayout_last_stats. The
 * cache owns the plan; callers use it under no lock because relayouts are collective and so
 * issued by one thread per client at a time. */
static dt_status get_plan(const dt_layout *src, const dt_layout *dst, int rank,
                          const int64_t *shape, dt_dtype dtype, rl_plan **plan_out)
{
    dt_status st = DT_OK;
    rl_plan *plan = NULL;
    int hit = 0;
    pthread_mutex_lock(&cache_lock);
    if (!cache_hooked && dt__at_finalize(dt_relayout_cache_clear) == DT_OK)
        cache_hooked = 1;
    cache_slot *victim = &cache[0];
    for (int i = 0; i < CACHE_SLOTS; i++) {
        if (plan_matches(cache[i].plan, src, dst, rank, shape, dtype)) {
            plan = cache[i].plan;
            cache[i].used = ++cache_clock;
            hit = 1;
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
    if (st == DT_OK) {
        dt_relayout_stats *s = malloc(((size_t)plan->nstats + 1) * sizeof *s);
        if (s) {
            if (plan->nstats)
                memcpy(s, plan->stats, (size_t)plan->nstats * sizeof *s);
            free(last_stats);
            last_stats = s;
            last_nstats = plan->nstats;
            last_cached = hit;
        }
        *plan_out = plan;
    }
    pthread_mutex_unlock(&cache_lock);
    return st;
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

static dt_status run(const dt_tensor *src, dt_tensor *dst)
{
    rl_plan *plan;
    dt_status st = get_plan(dt_tensor_layout(src), dt_tensor_layout(dst), dt_tensor_rank(src),
                            dt_tensor_shape(src), dt_tensor_dtype(src), &plan);
    if (st != DT_OK)
        return st;
    return dt__rl_execute(plan, src, dst);
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

dt_status dt_relayout(const dt_tensor *src, const dt_layout *layout, dt_tensor **out)
{
    return relayout_new(src, layout, 1, out);
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
