/* Dropout from the counter-based generator (ops/philox.c): a mask tensor whose every element
 * depends only on (seed, stream, its global row-major index), so it is the same on any mesh
 * and layout as on one device; dt_dropout is x times that mask (dt_mul: the tape records it,
 * and its backward, dy times the same mask, needs no saved state beyond the mask). */
#include <stdlib.h>

#include "layout/tensor_dev.h"
#include "ops/ops_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* Fills host `buf` with local component i's mask: the component is a box of the global tensor,
 * its rows along the last dim contiguous runs of global indices. */
static void fill_component(int rank, const int64_t *shape, const int64_t *off, const int64_t *len,
                           float p, uint64_t seed, uint64_t stream, float *buf)
{
    int64_t run = rank > 0 ? len[rank - 1] : 1, rows = 1, idx[DT_MAX_RANK] = {0};
    for (int d = 0; d + 1 < rank; d++)
        rows *= len[d];
    for (int64_t r = 0; r < rows && run > 0; r++) {
        int64_t g = 0;
        for (int d = 0; d < rank; d++)
            g = g * shape[d] + off[d] + (d + 1 < rank ? idx[d] : 0);
        dt__dropout_mask_run(g, run, p, seed, stream, buf + r * run);
        for (int d = rank - 2; d >= 0; d--) { /* next row of the box */
            if (++idx[d] < len[d])
                break;
            idx[d] = 0;
        }
    }
}

/* Local component i of the mask: filled in a host buffer, then written (any device). */
typedef struct mask_local {
    dt_tensor *t;
    const int64_t *shape;
    float p;
    uint64_t seed, stream;
} mask_local;

static dt_status mask_one(int i, void *arg)
{
    const mask_local *m = arg;
    const DLTensor *c = dt_tensor_local(m->t, i);
    int64_t n = dt__numel(c->ndim, c->shape);
    if (n == 0)
        return DT_OK;
    float *buf = malloc((size_t)n * sizeof *buf);
    if (!buf)
        return dt__error(DT_ERR_NO_MEMORY, "dt_dropout_mask: no memory for %lld floats",
                         (long long)n);
    fill_component(c->ndim, m->shape, dt_tensor_local_offset(m->t, i), c->shape, m->p, m->seed,
                   m->stream, buf);
    dt_status st = dt_tensor_local_write(m->t, i, buf, (size_t)n * sizeof *buf);
    free(buf);
    return st;
}

dt_status dt_dropout_mask(const dt_layout *layout, const int64_t *shape, float p, uint64_t seed,
                          uint64_t stream, dt_tensor **out)
{
    static const char op[] = "dt_dropout_mask";
    if (!layout || !shape || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: layout, shape and out are required", op);
    if (!(p >= 0.0f && p < 1.0f))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: p %g is not in [0, 1)", op, (double)p);
    /* The mask is a plain value: partial dims of the layout are dropped. */
    dt__lspec ls;
    dt__lspec_of(layout, &ls);
    for (int d = 0; d < DT_MESH_MAX_DIMS; d++)
        ls.partial[d] = 0;
    dt_layout *l = NULL;
    dt_tensor *t = NULL;
    dt_status st = dt__lspec_layout(dt_layout_mesh(layout), &ls, &l);
    if (st == DT_OK)
        st = dt__tensor_empty(l, DT_DTYPE_F32, shape, &t);
    dt_layout_destroy(l);
    mask_local ml = {t, shape, p, seed, stream};
    /* CPU devices fill their masks at once (dt__ops_each_local); other kinds one by one. */
    const dt__ops_backend *be = NULL;
    if (st == DT_OK && dt_mesh_device_type(dt_layout_mesh(layout)) == DT_DEVICE_CPU)
        st = dt__ops_backend_for(dt_layout_mesh(layout), op, &be);
    if (st == DT_OK && be)
        st = dt__ops_each_local(be, t, mask_one, &ml);
    for (int i = 0; st == DT_OK && !be && i < dt_tensor_num_local(t); i++)
        st = mask_one(i, &ml);
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

dt_status dt_dropout(const dt_tensor *x, float p, uint64_t seed, uint64_t stream, dt_tensor **out)
{
    if (!x || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_dropout: x and out are required");
    dt_tensor *mask = NULL;
    dt_status st = dt_dropout_mask(dt_tensor_layout(x), dt_tensor_shape(x), p, seed, stream, &mask);
    if (st == DT_OK)
        st = dt_mul(x, mask, NULL, out);
    dt_tensor_destroy(mask);
    return st;
}
