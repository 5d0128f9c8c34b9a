/* The NFC normalizer of tokenizer.json (Qwen2): each run of valid UTF-8 normalised with ICU,
 * bytes of invalid UTF-8 passed through unchanged (HF never sees them). */
#include <stdlib.h>
#include <string.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "runtime/error.h"
#include "text/text_impl.h"

/* Length of the valid UTF-8 sequence at p (at most `left` bytes), 0 when invalid. */
static size_t utf8_len(const unsigned char *p, size_t left)
{
    if (p[0] < 0x80)
        return 1;
    size_t n = p[0] >= 0xc2 && p[0] <= 0xdf   ? 2
               : p[0] >= 0xe0 && p[0] <= 0xef ? 3
               : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4
                                              : 0;
    if (n == 0 || n > left)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    /* overlong 3- and 4-byte forms, surrogates, above U+10FFFF */
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) ||
        (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))
        return 0;
    return n;
}

typedef struct byte_buf {
    char *v;
    size_t n, cap;
} byte_buf;

static int reserve(byte_buf *b, size_t extra)
{
    if (b->n + extra <= b->cap && b->v)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra)
        cap *= 2;
    char *v = realloc(b->v, cap);
    if (!v)
        return -1;
    b->v = v;
    b->cap = cap;
    return 0;
}

static int put(byte_buf *b, const char *s, size_t len)
{
    if (reserve(b, len))
        return -1;
    memcpy(b->v + b->n, s, len);
    b->n += len;
    return 0;
}

/* NFC of one valid UTF-8 run, appended to out. */
static dt_status nfc_run(const char *s, size_t len, byte_buf *out)
{
    UErrorCode err = U_ZERO_ERROR;
    const UNormalizer2 *nfc = unorm2_getNFCInstance(&err);
    if (U_FAILURE(err))
        return dt__error(DT_ERR_SYSTEM, "NFC normalizer: %s", u_errorName(err));
    /* UTF-16 is never longer (in units) than UTF-8 (in bytes); NFC mostly composes but may
     * grow a string: room for 3x, retried once at the size ICU asks for. */
    int32_t n16 = 0, cap = (int32_t)len + 1;
    UChar *a = malloc((size_t)cap * sizeof *a), *b = NULL;
    dt_status st = DT_OK;
    if (!a) {
        st = dt__error(DT_ERR_NO_MEMORY, "NFC normalizer");
        goto out;
    }
    u_strFromUTF8(a, cap, &n16, s, (int32_t)len, &err);
    if (U_FAILURE(err)) {
        st = dt__error(DT_ERR_SYSTEM, "NFC normalizer: %s", u_errorName(err));
        goto out;
    }
    int32_t bcap = 3 * n16 + 16, nb = 0;
    for (int tries = 0; tries < 2; tries++) {
        free(b);
        b = malloc((size_t)bcap * sizeof *b);
        if (!b) {
            st = dt__error(DT_ERR_NO_MEMORY, "NFC normalizer");
            goto out;
        }
        err = U_ZERO_ERROR;
        nb = unorm2_normalize(nfc, a, n16, b, bcap, &err);
        if (err != U_BUFFER_OVERFLOW_ERROR)
            break;
        bcap = nb + 1;
    }
    if (U_FAILURE(err)) {
        st = dt__error(DT_ERR_SYSTEM, "NFC normalizer: %s", u_errorName(err));
        goto out;
    }
    int32_t n8 = 0;
    err = U_ZERO_ERROR;
    u_strToUTF8(NULL, 0, &n8, b, nb, &err); /* measures: U_BUFFER_OVERFLOW_ERROR expected */
    if (reserve(out, (size_t)n8)) {
        st = dt__error(DT_ERR_NO_MEMORY, "NFC normalizer");
        goto out;
    }
    err = U_ZERO_ERROR;
    u_strToUTF8(out->v + out->n, (int32_t)(out->cap - out->n), &n8, b, nb, &err);
    if (U_FAILURE(err)) {
        st = dt__error(DT_ERR_SYSTEM, "NFC normalizer: %s", u_errorName(err));
        goto out;
    }
    out->n += (size_t)n8;
out:
    free(a);
    free(b);
    return st;
}

dt_status dt__tk_nfc(const char *s, size_t len, char **out, size_t *out_len)
{
    size_t i = 0;
    while (i < len && (unsigned char)s[i] < 0x80)
        i++;
    if (i == len) { /* ASCII is NFC already */
        *out = NULL;
        return DT_OK;
    }
    byte_buf b = {0};
    size_t run = 0; /* start of the current valid run */
    dt_status st = DT_OK;
    for (i = 0; i < len && st == DT_OK;) {
        size_t n = utf8_len((const unsigned char *)s + i, len - i);
        if (n) {
            i += n;
            continue;
        }
        if (i > run)
            st = nfc_run(s + run, i - run, &b);
        if (st == DT_OK && put(&b, s + i, 1))
            st = dt__error(DT_ERR_NO_MEMORY, "NFC normalizer");
        run = ++i;
    }
    if (st == DT_OK && len > run)
        st = nfc_run(s + run, len - run, &b);
    if (st != DT_OK) {
        free(b.v);
        return st;
    }
    if (reserve(&b, 1)) { /* a buffer even for an empty result */
        free(b.v);
        return dt__error(DT_ERR_NO_MEMORY, "NFC normalizer");
    }
    *out = b.v;
    *out_len = b.n;
    return DT_OK;
}
