/* `dtensor launch --hang-timeout S`: names a hung client from its peers' flight records
 * (DIR/rank-R.json, runtime/trace.c, written on the SIGUSR1 the launcher sends): peers inside
 * a collective for more than S seconds that a member of its group never entered, while that
 * member waits in no collective itself (docs/recovery.md). */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

typedef struct hrec {
    int rank;
    char host[LAUNCH_HOST_MAX];
    json_t *root, *ops, *groups;
} hrec;

/* 1 if client c is a member of the group key ("0-3,5"); a hashed key: unknown, 0. */
static int in_group(const char *key, int c)
{
    if (strstr(key, "#"))
        return 0;
    const char *p = key;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p)
            return 0;
        if (*end == '-')
            b = strtol(end + 1, &end, 10);
        if (c >= a && c <= b)
            return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

static const char *text_of(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* The next sequence number rank r would take in group `key` (0: none recorded). */
static long long next_seq(const hrec *r, const char *key)
{
    for (size_t i = 0; i < json_array_size(r->groups); i++) {
        json_t *g = json_array_get(r->groups, i);
        const char *k = json_string_value(json_object_get(g, "group"));
        if (k && strcmp(k, key) == 0)
            return json_integer_value(json_object_get(g, "next_seq"));
    }
    return 0;
}

/* The op rank r is inside (the newest without a leave time), or NULL. */
static json_t *inside(const hrec *r)
{
    size_t n = json_array_size(r->ops);
    for (size_t i = n; i-- > 0;) {
        json_t *o = json_array_get(r->ops, i);
        if (!json_is_number(json_object_get(o, "leave")))
            return o;
    }
    return NULL;
}

int launch_hang_check(const char *dir, double now, double bound, double since, char *msg,
                      size_t len, launch_hosts *hung)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    hrec recs[LAUNCH_MAX_HOSTS * 4];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < (int)(sizeof recs / sizeof recs[0])) {
        int rank;
        char tail[8];
        if (sscanf(e->d_name, "rank-%d.jso%1s", &rank, tail) != 2)
            continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        json_t *root = json_load_file(p, 0, NULL);
        if (!root)
            continue;
        /* Only records written since the probe: the state now. */
        if (json_number_value(json_object_get(root, "time")) < since) {
            json_decref(root);
            continue;
        }
        hrec *r = &recs[n++];
        r->rank = rank;
        r->root = root;
        r->ops = json_object_get(root, "ops");
        r->groups = json_object_get(root, "groups");
        const char *h = json_string_value(json_object_get(root, "host"));
        snprintf(r->host, sizeof r->host, "%s", h ? h : "?");
    }
    closedir(d);
    int found = 0;
    for (int i = 0; i < n && !found; i++) {
        json_t *o = inside(&recs[i]);
        if (!o || now - json_number_value(json_object_get(o, "enter")) < bound)
            continue;
        const char *key = json_string_value(json_object_get(o, "group"));
        long long seq = json_integer_value(json_object_get(o, "seq"));
        if (!key)
            continue;
        char names[1024] = "", waiters[512] = "";
        for (int j = 0; j < n; j++) {
            if (!in_group(key, recs[j].rank))
                continue;
            size_t k = strlen(names), w = strlen(waiters);
            if (next_seq(&recs[j], key) <= seq && !inside(&recs[j])) {
                snprintf(names + k, sizeof names - k, "%s%d (host %s)", k ? ", " : "",
                         recs[j].rank, recs[j].host);
                if (hung->n < LAUNCH_MAX_HOSTS) {
                    int dup = 0;
                    for (int q = 0; q < hung->n; q++)
                        dup |= strcmp(hung->h[q].name, recs[j].host) == 0;
                    if (!dup) {
                        snprintf(hung->h[hung->n].name, LAUNCH_HOST_MAX, "%s", recs[j].host);
                        hung->h[hung->n++].slots = 0;
                    }
                }
            } else if (inside(&recs[j])) {
                snprintf(waiters + w, sizeof waiters - w, "%s%d", w ? "," : "", recs[j].rank);
            }
        }
        if (names[0]) {
            snprintf(msg, len, "hung client(s) %s: no collective of group %s since seq %lld "
                     "for %.1f s while client(s) %s wait in it (%s %s)", names, key, seq,
                     now - json_number_value(json_object_get(o, "enter")), waiters,
                     text_of(o, "call"), text_of(o, "detail"));
            found = 1;
        }
    }
    for (int i = 0; i < n; i++)
        json_decref(recs[i].root);
    return found;
}
