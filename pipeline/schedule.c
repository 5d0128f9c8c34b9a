/* Pipeline schedules (GPipe, 1F1B, interleaved 1F1B): each stage's list of steps, their slots
 * on a unit-time timeline, one global order that respects the dependencies, the bubble, and
 * the printed table (docs/pipeline.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/pipeline.h"
#include "pipeline/pipe_impl.h"
#include "runtime/error.h"

static const char *const kind_names[] = {"gpipe", "1f1b", "interleaved"};

const char *dt_pipe_schedule_kind_name(dt_pipe_schedule_kind kind)
{
    if ((int)kind < 0 || (int)kind > DT_PIPE_INTERLEAVED)
        return "unknown";
    return kind_names[kind];
}

dt_status dt_pipe_schedule_kind_parse(const char *text, dt_pipe_schedule_kind *kind_out)
{
    if (!text || !kind_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_schedule_kind_parse: NULL argument");
    for (int k = 0; k <= DT_PIPE_INTERLEAVED; k++)
        if (strcmp(text, kind_names[k]) == 0) {
            *kind_out = (dt_pipe_schedule_kind)k;
            return DT_OK;
        }
    return dt__error(DT_ERR_INVALID_ARGUMENT,
                     "pipeline schedule '%s' unknown (gpipe, 1f1b or interleaved)", text);
}

/* The k-th forward (or backward) chunk-step of a stage in the interleaved order (Megatron):
 * micro-batches go in groups of P through chunk 0, then the same group through chunk 1, ...;
 * backwards visit the chunks in reverse. */
static void interleaved_pick(int P, int V, int k, int forward, int *micro, int *chunk)
{
    int in_group = k % (P * V);
    int c = in_group / P;
    *chunk = forward ? c : V - 1 - c;
    *micro = (k / (P * V)) * P + k % P;
}

static void put(dt_pipe_step *list, int64_t *n, int stage, int micro, int phase, int chunk)
{
    list[*n] = (dt_pipe_step){.stage = stage, .micro = micro, .phase = phase, .chunk = chunk,
                              .slot = -1};
    (*n)++;
}

/* Fills stage s's list (2*M*V steps). */
static void build_stage(dt_pipe_schedule *s, int st, dt_pipe_step *list)
{
    int P = s->stages, M = s->micro, V = s->chunks;
    int64_t n = 0;
    if (s->kind == DT_PIPE_GPIPE) {
        for (int m = 0; m < M; m++)
            put(list, &n, st, m, DT_PIPE_F, 0);
        for (int m = 0; m < M; m++)
            put(list, &n, st, m, DT_PIPE_B, 0);
        return;
    }
    int total = M * V;
    int warm = V == 1 ? P - st - 1 : (P - st - 1) * 2 + (V - 1) * P;
    if (warm > total)
        warm = total;
    int f = 0, b = 0, micro, chunk;
    for (; f < warm; f++) {
        interleaved_pick(P, V, f, 1, &micro, &chunk);
        put(list, &n, st, micro, DT_PIPE_F, chunk);
    }
    while (f < total) {
        interleaved_pick(P, V, f++, 1, &micro, &chunk);
        put(list, &n, st, micro, DT_PIPE_F, chunk);
        interleaved_pick(P, V, b++, 0, &micro, &chunk);
        put(list, &n, st, micro, DT_PIPE_B, chunk);
    }
    while (b < total) {
        interleaved_pick(P, V, b++, 0, &micro, &chunk);
        put(list, &n, st, micro, DT_PIPE_B, chunk);
    }
}

/* Index of the finish time of (virtual stage v, micro m, phase) in s->finish. */
static int64_t fin_index(const dt_pipe_schedule *s, int v, int m, int phase)
{
    return ((int64_t)v * s->micro + m) * 2 + phase;
}

static int ready(const dt_pipe_schedule *s, const dt_pipe_step *x, int64_t t)
{
    int VP = s->chunks * s->stages;
    int v = x->chunk * s->stages + x->stage;
    const int64_t *fin = s->finish;
    if (x->phase == DT_PIPE_F)
        return v == 0 || (fin[fin_index(s, v - 1, x->micro, DT_PIPE_F)] >= 0 &&
                          fin[fin_index(s, v - 1, x->micro, DT_PIPE_F)] <= t);
    int64_t f = fin[fin_index(s, v, x->micro, DT_PIPE_F)];
    if (f < 0 || f > t)
        return 0;
    if (v == VP - 1)
        return 1;
    int64_t b = fin[fin_index(s, v + 1, x->micro, DT_PIPE_B)];
    return b >= 0 && b <= t;
}

