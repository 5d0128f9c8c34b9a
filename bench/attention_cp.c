/* bench_attention_cp: dt_attention and its backward with the sequence sharded over a `seq`
 * mesh dim of every process's one CPU device (context parallel: the ring of
 * ops/attention_ring.c), against the tiled kernel on the whole sequence (the reference, same
 * run, every process at once so that both meet the same contention for cores). One key=value line
 * per seq: seq=, ms= and bwd_ms= (the mesh's, the slowest rank), ref_ms=, ref_bwd_ms=, speedup=;
 * and the ring's communication: ring_mib= (bytes the busiest process sent, forward and backward),
 * ring_msgs=, ring_wait_ms= (the ring's waits on its messages: what the compute did not hide,
 * including waits on a neighbour still computing; slowest rank), p2p_ms= (the same bytes in the
 * same number of hops of plain MPI_Isend/Irecv to the next and from the previous process, no
 * compute: the transport's bound, same run), p2p_gbps=. Run under mpiexec (bench/run attention --cp
 * N). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"
#include "ops/attention_ring.h" /* dt__attention_ring_stats */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill(float *x, int64_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = (float)((s >> 11) * 0x1.0p-53) * 2.0f - 1.0f;
    }
}

/* A tensor of `layout` holding the host array `all` (the whole [1, T, C] tensor). */
static dt_status make(const dt_layout *layout, const int64_t *shape, const float *all,
                      dt_tensor **out)
{
    dt_tensor *t = NULL;
    dt_status st = dt_tensor_zeros(layout, DT_DTYPE_F32, shape, &t);
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(t); i++) {
        const DLTensor *l = dt_tensor_local(t, i);
        int64_t off = dt_tensor_local_offset(t, i)[1], n = l->shape[1] * shape[2];
        st = dt_tensor_local_write(t, i, all + off * shape[2], (size_t)n * sizeof(float));
    }
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

static int fail(const char *what, dt_status st)
{
    fprintf(stderr, "bench_attention_cp: %s: %s: %s\n", what, dt_status_name(st), dt_last_error());
    return 1;
}

/* The transport's bound: `hops` rounds of `bytes` each sent to the next client and received
 * from the previous one with plain MPI_Isend/Irecv, no compute; the slowest client's seconds,
 * the best of reps. */
static double p2p_ring(double bytes, int hops, int reps)
{
    int me = dt_client_id(), n = dt_num_clients();
    int cnt = (int)(bytes / sizeof(float)) + 1;
    float *a = calloc((size_t)cnt, sizeof *a), *b = calloc((size_t)cnt, sizeof *b);
    double best = 1e30;
    for (int r = 0; r < reps && a && b; r++) {
        bu_max_all(0);
        double t0 = now();
        for (int h = 0; h < hops && n > 1; h++) {
            MPI_Request q[2];
            MPI_Irecv(b, cnt, MPI_FLOAT, (me + n - 1) % n, 77, MPI_COMM_WORLD, &q[0]);
            MPI_Isend(a, cnt, MPI_FLOAT, (me + 1) % n, 77, MPI_COMM_WORLD, &q[1]);
            MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
        }
        double t = bu_max_all(now() - t0);
        best = t < best ? t : best;
    }
    free(a);
    free(b);
    return best;
}

