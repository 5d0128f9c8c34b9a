/* Preparing one global batch on this client: the rows each local device holds, read once per
 * distinct row range straight into the first holder's buffer and copied to the other holders. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"
#include "runtime/error.h"

void dd_slot_clear(const dt_dataset *ds, dd_slot *slot)
{
    for (int i = 0; slot->bufs && i < ds->nout * ds->nlocal; i++) {
        if (slot->on_device)
            dt__device_free(ds->devs[i % ds->nlocal], slot->bufs[i], slot->dbytes[i]);
        else
            dt_host_free(slot->bufs[i]);
        slot->bufs[i] = NULL;
    }
    slot->on_device = 0;
    slot->ready = 0;
    slot->end = 0;
    slot->st = DT_OK;
    slot->msg[0] = '\0';
}

/* The global batch's shape for output k with `rows` rows. */
static void batch_shape(const dt_dataset *ds, int k, int64_t rows, int64_t *shape)
{
    const dt_data_field *f = &ds->src->fields[k];
    shape[0] = rows;
    for (int i = 0; i < f->rank; i++)
        shape[1 + i] = f->shape[i];
}

static dt_status fill_rows(dt_dataset *ds, const int64_t *idx, int64_t rows, dd_slot *slot)
{
    int nout = ds->nout, nl = ds->nlocal;
    int64_t off[DT_MAX_RANK], size[DT_MAX_RANK];
    /* Row range [r0p[i], r0p[i] + rnp[i]) of every (output k, device d), i = k * nl + d. */
    int64_t *r0p = malloc((size_t)(nout * nl) * sizeof *r0p);
    int64_t *rnp = malloc((size_t)(nout * nl) * sizeof *rnp);
    unsigned char *donep = calloc((size_t)(nout * nl), 1);
    dt_status st = DT_OK;
    if (!r0p || !rnp || !donep) {
        st = dt__error(DT_ERR_NO_MEMORY, "dataset: no memory");
        goto out;
    }
    for (int k = 0; k < nout; k++) {
        int64_t shape[DT_MAX_RANK];
        batch_shape(ds, k, rows, shape);
        for (int d = 0; d < nl; d++) {
            int i = k * nl + d;
            if ((st = dt_layout_shard(ds->layouts[k], shape, ds->pos[d], off, size)) != DT_OK)
                goto out;
            r0p[i] = off[0];
            rnp[i] = size[0];
            size_t bytes = (size_t)rnp[i] * ds->src->field_bytes[k];
            if ((st = dt_host_alloc(bytes ? bytes : 1, &slot->bufs[i])) != DT_OK)
                goto out;
            donep[i] = rnp[i] == 0;
        }
    }
    for (int i = 0; i < nout * nl; i++) {
        if (donep[i])
            continue;
        /* Every output with a device holding this very range reads it in the same call. */
        int64_t a = r0p[i], n = rnp[i];
        void *dst[DT_DATA_MAX_FIELDS] = {NULL};
        int first[DT_DATA_MAX_FIELDS];
        for (int k = 0; k < nout; k++) {
            first[k] = -1;
            for (int d = 0; d < nl && first[k] < 0; d++)
                if (!donep[k * nl + d] && r0p[k * nl + d] == a && rnp[k * nl + d] == n) {
                    first[k] = d;
                    dst[k] = slot->bufs[k * nl + d];
                }
        }
        if ((st = ds->src->ops->read(ds->src, idx + a, n, dst)) != DT_OK)
            goto out;
        for (int k = 0; k < nout; k++) {
            if (first[k] < 0)
                continue;
            size_t bytes = (size_t)n * ds->src->field_bytes[k];
            for (int d = first[k]; d < nl; d++) {
                int j = k * nl + d;
                if (donep[j] || r0p[j] != a || rnp[j] != n)
                    continue;
                if (d != first[k])
                    memcpy(slot->bufs[j], dst[k], bytes);
                donep[j] = 1;
            }
        }
    }
out:
    free(r0p);
    free(rnp);
    free(donep);
    return st;
}

void dd_fill(dt_dataset *ds, int64_t epoch, int64_t batch, dd_slot *slot)
{
    slot->epoch = epoch;
    slot->batch = batch;
    slot->rows = 0;
    slot->end = 0;
    slot->st = DT_OK;
    slot->msg[0] = '\0';
    if (ds->o.epochs > 0 && epoch >= ds->o.epochs) {
        slot->end = 1;
        return;
    }
    int64_t n = ds->src->n, b = ds->o.global_batch, start = batch * b;
    slot->rows = n - start < b ? n - start : b;
    if (ds->perm_epoch != epoch) {
        dd_epoch_order(ds->o.seed, epoch, ds->o.shuffle, n, ds->perm);
        ds->perm_epoch = epoch;
    }
    dt_clear_error();
    dt_status st = fill_rows(ds, ds->perm + start, slot->rows, slot);
    if (st != DT_OK) {
        const char *msg = dt_last_error();
        dd_slot_clear(ds, slot);
        slot->st = st;
        snprintf(slot->msg, sizeof slot->msg, "%s", msg[0] ? msg : dt_status_str(st));
        slot->epoch = epoch;
        slot->batch = batch;
    }
}
