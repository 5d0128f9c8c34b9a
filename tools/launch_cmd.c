/* `dtensor launch`: the command line for the MPI this build links: Open MPI's mpirun (hostfile
 * slots, --map-by ppr:N:node, -x, keepalive) or MPICH's Hydra (-f, -ppn, -genv). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

extern char **environ;

int launch_argv_add(launch_argv *a, const char *s)
{
    if (a->n + 2 > a->cap) {
        int cap = a->cap ? 2 * a->cap : 32;
        char **v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    if (!(a->v[a->n] = strdup(s)))
        return -1;
    a->v[++a->n] = NULL;
    return 0;
}

void launch_argv_free(launch_argv *a)
{
    for (int i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

void launch_quote(const char *word, char *buf, size_t len)
{
    size_t o = 0;
    int plain = *word != '\0';
    for (const char *c = word; *c; c++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%",
                    *c))
            plain = 0;
    if (plain) {
        snprintf(buf, len, "%s", word);
        return;
    }
    if (len < 3) {
        if (len)
            buf[0] = '\0';
        return;
    }
    buf[o++] = '\'';
    for (const char *c = word; *c && o + 6 < len; c++) {
        if (*c == '\'') {
            memcpy(buf + o, "'\\''", 4);
            o += 4;
        } else
            buf[o++] = *c;
    }
    buf[o++] = '\'';
    buf[o] = '\0';
}

void launch_keepalive(double timeout, int *time_s, int *intvl_s, int *probes)
{
    /* The processes report a lost host after timeout + timeout/2 (the watchdog's ping); the
     * launcher's own out-of-band link should notice just after that, so that the report comes
     * first, but never later than timeout + 90 s (+ 3 probes 5 s apart: + 105 s). */
    double t = ceil(1.5 * timeout) + 5;
    if (t > timeout + 90)
        t = ceil(timeout) + 90;
    *time_s = (int)t;
    *intvl_s = 5;
    *probes = 3;
}

int launch_write_hostfile(const launch_plan *p, char *err, size_t errlen)
{
    FILE *f = fopen(p->hostfile, "w");
    if (!f) {
        snprintf(err, errlen, "%s: %s", p->hostfile, strerror(errno));
        return -1;
    }
    int mpich = strcmp(p->mpi, "mpich") == 0;
    for (int i = 0; i < p->hosts->n; i++)
        fprintf(f, mpich ? "%s:%d\n" : "%s slots=%d\n", p->hosts->h[i].name,
                p->hosts->h[i].slots);
    if (fclose(f) != 0) {
        snprintf(err, errlen, "%s: %s", p->hostfile, strerror(errno));
        return -1;
    }
    return 0;
}

static int named(const launch_plan *p, const char *name, size_t len)
{
    for (int i = 0; i < p->n_env_names; i++) {
        const char *e = p->env_names[i];
        size_t elen = strcspn(e, "=");
        if (elen == len && strncmp(e, name, len) == 0)
            return 1;
    }
    return 0;
}

/* The variables to pass: every DT_* set here, then those named with --env (once each). */
static int env_words(const launch_plan *p, launch_argv *names)
{
    for (char **e = environ; *e; e++) {
        size_t len = strcspn(*e, "=");
        if (strncmp(*e, "DT_", 3) != 0 || named(p, *e, len))
            continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)len, *e);
        if (launch_argv_add(names, name) != 0)
            return -1;
    }
    for (int i = 0; i < p->n_env_names; i++) {
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(p->env_names[i], "="),
                 p->env_names[i]);
        if (launch_argv_add(names, name) != 0)
            return -1;
    }
    return 0;
}

static int add_fmt(launch_argv *a, const char *fmt, long v)
{
    char b[64];
    snprintf(b, sizeof b, fmt, v);
    return launch_argv_add(a, b);
}

/* MPICH inside Slurm: Hydra's own start through Slurm hung in the test cluster, srun with PMI2
 * works (docs/launch.md); srun passes the whole environment on. */
