/* bench_pipeline: pipeline parallelism over P processes (one CPU device each, mesh pipe=P):
 * for GPipe, 1F1B and interleaved 1F1B, the measured bubble (the stages' idle share of the
 * step) against (P-1)/(V*M+P-1), the peak activation memory the tapes hold, and the step
 * time against the same devices without pipelining (data parallel over batch=P, every layer
 * on every device), measured in the same run (docs/bench.md). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"
#include "dtensor/pipeline.h"

enum { MAX_STEPS = 200, IN_INDEX = 100000 };

typedef struct opts {
    int micro, layers, width, rows, steps, chunks;
} opts;

typedef struct net {
    const opts *o;
    dt_pipe *pipe;
    int P, V, VP;
    dt_tensor **w;      /* [layers], this client's stage's only */
    dt_tensor **acc;
    dt_tensor *x;       /* one micro-batch's input, on stage 0 */
    dt_tensor *labels;  /* on the last stage */
    dt_tape **tape;     /* [VP * micro] */
    dt_tensor **out;
    uint64_t *held;     /* [VP * micro]: bytes the tape of that step holds */
    uint64_t live, peak;
} net;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int ok_or_say(dt_status st, const char *what)
{
    if (st != DT_OK)
        fprintf(stderr, "# bench_pipeline: %s: %s: %s\n", what, dt_status_name(st),
                dt_last_error());
    return st == DT_OK;
}

static dt_tensor *filled(const dt_layout *l, int rank, const int64_t *shape, float scale,
                         unsigned seed)
{
    dt_tensor *t = NULL;
    if (!ok_or_say(dt_tensor_zeros(l, DT_DTYPE_F32, shape, &t), "dt_tensor_zeros"))
        return NULL;
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *dl = dt_tensor_local(t, i);
        int64_t n = 1;
        for (int d = 0; d < rank; d++)
            n *= dl->shape[d];
        float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
        for (int64_t e = 0; e < n; e++)
            h[e] = scale * (float)((int)((e * 2654435761u + seed) % 17) - 8) / 8.0f;
        dt_tensor_local_write(t, i, h, (size_t)n * sizeof *h);
        free(h);
    }
    return t;
}

static dt_tensor *make_labels(const dt_mesh *m, int rows, int classes)
{
    dt_layout *l = NULL;
    dt_tensor *t = NULL;
    const char *spec[1] = {"batch"};
    int64_t shape[1] = {rows};
    if (!ok_or_say(dt_layout_create(m, 1, spec, &l), "labels layout") ||
        !ok_or_say(dt_tensor_zeros(l, DT_DTYPE_I32, shape, &t), "labels")) {
        dt_layout_destroy(l);
        return NULL;
    }
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        int64_t n = dt_tensor_local(t, i)->shape[0];
        int32_t *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
        for (int64_t e = 0; e < n; e++)
            h[e] = (int32_t)(e % classes);
        dt_tensor_local_write(t, i, h, (size_t)n * sizeof *h);
        free(h);
    }
    dt_layout_destroy(l);
    return t;
}

/* Layers [lo, hi) of matmul + relu (none after the last layer). */
static dt_status layers(dt_tensor *const *w, int lo, int hi, int last, const dt_tensor *h,
                        dt_tensor **out)
{
    dt_tensor *cur = dt_tensor_retain(h);
    dt_status st = DT_OK;
    for (int l = lo; l < hi && st == DT_OK; l++) {
        dt_tensor *y = NULL, *z = NULL;
        st = dt_matmul(cur, w[l], 0, 0, NULL, &y);
        dt_tensor_destroy(cur);
        cur = y;
        if (st == DT_OK && l < last) {
            st = dt_relu(y, &z);
            dt_tensor_destroy(y);
            cur = z;
        }
    }
    if (st != DT_OK) {
        dt_tensor_destroy(cur);
        return st;
    }
    *out = cur;
    return DT_OK;
}

