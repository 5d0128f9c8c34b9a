/* Helpers of the ops tests: meshes sized to the devices present, tensors from and to whole
 * host arrays (through dt_relayout), small integer test data, a float comparison. */
#ifndef DT_OPS_TEST_UTIL_H
#define DT_OPS_TEST_UTIL_H

#include <stdint.h>

#include "dtensor/dtensor.h"

/* 1-D mesh "x" over every device of dt_test_device_type(); 2-D mesh "b" x "m" (b = 2, m = devices / 2). */
dt_mesh *ot_mesh_1d(void);
dt_mesh *ot_mesh_2d(void);

/* Tensor holding the whole host array `data` (dtype elements) laid out as `layout`. */
dt_tensor *ot_tensor(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                     const void *data);
/* Copies the whole value of `t` (any layout, partial reduced) into host `out`; checks that
 * every local replica agrees. */
void ot_fetch(const dt_tensor *t, void *out);

/* Fills n floats with small integers in [lo, hi] from a seeded generator. */
void ot_fill_int(float *x, int64_t n, int lo, int hi, uint64_t seed);
/* Same, uniform reals in [lo, hi). */
void ot_fill_real(float *x, int64_t n, float lo, float hi, uint64_t seed);

/* Number of elements where |a-b| > atol + rtol*|b|; prints the first few. */
int64_t ot_mismatches(const char *what, const float *a, const float *b, int64_t n, float atol,
                      float rtol);

/* 1 if the tensor's layout has partial dims. */
int ot_is_partial(const dt_tensor *t);
/* Mesh dim index sharding tensor dim `dim` of t, or -1. */
int ot_spec(const dt_tensor *t, int dim);

#endif
