/* ops/host_transfer: tensors from and to whole row-major host arrays (ops_general.h):
 * dt_tensor_from_host (each device copies its block), dt_tensor_scatter_from (the root's
 * array broadcast over the mesh's clients, then as from_host), dt_tensor_to_host (a relayout
 * to replicated, then one local copy). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "mesh/mesh_group.h"
#include "ops/shape_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"

/* Copies the block at `off` of extent `len` out of the global array `src` of `shape` into
 * the compact buffer dst. */
static void copy_block(int rank, const int64_t *shape, const int64_t *off, const int64_t *len,
                       size_t es, const char *src, char *dst)
{
    int64_t gs[DT_MAX_RANK], c[DT_MAX_RANK] = {0}, n = 1;
    dt__strides(rank, shape, gs);
    for (int d = 0; d < rank; d++)
        n *= len[d];
    if (n == 0)
        return;
    /* Runs along the last dim; coordinates of the dims before it advance as an odometer. */
    int64_t row = rank ? len[rank - 1] : 1;
    for (int64_t k = 0; k < n; k += row) {
        int64_t g = 0;
        for (int d = 0; d < rank; d++)
            g += (off[d] + c[d]) * gs[d];
        memcpy(dst + (size_t)k * es, src + (size_t)g * es, (size_t)row * es);
        for (int d = rank - 2; d >= 0; d--) {
            if (++c[d] < len[d])
                break;
            c[d] = 0;
        }
    }
}

/* 1 if the device at `position` holds the value of a sum-partial layout (its coordinate is 0
 * on every sum-partial mesh dim; the others hold zeros, the reduction's identity). Max, min
 * and avg partial dims hold the value on every member. */
static int holds_value(const dt_layout *l, int64_t position)
{
    const dt_mesh *mesh = dt_layout_mesh(l);
    int64_t coords[DT_MESH_MAX_DIMS];
    if (dt_layout_num_partial(l) == 0 || dt_mesh_coords(mesh, position, coords) != DT_OK)
        return 1;
    for (int i = 0; i < dt_layout_num_partial(l); i++) {
        int md;
        dt_reduce_op op;
        if (dt_layout_partial(l, i, &md, &op) == DT_OK && op == DT_REDUCE_SUM && coords[md])
            return 0;
    }
    return 1;
}

