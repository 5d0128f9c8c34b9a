/* bench_relayout_small: what a relayout costs per call at small sizes, where a transport's
 * fixed costs (e.g. the mpi transport's agreement on what each client moves, issue 45) show:
 * row-sharded -> replicated (all-gather) and -> column-sharded (all-to-all) on a 1-D mesh of
 * every CPU device, f32 [rows, 64], for each total size in bytes given. Batches of `inner`
 * calls of dt_relayout_into, median and min of `batches` batch means, in us per call.
 * Usage: bench_relayout_small [BYTES...] (default 1024 65536 1048576). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "dtensor/dtensor.h"

enum { BATCHES = 31, INNER = 200 };

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (dt_init(&argc, &argv, NULL) != DT_OK) {
        fprintf(stderr, "bench_relayout_small: dt_init: %s\n", dt_last_error());
        return 1;
    }
    long sizes[16] = {1024, 65536, 1048576};
    int nsizes = 3;
    if (argc > 1)
        for (nsizes = 0; nsizes < argc - 1 && nsizes < 16; nsizes++)
            sizes[nsizes] = atol(argv[nsizes + 1]);
    const char *dims[1] = {"x"};
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    dt_mesh *mesh = NULL;
    dt_layout *rows = NULL, *rep = NULL, *cols = NULL;
    if (dt_mesh_create("bench", 1, dims, &n, DT_DEVICE_CPU, &mesh) != DT_OK ||
        dt_layout_batch_sharded(mesh, "x", 2, 0, &rows) != DT_OK ||
        dt_layout_replicated(mesh, 2, &rep) != DT_OK ||
        dt_layout_inner_sharded(mesh, "x", 2, &cols) != DT_OK) {
        fprintf(stderr, "bench_relayout_small: set-up: %s\n", dt_last_error());
        return 1;
    }
    const char *transport = getenv("DT_TRANSPORT");
    for (int s = 0; s < nsizes; s++) {
        int64_t r = sizes[s] / 4 / 64;
        r = (r + n - 1) / n * n;
        int64_t shape[2] = {r, 64};
        const dt_layout *to[2] = {rep, cols};
        const char *name[2] = {"allgather", "alltoall"};
        for (int c = 0; c < 2; c++) {
            dt_tensor *src = NULL, *dst = NULL;
            if (dt_tensor_zeros(rows, DT_DTYPE_F32, shape, &src) != DT_OK ||
                dt_tensor_zeros(to[c], DT_DTYPE_F32, shape, &dst) != DT_OK) {
                fprintf(stderr, "bench_relayout_small: tensors: %s\n", dt_last_error());
                return 1;
            }
            double t[BATCHES];
            for (int w = 0; w < 20; w++)
                dt_relayout_into(src, dst);
            for (int b = 0; b < BATCHES; b++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                for (int i = 0; i < INNER; i++)
                    if (dt_relayout_into(src, dst) != DT_OK) {
                        fprintf(stderr, "bench_relayout_small: %s\n", dt_last_error());
                        return 1;
                    }
                t[b] = (MPI_Wtime() - t0) / INNER * 1e6;
            }
            qsort(t, BATCHES, sizeof *t, cmp);
            if (dt_client_id() == 0)
                printf("case=%s transport=%s np=%d devices=%lld bytes=%lld median_us=%.2f "
                       "min_us=%.2f\n", name[c], transport ? transport : "auto",
                       dt_num_clients(), (long long)n, (long long)(r * 64 * 4), t[BATCHES / 2],
                       t[0]);
            dt_tensor_destroy(dst);
            dt_tensor_destroy(src);
        }
    }
    dt_layout_destroy(cols);
    dt_layout_destroy(rep);
    dt_layout_destroy(rows);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return 0;
}
