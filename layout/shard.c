/* Shard math: which block of a global tensor each mesh position holds (uneven splits give the
 * first n % k shards one extra element), block indices and the positions that share a block. */
#include "layout/layout_impl.h"
#include "runtime/error.h"

void dt_shard_range(int64_t n, int64_t k, int64_t j, int64_t *offset_out, int64_t *size_out)
{
    int64_t off = 0, size = 0;
    if (n >= 0 && k >= 1 && j >= 0 && j < k) {
        int64_t q = n / k, r = n % k;
        size = q + (j < r ? 1 : 0);
        off = j * q + (j < r ? j : r);
    }
    if (offset_out)
        *offset_out = off;
    if (size_out)
        *size_out = size;
}

/* Coordinate of `position` along mesh dim d (row-major: the last dim varies fastest). */
static int64_t mesh_coord(const dt_layout *l, int d, int64_t position)
{
    int64_t stride = 1;
    for (int e = l->mesh_rank - 1; e > d; e--)
        stride *= l->mesh_dim_size[e];
    return (position / stride) % l->mesh_dim_size[d];
}

int64_t dt__layout_shard_coord(const dt_layout *layout, int dim, int64_t position)
{
    int d = layout->spec_dim[dim];
    return d < 0 ? 0 : mesh_coord(layout, d, position);
}

static dt_status check_position(const dt_layout *layout, int64_t position, const char *fn)
{
    if (!layout)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL layout", fn);
    if (position < 0 || position >= layout->mesh_size)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "%s: mesh position %lld out of range 0..%lld", fn, (long long)position,
                         (long long)layout->mesh_size - 1);
    return DT_OK;
}

dt_status dt_layout_shard(const dt_layout *layout, const int64_t *shape, int64_t position,
                          int64_t *offset_out, int64_t *shape_out)
{
    /* This is where every tensor creation asks for its shards, so a placeholder or the empty
     * layout is refused here with the reason. */
    dt_status st = dt_layout_check_concrete(layout);
    if (st == DT_OK)
        st = check_position(layout, position, "dt_layout_shard");
    if (st != DT_OK)
        return st;
    if (layout->rank > 0 && !shape)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_layout_shard: NULL shape for rank %d",
                         layout->rank);
    for (int i = 0; i < layout->rank; i++)
        if (shape[i] < 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "dt_layout_shard: shape[%d] = %lld is negative", i,
                             (long long)shape[i]);
    for (int i = 0; i < layout->rank; i++) {
        int64_t off, size;
        dt_shard_range(shape[i], dt_layout_num_shards(layout, i),
                       dt__layout_shard_coord(layout, i, position), &off, &size);
        if (offset_out)
            offset_out[i] = off;
        if (shape_out)
            shape_out[i] = size;
    }
    return DT_OK;
}

int64_t dt_layout_block_index(const dt_layout *layout, int64_t position)
{
    if (!layout || position < 0 || position >= layout->mesh_size)
        return -1;
    int64_t block = 0;
    for (int i = 0; i < layout->rank; i++)
        block = block * dt_layout_num_shards(layout, i) +
                dt__layout_shard_coord(layout, i, position);
    return block;
}

dt_status dt_layout_replicas(const dt_layout *layout, int64_t position, int64_t cap,
                             int64_t *positions_out, int64_t *count_out)
{
    dt_status st = check_position(layout, position, "dt_layout_replicas");
    if (st != DT_OK)
        return st;
    if (cap < 0 || (cap > 0 && !positions_out) || !count_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_layout_replicas: bad output (cap %lld, positions_out %s, "
                         "count_out %s)",
                         (long long)cap, positions_out ? "set" : "NULL",
                         count_out ? "set" : "NULL");

    /* The replicas share the coordinates of every mesh dim that shards a tensor dim and take
     * any value on the others (partial dims included). Walking the free dims like an
     * odometer, last dim fastest, visits them in increasing position order. */
    int fixed[DT_MESH_MAX_DIMS] = {0};
    int64_t coord[DT_MESH_MAX_DIMS], stride[DT_MESH_MAX_DIMS];
    int64_t total = 1;
    for (int i = 0; i < layout->rank; i++)
        if (layout->spec_dim[i] >= 0)
            fixed[layout->spec_dim[i]] = 1;
    int64_t s = 1;
    for (int d = layout->mesh_rank - 1; d >= 0; d--) {
        stride[d] = s;
        s *= layout->mesh_dim_size[d];
        coord[d] = fixed[d] ? mesh_coord(layout, d, position) : 0;
        if (!fixed[d])
            total *= layout->mesh_dim_size[d];
    }
    for (int64_t n = 0; n < total && n < cap; n++) {
        int64_t p = 0;
        for (int d = 0; d < layout->mesh_rank; d++)
            p += coord[d] * stride[d];
        positions_out[n] = p;
        for (int d = layout->mesh_rank - 1; d >= 0; d--) {
            if (fixed[d])
                continue;
            if (++coord[d] < layout->mesh_dim_size[d])
                break;
            coord[d] = 0;
        }
    }
    *count_out = total;
    return DT_OK;
}
