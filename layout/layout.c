/* dt_layout objects: creation from spec names (plus partial dims), the replicated / batch /
 * inner sharded helpers, reference counting, queries, equality. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/layout_impl.h"
#include "layout/tensor_dev.h"
#include "runtime/error.h"

const char *dt__layout_mesh_dims(const dt_mesh *mesh, char *buf, size_t len)
{
    size_t pos = 0;
    buf[0] = '\0';
    for (int d = 0; d < dt_mesh_rank(mesh) && pos < len; d++)
        pos += (size_t)snprintf(buf + pos, len - pos, "%s%s", d ? ", " : "",
                                dt_mesh_dim_name(mesh, d));
    return buf;
}

dt_status dt__layout_new(const dt_mesh *mesh, int rank, const int *spec_dim, int npartial,
                         const int *partial_dim, const dt_reduce_op *partial_op,
                         dt_layout **layout_out)
{
    if (!mesh || !layout_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "layout: mesh and layout_out must not be NULL");
    if (rank < 0 || rank > DT_MAX_RANK)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "layout rank %d out of range 0..%d (DT_MAX_RANK)", rank, DT_MAX_RANK);
    int mrank = dt_mesh_rank(mesh);
    if (mrank < 0 || mrank > DT_MESH_MAX_DIMS)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "layout: mesh has an invalid rank %d", mrank);
    if (npartial < 0 || npartial > mrank)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "layout: %d partial dims for a mesh of %d dims", npartial, mrank);
    if ((rank > 0 && !spec_dim) || (npartial > 0 && (!partial_dim || !partial_op)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "layout: NULL specs or partial arrays");

    /* user[d]: who uses mesh dim d: -1 nobody, 0..rank-1 that tensor dim, rank+ partial. */
    int user[DT_MESH_MAX_DIMS];
    for (int d = 0; d < mrank; d++)
        user[d] = -1;
    int match_dim = -1;
    for (int i = 0; i < rank; i++) {
        int d = spec_dim[i];
        if (d < DT__SPEC_MATCH || d >= mrank)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "layout: spec of tensor dim %d names mesh dim %d of %d", i, d,
                             mrank);
        /* TensorFlow lets 'any' repeat but counts 'match' as a dimension used once. */
        if (d == DT__SPEC_MATCH && match_dim >= 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "tensor dims %d and %d are both '" DT_MATCH "' (TensorFlow: "
                             "\"Attempted to shard two or more tensor dimensions over mesh "
                             "dimension match\")",
                             match_dim, i);
        if (d == DT__SPEC_MATCH)
            match_dim = i;
        if (d < 0)
            continue;
        if (user[d] >= 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "mesh dimension '%s' shards both tensor dims %d and %d; each mesh "
                             "dimension may be used at most once",
                             dt_mesh_dim_name(mesh, d), user[d], i);
        user[d] = i;
    }
    for (int i = 0; i < npartial; i++) {
        int d = partial_dim[i];
        if (d < 0 || d >= mrank)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "layout: partial dim %d names mesh dim %d of %d", i, d, mrank);
        if ((int)partial_op[i] < 0 || (int)partial_op[i] > (int)DT_REDUCE_AVG)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "partial mesh dimension '%s' has an invalid reduction %d",
                             dt_mesh_dim_name(mesh, d), (int)partial_op[i]);
        if (user[d] >= rank)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "mesh dimension '%s' is partial twice",
                             dt_mesh_dim_name(mesh, d));
        if (user[d] >= 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "mesh dimension '%s' cannot be both partial and sharding tensor "
                             "dim %d",
                             dt_mesh_dim_name(mesh, d), user[d]);
        user[d] = rank + i;
    }

    dt_layout *l = calloc(1, sizeof *l);
    if (!l)
        return dt__error(DT_ERR_NO_MEMORY, "layout: out of memory");
    atomic_init(&l->refs, 1);
    l->rank = rank;
    for (int i = 0; i < rank; i++)
        l->spec_dim[i] = spec_dim[i];
    /* Partial dims are kept in mesh dim order, so equal layouts compare and print alike. */
    for (int d = 0; d < mrank; d++) {
        if (user[d] >= rank) {
            l->partial_dim[l->npartial] = d;
            l->partial_op[l->npartial] = partial_op[user[d] - rank];
            l->npartial++;
        }
    }
    l->mesh_rank = mrank;
    l->mesh_size = dt_mesh_size(mesh);
    for (int d = 0; d < mrank; d++)
        l->mesh_dim_size[d] = dt_mesh_dim_size(mesh, d);
    l->mesh = dt_mesh_retain(mesh);
    *layout_out = l;
    return DT_OK;
}

