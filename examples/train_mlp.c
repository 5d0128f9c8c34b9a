/* train_mlp: trains an MLP on the UCI handwritten digits over a device mesh read from YAML:
 * data parallel along `batch`, the hidden layer tensor parallel along `model`, the ZeRO
 * optimizer, f32 or bf16/f16 mixed precision; checkpoints through the DSaver and resumes
 * exactly; writes the curves as CSV and PNG. Runs alone or under mpirun (docs/examples.md).
 * The last line printed is `result accuracy=<held-out accuracy> checkpoint=<dir> plot=<png>`. */
#include <dtensor/dtensor.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/digits.h"
#include "train/hand.h"
#include "train/history.h"
#include "train/job.h"
#include "train/model.h"
#include "train/options.h"

#ifndef TRAIN_EXAMPLES_DIR
#define TRAIN_EXAMPLES_DIR "examples"
#endif

#define TARGET_ACC 0.95

/* Everything a run holds; freed by ctx_free. */
typedef struct ctx {
    job j; /* this process of the job */
    train_opts o;
    char ckpt_dir[JOB_PATH_MAX], csv_path[JOB_PATH_MAX], png_path[JOB_PATH_MAX];
    dt_mesh *mesh;
    digits all, train, test;
    mlp *model;
    dt_zero *zero;
    dt_tensor *test_x, *test_y;
    dt_data_source *source; /* the training rows */
    dt_dataset *data;       /* their global batches: x [batch, 64], labels [batch] */
    history hist;
    int64_t step;         /* steps done */
    double train_seconds; /* time spent in training steps (this process's run) */
    int64_t trained_samples;
} ctx;

static dt_dtype param_dtype(precision p)
{
    return p == PRECISION_BF16 ? DT_DTYPE_BF16 : p == PRECISION_F16 ? DT_DTYPE_F16 : DT_DTYPE_F32;
}

/* ---- setup --------------------------------------------------------------------------------- */

/* Training example i (the input pipeline's source): its pixels and label. */
static dt_status fill_example(void *arg, int64_t i, void *const *f)
{
    const digits *d = arg;
    if (f[0])
        memcpy(f[0], d->x + i * DIGITS_FEATURES, DIGITS_FEATURES * sizeof *d->x);
    if (f[1])
        *(int32_t *)f[1] = d->y[i];
    return DT_OK;
}

static int setup_data(ctx *c)
{
    char err[512] = "";
    int bad = digits_load(c->o.data_file, &c->all, err, sizeof err) != 0 ||
              digits_split(&c->all, &c->train, &c->test, err, sizeof err) != 0;
    if (job_any_failed(&c->j, bad, err))
        return 1;
    int64_t shards = dt_mesh_dim_size(c->mesh, dt_mesh_dim_index(c->mesh, "batch"));
    if (c->o.batch > c->train.n || c->o.batch < shards) {
        if (c->j.me == 0)
            fprintf(stderr,
                    "train_mlp: --batch %lld: must be in %lld..%lld (one row per batch "
                    "shard at least, at most the %lld training rows)\n",
                    (long long)c->o.batch, (long long)shards, (long long)c->train.n,
                    (long long)c->train.n);
        return 2;
    }
    int64_t mshards = dt_mesh_dim_index(c->mesh, "model") >= 0
                          ? dt_mesh_dim_size(c->mesh, dt_mesh_dim_index(c->mesh, "model"))
                          : 1;
    if (c->o.hidden < mshards) {
        if (c->j.me == 0)
            fprintf(stderr,
                    "train_mlp: --hidden %lld: must be at least the model dim's size "
                    "%lld\n",
                    (long long)c->o.hidden, (long long)mshards);
        return 2;
    }
    /* Epochs of a seeded shuffle cut into global batches (the remainder dropped); each process
     * fills only its devices' rows, on a prefetch thread. */
    static const dt_data_field fields[2] = {{DT_DTYPE_F32, 1, {DIGITS_FEATURES}},
                                            {DT_DTYPE_I32, 0, {0}}};
    dt_layout *l[2] = {NULL, NULL};
    dt_dataset_opts dopts = DT_DATASET_OPTS_INIT;
    dopts.global_batch = c->o.batch;
    dopts.seed = c->o.seed;
    dt_status st = dt_data_source_callback(c->train.n, 2, fields, fill_example, &c->train,
                                           &c->source);
    if (st == DT_OK)
        st = dt_layout_batch_sharded(c->mesh, "batch", 2, 0, &l[0]);
    if (st == DT_OK)
        st = dt_layout_batch_sharded(c->mesh, "batch", 1, 0, &l[1]);
    if (st == DT_OK)
        st = dt_dataset_create(c->source, 2, (const dt_layout *const *)l, &dopts, &c->data);
    dt_layout_destroy(l[0]);
    dt_layout_destroy(l[1]);
    if (st != DT_OK)
        return job_fail(&c->j, "dataset", st, dt_last_error());
    return 0;
}

