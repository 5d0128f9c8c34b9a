/* The runtime's communicators and start/stop hooks (runtime/init.c, topology.c, memory.c). Not installed. */
#ifndef DTENSOR_RUNTIME_COMM_H
#define DTENSOR_RUNTIME_COMM_H

#include <mpi.h>

#include "dtensor/runtime.h"

/* The runtime's communicator (a duplicate of MPI_COMM_WORLD), MPI_COMM_NULL before dt_init. */
MPI_Comm dt__comm(void);

/* The device of type `to` with the same client and local index as device `id` of type
 * `from` (a GPU device's CPU device beside it), -1 when there is none. */
int dt__device_id_map(dt_device_type from, int id, dt_device_type to);

/* Number of local devices of each client (array of dt_num_clients entries), or NULL. */
const int *dt__client_device_counts(dt_device_type type);

/* MPI thread level provided (MPI_THREAD_*), MPI_THREAD_SINGLE before dt_init. */
int dt__mpi_thread_level(void);

/* Communicator of this job's clients on this host (MPI_COMM_TYPE_SHARED split of dt__comm),
 * MPI_COMM_NULL before dt_init. */
MPI_Comm dt__host_comm(void);

/* topology.c, called by dt_init/dt_finalize: read hwloc (local), then split the host
 * communicator and bind (collective over comm); unload restores the binding and frees all. */
dt_status dt__topology_load(void);
dt_status dt__topology_setup(MPI_Comm comm, int bind);
void dt__topology_unload(void);

/* memory.c: (re)reads DT_POOL_MAX_MB; DT_ERR_INVALID_ARGUMENT naming a bad value. */
dt_status dt__pool_configure(void);

/* Registers fn to run in dt_finalize before MPI is finalised (e.g. to drop cached plans
 * holding MPI datatypes). At most 16 functions. */
dt_status dt__at_finalize(void (*fn)(void));

#endif
