/* The GPU side of the prefetch: a batch prepared in host buffers goes onto the mesh's devices
 * in the thread that prepared it (the prefetch thread), so dt_dataset_next hands out device
 * tensors without a copy of its own. Device buffers come from the device pool (the cache of
 * freed blocks in front of the kind's alloc, runtime/device_pool.c); at most the ring's slots
 * plus the batches the caller still holds are allocated at once. Each copy is the kind's H2D
 * copy, ordered on the device's stream and complete on the host side when it returns. */
#include <stdio.h>
#include <stdlib.h>

#include "data/data_impl.h"

void dd_upload(dt_dataset *ds, dd_slot *slot)
{
    if (!ds->gpu || slot->st != DT_OK || slot->end || slot->on_device)
        return;
    int nl = ds->nlocal, n = ds->nout * nl;
    void **dev = calloc((size_t)n + 1, sizeof *dev);
    dt_status st = dev ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "dataset: no memory");
    for (int i = 0; i < n && st == DT_OK; i++) {
        int k = i / nl, d = i % nl;
        const dt_data_field *f = &ds->src->fields[k];
        int64_t shape[DT_MAX_RANK], off[DT_MAX_RANK], size[DT_MAX_RANK];
        shape[0] = slot->rows;
        for (int j = 0; j < f->rank; j++)
            shape[1 + j] = f->shape[j];
        if ((st = dt_layout_shard(ds->layouts[k], shape, ds->pos[d], off, size)) != DT_OK)
            break;
        size_t bytes = (size_t)size[0] * ds->src->field_bytes[k];
        slot->dbytes[i] = bytes ? bytes : 1;
        if ((st = dt__device_alloc(ds->devs[d], slot->dbytes[i], &dev[i])) == DT_OK && bytes)
            st = ds->devs[d]->kind->copy(ds->devs[d], DT__COPY_H2D, dev[i], slot->bufs[i],
                                         bytes);
    }
    if (st != DT_OK) {
        for (int i = 0; dev && i < n; i++)
            if (dev[i])
                dt__device_free(ds->devs[i % nl], dev[i], slot->dbytes[i]);
        slot->st = st;
        snprintf(slot->msg, sizeof slot->msg, "%s", dt_last_error());
        free(dev);
        return;
    }
    for (int i = 0; i < n; i++) {
        dt_host_free(slot->bufs[i]);
        slot->bufs[i] = dev[i];
    }
    slot->on_device = 1;
    free(dev);
}
