/* train_mlp: trains an MLP on the UCI handwritten digits over a device mesh read from YAML:
 * data parallel along `batch`, the hidden layer tensor parallel along `model`, the ZeRO
 * optimizer, f32 or bf16/f16 mixed precision; checkpoints through the DSaver and resumes
 * exactly; writes the curves as CSV and PNG. Runs alone or under mpirun (docs/examples.md).
 * The last line printed is `result accuracy=<held-out accuracy> checkpoint=<dir> plot=<png>`. */
#include <dtensor/dtensor.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "train/digits.h"
#include "train/hand.h"
#include "train/history.h"
#include "train/model.h"
#include "train/options.h"
#include "train/resume.h"

#ifndef TRAIN_EXAMPLES_DIR
#define TRAIN_EXAMPLES_DIR "examples"
#endif

#define TARGET_ACC 0.95

/* Everything a run holds; freed by ctx_free. */
typedef struct ctx {
    train_opts o;
    int me, nprocs;
    char ckpt_dir[4096], csv_path[4096], png_path[4096];
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

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Only client 0 prints (progress to stdout, errors to stderr). */
#define SAY(c, ...)                                                                                \
    do {                                                                                           \
        if ((c)->me == 0 && !(c)->o.quiet) {                                                       \
            printf(__VA_ARGS__);                                                                   \
            fflush(stdout);                                                                        \
        }                                                                                          \
    } while (0)

/* Set when a client was lost (the runtime's watchdog, DT_COMM_TIMEOUT): the clients cannot
 * agree on anything any more and MPI_Finalize would wait for the lost ones, so main aborts. */
static int lost_client;

static int fail_dt(const ctx *c, const char *what, dt_status st, const char *msg)
{
    if (st == DT_ERR_TIMEOUT)
        lost_client = 1;
    if (c->me == 0 || st == DT_ERR_TIMEOUT)  /* rank 0 may be among the lost */
        fprintf(stderr, "train_mlp: %s: %s: %s\n", what, dt_status_name(st),
                msg && *msg ? msg : dt_status_str(st));
    return 1;
}

/* A failure seen by some clients only (a file, memory): all clients learn of it, the lowest
 * failing one prints its message. Returns 1 if any client failed. Collective. */
static int any_failed(const ctx *c, int failed, const char *msg)
{
    int mine = failed ? c->me : INT_MAX, first = INT_MAX;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first != INT_MAX && first == c->me)
        fprintf(stderr, "train_mlp: %s\n", msg);
    return first != INT_MAX;
}

