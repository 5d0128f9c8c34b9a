/* ops/opdef_prop: (in progress) */
#include "ops/opdef_impl.h"
