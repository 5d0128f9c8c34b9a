/* ops/def_shape: built-in op definitions of this family (placeholder until they land). */
#include "ops/opdef_impl.h"

const dt_op_def *const dt__defs_shape[] = {NULL};
