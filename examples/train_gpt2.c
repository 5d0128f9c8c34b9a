/* train_gpt2: GPT-2 (examples/gpt2, forward on the tape) trained with ZeRO AdamW on llm.c
 * token shards, from an HF safetensors file, an llm.c checkpoint or a random init:
 *   train_gpt2 --init FILE|random --data TRAIN.bin [--val VAL.bin] --batch B --context T
 *     --steps N --lr LR [--weight-decay W] [--beta1 B1] [--beta2 B2] [--eps E] [--clip C]
 *     [--warmup N] [--min-lr LR] [--mesh FILE] [--precision f32|bf16] [--out DIR]
 *     [--zero 0-3] [--heads H] [--resume DIR]
 *     [--layers L --width C --heads H --vocab V --seed S]   (with --init random)
 *     [--grads-out DIR]   (step 0's gradients, one raw f32 file per parameter)
 *     [--show-layouts 1]  (each parameter's layout and local shape, the init's bytes read)
 *     [--params-out DIR]  (the final parameters, one raw f32 file each)
 *     [--model DIR]       an HF GPT-2 directory (config.json, safetensors, tokenizer): --init
 *     [--text FILE|DIR [--lines]]   raw text tokenised on the fly by DIR's tokenizer: --data
 *     [--sample-every N [--sample-tokens K]]   (with --model) `sample N: TEXT` every N steps
 * --resume DIR goes on from an earlier run's --out DIR (or its DIR/checkpoint): the
 * parameters, the optimizer state, the data position and the loss history, to --steps.
 * Prints `step N loss L tokens_per_s X` per step (with ` lr R` under a schedule), then
 * `result loss=L val_loss=V tokens_per_s=X params=P`. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <dtensor/dtensor.h>

#include "gpt2/model.h"
#include "llama/lm.h"
#include "llama/text_data.h"
#include "train/job.h"

typedef struct opts {
    const char *init, *data, *val, *mesh, *out, *grads_out, *params_out, *resume;
    const char *model, *text; /* --model DIR (an HF GPT-2 directory), --text FILE */
    int lines;
    int64_t batch, context, steps, layers, width, heads, vocab, warmup;
    uint64_t seed;
    double lr, wd, beta1, beta2, eps, clip, min_lr;
    int bf16, stage, show_layouts;
    int64_t sample_every, sample_tokens; /* --sample-every N (with --model): text samples */
} opts;

static void usage(FILE *f)
{
    fputs("usage: train_gpt2 --init FILE|random --data TRAIN.bin --batch B --context T "
          "--steps N --lr LR [options]\n"
          "  --init FILE|random   HF safetensors or llm.c checkpoint, or a random init\n"
          "  --data FILE          llm.c token shard to train on; --val FILE to evaluate on\n"
          "  --model DIR          an HF GPT-2 directory (as --init; its tokenizer for --text)\n"
          "  --text FILE|DIR      raw text to train on, tokenised on the fly (--lines: a\n"
          "                       document a line; every document after <|endoftext|>)\n"
          "  --sample-every N --sample-tokens K   (--model) a greedy sample as text every N\n"
          "                       steps, K tokens (default 32)\n"
          "  --batch B --context T   sequences per step and tokens per sequence (T at most\n"
          "                       the init's position table, n_ctx)\n"
          "  --steps N --lr LR    steps to run (to N with --resume) and the learning rate\n"
          "  --weight-decay W --beta1 B1 --beta2 B2 --eps E --clip C   AdamW, clipping\n"
          "  --warmup N --min-lr LR   linear warmup, then cosine decay to LR\n"
          "  --mesh FILE          mesh YAML (default meshes/1x1.yaml)\n"
          "  --precision f32|bf16 --zero 0-3   parameter precision, ZeRO stage\n"
          "  --out DIR --resume DIR   checkpoint and losses; go on from an earlier --out\n"
          "  --layers L --width C --heads H --vocab V --seed S   the model (--init random)\n"
          "  --grads-out DIR --params-out DIR   step 0's gradients, the final parameters\n"
          "  --show-layouts 1     each parameter's layout and local shape\n"
          "  --help, -h           this text\n",
          f);
}

