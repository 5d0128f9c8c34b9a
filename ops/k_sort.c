/* ops/k_sort: CPU kernels of topk and sort along one whole axis: the indices of the k largest
 * (or smallest) sorted, ties by the lower index first (a stable merge sort; NaN counts as the
 * largest value, as PyTorch), the values at given indices along an axis, and their gradient
 * (dy added at the indices into zeros). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/def_reduce.h"
#include "runtime/error.h"

/* a strictly before b in the requested order (NaN above every number). */
static int before(double a, double b, int largest)
{
    if (largest)
        return (isnan(a) && !isnan(b)) || a > b;
    return (!isnan(a) && isnan(b)) || a < b;
}

static void merge_sort(int64_t *idx, int64_t *tmp, int64_t n, const double *v, int largest)
{
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = before(v[idx[j]], v[idx[i]], largest) ? idx[j++] : idx[i++];
            while (i < mid)
                tmp[k++] = idx[i++];
            while (j < hi)
                tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, sizeof(int64_t) * (size_t)n);
    }
}

dt_status dt__k_topk_indices(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0];
    int axis = (int)a->attrs.i[0];
    int64_t k = a->attrs.i[1], outer, len, inner;
    int largest = a->attrs.i[2] != 0;
    dt__rd_split(x, axis, &outer, &len, &inner);
    size_t n = (size_t)(len > 0 ? len : 1);
    double *v = malloc(sizeof(double) * n);
    int64_t *idx = malloc(sizeof(int64_t) * n), *tmp = malloc(sizeof(int64_t) * n);
    if (!v || !idx || !tmp) {
        free(v);
        free(idx);
        free(tmp);
        return dt__error(DT_ERR_NO_MEMORY, "topk: no memory for a line of %lld", (long long)len);
    }
    int64_t *y = a->out.data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            for (int64_t j = 0; j < len; j++) {
                v[j] = dt__rd_get(x->data, x->dtype, base + j * inner);
                idx[j] = j;
            }
            merge_sort(idx, tmp, len, v, largest);
            for (int64_t j = 0; j < k; j++)
                y[(o * k + j) * inner + i] = idx[j];
        }
    free(v);
    free(idx);
    free(tmp);
    return DT_OK;
}

/* The index at element e of the index block, checked against the axis' length. */
static dt_status index_at(const dt_op_buf *ib, int64_t e, int64_t len, int64_t *out)
{
    int64_t j = dt__rd_geti(ib->data, ib->dtype, e);
    if (j < 0 || j >= len)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "topk_values: index %lld out of range 0..%lld of the axis", (long long)j,
                         (long long)len - 1);
    *out = j;
    return DT_OK;
}

dt_status dt__k_take_along(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *ib = &a->in[1];
    int axis = (int)a->attrs.i[0];
    int64_t outer, len, inner, k = ib->shape[axis];
    dt__rd_split(x, axis, &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < k; j++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t e = (o * k + j) * inner + i, src;
                dt_status st = index_at(ib, e, len, &src);
                if (st != DT_OK)
                    return st;
                dt__rd_set(a->out.data, a->out.dtype, e,
                           dt__rd_get(x->data, x->dtype, (o * len + src) * inner + i));
            }
    return DT_OK;
}

dt_status dt__k_take_along_grad(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *ib = &a->in[1], *dy = &a->in[2];
    int axis = (int)a->attrs.i[0];
    int64_t outer, len, inner, k = ib->shape[axis];
    dt__rd_split(x, axis, &outer, &len, &inner);
    memset(a->out.data, 0, (size_t)dt__op_numel(&a->out) * dt_dtype_size(a->out.dtype));
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < k; j++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t e = (o * k + j) * inner + i, dst;
                dt_status st = index_at(ib, e, len, &dst);
                if (st != DT_OK)
                    return st;
                int64_t d = (o * len + dst) * inner + i;
                dt__rd_set(a->out.data, a->out.dtype, d,
                           dt__rd_get(a->out.data, a->out.dtype, d) +
                               dt__rd_get(dy->data, dy->dtype, e));
            }
    return DT_OK;
}
