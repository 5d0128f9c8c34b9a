/* Runtime start and stop: options, MPI (launcher or singleton), the runtime's communicator,
 * clients and their local devices with dense global ids (client-major), topology and GPUs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dtensor/version.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/transport.h"
#include "runtime/util.h"

#define MAX_CPU_DEVICES 4096
#define MAX_GPU_DEVICES 4096
#define N_TYPES 2

static struct {
    int initialized;
    int mpi_owned; /* dt_init started MPI: dt_finalize finalises it (kept across failed inits) */
    int thread_level;
    MPI_Comm comm;
    int nclients, client;
    int *counts[N_TYPES];  /* local devices of each client */
    int *offsets[N_TYPES]; /* first global id of each client; offsets[t][nclients] = total */
} rt;

/* A decimal integer in lo..hi and nothing else; 0 on success. */
static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end = NULL;
    if (s[0] < '0' || s[0] > '9')
        return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || errno != 0 || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Everything that can be wrong with the options, checked before MPI starts. */
static dt_status resolve_opts(const dt_init_opts *opts, int *cpu_out, int *bind_out,
                              int *gpus_out, int *gpu_devices_out)
{
    dt_init_opts o = DT_INIT_OPTS_INIT;
    long v;
    if (opts)
        o = *opts;
    if (o.cpu_devices < 0 || o.cpu_devices > MAX_CPU_DEVICES)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_init: cpu_devices=%d is not in 1..%d (0 reads DT_CPU_DEVICES)",
                         o.cpu_devices, MAX_CPU_DEVICES);
    if (o.bind_cores != 0 && o.bind_cores != 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_init: bind_cores=%d is neither 0 nor 1",
                         o.bind_cores);
    if (o.use_gpus != 0 && o.use_gpus != 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_init: use_gpus=%d is neither 0 nor 1",
                         o.use_gpus);
    int cpu = o.cpu_devices;
    if (cpu == 0) {
        const char *env = getenv("DT_CPU_DEVICES");
        cpu = 1;
        if (env) {
            if (parse_int(env, 1, MAX_CPU_DEVICES, &v) != 0)
                return dt__error(DT_ERR_INVALID_ARGUMENT,
                                 "DT_CPU_DEVICES='%s' is not an integer in 1..%d", env,
                                 MAX_CPU_DEVICES);
            cpu = (int)v;
        }
    }
    int bind = o.bind_cores;
    const char *env_bind = getenv("DT_BIND");
    if (env_bind) {
        if (parse_int(env_bind, 0, 1, &v) != 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "DT_BIND='%s' is neither 0 nor 1",
                             env_bind);
        if (v == 0)
            bind = 0;
    }
    if (o.gpu_devices < 0 || o.gpu_devices > MAX_GPU_DEVICES)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_init: gpu_devices=%d is not in 1..%d (0 reads DT_GPU_DEVICES)",
                         o.gpu_devices, MAX_GPU_DEVICES);
    const char *mode = getenv("DT_GPU");
    if (mode && strcasecmp(mode, "auto") != 0 && strcasecmp(mode, "cuda") != 0 &&
        strcasecmp(mode, "sim") != 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "DT_GPU='%s' is not auto, cuda or sim", mode);
    int gpu_devices = o.gpu_devices;
    const char *env_gpus = getenv("DT_GPU_DEVICES");
    if (gpu_devices == 0 && env_gpus) {
        if (parse_int(env_gpus, 1, MAX_GPU_DEVICES, &v) != 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "DT_GPU_DEVICES='%s' is not an integer in 1..%d", env_gpus,
                             MAX_GPU_DEVICES);
        gpu_devices = (int)v;
    }
    *cpu_out = cpu;
    *bind_out = bind;
    *gpus_out = o.use_gpus;
    *gpu_devices_out = gpu_devices;
    return DT_OK;
}

/* Starts MPI unless the program did; rejects a process whose MPI was already finalised. */
static dt_status start_mpi(int *argc, char ***argv)
{
    int flag = 0, rc;
    MPI_Finalized(&flag);
    if (flag)
        return dt__error(DT_ERR_STATE,
                         "dt_init: MPI was already finalized in this process and cannot be "
                         "started again");
    MPI_Initialized(&flag);
    if (flag) {
        MPI_Query_thread(&rt.thread_level);
        return DT_OK;
    }
    rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &rt.thread_level);
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, "dt_init: MPI_Init_thread");
    rt.mpi_owned = 1;
    return DT_OK;
}

/* Duplicates MPI_COMM_WORLD into rt.comm with errors returned, not fatal. WORLD's own handler
 * is the program's: it is switched to "return" only around the duplication. */
