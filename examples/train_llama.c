/* train_llama: fine-tunes a Hugging Face model directory (the Llama family: Llama, Qwen2,
 * Mistral; or GPT-2) on text, with ZeRO AdamW on a mesh with `batch` (data parallel) and
 * `model` (tensor parallel) dims, the forward pass on the autograd tape (examples/llama),
 * printing a sample as text every N steps, and writing back an HF directory
 * (docs/generate.md, "Fine-tuning"):
 *   train_llama --model DIR [--random-init] (--text FILE|DIR [--lines] | --data TRAIN.bin) --batch B
 *     --context T --steps N --lr LR [--weight-decay W] [--beta1] [--beta2] [--eps] [--clip C]
 *     [--mesh FILE] [--zero 0-3] [--sequence-parallel] [--sample-every N] [--sample-tokens K]
 *     [--sample-prompt TEXT] [--temperature T] [--top-k K] [--seed S] [--out DIR]
 *     [--max-file-bytes N] [--micro M --schedule gpipe|1f1b]
 * --text: tokenised on the fly by the model's tokenizer (each line a document with --lines),
 * --data: an llm.c token shard (dtensor tokenize). --out DIR: DIR/checkpoint (our names) and
 * DIR/hf, the HF directory exported from it (config.json, safetensors with HF names, the
 * tokenizer files); --resume DIR goes on from such a DIR to --steps. Prints `step N loss L`
 * per step and `sample N: TEXT`. A mesh with a `pipe` dim trains the blocks in pipeline stages
 * (examples/llama/lm_pipe.c, M micro-batches a step). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <dtensor/dtensor.h>
#include <dtensor/foreign.h>
#include <dtensor/tokenizer.h>

#include "llama/lm.h"
#include "llama/lm_pipe.h"
#include "llama/sample.h"
#include "llama/text_data.h"
#include "train/job.h"

typedef struct opts {
    const char *model, *text, *data, *mesh, *out, *prompt, *resume;
    int64_t batch, context, steps, sample_every, sample_tokens, top_k, max_file_bytes;
    uint64_t seed;
    double lr, wd, beta1, beta2, eps, clip, temperature;
    int stage, lines, random_init, seqpar, micro;
    const char *schedule;
} opts;

static void usage(FILE *f)
{
    fputs("usage: train_llama --model DIR (--text FILE|DIR | --data TRAIN.bin) --batch B "
          "--context T --steps N --lr LR [options]\n"
          "  --model DIR          HF model directory (config.json, safetensors, tokenizer)\n"
          "  --random-init        the weights drawn from --seed instead (DIR's config.json\n"
          "                       and tokenizer only; the Llama family)\n"
          "  --text FILE|DIR      raw text tokenised on the fly (--lines: a document a line)\n"
          "  --data FILE          an llm.c token shard (dtensor tokenize)\n"
          "  --weight-decay W --beta1 B1 --beta2 B2 --eps E --clip C   AdamW, clipping\n"
          "  --mesh FILE --zero 0-3   mesh YAML (batch, model), ZeRO stage\n"
          "  --sequence-parallel  activations sharded along the sequence over `model`\n"
          "  --sample-every N --sample-tokens K --sample-prompt TEXT   a sample every N steps\n"
          "  --temperature T --top-k K --seed S   the samples' sampler (T 0: greedy)\n"
          "  --out DIR            DIR/checkpoint and the HF directory DIR/hf\n"
          "  --resume DIR         go on from an earlier --out DIR (its checkpoint: weights,\n"
          "                       optimizer state, data position, history) to --steps\n"
          "  --max-file-bytes N   DIR/hf's safetensors sharded (with an index) above N bytes\n"
          "  --micro M --schedule gpipe|1f1b   on a mesh with a `pipe` dim: pipeline stages,\n"
          "                       M micro-batches per step (default 1, 1f1b)\n",
          f);
}

static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){.mesh = TRAIN_EXAMPLES_DIR "/meshes/1x1.yaml", .lr = -1, .beta1 = 0.9,
                .beta2 = 0.95, .eps = 1e-8, .clip = 1.0, .stage = 1, .sample_tokens = 32,
                .temperature = 1.0, .seed = 1, .micro = 1, .schedule = "1f1b"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 2;
        if (!strcmp(a, "--lines")) {
            o->lines = 1;
            continue;
        }
        if (!strcmp(a, "--random-init")) {
            o->random_init = 1;
            continue;
        }
        if (!strcmp(a, "--sequence-parallel")) {
            o->seqpar = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "train_llama: %s needs a value\n", a);
            return 1;
        }
        i++;
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--text")) o->text = v;
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--mesh")) o->mesh = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--sample-prompt")) o->prompt = v;
        else if (!strcmp(a, "--resume")) o->resume = v;
        else if (!strcmp(a, "--batch")) o->batch = atoll(v);
        else if (!strcmp(a, "--context")) o->context = atoll(v);
        else if (!strcmp(a, "--steps")) o->steps = atoll(v);
        else if (!strcmp(a, "--sample-every")) o->sample_every = atoll(v);
        else if (!strcmp(a, "--sample-tokens")) o->sample_tokens = atoll(v);
        else if (!strcmp(a, "--top-k")) o->top_k = atoll(v);
        else if (!strcmp(a, "--max-file-bytes")) o->max_file_bytes = atoll(v);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--lr")) o->lr = atof(v);
        else if (!strcmp(a, "--weight-decay")) o->wd = atof(v);
        else if (!strcmp(a, "--beta1")) o->beta1 = atof(v);
        else if (!strcmp(a, "--beta2")) o->beta2 = atof(v);
        else if (!strcmp(a, "--eps")) o->eps = atof(v);
        else if (!strcmp(a, "--clip")) o->clip = atof(v);
        else if (!strcmp(a, "--temperature")) o->temperature = atof(v);
        else if (!strcmp(a, "--zero")) o->stage = atoi(v);
        else if (!strcmp(a, "--micro")) o->micro = atoi(v);
        else if (!strcmp(a, "--schedule")) o->schedule = v;
        else {
            fprintf(stderr, "train_llama: unknown option %s\n", a);
            return 1;
        }
    }
    if (!o->model || (!o->text == !o->data) || o->batch < 1 || o->context < 1 ||
        o->steps < 0 || o->lr < 0) {
        usage(stderr);
        return 1;
    }
    if (o->stage < 0 || o->stage > 3) {
        fprintf(stderr, "train_llama: --zero %d (0, 1, 2 or 3)\n", o->stage);
        return 1;
    }
    return 0;
}

/* The model of --model DIR on `mesh`: its weights, or with --random-init its config.json's
 * shapes drawn from --seed. */
