/* llama/gen: a whole generation run from an HF directory on a mesh (gen.h), shared by
 * examples/generate.c and `dtensor generate`. */
#include "gen.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dtensor/tokenizer.h>

#include "lm.h"
#include "sample.h"

void gen_usage(FILE *f, const char *mesh_default)
{
    fprintf(f,
            "  --model DIR          HF model directory (config.json, safetensors, tokenizer)\n"
            "  --prompt TEXT        a prompt (repeat for a batch of rows)\n"
            "  --ids LIST           a prompt as comma-separated token ids (repeatable)\n"
            "  --tokens N           tokens to generate per row (default 32; also --max-tokens)\n"
            "  --mesh FILE          mesh YAML with `batch` and optionally `model` (default %s)\n"
            "  --temperature T      0: greedy (default); else sample at T\n"
            "  --top-k K            sample among the K likeliest tokens (0: all)\n"
            "  --top-p P            sample among the likeliest tokens of mass P (default 1)\n"
            "  --seed S             the sampler's seed (default 1)\n"
            "  --ignore-eos         do not stop a row at the end-of-text token\n"
            "  --print-ids          also print each row's generated ids\n"
            "  --logits-out FILE    write the prompt positions' logits (f32 [rows, n, V])\n"
            "  --no-bos             do not start a --prompt with the config's bos_token_id\n"
            "                       (done by default for model_type llama, as its tokenizers\n"
            "                       do: ours adds no special tokens)\n"
            "  --quiet              print only the text\n",
            mesh_default);
}

int gen_parse(int argc, char **argv, int first, const char *prog, gen_opts *o)
{
    memset(o, 0, sizeof *o);
    o->tokens = 32;
    o->top_p = 1.0;
    o->seed = 1;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 2;
        if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = 1;
            continue;
        }
        if (!strcmp(a, "--print-ids")) {
            o->print_ids = 1;
            continue;
        }
        if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
            continue;
        }
        if (!strcmp(a, "--no-bos")) {
            o->no_bos = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value\n", prog, a);
            return 1;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--mesh"))
            o->mesh = v;
        else if (!strcmp(a, "--logits-out"))
            o->logits_out = v;
        else if (!strcmp(a, "--prompt") && o->nprompt < GEN_MAX_ROWS)
            o->prompt[o->nprompt++] = v;
        else if (!strcmp(a, "--ids") && o->nids < GEN_MAX_ROWS)
            o->ids[o->nids++] = v;
        else if (!strcmp(a, "--tokens") || !strcmp(a, "--max-tokens"))
            o->tokens = strtoll(v, NULL, 10);
        else if (!strcmp(a, "--top-k"))
            o->top_k = strtoll(v, NULL, 10);
        else if (!strcmp(a, "--temperature"))
            o->temperature = strtod(v, NULL);
        else if (!strcmp(a, "--top-p"))
            o->top_p = strtod(v, NULL);
        else if (!strcmp(a, "--seed"))
            o->seed = strtoull(v, NULL, 10);
        else {
            fprintf(stderr, "%s: unknown option %s (or more than %d prompts)\n", prog, a,
                    GEN_MAX_ROWS);
            return 1;
        }
    }
    if (!o->model || (o->nprompt == 0 && o->nids == 0) || (o->nprompt && o->nids)) {
        fprintf(stderr, "%s: --model and either --prompt or --ids are needed\n", prog);
        return 1;
    }
    if (o->tokens < 0 || o->temperature < 0 || o->top_p <= 0 || o->top_p > 1 || o->top_k < 0) {
        fprintf(stderr, "%s: --tokens, --temperature, --top-k >= 0 and 0 < --top-p <= 1\n", prog);
        return 1;
    }
    return 0;
}

/* The tokenizer files of an HF directory: tokenizer.json, else vocab.json and merges.txt.
 * *tok_out NULL (and DT_OK) when there are none. */
static dt_status load_tokenizer(const char *dir, dt_tokenizer **tok_out)
{
    char a[4096], b[4096];
    FILE *f;
    *tok_out = NULL;
    snprintf(a, sizeof a, "%s/tokenizer.json", dir);
    if ((f = fopen(a, "r")) != NULL) {
        fclose(f);
        return dt_tokenizer_from_json(a, tok_out);
    }
    snprintf(a, sizeof a, "%s/vocab.json", dir);
    snprintf(b, sizeof b, "%s/merges.txt", dir);
    if ((f = fopen(a, "r")) != NULL) {
        fclose(f);
        return dt_tokenizer_from_files(a, b, tok_out);
    }
    return DT_OK;
}

