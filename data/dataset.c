/* Datasets: checking the layouts and options, the host layouts of a GPU mesh, agreeing on the
 * creation over the mesh's client group, and teardown. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"
#include "mesh/mesh_group.h"
#include "runtime/error.h"

static const char fn[] = "dt_dataset_create";

/* Deterministic checks (the same answer on every client given the same arguments). */
static dt_status check_args(const dt_data_source *src, int n, const dt_layout *const *layouts,
                            const dt_dataset_opts *o)
{
    if (!src || !layouts)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL source or layouts", fn);
    if (n != src->nfields)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %d layouts for a source of %d fields", fn,
                         n, src->nfields);
    if (o->global_batch < 1 || o->prefetch < 0 || o->prefetch > 64 || o->epochs < 0 ||
        (o->shuffle != 0 && o->shuffle != 1) || (o->drop_remainder != 0 && o->drop_remainder != 1))
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "%s: bad options (global_batch %lld >= 1, prefetch %d in 0..64, epochs "
                         "%lld >= 0, shuffle %d and drop_remainder %d 0 or 1)", fn,
                         (long long)o->global_batch, o->prefetch, (long long)o->epochs,
                         o->shuffle, o->drop_remainder);
    if (o->drop_remainder && o->global_batch > src->n)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "%s: global_batch %lld exceeds the %lld examples and drop_remainder is "
                         "set: no batch would be delivered", fn, (long long)o->global_batch,
                         (long long)src->n);
    if (src->n == 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: the source has no examples", fn);
    for (int k = 0; k < n; k++) {
        const dt_layout *l = layouts[k];
        if (!l)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: layout %d is NULL", fn, k);
        if (!dt_mesh_equal(dt_layout_mesh(l), dt_layout_mesh(layouts[0])))
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: layout %d is on another mesh than "
                             "layout 0", fn, k);
        if (dt_layout_rank(l) != 1 + src->fields[k].rank)
            return dt__error(DT_ERR_SHAPE, "%s: layout %d has rank %d; field %d needs %d (the "
                             "batch dim, then the field's %d)", fn, k, dt_layout_rank(l), k,
                             1 + src->fields[k].rank, src->fields[k].rank);
        if (dt_layout_num_partial(l) > 0)
            return dt__error(DT_ERR_UNSUPPORTED, "%s: layout %d is partial", fn, k);
        for (int d = 1; d < dt_layout_rank(l); d++)
            if (dt_layout_spec_mesh_dim(l, d) >= 0)
                return dt__error(DT_ERR_UNSUPPORTED,
                                 "%s: layout %d shards dim %d on '%s'; only the batch dim (0) "
                                 "may be sharded (relayout a delivered batch instead)", fn, k,
                                 d, dt_layout_spec(l, d));
    }
    return DT_OK;
}

/* Everything local: positions, slots, the order buffer, a GPU mesh's local devices. */
static dt_status setup(dt_dataset *ds)
{
    ds->pos = malloc((size_t)ds->nlocal * sizeof *ds->pos);
    ds->perm = malloc((size_t)ds->src->n * sizeof *ds->perm);
    ds->nslots = ds->o.prefetch > 0 ? ds->o.prefetch : 1;
    ds->slots = calloc((size_t)ds->nslots, sizeof *ds->slots);
    if (!ds->pos || !ds->perm || !ds->slots)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    for (int i = 0; i < ds->nslots; i++)
        if (!(ds->slots[i].bufs = calloc((size_t)(ds->nout * ds->nlocal), sizeof(void *))))
            return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    for (int d = 0; d < ds->nlocal; d++)
        ds->pos[d] = dt_mesh_position(ds->mesh, dt_mesh_local_device_id(ds->mesh, d));
    if (!ds->gpu)
        return DT_OK;
    ds->devs = calloc((size_t)ds->nlocal + 1, sizeof *ds->devs);
    if (!ds->devs)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    for (int d = 0; d < ds->nlocal; d++)
        if (!(ds->devs[d] = dt__device_by_id(DT_DEVICE_GPU,
                                             dt_mesh_local_device_id(ds->mesh, d))))
            return dt__error(DT_ERR_STATE, "%s: local device %d of mesh '%s' not found", fn, d,
                             dt_mesh_name(ds->mesh));
    for (int i = 0; i < ds->nslots; i++)
        if (!(ds->slots[i].dbytes = calloc((size_t)(ds->nout * ds->nlocal), sizeof(size_t))))
            return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    return DT_OK;
}

dt_status dt_dataset_create(dt_data_source *source, int n, const dt_layout *const *layouts,
                            const dt_dataset_opts *opts, dt_dataset **dataset_out)
{
    if (!opts || !dataset_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL opts or dataset_out", fn);
    dt_status st = check_args(source, n, layouts, opts);
    const dt_mesh *mesh = layouts && n >= 1 && layouts[0] ? dt_layout_mesh(layouts[0]) : NULL;
    if (st == DT_OK)
        st = dt_mesh_check_devices(mesh);
    if (st != DT_OK) {
        /* This client's options or layouts: its failure is every mesh client's, agreed where
         * the others agree on theirs (below), so that none waits there for it. */
        if (mesh && dt_is_initialized())
            st = dt__mesh_agree(mesh, st, "dt_dataset_create: agreeing");
        return st;
    }
    if (dt_mesh_num_local_devices(mesh) < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: this client holds no device of the mesh "
                         "(only the mesh's clients call it)", fn);
    dt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    if ((st = dt__mesh_group(mesh, &ds->group)) != DT_OK) {
        free(ds);
        return st;
    }
    pthread_mutex_init(&ds->mu, NULL);
    pthread_cond_init(&ds->cv, NULL);
    ds->src = dd_source_retain(source);
    ds->nout = n;
    ds->mesh = dt_mesh_retain(mesh);
    ds->nlocal = dt_mesh_num_local_devices(mesh);
    ds->gpu = dt_mesh_device_type(mesh) == DT_DEVICE_GPU;
    ds->o = *opts;
    ds->bpe = opts->drop_remainder ? source->n / opts->global_batch
                                   : (source->n + opts->global_batch - 1) / opts->global_batch;
    ds->perm_epoch = -1;
    for (int k = 0; k < n; k++)
        ds->layouts[k] = dt_layout_retain(layouts[k]);
    st = setup(ds);
    /* A client that failed locally fails the creation everywhere, with its message. */
    st = dt__mesh_agree(mesh, st, "dt_dataset_create: agreeing");
    if (st != DT_OK) {
        dt_dataset_destroy(ds);
        return st;
    }
    *dataset_out = ds;
    return DT_OK;
}

void dt_dataset_destroy(dt_dataset *ds)
{
    if (!ds)
        return;
    if (ds->slots) {
        dd_stop(ds);
        for (int i = 0; i < ds->nslots; i++) {
            free(ds->slots[i].bufs);
            free(ds->slots[i].dbytes);
        }
        free(ds->slots);
    }
    pthread_cond_destroy(&ds->cv);
    pthread_mutex_destroy(&ds->mu);
    for (int k = 0; k < ds->nout; k++)
        dt_layout_destroy(ds->layouts[k]);
    free(ds->devs);
    dt_mesh_destroy(ds->mesh);
    dt_data_source_destroy(ds->src);
    free(ds->pos);
    free(ds->perm);
    free(ds->names);
    free(ds);
}
