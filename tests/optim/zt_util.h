/* Helpers of the optim tests: meshes sized to the devices present, tensors from whole host
 * arrays, gradients whose summands differ per data-parallel rank, a host reference of the
 * reduced gradient. */
#ifndef DT_ZT_UTIL_H
#define DT_ZT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/dtensor.h"

/* 1-D mesh "batch" over every CPU device; 2-D mesh "batch" = 2 x "model" = devices / 2. */
dt_mesh *zt_mesh_1d(void);
dt_mesh *zt_mesh_2d(void);

/* Layout of a rank-`rank` (<= 2) tensor from spec names (NULL = unsharded), optionally
 * sum-partial over mesh dim `partial`. */
dt_layout *zt_layout(const dt_mesh *mesh, int rank, const char *s0, const char *s1,
                     const char *partial);

/* Tensor of `dtype` holding the host f32 array `data` (rounded to dtype) laid out as `layout`. */
dt_tensor *zt_tensor(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                     const float *data);
/* Whole value of `t` as f32 on the host; checks that local replicas agree. */
void zt_fetch(const dt_tensor *t, float *out);

/* Gradient summand of element `idx` (row-major global index) held by data-parallel rank
 * `dpc` at call `step`. */
typedef float (*zt_grad_fn)(int64_t idx, int64_t dpc, int step, void *arg);

/* Gradient of `param`: its shape and specs, sum-partial over "batch", dtype `dtype`; the
 * summand of the devices at batch coordinate r is fn(idx, r, step, arg) * scale. */
dt_tensor *zt_grad(const dt_tensor *param, dt_dtype dtype, zt_grad_fn fn, int step, float scale,
                   void *arg);
/* The reduced value of that gradient: out[idx] = sum over r of fn(idx, r, step) * scale,
 * summed in f32 (exact for the small integers the tests use). */
void zt_grad_ref(int64_t n, int64_t ndp, zt_grad_fn fn, int step, float scale, void *arg,
                 float *out);

/* Rounds n floats through dtype and back. */
void zt_round(float *x, int64_t n, dt_dtype dtype);

/* Number of elements that differ bit for bit (as floats); prints the first few. */
int64_t zt_diff(const char *what, const float *a, const float *b, int64_t n);

#endif
