/* bench_relayout: times dt_relayout_into for the collective patterns of a 1-D mesh against the
 * MPI collective (in one process: the memcpys) that moves the same bytes, interleaved in the
 * same process over the same preallocated buffers; one key=value line per case (docs/bench.md).
 * --device gpu: the mesh's devices are GPUs (one per process, DT_GPU=sim or cuda) and the
 * reference is the raw chain on the same bytes: device to host copy into page-locked memory,
 * the MPI collective, host to device copy. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"
#include "layout/layout_impl.h"
#include "layout/tensor_dev.h"
#include "runtime/device.h"
#include "runtime/transport.h"
#include "runtime/util.h"

enum { MAX_MIBS = 8, MAX_REPS = 1000, MAX_STATS = 256 };

/* Row length (floats) of the 2-D tensors, and of each strided run of the 2-D shard move. */
enum { ROW = 1024, ROW_2D = 256 };

#define ALL_MPI_CASES "allgather,alltoall,alltoall_2d,reduce_scatter,allreduce"

typedef struct opts {
    const char *cases;
    int mibs[MAX_MIBS];
    int nmibs;
    int quick;
    int reps; /* 0: by size */
    int gpu;  /* --device gpu */
} opts;

typedef enum ref_kind {
    REF_ALLGATHER,
    REF_ALLTOALL,
    REF_REDUCE_SCATTER,
    REF_ALLREDUCE,
    REF_MEMCPY,
} ref_kind;

typedef struct copy_op {
    void *dst;
    const void *src;
    size_t bytes;
} copy_op;

/* One case: our relayout src -> dst, and the reference that moves the same bytes. */
typedef struct bench_case {
    const char *name;
    const char *ref_name;
    int mib;
    dt_tensor *src, *dst;
    int partial;     /* src is a sum over x: each position holds its own summand */
    double payload;  /* bytes per rank counted for both bandwidths */
    ref_kind ref;
    void *rsend, *rrecv; /* MPI reference buffers (the tensors' own components) */
    int rcount;          /* floats per block, as the collective counts them */
    copy_op *copies;     /* REF_MEMCPY */
    int ncopies;
    double moved_mib;    /* in-process: bytes received over all devices, in MiB */
    double self_mib;     /* in-process: bytes each device copied to itself, in MiB */
    unsigned long colls; /* plans of one dt_relayout_into run as collectives (0: pieces) */
    unsigned long fused; /* all-reduces of it run fused through shm (layout/relayout_fused.c) */
    /* Two memcpys beside the MPI collective, run by every process at once (the same
     * contention for memory as the relayout): of the bytes each process receives from the
     * others (all-reduce: twice its input, the two passes), and of all the bytes the
     * relayout writes into its output, its own block included: one copy of those is the
     * least any relayout does, so that one is the one-copy bound (docs/bench.md). Both copy
     * from the start of one pair of buffers. */
    void *msrc, *mdst;
    size_t mbytes, obytes;
    /* --device gpu: host mirrors (page-locked) of the one local component of src and dst,
     * where values are written and checked and the reference's MPI collective runs. */
    const dt__device *dev;
    void *hsrc, *hdst;
    size_t src_bytes, dst_bytes;
} bench_case;

static int g_rank, g_nclients;

/* ---- values: small integers from the global index, so every sum is exact ---------------- */

static float plain_value(int64_t g)
{
    return (float)(g % 4093);
}

static float summand_value(int64_t g, int64_t p)
{
    return (float)((g + 5 * p) % 17) - 8.0f;
}

/* A component seen as up to 3 dims (leading dims of size 1 added). */
typedef struct comp_view {
    float *data;
    int64_t off[3], len[3], gshape[3];
    int64_t position;
} comp_view;

static size_t comp_bytes(const dt_tensor *t, int i)
{
    const DLTensor *dl = dt_tensor_local(t, i);
    size_t n = sizeof(float);
    for (int d = 0; d < dl->ndim; d++)
        n *= (size_t)dl->shape[d];
    return n;
}

/* Copies between a GPU case's host mirror and its component (to_device: the mirror's values
 * to the device). */
static void mirror_sync(const bench_case *c, const dt_tensor *t, int to_device)
{
    if (!c->dev)
        return;
    void *h = t == c->src ? c->hsrc : c->hdst;
    size_t bytes = t == c->src ? c->src_bytes : c->dst_bytes;
    void *d = dt_tensor_local(t, 0)->data;
    dt_status st = to_device ? c->dev->kind->copy(c->dev, DT__COPY_H2D, d, h, bytes)
                             : c->dev->kind->copy(c->dev, DT__COPY_D2H, h, d, bytes);
    if (st != DT_OK)
        fprintf(stderr, "# client %d: device copy failed: %s\n", g_rank, dt_last_error());
}

