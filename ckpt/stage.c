/* Staging memory of an asynchronous save: the caller copies its slices' bytes, piece by piece
 * in the order the writer writes them, into a bounded FIFO; the writing thread takes each
 * piece, CRCs and writes it, and frees it, which lets the caller copy more. So the caller's
 * tensors may change as soon as the copy is done, and staging never holds more than the
 * caller's bound (docs/ckpt.md, "Asynchronous save"). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"

typedef struct piece {
    struct piece *next;
    int64_t si;
    uint64_t at, len;
    unsigned char bytes[];
} piece;

struct ck_stage {
    ck_source src;                /* first: the writer's view */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t bound, held;         /* bytes queued or being written */
    piece *head, *tail;
    int filled;                   /* the caller copied everything (or stopped) */
    int aborted;                  /* the writer stopped */
    dt_status fail;               /* the caller's failure, for the writer */
    char fail_msg[256];
};

static const void *stage_get(ck_source *src, int64_t si, uint64_t at, uint64_t len)
{
    ck_stage *s = (ck_stage *)src;
    pthread_mutex_lock(&s->mu);
    while (!s->head && !s->filled)
        pthread_cond_wait(&s->cv, &s->mu);
    piece *p = s->head;
    if (p) {
        s->head = p->next;
        if (!s->head)
            s->tail = NULL;
    }
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
        free(p);
        return NULL;
    }
    return p->bytes;
}

static void stage_put(ck_source *src, const void *bytes, uint64_t len)
{
    ck_stage *s = (ck_stage *)src;
    free((unsigned char *)bytes - offsetof(piece, bytes));
    pthread_mutex_lock(&s->mu);
    s->held -= len;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

dt_status dt__ckpt_stage_create(uint64_t bound, ck_stage **stage_out)
{
    ck_stage *s = calloc(1, sizeof *s);
    if (!s)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save_async: no memory");
    s->src = (ck_source){.get = stage_get, .put = stage_put, .parallel = 0};
    s->bound = bound;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    *stage_out = s;
    return DT_OK;
}

void dt__ckpt_stage_destroy(ck_stage *s)
{
    if (!s)
        return;
    while (s->head) {
        piece *p = s->head;
        s->head = p->next;
        free(p);
    }
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

/* Queues one copied piece, waiting while the bound would be exceeded (one piece always
 * passes, so a bound below a piece still makes progress). 0 when the writer stopped. */
static int push(ck_stage *s, piece *p)
{
    pthread_mutex_lock(&s->mu);
    while (!s->aborted && s->bound && s->held > 0 && s->held + p->len > s->bound)
        pthread_cond_wait(&s->cv, &s->mu);
    int ok = !s->aborted;
    if (ok) {
        s->held += p->len;
        if (s->tail)
            s->tail->next = p;
        else
            s->head = p;
        s->tail = p;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (!ok)
        free(p);
    return ok;
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
            for (uint64_t at = 0; go && at < bytes;) {
                uint64_t len = dt__ckpt_piece_len(plan->chunk_bytes, bytes, at);
                piece *p = data[si] ? malloc(sizeof *p + len) : NULL;
                if (!p) {
                    fail = data[si] ? dt__error(DT_ERR_NO_MEMORY, "dt_save_async: no memory "
                                                "for %llu bytes of staging",
                                                (unsigned long long)len)
                                    : dt__error(DT_ERR_STATE, "dt_save_async: no local data "
                                                "for slice %lld", (long long)si);
                    go = 0;
                    break;
                }
                *p = (piece){.si = si, .at = at, .len = len};
                memcpy(p->bytes, (const char *)data[si] + at, (size_t)len);
                go = push(s, p);
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
