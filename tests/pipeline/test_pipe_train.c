/* The executor trains a small network (8 layers of matmul + relu, softmax cross-entropy) on
 * the tape, its layers cut into stages (and chunks): the parameters after 2 steps of SGD
 * over M micro-batches equal, bit for bit, those of the same run without pipelining on the
 * same stage's devices (one tape over all layers, micro-batches accumulated in order), for
 * GPipe, 1F1B and interleaved 1F1B at P=1, 2 and 4, with global-norm clipping whose norm the
 * stages share (dt_pipe_share_values). A stage whose step fails mid-run ends the
 * other stages with a status (DT_ERR_TIMEOUT from the watchdog), not a hang. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "harness.h"
#include "dtensor/pipeline.h"
#include "../ops/ops_test_util.h"

enum { L = 8, D = 6, ROWS = 8, M = 4, STEPS = 2, IN_INDEX = 1000 };
static const float LR = 0.25f;
static const double CLIP = 0.05; /* below the gradients' norm: every step clips */
static int g_clipped;            /* steps that clipped */

typedef struct net {
    dt_pipe *pipe;
    int P, V, VP;
    dt_tensor *w[L];             /* on the stage mesh of the layer's stage (NULL elsewhere) */
    dt_tensor *acc[L];           /* accumulated gradients of a step */
    dt_tensor *x[M], *labels[M]; /* on stage 0's / the last stage's mesh */
    dt_tape **tape;              /* [VP * M] */
    dt_tensor **out;             /* [VP * M]: output (or loss) to run backward from */
    int fail_stage, fail_micro;  /* an injected fault (-1: none) */
} net;

static int layer_stage(const net *n, int l) { return (l / (L / n->VP)) % n->P; }

static float *host_data(int64_t count, uint64_t seed)
{
    float *h = malloc((size_t)count * sizeof *h);
    ot_fill_real(h, count, -1.0f, 1.0f, seed);
    return h;
}

/* The stage-mesh tensors a run needs, from seeded host data (the same in every run). */
static dt_tensor *weight(const dt_mesh *m, int l)
{
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 2, &rep));
    int64_t shape[2] = {D, D};
    float *h = host_data(D * D, 100 + (uint64_t)l);
    for (int i = 0; i < D * D; i++)
        h[i] *= 0.7f;
    dt_tensor *t = ot_tensor(rep, DT_DTYPE_F32, shape, h);
    free(h);
    dt_layout_destroy(rep);
    return t;
}

static dt_tensor *input(const dt_mesh *m, int micro)
{
    dt_layout *l = dt_test_layout(m, 2, "batch", NULL, NULL);
    int64_t shape[2] = {ROWS, D};
    float *h = host_data(ROWS * D, 200 + (uint64_t)micro);
    dt_tensor *t = ot_tensor(l, DT_DTYPE_F32, shape, h);
    free(h);
    dt_layout_destroy(l);
    return t;
}

static dt_tensor *labels(const dt_mesh *m, int micro)
{
    dt_layout *l = dt_test_layout(m, 1, "batch", NULL, NULL);
    int64_t shape[1] = {ROWS};
    int32_t h[ROWS];
    for (int i = 0; i < ROWS; i++)
        h[i] = (int32_t)((i * 5 + micro * 3) % D);
    dt_tensor *t = ot_tensor(l, DT_DTYPE_I32, shape, h);
    dt_layout_destroy(l);
    return t;
}

/* Layers [lo, hi) on h (borrowed); the last layer has no relu. Returns the new activation. */
static dt_tensor *layers(dt_tensor *const *w, int lo, int hi, const dt_tensor *h)
{
    dt_tensor *cur = dt_tensor_retain(h);
    for (int l = lo; l < hi; l++) {
        dt_tensor *y = NULL, *z = NULL;
        DT_ASSERT_OK(dt_matmul(cur, w[l], 0, 0, NULL, &y));
        dt_tensor_destroy(cur);
        if (l < L - 1) {
            DT_ASSERT_OK(dt_relu(y, &z));
            dt_tensor_destroy(y);
            y = z;
        }
        cur = y;
    }
    return cur;
}

