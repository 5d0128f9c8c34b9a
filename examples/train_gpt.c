/* train_gpt: trains a character-level GPT on first names (examples/data/names.txt) over a
 * device mesh read from YAML: data parallel along `batch` with the ZeRO optimizer (AdamW,
 * warm-up then cosine learning rate), attention heads, MLP and vocabulary tensor parallel
 * along `model`; f32, bf16 or f16 (dynamic loss scaling) parameters; checkpoints through the
 * DSaver and resumes exactly, also on another process count; writes the curves as CSV and
 * PNG and samples names at the end. Runs alone or under mpirun (docs/examples.md). The last
 * line printed is
 *   result heldout_loss=<nats/char> samples=<a,b,...> checkpoint=<dir> plot=<png>.
 * Training batches come through the input pipeline (include/dtensor/data.h): a callback
 * source over the training names, a prefetching dataset sharded over `batch`. */
#include <dtensor/dtensor.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt/curves.h"
#include "gpt/model.h"
#include "gpt/names.h"
#include "gpt/options.h"
#include "gpt/pipe.h"
#include "train/hand.h"
#include "train/history.h"
#include "train/job.h"
#include "train/rng.h"

#ifndef TRAIN_EXAMPLES_DIR
#define TRAIN_EXAMPLES_DIR "examples"
#endif

#define TARGET 2.00
/* The train / held-out split is fixed (not --seed): every run is measured on the same names. */
#define SPLIT_SEED 20251201u
#define HELDOUT_SHARE 10 /* one name in ten */

typedef struct ctx {
    job j; /* this process of the job */
    gpt_opts o;
    char ckpt_dir[JOB_PATH_MAX], csv_path[JOB_PATH_MAX], png_path[JOB_PATH_MAX];
    dt_mesh *mesh;
    dt_dtype dtype;
    names all, train, test;
    gpt *model;
    dt_zero *zero;
    int group_decay, group_plain;
    dt_tensor *test_x, *test_y;
    int64_t test_targets;
    dt_data_source *source; /* the training names */
    int64_t T;              /* tokens per row: NAMES_CONTEXT, or --context (names packed) */
    int32_t *stream;        /* --context: the training names packed (names_pack) */
    int64_t rows;           /* examples: training names, or rows of the packed stream */
    dt_data_field fields[2];
    dt_dataset *data;       /* their global batches: inputs and targets [batch, 16] */
    history hist;
    int64_t step;
    double train_seconds;
    double train_cpu_seconds; /* this process's CPU time in training steps */
    int64_t trained_tokens;
    uint64_t step_peak_bytes; /* the most tensor memory in use during a training step */
    /* --pipe (gpt/pipe.c): the model, the seeded draw of each batch's training names, the
     * held-out rows and a batch on the host (every client holds them whole) */
    gpt_pipe *gp;
    rng pick;
    int32_t *test_hx, *test_hy, *bx, *by, *brows;
    int64_t test_n;
    /* --mem-ckpt-every K [--mem-ckpt-buddy J] [--job-id ID]: in-memory checkpoints on a buddy
     * host (docs/recovery.md) */
    int64_t mem_every;
    int mem_buddy;
    const char *job_id;
    dt_memckpt *mem;
    int64_t mem_saves;
    double mem_seconds;       /* the saves after the first */
    double mem_first_seconds;
    int resumed;            /* resumed from memory or disk: the first step's time is printed */
} ctx;

/* ---- setup --------------------------------------------------------------------------------- */

/* The mesh (job_mesh's checks), whose `model` dim must split the heads and the vocabulary. */
static int setup_mesh(ctx *c)
{
    if (job_mesh(&c->j, c->o.mesh_file, c->o.mesh_name, -1, &c->mesh) != 0)
        return 1;
    int md = dt_mesh_dim_index(c->mesh, "model");
    int64_t msize = md >= 0 ? dt_mesh_dim_size(c->mesh, md) : 1;
    if (c->o.heads % msize != 0 || NAMES_VOCAB % msize != 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "--heads %lld and the vocabulary (%d) must split evenly over "
                 "model=%lld", (long long)c->o.heads, NAMES_VOCAB, (long long)msize);
        return job_fail(&c->j, "mesh", DT_ERR_INVALID_ARGUMENT, msg);
    }
    /* --cp K: context parallelism is the mesh's `seq` dim; this only checks its size. */
    int sd = dt_mesh_dim_index(c->mesh, "seq");
    int64_t ssize = sd >= 0 ? dt_mesh_dim_size(c->mesh, sd) : 1;
    if (c->o.cp && c->o.cp != ssize) {
        char msg[512];
        if (sd < 0)
            snprintf(msg, sizeof msg,
                     "--cp %lld: mesh '%s' has no `seq` dim (add one of size "
                     "%lld to its dims)",
                     (long long)c->o.cp, dt_mesh_name(c->mesh), (long long)c->o.cp);
        else
            snprintf(msg, sizeof msg, "--cp %lld: mesh '%s' has seq=%lld", (long long)c->o.cp,
                     dt_mesh_name(c->mesh), (long long)ssize);
        return job_fail(&c->j, "mesh", DT_ERR_INVALID_ARGUMENT, msg);
    }
    if (c->o.sequence_parallel && (sd >= 0 || c->o.pipe)) {
        return job_fail(&c->j, "mesh", DT_ERR_UNSUPPORTED,
                        sd >= 0 ? "--sequence-parallel with a `seq` mesh dim is not supported"
                                : "--sequence-parallel with --pipe is not supported");
    }
    return 0;
}

