/* dt_dataset_next: takes the prepared batch, hands its buffers (host memory on a CPU mesh,
 * device memory on a GPU mesh, where the producer already copied them: upload.c) to tensors
 * without a copy (dt_tensor_pack_managed), and agrees with the other clients on the
 * outcome. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/util.h"
#include "runtime/trace.h"

enum { MSG_LEN = 1024 };

/* A buffer of the slot as a managed component; the deleter returns it to its pool (the host
 * pool, or the device's when dev is set). */
typedef struct part {
    DLManagedTensor m;
    int64_t shape[DT_MAX_RANK];
    const dt__device *dev;
    size_t bytes;
} part;

static void part_free(DLManagedTensor *m)
{
    part *p = m->manager_ctx;
    if (p->dev)
        dt__device_free(p->dev, m->dl_tensor.data, p->bytes);
    else
        dt_host_free(m->dl_tensor.data);
    free(p);
}

/* Output k of the slot as a tensor on its layout. The slot's buffers move into the tensor on
 * success; on failure they stay with the slot. */
static dt_status pack_output(dt_dataset *ds, dd_slot *slot, int k, dt_tensor **out)
{
    const dt_layout *l = ds->layouts[k];
    const dt_data_field *f = &ds->src->fields[k];
    int nl = ds->nlocal, rank = 1 + f->rank;
    int64_t shape[DT_MAX_RANK], off[DT_MAX_RANK];
    shape[0] = slot->rows;
    for (int i = 0; i < f->rank; i++)
        shape[1 + i] = f->shape[i];
    DLManagedTensor **parts = calloc((size_t)nl, sizeof *parts);
    dt_status st = parts ? DT_OK : dt__error(DT_ERR_NO_MEMORY, "dt_dataset_next: no memory");
    for (int d = 0; d < nl && st == DT_OK; d++) {
        part *h = calloc(1, sizeof *h);
        if (!h) {
            st = dt__error(DT_ERR_NO_MEMORY, "dt_dataset_next: no memory");
            break;
        }
        parts[d] = &h->m;
        if ((st = dt_layout_shard(l, shape, ds->pos[d], off, h->shape)) != DT_OK)
            break;
        DLDevice where = {kDLCPU, 0};
        if (slot->on_device) {
            h->dev = ds->devs[d];
            h->bytes = slot->dbytes[k * nl + d];
            where = (DLDevice){h->dev->kind->dl_type, h->dev->ordinal};
        }
        h->m.manager_ctx = h;
        h->m.deleter = part_free;
        h->m.dl_tensor = (DLTensor){.data = slot->bufs[k * nl + d],
                                    .device = where,
                                    .ndim = rank,
                                    .dtype = dt_dtype_to_dlpack(f->dtype),
                                    .shape = h->shape};
    }
    if (st == DT_OK)
        st = dt_tensor_pack_managed(l, shape, nl, parts, out);
    if (st == DT_OK)
        for (int d = 0; d < nl; d++)
            slot->bufs[k * nl + d] = NULL;
    else
        for (int d = 0; parts && d < nl; d++)
            free(parts[d]); /* the part structs only: the buffers stay with the slot */
    free(parts);
    return st;
}

dt_status dt_dataset_next(dt_dataset *ds, int n, dt_tensor **tensors_out,
                          dt_data_batch_info *info_out)
{
    if (!ds || !tensors_out || n != ds->nout)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_dataset_next: NULL argument or %d outputs "
                         "(the dataset has %d)", n, ds ? ds->nout : 0);
    dt_tensor *t[DT_DATA_MAX_FIELDS] = {NULL};
    char msg[MSG_LEN] = "";
    dd_slot *slot = NULL;
    dt_status st = dd_take(ds, &slot);
    if (st != DT_OK)
        snprintf(msg, sizeof msg, "%s", dt_last_error());
    else if (slot->st != DT_OK) {
        st = slot->st;
        snprintf(msg, sizeof msg, "%s", slot->msg);
    }
    for (int k = 0; st == DT_OK && !slot->end && k < n; k++)
        if ((st = pack_output(ds, slot, k, &t[k])) != DT_OK)
            snprintf(msg, sizeof msg, "%s", dt_last_error());
    /* One outcome on every client: the lowest failing client's status and message. */
    if (st != DT_OK)
        dt__error(st, "%s", msg);
    long tk = ds->group->comm != MPI_COMM_NULL ? dt__coll_record(ds->group->clients, ds->group->size, "dataset next", "batch agreement") : -1;
    st = dt__group_agree(ds->group, st, "dt_dataset_next: agreeing on the batch");
    dt__coll_end(tk, "mpi", st);
    if (st != DT_OK)
        dt__strlcpy(msg, dt_last_error(), sizeof msg);
    if (st != DT_OK) {
        for (int k = 0; k < n; k++)
            dt_tensor_destroy(t[k]);
        /* Nothing delivered, the position kept: drop what was prepared and start over. */
        dd_stop(ds);
        return dt__error(st, "%s", msg);
    }
    dt_data_batch_info info = {slot->epoch, slot->batch, slot->rows, slot->end};
    if (info.end)
        dd_stop(ds); /* the producer halted at the end; a later call starts it again */
    else
        dd_release(ds);
    if (!info.end && ++ds->batch == ds->bpe) {
        ds->batch = 0;
        ds->epoch++;
    }
    for (int k = 0; k < n; k++)
        tensors_out[k] = t[k];
    if (info_out)
        *info_out = info;
    return DT_OK;
}