/* Resolves spec names to mesh dim indices; DT_ERR_INVALID_ARGUMENT names the bad one. */
static dt_status resolve_specs(const dt_mesh *mesh, int rank, const char *const *specs,
                               int *spec_dim)
{
    char dims[DT__MESH_DIMS_TEXT];
    if (rank > 0 && !specs)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "layout: specs is NULL for rank %d", rank);
    for (int i = 0; i < rank; i++) {
        if (!specs[i])
            return dt__error(DT_ERR_INVALID_ARGUMENT, "layout: spec of tensor dim %d is NULL",
                             i);
        if (strcmp(specs[i], DT_UNSHARDED) == 0 || strcmp(specs[i], DT_ANY) == 0 ||
            strcmp(specs[i], DT_MATCH) == 0) {
            spec_dim[i] = specs[i][0] == 'u' ? DT__SPEC_UNSHARDED
                          : specs[i][0] == 'a' ? DT__SPEC_ANY
                                               : DT__SPEC_MATCH;
            continue;
        }
        spec_dim[i] = dt_mesh_dim_index(mesh, specs[i]);
        if (spec_dim[i] < 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "spec '%s' of tensor dim %d is neither '" DT_UNSHARDED
                             "' ('" DT_ANY "', '" DT_MATCH "') nor a mesh dimension (mesh dims: "
                             "%s)",
                             specs[i], i, dt__layout_mesh_dims(mesh, dims, sizeof dims));
    }
    return DT_OK;
}

dt_status dt_layout_create_partial(const dt_mesh *mesh, int rank, const char *const *specs,
                                   int npartial, const char *const *partial_dims,
                                   const dt_reduce_op *partial_ops, dt_layout **layout_out)
{
    int spec_dim[DT_MAX_RANK];
    int pdim[DT_MESH_MAX_DIMS];
    char dims[DT__MESH_DIMS_TEXT];

    if (!mesh || !layout_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "layout: mesh and layout_out must not be NULL");
    if (rank < 0 || rank > DT_MAX_RANK)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "layout rank %d out of range 0..%d (DT_MAX_RANK)", rank, DT_MAX_RANK);
    if (npartial < 0 || npartial > dt_mesh_rank(mesh))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "layout: %d partial dims for a mesh of %d dims",
                         npartial, dt_mesh_rank(mesh));
    if (npartial > 0 && (!partial_dims || !partial_ops))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "layout: NULL partial_dims or partial_ops");
    dt_status st = resolve_specs(mesh, rank, specs, spec_dim);
    if (st != DT_OK)
        return st;
    for (int i = 0; i < npartial; i++) {
        if (!partial_dims[i])
            return dt__error(DT_ERR_INVALID_ARGUMENT, "layout: partial dim %d is NULL", i);
        pdim[i] = dt_mesh_dim_index(mesh, partial_dims[i]);
        if (pdim[i] < 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "partial dim '%s' is not a mesh dimension (mesh dims: %s)",
                             partial_dims[i], dt__layout_mesh_dims(mesh, dims, sizeof dims));
    }
    return dt__layout_new(mesh, rank, spec_dim, npartial, pdim, partial_ops, layout_out);
}

dt_status dt_layout_create(const dt_mesh *mesh, int rank, const char *const *specs,
                           dt_layout **layout_out)
{
    return dt_layout_create_partial(mesh, rank, specs, 0, NULL, NULL, layout_out);
}