static dt_status accumulate(dt_tensor **acc, dt_tensor *g)
{
    if (!*acc) {
        *acc = g;
        return DT_OK;
    }
    dt_tensor *s = NULL;
    dt_status st = dt_add(*acc, g, NULL, &s);
    dt_tensor_destroy(g);
    if (st == DT_OK) {
        dt_tensor_destroy(*acc);
        *acc = s;
    }
    return st;
}

static dt_status fwd(void *arg, int stage, int chunk, int micro, const dt_tensor *in,
                     dt_tensor **out)
{
    net *n = arg;
    int v = chunk * n->P + stage, per = n->o->layers / n->VP, lo = v * per, k = v * n->o->micro + micro;
    dt_tape_opts to = DT_TAPE_OPTS_INIT;
    to.accumulate = 0;
    dt_status st = dt_tape_create(&to, &n->tape[k]);
    for (int l = lo; l < lo + per && st == DT_OK; l++)
        st = dt_tape_watch(n->tape[k], n->w[l], l);
    if (st == DT_OK && in)
        st = dt_tape_watch(n->tape[k], in, IN_INDEX);
    if (st == DT_OK)
        st = dt_tape_begin(n->tape[k]);
    if (st != DT_OK)
        return st;
    dt_tensor *h = NULL;
    st = layers(n->w, lo, lo + per, n->o->layers - 1, in ? in : n->x, &h);
    *out = NULL;
    if (st == DT_OK && v == n->VP - 1) {
        dt_tensor *loss = NULL;
        st = dt_softmax_xent(h, n->labels, NULL, &loss);
        dt_tensor_destroy(h);
        n->out[k] = loss;
    } else if (st == DT_OK) {
        n->out[k] = h;
        *out = dt_tensor_retain(h);
    }
    dt_status est = dt_tape_end(n->tape[k]);
    dt_tape_stats ts;
    if (dt_tape_get_stats(n->tape[k], &ts) == DT_OK) {
        n->held[k] = ts.saved_bytes;
        n->live += ts.saved_bytes;
        if (n->live > n->peak)
            n->peak = n->live;
    }
    return st != DT_OK ? st : est;
}

static dt_status bwd(void *arg, int stage, int chunk, int micro, const dt_tensor *gout,
                     dt_tensor **gin)
{
    net *n = arg;
    int v = chunk * n->P + stage, per = n->o->layers / n->VP, lo = v * per, k = v * n->o->micro + micro;
    dt_status st = dt_tape_backward(n->tape[k], n->out[k], gout, 1.0f, NULL);
    for (int l = lo; l < lo + per && st == DT_OK; l++) {
        dt_tensor *g = NULL;
        st = dt_tape_take_grad(n->tape[k], l, &g);
        if (st == DT_OK)
            st = accumulate(&n->acc[l], g);
    }
    *gin = NULL;
    if (st == DT_OK && v > 0)
        st = dt_tape_take_grad(n->tape[k], IN_INDEX, gin);
    dt_tape_destroy(n->tape[k]);
    n->tape[k] = NULL;
    dt_tensor_destroy(n->out[k]);
    n->out[k] = NULL;
    n->live -= n->held[k];
    return st;
}

static dt_status sgd(dt_tensor **w, dt_tensor **acc, int l)
{
    dt_status st = dt_axpy(-0.01f, acc[l], w[l]);
    dt_tensor_destroy(acc[l]);
    acc[l] = NULL;
    return st;
}

static int layer_stage(const net *n, int l) { return (l / (n->o->layers / n->VP)) % n->P; }

