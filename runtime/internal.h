/* The runtime's internal headers by concern, for files that use several of them; a file that
 * needs one concern includes that header alone (runtime/error.h, comm.h, util.h, half.h,
 * transport.h, device.h). Not installed. */
#ifndef DTENSOR_RUNTIME_INTERNAL_H
#define DTENSOR_RUNTIME_INTERNAL_H

#include "dtensor/dtensor.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/half.h"
#include "runtime/transport.h"
#include "runtime/util.h"

#endif