/* 0: run; 1: a bad command line (said on stderr); 2: --help. */
static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){.init = NULL, .mesh = TRAIN_EXAMPLES_DIR "/meshes/1x1.yaml", .batch = 0,
                .context = 0, .steps = 0, .layers = 2, .width = 64, .heads = 0, .vocab = 128,
                .seed = 1, .lr = -1, .wd = 0.0, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                .clip = 1.0, .stage = 1, .warmup = 0, .min_lr = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 2;
        if (!strcmp(a, "--lines")) {
            o->lines = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "train_gpt2: %s needs a value\n", a);
            return 1;
        }
        i++;
        if (!strcmp(a, "--init")) o->init = v;
        else if (!strcmp(a, "--model")) o->init = o->model = v;
        else if (!strcmp(a, "--text")) o->text = v;
        else if (!strcmp(a, "--sample-every")) o->sample_every = atoll(v);
        else if (!strcmp(a, "--sample-tokens")) o->sample_tokens = atoll(v);
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--val")) o->val = v;
        else if (!strcmp(a, "--mesh")) o->mesh = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--grads-out")) o->grads_out = v;
        else if (!strcmp(a, "--params-out")) o->params_out = v;
        else if (!strcmp(a, "--resume")) o->resume = v;
        else if (!strcmp(a, "--batch")) o->batch = atoll(v);
        else if (!strcmp(a, "--context")) o->context = atoll(v);
        else if (!strcmp(a, "--steps")) o->steps = atoll(v);
        else if (!strcmp(a, "--layers")) o->layers = atoll(v);
        else if (!strcmp(a, "--width")) o->width = atoll(v);
        else if (!strcmp(a, "--heads")) o->heads = atoll(v);
        else if (!strcmp(a, "--vocab")) o->vocab = atoll(v);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--lr")) o->lr = atof(v);
        else if (!strcmp(a, "--warmup")) o->warmup = atoll(v);
        else if (!strcmp(a, "--min-lr")) o->min_lr = atof(v);
        else if (!strcmp(a, "--weight-decay")) o->wd = atof(v);
        else if (!strcmp(a, "--beta1")) o->beta1 = atof(v);
        else if (!strcmp(a, "--beta2")) o->beta2 = atof(v);
        else if (!strcmp(a, "--eps")) o->eps = atof(v);
        else if (!strcmp(a, "--clip")) o->clip = atof(v);
        else if (!strcmp(a, "--zero")) o->stage = atoi(v);
        else if (!strcmp(a, "--show-layouts")) o->show_layouts = atoi(v);
        else if (!strcmp(a, "--precision")) {
            if (strcmp(v, "f32") && strcmp(v, "bf16")) {
                fprintf(stderr, "train_gpt2: --precision %s (f32 or bf16)\n", v);
                return 1;
            }
            o->bf16 = !strcmp(v, "bf16");
        } else {
            fprintf(stderr, "train_gpt2: unknown option %s\n", a);
            return 1;
        }
    }
    if (o->sample_every > 0 && !o->model) {
        fprintf(stderr, "train_gpt2: --sample-every needs --model DIR (its tokenizer)\n");
        return 1;
    }
    if (o->text && !o->model) {
        fprintf(stderr, "train_gpt2: --text needs --model DIR (its tokenizer)\n");
        return 1;
    }
    if (o->text && !o->data)
        o->data = o->text;
    if (!o->init || !o->data || o->batch < 1 || o->context < 1 || o->steps < 1 || o->lr < 0) {
        usage(stderr);
        return 1;
    }
    if (o->warmup < 0) {
        fprintf(stderr, "train_gpt2: --warmup %lld must not be negative\n", (long long)o->warmup);
        return 1;
    }
    if (o->min_lr < 0 && o->min_lr != -1) { /* -1: not given */
        fprintf(stderr, "train_gpt2: --min-lr %g must not be negative\n", o->min_lr);
        return 1;
    }
    if (o->stage < 0 || o->stage > 3) {
        fprintf(stderr, "train_gpt2: --zero %d (0, 1, 2 or 3)\n", o->stage);
        return 1;
    }
    return 0;
}

