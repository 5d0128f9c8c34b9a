/* moe_soft: trains the soft-gated mixture of experts of examples/moe/layer.c (public ops and one
 * user-defined op, moe.gate_combine) to imitate a fixed teacher layer of the same shape, over a
 * mesh read from YAML: the rows data parallel over `batch`, the experts over `model` (expert
 * parallelism, from the op's factor rule alone), the ZeRO optimizer over `batch`. The inputs
 * are drawn by dt_random_normal for each step, so every mesh sees the same data. Prints the
 * mean squared error every --log-every steps; the last line is
 * `result first_loss=<step 1> last_loss=<last step>`; exits 1 when the loss did not fall to a
 * fifth of its first value. docs/vit.md, "A mixture of experts with a user-defined op". */
#include <dtensor/dtensor.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/layer.h"
#include "train/job.h"

#ifndef TRAIN_EXAMPLES_DIR
#define TRAIN_EXAMPLES_DIR "examples"
#endif

enum { W_GATE, W_1, W_2, NW };
static const char *const names[NW] = {"moe/gate", "moe/w1", "moe/w2"};

typedef struct opts {
    const char *mesh_file;
    int64_t steps, batch, dim, experts, hidden, top_k, log_every;
    double lr;
    int quiet;
} opts;

static int parse_options(int argc, char **argv, opts *o, int say)
{
    *o = (opts){.mesh_file = TRAIN_EXAMPLES_DIR "/meshes/2x2.yaml",
                .steps = 200,
                .batch = 64,
                .dim = 8,
                .experts = 4,
                .hidden = 16,
                .log_every = 20,
                .lr = 0.03};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *n = !strcmp(a, "--steps")       ? &o->steps
                     : !strcmp(a, "--batch")     ? &o->batch
                     : !strcmp(a, "--top-k")     ? &o->top_k
                     : !strcmp(a, "--log-every") ? &o->log_every
                                                 : NULL;
        if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
        } else if (!strcmp(a, "--mesh") && v) {
            o->mesh_file = v;
            i++;
        } else if (!strcmp(a, "--lr") && v && sscanf(v, "%lf", &o->lr) == 1 && o->lr > 0) {
            i++;
        } else if (n && v && (*n = strtoll(v, NULL, 10)) >= (n == &o->top_k ? 0 : 1)) {
            i++;
        } else {
            if (say)
                fprintf(stderr,
                        "moe_soft: bad option '%s'\nusage: moe_soft [--mesh FILE] [--steps N] "
                        "[--batch N] [--top-k K (0: all experts)] [--lr X] [--log-every N] "
                        "[--quiet]\n",
                        a);
            return -1;
        }
    }
    if (o->top_k > o->experts) {
        if (say)
            fprintf(stderr, "moe_soft: --top-k %lld: at most the %lld experts\n",
                    (long long)o->top_k, (long long)o->experts);
        return -1;
    }
    return 0;
}

/* The three weights on `mesh` from Philox stream base + i: the gate's expert columns and the
 * experts over `model`. */
static dt_status make_weights(const dt_mesh *mesh, const opts *o, uint64_t seed, dt_tensor **w)
{
    const char *tp = dt_mesh_dim_index(mesh, "model") >= 0 ? "model" : DT_UNSHARDED;
    const char *s_gate[2] = {DT_UNSHARDED, tp}, *s_exp[3] = {tp, DT_UNSHARDED, DT_UNSHARDED};
    int64_t sh[NW][3] = {
        {o->dim, o->experts}, {o->experts, o->dim, o->hidden}, {o->experts, o->hidden, o->dim}};
    double std[NW] = {1.0, 1.0 / sqrt((double)o->dim), 1.0 / sqrt((double)o->hidden)};
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < NW; i++) {
        dt_layout *l = NULL;
        st = dt_layout_create(mesh, i == W_GATE ? 2 : 3, i == W_GATE ? s_gate : s_exp, &l);
        if (st == DT_OK)
            st = dt_random_normal(l, sh[i], DT_DTYPE_F32, 0.0, std[i], seed, (uint64_t)i, &w[i]);
        dt_layout_destroy(l);
    }
    return st;
}

/* One step: a fresh batch, the teacher's answer, the student's loss and gradients, the
 * optimizer's update. */
