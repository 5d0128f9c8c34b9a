/* The tokenizer's tables: id -> bytes, bytes -> id, pair -> rank, special tokens, GPT-2's
 * byte-to-unicode mapping (decoded back to bytes on load), and destroy / getters. */
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "text/text_impl.h"

const char dt__tk_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

uint64_t dt__tk_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t pair_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

dt_tokenizer *dt__tk_new(int32_t n_ids)
{
    dt_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->n_ids = n_ids;
    t->tok = calloc((size_t)n_ids + 1, sizeof *t->tok);
    t->tok_len = calloc((size_t)n_ids + 1, sizeof *t->tok_len);
    t->is_special = calloc((size_t)n_ids + 1, 1);
    if (!t->tok || !t->tok_len || !t->is_special || pthread_mutex_init(&t->cache_lock, NULL)) {
        free(t->tok);
        free(t->tok_len);
        free(t->is_special);
        free(t);
        return NULL;
    }
    for (int i = 0; i < 256; i++)
        t->byte_id[i] = -1;
    return t;
}

dt_status dt__tk_set(dt_tokenizer *t, int32_t id, const char *s, size_t len, int special,
                     const char *what)
{
    if (id < 0 || id >= t->n_ids)
        return dt__error(DT_ERR_CORRUPT, "%s: id %d out of range", what, (int)id);
    if (t->tok[id]) {
        if (t->tok_len[id] == len && memcmp(t->tok[id], s, len) == 0) {
            t->is_special[id] |= (uint8_t)special;
            return DT_OK;
        }
        return dt__error(DT_ERR_CORRUPT, "%s: id %d given to two different tokens", what, (int)id);
    }
    if (len == 0)
        return dt__error(DT_ERR_CORRUPT, "%s: id %d is an empty token", what, (int)id);
    char *c = malloc(len);
    if (!c)
        return dt__error(DT_ERR_NO_MEMORY, "%s: token %d", what, (int)id);
    memcpy(c, s, len);
    t->tok[id] = c;
    t->tok_len[id] = (uint32_t)len;
    t->is_special[id] = (uint8_t)special;
    return DT_OK;
}

int32_t dt__tk_lookup(const dt_tokenizer *t, const char *s, size_t len)
{
    if (!t->vocab.slot)
        return -1;
    for (size_t i = dt__tk_hash(s, len) & t->vocab.mask;; i = (i + 1) & t->vocab.mask) {
        int32_t id = t->vocab.slot[i];
        if (id < 0)
            return -1;
        if (t->tok_len[id] == len && memcmp(t->tok[id], s, len) == 0)
            return id;
    }
}

dt_status dt__tk_index(dt_tokenizer *t, const char *what)
{
    size_t cap = 16;
    while (cap < 2 * (size_t)t->n_ids)
        cap *= 2;
    t->vocab.slot = malloc(cap * sizeof *t->vocab.slot);
    if (!t->vocab.slot)
        return dt__error(DT_ERR_NO_MEMORY, "%s: vocabulary index", what);
    memset(t->vocab.slot, 0xff, cap * sizeof *t->vocab.slot);
    t->vocab.mask = cap - 1;
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!t->tok[id] || t->is_special[id])
            continue;
        if (dt__tk_lookup(t, t->tok[id], t->tok_len[id]) >= 0)
            return dt__error(DT_ERR_CORRUPT, "%s: token %d repeats an earlier token", what,
                             (int)id);
        size_t i = dt__tk_hash(t->tok[id], t->tok_len[id]) & t->vocab.mask;
        while (t->vocab.slot[i] >= 0)
            i = (i + 1) & t->vocab.mask;
        t->vocab.slot[i] = id;
        t->vocab.n++;
        if (t->tok_len[id] == 1)
            t->byte_id[(unsigned char)t->tok[id][0]] = id;
    }
    /* Every byte needs a token, or some input could not round-trip. */
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] < 0)
            return dt__error(DT_ERR_CORRUPT, "%s: no token for byte 0x%02x", what, b);
    return DT_OK;
}

static tk_pair *pair_find(const tk_pair_map *m, uint64_t key)
{
    for (size_t i = pair_hash(key) & m->mask;; i = (i + 1) & m->mask)
        if (m->slot[i].key == key || m->slot[i].key == UINT64_MAX)
            return &m->slot[i];
}

static int pair_grow(tk_pair_map *m)
{
    size_t cap = m->slot ? 2 * (m->mask + 1) : 1024;
    tk_pair *s = malloc(cap * sizeof *s);
    if (!s)
        return -1;
    for (size_t i = 0; i < cap; i++)
        s[i].key = UINT64_MAX;
    tk_pair_map n = {s, cap - 1, 0};
    for (size_t i = 0; m->slot && i <= m->mask; i++)
        if (m->slot[i].key != UINT64_MAX) {
            *pair_find(&n, m->slot[i].key) = m->slot[i];
            n.n++;
        }
    free(m->slot);
    *m = n;
    return 0;
}