/* The learning rate of step `step` (0-based): llm.c's schedule (llmc/schedulers.h) with an
 * absolute floor: linear warmup lr (step + 1) / N over the first N = --warmup steps, then
 * cosine decay min + (lr - min) (1 + cos(pi (step - N) / (steps - N))) / 2, which reaches
 * min at step `steps` (one after the last). --min-lr defaults to lr (warmup only, as llm.c's
 * default final fraction 1); with neither option the rate is constant. */
static double lr_at(const opts *o, int64_t step)
{
    double min = o->min_lr >= 0 ? o->min_lr : o->lr;
    if (step < o->warmup)
        return o->lr * (double)(step + 1) / (double)o->warmup;
    if (o->steps <= o->warmup)
        return o->lr;
    double ratio = (double)(step - o->warmup) / (double)(o->steps - o->warmup);
    return min + 0.5 * (1.0 + cos(acos(-1.0) * ratio)) * (o->lr - min);
}

/* The model, from the init file or random. */
static dt_status make_model(const job *j, const opts *o, const dt_mesh *mesh, gpt2 **out)
{
    dt_dtype dt = o->bf16 ? DT_DTYPE_BF16 : DT_DTYPE_F32;
    gpt2_config cfg = {o->layers, o->width, o->heads, o->vocab, o->context};
    if (!strcmp(o->init, "random")) {
        if (cfg.heads < 1)
            cfg.heads = 4;
        dt_status st = gpt2_create(mesh, &cfg, dt, out);
        if (st == DT_OK && (st = gpt2_init_random(*out, o->seed)) != DT_OK)
            gpt2_destroy(*out);
        return st;
    }
    dt_foreign *src = NULL;
    dt_foreign_map_entry *map = NULL;
    int n = 0;
    dt_foreign_gpt2_config fc;
    dt_status st = dt_foreign_open(o->init, &src);
    if (st == DT_OK)
        st = dt_foreign_gpt2_map(src, 0, &map, &n, &fc);
    if (st == DT_OK) {
        cfg = (gpt2_config){fc.n_layer, fc.n_embd, o->heads ? o->heads : fc.n_head, fc.vocab,
                            fc.n_ctx};
        const char *hs = dt_foreign_metadata(src, "n_head");
        if (!o->heads && hs)
            cfg.heads = atoll(hs);
    }
    if (st == DT_OK)
        st = gpt2_create(mesh, &cfg, dt, out);
    if (st == DT_OK) {
        dt_foreign_view *views = calloc((size_t)n, sizeof *views);
        if (!views || n != gpt2_num_params(*out))
            st = DT_ERR_SHAPE;
        for (int i = 0; st == DT_OK && i < n; i++)
            views[i] = map[i].view;
        if (st == DT_OK)
            st = dt_foreign_restore(src, n, views, gpt2_params(*out));
        free(views);
        /* Each device reads its own boxes only: the tests compare with the local shapes. */
        for (int k = 0; st == DT_OK && o->show_layouts && k < dt_mesh_num_local_devices(mesh);
             k++) {
            int dev = dt_mesh_local_device_id(mesh, k);
            job_say(j, "read device %d bytes %llu\n", dev,
                    (unsigned long long)dt_foreign_bytes_read(src, dev));
        }
        if (st != DT_OK)
            gpt2_destroy(*out);
    }
    dt_foreign_map_free(map, n);
    dt_foreign_close(src);
    return st;
}

/* --show-layouts 1: a line per parameter, `layout NAME SPECS global RxC local RxC` (specs
 * the mesh dim sharding each tensor dim, `-` for none; local: this client's first device), so
 * that the tests see what is sharded. */
