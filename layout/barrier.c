/* dt_barrier: every client of a mesh tells every other one that it arrived and how many of
 * the mesh's devices it holds (DTensor's all-reduce of ones, checked against the mesh size).
 * Point-to-point arrival messages under the watchdog (runtime/watchdog.c) let a timed-out
 * barrier name the clients that never came and their hosts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/layout_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/trace.h"
#include "runtime/util.h"

enum { BARRIER_TAG = 7201 };

typedef struct arrival {
    int64_t devices;                /* this sender's devices in the mesh */
    char name[DT_NAME_MAX];
} arrival;

/* Clients holding devices of the mesh, increasing, and this client's device count. */
static dt_status mesh_clients(const dt_mesh *mesh, int **clients_out, int *n_out,
                              int64_t *mine_out)
{
    int nclients = dt_num_clients(), me = dt_client_id(), n = 0;
    dt_device_type type = dt_mesh_device_type(mesh);
    unsigned char *seen = calloc((size_t)nclients, 1);
    int *list = malloc((size_t)nclients * sizeof *list);
    if (!seen || !list) {
        free(seen);
        free(list);
        return dt__error(DT_ERR_NO_MEMORY, "barrier: no memory");
    }
    *mine_out = 0;
    for (int64_t p = 0; p < dt_mesh_size(mesh); p++) {
        int c = dt_device_client(type, dt_mesh_device_id(mesh, p));
        if (c < 0 || c >= nclients)
            continue;
        seen[c] = 1;
        *mine_out += c == me;
    }
    for (int c = 0; c < nclients; c++)
        if (seen[c])
            list[n++] = c;
    free(seen);
    *clients_out = list;
    *n_out = n;
    return DT_OK;
}

dt_status dt_barrier(const dt_mesh *mesh, const char *name, double timeout_seconds)
{
    if (!mesh)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "barrier: NULL mesh");
    dt_status st = dt_mesh_check_devices(mesh);
    if (st != DT_OK)
        return st;
    int *clients = NULL, n = 0, me = dt_client_id();
    int64_t mine = 0;
    if ((st = mesh_clients(mesh, &clients, &n, &mine)) != DT_OK)
        return st;
    if (mine == 0) {                      /* not a member: nothing to wait for */
        free(clients);
        return DT_OK;
    }
    if (!(timeout_seconds > 0)) {         /* no timeout of the caller's: the watchdog's */
        const char *bad = NULL;
        timeout_seconds = dt__comm_timeout(&bad);
        if (bad) {
            free(clients);
            return dt__error(DT_ERR_INVALID_ARGUMENT, "barrier: DT_COMM_TIMEOUT='%s' is not a "
                             "number of seconds > 0", bad);
        }
    }
    long token = -1;                      /* the flight recorder (relayout_trace.c) */
    if ((st = dt__barrier_trace_begin(mesh, name, &token)) != DT_OK) {
        free(clients);
        return st;
    }
    arrival out = {.devices = mine};
    dt__strlcpy(out.name, name ? name : "", sizeof out.name);
    arrival *in = calloc((size_t)n, sizeof *in);
    MPI_Request *reqs = malloc(2 * (size_t)n * sizeof *reqs);
    int *peer_of = malloc(2 * (size_t)n * sizeof *peer_of);
    if (!in || !reqs || !peer_of) {
        st = dt__error(DT_ERR_NO_MEMORY, "barrier: no memory");
        goto out;
    }
    MPI_Comm comm = dt__comm();
    for (int i = 0; i < n; i++) {
        reqs[i] = reqs[n + i] = MPI_REQUEST_NULL;
        if (clients[i] == me) {
            in[i] = out;
            continue;
        }
        MPI_Irecv(&in[i], (int)sizeof in[i], MPI_BYTE, clients[i], BARRIER_TAG, comm, &reqs[i]);
        MPI_Isend(&out, (int)sizeof out, MPI_BYTE, clients[i], BARRIER_TAG, comm, &reqs[n + i]);
    }
    char what[3 * DT_NAME_MAX];
    snprintf(what, sizeof what, "barrier '%s' on mesh '%s'", out.name, dt_mesh_name(mesh));
    for (int i = 0; i < n; i++)
        peer_of[i] = peer_of[n + i] = clients[i];
    if ((st = dt__wait_watched(reqs, peer_of, 2 * n, timeout_seconds, what)) != DT_OK)
        goto out;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (strncmp(in[i].name, out.name, sizeof out.name) != 0) {
            st = dt__error(DT_ERR_STATE, "barrier '%s': client %d called barrier '%.*s' instead",
                           out.name, clients[i], (int)sizeof in[i].name, in[i].name);
            goto out;
        }
        total += in[i].devices;
    }
    if (total != dt_mesh_size(mesh))
        st = dt__error(DT_ERR_STATE, "barrier '%s': %lld devices arrived but mesh '%s' has %lld",
                       out.name, (long long)total, dt_mesh_name(mesh),
                       (long long)dt_mesh_size(mesh));
out:
    dt__coll_end(token, "mpi", st);
    free(peer_of);
    free(reqs);
    free(in);
    free(clients);
    return st;
}