/* The source's callback: training name `index` as its input and target rows. */
static dt_status fill_example(void *arg, int64_t index, void *const *fields)
{
    const ctx *c = arg;
    int32_t row = (int32_t)index, x[NAMES_CONTEXT], y[NAMES_CONTEXT];
    if (c->stream) { /* --context: row `index` of the packed names */
        int32_t *w = malloc(2 * (size_t)c->T * sizeof *w);
        if (!w)
            return DT_ERR_NO_MEMORY;
        names_window(c->stream, c->T, index, w, w + c->T);
        if (fields[0])
            memcpy(fields[0], w, (size_t)c->T * sizeof *w);
        if (fields[1])
            memcpy(fields[1], w + c->T, (size_t)c->T * sizeof *w);
        free(w);
        return DT_OK;
    }
    names_encode(&c->train, &row, 1, x, y);
    if (fields[0])
        memcpy(fields[0], x, sizeof x);
    if (fields[1])
        memcpy(fields[1], y, sizeof y);
    return DT_OK;
}

/* The names, split into training and held-out ones. */
static int load_names(ctx *c)
{
    char err[512] = "";
    int bad = names_load(c->o.data_file, &c->all, err, sizeof err) != 0;
    if (!bad && names_split(&c->all, c->all.n / HELDOUT_SHARE, SPLIT_SEED, &c->train,
                            &c->test) != 0) {
        snprintf(err, sizeof err, "out of memory");
        bad = 1;
    }
    return job_any_failed(&c->j, bad, err);
}

static int setup_data(ctx *c)
{
    char err[512] = "";
    int bad = 0;
    if (load_names(c) != 0)
        return 1;
    c->T = c->o.context ? c->o.context : NAMES_CONTEXT;
    c->rows = c->train.n;
    if (!bad && c->o.context) {
        int64_t len = names_pack(&c->train, &c->stream);
        if (len < 0)
            snprintf(err, sizeof err, "out of memory");
        bad = len < 0;
        c->rows = bad ? 0 : (len - 1) / c->T;
    }
    if (job_any_failed(&c->j, bad, err))
        return 1;
    int64_t shards = dt_mesh_dim_size(c->mesh, dt_mesh_dim_index(c->mesh, "batch"));
    if (c->o.batch < shards || c->o.batch > c->rows) {
        if (c->j.me == 0)
            fprintf(stderr, "train_gpt: --batch %lld: must be in %lld..%lld\n",
                    (long long)c->o.batch, (long long)shards, (long long)c->rows);
        return 2;
    }
    /* Epochs of a seeded shuffle of the training names cut into global batches; each
     * process encodes only its devices' rows, on a prefetch thread. */
    dt_data_field *fields = c->fields;
    fields[0] = fields[1] = (dt_data_field){DT_DTYPE_I32, 1, {c->T}};
    dt_layout *l = NULL;
    dt_dataset_opts dopts = DT_DATASET_OPTS_INIT;
    dopts.global_batch = c->o.batch;
    dopts.seed = (uint64_t)c->o.seed;
    dt_status st = dt_data_source_callback(c->rows, 2, fields, fill_example, c, &c->source);
    if (st == DT_OK)
        st = dt_layout_batch_sharded(c->mesh, "batch", 2, 0, &l);
    const dt_layout *ls[2] = {l, l};
    if (st == DT_OK)
        st = dt_dataset_create(c->source, 2, ls, &dopts, &c->data);
    dt_layout_destroy(l);
    return st != DT_OK ? job_fail(&c->j, "dataset", st, dt_last_error()) : 0;
}

/* The held-out rows on the host (c->test_hx, test_hy, test_n rows of c->T) and the targets
 * they count. */
static int load_heldout(ctx *c)
{
    int64_t n = c->test.n, T = c->T;
    int32_t *stream = NULL;
    if (c->o.context) { /* the held-out names packed: every row of T whole */
        int64_t len = names_pack(&c->test, &stream);
        n = len > 0 ? (len - 1) / T : 0;
    }
    int32_t *x = malloc((size_t)(n * T) * sizeof *x), *y = malloc((size_t)(n * T) * sizeof *y);
    if (job_any_failed(&c->j, !x || !y || (c->o.context && (!stream || n < 1)),
                       c->o.context && n < 1 ? "--context: longer than the held-out names"
                                            : "out of memory")) {
        free(x);
        free(y);
        free(stream);
        return 1;
    }
    if (stream) {
        for (int64_t i = 0; i < n; i++)
            names_window(stream, T, i, x + i * T, y + i * T);
        c->test_targets = n * T;
        free(stream);
    } else {
        c->test_targets = names_encode(&c->test, NULL, n, x, y);
    }
    c->test_hx = x;
    c->test_hy = y;
    c->test_n = n;
    return 0;
}

static dt_dtype precision_dtype(const char *precision)
{
    return strcmp(precision, "bf16") == 0  ? DT_DTYPE_BF16
           : strcmp(precision, "f16") == 0 ? DT_DTYPE_F16
                                           : DT_DTYPE_F32;
}

