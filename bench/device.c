/* Relayout between the logical GPU devices of one process (DT_GPU_DEVICES of them, on CUDA or
 * the simulator) against the device kind's own device-to-device copies of the same pieces,
 * measured in the same run: the bound a relayout inside one GPU can reach. docs/bench.md.
 *   bench_device [--mib LIST] [--reps N]   (LIST: MiB per device, default 16,64) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"
#include "layout/tensor_dev.h"
#include "runtime/device.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHECK(call)                                                                        \
    do {                                                                                   \
        dt_status st_ = (call);                                                            \
        if (st_ != DT_OK) {                                                                \
            fprintf(stderr, "bench_device: %s: %s: %s\n", #call, dt_status_name(st_),     \
                    dt_last_error());                                                      \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* The reference: every piece the relayout moves, as one device-to-device copy each (the
 * pieces of an all-gather are contiguous; those of an all-to-all are the same bytes in one
 * run, which bounds the strided relayout). Copies on each destination device, then a sync. */
static double raw_copies(const dt_tensor *src, const dt_tensor *dst, size_t piece, int reps)
{
    int n = dt_tensor_num_local(src);
    double *t = malloc(sizeof *t * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int d = 0; d < n; d++) {
            const dt__device *dev = dt__tensor_device(dst, d);
            char *to = dt_tensor_local(dst, d)->data;
            for (int s = 0; s < n; s++)
                CHECK(dev->kind->copy(dev, DT__COPY_D2D, to + (size_t)s * piece,
                                      dt_tensor_local(src, s)->data, piece));
        }
        CHECK(dt__device_sync_all(DT_DEVICE_GPU));
        t[r] = now() - t0;
    }
    double m = bu_median(t, reps);
    free(t);
    return m;
}

static double relayouts(const dt_tensor *src, const dt_layout *to, int reps)
{
    double *t = malloc(sizeof *t * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        dt_tensor *out = NULL;
        double t0 = now();
        CHECK(dt_relayout(src, to, &out));
        t[r] = now() - t0;
        dt_tensor_destroy(out);
    }
    double m = bu_median(t, reps);
    free(t);
    return m;
}

/* case: allgather ([n*k] over x -> replicated) or alltoall ([n*k, n*k*k] dim 0 -> dim 1). */
static void run_case(const dt_mesh *mesh, const char *name, int mib, int reps)
{
    int n = dt_mesh_num_local_devices(mesh);
    int64_t per = (int64_t)mib << 18; /* f32 elements per device */
    dt_layout *from = NULL, *to = NULL;
    const char *rows[] = {"x", DT_UNSHARDED}, *cols[] = {DT_UNSHARDED, "x"};
    int rank = strcmp(name, "allgather") == 0 ? 1 : 2;
    int64_t shape[2];
    size_t piece;
    if (rank == 1) {
        shape[0] = per * n;
        CHECK(dt_layout_create(mesh, 1, rows, &from));
        CHECK(dt_layout_replicated(mesh, 1, &to));
        piece = (size_t)per * 4;
    } else {
        shape[0] = 64 * (int64_t)n;
        shape[1] = per / 64;
        CHECK(dt_layout_create(mesh, 2, rows, &from));
        CHECK(dt_layout_create(mesh, 2, cols, &to));
        piece = (size_t)per * 4 / (size_t)n;
    }
    float one = 1.0f;
    dt_tensor *src = NULL, *ref_dst = NULL;
    CHECK(dt_tensor_filled(from, DT_DTYPE_F32, shape, &one, &src));
    /* Big enough for n pieces per device in both cases. */
    int64_t dshape[1] = {(int64_t)(piece / 4) * n * n};
    dt_layout *flat = NULL;
    CHECK(dt_layout_create(mesh, 1, rows, &flat));
    CHECK(dt_tensor_zeros(flat, DT_DTYPE_F32, dshape, &ref_dst));
    relayouts(src, to, 1); /* plan cached, pools warm */
    raw_copies(src, ref_dst, piece, 1);
    double tr = relayouts(src, to, reps), tc = raw_copies(src, ref_dst, piece, reps);
    bu_line line;
    bu_line_init(&line);
    bu_line_add(&line, "case", "%s", name);
    bu_line_add(&line, "kind", "%s", dt_device_kind_name(DT_DEVICE_GPU));
    bu_line_add(&line, "devices", "%d", n);
    bu_line_add(&line, "mib_per_device", "%d", mib);
    bu_line_add(&line, "relayout_s", "%.6f", tr);
    bu_line_add(&line, "device_copies_s", "%.6f", tc);
    bu_line_add(&line, "ratio", "%.3f", tc / tr);
    bu_line_print(&line);
    dt_tensor_destroy(src);
    dt_tensor_destroy(ref_dst);
    dt_layout_destroy(from);
    dt_layout_destroy(to);
    dt_layout_destroy(flat);
}

int main(int argc, char **argv)
{
    int mibs[8] = {16, 64}, nmib = 2, reps = 10;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
            nmib = bu_parse_int_list(argv[++i], mibs, 8);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else
            nmib = -1;
    }
    if (nmib < 1 || reps < 1) {
        fprintf(stderr, "usage: bench_device [--mib LIST] [--reps N]\n");
        return 2;
    }
    dt_init_opts o = DT_INIT_OPTS_INIT;
    o.bind_cores = 0;
    CHECK(dt_init(&argc, &argv, &o));
    int ngpu = dt_num_local_devices(DT_DEVICE_GPU);
    if (ngpu < 2) {
        fprintf(stderr, "bench_device: %d GPU devices (set DT_GPU=sim or run on a GPU, and "
                "DT_GPU_DEVICES=4)\n", ngpu);
        dt_finalize();
        return 77;
    }
    const char *names[] = {"x"};
    int64_t sizes[] = {ngpu};
    dt_mesh *mesh = NULL;
    CHECK(dt_mesh_create("gpus", 1, names, sizes, DT_DEVICE_GPU, &mesh));
    for (int i = 0; i < nmib; i++) {
        run_case(mesh, "allgather", mibs[i], reps);
        run_case(mesh, "alltoall", mibs[i], reps);
    }
    dt_mesh_destroy(mesh);
    dt_finalize();
    return 0;
}
