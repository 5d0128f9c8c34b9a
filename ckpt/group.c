/* The clients of a mesh as an MPI communicator (created per collective call), and agreeing on
 * one outcome so that a failure on one client fails the call on all of them. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"

/* The tag of MPI_Comm_create_group's messages on the runtime's communicator: unlike every
 * other tag there, the watchdog's pings (7301, 7302) included, which a client answering pings
 * would otherwise take from a peer creating the group. */
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

/* The buffers of an agreement: on the heap, and left there when a wait times out (the
 * collective stays pending and MPI may still write into them). */
typedef struct agreement {
    int mine, first;
    struct {
        int status;
        char msg[MSG_LEN];
    } out;
} agreement;

dt_status dt__ckpt_agree(const ck_group *g, dt_status st)
{
    if (g->comm == MPI_COMM_NULL || g->size <= 1)
        return st;
    char keep[MSG_LEN];
    dt__strlcpy(keep, dt_last_error(), sizeof keep);
    agreement *a = calloc(1, sizeof *a);
    if (!a)
        return dt__error(DT_ERR_NO_MEMORY, "checkpoint: no memory to agree on the outcome");
    a->mine = st != DT_OK ? g->rank : INT_MAX;
    a->first = INT_MAX;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(&a->mine, &a->first, 1, MPI_INT, MPI_MIN, g->comm, &req);
    dt_status ws = dt__ckpt_wait(g, &req, rc, "checkpoint: agreeing on the outcome");
    int first = a->first;
    if (ws == DT_OK && first != INT_MAX) {
        if (g->rank == first) {
            a->out.status = (int)st;
            dt__strlcpy(a->out.msg, keep, sizeof a->out.msg);
        }
        rc = MPI_Ibcast(&a->out, (int)sizeof a->out, MPI_BYTE, first, g->comm, &req);
        ws = dt__ckpt_wait(g, &req, rc, "checkpoint: sharing the failure");
    }
    if (ws != DT_OK) {
        if (ws != DT_ERR_TIMEOUT)
            free(a);
        return ws;
    }
    dt_status out = DT_OK;
    if (first != INT_MAX)
        out = g->rank == first ? dt__error(st, "%s", keep)
                               : dt__error((dt_status)a->out.status, "client %d: %s",
                                           g->clients[first], a->out.msg);
    free(a);
    return out;
}

dt_status dt__ckpt_wait(const ck_group *g, MPI_Request *req, int rc, const char *what)
{
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, what);
    return dt__wait_watched_group(req, g->clients, g->size, 0, what);
}