static void accumulate(dt_tensor **acc, dt_tensor *g)
{
    if (!*acc) {
        *acc = g;
        return;
    }
    dt_tensor *s = NULL;
    DT_ASSERT_OK(dt_add(*acc, g, NULL, &s));
    dt_tensor_destroy(*acc);
    dt_tensor_destroy(g);
    *acc = s;
}

static dt_status fwd(void *arg, int stage, int chunk, int micro, const dt_tensor *in,
                     dt_tensor **out)
{
    net *n = arg;
    if (stage == n->fail_stage && micro == n->fail_micro)
        return DT_ERR_STATE; /* the injected fault */
    int v = chunk * n->P + stage, per = L / n->VP, lo = v * per;
    dt_tape_opts to = DT_TAPE_OPTS_INIT;
    to.accumulate = 0;
    dt_tape **tape = &n->tape[v * M + micro];
    DT_ASSERT_OK(dt_tape_create(&to, tape));
    for (int l = lo; l < lo + per; l++)
        DT_ASSERT_OK(dt_tape_watch(*tape, n->w[l], l));
    if (in)
        DT_ASSERT_OK(dt_tape_watch(*tape, in, IN_INDEX));
    DT_ASSERT_OK(dt_tape_begin(*tape));
    dt_tensor *h = layers(n->w, lo, lo + per, in ? in : n->x[micro]);
    if (v == n->VP - 1) {
        dt_tensor *loss = NULL;
        DT_ASSERT_OK(dt_softmax_xent(h, n->labels[micro], NULL, &loss));
        dt_tensor_destroy(h);
        n->out[v * M + micro] = loss;
        *out = NULL;
    } else {
        n->out[v * M + micro] = h;
        *out = dt_tensor_retain(h);
    }
    DT_ASSERT_OK(dt_tape_end(*tape));
    return DT_OK;
}

static dt_status bwd(void *arg, int stage, int chunk, int micro, const dt_tensor *gout,
                     dt_tensor **gin)
{
    net *n = arg;
    int v = chunk * n->P + stage, per = L / n->VP, lo = v * per;
    dt_tape *tape = n->tape[v * M + micro];
    DT_ASSERT_OK(dt_tape_backward(tape, n->out[v * M + micro], gout, 1.0f, NULL));
    for (int l = lo; l < lo + per; l++) {
        dt_tensor *g = NULL;
        DT_ASSERT_OK(dt_tape_take_grad(tape, l, &g));
        accumulate(&n->acc[l], g);
    }
    *gin = NULL;
    if (v > 0)
        DT_ASSERT_OK(dt_tape_take_grad(tape, IN_INDEX, gin));
    dt_tape_destroy(tape);
    n->tape[v * M + micro] = NULL;
    dt_tensor_destroy(n->out[v * M + micro]);
    n->out[v * M + micro] = NULL;
    return DT_OK;
}

/* Global-norm clipping over every layer: the squared norm of each layer's gradient (held
 * where acc[l] is, shared across the stages through the pipe when one is given), summed in
 * layer order on every client; the gradients held are then scaled by CLIP / (norm + 1e-6). */
static void clip(dt_pipe *pipe, const net *n, dt_tensor **acc)
{
    double sq[L];
    int stage_of[L];
    for (int l = 0; l < L; l++) {
        sq[l] = 0;
        stage_of[l] = n ? layer_stage(n, l) : 0;
        if (!acc[l])
            continue;
        dt_layout *r0 = NULL;
        dt_tensor *t = NULL;
        float v = 0;
        DT_ASSERT_OK(dt_layout_replicated(dt_layout_mesh(dt_tensor_layout(acc[l])), 0, &r0));
        DT_ASSERT_OK(dt_sq_norm(acc[l], r0, &t));
        DT_ASSERT_OK(dt_tensor_local_read(t, 0, &v, sizeof v));
        sq[l] = v;
        dt_tensor_destroy(t);
        dt_layout_destroy(r0);
    }
    if (pipe)
        DT_ASSERT_OK(dt_pipe_share_values(pipe, L, stage_of, sq));
    double total = 0;
    for (int l = 0; l < L; l++)
        total += sq[l];
    double norm = sqrt(total);
    if (norm <= CLIP)
        return;
    g_clipped++;
    float coef = (float)(CLIP / (norm + 1e-6));
    for (int l = 0; l < L; l++) {
        if (!acc[l])
            continue;
        dt_tensor *c = NULL;
        DT_ASSERT_OK(dt_scale(acc[l], coef, &c));
        dt_tensor_destroy(acc[l]);
        acc[l] = c;
    }
}

