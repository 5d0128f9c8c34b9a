/* `dtensor launch`: the hosts of a job, the launcher command for the MPI this build links, and
 * running it (restarts included). Shared by tools/cmd_launch.c and tools/launch_*.c. */
#ifndef DT_TOOLS_LAUNCH_H
#define DT_TOOLS_LAUNCH_H

#include <stddef.h>

#define LAUNCH_MAX_HOSTS 256
#define LAUNCH_HOST_MAX 256

typedef struct launch_host {
    char name[LAUNCH_HOST_MAX];
    int slots; /* processes on that host */
} launch_host;

typedef struct launch_hosts {
    launch_host h[LAUNCH_MAX_HOSTS];
    int n;
} launch_hosts;

/* A growable argv (NULL-terminated); every string is owned. */
typedef struct launch_argv {
    char **v;
    int n, cap;
} launch_argv;

int launch_argv_add(launch_argv *a, const char *s); /* 0, or -1 out of memory */
void launch_argv_free(launch_argv *a);

/* "h1:4,h2:4,h3" (slots default `default_slots`). 0, or -1 with a message in err. */
int launch_hosts_parse_list(const char *text, int default_slots, launch_hosts *out, char *err,
                            size_t errlen);
/* A hostfile: "NAME", "NAME slots=N" (Open MPI) or "NAME:N" (Hydra) per line, '#' comments. */
int launch_hosts_read_file(const char *path, int default_slots, launch_hosts *out, char *err,
                           size_t errlen);
/* The Slurm allocation this process is inside (SLURM_JOB_NODELIST, SLURM_NTASKS_PER_NODE or
 * SLURM_TASKS_PER_NODE). 1 when inside one (*out filled), 0 when not, -1 with err. */
int launch_hosts_from_slurm(int default_slots, launch_hosts *out, char *err, size_t errlen);
/* Expands a Slurm node list ("n[1-3,5],m7") into out->h names (slots 0). 0, or -1 with err. */
int launch_slurm_expand(const char *list, launch_hosts *out, char *err, size_t errlen);
/* Removes host `name`; 1 if it was there. */
int launch_hosts_remove(launch_hosts *hosts, const char *name);
int launch_hosts_total(const launch_hosts *hosts);

typedef struct launch_plan {
    const char *mpi;     /* "openmpi" or "mpich" */
    const char *mpiexec; /* the launcher binary */
    const launch_hosts *hosts; /* n == 0: this host only, `local_procs` processes */
    int local_procs;
    int ppn;             /* > 0: the same count per host (--map-by ppr / -ppn) */
    const char *const *env_names; /* variables to pass (besides every DT_* one set) */
    int n_env_names;
    const char *const *mpi_args; /* extra launcher words, before the program */
    int n_mpi_args;
    const char *hostfile; /* where the hostfile is (written by launch_write_hostfile) */
    int srun;             /* MPICH inside a Slurm allocation: srun --mpi=pmi2, no hostfile */
    const char *const *prog; /* PROGRAM ARGS... */
    int n_prog;
} launch_plan;

/* Writes the plan's hosts in the MPI's hostfile format. 0, or -1 with err. */
int launch_write_hostfile(const launch_plan *p, char *err, size_t errlen);
/* The command line of the plan into *out. 0, or -1 with err. */
int launch_build(const launch_plan *p, launch_argv *out, char *err, size_t errlen);
/* Open MPI's keepalive settings for a DT_COMM_TIMEOUT of `timeout` seconds: a host that goes
 * silent ends the job within timeout + 2 minutes. */
void launch_keepalive(double timeout, int *time_s, int *intvl_s, int *probes);

/* --hang-timeout: after the job's first output line and `bound` seconds more, the launcher
 * sends SIGUSR1 to the launcher process (mpirun passes it on; every client then writes its
 * flight record into `dir`, DT_TRACE_DIR) every bound/2 seconds and reads the records. */
typedef struct launch_hang {
    double bound;    /* seconds; 0: off */
    const char *dir; /* the job's DT_TRACE_DIR */
} launch_hang;

/* Reads the flight records in dir written at or after wall-clock time `since`: 1 when some
 * client is inside a collective entered more than `bound` seconds before `now` that a member
 * of its group never entered while that member waits in none; msg then names the hung
 * clients and their hosts ("hung client(s) 2 (host h2): ...") and their hosts are added to
 * *hung. Else 0. */
int launch_hang_check(const char *dir, double now, double bound, double since, char *msg,
                      size_t len, launch_hosts *hung);

/* Runs argv, its stdout and stderr passed through; SIGINT/SIGTERM/SIGHUP forwarded. Names of
 * `hosts` that the job's output reports lost ("lost client(s) N (host H)", Open MPI's
 * "Remote daemon ... on node H", Hydra's ... ) are collected into *lost, and with `hang`
 * (may be NULL) those of hung clients, after which the job is stopped at once. Returns the exit
 * status as a shell gives it (128 + signal), or -1 with err when it cannot start. */
int launch_run(char *const *argv, const launch_hosts *hosts, launch_hosts *lost,
               const struct launch_hang *hang, char *err, size_t errlen);
/* The names of `hosts` that one output line reports lost, added to *lost. */
void launch_scan_line(const char *line, const launch_hosts *hosts, launch_hosts *lost);

/* Shell-quotes one word into buf (as `sh` reads it back). */
void launch_quote(const char *word, char *buf, size_t len);

#endif