static void show_layouts(const job *j, const gpt2 *m)
{
    for (int i = 0; i < gpt2_num_params(m); i++) {
        const dt_tensor *t = gpt2_params(m)[i];
        char spec[128] = "", g[64], l[64];
        for (int d = 0; d < dt_tensor_rank(t); d++) {
            const char *sd = dt_layout_spec(dt_tensor_layout(t), d);
            snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%s%s", d ? "," : "",
                     strcmp(sd, DT_UNSHARDED) ? sd : "-");
        }
        const int64_t *gs = dt_tensor_shape(t), *ls = dt_tensor_local(t, 0)->shape;
        if (dt_tensor_rank(t) == 2) {
            snprintf(g, sizeof g, "%lldx%lld", (long long)gs[0], (long long)gs[1]);
            snprintf(l, sizeof l, "%lldx%lld", (long long)ls[0], (long long)ls[1]);
        } else {
            snprintf(g, sizeof g, "%lld", (long long)gs[0]);
            snprintf(l, sizeof l, "%lld", (long long)ls[0]);
        }
        job_say(j, "layout %s %s global %s local %s\n", gpt2_param_names(m)[i], spec, g, l);
    }
}

/* Tensors t[i] (the parameters' shapes, any layout and dtype), one raw f32 file of the global
 * tensor per parameter in dir, named as the parameter (client 0 writes). Collective. */
static dt_status write_tensors(const gpt2 *m, const dt_mesh *mesh, const dt_tensor *const *t,
                               const char *dir)
{
    mkdir(dir, 0755);
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < gpt2_num_params(m); i++) {
        dt_layout *rep = NULL;
        dt_tensor *all = NULL, *f = NULL;
        st = t[i] ? dt_layout_replicated(mesh, dt_tensor_rank(t[i]), &rep) : DT_ERR_STATE;
        if (st == DT_OK)
            st = dt_relayout(t[i], rep, &all);
        if (st == DT_OK && dt_tensor_dtype(all) != DT_DTYPE_F32)
            st = dt_cast(all, DT_DTYPE_F32, &f);
        const dt_tensor *w = f ? f : all;
        if (st == DT_OK && dt_client_id() == 0) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s.f32", dir, gpt2_param_names(m)[i]);
            size_t bytes = (size_t)dt_tensor_numel(w) * sizeof(float);
            float *buf = malloc(bytes);
            FILE *fp = fopen(path, "wb");
            if (!buf || !fp || dt_tensor_local_read(w, 0, buf, bytes) != DT_OK ||
                fwrite(buf, 1, bytes, fp) != bytes)
                st = DT_ERR_IO;
            if (fp)
                fclose(fp);
            free(buf);
        }
        dt_tensor_destroy(f);
        dt_tensor_destroy(all);
        dt_layout_destroy(rep);
    }
    return st;
}

/* --params-out: the parameters (whole: stage 3 gathers them for the while). Collective. */
static dt_status write_params(gpt2 *m, const dt_mesh *mesh, const char *dir)
{
    int n = gpt2_num_params(m);
    const dt_tensor **t = malloc((size_t)n * sizeof *t);
    if (!t)
        return DT_ERR_NO_MEMORY;
    dt_status st = gpt2_gather_all(m);
    for (int i = 0; i < n; i++)
        t[i] = gpt2_param(m, i);
    if (st == DT_OK)
        st = write_tensors(m, mesh, t, dir);
    dt_status r = gpt2_release_all(m);
    free(t);
    return st != DT_OK ? st : r;
}

/* --text: the model directory's tokenizer (tokenizer.json, else vocab.json and merges.txt). */
/* --sample-every: the model's current weights copied into `gen` (examples/llama, loaded
 * from --model), a greedy continuation of <|endoftext|> printed by client 0 as
 * "sample STEP: TEXT", as llm.c's trainer does. Collective. */
