/* Staging memory of an asynchronous save: the caller copies its slices' bytes, piece by piece
 * in the order the writer writes them, into a ring buffer; the writing thread takes each
 * piece, CRCs and writes it, and releases it, which lets the caller copy more. So the
 * caller's tensors may change as soon as the copy is done, and staging never holds more than
 * the caller's bound. The buffer is kept for the next asynchronous save (its pages are then
 * already mapped: the copy runs at memcpy speed) and freed at dt_finalize (docs/ckpt.md,
 * "Asynchronous save"). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"

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
    uint64_t cap;
    int whole;                    /* cap holds all of this client's bytes */
    uint64_t head, tail;          /* ring positions (monotonic byte counts, wraps included) */
    piece *pieces;                /* in write order */
    int64_t npieces, nput, nget;  /* queued by the caller, taken by the writer */
    int filled;                   /* the caller copied everything (or stopped) */
    int aborted;                  /* the writer stopped */
    dt_status fail;               /* the caller's failure, for the writer */
    char fail_msg[256];
};

/* One buffer kept between saves. */
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *cache_buf;
static uint64_t cache_cap;

static void free_cache(void)
{
    pthread_mutex_lock(&cache_mu);
    free(cache_buf);
    cache_buf = NULL;
    cache_cap = 0;
    pthread_mutex_unlock(&cache_mu);
}

/* A buffer of at least cap bytes: the kept one when it is large enough. */
static unsigned char *take_buffer(uint64_t cap)
{
    pthread_mutex_lock(&cache_mu);
    unsigned char *b = NULL;
    if (cache_buf && cache_cap >= cap) {
        b = cache_buf;
        cache_buf = NULL;
    }
    pthread_mutex_unlock(&cache_mu);
    return b ? b : malloc((size_t)cap);
}

static void give_buffer(unsigned char *b, uint64_t cap)
{
    pthread_mutex_lock(&cache_mu);
    if (!cache_buf || cache_cap < cap) {
        free(cache_buf);
        cache_buf = b;
        cache_cap = cap;
        b = NULL;
    }
    pthread_mutex_unlock(&cache_mu);
    free(b);
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

dt_status dt__ckpt_stage_create(const ck_plan *plan, uint64_t bound, ck_stage **stage_out)
{
    ck_stage *s = calloc(1, sizeof *s);
    if (!s)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save_async: no memory");
    dt_status st = dt__at_finalize(free_cache);
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
    s->whole = s->cap >= total;
    s->pieces = malloc((size_t)(s->npieces + 1) * sizeof *s->pieces);
    s->buf = take_buffer(s->cap);
    if (!s->pieces || !s->buf) {
        uint64_t cap = s->cap;
        free(s->pieces);
        free(s->buf);
        free(s);
        return dt__error(DT_ERR_NO_MEMORY, "dt_save_async: no memory for %llu bytes of "
                         "staging", (unsigned long long)cap);
    }
    s->src = (ck_source){.get = stage_get, .put = stage_put, .parallel = 0};
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    *stage_out = s;
    return DT_OK;
}

void dt__ckpt_stage_destroy(ck_stage *s)
{
    if (!s)
        return;
    give_buffer(s->buf, s->cap);
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

void dt__ckpt_stage_fill(ck_stage *s, const ck_plan *plan, const void *const *data)
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
            if (!data[si]) {
                fail = dt__error(DT_ERR_STATE, "dt_save_async: no local data for slice %lld",
                                 (long long)si);
                go = 0;
                break;
            }
            for (uint64_t at = 0; go && at < bytes;) {
                uint64_t len = dt__ckpt_piece_len(plan->chunk_bytes, bytes, at);
                uint64_t pos = reserve(s, len);
                if (pos == UINT64_MAX) {
                    go = 0;
                    break;
                }
                memcpy(s->buf + pos, (const char *)data[si] + at, (size_t)len);
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
