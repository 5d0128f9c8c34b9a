/* ops/opdef_call: (in progress) */
#include "ops/opdef_impl.h"