dt_status dt_layout_replicated(const dt_mesh *mesh, int rank, dt_layout **layout_out)
{
    int spec_dim[DT_MAX_RANK];
    for (int i = 0; i < DT_MAX_RANK; i++)
        spec_dim[i] = -1;
    return dt__layout_new(mesh, rank, spec_dim, 0, NULL, NULL, layout_out);
}

dt_status dt_layout_batch_sharded(const dt_mesh *mesh, const char *mesh_dim, int rank, int axis,
                                  dt_layout **layout_out)
{
    int spec_dim[DT_MAX_RANK];
    char dims[DT__MESH_DIMS_TEXT];

    if (!mesh || !mesh_dim || !layout_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "batch_sharded: NULL argument");
    if (rank < 1 || rank > DT_MAX_RANK)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "sharded layout rank %d out of range 1..%d (DT_MAX_RANK)", rank,
                         DT_MAX_RANK);
    if (axis < -rank || axis >= rank)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "axis %d out of range for rank %d", axis,
                         rank);
    if (axis < 0)
        axis += rank;
    int d = dt_mesh_dim_index(mesh, mesh_dim);
    if (d < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "'%s' is not a mesh dimension (mesh dims: %s)",
                         mesh_dim, dt__layout_mesh_dims(mesh, dims, sizeof dims));
    for (int i = 0; i < rank; i++)
        spec_dim[i] = i == axis ? d : -1;
    return dt__layout_new(mesh, rank, spec_dim, 0, NULL, NULL, layout_out);
}

dt_status dt_layout_inner_sharded(const dt_mesh *mesh, const char *mesh_dim, int rank,
                                  dt_layout **layout_out)
{
    return dt_layout_batch_sharded(mesh, mesh_dim, rank, rank - 1, layout_out);
}

dt_layout *dt_layout_retain(const dt_layout *layout)
{
    if (!layout)
        return NULL;
    /* Handles are always heap objects, so dropping const here is sound. */
    dt_layout *l = (dt_layout *)layout;
    atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
    return l;
}

void dt_layout_destroy(dt_layout *layout)
{
    if (!layout)
        return;
    if (atomic_fetch_sub_explicit(&layout->refs, 1, memory_order_acq_rel) != 1)
        return;
    dt_mesh_destroy(layout->mesh);
    free(layout);
}

const dt_mesh *dt_layout_mesh(const dt_layout *layout)
{
    return layout ? layout->mesh : NULL;
}

int dt_layout_rank(const dt_layout *layout)
{
    return layout ? layout->rank : 0;
}

const char *dt_layout_spec(const dt_layout *layout, int dim)
{
    if (!layout || dim < 0 || dim >= layout->rank)
        return NULL;
    switch (layout->spec_dim[dim]) {
    case DT__SPEC_ANY:
        return DT_ANY;
    case DT__SPEC_MATCH:
        return DT_MATCH;
    case DT__SPEC_UNSHARDED:
        return DT_UNSHARDED;
    default:
        break;
    }
    return dt_mesh_dim_name(layout->mesh, layout->spec_dim[dim]);
}

int dt_layout_spec_mesh_dim(const dt_layout *layout, int dim)
{
    if (!layout || dim < 0 || dim >= layout->rank)
        return -1;
    return layout->spec_dim[dim] < 0 ? -1 : layout->spec_dim[dim];
}

int dt_layout_num_partial(const dt_layout *layout)
{
    return layout ? layout->npartial : 0;
}

dt_status dt_layout_partial(const dt_layout *layout, int i, int *mesh_dim_out,
                            dt_reduce_op *op_out)
{
    if (!layout)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_layout_partial: NULL layout");
    if (i < 0 || i >= layout->npartial)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "partial dim index %d out of range: the layout has %d", i,
                         layout->npartial);
    if (mesh_dim_out)
        *mesh_dim_out = layout->partial_dim[i];
    if (op_out)
        *op_out = layout->partial_op[i];
    return DT_OK;
}

