/* train/digits: loads the digits CSV through zlib's gz reader (which reads plain files too),
 * checking every field, and makes the fixed train / held-out split. */
#include "digits.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "rng.h"

/* The split never changes with --seed: the held-out rows are the same in every run. */
#define SPLIT_SEED 0x5eed0f0d1917ULL

/* Parses one CSV line into 65 integers. Returns 0, or -1 with a message naming the field. */
static int parse_row(char *line, int *vals, char *why, size_t whylen)
{
    char *p = line;
    for (int f = 0; f <= DIGITS_FEATURES; f++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno) {
            snprintf(why, whylen, "field %d: expected an integer", f + 1);
            return -1;
        }
        int lo = 0, hi = f < DIGITS_FEATURES ? 16 : DIGITS_CLASSES - 1;
        if (v < lo || v > hi) {
            snprintf(why, whylen, "field %d: %ld is not in %d..%d", f + 1, v, lo, hi);
            return -1;
        }
        vals[f] = (int)v;
        p = end;
        while (*p == ' ' || *p == '\t')
            p++;
        if (f < DIGITS_FEATURES) {
            if (*p != ',') {
                snprintf(why, whylen, "expected %d comma-separated fields, found %d",
                         DIGITS_FEATURES + 1, f + 1);
                return -1;
            }
            p++;
        }
    }
    if (*p != '\0' && *p != '\n' && *p != '\r') {
        snprintf(why, whylen, "expected %d fields, found more", DIGITS_FEATURES + 1);
        return -1;
    }
    return 0;
}

static int grow(digits *d, int64_t *cap)
{
    int64_t ncap = *cap ? 2 * *cap : 2048;
    float *x = realloc(d->x, (size_t)ncap * DIGITS_FEATURES * sizeof *x);
    if (!x)
        return -1;
    d->x = x;
    int32_t *y = realloc(d->y, (size_t)ncap * sizeof *y);
    if (!y)
        return -1;
    d->y = y;
    *cap = ncap;
    return 0;
}

int digits_load(const char *path, digits *out, char *err, size_t errlen)
{
    gzFile f = gzopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path,
                 errno ? strerror(errno) : "out of memory");
        return -1;
    }
    digits d = {0, NULL, NULL};
    int64_t cap = 0, lineno = 0;
    char line[1024], why[128];
    int vals[DIGITS_FEATURES + 1];
    int rc = -1;
    while (gzgets(f, line, sizeof line)) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            snprintf(err, errlen, "%s:%lld: line too long", path, (long long)lineno);
            goto out;
        }
        if (line[0] == '\n' || (line[0] == '\r' && line[1] == '\n'))
            continue;
        if (parse_row(line, vals, why, sizeof why) != 0) {
            snprintf(err, errlen, "%s:%lld: %s", path, (long long)lineno, why);
            goto out;
        }
        if (d.n == cap && grow(&d, &cap) != 0) {
            snprintf(err, errlen, "%s: out of memory", path);
            goto out;
        }
        for (int j = 0; j < DIGITS_FEATURES; j++)
            d.x[d.n * DIGITS_FEATURES + j] = (float)vals[j] / 16.0f;
        d.y[d.n] = vals[DIGITS_FEATURES];
        d.n++;
    }
    int zerr;
    const char *msg = gzerror(f, &zerr);
    if (zerr != Z_OK && zerr != Z_STREAM_END) {
        snprintf(err, errlen, "%s: read error: %s", path, msg);
        goto out;
    }
    if (d.n == 0) {
        snprintf(err, errlen, "%s: no rows", path);
        goto out;
    }
    *out = d;
    rc = 0;
out:
    gzclose(f);
    if (rc != 0)
        digits_free(&d);
    return rc;
}

static int take(const digits *all, const int32_t *rows, int64_t n, digits *out)
{
    out->n = n;
    out->x = malloc((size_t)(n ? n : 1) * DIGITS_FEATURES * sizeof *out->x);
    out->y = malloc((size_t)(n ? n : 1) * sizeof *out->y);
    if (!out->x || !out->y) {
        digits_free(out);
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        memcpy(out->x + i * DIGITS_FEATURES, all->x + (int64_t)rows[i] * DIGITS_FEATURES,
               DIGITS_FEATURES * sizeof *out->x);
        out->y[i] = all->y[rows[i]];
    }
    return 0;
}

int digits_split(const digits *all, digits *train, digits *held_out, char *err, size_t errlen)
{
    if (all->n <= 2 * DIGITS_HELD_OUT || all->n > INT32_MAX) {
        snprintf(err, errlen, "data: %lld rows; need more than %d", (long long)all->n,
                 2 * DIGITS_HELD_OUT);
        return -1;
    }
    int32_t *perm = malloc((size_t)all->n * sizeof *perm);
    if (!perm) {
        snprintf(err, errlen, "data: out of memory");
        return -1;
    }
    for (int64_t i = 0; i < all->n; i++)
        perm[i] = (int32_t)i;
    rng r;
    rng_seed(&r, SPLIT_SEED);
    rng_shuffle(&r, perm, all->n);
    int64_t ntrain = all->n - DIGITS_HELD_OUT;
    int rc = 0;
    if (take(all, perm, ntrain, train) != 0) {
        rc = -1;
    } else if (take(all, perm + ntrain, DIGITS_HELD_OUT, held_out) != 0) {
        digits_free(train);
        rc = -1;
    }
    if (rc != 0)
        snprintf(err, errlen, "data: out of memory");
    free(perm);
    return rc;
}

void digits_free(digits *d)
{
    free(d->x);
    free(d->y);
    d->x = NULL;
    d->y = NULL;
    d->n = 0;
}