/* The optimizer's options as train_gpt sets them (f16: dynamic loss scaling). */
static dt_zero_opts zero_opts(const ctx *c)
{
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = (int)c->o.stage;
    zo.dp_dim = "batch";
    zo.clip_norm = c->o.clip;
    if (c->dtype == DT_DTYPE_F16) {
        zo.scaler.mode = DT_LOSS_SCALE_DYNAMIC;
        zo.scaler.window = 200;
    }
    return zo;
}

/* AdamW for the decayed parameters (the norms get no decay). */
static dt_optim_hparams adamw(const ctx *c)
{
    dt_optim_hparams hp = DT_OPTIM_ADAMW_INIT;
    hp.lr = (float)c->o.lr;
    hp.beta2 = 0.99f;
    hp.weight_decay = (float)c->o.weight_decay;
    return hp;
}

static int setup_model(ctx *c)
{
    c->dtype = precision_dtype(c->o.precision);
    gpt_config cfg = {NAMES_VOCAB, c->T, c->o.width, c->o.heads, c->o.layers,
                      strcmp(c->o.arch, "llama") == 0, c->o.kv_heads};
    dt_status st = gpt_create(c->mesh, &cfg, c->dtype, (uint64_t)c->o.seed, &c->model);
    if (st == DT_OK && c->o.sequence_parallel)
        st = gpt_set_sequence_parallel(c->model);
    if (st != DT_OK)
        return job_fail(&c->j, "model", st, gpt_last_error());
    gpt_set_backward(c->model, (int)c->o.checkpoint_blocks);
    gpt_set_dropout(c->model, (float)c->o.dropout, (uint64_t)c->o.seed, 0);
    if (load_heldout(c) != 0)
        return 1;
    st = gpt_inputs(c->model, c->test_n, c->test_hx, c->test_hy, &c->test_x, &c->test_y);
    free(c->test_hx);
    free(c->test_hy);
    c->test_hx = c->test_hy = NULL;
    if (st != DT_OK)
        return job_fail(&c->j, "held-out data", st, gpt_last_error());

    dt_zero_opts zo = zero_opts(c);
    /* 256 KiB buckets: several per transformer block, so the later blocks' buckets reduce
     * while the backward pass computes the earlier blocks. */
    zo.reduce_bucket_size = 262144;
    if ((st = dt_zero_create(c->mesh, &zo, &c->zero)) != DT_OK)
        return job_fail(&c->j, "dt_zero_create", st, dt_last_error());
    /* Weight matrices and embeddings decay; layer norms do not (GPT-2's grouping). */
    dt_optim_hparams hp = adamw(c);
    if ((st = gpt_attach(c->model, c->zero, &hp, c->o.stage == 3)) != DT_OK)
        return job_fail(&c->j, "dt_zero_add_group", st, dt_last_error());
    return 0;
}

/* Linear warm-up to --lr, then a cosine decay to --min-lr at the last step. */
static double lr_at(const gpt_opts *o, int64_t step)
{
    if (step < o->warmup)
        return o->lr * (double)(step + 1) / (double)o->warmup;
    double span = (double)(o->steps - o->warmup), t = span > 0 ? (double)(step - o->warmup) / span : 1;
    return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1 + cos(M_PI * (t < 1 ? t : 1)));
}

/* ---- checkpoints --------------------------------------------------------------------------- */

/* The optimizer, the data position, the history and the step (job_save, job_resume). */
static dt_zero *optimizer(const ctx *c)
{
    return c->gp ? gpt_pipe_zero(c->gp) : c->zero;
}

/* --pipe: every stage's optimizer saves into one checkpoint from the whole mesh, its batches'
 * position is the step (the draws are replayed on a resume). */
static job_train train_state(ctx *c)
{
    return (job_train){optimizer(c), c->data, &c->hist, &c->step,
                       c->gp ? gpt_pipe_save_mesh(c->gp) : NULL};
}

/* The model and batch a checkpoint was saved with, as one value train/config. */
static void config_text(const gpt_opts *o, char *buf, size_t len)
{
    snprintf(buf, len, "layers=%lld width=%lld heads=%lld batch=%lld precision=%s%s%s",
             (long long)o->layers, (long long)o->width, (long long)o->heads,
             (long long)o->batch, o->precision, strcmp(o->arch, "gpt") ? " arch=llama" : "",
             o->pipe ? " batches=pipe" : "");
}

static int save_checkpoint(ctx *c, int memory)
{
    char config[160];
    config_text(&c->o, config, sizeof config);
    dt_ckpt_value v[2] = {
        {"train/config", DT_CKPT_VALUE_BYTES, 0, 0, config, strlen(config)},
        {"train/seed", DT_CKPT_VALUE_I64, c->o.seed, 0, NULL, 0},
    };
    job_train t = train_state(c);
    if (memory)
        return job_save_memory(&c->j, &t, v, 2, c->mem);
    return job_save(&c->j, &t, v, 2, c->o.ckpt_root, c->o.keep_last, c->ckpt_dir);
}

