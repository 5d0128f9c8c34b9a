/* gpt/names: reads, splits and encodes the names (see names.h). */
#include "names.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../train/rng.h"

int names_token(char c)
{
    if (c == '.')
        return 0;
    if (c >= 'a' && c <= 'z')
        return 1 + (c - 'a');
    if (c == '-')
        return 27;
    return -1;
}

char names_char(int token)
{
    return token == 0 ? '.' : token == 27 ? '-' : (char)('a' + token - 1);
}

void names_free(names *n)
{
    free(n->s);
    n->s = NULL;
    n->n = 0;
}

int names_load(const char *path, names *out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open", path);
        return -1;
    }
    int64_t cap = 1024, n = 0, line = 0;
    char buf[256];
    out->s = malloc((size_t)cap * sizeof *out->s);
    int rc = out->s ? 0 : -1;
    if (rc)
        snprintf(err, errlen, "out of memory");
    while (rc == 0 && fgets(buf, sizeof buf, f)) {
        line++;
        size_t len = strcspn(buf, "\r\n");
        buf[len] = '\0';
        if (len == 0)
            continue;
        int ok = len <= NAMES_MAX_LEN;
        for (size_t i = 0; ok && i < len; i++)
            ok = names_token(buf[i]) > 0;
        if (!ok) {
            snprintf(err, errlen, "%s:%lld: '%.40s' is not a name of 1..%d letters a-z or '-'",
                     path, (long long)line, buf, NAMES_MAX_LEN);
            rc = -1;
            break;
        }
        if (n == cap) {
            void *p = realloc(out->s, (size_t)(cap *= 2) * sizeof *out->s);
            if (!p) {
                snprintf(err, errlen, "out of memory");
                rc = -1;
                break;
            }
            out->s = p;
        }
        memcpy(out->s[n++], buf, len + 1);
    }
    fclose(f);
    out->n = n;
    if (rc == 0 && n == 0) {
        snprintf(err, errlen, "%s: no names", path);
        rc = -1;
    }
    if (rc)
        names_free(out);
    return rc;
}

int names_split(const names *all, int64_t heldout, uint64_t seed, names *train, names *test)
{
    int32_t *perm = malloc((size_t)all->n * sizeof *perm);
    train->s = malloc((size_t)(all->n - heldout) * sizeof *train->s);
    test->s = malloc((size_t)(heldout > 0 ? heldout : 1) * sizeof *test->s);
    if (!perm || !train->s || !test->s) {
        free(perm);
        names_free(train);
        names_free(test);
        return -1;
    }
    for (int64_t i = 0; i < all->n; i++)
        perm[i] = (int32_t)i;
    rng r;
    rng_seed(&r, seed);
    rng_shuffle(&r, perm, all->n);
    test->n = heldout;
    train->n = all->n - heldout;
    for (int64_t i = 0; i < all->n; i++)
        memcpy(i < heldout ? test->s[i] : train->s[i - heldout], all->s[perm[i]],
               sizeof *all->s);
    free(perm);
    return 0;
}

int64_t names_encode(const names *set, const int32_t *rows, int64_t count, int32_t *x,
                     int32_t *y)
{
    int64_t targets = 0;
    for (int64_t i = 0; i < count; i++) {
        const char *s = set->s[rows ? rows[i] : i];
        int64_t len = (int64_t)strlen(s);
        int32_t *xi = x + i * NAMES_CONTEXT, *yi = y + i * NAMES_CONTEXT;
        for (int64_t t = 0; t < NAMES_CONTEXT; t++) {
            xi[t] = t == 0 ? 0 : (t <= len ? names_token(s[t - 1]) : 0);
            yi[t] = t < len ? names_token(s[t]) : (t == len ? 0 : -1);
        }
        targets += len + 1;
    }
    return targets;
}

int64_t names_pack(const names *set, int32_t **out)
{
    int64_t len = 1;
    for (int64_t i = 0; i < set->n; i++)
        len += (int64_t)strlen(set->s[i]) + 1;
    int32_t *s = malloc((size_t)len * sizeof *s);
    if (!s)
        return -1;
    int64_t k = 0;
    s[k++] = 0;
    for (int64_t i = 0; i < set->n; i++) {
        for (const char *c = set->s[i]; *c; c++)
            s[k++] = names_token(*c);
        s[k++] = 0;
    }
    *out = s;
    return len;
}

void names_window(const int32_t *stream, int64_t T, int64_t i, int32_t *x, int32_t *y)
{
    memcpy(x, stream + i * T, (size_t)T * sizeof *x);
    memcpy(y, stream + i * T + 1, (size_t)T * sizeof *y);
}
