/* Placeholder until the simulated accelerator lands. */
#include "runtime/device.h"

const dt__device_kind *dt__device_kind_sim(void)
{
    return NULL;
}