static dt_status dup_world(void)
{
    MPI_Errhandler old;
    int rc = MPI_Comm_get_errhandler(MPI_COMM_WORLD, &old);
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, "dt_init: MPI_Comm_get_errhandler(MPI_COMM_WORLD)");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &rt.comm);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, old);
    MPI_Errhandler_free(&old);
    if (rc != MPI_SUCCESS) {
        rt.comm = MPI_COMM_NULL;
        return dt__mpi_error(rc, "dt_init: MPI_Comm_dup(MPI_COMM_WORLD)");
    }
    rc = MPI_Comm_set_errhandler(rt.comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS)
        return dt__mpi_error(rc, "dt_init: MPI_Comm_set_errhandler");
    return DT_OK;
}

static void free_tables(void)
{
    for (int t = 0; t < N_TYPES; t++) {
        free(rt.counts[t]);
        free(rt.offsets[t]);
        rt.counts[t] = rt.offsets[t] = NULL;
    }
}

/* Gathers every client's local device counts and lays out the global ids. */
static dt_status build_tables(int ncpu, int ngpu)
{
    int mine[N_TYPES] = {ncpu, ngpu};
    int n = rt.nclients, rc;
    int *all = malloc(sizeof *all * N_TYPES * (size_t)n);
    if (!all)
        return dt__error(DT_ERR_NO_MEMORY, "dt_init: no memory for %d clients' devices", n);
    rc = MPI_Allgather(mine, N_TYPES, MPI_INT, all, N_TYPES, MPI_INT, rt.comm);
    if (rc != MPI_SUCCESS) {
        free(all);
        return dt__mpi_error(rc, "dt_init: MPI_Allgather of device counts");
    }
    for (int t = 0; t < N_TYPES; t++) {
        rt.counts[t] = malloc(sizeof(int) * (size_t)n);
        rt.offsets[t] = malloc(sizeof(int) * ((size_t)n + 1));
        if (!rt.counts[t] || !rt.offsets[t]) {
            free(all);
            return dt__error(DT_ERR_NO_MEMORY, "dt_init: no memory for %d clients' devices", n);
        }
        long long total = 0;
        for (int c = 0; c < n; c++) {
            rt.counts[t][c] = all[N_TYPES * c + t];
            rt.offsets[t][c] = (int)total;
            total += rt.counts[t][c];
        }
        if (total > INT32_MAX) {
            free(all);
            return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_init: %lld %s devices in all (more "
                             "than INT32_MAX)", total, dt_device_type_name((dt_device_type)t));
        }
        rt.offsets[t][n] = (int)total;
    }
    free(all);
    return DT_OK;
}

/* Makes a failure on any client a failure on all, so no client waits in a collective that
 * another has skipped. */
static dt_status agree(dt_status st)
{
    int ok = st == DT_OK, all_ok = 0;
    int rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, rt.comm);
    if (rc != MPI_SUCCESS)
        return st != DT_OK ? st : dt__mpi_error(rc, "dt_init: MPI_Allreduce");
    if (st == DT_OK && !all_ok)
        return dt__error(DT_ERR_COMM, "dt_init: another client failed to start its runtime");
    return st;
}

dt_status dt_init(int *argc, char ***argv, const dt_init_opts *opts)
{
    int ncpu = 1, bind = 0, use_gpus = 0, want_gpus = 0, ngpu = 0, rc;
    if (rt.initialized)
        return dt__error(DT_ERR_STATE,
                         "dt_init: the runtime is already initialized (dt_finalize first)");
    dt_status st = resolve_opts(opts, &ncpu, &bind, &use_gpus, &want_gpus);
    if (st == DT_OK)
        st = dt__pool_configure();
    if (st == DT_OK)
        st = dt__device_pool_configure();
    if (st == DT_OK)
        st = dt__transport_configure();
    if (st == DT_OK)
        st = dt__copy_configure();
    if (st == DT_OK)
        st = start_mpi(argc, argv);
    if (st != DT_OK)
        return st;

    rt.comm = MPI_COMM_NULL;
    st = dup_world();
    if (st != DT_OK)
        goto err_comm;
    if ((rc = MPI_Comm_size(rt.comm, &rt.nclients)) != MPI_SUCCESS ||
        (rc = MPI_Comm_rank(rt.comm, &rt.client)) != MPI_SUCCESS) {
        st = dt__mpi_error(rc, "dt_init: MPI_Comm_size/rank");
        goto err_comm;
    }
    st = agree(dt__topology_load());
    if (st != DT_OK)
        goto err_topology;
    st = agree(dt__topology_setup(rt.comm, bind));
    if (st != DT_OK)
        goto err_topology;
    st = agree(dt__gpu_select(dt__host_comm(), use_gpus, getenv("DT_GPU"), want_gpus, &ngpu));
    if (st != DT_OK)
        goto err_gpus;
    /* Every GPU device has a CPU device beside it, so the host mesh of any GPU mesh exists
     * (TensorFlow DTensor configures as many logical CPUs as accelerators). */
    if (ncpu < ngpu)
        ncpu = ngpu;
    st = agree(build_tables(ncpu, ngpu));
    if (st != DT_OK)
        goto err_tables;
    st = agree(dt__devices_open(ncpu, rt.offsets[DT_DEVICE_CPU][rt.client],
                                rt.offsets[DT_DEVICE_GPU][rt.client]));
    if (st != DT_OK)
        goto err_tables;
    /* The transports' start is collective over dt__comm and asks for client ids: the
     * runtime counts as up from here (NCCL's communicator, the shm pool). */
    rt.initialized = 1;
    st = agree(dt__transport_start());
    if (st != DT_OK) {
        rt.initialized = 0;
        goto err_tables;
    }
    return DT_OK;

err_tables:
    dt__transport_stop();
    free_tables();
err_gpus:
    dt__devices_close();
err_topology:
    dt__topology_unload();
err_comm:
    if (rt.comm != MPI_COMM_NULL)
        MPI_Comm_free(&rt.comm);
    rt.comm = MPI_COMM_NULL;
    rt.nclients = rt.client = 0;
    return st;
}

