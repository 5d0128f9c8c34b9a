/* autograd/tape: tapes' life cycle, the thread's recording state (recording tape, no-grad
 * depth, backward running), watched tensors, gradients held, segments and statistics. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/tape_impl.h"
#include "dtensor/ops.h"
#include "runtime/error.h"

/* ---- the live tapes (for "recorded on another tape") ----------------------------------- */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static dt_tape **registry;
static int nregistry, registry_cap;

void dt__ag_map_lock(void)
{
    pthread_mutex_lock(&registry_lock);
}
void dt__ag_map_unlock(void)
{
    pthread_mutex_unlock(&registry_lock);
}

int dt__ag_other_tape_has(const dt_tape *self, const dt_tensor *t)
{
    int found = 0;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < nregistry && !found; i++)
        if (registry[i] != self) {
            /* Only another tape's recorded outputs: a watched tensor may be on several. */
            int64_t v = dt__ag_find(registry[i], t);
            found = v >= 0 && registry[i]->values[v].producer >= 0;
        }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

/* ---- thread state ------------------------------------------------------------------- */

static _Thread_local dt_tape *tls_tape;
static _Thread_local int tls_nograd;
static _Thread_local int tls_backward;

static void tls_update(void)
{
    dt__rec_tls = (tls_tape && tls_nograd == 0 && !tls_backward) ? &tls_tape->rec : NULL;
}

void dt__ag_set_backward(int on)
{
    tls_backward = on;
    tls_update();
}

dt_tape *dt_tape_current(void)
{
    return tls_tape;
}

void dt_no_grad_begin(void)
{
    tls_nograd++;
    tls_update();
}

void dt_no_grad_end(void)
{
    if (tls_nograd > 0)
        tls_nograd--;
    tls_update();
}

int dt_grad_enabled(void)
{
    return tls_tape && tls_nograd == 0 && !tls_backward;
}

/* ---- life cycle ----------------------------------------------------------------------- */

dt_status dt_tape_create(const dt_tape_opts *opts, dt_tape **tape_out)
{
    if (!tape_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tape_create: NULL tape_out");
    dt_tape *tape = calloc(1, sizeof *tape);
    if (!tape)
        return dt__error(DT_ERR_NO_MEMORY, "dt_tape_create: cannot allocate the tape");
    dt_tape_opts def = DT_TAPE_OPTS_INIT;
    tape->opts = opts ? *opts : def;
    tape->rec.record = dt__ag_record;
    tape->open_seg = -1;
    pthread_mutex_lock(&registry_lock);
    if (nregistry == registry_cap) {
        int cap = registry_cap ? registry_cap * 2 : 8;
        dt_tape **nr = realloc(registry, (size_t)cap * sizeof *nr);
        if (!nr) {
            pthread_mutex_unlock(&registry_lock);
            free(tape);
            return dt__error(DT_ERR_NO_MEMORY, "dt_tape_create: cannot register the tape");
        }
        registry = nr;
        registry_cap = cap;
    }
    registry[nregistry++] = tape;
    pthread_mutex_unlock(&registry_lock);
    *tape_out = tape;
    return DT_OK;
}

void dt_tape_destroy(dt_tape *tape)
{
    if (!tape)
        return;
    if (tls_tape == tape) {
        tls_tape = NULL;
        tls_update();
    }
    dt__ag_drop_recording(tape);
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < nregistry; i++)
        if (registry[i] == tape) {
            registry[i] = registry[--nregistry];
            break;
        }
    if (nregistry == 0) {
        free(registry);
        registry = NULL;
        registry_cap = 0;
    }
    pthread_mutex_unlock(&registry_lock);
    for (int i = 0; i < tape->nwatch; i++) {
        dt_tensor_destroy(tape->watch[i].t);
        dt_tensor_destroy(tape->watch[i].grad);
    }
    free(tape->watch);
    free(tape->values);
    free(tape->map);
    free(tape->nodes);
    free(tape->segs);
    free(tape);
}

/* The watched tensors become values of a new recording. */
static dt_status add_watched(dt_tape *tape, int index)
{
    ag_watch *w = &tape->watch[index];
    int64_t v;
    dt_status st = dt__ag_value_add(tape, w->t, &v);
    if (st != DT_OK)
        return st;
    tape->values[v].requires_grad = 1;
    tape->values[v].watch = index;
    w->value = v;
    return DT_OK;
}

dt_status dt_tape_begin(dt_tape *tape)
{
    if (!tape)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tape_begin: NULL tape");
    if (tls_tape)
        return dt__error(DT_ERR_STATE, "dt_tape_begin: %s already records on this thread",
                         tls_tape == tape ? "this tape" : "another tape");
    if (tape->recording)
        return dt__error(DT_ERR_STATE, "dt_tape_begin: the tape records on another thread");
    dt__ag_drop_recording(tape);
    for (int i = 0; i < tape->nwatch; i++)
        if (tape->watch[i].t) {
            dt_status st = add_watched(tape, i);
            if (st != DT_OK) {
                dt__ag_drop_recording(tape);
                return st;
            }
        }
    tape->has_recording = 1;
    tape->recording = 1;
    tls_tape = tape;
    tls_update();
    return DT_OK;
}

