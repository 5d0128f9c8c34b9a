/* `dtensor launch`: starts a program on hosts (a list, a hostfile or the Slurm allocation)
 * through the MPI this build links, and with --max-restarts relaunches a failed job from the
 * latest committed checkpoint under the manager's root, without the lost hosts if asked. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "launch.h"

#ifndef DT_LAUNCH_MPI
#define DT_LAUNCH_MPI "openmpi"
#endif
#ifndef DT_LAUNCH_MPIEXEC
#define DT_LAUNCH_MPIEXEC "mpiexec"
#endif

#define MAX_WORDS 256

typedef struct opts {
    const char *hosts, *hostfile, *mpiexec, *ckpt_root;
    int nproc_per_node, dry_run, max_restarts, exclude_lost;
    double hang_timeout; /* --hang-timeout S: 0 off */
    const char *env[MAX_WORDS];
    int n_env;
    char *mpi_args[MAX_WORDS];
    int n_mpi_args;
    char *const *prog;
    int n_prog;
} opts;

static int usage(void)
{
    fputs("usage: dtensor launch [--hosts H1:N,H2:N | --hostfile FILE] [--nproc-per-node N]\n"
          "                      [--env VAR[=VALUE] ...] [--mpi-args 'WORDS'] [--mpiexec PATH]\n"
          "                      [--max-restarts K [--exclude-lost] [--ckpt-root ROOT]]\n"
          "                      [--hang-timeout S]\n"
          "                      [--dry-run] -- PROGRAM ARGS...\n"
          "Launches through " DT_LAUNCH_MPI "'s launcher (" DT_LAUNCH_MPIEXEC "); inside a Slurm\n"
          "allocation on its nodes. Exit status: the job's.\n",
          stderr);
    return CLI_USAGE;
}

static int bad(const char *fmt, const char *a)
{
    fputs("dtensor launch: ", stderr);
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    return CLI_USAGE;
}

static int count_arg(const char *flag, const char *v, int min, int *out)
{
    char *end;
    errno = 0;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || errno || n < min || n > 1 << 20)
        return bad("%s needs a count", flag);
    *out = (int)n;
    return 0;
}

/* Splits --mpi-args's text on blanks into o->mpi_args (owned). */
static int split_words(opts *o, const char *text)
{
    const char *p = text;
    for (;;) {
        p += strspn(p, " \t\n");
        if (!*p)
            return 0;
        size_t len = strcspn(p, " \t\n");
        if (o->n_mpi_args == MAX_WORDS)
            return bad("%s: too many words", "--mpi-args");
        o->mpi_args[o->n_mpi_args++] = strndup(p, len);
        p += len;
    }
}

static int parse(int argc, char **argv, opts *o)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0, takes = 1;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        } else if (strcmp(a, "--hosts") == 0)
            o->hosts = v;
        else if (strcmp(a, "--hostfile") == 0)
            o->hostfile = v;
        else if (strcmp(a, "--mpiexec") == 0)
            o->mpiexec = v;
        else if (strcmp(a, "--ckpt-root") == 0)
            o->ckpt_root = v;
        else if (strcmp(a, "--nproc-per-node") == 0)
            rc = count_arg(a, v, 1, &o->nproc_per_node);
        else if (strcmp(a, "--max-restarts") == 0)
            rc = count_arg(a, v, 0, &o->max_restarts);
        else if (strcmp(a, "--hang-timeout") == 0) {
            char *end = NULL;
            o->hang_timeout = v ? strtod(v, &end) : 0;
            if (v && (*end || !(o->hang_timeout > 0) || o->hang_timeout > 1e6))
                rc = bad("%s needs a number of seconds > 0", a);
        }
        else if (strcmp(a, "--env") == 0) {
            if (v && o->n_env < MAX_WORDS)
                o->env[o->n_env++] = v;
        } else if (strcmp(a, "--mpi-args") == 0)
            rc = v ? split_words(o, v) : 0;
        else {
            takes = 0;
            if (strcmp(a, "--dry-run") == 0)
                o->dry_run = 1;
            else if (strcmp(a, "--exclude-lost") == 0)
                o->exclude_lost = 1;
            else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
                return usage();
            else if (strcmp(a, "-n") == 0 || strcmp(a, "-np") == 0 || strcmp(a, "--np") == 0)
                return bad("%s is mpiexec's option: give the count as --nproc-per-node N (on "
                           "this host alone, the number of processes), then -- PROGRAM ARGS...",
                           a);
            else if (a[0] == '-')
                return bad("unknown option '%s' (the program's arguments go after --)", a);
            else
                break; /* the program, without a -- before it */
        }
        if (rc)
            return rc;
        if (takes && !v)
            return bad("%s needs a value", a);
        i += takes;
    }
    if (i >= argc)
        return bad("%s", "no program given (dtensor launch [OPTIONS] -- PROGRAM ARGS...)");
    if (o->hosts && o->hostfile)
        return bad("%s", "--hosts and --hostfile exclude each other");
    if (o->exclude_lost && o->max_restarts == 0)
        return bad("%s", "--exclude-lost needs --max-restarts K");
    o->prog = argv + i;
    o->n_prog = argc - i;
    return 0;
}

