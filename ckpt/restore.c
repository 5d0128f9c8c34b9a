/* dt_restore and dt_restore_into: every client opens the index, and each of its devices reads
 * exactly the chunks of the saved slices its target shard intersects (replicas on one client
 * are read once and copied); GPU targets are filled through their host mesh. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "dtensor/ops.h" /* dt_cast */
#include "runtime/device.h"

/* Fills every local component of the host tensor `t` with saved tensor `ti`. */
static dt_status read_tensor_local(ck_reader *rd, int64_t ti, dt_tensor *t)
{
    const ck_tensor *ct = &rd->ck->tensors[ti];
    const dt_layout *l = dt_tensor_layout(t);
    int nl = dt_tensor_num_local(t);
    size_t elem = dt_dtype_size(ct->dtype);
    for (int i = 0; i < nl; i++) {
        const DLTensor *x = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        int64_t numel = dt__numel(ct->rank, x->shape);
        if (numel == 0)
            continue;
        int64_t blk = dt_layout_block_index(l, dt_tensor_local_position(t, i));
        int done = 0;
        for (int j = 0; j < i && !done; j++)
            if (dt_layout_block_index(l, dt_tensor_local_position(t, j)) == blk) {
                memcpy(x->data, dt_tensor_local(t, j)->data, (size_t)numel * elem);
                done = 1;
            }
        for (int64_t s = 0; !done && s < ct->nslices; s++) {
            dt_status st = dt__ckpt_read_box(rd, ti, s, off, x->shape, x->data);
            if (st != DT_OK)
                return st;
        }
    }
    return DT_OK;
}

/* Host-mesh, same-spec layout of `l` (itself, retained, on a CPU mesh). */
static dt_status host_layout(const dt_layout *l, dt_layout **out)
{
    const dt_mesh *m = dt_layout_mesh(l);
    if (dt_mesh_device_type(m) == DT_DEVICE_CPU) {
        *out = dt_layout_retain(l);
        return DT_OK;
    }
    dt_mesh *host;
    dt_status st = dt_mesh_host_mesh(m, &host);
    if (st != DT_OK)
        return st;
    const char *specs[DT_MAX_RANK];
    for (int d = 0; d < dt_layout_rank(l); d++)
        specs[d] = dt_layout_spec(l, d);
    st = dt_layout_create(host, dt_layout_rank(l), specs, out);
    dt_mesh_destroy(host);
    return st;
}

/* The host tensor `h` (saved dtype) cast to the target's dtype, replacing *h_out; when it is
 * on the target's own mesh, also copied into the target's components (same layout, so the
 * same components); otherwise the copy to the target's mesh below delivers it. */
static dt_status cast_host(dt_tensor *h, dt_tensor *target, dt_tensor **h_out)
{
    dt_tensor *c = NULL;
    dt_status st = dt_cast(h, dt_tensor_dtype(target), &c);
    if (st != DT_OK)
        return st;
    size_t elem = dt_dtype_size(dt_tensor_dtype(c));
    int here = dt_mesh_equal(dt_layout_mesh(dt_tensor_layout(c)),
                             dt_layout_mesh(dt_tensor_layout(target)));
    for (int i = 0; here && i < dt_tensor_num_local(c); i++) {
        const DLTensor *src = dt_tensor_local(c, i);
        memcpy(dt_tensor_local(target, i)->data, src->data,
               (size_t)dt__numel(src->ndim, src->shape) * elem);
    }
    dt_tensor_destroy(h);
    *h_out = c;
    return DT_OK;
}

/* Shared body: `targets` (restore_into) or new tensors with `layouts` into `out`. */
static dt_status restore(const char *fn, const dt_mesh *mesh, const char *dir, int n,
                         const char *const *names, const dt_layout *const *layouts,
                         dt_tensor *const *targets, dt_tensor **out)
{
    dt_status st = dt_mesh_check_devices(mesh);
    if (st != DT_OK)
        return st;
    for (int t = 0; t < n; t++) {
        if (!names[t] || !layouts[t])
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL name or layout %d", fn, t);
        if (!dt_mesh_equal(dt_layout_mesh(layouts[t]), mesh))
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is not on the mesh",
                             fn, names[t]);
        if (dt_layout_num_partial(layouts[t]) > 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "%s: tensor '%s': cannot restore into a partial layout", fn,
                             names[t]);
    }
    ck_group g;
    if ((st = dt__ckpt_group_create(mesh, &g)) != DT_OK)
        return st;
    int gpu = dt_mesh_device_type(mesh) != DT_DEVICE_CPU;
    dt_ckpt *ck = NULL;
    ck_reader rd;
    int have_rd = 0;
    dt_tensor **host = calloc((size_t)n + 1, sizeof *host);
    int64_t *idx = calloc((size_t)n + 1, sizeof *idx);
    if (!host || !idx)
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
        int cast = targets && dt_tensor_dtype(targets[t]) != ct->dtype;
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
        if (targets && !gpu && !cast) {
            host[t] = dt_tensor_retain(targets[t]);
        } else {
            dt_layout *hl = NULL;
            if ((st = host_layout(layouts[t], &hl)) != DT_OK)
                break;
            st = dt__tensor_empty(hl, ct->dtype, ct->shape, &host[t]);
            dt_layout_destroy(hl);
            if (st != DT_OK)
                break;
        }
        st = read_tensor_local(&rd, idx[t], host[t]);
        if (st == DT_OK && cast)
            st = cast_host(host[t], targets[t], &host[t]);
    }
    st = dt__ckpt_agree(&g, st);
    /* GPU meshes: host copies go to their devices (collective), then into targets. */
    for (int t = 0; st == DT_OK && gpu && t < n; t++) {
        dt_tensor *dev = NULL;
        st = dt_copy_to_mesh(host[t], layouts[t], &dev);
        if (st == DT_OK && targets) {
            size_t elem = dt_dtype_size(dt_tensor_dtype(dev));
            for (int i = 0; st == DT_OK && i < dt_tensor_num_local(dev); i++) {
                const DLTensor *src = dt_tensor_local(dev, i);
                size_t bytes = (size_t)dt__numel(src->ndim, src->shape) * elem;
                const dt__device *d = dt__tensor_device(targets[t], i);
                st = d->kind->copy(d, DT__COPY_D2D, dt_tensor_local(targets[t], i)->data,
                                   src->data, bytes);
                if (st == DT_OK)
                    st = d->kind->sync(d);
            }
            dt_tensor_destroy(dev);
            dev = NULL;
        }
        dt_tensor_destroy(host[t]);
        host[t] = dev;
    }
    if (gpu)
        st = dt__ckpt_agree(&g, st);
    if (st == DT_OK && out)
        for (int t = 0; t < n; t++) {
            out[t] = host[t];
            host[t] = NULL;
        }
    for (int t = 0; host && t < n; t++)
        dt_tensor_destroy(host[t]);
    free(host);
    free(idx);
    if (have_rd)
        dt__ckpt_reader_free(&rd);
    dt_ckpt_close(ck);
    dt__ckpt_group_free(&g);
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
    for (int t = 0; t < n; t++) {
        if (!tensors[t]) {
            free(layouts);
            return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_restore_into: tensor %d is NULL", t);
        }
        layouts[t] = dt_tensor_layout(tensors[t]);
    }
    dt_status st = restore("dt_restore_into", dt_layout_mesh(layouts[0]), dir, n, names,
                           layouts, tensors, NULL);
    free(layouts);
    return st;
}
