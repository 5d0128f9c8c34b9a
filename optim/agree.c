/* Scalars agreed over the optimizer's mesh: one small tensor, partial over every mesh dim,
 * relaid out to replicated (the way dt_nonfinite and dt_item agree), so only the mesh's
 * clients take part; the values go in and out through the devices' copies. And one outcome
 * over the mesh's client group (runtime/group.h). */
#include "layout/tensor_dev.h"
#include "optim/optim_impl.h"
#include "mesh/mesh_group.h"
#include "runtime/util.h"

dt_status dt__zero_allreduce(const dt_zero *z, dt_reduce_op op, int n, const double *vals,
                             double *out)
{
    const dt_mesh *mesh = z->mesh;
    int rank = dt_mesh_rank(mesh);
    const char *dims[DT_MESH_MAX_DIMS];
    dt_reduce_op ops[DT_MESH_MAX_DIMS];
    for (int d = 0; d < rank; d++) {
        dims[d] = dt_mesh_dim_name(mesh, d);
        ops[d] = op;
    }
    const char *spec[1] = {DT_UNSHARDED};
    int64_t shape[1] = {n};
    dt_layout *lp = NULL, *lr = NULL;
    dt_tensor *t = NULL, *r = NULL;
    dt_status st = dt_layout_create_partial(mesh, 1, spec, rank, dims, ops, &lp);
    if (st == DT_OK)
        st = dt_layout_replicated(mesh, 1, &lr);
    if (st == DT_OK)
        st = dt__tensor_empty(lp, DT_DTYPE_F64, shape, &t);
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(t); i++)
        st = dt_tensor_local_write(t, i, vals + (size_t)i * (size_t)n, (size_t)n * sizeof *vals);
    if (st == DT_OK)
        st = dt_relayout(t, lr, &r);
    if (st == DT_OK)
        st = dt_tensor_local_read(r, 0, out, (size_t)n * sizeof *out);
    dt_tensor_destroy(r);
    dt_tensor_destroy(t);
    dt_layout_destroy(lr);
    dt_layout_destroy(lp);
    return st;
}

dt_status dt__zero_agree(const dt_zero *z, const char *fn, dt_status st)
{
    return dt__mesh_agree(z->mesh, st, fn);
}
