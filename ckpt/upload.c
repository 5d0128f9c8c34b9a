/* Restoring into device memory that host code cannot touch: the part of each saved slice a
 * component needs is cut into boxes of at most one staging buffer; a reader thread reads box
 * k+1 from the files (chunk CRCs checked by dt__ckpt_read_box) into host memory of the
 * devices' kind (page-locked on CUDA) while the caller copies box k to its device. Two
 * buffers: host memory never holds more than the bound, whatever the tensors' size
 * (docs/ckpt.md, "GPU tensors"). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"

enum { NSLOT = 2 };

/* A box of tensor fills[fill].ti staged in a buffer (a compact array of shape len). */
typedef struct sub {
    int64_t fill;
    int64_t off[DT_MAX_RANK], len[DT_MAX_RANK];
} sub;

typedef struct upload {
    const dt_ckpt *ck;
    const ck_fill *fills;
    int64_t n;
    uint64_t piece;               /* bytes per buffer */
    unsigned char *buf[NSLOT];
    sub box[NSLOT];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t nread, nused;         /* boxes staged by the reader, copied by the caller */
    int reader_done, abort;
    ck_reader rd;
    int64_t fill, slice;          /* what the reader is on */
    dt_status rst;                /* the reader's failure, with its message */
    char rmsg[1024];
} upload;

/* Reader: waits for a free buffer, reads box b of the current slice into it, hands it over. */
static dt_status stage_box(upload *u, const int64_t *off, const int64_t *len)
{
    pthread_mutex_lock(&u->mu);
    while (u->nread - u->nused >= NSLOT && !u->abort)
        pthread_cond_wait(&u->cv, &u->mu);
    int stop = u->abort;
    pthread_mutex_unlock(&u->mu);
    if (stop)
        return DT_ERR_STATE;      /* the caller failed: its status is the outcome */
    int k = (int)(u->nread % NSLOT);
    const ck_fill *f = &u->fills[u->fill];
    int rank = u->ck->tensors[f->ti].rank;
    sub *b = &u->box[k];
    b->fill = u->fill;
    memcpy(b->off, off, (size_t)rank * sizeof *off);
    memcpy(b->len, len, (size_t)rank * sizeof *len);
    dt_status st = dt__ckpt_read_box(&u->rd, f->ti, u->slice, b->off, b->len, u->buf[k]);
    if (st != DT_OK)
        return st;
    pthread_mutex_lock(&u->mu);
    u->nread++;
    pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    return DT_OK;
}

/* Cuts the box (lo, n) into boxes of at most u->piece bytes, each a compact array: whole
 * trailing dims after the first dim d whose trailing bytes fit, up to k indices along d, one
 * index along the dims before it. */
static dt_status stage_boxes(upload *u, int rank, size_t elem, const int64_t *lo,
                             const int64_t *n)
{
    uint64_t inner = elem;        /* bytes of one index along d */
    int d = rank - 1;
    while (d > 0 && inner * (uint64_t)n[d] <= u->piece) {
        inner *= (uint64_t)n[d];
        d--;
    }
    if (rank == 0)
        return stage_box(u, lo, n);
    int64_t k = (int64_t)(u->piece / inner);
    k = k < 1 ? 1 : k > n[d] ? n[d] : k;
    int64_t off[DT_MAX_RANK], len[DT_MAX_RANK], idx[DT_MAX_RANK] = {0};
    for (int e = d + 1; e < rank; e++) {
        off[e] = lo[e];
        len[e] = n[e];
    }
    for (;;) {
        for (int e = 0; e < d; e++) {
            off[e] = lo[e] + idx[e];
            len[e] = 1;
        }
        for (int64_t a = 0; a < n[d]; a += k) {
            off[d] = lo[d] + a;
            len[d] = n[d] - a < k ? n[d] - a : k;
            dt_status st = stage_box(u, off, len);
            if (st != DT_OK)
                return st;
        }
        int e = d - 1;
        while (e >= 0 && ++idx[e] == n[e])
            idx[e--] = 0;
        if (e < 0)
            return DT_OK;
    }
}

