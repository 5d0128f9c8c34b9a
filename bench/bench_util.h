/* Small helpers shared by libdtensor's benchmarks: option lists, repetition timing statistics
 * and the key=value result lines. Not part of the library. */
#ifndef DTENSOR_BENCH_UTIL_H
#define DTENSOR_BENCH_UTIL_H

#include <stddef.h>

/* Parses a comma-separated list of positive integers ("1,16,128") into out (at most cap).
 * Returns the count, or -1 on malformed text, a value < 1, or more than cap entries. */
int bu_parse_int_list(const char *text, int *out, int cap);

/* 1 if `name` is one of the comma-separated words of `list`. */
int bu_list_has(const char *list, const char *name);

/* Median of v[0..n-1] (sorts v in place); 0 for n == 0. */
double bu_median(double *v, int n);

/* A result line: "key=value" pairs separated by single spaces, printed on one line. */
typedef struct bu_line {
    char text[1024];
    size_t len;
} bu_line;

void bu_line_init(bu_line *line);
/* Appends " key=value" (no leading space for the first pair); value printed with fmt. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void bu_line_add(bu_line *line, const char *key, const char *fmt, ...);
/* Prints the line and a newline on stdout, and flushes. */
void bu_line_print(const bu_line *line);

/* Over MPI_COMM_WORLD: the largest t of all ranks (a collective step's time is its slowest
 * rank's), and whether every rank's ok is non-zero. Collective. */
double bu_max_all(double t);
int bu_ok_all(int ok);

#endif
