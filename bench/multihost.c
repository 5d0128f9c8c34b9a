/* bench_multihost: relayouts across hosts (run by bench/run multihost on 2 hosts x 2
 * processes made of network namespaces, docs/multihost.md) against MPI's collectives in the
 * same run. The mesh is {host: H, local: L}, one CPU device per process; the data is
 * replicated along `local` (inside a host) and reduced or gathered along `host`, which is
 * where the two-level route applies. References, interleaved with ours:
 *   world: the same collective on MPI_COMM_WORLD with the same bytes per process (what the
 *          issue compares against; all-reduce and reduce-scatter then sum L x as many
 *          contributions, the all-gather takes P/L per process to give the same 2P output)
 *   cross: the same collective on the communicator of the processes with the same local
 *          index (one per host): exactly our result, the hand-made two-level form.
 * One key=value line per case and size; cross_host_mib is what our relayout received across
 * hosts over the job (dt_relayout_stats) next to min_mib, the layouts' minimum. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"

enum { MAX_MIBS = 8, ROW = 1024 };

static int me, nprocs, hosts, local_n;
static MPI_Comm cross_comm;

typedef struct mh_case {
    const char *name;
    dt_tensor *src, *dst;
    int kind;      /* 0 all-reduce, 1 reduce-scatter, 2 all-gather */
    float *wsend, *wrecv;
    int wcount;    /* floats per block for the world reference */
    int ccount;    /* for the cross reference */
    float *csend, *crecv;
} mh_case;

static dt_layout *layout2(const dt_mesh *m, const char *a, int partial)
{
    const char *specs[2] = {a, DT_UNSHARDED}, *pdims[1] = {"host"};
    dt_reduce_op op = DT_REDUCE_SUM;
    dt_layout *l = NULL;
    dt_status st = partial ? dt_layout_create_partial(m, 2, specs, 1, pdims, &op, &l)
                           : dt_layout_create(m, 2, specs, &l);
    return st == DT_OK ? l : NULL;
}

/* Fills the source component: value g % 13 (+ host index for partial summands). */
static void fill(dt_tensor *t, int partial)
{
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *dl = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        float *v = dl->data;
        int64_t n = dl->shape[0] * dl->shape[1];
        int host = (int)(dt_tensor_local_position(t, i) / local_n);
        for (int64_t k = 0; k < n; k++)
            v[k] = (float)((off[0] * ROW + k) % 13) + (partial ? (float)host : 0.0f);
    }
}

/* 1 if every element of the destination is right, on every process. */
static int check(const mh_case *c)
{
    int ok = 1;
    for (int i = 0; i < dt_tensor_num_local(c->dst); i++) {
        const DLTensor *dl = dt_tensor_local(c->dst, i);
        const int64_t *off = dt_tensor_local_offset(c->dst, i);
        const float *v = dl->data;
        int64_t n = dl->shape[0] * dl->shape[1];
        for (int64_t k = 0; k < n && ok; k++) {
            float base = (float)((off[0] * ROW + k) % 13);
            float want = c->kind == 2 ? base
                                      : (float)hosts * base + (float)(hosts * (hosts - 1) / 2);
            ok = v[k] == want;
        }
    }
    return bu_ok_all(ok);
}

/* The collective of case kind on comm, count floats per block. */
static void collective(int kind, MPI_Comm comm, const float *send, float *recv, int count)
{
    if (kind == 0)
        MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, comm);
    else if (kind == 1)
        MPI_Reduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, comm);
    else
        MPI_Allgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, comm);
}

static void run_world(const mh_case *c)
{
    collective(c->kind, MPI_COMM_WORLD, c->wsend, c->wrecv, c->wcount);
}

static void run_cross(const mh_case *c)
{
    collective(c->kind, cross_comm, c->csend, c->crecv, c->ccount);
}

static double timed(void (*fn)(const mh_case *), const mh_case *c, dt_status *st)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (fn)
        fn(c);
    else
        *st = dt_relayout_into(c->src, c->dst);
    return bu_max_all(MPI_Wtime() - t0);
}

