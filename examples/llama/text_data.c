/* llama/text_data: text files tokenised into an in-memory token stream served as llm.c-style
 * examples through a dataset callback source (text_data.h). */
#include "text_data.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct text_data {
    int32_t *tok;
    int64_t n, cap, context;
};

void text_data_destroy(text_data *d)
{
    if (!d)
        return;
    free(d->tok);
    free(d);
}

int64_t text_data_tokens(const text_data *d)
{
    return d->n;
}

int32_t text_data_eot(const dt_tokenizer *tok)
{
    static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};
    int32_t id;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (dt_tokenizer_token_id(tok, names[i], strlen(names[i]), &id) == DT_OK)
            return id;
    return -1;
}

static dt_status grow(text_data *d, int64_t more)
{
    if (d->n + more <= d->cap)
        return DT_OK;
    int64_t cap = d->cap ? d->cap : 1 << 16;
    while (cap < d->n + more)
        cap *= 2;
    int32_t *t = realloc(d->tok, (size_t)cap * sizeof *t);
    if (!t)
        return DT_ERR_NO_MEMORY;
    d->tok = t;
    d->cap = cap;
    return DT_OK;
}

static dt_status document(text_data *d, const dt_tokenizer *tok, int32_t eot, const char *text,
                          size_t len)
{
    size_t n = 0;
    dt_status st = grow(d, (int64_t)len + 65);
    if (st == DT_OK)
        d->tok[d->n++] = eot;
    if (st == DT_OK)
        st = dt_tokenizer_encode(tok, text, len, 0, d->tok + d->n, len + 64, &n);
    if (st == DT_OK)
        d->n += (int64_t)n;
    return st;
}

static dt_status one_file(text_data *d, const dt_tokenizer *tok, int32_t eot, const char *path,
                          int lines)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return DT_ERR_IO;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)(len > 0 ? len : 1));
    dt_status st = text ? DT_OK : DT_ERR_NO_MEMORY;
    if (st == DT_OK && len > 0 && fread(text, 1, (size_t)len, f) != (size_t)len)
        st = DT_ERR_IO;
    fclose(f);
    if (st == DT_OK && !lines) {
        st = document(d, tok, eot, text, (size_t)len);
    } else if (st == DT_OK) {
        long at = 0;
        while (st == DT_OK && at < len) {
            long end = at;
            while (end < len && text[end] != '\n')
                end++;
            if (end > at)
                st = document(d, tok, eot, text + at, (size_t)(end - at));
            at = end + 1;
        }
    }
    free(text);
    return st;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

dt_status text_data_load(const dt_tokenizer *tok, const char *path, int lines, int32_t eot,
                         int64_t context, text_data **out)
{
    text_data *d = calloc(1, sizeof *d);
    if (!d)
        return DT_ERR_NO_MEMORY;
    d->context = context;
    struct stat sb;
    dt_status st = stat(path, &sb) == 0 ? DT_OK : DT_ERR_IO;
    if (st == DT_OK && S_ISDIR(sb.st_mode)) {
        DIR *dir = opendir(path);
        char **names = NULL;
        size_t n = 0;
        struct dirent *e;
        while (dir && (e = readdir(dir)) != NULL) {
            char **nn = e->d_name[0] == '.' ? names : realloc(names, (n + 1) * sizeof *names);
            if (!nn)
                break;
            names = nn;
            if (e->d_name[0] != '.')
                names[n++] = strdup(e->d_name);
        }
        if (dir)
            closedir(dir);
        else
            st = DT_ERR_IO;
        qsort(names, n, sizeof *names, by_name);
        for (size_t i = 0; i < n; i++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", path, names[i]);
            if (st == DT_OK && stat(p, &sb) == 0 && S_ISREG(sb.st_mode))
                st = one_file(d, tok, eot, p, lines);
            free(names[i]);
        }
        free(names);
    } else if (st == DT_OK) {
        st = one_file(d, tok, eot, path, lines);
    }
    if (st == DT_OK && (context < 1 || d->n < context + 1))
        st = DT_ERR_INVALID_ARGUMENT;
    if (st != DT_OK) {
        text_data_destroy(d);
        return st;
    }
    *out = d;
    return DT_OK;
}

static dt_status fill(void *arg, int64_t index, void *const *fields)
{
    const text_data *d = arg;
    const int32_t *at = d->tok + index * d->context;
    if (fields[0])
        memcpy(fields[0], at, (size_t)d->context * sizeof *at);
    if (fields[1])
        memcpy(fields[1], at + 1, (size_t)d->context * sizeof *at);
    return DT_OK;
}

dt_status text_data_source(text_data *d, dt_data_source **out)
{
    dt_data_field f[2];
    for (int k = 0; k < 2; k++)
        f[k] = (dt_data_field){.dtype = DT_DTYPE_I32, .rank = 1, .shape = {d->context}};
    return dt_data_source_callback((d->n - 1) / d->context, 2, f, fill, d, out);
}
