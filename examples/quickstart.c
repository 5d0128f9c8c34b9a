/* The README's first program: an 8x4 tensor on a 2x2 mesh of CPU devices, rows sharded over
 * `batch`, gathered whole by a relayout and checked. Every status is checked. */
#include <stdio.h>
#include <dtensor/dtensor.h>

static int bad(dt_status st, const char *what)
{
    if (st != DT_OK)
        fprintf(stderr, "quickstart: %s: %s: %s\n", what, dt_status_name(st), dt_last_error());
    return st != DT_OK;
}

int main(int argc, char **argv)
{
    const char *yaml = "meshes:\n  - {name: train, device_type: CPU, dims: {batch: 2, model: 2}}";
    const char *specs[] = {"batch", DT_UNSHARDED};
    dt_mesh *mesh = NULL;
    dt_layout *rows = NULL, *all = NULL;
    dt_tensor *t = NULL, *whole = NULL;
    float buf[32];
    int wrong = -1;
    if (bad(dt_init(&argc, &argv, NULL), "dt_init"))
        return 1;
    if (bad(dt_mesh_from_yaml_string(yaml, "train", &mesh), "dt_mesh_from_yaml_string") ||
        bad(dt_mesh_check_clients(mesh), "dt_mesh_check_clients") || /* every process in it */
        bad(dt_layout_create(mesh, 2, specs, &rows), "dt_layout_create") ||
        bad(dt_tensor_zeros(rows, DT_DTYPE_F32, (int64_t[]){8, 4}, &t), "dt_tensor_zeros"))
        goto out;
    for (int i = 0; i < dt_tensor_num_local(t); i++) { /* this process's devices */
        int64_t row0 = dt_tensor_local_offset(t, i)[0], n = dt_tensor_local(t, i)->shape[0];
        for (int e = 0; e < n * 4; e++)
            buf[e] = (float)(row0 + e / 4);              /* its rows' global numbers */
        if (bad(dt_tensor_local_write(t, i, buf, (size_t)n * 16), "dt_tensor_local_write"))
            goto out;
    }
    if (bad(dt_layout_replicated(mesh, 2, &all), "dt_layout_replicated") ||
        bad(dt_relayout(t, all, &whole), "dt_relayout") || /* collective: an all-gather */
        bad(dt_tensor_local_read(whole, 0, buf, sizeof buf), "dt_tensor_local_read"))
        goto out;
    wrong = 0;
    for (int e = 0; e < 32; e++)
        wrong += buf[e] != (float)(e / 4);
    printf("quickstart: client %d of %d: rows gathered from 2 shards, %d wrong\n",
           dt_client_id(), dt_num_clients(), wrong);
out:
    dt_tensor_destroy(whole);
    dt_tensor_destroy(t);
    dt_layout_destroy(all);
    dt_layout_destroy(rows);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return wrong == 0 ? 0 : 1;
}
