/* One cached MPI communicator per set of clients holding a mesh's devices (created on a mesh's
 * first collective that needs it), and dt__group_agree: the lowest failing client's status and
 * message reach every client. docs/runtime.md, "Communication groups". */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/util.h"

enum { GROUP_TAG = 7301, AGREE_TAG = 7303, MSG_LEN = 1024 };

typedef struct cached {
    struct cached *next;
    dt__group g;
    int *clients;
} cached;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cached *groups;
static dt__group outside = {.comm = MPI_COMM_NULL};

/* The mesh's clients in order into clients (dt_num_clients() entries); their number. */
static int mesh_clients(const dt_mesh *mesh, int *clients, int *mine)
{
    int nclients = dt_num_clients(), me = dt_client_id(), n = 0;
    dt_device_type type = dt_mesh_device_type(mesh);
    for (int c = 0; c < nclients; c++)
        clients[c] = 0;
    for (int64_t p = 0; p < dt_mesh_size(mesh); p++) {
        int c = dt_device_client(type, dt_mesh_device_id(mesh, p));
        if (c >= 0 && c < nclients)
            clients[c] = 1;
    }
    *mine = 0;
    for (int c = 0; c < nclients; c++)
        if (clients[c]) {
            *mine |= c == me;
            clients[n++] = c;
        }
    return n;
}

static dt_status create(int n, int *clients, cached **out)
{
    cached *e = calloc(1, sizeof *e);
    if (!e)
        return dt__error(DT_ERR_NO_MEMORY, "the mesh's client group: no memory");
    MPI_Group world, sub;
    int rc = MPI_Comm_group(dt__comm(), &world);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Group_incl(world, n, clients, &sub);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Comm_create_group(dt__comm(), sub, GROUP_TAG, &e->g.comm);
            MPI_Group_free(&sub);
        }
        MPI_Group_free(&world);
    }
    if (rc != MPI_SUCCESS) {
        free(e);
        return dt__mpi_error(rc, "creating the mesh's client group");
    }
    MPI_Comm_rank(e->g.comm, &e->g.rank);
    e->g.size = n;
    e->clients = clients;
    e->g.clients = clients;
    *out = e;
    return DT_OK;
}

dt_status dt__mesh_group(const dt_mesh *mesh, const dt__group **group_out)
{
    int nclients = dt_num_clients(), mine = 0;
    int *clients = malloc((size_t)(nclients > 0 ? nclients : 1) * sizeof *clients);
    if (!clients)
        return dt__error(DT_ERR_NO_MEMORY, "the mesh's client group: no memory");
    int n = mesh_clients(mesh, clients, &mine);
    if (!mine) {
        free(clients);
        *group_out = &outside;
        return DT_OK;
    }
    pthread_mutex_lock(&lock);
    cached *e = groups;
    while (e && (e->g.size != n || memcmp(e->clients, clients, (size_t)n * sizeof *clients)))
        e = e->next;
    dt_status st = DT_OK;
    if (e) {
        free(clients);
    } else if ((st = create(n, clients, &e)) == DT_OK) {
        e->next = groups;
        groups = e;
    } else {
        free(clients);
    }
    pthread_mutex_unlock(&lock);
    if (st == DT_OK)
        *group_out = &e->g;
    return st;
}

dt_status dt__group_dup(const dt__group *g, dt__group *out)
{
    dt__group d = {.comm = MPI_COMM_NULL, .rank = g->rank, .size = g->size, .owned = 1};
    int *clients = malloc((size_t)(g->size > 0 ? g->size : 1) * sizeof *clients);
    if (!clients)
        return dt__error(DT_ERR_NO_MEMORY, "the mesh's client group: no memory");
    if (g->size > 0)
        memcpy(clients, g->clients, (size_t)g->size * sizeof *clients);
    if (g->comm != MPI_COMM_NULL) {
        int rc = MPI_Comm_dup(g->comm, &d.comm);
        if (rc != MPI_SUCCESS) {
            free(clients);
            return dt__mpi_error(rc, "duplicating the mesh's client group");
        }
    }
    d.clients = clients;
    *out = d;
    return DT_OK;
}