static void sgd(dt_tensor **w, dt_tensor **acc, int l)
{
    DT_ASSERT_OK(dt_axpy(-LR, acc[l], w[l]));
    dt_tensor_destroy(acc[l]);
    acc[l] = NULL;
}

/* The run without pipelining on stage s's devices: every layer, one tape, micro-batches in
 * order (the tape accumulates), then SGD. */
static void reference(const dt_mesh *m, dt_tensor **w)
{
    dt_tensor *x[M], *lab[M], *acc[L] = {0};
    for (int i = 0; i < M; i++) {
        x[i] = input(m, i);
        lab[i] = labels(m, i);
    }
    for (int l = 0; l < L; l++)
        w[l] = weight(m, l);
    for (int step = 0; step < STEPS; step++) {
        dt_tape *tape = NULL;
        dt_tape_opts to = DT_TAPE_OPTS_INIT;
        to.accumulate = 1; /* the micro-batches' gradients add up */
        DT_ASSERT_OK(dt_tape_create(&to, &tape));
        for (int l = 0; l < L; l++)
            DT_ASSERT_OK(dt_tape_watch(tape, w[l], l));
        for (int i = 0; i < M; i++) {
            DT_ASSERT_OK(dt_tape_begin(tape));
            dt_tensor *h = layers(w, 0, L, x[i]), *loss = NULL;
            DT_ASSERT_OK(dt_softmax_xent(h, lab[i], NULL, &loss));
            DT_ASSERT_OK(dt_tape_end(tape));
            DT_ASSERT_OK(dt_tape_backward(tape, loss, NULL, 1.0f, NULL));
            dt_tensor_destroy(h);
            dt_tensor_destroy(loss);
        }
        for (int l = 0; l < L; l++)
            DT_ASSERT_OK(dt_tape_take_grad(tape, l, &acc[l]));
        clip(NULL, NULL, acc);
        for (int l = 0; l < L; l++)
            sgd(w, acc, l);
        dt_tape_destroy(tape);
    }
    for (int i = 0; i < M; i++) {
        dt_tensor_destroy(x[i]);
        dt_tensor_destroy(lab[i]);
    }
}

/* pipe=P, batch=B over the first P*B devices. */
static dt_mesh *pipe_mesh_b(int P, int64_t B)
{
    const char *names[2] = {"pipe", "batch"};
    int64_t sizes[2] = {P, B};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("train", 2, names, sizes, dt_test_device_type(), &m));
    return m;
}

static dt_mesh *pipe_mesh(int P) { return pipe_mesh_b(P, dt_test_num_devices() / P); }

static void net_setup(net *n, dt_pipe *p, int P, int V)
{
    memset(n, 0, sizeof *n);
    n->pipe = p;
    n->P = P;
    n->V = V;
    n->VP = P * V;
    n->fail_stage = n->fail_micro = -1;
    n->tape = calloc((size_t)(n->VP * M), sizeof *n->tape);
    n->out = calloc((size_t)(n->VP * M), sizeof *n->out);
    for (int l = 0; l < L; l++)
        if (dt_pipe_holds_stage(p, layer_stage(n, l)))
            n->w[l] = weight(dt_pipe_stage_mesh(p, layer_stage(n, l)), l);
    for (int i = 0; i < M; i++) {
        if (dt_pipe_holds_stage(p, 0))
            n->x[i] = input(dt_pipe_stage_mesh(p, 0), i);
        if (dt_pipe_holds_stage(p, P - 1))
            n->labels[i] = labels(dt_pipe_stage_mesh(p, P - 1), i);
    }
}

