/* Staging memory of a save: the caller copies its slices' bytes, piece by piece in the order
 * the writer writes them, into a ring buffer (from device memory through the kind's D2H copy,
 * into host memory of that kind: page-locked on CUDA); the writing thread takes each piece,
 * CRCs and writes it, and releases it, which lets the caller copy more. So the caller's
 * tensors may change as soon as the copy is done, the file write of one piece overlaps the
 * copy of the next, and staging never holds more than the bound. The buffer is kept for the
 * next save that stages (its pages are then already mapped: a steady-state save's copy takes
 * no page faults), trimmed when a later save's bound is smaller, and freed at dt_finalize
 * (docs/ckpt.md, "Asynchronous save" and "GPU tensors"). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/env.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/util.h"

typedef struct piece {
    int64_t si;
    uint64_t at, len;
    uint64_t pos;                 /* offset in the ring */
} piece;

struct ck_stage {
    ck_source src;                /* first: the writer's view */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned char *buf;
    uint64_t cap;                 /* the ring's size */
    uint64_t size;                /* buf's (a kept buffer may be larger than the ring) */
    const dt__device_kind *kind;  /* whose host_alloc made buf (NULL: malloc) */
    int whole;                    /* the writer waits for the whole copy (everything fits) */
    int keep;                     /* DT_CKPT_STAGING_KEEP: buf stays for the next save */
    uint64_t head, tail;          /* ring positions (monotonic byte counts, wraps included) */
    piece *pieces;                /* in write order */
    int64_t npieces, nput, nget;  /* queued by the caller, taken by the writer */
    int filled;                   /* the caller copied everything (or stopped) */
    int aborted;                  /* the writer stopped */
    dt_status fail;               /* the caller's failure, for the writer */
    char fail_msg[256];
};

/* One buffer kept between saves, with the kind whose host memory it is, and what this
 * process's staging has cost (dt__ckpt_stage_stats). */
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *cache_buf;
static uint64_t cache_cap;
static const dt__device_kind *cache_kind;
static uint64_t n_allocs, n_reuses;

static void release(const dt__device_kind *kind, void *b)
{
    if (kind)
        kind->host_free(b);
    else
        free(b);
}


/* Runs before the devices close (dt_finalize calls its hooks first). */
static void free_cache(void)
{
    pthread_mutex_lock(&cache_mu);
    release(cache_kind, cache_buf);
    cache_buf = NULL;
    cache_cap = 0;
    cache_kind = NULL;
    pthread_mutex_unlock(&cache_mu);
}

/* A buffer of at least cap and at most limit bytes of kind's host memory (its size in
 * *size_out): the kept one when it fits; else the kept one is freed first (a smaller bound
 * trims it, and the old and the new buffer are never both held) and a new one allocated. */
static unsigned char *take_buffer(const dt__device_kind *kind, uint64_t cap, uint64_t limit,
                                  uint64_t *size_out)
{
    pthread_mutex_lock(&cache_mu);
    unsigned char *b = cache_buf, *old = NULL;
    const dt__device_kind *old_kind = cache_kind;
    if (b && (cache_cap < cap || cache_cap > limit || cache_kind != kind)) {
        old = b;
        b = NULL;
    }
    if (b) {
        n_reuses++;
        *size_out = cache_cap;
    }
    cache_buf = NULL;
    cache_cap = 0;
    cache_kind = NULL;
    pthread_mutex_unlock(&cache_mu);
    if (old)
        release(old_kind, old);
    if (b)
        return b;
    void *p = NULL;
    if (!kind)
        p = malloc((size_t)cap);
    else if (kind->host_alloc((size_t)cap, &p) != DT_OK)
        p = NULL;
    if (p) {
        *size_out = cap;
        pthread_mutex_lock(&cache_mu);
        n_allocs++;
        pthread_mutex_unlock(&cache_mu);
    }
    return p;
}

/* Keeps b for the next save (its pages stay mapped), or frees it when keeping is off or a
 * larger buffer of the same kind was kept meanwhile. */
static void give_buffer(const dt__device_kind *kind, unsigned char *b, uint64_t cap, int keep)
{
    if (!keep) {
        release(kind, b);
        return;
    }
    pthread_mutex_lock(&cache_mu);
    if (!cache_buf || cache_cap < cap || cache_kind != kind) {
        unsigned char *old = cache_buf;
        const dt__device_kind *old_kind = cache_kind;
        cache_buf = b;
        cache_cap = cap;
        cache_kind = kind;
        b = old;
        kind = old_kind;
    }
    pthread_mutex_unlock(&cache_mu);
    if (b)
        release(kind, b);
}

void dt__ckpt_stage_stats(ck_stage_stats *out)
{
    pthread_mutex_lock(&cache_mu);
    *out = (ck_stage_stats){.allocs = n_allocs, .reuses = n_reuses, .kept_bytes = cache_cap};
    pthread_mutex_unlock(&cache_mu);
}