/* A checkpoint resumes only with the config and seed it was saved with (job_check_fn). */
static int check_config(void *arg, const dt_ckpt *ck, const char *dir, char *err, size_t errlen)
{
    const ctx *c = arg;
    int64_t seed = 0;
    const void *cd = NULL;
    size_t cn = 0;
    char config[160];
    config_text(&c->o, config, sizeof config);
    if (dt_ckpt_value_i64(ck, "train/seed", &seed) != DT_OK ||
        dt_ckpt_value_bytes(ck, "train/config", &cd, &cn) != DT_OK) {
        snprintf(err, errlen, "--resume %s: not a train_gpt checkpoint: %s", dir, dt_last_error());
        return -1;
    }
    if (cn != strlen(config) || memcmp(cd, config, cn) != 0 || seed != c->o.seed) {
        snprintf(err, errlen, "--resume %s: saved with %.*s --seed %lld; this run has %s "
                 "--seed %lld", dir, (int)(cn < 150 ? cn : 150), (const char *)cd,
                 (long long)seed, config, (long long)c->o.seed);
        return -1;
    }
    return 0;
}

/* A checkpoint of a finished run (at --steps) is not resumed. */
static int resume(ctx *c)
{
    job_train t = train_state(c);
    int rc = job_resume(&c->j, &t, c->o.resume, c->o.ckpt_root, c->o.steps, 0, c->o.stop_after,
                        check_config, c);
    for (int64_t i = 0; rc == 0 && c->gp && i < c->step * c->o.batch; i++)
        (void)rng_below(&c->pick, (uint64_t)c->train.n); /* the batches drawn before */
    return rc;
}

/* --mem-ckpt-every: the handle over the mesh's clients, then the newest step complete in
 * memory when it is at least as new as --resume's (0 resumed, 2 not, 1 failed). */
static int resume_memory(ctx *c)
{
    if (c->gp) {
        job_say(&c->j, "train_gpt: --mem-ckpt-every is not supported with --pipe\n");
        return 1;
    }
    dt_memckpt_opts mo = DT_MEMCKPT_OPTS_INIT;
    mo.every = c->mem_every;
    mo.buddy = c->mem_buddy;
    mo.job_id = c->job_id;
    dt_status st = dt_memckpt_create(c->mesh, &mo, &c->mem);
    if (st != DT_OK)
        return job_fail(&c->j, "dt_memckpt_create", st, dt_last_error());
    dt_memckpt_stats ms;
    dt_memckpt_stats_get(c->mem, &ms);
    job_say(&c->j, "  in-memory checkpoints every %lld steps over %d host(s); client 0's buddy "
            "is client %d%s\n", (long long)c->mem_every, ms.hosts, ms.buddy,
            ms.buddy_same_host ? " (some buddies share a host: one host's loss may be final)"
                               : "");
    job_train t = train_state(c);
    return job_resume_memory(&c->j, &t, c->mem, c->o.resume, c->o.ckpt_root, c->o.steps,
                             c->o.stop_after, check_config, c);
}

/* ---- training ------------------------------------------------------------------------------ */

/* DT_TEST_HANG="C:S": client C stops making progress before step S, for good (the hang
 * tests of docs/recovery.md), in the first launch only (DT_LAUNCH_RESTART unset or 0). */
static void hang_if_asked(const ctx *c)
{
    const char *h = getenv("DT_TEST_HANG"), *r = getenv("DT_LAUNCH_RESTART");
    int who = -1;
    long long at = -1;
    if (!h || (r && strcmp(r, "0") != 0) || sscanf(h, "%d:%lld", &who, &at) != 2 ||
        who != c->j.me || c->step + 1 != at)
        return;
    for (;;) /* signals (the launcher's probes) interrupt a sleep: sleep again */
        nanosleep(&(struct timespec){1, 0}, NULL);
}

static int train_step(ctx *c, hist_rec *rec)
{
    int np = gpt_num_params(c->model);
    int64_t targets = 0;
    dt_tensor *xy[2] = {NULL, NULL}, **g = calloc((size_t)np, sizeof *g);
    double scale = dt_zero_loss_scale(c->zero), loss = 0;
    dt_zero_step_info info;
    int rc = 1;
    dt_status st;
    if (job_any_failed(&c->j, !g, "out of memory"))
        goto out;
    double lr = lr_at(&c->o, c->step);
    if ((st = gpt_set_lr(c->model, c->zero, (float)lr)) != DT_OK) {
        job_fail(&c->j, "dt_zero_set_lr", st, dt_last_error());
        goto out;
    }
    if ((st = dt_dataset_next(c->data, 2, xy, NULL)) != DT_OK) {
        job_fail(&c->j, "batch", st, dt_last_error());
        goto out;
    }
    /* Each gradient goes to the optimizer as the backward pass makes it (hand_grad), whose
     * reduction then runs in the background while the earlier layers' gradients are made. */
    hang_if_asked(c); /* inside the step: the others then wait in its first collective */
    grad_hand hand = {c->zero, c->dtype};
    gpt_set_dropout(c->model, (float)c->o.dropout, (uint64_t)c->o.seed, (uint64_t)c->step);
    if ((st = gpt_count_targets(c->model, xy[1], &targets)) != DT_OK ||
        (st = gpt_grads_each(c->model, xy[0], xy[1], targets, (float)scale, &loss, hand_grad,
                             &hand, g)) != DT_OK) {
        job_fail(&c->j, "forward/backward", st, gpt_last_error());
        goto out;
    }
    if ((st = dt_zero_step(c->zero, NULL, &info)) != DT_OK) {
        job_fail(&c->j, "dt_zero_step", st, dt_last_error());
        goto out;
    }
    c->step++;
    *rec = (hist_rec){c->step, loss, NAN, NAN, 0, scale, info.skipped};
    rc = 0;
out:
    for (int i = 0; i < np && g; i++)
        dt_tensor_destroy(g[i]);
    free(g);
    dt_tensor_destroy(xy[0]);
    dt_tensor_destroy(xy[1]);
    return rc;
}

