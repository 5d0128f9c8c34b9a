/* The clients of a mesh as an MPI communicator (created per collective call), and agreeing on
 * one outcome so that a failure on one client fails the call on all of them. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"

/* GROUP_TAG: MPI_Comm_create_group talks on dt__comm() with it, so it must differ from the
 * watchdog's ping tag (7301), or a client answering pings in a relayout takes another
 * client's group message (a hang seen under the staged transport's long waits). */
enum { GROUP_TAG = 7311, MSG_LEN = 1024 };

dt_status dt__ckpt_group_create(const dt_mesh *mesh, ck_group *g)
{
    memset(g, 0, sizeof *g);
    g->comm = MPI_COMM_NULL;
    int nclients = dt_num_clients(), me = dt_client_id(), n = 0, mine = 0;
    dt_device_type type = dt_mesh_device_type(mesh);
    unsigned char *seen = calloc((size_t)nclients, 1);
    g->clients = malloc((size_t)nclients * sizeof *g->clients);
    if (!seen || !g->clients) {
        free(seen);
        free(g->clients);
        g->clients = NULL;
        return dt__error(DT_ERR_NO_MEMORY, "checkpoint: no memory");
    }
    for (int64_t p = 0; p < dt_mesh_size(mesh); p++) {
        int c = dt_device_client(type, dt_mesh_device_id(mesh, p));
        if (c >= 0 && c < nclients)
            seen[c] = 1;
    }
    for (int c = 0; c < nclients; c++)
        if (seen[c]) {
            mine |= c == me;
            g->clients[n++] = c;
        }
    free(seen);
    g->size = n;
    if (!mine)
        return DT_OK;
    MPI_Group world, sub;
    int rc = MPI_Comm_group(dt__comm(), &world);
    if (rc == MPI_SUCCESS)
        rc = MPI_Group_incl(world, n, g->clients, &sub);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Comm_create_group(dt__comm(), sub, GROUP_TAG, &g->comm);
        MPI_Group_free(&sub);
    }
    MPI_Group_free(&world);
    if (rc != MPI_SUCCESS) {
        free(g->clients);
        g->clients = NULL;
        return dt__mpi_error(rc, "checkpoint: creating the mesh's client group");
    }
    MPI_Comm_rank(g->comm, &g->rank);
    return DT_OK;
}

void dt__ckpt_group_free(ck_group *g)
{
    if (g->comm != MPI_COMM_NULL)
        MPI_Comm_free(&g->comm);
    free(g->clients);
    memset(g, 0, sizeof *g);
    g->comm = MPI_COMM_NULL;
}

dt_status dt__ckpt_agree(const ck_group *g, dt_status st)
{
    if (g->comm == MPI_COMM_NULL || g->size <= 1)
        return st;
    int mine = st != DT_OK ? g->rank : INT_MAX, first = INT_MAX;
    int rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, g->comm);
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, "checkpoint: agreeing on the outcome");
    if (first == INT_MAX)
        return DT_OK;
    struct {
        int status;
        char msg[MSG_LEN];
    } out;
    memset(&out, 0, sizeof out);
    if (g->rank == first) {
        out.status = (int)st;
        dt__strlcpy(out.msg, dt_last_error(), sizeof out.msg);
    }
    rc = MPI_Bcast(&out, (int)sizeof out, MPI_BYTE, first, g->comm);
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, "checkpoint: sharing the failure");
    if (g->rank == first)
        return st;
    return dt__error((dt_status)out.status, "client %d: %s", g->clients[first], out.msg);
}
