/* train_vit: trains a small vision transformer (examples/vit/model.c: patches by dt_reshape and
 * dt_permute, attention by dt_einsum and dt_softmax, every op a public one) on the UCI digits
 * over a mesh read from YAML: the batch data parallel over `batch`, the heads and MLP columns
 * tensor parallel over `model`, the ZeRO optimizer partitioned over `batch`. Every mesh of at
 * most 2 x 2 devices, in one process or several, prints the same losses and ends with the same
 * weights bit for bit (docs/vit.md). The last line printed is
 * `result accuracy=<held-out> heldout_loss=<loss> checksum=<weights' FNV-1a> steps=<n>`. */
#include <dtensor/dtensor.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/digits.h"
#include "train/job.h"
#include "train/rng.h"
#include "vit/model.h"

#ifndef TRAIN_EXAMPLES_DIR
#define TRAIN_EXAMPLES_DIR "examples"
#endif

typedef struct opts {
    const char *mesh_file, *data_file;
    int64_t steps, batch, eval_every, log_every, warmup;
    vit_config cfg;
    double lr, weight_decay;
    int stage, quiet, help, checksums;
    uint64_t seed; /* the data order */
} opts;

typedef struct ctx {
    job j;
    opts o;
    dt_mesh *mesh;
    digits all, train, test;
    vit *model;
    dt_zero *zero;
    dt_tensor *test_x, *test_y; /* [S, rows/S, 8, 8], [S, rows/S] (padded with label -1) */
    int32_t *order;             /* this epoch's order of the training rows */
    rng r;
    float *bx;   /* a batch's pixels */
    int32_t *by; /* its labels */
} ctx;

/* ---- options ------------------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: train_vit [options]\n"
            "  --mesh FILE        mesh YAML (dims batch, model; default examples/meshes/2x2.yaml)\n"
            "  --data FILE        digits CSV (default examples/data/digits.csv.gz)\n"
            "  --steps N          optimizer steps (default 300)\n"
            "  --batch N          global batch, even (default 64)\n"
            "  --patch P          patch side, 4 (4 tokens, the default) or 2 (16 tokens)\n"
            "  --dim D            token width (default 32)\n"
            "  --mlp F            MLP hidden width (default 64)\n"
            "  --layers L         transformer blocks (default 1)\n"
            "  --lr X             peak learning rate, AdamW (default 0.01)\n"
            "  --weight-decay X   AdamW's decoupled decay (default 0.01)\n"
            "  --warmup N         linear warm-up steps, then cosine decay (default 40)\n"
            "  --stage S          ZeRO stage 0, 1 or 2 (default 1)\n"
            "  --seed N           the initial weights and the data order (default 1)\n"
            "  --eval-every N     held-out evaluation every N steps (default 100)\n"
            "  --log-every N      a loss line every N steps (default 25)\n"
            "  --checksums        print each parameter's checksum at the end\n"
            "  --quiet            only the result line\n");
}

static int parse_i64(const char *s, int64_t lo, int64_t *out)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || v < lo)
        return -1;
    *out = v;
    return 0;
}

static int parse_options(int argc, char **argv, opts *o, char *err, size_t errlen)
{
    *o = (opts){.mesh_file = TRAIN_EXAMPLES_DIR "/meshes/2x2.yaml",
                .data_file = TRAIN_EXAMPLES_DIR "/data/digits.csv.gz",
                .steps = 300,
                .batch = 64,
                .eval_every = 100,
                .log_every = 25,
                .warmup = 40,
                .cfg = {.patch = 4, .dim = 32, .mlp = 64, .layers = 1, .seed = 1},
                .lr = 0.01,
                .weight_decay = 0.01,
                .stage = 1,
                .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n = 0;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            o->help = 1;
            continue;
        }
        if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
            continue;
        }
        if (!strcmp(a, "--checksums")) {
            o->checksums = 1;
            continue;
        }
        if (!v) {
            snprintf(err, errlen, "unknown option or missing value: '%s'", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--mesh"))
            o->mesh_file = v;
        else if (!strcmp(a, "--data"))
            o->data_file = v;
        else if (!strcmp(a, "--steps"))
            bad = parse_i64(v, 0, &o->steps);
        else if (!strcmp(a, "--batch"))
            bad = parse_i64(v, 2, &o->batch) || o->batch % VIT_SHARDS;
        else if (!strcmp(a, "--patch"))
            bad = parse_i64(v, 2, &o->cfg.patch);
        else if (!strcmp(a, "--dim"))
            bad = parse_i64(v, 1, &o->cfg.dim);
        else if (!strcmp(a, "--mlp"))
            bad = parse_i64(v, 1, &o->cfg.mlp);
        else if (!strcmp(a, "--layers"))
            bad = parse_i64(v, 1, &o->cfg.layers);
        else if (!strcmp(a, "--warmup"))
            bad = parse_i64(v, 0, &o->warmup);
        else if (!strcmp(a, "--eval-every"))
            bad = parse_i64(v, 1, &o->eval_every);
        else if (!strcmp(a, "--log-every"))
            bad = parse_i64(v, 1, &o->log_every);
        else if (!strcmp(a, "--stage"))
            bad = parse_i64(v, 0, &n) || n > 2 || ((o->stage = (int)n), 0);
        else if (!strcmp(a, "--seed"))
            bad = parse_i64(v, 0, &n) || ((o->seed = o->cfg.seed = (uint64_t)n), 0);
        else if (!strcmp(a, "--lr"))
            bad = sscanf(v, "%lf", &o->lr) != 1 || !(o->lr > 0);
        else if (!strcmp(a, "--weight-decay"))
            bad = sscanf(v, "%lf", &o->weight_decay) != 1 || !(o->weight_decay >= 0);
        else {
            snprintf(err, errlen, "unknown option '%s'", a);
            return -1;
        }
        if (bad) {
            snprintf(err, errlen, "%s %s: not a valid value", a, v);
            return -1;
        }
    }
    return 0;
}

/* ---- data ----------------------------------------------------------------------------------- */

