/* The dataset's position: queries, seeking, and its form as named checkpoint values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"
#include "runtime/error.h"

static const char *const keys[DT_DATASET_STATE_VALUES] = {"epoch",    "batch",        "seed",
                                                          "examples", "global_batch", "order"};

int64_t dt_dataset_batches_per_epoch(const dt_dataset *ds)
{
    return ds ? ds->bpe : 0;
}

dt_status dt_dataset_position(const dt_dataset *ds, dt_data_position *out)
{
    if (!ds || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_dataset_position: NULL argument");
    out->epoch = ds->epoch;
    out->batch = ds->batch;
    return DT_OK;
}

dt_status dt_dataset_seek(dt_dataset *ds, const dt_data_position *p)
{
    if (!ds || !p)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_dataset_seek: NULL argument");
    if (p->epoch < 0 || p->batch < 0 || p->batch >= ds->bpe)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_dataset_seek: epoch %lld batch %lld: an epoch has batches 0..%lld",
                         (long long)p->epoch, (long long)p->batch, (long long)ds->bpe - 1);
    dd_stop(ds);
    ds->epoch = p->epoch;
    ds->batch = p->batch;
    ds->fill_epoch = p->epoch;
    ds->fill_batch = p->batch;
    return DT_OK;
}

/* The values that fix the data order, in keys[] order from index 2. */
static void order_values(const dt_dataset *ds, int64_t v[DT_DATASET_STATE_VALUES])
{
    v[0] = ds->epoch;
    v[1] = ds->batch;
    v[2] = (int64_t)ds->o.seed;
    v[3] = ds->src->n;
    v[4] = ds->o.global_batch;
    v[5] = ds->o.shuffle + 2 * ds->o.drop_remainder;
}

dt_status dt_dataset_state_values(dt_dataset *ds, const char *prefix,
                                  dt_ckpt_value values_out[DT_DATASET_STATE_VALUES])
{
    if (!ds || !values_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_dataset_state_values: NULL argument");
    if (!prefix)
        prefix = "";
    size_t plen = strlen(prefix);
    if (plen + 16 > DT_CKPT_NAME_MAX)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_dataset_state_values: prefix of %zu bytes "
                         "is too long", plen);
    char *names = malloc(DT_DATASET_STATE_VALUES * (plen + 16));
    if (!names)
        return dt__error(DT_ERR_NO_MEMORY, "dt_dataset_state_values: no memory");
    free(ds->names);
    ds->names = names;
    int64_t v[DT_DATASET_STATE_VALUES];
    order_values(ds, v);
    for (int i = 0; i < DT_DATASET_STATE_VALUES; i++) {
        char *name = names + (size_t)i * (plen + 16);
        snprintf(name, plen + 16, "%s%s", prefix, keys[i]);
        values_out[i] = (dt_ckpt_value){name, DT_CKPT_VALUE_I64, v[i], 0.0, NULL, 0};
    }
    return DT_OK;
}

dt_status dt_dataset_load_state(dt_dataset *ds, const dt_ckpt *ckpt, const char *prefix)
{
    static const char fn[] = "dt_dataset_load_state";
    if (!ds || !ckpt)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
    if (!prefix)
        prefix = "";
    int64_t saved[DT_DATASET_STATE_VALUES], mine[DT_DATASET_STATE_VALUES];
    order_values(ds, mine);
    for (int i = 0; i < DT_DATASET_STATE_VALUES; i++) {
        char name[DT_CKPT_NAME_MAX + 1];
        if (snprintf(name, sizeof name, "%s%s", prefix, keys[i]) >= (int)sizeof name)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: prefix too long", fn);
        dt_status st = dt_ckpt_value_i64(ckpt, name, &saved[i]);
        if (st != DT_OK)
            return dt__error(st == DT_ERR_NOT_FOUND ? DT_ERR_NOT_FOUND : st,
                             "%s: %s: no dataset value '%s' (%s)", fn, dt_ckpt_path(ckpt), name,
                             dt_last_error());
        if (i >= 2 && saved[i] != mine[i])
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "%s: %s: saved with %s %lld, this dataset has %lld: another data "
                             "order", fn, dt_ckpt_path(ckpt), keys[i], (long long)saved[i],
                             (long long)mine[i]);
    }
    dt_data_position p = {saved[0], saved[1]};
    return dt_dataset_seek(ds, &p);
}