/* --pipe: a batch of training names drawn by the seeded generator, through the stages. */
static int pipe_step(ctx *c, hist_rec *rec)
{
    int64_t b = c->o.batch;
    for (int64_t i = 0; i < b; i++)
        c->brows[i] = (int32_t)rng_below(&c->pick, (uint64_t)c->train.n);
    names_encode(&c->train, c->brows, b, c->bx, c->by);
    double scale = dt_zero_loss_scale(optimizer(c)), loss = 0;
    dt_zero_step_info info;
    dt_status st = gpt_pipe_step(c->gp, b, c->bx, c->by, (float)lr_at(&c->o, c->step), &loss,
                                 &info);
    if (st != DT_OK)
        return job_fail(&c->j, "pipeline step", st, gpt_last_error());
    c->step++;
    *rec = (hist_rec){c->step, loss, NAN, NAN, 0, scale, info.skipped};
    return 0;
}

static int evaluate(ctx *c, double *loss)
{
    dt_status st = c->gp ? gpt_pipe_eval(c->gp, c->test_n, c->test_hx, c->test_hy,
                                         c->test_targets, loss, NULL)
                         : gpt_loss(c->model, c->test_x, c->test_y, c->test_targets, loss);
    return st != DT_OK ? job_fail(&c->j, "evaluation", st, gpt_last_error()) : 0;
}

/* `count` names drawn one character at a time from the model's softmax (temperature 1),
 * the same on every client (one seeded generator, logits gathered), comma-separated. */
static int sample_names(ctx *c, int64_t count, char *out, size_t outlen)
{
    /* Rows of the model's context T; a name is drawn in at most NAMES_CONTEXT - 1 steps. */
    int64_t T = c->T, V = NAMES_VOCAB;
    int32_t *x = calloc((size_t)(count * T), sizeof *x);
    float *logits = malloc((size_t)(count * T * V) * sizeof *logits);
    char(*s)[NAMES_CONTEXT + 1] = calloc((size_t)count, sizeof *s);
    int *done = calloc((size_t)count, sizeof *done);
    out[0] = '\0';
    if (job_any_failed(&c->j, !x || !logits || !s || !done, "out of memory")) {
        free(x), free(logits), free(s), free(done);
        return 1;
    }
    rng r;
    rng_seed(&r, (uint64_t)c->o.seed * 7919u + 17u);
    int rc = 0;
    for (int64_t t = 0; t + 1 < T && t + 1 < NAMES_CONTEXT && rc == 0; t++) {
        dt_tensor *tx = NULL;
        dt_status st = c->gp ? gpt_pipe_eval(c->gp, count, x, NULL, 0, NULL, logits)
                             : gpt_inputs(c->model, count, x, NULL, &tx, NULL);
        if (st == DT_OK && !c->gp)
            st = gpt_logits(c->model, tx, logits);
        dt_tensor_destroy(tx);
        if (st != DT_OK) {
            rc = job_fail(&c->j, "sampling", st, gpt_last_error());
            break;
        }
        for (int64_t i = 0; i < count; i++) {
            if (done[i])
                continue;
            const float *l = logits + (i * T + t) * V;
            double mx = l[0], p[NAMES_VOCAB], sum = 0, u = rng_uniform(&r);
            for (int64_t j = 1; j < V; j++)
                mx = l[j] > mx ? l[j] : mx;
            for (int64_t j = 0; j < V; j++)
                sum += (p[j] = exp(l[j] - mx));
            int64_t k = 0;
            for (double acc = p[0] / sum; k + 1 < V && u >= acc; acc += p[++k] / sum)
                ;
            if (k == 0) {
                done[i] = 1;
                continue;
            }
            s[i][t] = names_char((int)k);
            x[i * T + t + 1] = (int32_t)k;
        }
    }
    for (int64_t i = 0; i < count; i++)
        snprintf(out + strlen(out), outlen - strlen(out), "%s%s", i ? "," : "", s[i]);
    free(x), free(logits), free(s), free(done);
    return rc;
}

static int write_outputs(ctx *c)
{
    char err[1024] = "", sub[200];
    int bad = 0;
    if (c->j.me == 0) {
        snprintf(sub, sizeof sub, "(%s, %s, zero %lld, %lld layers x %lld wide, %lld heads, "
                 "batch %lld names)", dt_mesh_name(c->mesh), c->o.precision,
                 (long long)c->o.stage, (long long)c->o.layers, (long long)c->o.width,
                 (long long)c->o.heads, (long long)c->o.batch);
        bad = curves_write_csv(&c->hist, c->csv_path, err, sizeof err) != 0 ||
              curves_write_plot(&c->hist, c->o.steps, TARGET, sub, c->png_path, err,
                                sizeof err) != 0;
    }
    return job_any_failed(&c->j, bad, err);
}