static dt_status sample(const job *j, const opts *o, gpt2 *m, lm *gen, int64_t step)
{
    char a[JOB_PATH_MAX], b[JOB_PATH_MAX];
    struct stat sb;
    dt_tokenizer *tok = NULL;
    snprintf(a, sizeof a, "%s/tokenizer.json", o->model);
    snprintf(b, sizeof b, "%s/merges.txt", o->model);
    dt_status st = stat(a, &sb) == 0 ? dt_tokenizer_from_json(a, &tok)
                   : (snprintf(a, sizeof a, "%s/vocab.json", o->model),
                      dt_tokenizer_from_files(a, b, &tok));
    if (st == DT_OK)
        st = gpt2_gather_all(m);
    const char *const *gn = gpt2_param_names(m), *const *ln = lm_param_names(gen);
    for (int i = 0; st == DT_OK && i < lm_num_params(gen); i++)
        for (int k = 0; k < gpt2_num_params(m); k++)
            if (!strcmp(ln[i], gn[k])) {
                st = lm_set_param(gen, i, gpt2_param(m, k));
                break;
            }
    dt_status r = gpt2_release_all(m);
    st = st != DT_OK ? st : r;
    char *text = NULL;
    size_t len = 0;
    if (st == DT_OK)
        st = lm_sample_text(gen, tok, text_data_eot(tok), NULL,
                            o->sample_tokens > 0 ? o->sample_tokens : 32, 0.0, 0, 1, &text,
                            &len);
    if (st == DT_OK && j->me == 0) {
        printf("sample %lld: %.*s\n", (long long)step, (int)len, text);
        fflush(stdout);
    }
    free(text);
    dt_tokenizer_destroy(tok);
    return st;
}

static text_data *text_tokens; /* --text's tokens: as long as the run's dataset (run frees) */

static dt_status text_source(const opts *o, dt_data_source **src)
{
    text_data **td = &text_tokens;
    char a[JOB_PATH_MAX], b[JOB_PATH_MAX];
    struct stat sb;
    dt_tokenizer *tok = NULL;
    snprintf(a, sizeof a, "%s/tokenizer.json", o->model);
    snprintf(b, sizeof b, "%s/merges.txt", o->model);
    dt_status st = stat(a, &sb) == 0 ? dt_tokenizer_from_json(a, &tok)
                   : (snprintf(a, sizeof a, "%s/vocab.json", o->model),
                      dt_tokenizer_from_files(a, b, &tok));
    int32_t eot = st == DT_OK ? text_data_eot(tok) : -1;
    if (st == DT_OK && eot < 0)
        st = DT_ERR_NOT_FOUND;
    if (st == DT_OK)
        st = text_data_load(tok, o->text, o->lines, eot, o->context, td);
    dt_tokenizer_destroy(tok);
    return st == DT_OK ? text_data_source(*td, src) : st;
}

static dt_status make_dataset(const char *path, const opts *o, const dt_mesh *mesh,
                              dt_dataset **out)
{
    dt_data_source *src = NULL;
    dt_layout *l = NULL;
    dt_status st = o->text && path == o->data ? text_source(o, &src)
                                              : dt_data_source_llmc(path, o->context, &src);
    if (st == DT_OK)
        st = dt_layout_create(mesh, 2, (const char *[]){"batch", DT_UNSHARDED}, &l);
    dt_dataset_opts d = DT_DATASET_OPTS_INIT;
    d.global_batch = o->batch;
    d.shuffle = 0;
    d.drop_remainder = 1;
    if (st == DT_OK)
        st = dt_dataset_create(src, 2, (const dt_layout *const[]){l, l}, &d, out);
    dt_layout_destroy(l);
    dt_data_source_destroy(src);
    return st;
}

/* The run's model and precision as the checkpoint's train/config value. */
typedef struct run_config {
    char text[200];
} run_config;

static run_config config_of(const opts *o, const gpt2 *m)
{
    run_config rc;
    const gpt2_config *c = gpt2_cfg(m);
    snprintf(rc.text, sizeof rc.text,
             "layers=%lld width=%lld heads=%lld vocab=%lld context=%lld precision=%s",
             (long long)c->layers, (long long)c->width, (long long)c->heads,
             (long long)c->vocab, (long long)c->context, o->bf16 ? "bf16" : "f32");
    return rc;
}