static int by_slot_then_stage(const void *pa, const void *pb)
{
    const dt_pipe_step *a = pa, *b = pb;
    if (a->slot != b->slot)
        return a->slot < b->slot ? -1 : 1;
    return (a->stage > b->stage) - (a->stage < b->stage);
}

/* Places every step on the timeline: a stage starts its next step at the first slot where
 * its dependencies have finished. */
static dt_status simulate(dt_pipe_schedule *s)
{
    int P = s->stages;
    int64_t per = s->per_stage, total = per * P, placed = 0;
    int64_t *next = calloc((size_t)P, sizeof *next);
    if (!next)
        return dt__error(DT_ERR_NO_MEMORY, "pipeline schedule: no memory");
    for (int64_t t = 0; placed < total; t++) {
        int progress = 0;
        for (int st = 0; st < P; st++) {
            if (next[st] == per)
                continue;
            dt_pipe_step *x = &s->steps[st * per + next[st]];
            if (!ready(s, x, t))
                continue;
            x->slot = t;
            s->finish[fin_index(s, x->chunk * P + x->stage, x->micro, x->phase)] = t + 1;
            next[st]++;
            placed++;
            progress = 1;
            if (t + 1 > s->length)
                s->length = t + 1;
        }
        if (!progress && t > s->length + 1) {
            free(next);
            return dt__error(DT_ERR_STATE, "pipeline schedule %s P=%d M=%d V=%d deadlocks "
                             "(internal error)", dt_pipe_schedule_kind_name(s->kind), P,
                             s->micro, s->chunks);
        }
    }
    free(next);
    memcpy(s->order, s->steps, (size_t)total * sizeof *s->order);
    qsort(s->order, (size_t)total, sizeof *s->order, by_slot_then_stage);
    return DT_OK;
}

dt_status dt_pipe_schedule_create(dt_pipe_schedule_kind kind, int stages, int micro,
                                  int chunks, dt_pipe_schedule **sched_out)
{
    if (!sched_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_schedule_create: NULL sched_out");
    if ((int)kind < 0 || (int)kind > DT_PIPE_INTERLEAVED)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_schedule_create: unknown kind %d",
                         (int)kind);
    if (stages < 1 || stages > 4096 || micro < 1 || micro > (1 << 20))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_schedule_create: %d stages and %d "
                         "micro-batches (need 1..4096 and 1..%d)", stages, micro, 1 << 20);
    if (chunks < 1 || chunks > 64 || (kind != DT_PIPE_INTERLEAVED && chunks != 1))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_schedule_create: %d chunks per stage "
                         "(%s takes 1%s)", chunks, dt_pipe_schedule_kind_name(kind),
                         kind == DT_PIPE_INTERLEAVED ? " to 64" : "");
    if (kind == DT_PIPE_INTERLEAVED && chunks > 1 && micro % stages != 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_schedule_create: interleaved 1F1B "
                         "needs the micro-batches (%d) to be a multiple of the stages (%d)",
                         micro, stages);
    int64_t per = 2 * (int64_t)micro * chunks, total = per * stages;
    if (total > ((int64_t)1 << 26))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_schedule_create: %lld steps is too "
                         "many", (long long)total);
    dt_pipe_schedule *s = calloc(1, sizeof *s);
    if (!s)
        return dt__error(DT_ERR_NO_MEMORY, "dt_pipe_schedule_create: no memory");
    s->kind = kind;
    s->stages = stages;
    s->micro = micro;
    s->chunks = chunks;
    s->per_stage = per;
    s->steps = malloc((size_t)total * sizeof *s->steps);
    s->order = malloc((size_t)total * sizeof *s->order);
    s->finish = malloc((size_t)total * sizeof *s->finish);
    s->peak = calloc((size_t)stages, sizeof *s->peak);
    if (!s->steps || !s->order || !s->finish || !s->peak) {
        dt_pipe_schedule_destroy(s);
        return dt__error(DT_ERR_NO_MEMORY, "dt_pipe_schedule_create: no memory");
    }
    for (int64_t i = 0; i < total; i++)
        s->finish[i] = -1;
    for (int st = 0; st < stages; st++) {
        build_stage(s, st, &s->steps[st * per]);
        int live = 0;
        for (int64_t i = 0; i < per; i++) {
            live += s->steps[st * per + i].phase == DT_PIPE_F ? 1 : -1;
            if (live > s->peak[st])
                s->peak[st] = live;
        }
    }
    dt_status st = simulate(s);
    if (st != DT_OK) {
        dt_pipe_schedule_destroy(s);
        return st;
    }
    *sched_out = s;
    return DT_OK;
}

