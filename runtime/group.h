/* A list of clients (a mesh's: mesh/mesh_group.h) as one cached MPI communicator, and agreeing
 * on one outcome over it so that a failure on one client fails the call on all of them with its
 * message. Takes plain client ids: runtime/ knows no mesh. Not installed. */
#ifndef DTENSOR_RUNTIME_GROUP_H
#define DTENSOR_RUNTIME_GROUP_H

#include <mpi.h>

#include "dtensor/status.h"

/* A list of clients (a mesh's: those holding its devices, in client order). */
typedef struct dt__group {
    MPI_Comm comm;     /* over those clients; MPI_COMM_NULL on a client holding none */
    int rank, size;    /* this client's rank in comm (0 when outside) and the number of clients */
    const int *clients; /* group rank -> client id (size entries) */
    int owned;         /* 1: a dt__group_dup copy, freed by dt__group_free */
} dt__group;

/* The group of the clients listed, in that order (group rank i is clients[i]; a mesh's clients
 * for dt__mesh_group, a mesh dim's line of devices, ordered by coordinate, for the relayout's
 * collectives: docs/transports.md), created on the first call for that list and cached until
 * dt_finalize (equal lists share it). *group_out is borrowed. For collectives made from the
 * calling thread; work on another thread uses a duplicate. Collective over the listed clients
 * the first time (the caller must be one of them and list it once), local after. The first
 * time, the members first meet under the watchdog: a member lost before then gives
 * DT_ERR_TIMEOUT naming it within DT_COMM_TIMEOUT (and its half for the ping) instead of a
 * hang. DT_ERR_INVALID_ARGUMENT, DT_ERR_NO_MEMORY, DT_ERR_COMM, DT_ERR_TIMEOUT. */
dt_status dt__clients_group(int n, const int *clients, const dt__group **group_out);

/* The group of a client outside a list (comm == MPI_COMM_NULL, size 0); borrowed, static. */
const dt__group *dt__group_outside(void);

/* A duplicate of g with a communicator of its own (MPI_Comm_dup), for collectives on a
 * background thread while the caller's thread goes on using g. Collective over g's members
 * (a copy without communicator elsewhere). Freed with dt__group_free. DT_ERR_NO_MEMORY,
 * DT_ERR_COMM. */
dt_status dt__group_dup(const dt__group *g, dt__group *out);
/* Frees a dt__group_dup copy (and zeroes it); a zeroed or cached group is left alone. */
void dt__group_free(dt__group *g);

/* One outcome for every member: DT_OK when every member's st is DT_OK, else the status and
 * message of the lowest failing group rank: that client keeps its own dt_last_error, the
 * others get "client C: <its message>". `what` starts the message of an MPI failure.
 * Collective over g, blocking (st unchanged on a client outside it or in a group of one). */
dt_status dt__group_agree(const dt__group *g, dt_status st, const char *what);

/* Frees every cached group (dt_finalize, before MPI goes). */
void dt__groups_free(void);

#endif
