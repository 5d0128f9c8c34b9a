/* ops/opdef_rule: (in progress) */
#include "ops/opdef_impl.h"
