/* Small helpers every module uses: checked sizes, element counts, message text. Not installed. */
#ifndef DTENSOR_RUNTIME_UTIL_H
#define DTENSOR_RUNTIME_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/dtype.h"
#include "dtensor/runtime.h"

/* Checked size arithmetic: 0 on success, -1 on overflow. */
int dt__mul_size(size_t a, size_t b, size_t *out);

/* Product of shape[0..rank-1] (1 for rank 0). Assumes non-negative entries. */
int64_t dt__numel(int rank, const int64_t *shape);

/* Bounded string copy that always NUL-terminates; returns strlen(src). */
size_t dt__strlcpy(char *dst, const char *src, size_t len);
/* Shape text "[2,3]" ("[]" for rank 0) into buf, for messages; truncated text stays
 * NUL-terminated. Returns buf. */
const char *dt__shape_str(int rank, const int64_t *shape, char *buf, size_t len);

/* Copies bytes like memcpy; from DT__COPY_LARGE (8 MiB) up, on x86-64, with streaming stores
 * that bypass the caches (runtime/copy.c): for copies far larger than the caches, as the shm
 * transport's and the CPU device's. DT_COPY_STREAM=0 makes it plain memcpy (for A/B runs). */
#define DT__COPY_LARGE ((size_t)8 << 20)
void dt__copy_large(void *dst, const void *src, size_t bytes);
/* Zeroes bytes like memset, streaming from DT__COPY_LARGE up as dt__copy_large does (a plain
 * store reads each line first: two passes over memory where streaming stores need one).
 * The CPU device's memset0 (dt_alltoallv's zeroed tails). */
void dt__zero_large(void *dst, size_t bytes);
/* Turns the streaming stores on or off in this process (bench/relayout's in-run A/B). */
void dt__copy_set_streaming(int yes);
/* Reads DT_COPY_STREAM (dt_init): DT_ERR_INVALID_ARGUMENT unless unset, empty, 0 or 1. */
dt_status dt__copy_configure(void);

#endif
