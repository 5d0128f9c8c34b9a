/* Encoding: special tokens matched first, then the pattern's pieces (PCRE2), each merged by
 * rank (a min-heap of (rank, position) over a linked list), with a cache of words; decoding. */
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "text/text_impl.h"

enum { CACHE_SLOTS = 1 << 16, CACHE_MAX_WORD = 256 };

/* A growable id buffer. */
typedef struct ids_buf {
    int32_t *v;
    size_t n, cap;
} ids_buf;

static int push_id(ids_buf *b, int32_t id)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        int32_t *v = realloc(b->v, cap * sizeof *v);
        if (!v)
            return -1;
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = id;
    return 0;
}

static const tk_pair *merge_of(const dt_tokenizer *t, int32_t a, int32_t b)
{
    const tk_pair_map *m = &t->merges;
    if (!m->slot)
        return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b, k = key;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    for (size_t i = k & m->mask;; i = (i + 1) & m->mask) {
        if (m->slot[i].key == key)
            return &m->slot[i];
        if (m->slot[i].key == UINT64_MAX)
            return NULL;
    }
}

/* Heap entries: rank in the high half, start position in the low half, so the smallest
 * value is the lowest rank, leftmost on ties (HF's and GPT-2's order). */
static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1] < h[c])
            c++;
        if (h[c] >= v)
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

