/* dt_restore and dt_restore_into: every client opens the index, and each of its devices reads
 * exactly the chunks of the saved slices its target shard intersects (replicas on one client
 * are read once and copied). Components host code may touch are read into directly; the
 * others (GPU memory) through bounded staging (upload.c). A target of another dtype is filled
 * through a tensor of the saved dtype on its own mesh, then cast there. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "dtensor/ops.h" /* dt_cast */
#include "layout/tensor_dev.h"
#include "mesh/mesh_group.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"
#include "runtime/trace.h"

/* Fills every local component of `t` (on any mesh) with saved tensor `ti`: those host code
 * may touch directly, the others into *fills (staged later); a replica of a block held by an
 * earlier local component is marked in copy_from[i] (copied once all are filled). */
static dt_status read_tensor_local(ck_reader *rd, int64_t ti, dt_tensor *t, ck_fill *fills,
                                   int64_t *nfills, int *copy_from)
{
    const ck_tensor *ct = &rd->ck->tensors[ti];
    const dt_layout *l = dt_tensor_layout(t);
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *x = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        const dt__device *dev = dt__tensor_device(t, i);
        copy_from[i] = -1;
        if (dt__numel(ct->rank, x->shape) == 0)
            continue;
        int64_t blk = dt_layout_block_index(l, dt_tensor_local_position(t, i));
        for (int j = 0; j < i && copy_from[i] < 0; j++)
            if (dt_layout_block_index(l, dt_tensor_local_position(t, j)) == blk)
                copy_from[i] = j;
        if (copy_from[i] >= 0)
            continue;
        if (!dev->kind->host_visible) {
            fills[(*nfills)++] = (ck_fill){.ti = ti, .dev = dev, .data = x->data, .off = off,
                                           .shape = x->shape};
            continue;
        }
        int64_t first, end;
        dt__ckpt_slices_near(ct, off, x->shape, &first, &end);
        for (int64_t k = first; k < end; k++) {
            dt_status st = dt__ckpt_read_box(rd, ti, ct->order[k], off, x->shape, x->data);
            if (st != DT_OK)
                return st;
        }
    }
    return DT_OK;
}

/* Copies component `from` of `src` into component i of `dst` (same shape) on the device of
 * dst's component (a peer copy when the two differ). */
static dt_status copy_component(const dt_tensor *src, int from, dt_tensor *dst, int i)
{
    const DLTensor *x = dt_tensor_local(src, from);
    size_t bytes = (size_t)dt__numel(x->ndim, x->shape) * dt_dtype_size(dt_tensor_dtype(dst));
    const dt__device *d = dt__tensor_device(dst, i);
    return d->kind->copy(d, DT__COPY_D2D, dt_tensor_local(dst, i)->data, x->data, bytes);
}

