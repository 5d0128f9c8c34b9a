/* ops/ private header of the op definitions: the built-in definition tables of each family
 * file, the generic call path's entry for them, and helpers shared by the definition files.
 * Not installed. */
#ifndef DTENSOR_OPDEF_IMPL_H
#define DTENSOR_OPDEF_IMPL_H

#include <stdint.h>

#include "dtensor/dtensor.h"
#include "dtensor/opdef.h"
#include "dtensor/ops_general.h"

/* The built-in definitions, one NULL-terminated table per family file (ops/def_*.c); the
 * registry (ops/opdef_registry.c) registers them, in this order, before any other op. */
extern const dt_op_def *const dt__defs_elem[];   /* ops/def_elem.c: unary, binary, random */
extern const dt_op_def *const dt__defs_reduce[]; /* ops/def_reduce.c: reductions, linear */
extern const dt_op_def *const dt__defs_shape[];  /* ops/def_shape.c: shape, index, host */
extern const dt_op_def *const dt__defs_core[];   /* ops/def_core.c: the transformer ops */

/* The handle of a built-in definition (registers the built-ins on first use; NULL for a
 * definition that is not one of them). Thread-safe. */
const dt_op *dt__op_builtin(const dt_op_def *def);

/* dt_op_call on a built-in definition: what every public wrapper calls. */
dt_status dt__op_run(const dt_op_def *def, const dt_tensor *const *in, int nin,
                     const dt_op_attrs *attrs, const dt_layout *layout, dt_tensor **out);
/* One- and two-input shorthands with attributes (attrs may be NULL: all zero). */
dt_status dt__op_run1(const dt_op_def *def, const dt_tensor *x, const dt_op_attrs *attrs,
                      dt_tensor **out);
dt_status dt__op_run2(const dt_op_def *def, const dt_tensor *a, const dt_tensor *b,
                      const dt_op_attrs *attrs, dt_tensor **out);

/* An axis in -rank..rank-1 made 0..rank-1; -1 when out of range. */
static inline int dt__op_axis(int axis, int rank)
{
    if (axis < 0)
        axis += rank;
    return axis >= 0 && axis < rank ? axis : -1;
}

/* Elements of a buffer, and of a shape. */
static inline int64_t dt__op_numel(const dt_op_buf *b)
{
    int64_t n = 1;
    for (int i = 0; i < b->rank; i++)
        n *= b->shape[i];
    return n;
}

/* The factor letters for dims 0..rank-1 of a rule written by a rule_fn: 'a' + i. */
static inline char dt__op_letter(int i)
{
    return (char)('a' + i);
}

#endif
