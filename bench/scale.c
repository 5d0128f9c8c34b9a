/* bench_scale: planning as one client among N simulated clients (one device each), without
 * moving data, through the planners' test-only entry points (dt__rl_plan_build_as,
 * layout/layout_impl.h; the checkpoint module's plan, index and slice lookup,
 * ckpt/ckpt_impl.h; neither installed). Per case and N: planning time per plan per client,
 * plan bytes per client, the planner's work count, and beside them the former all-pairs
 * planner's time where it is still feasible; the first plan on each mesh apart (it reads the
 * device table once for the mesh's facts); which path the plan takes (a regular pattern's
 * collectives along one mesh dim, planned per mesh dim, or pieces); then the growth from N = 1024 to the largest N
 * against N and N log N. One key=value line each (docs/bench.md). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "ckpt/ckpt_impl.h"
#include "dtensor/dtensor.h"
#include "layout/layout_impl.h"

enum { MAX_NS = 16, NCLIENTS_TIMED = 3 };

#define ALL_CASES "alltoall,allgather,reduce_scatter,restore,index"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This process's CPU time: on a loaded shared machine the wall clock also counts the time
 * other processes held the cores. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct result {
    double ms;         /* per plan per client */
    double bytes;      /* plan bytes per client */
    double pieces;
    double work;
    int collective;    /* the plan is a regular pattern's (collectives along one mesh dim) */
    double first_ms;   /* the first plan on the mesh: with the mesh's facts (read once) */
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

/* Plans as NCLIENTS_TIMED clients spread over the table, `reps` times each; ref 1: the former
 * planner, 2: the piece planner without patterns, 0: the planner as dt_relayout uses it. */