void dt__group_free(dt__group *g)
{
    if (!g || !g->owned)
        return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (g->comm != MPI_COMM_NULL && !finalized)
        MPI_Comm_free(&g->comm);
    free((int *)g->clients);
    memset(g, 0, sizeof *g);
    g->comm = MPI_COMM_NULL;
}

/* What a member reports, and what group rank 0 answers: the lowest failing member (INT_MAX:
 * none), its status and message. */
typedef struct outcome {
    int first, status;
    char msg[MSG_LEN];
} outcome;

/* Point to point through group rank 0, each wait under the watchdog (dt__wait_watched), so a
 * lost client is DT_ERR_TIMEOUT naming it, not a hang. */
dt_status dt__group_agree(const dt__group *g, dt_status st, const char *what)
{
    if (g->comm == MPI_COMM_NULL || g->size <= 1)
        return st;
    outcome mine = {st != DT_OK ? g->rank : INT_MAX, (int)st, ""}, out = mine;
    if (st != DT_OK)
        dt__strlcpy(mine.msg, dt_last_error(), sizeof mine.msg);
    int n = g->size - 1, rc = MPI_SUCCESS;
    outcome *got = NULL;
    MPI_Request *reqs = malloc((size_t)n * sizeof *reqs);
    int *peers = malloc((size_t)n * sizeof *peers);
    dt_status wst = DT_OK;
    if (!reqs || !peers || (g->rank == 0 && !(got = malloc((size_t)n * sizeof *got)))) {
        wst = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", what);
        goto out;
    }
    if (g->rank == 0) {
        for (int r = 1; r <= n && rc == MPI_SUCCESS; r++) {
            peers[r - 1] = g->clients[r];
            rc = MPI_Irecv(&got[r - 1], (int)sizeof *got, MPI_BYTE, r, AGREE_TAG, g->comm,
                           &reqs[r - 1]);
        }
        if (rc != MPI_SUCCESS || (wst = dt__wait_watched(reqs, peers, n, 0, what)) != DT_OK)
            goto out;
        out = mine; /* rank 0 failing is the lowest; else the first failing report */
        for (int r = 1; r <= n && out.first == INT_MAX; r++)
            if (got[r - 1].first != INT_MAX)
                out = got[r - 1];
        for (int r = 1; r <= n && rc == MPI_SUCCESS; r++)
            rc = MPI_Isend(&out, (int)sizeof out, MPI_BYTE, r, AGREE_TAG, g->comm, &reqs[r - 1]);
        if (rc == MPI_SUCCESS)
            wst = dt__wait_watched(reqs, peers, n, 0, what);
    } else {
        peers[0] = g->clients[0];
        rc = MPI_Isend(&mine, (int)sizeof mine, MPI_BYTE, 0, AGREE_TAG, g->comm, &reqs[0]);
        if (rc == MPI_SUCCESS && (wst = dt__wait_watched(reqs, peers, 1, 0, what)) == DT_OK &&
            (rc = MPI_Irecv(&out, (int)sizeof out, MPI_BYTE, 0, AGREE_TAG, g->comm, &reqs[0])) ==
                MPI_SUCCESS)
            wst = dt__wait_watched(reqs, peers, 1, 0, what);
    }
out:
    free(reqs);
    free(peers);
    free(got);
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, what);
    if (wst != DT_OK)
        return wst;
    if (out.first == INT_MAX)
        return DT_OK;
    if (out.first == g->rank)
        return st;
    out.msg[sizeof out.msg - 1] = '\0';
    return dt__error((dt_status)out.status, "client %d: %s", g->clients[out.first], out.msg);
}

void dt__groups_free(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    pthread_mutex_lock(&lock);
    while (groups) {
        cached *e = groups;
        groups = e->next;
        if (e->g.comm != MPI_COMM_NULL && !finalized)
            MPI_Comm_free(&e->g.comm);
        free(e->clients);
        free(e);
    }
    pthread_mutex_unlock(&lock);
}
