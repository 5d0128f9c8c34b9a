/* Several of the runtime's internal headers at once, for the files not yet switched to the
 * headers they use (layout/, optim/, runtime/transport_mpi.c); every other file includes the
 * headers of its concerns alone (runtime/error.h, comm.h, util.h, half.h, transport.h,
 * device.h, group.h; docs/runtime.md says which holds what). Not installed. */
#ifndef DTENSOR_RUNTIME_INTERNAL_H
#define DTENSOR_RUNTIME_INTERNAL_H

#include "dtensor/dtensor.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/half.h"
#include "runtime/transport.h"
#include "runtime/util.h"

#endif