void dt_pipe_schedule_destroy(dt_pipe_schedule *sched)
{
    if (!sched)
        return;
    free(sched->steps);
    free(sched->order);
    free(sched->finish);
    free(sched->peak);
    free(sched);
}

dt_pipe_schedule_kind dt_pipe_schedule_kind_of(const dt_pipe_schedule *s) { return s->kind; }
int dt_pipe_schedule_stages(const dt_pipe_schedule *s) { return s->stages; }
int dt_pipe_schedule_micro(const dt_pipe_schedule *s) { return s->micro; }
int dt_pipe_schedule_chunks(const dt_pipe_schedule *s) { return s->chunks; }
int64_t dt_pipe_schedule_length(const dt_pipe_schedule *s) { return s->length; }

int64_t dt_pipe_schedule_num_steps(const dt_pipe_schedule *s, int stage)
{
    return stage >= 0 && stage < s->stages ? s->per_stage : 0;
}

int64_t dt_pipe_schedule_total_steps(const dt_pipe_schedule *s)
{
    return s->per_stage * s->stages;
}

const dt_pipe_step *dt_pipe_schedule_step(const dt_pipe_schedule *s, int stage, int64_t i)
{
    if (stage < 0 || stage >= s->stages || i < 0 || i >= s->per_stage)
        return NULL;
    return &s->steps[stage * s->per_stage + i];
}

const dt_pipe_step *dt_pipe_schedule_global_step(const dt_pipe_schedule *s, int64_t i)
{
    if (i < 0 || i >= s->per_stage * s->stages)
        return NULL;
    return &s->order[i];
}

double dt_pipe_schedule_bubble(const dt_pipe_schedule *s)
{
    double all = (double)s->stages * (double)s->length;
    return all > 0 ? (all - (double)(s->per_stage * s->stages)) / all : 0.0;
}

int dt_pipe_schedule_peak_live(const dt_pipe_schedule *s, int stage)
{
    return stage >= 0 && stage < s->stages ? s->peak[stage] : -1;
}

double dt_pipe_bubble_theory(int stages, int micro, int chunks)
{
    if (stages < 1 || micro < 1 || chunks < 1)
        return 0.0;
    return (double)(stages - 1) / ((double)chunks * micro + stages - 1);
}

/* snprintf into buf at *at, counting what the full text needs. */
static void emit(char *buf, size_t len, size_t *at, const char *text)
{
    size_t n = strlen(text);
    if (*at < len) {
        size_t room = len - *at;
        memcpy(buf + *at, text, n < room ? n : room);
    }
    *at += n;
}

static void cell_text(const dt_pipe_schedule *s, const dt_pipe_step *x, char *out, size_t n)
{
    if (!x)
        snprintf(out, n, ".");
    else if (s->chunks > 1)
        snprintf(out, n, "%c%d.%d", x->phase == DT_PIPE_F ? 'F' : 'B', x->micro, x->chunk);
    else
        snprintf(out, n, "%c%d", x->phase == DT_PIPE_F ? 'F' : 'B', x->micro);
}

size_t dt_pipe_schedule_format(const dt_pipe_schedule *s, char *buf, size_t len)
{
    char cell[48];
    int width = 1;
    for (int64_t i = 0; i < s->per_stage * s->stages; i++) {
        cell_text(s, &s->steps[i], cell, sizeof cell);
        if ((int)strlen(cell) > width)
            width = (int)strlen(cell);
    }
    size_t at = 0;
    for (int st = 0; st < s->stages; st++) {
        char head[32];
        snprintf(head, sizeof head, "stage %d:", st);
        emit(buf, len, &at, head);
        const dt_pipe_step *list = &s->steps[st * s->per_stage];
        int64_t k = 0, pending_pad = 0;
        for (int64_t t = 0; t < s->length; t++) {
            const dt_pipe_step *x = k < s->per_stage && list[k].slot == t ? &list[k++] : NULL;
            cell_text(s, x, cell, sizeof cell);
            if (!x && k == s->per_stage)
                break; /* no trailing idle cells */
            char pad[64];
            snprintf(pad, sizeof pad, "%*s", (int)pending_pad + 1, "");
            emit(buf, len, &at, pad);
            emit(buf, len, &at, cell);
            pending_pad = width - (int64_t)strlen(cell);
        }
        emit(buf, len, &at, "\n");
    }
    if (len > 0)
        buf[at < len ? at : len - 1] = '\0';
    return at;
}
