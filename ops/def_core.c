/* ops/def_core: (in progress) */
#include "ops/opdef_impl.h"

const dt_op_def *const dt__defs_core[] = {NULL};