static void view_of(const bench_case *c, const dt_tensor *t, int i, comp_view *v)
{
    const DLTensor *dl = dt_tensor_local(t, i);
    const int64_t *off = dt_tensor_local_offset(t, i), *shape = dt_tensor_shape(t);
    int rank = dt_tensor_rank(t), pad = 3 - rank;
    for (int d = 0; d < 3; d++) {
        v->off[d] = d < pad ? 0 : off[d - pad];
        v->len[d] = d < pad ? 1 : dl->shape[d - pad];
        v->gshape[d] = d < pad ? 1 : shape[d - pad];
    }
    v->data = c->dev ? (t == c->src ? c->hsrc : c->hdst) : dl->data;
    v->position = dt_tensor_local_position(t, i);
}

/* Calls fn(row data, global index of its first element, row length, arg) for every row. */
typedef int64_t (*row_fn)(float *row, int64_t g, int64_t n, const comp_view *v, void *arg);

static int64_t for_rows(const comp_view *v, row_fn fn, void *arg)
{
    int64_t total = 0;
    for (int64_t a = 0; a < v->len[0]; a++)
        for (int64_t b = 0; b < v->len[1]; b++) {
            int64_t g = ((v->off[0] + a) * v->gshape[1] + v->off[1] + b) * v->gshape[2] +
                        v->off[2];
            total += fn(v->data + (a * v->len[1] + b) * v->len[2], g, v->len[2], v, arg);
        }
    return total;
}

static int64_t fill_row(float *row, int64_t g, int64_t n, const comp_view *v, void *arg)
{
    int partial = *(const int *)arg;
    for (int64_t k = 0; k < n; k++)
        row[k] = partial ? summand_value(g + k, v->position) : plain_value(g + k);
    return 0;
}

typedef struct check_arg {
    int partial;
    int64_t nsummands;
    int64_t first_bad;  /* global index, -1 if none */
    float got, want;
} check_arg;

static int64_t check_row(float *row, int64_t g, int64_t n, const comp_view *v, void *arg)
{
    check_arg *c = arg;
    int64_t bad = 0;
    for (int64_t k = 0; k < n; k++) {
        float want = 0.0f;
        if (c->partial)
            for (int64_t p = 0; p < c->nsummands; p++)
                want += summand_value(g + k, p);
        else
            want = plain_value(g + k);
        if (row[k] != want) {
            if (bad++ == 0 && c->first_bad < 0) {
                c->first_bad = g + k;
                c->got = row[k];
                c->want = want;
            }
        }
    }
    return bad;
}

static void fill_source(bench_case *c)
{
    for (int i = 0; i < dt_tensor_num_local(c->src); i++) {
        comp_view v;
        view_of(c, c->src, i, &v);
        for_rows(&v, fill_row, &c->partial);
    }
    mirror_sync(c, c->src, 1);
}

/* Checks every element of every local destination component; returns the mismatches of all
 * clients together and describes this client's first one on stderr. */
