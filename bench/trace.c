/* What the flight recorder and DT_CHECK_COLLECTIVES cost: the relayout of 1 MiB per client
 * from row-sharded to replicated (an all-gather) and to column-sharded (an all-to-all), timed
 * with recording off, on, and on with the check, interleaved rep by rep in one run
 * (docs/trace.md). One key=value line per case. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"
#include "runtime/comm.h"
#include "runtime/trace.h"

enum { MODES = 3, MAX_REPS = 2000 };
static const char *mode_name[MODES] = {"off", "on", "check"};

int main(int argc, char **argv)
{
    int mib = 1, reps = argc > 1 ? atoi(argv[1]) : 200;
    if (reps < 1 || reps > MAX_REPS)
        reps = 200;
    if (dt_init(&argc, &argv, NULL) != DT_OK) {
        fprintf(stderr, "bench_trace: dt_init: %s\n", dt_last_error());
        return 1;
    }
    const char *dims[1] = {"x"};
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    int64_t cols = 512, rows = (int64_t)mib * 1024 * 1024 / 4 / cols * n, shape[2] = {rows, cols};
    dt_mesh *mesh = NULL;
    dt_layout *lrows = NULL, *lrep = NULL, *lcols = NULL;
    dt_tensor *src = NULL, *rep = NULL, *col = NULL;
    if (dt_mesh_create("bench", 1, dims, &n, DT_DEVICE_CPU, &mesh) != DT_OK ||
        dt_layout_batch_sharded(mesh, "x", 2, 0, &lrows) != DT_OK ||
        dt_layout_replicated(mesh, 2, &lrep) != DT_OK ||
        dt_layout_inner_sharded(mesh, "x", 2, &lcols) != DT_OK ||
        dt_tensor_zeros(lrows, DT_DTYPE_F32, shape, &src) != DT_OK ||
        dt_tensor_zeros(lrep, DT_DTYPE_F32, shape, &rep) != DT_OK ||
        dt_tensor_zeros(lcols, DT_DTYPE_F32, shape, &col) != DT_OK) {
        fprintf(stderr, "bench_trace: set-up: %s\n", dt_last_error());
        return 1;
    }
    const char *cases[2] = {"allgather", "alltoall"};
    dt_tensor *dsts[2] = {rep, col};
    for (int c = 0; c < 2; c++) {
        static double t[MODES][MAX_REPS];
        for (int w = 0; w < 20; w++)                  /* warm: plans cached, pages touched */
            dt_relayout_into(src, dsts[c]);
        for (int r = 0; r < reps; r++)
            for (int k = 0; k < MODES; k++) {
                /* The order rotates rep by rep: each mode follows each other one as often
                 * (in a fixed order "on" always ran right after "off"). */
                int m = (k + r) % MODES;
                dt__trace_set(m >= 1, m == 2);
                MPI_Barrier(dt__comm());
                double t0 = MPI_Wtime();
                dt_status st = dt_relayout_into(src, dsts[c]);
                t[m][r] = bu_max_all(MPI_Wtime() - t0);
                if (st != DT_OK) {
                    fprintf(stderr, "bench_trace: %s: %s\n", cases[c], dt_last_error());
                    return 1;
                }
            }
        double med[MODES];
        for (int m = 0; m < MODES; m++)
            med[m] = bu_median(t[m], reps);
        if (dt_client_id() == 0) {
            bu_line line;
            bu_line_init(&line);
            bu_line_add(&line, "bench", "trace");
            bu_line_add(&line, "case", "%s", cases[c]);
            bu_line_add(&line, "np", "%d", dt_num_clients());
            bu_line_add(&line, "mib", "%d", mib);
            bu_line_add(&line, "reps", "%d", reps);
            bu_line_add(&line, "transport", "%s", getenv("DT_TRANSPORT") ? getenv("DT_TRANSPORT")
                                                                        : "auto");
            for (int m = 0; m < MODES; m++) {
                char key[32];
                snprintf(key, sizeof key, "%s_us", mode_name[m]);
                bu_line_add(&line, key, "%.1f", med[m] * 1e6);
            }
            bu_line_add(&line, "record_cost_pct", "%.2f", 100.0 * (med[1] / med[0] - 1.0));
            bu_line_add(&line, "check_cost_pct", "%.2f", 100.0 * (med[2] / med[0] - 1.0));
            bu_line_print(&line);
        }
    }
    dt_tensor_destroy(col);
    dt_tensor_destroy(rep);
    dt_tensor_destroy(src);
    dt_layout_destroy(lcols);
    dt_layout_destroy(lrep);
    dt_layout_destroy(lrows);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return 0;
}
