/* One cached MPI communicator per ordered list of clients (created on the first collective over
 * that list; mesh/mesh_group.c lists a mesh's clients), and dt__group_agree: the lowest failing
 * client's status and message reach every client. docs/runtime.md, "Communication groups". */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/util.h"

/* MPI_Comm_create_group tags: one per set of clients (a hash of the list, the same on every
 * member), so that creations over overlapping sets that run at once (clients 0 and 2 making
 * {0,2} while client 1 already waits in {0,1,2}) never share a tag on the runtime's
 * communicator, whose point-to-point tags (7101 relayout, 7103-7105 the staged and nccl
 * transports' tallies, 7201 barrier, 7301/7302 watchdog, 7401 shm transport) stay below this
 * range. The arrival messages before a creation take the
 * same hash in the range above (ARRIVE_TAG_BASE); the staged transport's tags start above
 * both, at 24576, within the 32767 every MPI allows. */
enum { GROUP_TAG_BASE = 8192, GROUP_TAG_SPAN = 8192, ARRIVE_TAG_BASE = 16384, MSG_LEN = 1024 };

static uint32_t group_hash(int n, const int *clients)
{
    uint32_t h = 2166136261u; /* FNV-1a over the client ids */
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (uint32_t)clients[i] >> (8 * b) & 0xffu;
            h *= 16777619u;
        }
    return h;
}

static int group_tag(int n, const int *clients)
{
    return GROUP_TAG_BASE + (int)(group_hash(n, clients) % GROUP_TAG_SPAN);
}

/* Before the blocking MPI_Comm_create_group: every member sends every other one an arrival
 * message (the list's hash and size) and waits for theirs under the watchdog, so that a member
 * lost before the creation is named (DT_ERR_TIMEOUT) instead of hanging the others in it.
 * Point to point on the runtime's communicator, as dt_barrier: each member waits on each other
 * member directly, so every survivor names the lost one itself (a tree would name a parent
 * that is alive but waiting). Collective over the members. */
static dt_status arrive(int n, const int *clients)
{
    int me = dt_client_id();
    uint32_t out[2] = {group_hash(n, clients), (uint32_t)n};
    uint32_t(*in)[2] = calloc((size_t)n, sizeof *in);
    MPI_Request *reqs = malloc(2 * (size_t)n * sizeof *reqs);
    int *peers = malloc(2 * (size_t)n * sizeof *peers);
    dt_status st = DT_OK;
    if (!in || !reqs || !peers) {
        st = dt__error(DT_ERR_NO_MEMORY, "the mesh's client group: no memory");
        goto out;
    }
    int tag = ARRIVE_TAG_BASE + (int)(out[0] % GROUP_TAG_SPAN), rc = MPI_SUCCESS;
    MPI_Comm comm = dt__comm();
    for (int i = 0; i < n; i++) {
        reqs[i] = reqs[n + i] = MPI_REQUEST_NULL;
        peers[i] = peers[n + i] = clients[i];
        in[i][0] = out[0];
        in[i][1] = out[1];
        if (clients[i] == me || rc != MPI_SUCCESS)
            continue;
        rc = MPI_Irecv(in[i], 2, MPI_UINT32_T, clients[i], tag, comm, &reqs[i]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(out, 2, MPI_UINT32_T, clients[i], tag, comm, &reqs[n + i]);
    }
    if (rc != MPI_SUCCESS)
        st = dt__mpi_error(rc, "creating the mesh's client group (arrival)");
    /* On a failure the posted requests are waited for (or cancelled on a timeout) here. */
    dt_status ws = dt__wait_watched(reqs, peers, 2 * n, 0,
                                    "creating the mesh's client group (arrival)");
    if (st == DT_OK)
        st = ws;
    for (int i = 0; st == DT_OK && i < n; i++)
        if (in[i][0] != out[0] || in[i][1] != out[1])  /* two sets of one tag: never expected */
            st = dt__error(DT_ERR_STATE, "creating the mesh's client group of %d clients: "
                           "client %d arrived for another group (%u clients)", n, clients[i],
                           (unsigned)in[i][1]);
out:
    free(peers);
    free(reqs);
    free(in);
    return st;
}

typedef struct cached {
    struct cached *next;
    dt__group g;
    int *clients;
} cached;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cached *groups;
static const dt__group outside = {.comm = MPI_COMM_NULL};

static dt_status create(int n, int *clients, cached **out)
{
    cached *e = calloc(1, sizeof *e);
    if (!e)
        return dt__error(DT_ERR_NO_MEMORY, "the mesh's client group: no memory");
    dt_status st = arrive(n, clients);
    if (st != DT_OK) {
        free(e);
        return st;
    }
    MPI_Group world, sub;
    int rc = MPI_Comm_group(dt__comm(), &world);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Group_incl(world, n, clients, &sub);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Comm_create_group(dt__comm(), sub, group_tag(n, clients), &e->g.comm);
            if (rc == MPI_SUCCESS) /* errors become statuses, never end the process */
                rc = MPI_Comm_set_errhandler(e->g.comm, MPI_ERRORS_RETURN);
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

/* The cached group of exactly this ordered list, created when missing (takes clients). */
static dt_status find_or_create(int n, int *clients, const dt__group **group_out)
{
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

dt_status dt__clients_group(int n, const int *clients, const dt__group **group_out)
{
    int me = dt_client_id(), mine = 0;
    for (int i = 0; i < n; i++)
        mine += clients[i] == me;
    if (n < 1 || mine != 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "a group of %d clients must list client %d once (it does %d times)", n,
                         me, mine);
    int *copy = malloc((size_t)n * sizeof *copy);
    if (!copy)
        return dt__error(DT_ERR_NO_MEMORY, "a client group of %d: no memory", n);
    memcpy(copy, clients, (size_t)n * sizeof *copy);
    return find_or_create(n, copy, group_out);
}

const dt__group *dt__group_outside(void)
{
    return &outside;
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
        if (rc == MPI_SUCCESS)
            rc = MPI_Comm_set_errhandler(d.comm, MPI_ERRORS_RETURN);
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

/* Two collectives: the lowest failing rank (MPI_MIN), then its status and message from it.
 * Blocking, not under the watchdog: a client still busy with its part (writing a large
 * checkpoint) answers no ping, and must not be reported lost (docs/runtime.md). */
dt_status dt__group_agree(const dt__group *g, dt_status st, const char *what)
{
    if (g->comm == MPI_COMM_NULL || g->size <= 1)
        return st;
    int mine = st != DT_OK ? g->rank : INT_MAX, first = INT_MAX;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, g->comm, &req);
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, what);
    dt_status wst = dt__wait_watched_group(&req, g->clients, g->size, 0, what);
    if (wst != DT_OK)
        return wst;
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
    rc = MPI_Ibcast(&out, (int)sizeof out, MPI_BYTE, first, g->comm, &req);
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, what);
    if ((wst = dt__wait_watched_group(&req, g->clients, g->size, 0, what)) != DT_OK)
        return wst;
    if (g->rank == first)
        return st;
    out.msg[sizeof out.msg - 1] = '\0';
    return dt__error((dt_status)out.status, "client %d: %s", g->clients[first], out.msg);
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
