/* `dtensor mesh show`: the canonical mesh string, then a table of dims and devices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void print_table(const dt_mesh *mesh)
{
    int rank = dt_mesh_rank(mesh);
    const char *name = dt_mesh_name(mesh);
    if (dt_mesh_is_empty(mesh)) {
        printf("the empty mesh: no dims, no devices\n");
        return;
    }
    /* The type as the device names spell it (TPU, XLA_CPU, ...); only CPU and GPU can hold
     * tensors here, which the line says for the others. */
    dt_device_type type = dt_mesh_device_type(mesh);
    printf("mesh %s%s%s: %lld %s devices, %d dims%s\n", name[0] ? "'" : "",
           name[0] ? name : "(unnamed)", name[0] ? "'" : "", (long long)dt_mesh_size(mesh),
           dt_mesh_device_type_name(mesh), rank,
           type == DT_DEVICE_CPU || type == DT_DEVICE_GPU ? ""
                                                          : " (cannot hold tensors here)");
    printf("  %-16s %8s\n", "dim", "size");
    for (int d = 0; d < rank; d++)
        printf("  %-16s %8lld\n", dt_mesh_dim_name(mesh, d), (long long)dt_mesh_dim_size(mesh, d));
    printf("  %8s %8s", "position", "device");
    for (int d = 0; d < rank; d++)
        printf(" %8.8s", dt_mesh_dim_name(mesh, d));
    printf("  local\n");
    int64_t coords[DT_MESH_MAX_DIMS];
    for (int64_t p = 0; p < dt_mesh_size(mesh); p++) {
        int id = dt_mesh_device_id(mesh, p);
        printf("  %8lld %8d", (long long)p, id);
        if (dt_mesh_coords(mesh, p, coords) == DT_OK)
            for (int d = 0; d < rank; d++)
                printf(" %8lld", (long long)coords[d]);
        int local = 0;
        for (int i = 0; i < dt_mesh_num_local_devices(mesh); i++)
            local |= dt_mesh_local_device_id(mesh, i) == id;
        printf("  %s\n", local ? "yes" : "no");
    }
}

int cli_mesh(int argc, char **argv)
{
    const char *file = NULL, *string = NULL, *select = NULL;
    if (argc < 2 || strcmp(argv[1], "show") != 0)
        return cli_usage();
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--name") == 0 && i + 1 < argc)
            select = argv[++i];
        else if (strcmp(argv[i], "--string") == 0 && i + 1 < argc)
            string = argv[++i];
        else if (argv[i][0] != '-' && !file)
            file = argv[i];
        else
            return cli_usage();
    }
    if (!!file == !!string || (string && select))
        return cli_usage();

    dt_mesh *mesh = NULL;
    dt_status st = string ? dt_mesh_parse(string, &mesh)
                          : dt_mesh_from_yaml_file(file, select, &mesh);
    if (st != DT_OK)
        return cli_fail(string ? "mesh string" : file, st);
    char *text = cli_mesh_string(mesh);
    if (!text) {
        dt_mesh_destroy(mesh);
        return cli_fail("mesh", DT_ERR_NO_MEMORY);
    }
    printf("%s\n", text);
    print_table(mesh);
    free(text);
    dt_mesh_destroy(mesh);
    return CLI_OK;
}
