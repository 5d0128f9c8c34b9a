/* The producer: a background thread preparing the next batches into a ring of `prefetch`
 * slots, on a GPU mesh up to the devices (or, with prefetch 0, the caller preparing each
 * batch when asked). It stops after an
 * end or a failure; dd_stop rewinds it to the dataset's position. */
#include <string.h>

#include "data/data_impl.h"
#include "runtime/error.h"

static void advance(const dt_dataset *ds, int64_t *epoch, int64_t *batch)
{
    if (++*batch == ds->bpe) {
        *batch = 0;
        ++*epoch;
    }
}

static void *producer(void *arg)
{
    dt_dataset *ds = arg;
    pthread_mutex_lock(&ds->mu);
    while (!ds->stop) {
        if (ds->halted || ds->count == ds->nslots) {
            pthread_cond_wait(&ds->cv, &ds->mu);
            continue;
        }
        dd_slot *slot = &ds->slots[(ds->head + ds->count) % ds->nslots];
        int64_t e = ds->fill_epoch, b = ds->fill_batch;
        pthread_mutex_unlock(&ds->mu);
        dd_fill(ds, e, b, slot);
        dd_upload(ds, slot);
        pthread_mutex_lock(&ds->mu);
        slot->ready = 1;
        ds->count++;
        if (slot->end || slot->st != DT_OK)
            ds->halted = 1;
        else
            advance(ds, &ds->fill_epoch, &ds->fill_batch);
        pthread_cond_broadcast(&ds->cv);
    }
    pthread_mutex_unlock(&ds->mu);
    return NULL;
}

void dd_stop(dt_dataset *ds)
{
    if (ds->running) {
        pthread_mutex_lock(&ds->mu);
        ds->stop = 1;
        pthread_cond_broadcast(&ds->cv);
        pthread_mutex_unlock(&ds->mu);
        pthread_join(ds->thread, NULL);
        ds->running = 0;
    }
    for (int i = 0; i < ds->nslots; i++)
        dd_slot_clear(ds, &ds->slots[i]);
    ds->head = ds->count = 0;
    ds->stop = ds->halted = 0;
    ds->fill_epoch = ds->epoch;
    ds->fill_batch = ds->batch;
}

dt_status dd_take(dt_dataset *ds, dd_slot **slot_out)
{
    if (ds->o.prefetch == 0) {
        dd_fill(ds, ds->epoch, ds->batch, &ds->slots[0]);
        dd_upload(ds, &ds->slots[0]);
        *slot_out = &ds->slots[0];
        return DT_OK;
    }
    if (!ds->running) {
        dd_stop(ds);
        int rc = pthread_create(&ds->thread, NULL, producer, ds);
        if (rc != 0)
            return dt__error(DT_ERR_SYSTEM, "dt_dataset_next: cannot start the prefetch thread: "
                             "%s", strerror(rc));
        ds->running = 1;
    }
    pthread_mutex_lock(&ds->mu);
    while (ds->count == 0)
        pthread_cond_wait(&ds->cv, &ds->mu);
    *slot_out = &ds->slots[ds->head];
    pthread_mutex_unlock(&ds->mu);
    return DT_OK;
}

void dd_release(dt_dataset *ds)
{
    if (ds->o.prefetch == 0) {
        dd_slot_clear(ds, &ds->slots[0]);
        return;
    }
    pthread_mutex_lock(&ds->mu);
    dd_slot_clear(ds, &ds->slots[ds->head]);
    ds->head = (ds->head + 1) % ds->nslots;
    ds->count--;
    pthread_cond_broadcast(&ds->cv);
    pthread_mutex_unlock(&ds->mu);
}
