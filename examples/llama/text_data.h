/* llama/text_data: a raw text file (or a directory of them) tokenised on the fly into a
 * dataset source of llm.c's examples: example i is the context + 1 tokens from token
 * i * context, its inputs the first context and its targets the last context (int32), every
 * document preceded by the end-of-text token as `dtensor tokenize` writes them. Sharded,
 * prefetched and resumable as any dataset over a source (dtensor/data.h). */
#ifndef LLAMA_TEXT_DATA_H
#define LLAMA_TEXT_DATA_H

#include <stdint.h>

#include <dtensor/dtensor.h>
#include <dtensor/tokenizer.h>

typedef struct text_data text_data;

/* Tokenises `path` (a file, or the regular files of a directory in name order; each line a
 * document when `lines`) with `tok`, `eot` before each document. Local: every client does
 * the same. DT_ERR_IO, DT_ERR_INVALID_ARGUMENT (fewer than context + 1 tokens),
 * DT_ERR_NO_MEMORY, the tokenizer's errors. */
dt_status text_data_load(const dt_tokenizer *tok, const char *path, int lines, int32_t eot,
                         int64_t context, text_data **out);
void text_data_destroy(text_data *d);
int64_t text_data_tokens(const text_data *d);
/* A source of the examples (borrowing d, which must outlive it). */
dt_status text_data_source(text_data *d, dt_data_source **out);
/* The end-of-text id of a tokenizer ("<|endoftext|>", "<|end_of_text|>", "</s>"), or -1. */
int32_t text_data_eot(const dt_tokenizer *tok);

#endif