/* --resume: the checkpoint holds this model in this precision (job_check_fn). */
static int check_config(void *arg, const dt_ckpt *ck, const char *dir, char *err, size_t errlen)
{
    const run_config *rc = arg;
    const void *cd = NULL;
    size_t cn = 0;
    if (dt_ckpt_value_bytes(ck, "train/config", &cd, &cn) != DT_OK) {
        snprintf(err, errlen, "--resume %s: not a train_gpt2 checkpoint: %s", dir,
                 dt_last_error());
        return -1;
    }
    if (cn != strlen(rc->text) || memcmp(cd, rc->text, cn) != 0) {
        snprintf(err, errlen, "--resume %s: saved with %.*s; this run has %s", dir,
                 (int)(cn < 190 ? cn : 190), (const char *)cd, rc->text);
        return -1;
    }
    return 0;
}

/* --resume DIR: DIR/checkpoint when DIR is an --out directory, else DIR. Collective. */
static int resume(job *j, const opts *o, const gpt2 *m, const job_train *t)
{
    char dir[JOB_PATH_MAX];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s/checkpoint", o->resume);
    run_config rc = config_of(o, m);
    return job_resume(j, t, stat(dir, &sb) == 0 ? dir : o->resume, NULL, o->steps, 0, 0,
                      check_config, &rc);
}

/* --out DIR: the final state as DIR/checkpoint (the optimizer's parameters under our names,
 * its state, the data position, the history: resumable, and `dtensor ckpt export --format
 * hf-gpt2` reads it) and every step's loss as DIR/curves.csv. Returns 0, or 1 (printed).
 * Collective. */
static int write_out(job *j, const opts *o, const gpt2 *m, dt_zero *z, dt_dataset *ds,
                     history *hist, char *ckpt_dir, const char *csv)
{
    char err[JOB_PATH_MAX + 100] = "";
    run_config config = config_of(o, m);
    dt_ckpt_value v[1] = {{"train/config", DT_CKPT_VALUE_BYTES, 0, 0, config.text,
                           strlen(config.text)}};
    int64_t steps = o->steps;
    job_train t = {z, ds, hist, &steps, NULL};
    if (job_save(j, &t, v, 1, NULL, 0, ckpt_dir) != 0)
        return 1;
    int bad = j->me == 0 && history_write_csv(hist, csv, err, sizeof err) != 0;
    if (job_any_failed(j, bad, err))
        return 1;
    job_say(j, "out: checkpoint %s, losses %s\n", ckpt_dir, csv);
    return 0;
}

