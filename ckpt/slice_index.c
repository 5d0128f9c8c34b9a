/* The slice index of a parsed tensor: its slices sorted by their start along one dim, with
 * the furthest end reached so far, so that a restore target's box looks at one run of them
 * (found by binary search) instead of every slice of the tensor. */
#include <stdlib.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"

static int cmp_start(const void *pa, const void *pb, void *arg)
{
    const ck_tensor *t = arg;
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    int64_t x = t->slices[a].off[t->sweep], y = t->slices[b].off[t->sweep];
    if (x != y)
        return x < y ? -1 : 1;
    return a < b ? -1 : a > b;
}

dt_status dt__ckpt_slice_index(ck_tensor *t)
{
    size_t n = (size_t)(t->nslices ? t->nslices : 1);
    ck_box *boxes = malloc(n * sizeof *boxes);
    t->order = malloc(n * sizeof *t->order);
    t->reach = malloc(n * sizeof *t->reach);
    if (!boxes || !t->order || !t->reach) {
        free(boxes);
        return dt__error(DT_ERR_NO_MEMORY, "no memory for the slice index of '%s'", t->name);
    }
    for (int64_t s = 0; s < t->nslices; s++) {
        for (int d = 0; d < t->rank; d++) {
            boxes[s].off[d] = t->slices[s].off[d];
            boxes[s].size[d] = t->slices[s].size[d];
        }
        boxes[s].id = s;
        t->order[s] = s;
    }
    t->sweep = t->rank ? dt__ckpt_sweep_dim(t->rank, boxes, t->nslices) : 0;
    free(boxes);
    if (t->rank)
        qsort_r(t->order, (size_t)t->nslices, sizeof *t->order, cmp_start, t);
    for (int64_t i = 0; i < t->nslices; i++) {
        const ck_slice *s = &t->slices[t->order[i]];
        int64_t end = t->rank ? s->off[t->sweep] + s->size[t->sweep] : 1;
        t->reach[i] = i && t->reach[i - 1] > end ? t->reach[i - 1] : end;
    }
    return DT_OK;
}

void dt__ckpt_slices_near(const ck_tensor *t, const int64_t *off, const int64_t *shape,
                          int64_t *first, int64_t *end)
{
    if (t->rank == 0) {
        *first = 0;
        *end = t->nslices;
        return;
    }
    int64_t lo = off[t->sweep], hi = off[t->sweep] + shape[t->sweep], a = 0, b = t->nslices;
    while (a < b) { /* the first slice whose run reaches past lo */
        int64_t m = a + (b - a) / 2;
        if (t->reach[m] > lo)
            b = m;
        else
            a = m + 1;
    }
    *first = a;
    b = t->nslices;
    while (a < b) { /* the first slice starting at or after hi */
        int64_t m = a + (b - a) / 2;
        if (t->slices[t->order[m]].off[t->sweep] >= hi)
            b = m;
        else
            a = m + 1;
    }
    *end = a;
}
