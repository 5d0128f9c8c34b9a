/* The argument check the kernels of every backend share. */
#include "ops/ops_impl.h"
#include "runtime/error.h"

dt_status dt__kcheck(const char *op, int64_t n, int nptrs, const void *const *ptrs)
{
    if (n < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: negative size %lld", op, (long long)n);
    if (n == 0)
        return DT_OK;
    for (int i = 0; i < nptrs; i++)
        if (!ptrs[i])
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: pointer argument %d is NULL for %lld "
                             "elements", op, i + 1, (long long)n);
    return DT_OK;
}