/* ---- --pipe: the pipelined model (gpt/pipe.c, docs/pipeline.md) -------------------------- */

/* The mesh's `pipe` dim (or, at --pipe 1 without one, the whole mesh with micro-batches
 * accumulated): batches of seeded random training names from host arrays, the held-out
 * rows and the samples through the stages' forward passes. */
static int setup_pipe(ctx *c)
{
    int pd = dt_mesh_dim_index(c->mesh, "pipe");
    int64_t P = pd >= 0 ? dt_mesh_dim_size(c->mesh, pd) : 1;
    if (P != c->o.pipe || c->o.context || c->o.dropout > 0 ||
        dt_mesh_dim_index(c->mesh, "seq") >= 0) {
        char msg[320];
        snprintf(msg, sizeof msg, "--pipe %lld: the mesh's pipe dim has %lld stages (--pipe 1: "
                 "none); --context, --dropout and a 'seq' dim are not supported with --pipe",
                 (long long)c->o.pipe, (long long)P);
        return job_fail(&c->j, "mesh", DT_ERR_INVALID_ARGUMENT, msg);
    }
    if (load_names(c) != 0)
        return 1;
    c->T = NAMES_CONTEXT;
    c->rows = c->train.n;
    if (load_heldout(c) != 0)
        return 1;
    c->dtype = precision_dtype(c->o.precision);
    gpt_config cfg = {NAMES_VOCAB, NAMES_CONTEXT, c->o.width, c->o.heads, c->o.layers,
                      strcmp(c->o.arch, "llama") == 0, c->o.kv_heads};
    gpt_pipe_opts po;
    memset(&po, 0, sizeof po);
    dt_status st = dt_pipe_schedule_kind_parse(c->o.schedule, &po.schedule);
    po.micro = (int)c->o.microbatches;
    po.chunks = po.schedule == DT_PIPE_INTERLEAVED ? 2 : 1;
    po.zero = zero_opts(c);
    po.hp = adamw(c);
    if (st == DT_OK)
        st = gpt_pipe_create(c->mesh, &cfg, c->dtype, (uint64_t)c->o.seed, &po, &c->gp);
    if (st != DT_OK)
        return job_fail(&c->j, "pipeline model", st, gpt_last_error());
    int64_t b = c->o.batch, T = c->T;
    c->brows = malloc((size_t)b * sizeof *c->brows);
    c->bx = malloc((size_t)(b * T) * sizeof *c->bx);
    c->by = malloc((size_t)(b * T) * sizeof *c->by);
    rng_seed(&c->pick, (uint64_t)c->o.seed * 1000003u + 11u);
    return job_any_failed(&c->j, !c->brows || !c->bx || !c->by, "out of memory");
}

/* ---- the run ------------------------------------------------------------------------------ */