static int run_seq(const dt_mesh *mesh, int64_t T, int64_t H, int64_t D, int reps)
{
    int64_t C = H * D, n = T * C, shape[3] = {1, T, C};
    float *buf = malloc((size_t)(8 * n) * sizeof *buf);
    if (!buf)
        return fail("buffers", DT_ERR_NO_MEMORY);
    float *q = buf, *k = q + n, *v = k + n, *dy = v + n;
    fill(q, n, 1);
    fill(k, n, 2);
    fill(v, n, 3);
    fill(dy, n, 4);
    const char *specs[3] = {DT_UNSHARDED, "seq", DT_UNSHARDED};
    dt_layout *l = NULL;
    dt_tensor *t[4] = {NULL, NULL, NULL, NULL};
    dt_status st = dt_layout_create(mesh, 3, specs, &l);
    const float *src[4] = {q, k, v, dy};
    for (int j = 0; j < 4 && st == DT_OK; j++)
        st = make(l, shape, src[j], &t[j]);
    double fwd = 1e30, bwd = 1e30, wait = 1e30, bytes = 0;
    long long msgs = 0;
    for (int r = 0; r <= reps && st == DT_OK; r++) { /* the first is a warm-up */
        dt_tensor *y = NULL, *g[3] = {NULL, NULL, NULL};
        dt__attention_ring_stats(NULL, 1);
        bu_max_all(0);
        double t0 = now();
        st = dt_attention(t[0], t[1], t[2], H, 1, &y);
        double t1 = bu_max_all(now() - t0);
        t0 = now();
        if (st == DT_OK)
            st = dt_attention_backward(t[0], t[1], t[2], H, 1, t[3], &g[0], &g[1], &g[2]);
        double t2 = bu_max_all(now() - t0);
        dt__ring_stats rs;
        dt__attention_ring_stats(&rs, 1);
        double w = bu_max_all(rs.wait_s);
        if (r > 0) {
            fwd = t1 < fwd ? t1 : fwd;
            bwd = t2 < bwd ? t2 : bwd;
            wait = w < wait ? w : wait;
            bytes = rs.bytes;
            msgs = rs.messages;
        }
        dt_tensor_destroy(y);
        for (int j = 0; j < 3; j++)
            dt_tensor_destroy(g[j]);
    }
    /* The reference: the tiled kernel on the whole sequence, every client at once (so that it
     * meets the same contention for cores as the mesh's run), the slowest, the best rep. */
    double rf = 1e30, rb = 1e30;
    float *y = dy + n, *dq = y + n, *dk = dq + n, *dv = dk + n;
    for (int r = 0; r < reps && st == DT_OK; r++) {
        bu_max_all(0);
        double t0 = now();
        st = dt_kernel_attention_tiled(1, T, H, H, D, 1, q, k, v, y, NULL);
        double t1 = bu_max_all(now() - t0);
        t0 = now();
        if (st == DT_OK)
            st = dt_kernel_attention_tiled_grad(1, T, H, H, D, 1, q, k, v, dy, dq, dk, dv);
        double t2 = bu_max_all(now() - t0);
        rf = t1 < rf ? t1 : rf;
        rb = t2 < rb ? t2 : rb;
    }
    /* The same bytes in as many hops (each process sends 4 cp - 3 blocks: cp - 1 of k | v in
     * the forward, again in the backward's recomputed forward and its own pass, cp of dk | dv). */
    /* Every process the same hops: the busiest process's count and bytes (the zig-zag moves
     * differ between processes). */
    bytes = bu_max_all(bytes);
    msgs = (long long)bu_max_all((double)msgs);
    int hops = (int)(msgs > 0 ? msgs : 1);
    double p2p = st == DT_OK ? p2p_ring(bytes / hops, hops, reps) : 0;
    int ok = bu_ok_all(st == DT_OK);
    if (dt_client_id() == 0) {
        bu_line line;
        bu_line_init(&line);
        bu_line_add(&line, "case", "%s", "attention_cp");
        bu_line_add(&line, "cp", "%lld", (long long)dt_mesh_dim_size(mesh, 0));
        bu_line_add(&line, "seq", "%lld", (long long)T);
        bu_line_add(&line, "heads", "%lld", (long long)H);
        bu_line_add(&line, "head_dim", "%lld", (long long)D);
        bu_line_add(&line, "reps", "%d", reps);
        bu_line_add(&line, "ms", "%.2f", fwd * 1e3);
        bu_line_add(&line, "bwd_ms", "%.2f", bwd * 1e3);
        bu_line_add(&line, "ref_ms", "%.2f", rf * 1e3);
        bu_line_add(&line, "ref_bwd_ms", "%.2f", rb * 1e3);
        bu_line_add(&line, "speedup", "%.2f", (rf + rb) / (fwd + bwd));
        bu_line_add(&line, "ring_mib", "%.2f", bytes / (1 << 20));
        bu_line_add(&line, "ring_msgs", "%lld", msgs);
        bu_line_add(&line, "ring_wait_ms", "%.2f", wait * 1e3);
        bu_line_add(&line, "p2p_ms", "%.2f", p2p * 1e3);
        bu_line_add(&line, "p2p_gbps", "%.2f", p2p > 0 ? bytes / p2p / 1e9 : 0.0);
        if (!ok)
            bu_line_add(&line, "error", "%s", "failed");
        bu_line_print(&line);
    }
    if (st != DT_OK)
        fail("attention", st);
    for (int j = 0; j < 4; j++)
        dt_tensor_destroy(t[j]);
    dt_layout_destroy(l);
    free(buf);
    return !ok;
}

int main(int argc, char **argv)
{
    int seq[16] = {4096}, nseq = 1, reps = 2, heads = 4, hd = 64;
    for (int i = 1; i < argc; i++) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--seq") == 0 && val) {
            nseq = bu_parse_int_list(val, seq, 16);
            i++;
        } else if (strcmp(argv[i], "--reps") == 0 && val) {
            reps = atoi(val);
            i++;
        } else if (strcmp(argv[i], "--heads") == 0 && val) {
            heads = atoi(val);
            i++;
        } else if (strcmp(argv[i], "--head-dim") == 0 && val) {
            hd = atoi(val);
            i++;
        } else {
            fprintf(stderr, "usage: bench_attention_cp [--seq 4096] [--reps N] [--heads N] "
                            "[--head-dim N] (under mpiexec, one CPU device per process)\n");
            return 2;
        }
    }
    if (nseq < 1 || reps < 1 || heads < 1 || hd < 1)
        return 2;
    dt_init_opts io = DT_INIT_OPTS_INIT;
    dt_status st = dt_init(&argc, &argv, &io);
    if (st != DT_OK)
        return fail("dt_init", st);
    const char *names[1] = {"seq"};
    int64_t sizes[1] = {dt_num_global_devices(DT_DEVICE_CPU)};
    dt_mesh *mesh = NULL;
    st = dt_mesh_create("cp", 1, names, sizes, DT_DEVICE_CPU, &mesh);
    int bad = st != DT_OK ? fail("mesh", st) : 0;
    if (dt_client_id() == 0)
        printf("# bench_attention_cp: %d processes, one CPU device each; the reference: the "
               "tiled kernel on the whole sequence, in every process at once\n",
               dt_num_clients());
    for (int s = 0; s < nseq && !bad; s++)
        bad |= run_seq(mesh, seq[s], heads, hd, reps);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return bad;
}