dt_status dt_tape_end(dt_tape *tape)
{
    if (!tape)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tape_end: NULL tape");
    if (tls_tape != tape)
        return dt__error(DT_ERR_STATE, "dt_tape_end: the tape does not record on this thread");
    if (tape->open_seg >= 0)
        return dt__error(DT_ERR_STATE, "dt_tape_end: checkpoint segment %d is still open",
                         tape->open_seg);
    tape->recording = 0;
    tls_tape = NULL;
    tls_update();
    return DT_OK;
}

/* ---- watching --------------------------------------------------------------------------- */

dt_status dt_tape_watch(dt_tape *tape, const dt_tensor *param, int index)
{
    if (!tape || index < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tape_watch: %s",
                         !tape ? "NULL tape" : "negative index");
    for (int i = 0; param && i < tape->nwatch; i++)
        if (i != index && tape->watch[i].t == param)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "dt_tape_watch: the tensor is already watched as index %d", i);
    if (index >= tape->nwatch) {
        if (!param)
            return DT_OK;
        ag_watch *nw = realloc(tape->watch, (size_t)(index + 1) * sizeof *nw);
        if (!nw)
            return dt__error(DT_ERR_NO_MEMORY, "dt_tape_watch: cannot grow the watch list");
        for (int i = tape->nwatch; i <= index; i++)
            nw[i] = (ag_watch){NULL, -1, NULL};
        tape->watch = nw;
        tape->nwatch = index + 1;
    }
    ag_watch *w = &tape->watch[index];
    if (w->t == param)
        return DT_OK;
    dt_tensor *old = w->t;
    w->t = param ? dt_tensor_retain(param) : NULL;
    if (tape->has_recording) {
        if (w->value >= 0) {
            /* Rebinding (ZeRO stage 3): the same value, now this tensor. */
            ag_value *val = &tape->values[w->value];
            if (!param) {
                val->requires_grad = 0;
                val->watch = -1;
                w->value = -1;
            } else {
                val->t = param;
                val->serial = dt__tensor_serial(param);
                dt_status st = dt__ag_map_insert(tape, w->value);
                if (st != DT_OK) {
                    dt_tensor_destroy(w->t);
                    w->t = old;
                    return st;
                }
            }
        } else if (param) {
            int64_t found = dt__ag_find(tape, param);
            if (found >= 0) {
                tape->values[found].requires_grad = 1;
                tape->values[found].watch = index;
                w->value = found;
            } else {
                dt_status st = add_watched(tape, index);
                if (st != DT_OK) {
                    dt_tensor_destroy(w->t);
                    w->t = old;
                    return st;
                }
            }
        }
    }
    dt_tensor_destroy(old);
    return DT_OK;
}

int dt_tape_requires_grad(const dt_tape *tape, const dt_tensor *x)
{
    if (!tape || !x)
        return 0;
    if (!tape->has_recording || tape->consumed) {
        for (int i = 0; i < tape->nwatch; i++)
            if (tape->watch[i].t == x)
                return 1;
        return 0;
    }
    int64_t v = dt__ag_find(tape, x);
    return v >= 0 && tape->values[v].requires_grad;
}