static int setup_model(ctx *c)
{
    dt_status st = mlp_create(c->mesh, DIGITS_FEATURES, c->o.hidden, DIGITS_CLASSES,
                              param_dtype(c->o.precision), c->o.seed, &c->model);
    if (st != DT_OK)
        return job_fail(&c->j, "model", st, mlp_last_error());
    if ((st = mlp_inputs(c->model, c->test.n, c->test.x, c->test.y, &c->test_x, &c->test_y)) !=
        DT_OK)
        return job_fail(&c->j, "held-out data", st, mlp_last_error());

    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = c->o.stage;
    zo.offload = c->o.offload;
    /* 16 KiB buckets: a few per layer of this small model, so the first ones reduce while the
     * backward pass still computes the earlier layers. */
    zo.reduce_bucket_size = 16384;
    zo.dp_dim = "batch";
    zo.clip_norm = c->o.clip;
    if (c->o.precision == PRECISION_F16) {
        zo.scaler.mode = DT_LOSS_SCALE_DYNAMIC;
        zo.scaler.window = 100;
    }
    if ((st = dt_zero_create(c->mesh, &zo, &c->zero)) != DT_OK)
        return job_fail(&c->j, "dt_zero_create", st, dt_last_error());
    dt_optim_hparams hp;
    if (c->o.optimizer == DT_OPTIM_SGD) {
        hp = (dt_optim_hparams)DT_OPTIM_SGD_INIT;
        hp.momentum = 0.9f;
    } else if (c->o.optimizer == DT_OPTIM_ADAMW) {
        hp = (dt_optim_hparams)DT_OPTIM_ADAMW_INIT;
    } else {
        hp = (dt_optim_hparams)DT_OPTIM_ADAM_INIT;
    }
    hp.lr = (float)c->o.lr;
    hp.weight_decay = (float)c->o.weight_decay;
    if ((st = mlp_attach(c->model, c->zero, &hp, c->o.stage == 3)) != DT_OK)
        return job_fail(&c->j, "dt_zero_add_group", st, dt_last_error());
    return 0;
}

/* ---- checkpoints --------------------------------------------------------------------------- */

/* The optimizer, the data position, the history and the step (job_save, job_resume). */
static job_train train_state(ctx *c)
{
    return (job_train){c->zero, c->data, &c->hist, &c->step, NULL};
}

static int save_checkpoint(ctx *c)
{
    const char *prec = precision_name(c->o.precision);
    dt_ckpt_value v[4] = {
        {"train/batch", DT_CKPT_VALUE_I64, c->o.batch, 0, NULL, 0},
        {"train/hidden", DT_CKPT_VALUE_I64, c->o.hidden, 0, NULL, 0},
        {"train/precision", DT_CKPT_VALUE_BYTES, 0, 0, prec, strlen(prec)},
        {"train/seed", DT_CKPT_VALUE_I64, (int64_t)c->o.seed, 0, NULL, 0},
    };
    job_train t = train_state(c);
    return job_save(&c->j, &t, v, 4, c->o.ckpt_root, c->o.keep_last, c->ckpt_dir);
}