static dt_status load_model(const opts *o, const dt_mesh *mesh, lm **m_out)
{
    if (!o->random_init)
        return lm_load(mesh, o->model, m_out);
    dt_hf_config hc;
    dt_status st = dt_hf_config_read(o->model, &hc);
    return st == DT_OK ? lm_create_random(mesh, &hc, o->seed, m_out) : st;
}

static dt_status load_tokenizer(const char *dir, dt_tokenizer **tok_out)
{
    char a[4096], b[4096];
    struct stat sb;
    *tok_out = NULL;
    snprintf(a, sizeof a, "%s/tokenizer.json", dir);
    if (stat(a, &sb) == 0)
        return dt_tokenizer_from_json(a, tok_out);
    snprintf(a, sizeof a, "%s/vocab.json", dir);
    snprintf(b, sizeof b, "%s/merges.txt", dir);
    if (stat(a, &sb) == 0)
        return dt_tokenizer_from_files(a, b, tok_out);
    return DT_OK;
}

/* One sample (lm_sample_text), printed by client 0 as "sample STEP: TEXT". Collective. */
static dt_status sample(const job *j, const opts *o, lm *m, const dt_tokenizer *tok,
                        int32_t eot, int64_t step)
{
    char *text = NULL;
    size_t len = 0;
    dt_status st = lm_sample_text(m, tok, eot, o->prompt, o->sample_tokens, o->temperature,
                                  o->top_k, o->seed + (uint64_t)step, &text, &len);
    if (st == DT_OK && j->me == 0) {
        printf("sample %lld: %.*s\n", (long long)step, (int)len, text);
        fflush(stdout);
    }
    free(text);
    return st;
}