static dt_status step(const opts *o, int64_t s, const dt_layout *lx, dt_tensor *const *teacher,
                      dt_tensor *const *student, dt_tape *tape, dt_zero *zero, double *loss)
{
    int64_t k = o->top_k ? o->top_k : o->experts, shape[2] = {o->batch, o->dim};
    moe_weights tw = {teacher[W_GATE], teacher[W_1], teacher[W_2]};
    moe_weights sw = {student[W_GATE], student[W_1], student[W_2]};
    dt_tensor *x = NULL, *target = NULL, *y = NULL, *l = NULL, *g[NW] = {NULL};
    dt_status st = dt_random_normal(lx, shape, DT_DTYPE_F32, 0.0, 1.0, 7, (uint64_t)s, &x);
    if (st == DT_OK)
        st = moe_forward(x, &tw, k, &target); /* the teacher is not watched: not recorded */
    if (st == DT_OK)
        st = dt_tape_begin(tape);
    if (st == DT_OK) {
        st = moe_forward(x, &sw, k, &y);
        if (st == DT_OK)
            st = dt_mse(y, target, &l);
        dt_status st_end = dt_tape_end(tape);
        if (st == DT_OK)
            st = st_end;
    }
    if (st == DT_OK)
        st = dt_item(l, loss);
    if (st == DT_OK)
        st = dt_tape_backward(tape, l, NULL, 1.0f, NULL);
    for (int i = 0; st == DT_OK && i < NW; i++)
        st = dt_tape_take_grad(tape, i, &g[i]);
    if (st == DT_OK)
        st = dt_zero_step(zero, g, NULL);
    for (int i = 0; i < NW; i++)
        dt_tensor_destroy(g[i]);
    dt_tensor_destroy(l);
    dt_tensor_destroy(y);
    dt_tensor_destroy(target);
    dt_tensor_destroy(x);
    return st;
}

static int run(job *j, const opts *o)
{
    dt_mesh *mesh = NULL;
    dt_tensor *teacher[NW] = {NULL}, *student[NW] = {NULL};
    dt_layout *lx = NULL;
    dt_tape *tape = NULL;
    dt_zero *zero = NULL;
    const char *sx[2] = {"batch", DT_UNSHARDED};
    double first = NAN, loss = NAN;
    int rc = job_mesh(j, o->mesh_file, NULL, -1, &mesh);
    if (rc != 0)
        goto out;
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    dt_optim_hparams hp = DT_OPTIM_ADAMW_INIT;
    hp.lr = (float)o->lr;
    dt_status st = make_weights(mesh, o, 2, teacher);
    if (st == DT_OK)
        st = make_weights(mesh, o, 1, student);
    if (st == DT_OK)
        st = dt_layout_create(mesh, 2, sx, &lx);
    if (st == DT_OK)
        st = dt_tape_create(NULL, &tape);
    for (int i = 0; st == DT_OK && i < NW; i++)
        st = dt_tape_watch(tape, student[i], i);
    if (st == DT_OK)
        st = dt_zero_create(mesh, &zo, &zero);
    if (st == DT_OK)
        st = dt_zero_add_group(zero, NW, names, student, &hp, NULL);
    if (st != DT_OK) {
        rc = job_fail(j, "setup", st, dt_last_error());
        goto out;
    }
    job_say(j,
            "moe_soft: %lld experts (%s), width %lld, expert hidden %lld, batch %lld on mesh "
            "'%s'\n",
            (long long)o->experts, o->top_k ? "top-k" : "all, soft", (long long)o->dim,
            (long long)o->hidden, (long long)o->batch, dt_mesh_name(mesh));
    for (int64_t s = 0; s < o->steps; s++) {
        if ((st = step(o, s, lx, teacher, student, tape, zero, &loss)) != DT_OK) {
            rc = job_fail(j, "step", st, dt_last_error());
            goto out;
        }
        if (s == 0)
            first = loss;
        if ((s + 1) % o->log_every == 0 || s + 1 == o->steps)
            job_say(j, "step %5lld  mse %.6g\n", (long long)(s + 1), loss);
    }
    if (j->me == 0) {
        printf("result first_loss=%.6g last_loss=%.6g\n", first, loss);
        fflush(stdout);
    }
    rc = loss < first / 5 ? 0 : 1;
out:
    dt_zero_destroy(zero);
    dt_tape_destroy(tape);
    dt_layout_destroy(lx);
    for (int i = 0; i < NW; i++) {
        dt_tensor_destroy(teacher[i]);
        dt_tensor_destroy(student[i]);
    }
    dt_mesh_destroy(mesh);
    return rc;
}

int main(int argc, char **argv)
{
    job j;
    memset(&j, 0, sizeof j);
    job_begin(&j, "moe_soft", &argc, &argv);
    opts o;
    int rc = parse_options(argc, argv, &o, j.me == 0) != 0 ? 2 : 0;
    if (rc == 0 && (rc = job_start(&j, o.mesh_file, NULL, -1)) == 0) {
        j.quiet = o.quiet;
        rc = run(&j, &o);
        job_abort_if_lost(&j);
    }
    return job_end(&j, rc);
}
