/* mesh_demo: builds a mesh from YAML, lays a 6x5 tensor out over it (rows over `batch`, columns
 * over `model`), packs each local device's shard, prints the layout and what each device
 * holds, then relayouts it (a shard move, then an all-gather to replicated) and checks every
 * device against the global tensor. Usage: mesh_demo MESHES.yaml [MESH_NAME]. */
#include <dtensor/dtensor.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define ROWS 6
#define COLS 5

static int fail(const char *what, dt_status st)
{
    fprintf(stderr, "mesh_demo: %s: %s: %s\n", what, dt_status_name(st), dt_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: mesh_demo MESHES.yaml [MESH_NAME]\n");
        return 2;
    }
    dt_status st = dt_init(&argc, &argv, NULL);
    if (st != DT_OK)
        return fail("dt_init", st);
    int rc = 1;
    dt_mesh *mesh = NULL;
    dt_layout *layout = NULL;
    dt_tensor *tensor = NULL, *moved = NULL, *full = NULL;
    dt_layout *cols = NULL, *rep = NULL;
    float *shards = NULL;
    DLTensor *parts = NULL;

    st = dt_mesh_from_yaml_file(argv[1], argc > 2 ? argv[2] : "demo", &mesh);
    if (st != DT_OK) {
        fail("mesh", st);
        goto out;
    }
    if ((st = dt_mesh_check_devices(mesh)) != DT_OK) {
        fail("mesh devices", st);
        goto out;
    }
    const char *specs[2] = {dt_mesh_dim_name(mesh, 0),
                            dt_mesh_rank(mesh) > 1 ? dt_mesh_dim_name(mesh, 1) : DT_UNSHARDED};
    if ((st = dt_layout_create(mesh, 2, specs, &layout)) != DT_OK) {
        fail("layout", st);
        goto out;
    }

    /* Every device's component: its block of the global tensor g[i][j] = 10*i + j. */
    int64_t shape[2] = {ROWS, COLS}, off[2], loc[2], shape_store[16][2];
    int n = dt_mesh_num_local_devices(mesh);
    shards = calloc((size_t)n * ROWS * COLS, sizeof *shards);
    parts = calloc((size_t)n, sizeof *parts);
    if (!shards || !parts || n > 16) {
        fprintf(stderr, "mesh_demo: out of memory\n");
        goto out;
    }
    for (int k = 0; k < n; k++) {
        int64_t pos = dt_mesh_position(mesh, dt_mesh_local_device_id(mesh, k));
        dt_layout_shard(layout, shape, pos, off, loc);
        float *dst = shards + (size_t)k * ROWS * COLS;
        for (int64_t i = 0; i < loc[0]; i++)
            for (int64_t j = 0; j < loc[1]; j++)
                dst[i * loc[1] + j] = (float)(10 * (off[0] + i) + off[1] + j);
        shape_store[k][0] = loc[0];
        shape_store[k][1] = loc[1];
        parts[k] = (DLTensor){.data = dst, .device = {kDLCPU, 0}, .ndim = 2,
                              .dtype = dt_dtype_to_dlpack(DT_DTYPE_F32),
                              .shape = shape_store[k]};
    }
    if ((st = dt_tensor_pack(layout, shape, n, parts, &tensor)) != DT_OK) {
        fail("pack", st);
        goto out;
    }

    if (dt_client_id() == 0) {
        char text[2048], pic[4096];
        dt_layout_format(layout, text, sizeof text);
        dt_layout_picture(layout, shape, pic, sizeof pic);
        printf("%d clients, %d devices\nlayout: %s\n%s", dt_num_clients(),
               (int)dt_mesh_size(mesh), text, pic);
    }
    for (int c = 0; c < dt_num_clients(); c++) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (c != dt_client_id())
            continue;
        for (int k = 0; k < dt_tensor_num_local(tensor); k++) {
            const DLTensor *t = dt_tensor_local(tensor, k);
            const int64_t *o = dt_tensor_local_offset(tensor, k);
            printf("client %d device %d: offset [%lld,%lld] shape [%lld,%lld]:", c,
                   dt_mesh_local_device_id(mesh, k), (long long)o[0], (long long)o[1],
                   (long long)t->shape[0], (long long)t->shape[1]);
            for (int64_t e = 0; e < t->shape[0] * t->shape[1]; e++)
                printf(" %g", ((const float *)t->data)[e]);
            printf("\n");
        }
        fflush(stdout);
    }

    /* Move the shard: columns over the first mesh dim; then gather everything everywhere. */
    const char *col_specs[2] = {DT_UNSHARDED, dt_mesh_dim_name(mesh, 0)};
    if ((st = dt_layout_create(mesh, 2, col_specs, &cols)) != DT_OK ||
        (st = dt_relayout(tensor, cols, &moved)) != DT_OK ||
        (st = dt_layout_replicated(mesh, 2, &rep)) != DT_OK ||
        (st = dt_relayout(moved, rep, &full)) != DT_OK) {
        fail("relayout", st);
        goto out;
    }
    int wrong = 0;
    for (int k = 0; k < dt_tensor_num_local(full); k++) {
        const float *v = dt_tensor_local(full, k)->data;
        for (int i = 0; i < ROWS * COLS; i++)
            wrong += v[i] != (float)(10 * (i / COLS) + i % COLS);
    }
    dt_relayout_stats rs[16];
    int nrs = 0;
    dt_relayout_last_stats(16, rs, &nrs, NULL);
    if ((st = dt_barrier(mesh, "demo-done", 60.0)) != DT_OK) {
        fail("barrier", st);
        goto out;
    }
    for (int c = 0; c < dt_num_clients(); c++) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (c == dt_client_id())
            printf("client %d: relayout to columns then to replicated: %s; device %d received "
                   "%llu bytes in the all-gather\n", c, wrong ? "WRONG VALUES" : "values correct",
                   nrs ? rs[0].device_id : -1,
                   nrs ? (unsigned long long)rs[0].bytes_received : 0ULL);
        fflush(stdout);
    }
    rc = wrong ? 1 : 0;
out:
    dt_tensor_destroy(full);
    dt_tensor_destroy(moved);
    dt_layout_destroy(rep);
    dt_layout_destroy(cols);
    dt_tensor_destroy(tensor);
    free(parts);
    free(shards);
    dt_layout_destroy(layout);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return rc;
}
