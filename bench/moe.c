/* bench_moe: the ragged all-to-all of a mixture of experts' dispatch (dt_alltoallv, through
 * the transport DT_TRANSPORT picks) against MPI_Alltoall of the counts then MPI_Alltoallv of
 * the same rows (the raw two-step exchange torchtitan and Megatron make), in the same run:
 * one CPU device per process, f32 rows of `hidden` elements, skewed random counts (the same
 * on every client), median of `reps` timed calls each. Prints key=value lines:
 *   a2a_<transport>_vs_alltoallv=<the median over repetitions of ref_us / ours_us, each pair
 *   run back to back> (>= 1: ours at least as fast), with both medians and minima,
 * with the bytes sent per rank and the counts of rank 0; a2a_<transport>_vs_alltoallv_zeroed
 * also charges the reference with zeroing the rows of its receive buffer past those
 * received, which dt_alltoallv's output contract includes (out_rows is the largest count
 * received, so every other rank zeroes a tail).
 * Usage: bench_moe [--mib LIST] [--hidden H] [--reps N] */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int fail(const char *what)
{
    fprintf(stderr, "bench_moe: %s: %s\n", what, dt_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (dt_init(&argc, &argv, NULL) != DT_OK)
        return fail("dt_init");
    double mibs[8] = {1, 16};
    int nmib = 2, reps = 21;
    int64_t hidden = 1024;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--mib") == 0 && a + 1 < argc) {
            nmib = 0;
            for (char *s = strtok(argv[++a], ","); s && nmib < 8; s = strtok(NULL, ","))
                mibs[nmib++] = atof(s);
        } else if (strcmp(argv[a], "--hidden") == 0 && a + 1 < argc) {
            hidden = atoll(argv[++a]);
        } else if (strcmp(argv[a], "--reps") == 0 && a + 1 < argc) {
            reps = atoi(argv[++a]);
        } else if (strcmp(argv[a], "--quick") == 0) {
            reps = 5;
        }
    }
    int P = dt_num_clients(), me = dt_client_id();
    if (dt_num_global_devices(DT_DEVICE_CPU) != P) {
        fprintf(stderr, "bench_moe: run with DT_CPU_DEVICES=1 (one device per process)\n");
        return 1;
    }
    const char *dims[1] = {"ep"};
    int64_t n = P;
    dt_mesh *mesh = NULL;
    dt_layout *xl = NULL, *cl = NULL;
    if (dt_mesh_create("moe", 1, dims, &n, DT_DEVICE_CPU, &mesh) != DT_OK ||
        dt_layout_batch_sharded(mesh, "ep", 2, 0, &xl) != DT_OK ||
        dt_layout_batch_sharded(mesh, "ep", 2, 0, &cl) != DT_OK)
        return fail("set-up");
    const char *tr = getenv("DT_TRANSPORT");
    tr = tr && *tr ? tr : "auto";
    double *t_ours = malloc((size_t)reps * sizeof *t_ours);
    double *t_ref = malloc((size_t)reps * sizeof *t_ref);
    double *t_zero = malloc((size_t)reps * sizeof *t_zero);
    for (int s = 0; s < nmib; s++) {
        int64_t rows = (int64_t)(mibs[s] * 1048576.0) / (hidden * 4); /* rows per rank */
        if (rows < P)
            rows = P;
        /* counts: every rank sends about all of its rows, skewed towards low members (routing
         * imbalance), some members getting none */
        int64_t *all = calloc((size_t)(P * P), sizeof *all);
        for (int m = 0; m < P; m++) {
            int64_t left = rows;
            for (int j = 0; j < P; j++) {
                int64_t c = j == P - 1 ? left : (int64_t)(next_rand() % (uint64_t)(left + 1));
                if (P > 2 && j == 1 && m == 0)
                    c = 0;
                all[m * P + j] = c;
                left -= c;
            }
        }
        int64_t maxr = 0;
        for (int j = 0; j < P; j++) {
            int64_t r = 0;
            for (int m = 0; m < P; m++)
                r += all[m * P + j];
            maxr = r > maxr ? r : maxr;
        }
        int64_t xshape[2] = {rows * P, hidden}, cshape[2] = {P, P};
        dt_tensor *x = NULL, *sc = NULL;
        const float one = 1.0f;
        if (dt_tensor_filled(xl, DT_DTYPE_F32, xshape, &one, &x) != DT_OK ||
            dt_tensor_zeros(cl, DT_DTYPE_I64, cshape, &sc) != DT_OK ||
            dt_tensor_local_write(sc, 0, &all[me * P], (size_t)P * sizeof(int64_t)) != DT_OK)
            return fail("tensors");
        /* the reference's buffers */
        size_t rowb = (size_t)hidden * 4;
        float *sbuf = malloc((size_t)rows * rowb), *rbuf = malloc((size_t)maxr * rowb + 1);
        memset(sbuf, 0, (size_t)rows * rowb);
        int *scnt = malloc((size_t)P * sizeof(int)), *sdis = malloc((size_t)P * sizeof(int));
        int *rcnt = malloc((size_t)P * sizeof(int)), *rdis = malloc((size_t)P * sizeof(int));
        int64_t *mycounts = malloc((size_t)P * sizeof(int64_t));
        int64_t *theirs = malloc((size_t)P * sizeof(int64_t));
        memcpy(mycounts, &all[me * P], (size_t)P * sizeof(int64_t));
        for (int w = -2; w < reps; w++) {
            /* ours: counts in a tensor, rows in a tensor, a new output */
            dt_tensor *y = NULL;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (dt_alltoallv(x, sc, "ep", maxr, &y, NULL) != DT_OK)
                return fail("dt_alltoallv");
            double t1 = MPI_Wtime();
            dt_tensor_destroy(y);
            /* reference: the counts, then the rows */
            MPI_Barrier(MPI_COMM_WORLD);
            double t2 = MPI_Wtime();
            MPI_Alltoall(mycounts, 1, MPI_INT64_T, theirs, 1, MPI_INT64_T, MPI_COMM_WORLD);
            int so = 0, ro = 0;
            for (int j = 0; j < P; j++) {
                scnt[j] = (int)((size_t)mycounts[j] * rowb);
                sdis[j] = so;
                so += scnt[j];
                rcnt[j] = (int)((size_t)theirs[j] * rowb);
                rdis[j] = ro;
                ro += rcnt[j];
            }
            MPI_Alltoallv(sbuf, scnt, sdis, MPI_BYTE, rbuf, rcnt, rdis, MPI_BYTE,
                          MPI_COMM_WORLD);
            double t3 = MPI_Wtime();
            /* what dt_alltoallv also does: the rows past those received are zeroed */
            memset((char *)rbuf + ro, 0, (size_t)maxr * rowb - (size_t)ro);
            double t4 = MPI_Wtime();
            if (w >= 0) {
                t_ours[w] = t1 - t0;
                t_ref[w] = t3 - t2;
                t_zero[w] = t4 - t2;
            }
        }
        /* the slowest rank's time per repetition decides */
        MPI_Allreduce(MPI_IN_PLACE, t_ours, reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, t_ref, reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, t_zero, reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        /* the ratio of each repetition (ours and the reference ran back to back, so a load
         * spike from other work on the machine hits both), then medians */
        double *ratio = malloc(2 * (size_t)reps * sizeof *ratio), *zratio = ratio + reps;
        for (int r = 0; r < reps; r++) {
            ratio[r] = t_ref[r] / t_ours[r];
            zratio[r] = t_zero[r] / t_ours[r];
        }
        qsort(ratio, (size_t)reps, sizeof *ratio, cmp);
        qsort(zratio, (size_t)reps, sizeof *zratio, cmp);
        double zmed = zratio[reps / 2];
        qsort(t_ours, (size_t)reps, sizeof *t_ours, cmp);
        qsort(t_ref, (size_t)reps, sizeof *t_ref, cmp);
        double ours = t_ours[reps / 2], ref = t_ref[reps / 2], rmed = ratio[reps / 2];
        free(ratio);
        if (me == 0) {
            printf("case=a2a transport=%s np=%d hidden=%lld rows_per_rank=%lld "
                   "bytes_per_rank=%lld max_recv_rows=%lld counts0=", tr, P, (long long)hidden,
                   (long long)rows, (long long)(rows * (int64_t)rowb), (long long)maxr);
            for (int j = 0; j < P; j++)
                printf("%s%lld", j ? "," : "", (long long)all[j]);
            printf(" ours_us=%.1f alltoallv_us=%.1f ours_min_us=%.1f alltoallv_min_us=%.1f "
                   "a2a_%s_vs_alltoallv=%.3f a2a_%s_vs_alltoallv_zeroed=%.3f\n", ours * 1e6,
                   ref * 1e6, t_ours[0] * 1e6, t_ref[0] * 1e6, tr, rmed, tr, zmed);
            fflush(stdout);
        }
        free(theirs);
        free(mycounts);
        free(scnt);
        free(sdis);
        free(rcnt);
        free(rdis);
        free(sbuf);
        free(rbuf);
        free(all);
        dt_tensor_destroy(sc);
        dt_tensor_destroy(x);
    }
    free(t_ours);
    free(t_ref);
    free(t_zero);
    dt_layout_destroy(cl);
    dt_layout_destroy(xl);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return 0;
}