/* mkdir -p. Returns 0, or -1 with errno set. */
static int make_dirs(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return -1;
    struct stat sb;
    if (stat(buf, &sb) != 0)
        return -1;
    if (!S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

static dt_dtype param_dtype(precision p)
{
    return p == PRECISION_BF16 ? DT_DTYPE_BF16 : p == PRECISION_F16 ? DT_DTYPE_F16 : DT_DTYPE_F32;
}

/* ---- setup --------------------------------------------------------------------------------- */

/* The mesh `name` of the YAML file, on the devices --device asks for (the file's own type
 * without it): the same name and dims on `type`. */
static dt_status load_mesh(const train_opts *o, dt_mesh **out)
{
    dt_mesh *m = NULL;
    dt_status st = dt_mesh_from_yaml_file(o->mesh_file, o->mesh_name, &m);
    if (st != DT_OK || o->device < 0 || (int)dt_mesh_device_type(m) == o->device) {
        *out = m;
        return st;
    }
    const char *names[DT_MESH_MAX_DIMS];
    int64_t sizes[DT_MESH_MAX_DIMS];
    for (int d = 0; d < dt_mesh_rank(m); d++) {
        names[d] = dt_mesh_dim_name(m, d);
        sizes[d] = dt_mesh_dim_size(m, d);
    }
    st = dt_mesh_create(dt_mesh_name(m), dt_mesh_rank(m), names, sizes,
                        (dt_device_type)o->device, out);
    dt_mesh_destroy(m);
    return st;
}

/* Reads the mesh before dt_init to size the devices: unless DT_CPU_DEVICES (DT_GPU_DEVICES
 * for a GPU mesh) is set, each process gets mesh size / processes devices, so `train_mlp`
 * alone runs a whole mesh. */
static int start_runtime(ctx *c)
{
    dt_mesh *probe = NULL;
    dt_status st = load_mesh(&c->o, &probe);
    if (st != DT_OK)
        return fail_dt(c, "mesh", st, dt_last_error());
    int64_t size = dt_mesh_size(probe);
    int gpu = dt_mesh_device_type(probe) == DT_DEVICE_GPU;
    dt_mesh_destroy(probe);
    dt_init_opts io = DT_INIT_OPTS_INIT;
    const char *var = gpu ? "DT_GPU_DEVICES" : "DT_CPU_DEVICES";
    const char *env = getenv(var);
    if (!env || !*env) {
        if (size % c->nprocs != 0) {
            if (c->me == 0)
                fprintf(stderr,
                        "train_mlp: mesh: %lld devices do not split evenly over %d processes; "
                        "set %s\n",
                        (long long)size, c->nprocs, var);
            return 1;
        }
        if (gpu)
            io.gpu_devices = (int)(size / c->nprocs);
        else
            io.cpu_devices = (int)(size / c->nprocs);
    }
    if ((st = dt_init(NULL, NULL, &io)) != DT_OK)
        return fail_dt(c, "dt_init", st, dt_last_error());
    return 0;
}

static int setup_mesh(ctx *c)
{
    dt_status st = load_mesh(&c->o, &c->mesh);
    if (st != DT_OK)
        return fail_dt(c, "mesh", st, dt_last_error());
    char msg[512];
    if (dt_mesh_dim_index(c->mesh, "batch") < 0) {
        snprintf(msg, sizeof msg,
                 "%s: mesh '%s' has no dim named 'batch' (train_mlp needs 'batch', "
                 "and optionally 'model')",
                 c->o.mesh_file, dt_mesh_name(c->mesh));
        return fail_dt(c, "mesh", DT_ERR_INVALID_ARGUMENT, msg);
    }
    for (int d = 0; d < dt_mesh_rank(c->mesh); d++) {
        const char *n = dt_mesh_dim_name(c->mesh, d);
        if (strcmp(n, "batch") != 0 && strcmp(n, "model") != 0) {
            snprintf(msg, sizeof msg,
                     "%s: mesh '%s' has a dim '%s'; train_mlp uses 'batch' and "
                     "'model' only",
                     c->o.mesh_file, dt_mesh_name(c->mesh), n);
            return fail_dt(c, "mesh", DT_ERR_INVALID_ARGUMENT, msg);
        }
    }
    int have = dt_num_global_devices(dt_mesh_device_type(c->mesh));
    if (have != dt_mesh_size(c->mesh)) {
        snprintf(msg, sizeof msg,
                 "mesh '%s' has %lld devices but this job has %d (%d process%s x %d local "
                 "devices): run %lld devices in all, e.g. %s=%lld with one process",
                 dt_mesh_name(c->mesh), (long long)dt_mesh_size(c->mesh), have, c->nprocs,
                 c->nprocs == 1 ? "" : "es", dt_num_local_devices(dt_mesh_device_type(c->mesh)),
                 (long long)dt_mesh_size(c->mesh),
                 dt_mesh_device_type(c->mesh) == DT_DEVICE_GPU ? "DT_GPU_DEVICES"
                                                                : "DT_CPU_DEVICES",
                 (long long)dt_mesh_size(c->mesh));
        return fail_dt(c, "mesh", DT_ERR_DEVICE_MISMATCH, msg);
    }
    if ((st = dt_mesh_check_devices(c->mesh)) != DT_OK)
        return fail_dt(c, "mesh", st, dt_last_error());
    return 0;
}

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
    if (any_failed(c, bad, err))
        return 1;
    int64_t shards = dt_mesh_dim_size(c->mesh, dt_mesh_dim_index(c->mesh, "batch"));
    if (c->o.batch > c->train.n || c->o.batch < shards) {
        if (c->me == 0)
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
        if (c->me == 0)
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
        return fail_dt(c, "dataset", st, dt_last_error());
    return 0;
}

static int setup_model(ctx *c)
{
    dt_status st = mlp_create(c->mesh, DIGITS_FEATURES, c->o.hidden, DIGITS_CLASSES,
                              param_dtype(c->o.precision), c->o.seed, &c->model);
    if (st != DT_OK)
        return fail_dt(c, "model", st, mlp_last_error());
    if ((st = mlp_inputs(c->model, c->test.n, c->test.x, c->test.y, &c->test_x, &c->test_y)) !=
        DT_OK)
        return fail_dt(c, "held-out data", st, mlp_last_error());

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
        return fail_dt(c, "dt_zero_create", st, dt_last_error());
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
    if ((st = dt_zero_add_group(c->zero, MLP_NPARAMS, mlp_param_names(), mlp_params(c->model), &hp,
                                NULL)) != DT_OK)
        return fail_dt(c, "dt_zero_add_group", st, dt_last_error());
    return 0;
}

/* ---- checkpoints --------------------------------------------------------------------------- */

static int save_checkpoint(ctx *c)
{
    size_t hb = history_bytes(&c->hist);
    uint8_t *hbuf = malloc(hb ? hb : 1);
    if (any_failed(c, !hbuf, "out of memory"))
        return 1;
    history_serialize(&c->hist, hbuf);
    dt_ckpt_value v[6 + DT_DATASET_STATE_VALUES] = {
        {"train/step", DT_CKPT_VALUE_I64, c->step, 0, NULL, 0},
        {"train/history", DT_CKPT_VALUE_BYTES, 0, 0, hbuf, hb},
        {"train/batch", DT_CKPT_VALUE_I64, c->o.batch, 0, NULL, 0},
        {"train/hidden", DT_CKPT_VALUE_I64, c->o.hidden, 0, NULL, 0},
        {"train/precision", DT_CKPT_VALUE_BYTES, 0, 0, precision_name(c->o.precision),
         strlen(precision_name(c->o.precision))},
        {"train/seed", DT_CKPT_VALUE_I64, (int64_t)c->o.seed, 0, NULL, 0},
    };
    /* The data position: the next batch a resumed run reads. */
    dt_status st = dt_dataset_state_values(c->data, "train/data/", v + 6);
    if (st != DT_OK) {
        free(hbuf);
        return fail_dt(c, "dataset state", st, dt_last_error());
    }
    dt_save_opts so = DT_SAVE_OPTS_INIT;
    so.values = v;
    so.nvalues = (int)(sizeof v / sizeof v[0]);
    st = save_train_state(c->zero, c->o.ckpt_root, c->o.keep_last, c->step, c->ckpt_dir,
                          sizeof c->ckpt_dir, &so);
    free(hbuf);
    if (st != DT_OK)
        return fail_dt(c, "dt_zero_save", st, dt_last_error());
    return 0;
}

/* Reads the training state values of a checkpoint into c (local). Returns 0, or -1 with a
 * message in err. */
static int read_train_state(ctx *c, const char *dir, char *err, size_t errlen)
{
    dt_ckpt *ck = NULL;
    dt_status st = dt_ckpt_open(dir, &ck);
    if (st != DT_OK) {
        snprintf(err, errlen, "--resume: %s", dt_last_error());
        return -1;
    }
    int64_t step = 0, batch = 0, hidden = 0;
    const void *hd = NULL, *pd = NULL;
    size_t hn = 0, pn = 0;
    int rc = -1;
    if ((st = dt_ckpt_value_i64(ck, "train/step", &step)) != DT_OK ||
        (st = dt_ckpt_value_i64(ck, "train/batch", &batch)) != DT_OK ||
        (st = dt_ckpt_value_i64(ck, "train/hidden", &hidden)) != DT_OK ||
        (st = dt_ckpt_value_bytes(ck, "train/precision", &pd, &pn)) != DT_OK ||
        (st = dt_ckpt_value_bytes(ck, "train/history", &hd, &hn)) != DT_OK) {
        snprintf(err, errlen, "--resume %s: not a train_mlp checkpoint: %s", dir, dt_last_error());
        goto out;
    }
    const char *prec = precision_name(c->o.precision);
    if (batch != c->o.batch || hidden != c->o.hidden || pn != strlen(prec) ||
        memcmp(pd, prec, pn) != 0) {
        snprintf(err, errlen,
                 "--resume %s: saved with --batch %lld --hidden %lld --precision "
                 "%.*s; this run has --batch %lld --hidden %lld --precision %s",
                 dir, (long long)batch, (long long)hidden, (int)(pn < 16 ? pn : 16),
                 (const char *)pd, (long long)c->o.batch, (long long)c->o.hidden, prec);
        goto out;
    }
    if (step < 0 || step > c->o.steps || (c->o.stop_after && c->o.stop_after <= step)) {
        snprintf(err, errlen,
                 "--resume %s: the checkpoint is at step %lld; --steps %lld%s must "
                 "be beyond it",
                 dir, (long long)step, (long long)c->o.steps,
                 c->o.stop_after ? " and --stop-after" : "");
        goto out;
    }
    if ((st = dt_dataset_load_state(c->data, ck, "train/data/")) != DT_OK) {
        snprintf(err, errlen, "--resume %s: %s", dir, dt_last_error());
        goto out;
    }
    if (history_deserialize(&c->hist, hd, hn) != 0) {
        snprintf(err, errlen, "--resume %s: bad train/history value", dir);
        goto out;
    }
    history_truncate(&c->hist, step);
    c->step = step;
    rc = 0;
out:
    dt_ckpt_close(ck);
    return rc;
}

static int resume(ctx *c)
{
    char err[4400] = "", dir[4096];
    int bad = resume_dir(c->o.resume, c->o.ckpt_root, dir, sizeof dir, err, sizeof err) != 0 ||
              read_train_state(c, dir, err, sizeof err) != 0;
    if (any_failed(c, bad, err))
        return 1;
    dt_status st = dt_zero_load(c->zero, dir);
    if (st != DT_OK)
        return fail_dt(c, "dt_zero_load", st, dt_last_error());
    SAY(c, "resumed from %s at step %lld\n", dir, (long long)c->step);
    return 0;
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
        fail_dt(c, "batch", st, dt_last_error());
        goto out;
    }
    /* Each gradient goes to the optimizer as the backward pass makes it (hand_grad), whose
     * reduction then runs in the background while the earlier layers' gradients are made. */
    grad_hand hand = {c->zero, param_dtype(c->o.precision)};
    if ((st = mlp_grads_each(c->model, xy[0], xy[1], (float)scale, &loss, hand_grad, &hand,
                             g)) != DT_OK) {
        fail_dt(c, "forward/backward", st, mlp_last_error());
        goto out;
    }
    if ((st = dt_zero_step(c->zero, NULL, &info)) != DT_OK) {
        fail_dt(c, "dt_zero_step", st, dt_last_error());
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
        return fail_dt(c, "evaluation", st, mlp_last_error());
    return 0;
}

static int write_outputs(ctx *c)
{
    char err[1024] = "", sub[160];
    int bad = 0;
    if (c->me == 0) {
        snprintf(sub, sizeof sub, "(%s, %s, zero %d, %s, hidden %lld, batch %lld)",
                 dt_mesh_name(c->mesh)[0] ? dt_mesh_name(c->mesh) : "mesh",
                 optimizer_name(c->o.optimizer), c->o.stage, precision_name(c->o.precision),
                 (long long)c->o.hidden, (long long)c->o.batch);
        bad = history_write_csv(&c->hist, c->csv_path, err, sizeof err) != 0 ||
              history_write_plot(&c->hist, c->o.steps, TARGET_ACC, sub, c->png_path, err,
                                 sizeof err) != 0;
    }
    return any_failed(c, bad, err);
}

static void print_header(ctx *c)
{
    dt_device_type t = dt_mesh_device_type(c->mesh);
    char dims[256] = "";
    for (int d = 0; d < dt_mesh_rank(c->mesh); d++)
        snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%s=%lld", d ? " x " : "",
                 dt_mesh_dim_name(c->mesh, d), (long long)dt_mesh_dim_size(c->mesh, d));
    SAY(c, "train_mlp: mesh '%s' %s: %lld %s devices (%d process%s x %d)\n", dt_mesh_name(c->mesh),
        dims, (long long)dt_mesh_size(c->mesh), dt_device_type_name(t), c->nprocs,
        c->nprocs == 1 ? "" : "es", dt_num_local_devices(t));
    SAY(c, "  data: %lld training / %lld held-out digits (%s), global batch %lld\n",
        (long long)c->train.n, (long long)c->test.n, c->o.data_file, (long long)c->o.batch);
    SAY(c, "  model: 64-%lld-10 MLP, %s parameters; ZeRO stage %d, %s lr %g%s\n",
        (long long)c->o.hidden, precision_name(c->o.precision), c->o.stage,
        optimizer_name(c->o.optimizer), c->o.lr,
        c->o.precision == PRECISION_F16 ? ", dynamic loss scaling" : "");
}

static int run(ctx *c)
{
    int rc;
    if ((rc = setup_mesh(c)) != 0 || (rc = setup_data(c)) != 0 || (rc = setup_model(c)) != 0)
        return rc;
    if (c->o.ckpt_root)
        snprintf(c->ckpt_dir, sizeof c->ckpt_dir, "%s/", c->o.ckpt_root); /* make_dirs(root) */
    else if (c->o.ckpt_dir)
        snprintf(c->ckpt_dir, sizeof c->ckpt_dir, "%s", c->o.ckpt_dir);
    else
        snprintf(c->ckpt_dir, sizeof c->ckpt_dir, "%s/checkpoint", c->o.out_dir);
    snprintf(c->csv_path, sizeof c->csv_path, "%s/curves.csv", c->o.out_dir);
    snprintf(c->png_path, sizeof c->png_path, "%s/curves.png", c->o.out_dir);
    char err[4200] = "";
    int bad = make_dirs(c->o.out_dir) != 0;
    if (bad)
        snprintf(err, sizeof err, "--out %s: %s", c->o.out_dir, strerror(errno));
    if (any_failed(c, bad, err))
        return 1;
    /* The checkpoint's parent must exist for the save's temporary directory beside it. */
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", c->ckpt_dir);
    char *slash = strrchr(parent, '/');
    bad = 0;
    if (slash && slash != parent) {
        *slash = '\0';
        bad = make_dirs(parent) != 0;
    }
    struct stat sb;
    if (!bad && stat(c->ckpt_dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        bad = 1;
    }
    if (bad)
        snprintf(err, sizeof err, "--ckpt-dir %s: %s", c->ckpt_dir, strerror(errno));
    if (any_failed(c, bad, err))
        return 1;

    print_header(c);
    if (c->o.resume && (rc = resume(c)) != 0)
        return rc;

    int64_t b = c->o.batch, last = c->o.stop_after ? c->o.stop_after : c->o.steps;
    double t_start = now(), win_time = 0, eloss = NAN, eacc = NAN, best = -1, t_target = -1;
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
        double t0 = now();
        if ((rc = train_step(c, &rec)) != 0)
            goto out;
        double dt = now() - t0;
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
                t_target = now() - t_start;
            }
            SAY(c, "step %5lld/%lld  loss %.4f  held-out loss %.4f acc %6.2f%%  %7.0f samples/s",
                (long long)c->step, (long long)c->o.steps, rec.loss, eloss, 100 * eacc,
                win_time > 0 ? (double)(win_steps * b) / win_time : 0.0);
            if (c->o.precision == PRECISION_F16)
                SAY(c, "  loss scale %g", dt_zero_loss_scale(c->zero));
            if (win_skipped)
                SAY(c, "  (%lld step%s skipped: overflow)", (long long)win_skipped,
                    win_skipped == 1 ? "" : "s");
            SAY(c, "\n");
            win_time = 0;
            win_steps = win_skipped = 0;
        }
        if (history_add(&c->hist, &rec) != 0) {
            any_failed(c, 1, "out of memory");
            rc = 1;
            goto out;
        }
        if (c->step == last || (c->o.ckpt_every && c->step % c->o.ckpt_every == 0))
            if ((rc = save_checkpoint(c)) != 0)
                goto out;
    }
    double wall = now() - t_start;
    if (isnan(eacc) && (rc = evaluate(c, &eloss, &eacc)) != 0) /* resumed at the end */
        goto out;
    if ((rc = write_outputs(c)) != 0)
        goto out;

    if (c->o.stop_after)
        SAY(c, "stopped after step %lld as asked (--stop-after); continue with --resume %s\n",
            (long long)c->step, c->ckpt_dir);
    SAY(c,
        "done: step %lld (%lld steps in %.1f s in this run), %.0f samples/s in training "
        "steps\n",
        (long long)c->step, (long long)(c->trained_samples / b), wall,
        c->train_seconds > 0 ? (double)c->trained_samples / c->train_seconds : 0.0);
    SAY(c, "  held-out accuracy %.2f%% (%lld of %lld), loss %.4f; best %.2f%% at step %lld\n",
        100 * eacc, (long long)llround(eacc * (double)c->test.n), (long long)c->test.n, eloss,
        100 * best, (long long)best_step);
    if (target_step && t_target >= 0)
        SAY(c, "  reached %.0f%% held-out accuracy at step %lld, %.1f s into the run\n",
            100 * TARGET_ACC, (long long)target_step, t_target);
    else if (target_step)
        SAY(c, "  reached %.0f%% held-out accuracy at step %lld\n", 100 * TARGET_ACC,
            (long long)target_step);
    dt_zero_memory mem;
    if (dt_zero_memory_usage(c->zero, &mem) == DT_OK)
        SAY(c,
            "  optimizer memory on client 0: parameters %.1f KiB, gradients %.1f KiB, "
            "master weights and moments %.1f KiB\n",
            (double)mem.param_bytes / 1024, (double)mem.grad_bytes / 1024,
            (double)mem.state_bytes / 1024);
    SAY(c, "  checkpoint %s (step %lld), curves %s, plot %s\n", c->ckpt_dir, (long long)c->step,
        c->csv_path, c->png_path);
    if (c->me == 0) {
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
    MPI_Init(&argc, &argv);
    ctx c;
    memset(&c, 0, sizeof c);
    MPI_Comm_rank(MPI_COMM_WORLD, &c.me);
    MPI_Comm_size(MPI_COMM_WORLD, &c.nprocs);
    char err[512];
    int rc = 0;
    if (options_parse(argc, argv, TRAIN_EXAMPLES_DIR "/meshes/2x2.yaml",
                      TRAIN_EXAMPLES_DIR "/data/digits.csv.gz", &c.o, err, sizeof err) != 0) {
        if (c.me == 0)
            fprintf(stderr, "train_mlp: %s\n", err);
        rc = 2;
    } else if (c.o.help) {
        if (c.me == 0)
            options_usage(stdout, "train_mlp");
    } else if ((rc = start_runtime(&c)) == 0) {
        rc = run(&c);
        if (lost_client)
            MPI_Abort(MPI_COMM_WORLD, 3);
        ctx_free(&c);
        dt_finalize();
    }
    MPI_Finalize();
    return rc;
}
