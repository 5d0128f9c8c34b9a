/* Host topology: hwloc is read once at dt_init (I/O devices kept so GPUs are seen), the host's
 * clients are found with MPI_Comm_split_type, and each process is bound to its share of the
 * host's cores. dt_topology reports what was found. */
#include <errno.h>
#include <hwloc.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"

static hwloc_topology_t topo;
static hwloc_bitmap_t saved_binding; /* the binding before ours, restored at finalize */
static MPI_Comm host_comm = MPI_COMM_NULL;
static int loaded;
static dt_topology_info info;
/* Every client's host (dense index, in order of each host's lowest client) and host name. */
static int *client_host;
static char (*client_hostname)[64];
static int nclients_seen, nhosts;

static int count_type(hwloc_obj_type_t type)
{
    int n = hwloc_get_nbobjs_by_type(topo, type);
    return n > 0 ? n : 0;
}

/* GPUs as hwloc sees them: PCI display controllers and processing accelerators of the GPU
 * vendors (NVIDIA, AMD). BMC VGA chips and the like do not count. */
static int count_pci_gpus(void)
{
    int n = 0;
    for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, NULL); o; o = hwloc_get_next_pcidev(topo, o)) {
        unsigned cls = o->attr->pcidev.class_id >> 8, vendor = o->attr->pcidev.vendor_id;
        if ((cls == 0x03 || cls == 0x12) && (vendor == 0x10de || vendor == 0x1002))
            n++;
    }
    return n;
}

dt_status dt__topology_load(void)
{
    memset(&info, 0, sizeof info);
    if (hwloc_topology_init(&topo) != 0)
        return dt__error(DT_ERR_SYSTEM, "dt_init: hwloc_topology_init failed: %s",
                         strerror(errno));
    if (hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0 ||
        hwloc_topology_load(topo) != 0) {
        int e = errno;
        hwloc_topology_destroy(topo);
        return dt__error(DT_ERR_SYSTEM, "dt_init: hwloc_topology_load failed: %s", strerror(e));
    }
    saved_binding = hwloc_bitmap_alloc();
    if (saved_binding && hwloc_get_cpubind(topo, saved_binding, HWLOC_CPUBIND_PROCESS) != 0) {
        hwloc_bitmap_free(saved_binding);
        saved_binding = NULL;
    }
    info.pus = count_type(HWLOC_OBJ_PU);
    info.cores = count_type(HWLOC_OBJ_CORE);
    info.packages = count_type(HWLOC_OBJ_PACKAGE);
    info.numa_nodes = count_type(HWLOC_OBJ_NUMANODE);
    /* Some virtual machines report no cores or packages: every PU is then its own core. */
    if (info.cores == 0)
        info.cores = info.pus;
    if (info.packages == 0)
        info.packages = 1;
    if (info.numa_nodes == 0)
        info.numa_nodes = 1;
    info.gpus = dt__gpu_physical_count();
    if (info.gpus == 0)
        info.gpus = count_pci_gpus();
    info.host_clients = 1;
    if (gethostname(info.hostname, sizeof info.hostname) != 0)
        dt__strlcpy(info.hostname, "localhost", sizeof info.hostname);
    info.hostname[sizeof info.hostname - 1] = '\0';
    loaded = 1;
    return DT_OK;
}

/* The cores bound to: with at least as many cores as clients, a contiguous equal split (the
 * first ncores % nclients clients get one more); with fewer, core host_rank % ncores. Cores are
 * in hwloc's logical order, so a share stays within a package where it can. */
static void core_share(int ncores, int nclients, int rank, int *first, int *count)
{
    if (ncores >= nclients) {
        int base = ncores / nclients, extra = ncores % nclients;
        *first = rank * base + (rank < extra ? rank : extra);
        *count = base + (rank < extra);
    } else {
        *first = rank % ncores;
        *count = 1;
    }
}

static void bind_to_share(void)
{
    int have_cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0;
    hwloc_obj_type_t unit = have_cores ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    int n = hwloc_get_nbobjs_by_type(topo, unit), first, count;
    if (n <= 0)
        return;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set)
        return;
    core_share(n, info.host_clients, info.host_rank, &first, &count);
    for (int i = first; i < first + count; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(topo, unit, (unsigned)i);
        if (o && o->cpuset)
            hwloc_bitmap_or(set, set, o->cpuset);
    }
    /* Not fatal: a process that cannot be bound runs unbound and says so in dt_topology. */
    if (!hwloc_bitmap_iszero(set) && hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0) {
        info.bound = 1;
        hwloc_bitmap_list_snprintf(info.cpuset, sizeof info.cpuset, set);
    }
    hwloc_bitmap_free(set);
}

