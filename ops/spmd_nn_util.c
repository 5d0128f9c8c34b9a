/* Small helpers shared by the transformer ops' SPMD files. */
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/device.h"

dt_status dt__set_device_of(const dt__ops_backend *be, const dt_tensor *t, int i)
{
    return be->set_device ? be->set_device(dt_tensor_local(t, i)->device.device_id) : DT_OK;
}

void dt__lspec_gathered(const dt_tensor *t, int dim, dt__lspec *out)
{
    dt__lspec_of(dt_tensor_layout(t), out);
    memset(out->partial, 0, sizeof out->partial);
    if (dim >= 0 && dim < out->rank)
        out->spec[dim] = -1;
}