static int run(ctx *c)
{
    int rc;
    if ((rc = setup_mesh(c)) != 0 ||
        (c->o.pipe ? (rc = setup_pipe(c)) != 0
                   : ((rc = setup_data(c)) != 0 || (rc = setup_model(c)) != 0)))
        return rc;
    if (job_places(&c->j, c->o.out_dir, c->o.ckpt_dir, c->o.ckpt_root, c->ckpt_dir, c->csv_path,
                   c->png_path) != 0)
        return 1;

    dt_device_type dev = dt_mesh_device_type(c->mesh);
    job_say(&c->j, "train_gpt: mesh '%s' (%lld %s devices, %d process%s)\n", dt_mesh_name(c->mesh),
        (long long)dt_mesh_size(c->mesh), dt_device_type_name(dev), c->j.nprocs,
        c->j.nprocs == 1 ? "" : "es");
    job_say(&c->j, "  data: %lld training / %lld held-out names (%s), %lld names per batch\n",
        (long long)c->train.n, (long long)c->test.n, c->o.data_file, (long long)c->o.batch);
    if (c->gp)
        job_say(&c->j, "  pipeline: %d stages (%s), %lld micro-batches of %lld names; this "
                "process's stage %d holds %lld %s parameters; ZeRO stage %lld, AdamW lr %g\n",
                gpt_pipe_stages(c->gp), c->o.schedule, (long long)c->o.microbatches,
                (long long)(c->o.batch / c->o.microbatches), gpt_pipe_my_stage(c->gp),
                (long long)gpt_pipe_param_count(c->gp), c->o.precision, (long long)c->o.stage,
                c->o.lr);
    else
        job_say(&c->j, "  model: %lld layers, width %lld, %lld heads, context %d, %lld %s "
                "parameters; ZeRO stage %lld, AdamW lr %g\n", (long long)c->o.layers,
                (long long)c->o.width, (long long)c->o.heads, (int)c->T,
                (long long)gpt_param_count(c->model), c->o.precision, (long long)c->o.stage,
                c->o.lr);
    int from_disk = 2;
    if (c->mem_every && (from_disk = resume_memory(c)) == 1)
        return 1;
    double r0 = job_now();
    if (from_disk == 2 && c->o.resume && (rc = resume(c)) != 0)
        return rc;
    if (from_disk == 2 && c->o.resume && c->mem_every)
        job_say(&c->j, "  restored from disk in %.3f s\n", job_now() - r0);
    c->resumed = from_disk == 0 || c->o.resume;

    int64_t b = c->o.batch, T = c->T;
    int64_t last = c->o.stop_after ? c->o.stop_after : c->o.steps;
    double t_start = job_now(), win_time = 0, eloss = NAN;
    int64_t win_steps = 0, win_skipped = 0;
    while (c->step < last) {
        hist_rec rec;
        double t0 = job_now(), cpu0 = job_cpu_now();
        dt_host_pool_reset_peak();
        if ((rc = c->gp ? pipe_step(c, &rec) : train_step(c, &rec)) != 0)
            goto out;
        double dt = job_now() - t0;
        c->train_cpu_seconds += job_cpu_now() - cpu0;
        dt_pool_stats ps;
        dt_host_pool_stats(&ps);
        if (ps.peak_bytes_requested > c->step_peak_bytes)
            c->step_peak_bytes = ps.peak_bytes_requested;
        rec.samples_per_s = dt > 0 ? (double)(b * T) / dt : 0;
        c->train_seconds += dt;
        c->trained_tokens += b * T;
        win_time += dt;
        win_steps++;
        win_skipped += rec.skipped;
        if (c->step % c->o.eval_every == 0 || c->step == last) {
            if ((rc = evaluate(c, &eloss)) != 0)
                goto out;
            if (c->step % c->o.eval_every == 0 || c->step == c->o.steps)
                rec.eval_loss = eloss;
            job_say(&c->j, "step %5lld/%lld  loss %.4f  held-out %.4f nats/char  %7.0f tokens/s",
                (long long)c->step, (long long)c->o.steps, rec.loss, eloss,
                win_time > 0 ? (double)(win_steps * b * T) / win_time : 0.0);
            if (c->dtype == DT_DTYPE_F16)
                job_say(&c->j, "  loss scale %g", dt_zero_loss_scale(optimizer(c)));
            if (win_skipped)
                job_say(&c->j, "  (%lld skipped: overflow)", (long long)win_skipped);
            job_say(&c->j, "\n");
            win_time = 0;
            win_steps = win_skipped = 0;
        }
        if (history_add(&c->hist, &rec) != 0) {
            job_any_failed(&c->j, 1, "out of memory");
            rc = 1;
            goto out;
        }
        if (c->resumed == 1) { /* for the recovery tests (docs/recovery.md) */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            job_say(&c->j, "first step after resuming: step %lld at unix time %.3f\n",
                    (long long)c->step, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
            c->resumed = 2;
        }
        if (c->step == last || (c->o.ckpt_every && c->step % c->o.ckpt_every == 0))
            if ((rc = save_checkpoint(c, 0)) != 0)
                goto out;
        if (c->mem && c->step != last && dt_memckpt_due(c->mem, c->step)) {
            double m0 = job_now();
            if ((rc = save_checkpoint(c, 1)) != 0)
                goto out;
            /* The first save agrees with every client (once per job): apart from the rest. */
            if (c->mem_saves++ == 0)
                c->mem_first_seconds = job_now() - m0;
            else
                c->mem_seconds += job_now() - m0;
        } else if (c->mem) {
            dt_memckpt_poll(c->mem, NULL);
        }
    }
    if (c->mem) {
        dt_memckpt_stats ms;
        dt_memckpt_stats_get(c->mem, &ms);
        job_say(&c->j, "  in-memory checkpoints: %lld saves, %.2f ms per save, %.2f%% of the "
                "training steps' time (the saves after the first; the first, agreed by every "
                "client, %.1f ms); %llu bytes per client in memory (%llu own + %llu of its "
                "source, per step kept)\n", (long long)c->mem_saves,
                c->mem_saves > 1 ? 1e3 * c->mem_seconds / (double)(c->mem_saves - 1) : 0.0,
                c->train_seconds > 0 ? 100.0 * c->mem_seconds / c->train_seconds : 0.0,
                1e3 * c->mem_first_seconds, (unsigned long long)ms.held_bytes,
                (unsigned long long)ms.own_bytes, (unsigned long long)ms.buddy_bytes);
        dt_status st = dt_memckpt_cleanup(c->mem);
        if (st != DT_OK && (rc = job_fail(&c->j, "dt_memckpt_cleanup", st, dt_last_error())))
            goto out;
    }
    double wall = job_now() - t_start;
    if (isnan(eloss) && (rc = evaluate(c, &eloss)) != 0)
        goto out;
    if ((rc = write_outputs(c)) != 0)
        goto out;
    char samples[1024] = "";
    if (c->o.samples > 0 && (rc = sample_names(c, c->o.samples, samples, sizeof samples)) != 0)
        goto out;
    if (c->o.stop_after)
        job_say(&c->j, "stopped after step %lld as asked (--stop-after); continue with --resume %s\n",
            (long long)c->step, c->ckpt_dir);
    job_say(&c->j, "done: step %lld (%.1f s in this run), %.0f tokens/s in training steps\n",
        (long long)c->step, wall,
        c->train_seconds > 0 ? (double)c->trained_tokens / c->train_seconds : 0.0);
    job_say(&c->j, "  cpu: %.3f s of process CPU time in training steps (process 0, all its "
            "threads)\n", c->train_cpu_seconds);
    job_say(&c->j, "  held-out loss %.4f nats/char (target %.2f)\n", eloss, TARGET);
    if (c->gp)
        ; /* the stages' tapes are per micro-batch (docs/pipeline.md) */
    else if (c->o.checkpoint_blocks || c->o.sequence_parallel)
        job_say(&c->j, "  tape: at most %llu bytes held for the backward pass (%s: %lld calls "
                "re-run per step)\n", (unsigned long long)gpt_peak_saved(c->model),
                c->o.checkpoint_blocks ? "blocks recomputed" : "sequence gathers recomputed",
                (long long)gpt_recomputed(c->model));
    else
        job_say(&c->j, "  tape: at most %llu bytes held for the backward pass\n",
                (unsigned long long)gpt_peak_saved(c->model));
    job_say(&c->j, "  memory: at most %llu bytes of host and CPU tensor memory in use during a "
            "training step (process 0)\n", (unsigned long long)c->step_peak_bytes);
    job_say(&c->j, "  samples: %s\n", samples);
    job_say(&c->j, "  checkpoint %s, curves %s, plot %s\n", c->ckpt_dir, c->csv_path, c->png_path);
    if (c->j.me == 0 && c->gp)
        printf("result train_loss=%.9g heldout_loss=%.9g pipe=%d microbatches=%lld schedule=%s "
               "samples=%s checkpoint=%s\n", c->hist.n ? c->hist.r[c->hist.n - 1].loss : NAN,
               eloss, gpt_pipe_stages(c->gp), (long long)c->o.microbatches, c->o.schedule,
               samples, c->ckpt_dir);
    else if (c->j.me == 0)
        printf("result heldout_loss=%.4f samples=%s checkpoint=%s plot=%s\n", eloss, samples,
               c->ckpt_dir, c->png_path);
    fflush(stdout);
    rc = 0;
out:
    return rc;
}

static void ctx_free(ctx *c)
{
    dt_memckpt_destroy(c->mem);
    gpt_pipe_destroy(c->gp);
    free(c->test_hx);
    free(c->test_hy);
    free(c->bx);
    free(c->by);
    free(c->brows);
    dt_zero_destroy(c->zero);
    dt_tensor_destroy(c->test_x);
    dt_tensor_destroy(c->test_y);
    dt_dataset_destroy(c->data);
    dt_data_source_destroy(c->source);
    gpt_destroy(c->model);
    dt_mesh_destroy(c->mesh);
    history_free(&c->hist);
    names_free(&c->all);
    names_free(&c->train);
    names_free(&c->test);
    free(c->stream);
}

/* Takes this example's recovery flags out of argv (the model's options parse the rest):
 * --mem-ckpt-every K, --mem-ckpt-buddy J, --job-id ID (else $DT_JOB_ID). 0, or -1 with err. */
static int take_memory_flags(ctx *c, int *argc, char **argv, char *err, size_t len)
{
    int o = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
        int which = strcmp(a, "--mem-ckpt-every") == 0 ? 1 : strcmp(a, "--mem-ckpt-buddy") == 0
                    ? 2 : strcmp(a, "--job-id") == 0 ? 3 : 0;
        if (!which) {
            argv[o++] = argv[i];
            continue;
        }
        char *end = NULL;
        long long n = v ? strtoll(v, &end, 10) : -1;
        if (!v || (which < 3 && (*end || n < (which == 1 ? 1 : 0)))) {
            snprintf(err, len, "%s needs %s", a, which == 3 ? "a value" : "a count");
            return -1;
        }
        if (which == 1)
            c->mem_every = n;
        else if (which == 2)
            c->mem_buddy = (int)n;
        else
            c->job_id = v;
        i++;
    }
    argv[o] = NULL;
    *argc = o;
    return 0;
}

