/* gpt/names: the names data set of examples/train_gpt: the file read into names, a fixed-seed
 * split into training and held-out names, the character vocabulary, and batches of names as
 * model inputs (a start marker then the letters) and targets (the letters then an end marker;
 * positions past the end are ignored, label -1). */
#ifndef GPT_NAMES_H
#define GPT_NAMES_H

#include <stddef.h>
#include <stdint.h>

/* '.' is the start and end marker (token 0), then 'a'..'z' (1..26) and '-' (27). */
#define NAMES_VOCAB 28
/* Longest name the file may hold: the context is one more (the start marker). */
#define NAMES_MAX_LEN 15
#define NAMES_CONTEXT (NAMES_MAX_LEN + 1)

typedef struct names {
    int64_t n;
    char (*s)[NAMES_MAX_LEN + 1]; /* NUL-terminated */
} names;

/* Reads one name per line (letters a-z and '-', 1..15 characters). Returns 0, or -1 with a
 * message naming the file and line in err. */
int names_load(const char *path, names *out, char *err, size_t errlen);
/* A seeded shuffle of the names, the first `heldout` of them held out. Returns 0 or -1. */
int names_split(const names *all, int64_t heldout, uint64_t seed, names *train, names *test);
void names_free(names *n);

int names_token(char c);     /* -1 for a character outside the vocabulary */
char names_char(int token);

/* Inputs x and targets y [rows, NAMES_CONTEXT] for the names rows[0..count-1] of `set`
 * (rows == NULL: names 0..count-1). Returns the number of targets that count (not -1). */
int64_t names_encode(const names *set, const int32_t *rows, int64_t count, int32_t *x,
                     int32_t *y);

/* --context T (train_gpt): the names of `set` packed one after another, each after a marker
 * (0 a b 0 c d e ... 0), into *out (malloc'd). Returns the token count, -1 without memory.
 * names_window: row i of that stream cut into rows of T, inputs x = s[iT .. iT+T-1] and
 * targets y = s[iT+1 .. iT+T] (every target counts); a stream of len tokens has (len - 1) / T
 * rows. */
int64_t names_pack(const names *set, int32_t **out);
void names_window(const int32_t *stream, int64_t T, int64_t i, int32_t *x, int32_t *y);

#endif