/* Functions other modules registered to run at finalize, before MPI goes (cached plans
 * holding MPI datatypes). They stay registered across dt_init/dt_finalize cycles. */
enum { MAX_FINALIZERS = 16 };
static void (*finalizers[MAX_FINALIZERS])(void);
static int nfinalizers;

dt_status dt__at_finalize(void (*fn)(void))
{
    for (int i = 0; i < nfinalizers; i++)
        if (finalizers[i] == fn)
            return DT_OK;
    if (nfinalizers == MAX_FINALIZERS)
        return dt__error(DT_ERR_NO_MEMORY, "too many finalize hooks (%d)", MAX_FINALIZERS);
    finalizers[nfinalizers++] = fn;
    return DT_OK;
}

void dt_finalize(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!rt.initialized) {
        /* A dt_init that started MPI and then failed leaves MPI to us. */
        if (rt.mpi_owned && !finalized)
            MPI_Finalize();
        rt.mpi_owned = 0;
        return;
    }
    dt__device_sync_all(-1);
    for (int i = nfinalizers - 1; i >= 0; i--)
        finalizers[i]();
    dt__transport_stop();
    dt__groups_free();
    free_tables();
    dt__devices_close();
    dt__topology_unload();
    if (!finalized)
        MPI_Comm_free(&rt.comm);
    rt.comm = MPI_COMM_NULL;
    rt.nclients = rt.client = 0;
    rt.initialized = 0;
    dt_host_pool_trim();
    if (rt.mpi_owned && !finalized)
        MPI_Finalize();
    rt.mpi_owned = 0;
}

int dt_is_initialized(void)
{
    return rt.initialized;
}

int dt_num_clients(void)
{
    return rt.initialized ? rt.nclients : 1;
}

int dt_client_id(void)
{
    return rt.initialized ? rt.client : 0;
}

static int type_ok(dt_device_type type)
{
    return rt.initialized && (type == DT_DEVICE_CPU || type == DT_DEVICE_GPU);
}

int dt_num_local_devices(dt_device_type type)
{
    return type_ok(type) ? rt.counts[type][rt.client] : 0;
}

int dt_num_global_devices(dt_device_type type)
{
    return type_ok(type) ? rt.offsets[type][rt.nclients] : 0;
}

int dt_local_device_id(dt_device_type type, int local_index)
{
    if (!type_ok(type) || local_index < 0 || local_index >= rt.counts[type][rt.client])
        return -1;
    return rt.offsets[type][rt.client] + local_index;
}

int dt_device_client(dt_device_type type, int device_id)
{
    if (!type_ok(type) || device_id < 0 || device_id >= rt.offsets[type][rt.nclients])
        return -1;
    /* The last client whose first id is <= device_id; clients without devices are skipped
     * because the next client starts at the same id. */
    const int *off = rt.offsets[type];
    int lo = 0, hi = rt.nclients - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (off[mid] <= device_id)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

MPI_Comm dt__comm(void)
{
    return rt.initialized ? rt.comm : MPI_COMM_NULL;
}

const int *dt__client_device_counts(dt_device_type type)
{
    return type_ok(type) ? rt.counts[type] : NULL;
}

int dt__device_id_map(dt_device_type from, int id, dt_device_type to)
{
    int c = dt_device_client(from, id);
    if (c < 0 || !type_ok(to))
        return -1;
    int j = id - rt.offsets[from][c];
    return j < rt.counts[to][c] ? rt.offsets[to][c] + j : -1;
}

int dt__mpi_thread_level(void)
{
    return rt.initialized ? rt.thread_level : MPI_THREAD_SINGLE;
}
