/* dtensor tokenize: raw text (a file, or every file of a directory in name order) encoded by
 * an HF tokenizer into llm.c token shards (int32[256] header: magic 20240520, version 1, the
 * token count; then uint16 tokens), which llm.c's tools and our dataset read
 * (docs/generate.md, "Training on text"). Each document is preceded by the end-of-text token,
 * as llm.c's data scripts write them; the first shard is the validation split. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "dtensor/tokenizer.h"

#define LLMC_MAGIC 20240520

typedef struct shard_writer {
    const char *prefix;
    int64_t shard_tokens, val_tokens;
    uint16_t *buf;
    int64_t n;     /* tokens in buf */
    int index;     /* next shard's number */
    int64_t total; /* tokens written */
} shard_writer;

static int flush_shard(shard_writer *w)
{
    if (w->n == 0)
        return CLI_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s_%s_%06d.bin", w->prefix, w->index == 0 ? "val" : "train",
             w->index);
    int32_t head[256] = {LLMC_MAGIC, 1, (int32_t)w->n};
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(head, sizeof head, 1, f) != 1 ||
        fwrite(w->buf, sizeof *w->buf, (size_t)w->n, f) != (size_t)w->n) {
        fprintf(stderr, "dtensor tokenize: cannot write %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return CLI_BAD_INPUT;
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "dtensor tokenize: cannot write %s: %s\n", path, strerror(errno));
        return CLI_BAD_INPUT;
    }
    printf("%s %lld tokens\n", path, (long long)w->n);
    w->total += w->n;
    w->n = 0;
    w->index++;
    return CLI_OK;
}

static int put_tokens(shard_writer *w, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        /* The validation shard holds val_tokens, the others shard_tokens. */
        int64_t cap = w->index == 0 && w->val_tokens > 0 ? w->val_tokens : w->shard_tokens;
        if (w->n >= cap) {
            int rc = flush_shard(w);
            if (rc != CLI_OK)
                return rc;
        }
        w->buf[w->n++] = (uint16_t)ids[i];
    }
    return CLI_OK;
}

static char *read_all(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                buf = NULL;
            }
            buf = b;
        }
    }
    fclose(f);
    *len_out = len;
    return buf;
}

/* Encodes text[0..len) as one document: the end-of-text token, then its ids. */
static int put_document(shard_writer *w, const dt_tokenizer *tok, int32_t eot, const char *text,
                        size_t len)
{
    size_t cap = len + 64, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return CLI_BAD_INPUT;
    ids[0] = eot;
    dt_status st = dt_tokenizer_encode(tok, text, len, 0, ids + 1, cap - 1, &n);
    int rc = st == DT_OK ? put_tokens(w, ids, n + 1) : cli_fail("encoding", st);
    free(ids);
    return rc;
}

static int do_file(shard_writer *w, const dt_tokenizer *tok, int32_t eot, const char *path,
                   int lines)
{
    size_t len = 0;
    char *text = read_all(path, &len);
    if (!text) {
        fprintf(stderr, "dtensor tokenize: cannot read %s: %s\n", path, strerror(errno));
        return CLI_BAD_INPUT;
    }
    int rc = CLI_OK;
    if (!lines) {
        rc = put_document(w, tok, eot, text, len);
    } else {
        size_t at = 0;
        while (rc == CLI_OK && at < len) {
            size_t end = at;
            while (end < len && text[end] != '\n')
                end++;
            if (end > at)
                rc = put_document(w, tok, eot, text + at, end - at);
            at = end + 1;
        }
    }
    free(text);
    return rc;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A directory's regular files in name order (not recursive). */
static int do_dir(shard_writer *w, const dt_tokenizer *tok, int32_t eot, const char *dir, int lines)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "dtensor tokenize: cannot open %s: %s\n", dir, strerror(errno));
        return CLI_BAD_INPUT;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            char **b = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
            if (!b)
                break;
            names = b;
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    int rc = CLI_OK;
    for (size_t i = 0; i < n; i++) {
        char p[4096];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (rc == CLI_OK && stat(p, &sb) == 0 && S_ISREG(sb.st_mode))
            rc = do_file(w, tok, eot, p, lines);
        free(names[i]);
    }
    free(names);
    return rc;
}

static int tokenize_usage(void)
{
    fputs("usage: dtensor tokenize (--model DIR | --tokenizer tokenizer.json |\n"
          "                         --vocab vocab.json --merges merges.txt)\n"
          "                        --out PREFIX [--lines] [--shard-tokens N] [--val-tokens N]\n"
          "                        [--eot ID] INPUT...\n"
          "  INPUT: text files or directories of them (their files in name order); each file\n"
          "  (each line with --lines) is a document preceded by the end-of-text token.\n"
          "  Writes PREFIX_val_000000.bin (the first --val-tokens, default one shard), then\n"
          "  PREFIX_train_000001.bin... of --shard-tokens (default 100M) uint16 tokens each.\n",
          stderr);
    return CLI_USAGE;
}

