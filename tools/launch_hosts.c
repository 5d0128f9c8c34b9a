/* `dtensor launch`: the job's hosts from --hosts, a hostfile or the Slurm allocation this
 * process runs in (its node list expanded, its tasks per node). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

int launch_hosts_total(const launch_hosts *hosts)
{
    int t = 0;
    for (int i = 0; i < hosts->n; i++)
        t += hosts->h[i].slots;
    return t;
}

int launch_hosts_remove(launch_hosts *hosts, const char *name)
{
    for (int i = 0; i < hosts->n; i++)
        if (strcmp(hosts->h[i].name, name) == 0) {
            memmove(&hosts->h[i], &hosts->h[i + 1], (size_t)(hosts->n - i - 1) * sizeof hosts->h[0]);
            hosts->n--;
            return 1;
        }
    return 0;
}

static int add_host(launch_hosts *out, const char *name, size_t len, int slots, char *err,
                    size_t errlen)
{
    if (len == 0 || len >= LAUNCH_HOST_MAX) {
        snprintf(err, errlen, "host name '%.*s': empty or longer than %d characters", (int)len,
                 name, LAUNCH_HOST_MAX - 1);
        return -1;
    }
    for (int i = 0; i < out->n; i++)
        if (strlen(out->h[i].name) == len && memcmp(out->h[i].name, name, len) == 0) {
            snprintf(err, errlen, "host '%.*s' named twice", (int)len, name);
            return -1;
        }
    if (out->n == LAUNCH_MAX_HOSTS) {
        snprintf(err, errlen, "more than %d hosts", LAUNCH_MAX_HOSTS);
        return -1;
    }
    memcpy(out->h[out->n].name, name, len);
    out->h[out->n].name[len] = '\0';
    out->h[out->n].slots = slots;
    out->n++;
    return 0;
}

static int parse_count(const char *s, size_t len, int *out)
{
    char buf[16];
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    long v = strtol(buf, &end, 10);
    if (*end != '\0' || errno || v < 1 || v > 1 << 20)
        return -1;
    *out = (int)v;
    return 0;
}

int launch_hosts_parse_list(const char *text, int default_slots, launch_hosts *out, char *err,
                            size_t errlen)
{
    out->n = 0;
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        int slots = default_slots;
        size_t nlen = colon ? (size_t)(colon - p) : len;
        if (colon && parse_count(colon + 1, len - nlen - 1, &slots) != 0) {
            snprintf(err, errlen, "--hosts '%s': '%.*s' is not HOST or HOST:COUNT (COUNT >= 1)",
                     text, (int)len, p);
            return -1;
        }
        if (add_host(out, p, nlen, slots, err, errlen) != 0)
            return -1;
        if (!end)
            break;
        p = end + 1;
    }
    if (out->n == 0) {
        snprintf(err, errlen, "--hosts '%s': no host", text);
        return -1;
    }
    return 0;
}

int launch_hosts_read_file(const char *path, int default_slots, launch_hosts *out, char *err,
                           size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--hostfile %s: %s", path, strerror(errno));
        return -1;
    }
    out->n = 0;
    char line[1024];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = line;
        while (isspace((unsigned char)*s))
            s++;
        if (!*s)
            continue;
        size_t nlen = strcspn(s, " \t\r\n:");
        int slots = default_slots;
        char *rest = s + nlen;
        if (*rest == ':') { /* Hydra's NAME:N */
            size_t clen = strcspn(rest + 1, " \t\r\n");
            if (parse_count(rest + 1, clen, &slots) != 0)
                rc = -1;
        } else {
            char *kw = strstr(rest, "slots=");
            if (kw) {
                size_t clen = strcspn(kw + 6, " \t\r\n");
                if (parse_count(kw + 6, clen, &slots) != 0)
                    rc = -1;
            }
        }
        if (rc != 0) {
            snprintf(err, errlen, "%s:%d: a bad process count", path, lineno);
            break;
        }
        char msg[512];
        if (add_host(out, s, nlen, slots, msg, sizeof msg) != 0) {
            snprintf(err, errlen, "%s:%d: %s", path, lineno, msg);
            rc = -1;
        }
    }
    fclose(f);
    if (rc == 0 && out->n == 0) {
        snprintf(err, errlen, "--hostfile %s: no host", path);
        rc = -1;
    }
    return rc;
}