static int time_plans(const rl_case *c, int64_t n, int reps, int ref, result *r)
{
    int64_t who[NCLIENTS_TIMED] = {0, n / 2 + 1, n - 1};
    double t = 0;
    memset(r, 0, sizeof *r);
    if (ref == 0) {
        /* The mesh's first plan reads its device table once for the pattern check
         * (mesh/mesh_facts.c); the plans timed below are every later one's cost. */
        dt__rl_sim sim = {(int)n, 1, (int)n, 0};
        rl_plan *p = NULL;
        double t0 = now();
        dt_status st = dt__rl_plan_build_as(c->src, c->dst, 2, c->shape, DT_DTYPE_F32, &sim, &p);
        r->first_ms = 1e3 * (now() - t0);
        dt__rl_plan_free(p);
        if (st != DT_OK) {
            fprintf(stderr, "bench_scale: plan: %s: %s\n", dt_status_name(st), dt_last_error());
            return -1;
        }
    }
    for (int k = 0; k < NCLIENTS_TIMED; k++) {
        dt__rl_sim sim = {(int)n, 1, (int)n, (int)who[k]};
        for (int i = 0; i < reps; i++) {
            rl_plan *p = NULL;
            double t0 = now();
            dt_status st =
                ref == 1 ? dt__rl_plan_build_ref(c->src, c->dst, 2, c->shape, DT_DTYPE_F32,
                                                 &sim, &p)
                : ref == 2 ? dt__rl_plan_build_general(c->src, c->dst, 2, c->shape,
                                                       DT_DTYPE_F32, &sim, &p)
                           : dt__rl_plan_build_as(c->src, c->dst, 2, c->shape, DT_DTYPE_F32,
                                                  &sim, &p);
            t += now() - t0;
            if (st != DT_OK) {
                fprintf(stderr, "bench_scale: plan: %s: %s\n", dt_status_name(st),
                        dt_last_error());
                return -1;
            }
            r->bytes += (double)plan_bytes(p);
            r->pieces += (double)p->npieces;
            r->work += (double)p->work;
            r->collective = p->coll != NULL;
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


/* ---- checkpoint metadata ---------------------------------------------------------------- */

/* A checkpoint of N devices' slices, built as client 0 builds its index, then parsed as every
 * client parses it: w [4N, 64] sharded on dim 0 over x (N slices), b [64] replicated (one),
 * v [4N] sharded (N). Times of the save plan, the index text and the parse into *ms3. */
static dt_status build_index(int64_t n, dt_ckpt **ck_out, double *ms3, double *cpu_ms)
{
    int64_t sizes[1] = {n}, sw[2] = {4 * n, 64}, sb[1] = {64}, sv[1] = {4 * n};
    dt_mesh *m = mesh_of(1, sizes);
    dt_layout *lw = m ? layout_of(m, "x", DT_UNSHARDED, NULL) : NULL, *lb = NULL, *lv = NULL;
    const char *ub[1] = {DT_UNSHARDED}, *xv[1] = {"x"};
    dt_status st = lw ? DT_OK : DT_ERR_INVALID_ARGUMENT;
    if (st == DT_OK && (st = dt_layout_create(m, 1, ub, &lb)) == DT_OK)
        st = dt_layout_create(m, 1, xv, &lv);
    const char *names[3] = {"w", "b", "v"};
    const dt_layout *layouts[3] = {lw, lb, lv};
    const int ranks[3] = {2, 1, 1};
    const int64_t *shapes[3] = {sw, sb, sv};
    const dt_dtype dtypes[3] = {DT_DTYPE_F32, DT_DTYPE_F32, DT_DTYPE_F32};
    ck_plan_input in = {3, names, layouts, ranks, shapes, dtypes, 0, NULL};
    ck_plan plan = {0};
    uint32_t *crcs = NULL, **chunk = NULL;
    char *text = NULL, *mesh_str = m ? malloc(dt_mesh_format(m, NULL, 0) + 1) : NULL;
    if (st == DT_OK && !mesh_str)
        st = DT_ERR_NO_MEMORY;
    double c0 = cpu_now(), t0 = now();
    if (st == DT_OK)
        st = dt__ckpt_plan(m, &in, DT_CKPT_CHUNK_BYTES, &plan);
    double t1 = now(), c1 = cpu_now();
    if (st == DT_OK) {
        /* Every slice here fits one chunk: its CRC is the chunk's (zeros: nothing is read). */
        crcs = calloc((size_t)plan.nslices + 1, sizeof *crcs);
        chunk = calloc((size_t)plan.nslices + 1, sizeof *chunk);
        st = crcs && chunk ? DT_OK : DT_ERR_NO_MEMORY;
        for (int64_t i = 0; st == DT_OK && i < plan.nslices; i++)
            st = (chunk[i] = calloc(1, sizeof **chunk)) ? DT_OK : DT_ERR_NO_MEMORY;
    }
    if (mesh_str)
        dt_mesh_format(m, mesh_str, dt_mesh_format(m, NULL, 0) + 1);
    double c2 = cpu_now(), t2 = now();
    if (st == DT_OK)
        st = dt__ckpt_index_text(&plan, mesh_str, n, crcs, (const uint32_t *const *)chunk, 0,
                                 NULL, &text);
    double t3 = now(), c3 = cpu_now();
    if (st == DT_OK)
        st = dt__ckpt_parse_index("sim", "sim/dtensor-index.json", text, strlen(text), ck_out);
    double t4 = now();
    *cpu_ms = 1e3 * (c1 - c0 + c3 - c2);
    ms3[0] = 1e3 * (t1 - t0);
    ms3[1] = 1e3 * (t3 - t2);
    ms3[2] = 1e3 * (t4 - t3);
    for (int64_t i = 0; chunk && i < plan.nslices; i++)
        free(chunk[i]);
    free(chunk);
    free(crcs);
    free(text);
    free(mesh_str);
    dt__ckpt_plan_free(&plan);
    dt_layout_destroy(lw);
    dt_layout_destroy(lb);
    dt_layout_destroy(lv);
    dt_mesh_destroy(m);
    if (st != DT_OK)
        fprintf(stderr, "bench_scale: index of %lld devices: %s: %s\n", (long long)n,
                dt_status_name(st), dt_last_error());
    return st;
}

static int meets(int rank, const int64_t *a_off, const int64_t *a_len, const int64_t *b_off,
                 const int64_t *b_len)
{
    for (int d = 0; d < rank; d++)
        if (a_off[d] >= b_off[d] + b_len[d] || b_off[d] >= a_off[d] + a_len[d])
            return 0;
    return 1;
}

/* Restoring w onto the 2-D mesh x = N/8, y = 8 as [x, y]: per client, the saved slices its box
 * meets, through the slice index (new) and by scanning every slice (old). */
static int restore_case(int64_t n, const dt_ckpt *ck, int reps, bu_line *line)
{
    int64_t sizes[2] = {n / 8, 8}, who[NCLIENTS_TIMED] = {0, n / 2 + 1, n - 1};
    dt_mesh *m = mesh_of(2, sizes);
    dt_layout *l = m ? layout_of(m, "x", "y", NULL) : NULL;
    const ck_tensor *t = &ck->tensors[0];
    double t_new = 0, t_old = 0, found = 0, looked = 0;
    int bad = !l;
    for (int k = 0; !bad && k < NCLIENTS_TIMED; k++) {
        int64_t off[2], len[2], first, end;
        dt_layout_shard(l, t->shape, who[k], off, len);
        for (int i = 0; i < reps; i++) {
            int64_t a = 0, b = 0;
            double t0 = now();
            dt__ckpt_slices_near(t, off, len, &first, &end);
            for (int64_t j = first; j < end; j++)
                a += meets(2, off, len, t->slices[t->order[j]].off, t->slices[t->order[j]].size);
            double t1 = now();
            for (int64_t s = 0; s < t->nslices; s++)
                b += meets(2, off, len, t->slices[s].off, t->slices[s].size);
            double t2 = now();
            t_new += t1 - t0;
            t_old += t2 - t1;
            bad |= a != b || a == 0;
            found += (double)a;
            looked += (double)(end - first);
        }
    }
    int plans = NCLIENTS_TIMED * reps;
    bu_line_add(line, "plan_ms", "%.4f", 1e3 * t_new / plans);
    bu_line_add(line, "slices_met", "%.0f", found / plans);
    bu_line_add(line, "slices_looked_at", "%.0f", looked / plans);
    bu_line_add(line, "old_plan_ms", "%.4f", 1e3 * t_old / plans);
    bu_line_add(line, "old_slices_looked_at", "%lld", (long long)t->nslices);
    bu_line_add(line, "same", "%d", !bad);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    return bad ? -1 : 0;
}

/* The checkpoint cases at N: "index" (client 0's save plan and index text, every client's
 * parse) and "restore". */
static int ckpt_case(const char *name, int64_t n, int reps, double *ms_out)
{
    dt_ckpt *ck = NULL;
    double ms3[3], cpu_ms;
    bu_line line;
    if (build_index(n, &ck, ms3, &cpu_ms) != DT_OK)
        return -1;
    bu_line_init(&line);
    bu_line_add(&line, "case", "%s", name);
    bu_line_add(&line, "clients", "%lld", (long long)n);
    int rc = 0;
    if (!strcmp(name, "index")) {
        bu_line_add(&line, "plan_ms", "%.1f", ms3[0]);
        bu_line_add(&line, "index_text_ms", "%.1f", ms3[1]);
        bu_line_add(&line, "build_ms", "%.1f", ms3[0] + ms3[1]);
        bu_line_add(&line, "build_cpu_ms", "%.1f", cpu_ms);
        bu_line_add(&line, "parse_ms", "%.1f", ms3[2]);
        bu_line_add(&line, "slices", "%lld", (long long)(ck->tensors[0].nslices +
                                                         ck->tensors[1].nslices +
                                                         ck->tensors[2].nslices));
        bu_line_add(&line, "target_ms", "1000");
        bu_line_add(&line, "ok", "%d", cpu_ms <= 1000 || n > 16384);
        *ms_out = ms3[0] + ms3[1];
    } else {
        rc = restore_case(n, ck, reps, &line);
        *ms_out = -1;
    }
    bu_line_print(&line);
    dt_ckpt_close(ck);
    return rc;
}

/* Writes element (r, c) = (r * cols + c) mod 1000003 into every local component of t (fill),
 * or counts the components' elements that differ from it into *wrong. */
static dt_status fill_or_check(dt_tensor *t, int64_t cols, int fill, int64_t *wrong)
{
    dt_status st = DT_OK;
    if (wrong)
        *wrong = 0;
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(t); i++) {
        const DLTensor *x = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        size_t n = (size_t)(x->shape[0] * x->shape[1]);
        float *v = malloc(n * sizeof *v + 1);
        if (!v)
            return DT_ERR_NO_MEMORY;
        if (!fill)
            st = dt_tensor_local_read(t, i, v, n * sizeof *v);
        for (int64_t r = 0; st == DT_OK && r < x->shape[0]; r++)
            for (int64_t k = 0; k < x->shape[1]; k++) {
                float want = (float)(((off[0] + r) * cols + off[1] + k) % 1000003);
                if (fill)
                    v[r * x->shape[1] + k] = want;
                else
                    *wrong += v[r * x->shape[1] + k] != want;
            }
        if (fill && st == DT_OK)
            st = dt_tensor_local_write(t, i, v, n * sizeof *v);
        free(v);
    }
    return st;
}

/* The measurement: one process holding all N CPU devices (DT_CPU_DEVICES=N, the
 * runtime initialised), the first dt_relayout of [4N, 4N] f32 from dim 0 to dim 1 sharded
 * (planning included) and the second (plan cached), and both planners' time for that plan;
 * the result is checked element for element. */
static int inprocess_case(int *argc, char ***argv)
{
    dt_status st = dt_init(argc, argv, NULL);
    if (st != DT_OK) {
        fprintf(stderr, "bench_scale: dt_init: %s\n", dt_last_error());
        return 1;
    }
    int64_t n = dt_num_local_devices(DT_DEVICE_CPU);
    rl_case c;
    if (make_case("alltoall", n, &c) != 0)
        return 1;
    dt_tensor *t = NULL, *a = NULL, *b = NULL;
    st = dt_tensor_zeros(c.src, DT_DTYPE_F32, c.shape, &t);
    if (st == DT_OK)
        st = fill_or_check(t, c.shape[1], 1, NULL);
    double t0 = now();
    if (st == DT_OK)
        st = dt_relayout(t, c.dst, &a);
    double t1 = now();
    if (st == DT_OK)
        st = dt_relayout(t, c.dst, &b);
    double t2 = now();
    rl_plan *pn = NULL, *pr = NULL;
    double t3 = now();
    if (st == DT_OK)
        st = dt__rl_plan_build(c.src, c.dst, 2, c.shape, DT_DTYPE_F32, &pn);
    double t4 = now();
    if (st == DT_OK)
        st = dt__rl_plan_build_ref(c.src, c.dst, 2, c.shape, DT_DTYPE_F32, NULL, &pr);
    double t5 = now();
    int64_t wrong = 1;
    if (st == DT_OK)
        st = fill_or_check(b, c.shape[1], 0, &wrong);
    int same = wrong == 0;
    if (st != DT_OK)
        fprintf(stderr, "bench_scale: inprocess: %s\n", dt_last_error());
    bu_line line;
    bu_line_init(&line);
    bu_line_add(&line, "case", "inprocess");
    bu_line_add(&line, "devices", "%lld", (long long)n);
    bu_line_add(&line, "first_s", "%.3f", t1 - t0);
    bu_line_add(&line, "second_s", "%.3f", t2 - t1);
    bu_line_add(&line, "plan_s", "%.3f", t4 - t3);
    bu_line_add(&line, "old_plan_s", "%.3f", t5 - t4);
    bu_line_add(&line, "pieces", "%zu", pn ? pn->npieces : 0);
    bu_line_add(&line, "check", "%s", same ? "ok" : "FAILED");
    bu_line_print(&line);
    dt__rl_plan_free(pn);
    dt__rl_plan_free(pr);
    dt_tensor_destroy(a);
    dt_tensor_destroy(b);
    dt_tensor_destroy(t);
    free_case(&c);
    dt_finalize();
    return st == DT_OK && same ? 0 : 1;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_scale [--n LIST] [--cases LIST] [--ref-max N] [--reps N]\n"
                    "       DT_CPU_DEVICES=N bench_scale --inprocess\n"
                    "  --n LIST      simulated clients (default 256,1024,4096,16384)\n"
                    "  --cases LIST  " ALL_CASES " (default all)\n"
                    "  --ref-max N   time the former planner up to N clients (default 1024)\n");
    return 2;
}

int main(int argc, char **argv)
{
    int ns[MAX_NS] = {256, 1024, 4096, 16384}, nn = 4, ref_max = 1024, reps = 3;
    const char *cases = ALL_CASES;
    if (argc > 1 && !strcmp(argv[1], "--inprocess"))
        return inprocess_case(&argc, &argv);
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
    static const char *ck_cases[] = {"restore", "index"};
    for (size_t k = 0; k < 2; k++) {
        double ms_1024 = -1, ms = -1;
        for (int i = 0; bu_list_has(cases, ck_cases[k]) && i < nn; i++) {
            if (ns[i] % 8) {
                fprintf(stderr, "bench_scale: N = %d must be a multiple of 8\n", ns[i]);
                return 2;
            }
            rc |= ckpt_case(ck_cases[k], ns[i], reps, &ms) != 0;
            if (ns[i] == 1024)
                ms_1024 = ms;
        }
        if (ms_1024 > 0 && ns[nn - 1] > 1024) {
            bu_line line;
            double ratio = (double)ns[nn - 1] / 1024;
            bu_line_init(&line);
            bu_line_add(&line, "case", "%s", ck_cases[k]);
            bu_line_add(&line, "growth", "1024->%d", ns[nn - 1]);
            bu_line_add(&line, "time_ratio", "%.2f", ms / ms_1024);
            bu_line_add(&line, "n_ratio", "%.2f", ratio);
            bu_line_add(&line, "nlogn_ratio", "%.2f", ratio * log2((double)ns[nn - 1]) / 10.0);
            bu_line_print(&line);
        }
    }
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) {
        if (!bu_list_has(cases, all[k]))
            continue;
        double ms_1024 = -1, ms_last = -1;
        int64_t n_last = 0;
        for (int i = 0; i < nn; i++) {
            int64_t n = ns[i];
            rl_case c;
            result r, rr, rg;
            bu_line line;
            if (n % 8 || make_case(all[k], n, &c) != 0) {
                fprintf(stderr, "bench_scale: N = %lld must be a multiple of 8\n",
                        (long long)n);
                return 2;
            }
            int bad = time_plans(&c, n, reps, 0, &r) != 0;
            int with_ref = n <= ref_max;
            bad |= with_ref && time_plans(&c, n, 1, 1, &rr) != 0;
            bad |= !bad && r.collective && time_plans(&c, n, 1, 2, &rg) != 0;
            free_case(&c);
            if (bad) {
                rc = 1;
                continue;
            }
            bu_line_init(&line);
            bu_line_add(&line, "case", "%s", all[k]);
            bu_line_add(&line, "clients", "%lld", (long long)n);
            bu_line_add(&line, "path", "%s", r.collective ? "collective" : "pieces");
            bu_line_add(&line, "plan_ms", "%.4f", r.ms);
            bu_line_add(&line, "first_plan_ms", "%.3f", r.first_ms);
            bu_line_add(&line, "plan_kib", "%.1f", r.bytes / 1024);
            bu_line_add(&line, "pieces", "%.0f", r.pieces);
            bu_line_add(&line, "work", "%.0f", r.work);
            if (r.collective) /* the same plan as pieces (DT_RELAYOUT_PATTERNS=0) */
                bu_line_add(&line, "pieces_plan_ms", "%.3f", rg.ms);
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
