/* `dtensor mesh show`: the canonical mesh string, then a table of dims and devices; every mesh
 * of a file of several unless --name picks one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* Prints one mesh: its canonical string, then its table. */
static int show(const dt_mesh *mesh)
{
    char *text = cli_mesh_string(mesh);
    if (!text)
        return cli_fail("mesh", DT_ERR_NO_MEMORY);
    printf("%s\n", text);
    print_table(mesh);
    free(text);
    return CLI_OK;
}

static int show_one(const char *file, const char *string, const char *select)
{
    dt_mesh *mesh = NULL;
    dt_status st = string ? dt_mesh_parse(string, &mesh)
                          : dt_mesh_from_yaml_file(file, select, &mesh);
    if (st != DT_OK)
        return cli_fail(string ? "mesh string" : file, st);
    int rc = show(mesh);
    dt_mesh_destroy(mesh);
    return rc;
}

/* A file of several meshes without --name: a line naming them all, then each one. */
static int show_all(const char *file, int n)
{
    char(*names)[DT_NAME_MAX] = calloc((size_t)n, sizeof *names);
    if (!names)
        return cli_fail("mesh", DT_ERR_NO_MEMORY);
    int count = 0, rc = CLI_OK;
    dt_status st = dt_mesh_yaml_names(file, n, names, &count);
    if (st != DT_OK) {
        free(names);
        return cli_fail(file, st);
    }
    printf("%s: %d meshes:", file, count);
    for (int i = 0; i < count && i < n; i++)
        printf(" %s%s", names[i][0] ? names[i] : "(unnamed)", i + 1 < count ? "," : "");
    printf(" (--name NAME shows one)\n");
    for (int i = 0; i < count && i < n && rc == CLI_OK; i++) {
        printf("\n");
        int seen = 0; /* --name picks the first mesh of a name: a second cannot be shown */
        for (int k = 0; k < i; k++)
            seen |= strcmp(names[k], names[i]) == 0;
        if (seen)
            printf("mesh %d of %d: %s%s%s as an earlier one: not shown (give it a name of "
                   "its own)\n", i + 1, count, names[i][0] ? "named '" : "unnamed,",
                   names[i], names[i][0] ? "'" : "");
        else
            rc = show_one(file, NULL, names[i]);
    }
    free(names);
    return rc;
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

    struct stat sb;
    if (file && stat(file, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "dtensor: %s: is a directory, not a mesh file (dtensor mesh show "
                "FILE.yaml)\n", file);
        return CLI_BAD_INPUT;
    }
    if (file && !select) {
        int count = 0;
        dt_status st = dt_mesh_yaml_names(file, 0, NULL, &count);
        if (st != DT_OK)
            return cli_fail(file, st);
        if (count > 1)
            return show_all(file, count);
    }
    return show_one(file, string, select);
}
