/* Agreeing on one outcome over the mesh's group (runtime/group.h) under the watchdog, so that
 * a failure on one client fails the call on all of them and a client lost meanwhile is named
 * within DT_COMM_TIMEOUT instead of hanging the others (docs/multihost.md). A client still
 * writing its files answers the watchdog's pings (write.c), so it is not taken for lost. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/util.h"

enum { MSG_LEN = 1024 };

/* The buffers of an agreement: on the heap, and left there when a wait times out (the
 * collective stays pending and MPI may still write into them). */
typedef struct agreement {
    int mine, first;
    struct {
        int status;
        char msg[MSG_LEN];
    } out;
} agreement;

dt_status dt__ckpt_agree(const dt__group *g, dt_status st)
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

dt_status dt__ckpt_wait(const dt__group *g, MPI_Request *req, int rc, const char *what)
{
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, what);
    return dt__wait_watched_group(req, g->clients, g->size, 0, what);
}
