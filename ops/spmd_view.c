/* Zero-copy reshapes of distributed tensors between [d0, d1, ..., dr-2, n] and
 * [d0 * ... * dr-2, n] (the N-d ops run the 2-D machinery on such views): each local
 * component is re-described, never copied, when the row blocks of the two shapes coincide. */
#include <stdlib.h>
#include <string.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

typedef struct view {
    DLManagedTensor self;
    DLManagedTensor *inner;
    int64_t shape[DT_MAX_RANK];
} view;

static void view_delete(DLManagedTensor *self)
{
    view *v = self->manager_ctx;
    if (v->inner->deleter)
        v->inner->deleter(v->inner);
    free(v);
}

int dt__rows_aligned(const dt_mesh *mesh, int mesh_dim, int64_t lead, int64_t inner)
{
    if (mesh_dim < 0)
        return 1;
    int64_t k = dt_mesh_dim_size(mesh, mesh_dim);
    for (int64_t j = 0; j < k; j++) {
        int64_t o1, n1, o2, n2;
        dt_shard_range(lead, k, j, &o1, &n1);
        dt_shard_range(lead * inner, k, j, &o2, &n2);
        if (o1 * inner != o2 || n1 * inner != n2)
            return 0;
    }
    return 1;
}

dt_status dt__tensor_view(const dt_tensor *t, const dt__lspec *ls, const int64_t *shape,
                          dt_tensor **out)
{
    int n = dt_tensor_num_local(t);
    DLManagedTensor **inner = calloc((size_t)(n > 0 ? n : 1), sizeof *inner);
    DLManagedTensor **outer = calloc((size_t)(n > 0 ? n : 1), sizeof *outer);
    dt_layout *layout = NULL;
    dt_status st = inner && outer ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "tensor view: out of "
                                                      "memory");
    if (st == DT_OK)
        st = dt__lspec_layout(dt_layout_mesh(dt_tensor_layout(t)), ls, &layout);
    if (st == DT_OK)
        st = dt_tensor_unpack(t, n, inner);
    if (st != DT_OK)
        goto done;
    for (int i = 0; i < n && st == DT_OK; i++) {
        view *v = calloc(1, sizeof *v);
        if (!v) {
            st = dt__error(DT_ERR_NO_MEMORY, "tensor view: out of memory");
            break;
        }
        const DLTensor *src = &inner[i]->dl_tensor;
        /* The local shape under the new layout; pack checks it holds as many elements. */
        st = dt_layout_shard(layout, shape, dt_tensor_local_position(t, i), NULL, v->shape);
        if (st != DT_OK) {
            free(v);
            break;
        }
        if (dt__numel(ls->rank, v->shape) != dt__numel(src->ndim, src->shape)) {
            free(v);
            st = dt__error(DT_ERR_SHAPE, "tensor view: local blocks of the two shapes differ "
                           "(component %d)", i);
            break;
        }
        v->inner = inner[i];
        v->self.dl_tensor = *src;
        v->self.dl_tensor.ndim = ls->rank;
        v->self.dl_tensor.shape = v->shape;
        v->self.dl_tensor.strides = NULL;
        v->self.manager_ctx = v;
        v->self.deleter = view_delete;
        outer[i] = &v->self;
        inner[i] = NULL;
    }
    /* A client holding none of the mesh has nothing to view: an empty tensor of the shape. */
    if (st == DT_OK)
        st = n > 0 ? dt_tensor_pack_managed(layout, shape, n, outer, out)
                   : dt_tensor_zeros(layout, dt_tensor_dtype(t), shape, out);
done:
    for (int i = 0; st != DT_OK && i < n; i++) {
        if (outer && outer[i])
            outer[i]->deleter(outer[i]);
        else if (inner && inner[i] && inner[i]->deleter)
            inner[i]->deleter(inner[i]);
    }
    dt_layout_destroy(layout);
    free(inner);
    free(outer);
    return st;
}
