/* runtime/record: the thread's recorder of op calls (runtime/record.h), below every module
 * that records (layout/, ops/) and the tape that sets it (autograd/). */
#include "runtime/record.h"

_Thread_local dt__recorder *dt__rec_tls;