dt_status dt_tensor_from_host(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                              const void *data, dt_tensor **out)
{
    if (!layout || !out || (!shape && dt_layout_rank(layout) > 0))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tensor_from_host: NULL argument");
    dt_tensor *t = NULL;
    dt_status st = dt_tensor_zeros(layout, dtype, shape, &t);
    if (st != DT_OK)
        return st;
    int rank = dt_layout_rank(layout), n = dt_tensor_num_local(t);
    size_t es = dt_dtype_size(dtype);
    if (n > 0 && dt_tensor_numel(t) > 0 && !data) {
        dt_tensor_destroy(t);
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tensor_from_host: NULL data");
    }
    void *stage = NULL;
    for (int i = 0; i < n && st == DT_OK; i++) {
        const DLTensor *dl = dt_tensor_local(t, i);
        int64_t cnt = 1, whole = 1;
        for (int d = 0; d < rank; d++) {
            cnt *= dl->shape[d];
            whole &= dl->shape[d] == shape[d];
        }
        if (cnt == 0 || !holds_value(layout, dt_tensor_local_position(t, i)))
            continue; /* zeros already */
        size_t bytes = (size_t)cnt * es;
        if (whole) {
            st = dt_tensor_local_write(t, i, data, bytes);
            continue;
        }
        if (!(stage = malloc(bytes))) {
            st = dt__error(DT_ERR_NO_MEMORY, "dt_tensor_from_host: out of memory");
            break;
        }
        copy_block(rank, shape, dt_tensor_local_offset(t, i), dl->shape, es, data, stage);
        st = dt_tensor_local_write(t, i, stage, bytes);
        free(stage);
        stage = NULL;
    }
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

/* The group rank of client `root` in g, -1 when it holds no device of the mesh. */
static int group_rank_of(const dt__group *g, int root)
{
    for (int r = 0; r < g->size; r++)
        if (g->clients[r] == root)
            return r;
    return -1;
}

/* Only `root` has the array: it is broadcast over the mesh's clients (their communicator,
 * mesh/mesh_group.h, in chunks below INT_MAX bytes, under the watchdog), then every client
 * builds the tensor as dt_tensor_from_host does. A tensor placed only on the root's devices
 * is not expressible as a layout, so this is the simplest correct way; it moves the whole
 * array to every client once. */
dt_status dt_tensor_scatter_from(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                                 const void *data, int root, dt_tensor **out)
{
    if (!layout || !out || (!shape && dt_layout_rank(layout) > 0))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tensor_scatter_from: NULL argument");
    const dt_mesh *mesh = dt_layout_mesh(layout);
    const dt__group *g = NULL;
    dt_status st = dt__mesh_group(mesh, &g);
    if (st != DT_OK)
        return st;
    if (g->comm == MPI_COMM_NULL) /* holds no device of the mesh: nothing to build */
        return dt_tensor_from_host(layout, dtype, shape, NULL, out);
    int groot = group_rank_of(g, root);
    if (groot < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_tensor_scatter_from: root %d holds no "
                         "device of the mesh",
                         root);
    int64_t numel = 1;
    for (int d = 0; d < dt_layout_rank(layout); d++)
        numel *= shape[d] > 0 ? shape[d] : 0;
    size_t bytes = (size_t)numel * dt_dtype_size(dtype);
    st = dt_layout_check_concrete(layout);
    if (st == DT_OK && dt_dtype_size(dtype) == 0)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tensor_scatter_from: bad dtype %d", (int)dtype);
    if (st == DT_OK && g->rank == groot && bytes && !data)
        st = dt__error(DT_ERR_INVALID_ARGUMENT,
                       "dt_tensor_scatter_from: NULL data on the "
                       "root client %d",
                       root);
    char *buf = NULL;
    if (st == DT_OK && g->rank != groot && !(buf = malloc(bytes ? bytes : 1)))
        st =
            dt__error(DT_ERR_NO_MEMORY, "dt_tensor_scatter_from: out of memory (%zu bytes)", bytes);
    st = dt__mesh_agree(mesh, st, "dt_tensor_scatter_from");
    if (st != DT_OK) {
        free(buf);
        return st;
    }
    char *p = g->rank == groot ? (char *)data : buf;
    for (size_t done = 0; done < bytes && st == DT_OK && g->size > 1;) {
        size_t chunk = bytes - done < (size_t)INT_MAX ? bytes - done : (size_t)INT_MAX;
        MPI_Request req = MPI_REQUEST_NULL;
        int rc = MPI_Ibcast(p + done, (int)chunk, MPI_BYTE, groot, g->comm, &req);
        st = rc == MPI_SUCCESS
                 ? dt__wait_watched_group(&req, g->clients, g->size, 0.0, "dt_tensor_scatter_from")
                 : dt__mpi_error(rc, "dt_tensor_scatter_from: MPI_Ibcast");
        done += chunk;
    }
    if (st == DT_OK)
        st = dt_tensor_from_host(layout, dtype, shape, p, out);
    free(buf);
    return st;
}

dt_status dt_tensor_to_host(const dt_tensor *x, int root, void *data, size_t bytes)
{
    if (!x)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tensor_to_host: NULL tensor");
    const dt_layout *l = dt_tensor_layout(x);
    const dt_mesh *mesh = dt_layout_mesh(l);
    size_t want = (size_t)dt_tensor_numel(x) * dt_dtype_size(dt_tensor_dtype(x));
    int here = root < 0 || root == dt_client_id();
    dt_status st = DT_OK;
    if (here && bytes != want)
        st = dt__error(DT_ERR_INVALID_ARGUMENT,
                       "dt_tensor_to_host: buffer of %zu bytes for "
                       "%zu",
                       bytes, want);
    else if (here && want && !data)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tensor_to_host: NULL data");
    else if (here && want && dt_tensor_num_local(x) == 0)
        st = dt__error(DT_ERR_INVALID_ARGUMENT,
                       "dt_tensor_to_host: client %d holds no "
                       "device of the tensor's mesh",
                       dt_client_id());
    /* Every client learns of a bad buffer before the relayout, so none is left waiting. */
    st = dt__mesh_agree(mesh, st, "dt_tensor_to_host");
    if (st != DT_OK)
        return st;
    const dt_tensor *r = x;
    dt_tensor *tmp = NULL;
    dt_layout *rep = NULL;
    if (!dt_layout_is_replicated(l)) {
        st = dt_layout_replicated(mesh, dt_layout_rank(l), &rep);
        if (st == DT_OK)
            st = dt_relayout(x, rep, &tmp);
        r = tmp;
    }
    if (st == DT_OK && here && want)
        st = dt_tensor_local_read(r, 0, data, bytes);
    dt_tensor_destroy(tmp);
    dt_layout_destroy(rep);
    return st;
}
