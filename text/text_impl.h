/* The tokenizer's private state: id -> bytes, bytes -> id and pair -> rank tables, the
 * special tokens, the compiled pattern and the word cache. Not installed. */
#ifndef DTENSOR_TEXT_IMPL_H
#define DTENSOR_TEXT_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "dtensor/tokenizer.h"

/* bytes -> id, open addressing; keys point into the tokenizer's token bytes. */
typedef struct tk_str_map {
    int32_t *slot; /* -1 empty, else an id */
    size_t mask;
    size_t n;
} tk_str_map;

/* (left id, right id) -> rank and merged id, open addressing. */
typedef struct tk_pair {
    uint64_t key; /* left << 32 | right; UINT64_MAX empty */
    int32_t rank, merged;
} tk_pair;
typedef struct tk_pair_map {
    tk_pair *slot;
    size_t mask;
    size_t n;
} tk_pair_map;

/* A cached word: its bytes and its ids, one allocation. */
typedef struct tk_cached {
    uint32_t len, n_ids;
    uint64_t hash;
    /* int32_t ids[n_ids] then char bytes[len] follow */
} tk_cached;

struct dt_tokenizer {
    int32_t n_ids;       /* one more than the largest id */
    char **tok;          /* [n_ids]: token bytes, NULL for an unused id */
    uint32_t *tok_len;   /* [n_ids] */
    uint8_t *is_special; /* [n_ids] */
    tk_str_map vocab;    /* model vocabulary (not the special tokens) */
    int32_t byte_id[256];
    tk_pair_map merges;
    int32_t *special; /* ids of the special tokens, longest first */
    int n_special;
    uint8_t special_first[256]; /* 1 where a special token starts with this byte */
    int ignore_merges;
    int nfc; /* the normalizer: NFC (Qwen2) */
    pcre2_code *re;
    /* Word cache: bytes -> ids; cleared when full. */
    pthread_mutex_t cache_lock;
    tk_cached **cache;
    size_t cache_mask, cache_n;
};

uint64_t dt__tk_hash(const char *s, size_t len);
/* A new empty tokenizer with room for n_ids ids (all unused). NULL on no memory. */
dt_tokenizer *dt__tk_new(int32_t n_ids);
/* Sets token `id` to bytes s[0..len) (copied). DT_ERR_CORRUPT when id is taken by other
 * bytes or out of range (what names the source for the detail). */
dt_status dt__tk_set(dt_tokenizer *t, int32_t id, const char *s, size_t len, int special,
                     const char *what);
/* Builds the bytes -> id map and byte_id from the vocabulary tokens; DT_ERR_CORRUPT when a
 * byte has no token. */
dt_status dt__tk_index(dt_tokenizer *t, const char *what);
/* Adds merge (a, b) with the next rank; DT_ERR_CORRUPT when a, b or a+b is not a token. */
dt_status dt__tk_add_merge(dt_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                           const char *what, long line);
/* Registers the special tokens (every id with is_special) for matching. */
dt_status dt__tk_finish_special(dt_tokenizer *t);
/* Compiles the pre-tokenisation pattern (UTF, UCP, MATCH_INVALID_UTF, JIT when present). */
dt_status dt__tk_set_pattern(dt_tokenizer *t, const char *pattern, const char *what);
int32_t dt__tk_lookup(const dt_tokenizer *t, const char *s, size_t len);

/* Byte-level text (GPT-2's bytes_to_unicode) to raw bytes: out needs len bytes. Returns the
 * byte count, or -1 when s holds a character outside the mapping or invalid UTF-8. */
long dt__tk_unbyte(const char *s, size_t len, char *out);

/* NFC of s[0..len) (text/normalize.c): *out NULL when s is ASCII (NFC as it is), else a
 * malloc'd string of *out_len bytes; invalid UTF-8 bytes pass through. */
dt_status dt__tk_nfc(const char *s, size_t len, char **out, size_t *out_len);

extern const char dt__tk_gpt2_pattern[];

#endif