static dt_status make_dataset(const opts *o, const dt_mesh *mesh, const dt_tokenizer *tok,
                              int32_t eot, text_data **td, dt_dataset **out)
{
    dt_data_source *src = NULL;
    dt_layout *l = NULL;
    dt_status st;
    if (o->text) {
        st = text_data_load(tok, o->text, o->lines, eot, o->context, td);
        if (st == DT_OK)
            st = text_data_source(*td, &src);
    } else {
        st = dt_data_source_llmc(o->data, o->context, &src);
    }
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

/* What was trained, as the checkpoint's train/config value. */
static void config_text(const opts *o, const lm *m, char *buf, size_t len)
{
    const dt_hf_config *cf = lm_config(m);
    snprintf(buf, len, "model_type=%s layers=%lld hidden=%lld heads=%lld kv_heads=%lld "
             "vocab=%lld context=%lld", cf->model_type, (long long)cf->layers,
             (long long)cf->hidden, (long long)cf->heads, (long long)cf->kv_heads,
             (long long)cf->vocab, (long long)o->context);
}

/* --resume: the checkpoint holds this model (job_check_fn). */
static int check_config(void *arg, const dt_ckpt *ck, const char *dir, char *err, size_t errlen)
{
    const char *want = arg;
    const void *cd = NULL;
    size_t cn = 0;
    if (dt_ckpt_value_bytes(ck, "train/config", &cd, &cn) != DT_OK) {
        snprintf(err, errlen, "--resume %s: not a train_llama checkpoint: %s", dir,
                 dt_last_error());
        return -1;
    }
    if (cn != strlen(want) || memcmp(cd, want, cn) != 0) {
        snprintf(err, errlen, "--resume %s: saved with %.*s; this run has %s", dir,
                 (int)(cn < 200 ? cn : 200), (const char *)cd, want);
        return -1;
    }
    return 0;
}

/* --out DIR: DIR/checkpoint (the optimizer's parameters under our names and its state), then
 * client 0 exports DIR/hf from it. Collective. */
static int write_out(job *j, const opts *o, lm *m, dt_zero *z, dt_dataset *ds, history *hist)
{
    char ckpt_dir[JOB_PATH_MAX], csv[JOB_PATH_MAX], png[JOB_PATH_MAX], hf[JOB_PATH_MAX];
    if (job_places(j, o->out, NULL, NULL, ckpt_dir, csv, png) != 0)
        return 1;
    int64_t steps = o->steps;
    job_train t = {z, ds, hist, &steps, NULL};
    char config[256];
    config_text(o, m, config, sizeof config);
    dt_ckpt_value v[1] = {{"train/config", DT_CKPT_VALUE_BYTES, 0, 0, config, strlen(config)}};
    if (job_save(j, &t, v, 1, NULL, 0, ckpt_dir) != 0)
        return 1;
    snprintf(hf, sizeof hf, "%s/hf", o->out);
    char err[JOB_PATH_MAX + 200] = "";
    int bad = 0;
    if (j->me == 0) {
        dt_ckpt *ck = NULL;
        dt_ckpt_export_opts eo = DT_CKPT_EXPORT_OPTS_INIT;
        eo.max_file_bytes = (uint64_t)o->max_file_bytes;
        dt_status st = dt_ckpt_open(ckpt_dir, &ck);
        if (st == DT_OK)
            st = dt_ckpt_export_hf(ck, hf, lm_config(m), o->model, &eo);
        dt_ckpt_close(ck);
        if (st != DT_OK) {
            snprintf(err, sizeof err, "export to %s: %s: %s", hf, dt_status_name(st),
                     dt_last_error());
            bad = 1;
        }
    }
    if (job_any_failed(j, bad, err))
        return 1;
    job_say(j, "out: checkpoint %s, HF directory %s\n", ckpt_dir, hf);
    return 0;
}

/* Training on a mesh with a `pipe` dim (examples/llama/lm_pipe.c): the model on this
 * client's stage mesh, the batch read on the whole mesh and handed to the stages as host ids,
 * `step N loss L` as without pipeline. Not yet with --sequence-parallel, --out, --resume,
 * samples or ZeRO stage 3. */
static int run_pipe(job *j, const opts *o, const dt_mesh *mesh)
{
    dt_pipe *pipe = NULL;
    lm *m = NULL;
    lm_pipe *lp = NULL;
    dt_tokenizer *tok = NULL;
    text_data *td = NULL;
    dt_dataset *ds = NULL;
    int32_t *hx = NULL, *hy = NULL;
    const char *what = "pipeline";
    dt_status st = DT_OK;
    int rc = 0;
    if (o->seqpar || o->out || o->resume || o->sample_every > 0 || o->stage == 3)
        return job_fail(j, what, DT_ERR_UNSUPPORTED,
                        "a mesh with a pipe dim does not take --sequence-parallel, --out, "
                        "--resume, --sample-every or --zero 3 yet");
    dt_pipe_schedule_kind kind;
    if ((st = dt_pipe_schedule_kind_parse(o->schedule, &kind)) != DT_OK ||
        (st = dt_pipe_create(mesh, "pipe", &pipe)) != DT_OK)
        goto fail;
    const dt_mesh *sm = NULL;
    for (int s = 0; s < dt_pipe_num_stages(pipe); s++)
        if (dt_pipe_holds_stage(pipe, s))
            sm = dt_pipe_stage_mesh(pipe, s);
    what = "model";
    if ((st = load_model(o, sm, &m)) != DT_OK)
        goto fail;
    what = "tokenizer";
    if ((st = load_tokenizer(o->model, &tok)) != DT_OK)
        goto fail;
    if (!tok && o->text) {
        rc = job_fail(j, what, DT_ERR_NOT_FOUND, "the model directory has no tokenizer");
        goto done;
    }
    int32_t eot = tok ? text_data_eot(tok) : -1;
    if (eot < 0)
        eot = (int32_t)lm_config(m)->eos_token_id;
    what = "data";
    if ((st = make_dataset(o, mesh, tok, eot, &td, &ds)) != DT_OK)
        goto fail;
    lm_pipe_opts po = {o->micro, kind, o->batch, o->context, o->stage, o->clip,
                       DT_OPTIM_ADAMW_INIT};
    po.hp.lr = (float)o->lr;
    po.hp.beta1 = (float)o->beta1;
    po.hp.beta2 = (float)o->beta2;
    po.hp.eps = (float)o->eps;
    po.hp.weight_decay = (float)o->wd;
    what = "pipeline";
    if ((st = lm_pipe_create(pipe, m, &po, &lp)) != DT_OK)
        goto fail;
    size_t bytes = (size_t)(o->batch * o->context) * sizeof *hx;
    hx = malloc(bytes);
    hy = malloc(bytes);
    if (!hx || !hy) {
        st = DT_ERR_NO_MEMORY;
        goto fail;
    }
    job_say(j, "train_llama: %s: %d pipeline stages, %d micro-batches (%s)\n", o->model,
            dt_pipe_num_stages(pipe), o->micro, o->schedule);
    double loss = 0, t_all = 0;
    for (int64_t step = 0; step < o->steps; step++) {
        dt_tensor *b[2] = {NULL, NULL};
        what = "batch";
        if ((st = dt_dataset_next(ds, 2, b, NULL)) != DT_OK)
            goto fail;
        if (dt_tensor_dtype(b[0]) != DT_DTYPE_I32)
            st = DT_ERR_STATE;
        if (st == DT_OK)
            st = dt_tensor_to_host(b[0], -1, hx, bytes);
        if (st == DT_OK)
            st = dt_tensor_to_host(b[1], -1, hy, bytes);
        dt_tensor_destroy(b[0]);
        dt_tensor_destroy(b[1]);
        if (st != DT_OK)
            goto fail;
        double t0 = job_now();
        dt_zero_step_info info;
        what = "pipeline step";
        if ((st = lm_pipe_step(lp, hx, hy, &loss, &info)) != DT_OK)
            goto fail;
        double dt = job_now() - t0;
        t_all += dt;
        job_say(j, "step %lld loss %.9g tokens_per_s %.1f\n", (long long)step, loss,
                (double)(o->batch * o->context) / dt);
    }
    job_say(j, "result loss=%.6f tokens_per_s=%.1f\n", loss,
            t_all > 0 ? (double)(o->batch * o->context * o->steps) / t_all : 0.0);
    goto done;
fail:
    /* A stage's own failure, printed where it happened (job_fail prints on client 0, which
     * may be another stage waiting for this one). */
    if (j->me != 0 && st != DT_ERR_TIMEOUT)
        fprintf(stderr, "train_llama: client %d: %s: %s: %s\n", j->me, what, dt_status_name(st),
                lm_last_error());
    rc = job_fail(j, what, st, lm_last_error());
done:
    free(hx);
    free(hy);
    lm_pipe_destroy(lp);
    dt_dataset_destroy(ds);
    text_data_destroy(td);
    dt_tokenizer_destroy(tok);
    lm_destroy(m);
    dt_pipe_destroy(pipe);
    return rc;
}

static int run(job *j, const opts *o)
{
    dt_mesh *mesh = NULL;
    lm *m = NULL;
    dt_tokenizer *tok = NULL;
    text_data *td = NULL;
    dt_dataset *ds = NULL;
    dt_zero *z = NULL;
    dt_tape *tape = NULL;
    dt_tensor **grads = NULL, **zg = NULL;
    history hist = {NULL, 0, 0};
    const char *what = "mesh";
    dt_status st = DT_OK;
    int rc = 0, n = 0;
    if (job_mesh(j, o->mesh, NULL, -1, &mesh) != 0) {
        dt_mesh_destroy(mesh);
        return 1;
    }
    if (dt_mesh_dim_index(mesh, "pipe") >= 0) {
        rc = run_pipe(j, o, mesh);
        dt_mesh_destroy(mesh);
        return rc;
    }
    what = "model";
    if ((st = load_model(o, mesh, &m)) != DT_OK)
        goto fail;
    what = "tokenizer";
    if ((st = load_tokenizer(o->model, &tok)) != DT_OK)
        goto fail;
    if (!tok && (o->text || o->sample_every > 0)) {
        st = DT_ERR_NOT_FOUND;
        rc = job_fail(j, what, st, "the model directory has no tokenizer.json nor vocab.json "
                      "and merges.txt");
        goto done;
    }
    lm_set_sequence_parallel(m, o->seqpar);
    int32_t eot = tok ? text_data_eot(tok) : -1;
    if (eot < 0)
        eot = (int32_t)lm_config(m)->eos_token_id;
    what = "data";
    if ((st = make_dataset(o, mesh, tok, eot, &td, &ds)) != DT_OK)
        goto fail;
    what = "optimizer";
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = o->stage;
    zo.clip_norm = o->clip;
    if ((st = dt_zero_create(mesh, &zo, &z)) != DT_OK)
        goto fail;
    dt_optim_hparams hp = DT_OPTIM_ADAMW_INIT;
    hp.lr = (float)o->lr;
    hp.beta1 = (float)o->beta1;
    hp.beta2 = (float)o->beta2;
    hp.eps = (float)o->eps;
    hp.weight_decay = (float)o->wd;
    if ((st = lm_attach(m, z, &hp, o->stage == 3)) != DT_OK)
        goto fail;
    dt_tape_opts to = DT_TAPE_OPTS_INIT;
    if ((st = dt_tape_create(&to, &tape)) != DT_OK)
        goto fail;
    n = lm_num_params(m);
    grads = calloc((size_t)n, sizeof *grads);
    zg = calloc((size_t)n, sizeof *zg);
    if (!grads || !zg) {
        st = DT_ERR_NO_MEMORY;
        goto fail;
    }
    const dt_hf_config *cf = lm_config(m);
    job_say(j, "train_llama: %s (%s): %lld layers, hidden %lld, %lld heads (%lld kv), vocab "
            "%lld; %lld tokens of %s\n", o->model, cf->model_type, (long long)cf->layers,
            (long long)cf->hidden, (long long)cf->heads, (long long)cf->kv_heads,
            (long long)cf->vocab, td ? (long long)text_data_tokens(td) : -1LL,
            o->text ? o->text : o->data);
    int64_t first = 0; /* the first step this run makes (after --resume's) */
    if (o->resume) {
        char dir[JOB_PATH_MAX], config[256];
        struct stat sb;
        job_train jt = {z, ds, &hist, &first, NULL};
        snprintf(dir, sizeof dir, "%s/checkpoint", o->resume);
        config_text(o, m, config, sizeof config);
        if (job_resume(j, &jt, stat(dir, &sb) == 0 ? dir : o->resume, NULL, o->steps, 0, 0,
                       check_config, config) != 0) {
            rc = 1;
            goto done;
        }
    }
    double loss = 0, t_all = 0;
    for (int64_t step = first; step < o->steps; step++) {
        if (o->sample_every > 0 && step % o->sample_every == 0 &&
            (st = sample(j, o, m, tok, eot, step)) != DT_OK) {
            what = "sample";
            goto fail;
        }
        dt_tensor *b[2] = {NULL, NULL};
        what = "batch";
        if ((st = dt_dataset_next(ds, 2, b, NULL)) != DT_OK)
            goto fail;
        double t0 = job_now();
        what = "forward/backward";
        st = lm_grads(m, tape, b[0], b[1], &loss, grads);
        dt_tensor_destroy(b[0]);
        dt_tensor_destroy(b[1]);
        if (st != DT_OK)
            goto fail;
        for (int k = 0; k < n; k++)
            zg[k] = grads[lm_opt_order(m, k)];
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
        job_say(j, "step %lld loss %.9g tokens_per_s %.1f\n", (long long)step, loss,
                (double)(o->batch * o->context) / dt);
        hist_rec rec = {step, loss, NAN, NAN, (double)o->batch / dt, 1.0, info.skipped};
        if (job_any_failed(j, history_add(&hist, &rec) != 0, "out of memory")) {
            rc = 1;
            goto done;
        }
    }
    if (o->sample_every > 0 && (st = sample(j, o, m, tok, eot, o->steps)) != DT_OK) {
        what = "sample";
        goto fail;
    }
    if (o->out && (rc = write_out(j, o, m, z, ds, &hist)) != 0)
        goto done;
    job_say(j, "result loss=%.6f tokens_per_s=%.1f\n", loss,
            t_all > 0 ? (double)(o->batch * o->context * (o->steps - first)) / t_all : 0.0);
    goto done;
fail:
    rc = job_fail(j, what, st, lm_last_error());
done:
    for (int k = 0; grads && k < n; k++)
        dt_tensor_destroy(grads[k]);
    free(grads);
    free(zg);
    dt_tape_destroy(tape);
    dt_zero_destroy(z);
    dt_dataset_destroy(ds);
    text_data_destroy(td);
    dt_tokenizer_destroy(tok);
    lm_destroy(m);
    dt_mesh_destroy(mesh);
    history_free(&hist);
    return rc;
}

int main(int argc, char **argv)
{
    job j;
    job_begin(&j, "train_llama", &argc, &argv);
    j.allow_pipe = 1; /* a `pipe` dim: run_pipe */
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc == 2) {
        if (j.me == 0)
            usage(stdout);
        rc = 0;
    } else if (rc == 0 && (rc = job_start(&j, o.mesh, NULL, -1)) == 0) {
        rc = run(&j, &o);
    }
    return job_end(&j, rc);
}