/* A checkpoint resumes only with the model and batch it was saved with (job_check_fn). */
static int check_config(void *arg, const dt_ckpt *ck, const char *dir, char *err, size_t errlen)
{
    const ctx *c = arg;
    int64_t batch = 0, hidden = 0;
    const void *pd = NULL;
    size_t pn = 0;
    if (dt_ckpt_value_i64(ck, "train/batch", &batch) != DT_OK ||
        dt_ckpt_value_i64(ck, "train/hidden", &hidden) != DT_OK ||
        dt_ckpt_value_bytes(ck, "train/precision", &pd, &pn) != DT_OK) {
        snprintf(err, errlen, "--resume %s: not a train_mlp checkpoint: %s", dir, dt_last_error());
        return -1;
    }
    const char *prec = precision_name(c->o.precision);
    if (batch != c->o.batch || hidden != c->o.hidden || pn != strlen(prec) ||
        memcmp(pd, prec, pn) != 0) {
        snprintf(err, errlen,
                 "--resume %s: saved with --batch %lld --hidden %lld --precision "
                 "%.*s; this run has --batch %lld --hidden %lld --precision %s",
                 dir, (long long)batch, (long long)hidden, (int)(pn < 16 ? pn : 16),
                 (const char *)pd, (long long)c->o.batch, (long long)c->o.hidden, prec);
        return -1;
    }
    return 0;
}

/* A checkpoint at the last step may be resumed: the run is evaluated and written out again. */
static int resume(ctx *c)
{
    job_train t = train_state(c);
    return job_resume(&c->j, &t, c->o.resume, c->o.ckpt_root, c->o.steps, 1, c->o.stop_after,
                      check_config, c);
}

/* ---- training ------------------------------------------------------------------------------ */

/* One optimizer step on the next global batch. */
static int train_step(ctx *c, hist_rec *rec)
{
    dt_tensor *xy[2] = {NULL, NULL}, *g[MLP_NPARAMS] = {NULL, NULL, NULL, NULL};
    double scale = dt_zero_loss_scale(c->zero), loss = 0;
    dt_zero_step_info info;
    int rc = 1;
    dt_status st = dt_dataset_next(c->data, 2, xy, NULL);
    if (st != DT_OK) {
        job_fail(&c->j, "batch", st, dt_last_error());
        goto out;
    }
    /* Each gradient goes to the optimizer as the backward pass makes it (hand_grad), whose
     * reduction then runs in the background while the earlier layers' gradients are made. */
    grad_hand hand = {c->zero, param_dtype(c->o.precision)};
    if ((st = mlp_grads_each(c->model, xy[0], xy[1], (float)scale, &loss, hand_grad, &hand,
                             g)) != DT_OK) {
        job_fail(&c->j, "forward/backward", st, mlp_last_error());
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
    for (int i = 0; i < MLP_NPARAMS; i++)
        dt_tensor_destroy(g[i]);
    dt_tensor_destroy(xy[0]);
    dt_tensor_destroy(xy[1]);
    return rc;
}

static int evaluate(ctx *c, double *loss, double *acc)
{
    dt_status st = mlp_evaluate(c->model, c->test_x, c->test_y, c->test.y, loss, acc);
    if (st != DT_OK)
        return job_fail(&c->j, "evaluation", st, mlp_last_error());
    return 0;
}

static int write_outputs(ctx *c)
{
    char err[1024] = "", sub[160];
    int bad = 0;
    if (c->j.me == 0) {
        snprintf(sub, sizeof sub, "(%s, %s, zero %d, %s, hidden %lld, batch %lld)",
                 dt_mesh_name(c->mesh)[0] ? dt_mesh_name(c->mesh) : "mesh",
                 optimizer_name(c->o.optimizer), c->o.stage, precision_name(c->o.precision),
                 (long long)c->o.hidden, (long long)c->o.batch);
        bad = history_write_csv(&c->hist, c->csv_path, err, sizeof err) != 0 ||
              history_write_plot(&c->hist, c->o.steps, TARGET_ACC, sub, c->png_path, err,
                                 sizeof err) != 0;
    }
    return job_any_failed(&c->j, bad, err);
}

static void print_header(ctx *c)
{
    dt_device_type t = dt_mesh_device_type(c->mesh);
    char dims[256] = "";
    for (int d = 0; d < dt_mesh_rank(c->mesh); d++)
        snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%s=%lld", d ? " x " : "",
                 dt_mesh_dim_name(c->mesh, d), (long long)dt_mesh_dim_size(c->mesh, d));
    job_say(&c->j, "train_mlp: mesh '%s' %s: %lld %s devices (%d process%s x %d)\n", dt_mesh_name(c->mesh),
        dims, (long long)dt_mesh_size(c->mesh), dt_device_type_name(t), c->j.nprocs,
        c->j.nprocs == 1 ? "" : "es", dt_num_local_devices(t));
    job_say(&c->j, "  data: %lld training / %lld held-out digits (%s), global batch %lld\n",
        (long long)c->train.n, (long long)c->test.n, c->o.data_file, (long long)c->o.batch);
    job_say(&c->j, "  model: 64-%lld-10 MLP, %s parameters; ZeRO stage %d, %s lr %g%s\n",
        (long long)c->o.hidden, precision_name(c->o.precision), c->o.stage,
        optimizer_name(c->o.optimizer), c->o.lr,
        c->o.precision == PRECISION_F16 ? ", dynamic loss scaling" : "");
}

