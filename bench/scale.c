/* bench_scale: planning as one client among N simulated clients (one device each), without
 * moving data, through the planners' test-only entry points (dt__rl_plan_build_as,
 * layout/layout_impl.h; not installed). Per case and N: planning time per plan per client,
 * plan bytes per client, the planner's work count, and beside them the former all-pairs
 * planner's time where it is still feasible; then the growth from N = 1024 to the largest N
 * against N and N log N. One key=value line each (docs/bench.md). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"
#include "layout/layout_impl.h"

enum { MAX_NS = 16, NCLIENTS_TIMED = 3 };

#define ALL_CASES "alltoall,allgather,reduce_scatter"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct result {
    double ms;         /* per plan per client */
    double bytes;      /* plan bytes per client */
    double pieces;
    double work;
} result;

/* The meshes and layouts of one relayout case at N devices. */
typedef struct rl_case {
    dt_mesh *mesh;
    dt_layout *src, *dst;
    int64_t shape[2];
} rl_case;

static dt_mesh *mesh_of(int rank, const int64_t *sizes)
{
    static const char *names[2] = {"x", "y"};
    dt_mesh *m = NULL;
    if (dt_mesh_create("scale", rank, names, sizes, DT_DEVICE_CPU, &m) != DT_OK)
        fprintf(stderr, "bench_scale: mesh: %s\n", dt_last_error());
    return m;
}

static dt_layout *layout_of(const dt_mesh *m, const char *a, const char *b, const char *partial)
{
    const char *specs[2] = {a, b};
    dt_reduce_op op = DT_REDUCE_SUM;
    dt_layout *l = NULL;
    if (dt_layout_create_partial(m, 2, specs, partial ? 1 : 0, &partial, &op, &l) != DT_OK)
        fprintf(stderr, "bench_scale: layout: %s\n", dt_last_error());
    return l;
}

/* alltoall: [4N, 4N] sharded on dim 0 -> dim 1 over a 1-D mesh (N pieces per client);
 * allgather: [x, y] -> [unsharded, y] on the 2-D mesh x=8, y=N/8 (8 pieces per client);
 * reduce_scatter: [unsharded, y] partial over x -> [x, y] on the same mesh. */
static int make_case(const char *name, int64_t n, rl_case *c)
{
    memset(c, 0, sizeof *c);
    c->shape[0] = c->shape[1] = 4 * n;
    if (!strcmp(name, "alltoall")) {
        int64_t sizes[1] = {n};
        c->mesh = mesh_of(1, sizes);
        c->src = c->mesh ? layout_of(c->mesh, "x", DT_UNSHARDED, NULL) : NULL;
        c->dst = c->mesh ? layout_of(c->mesh, DT_UNSHARDED, "x", NULL) : NULL;
    } else {
        int64_t sizes[2] = {8, n / 8};
        c->mesh = mesh_of(2, sizes);
        int rs = !strcmp(name, "reduce_scatter");
        c->src = c->mesh ? layout_of(c->mesh, rs ? DT_UNSHARDED : "x", "y", rs ? "x" : NULL)
                         : NULL;
        c->dst = c->mesh ? layout_of(c->mesh, rs ? "x" : DT_UNSHARDED, "y", NULL) : NULL;
    }
    return c->src && c->dst ? 0 : -1;
}

static void free_case(rl_case *c)
{
    dt_layout_destroy(c->src);
    dt_layout_destroy(c->dst);
    dt_mesh_destroy(c->mesh);
}

static size_t plan_bytes(const rl_plan *p)
{
    return sizeof *p + p->npieces * sizeof *p->pieces + (size_t)p->nstats * sizeof *p->stats +
           (size_t)p->ndst_local + 1;
}

/* Plans as NCLIENTS_TIMED clients spread over the table, `reps` times each; ref: the former
 * planner. */