static void net_free(net *n)
{
    for (int i = 0; i < n->VP * M; i++) {
        dt_tape_destroy(n->tape[i]);
        dt_tensor_destroy(n->out[i]);
    }
    free(n->tape);
    free(n->out);
    for (int l = 0; l < L; l++) {
        dt_tensor_destroy(n->w[l]);
        dt_tensor_destroy(n->acc[l]);
    }
    for (int i = 0; i < M; i++) {
        dt_tensor_destroy(n->x[i]);
        dt_tensor_destroy(n->labels[i]);
    }
}

static dt_pipe_run_opts run_opts(net *n)
{
    static const char *const specs[2] = {"batch", "unsharded"};
    static const int64_t shape[2] = {ROWS, D};
    dt_pipe_run_opts o = DT_PIPE_RUN_OPTS_INIT;
    o.forward = fwd;
    o.backward = bwd;
    o.arg = n;
    o.act_rank = 2;
    o.act_specs = specs;
    o.act_shape = shape;
    return o;
}

static void train_and_compare(dt_pipe_schedule_kind kind, int P, int V)
{
    if (dt_test_num_devices() % P != 0 || ROWS % (dt_test_num_devices() / P) != 0)
        return;
    dt_mesh *m = pipe_mesh(P);
    dt_pipe *p = NULL;
    DT_ASSERT_OK(dt_pipe_create(m, "pipe", &p));
    dt_pipe_schedule *s = NULL;
    DT_ASSERT_OK(dt_pipe_schedule_create(kind, P, M, V, &s));
    net n;
    net_setup(&n, p, P, V);
    dt_pipe_run_opts o = run_opts(&n);
    dt_pipe_run_stats rs;
    for (int step = 0; step < STEPS; step++) {
        DT_ASSERT_OK(dt_pipe_run(p, s, &o, &rs));
        g_clipped = 0;
        clip(p, &n, n.acc);
        CU_ASSERT_EQUAL(g_clipped, 1); /* every stage clipped, by the global norm */
        for (int l = 0; l < L; l++)
            if (n.w[l])
                sgd(n.w, n.acc, l);
    }
    /* The boundary activations moved and nothing else: ROWS x D f32 per micro-batch and
     * boundary, forward and backward. */
    dt_pipe_stats ps;
    DT_ASSERT_OK(dt_pipe_get_stats(p, &ps));
    if (dt_num_clients() == 1)
        CU_ASSERT_EQUAL(ps.bytes_sent,
                        (uint64_t)STEPS * M * 2 * (P > 1 ? n.VP - 1 : 0) * ROWS * D * sizeof(float));
    CU_ASSERT(rs.steps > 0);
    int peak_want = 0;
    for (int st = 0; st < P; st++)
        if (dt_pipe_holds_stage(p, st) && dt_pipe_schedule_peak_live(s, st) > peak_want)
            peak_want = dt_pipe_schedule_peak_live(s, st);
    CU_ASSERT_EQUAL(rs.peak_live, peak_want);

    for (int st = 0; st < P; st++) {
        if (!dt_pipe_holds_stage(p, st))
            continue;
        dt_tensor *ref[L];
        reference(dt_pipe_stage_mesh(p, st), ref);
        for (int l = 0; l < L; l++) {
            if (layer_stage(&n, l) == st) {
                for (int i = 0; i < dt_tensor_num_local(ref[l]); i++) {
                    float *a = dt_test_local_get(n.w[l], i), *b = dt_test_local_get(ref[l], i);
                    int same = memcmp(a, b, D * D * sizeof(float)) == 0;
                    if (!same)
                        fprintf(stderr, "%s P=%d V=%d layer %d: %.9g vs %.9g\n",
                                dt_pipe_schedule_kind_name(kind), P, V, l, a[0], b[0]);
                    CU_ASSERT(same);
                    free(a);
                    free(b);
                }
            }
            dt_tensor_destroy(ref[l]);
        }
    }
    net_free(&n);
    dt_pipe_schedule_destroy(s);
    dt_pipe_destroy(p);
    dt_mesh_destroy(m);
}

