/* bench_tokenizer: the tokenizer driven from scripts (tests/text/test_tokenizer_ref.py and
 * bench/tokenizer.sh).
 *   bench_tokenizer (--files VOCAB MERGES | --json TOKENIZER) [--plain] encode SAMPLES
 *       SAMPLES: one sample a line, hex of its bytes; prints one line of ids per sample, and
 *       exits 1 when decode(encode(x)) != x for any sample.
 *   bench_tokenizer (--files ... | --json ...) bench FILE [REPS]
 *       encodes FILE REPS times (default 5) in calls of whole lines of up to 4 KiB: prints
 *       bytes=, tokens=, chunks=, seconds= and mb_s= of the best repetition. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtensor/tokenizer.h"

enum { CHUNK = 4096 };

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what, dt_status st)
{
    fprintf(stderr, "bench_tokenizer: %s: %s: %s\n", what, dt_status_name(st), dt_last_error());
    return 2;
}

static int encode_samples(const dt_tokenizer *tok, unsigned flags, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return 2;
    }
    char *line = NULL, *text = NULL, *back = NULL;
    int32_t *ids = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            n--;
        size_t len = (size_t)n / 2, nids, blen;
        text = realloc(text, len + 1);
        back = realloc(back, len + 1);
        ids = realloc(ids, (len + 1) * sizeof *ids);
        for (size_t i = 0; i < len; i++)
            text[i] = (char)(hexval(line[2 * i]) << 4 | hexval(line[2 * i + 1]));
        dt_status st = dt_tokenizer_encode(tok, text, len, flags, ids, len, &nids);
        if (st != DT_OK)
            return fail("encode", st);
        for (size_t i = 0; i < nids; i++)
            printf(i ? " %d" : "%d", (int)ids[i]);
        printf("\n");
        st = dt_tokenizer_decode(tok, ids, nids, back, len, &blen);
        if (st != DT_OK || blen != len || memcmp(back, text, len) != 0) {
            fprintf(stderr, "bench_tokenizer: round trip failed on sample %.*s\n", (int)n, line);
            rc = 1;
        }
    }
    free(line);
    free(text);
    free(back);
    free(ids);
    fclose(f);
    return rc;
}

static int bench(const dt_tokenizer *tok, unsigned flags, const char *path, int reps)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 1);
    int32_t *ids = malloc(((size_t)len + 1) * sizeof *ids);
    if (!text || !ids || fread(text, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "bench_tokenizer: cannot read %s\n", path);
        return 2;
    }
    fclose(f);
    /* Chunks of whole lines of up to CHUNK bytes (a longer line alone), as js_ref.cjs cuts
     * them: gpt-3-encoder's cost grows with the square of one call's token count. */
    size_t n_chunks = 0, *cut = malloc(((size_t)len + 2) * sizeof *cut);
    cut[n_chunks++] = 0;
    for (size_t a = 0; a < (size_t)len;) {
        size_t b = a;
        for (;;) {
            char *nl = memchr(text + b, '\n', (size_t)len - b);
            size_t e = nl ? (size_t)(nl - text) + 1 : (size_t)len;
            if (b > a && e - a > CHUNK)
                break;
            b = e;
            if (b == (size_t)len)
                break;
        }
        cut[n_chunks++] = b;
        a = b;
    }
    double best = 1e30;
    size_t nids = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        nids = 0;
        for (size_t c = 0; c + 1 < n_chunks; c++) {
            size_t n;
            dt_status st = dt_tokenizer_encode(tok, text + cut[c], cut[c + 1] - cut[c], flags, ids,
                                               (size_t)len, &n);
            if (st != DT_OK)
                return fail("encode", st);
            nids += n;
        }
        double dt = now() - t0;
        if (dt < best)
            best = dt;
    }
    free(cut);
    printf("bytes=%ld tokens=%zu chunks=%zu seconds=%.6f mb_s=%.2f\n", len, nids, n_chunks - 1,
           best, (double)len / best / 1e6);
    free(text);
    free(ids);
    return 0;
}

int main(int argc, char **argv)
{
    dt_tokenizer *tok = NULL;
    unsigned flags = 0;
    int i = 1;
    dt_status st = DT_ERR_INVALID_ARGUMENT;
    if (i + 2 < argc && strcmp(argv[i], "--files") == 0) {
        st = dt_tokenizer_from_files(argv[i + 1], argv[i + 2], &tok);
        i += 3;
    } else if (i + 1 < argc && strcmp(argv[i], "--json") == 0) {
        st = dt_tokenizer_from_json(argv[i + 1], &tok);
        i += 2;
    } else {
        fprintf(stderr, "usage: bench_tokenizer (--files VOCAB MERGES | --json FILE) [--plain] "
                        "(encode SAMPLES | bench FILE [REPS])\n");
        return 2;
    }
    if (st != DT_OK)
        return fail("load", st);
    if (i < argc && strcmp(argv[i], "--plain") == 0) {
        flags |= DT_TOKENIZER_ENCODE_PLAIN;
        i++;
    }
    int rc = 2;
    if (i + 1 < argc && strcmp(argv[i], "encode") == 0)
        rc = encode_samples(tok, flags, argv[i + 1]);
    else if (i + 1 < argc && strcmp(argv[i], "bench") == 0)
        rc = bench(tok, flags, argv[i + 1], i + 2 < argc ? atoi(argv[i + 2]) : 5);
    else
        fprintf(stderr, "bench_tokenizer: encode SAMPLES or bench FILE [REPS]\n");
    dt_tokenizer_destroy(tok);
    return rc;
}