static const void *stage_get(ck_source *src, int64_t si, uint64_t at, uint64_t len)
{
    ck_stage *s = (ck_stage *)src;
    pthread_mutex_lock(&s->mu);
    /* When everything fits, the writer starts once the caller's copy is done: the copy, which
     * the caller waits for, then has the memory bandwidth and the cores to itself. */
    while ((s->nget == s->nput || s->whole) && !s->filled)
        pthread_cond_wait(&s->cv, &s->mu);
    piece *p = s->nget < s->nput ? &s->pieces[s->nget++] : NULL;
    dt_status fail = s->fail;
    pthread_mutex_unlock(&s->mu);
    if (!p) {
        src->status = fail != DT_OK ? dt__error(fail, "%s", s->fail_msg)
                                    : dt__error(DT_ERR_STATE, "dt_save_async: staging ended "
                                                "before slice %lld", (long long)si);
        return NULL;
    }
    if (p->si != si || p->at != at || p->len != len) {
        src->status = dt__error(DT_ERR_STATE, "dt_save_async: staged piece out of order");
        return NULL;
    }
    return s->buf + p->pos;
}

/* The writer starts nothing beside its writes while the caller copies everything. */
static void stage_ready(ck_source *src)
{
    ck_stage *s = (ck_stage *)src;
    pthread_mutex_lock(&s->mu);
    while (s->whole && !s->filled)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* Pieces are released in the order they were taken: the tail moves past this one (and the
 * gap left at the ring's end when it was placed at the start). */
static void stage_put(ck_source *src, const void *bytes, uint64_t len)
{
    ck_stage *s = (ck_stage *)src;
    uint64_t pos = (uint64_t)((const unsigned char *)bytes - s->buf);
    pthread_mutex_lock(&s->mu);
    uint64_t at = s->tail % s->cap;
    s->tail += (pos < at ? s->cap - at : 0) + len;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Pieces of this client's slices in write order: files in order, slices in data order. */
static int64_t count_pieces(const ck_plan *plan, uint64_t *bytes_out, uint64_t *largest_out)
{
    int me = dt_client_id();
    int64_t n = 0;
    *bytes_out = *largest_out = 0;
    for (int64_t f = 0; f < plan->nfiles; f++) {
        const ck_plan_file *pf = &plan->files[f];
        if (dt_device_client(DT_DEVICE_CPU, pf->device_id) != me)
            continue;
        for (int64_t i = 0; i < pf->nslices; i++) {
            uint64_t bytes = plan->slices[pf->slices[i]].bytes;
            *bytes_out += bytes;
            for (uint64_t at = 0, len; at < bytes; n++, at += len) {
                len = dt__ckpt_piece_len(plan->chunk_bytes, bytes, at);
                *largest_out = len > *largest_out ? len : *largest_out;
            }
        }
    }
    return n;
}

dt_status dt__ckpt_stage_create(const ck_plan *plan, uint64_t bound,
                                const dt__device_kind *kind, int eager, ck_stage **stage_out)
{
    ck_stage *s = calloc(1, sizeof *s);
    if (!s)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save_async: no memory");
    /* DT_CKPT_STAGING_KEEP=0: every save allocates its staging and frees it after (the memory
     * is not held between saves; each save pays the page faults again). */
    dt_status st = dt__env_flag("DT_CKPT_STAGING_KEEP", 1, "keep the staging between saves",
                                &s->keep);
    if (st == DT_OK)
        st = dt__at_finalize(free_cache);
    if (st != DT_OK) {
        free(s);
        return st;
    }
    uint64_t total = 0, largest = 0;
    s->npieces = count_pieces(plan, &total, &largest);
    /* The bound, but never less than the largest piece (at most 1 MiB) nor more than needed. */
    s->cap = bound && bound < total ? bound : total;
    s->cap = s->cap < largest ? largest : s->cap;
    s->cap = s->cap ? s->cap : 1;
    s->whole = !eager && s->cap >= total;
    s->kind = kind;
    s->pieces = malloc((size_t)(s->npieces + 1) * sizeof *s->pieces);
    /* A kept buffer above the bound is trimmed; without a bound any kept one that fits. */
    uint64_t limit = bound ? (bound > s->cap ? bound : s->cap) : UINT64_MAX;
    s->buf = take_buffer(kind, s->cap, limit, &s->size);
    if (!s->pieces || !s->buf) {
        uint64_t cap = s->cap;
        free(s->pieces);
        if (s->buf)
            release(kind, s->buf);
        free(s);
        return dt__error(DT_ERR_NO_MEMORY, "dt_save_async: no memory for %llu bytes of "
                         "staging", (unsigned long long)cap);
    }
    s->src = (ck_source){.get = stage_get, .put = stage_put, .ready = stage_ready,
                        .parallel = 0};
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    *stage_out = s;
    return DT_OK;
}

void dt__ckpt_stage_destroy(ck_stage *s)
{
    if (!s)
        return;
    give_buffer(s->kind, s->buf, s->size, s->keep);
    free(s->pieces);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

ck_source *dt__ckpt_stage_source(ck_stage *s) { return &s->src; }

void dt__ckpt_stage_abort(ck_stage *s)
{
    pthread_mutex_lock(&s->mu);
    s->aborted = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Room for `len` bytes at the head (placed at the ring's start when they do not fit before its
 * end): waits for the writer; the position, or UINT64_MAX when the writer stopped. */
static uint64_t reserve(ck_stage *s, uint64_t len)
{
    pthread_mutex_lock(&s->mu);
    uint64_t pos = UINT64_MAX;
    for (;;) {
        uint64_t at = s->head % s->cap, skip = at + len > s->cap ? s->cap - at : 0;
        if (s->aborted)
            break;
        if (s->head + skip + len - s->tail <= s->cap) {
            s->head += skip;
            pos = s->head % s->cap;
            break;
        }
        pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return pos;
}

static void publish(ck_stage *s, piece p)
{
    pthread_mutex_lock(&s->mu);
    s->pieces[s->nput++] = p;
    s->head += p.len;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Copies `len` bytes at `at` of a slice into the ring. */
static dt_status copy_in(void *dst, const ck_slice_src *src, uint64_t at, uint64_t len)
{
    const char *from = (const char *)src->data + at;
    if (src->dev)
        return src->dev->kind->copy(src->dev, DT__COPY_D2H, dst, from, (size_t)len);
    dt__copy_large(dst, from, (size_t)len);
    return DT_OK;
}

/* Everything fits (s->whole: the writer waits for the whole copy): the slice in one copy, so
 * that a large one takes the streaming copy, then its pieces. 0 when the writer stopped. */
static int fill_slice_whole(ck_stage *s, const ck_plan *plan, const ck_slice_src *src,
                            int64_t si, dt_status *fail)
{
    uint64_t bytes = plan->slices[si].bytes, pos = reserve(s, bytes);
    if (pos == UINT64_MAX)
        return 0;
    if ((*fail = copy_in(s->buf + pos, &src[si], 0, bytes)) != DT_OK)
        return 0;
    for (uint64_t at = 0; at < bytes;) {
        uint64_t len = dt__ckpt_piece_len(plan->chunk_bytes, bytes, at);
        publish(s, (piece){.si = si, .at = at, .len = len, .pos = pos + at});
        at += len;
    }
    return 1;
}

void dt__ckpt_stage_fill(ck_stage *s, const ck_plan *plan, const ck_slice_src *src)
{
    int me = dt_client_id(), go = 1;
    dt_status fail = DT_OK;
    for (int64_t f = 0; go && f < plan->nfiles; f++) {
        const ck_plan_file *pf = &plan->files[f];
        if (dt_device_client(DT_DEVICE_CPU, pf->device_id) != me)
            continue;
        for (int64_t i = 0; go && i < pf->nslices; i++) {
            int64_t si = pf->slices[i];
            uint64_t bytes = plan->slices[si].bytes;
            if (!src[si].data) {
                fail = dt__error(DT_ERR_STATE, "dt_save_async: no local data for slice %lld",
                                 (long long)si);
                go = 0;
                break;
            }
            if (s->whole) {
                go = fill_slice_whole(s, plan, src, si, &fail);
                continue;
            }
            for (uint64_t at = 0; go && at < bytes;) {
                uint64_t len = dt__ckpt_piece_len(plan->chunk_bytes, bytes, at);
                uint64_t pos = reserve(s, len);
                if (pos == UINT64_MAX) {
                    go = 0;
                    break;
                }
                if ((fail = copy_in(s->buf + pos, &src[si], at, len)) != DT_OK) {
                    go = 0;
                    break;
                }
                publish(s, (piece){.si = si, .at = at, .len = len, .pos = pos});
                at += len;
            }
        }
    }
    pthread_mutex_lock(&s->mu);
    s->filled = 1;
    if (fail != DT_OK) {
        s->fail = fail;
        dt__strlcpy(s->fail_msg, dt_last_error(), sizeof s->fail_msg);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

dt_status dt__ckpt_device_staging(const char *fn, uint64_t *bytes_out)
{
    dt_status st = dt__env_mib("DT_CKPT_STAGING_MB", CK_DEVICE_STAGING_DEFAULT >> 20, 1, 1u << 20,
                               "MiB of host staging for a save from device memory", bytes_out);
    if (st != DT_OK) {
        char msg[512];
        dt__strlcpy(msg, dt_last_error(), sizeof msg);
        return dt__error(st, "%s: %s", fn, msg);
    }
    return DT_OK;
}
