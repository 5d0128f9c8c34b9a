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

/* Hosts (topology.c, from dt_init): how many, a client's host as a dense index (hosts
 * numbered in the order of their lowest client; -1 for a bad client or before dt_init) and its
 * host name ("?" then). Local. */
int dt__num_hosts(void);
int dt__client_host(int client);
const char *dt__client_hostname(int client);
/* This host's clients (this one included; 1 before dt_init) and the cores this process may
 * run on (its affinity mask, else the online count), for sizing threads and waits. */
void dt__host_clients_and_cores(int *clients_out, int *cores_out);

/* The watchdog (watchdog.c, docs/multihost.md). DT_COMM_TIMEOUT: seconds (> 0) a wait on
 * other clients may go without any of its requests completing, default 300; *bad_out (may be
 * NULL) gets the text of a bad value, the default then returned. Local. */
double dt__comm_timeout(const char **bad_out);

/* Waits for reqs[0..n) (MPI_REQUEST_NULL entries allowed) like MPI_Waitall, answering other
 * clients' pings meanwhile. After `timeout` seconds (<= 0: dt__comm_timeout()) in which none
 * completed, pings the clients still waited for (peers[i]: the other client of reqs[i]) and
 * gives them timeout/2 to answer; if some did not, DT_ERR_TIMEOUT whose message starts with
 * `what` and names them (lost) and their hosts, and those that answered. If all answered
 * (they wait on someone else, who will report), waits on; after 3 such stalls, DT_ERR_TIMEOUT
 * naming the clients that answered but never sent. The pending receives are cancelled and the sends dropped then (MPI may still read
 * their buffers: after this error the job can only be aborted). DT_ERR_COMM if MPI reports an
 * error. Local (other clients answer pings only while in a watched wait of their own). */
dt_status dt__wait_watched(MPI_Request *reqs, const int *peers, int n, double timeout,
                           const char *what);
/* dt__wait_watched that also stores the status of each request completed (statuses[i] for
 * reqs[i]; n entries) so that the caller can check who sent how much, and which failed after
 * a DT_ERR_COMM (MPI_ERR_IN_STATUS). Local. */
dt_status dt__wait_watched_status(MPI_Request *reqs, const int *peers, int n, double timeout,
                                  const char *what, MPI_Status *statuses);
/* dt__wait_watched for one nonblocking collective `req` among the clients group[0..ngroup)
 * (this one included, as client ids of dt__comm): a stall pings all the others. On a
 * DT_ERR_TIMEOUT the request stays pending (a collective cannot be cancelled): the job can
 * then only end. Local. */
dt_status dt__wait_watched_group(MPI_Request *req, const int *group, int ngroup,
                                 double timeout, const char *what);

/* Answers the pings that have arrived: a client busy for long outside any watched wait (a
 * checkpoint's writes) calls it now and then so that the others' watchdogs see it alive, and
 * waits of their own (a pipelined transport's) call it while they spin, then
 * dt__wait_watched once stalled. Local; from a thread other than the main one only under
 * MPI_THREAD_MULTIPLE. */
void dt__watchdog_answer(void);
/* For waits on other clients without MPI requests (the shm transport's flags): the wait saw
 * nothing for `timeout` seconds from the k clients who[0..k). state (may be NULL) says what
 * the caller knows of each: -1 its process has ended (named lost at once, nobody pinged),
 * 1 its process on this host still runs (alive even if it does not answer: busy outside a
 * watched wait), 0 nothing. Else all are pinged and given timeout/2 to answer. DT_OK to wait
 * on when all are alive (they wait on someone else, who will report), at most 3 times per
 * wait (*rounds counts, start it at 0); else DT_ERR_TIMEOUT whose message starts with `what`
 * and names the lost clients and their hosts, as dt__wait_watched's. When some client of this
 * host runs but does not answer (blocked outside a watched wait, e.g. in a collective across
 * a cut link), the clients of the other hosts are pinged too, and those that do not answer
 * are named lost. */
dt_status dt__watchdog_stalled(const int *who, const int *state, int k, double timeout,
                               int *rounds, const char *what);
/* Seconds of a monotonic clock (the watchdog's), for waits of their own. Local. */
double dt__now_seconds(void);

/* topology.c, called by dt_init/dt_finalize: read hwloc (local), then split the host
 * communicator and bind (collective over comm); unload restores the binding and frees all. */
dt_status dt__topology_load(void);
dt_status dt__topology_setup(MPI_Comm comm, int bind);
void dt__topology_unload(void);

/* memory.c: (re)reads DT_POOL_MAX_MB; DT_ERR_INVALID_ARGUMENT naming a bad value. */
dt_status dt__pool_configure(void);
/* memory.c: counts a block of `size` bytes (`requested` asked for) handed out (live 1) or
 * given back (live 0) by another host allocator (the shm pool, runtime/shm_pool.c) in
 * dt_host_pool_stats, so that tensors' memory is counted wherever it lies. */
void dt__pool_count(size_t size, size_t requested, int live);

/* Registers fn to run in dt_finalize before MPI is finalised (e.g. to drop cached plans
 * holding MPI datatypes). At most 16 functions. */
dt_status dt__at_finalize(void (*fn)(void));

#endif