static int bench(const dt_mesh *mesh, int kind, int mib, int reps)
{
    static const char *names[3] = {"allreduce", "reduce_scatter", "allgather"};
    mh_case c = {.name = names[kind], .kind = kind};
    int64_t per = (int64_t)mib << 18;               /* floats per process */
    int64_t rows = per / ROW * (kind == 2 ? hosts : 1);
    int64_t shape[2] = {rows, ROW};
    uint64_t total = (uint64_t)(rows * ROW) * 4;    /* S */
    int failed = 1;
    dt_layout *sl = layout2(mesh, kind == 2 ? "host" : DT_UNSHARDED, kind != 2);
    dt_layout *dl = layout2(mesh, kind == 1 ? "host" : DT_UNSHARDED, 0);
    double *t[3] = {calloc((size_t)reps, sizeof(double)), calloc((size_t)reps, sizeof(double)),
                    calloc((size_t)reps, sizeof(double))};
    size_t big = (size_t)per * (size_t)(kind == 2 ? 2 * hosts : 1) * sizeof(float);
    c.wsend = malloc(big);
    c.wrecv = malloc(big);
    c.csend = malloc(big);
    c.crecv = malloc(big);
    if (!sl || !dl || !t[0] || !t[1] || !t[2] || !c.wsend || !c.wrecv || !c.csend || !c.crecv ||
        dt_tensor_zeros(sl, DT_DTYPE_F32, shape, &c.src) != DT_OK ||
        dt_tensor_zeros(dl, DT_DTYPE_F32, shape, &c.dst) != DT_OK) {
        fprintf(stderr, "bench_multihost: set-up failed: %s\n", dt_last_error());
        goto out;
    }
    memset(c.wsend, 0, big);
    memset(c.csend, 0, big);
    if (kind == 0) {
        c.wcount = c.ccount = (int)per;
    } else if (kind == 1) {
        c.wcount = (int)(per / nprocs);
        c.ccount = (int)(per / hosts);
    } else {
        c.wcount = (int)(per * hosts / nprocs);  /* the same 2P output on every process */
        c.ccount = (int)per;
    }
    fill(c.src, kind != 2);
    dt_status st = dt_relayout_into(c.src, c.dst), st2 = DT_OK;
    if (!bu_ok_all(st == DT_OK)) {
        fprintf(stderr, "bench_multihost: %s: %s\n", c.name, dt_last_error());
        goto out;
    }
    dt_relayout_stats s[8];
    int n = 0;
    long long cross = 0;
    if (dt_relayout_last_stats(8, s, &n, NULL) == DT_OK)
        for (int i = 0; i < n && i < 8; i++)
            cross += (long long)s[i].bytes_received_cross_host;
    MPI_Allreduce(MPI_IN_PLACE, &cross, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    uint64_t min = (uint64_t)(hosts - 1) * total * (kind == 0 ? 2 : 1);
    run_world(&c);
    run_cross(&c);
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 3; k++) {
            int who = (k + r) % 3;  /* rotate who goes first */
            t[who][r] = timed(who == 0 ? NULL : who == 1 ? run_world : run_cross, &c, &st2);
        }
    memset(dt_tensor_local(c.dst, 0)->data, 0xff, (size_t)dt_tensor_local(c.dst, 0)->shape[0] *
                                                   ROW * sizeof(float));
    st = dt_relayout_into(c.src, c.dst);
    int ok = bu_ok_all(st == DT_OK && st2 == DT_OK) && check(&c);
    double ours = bu_median(t[0], reps), world = bu_median(t[1], reps);
    double xref = bu_median(t[2], reps);
    if (me == 0) {
        bu_line line;
        bu_line_init(&line);
        bu_line_add(&line, "case", "%s", c.name);
        bu_line_add(&line, "hosts", "%d", hosts);
        bu_line_add(&line, "np", "%d", nprocs);
        bu_line_add(&line, "mib", "%d", mib);
        bu_line_add(&line, "ours_ms", "%.1f", ours * 1e3);
        bu_line_add(&line, "world_ms", "%.1f", world * 1e3);
        bu_line_add(&line, "cross_ms", "%.1f", xref * 1e3);
        bu_line_add(&line, "vs_world", "%.2f", world / ours);
        bu_line_add(&line, "vs_cross", "%.2f", xref / ours);
        bu_line_add(&line, "cross_host_mib", "%.1f", (double)cross / (1 << 20));
        bu_line_add(&line, "min_mib", "%.1f", (double)min / (1 << 20));
        bu_line_add(&line, "reps", "%d", reps);
        bu_line_add(&line, "check", "%s", ok ? "ok" : "FAIL");
        bu_line_print(&line);
    }
    failed = !ok || (uint64_t)cross != min;
out:
    dt_tensor_destroy(c.src);
    dt_tensor_destroy(c.dst);
    dt_layout_destroy(sl);
    dt_layout_destroy(dl);
    for (int i = 0; i < 3; i++)
        free(t[i]);
    free(c.wsend);
    free(c.wrecv);
    free(c.csend);
    free(c.crecv);
    return failed;
}

int main(int argc, char **argv)
{
    int mibs[MAX_MIBS] = {16, 64}, nmibs = 2, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
            nmibs = bu_parse_int_list(argv[++i], mibs, MAX_MIBS);
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_multihost [--mib 16,64] [--reps N]\n");
            return 2;
        }
    }
    if (nmibs < 1 || reps < 1) {
        fprintf(stderr, "bench_multihost: bad --mib or --reps\n");
        return 2;
    }
    dt_status st = dt_init(&argc, &argv, NULL);
    if (st != DT_OK) {
        fprintf(stderr, "bench_multihost: dt_init: %s\n", dt_last_error());
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    /* Hosts as MPI sees them (shared-memory domains), ranks filling hosts in order. */
    MPI_Comm host;
    int host_size = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
    MPI_Comm_size(host, &host_size);
    local_n = host_size;
    hosts = nprocs / local_n;
    MPI_Comm_split(MPI_COMM_WORLD, me % local_n, me, &cross_comm);
    int rc = 0;
    if (hosts < 2 || nprocs % local_n != 0 || dt_num_global_devices(DT_DEVICE_CPU) != nprocs) {
        if (me == 0)
            fprintf(stderr, "bench_multihost: needs >= 2 hosts with equal process counts and "
                            "one CPU device per process (DT_CPU_DEVICES=1)\n");
        rc = 2;
    } else {
        const char *names[2] = {"host", "local"};
        int64_t sizes[2] = {hosts, local_n};
        dt_mesh *mesh = NULL;
        if (dt_mesh_create("hosts", 2, names, sizes, DT_DEVICE_CPU, &mesh) != DT_OK) {
            fprintf(stderr, "bench_multihost: %s\n", dt_last_error());
            rc = 1;
        }
        for (int m = 0; mesh && m < nmibs; m++)
            for (int kind = 0; kind < 3; kind++)
                rc |= bench(mesh, kind, mibs[m], reps);
        dt_mesh_destroy(mesh);
    }
    MPI_Comm_free(&cross_comm);
    MPI_Comm_free(&host);
    dt_finalize();
    return rc;
}