static dt_status map_hosts(MPI_Comm comm);

dt_status dt__topology_setup(MPI_Comm comm, int bind)
{
    int rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host_comm);
    if (rc == MPI_SUCCESS) /* errors become statuses, never end the process */
        rc = MPI_Comm_set_errhandler(host_comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, "dt_init: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    if ((rc = MPI_Comm_size(host_comm, &info.host_clients)) != MPI_SUCCESS ||
        (rc = MPI_Comm_rank(host_comm, &info.host_rank)) != MPI_SUCCESS)
        return dt__mpi_error(rc, "dt_init: MPI_Comm_size/rank (host communicator)");
    if (bind)
        bind_to_share();
    return map_hosts(comm);
}

/* Which clients share a host: every client sends its host communicator's first client (its
 * rank in comm) and its host name. Collective over comm. */
static dt_status map_hosts(MPI_Comm comm)
{
    int n = 0, me = 0, leader = 0, rc;
    MPI_Comm_size(comm, &n);
    MPI_Comm_rank(comm, &me);
    leader = me;
    if ((rc = MPI_Bcast(&leader, 1, MPI_INT, 0, host_comm)) != MPI_SUCCESS)
        return dt__mpi_error(rc, "dt_init: MPI_Bcast (host communicator)");
    int *leaders = malloc((size_t)n * sizeof *leaders);
    client_host = malloc((size_t)n * sizeof *client_host);
    client_hostname = malloc((size_t)n * sizeof *client_hostname);
    if (!leaders || !client_host || !client_hostname) {
        free(leaders);
        return dt__error(DT_ERR_NO_MEMORY, "dt_init: no memory for the host map");
    }
    rc = MPI_Allgather(&leader, 1, MPI_INT, leaders, 1, MPI_INT, comm);
    if (rc == MPI_SUCCESS)
        rc = MPI_Allgather(info.hostname, 64, MPI_CHAR, client_hostname, 64, MPI_CHAR, comm);
    if (rc != MPI_SUCCESS) {
        free(leaders);
        return dt__mpi_error(rc, "dt_init: MPI_Allgather of host names");
    }
    nhosts = 0;
    for (int c = 0; c < n; c++) {
        client_hostname[c][63] = '\0';
        client_host[c] = leaders[c] == c ? nhosts++ : client_host[leaders[c]];
    }
    nclients_seen = n;
    free(leaders);
    return DT_OK;
}

int dt__num_hosts(void)
{
    return nhosts > 0 ? nhosts : 1;
}

int dt__client_host(int client)
{
    return client >= 0 && client < nclients_seen ? client_host[client] : -1;
}

const char *dt__client_hostname(int client)
{
    return client >= 0 && client < nclients_seen ? client_hostname[client] : "?";
}

void dt__host_clients_and_cores(int *clients_out, int *cores_out)
{
    int mine = 0, me = dt__client_host(dt_client_id());
    for (int c = 0; c < dt_num_clients(); c++)
        mine += dt__client_host(c) == me;
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cores <= 0)
        cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    *clients_out = mine > 0 ? mine : 1;
    *cores_out = cores > 0 ? cores : 1;
}

MPI_Comm dt__host_comm(void)
{
    return host_comm;
}

void dt__topology_unload(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (host_comm != MPI_COMM_NULL && !finalized)
        MPI_Comm_free(&host_comm);
    host_comm = MPI_COMM_NULL;
    free(client_host);
    free(client_hostname);
    client_host = NULL;
    client_hostname = NULL;
    nclients_seen = nhosts = 0;
    if (!loaded)
        return;
    if (info.bound && saved_binding)
        hwloc_set_cpubind(topo, saved_binding, HWLOC_CPUBIND_PROCESS);
    hwloc_bitmap_free(saved_binding);
    saved_binding = NULL;
    hwloc_topology_destroy(topo);
    loaded = 0;
    memset(&info, 0, sizeof info);
}

dt_status dt_topology(dt_topology_info *info_out)
{
    if (!info_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_topology: info_out is NULL");
    if (!dt_is_initialized())
        return dt__error(DT_ERR_STATE, "dt_topology: the runtime is not initialized (dt_init)");
    *info_out = info;
    return DT_OK;
}
