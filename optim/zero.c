/* Placeholder until the ZeRO optimizer lands (include/dtensor/optim.h). */
#include "dtensor/optim.h"
#include "runtime/internal.h"