static int build_srun(const launch_plan *p, launch_argv *out, char *err, size_t errlen)
{
    char nodes[LAUNCH_MAX_HOSTS * (LAUNCH_HOST_MAX + 1) + 16];
    size_t o = (size_t)snprintf(nodes, sizeof nodes, "--nodelist=");
    for (int i = 0; i < p->hosts->n; i++)
        o += (size_t)snprintf(nodes + o, sizeof nodes - o, "%s%s", i ? "," : "",
                              p->hosts->h[i].name);
    int bad = launch_argv_add(out, "srun") != 0 || launch_argv_add(out, "--mpi=pmi2") != 0 ||
              launch_argv_add(out, "--kill-on-bad-exit=1") != 0 ||
              add_fmt(out, "--nodes=%ld", p->hosts->n) != 0 ||
              add_fmt(out, "--ntasks=%ld", launch_hosts_total(p->hosts)) != 0 ||
              launch_argv_add(out, nodes) != 0;
    if (!bad && p->ppn > 0)
        bad = add_fmt(out, "--ntasks-per-node=%ld", p->ppn) != 0;
    for (int i = 0; !bad && i < p->n_mpi_args; i++)
        bad = launch_argv_add(out, p->mpi_args[i]) != 0;
    for (int i = 0; !bad && i < p->n_prog; i++)
        bad = launch_argv_add(out, p->prog[i]) != 0;
    if (bad)
        snprintf(err, errlen, "out of memory");
    return bad ? -1 : 0;
}

int launch_build(const launch_plan *p, launch_argv *out, char *err, size_t errlen)
{
    if (p->srun)
        return build_srun(p, out, err, errlen);
    int mpich = strcmp(p->mpi, "mpich") == 0;
    int total = p->hosts->n ? launch_hosts_total(p->hosts) : p->local_procs;
    launch_argv names = {0};
    int bad = env_words(p, &names) != 0 || launch_argv_add(out, p->mpiexec) != 0;
    if (!bad && p->hosts->n)
        bad = launch_argv_add(out, mpich ? "-f" : "--hostfile") != 0 ||
              launch_argv_add(out, p->hostfile) != 0;
    bad = bad || launch_argv_add(out, "-n") != 0 || add_fmt(out, "%ld", total) != 0;
    if (!bad && p->hosts->n && p->ppn > 0) {
        if (mpich)
            bad = launch_argv_add(out, "-ppn") != 0 || add_fmt(out, "%ld", p->ppn) != 0;
        else
            bad = launch_argv_add(out, "--map-by") != 0 || add_fmt(out, "ppr:%ld:node", p->ppn);
    }
    for (int i = 0; !bad && i < names.n; i++) {
        const char *val = getenv(names.v[i]);
        for (int k = 0; k < p->n_env_names; k++) /* --env VAR=VALUE */
            if (strncmp(p->env_names[k], names.v[i], strlen(names.v[i])) == 0 &&
                p->env_names[k][strlen(names.v[i])] == '=')
                val = p->env_names[k] + strlen(names.v[i]) + 1;
        if (!val)
            continue; /* named but not set: nothing to pass */
        if (mpich) {
            bad = launch_argv_add(out, "-genv") != 0 || launch_argv_add(out, names.v[i]) != 0 ||
                  launch_argv_add(out, val) != 0;
        } else {
            char kv[4096];
            int n = snprintf(kv, sizeof kv, "%s=%s", names.v[i], val);
            if (n < 0 || (size_t)n >= sizeof kv) {
                snprintf(err, errlen, "the value of %s is too long", names.v[i]);
                launch_argv_free(&names);
                return -1;
            }
            bad = launch_argv_add(out, "-x") != 0 || launch_argv_add(out, kv) != 0;
        }
    }
    if (!bad && !mpich) {
        const char *t = getenv("DT_COMM_TIMEOUT");
        double timeout = t && atof(t) > 0 ? atof(t) : 300;
        int ktime, kintvl, kprobes;
        launch_keepalive(timeout, &ktime, &kintvl, &kprobes);
        bad = launch_argv_add(out, "--mca") != 0 ||
              launch_argv_add(out, "oob_tcp_keepalive_time") != 0 ||
              add_fmt(out, "%ld", ktime) != 0 || launch_argv_add(out, "--mca") != 0 ||
              launch_argv_add(out, "oob_tcp_keepalive_intvl") != 0 ||
              add_fmt(out, "%ld", kintvl) != 0 || launch_argv_add(out, "--mca") != 0 ||
              launch_argv_add(out, "oob_tcp_keepalive_probes") != 0 ||
              add_fmt(out, "%ld", kprobes) != 0;
    }
    for (int i = 0; !bad && i < p->n_mpi_args; i++)
        bad = launch_argv_add(out, p->mpi_args[i]) != 0;
    for (int i = 0; !bad && i < p->n_prog; i++)
        bad = launch_argv_add(out, p->prog[i]) != 0;
    launch_argv_free(&names);
    if (bad) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}