/* Row-major host rows into [S, n/S, 8, 8] and [S, n/S] tensors of the model's layouts (every
 * client passes the whole arrays; each device copies its block). */
static dt_status to_tensors(const vit *m, int64_t n, const float *x, const int32_t *y,
                            dt_tensor **tx, dt_tensor **ty)
{
    int64_t sx[4] = {VIT_SHARDS, n / VIT_SHARDS, VIT_SIDE, VIT_SIDE}, sy[2] = {sx[0], sx[1]};
    dt_status st = dt_tensor_from_host(vit_image_layout(m), DT_DTYPE_F32, sx, x, tx);
    if (st == DT_OK &&
        (st = dt_tensor_from_host(vit_label_layout(m), DT_DTYPE_I32, sy, y, ty)) != DT_OK) {
        dt_tensor_destroy(*tx);
        *tx = NULL;
    }
    return st;
}

/* The held-out rows, padded to a multiple of S with an ignored row (label -1). */
static int setup_test(ctx *c)
{
    int64_t n = (c->test.n + VIT_SHARDS - 1) / VIT_SHARDS * VIT_SHARDS;
    float *x = calloc((size_t)(n * DIGITS_FEATURES), sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    dt_status st = DT_ERR_NO_MEMORY;
    if (x && y) {
        memcpy(x, c->test.x, (size_t)(c->test.n * DIGITS_FEATURES) * sizeof *x);
        for (int64_t i = 0; i < n; i++)
            y[i] = i < c->test.n ? c->test.y[i] : -1;
        st = to_tensors(c->model, n, x, y, &c->test_x, &c->test_y);
    }
    free(x);
    free(y);
    return st == DT_OK ? 0 : job_fail(&c->j, "held-out data", st, vit_last_error());
}

/* Global batch `step` (0-based): the next rows of a seeded shuffle of the training rows, a new
 * shuffle each epoch (the remainder dropped). The same on every client and mesh. */
static void next_batch(ctx *c, int64_t step)
{
    int64_t per_epoch = c->train.n / c->o.batch, k = step % per_epoch;
    if (k == 0)
        rng_shuffle(&c->r, c->order, c->train.n);
    for (int64_t i = 0; i < c->o.batch; i++) {
        int64_t row = c->order[k * c->o.batch + i];
        const float *src = c->train.x + row * DIGITS_FEATURES;
        float *dst = c->bx + i * DIGITS_FEATURES;
        memcpy(dst, src, DIGITS_FEATURES * sizeof *dst);
        c->by[i] = c->train.y[row];
    }
}

static int setup(ctx *c)
{
    char err[512] = "";
    int bad = digits_load(c->o.data_file, &c->all, err, sizeof err) != 0 ||
              digits_split(&c->all, &c->train, &c->test, err, sizeof err) != 0;
    if (job_any_failed(&c->j, bad, err))
        return 1;
    if (c->o.batch > c->train.n) {
        if (c->j.me == 0)
            fprintf(stderr, "train_vit: --batch %lld: at most the %lld training rows\n",
                    (long long)c->o.batch, (long long)c->train.n);
        return 2;
    }
    c->order = malloc((size_t)c->train.n * sizeof *c->order);
    c->bx = malloc((size_t)(c->o.batch * DIGITS_FEATURES) * sizeof *c->bx);
    c->by = malloc((size_t)c->o.batch * sizeof *c->by);
    if (job_any_failed(&c->j, !c->order || !c->bx || !c->by, "train_vit: out of memory"))
        return 1;
    for (int64_t i = 0; i < c->train.n; i++)
        c->order[i] = (int32_t)i;
    rng_seed(&c->r, c->o.seed ^ 0x7669745f64617461ULL);

    dt_status st = vit_create(c->mesh, &c->o.cfg, &c->model);
    if (st != DT_OK)
        return job_fail(&c->j, "model", st, vit_last_error());
    if (setup_test(c) != 0)
        return 1;
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = c->o.stage;
    zo.dp_dim = "batch";
    zo.clip_norm = 0; /* a global norm sums many terms in a mesh-dependent order: off */
    if ((st = dt_zero_create(c->mesh, &zo, &c->zero)) != DT_OK)
        return job_fail(&c->j, "dt_zero_create", st, dt_last_error());
    dt_optim_hparams hp = DT_OPTIM_ADAMW_INIT;
    hp.lr = (float)c->o.lr;
    hp.weight_decay = (float)c->o.weight_decay;
    if ((st = dt_zero_add_group(c->zero, vit_num_params(c->model), vit_param_names(c->model),
                                vit_params(c->model), &hp, NULL)) != DT_OK)
        return job_fail(&c->j, "dt_zero_add_group", st, dt_last_error());
    return 0;
}

/* ---- training ------------------------------------------------------------------------------- */

/* Linear warm-up to --lr, then a cosine to a tenth of it at the last step. */
static float lr_at(const opts *o, int64_t step)
{
    if (step < o->warmup)
        return (float)(o->lr * (double)(step + 1) / (double)o->warmup);
    double t = (double)(step - o->warmup) /
               (double)(o->steps - o->warmup > 1 ? o->steps - o->warmup - 1 : 1);
    return (float)(o->lr *
                   (0.1 + 0.9 * 0.5 * (1.0 + cos(3.14159265358979323846 * (t > 1 ? 1 : t)))));
}

static int train_step(ctx *c, int64_t step, double *loss)
{
    int n = vit_num_params(c->model);
    dt_tensor *x = NULL, *y = NULL, *g[VIT_MAX_PARAMS] = {NULL};
    next_batch(c, step);
    dt_status st = to_tensors(c->model, c->o.batch, c->bx, c->by, &x, &y);
    const char *what = "batch";
    if (st == DT_OK && (st = dt_zero_set_lr(c->zero, 0, lr_at(&c->o, step))) != DT_OK)
        what = "dt_zero_set_lr";
    if (st == DT_OK && (st = vit_grads(c->model, x, y, loss, g)) != DT_OK)
        what = "forward/backward";
    if (st == DT_OK && (st = dt_zero_step(c->zero, g, NULL)) != DT_OK)
        what = "dt_zero_step";
    for (int i = 0; i < n; i++)
        dt_tensor_destroy(g[i]);
    dt_tensor_destroy(x);
    dt_tensor_destroy(y);
    return st == DT_OK ? 0 : job_fail(&c->j, what, st, vit_last_error());
}

/* Held-out loss and accuracy (argmax of the logits gathered to every client). */
static int evaluate(ctx *c, double *loss, double *acc)
{
    dt_tensor *logits = NULL, *l = NULL;
    int64_t rows = dt_tensor_shape(c->test_y)[0] * dt_tensor_shape(c->test_y)[1];
    float *v = malloc((size_t)(rows * VIT_CLASSES) * sizeof *v);
    dt_status st = v ? vit_forward(c->model, c->test_x, &logits) : DT_ERR_NO_MEMORY;
    if (st == DT_OK)
        st = vit_loss(c->model, logits, c->test_y, &l);
    if (st == DT_OK)
        st = dt_item(l, loss);
    if (st == DT_OK)
        st = dt_tensor_to_host(logits, -1, v, (size_t)(rows * VIT_CLASSES) * sizeof *v);
    if (st == DT_OK) {
        int64_t correct = 0;
        for (int64_t i = 0; i < c->test.n; i++) {
            int best = 0;
            for (int k = 1; k < VIT_CLASSES; k++)
                if (v[i * VIT_CLASSES + k] > v[i * VIT_CLASSES + best])
                    best = k;
            correct += best == c->test.y[i];
        }
        *acc = (double)correct / (double)c->test.n;
    }
    free(v);
    dt_tensor_destroy(l);
    dt_tensor_destroy(logits);
    return st == DT_OK ? 0 : job_fail(&c->j, "evaluation", st, vit_last_error());
}

/* FNV-1a (64-bit) over every parameter's f32 bytes, global row-major, in parameter order. */
static int checksum(ctx *c, uint64_t *out)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    dt_tensor *const *p = vit_params(c->model);
    for (int i = 0; i < vit_num_params(c->model); i++) {
        size_t bytes = (size_t)dt_tensor_numel(p[i]) * sizeof(float);
        unsigned char *buf = malloc(bytes);
        dt_status st = buf ? dt_tensor_to_host(p[i], -1, buf, bytes) : DT_ERR_NO_MEMORY;
        uint64_t hp = 0xcbf29ce484222325ULL;
        for (size_t k = 0; st == DT_OK && k < bytes; k++) {
            h = (h ^ buf[k]) * 0x100000001b3ULL;
            hp = (hp ^ buf[k]) * 0x100000001b3ULL;
        }
        free(buf);
        if (st == DT_OK && c->o.checksums)
            job_say(&c->j, "checksum %-22s %016llx\n", vit_param_names(c->model)[i],
                    (unsigned long long)hp);
        if (st != DT_OK)
            return job_fail(&c->j, "checksum", st, dt_last_error());
    }
    *out = h;
    return 0;
}

