/* TODO: being written. */
#include "runtime/internal.h"
