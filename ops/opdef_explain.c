/* ops/opdef_explain: (in progress) */
#include "ops/opdef_impl.h"