/* BPE over w[0..len): appends the ids to out. scratch holds 5 * len words. */
static int bpe_word(const dt_tokenizer *t, const unsigned char *w, size_t len, ids_buf *out,
                    uint64_t *scratch)
{
    int32_t *id = (int32_t *)scratch;
    int32_t *next = id + len, *prev = next + len;
    uint64_t *heap = scratch + 2 * len;
    size_t nh = 0;
    for (size_t i = 0; i < len; i++) {
        id[i] = t->byte_id[w[i]];
        next[i] = i + 1 < len ? (int32_t)(i + 1) : -1;
        prev[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < len; i++) {
        const tk_pair *p = merge_of(t, id[i], id[i + 1]);
        if (p)
            heap_push(heap, &nh, (uint64_t)(uint32_t)p->rank << 32 | i);
    }
    while (nh > 0) {
        uint64_t e = heap_pop(heap, &nh);
        int32_t i = (int32_t)(uint32_t)e, rank = (int32_t)(e >> 32);
        /* Stale entries: the left symbol was merged away (id -1) or its pair changed. Ranks
         * are unique per pair, so an equal rank means the same pair, still to be merged. */
        if (id[i] < 0 || next[i] < 0)
            continue;
        const tk_pair *p = merge_of(t, id[i], id[next[i]]);
        if (!p || p->rank != rank)
            continue;
        int32_t j = next[i];
        id[i] = p->merged;
        id[j] = -1;
        next[i] = next[j];
        if (next[j] >= 0)
            prev[next[j]] = i;
        if (prev[i] >= 0 && (p = merge_of(t, id[prev[i]], id[i])))
            heap_push(heap, &nh, (uint64_t)(uint32_t)p->rank << 32 | (uint32_t)prev[i]);
        if (next[i] >= 0 && (p = merge_of(t, id[i], id[next[i]])))
            heap_push(heap, &nh, (uint64_t)(uint32_t)p->rank << 32 | (uint32_t)i);
    }
    for (int32_t i = 0; i >= 0; i = next[i])
        if (push_id(out, id[i]))
            return -1;
    return 0;
}

static int32_t *cached_ids(tk_cached *c)
{
    return (int32_t *)(c + 1);
}
static char *cached_bytes(tk_cached *c)
{
    return (char *)(cached_ids(c) + c->n_ids);
}

/* Appends the ids of one word, through the cache. */
static int encode_word(const dt_tokenizer *tc, const unsigned char *w, size_t len, ids_buf *out,
                       uint64_t **scratch, size_t *scratch_len)
{
    dt_tokenizer *t = (dt_tokenizer *)tc; /* the cache is the one mutable part, locked */
    if (t->ignore_merges) {
        int32_t id = dt__tk_lookup(t, (const char *)w, len);
        if (id >= 0)
            return push_id(out, id);
    }
    if (len == 1)
        return push_id(out, t->byte_id[w[0]]);
    uint64_t h = dt__tk_hash((const char *)w, len);
    int cacheable = len <= CACHE_MAX_WORD;
    if (cacheable) {
        pthread_mutex_lock(&t->cache_lock);
        tk_cached *c = t->cache ? t->cache[h & t->cache_mask] : NULL;
        if (c && c->hash == h && c->len == len && memcmp(cached_bytes(c), w, len) == 0) {
            for (uint32_t k = 0; k < c->n_ids; k++)
                if (push_id(out, cached_ids(c)[k])) {
                    pthread_mutex_unlock(&t->cache_lock);
                    return -1;
                }
            pthread_mutex_unlock(&t->cache_lock);
            return 0;
        }
        pthread_mutex_unlock(&t->cache_lock);
    }
    if (*scratch_len < 5 * len) {
        uint64_t *s = realloc(*scratch, 5 * len * sizeof *s);
        if (!s)
            return -1;
        *scratch = s;
        *scratch_len = 5 * len;
    }
    size_t first = out->n;
    if (bpe_word(t, w, len, out, *scratch))
        return -1;
    if (!cacheable)
        return 0;
    size_t n = out->n - first;
    tk_cached *c = malloc(sizeof *c + n * sizeof(int32_t) + len);
    if (!c)
        return 0; /* the cache is an optimisation */
    c->len = (uint32_t)len;
    c->n_ids = (uint32_t)n;
    c->hash = h;
    memcpy(cached_ids(c), out->v + first, n * sizeof(int32_t));
    memcpy(cached_bytes(c), w, len);
    pthread_mutex_lock(&t->cache_lock);
    if (!t->cache && (t->cache = calloc(CACHE_SLOTS, sizeof *t->cache)))
        t->cache_mask = CACHE_SLOTS - 1;
    if (t->cache) {
        /* Direct-mapped: a colliding word replaces the one there. */
        free(t->cache[h & t->cache_mask]);
        t->cache[h & t->cache_mask] = c;
    } else {
        free(c);
    }
    pthread_mutex_unlock(&t->cache_lock);
    return 0;
}

/* Splits s[0..len) (no special tokens inside) by the pattern and encodes each piece; bytes
 * the pattern does not match (only invalid UTF-8 for the families we load) form pieces of
 * their own. */
static dt_status split_text(const dt_tokenizer *t, const unsigned char *s, size_t len,
                            pcre2_match_data *md, ids_buf *out, uint64_t **scratch,
                            size_t *scratch_len)
{
    size_t pos = 0;
    while (pos < len) {
        int rc = pcre2_match(t->re, s, len, pos, 0, md, NULL);
        size_t a = len, b = len;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            a = ov[0];
            b = ov[1];
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return dt__error(DT_ERR_SYSTEM, "dt_tokenizer_encode: pattern match at byte %zu: %s",
                             pos, (const char *)msg);
        }
        if (a > pos && encode_word(t, s + pos, a - pos, out, scratch, scratch_len))
            return dt__error(DT_ERR_NO_MEMORY, "dt_tokenizer_encode");
        if (b == a) { /* an empty match: step over one byte, as a piece of its own */
            if (a < len && encode_word(t, s + a, 1, out, scratch, scratch_len))
                return dt__error(DT_ERR_NO_MEMORY, "dt_tokenizer_encode");
            b = a + 1;
        } else if (encode_word(t, s + a, b - a, out, scratch, scratch_len)) {
            return dt__error(DT_ERR_NO_MEMORY, "dt_tokenizer_encode");
        }
        pos = b;
    }
    return DT_OK;
}

/* split_text after the normalizer, when the tokenizer has one (HF normalises the text
 * between the special tokens, which are matched on the raw text). */
