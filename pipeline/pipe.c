/* A pipe: the stage meshes of a mesh along its pipeline dimension, the communicator the
 * stages' transfers use, and their byte counts (docs/pipeline.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/runtime.h"
#include "pipeline/pipe_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"

/* Stage s's mesh: the devices with coordinate s on `dim`, the other dims in order. */
static dt_status stage_mesh(const dt_mesh *mesh, int dim, int s, dt_mesh **out)
{
    int rank = dt_mesh_rank(mesh);
    int64_t size = dt_mesh_size(mesh), n = size / dt_mesh_dim_size(mesh, dim);
    size_t cap = 512 + (size_t)n * 12 + (size_t)rank * (DT_NAME_MAX + 24);
    char *text = malloc(cap);
    int64_t *coords = malloc((size_t)rank * sizeof *coords);
    dt_status st = DT_OK;
    if (!text || !coords) {
        st = dt__error(DT_ERR_NO_MEMORY, "dt_pipe_create: no memory");
        goto out;
    }
    const char *name = dt_mesh_name(mesh);
    size_t at = (size_t)snprintf(text, cap, "mesh:\n  name: %s%sstage%d\n  device_type: %s\n"
                                 "  dims: {", name, *name ? "." : "", s,
                                 dt_mesh_device_type_name(mesh));
    int first = 1;
    for (int d = 0; d < rank; d++) {
        if (d == dim)
            continue;
        at += (size_t)snprintf(text + at, cap - at, "%s%s: %lld", first ? "" : ", ",
                               dt_mesh_dim_name(mesh, d), (long long)dt_mesh_dim_size(mesh, d));
        first = 0;
    }
    if (first)
        at += (size_t)snprintf(text + at, cap - at, "pipe_local: 1");
    at += (size_t)snprintf(text + at, cap - at, "}\n  device_ids: [");
    first = 1;
    for (int64_t p = 0; p < size; p++) {
        if ((st = dt_mesh_coords(mesh, p, coords)) != DT_OK)
            goto out;
        if (coords[dim] != s)
            continue;
        at += (size_t)snprintf(text + at, cap - at, "%s%d", first ? "" : ", ",
                               dt_mesh_device_id(mesh, p));
        first = 0;
    }
    snprintf(text + at, cap - at, "]\n");
    st = dt_mesh_from_yaml_string(text, NULL, out);
out:
    free(coords);
    free(text);
    return st;
}

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