static int run(ctx *c)
{
    int rc;
    if ((rc = job_mesh(&c->j, c->o.mesh_file, NULL, -1, &c->mesh)) != 0 || (rc = setup(c)) != 0)
        return rc;
    char dims[128] = "";
    for (int d = 0; d < dt_mesh_rank(c->mesh); d++)
        snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%s=%lld", d ? " x " : "",
                 dt_mesh_dim_name(c->mesh, d), (long long)dt_mesh_dim_size(c->mesh, d));
    int64_t nparam = 0;
    for (int i = 0; i < vit_num_params(c->model); i++)
        nparam += dt_tensor_numel(vit_params(c->model)[i]);
    const vit_config *g = &c->o.cfg;
    job_say(&c->j, "train_vit: mesh '%s' %s: %lld CPU devices (%d process%s x %d)\n",
            dt_mesh_name(c->mesh), dims, (long long)dt_mesh_size(c->mesh), c->j.nprocs,
            c->j.nprocs == 1 ? "" : "es", dt_num_local_devices(DT_DEVICE_CPU));
    job_say(&c->j,
            "  data: %lld training / %lld held-out digits, global batch %lld (%d shards "
            "of %lld)\n",
            (long long)c->train.n, (long long)c->test.n, (long long)c->o.batch, VIT_SHARDS,
            (long long)(c->o.batch / VIT_SHARDS));
    job_say(&c->j,
            "  model: ViT, %lld patches of %lldx%lld, width %lld, %d heads, MLP %lld, "
            "%lld block%s, %lld parameters; ZeRO stage %d, AdamW lr %g\n",
            (long long)((VIT_SIDE / g->patch) * (VIT_SIDE / g->patch)), (long long)g->patch,
            (long long)g->patch, (long long)g->dim, VIT_GROUPS, (long long)g->mlp,
            (long long)g->layers, g->layers == 1 ? "" : "s", (long long)nparam, c->o.stage,
            c->o.lr);
    double t0 = job_now(), train_s = 0, eloss = NAN, eacc = NAN, loss = NAN;
    for (int64_t step = 0; step < c->o.steps; step++) {
        double ts = job_now();
        if ((rc = train_step(c, step, &loss)) != 0)
            return rc;
        train_s += job_now() - ts;
        int64_t done = step + 1;
        if (done % c->o.log_every == 0 || done == c->o.steps)
            job_say(&c->j, "step %5lld  loss %.9g\n", (long long)done, loss);
        if (done % c->o.eval_every == 0 || done == c->o.steps) {
            if ((rc = evaluate(c, &eloss, &eacc)) != 0)
                return rc;
            job_say(&c->j, "eval %5lld  held-out loss %.9g  accuracy %.4f\n", (long long)done,
                    eloss, eacc);
        }
    }
    if (c->o.steps == 0 && (rc = evaluate(c, &eloss, &eacc)) != 0)
        return rc;
    uint64_t sum = 0;
    if ((rc = checksum(c, &sum)) != 0)
        return rc;
    job_say(&c->j, "done: %lld steps in %.2f s (%.1f ms a step), %.1f s in all\n",
            (long long)c->o.steps, train_s, c->o.steps ? 1e3 * train_s / (double)c->o.steps : 0.0,
            job_now() - t0);
    if (c->j.me == 0) {
        printf("result accuracy=%.4f heldout_loss=%.9g checksum=%016llx steps=%lld\n", eacc, eloss,
               (unsigned long long)sum, (long long)c->o.steps);
        fflush(stdout);
    }
    return 0;
}

static void ctx_free(ctx *c)
{
    dt_zero_destroy(c->zero);
    dt_tensor_destroy(c->test_x);
    dt_tensor_destroy(c->test_y);
    vit_destroy(c->model);
    dt_mesh_destroy(c->mesh);
    digits_free(&c->all);
    digits_free(&c->train);
    digits_free(&c->test);
    free(c->order);
    free(c->bx);
    free(c->by);
}

int main(int argc, char **argv)
{
    ctx c;
    memset(&c, 0, sizeof c);
    job_begin(&c.j, "train_vit", &argc, &argv);
    char err[512];
    int rc = 0;
    if (parse_options(argc, argv, &c.o, err, sizeof err) != 0) {
        if (c.j.me == 0)
            fprintf(stderr, "train_vit: %s\n", err);
        rc = 2;
    } else if (c.o.help) {
        if (c.j.me == 0)
            usage(stdout);
    } else if ((rc = job_start(&c.j, c.o.mesh_file, NULL, -1)) == 0) {
        c.j.quiet = c.o.quiet;
        rc = run(&c);
        job_abort_if_lost(&c.j);
        ctx_free(&c);
    }
    return job_end(&c.j, rc);
}
