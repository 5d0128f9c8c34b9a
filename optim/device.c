/* The optimizer's local devices: selecting one for its kernels and waiting for all of them.
 * Nothing here asks which kind a device is: the CPU's table is the dt_kernel_* functions. */
#include "optim/optim_impl.h"
#include "runtime/error.h"

dt_status dt__zero_select(const dt_zero *z, int i, const dt__ops_backend **be_out)
{
    const dt__device *dev = z->devs[i];
    const dt__ops_backend *be = dev->kind->ops();
    if (!be)
        return dt__error(DT_ERR_UNSUPPORTED, "dt_zero: %s device %d has no kernels in this "
                         "build", dev->kind->name, dev->global_id);
    if (be->set_device) {
        dt_status st = be->set_device(dev->ordinal);
        if (st != DT_OK)
            return st;
    }
    *be_out = be;
    return DT_OK;
}

dt_status dt__zero_sync(const dt_zero *z)
{
    dt_status st = DT_OK;
    for (int i = 0; i < z->nlocal; i++) {
        const dt__device *d = z->devs[i];
        int seen = 0; /* devices sharing one physical device share its stream */
        for (int j = 0; j < i && !seen; j++)
            seen = z->devs[j]->kind == d->kind && z->devs[j]->ordinal == d->ordinal;
        dt_status s = seen ? DT_OK : d->kind->sync(d);
        if (st == DT_OK)
            st = s;
    }
    return st;
}