dt_status dt_pipe_create(const dt_mesh *mesh, const char *dim_name, dt_pipe **pipe_out)
{
    if (!mesh || !dim_name || !pipe_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_create: NULL argument");
    if (!dt_is_initialized())
        return dt__error(DT_ERR_STATE, "dt_pipe_create: the runtime is not initialised");
    int dim = dt_mesh_dim_index(mesh, dim_name);
    if (dim < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_create: the mesh has no dimension "
                         "'%s' for the pipeline", dim_name);
    dt_status st = dt_mesh_check_devices(mesh);
    if (st != DT_OK)
        return st;
    dt_pipe *p = calloc(1, sizeof *p);
    if (!p)
        return dt__error(DT_ERR_NO_MEMORY, "dt_pipe_create: no memory");
    p->comm.comm = MPI_COMM_NULL;
    p->mesh = dt_mesh_retain(mesh);
    p->dim = dim;
    p->stages = (int)dt_mesh_dim_size(mesh, dim);
    p->stage_mesh = calloc((size_t)p->stages, sizeof *p->stage_mesh);
    p->holds = calloc((size_t)p->stages, sizeof *p->holds);
    p->leader = calloc((size_t)p->stages, sizeof *p->leader);
    int nc = dt_num_clients();
    p->client_rank = malloc((size_t)nc * sizeof *p->client_rank);
    int64_t size = dt_mesh_size(mesh);
    int *clients = malloc((size_t)size * sizeof *clients);
    if (!p->stage_mesh || !p->holds || !p->leader || !p->client_rank || !clients) {
        free(clients);
        dt_pipe_destroy(p);
        return dt__error(DT_ERR_NO_MEMORY, "dt_pipe_create: no memory");
    }
    for (int s = 0; s < p->stages; s++) {
        if ((st = stage_mesh(mesh, dim, s, &p->stage_mesh[s])) != DT_OK) {
            free(clients);
            dt_pipe_destroy(p);
            return st;
        }
        p->holds[s] = dt_mesh_num_local_devices(p->stage_mesh[s]) > 0;
        const dt_mesh *sm = p->stage_mesh[s];
        p->leader[s] = -1;
        for (int64_t q = 0; q < dt_mesh_size(sm); q++) {
            int c = dt_device_client(dt_mesh_device_type(sm), dt_mesh_device_id(sm, q));
            if (p->leader[s] < 0 || c < p->leader[s])
                p->leader[s] = c;
        }
    }
    /* The mesh's clients, in client order: the pipe's own communicator spans them. */
    dt_device_type type = dt_mesh_device_type(mesh);
    for (int64_t i = 0; i < size; i++)
        clients[i] = dt_device_client(type, dt_mesh_device_id(mesh, i));
    qsort(clients, (size_t)size, sizeof *clients, cmp_int);
    int n = 0;
    for (int64_t i = 0; i < size; i++)
        if (n == 0 || clients[n - 1] != clients[i])
            clients[n++] = clients[i];
    for (int c = 0; c < nc; c++)
        p->client_rank[c] = -1;
    for (int i = 0; i < n; i++)
        p->client_rank[clients[i]] = i;
    const dt__group *g = NULL;
    st = dt__clients_group(n, clients, &g);
    free(clients);
    if (st == DT_OK)
        st = dt__group_dup(g, &p->comm);
    if (st != DT_OK) {
        dt_pipe_destroy(p);
        return st;
    }
    *pipe_out = p;
    return DT_OK;
}

void dt_pipe_destroy(dt_pipe *pipe)
{
    if (!pipe)
        return;
    (void)dt_pipe_flush(pipe);
    dt__pipe_release_shm(pipe);
    free(pipe->sends);
    for (int i = 0; i < pipe->nlocals; i++)
        free(pipe->locals[i].buf);
    free(pipe->locals);
    dt__group_free(&pipe->comm);
    if (pipe->stage_mesh)
        for (int s = 0; s < pipe->stages; s++)
            dt_mesh_destroy(pipe->stage_mesh[s]);
    free(pipe->stage_mesh);
    free(pipe->holds);
    free(pipe->leader);
    free(pipe->client_rank);
    dt_mesh_destroy(pipe->mesh);
    free(pipe);
}

int dt_pipe_num_stages(const dt_pipe *pipe) { return pipe->stages; }

const dt_mesh *dt_pipe_stage_mesh(const dt_pipe *pipe, int stage)
{
    return stage >= 0 && stage < pipe->stages ? pipe->stage_mesh[stage] : NULL;
}

int dt_pipe_holds_stage(const dt_pipe *pipe, int stage)
{
    return stage >= 0 && stage < pipe->stages ? pipe->holds[stage] : 0;
}

dt_status dt_pipe_share_values(dt_pipe *pipe, int n, const int *stage_of, double *vals)
{
    if (!pipe || n < 0 || (n > 0 && (!stage_of || !vals)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_share_values: NULL argument");
    for (int i = 0; i < n; i++)
        if (stage_of[i] < 0 || stage_of[i] >= pipe->stages)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_share_values: value %d belongs "
                             "to stage %d (the pipe has %d)", i, stage_of[i], pipe->stages);
    if (n == 0 || pipe->comm.comm == MPI_COMM_NULL)
        return DT_OK;
    double *mine = malloc((size_t)n * sizeof *mine);
    if (!mine)
        return dt__error(DT_ERR_NO_MEMORY, "dt_pipe_share_values: no memory");
    /* A sum where only the stage's leader contributes: x + 0 + ... + 0 is x, inf and NaN too. */
    int me = dt_client_id();
    for (int i = 0; i < n; i++)
        mine[i] = pipe->leader[stage_of[i]] == me ? vals[i] : 0.0;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, mine, n, MPI_DOUBLE, MPI_SUM, pipe->comm.comm, &req);
    dt_status st = rc == MPI_SUCCESS ? DT_OK : dt__mpi_error(rc, "dt_pipe_share_values");
    if (st == DT_OK)
        st = dt__wait_watched_group(&req, pipe->comm.clients, pipe->comm.size, 0.0,
                                    "dt_pipe_share_values");
    if (st == DT_OK)
        memcpy(vals, mine, (size_t)n * sizeof *vals);
    free(mine);
    return st;
}

dt_status dt_pipe_get_stats(const dt_pipe *pipe, dt_pipe_stats *stats_out)
{
    if (!pipe || !stats_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_get_stats: NULL argument");
    *stats_out = pipe->stats;
    return DT_OK;
}

void dt_pipe_reset_stats(dt_pipe *pipe)
{
    if (pipe)
        memset(&pipe->stats, 0, sizeof pipe->stats);
}