static int run(ctx *c)
{
    int rc;
    if ((rc = job_mesh(&c->j, c->o.mesh_file, c->o.mesh_name, c->o.device, &c->mesh)) != 0 || (rc = setup_data(c)) != 0 || (rc = setup_model(c)) != 0)
        return rc;
    if (job_places(&c->j, c->o.out_dir, c->o.ckpt_dir, c->o.ckpt_root, c->ckpt_dir, c->csv_path,
                   c->png_path) != 0)
        return 1;
    print_header(c);
    if (c->o.resume && (rc = resume(c)) != 0)
        return rc;

    int64_t b = c->o.batch, last = c->o.stop_after ? c->o.stop_after : c->o.steps;
    double t_start = job_now(), win_time = 0, eloss = NAN, eacc = NAN, best = -1, t_target = -1;
    int64_t win_steps = 0, win_skipped = 0, best_step = 0, target_step = 0;
    /* The best and the first >= 95% of an earlier part of the run come from its history. */
    for (int64_t i = 0; i < c->hist.n; i++) {
        const hist_rec *r = &c->hist.r[i];
        if (!isnan(r->eval_acc) && r->eval_acc > best) {
            best = r->eval_acc;
            best_step = r->step;
        }
        if (!isnan(r->eval_acc) && r->eval_acc >= TARGET_ACC && !target_step)
            target_step = r->step;
    }
    while (c->step < last) {
        hist_rec rec;
        double t0 = job_now();
        if ((rc = train_step(c, &rec)) != 0)
            goto out;
        double dt = job_now() - t0;
        rec.samples_per_s = dt > 0 ? (double)b / dt : 0;
        c->train_seconds += dt;
        c->trained_samples += b;
        win_time += dt;
        win_steps++;
        win_skipped += rec.skipped;
        if (c->step % c->o.eval_every == 0 || c->step == last) {
            if ((rc = evaluate(c, &eloss, &eacc)) != 0)
                goto out;
            /* An evaluation only for --stop-after is not in the curves, so that a stopped and
             * resumed run records exactly what an uninterrupted one does. */
            if (c->step % c->o.eval_every == 0 || c->step == c->o.steps) {
                rec.eval_loss = eloss;
                rec.eval_acc = eacc;
            }
            if (eacc > best) {
                best = eacc;
                best_step = c->step;
            }
            if (eacc >= TARGET_ACC && !target_step) {
                target_step = c->step;
                t_target = job_now() - t_start;
            }
            job_say(&c->j, "step %5lld/%lld  loss %.4f  held-out loss %.4f acc %6.2f%%  %7.0f samples/s",
                (long long)c->step, (long long)c->o.steps, rec.loss, eloss, 100 * eacc,
                win_time > 0 ? (double)(win_steps * b) / win_time : 0.0);
            if (c->o.precision == PRECISION_F16)
                job_say(&c->j, "  loss scale %g", dt_zero_loss_scale(c->zero));
            if (win_skipped)
                job_say(&c->j, "  (%lld step%s skipped: overflow)", (long long)win_skipped,
                    win_skipped == 1 ? "" : "s");
            job_say(&c->j, "\n");
            win_time = 0;
            win_steps = win_skipped = 0;
        }
        if (history_add(&c->hist, &rec) != 0) {
            job_any_failed(&c->j, 1, "out of memory");
            rc = 1;
            goto out;
        }
        if (c->step == last || (c->o.ckpt_every && c->step % c->o.ckpt_every == 0))
            if ((rc = save_checkpoint(c)) != 0)
                goto out;
    }
    double wall = job_now() - t_start;
    if (isnan(eacc) && (rc = evaluate(c, &eloss, &eacc)) != 0) /* resumed at the end */
        goto out;
    if ((rc = write_outputs(c)) != 0)
        goto out;

    if (c->o.stop_after)
        job_say(&c->j, "stopped after step %lld as asked (--stop-after); continue with --resume %s\n",
            (long long)c->step, c->ckpt_dir);
    job_say(&c->j,
        "done: step %lld (%lld steps in %.1f s in this run), %.0f samples/s in training "
        "steps\n",
        (long long)c->step, (long long)(c->trained_samples / b), wall,
        c->train_seconds > 0 ? (double)c->trained_samples / c->train_seconds : 0.0);
    job_say(&c->j, "  held-out accuracy %.2f%% (%lld of %lld), loss %.4f; best %.2f%% at step %lld\n",
        100 * eacc, (long long)llround(eacc * (double)c->test.n), (long long)c->test.n, eloss,
        100 * best, (long long)best_step);
    if (target_step && t_target >= 0)
        job_say(&c->j, "  reached %.0f%% held-out accuracy at step %lld, %.1f s into the run\n",
            100 * TARGET_ACC, (long long)target_step, t_target);
    else if (target_step)
        job_say(&c->j, "  reached %.0f%% held-out accuracy at step %lld\n", 100 * TARGET_ACC,
            (long long)target_step);
    dt_zero_memory mem;
    if (dt_zero_memory_usage(c->zero, &mem) == DT_OK)
        job_say(&c->j,
            "  optimizer memory on client 0: parameters %.1f KiB, gradients %.1f KiB, "
            "master weights and moments %.1f KiB\n",
            (double)mem.param_bytes / 1024, (double)mem.grad_bytes / 1024,
            (double)mem.state_bytes / 1024);
    job_say(&c->j, "  checkpoint %s (step %lld), curves %s, plot %s\n", c->ckpt_dir, (long long)c->step,
        c->csv_path, c->png_path);
    if (c->j.me == 0) {
        printf("result accuracy=%.4f checkpoint=%s plot=%s\n", eacc, c->ckpt_dir, c->png_path);
        fflush(stdout);
    }
    rc = 0;
out:
    return rc;
}

