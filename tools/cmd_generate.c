/* `dtensor generate`: text from a Hugging Face model directory on a mesh, the run of
 * examples/generate (examples/llama/gen.c: the same options, the same output), started as a
 * subcommand: MPI and the runtime sized from the mesh (--mesh FILE, default one CPU device
 * `batch=1, model=1`), so `mpirun -n 2 dtensor generate --mesh 1x2.yaml ...` runs it too. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../examples/llama/gen.h"

typedef struct gen_ctx {
    int me;
} gen_ctx;

/* Client 0 prints a failure, as the examples do. */
static void fail(void *arg, const char *what, dt_status st, const char *msg)
{
    const gen_ctx *c = arg;
    if (c->me == 0)
        fprintf(stderr, "dtensor generate: %s: %s: %s\n", what, dt_status_name(st), msg ? msg : "");
}

static dt_status load_mesh(const char *file, dt_mesh **out)
{
    if (file)
        return dt_mesh_from_yaml_file(file, NULL, out);
    const char *names[2] = {"batch", "model"};
    const int64_t sizes[2] = {1, 1};
    return dt_mesh_create("cpu_1x1", 2, names, sizes, DT_DEVICE_CPU, out);
}

/* The mesh's dims are `batch` and optionally `model`, its devices this job's. */
static int check_mesh(const dt_mesh *m, char *why, size_t len)
{
    if (dt_mesh_dim_index(m, "batch") < 0) {
        snprintf(why, len, "mesh '%s' has no dim 'batch' (generate uses 'batch' and 'model')",
                 dt_mesh_name(m));
        return -1;
    }
    for (int d = 0; d < dt_mesh_rank(m); d++)
        if (strcmp(dt_mesh_dim_name(m, d), "batch") && strcmp(dt_mesh_dim_name(m, d), "model")) {
            snprintf(why, len, "mesh '%s' has a dim '%s' (generate uses 'batch' and 'model')",
                     dt_mesh_name(m), dt_mesh_dim_name(m, d));
            return -1;
        }
    dt_device_type t = dt_mesh_device_type(m);
    if (dt_num_global_devices(t) != dt_mesh_size(m)) {
        snprintf(why, len, "mesh '%s' has %lld devices but this job has %d", dt_mesh_name(m),
                 (long long)dt_mesh_size(m), dt_num_global_devices(t));
        return -1;
    }
    return 0;
}

int cli_generate(int argc, char **argv)
{
    gen_opts o;
    int rc = gen_parse(argc, argv, 1, "dtensor generate", &o);
    if (rc == 2) {
        printf("usage: dtensor generate --model DIR --prompt TEXT [--prompt TEXT]... [options]\n");
        gen_usage(stdout, "one CPU device, batch=1 model=1");
        return CLI_OK;
    }
    if (rc != 0)
        return CLI_USAGE;
    MPI_Init(NULL, NULL);
    gen_ctx ctx = {0};
    int nprocs = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &ctx.me);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    dt_mesh *mesh = NULL;
    dt_status st = load_mesh(o.mesh, &mesh);
    if (st != DT_OK) {
        rc = ctx.me == 0 ? cli_fail("mesh", st) : CLI_BAD_INPUT;
        goto out_mpi;
    }
    /* Each process gets its share of the mesh's devices unless the environment says. */
    dt_init_opts io = DT_INIT_OPTS_INIT;
    int gpu = dt_mesh_device_type(mesh) == DT_DEVICE_GPU;
    const char *env = getenv(gpu ? "DT_GPU_DEVICES" : "DT_CPU_DEVICES");
    if (!env || !*env) {
        int64_t share = dt_mesh_size(mesh) / nprocs;
        if (share * nprocs != dt_mesh_size(mesh)) {
            if (ctx.me == 0)
                fprintf(stderr,
                        "dtensor generate: mesh: %lld devices do not split over %d "
                        "processes\n",
                        (long long)dt_mesh_size(mesh), nprocs);
            rc = CLI_BAD_INPUT;
            goto out_mesh;
        }
        if (gpu)
            io.gpu_devices = (int)share;
        else
            io.cpu_devices = (int)share;
    }
    /* The mesh read before dt_init only sized the devices: read again, its devices are
     * this job's now. */
    dt_mesh_destroy(mesh);
    mesh = NULL;
    if ((st = dt_init(NULL, NULL, &io)) != DT_OK) {
        rc = ctx.me == 0 ? cli_fail("dt_init", st) : CLI_BAD_INPUT;
        goto out_mpi;
    }
    if ((st = load_mesh(o.mesh, &mesh)) != DT_OK) {
        rc = ctx.me == 0 ? cli_fail("mesh", st) : CLI_BAD_INPUT;
        dt_finalize();
        goto out_mpi;
    }
    char why[256];
    if (check_mesh(mesh, why, sizeof why) != 0) {
        if (ctx.me == 0)
            fprintf(stderr, "dtensor generate: %s\n", why);
        rc = CLI_BAD_INPUT;
    } else if ((st = dt_mesh_check_devices(mesh)) != DT_OK) {
        rc = ctx.me == 0 ? cli_fail("mesh", st) : CLI_BAD_INPUT;
    } else {
        rc = gen_run(mesh, ctx.me, &o, stdout, fail, &ctx) == 0 ? CLI_OK : CLI_BAD_INPUT;
    }
    dt_mesh_destroy(mesh);
    mesh = NULL;
    dt_finalize();
out_mesh:
    dt_mesh_destroy(mesh);
out_mpi:
    MPI_Finalize();
    return rc;
}