int main(int argc, char **argv)
{
    ctx c;
    memset(&c, 0, sizeof c);
    job_begin(&c.j, "train_gpt", &argc, &argv);
    char err[512];
    int rc = 0;
    if (take_memory_flags(&c, &argc, argv, err, sizeof err) != 0 ||
        gpt_options_parse(argc, argv, TRAIN_EXAMPLES_DIR "/meshes/2x2.yaml",
                          TRAIN_EXAMPLES_DIR "/data/names.txt", &c.o, err, sizeof err) != 0) {
        if (c.j.me == 0)
            fprintf(stderr, "train_gpt: %s\n", err);
        rc = 2;
    } else if (c.o.help) {
        if (c.j.me == 0) {
            gpt_options_usage(stdout);
            fputs("in-memory checkpoints on a buddy host (docs/recovery.md):\n"
                  "  --mem-ckpt-every K  save to host memory every K steps, a copy on a client of\n"
                  "                      another host; a restart resumes from there when newer\n"
                  "                      than --resume's disk checkpoint\n"
                  "  --mem-ckpt-buddy J  the buddy is J clients away (default: on the next host)\n"
                  "  --job-id ID         the job's memory (default $DT_JOB_ID, set by dtensor\n"
                  "                      launch --max-restarts); memory in $DT_MEMCKPT_DIR\n"
                  "                      (default /dev/shm; %h: the host name)\n", stdout);
        }
    } else if ((c.j.allow_pipe = c.o.pipe > 0),
               (rc = job_start(&c.j, c.o.mesh_file, c.o.mesh_name, -1)) == 0) {
        c.j.quiet = c.o.quiet;
        rc = run(&c);
        job_abort_if_lost(&c.j);
        ctx_free(&c);
    }
    return job_end(&c.j, rc);
}