static void ctx_free(ctx *c)
{
    dt_zero_destroy(c->zero);
    dt_tensor_destroy(c->test_x);
    dt_tensor_destroy(c->test_y);
    mlp_destroy(c->model);
    dt_mesh_destroy(c->mesh);
    dt_dataset_destroy(c->data);
    dt_data_source_destroy(c->source);
    history_free(&c->hist);
    digits_free(&c->all);
    digits_free(&c->train);
    digits_free(&c->test);
}

int main(int argc, char **argv)
{
    ctx c;
    memset(&c, 0, sizeof c);
    job_begin(&c.j, "train_mlp", &argc, &argv);
    char err[512];
    int rc = 0;
    if (options_parse(argc, argv, TRAIN_EXAMPLES_DIR "/meshes/2x2.yaml",
                      TRAIN_EXAMPLES_DIR "/data/digits.csv.gz", &c.o, err, sizeof err) != 0) {
        if (c.j.me == 0)
            fprintf(stderr, "train_mlp: %s\n", err);
        rc = 2;
    } else if (c.o.help) {
        if (c.j.me == 0)
            options_usage(stdout, "train_mlp");
    } else if ((rc = job_start(&c.j, c.o.mesh_file, c.o.mesh_name, c.o.device)) == 0) {
        c.j.quiet = c.o.quiet;
        rc = run(&c);
        job_abort_if_lost(&c.j);
        ctx_free(&c);
    }
    return job_end(&c.j, rc);
}