static void test_gpipe_trains_like_the_unpipelined_run_bit_for_bit(void)
{
    train_and_compare(DT_PIPE_GPIPE, 2, 1);
}

static void test_1f1b_trains_like_the_unpipelined_run_bit_for_bit(void)
{
    train_and_compare(DT_PIPE_1F1B, 2, 1);
    train_and_compare(DT_PIPE_1F1B, 4, 1);
}

static void test_interleaved_trains_like_the_unpipelined_run_bit_for_bit(void)
{
    train_and_compare(DT_PIPE_INTERLEAVED, 2, 2);
    train_and_compare(DT_PIPE_INTERLEAVED, 1, 2);
}

/* Stage 1 fails at its forward of micro-batch 1 and leaves the run with that status; stage 0
 * then waits for a gradient that never comes, and gets DT_ERR_TIMEOUT from the watchdog. */
static void test_a_failing_stage_ends_the_others_with_a_status(void)
{
    dt_mesh *m = pipe_mesh(2);
    dt_pipe *p = NULL;
    DT_ASSERT_OK(dt_pipe_create(m, "pipe", &p));
    if (dt_pipe_holds_stage(p, 0) && dt_pipe_holds_stage(p, 1)) {
        dt_pipe_destroy(p); /* one client holds both: no peer to lose */
        dt_mesh_destroy(m);
        return;
    }
    dt_pipe_schedule *s = NULL;
    DT_ASSERT_OK(dt_pipe_schedule_create(DT_PIPE_1F1B, 2, M, 1, &s));
    net n;
    net_setup(&n, p, 2, 1);
    n.fail_stage = 1;
    n.fail_micro = 1;
    dt_pipe_run_opts o = run_opts(&n);
    setenv("DT_COMM_TIMEOUT", "1", 1);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    dt_status st = dt_pipe_run(p, s, &o, NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double took = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    unsetenv("DT_COMM_TIMEOUT");
    if (dt_pipe_holds_stage(p, 1)) {
        CU_ASSERT_EQUAL(st, DT_ERR_STATE);
    } else {
        if (st != DT_ERR_TIMEOUT)
            fprintf(stderr, "stage 0 got %s: %s\n", dt_status_name(st), dt_last_error());
        CU_ASSERT_EQUAL(st, DT_ERR_TIMEOUT);
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "dt_pipe_recv"));
        CU_ASSERT(took < 30.0);
    }
    net_free(&n);
    dt_pipe_schedule_destroy(s);
    dt_pipe_destroy(p);
    dt_mesh_destroy(m);
}

/* One step of 1F1B at P stages of one device each (pipe=P, batch=1): restored from
 * restore_dir first, saved to save_dir after, compared with ref (bit for bit) when given.
 * Clients holding none of the mesh's devices sit it out. */
