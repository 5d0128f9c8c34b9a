/* train/digits: the UCI handwritten digits (examples/data/digits.csv.gz), read with zlib, and
 * the example's fixed held-out split. */
#ifndef TRAIN_DIGITS_H
#define TRAIN_DIGITS_H

#include <stddef.h>
#include <stdint.h>

#define DIGITS_FEATURES 64
#define DIGITS_CLASSES  10
/* Rows kept out of training for the held-out accuracy (of 1797). */
#define DIGITS_HELD_OUT 297

typedef struct digits {
    int64_t n;
    float *x;   /* n x DIGITS_FEATURES, pixels 0..16 scaled to 0..1 */
    int32_t *y; /* n labels 0..9 */
} digits;

/* Reads a (gzip-compressed or plain) CSV of rows "p0,...,p63,label" with pixels 0..16 and
 * labels 0..9. Returns 0, or -1 with a one-line message ("FILE:LINE: what") in err. */
int digits_load(const char *path, digits *out, char *err, size_t errlen);

/* Splits `all` by a fixed permutation (independent of any option) into the training rows
 * and the last DIGITS_HELD_OUT rows, held out. Returns 0, or -1 (out of memory, or too few
 * rows) with a message in err. */
int digits_split(const digits *all, digits *train, digits *held_out, char *err, size_t errlen);

void digits_free(digits *d);

#endif
