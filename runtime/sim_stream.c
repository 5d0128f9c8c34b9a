/* The simulated GPU's streams: one thread per ordinal running the closures submitted to it in
 * order (a bounded ring of copied closures), with a CUDA-like sticky error: the first failure
 * and its message are kept, the work behind it skipped, until a submit or sync returns it. */
#include <pthread.h>
#include <stdalign.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/sim.h"
#include "runtime/util.h"

#define RING 256 /* queued closures per stream before submit waits */
#define MAX_ORDINALS 64

typedef struct item {
    dt_status (*fn)(void *arg);
    void (*drop)(void *arg); /* run instead of fn when the item is skipped (may be NULL) */
    alignas(max_align_t) unsigned char arg[DT__SIM_ARG_MAX];
} item;

typedef struct stream {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work;   /* submitted > done, or stop */
    pthread_cond_t done_cv; /* done advanced */
    uint64_t submitted, done;
    int stop;
    dt_status err;         /* first failure since the last sync */
    char msg[1024];
    item ring[RING];
} stream;

static stream *streams;
static int nstreams;

static void *stream_main(void *p)
{
    stream *s = p;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->done == s->submitted && !s->stop)
            pthread_cond_wait(&s->work, &s->lock);
        if (s->done == s->submitted)
            break; /* stopping, and nothing left */
        item *it = &s->ring[s->done % RING];
        int skip = s->err != DT_OK;
        pthread_mutex_unlock(&s->lock);
        /* The slot stays ours until done advances: submit never overwrites a pending item. */
        dt_status st = DT_OK;
        if (!skip) {
            dt_clear_error();
            st = it->fn(it->arg);
        } else if (it->drop) {
            it->drop(it->arg);
        }
        pthread_mutex_lock(&s->lock);
        if (st != DT_OK && s->err == DT_OK) {
            s->err = st;
            dt__strlcpy(s->msg, dt_last_error()[0] ? dt_last_error() : dt_status_str(st),
                        sizeof s->msg);
        }
        s->done++;
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static dt_status lookup(int ordinal, stream **out)
{
    if (ordinal < 0 || ordinal >= nstreams)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "simulated GPU %d: this process has %d "
                         "(ordinals 0..%d)", ordinal, nstreams, nstreams - 1);
    *out = &streams[ordinal];
    return DT_OK;
}

/* Lock held: waits for the queue to drain. */
static void wait_idle(stream *s)
{
    while (s->done != s->submitted)
        pthread_cond_wait(&s->done_cv, &s->lock);
}

/* Lock held: hands the sticky failure, if any, to the calling thread and clears it. */
static dt_status take_error(stream *s)
{
    dt_status st = s->err;
    if (st == DT_OK)
        return DT_OK;
    s->err = DT_OK;
    return dt__error(st, "%s", s->msg);
}

dt_status dt__sim_submit(int ordinal, dt_status (*fn)(void *arg), const void *arg,
                         size_t argsize)
{
    return dt__sim_submit_owned(ordinal, fn, NULL, arg, argsize);
}

dt_status dt__sim_submit_owned(int ordinal, dt_status (*fn)(void *arg), void (*drop)(void *arg),
                               const void *arg, size_t argsize)
{
    stream *s = NULL;
    dt_status st = lookup(ordinal, &s);
    if (st != DT_OK)
        return st;
    if (argsize > DT__SIM_ARG_MAX)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "simulated GPU %d: a %zu-byte closure (at "
                         "most %d)", ordinal, argsize, DT__SIM_ARG_MAX);
    pthread_mutex_lock(&s->lock);
    if (s->err != DT_OK) {
        wait_idle(s); /* what was queued behind the failure is skipped before it is cleared */
        st = take_error(s);
        pthread_mutex_unlock(&s->lock);
        return st;
    }
    while (s->submitted - s->done >= RING)
        pthread_cond_wait(&s->done_cv, &s->lock);
    item *it = &s->ring[s->submitted % RING];
    it->fn = fn;
    it->drop = drop;
    if (argsize)
        memcpy(it->arg, arg, argsize);
    s->submitted++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->lock);
    return DT_OK;
}

dt_status dt__sim_sync(int ordinal)
{
    stream *s = NULL;
    dt_status st = lookup(ordinal, &s);
    if (st != DT_OK)
        return st;
    pthread_mutex_lock(&s->lock);
    wait_idle(s);
    st = take_error(s);
    pthread_mutex_unlock(&s->lock);
    return st;
}

void dt__sim_drain_all(void)
{
    for (int i = 0; i < nstreams; i++) {
        pthread_mutex_lock(&streams[i].lock);
        wait_idle(&streams[i]);
        pthread_mutex_unlock(&streams[i].lock);
    }
}

int dt__sim_num_ordinals(void)
{
    return nstreams;
}

dt_status dt__sim_streams_start(int nordinals)
{
    if (nordinals < 1 || nordinals > MAX_ORDINALS)
        return dt__error(DT_ERR_UNSUPPORTED, "simulated GPUs: %d per process (1..%d)",
                         nordinals, MAX_ORDINALS);
    streams = calloc((size_t)nordinals, sizeof *streams);
    if (!streams)
        return dt__error(DT_ERR_NO_MEMORY, "simulated GPUs: no memory for %d streams",
                         nordinals);
    for (int i = 0; i < nordinals; i++) {
        stream *s = &streams[i];
        pthread_mutex_init(&s->lock, NULL);
        pthread_cond_init(&s->work, NULL);
        pthread_cond_init(&s->done_cv, NULL);
        int rc = pthread_create(&s->thread, NULL, stream_main, s);
        if (rc != 0) {
            pthread_mutex_destroy(&s->lock);
            pthread_cond_destroy(&s->work);
            pthread_cond_destroy(&s->done_cv);
            dt__sim_streams_stop();
            return dt__error(DT_ERR_NO_MEMORY, "simulated GPU %d: starting its stream thread: "
                             "%s", i, strerror(rc));
        }
        nstreams = i + 1;
    }
    return DT_OK;
}

void dt__sim_streams_stop(void)
{
    for (int i = 0; i < nstreams; i++) {
        stream *s = &streams[i];
        pthread_mutex_lock(&s->lock);
        s->stop = 1;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->work);
        pthread_cond_destroy(&s->done_cv);
    }
    free(streams);
    streams = NULL;
    nstreams = 0;
}
