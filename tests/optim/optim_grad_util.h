/* Helpers of the optim tests: meshes sized to the devices present, tensors from whole host
 * arrays, gradients whose summands differ per data-parallel rank, a host reference of the
 * reduced gradient. */
#ifndef DT_OPTIM_GRAD_UTIL_H
#define DT_OPTIM_GRAD_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/dtensor.h"

/* 1-D mesh "batch" over every device of dt_test_device_type(); 2-D mesh "batch" = 2 x "model" = devices / 2. */
dt_mesh *og_mesh_1d(void);
dt_mesh *og_mesh_2d(void);

/* ot_tensor and ot_fetch (tests/ops/ops_test_util.h) for f32 host arrays: a tensor of
 * `dtype` holding `data` rounded to dtype, laid out as `layout`; the whole value of `t` as
 * f32, checking that local replicas agree. */
dt_tensor *og_tensor(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                     const float *data);
void og_fetch(const dt_tensor *t, float *out);

/* Gradient summand of element `idx` (row-major global index) held by data-parallel rank
 * `dpc` at call `step`. */
typedef float (*og_grad_fn)(int64_t idx, int64_t dpc, int step, void *arg);

/* Gradient of `param`: its shape and specs, sum-partial over "batch", dtype `dtype`; the
 * summand of the devices at batch coordinate r is fn(idx, r, step, arg) * scale. */
dt_tensor *og_grad(const dt_tensor *param, dt_dtype dtype, og_grad_fn fn, int step, float scale,
                   void *arg);
/* The reduced value of that gradient: out[idx] = sum over r of fn(idx, r, step) * scale,
 * summed in f32 (exact for the small integers the tests use). */
void og_grad_ref(int64_t n, int64_t ndp, og_grad_fn fn, int step, float scale, void *arg,
                 float *out);

/* Number of elements that differ bit for bit (as floats); prints the first few. */
int64_t og_diff(const char *what, const float *a, const float *b, int64_t n);

#endif
