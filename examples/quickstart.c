/* The README's first program: an 8x4 tensor on a 2x2 mesh of CPU devices, rows sharded over
 * `batch`, each device writing its rows' global numbers, gathered whole by a relayout and
 * checked; every status is checked. One process (DT_CPU_DEVICES=4) or 2 x 2 under mpiexec. */
#include <stdio.h>
#include <dtensor/dtensor.h>

static int failed(dt_status st, const char *what)
{
    if (st != DT_OK)
        fprintf(stderr, "quickstart: %s: %s: %s\n", what, dt_status_name(st), dt_last_error());
    return st != DT_OK;
}

int main(int argc, char **argv)
{
    const char *yaml = "meshes:\n  - {name: train, device_type: CPU, dims: {batch: 2, model: 2}}";
    const char *specs[] = {"batch", DT_UNSHARDED};
    int64_t shape[2] = {8, 4};
    dt_mesh *mesh = NULL;
    dt_layout *rows = NULL, *all = NULL;
    dt_tensor *t = NULL, *whole = NULL;
    float buf[32];
    int wrong = -1;
    if (failed(dt_init(&argc, &argv, NULL), "dt_init"))
        return 1;
    if (!failed(dt_mesh_from_yaml_string(yaml, "train", &mesh), "dt_mesh_from_yaml_string") &&
        !failed(dt_layout_create(mesh, 2, specs, &rows), "dt_layout_create") &&
        !failed(dt_tensor_zeros(rows, DT_DTYPE_F32, shape, &t), "dt_tensor_zeros")) {
        wrong = 0;
        for (int i = 0; i < dt_tensor_num_local(t) && wrong == 0; i++) { /* my devices */
            const DLTensor *mine = dt_tensor_local(t, i);  /* its shard, as DLPack: 4x4 */
            for (int64_t e = 0; e < mine->shape[0] * 4; e++)
                buf[e] = (float)(dt_tensor_local_offset(t, i)[0] + e / 4);
            wrong = failed(dt_tensor_local_write(t, i, buf, (size_t)mine->shape[0] * 16),
                           "dt_tensor_local_write");
        }
        if (wrong == 0 && !failed(dt_layout_replicated(mesh, 2, &all), "dt_layout_replicated") &&
            !failed(dt_relayout(t, all, &whole), "dt_relayout") && /* collective: all-gather */
            !failed(dt_tensor_local_read(whole, 0, buf, sizeof buf), "dt_tensor_local_read"))
            for (int e = 0; e < 32; e++)
                wrong += buf[e] != (float)(e / 4);
        else
            wrong = -1;
    }
    if (wrong >= 0)
        printf("quickstart: client %d of %d: rows gathered from 2 shards, %d wrong\n",
               dt_client_id(), dt_num_clients(), wrong);
    dt_tensor_destroy(whole);
    dt_tensor_destroy(t);
    dt_layout_destroy(all);
    dt_layout_destroy(rows);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return wrong == 0 ? 0 : 1;
}
