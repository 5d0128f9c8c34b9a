/* Helpers shared by the benchmarks: integer lists, medians, key=value result lines. */
#include "bench_util.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bu_parse_int_list(const char *text, int *out, int cap)
{
    int n = 0;
    const char *p = text;
    if (!p || !*p)
        return -1;
    for (;;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1 << 20 || n == cap)
            return -1;
        out[n++] = (int)v;
        if (*end == '\0')
            return n;
        if (*end != ',')
            return -1;
        p = end + 1;
    }
}

int bu_list_has(const char *list, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n == len && strncmp(p, name, len) == 0)
            return 1;
        p = comma ? comma + 1 : NULL;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bu_median(double *v, int n)
{
    if (n <= 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void bu_line_init(bu_line *line)
{
    line->text[0] = '\0';
    line->len = 0;
}

void bu_line_add(bu_line *line, const char *key, const char *fmt, ...)
{
    size_t cap = sizeof line->text;
    if (line->len + 1 >= cap)
        return;
    int n = snprintf(line->text + line->len, cap - line->len, "%s%s=", line->len ? " " : "", key);
    if (n < 0 || (size_t)n >= cap - line->len) {
        line->len = cap - 1;
        return;
    }
    line->len += (size_t)n;
    va_list ap;
    va_start(ap, fmt);
    n = vsnprintf(line->text + line->len, cap - line->len, fmt, ap);
    va_end(ap);
    line->len = (n < 0 || (size_t)n >= cap - line->len) ? cap - 1 : line->len + (size_t)n;
}

void bu_line_print(const bu_line *line)
{
    fputs(line->text, stdout);
    fputc('\n', stdout);
    fflush(stdout);
}

double bu_max_all(double t)
{
    double m;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

int bu_ok_all(int ok)
{
    int all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}
