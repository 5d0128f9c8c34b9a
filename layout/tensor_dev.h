/* What layout/tensor.c offers the modules above the runtime besides the public tensor API: a
 * component's device and tensors allocated but not initialised. Not installed. */
#ifndef DTENSOR_LAYOUT_TENSOR_DEV_H
#define DTENSOR_LAYOUT_TENSOR_DEV_H

#include "dtensor/tensor.h"
#include "runtime/device.h"

/* The device of a tensor's local component i (NULL if out of range). */
const dt__device *dt__tensor_device(const dt_tensor *t, int i);

/* A tensor whose local components are allocated (host pool or device) but not initialised:
 * for producers that overwrite every element (relayout). */
dt_status dt__tensor_empty(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                           dt_tensor **tensor_out);

#endif