/* The value of the program's option `flag` ("--flag V" or "--flag=V"), or NULL. */
static const char *prog_option(const launch_argv *prog, const char *flag)
{
    size_t len = strlen(flag);
    for (int i = 0; i < prog->n; i++) {
        if (strcmp(prog->v[i], flag) == 0 && i + 1 < prog->n)
            return prog->v[i + 1];
        if (strncmp(prog->v[i], flag, len) == 0 && prog->v[i][len] == '=')
            return prog->v[i] + len + 1;
    }
    return NULL;
}

/* Sets the program's --resume to dir (replacing one it had, else appending it). */
static int set_resume(launch_argv *prog, const char *dir)
{
    for (int i = 0; i < prog->n; i++) {
        if (strcmp(prog->v[i], "--resume") == 0 && i + 1 < prog->n) {
            char *d = strdup(dir);
            if (!d)
                return -1;
            free(prog->v[i + 1]);
            prog->v[i + 1] = d;
            return 0;
        }
        if (strncmp(prog->v[i], "--resume=", 9) == 0) {
            size_t n = strlen(dir) + 10;
            char *d = malloc(n);
            if (!d)
                return -1;
            snprintf(d, n, "--resume=%s", dir);
            free(prog->v[i]);
            prog->v[i] = d;
            return 0;
        }
    }
    return launch_argv_add(prog, "--resume") || launch_argv_add(prog, dir);
}

/* Whether the program's mesh file (--mesh [--mesh-name]) fits `procs` processes: with
 * DT_CPU_DEVICES / DT_GPU_DEVICES set, procs x that many devices; unset, an even split. 1 when
 * it fits or there is no mesh file to check, else 0 with the reason in why. */
static int mesh_fits(const launch_argv *prog, int procs, char *why, size_t len)
{
    const char *file = prog_option(prog, "--mesh");
    if (!file)
        return 1;
    dt_mesh *m = NULL;
    dt_status st = dt_mesh_from_yaml_file(file, prog_option(prog, "--mesh-name"), &m);
    if (st != DT_OK) {
        snprintf(why, len, "%s: %s", file, dt_last_error());
        return 0;
    }
    long long size = (long long)dt_mesh_size(m);
    const char *var = dt_mesh_device_type(m) == DT_DEVICE_GPU ? "DT_GPU_DEVICES" : "DT_CPU_DEVICES";
    dt_mesh_destroy(m);
    const char *set = getenv(var);
    int fits = set && *set ? (long long)procs * atoll(set) == size : size % procs == 0;
    if (!fits)
        snprintf(why, len, "the mesh of %s (%lld devices) does not fit %d process%s%s%s", file,
                 size, procs, procs == 1 ? "" : "es", set && *set ? " x " : "",
                 set && *set ? set : "");
    return fits;
}

/* Open MPI's launcher refuses to start as root (containers run as root) unless
 * OMPI_ALLOW_RUN_AS_ROOT and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM are both 1: as root, sets them for
 * the job, saying so once on stderr. 1 when it set them. */
static int allow_root(void)
{
    const char *a = getenv("OMPI_ALLOW_RUN_AS_ROOT"), *c = getenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM");
    if (strcmp(DT_LAUNCH_MPI, "openmpi") != 0 || geteuid() != 0 ||
        (a && strcmp(a, "1") == 0 && c && strcmp(c, "1") == 0))
        return 0;
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    fprintf(stderr, "dtensor launch: running as root: set OMPI_ALLOW_RUN_AS_ROOT=1 "
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (Open MPI refuses root without them)\n");
    return 1;
}

static void print_command(const launch_plan *p, const launch_argv *cmd, int root_vars)
{
    if (p->hosts->n && !p->srun) {
        printf("# %s:\n", p->hostfile);
        for (int i = 0; i < p->hosts->n; i++)
            printf(strcmp(p->mpi, "mpich") == 0 ? "#   %s:%d\n" : "#   %s slots=%d\n",
                   p->hosts->h[i].name, p->hosts->h[i].slots);
    }
    if (root_vars) /* what the run would set: the command works as root when pasted */
        printf("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ");
    for (int i = 0; i < cmd->n; i++) {
        char q[8192];
        launch_quote(cmd->v[i], q, sizeof q);
        printf("%s%s", i ? " " : "", q);
    }
    printf("\n");
    fflush(stdout);
}

static void host_names(const launch_hosts *h, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < h->n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? "," : "", h->h[i].name);
}

