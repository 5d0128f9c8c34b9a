/* `dtensor trace DIR`: reads every client's flight record (DIR/rank-R.json, runtime/trace.c),
 * says in one line what went wrong (clients that never entered an operation of a group, two
 * different calls at one sequence number, a client gone or failed), then shows each client's
 * last operations side by side (docs/trace.md). */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct top {
    long long seq;
    const char *group, *call, *path, *detail, *status, *error;
    double enter, leave;           /* leave < 0: still inside */
} top;

typedef struct rec {
    int rank, clients;
    const char *reason;
    json_t *root;
    top *ops;
    size_t nops;
} rec;

static const char *str_of(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static int load(const char *path, rec *r)
{
    json_error_t err;
    r->root = json_load_file(path, 0, &err);
    if (!r->root) {
        fprintf(stderr, "dtensor: trace: %s:%d: %s\n", path, err.line, err.text);
        return -1;
    }
    r->rank = (int)json_integer_value(json_object_get(r->root, "rank"));
    r->clients = (int)json_integer_value(json_object_get(r->root, "clients"));
    r->reason = str_of(r->root, "reason");
    json_t *ops = json_object_get(r->root, "ops");
    r->nops = json_array_size(ops);
    r->ops = calloc(r->nops + 1, sizeof *r->ops);
    if (!r->ops)
        return -1;
    for (size_t i = 0; i < r->nops; i++) {
        json_t *o = json_array_get(ops, i);
        top *t = &r->ops[i];
        t->seq = json_integer_value(json_object_get(o, "seq"));
        t->group = str_of(o, "group");
        t->call = str_of(o, "call");
        t->path = str_of(o, "path");
        t->detail = str_of(o, "detail");
        t->status = json_is_string(json_object_get(o, "status")) ? str_of(o, "status") : NULL;
        t->error = str_of(o, "error");
        t->enter = json_number_value(json_object_get(o, "enter"));
        json_t *lv = json_object_get(o, "leave");
        t->leave = json_is_number(lv) ? json_number_value(lv) : -1;
    }
    return 0;
}

/* The op of rank r at (group, seq), NULL if its record has none. */
static const top *find(const rec *r, const char *group, long long seq)
{
    for (size_t i = r->nops; i-- > 0;)
        if (r->ops[i].seq == seq && strcmp(r->ops[i].group, group) == 0)
            return &r->ops[i];
    return NULL;
}

/* Highest and lowest sequence number of group in r's record (0 when none). */
static void seq_range(const rec *r, const char *group, long long *lo, long long *hi)
{
    *lo = *hi = 0;
    for (size_t i = 0; i < r->nops; i++)
        if (strcmp(r->ops[i].group, group) == 0) {
            if (!*lo || r->ops[i].seq < *lo)
                *lo = r->ops[i].seq;
            if (r->ops[i].seq > *hi)
                *hi = r->ops[i].seq;
        }
}

/* 1 if client c is a member of the group key ("0-3,5"; a hashed key: unknown, 1). */
static int member(const char *key, int c)
{
    if (strstr(key, "clients #"))
        return 1;
    const char *p = key;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (*end == '-')
            b = strtol(end + 1, &end, 10);
        if (c >= a && c <= b)
            return 1;
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p)
            return 0;
    }
    return 0;
}

static void describe(const top *t, char *buf, size_t len)
{
    snprintf(buf, len, "%s %s", t->call, t->detail);
}

static const char *outcome(const top *t, char *buf, size_t len)
{
    if (t->leave < 0)
        snprintf(buf, len, "still inside");
    else if (strcmp(t->status, "DT_OK") == 0)
        snprintf(buf, len, "ok");
    else
        snprintf(buf, len, "%s: %s", t->status, t->error);
    return buf;
}