/* The end-of-text id: --eot, else the tokenizer's "<|endoftext|>" or "<|end_of_text|>". */
static int32_t find_eot(const dt_tokenizer *tok)
{
    static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};
    int32_t id;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (dt_tokenizer_token_id(tok, names[i], strlen(names[i]), &id) == DT_OK)
            return id;
    return -1;
}

int cli_tokenize(int argc, char **argv)
{
    const char *model = NULL, *json = NULL, *vocab = NULL, *merges = NULL, *out = NULL;
    int64_t shard_tokens = 100000000, val_tokens = 0;
    int lines = 0, ninput = 0;
    long eot = -1;
    const char **input = calloc((size_t)argc, sizeof *input);
    if (!input)
        return CLI_BAD_INPUT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--lines")) {
            lines = 1;
        } else if (a[0] == '-' && a[1] == '-' && !v) {
            free(input);
            return tokenize_usage();
        } else if (!strcmp(a, "--model")) {
            model = argv[++i];
        } else if (!strcmp(a, "--tokenizer")) {
            json = argv[++i];
        } else if (!strcmp(a, "--vocab")) {
            vocab = argv[++i];
        } else if (!strcmp(a, "--merges")) {
            merges = argv[++i];
        } else if (!strcmp(a, "--out")) {
            out = argv[++i];
        } else if (!strcmp(a, "--shard-tokens")) {
            shard_tokens = strtoll(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--val-tokens")) {
            val_tokens = strtoll(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--eot")) {
            eot = strtol(argv[++i], NULL, 10);
        } else if (a[0] == '-') {
            free(input);
            return tokenize_usage();
        } else {
            input[ninput++] = a;
        }
    }
    if (!out || ninput == 0 || shard_tokens < 1 || val_tokens < 0 ||
        (!model && !json && !(vocab && merges))) {
        free(input);
        return tokenize_usage();
    }
    char a[4096], b[4096];
    struct stat sb;
    if (model) {
        snprintf(a, sizeof a, "%s/tokenizer.json", model);
        if (stat(a, &sb) == 0) {
            json = a;
        } else {
            snprintf(a, sizeof a, "%s/vocab.json", model);
            snprintf(b, sizeof b, "%s/merges.txt", model);
            vocab = a;
            merges = b;
        }
    }
    dt_tokenizer *tok = NULL;
    dt_status st =
        json ? dt_tokenizer_from_json(json, &tok) : dt_tokenizer_from_files(vocab, merges, &tok);
    if (st != DT_OK) {
        free(input);
        return cli_fail("loading the tokenizer", st);
    }
    int rc = CLI_OK;
    if (dt_tokenizer_vocab_size(tok) > 65536) {
        fprintf(stderr,
                "dtensor tokenize: a vocabulary of %d ids does not fit llm.c's uint16 "
                "token shards (at most 65536)\n",
                (int)dt_tokenizer_vocab_size(tok));
        rc = CLI_BAD_INPUT;
    }
    if (eot < 0)
        eot = find_eot(tok);
    if (rc == CLI_OK && (eot < 0 || eot >= dt_tokenizer_vocab_size(tok))) {
        fprintf(stderr, "dtensor tokenize: no end-of-text token (<|endoftext|>, "
                        "<|end_of_text|>, </s>) in the tokenizer; give --eot ID\n");
        rc = CLI_BAD_INPUT;
    }
    shard_writer w = {.prefix = out, .shard_tokens = shard_tokens, .val_tokens = val_tokens};
    int64_t bufn = shard_tokens > val_tokens ? shard_tokens : val_tokens;
    w.buf = rc == CLI_OK ? malloc((size_t)bufn * sizeof *w.buf) : NULL;
    if (rc == CLI_OK && !w.buf) {
        fprintf(stderr, "dtensor tokenize: no memory for a shard of %lld tokens\n",
                (long long)bufn);
        rc = CLI_BAD_INPUT;
    }
    for (int i = 0; rc == CLI_OK && i < ninput; i++) {
        if (stat(input[i], &sb) != 0) {
            fprintf(stderr, "dtensor tokenize: %s: %s\n", input[i], strerror(errno));
            rc = CLI_BAD_INPUT;
        } else if (S_ISDIR(sb.st_mode)) {
            rc = do_dir(&w, tok, (int32_t)eot, input[i], lines);
        } else {
            rc = do_file(&w, tok, (int32_t)eot, input[i], lines);
        }
    }
    if (rc == CLI_OK)
        rc = flush_shard(&w);
    if (rc == CLI_OK)
        printf("tokens=%lld shards=%d\n", (long long)w.total, w.index);
    free(w.buf);
    free(input);
    dt_tokenizer_destroy(tok);
    return rc;
}
