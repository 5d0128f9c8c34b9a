/* The device registry: which kind runs this client's GPU devices (DT_GPU), their logical
 * split over the physical GPUs (DT_GPU_DEVICES), and the table of local devices. The only
 * file that knows which device kinds this build has. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dtensor/version.h"
#include "runtime/device.h"
#include "runtime/error.h"

#if DT_HAVE_CUDA
#include "runtime/cuda.h"
#endif

static struct {
    const dt__device_kind *gpu_kind;
    int gpu_count;    /* logical GPU devices of this client */
    int nordinals;    /* physical GPUs they spread over */
    int *ordinal;     /* gpu_count entries */
    dt__device *devs[2];
    int ndevs[2];
} reg;

static void forget_selection(void)
{
    free(reg.ordinal);
    reg.ordinal = NULL;
    reg.gpu_kind = NULL;
    reg.gpu_count = reg.nordinals = 0;
}

/* Logical device j of n over `phys` physical GPUs starting at ordinal `first`: contiguous
 * blocks, so neighbouring mesh devices share a GPU. */
static dt_status spread(int n, int first, int phys)
{
    reg.ordinal = malloc(sizeof *reg.ordinal * (size_t)(n ? n : 1));
    if (!reg.ordinal)
        return dt__error(DT_ERR_NO_MEMORY, "dt_init: no memory for %d GPU devices", n);
    for (int j = 0; j < n; j++)
        reg.ordinal[j] = first + (int)((long long)j * phys / n);
    reg.gpu_count = n;
    reg.nordinals = phys;
    return DT_OK;
}

dt_status dt__gpu_select(MPI_Comm host_comm, int use_gpus, const char *mode, int want,
                         int *count_out)
{
    forget_selection();
    if (!mode || !*mode)
        mode = "auto";
    /* dt_init checked that mode is auto, cuda or sim. */
    int sim = strcasecmp(mode, "sim") == 0, cuda = strcasecmp(mode, "cuda") == 0;
    int first = 0, phys = 0;
    dt_status st = DT_OK;
#if DT_HAVE_CUDA
    /* Every client of the host takes part in the split, whatever it uses, so all stay in
     * step; a client using the simulator asks for no GPU. */
    st = dt__cuda_assign(host_comm, use_gpus && !sim, &first, &phys);
    if (st != DT_OK)
        return st;
#endif
    *count_out = 0;
    if (!use_gpus)
        return DT_OK;
    if (sim) {
        reg.gpu_kind = dt__device_kind_sim();
        if (!reg.gpu_kind)
            return dt__error(DT_ERR_UNSUPPORTED, "DT_GPU=sim: this build has no simulator");
        st = spread(want > 0 ? want : 1, 0, 1);
    } else if (phys > 0) {
#if DT_HAVE_CUDA
        reg.gpu_kind = dt__device_kind_cuda();
        st = spread(want > 0 ? want : phys, first, phys);
#endif
    } else if (cuda) {
#if DT_HAVE_CUDA
        return dt__error(DT_ERR_UNSUPPORTED, "DT_GPU=cuda but no CUDA GPU is usable here (%s); "
                         "DT_GPU=sim runs GPU meshes on the simulated accelerator",
                         dt__cuda_absence());
#else
        return dt__error(DT_ERR_UNSUPPORTED, "DT_GPU=cuda but libdtensor was built without CUDA "
                         "(configure with -Dcuda=enabled and the CUDA toolkit); DT_GPU=sim runs "
                         "GPU meshes on the simulated accelerator");
#endif
    }
    if (st != DT_OK) {
        forget_selection();
        return st;
    }
    *count_out = reg.gpu_count;
    return DT_OK;
}

const char *dt__gpu_absence(void)
{
#if DT_HAVE_CUDA
    return dt__cuda_absence();
#else
    return "libdtensor was built without CUDA";
#endif
}

int dt__gpu_physical_count(void)
{
#if DT_HAVE_CUDA
    return dt__cuda_device_count();
#else
    return 0;
#endif
}

const dt__device_kind *dt__gpu_kind(void)
{
    return reg.gpu_kind;
}

static void close_type(int t)
{
    free(reg.devs[t]);
    reg.devs[t] = NULL;
    reg.ndevs[t] = 0;
}

dt_status dt__devices_open(int ncpu, int cpu_first_id, int gpu_first_id)
{
    const dt__device_kind *kinds[2] = {dt__device_kind_cpu(), reg.gpu_kind};
    int counts[2] = {ncpu, reg.gpu_kind ? reg.gpu_count : 0};
    int firsts[2] = {cpu_first_id, gpu_first_id};
    for (int t = 0; t < 2; t++) {
        if (counts[t] == 0)
            continue;
        reg.devs[t] = calloc((size_t)counts[t], sizeof *reg.devs[t]);
        if (!reg.devs[t]) {
            dt__devices_close();
            return dt__error(DT_ERR_NO_MEMORY, "dt_init: no memory for %d devices", counts[t]);
        }
        for (int j = 0; j < counts[t]; j++) {
            dt__device *d = &reg.devs[t][j];
            d->kind = kinds[t];
            d->type = (dt_device_type)t;
            d->local_index = j;
            d->global_id = firsts[t] + j;
            d->ordinal = t == DT_DEVICE_GPU ? reg.ordinal[j] : 0;
        }
        reg.ndevs[t] = counts[t];
        if (kinds[t]->start) {
            dt_status st = kinds[t]->start(counts[t], t == DT_DEVICE_GPU ? reg.nordinals : 1);
            if (st != DT_OK) {
                close_type(t);
                dt__devices_close();
                return st;
            }
        }
    }
    return DT_OK;
}

void dt__devices_close(void)
{
    dt__device_pool_trim();
    for (int t = 1; t >= 0; t--) {
        if (reg.ndevs[t] && reg.devs[t][0].kind->stop)
            reg.devs[t][0].kind->stop();
        close_type(t);
    }
    forget_selection();
}

const dt__device *dt__device_local(dt_device_type type, int local_index)
{
    if ((int)type < 0 || type > DT_DEVICE_GPU || local_index < 0 ||
        local_index >= reg.ndevs[type])
        return NULL;
    return &reg.devs[type][local_index];
}

const dt__device *dt__device_by_id(dt_device_type type, int global_id)
{
    if ((int)type < 0 || type > DT_DEVICE_GPU || reg.ndevs[type] == 0)
        return NULL;
    return dt__device_local(type, global_id - reg.devs[type][0].global_id);
}

dt_status dt__device_sync_all(int type)
{
    for (int t = 0; t < 2; t++) {
        if (type >= 0 && t != type)
            continue;
        /* Devices on one ordinal share a stream: sync each ordinal once. */
        for (int j = 0; j < reg.ndevs[t]; j++) {
            const dt__device *d = &reg.devs[t][j];
            int seen = 0;
            for (int k = 0; k < j && !seen; k++)
                seen = reg.devs[t][k].ordinal == d->ordinal;
            if (seen)
                continue;
            dt_status st = d->kind->sync(d);
            if (st != DT_OK)
                return st;
        }
    }
    return DT_OK;
}

const char *dt_device_kind_name(dt_device_type type)
{
    const dt__device *d = dt__device_local(type, 0);
    return d ? d->kind->name : "none";
}