static void *reader(void *arg)
{
    upload *u = arg;
    dt_status st = DT_OK;
    for (u->fill = 0; st == DT_OK && u->fill < u->n; u->fill++) {
        const ck_fill *f = &u->fills[u->fill];
        const ck_tensor *t = &u->ck->tensors[f->ti];
        size_t elem = dt_dtype_size(t->dtype);
        int64_t first, end;
        dt__ckpt_slices_near(t, f->off, f->shape, &first, &end);
        for (int64_t k = first; st == DT_OK && k < end; k++) {
            u->slice = t->order[k];
            const ck_slice *s = &t->slices[u->slice];
            int64_t lo[DT_MAX_RANK], n[DT_MAX_RANK];
            int empty = 0;
            for (int d = 0; d < t->rank; d++) {
                lo[d] = s->off[d] > f->off[d] ? s->off[d] : f->off[d];
                int64_t a = s->off[d] + s->size[d], b = f->off[d] + f->shape[d];
                n[d] = (a < b ? a : b) - lo[d];
                empty |= n[d] <= 0;
            }
            if (!empty)
                st = stage_boxes(u, t->rank, elem, lo, n);
        }
    }
    pthread_mutex_lock(&u->mu);
    u->reader_done = 1;
    if (st != DT_OK && !u->abort) {
        u->rst = st;
        dt__strlcpy(u->rmsg, dt_last_error(), sizeof u->rmsg);
    }
    pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

/* Caller: copies each staged box to its component, in order, until the reader is done. */
static dt_status copy_boxes(upload *u)
{
    for (;;) {
        pthread_mutex_lock(&u->mu);
        while (u->nused == u->nread && !u->reader_done)
            pthread_cond_wait(&u->cv, &u->mu);
        int more = u->nused < u->nread;
        pthread_mutex_unlock(&u->mu);
        if (!more)
            return DT_OK;
        int k = (int)(u->nused % NSLOT);
        const sub *b = &u->box[k];
        const ck_fill *f = &u->fills[b->fill];
        const ck_tensor *t = &u->ck->tensors[f->ti];
        dt_status st = dt__device_copy_box(f->dev, DT__COPY_H2D, t->rank,
                                           dt_dtype_size(t->dtype), b->off, b->len, f->data,
                                           f->off, f->shape, u->buf[k], b->off, b->len);
        pthread_mutex_lock(&u->mu);
        if (st == DT_OK)
            u->nused++;
        else
            u->abort = 1;
        pthread_cond_broadcast(&u->cv);
        pthread_mutex_unlock(&u->mu);
        if (st != DT_OK)
            return st;
    }
}

dt_status dt__ckpt_upload(const dt_ckpt *ck, const ck_fill *fills, int64_t n, uint64_t bound)
{
    if (n == 0)
        return DT_OK;
    upload *u = calloc(1, sizeof *u);
    if (!u)
        return dt__error(DT_ERR_NO_MEMORY, "dt_restore: no memory");
    const dt__device_kind *kind = fills[0].dev->kind;
    u->ck = ck;
    u->fills = fills;
    u->n = n;
    u->piece = bound / NSLOT;
    u->piece = u->piece < ((uint64_t)64 << 10) ? (uint64_t)64 << 10 : u->piece;
    dt_status st = dt__ckpt_reader_init(&u->rd, ck);
    int have_rd = st == DT_OK;
    u->rd.reuse_checks = 1;
    for (int k = 0; st == DT_OK && k < NSLOT; k++) {
        void *p = NULL;
        st = kind->host_alloc((size_t)u->piece, &p);
        u->buf[k] = p;
    }
    pthread_t th;
    pthread_mutex_init(&u->mu, NULL);
    pthread_cond_init(&u->cv, NULL);
    if (st == DT_OK && pthread_create(&th, NULL, reader, u) != 0)
        st = dt__error(DT_ERR_NO_MEMORY, "dt_restore: cannot start the reading thread");
    if (st == DT_OK) {
        st = copy_boxes(u);
        pthread_join(th, NULL);
        if (st == DT_OK && u->rst != DT_OK)
            st = dt__error(u->rst, "%s", u->rmsg);
    }
    pthread_mutex_destroy(&u->mu);
    pthread_cond_destroy(&u->cv);
    for (int k = 0; k < NSLOT; k++)
        if (u->buf[k])
            kind->host_free(u->buf[k]);
    if (have_rd)
        dt__ckpt_reader_free(&u->rd);
    free(u);
    return st;
}