static int launch_loop(opts *o, launch_hosts *hosts, int slurm, const char *tmpdir)
{
    int root_vars = allow_root();
    launch_argv prog = {0};
    for (int i = 0; i < o->n_prog; i++)
        if (launch_argv_add(&prog, o->prog[i]) != 0)
            return cli_fail("launch", DT_ERR_NO_MEMORY);
    char hostfile[4200], err[1024], names[4096];
    snprintf(hostfile, sizeof hostfile, "%s/hostfile", tmpdir);
    const char *root = o->ckpt_root ? o->ckpt_root : prog_option(&prog, "--ckpt-root");
    /* One job id over the restarts: the in-memory checkpoints of this job (and of no other)
     * are what a restart finds (dt_memckpt, docs/recovery.md). */
    if (!o->dry_run && o->max_restarts > 0 && !getenv("DT_JOB_ID")) {
        char id[96], host[64] = "";
        gethostname(host, sizeof host - 1);
        for (char *h = host; *h; h++)
            if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') ||
                  (*h >= '0' && *h <= '9') || *h == '-'))
                *h = '-';
        snprintf(id, sizeof id, "launch-%.32s-%ld-%ld", host, (long)getpid(),
                 (long)time(NULL)); /* at most 64 bytes, as job ids are */
        setenv("DT_JOB_ID", id, 1);
    }
    int rc = 0;
    for (int attempt = 0;; attempt++) {
        int ppn = o->nproc_per_node;
        for (int i = 0; !ppn && i < hosts->n; i++)
            ppn = hosts->h[i].slots;
        for (int i = 0; i < hosts->n; i++)
            if (hosts->h[i].slots != ppn)
                ppn = 0; /* uneven: Open MPI fills the slots in order, Hydra reads the counts */
        launch_plan p = {.mpi = DT_LAUNCH_MPI, .mpiexec = o->mpiexec, .hosts = hosts,
                         .local_procs = o->nproc_per_node ? o->nproc_per_node : 1, .ppn = ppn,
                         .env_names = o->env, .n_env_names = o->n_env,
                         .mpi_args = (const char *const *)o->mpi_args,
                         .n_mpi_args = o->n_mpi_args, .hostfile = hostfile,
                         .srun = slurm && strcmp(DT_LAUNCH_MPI, "mpich") == 0,
                         .prog = (const char *const *)prog.v, .n_prog = prog.n};
        char count[16];
        snprintf(count, sizeof count, "%d", attempt);
        setenv("DT_LAUNCH_RESTART", count, 1); /* passed on like every DT_* variable */
        launch_argv cmd = {0};
        if ((hosts->n && !p.srun && !o->dry_run &&
             launch_write_hostfile(&p, err, sizeof err) != 0) ||
            launch_build(&p, &cmd, err, sizeof err) != 0) {
            fprintf(stderr, "dtensor launch: %s\n", err);
            launch_argv_free(&cmd);
            rc = CLI_BAD_INPUT;
            break;
        }
        if (o->dry_run) {
            print_command(&p, &cmd, root_vars);
            launch_argv_free(&cmd);
            break;
        }
        launch_hosts lost = {.n = 0};
        launch_hang hang = {o->hang_timeout, getenv("DT_TRACE_DIR")};
        rc = launch_run(cmd.v, hosts, &lost, o->hang_timeout > 0 ? &hang : NULL, err,
                        sizeof err);
        launch_argv_free(&cmd);
        if (rc < 0) {
            fprintf(stderr, "dtensor launch: %s\n", err);
            rc = CLI_BAD_INPUT;
            break;
        }
        if (rc == 0 || attempt == o->max_restarts)
            break;
        host_names(&lost, names, sizeof names);
        fprintf(stderr, "dtensor launch: the job failed (exit status %d)%s%s\n", rc,
                lost.n ? "; lost host(s): " : "", names);
        if (o->exclude_lost)
            for (int i = 0; i < lost.n; i++)
                launch_hosts_remove(hosts, lost.h[i].name);
        if (o->exclude_lost && lost.n && hosts->n == 0) {
            fprintf(stderr, "dtensor launch: not restarting: every host was lost\n");
            break;
        }
        int procs = hosts->n ? launch_hosts_total(hosts) : p.local_procs;
        if (o->exclude_lost && lost.n && !mesh_fits(&prog, procs, err, sizeof err)) {
            fprintf(stderr, "dtensor launch: not restarting on fewer hosts: %s\n", err);
            break;
        }
        char dir[4096];
        int64_t step = -1;
        dt_ckpt_latest_info latest;
        if (root && dt_ckpt_find_latest(root, &latest, dir, sizeof dir) == DT_OK) {
            step = latest.step;
            if (latest.skipped > 0)
                fprintf(stderr, "dtensor launch: passed over damaged step %lld (%s)\n",
                        (long long)latest.skipped_step, latest.skipped_reason);
            if (set_resume(&prog, dir) != 0) {
                rc = cli_fail("launch", DT_ERR_NO_MEMORY);
                break;
            }
        }
        host_names(hosts, names, sizeof names);
        if (step >= 0)
            fprintf(stderr, "dtensor launch: restart %d of %d from step %lld (%s) on %d "
                    "process%s%s%s\n", attempt + 1, o->max_restarts, (long long)step, dir, procs,
                    procs == 1 ? "" : "es", hosts->n ? ": " : "", names);
        else
            fprintf(stderr, "dtensor launch: restart %d of %d from the start (%s) on %d "
                    "process%s%s%s\n", attempt + 1, o->max_restarts,
                    root ? "no committed checkpoint under the root yet"
                         : "no --ckpt-root to resume from",
                    procs, procs == 1 ? "" : "es", hosts->n ? ": " : "", names);
        if (prog_option(&prog, "--mem-ckpt-every"))
            fprintf(stderr, "dtensor launch: job %s keeps in-memory checkpoints: the program "
                    "resumes from the newest step complete in its hosts' memory when newer "
                    "(docs/recovery.md)\n", getenv("DT_JOB_ID") ? getenv("DT_JOB_ID") : "?");
    }
    launch_argv_free(&prog);
    return rc;
}