static int64_t check_destination(const bench_case *c, int64_t nsummands)
{
    int64_t bad = 0;
    mirror_sync(c, c->dst, 0);
    for (int i = 0; i < dt_tensor_num_local(c->dst); i++) {
        comp_view v;
        view_of(c, c->dst, i, &v);
        check_arg a = {.partial = c->partial, .nsummands = nsummands, .first_bad = -1};
        int64_t n = for_rows(&v, check_row, &a);
        if (n && !bad)
            fprintf(stderr,
                    "# client %d: case=%s mib=%d: %lld wrong elements on the device at mesh "
                    "position %lld (shard offset %lld,%lld,%lld shape %lld,%lld,%lld); first "
                    "at global flat index %lld: got %g, expected %g\n",
                    g_rank, c->name, c->mib, (long long)n, (long long)v.position,
                    (long long)v.off[0], (long long)v.off[1], (long long)v.off[2],
                    (long long)v.len[0], (long long)v.len[1], (long long)v.len[2],
                    (long long)a.first_bad, (double)a.got, (double)a.want);
        bad += n;
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    return bad;
}

static void poison_destination(const bench_case *c)
{
    if (c->dev) {
        memset(c->hdst, 0xff, c->dst_bytes); /* NaN */
        mirror_sync(c, c->dst, 1);
        return;
    }
    for (int i = 0; i < dt_tensor_num_local(c->dst); i++) {
        const DLTensor *dl = dt_tensor_local(c->dst, i);
        int64_t n = 1;
        for (int d = 0; d < dl->ndim; d++)
            n *= dl->shape[d];
        memset(dl->data, 0xff, (size_t)n * sizeof(float)); /* NaN */
    }
}

/* ---- the two contestants ----------------------------------------------------------------- */

static void run_reference(const bench_case *c)
{
    mirror_sync(c, c->src, 0); /* GPU: the chain's device-to-host copy */
    switch (c->ref) {
    case REF_ALLGATHER:
        MPI_Allgather(c->rsend, c->rcount, MPI_FLOAT, c->rrecv, c->rcount, MPI_FLOAT,
                      MPI_COMM_WORLD);
        break;
    case REF_ALLTOALL:
        MPI_Alltoall(c->rsend, c->rcount, MPI_FLOAT, c->rrecv, c->rcount, MPI_FLOAT,
                     MPI_COMM_WORLD);
        break;
    case REF_REDUCE_SCATTER:
        MPI_Reduce_scatter_block(c->rsend, c->rrecv, c->rcount, MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD);
        break;
    case REF_ALLREDUCE:
        MPI_Allreduce(c->rsend, c->rrecv, c->rcount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case REF_MEMCPY:
        for (int i = 0; i < c->ncopies; i++)
            memcpy(c->copies[i].dst, c->copies[i].src, c->copies[i].bytes);
        break;
    }
    mirror_sync(c, c->dst, 1); /* and its host-to-device copy */
}

/* 1 if st is DT_OK on every client. */
static int ok_everywhere(dt_status st)
{
    int ok = st == DT_OK;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return ok;
}

static void line_head(bu_line *line, const bench_case *c)
{
    bu_line_init(line);
    bu_line_add(line, "case", "%s", c->name);
    bu_line_add(line, "np", "%d", g_nclients);
    const char *tr = getenv("DT_TRANSPORT");
    bu_line_add(line, "transport", "%s", tr && *tr ? tr : "auto");
    if (c->ref == REF_MEMCPY)
        bu_line_add(line, "devices", "%d", dt_tensor_num_local(c->src));
    bu_line_add(line, "mib", "%d", c->mib);
    if (c->dev)
        bu_line_add(line, "device", "%s", c->dev->kind->name);
}

static void report_failure(const bench_case *c, const char *when, dt_status st)
{
    if (st != DT_OK)
        fprintf(stderr, "# client %d: case=%s mib=%d: dt_relayout_into failed %s: %s: %s\n",
                g_rank, c->name, c->mib, when, dt_status_name(st), dt_last_error());
    if (g_rank == 0) {
        bu_line line;
        line_head(&line, c);
        bu_line_add(&line, "error", "relayout_failed_%s", when);
        bu_line_print(&line);
    }
}

/* Minor page faults of this process so far (a fault per fresh page touched). */
static long minor_faults(void)
{
    struct rusage u;
    return getrusage(RUSAGE_SELF, &u) == 0 ? u.ru_minflt : 0;
}

static int default_reps(int mib, int quick)
{
    if (mib <= 1)
        return quick ? 10 : 50;
    if (mib <= 16)
        return quick ? 5 : 20;
    return quick ? 2 : 5;
}

/* The clock every process of one host shares. */
static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds from the first process's start to the last one's end: what all the processes'
 * work took together. Where the processes outnumber the cores (np 4 on 2), a process that got
 * its core late starts its own clock late, so its own duration would leave out the wait; the
 * span counts it, for ours, the MPI collective and the memcpys alike. Collective. */
static double span_of(double t0, double t1)
{
    double v[2] = {-t0, t1};
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v[0] + v[1];
}

/* Warm-up, interleaved timing, verification, the result line. Returns 0 if ours ran and was
 * right. */
static int run_case(const opts *o, bench_case *c, int64_t nsummands)
{
    int reps = o->reps ? o->reps : default_reps(c->mib, o->quick);
    double *t_ours = calloc((size_t)reps, sizeof *t_ours);
    double *t_ref = calloc((size_t)reps, sizeof *t_ref);
    double *t_mem = NULL; /* the memcpy bound's times */
    /* DT_BENCH_AB_STREAM=1: ours runs twice a rep, with and without streaming stores in its
     * large copies (runtime/copy.c), in alternating order: an A/B under the same load. */
    const char *ab_env = getenv("DT_BENCH_AB_STREAM");
    int ab = ab_env && strcmp(ab_env, "1") == 0;
    double *t_plain = calloc((size_t)reps, sizeof *t_plain);
    int failed = 1;
    if (!t_ours || !t_ref || !t_plain) {
        fprintf(stderr, "bench_relayout: out of memory\n");
        goto out;
    }
    fill_source(c);
    unsigned long colls0 = dt__rl_coll_runs(), fused0 = dt__rl_fused_runs();
    dt_status st = dt_relayout_into(c->src, c->dst);
    c->colls = dt__rl_coll_runs() - colls0;
    c->fused = dt__rl_fused_runs() - fused0;
    if (!ok_everywhere(st)) {
        report_failure(c, "warmup", st);
        goto out;
    }
    if (c->ref == REF_MEMCPY) {
        dt_relayout_stats stats[MAX_STATS];
        int n = 0;
        uint64_t recv = 0, self = 0, copies = 0;
        if (dt_relayout_last_stats(MAX_STATS, stats, &n, NULL) == DT_OK)
            for (int i = 0; i < n && i < MAX_STATS; i++) {
                recv += stats[i].bytes_received;
                self += stats[i].bytes_self;
            }
        for (int i = 0; i < c->ncopies; i++)
            copies += c->copies[i].bytes;
        c->moved_mib = (double)recv / (1 << 20);
        c->self_mib = (double)self / (1 << 20);
        c->payload = (double)recv;
        if (recv != copies)
            printf("# case=%s mib=%d: relayout stats say %llu bytes received, the memcpy "
                   "reference copies %llu\n",
                   c->name, c->mib, (unsigned long long)recv, (unsigned long long)copies);
    }
    run_reference(c);
    if (c->ref != REF_MEMCPY) {
        /* The bytes this process received (the largest over processes), or twice the input. */
        dt_relayout_stats stats[MAX_STATS];
        int n = 0;
        uint64_t recv = 0;
        if (dt_relayout_last_stats(MAX_STATS, stats, &n, NULL) == DT_OK)
            for (int i = 0; i < n && i < MAX_STATS; i++)
                recv += stats[i].bytes_received;
        MPI_Allreduce(MPI_IN_PLACE, &recv, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
        c->mbytes = c->ref == REF_ALLREDUCE ? 2 * (size_t)c->payload : (size_t)recv;
        c->obytes = comp_bytes(c->dst, 0);
        size_t most = c->mbytes > c->obytes ? c->mbytes : c->obytes;
        c->msrc = malloc(most + 1);
        c->mdst = malloc(most + 1);
        t_mem = calloc(2 * (size_t)reps, sizeof *t_mem);
        if (!c->msrc || !c->mdst || !t_mem) {
            fprintf(stderr, "bench_relayout: out of memory for the memcpy bound\n");
            free(t_mem);
            t_mem = NULL;
        } else {
            memset(c->msrc, 1, most);
            memset(c->mdst, 2, most);
        }
    }

    dt_status first = DT_OK;
    long faults = 0; /* page faults of our timed runs, this process */
    double ph0[DT__SHM_PHASES], ph[DT__SHM_PHASES]; /* the shm transport's phases */
    dt__transport_shm_phases(ph0);
    for (int r = 0; r < reps; r++)
        for (int k = ab ? -1 : 0; k < 4; k++) {
            if (k < 0) { /* the A/B's plain-memcpy run of ours, first or last in turn */
                for (int j = 0; j < 2; j++) {
                    int plain = j == (r & 1);
                    dt__copy_set_streaming(!plain);
                    MPI_Barrier(MPI_COMM_WORLD);
                    double t0 = mono_now();
                    st = dt_relayout_into(c->src, c->dst);
                    double t = span_of(t0, mono_now());
                    if (st != DT_OK && first == DT_OK)
                        first = st;
                    (plain ? t_plain : t_ours)[r] = t;
                }
                dt__copy_set_streaming(1);
                continue;
            }
            int ours = (k ^ (r & 1)) == 0; /* alternate who goes first */
            if (ab && ours)
                continue; /* timed above */
            if (k >= 2) {            /* the memcpys, last: received bytes, output bytes */
                if (!t_mem)
                    continue;
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = mono_now();
                memcpy(c->mdst, c->msrc, k == 2 ? c->mbytes : c->obytes);
                t_mem[(k - 2) * reps + r] = span_of(t0, mono_now());
                continue;
            }
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = mono_now();
            if (ours) {
                long f0 = minor_faults();
                st = dt_relayout_into(c->src, c->dst);
                faults += minor_faults() - f0;
                if (st != DT_OK && first == DT_OK)
                    first = st;
            } else {
                run_reference(c);
            }
            double t = span_of(t0, mono_now());
            (ours ? t_ours : t_ref)[r] = t;
        }
    MPI_Allreduce(MPI_IN_PLACE, t_ours, reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, t_ref, reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, t_plain, reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (t_mem)
        MPI_Allreduce(MPI_IN_PLACE, t_mem, 2 * reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &faults, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    dt__transport_shm_phases(ph);
    for (int k = 0; k < DT__SHM_PHASES; k++)
        ph[k] = (ph[k] - ph0[k]) / reps;
    MPI_Allreduce(MPI_IN_PLACE, ph, DT__SHM_PHASES, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (!ok_everywhere(first)) {
        report_failure(c, "timed", first);
        goto out;
    }

    /* The reference may have written the same buffers: poison them and run ours once more. */
    poison_destination(c);
    st = dt_relayout_into(c->src, c->dst);
    if (!ok_everywhere(st)) {
        report_failure(c, "verify", st);
        goto out;
    }
    int64_t bad = check_destination(c, nsummands);

    double ours = bu_median(t_ours, reps), ref = bu_median(t_ref, reps);
    double ours_gbs = c->payload / ours / 1e9, ref_gbs = c->payload / ref / 1e9;
    if (g_rank == 0) {
        bu_line line;
        line_head(&line, c);
        /* Which path ran: the regular pattern's collectives (layout/relayout_coll.c; how many
         * plans, 2 for an all-reduce split into reduce-scatter + all-gather) or pieces. */
        bu_line_add(&line, "path", "%s",
                    c->fused ? "fused" : c->colls ? "collective" : "pieces");
        if (c->colls)
            bu_line_add(&line, "coll_plans", "%lu", c->colls);
        bu_line_add(&line, "ours_gbs", "%.3f", ours_gbs);
        bu_line_add(&line, "ref", "%s%s%s", c->dev ? "D2H+" : "", c->ref_name,
                    c->dev ? "+H2D" : "");
        bu_line_add(&line, "ref_gbs", "%.3f", ref_gbs);
        bu_line_add(&line, "ratio", "%.3f", ours_gbs / ref_gbs);
        bu_line_add(&line, "ours_ms", "%.3f", ours * 1e3);
        bu_line_add(&line, "ref_ms", "%.3f", ref * 1e3);
        bu_line_add(&line, "reps", "%d", reps);
        bu_line_add(&line, "faults_per_rep", "%.0f", (double)faults / reps);
        if (ab) { /* ours_ms is with streaming stores; the same runs without */
            double plain = bu_median(t_plain, reps);
            bu_line_add(&line, "ours_plain_ms", "%.3f", plain * 1e3);
            bu_line_add(&line, "ab_speedup", "%.3f", plain / ours);
        }
        if (t_mem) { /* ours against the two memcpys (speed ratios) */
            double mem = bu_median(t_mem, reps), out = bu_median(t_mem + reps, reps);
            bu_line_add(&line, "memcpy_mib", "%.1f", (double)c->mbytes / (1 << 20));
            bu_line_add(&line, "memcpy_ms", "%.3f", mem * 1e3);
            bu_line_add(&line, "ratio_memcpy", "%.3f", mem / ours);
            bu_line_add(&line, "memcpy_out_mib", "%.1f", (double)c->obytes / (1 << 20));
            bu_line_add(&line, "memcpy_out_ms", "%.3f", out * 1e3);
            bu_line_add(&line, "ratio_memcpy_out", "%.3f", out / ours);
        }
        const char *want = getenv("DT_BENCH_PHASES");
        if (want && strcmp(want, "1") == 0 && (ph[DT__SHM_LOCAL] > 0 || ph[DT__SHM_PROGRESS] > 0)) {
            /* Where an shm exchange's time goes, per rep, the most over processes. */
            static const char *names[DT__SHM_PHASES] = {"shm_setup_ms", "shm_local_ms",
                                                        "shm_progress_ms", "shm_peer_copy_ms",
                                                        "shm_handoff_ms"};
            for (int k = 0; k < DT__SHM_PHASES; k++)
                bu_line_add(&line, names[k], "%.3f", ph[k] * 1e3);
        }
        if (c->ref == REF_MEMCPY) {
            bu_line_add(&line, "moved_mib", "%.1f", c->moved_mib);
            bu_line_add(&line, "self_mib", "%.1f", c->self_mib);
        }
        if (bad)
            bu_line_add(&line, "check", "FAIL_%lld_wrong", (long long)bad);
        else
            bu_line_add(&line, "check", "ok");
        bu_line_print(&line);
    }
    failed = bad != 0;
out:
    free(t_ours);
    free(t_plain);
    free(t_ref);
    free(t_mem);
    free(c->msrc);
    free(c->mdst);
    c->msrc = c->mdst = NULL;
    return failed;
}

/* ---- case set-up ------------------------------------------------------------------------- */

/* Layout of `rank` dims with dim `sharded` on x (-1: none), optionally partial (sum) over x. */
static dt_status make_layout(const dt_mesh *mesh, int rank, int sharded, int partial,
                             dt_layout **out)
{
    const char *specs[DT_MAX_RANK];
    for (int d = 0; d < rank; d++)
        specs[d] = d == sharded ? "x" : DT_UNSHARDED;
    if (!partial)
        return dt_layout_create(mesh, rank, specs, out);
    const char *pdims[1] = {"x"};
    dt_reduce_op ops[1] = {DT_REDUCE_SUM};
    return dt_layout_create_partial(mesh, rank, specs, 1, pdims, ops, out);
}

static dt_status make_tensors(const dt_mesh *mesh, int rank, const int64_t *shape,
                              int src_sharded, int src_partial, int dst_sharded,
                              bench_case *c)
{
    dt_layout *sl = NULL, *dl = NULL;
    dt_status st = make_layout(mesh, rank, src_sharded, src_partial, &sl);
    if (st == DT_OK)
        st = make_layout(mesh, rank, dst_sharded, 0, &dl);
    if (st == DT_OK)
        st = dt_tensor_zeros(sl, DT_DTYPE_F32, shape, &c->src);
    if (st == DT_OK)
        st = dt_tensor_zeros(dl, DT_DTYPE_F32, shape, &c->dst);
    dt_layout_destroy(sl);
    dt_layout_destroy(dl);
    return st;
}

static void *comp_data(const dt_tensor *t, int i)
{
    return dt_tensor_local(t, i)->data;
}

/* Sets up case `name` at `mib` MiB per rank on the 1-D mesh; n = mesh size. */
static dt_status setup_case(const char *name, int mib, const dt_mesh *mesh, bench_case *c)
{
    int64_t n = dt_mesh_size(mesh), e = (int64_t)mib << 18; /* floats per rank */
    dt_status st;
    memset(c, 0, sizeof *c);
    c->name = name;
    c->mib = mib;
    if (strcmp(name, "allgather") == 0) {
        int64_t r = e / ROW, shape[2] = {n * r, ROW};
        st = make_tensors(mesh, 2, shape, 0, 0, -1, c);
        c->ref = REF_ALLGATHER;
        c->ref_name = "MPI_Allgather";
        c->rcount = (int)(r * ROW);
        c->payload = (double)(r * ROW) * sizeof(float);
    } else if (strcmp(name, "alltoall") == 0) {
        int64_t r = e / (n * ROW), shape[3] = {n, n * r, ROW};
        st = make_tensors(mesh, 3, shape, 0, 0, 1, c);
        c->ref = REF_ALLTOALL;
        c->ref_name = "MPI_Alltoall";
        c->rcount = (int)(r * ROW);
        c->payload = (double)(n * r * ROW) * sizeof(float);
    } else if (strcmp(name, "alltoall_2d") == 0) {
        int64_t r = e / (n * ROW_2D), shape[2] = {n * r, n * ROW_2D};
        st = make_tensors(mesh, 2, shape, 0, 0, 1, c);
        c->ref = REF_ALLTOALL;
        c->ref_name = "MPI_Alltoall";
        c->rcount = (int)(r * ROW_2D);
        c->payload = (double)(n * r * ROW_2D) * sizeof(float);
    } else if (strcmp(name, "reduce_scatter") == 0 || strcmp(name, "allreduce") == 0) {
        int rs = name[0] == 'r';
        int64_t r = e / (n * ROW), shape[2] = {n * r, ROW};
        st = make_tensors(mesh, 2, shape, -1, 1, rs ? 0 : -1, c);
        c->partial = 1;
        c->ref = rs ? REF_REDUCE_SCATTER : REF_ALLREDUCE;
        c->ref_name = rs ? "MPI_Reduce_scatter_block" : "MPI_Allreduce";
        c->rcount = (int)(rs ? r * ROW : n * r * ROW);
        c->payload = (double)(n * r * ROW) * sizeof(float);
    } else if (strcmp(name, "inprocess") == 0) {
        int64_t r = e / ROW, shape[2] = {n * r, ROW};
        st = make_tensors(mesh, 2, shape, 0, 0, -1, c);
        c->ref = REF_MEMCPY;
        c->ref_name = "memcpy";
        if (st == DT_OK) {
            /* Each shard from its own component into every other device's replica. */
            int nl = dt_tensor_num_local(c->src);
            c->copies = calloc((size_t)nl * (size_t)nl, sizeof *c->copies);
            if (!c->copies)
                return DT_ERR_NO_MEMORY;
            for (int i = 0; i < nl; i++)
                for (int j = 0; j < nl; j++) {
                    if (dt_tensor_local_position(c->dst, i) ==
                        dt_tensor_local_position(c->src, j))
                        continue;
                    const DLTensor *s = dt_tensor_local(c->src, j);
                    int64_t row0 = dt_tensor_local_offset(c->src, j)[0];
                    size_t bytes = (size_t)(s->shape[0] * s->shape[1]) * sizeof(float);
                    c->copies[c->ncopies++] = (copy_op){
                        (char *)comp_data(c->dst, i) + (size_t)(row0 * ROW) * sizeof(float),
                        s->data, bytes};
                }
        }
    } else {
        return DT_ERR_INVALID_ARGUMENT;
    }
    if (st == DT_OK && c->ref != REF_MEMCPY && dt_mesh_device_type(mesh) == DT_DEVICE_GPU) {
        c->dev = dt__tensor_device(c->src, 0);
        c->src_bytes = comp_bytes(c->src, 0);
        c->dst_bytes = comp_bytes(c->dst, 0);
        st = c->dev->kind->host_alloc(c->src_bytes, &c->hsrc);
        if (st == DT_OK)
            st = c->dev->kind->host_alloc(c->dst_bytes, &c->hdst);
    }
    if (st == DT_OK && c->ref != REF_MEMCPY) {
        c->rsend = c->dev ? c->hsrc : comp_data(c->src, 0);
        c->rrecv = c->dev ? c->hdst : comp_data(c->dst, 0);
    }
    return st;
}

static void teardown_case(bench_case *c)
{
    dt_tensor_destroy(c->src);
    dt_tensor_destroy(c->dst);
    if (c->hsrc)
        c->dev->kind->host_free(c->hsrc);
    if (c->hdst)
        c->dev->kind->host_free(c->hdst);
    free(c->copies);
    memset(c, 0, sizeof *c);
    /* Give freed tensors back to the system so the next (larger) case fits in memory. */
    dt_host_pool_trim();
}

/* ---- main -------------------------------------------------------------------------------- */

static int usage(void)
{
    fputs("usage: bench_relayout [--cases LIST] [--mib LIST] [--quick] [--reps N] "
          "[--device cpu|gpu]\n"
          "  --cases  comma-separated, from " ALL_MPI_CASES ",inprocess\n"
          "           (default: the MPI cases under mpirun with one CPU device per process,\n"
          "           inprocess when one process holds several devices)\n"
          "  --mib    payload MiB per rank, default 1,16,128\n"
          "  --quick  fewer repetitions;  --reps N  exactly N timed repetitions\n"
          "  --device gpu  the MPI cases on one GPU device per process (DT_GPU_DEVICES=1),\n"
          "           against device-to-host, the MPI collective, host-to-device\n"
          "Environment: DT_CPU_DEVICES (devices per process), DT_BIND. See docs/bench.md.\n",
          stderr);
    return 2;
}

static int parse_opts(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->mibs[0] = 1;
    o->mibs[1] = 16;
    o->mibs[2] = 128;
    o->nmibs = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--quick") == 0) {
            o->quick = 1;
        } else if (strcmp(a, "--device") == 0 && i + 1 < argc) {
            const char *d = argv[++i];
            if (strcmp(d, "cpu") != 0 && strcmp(d, "gpu") != 0) {
                fprintf(stderr, "bench_relayout: --device '%s' is not cpu or gpu\n", d);
                return -1;
            }
            o->gpu = d[0] == 'g';
        } else if (strcmp(a, "--cases") == 0 && i + 1 < argc) {
            o->cases = argv[++i];
        } else if (strcmp(a, "--mib") == 0 && i + 1 < argc) {
            o->nmibs = bu_parse_int_list(argv[++i], o->mibs, MAX_MIBS);
            if (o->nmibs < 0) {
                fprintf(stderr, "bench_relayout: bad --mib list '%s'\n", argv[i]);
                return -1;
            }
        } else if (strcmp(a, "--reps") == 0 && i + 1 < argc) {
            int n = 0;
            if (bu_parse_int_list(argv[++i], &n, 1) != 1 || n > MAX_REPS) {
                fprintf(stderr, "bench_relayout: bad --reps '%s'\n", argv[i]);
                return -1;
            }
            o->reps = n;
        } else {
            fprintf(stderr, "bench_relayout: unknown argument '%s'\n", a);
            return -1;
        }
    }
    return 0;
}

static int valid_cases(const char *list)
{
    static const char *known[] = {"allgather", "alltoall", "alltoall_2d", "reduce_scatter",
                                  "allreduce", "inprocess"};
    for (const char *p = list; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        int found = 0;
        for (size_t k = 0; k < sizeof known / sizeof *known; k++)
            found |= strlen(known[k]) == len && strncmp(known[k], p, len) == 0;
        if (!found) {
            fprintf(stderr, "bench_relayout: unknown case '%.*s'\n", (int)len, p);
            return 0;
        }
        p = comma ? comma + 1 : "";
    }
    return 1;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse_opts(argc, argv, &o) != 0 || (o.cases && !valid_cases(o.cases)))
        return usage();
    dt_status st = dt_init(&argc, &argv, NULL);
    if (st != DT_OK) {
        fprintf(stderr, "bench_relayout: dt_init: %s: %s\n", dt_status_name(st),
                dt_last_error());
        return 1;
    }
    g_rank = dt_client_id();
    g_nclients = dt_num_clients();
    dt_device_type type = o.gpu ? DT_DEVICE_GPU : DT_DEVICE_CPU;
    const char *tname = o.gpu ? "GPU" : "CPU";
    int nlocal = dt_num_local_devices(type);
    int nglobal = dt_num_global_devices(type);
    const char *cases = o.cases ? o.cases : (nlocal > 1 ? "inprocess" : ALL_MPI_CASES);
    int rc = 0;

    /* The MPI references move one block per process: that is our mesh with one device per
     * process. The in-process case compares with memcpy, so it needs a single process. */
    int want_mpi = 0, want_inproc = bu_list_has(cases, "inprocess");
    static const char *mpi_cases[] = {"allgather", "alltoall", "alltoall_2d", "reduce_scatter",
                                      "allreduce"};
    for (size_t k = 0; k < sizeof mpi_cases / sizeof *mpi_cases; k++)
        want_mpi |= bu_list_has(cases, mpi_cases[k]);
    if ((want_mpi && nlocal != 1) || (want_inproc && (g_nclients != 1 || o.gpu))) {
        if (g_rank == 0)
            fprintf(stderr,
                    "bench_relayout: the MPI cases need one %s device per process "
                    "(DT_%s_DEVICES=1) and 'inprocess' a single process of CPU devices; got "
                    "%d processes of %d devices\n",
                    tname, tname, g_nclients, nlocal);
        dt_finalize();
        return 2;
    }

    const char *dim = "x";
    int64_t size = nglobal;
    dt_mesh *mesh = NULL;
    st = dt_mesh_create("bench", 1, &dim, &size, type, &mesh);
    if (st != DT_OK) {
        fprintf(stderr, "bench_relayout: dt_mesh_create: %s\n", dt_last_error());
        dt_finalize();
        return 1;
    }
    if (g_rank == 0) {
        printf("# bench_relayout: %d process(es), %d %s device(s) each%s%s, mesh x=%d, f32; "
               "GB/s = 1e9 payload bytes/s, median over reps of the span from the first process's start to the last one's end\n",
               g_nclients, nlocal, tname, o.gpu ? " of kind " : "",
               o.gpu && dt__gpu_kind() ? dt__gpu_kind()->name : "", nglobal);
        fflush(stdout);
    }

    static const char *order[] = {"allgather", "alltoall", "alltoall_2d", "reduce_scatter",
                                  "allreduce", "inprocess"};
    for (size_t k = 0; k < sizeof order / sizeof *order; k++) {
        if (!bu_list_has(cases, order[k]))
            continue;
        for (int m = 0; m < o.nmibs; m++) {
            bench_case c;
            st = setup_case(order[k], o.mibs[m], mesh, &c);
            if (!ok_everywhere(st)) {
                if (st != DT_OK)
                    fprintf(stderr, "# client %d: case=%s mib=%d: set-up failed: %s: %s\n",
                            g_rank, order[k], o.mibs[m], dt_status_name(st), dt_last_error());
                if (g_rank == 0)
                    printf("case=%s np=%d mib=%d error=setup_failed\n", order[k], g_nclients,
                           o.mibs[m]);
                rc = 1;
            } else if (run_case(&o, &c, nglobal) != 0) {
                rc = 1;
            }
            teardown_case(&c);
        }
    }
    dt_mesh_destroy(mesh);
    dt_finalize();
    return rc;
}