/* Shared body: `targets` (restore_into) or new tensors with `layouts` into `out`. */
static dt_status restore(const char *fn, const dt_mesh *mesh, const char *dir, int n,
                         const char *const *names, const dt_layout *const *layouts,
                         dt_tensor *const *targets, dt_tensor **out)
{
    /* The arguments are this client's: a failure here goes on to the one agreement below
     * (every step on the way is skipped), so the others do not wait for it there. */
    dt_status st = dt_mesh_check_devices(mesh);
    for (int t = 0; st == DT_OK && t < n; t++) {
        if (!names[t] || !layouts[t])
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL name or layout %d", fn, t);
        else if (!dt_mesh_equal(dt_layout_mesh(layouts[t]), mesh))
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is not on the mesh", fn,
                           names[t]);
        else if (dt_layout_num_partial(layouts[t]) > 0)
            st = dt__error(DT_ERR_INVALID_ARGUMENT,
                           "%s: tensor '%s': cannot restore into a partial layout", fn, names[t]);
    }
    const dt__group *g = NULL;
    dt_status gst = dt__mesh_group(mesh, &g);
    if (gst != DT_OK)
        return gst;
    dt_ckpt *ck = NULL;
    ck_reader rd;
    int have_rd = 0;
    int nlocal = dt_mesh_num_local_devices(mesh);
    dt_tensor **filled = calloc((size_t)n + 1, sizeof *filled);
    int64_t *idx = calloc((size_t)n + 1, sizeof *idx);
    ck_fill *fills = calloc((size_t)n * (size_t)nlocal + 1, sizeof *fills);
    int *copy_from = calloc((size_t)n * (size_t)nlocal + 1, sizeof *copy_from);
    int64_t nfills = 0;
    uint64_t bound = 0;
    if (st == DT_OK && (!filled || !idx || !fills || !copy_from))
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    if (st == DT_OK)
        st = dt_ckpt_open(dir, &ck);
    if (st == DT_OK && (st = dt__ckpt_reader_init(&rd, ck)) == DT_OK)
        have_rd = 1;
    for (int t = 0; st == DT_OK && t < n; t++) {
        if ((st = dt_ckpt_find(ck, names[t], &idx[t])) != DT_OK)
            break;
        const ck_tensor *ct = &ck->tensors[idx[t]];
        if (dt_layout_rank(layouts[t]) != ct->rank) {
            st = dt__error(DT_ERR_SHAPE, "%s: tensor '%s' was saved with rank %d, the layout "
                           "has rank %d", fn, names[t], ct->rank, dt_layout_rank(layouts[t]));
            break;
        }
        if (targets) {
            const int64_t *shape = dt_tensor_shape(targets[t]);
            int same = dt__ckpt_castable(ct->dtype, dt_tensor_dtype(targets[t]));
            for (int d = 0; d < ct->rank; d++)
                same &= shape[d] == ct->shape[d];
            if (!same) {
                char a[160], b[160];
                st = dt__error(DT_ERR_SHAPE, "%s: tensor '%s' was saved as %s %s, the target "
                               "is %s %s", fn, names[t], dt_dtype_name(ct->dtype),
                               dt__shape_str(ct->rank, ct->shape, a, sizeof a),
                               dt_dtype_name(dt_tensor_dtype(targets[t])),
                               dt__shape_str(ct->rank, shape, b, sizeof b));
                break;
            }
        }
        /* The target itself, or a new tensor of the saved dtype on the target's layout. */
        if (targets && dt_tensor_dtype(targets[t]) == ct->dtype)
            filled[t] = dt_tensor_retain(targets[t]);
        else if ((st = dt__tensor_empty(layouts[t], ct->dtype, ct->shape, &filled[t])) != DT_OK)
            break;
        st = read_tensor_local(&rd, idx[t], filled[t], fills, &nfills,
                               copy_from + (size_t)t * (size_t)nlocal);
    }
    if (st == DT_OK && nfills > 0 && (st = dt__ckpt_device_staging(fn, &bound)) == DT_OK)
        st = dt__ckpt_upload(ck, fills, nfills, bound);
    /* Replicas, casts and copies into the targets, on the devices. */
    for (int t = 0; st == DT_OK && t < n; t++) {
        const int *cf = copy_from + (size_t)t * (size_t)nlocal;
        for (int i = 0; st == DT_OK && i < dt_tensor_num_local(filled[t]); i++)
            if (cf[i] >= 0)
                st = copy_component(filled[t], cf[i], filled[t], i);
        if (st == DT_OK)
            st = dt__device_sync_all(dt_mesh_device_type(mesh));
        if (st != DT_OK || !targets || filled[t] == targets[t])
            continue;
        dt_tensor *c = NULL;
        st = dt_cast(filled[t], dt_tensor_dtype(targets[t]), &c);
        for (int i = 0; st == DT_OK && i < dt_tensor_num_local(c); i++)
            st = copy_component(c, i, targets[t], i);
        if (st == DT_OK)
            st = dt__device_sync_all(dt_mesh_device_type(mesh));
        dt_tensor_destroy(c);
    }
    long tk = g->comm != MPI_COMM_NULL ? dt__coll_record(g->clients, g->size, "ckpt restore", "") : -1;
    st = dt__ckpt_agree(g, st);
    dt__coll_end(tk, "mpi", st);
    if (st == DT_OK && out)
        for (int t = 0; t < n; t++) {
            out[t] = filled[t];
            filled[t] = NULL;
        }
    for (int t = 0; filled && t < n; t++)
        dt_tensor_destroy(filled[t]);
    free(filled);
    free(idx);
    free(fills);
    free(copy_from);
    if (have_rd)
        dt__ckpt_reader_free(&rd);
    dt_ckpt_close(ck);
    return st;
}

dt_status dt_restore(const dt_mesh *mesh, const char *dir, int n, const char *const *names,
                     const dt_layout *const *layouts, dt_tensor **tensors_out)
{
    if (!mesh || n < 0 || (n > 0 && (!names || !layouts || !tensors_out)))
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_restore: NULL mesh, names, layouts or outputs, or n < 0");
    return restore("dt_restore", mesh, dir, n, names, layouts, NULL, tensors_out);
}

dt_status dt_restore_into(const char *dir, int n, const char *const *names,
                          dt_tensor *const *tensors)
{
    if (n <= 0 || !names || !tensors)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_restore_into: no tensors");
    const dt_layout **layouts = calloc((size_t)n, sizeof *layouts);
    if (!layouts)
        return dt__error(DT_ERR_NO_MEMORY, "dt_restore_into: no memory");
    /* A NULL tensor on one client goes on to restore's checks, which the mesh's clients agree
     * on (the mesh from any other tensor): it fails there on all of them. */
    const dt_mesh *mesh = NULL;
    for (int t = 0; t < n; t++) {
        layouts[t] = tensors[t] ? dt_tensor_layout(tensors[t]) : NULL;
        if (!mesh && layouts[t])
            mesh = dt_layout_mesh(layouts[t]);
    }
    if (!mesh) {
        free(layouts);
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_restore_into: every tensor is NULL");
    }
    dt_status st = restore("dt_restore_into", mesh, dir, n, names, layouts, tensors, NULL);
    free(layouts);
    return st;
}