dt_status dt__tk_add_merge(dt_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                           const char *what, long line)
{
    int32_t ia = dt__tk_lookup(t, a, alen), ib = dt__tk_lookup(t, b, blen);
    char stack[256], *ab = alen + blen <= sizeof stack ? stack : malloc(alen + blen);
    if (!ab)
        return dt__error(DT_ERR_NO_MEMORY, "%s: merge %ld", what, line);
    memcpy(ab, a, alen);
    memcpy(ab + alen, b, blen);
    int32_t iab = dt__tk_lookup(t, ab, alen + blen);
    if (ab != stack)
        free(ab);
    if (ia < 0 || ib < 0 || iab < 0)
        return dt__error(DT_ERR_CORRUPT, "%s: merge %ld: %s is not in the vocabulary", what, line,
                         ia < 0   ? "its left token"
                         : ib < 0 ? "its right token"
                                  : "the merged token");
    if (2 * (t->merges.n + 1) > t->merges.mask + 1 || !t->merges.slot)
        if (pair_grow(&t->merges))
            return dt__error(DT_ERR_NO_MEMORY, "%s: merges", what);
    uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
    tk_pair *p = pair_find(&t->merges, key);
    if (p->key == key)
        return DT_OK; /* a repeated merge keeps its first (lower) rank */
    p->key = key;
    p->rank = (int32_t)t->merges.n++;
    p->merged = iab;
    return DT_OK;
}

dt_status dt__tk_finish_special(dt_tokenizer *t)
{
    int n = 0;
    for (int32_t id = 0; id < t->n_ids; id++)
        n += t->tok[id] && t->is_special[id];
    t->special = malloc(((size_t)n + 1) * sizeof *t->special);
    if (!t->special)
        return dt__error(DT_ERR_NO_MEMORY, "special tokens");
    n = 0;
    for (int32_t id = 0; id < t->n_ids; id++)
        if (t->tok[id] && t->is_special[id]) {
            t->special[n++] = id;
            t->special_first[(unsigned char)t->tok[id][0]] = 1;
        }
    t->n_special = n;
    /* Longest first, so that at one position the longest special token wins (an insertion
     * sort: qsort has no context argument to reach the lengths). */
    for (int i = 1; i < n; i++) {
        int32_t v = t->special[i];
        int j = i;
        while (j > 0 && t->tok_len[t->special[j - 1]] < t->tok_len[v]) {
            t->special[j] = t->special[j - 1];
            j--;
        }
        t->special[j] = v;
    }
    return DT_OK;
}

dt_status dt__tk_set_pattern(dt_tokenizer *t, const char *pattern, const char *what)
{
    int err;
    PCRE2_SIZE off;
    t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return dt__error(DT_ERR_PARSE, "%s: pattern at offset %zu: %s", what, (size_t)off,
                         (const char *)msg);
    }
    /* JIT is an optimisation: where it is missing the interpreter gives the same matches. */
    (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);
    return DT_OK;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
 * bytes for U+0100.. in byte order. unbyte[cp] = byte + 1 for cp < 324, 0 elsewhere. */
static int unbyte_table(int cp)
{
    static short table[324];
    static int ready; /* benign: every thread writes the same values */
    if (!ready) {
        int n = 0;
        for (int b = 0; b < 256; b++) {
            int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
            table[printable ? b : 256 + n++] = (short)(b + 1);
        }
        ready = 1;
    }
    return cp >= 0 && cp < 324 ? table[cp] - 1 : -1;
}

long dt__tk_unbyte(const char *s, size_t len, char *out)
{
    const unsigned char *p = (const unsigned char *)s;
    long n = 0;
    for (size_t i = 0; i < len;) {
        int cp;
        if (p[i] < 0x80) {
            cp = p[i++];
        } else if ((p[i] & 0xe0) == 0xc0 && i + 1 < len && (p[i + 1] & 0xc0) == 0x80) {
            cp = (p[i] & 0x1f) << 6 | (p[i + 1] & 0x3f);
            i += 2;
        } else {
            return -1; /* every mapped code point is below U+0800 */
        }
        int b = unbyte_table(cp);
        if (b < 0)
            return -1;
        out[n++] = (char)b;
    }
    return n;
}

void dt_tokenizer_destroy(dt_tokenizer *tok)
{
    if (!tok)
        return;
    for (int32_t id = 0; id < tok->n_ids; id++)
        free(tok->tok[id]);
    free(tok->tok);
    free(tok->tok_len);
    free(tok->is_special);
    free(tok->vocab.slot);
    free(tok->merges.slot);
    free(tok->special);
    if (tok->re)
        pcre2_code_free(tok->re);
    for (size_t i = 0; tok->cache && i <= tok->cache_mask; i++)
        free(tok->cache[i]);
    free(tok->cache);
    pthread_mutex_destroy(&tok->cache_lock);
    free(tok);
}

int32_t dt_tokenizer_vocab_size(const dt_tokenizer *tok)
{
    return tok ? tok->n_ids : 0;
}

dt_status dt_tokenizer_token(const dt_tokenizer *tok, int32_t id, const char **bytes_out,
                             size_t *len_out)
{
    if (!tok || !bytes_out || !len_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tokenizer_token: NULL argument");
    if (id < 0 || id >= tok->n_ids || !tok->tok[id])
        return dt__error(DT_ERR_NOT_FOUND, "dt_tokenizer_token: no token has id %d", (int)id);
    *bytes_out = tok->tok[id];
    *len_out = tok->tok_len[id];
    return DT_OK;
}

dt_status dt_tokenizer_token_id(const dt_tokenizer *tok, const char *text, size_t len,
                                int32_t *id_out)
{
    if (!tok || !text || !id_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tokenizer_token_id: NULL argument");
    for (int i = 0; i < tok->n_special; i++) {
        int32_t id = tok->special[i];
        if (tok->tok_len[id] == len && memcmp(tok->tok[id], text, len) == 0) {
            *id_out = id;
            return DT_OK;
        }
    }
    int32_t id = dt__tk_lookup(tok, text, len);
    if (id < 0)
        return dt__error(DT_ERR_NOT_FOUND, "dt_tokenizer_token_id: no token of %zu bytes '%.*s'",
                         len, (int)(len > 40 ? 40 : len), text);
    *id_out = id;
    return DT_OK;
}
