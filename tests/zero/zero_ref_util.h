/* Helpers of the ZeRO system tests: meshes over any number of the devices present, tensors
 * filled from and compared with whole host arrays device by device (no communication), the
 * single-device reference of the inner optimizers in plain C (the arithmetic of
 * ops/optimizer.c, operation for operation), and seeded test data. */
#ifndef DT_ZERO_REF_UTIL_H
#define DT_ZERO_REF_UTIL_H

#include <stdint.h>

#include "dtensor/dtensor.h"

/* Global devices of dt_test_device_type() in the job. */
int zt_num_devices(void);

/* 1-D mesh "batch" of k devices (k <= zt_num_devices()) spread evenly over the devices
 * present (ids floor(i n / k)), so under MPI even a small mesh spans several processes;
 * clients holding none of its devices stay out of its collectives. */
dt_mesh *zt_mesh_dp(int64_t k);
/* The same, 2-D: batch (b) x model (m) over b m devices spread evenly; m = 0 gives the 1-D
 * zt_mesh_dp(b). */
dt_mesh *zt_mesh_bm(int64_t b, int64_t m);
/* 2-D mesh batch x model (model = 2) over every device (needs an even device count). */
dt_mesh *zt_mesh_batch_model(void);
/* 1 if this client holds devices of `mesh` (only those clients take part in its
 * collectives). */
int zt_in_mesh(const dt_mesh *mesh);

/* A tensor of `layout`, dtype and global shape whose local component on every device holds
 * its box of src[c], c being the device's coordinate on mesh dim `by_dim` (0 when by_dim < 0):
 * so a partial-over-dp tensor gets summand j on dp coordinate j. src arrays are whole f32
 * tensors (row-major), converted to `dtype` (exactly, for the values the tests use). Local. */
dt_tensor *zt_tensor_from(const dt_layout *layout, dt_dtype dtype, const int64_t *shape, int by_dim,
                          const float *const *src);
/* The same for one array on every device. */
dt_tensor *zt_tensor(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                     const float *src);

/* Number of elements, over every local component of t, whose bits differ from `want` (a
 * whole f32 array, rounded to t's dtype with dt_kernel_cast first); prints the first few
 * with `what`. Local. */
int64_t zt_bit_mismatches(const char *what, const dt_tensor *t, const float *want);
/* Same with a tolerance: |got - want| > atol + rtol |want| (values in f32). */
int64_t zt_mismatches(const char *what, const dt_tensor *t, const float *want, float atol,
                      float rtol);

/* Seeded data: uniform reals in [lo, hi), small integers in [lo, hi]. */
uint64_t zt_hash(uint64_t a, uint64_t b, uint64_t c);
void zt_fill_real(float *x, int64_t n, float lo, float hi, uint64_t seed);
float zt_int_at(uint64_t seed, uint64_t i, int lo, int hi);

/* The reference inner optimizers on whole f32 arrays: dt_kernel_sgd and dt_kernel_adam's
 * documented formulas with their f32 operation order (ops/optimizer.c), grad_scale 1. */
void zt_ref_sgd(int64_t n, const dt_optim_hparams *hp, float *p, const float *g, float *buf);
void zt_ref_adam(int64_t n, const dt_optim_hparams *hp, int64_t step, float *p, const float *g,
                 float *m, float *v);
/* The two groups the system tests train: 0 is AdamW (lr 0.02, weight decay 0.05), 1 is SGD
 * with momentum (lr 0.05, momentum 0.9, dampening 0.1). */
const dt_optim_hparams *zt_test_hparams(int group);
/* Elements of a rank-1 or rank-2 shape (shape[1] unused at rank 1). */
int64_t zt_numel2(int rank, const int64_t shape[2]);
/* One group's update: dispatches on hp->kind. */
void zt_ref_update(int64_t n, const dt_optim_hparams *hp, int64_t step, float *p, const float *g,
                   float *s1, float *s2);

#endif
