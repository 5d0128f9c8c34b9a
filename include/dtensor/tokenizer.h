/* libdtensor: byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2 style; docs/text.md). */
#ifndef DTENSOR_TOKENIZER_H
#define DTENSOR_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/export.h"
#include "dtensor/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A loaded tokenizer: vocabulary, merge ranks, special tokens and pre-tokenisation pattern.
 * Immutable once loaded except for an internal cache of encoded words guarded by a lock, so
 * one tokenizer may be used by several threads at once. */
typedef struct dt_tokenizer dt_tokenizer;

/* Flags of dt_tokenizer_encode. */
enum {
    /* Special tokens' text is encoded as ordinary text (as gpt-3-encoder does), not matched. */
    DT_TOKENIZER_ENCODE_PLAIN = 1u << 0,
};

/* Loads GPT-2's files: `vocab_json` (encoder.json / vocab.json: an object of byte-level
 * token string -> id) and `merges_txt` (vocab.bpe / merges.txt: "a b" per line, in rank
 * order, an optional "#version" first line). The pre-tokenisation pattern is GPT-2's;
 * "<|endoftext|>", when in the vocabulary, is a special token. Local.
 * tok_out: an owned tokenizer (dt_tokenizer_destroy), written only on success.
 * Returns DT_ERR_INVALID_ARGUMENT (NULL argument), DT_ERR_IO (a file cannot be read),
 * DT_ERR_PARSE (not JSON, or a malformed merge line: the detail names file and line),
 * DT_ERR_CORRUPT (a token that is not byte-level text, a merge of tokens not in the
 * vocabulary, a byte with no token, a repeated id), DT_ERR_NO_MEMORY. */
DT_API dt_status dt_tokenizer_from_files(const char *vocab_json, const char *merges_txt,
                                         dt_tokenizer **tok_out);

/* Loads a Hugging Face `tokenizer.json` whose model.type is "BPE": model.vocab,
 * model.merges ("a b" strings or ["a", "b"] pairs), model.ignore_merges, added_tokens
 * (matched before pre-tokenisation), an NFC normalizer or none (Qwen2 has NFC), a
 * pre_tokenizer that is ByteLevel (GPT-2's pattern) or a
 * Sequence of a Split with a Regex pattern (behavior Isolated) and a ByteLevel with
 * use_regex false, and a ByteLevel or absent decoder. The post_processor is not applied
 * (encode adds no BOS). Local.
 * tok_out: an owned tokenizer, written only on success.
 * Returns DT_ERR_INVALID_ARGUMENT, DT_ERR_IO, DT_ERR_PARSE (not JSON, a key of the wrong
 * type, a pattern PCRE2 rejects), DT_ERR_UNSUPPORTED (a setting this loader does not
 * implement, such as a normalizer or another model type: the detail names the key),
 * DT_ERR_CORRUPT, DT_ERR_NO_MEMORY. */
DT_API dt_status dt_tokenizer_from_json(const char *tokenizer_json, dt_tokenizer **tok_out);

/* Frees a tokenizer. NULL is ignored. Local. */
DT_API void dt_tokenizer_destroy(dt_tokenizer *tok);

/* Encodes text[0..len) (any bytes; invalid UTF-8 is encoded byte by byte) into token ids:
 * special tokens first (unless DT_TOKENIZER_ENCODE_PLAIN), then the pattern's pieces, each
 * merged by rank. Without a normalizer at most `len` ids result, so cap >= len suffices (NFC
 * can lengthen a few texts).
 * ids: caller buffer of cap ids; ids == NULL with cap == 0 only counts.
 * n_out: the number of ids, written only on success. Local; thread-safe.
 * Returns DT_ERR_INVALID_ARGUMENT (NULL tok, text or n_out with len > 0, unknown flags, or
 * cap too small: the detail gives the count needed), DT_ERR_NO_MEMORY, DT_ERR_SYSTEM (the
 * regex engine failed, e.g. out of its stack). */
DT_API dt_status dt_tokenizer_encode(const dt_tokenizer *tok, const char *text, size_t len,
                                     unsigned flags, int32_t *ids, size_t cap, size_t *n_out);

/* Decodes ids[0..n) into the bytes they stand for: decode(encode(x)) == x for every x (for a
 * tokenizer with the NFC normalizer: x with its valid UTF-8 runs in NFC).
 * buf: caller buffer of cap bytes (not NUL-terminated); buf == NULL with cap == 0 only
 * measures. len_out: bytes written, written only on success. Local.
 * Returns DT_ERR_INVALID_ARGUMENT (NULL argument, an id with no token: the detail names its
 * position, cap too small: the detail gives the bytes needed). */
DT_API dt_status dt_tokenizer_decode(const dt_tokenizer *tok, const int32_t *ids, size_t n,
                                     char *buf, size_t cap, size_t *len_out);

/* One more than the largest id with a token (vocabulary and special tokens). Local. */
DT_API int32_t dt_tokenizer_vocab_size(const dt_tokenizer *tok);

/* The bytes of token `id`: *bytes_out borrowed from tok (valid until it is destroyed, not
 * NUL-terminated), *len_out their count. Local.
 * Returns DT_ERR_INVALID_ARGUMENT (NULL argument), DT_ERR_NOT_FOUND (no token has this id). */
DT_API dt_status dt_tokenizer_token(const dt_tokenizer *tok, int32_t id, const char **bytes_out,
                                    size_t *len_out);

/* The id of the token whose bytes are text[0..len), vocabulary or special. Local.
 * Returns DT_ERR_INVALID_ARGUMENT, DT_ERR_NOT_FOUND (no such token). */
DT_API dt_status dt_tokenizer_token_id(const dt_tokenizer *tok, const char *text, size_t len,
                                       int32_t *id_out);

#ifdef __cplusplus
}
#endif
#endif
