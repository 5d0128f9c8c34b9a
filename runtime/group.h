/* The clients of a mesh as one cached MPI communicator, and agreeing on one outcome over it so
 * that a failure on one client fails the call on all of them with its message. Not installed. */
#ifndef DTENSOR_RUNTIME_GROUP_H
#define DTENSOR_RUNTIME_GROUP_H

#include <mpi.h>

#include "dtensor/mesh.h"

/* The clients holding devices of a mesh, in client order. */
typedef struct dt__group {
    MPI_Comm comm;     /* over those clients; MPI_COMM_NULL on a client holding none */
    int rank, size;    /* this client's rank in comm (0 when outside) and the number of clients */
    const int *clients; /* group rank -> client id (size entries) */
    int owned;         /* 1: a dt__group_dup copy, freed by dt__group_free */
} dt__group;

/* The group of the mesh's clients, created on the first call for that set of clients and
 * cached until dt_finalize (meshes over the same clients share it). *group_out is borrowed.
 * For collectives made from the calling thread; work on another thread uses a duplicate.
 * Collective over the mesh's clients the first time, local after; a client holding no device
 * of the mesh gets a group with comm == MPI_COMM_NULL without communicating. The first time,
 * the members first meet under the watchdog: a member lost before then gives DT_ERR_TIMEOUT
 * naming it within DT_COMM_TIMEOUT (and its half for the ping) instead of a hang.
 * DT_ERR_NO_MEMORY, DT_ERR_COMM, DT_ERR_TIMEOUT. */
dt_status dt__mesh_group(const dt_mesh *mesh, const dt__group **group_out);

/* The group of the clients listed, in that order (group rank i is clients[i]; a mesh dim's
 * line of devices, ordered by coordinate, for the relayout's collectives: docs/transports.md).
 * Cached like dt__mesh_group and shared with it when the lists are equal. Collective over
 * the listed clients the first time (the caller must be one of them and list it once),
 * local after. DT_ERR_INVALID_ARGUMENT, DT_ERR_NO_MEMORY, DT_ERR_COMM. */
dt_status dt__clients_group(int n, const int *clients, const dt__group **group_out);

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