dt_status dt_detach(const dt_tensor *x, dt_tensor **out)
{
    if (!x || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_detach: NULL %s", !x ? "x" : "out");
    dt_dtype t = dt_tensor_dtype(x);
    if (!(t == DT_DTYPE_F32 || t == DT_DTYPE_F64 || t == DT_DTYPE_F16 || t == DT_DTYPE_BF16)) {
        *out = dt_tensor_retain(x); /* integers never carry a gradient: nothing to detach */
        return DT_OK;
    }
    dt_no_grad_begin();
    dt_status st = dt_cast(x, t, out);
    dt_no_grad_end();
    return st;
}

/* ---- gradients held ---------------------------------------------------------------------- */

static dt_status check_index(const char *fn, const dt_tape *tape, int index, const void *out)
{
    if (!tape || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, !tape ? "tape" : "grad_out");
    if (index < 0 || index >= tape->nwatch || !tape->watch[index].t)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: index %d is not watched", fn, index);
    return DT_OK;
}

dt_status dt_tape_grad(const dt_tape *tape, int index, const dt_tensor **grad_out)
{
    dt_status st = check_index("dt_tape_grad", tape, index, grad_out);
    if (st == DT_OK)
        *grad_out = tape->watch[index].grad;
    return st;
}

dt_status dt_tape_take_grad(dt_tape *tape, int index, dt_tensor **grad_out)
{
    dt_status st = check_index("dt_tape_take_grad", tape, index, grad_out);
    if (st == DT_OK) {
        *grad_out = tape->watch[index].grad;
        tape->watch[index].grad = NULL;
    }
    return st;
}

void dt_tape_zero_grad(dt_tape *tape)
{
    if (!tape)
        return;
    for (int i = 0; i < tape->nwatch; i++) {
        dt_tensor_destroy(tape->watch[i].grad);
        tape->watch[i].grad = NULL;
    }
}

dt_status dt_tape_reset(dt_tape *tape)
{
    if (!tape)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tape_reset: NULL tape");
    if (tape->recording)
        return dt__error(DT_ERR_STATE, "dt_tape_reset: the tape records (dt_tape_end first)");
    dt__ag_drop_recording(tape);
    dt_tape_zero_grad(tape);
    return DT_OK;
}

/* ---- segments ------------------------------------------------------------------------------ */

dt_status dt_tape_checkpoint_begin(dt_tape *tape, const dt_checkpoint_opts *opts)
{
    if (!tape)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tape_checkpoint_begin: NULL tape");
    if (tls_tape != tape)
        return dt__error(DT_ERR_STATE,
                         "dt_tape_checkpoint_begin: the tape does not record on this thread");
    if (tape->open_seg >= 0)
        return dt__error(DT_ERR_STATE,
                         "dt_tape_checkpoint_begin: segment %d is open "
                         "(segments do not nest)",
                         tape->open_seg);
    if (tape->nsegs == tape->segs_cap) {
        int cap = tape->segs_cap ? tape->segs_cap * 2 : 8;
        ag_segment *ns = realloc(tape->segs, (size_t)cap * sizeof *ns);
        if (!ns)
            return dt__error(DT_ERR_NO_MEMORY, "dt_tape_checkpoint_begin: out of memory");
        tape->segs = ns;
        tape->segs_cap = cap;
    }
    ag_segment *seg = &tape->segs[tape->nsegs];
    memset(seg, 0, sizeof *seg);
    dt_checkpoint_opts def = DT_CHECKPOINT_OPTS_INIT;
    seg->opts = opts ? *opts : def;
    seg->first = tape->nnodes;
    seg->last = tape->nnodes - 1;
    tape->open_seg = tape->nsegs++;
    return DT_OK;
}

/* A selective segment (recompute with keep_ops) holds the outputs of the kept kinds as they
 * are recorded; at its end it lets go of those its backward will not read. Read are: an
 * output its own rule saves, an input a rule saves, and an input of a record the backward
 * re-runs (one whose output is read and not kept): the marking of autograd/backward.c's
 * recompute. Outputs used after the segment are held by the records that use them. */
static dt_status prune_kept(dt_tape *tape, const ag_segment *seg)
{
    unsigned char *need = calloc((size_t)(tape->nvalues > 0 ? tape->nvalues : 1), 1);
    if (!need)
        return dt__error(DT_ERR_NO_MEMORY, "dt_tape_checkpoint_end: out of memory");
    for (int64_t n = seg->last; n >= seg->first; n--) {
        ag_node *node = &tape->nodes[n];
        int kept = node->saved_out != NULL;
        int read = need[node->out] || (node->rule && node->rule->save_out);
        if (kept && !read) {
            dt__ag_unhold(tape, node->out);
            dt_tensor_destroy(node->saved_out);
            node->saved_out = NULL;
        }
        for (int i = 0; i < node->nin; i++)
            if ((!kept && read) || (node->rule && (node->rule->save_in >> i & 1)))
                need[node->in[i]] = 1;
    }
    free(need);
    return DT_OK;
}

dt_status dt_tape_checkpoint_end(dt_tape *tape)
{
    if (!tape)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tape_checkpoint_end: NULL tape");
    if (tape->open_seg < 0)
        return dt__error(DT_ERR_STATE, "dt_tape_checkpoint_end: no segment is open");
    const ag_segment *seg = &tape->segs[tape->open_seg];
    tape->open_seg = -1;
    if (seg->opts.recompute && seg->opts.keep_ops)
        return prune_kept(tape, seg);
    return DT_OK;
}

/* ---- statistics -------------------------------------------------------------------------- */

dt_status dt_tape_get_stats(const dt_tape *tape, dt_tape_stats *stats_out)
{
    if (!tape || !stats_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tape_get_stats: NULL argument");
    dt_tape_stats s = {0};
    s.nodes = tape->nnodes;
    for (int64_t n = 0; n < tape->nnodes; n++)
        s.nodes_pending += !tape->nodes[n].done;
    s.saved_tensors = tape->saved_tensors;
    s.saved_bytes = tape->saved_bytes;
    s.peak_saved_bytes = tape->peak_saved_bytes;
    for (int64_t v = 0; v < tape->nvalues; v++) {
        const ag_value *val = &tape->values[v];
        if (val->grad) {
            s.grad_tensors++;
            s.grad_bytes += dt__ag_local_bytes(val->grad);
        }
        for (int k = 0; val->contrib && k < val->ncontrib_cap; k++)
            if (val->contrib[k]) {
                s.grad_tensors++;
                s.grad_bytes += dt__ag_local_bytes(val->contrib[k]);
            }
    }
    for (int i = 0; i < tape->nwatch; i++)
        if (tape->watch[i].grad) {
            s.grad_tensors++;
            s.grad_bytes += dt__ag_local_bytes(tape->watch[i].grad);
        }
    s.recomputed = tape->recomputed;
    *stats_out = s;
    return DT_OK;
}
