/* Helpers of the reduce family's kernel tests: local blocks over host arrays and a call of a
 * definition's CPU kernel on them, as the generic path makes it. */
#ifndef DT_REDUCE_KERNEL_UTIL_H
#define DT_REDUCE_KERNEL_UTIL_H

#include <string.h>

#include "ops/def_reduce.h"

/* A whole tensor of `shape` at `data` as one block (offset 0, global = shape). */
static inline dt_op_buf kbuf(void *data, dt_dtype t, int rank, const int64_t *shape)
{
    dt_op_buf b;
    memset(&b, 0, sizeof(b));
    b.data = data;
    b.dtype = t;
    b.rank = rank;
    for (int d = 0; d < rank; d++)
        b.shape[d] = b.global[d] = shape[d];
    return b;
}

/* Runs def's CPU kernel on inputs in[0..nin-1] into out with attrs at. */
static inline dt_status krun(const dt_op_def *def, const dt_op_attrs *at, int nin,
                             const dt_op_buf *in, dt_op_buf out)
{
    dt_op_kernel_args a;
    memset(&a, 0, sizeof(a));
    a.attrs = *at;
    a.nin = nin;
    for (int i = 0; i < nin; i++)
        a.in[i] = in[i];
    a.out = out;
    a.user = def->user;
    return def->cpu(&a);
}

#endif
