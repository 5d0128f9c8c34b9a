/* Helpers of the reduce family's tests: an op checked on every layout of its inputs over the
 * meshes of 1, 2 and 2x2 devices against a reference (and, where the arithmetic allows, the
 * same bits everywhere), and meshes of a given size. */
#ifndef DT_REDUCE_TEST_UTIL_H
#define DT_REDUCE_TEST_UTIL_H

#include <stdint.h>

#include "dtensor/dtensor.h"
#include "ops/def_reduce.h"
#include "../../ops/ops_test_util.h"

typedef dt_status (*rt_fn)(const dt_tensor *const *in, dt_tensor **out);

typedef struct rt_case {
    const char *what;
    rt_fn fn;
    int nin;
    const double *x[2]; /* input values (converted to dtype[i]) */
    dt_dtype dtype[2];
    int rank[2];
    const int64_t *shape[2];
    const double *ref; /* the expected output, nout values */
    int64_t nout;
    dt_dtype out_dtype;
    double tol;  /* relative; 0: exact */
    int bitwise; /* the same bits on every layout and mesh */
} rt_case;

/* Mesh 0: one device ("x" = 1); 1: two devices ("x" = 2); 2: 2x2 ("b", "m"). */
dt_mesh *rt_mesh(int which);
/* 1 when this client holds devices of the mesh. */
int rt_here(const dt_mesh *m);
/* The case on every layout (replicated, sharded on each dim, partial for float inputs) of
 * its inputs on the three meshes. */
void rt_check_layouts(const rt_case *c);
/* A tensor of `shape` from doubles converted to dtype, in layout. */
dt_tensor *rt_tensor(const dt_layout *l, dt_dtype t, int rank, const int64_t *shape,
                     const double *x);
/* The whole value of t as doubles (n of them); only on clients holding devices of its mesh. */
void rt_fetch(const dt_tensor *t, double *out, int64_t n);

#endif