int dt_layout_is_replicated(const dt_layout *layout)
{
    if (!layout || layout->npartial > 0)
        return 0;
    for (int i = 0; i < layout->rank; i++)
        if (layout->spec_dim[i] != DT__SPEC_UNSHARDED)
            return 0;
    return 1;
}

dt_status dt_layout_check_concrete(const dt_layout *layout)
{
    if (!layout)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_layout_check_concrete: NULL layout");
    if (dt_mesh_is_empty(layout->mesh))
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "TensorFlow's 'empty_layout' (a layout on the empty mesh) places "
                         "nothing: it has no devices to hold a tensor");
    for (int i = 0; i < layout->rank; i++) {
        if (layout->spec_dim[i] == DT__SPEC_ANY || layout->spec_dim[i] == DT__SPEC_MATCH)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "tensor dim %d of the layout is TensorFlow's placeholder '%s', "
                             "which names no mesh dimension: a tensor needs a layout whose "
                             "specs are mesh dimensions or '" DT_UNSHARDED "'",
                             i, dt_layout_spec(layout, i));
    }
    return DT_OK;
}

int dt_layout_equal(const dt_layout *a, const dt_layout *b)
{
    if (a == b)
        return 1;
    if (!a || !b || a->rank != b->rank || a->npartial != b->npartial)
        return 0;
    if (a->mesh != b->mesh && !dt_mesh_equal(a->mesh, b->mesh))
        return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->spec_dim[i] != b->spec_dim[i])
            return 0;
    for (int i = 0; i < a->npartial; i++)
        if (a->partial_dim[i] != b->partial_dim[i] || a->partial_op[i] != b->partial_op[i])
            return 0;
    return 1;
}

/* Mesh dim d of l when it splits or sums over more than one device, else -1 (unsharded). */
static int wide_dim(const dt_layout *l, int d)
{
    return d >= 0 && l->mesh_dim_size[d] > 1 ? d : -1;
}

/* The partial mesh dims of l over more than one device, in increasing order, and their
 * reductions; returns how many. */
static int wide_partials(const dt_layout *l, int *dims, dt_reduce_op *ops)
{
    int n = 0;
    for (int i = 0; i < l->npartial; i++)
        if (wide_dim(l, l->partial_dim[i]) >= 0) {
            dims[n] = l->partial_dim[i];
            ops[n++] = l->partial_op[i];
        }
    return n;
}

int dt__layout_same_placement(const dt_layout *a, const dt_layout *b)
{
    if (dt_layout_equal(a, b))
        return 1;
    if (!a || !b || a->rank != b->rank)
        return 0;
    if (a->mesh != b->mesh && !dt_mesh_equal(a->mesh, b->mesh))
        return 0;
    for (int i = 0; i < a->rank; i++) {
        /* A placeholder ("any", "match") places nothing: never the same as anything. */
        if (a->spec_dim[i] < DT__SPEC_UNSHARDED || b->spec_dim[i] < DT__SPEC_UNSHARDED)
            return 0;
        if (wide_dim(a, a->spec_dim[i]) != wide_dim(b, b->spec_dim[i]))
            return 0;
    }
    int da[DT_MESH_MAX_DIMS], db[DT_MESH_MAX_DIMS];
    dt_reduce_op oa[DT_MESH_MAX_DIMS], ob[DT_MESH_MAX_DIMS];
    int na = wide_partials(a, da, oa), nb = wide_partials(b, db, ob);
    if (na != nb)
        return 0;
    for (int i = 0; i < na; i++)
        if (da[i] != db[i] || oa[i] != ob[i])
            return 0;
    return 1;
}

int64_t dt_layout_num_shards(const dt_layout *layout, int dim)
{
    if (!layout || dim < 0 || dim >= layout->rank)
        return 0;
    int d = layout->spec_dim[dim];
    return d < 0 ? 1 : layout->mesh_dim_size[d];
}