/* The one-line diagnosis; 1 if something went wrong. */
static int diagnose(rec *recs, int nrec, int nclients)
{
    char a[512], b[512], o[512];
    /* The earliest (by entering time) sequence number where the records disagree. */
    const top *best = NULL;
    char line[2048] = "";
    for (int i = 0; i < nrec; i++)
        for (size_t k = 0; k < recs[i].nops; k++) {
            const top *t = &recs[i].ops[k];
            if (best && t->enter >= best->enter)
                continue;
            char never[256] = "", entered[256] = "";
            const top *other = NULL;
            int other_rank = -1;
            for (int j = 0; j < nrec; j++) {
                if (!member(t->group, recs[j].rank))
                    continue;
                long long lo, hi;
                seq_range(&recs[j], t->group, &lo, &hi);
                const top *u = find(&recs[j], t->group, t->seq);
                size_t n = strlen(never), m = strlen(entered);
                if (!u && hi < t->seq)
                    snprintf(never + n, sizeof never - n, "%s%d", n ? "," : "", recs[j].rank);
                else if (u)
                    snprintf(entered + m, sizeof entered - m, "%s%d", m ? "," : "",
                             recs[j].rank);
                if (u && !other && (strcmp(u->call, t->call) || strcmp(u->detail, t->detail))) {
                    other = u;
                    other_rank = recs[j].rank;
                }
            }
            if (other) {            /* named in rank order */
                int lo = recs[i].rank < other_rank;
                describe(lo ? t : other, a, sizeof a);
                describe(lo ? other : t, b, sizeof b);
                snprintf(line, sizeof line, "group %s seq %lld: two different calls: rank %d "
                         "%s; rank %d %s", t->group, t->seq, lo ? recs[i].rank : other_rank, a,
                         lo ? other_rank : recs[i].rank, b);
                best = t;
            } else if (never[0]) {
                describe(t, a, sizeof a);
                snprintf(line, sizeof line, "group %s seq %lld: rank(s) %s never entered it "
                         "(rank(s) %s entered %s)", t->group, t->seq, never, entered, a);
                best = t;
            }
        }
    if (best) {
        printf("%s\n", line);
        return 1;
    }
    /* Clients with no record, or one ended by a signal: where the others were. */
    for (int c = 0; c < nclients; c++) {
        int have = -1;
        for (int j = 0; j < nrec; j++)
            if (recs[j].rank == c)
                have = j;
        const char *why = have < 0 ? "left no record (its process ended without writing one)"
                          : strncmp(recs[have].reason, "fatal signal", 12) == 0
                          ? recs[have].reason : NULL;
        if (!why)
            continue;
        const top *own = have >= 0 && recs[have].nops ? &recs[have].ops[recs[have].nops - 1]
                                                      : NULL;
        if (own && own->leave < 0) {
            describe(own, a, sizeof a);
            printf("rank %d ended (%s) inside group %s seq %lld: %s", c, why, own->group,
                   own->seq, a);
        } else {
            printf("rank %d %s", c, why);
        }
        for (int j = 0; j < nrec; j++) {
            if (recs[j].rank == c || !recs[j].nops)
                continue;
            const top *t = &recs[j].ops[recs[j].nops - 1];
            describe(t, a, sizeof a);
            printf("; rank %d at group %s seq %lld %s: %s", recs[j].rank, t->group, t->seq, a,
                   outcome(t, o, sizeof o));
        }
        printf("\n");
        return 1;
    }
    for (int j = 0; j < nrec; j++)
        for (size_t k = 0; k < recs[j].nops; k++) {
            const top *t = &recs[j].ops[k];
            if (t->leave >= 0 && strcmp(t->status, "DT_OK") == 0)
                continue;
            describe(t, a, sizeof a);
            printf("no mismatch in the records; rank %d group %s seq %lld %s: %s\n",
                   recs[j].rank, t->group, t->seq, a, outcome(t, o, sizeof o));
            return 1;
        }
    printf("no mismatch: the %d record(s) agree on every group and every operation left\n",
           nrec);
    return 0;
}

typedef struct row {
    const char *group;
    long long seq;
    double enter;
} row;

static int row_cmp(const void *x, const void *y)
{
    const row *a = x, *b = y;
    return a->enter < b->enter ? -1 : a->enter > b->enter;
}

