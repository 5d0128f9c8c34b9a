/* Several of the runtime's internal headers at once, for the two files not yet switched to
 * the headers they use (runtime/transport.c, runtime/transport_nccl.c); every other file
 * includes the headers of its concerns alone (runtime/error.h, comm.h, util.h, half.h,
 * transport.h, device.h, group.h; docs/runtime.md says which holds what). Delete it once
 * those two include what they use. Not installed. */
#ifndef DTENSOR_RUNTIME_INTERNAL_H
#define DTENSOR_RUNTIME_INTERNAL_H

#include "dtensor/dtensor.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/half.h"
#include "runtime/transport.h"
#include "runtime/util.h"

#endif