/* One schedule: `steps` timed steps after one warm-up. */
static int run_schedule(const opts *o, dt_pipe *pipe, dt_pipe_schedule_kind kind, int V,
                        double ref_step)
{
    int P = dt_pipe_num_stages(pipe), ok = 1;
    net n = {.o = o, .pipe = pipe, .P = P, .V = V, .VP = P * V};
    size_t k = (size_t)n.VP * o->micro;
    n.w = calloc((size_t)o->layers, sizeof *n.w);
    n.acc = calloc((size_t)o->layers, sizeof *n.acc);
    n.tape = calloc(k, sizeof *n.tape);
    n.out = calloc(k, sizeof *n.out);
    n.held = calloc(k, sizeof *n.held);
    dt_pipe_schedule *s = NULL;
    ok = ok_or_say(dt_pipe_schedule_create(kind, P, o->micro, V, &s), "schedule");
    int64_t wshape[2] = {o->width, o->width}, xshape[2] = {o->rows, o->width};
    for (int l = 0; ok && l < o->layers; l++) {
        int st = layer_stage(&n, l);
        if (!dt_pipe_holds_stage(pipe, st))
            continue;
        dt_layout *rep = NULL;
        ok = ok_or_say(dt_layout_replicated(dt_pipe_stage_mesh(pipe, st), 2, &rep), "layout");
        if (ok)
            ok = (n.w[l] = filled(rep, 2, wshape, 0.5f / 8.0f, (unsigned)l)) != NULL;
        dt_layout_destroy(rep);
    }
    const char *spec[2] = {"batch", "unsharded"};
    if (ok && dt_pipe_holds_stage(pipe, 0)) {
        dt_layout *l = NULL;
        ok = ok_or_say(dt_layout_create(dt_pipe_stage_mesh(pipe, 0), 2, spec, &l), "layout");
        if (ok)
            ok = (n.x = filled(l, 2, xshape, 1.0f, 7)) != NULL;
        dt_layout_destroy(l);
    }
    if (ok && dt_pipe_holds_stage(pipe, P - 1))
        ok = (n.labels = make_labels(dt_pipe_stage_mesh(pipe, P - 1), o->rows, o->width)) != NULL;
    dt_pipe_run_opts ro = DT_PIPE_RUN_OPTS_INIT;
    ro.forward = fwd;
    ro.backward = bwd;
    ro.arg = &n;
    ro.act_rank = 2;
    ro.act_specs = spec;
    ro.act_shape = xshape;
    double times[MAX_STEPS], busy = 0, wall = 0, comm = 0;
    dt_pipe_reset_stats(pipe);
    for (int step = -1; ok && step < o->steps; step++) {
        dt_pipe_run_stats rs;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        ok = bu_ok_all(ok_or_say(dt_pipe_run(pipe, s, &ro, &rs), "dt_pipe_run"));
        for (int l = 0; ok && l < o->layers; l++)
            if (n.w[l])
                ok = ok_or_say(sgd(n.w, n.acc, l), "sgd");
        double t = bu_max_all(now() - t0);
        if (step >= 0 && ok) {
            times[step] = t;
            busy += rs.busy_seconds;
            wall += rs.wall_seconds;
            comm += rs.comm_seconds;
        }
    }
    if (ok) {
        /* Measured bubble: the share of the stages' time outside the callbacks. */
        double busy_all = 0, wall_max = 0, peak = (double)n.peak, peak_max = 0, comm_all = 0;
        MPI_Allreduce(&busy, &busy_all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(&comm, &comm_all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(&wall, &wall_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&peak, &peak_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        dt_pipe_stats ps;
        dt_pipe_get_stats(pipe, &ps);
        double sent = (double)ps.bytes_sent, sent_all = 0;
        MPI_Allreduce(&sent, &sent_all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double step_s = bu_median(times, o->steps);
        if (dt_client_id() == 0) {
            bu_line line;
            bu_line_init(&line);
            bu_line_add(&line, "case", "pipeline");
            bu_line_add(&line, "schedule", "%s", dt_pipe_schedule_kind_name(kind));
            bu_line_add(&line, "np", "%d", dt_num_clients());
            bu_line_add(&line, "stages", "%d", P);
            bu_line_add(&line, "micro", "%d", o->micro);
            bu_line_add(&line, "chunks", "%d", V);
            bu_line_add(&line, "layers", "%d", o->layers);
            bu_line_add(&line, "width", "%d", o->width);
            bu_line_add(&line, "rows", "%d", o->rows);
            bu_line_add(&line, "bubble", "%.4f", 1.0 - busy_all / (P * wall_max));
            /* Of the bubble, the share spent inside sends, receives and the flush (waiting
             * for the neighbour included: a receive waits until its data come). */
            bu_line_add(&line, "comm_share", "%.4f", comm_all / (P * wall_max));
            bu_line_add(&line, "bubble_theory", "%.4f", dt_pipe_bubble_theory(P, o->micro, V));
            bu_line_add(&line, "bubble_table", "%.4f", dt_pipe_schedule_bubble(s));
            bu_line_add(&line, "peak_live", "%d", dt_pipe_schedule_peak_live(s, 0));
            bu_line_add(&line, "peak_act_bytes", "%.0f", peak_max);
            bu_line_add(&line, "boundary_bytes_per_step", "%.0f",
                        sent_all / (o->steps + 1));
            bu_line_add(&line, "step_s", "%.6f", step_s);
            bu_line_add(&line, "ref_step_s", "%.6f", ref_step);
            bu_line_add(&line, "vs_ref", "%.3f", ref_step > 0 ? step_s / ref_step : 0.0);
            bu_line_print(&line);
        }
    }
    for (size_t i = 0; i < k; i++) {
        dt_tape_destroy(n.tape[i]);
        dt_tensor_destroy(n.out[i]);
    }
    for (int l = 0; l < o->layers; l++) {
        dt_tensor_destroy(n.w[l]);
        dt_tensor_destroy(n.acc[l]);
    }
    dt_tensor_destroy(n.x);
    dt_tensor_destroy(n.labels);
    free(n.w);
    free(n.acc);
    free(n.tape);
    free(n.out);
    free(n.held);
    dt_pipe_schedule_destroy(s);
    return ok;
}

/* The same devices without pipelining: data parallel over batch=P, every layer everywhere,
 * the same M micro-batches of `rows` rows globally (each device its rows/P share), gradients
 * accumulated and all-reduced by the update. Returns the median step time (0 on failure). */
static double reference(const opts *o)
{
    const char *names[1] = {"batch"};
    int64_t sizes[1] = {dt_num_global_devices(DT_DEVICE_CPU)};
    dt_mesh *m = NULL;
    if (!ok_or_say(dt_mesh_create("dp", 1, names, sizes, DT_DEVICE_CPU, &m), "mesh"))
        return 0;
    dt_layout *rep = NULL, *xl = NULL;
    const char *spec[2] = {"batch", "unsharded"};
    int ok = ok_or_say(dt_layout_replicated(m, 2, &rep), "layout") &&
             ok_or_say(dt_layout_create(m, 2, spec, &xl), "layout");
    int64_t wshape[2] = {o->width, o->width}, xshape[2] = {o->rows, o->width};
    dt_tensor **w = calloc((size_t)o->layers, sizeof *w), **acc = calloc((size_t)o->layers, sizeof *acc);
    dt_tensor *x = ok ? filled(xl, 2, xshape, 1.0f, 7) : NULL, *lab = ok ? make_labels(m, o->rows, o->width) : NULL;
    ok = ok && x && lab;
    for (int l = 0; ok && l < o->layers; l++)
        ok = (w[l] = filled(rep, 2, wshape, 0.5f / 8.0f, (unsigned)l)) != NULL;
    double times[MAX_STEPS];
    for (int step = -1; ok && step < o->steps; step++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        dt_tape *tape = NULL;
        dt_tape_opts to = DT_TAPE_OPTS_INIT;
        to.accumulate = 1; /* the micro-batches' gradients add up */
        ok = ok_or_say(dt_tape_create(&to, &tape), "tape");
        for (int l = 0; ok && l < o->layers; l++)
            ok = ok_or_say(dt_tape_watch(tape, w[l], l), "watch");
        for (int i = 0; ok && i < o->micro; i++) {
            dt_tensor *h = NULL, *loss = NULL;
            ok = ok_or_say(dt_tape_begin(tape), "begin") &&
                 ok_or_say(layers(w, 0, o->layers, o->layers - 1, x, &h), "forward") &&
                 ok_or_say(dt_softmax_xent(h, lab, NULL, &loss), "loss") &&
                 ok_or_say(dt_tape_end(tape), "end") &&
                 ok_or_say(dt_tape_backward(tape, loss, NULL, 1.0f, NULL), "backward");
            dt_tensor_destroy(h);
            dt_tensor_destroy(loss);
        }
        for (int l = 0; ok && l < o->layers; l++)
            ok = ok_or_say(dt_tape_take_grad(tape, l, &acc[l]), "grad") &&
                 ok_or_say(sgd(w, acc, l), "sgd");
        dt_tape_destroy(tape);
        double t = bu_max_all(now() - t0);
        if (step >= 0)
            times[step] = t;
    }
    for (int l = 0; l < o->layers; l++) {
        dt_tensor_destroy(w[l]);
        dt_tensor_destroy(acc[l]);
    }
    free(w);
    free(acc);
    dt_tensor_destroy(x);
    dt_tensor_destroy(lab);
    dt_layout_destroy(rep);
    dt_layout_destroy(xl);
    dt_mesh_destroy(m);
    ok = bu_ok_all(ok);
    return ok ? bu_median(times, o->steps) : 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_pipeline [--micro M] [--layers L] [--width W] [--rows R] "
                    "[--steps N] [--chunks V]\n");
    return 2;
}

int main(int argc, char **argv)
{
    opts o = {.micro = 8, .layers = 8, .width = 256, .rows = 64, .steps = 5, .chunks = 2};
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--micro")    ? &o.micro
                   : !strcmp(argv[i], "--layers") ? &o.layers
                   : !strcmp(argv[i], "--width")  ? &o.width
                   : !strcmp(argv[i], "--rows")   ? &o.rows
                   : !strcmp(argv[i], "--steps")  ? &o.steps
                   : !strcmp(argv[i], "--chunks") ? &o.chunks
                                                  : NULL;
        if (!dst || i + 1 >= argc || (*dst = atoi(argv[++i])) < 1)
            return usage();
    }
    if (o.steps > MAX_STEPS)
        o.steps = MAX_STEPS;
    if (dt_init(&argc, &argv, NULL) != DT_OK) {
        fprintf(stderr, "bench_pipeline: dt_init: %s\n", dt_last_error());
        return 1;
    }
    int P = dt_num_global_devices(DT_DEVICE_CPU), ok = 1;
    if (o.layers % (P * o.chunks) != 0 || o.rows % P != 0 || o.micro % P != 0) {
        if (dt_client_id() == 0)
            fprintf(stderr, "bench_pipeline: --layers (%d) must divide by stages x chunks (%d "
                    "x %d), --rows (%d) and --micro (%d) by the stages\n", o.layers, P, o.chunks,
                    o.rows, o.micro);
        dt_finalize();
        return 2;
    }
    double ref = reference(&o);
    if (ref <= 0)
        ok = 0;
    /* pipe=P, batch=1: the stage meshes keep a `batch` dim for the activations' specs. */
    const char *names[2] = {"pipe", "batch"};
    int64_t sizes[2] = {P, 1};
    dt_mesh *m = NULL;
    dt_pipe *pipe = NULL;
    ok = ok && ok_or_say(dt_mesh_create("pp", 2, names, sizes, DT_DEVICE_CPU, &m), "mesh") &&
         ok_or_say(dt_pipe_create(m, "pipe", &pipe), "dt_pipe_create");
    static const dt_pipe_schedule_kind kinds[3] = {DT_PIPE_GPIPE, DT_PIPE_1F1B,
                                                   DT_PIPE_INTERLEAVED};
    for (int i = 0; ok && i < 3; i++)
        ok = run_schedule(&o, pipe, kinds[i], kinds[i] == DT_PIPE_INTERLEAVED ? o.chunks : 1,
                          ref);
    dt_pipe_destroy(pipe);
    dt_mesh_destroy(m);
    dt_finalize();
    return ok ? 0 : 1;
}