static int run(job *j, const opts *o)
{
    dt_mesh *mesh = NULL;
    gpt2 *m = NULL;
    dt_dataset *ds = NULL, *vs = NULL;
    dt_zero *z = NULL;
    dt_tape *tape = NULL;
    dt_status st;
    int rc = 0;
    const char *what = "mesh";
    history hist = {NULL, 0, 0};
    lm *gen = NULL; /* --sample-every: the sampling model (examples/llama), loaded once */
    int n = 0, *order = NULL;             /* the optimizer's parameter order */
    dt_tensor **grads = NULL, **zg = NULL; /* a step's gradients, in model and that order */
    char ckpt_dir[JOB_PATH_MAX], csv[JOB_PATH_MAX], png[JOB_PATH_MAX];
    if (job_mesh(j, o->mesh, NULL, -1, &mesh) != 0 ||
        (o->out && job_places(j, o->out, NULL, NULL, ckpt_dir, csv, png) != 0)) {
        dt_mesh_destroy(mesh);
        return 1;
    }
    dt_hf_config hc;
    if (o->model && (st = dt_hf_config_read(o->model, &hc)) == DT_OK && hc.arch != DT_HF_GPT2) {
        rc = job_fail(j, "--model", DT_ERR_UNSUPPORTED, "a Llama-family directory: "
                      "train it with train_llama");
        goto done;
    }
    if (o->model && st != DT_OK) {
        what = "--model";
        goto fail;
    }
    if ((st = make_model(j, o, mesh, &m)) != DT_OK) {
        what = "model";
        goto fail;
    }
    /* Positions past the table would be an error in the first step's lookup: say so now. */
    if (o->context > gpt2_cfg(m)->context) {
        char msg[160];
        snprintf(msg, sizeof msg, "--context %lld is longer than the model's position table "
                 "(%lld rows, n_ctx of %s)", (long long)o->context,
                 (long long)gpt2_cfg(m)->context, o->init);
        rc = job_fail(j, "context", DT_ERR_INVALID_ARGUMENT, msg);
        goto done;
    }
    if (o->show_layouts)
        show_layouts(j, m);
    what = "data";
    if ((st = make_dataset(o->data, o, mesh, &ds)) != DT_OK)
        goto fail;
    if (o->val && (st = make_dataset(o->val, o, mesh, &vs)) != DT_OK)
        goto fail;
    what = "optimizer";
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = o->stage;
    zo.clip_norm = o->clip;
    zo.reduce_dtype = o->bf16 ? DT_ZERO_REDUCE_F32 : DT_ZERO_REDUCE_PARAM;
    if ((st = dt_zero_create(mesh, &zo, &z)) != DT_OK)
        goto fail;
    {
        dt_optim_hparams hp = DT_OPTIM_ADAMW_INIT;
        hp.lr = (float)o->lr;
        hp.beta1 = (float)o->beta1;
        hp.beta2 = (float)o->beta2;
        hp.eps = (float)o->eps;
        hp.weight_decay = (float)o->wd;
        if ((st = gpt2_attach(m, z, &hp, o->stage == 3)) != DT_OK)
            goto fail;
    }
    dt_tape_opts to = DT_TAPE_OPTS_INIT;
    to.accumulate = 0;
    if ((st = dt_tape_create(&to, &tape)) != DT_OK)
        goto fail;
    /* The optimizer's parameter order (gpt2_attach's groups). */
    n = gpt2_num_params(m);
    order = malloc((size_t)n * sizeof *order);
    grads = calloc((size_t)n, sizeof *grads);
    zg = calloc((size_t)n, sizeof *zg);
    if (!order || !grads || !zg) {
        st = DT_ERR_NO_MEMORY;
        goto fail;
    }
    for (int k = 0; k < n; k++)
        order[k] = gpt2_opt_order(m, k);
    int64_t first = 0; /* the first step this run makes (after --resume's) */
    job_train jt = {z, ds, &hist, &first, NULL};
    if (o->resume && resume(j, o, m, &jt) != 0) {
        rc = 1;
        goto done;
    }
    double loss = 0, tps = 0, t_all = 0;
    int sched = o->warmup > 0 || o->min_lr >= 0;
    int64_t tokens = o->batch * o->context;
    const gpt2_config *mc = gpt2_cfg(m); /* the model's, from the init file or the options */
    job_say(j, "train_gpt2: %lld parameters, %lld layers, width %lld, %lld heads, vocab %lld\n",
            (long long)gpt2_param_count(m), (long long)mc->layers, (long long)mc->width,
            (long long)mc->heads, (long long)mc->vocab);
    if (o->sample_every > 0 && (st = lm_load(mesh, o->model, &gen)) != DT_OK) {
        rc = job_fail(j, "--sample-every", st, lm_last_error());
        goto done;
    }
    for (int64_t step = first; step <= o->steps; step++) {
        if (gen && step % o->sample_every == 0 && (st = sample(j, o, m, gen, step)) != DT_OK) {
            rc = job_fail(j, "--sample-every", st, lm_last_error());
            goto done;
        }
        if (step == o->steps)
            break;
        dt_tensor *b[2] = {NULL, NULL};
        double lr = lr_at(o, step);
        what = "learning rate";
        if (sched && (st = gpt2_set_lr(m, z, (float)lr)) != DT_OK)
            goto fail;
        what = "batch";
        if ((st = dt_dataset_next(ds, 2, b, NULL)) != DT_OK)
            goto fail;
        double t0 = job_now();
        what = "forward/backward";
        st = gpt2_grads(m, tape, b[0], b[1], 1.0f, &loss, grads);
        dt_tensor_destroy(b[0]);
        dt_tensor_destroy(b[1]);
        if (st != DT_OK)
            goto fail;
        const dt_tensor *const *cg = (const dt_tensor *const *)grads;
        if (step == 0 && o->grads_out &&
            (st = write_tensors(m, mesh, cg, o->grads_out)) != DT_OK) {
            what = "grads-out";
            goto fail;
        }
        for (int k = 0; k < n; k++)
            zg[k] = grads[order[k]];
        dt_zero_step_info info;
        what = "dt_zero_step";
        st = dt_zero_step(z, zg, &info);
        for (int k = 0; k < n; k++) {
            dt_tensor_destroy(grads[k]);
            grads[k] = NULL;
        }
        if (st != DT_OK)
            goto fail;
        double dt = job_now() - t0;
        t_all += dt;
        tps = (double)tokens / dt;
        if (sched)
            job_say(j, "step %lld loss %.9g tokens_per_s %.1f lr %.9g\n", (long long)step, loss,
                    tps, (double)(float)lr);
        else
            job_say(j, "step %lld loss %.9g tokens_per_s %.1f\n", (long long)step, loss, tps);
        hist_rec rec = {step, loss, NAN, NAN, (double)o->batch / dt, dt_zero_loss_scale(z),
                        info.skipped};
        if (job_any_failed(j, history_add(&hist, &rec) != 0, "out of memory")) {
            rc = 1;
            goto done;
        }
    }
    double vloss = NAN;
    if (vs) {
        dt_tensor *b[2] = {NULL, NULL};
        what = "val";
        if ((st = dt_dataset_next(vs, 2, b, NULL)) != DT_OK)
            goto fail;
        st = gpt2_grads(m, tape, b[0], b[1], 1.0f, &vloss, grads);
        for (int k = 0; k < n; k++) {
            dt_tensor_destroy(grads[k]);
            grads[k] = NULL;
        }
        dt_tensor_destroy(b[0]);
        dt_tensor_destroy(b[1]);
        if (st != DT_OK)
            goto fail;
    }
    if (vs && hist.n > 0)
        hist.r[hist.n - 1].eval_loss = vloss;
    what = "params-out";
    if (o->params_out && (st = write_params(m, mesh, o->params_out)) != DT_OK)
        goto fail;
    if (o->out && (rc = write_out(j, o, m, z, ds, &hist, ckpt_dir, csv)) != 0)
        goto done;
    job_say(j, "result loss=%.6f val_loss=%.6f tokens_per_s=%.1f params=%lld\n", loss, vloss,
            t_all > 0 ? (double)(tokens * (o->steps - first)) / t_all : 0.0,
            (long long)gpt2_param_count(m));
    goto done;
fail:
    rc = job_fail(j, what, st, gpt2_last_error());
done:
    for (int k = 0; grads && k < n; k++)
        dt_tensor_destroy(grads[k]);
    free(order);
    free(grads);
    free(zg);
    dt_tape_destroy(tape);
    dt_zero_destroy(z);
    dt_dataset_destroy(ds);
    dt_dataset_destroy(vs);
    gpt2_destroy(m);
    dt_mesh_destroy(mesh);
    history_free(&hist);
    text_data_destroy(text_tokens);
    text_tokens = NULL;
    lm_destroy(gen);
    return rc;
}

int main(int argc, char **argv)
{
    job j;
    job_begin(&j, "train_gpt2", &argc, &argv);
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc == 2) {
        if (j.me == 0)
            usage(stdout);
        rc = 0;
    } else if (rc == 0 && (rc = job_start(&j, o.mesh, NULL, -1)) == 0)
        rc = run(&j, &o);
    return job_end(&j, rc);
}