/* The last `last` operations of every rank, one row per (group, seq), a column per rank. */
static void side_by_side(rec *recs, int nrec, int last, int width)
{
    size_t cap = (size_t)nrec * (size_t)last + 1, n = 0;
    row *rows = calloc(cap, sizeof *rows);
    if (!rows)
        return;
    for (int j = 0; j < nrec; j++)
        for (size_t k = recs[j].nops > (size_t)last ? recs[j].nops - (size_t)last : 0;
             k < recs[j].nops; k++) {
            const top *t = &recs[j].ops[k];
            size_t r = 0;
            while (r < n && !(rows[r].seq == t->seq && strcmp(rows[r].group, t->group) == 0))
                r++;
            if (r == n)
                rows[n++] = (row){t->group, t->seq, t->enter};
            else if (t->enter < rows[r].enter)
                rows[r].enter = t->enter;
        }
    qsort(rows, n, sizeof *rows, row_cmp);
    printf("%-16s %5s", "group", "seq");
    for (int j = 0; j < nrec; j++) {
        char h[64];
        snprintf(h, sizeof h, "rank %d", recs[j].rank);
        printf(" | %-*s", width, h);
    }
    printf("\n");
    for (size_t r = 0; r < n; r++) {
        printf("%-16.16s %5lld", rows[r].group, rows[r].seq);
        for (int j = 0; j < nrec; j++) {
            const top *t = find(&recs[j], rows[r].group, rows[r].seq);
            char cell[1024] = "-";
            if (t)
                snprintf(cell, sizeof cell, "%s%s %s", t->leave < 0 ? "[inside] " :
                         strcmp(t->status, "DT_OK") ? "[failed] " : "", t->call, t->detail);
            printf(" | %-*.*s", width, width, cell);
        }
        printf("\n");
    }
    for (int j = 0; j < nrec; j++)
        printf("rank %d: %s%s%zu op(s) kept\n", recs[j].rank, recs[j].reason,
               recs[j].reason[0] ? "; " : "", recs[j].nops);
    free(rows);
}

static int by_rank(const void *x, const void *y)
{
    return ((const rec *)x)->rank - ((const rec *)y)->rank;
}

int cli_trace(int argc, char **argv)
{
    const char *dir = NULL;
    int last = 8, width = 44;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--last") == 0 && i + 1 < argc)
            last = atoi(argv[++i]);
        else if (strcmp(argv[i], "--width") == 0 && i + 1 < argc)
            width = atoi(argv[++i]);
        else if (!dir && argv[i][0] != '-')
            dir = argv[i];
        else
            return cli_usage();
    }
    if (!dir || last < 1 || width < 8)
        return cli_usage();
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "dtensor: trace: cannot open directory %s\n", dir);
        return CLI_BAD_INPUT;
    }
    rec *recs = NULL;
    int nrec = 0, bad = 0, nclients = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int r;
        char tail[8];
        if (sscanf(e->d_name, "rank-%d.jso%1[n]%c", &r, tail, tail) != 2)
            continue;
        rec *grown = realloc(recs, (size_t)(nrec + 1) * sizeof *recs);
        if (!grown) {
            bad = 1;
            break;
        }
        recs = grown;
        memset(&recs[nrec], 0, sizeof *recs);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (load(path, &recs[nrec]) != 0) {
            json_decref(recs[nrec].root);
            free(recs[nrec].ops);
            bad = 1;
            break;
        }
        if (recs[nrec].clients > nclients)
            nclients = recs[nrec].clients;
        nrec++;
    }
    closedir(d);
    if (!bad && nrec == 0) {
        fprintf(stderr, "dtensor: trace: no rank-R.json record in %s\n", dir);
        bad = 1;
    }
    if (!bad) {
        qsort(recs, (size_t)nrec, sizeof *recs, by_rank);
        diagnose(recs, nrec, nclients);
        side_by_side(recs, nrec, last, width);
    }
    for (int j = 0; j < nrec; j++) {
        json_decref(recs[j].root);
        free(recs[j].ops);
    }
    free(recs);
    return bad ? CLI_BAD_INPUT : CLI_OK;
}
