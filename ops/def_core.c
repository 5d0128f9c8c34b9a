/* ops/def_core: definitions of the library's own: the transformer ops' table entries will
 * move here (docs/ops.md); for now the table is empty. */
#include "ops/opdef_impl.h"

const dt_op_def *const dt__defs_core[] = {NULL};
