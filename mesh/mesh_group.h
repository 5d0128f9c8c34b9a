/* The communication group of a mesh's clients (mesh_group.c), for the modules above the mesh
 * (ckpt/, data/, optim/) that agree on one outcome over a mesh. Internal, not installed. */
#ifndef DTENSOR_MESH_GROUP_H
#define DTENSOR_MESH_GROUP_H

#include "dtensor/mesh.h"
#include "runtime/group.h"

/* The group of the clients holding devices of the mesh, in client order: runtime/group.h's
 * dt__clients_group over that list, created on the first call and cached until dt_finalize
 * (meshes over the same clients share it). *group_out is borrowed. For collectives made from
 * the calling thread; work on another thread uses a duplicate (dt__group_dup). Collective
 * over the mesh's clients the first time, local after; a client holding no device of the mesh
 * gets a group with comm == MPI_COMM_NULL without communicating. The first time, the members
 * first meet under the watchdog: a member lost before then gives DT_ERR_TIMEOUT naming it
 * within DT_COMM_TIMEOUT (and its half for the ping) instead of a hang.
 * DT_ERR_NO_MEMORY, DT_ERR_COMM, DT_ERR_TIMEOUT. */
dt_status dt__mesh_group(const dt_mesh *mesh, const dt__group **group_out);

/* One outcome over the mesh's clients: every client returns the lowest failing client's status
 * and message ("client C: ..." on the others; runtime/group.h's dt__group_agree), st when none
 * failed, recorded in the flight recorder as `call`. Collective over the mesh's clients; st as
 * it is, without communicating, on a client outside the mesh or on a mesh of one client. */
dt_status dt__mesh_agree(const dt_mesh *mesh, dt_status st, const char *call);

#endif