int cli_launch(int argc, char **argv)
{
    opts o = {.mpiexec = DT_LAUNCH_MPIEXEC};
    int rc = parse(argc, argv, &o);
    static launch_hosts hosts;
    char err[1024];
    hosts.n = 0;
    int got = 0;
    for (int i = 0; rc == 0 && i < o.n_env; i++) { /* --env VAR=VALUE: set for the job */
        const char *eq = strchr(o.env[i], '=');
        if (eq) {
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(eq - o.env[i]), o.env[i]);
            setenv(name, eq + 1, 1);
        }
    }
    if (rc == 0) {
        if (o.hosts)
            got = launch_hosts_parse_list(o.hosts, o.nproc_per_node ? o.nproc_per_node : 1,
                                          &hosts, err, sizeof err);
        else if (o.hostfile)
            got = launch_hosts_read_file(o.hostfile, 1, &hosts, err, sizeof err);
        else
            got = launch_hosts_from_slurm(o.nproc_per_node, &hosts, err, sizeof err);
        if (got < 0) {
            fprintf(stderr, "dtensor launch: %s\n", err);
            rc = CLI_BAD_INPUT;
        }
        if (o.nproc_per_node)
            for (int i = 0; i < hosts.n; i++)
                hosts.h[i].slots = o.nproc_per_node;
    }
    if (rc == 0) {
        char tmpdir[4096];
        const char *t = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/dtensor-launch.XXXXXX", t && *t ? t : "/tmp");
        char trace[4200] = "";
        if (!o.dry_run && !mkdtemp(tmpdir)) {
            fprintf(stderr, "dtensor launch: %s: %s\n", tmpdir, strerror(errno));
            rc = CLI_BAD_INPUT;
        } else {
            /* --hang-timeout reads the clients' flight records: DT_TRACE_DIR, else one of
             * ours (it must be a directory every host sees: docs/recovery.md). */
            const char *td = getenv("DT_TRACE_DIR");
            if (o.hang_timeout > 0 && !o.dry_run && !(td && *td)) {
                snprintf(trace, sizeof trace, "%s/trace", tmpdir);
                if (mkdir(trace, 0755) == 0)
                    setenv("DT_TRACE_DIR", trace, 1);
            }
            if (o.dry_run)
                snprintf(tmpdir, sizeof tmpdir, "%s/dtensor-launch.XXXXXX", t && *t ? t : "/tmp");
            rc = launch_loop(&o, &hosts, got == 1 && !o.hosts && !o.hostfile, tmpdir);
            if (!o.dry_run) {
                char hf[4200];
                snprintf(hf, sizeof hf, "%s/hostfile", tmpdir);
                unlink(hf);
                if (trace[0]) { /* the records of our own trace directory */
                    DIR *d = opendir(trace);
                    struct dirent *e;
                    while (d && (e = readdir(d))) {
                        char p[4600];
                        snprintf(p, sizeof p, "%s/%s", trace, e->d_name);
                        if (e->d_name[0] != '.')
                            unlink(p);
                    }
                    if (d)
                        closedir(d);
                    rmdir(trace);
                }
                rmdir(tmpdir);
            }
        }
    }
    for (int i = 0; i < o.n_mpi_args; i++)
        free(o.mpi_args[i]);
    return rc;
}