/* One element of a node list: "pre[1-3,07]suf" or a plain name. */
static int expand_one(const char *s, size_t len, launch_hosts *out, char *err, size_t errlen)
{
    const char *lb = memchr(s, '[', len);
    if (!lb)
        return add_host(out, s, len, 0, err, errlen);
    const char *rb = memchr(lb, ']', len - (size_t)(lb - s));
    if (!rb) {
        snprintf(err, errlen, "node list element '%.*s': no ']'", (int)len, s);
        return -1;
    }
    size_t plen = (size_t)(lb - s), slen = len - (size_t)(rb + 1 - s);
    const char *r = lb + 1;
    while (r < rb) {
        const char *comma = memchr(r, ',', (size_t)(rb - r));
        const char *e = comma ? comma : rb;
        const char *dash = memchr(r, '-', (size_t)(e - r));
        int width = (int)((dash ? dash : e) - r);
        char *stop;
        long lo = strtol(r, &stop, 10), hi = lo;
        if (stop != (dash ? dash : e)) {
            snprintf(err, errlen, "node list element '%.*s': a bad range", (int)len, s);
            return -1;
        }
        if (dash) {
            hi = strtol(dash + 1, &stop, 10);
            if (stop != e || hi < lo || hi - lo > LAUNCH_MAX_HOSTS) {
                snprintf(err, errlen, "node list element '%.*s': a bad range", (int)len, s);
                return -1;
            }
        }
        for (long v = lo; v <= hi; v++) {
            char name[LAUNCH_HOST_MAX];
            int n = snprintf(name, sizeof name, "%.*s%0*ld%.*s", (int)plen, s, width, v,
                             (int)slen, rb + 1);
            if (n < 0 || (size_t)n >= sizeof name) {
                snprintf(err, errlen, "node list element '%.*s': name too long", (int)len, s);
                return -1;
            }
            if (add_host(out, name, (size_t)n, 0, err, errlen) != 0)
                return -1;
        }
        r = e + (e < rb);
    }
    return 0;
}

int launch_slurm_expand(const char *list, launch_hosts *out, char *err, size_t errlen)
{
    out->n = 0;
    const char *p = list;
    while (*p) {
        /* A top-level comma ends an element; commas inside [...] do not. */
        const char *e = p;
        int depth = 0;
        while (*e && (depth > 0 || *e != ',')) {
            depth += *e == '[' ? 1 : *e == ']' ? -1 : 0;
            e++;
        }
        if (expand_one(p, (size_t)(e - p), out, err, errlen) != 0)
            return -1;
        p = *e ? e + 1 : e;
    }
    if (out->n == 0) {
        snprintf(err, errlen, "SLURM_JOB_NODELIST '%s': no node", list);
        return -1;
    }
    return 0;
}

/* SLURM_TASKS_PER_NODE: "2(x3),1" = 2, 2, 2, 1. */
static int tasks_per_node(const char *text, launch_hosts *hosts, char *err, size_t errlen)
{
    int i = 0;
    const char *p = text;
    while (*p && i < hosts->n) {
        char *end;
        long c = strtol(p, &end, 10), rep = 1;
        if (end == p || c < 0)
            break;
        if (strncmp(end, "(x", 2) == 0) {
            rep = strtol(end + 2, &end, 10);
            if (*end != ')')
                break;
            end++;
        }
        for (long r = 0; r < rep && i < hosts->n; r++)
            hosts->h[i++].slots = (int)c;
        p = *end == ',' ? end + 1 : end;
    }
    if (i != hosts->n) {
        snprintf(err, errlen, "SLURM_TASKS_PER_NODE '%s' does not cover the %d nodes", text,
                 hosts->n);
        return -1;
    }
    return 0;
}

int launch_hosts_from_slurm(int default_slots, launch_hosts *out, char *err, size_t errlen)
{
    const char *list = getenv("SLURM_JOB_NODELIST");
    if (!list || !*list)
        list = getenv("SLURM_NODELIST");
    if (!list || !*list)
        return 0;
    if (launch_slurm_expand(list, out, err, errlen) != 0)
        return -1;
    const char *ntpn = getenv("SLURM_NTASKS_PER_NODE");
    const char *tpn = getenv("SLURM_TASKS_PER_NODE");
    int n = 0;
    if (default_slots > 0)
        n = default_slots; /* --nproc-per-node given: it wins */
    else if (ntpn && *ntpn && parse_count(ntpn, strlen(ntpn), &n) != 0) {
        snprintf(err, errlen, "SLURM_NTASKS_PER_NODE '%s' is not a count", ntpn);
        return -1;
    }
    if (n > 0) {
        for (int i = 0; i < out->n; i++)
            out->h[i].slots = n;
        return 1;
    }
    if (tpn && *tpn)
        return tasks_per_node(tpn, out, err, errlen) == 0 ? 1 : -1;
    for (int i = 0; i < out->n; i++)
        out->h[i].slots = 1;
    return 1;
}
