/* libdtensor: a mesh-aware distributed tensor runtime. Umbrella header. */
#ifndef DTENSOR_DTENSOR_H
#define DTENSOR_DTENSOR_H

#include "dtensor/status.h"
#include "dtensor/dtype.h"
#include "dtensor/runtime.h"
#include "dtensor/mesh.h"
#include "dtensor/layout.h"
#include "dtensor/tensor.h"
#include "dtensor/relayout.h"
#include "dtensor/ckpt.h"
#include "dtensor/foreign.h"
#include "dtensor/ops.h"
#include "dtensor/opdef.h"
#include "dtensor/ops_general.h"
#include "dtensor/autograd.h"
#include "dtensor/optim.h"
#include "dtensor/data.h"
#include "dtensor/trace.h"
#include "dtensor/tokenizer.h"
#include "dtensor/collective.h"
#include "dtensor/moe.h"
#include "dtensor/version.h"

#endif