static void ckpt_step(int P, const char *save_dir, const char *restore_dir, dt_tensor *const *ref)
{
    if (dt_test_num_devices() < P)
        return;
    dt_mesh *m = pipe_mesh_b(P, 1);
    if (dt_mesh_num_local_devices(m) == 0) {
        dt_mesh_destroy(m);
        return;
    }
    dt_pipe *p = NULL;
    DT_ASSERT_OK(dt_pipe_create(m, "pipe", &p));
    dt_pipe_schedule *s = NULL;
    DT_ASSERT_OK(dt_pipe_schedule_create(DT_PIPE_1F1B, P, M, 1, &s));
    net n;
    net_setup(&n, p, P, 1);
    char names[L][32];
    const char *name_ptr[L];
    int stage_of[L];
    for (int l = 0; l < L; l++) {
        snprintf(names[l], sizeof names[l], "block%d.weight", l);
        name_ptr[l] = names[l];
        stage_of[l] = layer_stage(&n, l);
    }
    if (restore_dir) {
        dt_layout *lay[L];
        dt_tensor *got[L];
        for (int l = 0; l < L; l++)
            DT_ASSERT_OK(dt_layout_replicated(dt_pipe_stage_mesh(p, stage_of[l]), 2, &lay[l]));
        DT_ASSERT_OK(dt_pipe_restore(p, restore_dir, L, name_ptr, stage_of,
                                     (const dt_layout *const *)lay, got));
        for (int l = 0; l < L; l++) {
            CU_ASSERT_EQUAL(got[l] != NULL, dt_pipe_holds_stage(p, stage_of[l]));
            dt_tensor_destroy(n.w[l]);
            n.w[l] = got[l];
            dt_layout_destroy(lay[l]);
        }
    }
    dt_pipe_run_opts o = run_opts(&n);
    DT_ASSERT_OK(dt_pipe_run(p, s, &o, NULL));
    clip(p, &n, n.acc);
    for (int l = 0; l < L; l++)
        if (n.w[l])
            sgd(n.w, n.acc, l);
    if (save_dir)
        DT_ASSERT_OK(dt_pipe_save(p, save_dir, L, name_ptr, stage_of,
                                  (const dt_tensor *const *)n.w, NULL));
    for (int l = 0; ref && l < L; l++) {
        if (!n.w[l])
            continue;
        for (int i = 0; i < dt_tensor_num_local(n.w[l]); i++) {
            float *a = dt_test_local_get(n.w[l], i), *b = dt_test_local_get(ref[l], 0);
            int same = memcmp(a, b, D * D * sizeof(float)) == 0;
            if (!same)
                fprintf(stderr, "resumed at P=%d, layer %d: %.9g vs %.9g\n", P, l, a[0], b[0]);
            CU_ASSERT(same);
            free(a);
            free(b);
        }
    }
    net_free(&n);
    dt_pipe_schedule_destroy(s);
    dt_pipe_destroy(p);
    dt_mesh_destroy(m);
}

/* A checkpoint saved after one step at P=2 (layers under global names) resumes at P=1, 2
 * and 4, and the second step gives the parameters of an uninterrupted 2-step run (one device,
 * no pipeline) bit for bit. Stages of one device each keep every sum's order for any P. */
static void test_a_checkpoint_saved_at_p2_resumes_at_p1_p2_p4_bit_identical(void)
{
    char dir[512], ck[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/p2", dir);
    /* The uninterrupted run, on this client's first device. */
    char yaml[256];
    snprintf(yaml, sizeof yaml, "mesh:\n  name: own\n  device_type: %s\n  dims: {batch: 1}\n"
             "  device_ids: [%d]\n", dt_test_device_type() == DT_DEVICE_GPU ? "GPU" : "CPU",
             dt_local_device_id(dt_test_device_type(), 0));
    dt_mesh *own = NULL;
    DT_ASSERT_OK(dt_mesh_from_yaml_string(yaml, NULL, &own));
    dt_tensor *ref[L];
    reference(own, ref);
    ckpt_step(2, ck, NULL, NULL);
    MPI_Barrier(MPI_COMM_WORLD); /* the save's clients are done before others read */
    ckpt_step(1, NULL, ck, ref);
    ckpt_step(2, NULL, ck, ref);
    ckpt_step(4, NULL, ck, ref);
    for (int l = 0; l < L; l++)
        dt_tensor_destroy(ref[l]);
    dt_mesh_destroy(own);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_gpipe_trains_like_the_unpipelined_run_bit_for_bit),
        DT_TEST(test_1f1b_trains_like_the_unpipelined_run_bit_for_bit),
        DT_TEST(test_interleaved_trains_like_the_unpipelined_run_bit_for_bit),
        DT_TEST(test_a_checkpoint_saved_at_p2_resumes_at_p1_p2_p4_bit_identical),
        DT_TEST(test_a_failing_stage_ends_the_others_with_a_status),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "pipe_train", cases);
}
