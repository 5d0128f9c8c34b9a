/* Walks a box inside two compact row-major arrays as contiguous runs (whole trailing dims
 * merged), for copies and reductions between components, staging buffers and devices. */
#include <string.h>

#include "runtime/device.h"
#include "runtime/util.h"

void dt__box_apply(int rank, size_t elem, const int64_t *box_off, const int64_t *box_len,
                   void *dst, const int64_t *doff, const int64_t *dshape, const void *src,
                   const int64_t *soff, const int64_t *sshape, dt__run_fn fn, void *arg)
{
    if (dt__numel(rank, box_len) == 0)
        return;
    /* Merge trailing dims that the box covers fully in both arrays into one run. */
    int inner = rank - 1;
    int64_t run = rank ? box_len[inner] : 1;
    while (inner > 0 && box_len[inner] == dshape[inner] && box_len[inner] == sshape[inner]) {
        inner--;
        run *= box_len[inner];
    }
    int64_t dstride[DT_MAX_RANK], sstride[DT_MAX_RANK], idx[DT_MAX_RANK] = {0};
    int64_t ds = 1, ss = 1;
    for (int d = rank - 1; d >= 0; d--) {
        dstride[d] = ds;
        sstride[d] = ss;
        ds *= dshape[d];
        ss *= sshape[d];
    }
    int64_t dbase = 0, sbase = 0;
    for (int d = 0; d < rank; d++) {
        dbase += (box_off[d] - doff[d]) * dstride[d];
        sbase += (box_off[d] - soff[d]) * sstride[d];
    }
    char *db = (char *)dst;
    const char *sb = (const char *)src;
    for (;;) {
        int64_t di = dbase, si = sbase;
        for (int d = 0; d < inner; d++) {
            di += idx[d] * dstride[d];
            si += idx[d] * sstride[d];
        }
        fn(db + (size_t)di * elem, sb + (size_t)si * elem, run, arg);
        int d = inner - 1;
        while (d >= 0 && ++idx[d] == box_len[d])
            idx[d--] = 0;
        if (d < 0)
            break;
    }
}

struct copy_arg {
    const dt__device *dev;
    dt__copy_dir dir;
    size_t elem;
    dt_status st;
};

static void copy_run(void *dst, const void *src, int64_t n, void *arg)
{
    struct copy_arg *a = arg;
    if (a->st == DT_OK)
        a->st = a->dev->kind->copy(a->dev, a->dir, dst, src, (size_t)n * a->elem);
}

dt_status dt__device_copy_box(const dt__device *dev, dt__copy_dir dir, int rank, size_t elem,
                              const int64_t *box_off, const int64_t *len, void *dst,
                              const int64_t *doff, const int64_t *dshape, const void *src,
                              const int64_t *soff, const int64_t *sshape)
{
    struct copy_arg a = {dev, dir, elem, DT_OK};
    dt__box_apply(rank, elem, box_off, len, dst, doff, dshape, src, soff, sshape, copy_run, &a);
    return a.st;
}

void dt__fill_pattern(void *dst, size_t bytes, const void *value, size_t elem)
{
    char *d = dst;
    if (bytes < elem)
        return;
    memcpy(d, value, elem);
    /* Doubling copies: each memcpy repeats the pattern written so far. */
    for (size_t done = elem; done < bytes;) {
        size_t n = done < bytes - done ? done : bytes - done;
        memcpy(d + done, d, n);
        done += n;
    }
}