/* The ids of "1,2,3" into a new array. */
static int32_t *parse_ids(const char *s, int64_t *n_out)
{
    int64_t cap = (int64_t)strlen(s) + 1, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    const char *p = s;
    while (ids && *p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0) {
            free(ids);
            return NULL;
        }
        ids[n++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            free(ids);
            return NULL;
        }
    }
    *n_out = n;
    return ids;
}

static void print_text(FILE *out, const dt_tokenizer *tok, const int32_t *ids, int64_t n)
{
    size_t len = 0;
    if (!tok || dt_tokenizer_decode(tok, ids, (size_t)n, NULL, 0, &len) != DT_OK)
        return;
    char *buf = malloc(len + 1);
    if (buf && dt_tokenizer_decode(tok, ids, (size_t)n, buf, len, &len) == DT_OK)
        fwrite(buf, 1, len, out);
    free(buf);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int gen_run(const dt_mesh *mesh, int me, const gen_opts *o, FILE *out_f, gen_fail_fn fail,
            void *arg)
{
    lm *m = NULL;
    lm_cache *c = NULL;
    dt_tokenizer *tok = NULL;
    int rows = o->nprompt ? o->nprompt : o->nids, rc = 1;
    int32_t *prompt[GEN_MAX_ROWS] = {0}, *out[GEN_MAX_ROWS] = {0};
    int64_t plen[GEN_MAX_ROWS] = {0}, nout[GEN_MAX_ROWS] = {0},
            skip = 0; /* skip: the BOS, unprinted */
    float *logits = NULL, *all = NULL;
    int32_t *step_ids = NULL;
    dt_status st;
    double t0 = now();
    if ((st = lm_load(mesh, o->model, &m)) != DT_OK) {
        fail(arg, "loading the model", st, lm_last_error());
        goto out;
    }
    double t_load = now() - t0;
    const dt_hf_config *cf = lm_config(m);
    if ((st = load_tokenizer(o->model, &tok)) != DT_OK) {
        fail(arg, "loading the tokenizer", st, dt_last_error());
        goto out;
    }
    if (o->nprompt && !tok) {
        fail(arg, "--prompt", DT_ERR_NOT_FOUND,
             "the model directory has no tokenizer.json "
             "nor vocab.json and merges.txt (use --ids)");
        goto out;
    }
    int64_t nmin = 0, nmax = 0;
    for (int r = 0; r < rows; r++) {
        if (o->nprompt) {
            size_t len = strlen(o->prompt[r]), n = 0;
            /* Llama's tokenizers start a text with <|begin_of_text|> / <s>. */
            skip = !o->no_bos && !strcmp(cf->model_type, "llama") && cf->bos_token_id >= 0;
            prompt[r] = malloc((len + 17) * sizeof *prompt[r]);
            if (prompt[r] && skip)
                prompt[r][0] = (int32_t)cf->bos_token_id;
            st = prompt[r] ? dt_tokenizer_encode(tok, o->prompt[r], len, 0, prompt[r] + skip,
                                                 len + 16, &n)
                           : DT_ERR_NO_MEMORY;
            if (st != DT_OK) {
                fail(arg, "encoding the prompt", st, dt_last_error());
                goto out;
            }
            plen[r] = (int64_t)n + skip;
        } else if (!(prompt[r] = parse_ids(o->ids[r], &plen[r]))) {
            fail(arg, "--ids", DT_ERR_INVALID_ARGUMENT, "not a comma-separated list of ids");
            goto out;
        }
        for (int64_t i = 0; i < plen[r]; i++)
            if (prompt[r][i] >= cf->vocab) {
                fail(arg, "--ids", DT_ERR_INVALID_ARGUMENT, "an id beyond the vocabulary");
                goto out;
            }
        if (plen[r] == 0) {
            fail(arg, "the prompt", DT_ERR_INVALID_ARGUMENT, "an empty prompt");
            goto out;
        }
        nmin = r == 0 || plen[r] < nmin ? plen[r] : nmin;
        nmax = plen[r] > nmax ? plen[r] : nmax;
        out[r] = malloc((size_t)(o->tokens + 1) * sizeof *out[r]);
        if (!out[r]) {
            fail(arg, "the output", DT_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
    }
    int64_t V = cf->vocab, cap = nmax + o->tokens;
    if ((st = lm_cache_create(m, rows, cap, &c)) != DT_OK) {
        fail(arg, "the key/value cache", st, lm_last_error());
        goto out;
    }
    logits = malloc((size_t)(rows * V) * sizeof *logits);
    all = o->logits_out ? malloc((size_t)(rows * nmin * V) * sizeof *all) : NULL;
    step_ids = malloc((size_t)(rows * nmin) * sizeof *step_ids);
    if (!logits || !step_ids || (o->logits_out && !all)) {
        fail(arg, "the logits", DT_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    /* Prefill: the positions every prompt has. */
    for (int r = 0; r < rows; r++)
        memcpy(step_ids + r * nmin, prompt[r], (size_t)nmin * sizeof *step_ids);
    t0 = now();
    st = lm_forward(m, c, nmin, step_ids, all != NULL, all ? all : logits);
    double t_prefill = now() - t0;
    if (st != DT_OK) {
        fail(arg, "the prompt's forward pass", st, lm_last_error());
        goto out;
    }
    if (all) {
        for (int r = 0; r < rows; r++)
            memcpy(logits + r * V, all + (r * nmin + nmin - 1) * V, (size_t)V * sizeof *logits);
        FILE *f = me == 0 ? fopen(o->logits_out, "wb") : NULL;
        if (me == 0 && (!f || fwrite(all, sizeof *all, (size_t)(rows * nmin * V), f) !=
                                  (size_t)(rows * nmin * V))) {
            fail(arg, "--logits-out", DT_ERR_IO, o->logits_out);
            if (f)
                fclose(f);
            goto out;
        }
        if (f)
            fclose(f);
    }
    sampler smp;
    sampler_init(&smp, o->temperature, o->top_k, o->top_p, o->seed);
    int done[GEN_MAX_ROWS] = {0};
    int64_t decoded = 0;
    t0 = now();
    /* Decode one position per step: a row still inside its prompt is fed its next prompt
     * token, the others their sample. */
    for (int64_t pos = nmin;; pos++) {
        int busy = 0;
        for (int r = 0; r < rows; r++) {
            int32_t next;
            if (pos < plen[r]) {
                next = prompt[r][pos];
            } else {
                next = sampler_next(&smp, logits + r * V, V);
                if (!done[r] && nout[r] < o->tokens) {
                    out[r][nout[r]++] = next;
                    if (!o->ignore_eos && cf->eos_token_id >= 0 && next == cf->eos_token_id)
                        done[r] = 1;
                }
                if (nout[r] >= o->tokens)
                    done[r] = 1;
            }
            busy |= !done[r];
            step_ids[r] = next;
        }
        if (!busy || pos >= cap)
            break;
        if ((st = lm_forward(m, c, 1, step_ids, 0, logits)) != DT_OK) {
            fail(arg, "a decoding step", st, lm_last_error());
            goto out;
        }
        decoded++;
    }
    double t_decode = now() - t0;
    if (me == 0) {
        for (int r = 0; r < rows; r++) {
            if (!o->quiet)
                fprintf(out_f, "row %d: ", r);
            print_text(out_f, tok, prompt[r] + skip, plen[r] - skip);
            print_text(out_f, tok, out[r], nout[r]);
            fprintf(out_f, "\n");
            if (o->print_ids) {
                fprintf(out_f, "ids %d:", r);
                for (int64_t i = 0; i < nout[r]; i++)
                    fprintf(out_f, " %" PRId32, out[r][i]);
                fprintf(out_f, "\n");
            }
        }
        if (!o->quiet)
            fprintf(out_f,
                    "generate: %s (%s, %" PRId64 " layers, hidden %" PRId64 ") on %lld devices: "
                    "load %.3f s, prefill %" PRId64 " x %" PRId64 " tokens %.3f s, %" PRId64
                    " decode steps x %d rows %.3f s (%.1f tokens/s)\n",
                    o->model, cf->model_type, cf->layers, cf->hidden, (long long)dt_mesh_size(mesh),
                    t_load, (int64_t)rows, nmin, t_prefill, decoded, rows, t_decode,
                    t_decode > 0 ? (double)(decoded * rows) / t_decode : 0.0);
        fflush(out_f);
    }
    rc = 0;
out:
    for (int r = 0; r < GEN_MAX_ROWS; r++) {
        free(prompt[r]);
        free(out[r]);
    }
    free(logits);
    free(all);
    free(step_ids);
    lm_cache_destroy(c);
    lm_destroy(m);
    dt_tokenizer_destroy(tok);
    return rc;
}