static dt_status encode_text(const dt_tokenizer *t, const unsigned char *s, size_t len,
                             pcre2_match_data *md, ids_buf *out, uint64_t **scratch,
                             size_t *scratch_len)
{
    char *norm = NULL;
    size_t norm_len = 0;
    if (t->nfc && len > 0) {
        dt_status st = dt__tk_nfc((const char *)s, len, &norm, &norm_len);
        if (st != DT_OK)
            return st;
    }
    dt_status st =
        norm ? split_text(t, (const unsigned char *)norm, norm_len, md, out, scratch, scratch_len)
             : split_text(t, s, len, md, out, scratch, scratch_len);
    free(norm);
    return st;
}

/* The special token starting at s[0], longest first; -1 when none. */
static int32_t special_at(const dt_tokenizer *t, const unsigned char *s, size_t left)
{
    for (int k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        if (t->tok_len[id] <= left && memcmp(t->tok[id], s, t->tok_len[id]) == 0)
            return id;
    }
    return -1;
}

dt_status dt_tokenizer_encode(const dt_tokenizer *tok, const char *text, size_t len, unsigned flags,
                              int32_t *ids, size_t cap, size_t *n_out)
{
    if (!tok || !n_out || (!text && len > 0) || (!ids && cap > 0))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tokenizer_encode: NULL argument");
    if (flags & ~(unsigned)DT_TOKENIZER_ENCODE_PLAIN)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tokenizer_encode: unknown flags 0x%x", flags);
    const unsigned char *s = (const unsigned char *)text;
    ids_buf out = {0};
    uint64_t *scratch = NULL;
    size_t scratch_len = 0;
    dt_status st = DT_OK;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(tok->re, NULL);
    if (!md)
        return dt__error(DT_ERR_NO_MEMORY, "dt_tokenizer_encode: match data");
    int specials = tok->n_special > 0 && !(flags & DT_TOKENIZER_ENCODE_PLAIN);
    size_t start = 0;
    for (size_t i = 0; specials && i < len; i++) {
        if (!tok->special_first[s[i]])
            continue;
        int32_t id = special_at(tok, s + i, len - i);
        if (id < 0)
            continue;
        st = encode_text(tok, s + start, i - start, md, &out, &scratch, &scratch_len);
        if (st != DT_OK)
            goto out;
        if (push_id(&out, id)) {
            st = dt__error(DT_ERR_NO_MEMORY, "dt_tokenizer_encode");
            goto out;
        }
        i += tok->tok_len[id] - 1;
        start = i + 1;
    }
    if (start < len)
        st = encode_text(tok, s + start, len - start, md, &out, &scratch, &scratch_len);
    if (st != DT_OK)
        goto out;
    if (ids || cap) {
        if (out.n > cap) {
            st = dt__error(DT_ERR_INVALID_ARGUMENT,
                           "dt_tokenizer_encode: %zu ids do not fit in %zu", out.n, cap);
            goto out;
        }
        if (out.n)
            memcpy(ids, out.v, out.n * sizeof *ids);
    }
    *n_out = out.n;
out:
    pcre2_match_data_free(md);
    free(scratch);
    free(out.v);
    return st;
}

dt_status dt_tokenizer_decode(const dt_tokenizer *tok, const int32_t *ids, size_t n, char *buf,
                              size_t cap, size_t *len_out)
{
    if (!tok || !len_out || (!ids && n > 0) || (!buf && cap > 0))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tokenizer_decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_ids || !tok->tok[ids[i]])
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "dt_tokenizer_decode: ids[%zu] = %d is no token", i, (int)ids[i]);
        total += tok->tok_len[ids[i]];
    }
    if (buf || cap) {
        if (total > cap)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "dt_tokenizer_decode: %zu bytes do not fit in %zu", total, cap);
        char *p = buf;
        for (size_t i = 0; i < n; i++) {
            memcpy(p, tok->tok[ids[i]], tok->tok_len[ids[i]]);
            p += tok->tok_len[ids[i]];
        }
    }
    *len_out = total;
    return DT_OK;
}