static int time_plans(const rl_case *c, int64_t n, int reps, int ref, result *r)
{
    int64_t who[NCLIENTS_TIMED] = {0, n / 2 + 1, n - 1};
    double t = 0;
    memset(r, 0, sizeof *r);
    for (int k = 0; k < NCLIENTS_TIMED; k++) {
        dt__rl_sim sim = {(int)n, 1, (int)n, (int)who[k]};
        for (int i = 0; i < reps; i++) {
            rl_plan *p = NULL;
            double t0 = now();
            dt_status st = ref ? dt__rl_plan_build_ref(c->src, c->dst, 2, c->shape,
                                                       DT_DTYPE_F32, &sim, &p)
                               : dt__rl_plan_build_as(c->src, c->dst, 2, c->shape,
                                                      DT_DTYPE_F32, &sim, &p);
            t += now() - t0;
            if (st != DT_OK) {
                fprintf(stderr, "bench_scale: plan: %s: %s\n", dt_status_name(st),
                        dt_last_error());
                return -1;
            }
            r->bytes += (double)plan_bytes(p);
            r->pieces += (double)p->npieces;
            r->work += (double)p->work;
            dt__rl_plan_free(p);
        }
    }
    int plans = NCLIENTS_TIMED * reps;
    r->ms = 1e3 * t / plans;
    r->bytes /= plans;
    r->pieces /= plans;
    r->work /= plans;
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_scale [--n LIST] [--cases LIST] [--ref-max N] [--reps N]\n"
                    "  --n LIST      simulated clients (default 256,1024,4096,16384)\n"
                    "  --cases LIST  " ALL_CASES " (default all)\n"
                    "  --ref-max N   time the former planner up to N clients (default 1024)\n");
    return 2;
}

int main(int argc, char **argv)
{
    int ns[MAX_NS] = {256, 1024, 4096, 16384}, nn = 4, ref_max = 1024, reps = 3;
    const char *cases = ALL_CASES;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) {
            if ((nn = bu_parse_int_list(argv[++i], ns, MAX_NS)) < 1)
                return usage();
        } else if (!strcmp(argv[i], "--cases") && i + 1 < argc) {
            cases = argv[++i];
        } else if (!strcmp(argv[i], "--ref-max") && i + 1 < argc) {
            ref_max = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1)
                return usage();
        } else {
            usage();
            return strcmp(argv[i], "--help") && strcmp(argv[i], "-h") ? 2 : 0;
        }
    }
    static const char *all[] = {"alltoall", "allgather", "reduce_scatter"};
    int rc = 0;
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) {
        if (!bu_list_has(cases, all[k]))
            continue;
        double ms_1024 = -1, ms_last = -1;
        int64_t n_last = 0;
        for (int i = 0; i < nn; i++) {
            int64_t n = ns[i];
            rl_case c;
            result r, rr;
            bu_line line;
            if (n % 8 || make_case(all[k], n, &c) != 0) {
                fprintf(stderr, "bench_scale: N = %lld must be a multiple of 8\n",
                        (long long)n);
                return 2;
            }
            int bad = time_plans(&c, n, reps, 0, &r) != 0;
            int with_ref = n <= ref_max;
            bad |= with_ref && time_plans(&c, n, 1, 1, &rr) != 0;
            free_case(&c);
            if (bad) {
                rc = 1;
                continue;
            }
            bu_line_init(&line);
            bu_line_add(&line, "case", "%s", all[k]);
            bu_line_add(&line, "clients", "%lld", (long long)n);
            bu_line_add(&line, "plan_ms", "%.3f", r.ms);
            bu_line_add(&line, "plan_kib", "%.1f", r.bytes / 1024);
            bu_line_add(&line, "pieces", "%.0f", r.pieces);
            bu_line_add(&line, "work", "%.0f", r.work);
            if (with_ref) {
                bu_line_add(&line, "old_plan_ms", "%.3f", rr.ms);
                bu_line_add(&line, "old_work", "%.0f", rr.work);
                bu_line_add(&line, "speedup", "%.1f", rr.ms / r.ms);
            }
            bu_line_add(&line, "target_ms", "50");
            bu_line_add(&line, "ok", "%d", r.ms <= 50 || n > 16384);
            bu_line_print(&line);
            if (n == 1024)
                ms_1024 = r.ms;
            ms_last = r.ms;
            n_last = n;
        }
        if (ms_1024 > 0 && n_last > 1024) {
            bu_line line;
            double ratio = (double)n_last / 1024;
            bu_line_init(&line);
            bu_line_add(&line, "case", "%s", all[k]);
            bu_line_add(&line, "growth", "1024->%lld", (long long)n_last);
            bu_line_add(&line, "time_ratio", "%.2f", ms_last / ms_1024);
            bu_line_add(&line, "n_ratio", "%.2f", ratio);
            bu_line_add(&line, "nlogn_ratio", "%.2f", ratio * log2((double)n_last) / 10.0);
            bu_line_print(&line);
        }
    }
    return rc;
}
